"""`graphstore.from_arrays`: a graph in memory (numpy, torch, memmap, lists) through the same
converter as files. Round trips read the store back with `graphstore.open`; the independent
check converts the same arrays written as an edge list (``edges.txt``, ``features.npy``,
``labels.npy``) and compares the two stores file by file; every message class is one line
naming the argument; a failing conversion leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.errors import ConfigError, SourceError, StoreExistsError
from graphstore.layout.dtypes import decode
from graphstore.layout.sources import _io
from graphstore.layout.sources.arrays import array_source
from graphstore.testing.readers import check_source_graph
from tests.conftest import REPO


def random_graph(num_nodes=300, num_edges=1500, *, seed=0, feature_dim=5, num_classes=4):
    """Edges with self loops and repeats on purpose; feature row i is [i, i + 0.5, ...]."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    dst[:4] = src[:4]  # self loops
    src[-6:], dst[-6:] = src[10:16], dst[10:16]  # repeated edges
    features = np.arange(num_nodes, dtype=np.float32)[:, None] + 0.5 * np.arange(feature_dim, dtype=np.float32)
    labels = rng.integers(-1, num_classes, num_nodes)
    labels[:num_classes] = np.arange(num_classes)  # every class present
    order = rng.permutation(num_nodes)
    splits = {"train": np.sort(order[:100]), "valid": np.sort(order[100:150]), "test": np.sort(order[150:250])}
    return np.stack([src, dst]), features, labels, splits


def as_kind(array: np.ndarray, kind: str, tmp_path: Path, name: str):
    """``array`` as the caller would hold it: numpy, torch tensor, np.memmap, or a list."""
    if kind == "numpy":
        return array
    if kind == "torch":
        return torch.from_numpy(array.copy())
    if kind == "memmap":
        mm = np.lib.format.open_memmap(tmp_path / f"{name}.npy", mode="w+", dtype=array.dtype, shape=array.shape)
        mm[...] = array
        mm.flush()
        return np.load(tmp_path / f"{name}.npy", mmap_mode="r")
    assert kind == "list"
    return array.tolist()


def expected_edge_set(edge_index: np.ndarray, *, directed: bool) -> set[tuple[int, int]]:
    pairs = {(int(s), int(d)) for s, d in edge_index.T if s != d}
    return pairs if directed else pairs | {(d, s) for s, d in pairs}


def read_back(path):
    """The store as source-id arrays: features, labels, splits (sets) and the edge list."""
    with graphstore.open(path) as store:
        n = store.num_nodes
        orig = store.to_source_ids(np.arange(n))
        out = {"num_nodes": n, "manifest": store.manifest}
        if store.manifest.has_features:
            feats = np.empty((n, store.manifest.feature_dim), np.float32)
            feats[orig] = decode(store.read_rows("nodes/features", 0, n), store.manifest.feature_dtype)
            out["features"] = feats
        if store.manifest.has_labels:
            labels = np.empty(n, np.int64)
            labels[orig] = store.labels[...]
            out["labels"] = labels
        out["splits"] = {name: set(orig[store.read_node_split(name)].tolist())
                         for name, kind in store.manifest.split_kinds.items() if kind == "nodes"}
        src = orig[store.array("edges/src")[...]]
        dst = orig[store.array("edges/dst")[...]]
        out["edges"] = list(zip(src.tolist(), dst.tolist(), strict=True))
        if store.manifest.has_relations:
            out["rel"] = store.array("edges/rel")[...]
    return out


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", ["numpy", "torch", "memmap", "list"])
@pytest.mark.parametrize("directed", [False, True])
def test_round_trip_gives_back_the_arrays(tmp_path, kind, directed):
    edge_index, features, labels, splits = random_graph()
    masks = {"train": np.isin(np.arange(300), splits["train"])}  # one split as a boolean mask
    given = {"train": as_kind(masks["train"], kind, tmp_path, "train"),
             "val": as_kind(splits["valid"], kind, tmp_path, "valid"),  # PyG's name for valid
             "test": as_kind(splits["test"], kind, tmp_path, "test")}
    manifest = graphstore.from_arrays(
        tmp_path / "g.gs", edge_index=as_kind(edge_index, kind, tmp_path, "edges"),
        features=as_kind(features, kind, tmp_path, "features"), labels=as_kind(labels, kind, tmp_path, "labels"),
        splits=given, directed=directed, num_partitions=4, partitioner="random", seed=1)
    back = read_back(tmp_path / "g.gs")
    assert manifest.directed is directed and manifest.tasks == ["node_classification"]
    assert manifest.source["format"] == "arrays" and manifest.source["name"] == "g"
    np.testing.assert_array_equal(back["features"], features)
    np.testing.assert_array_equal(back["labels"], labels)
    assert back["splits"] == {name: set(ids.tolist()) for name, ids in splits.items()}
    assert set(back["edges"]) == expected_edge_set(edge_index, directed=directed)
    assert len(back["edges"]) == len(set(back["edges"]))  # repeats merged
    assert manifest.num_classes == 4
    assert manifest.conversion["self_loops_dropped"] == int((edge_index[0] == edge_index[1]).sum()) >= 4


def test_a_pair_src_dst_and_relation_types(tmp_path):
    edge_index, features, labels, splits = random_graph()
    rel = np.random.default_rng(5).integers(0, 3, edge_index.shape[1])
    rel[-6:] = rel[10:16]  # a repeat keeps its type, so it is a duplicate, not a second relation
    manifest = graphstore.from_arrays(
        tmp_path / "g.gs", edge_index=(torch.from_numpy(edge_index[0]), torch.from_numpy(edge_index[1])),
        features=features, labels=labels, splits=splits, edge_types=torch.from_numpy(rel), directed=True,
        num_partitions=3, partitioner="random")
    back = read_back(tmp_path / "g.gs")
    assert manifest.num_relations == 3
    # Knowledge-graph rule of the converter: self loops are kept when edges have types.
    want = {(int(s), int(d), int(r)) for s, d, r in zip(edge_index[0], edge_index[1], rel, strict=True)}
    got = {(s, d, int(r)) for (s, d), r in zip(back["edges"], back["rel"], strict=True)}
    assert got == want


def test_bfloat16_and_float16_tensors_keep_their_width(tmp_path):
    edge_index, features, labels, splits = random_graph()
    for dtype, stored in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        out = tmp_path / f"{stored}.gs"
        x = torch.from_numpy(features).to(dtype)
        manifest = graphstore.from_arrays(out, edge_index=edge_index, features=x, labels=labels, splits=splits)
        assert manifest.feature_dtype == stored
        np.testing.assert_array_equal(read_back(out)["features"], x.float().numpy())  # stored as given


def test_without_labels_a_link_split_is_drawn_or_taken(tmp_path):
    edge_index, features, _, _ = random_graph()
    drawn = graphstore.from_arrays(tmp_path / "drawn.gs", edge_index=edge_index, features=features)
    assert drawn.tasks == ["link_prediction"] and drawn.split_kinds == {"train": "edges", "valid": "edges",
                                                                           "test": "edges"}
    with graphstore.open(tmp_path / "drawn.gs") as store:
        held = store.read_edge_split("test")
        orig = store.to_source_ids(np.arange(store.num_nodes))
        stored = set(zip(orig[store.array("edges/src")[...]].tolist(), orig[store.array("edges/dst")[...]].tolist(),
                         strict=True))
        pairs = set(zip(orig[held.src].tolist(), orig[held.dst].tolist(), strict=True))
    assert len(pairs) == int(0.10 * len({tuple(sorted(p)) for p in expected_edge_set(edge_index, directed=True)}))
    assert not pairs & stored  # held out of the graph, in both directions
    assert not {(d, s) for s, d in pairs} & stored

    given = graphstore.from_arrays(tmp_path / "given.gs", edge_index=edge_index,
                                   splits={"valid": edge_index[:, :20], "test": torch.from_numpy(edge_index[:, 20:50])})
    assert given.splits == {"valid": 20, "test": 30} and given.num_edges == drawn.num_edges + 2 * sum(
        drawn.splits[s] for s in ("valid", "test"))


def test_typed_link_splits_take_edges_and_types(tmp_path):
    edge_index, _, _, _ = random_graph()
    rel = np.random.default_rng(1).integers(0, 4, edge_index.shape[1])
    manifest = graphstore.from_arrays(tmp_path / "kg.gs", edge_index=edge_index, edge_types=rel, directed=True,
                                      splits={"valid": (edge_index[:, :10], rel[:10]),
                                              "test": (edge_index[:, 10:30], rel[10:30])})
    assert manifest.num_relations == 4 and manifest.splits == {"valid": 10, "test": 20}
    with graphstore.open(tmp_path / "kg.gs") as store:
        np.testing.assert_array_equal(store.read_edge_split("test").rel, rel[10:30])


def test_num_nodes_counts_isolated_nodes(tmp_path):
    manifest = graphstore.from_arrays(tmp_path / "g.gs", edge_index=np.array([[0, 1], [1, 2]]), num_nodes=10,
                                      labels=np.zeros(10, np.int64), splits={"train": [0]})
    assert manifest.num_nodes == 10
    inferred = graphstore.from_arrays(tmp_path / "h.gs", edge_index=np.array([[0, 1], [1, 7]]))
    assert inferred.num_nodes == 8


@pytest.mark.parametrize("kind", ["numpy", "torch", "memmap"])
@pytest.mark.parametrize("with_labels", [True, False])
def test_array_sources_keep_the_reader_invariants(tmp_path, kind, with_labels):
    """The conformance suite every registered reader passes (`graphstore.testing.readers`)."""
    edge_index, features, labels, splits = random_graph()
    splits["train"] = np.concatenate([splits["train"], splits["train"][:5]])  # repeats mean the node once
    graph = array_source(edge_index=as_kind(edge_index, kind, tmp_path, "e"),
                         features=as_kind(features, kind, tmp_path, "x"),
                         labels=as_kind(labels, kind, tmp_path, "y") if with_labels else None,
                         splits=splits if with_labels else None)
    check_source_graph(graph)
    assert graph.tasks == (("node_classification",) if with_labels else ("link_prediction",))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), num_nodes=st.integers(20, 60), num_edges=st.integers(1, 120), chunk=st.integers(1, 50),
       kind=st.sampled_from(["numpy", "torch", "list", "pair"]), labeled=st.booleans(), directed=st.booleans())
def test_streams_give_back_every_column_in_order(data, num_nodes, num_edges, chunk, kind, labeled, directed):
    """Any chunk size, any input kind: the edge stream is the input's columns in order (less
    the held-out ones of a drawn link split), each named by its column; the feature stream
    is the rows."""
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    edge_index = rng.integers(0, num_nodes, (2, num_edges))
    features = rng.standard_normal((num_nodes, 3)).astype(np.float32)
    given = {"numpy": edge_index, "torch": torch.from_numpy(edge_index), "list": edge_index.tolist(),
             "pair": (torch.from_numpy(edge_index[0]), edge_index[1])}[kind]
    with mock.patch.object(_io, "EDGE_CHUNK_ROWS", chunk), mock.patch.object(_io, "FEATURE_CHUNK_BYTES", chunk * 12):
        graph = array_source(edge_index=given, features=features, num_nodes=num_nodes, directed=directed,
                             labels=rng.integers(0, 3, num_nodes) if labeled else None, seed=seed)
        pieces = list(graph.edges())
        rows = list(graph.features())
    assert all(len(p.src) <= chunk for p in pieces) and all(len(r) <= chunk for r in rows)
    src = np.concatenate([p.src for p in pieces])
    dst = np.concatenate([p.dst for p in pieces])
    np.testing.assert_array_equal(np.concatenate(rows), features)
    if labeled:
        kept = np.arange(num_edges)
    else:
        held = {(int(s), int(d)) for split in ("valid", "test")
                for s, d in zip(graph.edge_splits[split].src, graph.edge_splits[split].dst, strict=True)}
        held |= set() if directed else {(d, s) for s, d in held}
        kept = np.array([i for i in range(num_edges) if (int(edge_index[0, i]), int(edge_index[1, i])) not in held],
                        dtype=np.int64)
    np.testing.assert_array_equal(src, edge_index[0, kept])
    np.testing.assert_array_equal(dst, edge_index[1, kept])
    if len(kept):
        i = data.draw(st.integers(0, len(kept) - 1))
        assert graph.describe_edge(i) == f"column {kept[i]}"


# ---------------------------------------------------------------------------- the independent check


def _files(root: Path) -> dict[str, bytes | dict]:
    """Every file of a store but the root's zarr.json (the manifest names its source); Zarr
    metadata parsed (its key order follows the directory listing)."""
    out: dict[str, bytes | dict] = {}
    for p in sorted(root.rglob("*")):
        name = p.relative_to(root).as_posix()
        if p.is_file() and name != "zarr.json":
            out[name] = json.loads(p.read_text()) if p.name == "zarr.json" else p.read_bytes()
    return out


def _manifest_without_source(path: Path) -> dict:
    meta = json.loads((path / "zarr.json").read_text())["attributes"]["graphstore"]
    meta.pop("source")
    meta["conversion"].pop("seconds")
    meta["partitioner"]["info"].pop("seconds")
    meta["partitioner"]["info"].pop("metis_seconds")
    return meta


@pytest.mark.parametrize("with_labels", [True, False])
def test_same_store_as_the_same_arrays_written_as_files(tmp_path, with_labels):
    edge_index, features, labels, _ = random_graph(num_nodes=2500, num_edges=12000, seed=3)
    files = tmp_path / "files"
    files.mkdir()
    np.savetxt(files / "edges.txt", edge_index.T, fmt="%d")
    np.save(files / "features.npy", features)
    if with_labels:
        np.save(files / "labels.npy", labels)
    options = dict(num_partitions=4, partitioner="metis", seed=7)
    graphstore.convert(files, tmp_path / "from_files.gs", **options)
    graphstore.from_arrays(tmp_path / "from_arrays.gs", edge_index=edge_index, features=features,
                           labels=labels if with_labels else None, **options)
    assert _manifest_without_source(tmp_path / "from_arrays.gs") == _manifest_without_source(tmp_path / "from_files.gs")
    ours, theirs = _files(tmp_path / "from_arrays.gs"), _files(tmp_path / "from_files.gs")
    assert ours.keys() == theirs.keys() and len(ours) > 20
    assert [k for k in ours if ours[k] != theirs[k]] == []


# ---------------------------------------------------------------------------- streaming


def test_streams_slice_the_arrays_a_chunk_at_a_time(tmp_path):
    edge_index, features, labels, splits = random_graph(num_nodes=3000, num_edges=5000)
    wide = np.repeat(features, 400, axis=1)  # 2,000 float32 a row: a feature chunk is ~524 rows
    mm = as_kind(wide, "memmap", tmp_path, "wide")
    graph = array_source(edge_index=edge_index, features=mm, labels=labels, splits=splits)
    chunks = list(graph.features())
    assert len(chunks) > 5 and max(len(c) for c in chunks) * wide.shape[1] * 4 <= 4 << 20
    np.testing.assert_array_equal(np.concatenate(chunks), wide)
    assert not any(np.shares_memory(c, mm) for c in chunks)  # the caller's arrays are never handed on
    edges = list(graph.edges())
    np.testing.assert_array_equal(np.concatenate([e.src for e in edges]), edge_index[0])


def test_the_source_holds_one_chunk_at_a_time(tmp_path, monkeypatch):
    """Building the source and streaming all of it allocates a few chunks, not the arrays."""
    n, d = 24576, 512  # 48 MiB of memory-mapped features, 2,048 rows (4 MiB) a chunk
    monkeypatch.setattr(_io, "EDGE_CHUNK_ROWS", 1 << 18)  # 4 MiB of int64 ids a chunk, not 32
    _write_npy(tmp_path / "x.npy", n, d)
    x = np.load(tmp_path / "x.npy", mmap_mode="r")
    edge_index = np.random.default_rng(0).integers(0, n, (2, 3_000_000))  # 48 MiB of int64 ids
    tracemalloc.start()
    try:
        graph = array_source(edge_index=edge_index, features=x, labels=np.zeros(n, np.int64))
        rows = sum(len(chunk) for chunk in graph.features())
        edges = sum(len(chunk.src) for chunk in graph.edges())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == n and edges == edge_index.shape[1]
    # A chunk and the one before it (the consumer's) alive at once, and a little more.
    assert peak < 12 << 20, f"peak {peak / 2**20:.0f} MiB for {(x.nbytes + edge_index.nbytes) / 2**20:.0f} MiB"


def _write_npy(path: Path, n: int, d: int) -> None:
    """Row i is all i, written a block at a time."""
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    for start in range(0, n, 8192):
        mm[start : start + 8192] = np.arange(start, min(start + 8192, n), dtype=np.float32)[:, None]
    mm.flush()
    del mm


def test_conversion_takes_no_more_memory_than_from_files(tmp_path):
    """The converter's own peak is bounded by its chunk and partition settings; from arrays
    it is the same as from the same data as files (a memory-mapped features.npy)."""
    n, d = 49152, 512  # 96 MiB of features
    files = tmp_path / "files"
    files.mkdir()
    _write_npy(files / "features.npy", n, d)
    edge_index = np.random.default_rng(0).integers(0, n, (2, 100_000))
    np.savetxt(files / "edges.txt", edge_index.T, fmt="%d")
    labels = np.arange(n) % 3
    np.save(files / "labels.npy", labels)
    peaks = {}
    for how in ("files", "arrays"):
        tracemalloc.start()
        try:
            options = dict(num_partitions=16, partitioner="sequential")
            if how == "files":
                graphstore.convert(files, tmp_path / "files.gs", **options)
            else:
                x = np.load(files / "features.npy", mmap_mode="r")
                graphstore.from_arrays(tmp_path / "arrays.gs", edge_index=edge_index, features=x, labels=labels,
                                       **options)
            peaks[how] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks["arrays"] <= peaks["files"] + (4 << 20), {k: f"{v / 2**20:.1f} MiB" for k, v in peaks.items()}
    with graphstore.open(tmp_path / "arrays.gs") as store:
        rows = store.read_rows("nodes/features", n - 3, n)
    np.testing.assert_array_equal(rows[:, 0], np.arange(n - 3, n))


# ---------------------------------------------------------------------------- errors


N = 10
EDGES = np.array([[0, 1, 2, 3], [1, 2, 3, 4]])
FEATURES = np.ones((N, 3), np.float32)
LABELS = np.zeros(N, np.int64)

BAD = {
    "edge_index shape": (dict(edge_index=np.zeros((3, 4), np.int64)), r"^from_arrays: edge_index: expected shape \[2, E\]"),
    "edge_index transposed": (dict(edge_index=EDGES.T.copy()), r"got \(4, 2\) \(transpose it: edge_index\.T\)$"),
    "edge_index pair": (dict(edge_index=(np.arange(3), np.arange(4))), r"^from_arrays: edge_index: a pair \(src, dst\)"),
    "edge_index dtype": (dict(edge_index=EDGES.astype(np.float32)), r"^from_arrays: edge_index: expected integer node ids, got dtype float32$"),
    "edge id out of range": (dict(edge_index=np.array([[0, 1], [1, 12]]), num_nodes=N),
                             r"^from_arrays: edge_index\[1, 1\]: node id 12 is out of range \[0, 10\)$"),
    "negative edge id": (dict(edge_index=np.array([[0, -1], [1, 2]])), r"^from_arrays: edge_index\[0, 1\]: node id -1"),
    "features rows": (dict(features=np.ones((N - 1, 3)), num_nodes=N),
                      r"^from_arrays: features: 9 rows, expected 10 \(one per node: num_nodes = 10\)$"),
    "features shape": (dict(features=np.ones(N)), r"^from_arrays: features: expected shape \[N, D\]"),
    "features dtype": (dict(features=np.full((N, 2), "a")), r"^from_arrays: features: expected numbers, got dtype <U1$"),
    "features sparse": (dict(features=torch.eye(N).to_sparse()), r"^from_arrays: features: a sparse tensor"),
    "labels length": (dict(labels=np.zeros(N + 1, np.int64)),
                      r"^from_arrays: labels: 11 entries, expected 10 \(one per node: 10 rows of features\)$"),
    "labels multi-label": (dict(labels=np.zeros((N, 3))), r"^from_arrays: labels: expected shape \[N\].*multi-label"),
    "labels not class ids": (dict(labels=np.full(N, 1.5)), r"^from_arrays: labels\[0\]: 1.5 is not a class id"),
    "mask length": (dict(splits={"train": np.ones(N + 2, bool)}),
                    r"^from_arrays: splits\['train'\]: a boolean mask of 12 entries, expected 10"),
    "split id out of range": (dict(splits={"test": torch.tensor([0, 3, 10])}),
                              r"^from_arrays: splits\['test'\]: node id 10 at position 2 is out of range \[0, 10\)$"),
    "split of several columns": (dict(splits={"train": np.ones((N, 4), bool)}), r"4 splits side by side"),
    "split dtype": (dict(splits={"train": np.array([0.0, 1.0])}), r"^from_arrays: splits\['train'\]: expected node ids"),
    "split overlap": (dict(splits={"train": [0, 1, 2], "test": np.arange(N) >= 2}),
                      r"^from_arrays: splits\['test'\]: node 2 is also in split 'train' \(from_arrays: "
                      r"splits\['train'\]\); a node belongs to one split$"),
    "split name": (dict(splits={"a/b": [0]}), r"^from_arrays: splits\['a/b'\]: a split name must be"),
    "split twice": (dict(splits={"val": [0], "valid": [1]}), r"split 'valid' given twice"),
    "edge_types length": (dict(edge_types=np.zeros(3, np.int64)), r"^from_arrays: edge_types: expected shape \[E\] = \(4,\)"),
    "edge_types dtype": (dict(edge_types=np.zeros(4)), r"^from_arrays: edge_types: expected integer relation ids"),
    "negative edge type": (dict(edge_types=np.array([0, 1, -1, 0])), r"^from_arrays: edge_types\[2\]: relation id -1 is negative$"),
    "num_nodes": (dict(num_nodes=0), r"^from_arrays: num_nodes: expected a positive integer \(got 0\)$"),
    "link split shape": (dict(labels=None, splits={"valid": [0, 1, 2]}), r"without labels a split holds edges"),
    "link split ids": (dict(labels=None, splits={"valid": np.array([[0], [99]])}),
                       r"^from_arrays: splits\['valid'\]: edge \(0, 99\) at column 0 has a node id out of range"),
    "typed link without splits": (dict(labels=None, edge_types=np.zeros(4, np.int64)), r"cannot be drawn here"),
    "directed": (dict(directed="yes"), r"^from_arrays: directed must be True or False"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_the_argument(tmp_path, case):
    changes, pattern = BAD[case]
    args = dict(edge_index=EDGES, features=FEATURES, labels=LABELS, splits={"train": [0, 1], "test": [2]})
    args.update(changes)
    if args["labels"] is None and "splits" not in changes:
        args["splits"] = None
    with pytest.raises(SourceError, match=pattern) as info:
        graphstore.from_arrays(tmp_path / "g.gs", **args)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_unknown_option_suggests_the_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"^from_arrays: unknown option 'num_partitons'; did you mean "
                       r"'num_partitions'\?$"):
        graphstore.from_arrays(tmp_path / "g.gs", edge_index=EDGES, num_partitons=2)
    with pytest.raises(ConfigError, match=r"unknown option 'format'"):  # a file option means nothing here
        graphstore.from_arrays(tmp_path / "g.gs", edge_index=EDGES, format="npz")


# ---------------------------------------------------------------------------- atomicity


def test_a_failing_conversion_leaves_no_store_and_no_temporary(tmp_path):
    """Non-finite features are found while they stream, after edges were staged and the
    nodes partitioned: the temporary directory goes, no store appears."""
    edge_index, features, labels, splits = random_graph()
    features = features.copy()
    features[287, 2] = np.nan
    with pytest.raises(SourceError, match=r"^from_arrays: features row 287: non-finite value nan in column 2$"):
        graphstore.from_arrays(tmp_path / "g.gs", edge_index=edge_index, features=features, labels=labels,
                               splits=splits, num_partitions=4)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_overwrite_keeps_the_old_store(tmp_path):
    edge_index, features, labels, splits = random_graph()
    graphstore.from_arrays(tmp_path / "g.gs", edge_index=edge_index, features=features, labels=labels, splits=splits)
    with pytest.raises(StoreExistsError):
        graphstore.from_arrays(tmp_path / "g.gs", edge_index=edge_index, features=features, labels=labels)
    bad = features.copy()
    bad[5, 0] = np.inf
    with pytest.raises(SourceError, match="non-finite"):
        graphstore.from_arrays(tmp_path / "g.gs", edge_index=edge_index, features=bad, labels=labels,
                               splits=splits, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["g.gs"]
    np.testing.assert_array_equal(read_back(tmp_path / "g.gs")["features"], features)


def test_a_killed_conversion_leaves_no_store(tmp_path):
    """A process killed mid-conversion (SIGKILL while features stream) leaves its temporary,
    which the next conversion to that path removes; no store appears."""
    script = f"""
import os, signal, sys, numpy as np
sys.path.insert(0, {str(REPO)!r})
import graphstore
class Dying:
    shape, dtype, ndim = (3000, 4), np.dtype(np.float32), 2
    def __len__(self): return 3000
    def __array__(self, dtype=None, copy=None): raise AssertionError("copied whole")
    def __getitem__(self, index):
        if index.start and index.start > 0: os.kill(os.getpid(), signal.SIGKILL)
        return np.ones((index.stop - index.start, 4), np.float32)
edges = np.random.default_rng(0).integers(0, 3000, (2, 9000))
import graphstore.layout.sources._io as io
io.FEATURE_CHUNK_BYTES = 4 * 4 * 1000  # 1,000 rows a chunk: the kill comes at the second
# An array-like (as h5py's or Zarr's) is sliced, never copied whole.
graphstore.from_arrays({str(tmp_path / 'g.gs')!r}, edge_index=edges, features=Dying(),
                       labels=np.zeros(3000, np.int64), splits={{"train": [0]}})
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == -9, result.stderr
    assert not (tmp_path / "g.gs").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".g.gs.tmp-")]  # what the kill left
    graphstore.from_arrays(tmp_path / "g.gs", edge_index=EDGES, num_nodes=N, labels=LABELS, splits={"train": [0]})
    assert [p.name for p in tmp_path.iterdir()] == ["g.gs"]


def test_import_graphstore_stays_cheap():
    code = ("import sys, graphstore; assert {'from_arrays', 'from_pyg', 'from_dgl'} <= set(graphstore.__all__); "
            "assert callable(graphstore.from_arrays); "
            "print(sorted(m for m in ('torch', 'torch_geometric', 'dgl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
