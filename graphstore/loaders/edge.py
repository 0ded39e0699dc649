"""`EdgeLoader`: batches of training edges with negatives, for link prediction."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store
from graphstore.loaders.base import BufferedLoader
from graphstore.loaders.schemes import SCHEMES
from graphstore.loaders.settings import EdgeLoaderSettings
from graphstore.loaders.shard import Shard
from graphstore.loaders.stages import (
    EdgeNeighbourSampling,
    EdgeTargets,
    EpochContext,
    Negatives,
    Stage,
    bucket_edge_counts,
    run_stages,
)

__all__ = ["EdgeLoader"]


class EdgeLoader(BufferedLoader):
    """Batches of training edges (the store's edges) with negatives, for link prediction.

    The training edges are the store's edges; each state trains the buckets the plan
    assigns to it (COMET/BETA: every bucket exactly once an epoch), shuffled, in batches of
    ``batch_size`` positives with ``negatives`` shared per chunk (MariusGNN's
    ``num_chunks``, ``degree_fraction``), drawn from the state's resident nodes. An epoch
    is the stages ``BufferWalk -> EdgeTargets -> Negatives [-> EdgeNeighbourSampling]``.

    With ``embeddings`` (an `EmbeddingTable`), the resident rows are
    ``batch.graph.embeddings`` and every update to them is written back to the store.
    With ``fanouts``, each batch also carries a DENSE over its distinct endpoints and
    negatives, for a GNN encoder.

    Data parallelism (``rank``, ``world_size``; `graphstore.distributed.data_parallel`): the
    minibatch scheme divides its one state by batches (every N-th); the disk scheme divides
    COMET's/BETA's states in blocks when the inputs are the store's features, and with
    learnable embeddings runs the ``disjoint`` plan: rounds of partition-disjoint states,
    each rank its own, so each partition's rows are held and written back by one rank at a
    time (``embedding_placement="owned"``). Between rounds the caller synchronises the ranks
    (the trainer's barrier), after `epoch` (with ``round=t``) wrote them back. With the
    minibatch scheme every rank holds the whole table (``"replicated"``): the trainer applies
    every rank's updates on every rank, and only rank 0 writes back.
    """

    task = "link"

    def __init__(self, store: Store, *, batch_size: int, negatives: int, num_chunks: int = 1,
                 degree_fraction: float = 0.0, scheme: str = "minibatch", policy: str | None = None,
                 capacity: int | None = None, buffer_bytes: int | None = None,
                 embeddings: EmbeddingTable | None = None, fanouts: Sequence[int] | None = None,
                 num_logical_partitions: int | None = None, seed: int = 0, prefetch: bool = True,
                 rank: int = 0, world_size: int = 1) -> None:
        if int(batch_size) < 1 or int(negatives) < 0 or int(num_chunks) < 1:
            raise ConfigError("batch_size and num_chunks must be >= 1 and negatives >= 0")
        self.batch_size, self.negatives, self.num_chunks = int(batch_size), int(negatives), int(num_chunks)
        self.degree_fraction = float(degree_fraction)
        self.table = embeddings
        self.fanouts = None if fanouts is None else tuple(fanouts)
        shard = Shard(int(rank), int(world_size))  # checks the pair
        self.shard = shard if shard.world_size > 1 else None
        self.embedding_placement = None
        whole_graph = scheme in SCHEMES and SCHEMES.get(scheme).whole_graph
        if self.shard is not None and embeddings is not None:
            if whole_graph:
                self.embedding_placement = "replicated"
            else:
                if policy not in (None, "disjoint"):
                    raise ConfigError(f"policy {policy!r} walks one buffer through overlapping states, so two ranks "
                                      f"would hold (and write back) the same embedding rows; with learnable "
                                      f"embeddings and {world_size} ranks the disk scheme runs policy 'disjoint'")
                policy, self.embedding_placement = "disjoint", "owned"
        options = {}
        if num_logical_partitions is not None:
            if (policy or "comet") != "comet" or scheme != "disk":
                raise ConfigError("num_logical_partitions is COMET's setting (scheme 'disk', policy 'comet')")
            options["num_logical_partitions"] = num_logical_partitions
        if policy == "disjoint":
            options["world_size"] = int(world_size)
        # Without it, COMET picks l from the capacity the budget settles on
        # (`default_logical_partitions`: two logical partitions always fit), so every
        # capacity the budget search tries is a valid plan.
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, embedding_dim=0 if embeddings is None else embeddings.dim,
                         policy_options=options, embeddings=embeddings, shard=self.shard,
                         write_back=not (self.embedding_placement == "replicated" and shard.rank > 0))
        # COMET's l, chosen or derived (the same every epoch), is part of what was decided.
        comet = self.plan(0).options if self.policy == "comet" else {}
        self.settings = EdgeLoaderSettings(
            **self._common_settings(), batch_size=self.batch_size, negatives=self.negatives,
            num_chunks=self.num_chunks, degree_fraction=self.degree_fraction, fanouts=self.fanouts,
            embedding_dim=self.embedding_dim, **comet,
            world_size=None if self.shard is None else self.shard.world_size,
            embedding_placement=self.embedding_placement)

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options, task="link") if self.policy == "in_memory" else dict(self.options)

    def stages(self) -> list[Stage]:
        """The stages after the buffer walk, in order."""
        stages: list[Stage] = [
            EdgeTargets(self.batch_size, shard=self.shard),
            Negatives(negatives=self.negatives, num_chunks=self.num_chunks, degree_fraction=self.degree_fraction),
        ]
        return stages + ([EdgeNeighbourSampling(self.fanouts)] if self.fanouts is not None else [])

    @property
    def rank(self) -> int:
        return 0 if self.shard is None else self.shard.rank

    def num_rounds(self, epoch: int) -> int:
        """Rounds of ``epoch``: the ``disjoint`` plan's (ranks synchronise between them), else 1."""
        plan = self.plan(epoch)
        return 1 if plan.state_rounds is None else int(plan.options["num_rounds"])

    def epoch(self, epoch: int, *, lookahead: bool = True, round: int | None = None) -> Iterator:
        """The batches of ``epoch`` (or of its round ``round`` only); with ``lookahead``, the
        next epoch's first partitions are read during the last state (not with rounds).

        A plan with rounds draws each round's randomness from its own streams, keyed by
        ``(round, rank)``, so a round replays without the rounds before it. Each round's
        updated embeddings are written back when its batches end."""
        plan = self.plan(epoch)
        if plan.state_rounds is None:
            if round not in (None, 0):
                raise ConfigError(f"epoch {epoch} has one round (policy {self.policy}); got round={round}")
            yield from super().epoch(epoch, lookahead=lookahead)
            return
        for t in range(self.num_rounds(epoch)) if round is None else [int(round)]:
            ctx = EpochContext(epoch, plan, self.seed, round=t, stream=(t, self.rank))
            yield from run_stages(self.walk.states(ctx, lookahead=False), self.stages(), ctx)

    def round_steps(self, epoch: int) -> list[tuple[int, int]]:
        """Per round of ``epoch``: ``(this rank's batches, optimizer steps)``, the steps being
        the most batches any rank has in the round (one round without a ``disjoint`` plan).
        Every rank computes the same steps from the plan, so their collectives match."""
        plan = self.plan(epoch)
        per_state = [math.ceil(n / self.batch_size) for n in bucket_edge_counts(plan, self._bucket_sizes())]
        if plan.state_rounds is None:
            if self.shard is None:
                return [(sum(per_state), sum(per_state))]
            counts = self.shard.batch_counts(per_state, by_states=self.shard.by_states(len(per_state)))
            return [(counts[self.rank], max(counts))]
        world = 1 if self.shard is None else self.shard.world_size
        table = np.zeros((self.num_rounds(epoch), world), dtype=np.int64)
        np.add.at(table, (np.asarray(plan.state_rounds), np.asarray(plan.state_ranks)), per_state)
        return [(int(row[self.rank]), int(row.max())) for row in table]

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` (COMET regroups every epoch, so the count varies a little);
        with ``world_size > 1``, this rank's."""
        return sum(own for own, _ in self.round_steps(epoch))

    def num_steps(self, epoch: int) -> int:
        """Optimizer steps of ``epoch``: `num_batches`, or with ``world_size > 1`` the most
        batches any rank has, round by round (a rank with fewer pads with zero steps)."""
        return sum(steps for _, steps in self.round_steps(epoch))

    def _bucket_sizes(self) -> np.ndarray:
        p = self.store.num_partitions
        return np.diff(self.store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: bucket (i, j)
