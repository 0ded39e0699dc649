"""`EdgeLoader`: batches of training edges with negatives, for link prediction."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import torch

from graphstore.buffer.manager import LoadedState
from graphstore.buffer.policies import EpochPlan
from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.hashing import mix64
from graphstore.layout.store import Store
from graphstore.loaders.base import BufferedLoader
from graphstore.loaders.batches import EdgeBatch
from graphstore.loaders.schemes import SCHEMES
from graphstore.loaders.seeds import epoch_seed
from graphstore.loaders.settings import EdgeLoaderSettings
from graphstore.loaders.shard import Shard
from graphstore.loaders.stages import (
    EdgeNeighbourSampling,
    EdgeTargets,
    EpochContext,
    Negatives,
    SALT_EDGE_ORDER,
    PositiveEdges,
    Stage,
    bucket_edge_counts,
    positive_batches,
    run_stages,
)

__all__ = ["EdgeLoader", "SpreadEdgeTargets", "spread_edge_counts"]

# An `epoch_seed` salt of the bucket spread (the stages' salts are 1-13).
SALT_BUCKET_SPREAD = 21
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)


def _holds(plan: EpochPlan) -> np.ndarray:
    """``[S, p] bool``: partition k resident in state s."""
    hold = np.zeros((len(plan.states), plan.num_partitions), dtype=bool)
    for s, parts in enumerate(plan.states):
        hold[s, list(parts)] = True
    return hold


def _rotation(base: int, bucket: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per bucket ``i * p + j``, which of its ``count`` shares its first co-resident state takes."""
    h = mix64(np.asarray(bucket, dtype=np.uint64) * _M1 ^ np.uint64(base))
    return (h % np.maximum(count, 1).astype(np.uint64)).astype(np.int64)


def _share_sizes(n: np.ndarray, m: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Size of share ``share`` when ``n`` edges are cut into ``m`` near-equal shares (the
    first ``n % m`` one larger: `torch.tensor_split`)."""
    m = np.maximum(m, 1)
    return n // m + (share < n % m)


def _share_of_position(t: np.ndarray, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Which share position ``t`` (``0 <= t < n``) falls in, shares as `_share_sizes`."""
    m = np.maximum(m, 1)
    base, extra = n // m, n % m
    boundary = extra * (base + 1)
    return np.where(t < boundary, t // (base + 1), extra + (t - boundary) // np.maximum(base, 1))


class _PairCounts:
    """A plan's states walked in order: for state ``s`` and its partitions, how many states
    hold both ends of each bucket among them, in all and before ``s`` (running counts, so
    a walk costs ``O(S c^2 + S p^2)``, not a pass over the states per state)."""

    def __init__(self, plan: EpochPlan) -> None:
        self.hold = _holds(plan)
        h = self.hold.astype(np.float32)  # BLAS; counts stay far below 2**24
        self.total = np.rint(h.T @ h).astype(np.int64)
        self.before = np.zeros_like(self.total)
        self.next = 0

    def at(self, s: int, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if s < self.next:
            self.before[:] = 0
            self.next = 0
        while self.next < s:
            held = np.flatnonzero(self.hold[self.next])
            self.before[np.ix_(held, held)] += 1
            self.next += 1
        return self.total[np.ix_(parts, parts)], self.before[np.ix_(parts, parts)]


def spread_edge_counts(plan: EpochPlan, bucket_sizes: np.ndarray, *, seed: int) -> list[int]:
    """Training edges of each state of ``plan`` under `SpreadEdgeTargets` (``bucket_sizes[i,
    j]``: edges of bucket (i, j)): each bucket's edges cut into near-equal shares, one per
    state holding both its partitions."""
    pairs = _PairCounts(plan)
    p = plan.num_partitions
    base = epoch_seed(seed, plan.epoch, SALT_BUCKET_SPREAD)
    counts = []
    for s, state in enumerate(plan.states):
        parts = np.asarray(sorted(state), dtype=np.int64)
        m, before = pairs.at(s, parts)
        bucket = parts[:, None] * p + parts[None, :]
        share = (before + _rotation(base, bucket, m)) % m
        counts.append(int(_share_sizes(bucket_sizes[np.ix_(parts, parts)], m, share).sum()))
    return counts


class SpreadEdgeTargets:
    """`EdgeTargets` with each bucket's edges spread over every state that holds both of
    its partitions, instead of all in the one state the plan assigns the bucket to.

    Bucket (i, j) is resident together in ``m_ij`` states of the epoch; its edges, ordered
    by a seeded hash of ``(src, dst, rel)`` and the epoch, are cut into ``m_ij`` near-equal
    shares, and the ``k``-th state holding both trains share ``(k + r_ij) mod m_ij`` (``r_ij``
    a seeded rotation). Every state computes the same order from the same resident edges,
    so every edge trains exactly once an epoch, in a state where both its ends are resident.

    Why (a departure from MariusGNN, which trains a bucket whole in one random co-resident
    state): MariusGNN's partitions are random, ours are METIS communities by default, so a
    bucket holds one community's edges (the diagonal buckets hold 31 % of a synthetic
    FB15k-237-like graph's edges at 16 partitions, 85 % of WN18RR's), and training it whole
    in one state makes that state's examples correlated: its relation mix is far from the
    graph's, and consecutive steps pull the model towards each state's communities in turn
    (1.9 points of MRR below in-memory training there; docs/benchmarks.md). Spread over
    the states that could train it, each state gets the expected mix of COMET's random
    assignment, which recovers about a quarter of that. The IO is the plan's: the states
    and their partitions are the same."""

    def __init__(self, batch_size: int, *, seed: int) -> None:
        self.batch_size, self.seed = batch_size, seed

    def __call__(self, states: Iterator[LoadedState], ctx: EpochContext) -> Iterator[PositiveEdges]:
        order_gen = ctx.generator(SALT_EDGE_ORDER)
        plan = ctx.plan
        pairs = _PairCounts(plan)
        p = plan.num_partitions
        base = epoch_seed(self.seed, plan.epoch, SALT_BUCKET_SPREAD)
        index = 0
        for loaded in states:
            g = loaded.graph
            src, dst, edges = self._edges_here(g, loaded.index, pairs, p, base)
            order = torch.randperm(edges.numel(), generator=order_gen)
            starts = [(index + k, start) for k, start in enumerate(range(0, edges.numel(), self.batch_size))]
            index += len(starts)
            yield from positive_batches(g, src[order], dst[order], edges[order], starts, self.batch_size)

    @staticmethod
    def _edges_here(g, s: int, pairs: _PairCounts, p: int, base: int):
        """State ``s``'s share of every bucket among its resident partitions."""
        src, dst, edges = g.training_edges(None, s)
        if edges.numel() == 0:
            return src, dst, edges
        ids = g.node_ids
        P = g.partition_size
        si, di = ids[src].numpy().astype(np.int64), ids[dst].numpy().astype(np.int64)
        rel = g.rel[edges].numpy().astype(np.int64) if g.rel is not None else np.zeros(len(si), np.int64)
        parts = np.unique(np.concatenate([si // P, di // P]))
        m_all, before_all = pairs.at(s, parts)
        a, b = np.searchsorted(parts, si // P), np.searchsorted(parts, di // P)
        m, before = m_all[a, b], before_all[a, b]
        bucket = (si // P) * p + di // P
        share = (before + _rotation(base, bucket, m)) % m
        # A key per edge from its ends, relation and the epoch alone: the same in every
        # state, whatever the slots. Equal edges (kept duplicates) tie, which is harmless:
        # each state counts positions, so each copy is taken once.
        key = mix64((si.astype(np.uint64) * _M1) ^ (di.astype(np.uint64) * _M2)
                    ^ (rel.astype(np.uint64) * _M3) ^ np.uint64(base))
        order = np.lexsort((key, bucket))
        sorted_bucket = bucket[order]
        starts = np.searchsorted(sorted_bucket, sorted_bucket, side="left")
        n = np.searchsorted(sorted_bucket, sorted_bucket, side="right") - starts
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order)) - starts
        n_edge = np.empty(len(order), dtype=np.int64)
        n_edge[order] = n
        keep = torch.from_numpy(_share_of_position(position, n_edge, m) == share)
        return src[keep], dst[keep], edges[keep]


class EdgeLoader(BufferedLoader):
    """Batches of training edges (the store's edges) with negatives, for link prediction.

    The training edges are the store's edges; each state trains the buckets the plan
    assigns to it (COMET/BETA: every bucket exactly once an epoch), shuffled, in batches of
    ``batch_size`` positives with ``negatives`` shared per chunk (MariusGNN's
    ``num_chunks``, ``degree_fraction``), drawn from the state's resident nodes. An epoch
    is the stages ``BufferWalk -> EdgeTargets (or SpreadEdgeTargets) -> Negatives
    [-> EdgeNeighbourSampling]``.

    With a plan of several states with edge buckets (the disk scheme) in one process, each
    bucket's edges are by default spread over every state that holds both its partitions
    (`SpreadEdgeTargets`): still every edge once an epoch, with each state's examples less
    correlated when the partitions are METIS communities (docs/benchmarks.md, "Link
    prediction out of core on METIS partitions"). ``spread_buckets=False`` trains each
    bucket whole in the one state the plan assigns it, as MariusGNN does.

    With ``embeddings`` (an `EmbeddingTable`), the resident rows are
    ``batch.graph.embeddings`` and every update to them is written back to the store.
    With ``fanouts``, each batch also carries a DENSE over its distinct endpoints and
    negatives, for a GNN encoder.

    Negatives and the encoder's sampling run on ``loader_threads`` threads ahead of the
    consumer (`graphstore.loaders.pipeline`; 0: in its thread), each batch from its own
    random streams, so the batches are the same for every value; a ``transform`` (e.g.
    ``EdgeBatch.to_pyg``) runs there too. They read the structure only: the embedding rows
    the consumer updates are never read ahead.

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
                 rank: int = 0, world_size: int = 1, spread_buckets: bool | None = None,
                 loader_threads: int | None = None, transform: Callable[[EdgeBatch], Any] | None = None) -> None:
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
            # Rounds are padded to their busiest rank: the plan balances the ranks' edges.
            p = store.num_partitions
            options["bucket_edges"] = np.diff(store.bucket_offsets).reshape(p, p).T
        # Without it, COMET picks l from the capacity the budget settles on
        # (`default_logical_partitions`: two logical partitions always fit), so every
        # capacity the budget search tries is a valid plan.
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, embedding_dim=0 if embeddings is None else embeddings.dim,
                         policy_options=options, embeddings=embeddings, shard=self.shard,
                         write_back=not (self.embedding_placement == "replicated" and shard.rank > 0),
                         loader_threads=loader_threads, transform=transform)
        self.spread_buckets = self._resolve_spread(spread_buckets)
        # COMET's l, chosen or derived (the same every epoch), is part of what was decided.
        comet = self.plan(0).options if self.policy == "comet" else {}
        self.settings = EdgeLoaderSettings(
            **self._common_settings(), batch_size=self.batch_size, negatives=self.negatives,
            num_chunks=self.num_chunks, degree_fraction=self.degree_fraction, fanouts=self.fanouts,
            embedding_dim=self.embedding_dim, **comet,
            world_size=None if self.shard is None else self.shard.world_size,
            embedding_placement=self.embedding_placement, spread_buckets=self.spread_buckets)

    def _samples_neighbours(self) -> bool:
        # Without an encoder a batch reads its endpoints' and negatives' rows only: cut edges
        # lose nothing, and random partitions are the better choice (MariusGNN's).
        return self.fanouts is not None

    def _resolve_spread(self, spread_buckets: bool | None) -> bool:
        """Whether `SpreadEdgeTargets` picks each state's edges: by default wherever it can, a
        plan of several states with buckets walked by one process (the in-memory plan's one
        state, a ``disjoint`` plan's rounds and data-parallel shards keep `EdgeTargets`)."""
        plan = self.plan(0)
        possible = (plan.bucket_states is not None and len(plan.states) > 1 and plan.state_rounds is None
                    and self.shard is None)
        if spread_buckets is None:
            return possible
        if spread_buckets and not possible:
            raise ConfigError("spread_buckets needs a plan with edge buckets walked by one process "
                              f"(policy {self.policy!r}, world_size {1 if self.shard is None else self.shard.world_size})")
        return bool(spread_buckets)

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options, task="link") if self.policy == "in_memory" else dict(self.options)

    def stages(self) -> list[Stage]:
        """The stages after the buffer walk, in order."""
        targets = (SpreadEdgeTargets(self.batch_size, seed=self.seed) if self.spread_buckets
                   else EdgeTargets(self.batch_size, shard=self.shard))
        per_batch: list = [
            Negatives(negatives=self.negatives, num_chunks=self.num_chunks, degree_fraction=self.degree_fraction)]
        if self.fanouts is not None:
            per_batch.append(EdgeNeighbourSampling(self.fanouts))
        return self._pipeline(targets, per_batch, [])

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
        counts = (spread_edge_counts(plan, self._bucket_sizes(), seed=self.seed) if self.spread_buckets
                  else bucket_edge_counts(plan, self._bucket_sizes()))
        per_state = [math.ceil(n / self.batch_size) for n in counts]
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
