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
  r + 2N, ...`` of the epoch (`Shard.takes_batch`).

Either way ``batch_size`` is per rank: one optimizer step trains one batch of every rank,
as torch's DistributedSampler does. Ranks may end up with different batch counts (states
hold different numbers of targets; the last batches of an epoch); `Shard.steps` is the
largest, and the trainer pads a shorter rank with zero-weight steps so that DDP's
collectives stay matched (`graphstore.distributed.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphstore.errors import ConfigError

__all__ = ["Shard"]


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

    def steps(self, per_state: Sequence[int]) -> int:
        """Optimizer steps of the epoch: the most batches any rank has."""
        return max(self.batch_counts(per_state, by_states=self.by_states(len(per_state))))
