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
   epoch from ``(seed, epoch)``. The fewest such groups and up to N more are each planned
   (steps 2-4), two ways each; the plan whose rounds' busiest ranks add up to the fewest
   steps wins, unless one that reads fewer partitions (fewer groups, fewer states) is
   within 5 % of it;
2. every pair of groups must be resident together once, and a *round* is a set of disjoint
   pairs, each round's states trained by the ranks at the same time. Two schedules of the
   pairs are tried: the round-robin tournament (circle method: ``l - 1`` rounds of
   ``floor(l / 2)`` pairs, ``l`` rounds with one group resting when l is odd), and rounds
   of N pairs, the pairs placed largest first, each in the first round where both its
   groups are free, so that pairs of like size share a round and each round's largest
   state is small. The tournament alone wasted a round's worth of steps whenever its
   ``floor(l / 2)`` pairs were not a multiple of N: 8 groups give 4 pairs a round, one
   rank trains two of them while the others wait (3 ranks over 8 partitions: 28 steps
   where the batches divided by 3 are 20). The second schedule fills ``floor(pairs / N)``
   rounds; a pair that fits none of them (its groups taken, or the remainder) joins the
   first where both its groups are free, as a second state of some rank, and only a pair
   that fits nowhere opens another round;
3. bucket (i, j) between two groups trains in the one state holding their pair; the buckets
   inside a group (i == j included) train together in one state holding the group: a
   pair's in some round, or the group alone in a round that leaves it free (a state of its
   own, so that a rank without a pair has work: 5 partitions make 2 pairs a round for 3
   ranks). Groups are placed largest first where their round's busiest rank (its states
   dealt as in step 4) grows least, then moved one at a time while a move lowers the
   rounds' busiest ranks' sum (placed greedily, an early group can take the round a later
   one needed: with METIS partitions most edges are inside them, and gathering them in one
   round padded every rank to the busiest);
4. each round's states are dealt to the ranks largest first, each to the rank with the
   fewest steps so far (then the fewest states): the states of one round are pairwise
   disjoint, so the ranks train them concurrently; between rounds the ranks write back and
   wait for each other (the trainer's barrier).

A state's steps are its edges: ``bucket_edges`` (the store's bucket sizes; the edge loader
passes them) weighs the states, and without it every bucket counts one. Given
``batch_size`` (positives per batch), a state's steps are its batches,
``ceil(edges / batch_size)``, as the trainer counts them: when a state holds a few batches,
the part-filled last batch of each state decides as much as the edges do.
``options["round_edges"]`` reports each rank's edges per round.

States are listed round by round, each round rank by rank (`EpochPlan.state_rounds`,
`EpochPlan.state_ranks`). With N = 1 it is a valid single-process plan (each state a
fresh pair, so more reads than COMET: it exists for N > 1). Every partition count works:
with p < 2N some ranks have no state in a round and only take part in its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def rounds_of_largest_first(pairs: list[tuple[int, int]], pair_edges: np.ndarray,
                            per_round: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs, ``per_round`` in each of ``floor(len(pairs) / per_round)``
    rounds: the pairs largest first (equal ones in the given order), each into the first
    round where both its groups are free and there is room; a pair that finds no room in
    those rounds joins the first of them where both are free (some rank trains two states
    there), and one that finds neither opens a round.

    ``pair_edges`` [l, l]: the edges of each pair of groups.

    >>> edges = np.array([[0, 5, 3, 1], [5, 0, 1, 3], [3, 1, 0, 4], [1, 3, 4, 0]])
    >>> rounds_of_largest_first([(0, 3), (1, 2), (0, 2), (1, 3), (0, 1), (2, 3)], edges, 2)
    [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]

    8 groups, 3 ranks: 9 rounds of 3 pairs, and the 28th pair a second state in one of them

    >>> pairs = [pair for pairs in round_robin_pairs(8) for pair in pairs]
    >>> [len(r) for r in rounds_of_largest_first(pairs, np.ones((8, 8)), 3)]
    [3, 3, 3, 3, 3, 3, 3, 3, 4]
    """
    pairs_arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    pairs_arr = pairs_arr[np.argsort(-pair_edges[pairs_arr[:, 0], pairs_arr[:, 1]], kind="stable")]
    full = max(1, len(pairs_arr) // per_round)
    first = np.arange(len(pairs_arr)) < full  # rounds at most one per pair
    used = np.zeros((len(pairs_arr), len(pair_edges)), dtype=bool)  # [round, group]
    count = np.zeros(len(pairs_arr), dtype=np.int64)
    rounds: list[list[tuple[int, int]]] = [[] for _ in range(len(pairs_arr))]
    for a, b in pairs_arr.tolist():
        free = ~used[:, a] & ~used[:, b]
        fits = free & (count < per_round)
        if not (fits & first).any() and (free & first).any():
            fits = free & first  # a second state for some rank of that round
        t = int(np.argmax(fits))
        used[t, [a, b]] = True
        count[t] += 1
        rounds[t].append((a, b))
    return [sorted(r) for r in rounds if r]


@register_policy("disjoint", task=TASK_LINK, options=("world_size", "bucket_edges", "batch_size"),
                 summary="link prediction: rounds of partition-disjoint states, one share per data-parallel rank")
def plan_disjoint(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                  world_size: int = 1, bucket_edges: np.ndarray | None = None,
                  batch_size: int | None = None) -> EpochPlan:
    """Rounds of pairs of random partition groups, each round's states disjoint and dealt
    to ``world_size`` ranks so that the ranks' steps are as even as they can be
    (``bucket_edges`` [p, p]: edges of bucket (i, j), None counts every bucket as one edge;
    ``batch_size``: a state's steps are ``ceil(edges / batch_size)``, None: its edges).
    Module docstring."""
    p, c = num_partitions, capacity
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1 (got {world_size!r})")
    whole = isinstance(batch_size, (int, np.integer)) and not isinstance(batch_size, bool)
    if batch_size is not None and not (whole and batch_size >= 1):
        raise ConfigError(f"batch_size must be an integer >= 1 or None (got {batch_size!r})")
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
    batch = None if batch_size is None else int(batch_size)
    candidates = [plan for num_groups in range(fewest, min(p, fewest + n_ranks) + 1)
                  for plan in _plan_groups(np.array_split(order, num_groups), weights, n_ranks,
                                           np.random.default_rng(stream), batch)]
    # More groups mean more reads (and states and rounds): only for 5 % fewer steps.
    cheapest = min(cand.cost for cand in candidates)
    best = min((cand for cand in candidates if cand.cost <= 1.05 * cheapest),
               key=lambda cand: (cand.reads, cand.cost, cand.num_rounds))
    return _assemble(best, n_ranks, plan_args=dict(
        num_partitions=p, capacity=c, epoch=epoch, seed=seed, weighted=bucket_edges is not None))


@dataclass(frozen=True, slots=True)
class _Candidate:
    """One schedule of one grouping, its groups' inner buckets placed."""

    rounds: _Rounds
    """The rounds' units and their edges."""
    inner_unit: np.ndarray
    """[l] int64: the unit (``t * width + i``) training each group's inner buckets."""
    groups: list[np.ndarray]
    """The groups' partitions, ascending."""
    group_of: np.ndarray
    """[p] int64: each partition's group."""
    cost: float
    """The rounds' busiest ranks' steps, summed (`_Rounds.cost`)."""
    reads: int
    """Partitions read in the epoch: each state's, once."""
    num_rounds: int
    """Rounds of its schedule (barriers)."""


def _plan_groups(split: list[np.ndarray], weights: np.ndarray, n_ranks: int, rng: np.random.Generator,
                 batch_size: int | None) -> list[_Candidate]:
    """The two schedules of these groups' pairs (step 2), each with its inner buckets placed."""
    groups = [np.sort(g) for g in split]
    sizes = np.array([len(g) for g in groups])
    group_of = np.empty(len(weights), dtype=np.int64)
    for index, g in enumerate(groups):
        group_of[g] = index
    between = np.zeros((len(groups), len(groups)))
    np.add.at(between, (group_of[:, None], group_of[None, :]), weights)
    cross = between + between.T
    np.fill_diagonal(cross, 0.0)
    tournament = round_robin_pairs(len(groups)) or [[(0, 0)]]  # one group: one state holding it
    largest_first = rounds_of_largest_first([pair for pairs in tournament for pair in pairs], cross, n_ranks)
    out = []
    for schedule in (tournament, largest_first):
        best = None
        # Greedy placement depends on the order of equal groups; a few orders where that is cheap.
        for _ in range(_PLACEMENT_TRIES if len(groups) <= 16 else 1):
            rounds = _Rounds(schedule, len(groups), cross, batch_size)
            inner_unit = rounds.place_inner(np.diag(between).copy(), n_ranks, rng)
            cost = rounds.cost(n_ranks)
            if best is None or cost < best[0]:
                best = (cost, rounds, inner_unit)
        cost, rounds, inner_unit = best
        out.append(_Candidate(rounds, inner_unit, groups, group_of, cost, rounds.reads(inner_unit, sizes),
                              len(schedule)))
    return out


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
    """Each round's units (states to be): its pairs of groups, then each group the round
    leaves free, alone (a state only if it is given its inner buckets), with the edges each
    would train."""

    def __init__(self, schedule: list[list[tuple[int, int]]], num_groups: int, pair_edges: np.ndarray,
                 batch_size: int | None) -> None:
        self.schedule = schedule
        self.batch_size = batch_size
        width = max(num_groups - len({g for pair in pairs for g in pair}) + len(pairs) for pairs in schedule)
        self.load = np.zeros((len(schedule), width))
        self.unit_of = np.full((len(schedule), num_groups), -1, dtype=np.int64)  # [round, group] -> unit
        self.resting = np.zeros((len(schedule), width), dtype=bool)
        for t, pairs in enumerate(schedule):
            for i, (a, b) in enumerate(pairs):  # with one group, the schedule's (0, 0) holds it
                self.unit_of[t, [a, b]] = i
                self.load[t, i] = pair_edges[a, b]
            rest = np.flatnonzero(self.unit_of[t] < 0)
            self.unit_of[t, rest] = len(pairs) + np.arange(len(rest))
            self.resting[t, len(pairs):len(pairs) + len(rest)] = True

    def steps(self, load: np.ndarray) -> np.ndarray:
        """A unit's steps for its edges: its batches given a batch size, else its edges."""
        return load if self.batch_size is None else np.ceil(load / self.batch_size)

    def members(self, t: int, i: int) -> np.ndarray:
        """The groups of round ``t``'s unit ``i``."""
        return np.flatnonzero(self.unit_of[t] == i)

    def states(self, inner_unit: np.ndarray) -> np.ndarray:
        """[rounds, width] bool: the units that become states, every pair and a group alone
        where it trains its inner buckets."""
        rounds, width = self.load.shape
        state = np.zeros((rounds, width), dtype=bool)
        state[np.arange(rounds)[:, None], self.unit_of] = True  # units with a member
        wanted = np.zeros(rounds * width, dtype=bool)
        wanted[inner_unit] = True
        return state & (~self.resting | wanted.reshape(rounds, width))

    def reads(self, inner_unit: np.ndarray, sizes: np.ndarray) -> int:
        """Partitions the states read, each state's once (``sizes`` [l]: the groups')."""
        held = self.states(inner_unit)[np.arange(len(self.schedule))[:, None], self.unit_of]  # [round, group]
        return int((held * sizes[None, :]).sum())

    def place_inner(self, inner: np.ndarray, n_ranks: int, rng: np.random.Generator) -> np.ndarray:
        """Put each group's inner edges in one round's unit holding it, largest first, where
        the round's busiest rank grows least, then improve (`_move_inner`); returns [group]
        (round, unit) as t * width + i."""
        rounds, width = self.load.shape
        shuffled = rng.permutation(len(inner))  # ties between equal groups drawn per epoch
        order = shuffled[np.argsort(-inner[shuffled], kind="stable")]
        chosen = np.empty(len(inner), dtype=np.int64)
        t_all = np.arange(rounds)
        for a in order.tolist():
            units = self.unit_of[:, a]
            before = _makespan(self.steps(self.load), n_ranks)
            trial = self.load.copy()
            trial[t_all, units] += inner[a]
            after = _makespan(self.steps(trial), n_ranks)
            # A resting unit becomes a state of its own (one more read): only for real work.
            rest = self.resting[t_all, units]
            cost = np.where(rest & (inner[a] == 0), np.inf, after - before)
            t = int(np.lexsort((self.load.sum(1), rest, after, cost))[0])
            self.load[t, units[t]] += inner[a]
            chosen[a] = t * width + units[t]
        self._move_inner(inner, chosen, n_ranks)
        return chosen

    def _move_inner(self, inner: np.ndarray, chosen: np.ndarray, n_ranks: int) -> None:
        """Move one group's inner edges to another round, the move that lowers the rounds'
        summed busiest ranks most, until none does (as many moves as groups at most)."""
        rounds, width = self.load.shape
        t_all = np.arange(rounds)
        for _ in range(len(inner)):
            busiest = _makespan(self.steps(self.load), n_ranks)
            best_gain, best_move = 1e-9, None
            for a in np.flatnonzero(inner > 0).tolist():
                s, i = divmod(int(chosen[a]), width)
                left = self.load[s:s + 1].copy()
                left[0, i] -= inner[a]
                trial = self.load.copy()
                trial[t_all, self.unit_of[:, a]] += inner[a]
                gain = (busiest[s] - _makespan(self.steps(left), n_ranks)[0]
                        + busiest - _makespan(self.steps(trial), n_ranks))
                gain[s] = -np.inf
                t = int(np.argmax(gain))
                if gain[t] > best_gain:
                    best_gain, best_move = gain[t], (a, s, i, t)
            if best_move is None:
                return
            a, s, i, t = best_move
            self.load[s, i] -= inner[a]
            self.load[t, self.unit_of[t, a]] += inner[a]
            chosen[a] = t * width + self.unit_of[t, a]

    def cost(self, n_ranks: int) -> float:
        """The busiest rank's steps summed over the rounds, each round's units dealt by `_deal`."""
        return float(_makespan(self.steps(self.load), n_ranks).sum())


def _makespan(load: np.ndarray, n_ranks: int) -> np.ndarray:
    """[rounds] each round's busiest rank when `_deal` deals its units [rounds, width] (largest
    first to the least loaded rank), for all rounds at once."""
    top = -np.sort(-load, axis=1)
    top = top[:, :max(n_ranks, int((top > 0).sum(axis=1).max(initial=0)))]  # the empty units change nothing
    totals = np.zeros((len(load), n_ranks))
    totals[:, :min(n_ranks, top.shape[1])] = top[:, :n_ranks]  # the N largest, one a rank
    rows = np.arange(len(load))
    for unit in top[:, n_ranks:].T:  # then the k-th largest unit of every round
        totals[rows, np.argmin(totals, axis=1)] += unit
    return totals.max(axis=1)


def _deal(load: np.ndarray, n_ranks: int) -> np.ndarray:
    """[units] rank of each unit: largest first to the least loaded rank (then the one with
    fewest units, so a round of at least N units gives every rank a state)."""
    ranks = np.empty(len(load), dtype=np.int64)
    totals, counts = np.zeros(n_ranks), np.zeros(n_ranks, dtype=np.int64)
    for u in np.argsort(-load, kind="stable").tolist():
        r = int(np.lexsort((np.arange(n_ranks), counts, totals))[0])
        ranks[u], totals[r], counts[r] = r, totals[r] + load[u], counts[r] + 1
    return ranks


def _assemble(best: _Candidate, n_ranks: int, *, plan_args: dict) -> EpochPlan:
    """The states round by round, each round rank by rank, and every bucket's state."""
    rounds, groups = best.rounds, best.groups
    num_rounds, width = rounds.load.shape
    num_groups = len(groups)
    is_state = rounds.states(best.inner_unit)
    state_of = {}
    states, rounds_of, ranks_of = [], [], []
    round_edges = np.zeros((num_rounds, n_ranks))
    for t in range(num_rounds):
        units = np.flatnonzero(is_state[t]).tolist()
        ranks = _deal(rounds.steps(rounds.load[t, units]), n_ranks)
        np.add.at(round_edges[t], ranks, rounds.load[t, units])
        for i, r in sorted(zip(units, ranks.tolist()), key=lambda x: (x[1], x[0])):
            state_of[t * width + i] = len(states)
            states.append(tuple(sorted(np.concatenate([groups[g] for g in rounds.members(t, i)]).tolist())))
            rounds_of.append(t)
            ranks_of.append(r)
    table = np.full((num_groups, num_groups), -1, dtype=np.int32)
    for t, pairs in enumerate(rounds.schedule):
        for a, b in pairs:
            table[a, b] = table[b, a] = state_of[t * width + rounds.unit_of[t, a]]
    table[np.arange(num_groups), np.arange(num_groups)] = [state_of[u] for u in best.inner_unit.tolist()]
    bucket_states = table[best.group_of[:, None], best.group_of[None, :]]
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
