"""The dependency direction of docs/architecture.md, read from the imports themselves:
layout imports nothing of ours but the leaf modules; buffer sees layout; sample sees the
resident graph only through its Protocol; nn sees sample's data classes; the loaders join
them; the conformance suite may use all of those. No cycles."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphstore"

# stage -> the stages it may import (besides itself and the leaf modules)
ALLOWED = {
    "layout": set(),
    "buffer": {"layout"},
    "sample": {"buffer"},
    "nn": {"sample"},
    # The loaders join the stages into epochs (what trainers and users iterate); nothing
    # below them may import them, and they do not reach for the user-facing modules.
    "loaders": {"layout", "buffer", "sample", "nn", "interop"},
    # Interop hands the sampler's boundary (Batch, DENSE) and a store to PyG and DGL. It
    # needs nothing of the loaders (it reads a batch's fields), so the loaders' batches may
    # delegate to_pyg()/to_dgl() to it, as they use nn: one direction, no cycle.
    "interop": {"layout", "buffer", "sample"},
    # Whole-graph inference streams the store through the layers' partial form.
    "inference": {"layout", "buffer", "sample", "nn"},
    # Full-batch training across ranks (SAR, domain parallel) reads the store by partition
    # and runs the layers' partial form; it never sees the loaders.
    "distributed": {"layout", "buffer", "sample", "nn"},
    # The conformance suite exercises every registry and the loaders.
    "testing": {"layout", "buffer", "sample", "nn", "loaders"},
}

# Top-level modules every stage may import: they hold what several stages share and no
# stage's logic (the exception tree, the version, the ctypes loader of the compiled
# kernels, the registry shape, byte sizes and JSON values, the one METIS wrapper, the C
# heap's trim and threshold), and they
# import nothing but each other, so importing them can never point a stage upstream.
LEAF_MODULES = {"errors", "_version", "_native_lib", "registry", "units", "_metis", "_heap", "_memory"}


def imported_stages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    stages = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "graphstore" and len(parts) > 1:
                stages.add(parts[1])
    return stages


def test_stages_import_only_what_is_upstream():
    checked = 0
    for stage, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            extra = imported_stages(path) - allowed - {stage} - LEAF_MODULES
            assert not extra, f"{path.relative_to(PACKAGE.parent)} imports graphstore.{sorted(extra)}"
            checked += 1
    assert checked >= 8  # the layout stage alone has that many modules


def test_leaf_modules_import_only_leaf_modules():
    for name in sorted(LEAF_MODULES):
        path = PACKAGE / f"{name}.py"
        assert path.is_file(), f"leaf module graphstore/{name}.py is missing"
        extra = imported_stages(path) - LEAF_MODULES
        assert not extra, f"graphstore/{name}.py imports graphstore.{sorted(extra)}"


def test_the_wheel_ships_no_trainers_or_tools():
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'include = ["graphstore*"]' in text


def test_every_module_has_a_place_in_the_layering():
    # The user-facing top: what `import graphstore` and the command line expose; they may
    # import anything, and nothing in a stage may import them (_argparse: the parser of the
    # command line and the trainers').
    top = {"__init__", "__main__", "dataset", "cli", "plot", "_argparse"}
    for path in sorted(PACKAGE.iterdir()):
        name = path.stem if path.suffix == ".py" else path.name
        if path.name.startswith((".", "__pycache__")) or (path.is_file() and path.suffix != ".py"):
            continue
        assert name in ALLOWED or name in LEAF_MODULES or name in top, (
            f"graphstore/{path.name} is in no layer: add it to ALLOWED or LEAF_MODULES in "
            f"tests/test_architecture.py and to docs/architecture.md")
