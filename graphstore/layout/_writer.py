"""Writing the arrays of a new store: the chunking every writer agrees on, node arrays,
splits. Features and edges, the two streamed parts, have modules of their own
(`_features`, `_buckets`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import zarr

from graphstore.errors import SourceError
from graphstore.layout._arrays import ChunkedAppender, chunk_rows_for, new_array
from graphstore.layout._staging import NODE_CHUNK, node_scratch
from graphstore.layout.sources.base import EdgeSplit, SourceGraph

__all__ = ["StoreWriter", "write_node_arrays", "write_splits"]

log = logging.getLogger(__name__)


class StoreWriter:
    """The open output group and the chunking every writer agrees on."""

    def __init__(self, root: zarr.Group, n: int, p: int, partition_size: int, idx: str, compress: bool):
        self.root, self.n, self.p, self.partition_size = root, n, p, partition_size
        self.idx, self.compress = idx, compress
        self.node_rows_1d = chunk_rows_for(partition_size, 8, n)
        self.edge_chunk = (4 << 20) // np.dtype(idx).itemsize
        self.feature_rows = 0

    def node_array(self, name: str, values: np.ndarray, dtype=None) -> None:
        """Write a per-node array (possibly file-backed) a chunk at a time, cast to ``dtype``."""
        dtype = np.dtype(dtype or values.dtype)
        arr = new_array(self.root, name, shape=values.shape, dtype=dtype,
                        chunks=(self.node_rows_1d, *values.shape[1:]), compress=self.compress)
        step = self.node_rows_1d
        for start in range(0, values.shape[0], step):
            arr[start : start + step] = np.asarray(values[start : start + step]).astype(dtype, copy=False)

    def array(self, name: str, shape: tuple[int, ...], dtype, chunks: tuple[int, ...]) -> zarr.Array:
        return new_array(self.root, name, shape=shape, dtype=dtype, chunks=chunks, compress=self.compress)

    def chunk_summary(self) -> dict[str, int]:
        return {"node_rows": self.feature_rows, "node_rows_1d": self.node_rows_1d, "edges": self.edge_chunk}


def write_node_arrays(layout: StoreWriter, graph: SourceGraph, orig_id: np.ndarray, store_id: np.ndarray) -> None:
    layout.node_array("nodes/orig_id", orig_id, layout.idx)
    layout.node_array("nodes/store_id", store_id, layout.idx)
    if graph.labels is not None:
        # Labels in store order, a chunk of store rows at a time (their source rows scatter).
        labels = graph.labels
        arr = new_array(layout.root, "nodes/labels", shape=(layout.n,), dtype="int32",
                        chunks=(layout.node_rows_1d,), compress=layout.compress)
        step = layout.node_rows_1d
        for start in range(0, layout.n, step):
            rows = np.asarray(orig_id[start : start + step])
            arr[start : start + len(rows)] = np.asarray(labels[rows]).astype(np.int32)
    if graph.node_names is not None:
        names = np.asarray(graph.node_names, dtype=str)[orig_id]
        arr = new_array(layout.root, "nodes/name", shape=names.shape, dtype=str,
                        chunks=(layout.node_rows_1d,), compress=layout.compress)
        arr[...] = names


def write_splits(layout: StoreWriter, graph: SourceGraph, store_id: np.ndarray,
                 work: Path) -> tuple[dict[str, int], dict[str, str]]:
    counts: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for name, ids in graph.node_splits.items():
        counts[name], kinds[name] = _write_node_split(layout, graph, name, ids, store_id, work), "nodes"
    for name, split in graph.edge_splits.items():
        if name in counts:
            raise SourceError(f"{graph.path}: split {name!r} is both a node split and an edge split")
        _write_edge_split(layout, graph, name, split, store_id)
        counts[name], kinds[name] = len(split.src), "edges"
    return counts, kinds


def _write_node_split(layout: StoreWriter, graph: SourceGraph, name: str, ids: np.ndarray,
                      store_id: np.ndarray, work: Path) -> int:
    """Write split ``name`` as ascending distinct store ids; returns how many.

    A split can hold most of the nodes, so instead of sorting its store ids in memory it
    marks them in a per-node byte mask on disk and reads the mask back in store order.
    """
    n = graph.num_nodes
    where = graph.where(f"split:{name}")
    mask = node_scratch(str(work), f"split_mask_{name}", n, np.bool_)
    for start in range(0, len(ids), NODE_CHUNK):
        chunk = _checked_ids(np.asarray(ids[start : start + NODE_CHUNK]), n, where, "node id", offset=start)
        mask[np.asarray(store_id[chunk])] = True
    out = ChunkedAppender(layout.array(f"splits/nodes/{name}", (max(len(ids), 1),), layout.idx,
                                       (layout.node_rows_1d,)))
    for start in range(0, n, NODE_CHUNK):
        out.append((np.flatnonzero(mask[start : start + NODE_CHUNK]) + start).astype(layout.idx))
    written = out.finish()
    if written != len(ids):
        log.warning("%s: %d repeated node ids merged", where, len(ids) - written)
    del mask
    os.unlink(work / f"split_mask_{name}.npy")
    return written


def _checked_ids(ids: np.ndarray, n: int, where: str, what: str, offset: int = 0) -> np.ndarray:
    ids = ids.astype(np.int64, copy=False)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if len(bad):
        raise SourceError(f"{where}: {what} {ids[bad[0]]} at position {offset + bad[0]} is outside [0, {n}) "
                          "(unknown node)")
    return ids


def _write_edge_split(layout: StoreWriter, graph: SourceGraph, name: str, split: EdgeSplit, store_id: np.ndarray) -> None:
    n = graph.num_nodes
    where = graph.where(f"split:{name}")
    base = f"splits/edges/{name}"
    if len(split.src) != len(split.dst) or (split.rel is not None and len(split.rel) != len(split.src)):
        raise SourceError(f"{where}: positive edges have mismatched lengths (src {len(split.src)}, dst {len(split.dst)})")
    parts = {
        "src": store_id[_checked_ids(np.asarray(split.src), n, where, "source node")],
        "dst": store_id[_checked_ids(np.asarray(split.dst), n, where, "destination node")],
    }
    if split.neg_dst is not None:
        neg_dst = np.asarray(split.neg_dst)
        if split.neg_src is not None:
            if len(split.neg_src) != len(neg_dst) or neg_dst.ndim != 1:
                raise SourceError(f"{where}: negative edges have mismatched lengths "
                                  f"(neg_src {len(split.neg_src)}, neg_dst {len(neg_dst)})")
            parts["neg_src"] = store_id[_checked_ids(np.asarray(split.neg_src), n, where, "negative source node")]
        elif neg_dst.ndim != 2 or len(neg_dst) != len(split.src):
            raise SourceError(f"{where}: per-positive negatives have shape {neg_dst.shape}, "
                              f"expected ({len(split.src)}, k)")
        parts["neg_dst"] = store_id[_checked_ids(neg_dst, n, where, "negative destination node")]
    for key, values in parts.items():
        values = values.astype(layout.idx)
        rows = max(1, (4 << 20) // max(1, values.itemsize * int(np.prod(values.shape[1:]))))
        arr = layout.array(f"{base}/{key}", values.shape, values.dtype, (rows, *values.shape[1:]))
        arr[...] = values
    if split.rel is not None:
        rel = np.asarray(split.rel).astype(np.int32)
        bad = np.flatnonzero((rel < 0) | (rel >= max(graph.num_relations, 1)))
        if len(bad):
            raise SourceError(f"{where}: relation {rel[bad[0]]} at position {bad[0]} outside [0, {graph.num_relations})")
        arr = layout.array(f"{base}/rel", rel.shape, "int32", (1 << 20,))
        arr[...] = rel
