"""HierBatching's static cache: hub nodes whose features stay resident all run.

A mega-batch holds c random partitions, so most of a node's neighbours are elsewhere; the
highest-degree nodes are the neighbours most often missed. The cache keeps their feature
rows and labels in the buffer's cache rows for the whole run (read once, from the store's
contiguous copy, into the rows the buffer gathers from: they are held once). Their edges
are not held: as in HierBatching's Appendix C.1 they are re-read from the store's hub group
(`graphstore.layout._hubs`) with each state, a segment per resident partition, and a state
keeps only the edges its resident nodes and the hubs induce
(`graphstore.buffer.resident`). So the cache costs its rows, and each state the hub edges
of its own partitions: it fits any budget that fits its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphstore.errors import ConfigError
from graphstore.layout.store import Store

__all__ = ["StaticCache"]


@dataclass(frozen=True, eq=False)
class StaticCache:
    """The cache's nodes (store ids, ascending) and where their edges lie in the store."""

    ids: np.ndarray
    """[k] int64 store ids, ascending."""
    segment_offsets: np.ndarray
    """[p + 2] int64: hub segment g (the edges between hubs and partition g's other nodes;
    g = p: hub-hub) is rows ``[segment_offsets[g], segment_offsets[g + 1])`` of
    ``hubs/edges/*``."""
    fraction: float
    """The fraction of the store's nodes the cache holds."""

    @property
    def num_nodes(self) -> int:
        return int(self.ids.size)

    @property
    def segment_sizes(self) -> np.ndarray:
        """[p + 1] int64 edges per hub segment."""
        return np.diff(self.segment_offsets)

    @property
    def nbytes(self) -> int:
        """Bytes the cache object holds (its rows live in the buffer's memory)."""
        return int(self.ids.nbytes + self.segment_offsets.nbytes)

    @classmethod
    def open(cls, store: Store, fraction: float | None = None) -> StaticCache:
        """The store's hub group as a cache; ``fraction``, when given, must be the group's.

        Raises
        ------
        ConfigError
            The store has no hub group, or one for another fraction (the message names the
            command that writes it).
        """
        hubs = store.hubs
        if hubs is None:
            raise ConfigError(f"{store.path}: no hubs/ group for the static cache; "
                              f"`graphstore hubs {store.path} --fraction {fraction or 0.01:g}` writes it")
        if fraction is not None and not np.isclose(fraction, hubs.fraction, rtol=1e-9, atol=0):
            raise ConfigError(f"{store.path}: hubs/ holds {hubs.fraction:g} of the nodes, not {fraction:g}; "
                              f"`graphstore hubs {store.path} --fraction {fraction:g}` rewrites it")
        return cls(hubs.ids, hubs.offsets, hubs.fraction)

    def __repr__(self) -> str:
        return f"<StaticCache {self.num_nodes} nodes, {int(self.segment_offsets[-1])} hub edges on disk>"
