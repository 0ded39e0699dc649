"""Fixtures shared across the suite: the real datasets and a hand-made graph factory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from graphstore.layout.sources.base import TASK_NODE, EdgeChunk, SourceGraph

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip without a CUDA device, all for one reason; on the GPU
    machine's check (``GS_REQUIRE_CUDA=1``) a missing device fails them instead, so a
    broken CUDA install cannot pass as a run of skips."""
    import torch

    if torch.cuda.is_available():
        return
    if os.environ.get("GS_REQUIRE_CUDA") == "1":
        raise pytest.UsageError(f"GS_REQUIRE_CUDA=1 but torch {torch.__version__} sees no CUDA device "
                                f"(torch.version.cuda: {torch.version.cuda})")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Tests that pin torch to one thread (the example scripts, the exactness checks) give
    the rest of the session its threads back: loaders choose their threads from torch's."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` (read-only); tests needing it skip on a user's machine without it."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):  # CI always has shared/ beside the clone: a skip there hides a break
            pytest.fail(f"CI run without {SHARED_DATA}")
        pytest.skip("../shared/data not present (only the developers' machines and CI have it)")
    return SHARED_DATA


@pytest.fixture
def copy(store_path, tmp_path) -> Path:
    """A private copy of the module's ``store_path`` store, for tests that damage it."""
    dest = tmp_path / "copy.gs"
    shutil.copytree(store_path, dest)
    return dest


def make_graph(
    num_nodes: int = 300,
    num_edges: int = 1500,
    *,
    seed: int = 0,
    directed: bool = False,
    feature_dim: int = 3,
    num_classes: int = 4,
    num_relations: int = 0,
    edge_chunk: int = 400,
    feature_chunk: int = 70,
    self_loops: int = 5,
    duplicates: int = 7,
) -> tuple[SourceGraph, dict[str, np.ndarray]]:
    """A seeded random graph as a `SourceGraph`, plus the raw arrays it streams.

    Feature row i is ``[i, i + 0.5, ...]`` (a PyG habit): every gather is checkable exactly.
    The edge list has ``self_loops`` self loops and ``duplicates`` repeated edges on purpose.
    """
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    dst[:self_loops] = src[:self_loops]
    if duplicates:
        src[-duplicates:] = src[self_loops : self_loops + duplicates]
        dst[-duplicates:] = dst[self_loops : self_loops + duplicates]
    rel = rng.integers(0, num_relations, num_edges) if num_relations else None
    if rel is not None and duplicates:
        rel[-duplicates:] = rel[self_loops : self_loops + duplicates]
    features = (np.arange(num_nodes, dtype=np.float32)[:, None] + 0.5 * np.arange(feature_dim, dtype=np.float32))
    labels = rng.integers(-1, num_classes, num_nodes)
    order = rng.permutation(num_nodes)
    splits = {"train": order[: num_nodes // 2], "valid": order[num_nodes // 2 : 3 * num_nodes // 4],
              "test": order[3 * num_nodes // 4 :]}

    def edges():
        for start in range(0, num_edges, edge_chunk):
            stop = start + edge_chunk
            yield EdgeChunk(src[start:stop], dst[start:stop], None if rel is None else rel[start:stop])

    def feature_rows():
        for start in range(0, num_nodes, feature_chunk):
            yield features[start : start + feature_chunk]

    graph = SourceGraph(
        name="handmade", format="memory", path="memory", num_nodes=num_nodes, directed=directed,
        edges=edges, num_relations=num_relations, feature_dim=feature_dim,
        features=feature_rows if feature_dim else None, labels=labels, num_classes=num_classes,
        node_splits=splits, tasks=(TASK_NODE,), split_origin={"kind": "handmade", "seed": seed},
        files={"edges": "memory:edges", "features": "memory:features", "labels": "memory:labels"},
        describe_edge=lambda i: f"line {i + 1}",
    )
    raw = {"src": src, "dst": dst, "features": features, "labels": labels}
    if rel is not None:
        raw["rel"] = rel
    return graph, raw



def write_float16_edgelist(directory: Path, *, num_nodes: int = 2000, num_classes: int = 4, feature_dim: int = 16,
                           seed: int = 0) -> None:
    """An edge list source with float16 ``features.npy`` (as ogbn-papers100M ships them) and
    ``labels.npy``: edges join nodes of one class and a row's class column is raised, so a
    model can learn it."""
    rng = np.random.default_rng(seed)
    labels = np.arange(num_nodes) % num_classes
    src = rng.integers(0, num_nodes, 8 * num_nodes)
    dst = (src + num_classes * rng.integers(1, num_nodes // num_classes, src.size)) % num_nodes  # same class
    directory.mkdir(parents=True, exist_ok=True)
    np.savetxt(directory / "edges.txt", np.stack([src, dst], 1), fmt="%d")
    features = rng.normal(0, 1, (num_nodes, feature_dim))
    features[np.arange(num_nodes), labels] += 2
    np.save(directory / "features.npy", features.astype(np.float16))
    np.save(directory / "labels.npy", labels.astype(np.int64))


@pytest.fixture(scope="session")
def float16_store(tmp_path_factory) -> Path:
    """A store converted from `write_float16_edgelist`'s source: its features stay float16."""
    import graphstore

    root = tmp_path_factory.mktemp("float16")
    write_float16_edgelist(root / "src")
    out = root / "f16.gs"
    graphstore.convert(root / "src", out, num_partitions=4, partitioner="random", seed=1)
    with graphstore.open(out) as store:
        assert store.manifest.feature_dtype == "float16"
    return out
