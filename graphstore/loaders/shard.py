"""Rank ``r`` of ``N``'s share of an epoch, for data-parallel training (pure: no
torch.distributed here; the process group and DDP live in `graphstore.distributed`).

Every rank computes the same `EpochPlan` from ``(seed, epoch)`` and takes a disjoint share
of its work, divided the way the scheme divides an epoch:

- **by buffer states** when the plan has at least ``N`` states (megabatch's mega-batches,
  disk's DISPERSED states): rank ``r`` loads and trains a contiguous block of the states
  (`Shard.states`), so each rank reads only its own states' partitions and consecutive
  states of a block still differ by few swaps. Which targets a state trains comes from
  the whole plan (`EpochPlan.target_states`), so the blocks' targets are disjoint and
  together are the single-process epoch's;
- **by batches** otherwise (minibatch, microbatch and macrobatch hold the whole graph in
  one state): every rank draws the same target order and keeps batches ``r, r + N,
  r + 2N, ...`` of the epoch (`Shard.takes_batch`);
- **by owner** (`Shard.local_shares`; the default of the macrobatch scheme, whose rows come
  from their owners under BatchGNN's partitioned placement): rank ``r`` trains the targets
  of its own block of partitions (`block_bounds`), balanced to equal shares, as DistDGL's
  ``node_split(..., force_even=True)`` gives each trainer its partition's seeds. Every
  rank still holds the whole graph's structure and samples across it; only its targets
  are its own, so most of its sampled rows are too.

Either way ``batch_size`` is per rank: one optimizer step trains one batch of every rank,
as torch's DistributedSampler does. Ranks may end up with different batch counts (states
hold different numbers of targets; the last batches of an epoch); `Shard.steps` is the
largest, and the trainer pads a shorter rank with zero-weight steps so that DDP's
collectives stay matched (`graphstore.distributed.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphstore.errors import ConfigError

__all__ = ["Shard", "block_bounds", "partition_blocks"]


def partition_blocks(num_partitions: int, world_size: int) -> list[tuple[int, int]]:
    """``[first, stop)`` partitions of every rank's block: contiguous runs whose lengths
    differ by at most one. The rule of `graphstore.distributed.rank_partitions` (full-batch
    ranks' blocks, BatchGNN's owners of feature rows), which the loaders cannot import;
    tests/distributed/test_feature_fetch.py checks that the two agree.

    >>> partition_blocks(8, 3)
    [(0, 3), (3, 5), (5, 8)]
    """
    bounds = np.linspace(0, num_partitions, world_size + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def block_bounds(num_partitions: int, partition_size: int, num_nodes: int, world_size: int) -> np.ndarray:
    """int64 [world_size + 1]: the store id where each rank's block (`partition_blocks`)
    starts, then ``num_nodes``."""
    starts = [min(a * partition_size, num_nodes) for a, _ in partition_blocks(num_partitions, world_size)]
    return np.array(starts + [num_nodes], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Shard:
    """One rank's place among ``world_size`` data-parallel ranks.

    Examples
    --------
    >>> s = Shard(rank=1, world_size=2)
    >>> list(s.states(5)), s.by_states(5), s.by_states(1)
    ([3, 4], True, False)
    >>> [i for i in range(5) if s.takes_batch(i)]
    [1, 3]
    >>> s.batch_counts([3, 1, 2, 2, 4], by_states=True), s.batch_counts([3, 1, 2, 2, 4], by_states=False)
    ([6, 6], [6, 6])
    """

    rank: int
    """This rank, in ``[0, world_size)``."""
    world_size: int
    """Ranks sharing each epoch (N >= 1)."""

    def __post_init__(self) -> None:
        if int(self.world_size) < 1 or not 0 <= int(self.rank) < int(self.world_size):
            raise ConfigError(f"rank must be in [0, world_size) and world_size >= 1 "
                              f"(got rank {self.rank}, world_size {self.world_size})")

    def by_states(self, num_states: int) -> bool:
        """Whether an epoch of ``num_states`` states is divided by states (else by batches)."""
        return self.world_size > 1 and num_states >= self.world_size

    def block(self, rank: int, num_states: int) -> range:
        """The contiguous block of state indices ``rank`` trains (sizes differ by at most one)."""
        base, extra = divmod(num_states, self.world_size)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (rank < extra))

    def states(self, num_states: int) -> range:
        """The state indices this rank loads: its block, or every state when divided by batches."""
        return self.block(self.rank, num_states) if self.by_states(num_states) else range(num_states)

    def takes_batch(self, index: int) -> bool:
        """Whether this rank trains the epoch's batch ``index`` (division by batches)."""
        return index % self.world_size == self.rank

    def batch_counts(self, per_state: Sequence[int], *, by_states: bool) -> list[int]:
        """Batches of every rank, given the batches of every state of the epoch."""
        n = self.world_size
        if by_states:
            return [sum(per_state[i] for i in self.block(r, len(per_state))) for r in range(n)]
        total = sum(per_state)
        return [total // n + (r < total % n) for r in range(n)]

    def local_shares(self, targets: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
        """Every rank's targets when each trains the targets its own block holds, balanced.

        Rule: rank ``r`` gets ``q_r = T // N + (r < T % N)`` of the ``T`` targets (so batch
        counts differ by at most one, and padding covers the rest). It keeps the lowest
        ``min(own_r, q_r)`` of the targets in its block ``[bounds[r], bounds[r + 1])``; the
        targets beyond a full rank's quota go, in id order, to the ranks short of theirs, in
        rank order. So ``sum_r max(0, own_r - q_r)`` targets train away from their block,
        the fewest any division into these quotas allows, and the shares together are
        ``targets`` exactly once.

        Parameters
        ----------
        targets : int64 array [T]
            Distinct store ids (any order).
        bounds : int64 array [world_size + 1]
            First store id of each rank's block, then one past the last (covering ``targets``).

        Returns
        -------
        list of int64 arrays
            ``world_size`` shares, each ascending.

        Examples
        --------
        >>> s = Shard(rank=0, world_size=2)
        >>> [a.tolist() for a in s.local_shares(np.array([0, 1, 2, 3, 7]), np.array([0, 5, 10]))]
        [[0, 1, 2], [3, 7]]
        """
        n, targets = self.world_size, np.sort(np.asarray(targets, dtype=np.int64))
        bounds = np.asarray(bounds, dtype=np.int64)
        if bounds.shape != (n + 1,) or (targets.size and (targets[0] < bounds[0] or targets[-1] >= bounds[-1])):
            raise ConfigError(f"bounds must be [{n + 1}] store ids covering every target (got {bounds.tolist()} "
                              f"for targets in [{targets[:1].tolist()}, {targets[-1:].tolist()}])")
        quota = np.array([targets.size // n + (r < targets.size % n) for r in range(n)], dtype=np.int64)
        cuts = np.searchsorted(targets, bounds)
        own = np.diff(cuts)
        keep = np.minimum(own, quota)
        owner = np.repeat(np.arange(n), own)
        position = np.arange(targets.size) - cuts[:-1][owner]  # place within its owner's block
        overflow = targets[position >= keep[owner]]
        room = np.concatenate([[0], np.cumsum(quota - keep)])
        return [np.sort(np.concatenate([targets[cuts[r]:cuts[r] + keep[r]], overflow[room[r]:room[r + 1]]]))
                for r in range(n)]

    def steps(self, per_state: Sequence[int]) -> int:
        """Optimizer steps of the epoch: the most batches any rank has."""
        return max(self.batch_counts(per_state, by_states=self.by_states(len(per_state))))
