"""Buffer capacity from a byte budget (``--buffer-bytes``).

A user knows how much memory the buffer may take, not how many partitions that is. What a
`BufferManager` holds for a plan, counted exactly from the store's metadata:

- the slots (`BufferMemory`): ``slots_needed`` partitions of rows (features, int32 labels,
  float32 embedding + optimizer state), which with prefetch covers two consecutive states;
- the static cache: its rows (once, in the buffer's cache rows), its int64 ids and
  segment offsets; its edges are not held for the run but read per state, below;
- the edge buckets held (source dtype src + dst (+ int32 rel); the manager keeps no more
  than their edges, whatever the partitions' in-degrees), and with a static cache
  the hub segments of the held partitions and the hub-hub segment; the two assembled
  graphs alive at once (the one trained and the one ready): int64 ``indices`` (+ ``rel``)
  per edge, int64 ``indptr`` and ``node_ids`` per local row; plus the temporaries of the
  graph being assembled (three int64s per edge, five with relations, and the widened
  copies of one hub segment), which with prefetch exist while the previous state trains;
- per bucket held (every (i, j) among the held partitions, empty ones included), the
  Python objects that file it (`BUCKET_OBJECT_BYTES`): c^2 of them, 0.2 GB at 736
  partitions, so counted, not left to the process's allowance;
- with prefetch, what of the next epoch's first state is read during the last state
  (`lookahead_within`: only what fits the epoch's own slots, so DISPERSED, whose next
  epoch starts from c random partitions, does not double its slots).

`capacity_for_budget` plans epoch 0 for each candidate capacity and returns the largest
whose plan fits; other epochs of a randomised policy differ only in which partitions meet,
so their footprint varies by the bucket sizes (a margin the caller may leave).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.buffer.cache import StaticCache
from graphstore.buffer.policies import plan_epoch
from graphstore.buffer.slots import lookahead_within, slots_needed
from graphstore.errors import ConfigError
from graphstore.layout.dtypes import storage_dtype
from graphstore.layout.store import Store

__all__ = ["BUCKET_OBJECT_BYTES", "BufferFootprint", "capacity_for_budget", "footprint"]

BUCKET_OBJECT_BYTES = 512
"""Bytes of Python objects per held edge bucket: its key, its ``(src, dst, rel)`` tuple, two
or three array views and two dict entries. Measured with tracemalloc: 393 bytes a bucket at
184 partitions (33,856 buckets), 424 at 736 (541,696; without the span index's entries)."""


@dataclass(frozen=True, slots=True)
class BufferFootprint:
    """Bytes a buffer holds for a plan, by part."""

    slots: int
    slot_bytes: int
    cache_bytes: int
    edge_bytes: int

    @property
    def total(self) -> int:
        return self.slot_bytes + self.cache_bytes + self.edge_bytes


def footprint(store: Store, states: Sequence[Sequence[int]], *, prefetch: bool = True, with_features: bool = True,
              embedding_dim: int = 0, static_cache: StaticCache | None = None,
              lookahead: Sequence[int] | None = None) -> BufferFootprint:
    """What a `BufferManager` over ``states`` holds at its peak (see the module docstring);
    ``lookahead``: the partitions of the next epoch read during the last state, held (not
    assembled) beside it."""
    m, P, p = store.manifest, store.partition_size, store.num_partitions
    row = 4 * m.has_labels + 8 * embedding_dim
    if with_features and m.has_features:
        row += m.feature_dim * storage_dtype(m.feature_dtype).itemsize
    lookahead = lookahead if prefetch and lookahead and states else None
    slots = slots_needed(list(states) + ([lookahead] if lookahead else []), prefetch=prefetch)
    cache_nodes = 0 if static_cache is None else static_cache.num_nodes
    cache_bytes = 0 if static_cache is None else cache_nodes * (row - 8 * embedding_dim) + static_cache.nbytes
    raw_edge = 2 * np.dtype(m.index_dtype).itemsize + 4 * m.has_relations
    sizes = np.diff(store.bucket_offsets).reshape(p, p)  # sizes[j, i]: bucket (i, j)
    hub_sizes = np.zeros(p + 1, np.int64) if static_cache is None else static_cache.segment_sizes
    graph_edge = 8 + 8 * m.has_relations
    local_rows = slots * P + cache_nodes

    def edges(parts: set[int]) -> int:
        """Bucket edges among ``parts``, plus (with a cache) their hub segments' edges, an
        upper bound on the hub edges a state keeps."""
        if not parts:
            return 0
        idx = np.fromiter(parts, np.int64)
        return int(sizes[np.ix_(idx, idx)].sum()) + int(hub_sizes[idx].sum() + hub_sizes[p])

    states = [set(s) for s in states]
    peak = 0
    pairs = zip(states, states[1:] + [set()]) if prefetch else ((s, set()) for s in states)
    # Assembling a graph needs its int64 sources, destinations (and relations) joined, then
    # the sort order, before the sorted copy is the graph's: 3 (5) int64s per edge besides it.
    assembly_edge = 24 + 16 * m.has_relations
    # A hub segment is widened to int64 and mapped before its kept edges join (one at a time).
    segment_temporaries = int(hub_sizes.max(initial=0)) * (48 + 8 * m.has_relations)
    for now, after in pairs:
        held = edges(now | after) * raw_edge + len(now | after) ** 2 * BUCKET_OBJECT_BYTES
        graphs = (edges(now) + edges(after)) * graph_edge + (2 if after else 1) * local_rows * 16
        assembling = edges(after if prefetch else now) * assembly_edge + segment_temporaries
        peak = max(peak, held + graphs + assembling)
    if lookahead:  # the last state's graph, and its buckets beside the next epoch's
        last = states[-1]
        both = last | set(lookahead)
        peak = max(peak, edges(both) * raw_edge + len(both) ** 2 * BUCKET_OBJECT_BYTES
                   + edges(last) * graph_edge + local_rows * 16)
    return BufferFootprint(slots, slots * P * row, cache_bytes, peak)


def capacity_for_budget(store: Store, budget_bytes: int, policy: str, *, prefetch: bool = True,
                        with_features: bool = True, embedding_dim: int = 0, static_cache: StaticCache | None = None,
                        seed: int = 0, lookahead: bool = True, reserved_bytes: int = 0,
                        **options: Any) -> tuple[int, BufferFootprint]:
    """The largest capacity c whose epoch-0 plan fits in ``budget_bytes`` less
    ``reserved_bytes`` (held beside the buffer: the loader threads' batches), and its
    footprint.

    With ``lookahead`` (the loaders' default) the plan includes what of epoch 1's first
    state is read during epoch 0's last (`lookahead_within`).

    Raises
    ------
    ConfigError
        The budget is below what the smallest capacity the policy accepts needs (the
        message gives that capacity and its bytes).

    Examples
    --------
    A budget is met by a plan's footprint, e.g. ``capacity_for_budget(store, 2 << 30,
    "comet")`` on a store of 16 partitions might return ``(6, BufferFootprint(...))``.
    """
    if int(budget_bytes) <= 0:
        raise ConfigError(f"buffer bytes must be positive (got {budget_bytes})")
    budget = int(budget_bytes) - int(reserved_bytes)
    p = store.num_partitions

    def need(c: int) -> BufferFootprint | None:
        try:
            plan = plan_epoch(policy, num_partitions=p, capacity=c, epoch=0, seed=seed, **options)
        except ConfigError:
            return None  # too small for the policy
        ahead = None
        if lookahead and prefetch:
            following = plan_epoch(policy, num_partitions=p, capacity=c, epoch=1, seed=seed, **options)
            ahead = lookahead_within(plan.states, following.states[0], prefetch=True)
        return footprint(store, plan.states, prefetch=prefetch, with_features=with_features,
                         embedding_dim=embedding_dim, static_cache=static_cache, lookahead=ahead)

    smallest = next(((c, f) for c in range(1, p + 1) if (f := need(c)) is not None), None)
    if smallest is None:
        raise ConfigError(f"policy {policy!r} accepts no capacity for {p} partitions")
    c_min, f_min = smallest
    if f_min.total > budget:
        given = (f"{int(budget_bytes):,} bytes" if not reserved_bytes else
                 f"{int(budget_bytes):,} bytes ({budget:,} after {int(reserved_bytes):,} for the batches the "
                 f"loader threads make ahead)")
        raise ConfigError(f"buffer budget {given} is below the {f_min.total:,} bytes that policy "
                          f"{policy!r} needs at its smallest capacity {c_min} ({f_min.slots} slots of "
                          f"{store.partition_size} rows with prefetch={prefetch})")
    lo, hi, best = c_min, p, f_min  # footprints grow with c: binary search the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        f = need(mid)
        if f is not None and f.total <= budget:
            lo, best = mid, f
        else:
            hi = mid - 1
    return lo, best
