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

This module is where the cache's nodes are chosen, once per run: `static_cache_ids` is the
rule (the ``ceil(fraction * N)`` highest in+out degrees, ties to the lower id: the store's
hub group is written with the same function, `graphstore.layout.hub_ids`), and
`StaticCache.choose` decides which cache, if any, a loader runs with. Everything after
takes the chosen `StaticCache` (or its ``ids``): the hierbatching policy records them in its
plan, the budget sizes its rows (`graphstore.buffer.budget`) and the slots place them
after the partitions (`graphstore.buffer.slots`).
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np

from graphstore.errors import ConfigError, OutOfCoreWarning
from graphstore.layout import hub_ids
from graphstore.layout.store import Store

__all__ = ["StaticCache", "static_cache_ids"]

_WARNED_NO_HUBS: set[str] = set()
"""Stores already warned about (once per process: every loader of a run would repeat it)."""


def static_cache_ids(degrees, fraction: float) -> np.ndarray:
    """Store ids of the ``k = ceil(fraction * N)`` highest-degree nodes, ascending.

    Ties go to the lower id, so the cache is a function of the degrees alone; it is the
    rule the store's hub group is written with (`graphstore.layout.hub_ids`, which this
    validates the arguments of).

    Parameters
    ----------
    degrees : array_like
        ``[N]`` non-negative node degrees, indexed by store id.
    fraction : float
        r_s in [0, 1].

    Returns
    -------
    numpy.ndarray
        ``[k] int64``.

    Raises
    ------
    ConfigError
        ``degrees`` not a 1-d numeric array, or ``fraction`` outside [0, 1].

    Examples
    --------
    >>> static_cache_ids([3, 9, 1, 9, 4], 0.5).tolist()
    [1, 3, 4]
    """
    deg = np.asarray(degrees)
    if deg.ndim != 1 or deg.dtype.kind not in "iuf":
        raise ConfigError(f"degrees must be a 1-d numeric array [N] "
                          f"(got shape {deg.shape}, dtype {deg.dtype})")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating, np.integer)) \
            or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"static_cache_fraction must be in [0, 1] (got {fraction!r})")
    return hub_ids(deg, fraction)


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
    def choose(cls, store: Store, fraction: float | None) -> StaticCache | None:
        """The cache a loader runs with: none for ``fraction == 0``; for ``None``, the
        store's hub group when it has one (HierBatching's default), else none, with an
        `OutOfCoreWarning` (once per store) naming the command that writes the group; for
        a fraction in (0, 1], the store's group, which must be for that fraction (`open`).

        Raises
        ------
        ConfigError
            ``fraction`` outside [0, 1], or a fraction the store has no hub group for.
        """
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, numbers.Real)
                                     or not 0 <= fraction <= 1):
            raise ConfigError(f"static_cache must be a fraction of the nodes in [0, 1] (got {fraction!r})")
        if fraction is None:
            if store.hubs is not None:
                return cls.open(store)
            if str(store.path) not in _WARNED_NO_HUBS:
                _WARNED_NO_HUBS.add(str(store.path))
                warnings.warn(f"{store.path}: no hubs/ group, so mega-batches run without HierBatching's "
                              f"static cache; `graphstore hubs {store.path}` writes it", OutOfCoreWarning,
                              stacklevel=3)
            return None
        return cls.open(store, float(fraction)) if fraction > 0 else None

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
