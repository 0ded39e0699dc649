"""Link-prediction policies: BETA and COMET (MariusGNN).

Training on the edge bucket (i, j) needs partitions i and j resident together, so an
epoch's states must bring every pair of partitions together at least once. Both policies
walk the buffer with one swap per state (the loader reads one partition, or one logical
group, while the trainer works), which makes the IO of an epoch the number of states.

BETA order over n items with k slots (our construction of the idea in the MariusGNN paper):
keep k - 1 items fixed and pass every other remaining item through the last slot; the fixed
items have then met everyone and retire. The next fixed set keeps whatever remaining item is
already resident and swaps the rest in over retired items. When the remaining items fit in
the buffer they are swapped in and the epoch ends. Each swap meets up to k - 1 new pairs, so
the state count stays close to the covering bound ``1 + (n(n-1)/2 - k(k-1)/2) / (k-1)``.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from graphstore.buffer.policies.base import TASK_LINK, EpochPlan, frozen_array, register_policy
from graphstore.errors import ConfigError

__all__ = ["beta_order"]

# Bucket assignment samples this many matrix entries at a time to bound temporary memory.
_SAMPLE_BLOCK = 1 << 22
# Up to this many (pair, state) entries, COMET lists co-resident states explicitly.
_TABLE_LIMIT = 1 << 23
# Past this many group pairs with a choice of state, sample the whole matrix block by block.
_MAX_RANDOM_BLOCKS = 4096


def beta_order(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The BETA walk over items ``0..n-1`` with a buffer of ``k`` slots.

    Parameters
    ----------
    n : int
        Items (partitions) to bring together pairwise, n >= 1.
    k : int
        Buffer slots, ``2 <= k <= n`` (or ``k == n == 1``).

    Returns
    -------
    slots : numpy.ndarray
        ``[S, k] int64``: ``slots[s, j]`` is the item in slot j during state s. Items never
        change slot while resident, so consecutive rows differ in exactly one column.
    swap_slot : numpy.ndarray
        ``[S] int64``: the slot whose item changed entering state s; -1 for state 0.

    Examples
    --------
    >>> slots, swap_slot = beta_order(4, 2)
    >>> [sorted(r) for r in slots.tolist()]
    [[0, 1], [0, 2], [0, 3], [1, 3], [2, 3], [1, 2]]
    """
    if not (1 <= k <= n) or (k == 1 and n > 1):
        raise ConfigError(f"beta_order needs 2 <= k <= n (got n={n}, k={k})")
    buf = list(range(k))
    slot_of = {x: j for j, x in enumerate(buf)}
    swaps: list[tuple[int, int]] = []  # (slot, new item), one per state after the first

    def swap(out: int, new: int) -> None:
        j = slot_of.pop(out)
        buf[j] = new
        slot_of[new] = j
        swaps.append((j, new))

    remaining = list(range(n))  # items with pairs still unmet, in walk order
    retired = np.zeros(n, dtype=bool)
    while len(remaining) > k:
        resident = [x for x in remaining if x in slot_of]
        fixed = resident[: k - 1]
        fixed += [x for x in remaining if x not in slot_of][: k - 1 - len(fixed)]
        fixed_set = set(fixed)
        passing = [x for x in remaining if x not in fixed_set]
        # Retired items are the only ones safe to evict: they have met everybody.
        spare = [y for y in buf if retired[y]]
        for x in fixed:
            if x not in slot_of:
                swap(spare.pop(), x)
        # The free slot either already holds a passing item (the first round) or a retired one.
        current = next((x for x in passing if x in slot_of), None)
        if current is None:
            current = passing[0]
            swap(spare.pop(), current)
        for x in passing:
            if x != current:
                swap(current, x)
                current = x
        retired[fixed] = True
        remaining = passing
    spare = [y for y in buf if retired[y]]
    for x in remaining:
        if x not in slot_of:
            swap(spare.pop(), x)

    num_states = 1 + len(swaps)
    swap_slot = np.full(num_states, -1, dtype=np.int64)
    slots = np.empty((num_states, k), dtype=np.int64)
    current = np.arange(k)
    slots[0] = current
    for s, (j, x) in enumerate(swaps, start=1):
        swap_slot[s] = j
        current[j] = x
        slots[s] = current
    return slots, swap_slot


def _states_from_slots(slots: np.ndarray, swap_slot: np.ndarray) -> list[tuple[int, ...]]:
    """Each row of ``slots`` as an ascending tuple of ints."""
    # One swap per state: keep a sorted list and move one item, instead of sorting S rows.
    current = sorted(slots[0].tolist())
    states = [tuple(current)]
    if len(slots) > 1:
        steps = np.arange(1, len(slots))
        js = swap_slot[1:]
        for out, new in zip(slots[steps - 1, js].tolist(), slots[steps, js].tolist()):
            del current[bisect.bisect_left(current, out)]
            bisect.insort(current, new)
            states.append(tuple(current))
    return states


def _first_meetings(slots: np.ndarray, swap_slot: np.ndarray, p: int) -> np.ndarray:
    """``[p, p] int32``: the first state holding both i and j (slots hold physical ids)."""
    bucket_states = np.full((p, p), -1, dtype=np.int32)
    first = slots[0]
    bucket_states[np.ix_(first, first)] = 0
    # One small vectorised step per state: the entering item meets the residents it has
    # not met yet. The loop is over states (~p^2 / 2c), not over the p^2 buckets.
    for s in range(1, len(slots)):
        resident = slots[s]
        x = resident[swap_slot[s]]
        new = resident[bucket_states[x, resident] < 0]
        bucket_states[x, new] = s
        bucket_states[new, x] = s
    return bucket_states


def _co_residency_segments(slots: np.ndarray, swap_slot: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every maximal run of states in which two items are both resident.

    A run starts when the later of the two enters (or at state 0), so each state's entering
    item contributes one run per resident, and each run ends when either item leaves.

    Returns ``a, b, start, end`` (int64, ``a <= b``, states ``start <= s < end``).
    """
    num_states, k = slots.shape
    # next_change[s, j]: first state after s whose swap replaces slot j (num_states if none)
    change = np.full((num_states + 1, k), num_states, dtype=np.int64)
    change[np.arange(1, num_states), swap_slot[1:]] = np.arange(1, num_states)
    next_change = np.minimum.accumulate(change[::-1], axis=0)[::-1][1:]

    rows, cols = np.triu_indices(k)
    a = [slots[0, rows]]
    b = [slots[0, cols]]
    start = [np.zeros(len(rows), dtype=np.int64)]
    end = [np.minimum(next_change[0, rows], next_change[0, cols])]
    if num_states > 1:
        s = np.arange(1, num_states)
        js = swap_slot[1:]
        a.append(np.repeat(slots[s, js], k))
        b.append(slots[1:].reshape(-1))
        start.append(np.repeat(s, k))
        end.append(np.minimum(next_change[s, js][:, None], next_change[1:]).reshape(-1))
    a_all, b_all = np.concatenate(a), np.concatenate(b)
    return np.minimum(a_all, b_all), np.maximum(a_all, b_all), np.concatenate(start), np.concatenate(end)


def _random_meetings(
    slots: np.ndarray, swap_slot: np.ndarray, group_of: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``[p, p] int32``: for each physical bucket (i, j), a state drawn uniformly among those
    holding both logical partitions ``group_of[i]`` and ``group_of[j]``."""
    num_logical = int(slots.max()) + 1
    lo, hi, start, end = _co_residency_segments(slots, swap_slot)
    key = lo * num_logical + hi
    order = np.argsort(key, kind="stable")
    key, start = key[order], start[order]
    length = end[order] - start
    seg_end = np.cumsum(length)
    seg_begin = seg_end - length  # where each run starts in the concatenated per-pair state lists
    total = np.bincount(key, weights=length, minlength=num_logical * num_logical).astype(np.int64)
    base = np.zeros(num_logical * num_logical, dtype=np.int64)
    present = total > 0
    base[present] = seg_begin[np.searchsorted(key, np.flatnonzero(present))]
    # Mirror the pair tables so a bucket can index them by (group_of[i], group_of[j]) directly.
    square = np.arange(num_logical)
    pair = np.minimum.outer(square, square) * num_logical + np.maximum.outer(square, square)
    total2, base2 = total[pair], base[pair]

    size = int(seg_end[-1])
    if size <= _TABLE_LIMIT:
        # Few co-resident states in all (the default COMET has two groups per state): list them
        # explicitly so a draw is one gather instead of a binary search.
        table = np.repeat(start - seg_begin, length) + np.arange(size)
    else:
        table = None

    p = len(group_of)
    out = np.empty((p, p), dtype=np.int32)
    rows_per_block = max(1, _SAMPLE_BLOCK // p)
    random_pairs = np.flatnonzero(total > 1)
    if table is not None and len(random_pairs) <= _MAX_RANDOM_BLOCKS:
        # Usual COMET: most group pairs meet in one state only. Those buckets are a lookup;
        # draw only inside the few blocks (mostly the diagonal ones) with a real choice.
        single = np.where(total2 == 1, table[base2], -1).astype(np.int32)
        for r0 in range(0, p, rows_per_block):
            out[r0:r0 + rows_per_block] = single[group_of[r0:r0 + rows_per_block]][:, group_of]
        members = np.split(np.argsort(group_of, kind="stable"), np.cumsum(np.bincount(group_of))[:-1])
        for key in random_pairs.tolist():
            a, b = divmod(key, num_logical)
            for rows, cols in ((members[a], members[b]), (members[b], members[a]))[: 1 + (a != b)]:
                draw = np.minimum((rng.random((len(rows), len(cols))) * total[key]).astype(np.int64),
                                  total[key] - 1)
                out[np.ix_(rows, cols)] = table[base[key] + draw]
        return out
    for r0 in range(0, p, rows_per_block):
        ga = group_of[r0:r0 + rows_per_block]
        count = total2[ga][:, group_of]
        draw = (rng.random(count.shape) * count).astype(np.int64)
        np.minimum(draw, count - 1, out=draw)  # float rounding must never pick state `count`
        target = base2[ga][:, group_of] + draw
        if table is not None:
            out[r0:r0 + rows_per_block] = table[target]
        else:
            seg = np.searchsorted(seg_end, target, side="right")
            out[r0:r0 + rows_per_block] = start[seg] + (target - seg_begin[seg])
    return out


def _need_pairs(policy: str, p: int, c: int) -> None:
    if p > 1 and c < 2:
        raise ConfigError(f"{policy} needs capacity >= 2 when num_partitions > 1 (got capacity {c}): "
                          "every pair of partitions must be resident together once per epoch")


@register_policy("beta", task=TASK_LINK, summary="link prediction: one swap per state until every pair met")
def plan_beta(*, num_partitions: int, capacity: int, epoch: int, seed: int,
              rng: np.random.Generator) -> EpochPlan:
    """BETA (MariusGNN): the walk of `beta_order` over a random relabelling of the
    partitions (drawn from ``(seed, epoch)``); bucket (i, j) trains in the first state
    holding both."""
    p, c = num_partitions, capacity
    _need_pairs("beta", p, c)
    perm = rng.permutation(p)
    slots, swap_slot = beta_order(p, c)
    slots = perm[slots]
    return EpochPlan(
        policy="beta", task=TASK_LINK, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
        states=_states_from_slots(slots, swap_slot),
        bucket_states=frozen_array(_first_meetings(slots, swap_slot, p)),
    )


def default_logical_partitions(num_partitions: int, capacity: int) -> int:
    """COMET's default l: the fewest logical partitions of which two fit in the buffer,
    ``ceil(p / floor(c / 2))`` (MariusGNN's ``2p / c`` when c is even and divides 2p);
    1 when everything fits.

    >>> default_logical_partitions(16, 4), default_logical_partitions(16, 6), default_logical_partitions(8, 8)
    (8, 6, 1)
    """
    if capacity >= num_partitions:
        return 1
    return min(num_partitions, math.ceil(num_partitions / max(1, capacity // 2)))


@register_policy("comet", task=TASK_LINK, options=("num_logical_partitions",),
                 summary="link prediction: BETA over random logical groups, buckets to random states")
def plan_comet(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
               num_logical_partitions: int | None = None) -> EpochPlan:
    """COMET (MariusGNN): partitions in ``l`` random groups (regrouped each epoch from
    ``(seed, epoch)``, sizes differing by at most one), the BETA walk over groups with
    ``c_l = c // max group size`` groups resident, and each physical bucket (i, j) assigned
    to a uniformly random state among those holding both groups."""
    p, c = num_partitions, capacity
    _need_pairs("comet", p, c)
    if num_logical_partitions is None:
        num_logical = default_logical_partitions(p, c)
    elif (isinstance(num_logical_partitions, bool)
          or not isinstance(num_logical_partitions, (int, np.integer))
          or not 1 <= num_logical_partitions <= p):
        raise ConfigError(f"num_logical_partitions must be an integer in [1, {p}] "
                          f"(got {num_logical_partitions!r})")
    else:
        num_logical = int(num_logical_partitions)
    group_size = math.ceil(p / num_logical)
    logical_capacity = min(num_logical, c // group_size)
    if logical_capacity < min(2, num_logical):
        fits = math.ceil(p / (c // 2))
        raise ConfigError(
            f"comet needs at least 2 logical partitions resident, but capacity {c} holds {c // group_size} "
            f"of size {group_size} (num_partitions {p}, num_logical_partitions {num_logical}); "
            f"use num_logical_partitions >= {fits} or capacity >= {2 * group_size}")

    groups = [np.sort(g) for g in np.array_split(rng.permutation(p), num_logical)]
    group_of = np.empty(p, dtype=np.int64)
    for index, g in enumerate(groups):
        group_of[g] = index
    slots, swap_slot = beta_order(num_logical, logical_capacity)

    # Physical states: the union of the resident groups; pad ragged groups with -1 to stay vectorised.
    padded = np.full((num_logical, group_size), -1, dtype=np.int64)
    for index, g in enumerate(groups):
        padded[index, : len(g)] = g
    members = np.sort(padded[slots].reshape(len(slots), -1), axis=1)
    pads = (members < 0).sum(axis=1).tolist()
    states = [tuple(row[n:]) for row, n in zip(members.tolist(), pads)]
    return EpochPlan(
        policy="comet", task=TASK_LINK, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
        states=states,
        bucket_states=frozen_array(_random_meetings(slots, swap_slot, group_of, rng)),
        logical_groups=tuple(tuple(g.tolist()) for g in groups),
        logical_states=_states_from_slots(slots, swap_slot),
        options={"num_logical_partitions": num_logical, "logical_capacity": logical_capacity},
    )
