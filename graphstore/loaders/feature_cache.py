"""A feature-row cache between macro-batch rounds that knows the future (Ginex's idea).

Macro-batching fetches each round's union of input rows once (`graphstore.loaders.macro`).
Rows used again by a later round would be read again; a cache of rows keeps some of them in
memory, within a byte budget. Because the mini-batches are sampled ahead, the rounds to
come are known: the rest of the current macro-batch always, and the macro-batches the
reader has already sampled (``lookahead``). So the cache can keep, after each round, the
rows whose next use is soonest: Belady's optimal policy, which Ginex (VLDB'22) runs over a
"superbatch" of sampled mini-batches for the same reason. LRU and no cache run the same
rounds for comparison.

The policy's unit is a round: every row of a round's union is used once by the round (its
mini-batches gather from the round's rows), so a row's *next use* is the index of the next
round whose union holds it. After round ``t`` the candidates are the cached rows and the
round's union; the cache keeps the ``capacity`` of them with

- ``belady``: the soonest next use within the known rounds; rows with none known keep the
  most recently used first (LRU decides among them);
- ``lru``: the most recent use (ties: lower store id).

Where this departs from Ginex: Ginex samples a whole superbatch first, writes the samples to
disk and replays them; here the lookahead is the macro-batches the prefetch thread holds in
memory, so the future known is shorter but nothing is sampled twice or stored.

Everything is vectorized over the rows (searchsorted, lexsort); no per-row Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from graphstore.errors import ConfigError
from graphstore.loaders.defaults import memory_budget

__all__ = ["CACHE_POLICIES", "CacheStats", "FeatureCache", "default_cache_bytes"]

CACHE_POLICIES = ("belady", "lru")
_NEVER = np.iinfo(np.int64).max


@dataclass
class CacheStats:
    """What the cache served in one epoch."""

    hits: int = 0
    """Rows of rounds' unions found in the cache."""
    misses: int = 0
    """Rows of rounds' unions read from the store."""
    rows_kept: int = 0
    """Rows held after the last round."""

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))


class FeatureCache:
    """Rows of ``nodes/features`` kept between rounds, at most ``capacity_bytes`` of them.

    Parameters
    ----------
    dim : int
        Features per row.
    capacity_bytes : int
        Most bytes of rows held (rows of ``dim * dtype.itemsize`` bytes).
    policy : {"belady", "lru"}
        What to keep; see the module docstring.
    dtype : numpy dtype
        Of the rows, as fetched (float16 features stay float16, bfloat16 its uint16 bits: half
        the bytes, twice the rows).
    """

    def __init__(self, dim: int, capacity_bytes: int, policy: str = "belady", dtype=np.float32) -> None:
        if policy not in CACHE_POLICIES:
            raise ConfigError(f"feature cache policy must be one of {', '.join(CACHE_POLICIES)} (got {policy!r})")
        if capacity_bytes < 0:
            raise ConfigError(f"feature cache bytes must be >= 0 (got {capacity_bytes})")
        self.dim, self.policy, self.dtype = dim, policy, np.dtype(dtype)
        self.capacity_bytes = int(capacity_bytes)
        """The budget given (the settings record it)."""
        self.capacity = int(capacity_bytes) // (self.dtype.itemsize * dim)
        self.ids = np.empty(0, dtype=np.int64)
        """Cached store ids, ascending."""
        self.rows = np.empty((0, dim), dtype=self.dtype)
        self.last_use = np.empty(0, dtype=np.int64)
        self._round = 0

    def serve(self, union: np.ndarray, future: Sequence[np.ndarray],
              fetch: Callable[[np.ndarray], np.ndarray], stats: CacheStats) -> np.ndarray:
        """[len(union), D] of the cache's dtype: the rows of ``union`` (ascending store ids), the
        cached ones from memory and the rest through ``fetch``; then keep what the policy says.

        ``future`` holds the unions of the rounds known to come, in order (Belady's input;
        LRU ignores it).
        """
        out = np.empty((union.size, self.dim), dtype=self.dtype)
        pos = np.searchsorted(self.ids, union)
        hit = np.zeros(union.size, dtype=bool)
        inside = pos < self.ids.size
        hit[inside] = self.ids[pos[inside]] == union[inside]
        out[hit] = self.rows[pos[hit]]
        missing = ~hit
        if missing.any():
            out[missing] = fetch(union[missing])
        stats.hits += int(hit.sum())
        stats.misses += int(missing.sum())
        self._keep(union, out, future, used=pos[hit])
        stats.rows_kept = int(self.ids.size)
        return out

    def _keep(self, union: np.ndarray, rows: np.ndarray, future: Sequence[np.ndarray], *, used: np.ndarray) -> None:
        """``used``: the cache positions this round hit (those rows are in ``union`` too)."""
        t = self._round
        self._round += 1
        if self.capacity == 0:
            return
        # Candidates: this round's union (used now) and the cached rows it did not use.
        unused = np.ones(self.ids.size, dtype=bool)
        unused[used] = False
        old = np.flatnonzero(unused)
        ids = np.concatenate([union, self.ids[old]])
        last = np.concatenate([np.full(union.size, t, dtype=np.int64), self.last_use[old]])
        if ids.size <= self.capacity:
            chosen = np.arange(ids.size)
        elif self.policy == "belady":
            chosen = np.lexsort((ids, -last, _next_use(ids, future)))[: self.capacity]  # soonest, then newest
        else:
            chosen = np.lexsort((ids, -last))[: self.capacity]
        new, kept = chosen[chosen < union.size], old[chosen[chosen >= union.size] - union.size]
        kept_ids = np.concatenate([union[new], self.ids[kept]])
        kept_rows = np.concatenate([rows[new], self.rows[kept]])
        kept_last = np.concatenate([np.full(new.size, t, dtype=np.int64), self.last_use[kept]])
        order = np.argsort(kept_ids, kind="stable")
        self.ids, self.rows, self.last_use = kept_ids[order], kept_rows[order], kept_last[order]

    def __repr__(self) -> str:
        return (f"FeatureCache(policy={self.policy!r}, capacity={self.capacity} rows, "
                f"held={self.ids.size})")


def default_cache_bytes(num_rows: int, row_bytes: int) -> tuple[int, str]:
    """The cache's bytes when a policy is named without them, and the rule: every row
    (``num_rows`` of ``row_bytes``) when they fit the default buffer budget
    (`graphstore.loaders.defaults.memory_budget`), else that budget. Macro-batching holds no
    partition buffer, so the share of memory a buffer would take is the cache's (DGL's and
    PyG's in-memory loaders hold every row; a cache of nothing surprised users)."""
    budget = memory_budget()
    whole = int(num_rows) * int(row_bytes)
    if whole <= budget.bytes:
        return whole, f"every row ({whole} bytes), within {budget.rule}"
    return budget.bytes, f"{budget.rule}: {budget.bytes} bytes, {budget.bytes / whole:.0%} of the rows"


def _next_use(ids: np.ndarray, future: Sequence[np.ndarray]) -> np.ndarray:
    """[len(ids)] int64: the index of the first array of ``future`` holding each id, or a
    sentinel larger than any index when none does."""
    nxt = np.full(ids.size, _NEVER, dtype=np.int64)
    if not future:
        return nxt
    sizes = np.array([f.size for f in future], dtype=np.int64)
    seen = np.concatenate(future)
    when = np.repeat(np.arange(len(future), dtype=np.int64), sizes)
    # First occurrence of each id in round order: np.unique keeps the first index.
    uniq, first = np.unique(seen, return_index=True)
    pos = np.searchsorted(uniq, ids)
    found = pos < uniq.size
    found[found] = uniq[pos[found]] == ids[found]
    nxt[found] = when[first[pos[found]]]
    return nxt
