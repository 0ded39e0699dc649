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

1. the p partitions are drawn into ``l`` random groups of at most ``c // 2`` partitions
   (two groups fit in a buffer of c; at least 2N groups when p allows it), regrouped every
   epoch from ``(seed, epoch)``. The fewest such groups, and up to N more, are each
   planned; the plan whose rounds' busiest ranks add up to the fewest edges
   wins, the fewest groups unless more cut that by 10 % (more groups: more states, reads
   and rounds). A round's pairs divided among N ranks decide how even they can be: 8
   groups give 4 pairs a round, which 3 ranks cannot share; 7 give 3 pairs and a rest;
2. every pair of groups must be resident together once, and a *round* is a set of disjoint
   pairs: the round-robin tournament (circle method) over the groups gives ``l - 1``
   rounds (``l`` when l is odd: one group rests each round) of ``floor(l / 2)`` pairs, so
   every pair of groups meets exactly once;
3. bucket (i, j) between two groups trains in the one state holding their pair; the buckets
   inside a group (i == j included) train together in one state holding the group: a
   pair's in some round, or the group alone in the round it rests (a state of its own, so
   a third rank has work when 5 partitions make 2 pairs a round). Groups are placed
   largest first where their round's bound on the busiest rank (largest state, mean, two
   of the N + 1 largest) grows least: with METIS partitions most edges are inside them,
   and gathering them in one round padded every rank to the busiest;
4. each round's states are dealt to the ranks largest first, each to the rank with the
   fewest edges so far (then the fewest states): the states of one round are pairwise
   disjoint, so the ranks train them concurrently; between rounds the ranks write back and
   wait for each other (the trainer's barrier). ``bucket_edges`` (the store's bucket
   sizes; the edge loader passes them) weighs the states; without it every bucket counts
   one. ``options["round_edges"]`` reports each rank's edges per round.

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


@register_policy("disjoint", task=TASK_LINK, options=("world_size", "bucket_edges"),
                 summary="link prediction: rounds of partition-disjoint states, one share per data-parallel rank")
def plan_disjoint(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                  world_size: int = 1, bucket_edges: np.ndarray | None = None) -> EpochPlan:
    """Rounds of pairs of random partition groups, each round's states disjoint and dealt
    to ``world_size`` ranks so that the ranks' edges are as even as they can be
    (``bucket_edges`` [p, p]: edges of bucket (i, j); None counts every bucket as one edge).
    Module docstring."""
    p, c = num_partitions, capacity
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1 (got {world_size!r})")
    n_ranks = int(world_size)
    if p > 1 and c < 2:
        raise ConfigError(f"disjoint needs capacity >= 2 when num_partitions > 1 (got capacity {c})")
    weights = _bucket_weights(bucket_edges, p)
    # The fewest groups two of which fit in the buffer, at least 2N when p allows it; a few
    # more groups are tried too (smaller, some one partition short), because a round's
    # pairs divided by N decide how evenly its ranks can be loaded: 8 groups give 4 pairs
    # a round, which 3 ranks cannot share, 7 give 3 pairs and a resting group; N more
    # groups at most.
    fewest = max(min(2 * n_ranks, p), math.ceil(p / max(1, c // 2))) if p > 1 else 1
    order = rng.permutation(p)
    stream = int(rng.integers(2**63))  # every candidate breaks its ties with the same draws
    candidates = [_plan_groups(np.array_split(order, num_groups), weights, n_ranks, np.random.default_rng(stream))
                  for num_groups in range(fewest, min(p, fewest + n_ranks) + 1)]
    # More groups mean more states and rounds (reads, barriers, part-filled batches): only
    # for 10 % fewer steps.
    costs = [r[0].cost(n_ranks) for r in candidates]
    best = min((r for r, cost in zip(candidates, costs) if cost <= 1.1 * min(costs)), key=lambda r: len(r[0].schedule))
    rounds, inner_unit, groups, group_of = best
    return _assemble(rounds, inner_unit, groups, group_of, n_ranks, plan_args=dict(
        num_partitions=p, capacity=c, epoch=epoch, seed=seed, weighted=bucket_edges is not None))


def _plan_groups(split: list[np.ndarray], weights: np.ndarray, n_ranks: int, rng: np.random.Generator):
    """The rounds over these groups and where each group's inner buckets train."""
    groups = [np.sort(g) for g in split]
    group_of = np.empty(len(weights), dtype=np.int64)
    for index, g in enumerate(groups):
        group_of[g] = index
    between = np.zeros((len(groups), len(groups)))
    np.add.at(between, (group_of[:, None], group_of[None, :]), weights)
    cross = between + between.T
    np.fill_diagonal(cross, 0.0)
    schedule = round_robin_pairs(len(groups)) or [[(0, 0)]]  # one group: one state holding it
    best = None
    # Greedy placement depends on the order of equal groups; a few orders where that is cheap.
    for _ in range(_PLACEMENT_TRIES if len(groups) <= 16 else 1):
        rounds = _Rounds(schedule, len(groups), cross)
        inner_unit = rounds.place_inner(np.diag(between).copy(), n_ranks, rng)
        cost = rounds.cost(n_ranks)
        if best is None or cost < best[0]:
            best = (cost, rounds, inner_unit)
    return best[1], best[2], groups, group_of


_PLACEMENT_TRIES = 4


def _bucket_weights(bucket_edges: np.ndarray | None, p: int) -> np.ndarray:
    if bucket_edges is None:
        return np.ones((p, p))
    weights = np.asarray(bucket_edges, dtype=np.float64)
    if weights.shape != (p, p) or not np.isfinite(weights).all() or (weights < 0).any():
        raise ConfigError(f"bucket_edges must be [{p}, {p}] non-negative edge counts (got shape "
                          f"{list(weights.shape)})")
    return weights


class _Rounds:
    """Each round's units (states to be): its pairs of groups, then, with an odd number of
    groups, the resting group alone (a state only if it is given its inner buckets), with
    the edges each would train."""

    def __init__(self, schedule: list[list[tuple[int, int]]], num_groups: int, pair_edges: np.ndarray) -> None:
        self.schedule = schedule
        width = max(len(pairs) for pairs in schedule) + num_groups % 2
        self.load = np.zeros((len(schedule), width))
        self.unit_of = np.full((len(schedule), num_groups), -1, dtype=np.int64)  # [round, group] -> unit
        self.resting = np.zeros((len(schedule), width), dtype=bool)
        for t, pairs in enumerate(schedule):
            for i, (a, b) in enumerate(pairs):
                self.unit_of[t, [a, b]] = i
                self.load[t, i] = pair_edges[a, b]
            rest = np.flatnonzero(self.unit_of[t] < 0)
            if len(rest):  # the odd group out (with one group, schedule's (0, 0) holds it)
                self.unit_of[t, rest] = width - 1
                self.resting[t, width - 1] = True

    def place_inner(self, inner: np.ndarray, n_ranks: int, rng: np.random.Generator) -> np.ndarray:
        """Put each group's inner edges in one round's unit holding it, largest first, where
        the round's makespan bound grows least; returns [group] (round, unit) as t * width + i."""
        rounds, width = self.load.shape
        shuffled = rng.permutation(len(inner))  # ties between equal groups drawn per epoch
        order = shuffled[np.argsort(-inner[shuffled], kind="stable")]
        chosen = np.empty(len(inner), dtype=np.int64)
        t_all = np.arange(rounds)
        for a in order.tolist():
            units = self.unit_of[:, a]
            before = _makespan_bound(self.load, n_ranks)
            trial = self.load.copy()
            trial[t_all, units] += inner[a]
            after = _makespan_bound(trial, n_ranks)
            # A resting unit becomes a state of its own (one more read): only for real work.
            rest = self.resting[t_all, units]
            cost = np.where(rest & (inner[a] == 0), np.inf, after - before)
            t = int(np.lexsort((self.load.sum(1), rest, after, cost))[0])
            self.load[t, units[t]] += inner[a]
            chosen[a] = t * width + units[t]
        return chosen

    def cost(self, n_ranks: int) -> float:
        """The busiest rank's edges summed over the rounds, each round's units dealt by `_deal`."""
        total = 0.0
        for t in range(len(self.schedule)):
            load = self.load[t][self.load[t] > 0]
            total += np.bincount(_deal(load, n_ranks), weights=load, minlength=n_ranks).max() if len(load) else 0.0
        return total


def _makespan_bound(load: np.ndarray, n_ranks: int) -> np.ndarray:
    """[rounds] a lower bound on each round's busiest rank, units [rounds, width] dealt whole
    to ``n_ranks``: the largest unit, the mean, and (more units than ranks) two of the
    ``n_ranks + 1`` largest on one rank."""
    top = -np.sort(-load, axis=1)
    bound = np.maximum(top[:, 0], load.sum(1) / n_ranks)
    if load.shape[1] > n_ranks:
        bound = np.maximum(bound, top[:, n_ranks - 1] + top[:, n_ranks])
    return bound


def _deal(load: np.ndarray, n_ranks: int) -> np.ndarray:
    """[units] rank of each unit: largest first to the least loaded rank (then the one with
    fewest units, so p >= 2N gives every rank a state)."""
    ranks = np.empty(len(load), dtype=np.int64)
    totals, counts = np.zeros(n_ranks), np.zeros(n_ranks, dtype=np.int64)
    for u in np.argsort(-load, kind="stable").tolist():
        r = int(np.lexsort((np.arange(n_ranks), counts, totals))[0])
        ranks[u], totals[r], counts[r] = r, totals[r] + load[u], counts[r] + 1
    return ranks


def _assemble(rounds: _Rounds, inner_unit: np.ndarray, groups: list[np.ndarray], group_of: np.ndarray,
              n_ranks: int, *, plan_args: dict) -> EpochPlan:
    """The states round by round, each round rank by rank, and every bucket's state."""
    num_rounds, width = rounds.load.shape
    num_groups = len(groups)
    wanted = set(inner_unit.tolist())  # a resting group's unit is a state only with work
    state_of = {}
    states, rounds_of, ranks_of = [], [], []
    round_edges = np.zeros((num_rounds, n_ranks))
    for t in range(num_rounds):
        members = [np.flatnonzero(rounds.unit_of[t] == i) for i in range(width)]
        units = [i for i in range(width) if len(members[i]) and (not rounds.resting[t, i] or t * width + i in wanted)]
        ranks = _deal(rounds.load[t, units], n_ranks)
        np.add.at(round_edges[t], ranks, rounds.load[t, units])
        for i, r in sorted(zip(units, ranks.tolist()), key=lambda x: (x[1], x[0])):
            state_of[t * width + i] = len(states)
            states.append(tuple(sorted(np.concatenate([groups[g] for g in members[i]]).tolist())))
            rounds_of.append(t)
            ranks_of.append(r)
    table = np.full((num_groups, num_groups), -1, dtype=np.int32)
    for t, pairs in enumerate(rounds.schedule):
        for a, b in pairs:
            table[a, b] = table[b, a] = state_of[t * width + rounds.unit_of[t, a]]
    table[np.arange(num_groups), np.arange(num_groups)] = [state_of[u] for u in inner_unit.tolist()]
    bucket_states = table[group_of[:, None], group_of[None, :]]
    return EpochPlan(
        policy="disjoint", task=TASK_LINK, num_partitions=plan_args["num_partitions"],
        capacity=plan_args["capacity"], epoch=plan_args["epoch"], seed=plan_args["seed"],
        states=states, bucket_states=frozen_array(bucket_states.astype(np.int32)),
        logical_groups=tuple(tuple(g.tolist()) for g in groups),
        state_rounds=rounds_of, state_ranks=ranks_of,
        options={"world_size": n_ranks, "group_size": max(len(g) for g in groups), "num_groups": num_groups,
                 "num_rounds": num_rounds, "weighted": plan_args["weighted"],
                 "round_edges": round_edges.astype(np.int64).tolist()},
    )
