"""The README's Python example runs as written (on a store converted from the embedded Cora),
and the demo runs end to end."""

from __future__ import annotations

import re
import subprocess
import sys

from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import REPO


def test_readme_python_example_runs(tmp_path, monkeypatch):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README lost its Python example"
    (tmp_path / "demo_out").mkdir()
    convert(REPO / "data" / "cora", tmp_path / "demo_out" / "cora.gs", ConvertOptions(num_partitions=8))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["x"].shape == (339, 1433)
    assert len(namespace["train"]) == 140 and sorted(namespace["source_ids"].tolist()) == list(range(140))
    loader = namespace["loader"]
    assert [s.bytes_read > 0 for s in loader.epoch_stats] == [True, True] and namespace["loss"].item() < 1.9


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
