"""The invariants every registered source reader keeps on a well-formed source.

`check_reader` reads a source through `read_source` with ``format=name``, checks the
`SourceGraph` against itself, converts it and verifies the store. What is checked, for any
reader (the source being valid: on bad input a reader may hand ids out of range to the
converter, whose checks name the file and row):

- the graph says what was read: ``format`` is the reader's name, ``path`` the path given,
  ``num_nodes`` a positive int, ``tasks`` drawn from node classification and link
  prediction;
- edges: every call of ``edges()`` is a fresh pass giving the same edges, in chunks of
  equal-length 1-D int64 ``src`` / ``dst`` with ids in ``[0, N)``; ``rel`` in every chunk
  or in none, int64 in ``[0, num_relations)``, and present exactly when
  ``num_relations > 0``; ``relation_names`` (when given) has ``num_relations`` names;
- features: None exactly when ``feature_dim == 0``; otherwise every pass streams N rows of
  ``[m, feature_dim]`` floats, the same each time;
- labels: None (then ``num_classes == 0``) or ``[N]`` integers in ``[-1, num_classes)``;
  node classification needs them;
- node splits: 1-D integer ids in ``[0, N)``, no id twice, no id in two splits; edge
  splits: equal-length endpoints in range, relations and negatives shaped as `EdgeSplit`
  documents; ``node_names`` (when given) has N entries; ``split_origin`` is JSON-safe;
- ``graphstore.convert`` takes the graph, the store's manifest agrees with it (nodes,
  features, classes, relations, directedness) and ``graphstore.verify`` passes.

A failure raises `AssertionError` naming the reader, the source and the invariant.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

import graphstore
from graphstore.errors import GraphStoreError
from graphstore.layout.sources import TASK_LINK, TASK_NODE, SourceGraph, read_source

__all__ = ["check_reader", "check_source_graph"]


class _Fail:
    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, problem: str) -> NoReturn:
        raise AssertionError(f"{self.where}: {problem}")


def check_reader(name: str, path: str | os.PathLike, *, work_dir: str | os.PathLike, seed: int = 0,
                 options: Mapping[str, object] | None = None, convert: bool = True,
                 convert_options: Mapping[str, Any] | None = None) -> SourceGraph:
    """Read ``path`` with the reader registered as ``name`` and check every invariant.

    Parameters
    ----------
    name : str
        A registered format (`available_formats`).
    path : path-like or str
        A well-formed source of that format.
    work_dir : path-like
        Scratch directory (archives are extracted, the store is converted, below it); it
        must outlive the returned graph.
    seed, options
        As for `read_source`.
    convert : bool, default True
        Also convert the graph and verify the store (the slow part on a large source).
    convert_options : mapping, optional
        Options of ``graphstore.convert`` (default: ``partitioner="sequential"``, two
        partitions when there are two nodes, no progress bars).

    Returns
    -------
    SourceGraph
        What the reader returned.

    Raises
    ------
    AssertionError
        The first broken invariant, naming the reader, the source and the invariant.
    """
    fail = _Fail(f"reader {name!r} on {os.fspath(path)}")
    graph = read_source(path, format=name, work_dir=work_dir, seed=seed, options=options)
    if not isinstance(graph, SourceGraph):
        fail(f"returned {type(graph).__name__}, not a SourceGraph")
    if graph.format != name:
        fail(f"graph.format is {graph.format!r}, expected {name!r}")
    if graph.path != os.fspath(path):
        fail(f"graph.path is {graph.path!r}, expected the path as given, {os.fspath(path)!r}")
    _check_graph(fail, graph)
    if convert:
        _check_convert(fail, graph, Path(work_dir), convert_options)
    return graph


def check_source_graph(graph: SourceGraph) -> None:
    """Check a `SourceGraph` built by hand (or by a reader) against itself.

    Raises
    ------
    AssertionError
        The first broken invariant, naming the graph and the invariant.
    """
    _check_graph(_Fail(f"source graph {graph.name!r} ({graph.format}, {graph.path})"), graph)


def _check_graph(fail: _Fail, graph: SourceGraph) -> None:
    n = graph.num_nodes
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        fail(f"num_nodes must be a positive int (got {n!r})")
    if not isinstance(graph.name, str) or not graph.name:
        fail(f"name must be a non-empty str (got {graph.name!r})")
    if not isinstance(graph.directed, bool):
        fail(f"directed must be a bool (got {graph.directed!r})")
    tasks = tuple(graph.tasks)
    if len(set(tasks)) != len(tasks) or not set(tasks) <= {TASK_NODE, TASK_LINK}:
        fail(f"tasks {tasks} must be distinct, from {TASK_NODE!r} and {TASK_LINK!r}")
    if not isinstance(graph.files, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in graph.files.items()):
        fail("files must map each role (str) to a file (str)")
    for describe in ("describe_edge", "describe_feature_row"):
        if not isinstance(getattr(graph, describe)(0), str):
            fail(f"{describe}(0) must return a str for messages")
    try:
        json.dumps(graph.split_origin)
    except (TypeError, ValueError) as exc:
        fail(f"split_origin is not JSON-safe ({exc}); the store records it")

    r = graph.num_relations
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        fail(f"num_relations must be an int >= 0 (got {r!r})")
    if graph.relation_names is not None and len(graph.relation_names) != r:
        fail(f"{len(graph.relation_names)} relation_names for num_relations={r}")
    if graph.node_names is not None and len(graph.node_names) != n:
        fail(f"{len(graph.node_names)} node_names for num_nodes={n}")
    _check_edges(fail, graph)
    _check_features(fail, graph)
    _check_labels(fail, graph)
    _check_node_splits(fail, graph)
    _check_edge_splits(fail, graph)


def _ids(fail: _Fail, what: str, ids: Any, n: int, *, ndim: int = 1) -> np.ndarray:
    """``ids`` as an array after checking it is ``ndim``-D integers in ``[0, n)``."""
    if not isinstance(ids, np.ndarray) or ids.ndim != ndim or ids.dtype.kind not in "iu":
        shown = f"{ids.shape} {ids.dtype}" if isinstance(ids, np.ndarray) else type(ids).__name__
        fail(f"{what} must be a {ndim}-D integer array (got {shown})")
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        fail(f"{what} has ids in [{ids.min()}, {ids.max()}], outside [0, {n})")
    return ids


def _edge_pass(fail: _Fail, graph: SourceGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    src, dst, rel = [], [], []
    with_rel = None
    for i, chunk in enumerate(graph.edges()):
        for part in ("src", "dst"):
            array = getattr(chunk, part)
            if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != 1:
                fail(f"edge chunk {i}: {part} must be a 1-D int64 array")
        if chunk.src.shape != chunk.dst.shape:
            fail(f"edge chunk {i}: {len(chunk.src)} sources but {len(chunk.dst)} destinations")
        if with_rel is None:
            with_rel = chunk.rel is not None
        if (chunk.rel is not None) != with_rel:
            fail(f"edge chunk {i}: rel is {'missing' if with_rel else 'present'}, unlike the first chunk")
        if chunk.rel is not None and (chunk.rel.dtype != np.int64 or chunk.rel.shape != chunk.src.shape):
            fail(f"edge chunk {i}: rel must be int64 with one id per edge")
        src.append(chunk.src)
        dst.append(chunk.dst)
        if chunk.rel is not None:
            rel.append(chunk.rel)
    empty = np.zeros(0, np.int64)
    return (np.concatenate(src) if src else empty, np.concatenate(dst) if dst else empty,
            np.concatenate(rel) if with_rel else None)


def _check_edges(fail: _Fail, graph: SourceGraph) -> None:
    src, dst, rel = _edge_pass(fail, graph)
    again = _edge_pass(fail, graph)
    if not (np.array_equal(src, again[0]) and np.array_equal(dst, again[1])
            and (rel is None) == (again[2] is None) and (rel is None or np.array_equal(rel, again[2]))):
        fail("a second edges() pass gave different edges; every call must be a fresh pass")
    _ids(fail, "edge sources", src, graph.num_nodes)
    _ids(fail, "edge destinations", dst, graph.num_nodes)
    if (rel is not None) != (graph.num_relations > 0) and len(src):
        fail(f"edges {'carry' if rel is not None else 'lack'} relation ids, but num_relations={graph.num_relations}")
    if rel is not None:
        _ids(fail, "edge relations", rel, graph.num_relations)


def _feature_pass(fail: _Fail, graph: SourceGraph) -> np.ndarray:
    chunks = []
    for i, rows in enumerate(graph.features()):
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] != graph.feature_dim \
                or rows.dtype.kind != "f":
            shown = f"{rows.shape} {rows.dtype}" if isinstance(rows, np.ndarray) else type(rows).__name__
            fail(f"feature chunk {i} is {shown}, expected [m, {graph.feature_dim}] floats")
        chunks.append(rows)
    return np.concatenate(chunks) if chunks else np.zeros((0, graph.feature_dim), np.float32)


def _check_features(fail: _Fail, graph: SourceGraph) -> None:
    if (graph.features is None) != (graph.feature_dim == 0):
        fail(f"features is {'None' if graph.features is None else 'given'} but feature_dim={graph.feature_dim}")
    if graph.features is None:
        return
    x = _feature_pass(fail, graph)
    if x.shape[0] != graph.num_nodes:
        fail(f"features stream {x.shape[0]} rows for {graph.num_nodes} nodes")
    if not np.array_equal(x, _feature_pass(fail, graph), equal_nan=True):
        fail("a second features() pass gave different rows; every call must be a fresh pass")


def _check_labels(fail: _Fail, graph: SourceGraph) -> None:
    c = graph.num_classes
    if graph.labels is None:
        if c != 0:
            fail(f"num_classes={c} without labels")
        if TASK_NODE in graph.tasks:
            fail("node classification without labels")
        return
    labels = graph.labels
    if not isinstance(labels, np.ndarray) or labels.shape != (graph.num_nodes,) or labels.dtype.kind not in "iu":
        fail(f"labels must be [{graph.num_nodes}] integers (got {getattr(labels, 'shape', None)} "
             f"{getattr(labels, 'dtype', type(labels).__name__)})")
    if labels.size and (labels.min() < -1 or labels.max() >= c):
        fail(f"labels in [{labels.min()}, {labels.max()}], outside [-1, num_classes={c})")


def _check_node_splits(fail: _Fail, graph: SourceGraph) -> None:
    seen: dict[int, str] = {}
    for split, ids in graph.node_splits.items():
        ids = _ids(fail, f"node split {split!r}", ids, graph.num_nodes)
        unique, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            fail(f"node split {split!r} lists node {unique[counts > 1][0]} twice")
        for other, before in seen.items():
            both = np.intersect1d(unique, before)
            if both.size:
                fail(f"node {both[0]} is in node splits {other!r} and {split!r}")
        seen[split] = unique


def _check_edge_splits(fail: _Fail, graph: SourceGraph) -> None:
    n = graph.num_nodes
    for split, edges in graph.edge_splits.items():
        what = f"edge split {split!r}"
        src = _ids(fail, f"{what} sources", edges.src, n)
        dst = _ids(fail, f"{what} destinations", edges.dst, n)
        if src.shape != dst.shape:
            fail(f"{what}: {len(src)} sources but {len(dst)} destinations")
        if edges.rel is not None:
            rel = _ids(fail, f"{what} relations", edges.rel, max(graph.num_relations, 0))
            if rel.shape != src.shape:
                fail(f"{what}: {len(rel)} relations for {len(src)} edges")
        if edges.neg_src is not None:
            neg_src = _ids(fail, f"{what} negative sources", edges.neg_src, n)
            neg_dst = _ids(fail, f"{what} negative destinations", edges.neg_dst, n)
            if neg_src.shape != neg_dst.shape:
                fail(f"{what}: {len(neg_src)} negative sources but {len(neg_dst)} destinations")
        elif edges.neg_dst is not None:
            neg = _ids(fail, f"{what} candidate negatives", edges.neg_dst, n, ndim=2)
            if neg.shape[0] != src.shape[0]:
                fail(f"{what}: {neg.shape[0]} rows of candidate negatives for {len(src)} edges")


def _check_convert(fail: _Fail, graph: SourceGraph, work_dir: Path,
                   convert_options: Mapping[str, Any] | None) -> None:
    options = {"partitioner": "sequential", "num_partitions": min(2, graph.num_nodes), "progress": False,
               **dict(convert_options or {})}
    work_dir.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="check-reader-", dir=work_dir)) / "store.gs"
    try:
        manifest = graphstore.convert(graph, out, **options)
    except GraphStoreError as exc:
        fail(f"graphstore.convert refused the graph ({type(exc).__name__}: {exc})")
    for field in ("num_nodes", "feature_dim", "num_classes", "num_relations", "directed"):
        if getattr(manifest, field) != getattr(graph, field):
            fail(f"the store's {field} is {getattr(manifest, field)!r}, the graph's {getattr(graph, field)!r}")
    try:
        graphstore.verify(out)
    except GraphStoreError as exc:
        fail(f"the converted store does not verify ({type(exc).__name__}: {exc})")
