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
    """[m] int64 store ids: every edge with its source or destination in ``ids``."""
    dst: np.ndarray
    rel: np.ndarray | None
    """[m] relation of each edge, or None."""
    bytes_read: int
    seconds: float

    @property
    def num_nodes(self) -> int:
        return int(self.ids.size)

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.features, self.labels, self.src, self.dst, self.rel)
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
            kept[0].append(src[touch].astype(np.int64))
            kept[1].append(dst[touch].astype(np.int64))
            if m.has_relations:
                rel = store.read_rows("edges/rel", lo, hi)
                nbytes += rel.nbytes
                kept[2].append(rel[touch].astype(np.int64))
        empty = np.zeros(0, np.int64)
        src, dst, *rel = (np.concatenate([empty, *parts_]) for parts_ in kept)
        return cls(ids, features, labels, src, dst, rel[0] if rel else None, nbytes, time.perf_counter() - t0)

    def __repr__(self) -> str:
        return f"<StaticCache {self.num_nodes} nodes, {self.src.size} edges, {self.nbytes / 2**20:.1f} MiB>"
