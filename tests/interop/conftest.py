"""Fixtures of the interop tests: the optional extras (PyG, DGL), the embedded Cora as a
store, and a small hand-made store whose feature row i is [i, i + 0.5, ...]."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

import graphstore
from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import REPO, make_graph


def need(module: str, extra: str) -> ModuleType:
    """Import an extra's module; without it, fail under CI (`make test` installs the extras,
    so a missing one is a broken install) and skip elsewhere, with one line saying why."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = f"{module} missing ({exc}): pip install 'graphstore[{extra}]' (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def pyg() -> ModuleType:
    return need("torch_geometric", "pyg")


@pytest.fixture
def dgl() -> ModuleType:
    return need("dgl", "dgl")


@pytest.fixture(scope="session")
def cora_path(tmp_path_factory) -> Path:
    """The embedded Cora (data/cora) in 8 METIS partitions, as `make demo` converts it."""
    out = tmp_path_factory.mktemp("interop_cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    return out


@pytest.fixture(scope="module")
def cora(cora_path):
    with graphstore.open(cora_path) as store:
        yield store


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """400 nodes, 3000 directed edges with 2 relations, 8 random partitions; features are
    node ids, so every gathered row names its node."""
    graph, _ = make_graph(num_nodes=400, num_edges=3000, directed=True, num_relations=2)
    out = tmp_path_factory.mktemp("interop_small") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=8, partitioner="random", seed=3))
    with graphstore.open(out) as store:
        yield store
