"""The README's and the guide's Python examples run as written (on a store converted from the
embedded Cora), their links resolve, and the demo runs end to end."""

from __future__ import annotations

import re
import subprocess
import sys

from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import REPO


def run_python_blocks(doc: str, tmp_path, monkeypatch) -> dict:
    """Run every ```python block of ``doc`` in order, in one namespace, from a folder holding
    the store `make demo` makes."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{doc} lost its Python examples"
    (tmp_path / "demo_out").mkdir()
    convert(REPO / "data" / "cora", tmp_path / "demo_out" / "cora.gs", ConvertOptions(num_partitions=8))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, doc, "exec"), namespace)
    return namespace


def test_readme_python_example_runs(tmp_path, monkeypatch):
    namespace = run_python_blocks("README.md", tmp_path, monkeypatch)
    loader = namespace["loader"]
    assert [s.bytes_read > 0 for s in loader.epoch_stats] == [True, True] and namespace["loss"].item() < 1.9


def test_guide_python_examples_run(tmp_path, monkeypatch):
    namespace = run_python_blocks("docs/guide.md", tmp_path, monkeypatch)
    assert namespace["x"].shape == (339, 1433)
    assert len(namespace["train"]) == 140 and sorted(namespace["source_ids"].tolist()) == list(range(140))
    loader = namespace["loader"]
    assert [s.bytes_read > 0 for s in loader.epoch_stats] == [True, True] and namespace["loss"].item() < 1.9


def test_readme_first_screen_is_short_and_its_links_resolve():
    """Issue 35: what graphstore is, the two commands and an example before the first
    section, in at most 15 lines; every relative link in the README and the guide names a file
    that exists (anchors are checked against the target's headings)."""
    readme = (REPO / "README.md").read_text().splitlines()
    first_section = next(i for i, line in enumerate(readme) if line.startswith("## "))
    assert first_section <= 15 and "make demo" in "\n".join(readme[:first_section])
    for doc in ("README.md", "docs/guide.md"):
        path = REPO / doc
        for target in re.findall(r"\]\(([^)#][^)]*|#[^)]*)\)", path.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.exists(), (doc, target)
            if anchor and resolved.suffix == ".md":
                assert anchor in markdown_anchors(resolved.read_text()), (doc, target)


def markdown_anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation but `-` and
    `_` dropped, spaces to `-`), and its ``<a id="...">`` anchors."""
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", text, flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors | set(re.findall(r'<a (?:id|name)="([^"]+)"', text))


def test_demo_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "demo.py")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "OK (" in proc.stdout and "2,708 nodes" in proc.stdout and "train split: 140 nodes" in proc.stdout
    # It trains both schemes and prints their accuracies side by side, well above chance (1/7).
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[-2:]}
    assert set(rows) == {"megabatch", "minibatch"}
    assert rows["megabatch"][1:4] == ["2/8", "+", "28"] and rows["minibatch"][1:4] == ["8/8", "+", "0"]
    assert all(float(row[4]) > 0.6 for row in rows.values())
