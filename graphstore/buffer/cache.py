"""HierBatching's static cache: hub nodes whose features and edges stay resident all run.

A mega-batch holds c random partitions, so most of a node's neighbours are elsewhere; the
highest-degree nodes are the neighbours most often missed. The cache keeps their feature
rows and labels, and every edge between a cache node and any other node, in memory for
the whole run. Each buffer state's graph is then the subgraph induced by the resident
partitions' nodes together with the cache nodes (`graphstore.buffer.resident`).

Loading streams the store once: the feature and label rows of the partitions that hold
cache nodes (whole partitions, sequential reads, one partition in memory at a time), and
``edges/src``/``edges/dst`` in chunks, keeping the edges that touch a cache node. The cost
is one pass over the store, paid once per run, reported by `StaticCache.bytes_read`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from graphstore.errors import ConfigError
from graphstore.layout.store import Store

__all__ = ["StaticCache"]

_EDGE_CHUNK = 1 << 22


@dataclass(frozen=True, eq=False)
class StaticCache:
    """The cache's nodes (store ids, ascending), their rows, and the edges that touch them."""

    ids: np.ndarray
    """[k] int64 store ids, ascending."""
    features: np.ndarray | None
    """[k, D] feature rows of ``ids``, or None."""
    labels: np.ndarray | None
    """[k] int32 labels of ``ids``, or None."""
    src: np.ndarray
    """[m] store ids (the store's index dtype): every edge with its source or destination
    in ``ids``."""
    dst: np.ndarray
    rel: np.ndarray | None
    """[m] int32 relation of each edge, or None."""
    bytes_read: int
    seconds: float
    src_pos: np.ndarray | None = None
    """[m] int32 position of each source in ``ids``, -1 if it is not a cache node (computed
    once, so states map cache edges to local ids without searching)."""
    dst_pos: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.ids.size)

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.features, self.labels, self.src, self.dst, self.rel, self.src_pos, self.dst_pos)
        return sum(a.nbytes for a in arrays if a is not None)

    @classmethod
    def load(cls, store: Store, ids, *, with_features: bool = True) -> StaticCache:
        """Read the rows of ``ids`` and the edges touching them from ``store``.

        Raises
        ------
        ConfigError
            ``ids`` not distinct, or out of ``[0, N)``.
        """
        t0 = time.perf_counter()
        ids = np.asarray(ids, dtype=np.int64)
        N = store.num_nodes
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= N)):
            raise ConfigError(f"static cache ids must be a 1-d array of store ids in [0, {N})")
        ids = np.unique(ids)
        m = store.manifest
        take_features = with_features and m.has_features
        features = np.empty((ids.size, m.feature_dim), m.feature_dtype) if take_features else None
        labels = np.empty(ids.size, np.int32) if m.has_labels else None
        nbytes = 0
        parts = store.partition_of(ids)
        bounds = np.searchsorted(parts, np.arange(store.num_partitions + 1))
        for k in np.unique(parts).tolist():
            start, stop = store.partition_range(k)
            sel = slice(int(bounds[k]), int(bounds[k + 1]))
            rows = ids[sel] - start
            for name, out in (("nodes/features", features), ("nodes/labels", labels)):
                if out is not None:
                    block = store.read_rows(name, start, stop)
                    out[sel] = block[rows]
                    nbytes += block.nbytes

        member = np.zeros(N, dtype=bool)
        member[ids] = True
        names = ["edges/src", "edges/dst"] + (["edges/rel"] if m.has_relations else [])
        kept: list[list[np.ndarray]] = [[] for _ in names]
        for lo in range(0, store.num_edges, _EDGE_CHUNK):
            hi = min(lo + _EDGE_CHUNK, store.num_edges)
            src = store.read_rows("edges/src", lo, hi)
            dst = store.read_rows("edges/dst", lo, hi)
            nbytes += src.nbytes + dst.nbytes
            touch = member[src] | member[dst]
            if not touch.any():
                continue
            # The store's own dtypes (int32 ids below 2**31 nodes): on a power-law graph the
            # hubs' edges are a large share of all edges, so their width matters.
            kept[0].append(src[touch])
            kept[1].append(dst[touch])
            if m.has_relations:
                rel = store.read_rows("edges/rel", lo, hi)
                nbytes += rel.nbytes
                kept[2].append(rel[touch])
        dtypes = [m.index_dtype, m.index_dtype, np.int32]
        src, dst, *rel = (np.concatenate([np.zeros(0, dtype), *parts_]) for parts_, dtype in zip(kept, dtypes))
        position = np.full(N, -1, dtype=np.int32)
        position[ids] = np.arange(ids.size, dtype=np.int32)
        return cls(ids, features, labels, src, dst, rel[0] if rel else None, nbytes, time.perf_counter() - t0,
                   src_pos=position[src], dst_pos=position[dst])

    def __repr__(self) -> str:
        return f"<StaticCache {self.num_nodes} nodes, {self.src.size} edges, {self.nbytes / 2**20:.1f} MiB>"
