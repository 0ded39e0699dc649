"""The dependency direction of ARCHITECTURE.md, read from the imports themselves:
layout imports nothing of ours but errors; buffer sees layout; sample sees the resident
graph only through its Protocol; nn sees sample's data classes. No cycles."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphstore"

# stage -> the stages it may import (besides itself, graphstore.errors, graphstore._version and
# graphstore._native_lib, the ctypes loader of the compiled kernels)
ALLOWED = {
    "layout": set(),
    "buffer": {"layout"},
    "sample": {"buffer"},
    "nn": {"sample"},
}


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
            extra = imported_stages(path) - allowed - {stage, "errors", "_version", "_native_lib"}
            assert not extra, f"{path.relative_to(PACKAGE.parent)} imports graphstore.{sorted(extra)}"
            checked += 1
    assert checked >= 8  # the layout stage alone has that many modules


def test_the_wheel_ships_no_trainers_or_tools():
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'include = ["graphstore*"]' in text
