"""DISJOINT: link-prediction states that data-parallel ranks can train at the same time.

Under data parallelism with learnable embeddings (`graphstore.distributed.data_parallel`),
each rank holds some partitions' embedding rows in its buffer, updates them and writes
them back. Two ranks holding the same partition at once would each write back their own
copy and one rank's updates would be lost; so the ranks must hold *disjoint* partitions
at any time, and a partition passes from one rank to another only through the store,
after its holder wrote it back. (The alternative, every rank holding every partition and
merging updates, is the minibatch scheme's replicated table; a disk-scheme buffer holds a
few partitions by design.) BETA and COMET walk one buffer through overlapping states, so a
contiguous block of their states per rank would overlap other ranks' blocks.

This plan is built for it, from COMET's idea of random logical groups:

1. the p partitions are drawn into ``l`` random groups of at most ``g = min(c // 2,
   p // (2N))`` partitions (two groups fit in a buffer of c, and there are at least 2N
   groups when p allows it), regrouped every epoch from ``(seed, epoch)``;
2. every pair of groups must be resident together once, and a *round* is a set of disjoint
   pairs: the round-robin tournament (circle method) over the groups gives ``l - 1``
   rounds (``l`` when l is odd: one group rests each round) of ``floor(l / 2)`` pairs, so
   every pair of groups meets exactly once;
3. a round's pairs are shuffled and dealt to the N ranks (in round t, pair i to rank
   ``(i + t) % N``, so no rank always gets the odd one out):
   the states of one round are pairwise disjoint, so the ranks train them concurrently;
   between rounds the ranks write back and wait for each other (the trainer's barrier);
4. bucket (i, j) between two groups trains in the one state holding their pair; the buckets
   inside the groups (i and j in one group, i == j included) all train in one round drawn
   per epoch, each in the state of that round holding its group (a group resting in that
   round: in a random state holding it). Steps are padded to the round's busiest rank, so
   spreading them at random (as COMET draws buckets' states) would raise the busiest rank
   of most rounds; gathered, they raise one round's, about equally for every rank.

States are listed round by round, each round rank by rank (`EpochPlan.state_rounds`,
`EpochPlan.state_ranks`). With N = 1 it is a valid single-process plan (each state a
fresh pair, so more reads than COMET: it exists for N > 1). Every partition count works:
with p < 2N some ranks have no state in a round and only take part in its steps.
"""

from __future__ import annotations

import math

import numpy as np

from graphstore.buffer.policies.base import TASK_LINK, EpochPlan, frozen_array, register_policy
from graphstore.errors import ConfigError

__all__ = ["round_robin_pairs"]


def round_robin_pairs(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs of ``0..n-1`` in which every pair meets exactly once (the
    circle method: item 0 stays, the others rotate; with n odd a rest slot sits in).

    >>> round_robin_pairs(4)
    [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    >>> sorted(p for r in round_robin_pairs(5) for p in r) == [(a, b) for a in range(5) for b in range(a + 1, 5)]
    True
    """
    if n < 2:
        return []
    m = n + (n % 2)  # the slot m - 1 is the rest when n is odd
    ring = list(range(1, m))
    rounds = []
    for _ in range(m - 1):
        order = [0] + ring
        pairs = [(order[i], order[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a < n and b < n))
        ring = ring[-1:] + ring[:-1]
    return rounds


@register_policy("disjoint", task=TASK_LINK, options=("world_size",),
                 summary="link prediction: rounds of partition-disjoint states, one share per data-parallel rank")
def plan_disjoint(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                  world_size: int = 1) -> EpochPlan:
    """Rounds of pairs of random partition groups, each round's states disjoint and dealt
    to ``world_size`` ranks (module docstring)."""
    p, c = num_partitions, capacity
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1 (got {world_size!r})")
    n_ranks = int(world_size)
    if p > 1 and c < 2:
        raise ConfigError(f"disjoint needs capacity >= 2 when num_partitions > 1 (got capacity {c})")
    group_size = max(1, min(c // 2, p // (2 * n_ranks))) if p > 1 else 1
    num_groups = math.ceil(p / group_size)
    groups = [np.sort(g) for g in np.array_split(rng.permutation(p), num_groups)]
    group_of = np.empty(p, dtype=np.int64)
    for index, g in enumerate(groups):
        group_of[g] = index

    states: list[tuple[int, ...]] = []
    pair_states: dict[tuple[int, int], int] = {}
    round_of_group: dict[tuple[int, int], int] = {}  # (round, group) -> the state holding it
    rounds_of: list[int] = []
    ranks_of: list[int] = []
    held_by: list[list[int]] = [[] for _ in range(num_groups)]  # states holding each group
    schedule = round_robin_pairs(num_groups) or [[(0, 0)]]  # one group: one state holding it
    for t, pairs in enumerate(schedule):
        pairs = [pairs[i] for i in rng.permutation(len(pairs))]
        for r in range(n_ranks):
            for a, b in (pairs[i] for i in range(len(pairs)) if (i + t) % n_ranks == r):
                members = np.concatenate([groups[a], groups[b]]) if a != b else groups[a]
                pair_states[(a, b)] = len(states)
                held_by[a].append(len(states))
                round_of_group[(t, a)] = round_of_group[(t, b)] = len(states)
                if b != a:
                    held_by[b].append(len(states))
                states.append(tuple(sorted(members.tolist())))
                rounds_of.append(t)
                ranks_of.append(r)

    # Buckets between two groups: their pair's state; inside a group: the state holding it in
    # the epoch's round for them (or, resting then, a random state holding it).
    lo, hi = np.minimum.outer(group_of, group_of), np.maximum.outer(group_of, group_of)
    table = np.full((num_groups, num_groups), -1, dtype=np.int32)
    for (a, b), s in pair_states.items():
        table[a, b] = s
    inner_round = int(rng.integers(len(schedule)))
    for a in range(num_groups):
        table[a, a] = round_of_group.get((inner_round, a), held_by[a][int(rng.integers(len(held_by[a])))])
    bucket_states = table[lo, hi]
    return EpochPlan(
        policy="disjoint", task=TASK_LINK, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
        states=states, bucket_states=frozen_array(bucket_states.astype(np.int32)),
        logical_groups=tuple(tuple(g.tolist()) for g in groups),
        state_rounds=rounds_of, state_ranks=ranks_of,
        options={"world_size": n_ranks, "group_size": group_size, "num_groups": num_groups,
                 "num_rounds": len(schedule), "inner_round": inner_round},
    )
