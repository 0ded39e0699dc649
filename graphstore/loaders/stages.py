"""The stages an epoch flows through, each with one job and typed items in and out.

::

    Planner ──EpochPlan──> BufferWalk ──LoadedState──> NodeTargets ──TargetBatch──>
        NeighbourSampling ──SampledBatch──> GatherRows ──NodeBatch──> [MicroBatchSplit] ──NodeBatch

    Planner ──EpochPlan──> BufferWalk ──LoadedState──> EdgeTargets ──PositiveEdges──>
        Negatives ──EdgeBatch──> [EdgeNeighbourSampling] ──EdgeBatch

A stage is a callable ``stage(items, ctx) -> iterator``: it consumes the previous stage's
items lazily and yields its own, so the buffer's next state loads while this state's
batches train. The stages after the targets that work on one batch alone (sampling,
gathering, negatives, a fixed micro-batch split) are per-batch steps (``bind(ctx)``): the
loader runs them on its threads (`graphstore.loaders.pipeline.Pipelined`), each batch from
its own random streams (`EpochContext.batch_generator`). Each stage that draws takes its own random stream from the `EpochContext`
(``ctx.generator(salt)``), so an epoch replays exactly and adding a stage never shifts
another's draws. `run_stages` chains them and closes every stage when the consumer stops,
so the buffer is closed (and embeddings written back) however the epoch ends.

Macro-batching is `graphstore.loaders.macro.MacroBatchGather` in place of `GatherRows`.
New schemes (``to_pyg()``/``to_dgl()``) are new stages in this chain, not branches inside
one generator. Data-parallel sharding (`graphstore.loaders.shard`) is a `Shard` given to
the first two stages rather than a filter stage after them: `BufferWalk` loads only the
rank's block of states and `NodeTargets` keeps only the rank's batches, so a rank reads and
samples nothing another rank trains.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
import torch

from graphstore._heap import trim_heap
from graphstore.buffer import BufferManager, BufferMemory, BufferStats, StaticCache, plan_epoch
from graphstore.buffer.manager import LoadedState, planned_read_bytes
from graphstore.buffer.policies import EpochPlan
from graphstore.buffer.resident import ResidentGraph, build_structure_graph
from graphstore.buffer.slots import lookahead_within, slots_needed
from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store
from graphstore.loaders.batches import EdgeBatch, EdgeIndex, NodeBatch
from graphstore.loaders.pipeline import ThreadLocalWorkspace
from graphstore.loaders.seeds import epoch_generator, epoch_seed
from graphstore.loaders.shard import Shard
from graphstore.sample import DENSE, Batch, choose_micro_batches, sample_dense, split_dense
from graphstore.sample.dense import new_workspace
from graphstore.sample.microbatch import DenseSizes
from graphstore.sample.negatives import sample_negatives

__all__ = [
    "BufferWalk", "EdgeNeighbourSampling", "EdgeTargets", "EpochContext", "GatherRows", "MicroBatchSplit",
    "Negatives", "NeighbourSampling", "NodeTargets", "Planner", "PositiveEdges", "SampledBatch", "Stage",
    "StructureWalk",
    "TargetBatch", "run_stages",
]

In = TypeVar("In")
Out = TypeVar("Out")

# Random streams by purpose (values fixed: recorded runs replay with them).
SALT_NODE_ORDER, SALT_NODE_SAMPLE = 1, 2
SALT_EDGE_ORDER, SALT_NEGATIVES, SALT_EDGE_SAMPLE = 3, 4, 5
SALT_MICRO_SPLIT = 13  # an `epoch_seed` salt: the micro-batch splitters take integer seeds


@dataclass(frozen=True, slots=True)
class EpochContext:
    """What every stage of one epoch may read."""

    epoch: int
    plan: EpochPlan
    seed: int
    round: int | None = None
    """A plan with rounds (`EpochPlan.state_rounds`): the round this pass runs."""
    stream: tuple[int, ...] = ()
    """Keys of this pass's own random streams (a round's: ``(round, rank)``); none for a
    whole epoch."""

    def generator(self, salt: int) -> torch.Generator:
        """The epoch's (or the round's) random stream for one purpose."""
        return epoch_generator(self.seed, self.epoch, salt, *self.stream)

    def batch_generator(self, salt: int, index: int) -> torch.Generator:
        """Batch ``index``'s own random stream for one purpose: what a per-batch stage draws
        from, so a batch is the same whichever thread runs it and whenever
        (`graphstore.loaders.pipeline`)."""
        return epoch_generator(self.seed, self.epoch, salt, *self.stream, index)


class Stage(Protocol[In, Out]):
    def __call__(self, items: Iterator[In], ctx: EpochContext) -> Iterator[Out]: ...


def run_stages(source: Iterator, stages: Sequence[Stage], ctx: EpochContext) -> Iterator:
    """Chain ``stages`` after ``source`` and yield the last one's items; every stage is
    closed when the consumer stops (early, by an error, or at the end), last first, so
    the source (the buffer walk) finishes its clean-up after everything that used it."""
    streams = [source]
    for stage in stages:
        streams.append(stage(streams[-1], ctx))
    try:
        yield from streams[-1]
    finally:
        for stream in reversed(streams):
            stream.close()


# ------------------------------------------------------------------ items between stages


@dataclass(frozen=True, slots=True)
class TargetBatch:
    """Targets of one batch, in the state's local ids."""

    graph: ResidentGraph
    targets: torch.Tensor
    """int64 [B] local ids."""
    index: int
    """The batch's place in the epoch (all ranks' batches counted): its random streams' key."""
    ends_state: bool
    """The last batch of its state (the buffer may move on once it is consumed)."""
    class_weights: torch.Tensor | None = None
    """float32 [num_classes] loss weight of each class in this batch's state, or None
    (`NodeTargets`'s ``balance``)."""


@dataclass(frozen=True, slots=True)
class SampledBatch:
    """A batch's sampled neighbourhood, before its rows are gathered."""

    graph: ResidentGraph
    dense: DENSE
    class_weights: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class PositiveEdges:
    """Positive edges of one batch, in the state's local ids."""

    graph: ResidentGraph
    src: torch.Tensor
    """int64 [B]."""
    dst: torch.Tensor
    """int64 [B]."""
    rel: torch.Tensor
    """int64 [B] relation ids (zeros without relations)."""
    index: int
    """The batch's place in the epoch (or round): its random streams' key."""
    ends_state: bool
    """The last batch of its state (the buffer may move on once it is consumed)."""


# ------------------------------------------------------------------ plan and buffer


class Planner:
    """Settings -> each epoch's `EpochPlan` (a pure function of them and the epoch)."""

    KEPT = 4
    """Plans kept (the loader asks for an epoch's plan several times: its batches, its
    steps, the next epoch's lookahead; a data-parallel plan takes seconds at 64 groups)."""

    def __init__(self, store: Store, policy: str, capacity: int, seed: int, options: dict) -> None:
        self.store, self.policy, self.capacity, self.seed = store, policy, capacity, seed
        self.options = dict(options)
        self._kept: dict[int, EpochPlan] = {}

    def plan(self, epoch: int) -> EpochPlan:
        plan = self._kept.get(epoch)
        if plan is None:
            plan = plan_epoch(self.policy, num_partitions=self.store.num_partitions, capacity=self.capacity,
                              epoch=epoch, seed=self.seed, **self.options)
            if len(self._kept) >= self.KEPT:
                self._kept.pop(next(iter(self._kept)))  # the oldest asked for
            self._kept[epoch] = plan
        return plan


class BufferWalk:
    """Source stage: the epoch's states through a `BufferManager` (the next state read in
    the background), with the slot memory allocated once for the run."""

    def __init__(self, store: Store, planner: Planner, *, prefetch: bool, embedding_dim: int,
                 cache: StaticCache | None, embeddings: EmbeddingTable | None = None,
                 shard: Shard | None = None, write_back: bool = True) -> None:
        self.store, self.planner, self.prefetch = store, planner, prefetch
        self.embedding_dim, self.cache, self.embeddings = embedding_dim, cache, embeddings
        self.shard, self.write_back = shard, write_back
        self.memory: BufferMemory | None = None
        self.epoch_stats: list[BufferStats] = []

    def release(self) -> int:
        """Free the slot memory kept between epochs (the next epoch allocates it and reads
        its partitions again); the bytes it held. For a phase that needs the memory, such
        as exact evaluation within the same budget."""
        memory, self.memory = self.memory, None
        if memory is None:
            return 0
        if memory.in_use or any(memory.dirty):
            self.memory = memory
            raise ConfigError("the buffer's memory is in use (mid-epoch, or embeddings not written back)")
        nbytes = memory.nbytes
        del memory
        # The last epoch's manager still reaches the slots through a reference cycle (its
        # loader and hand-off refer to each other) that only the cycle collector frees;
        # then the epoch's freed batch buffers go back to the system too.
        gc.collect()
        trim_heap()
        return nbytes

    def _mine(self, plan: EpochPlan, round: int | None = None) -> Sequence[int]:
        """The plan's states this rank loads: with rounds, its states of ``round``; else
        its block (all of them without a shard)."""
        if plan.state_rounds is not None:
            rank = 0 if self.shard is None else self.shard.rank
            return [i for i, (t, r) in enumerate(zip(plan.state_rounds, plan.state_ranks))
                    if t == round and r == rank]
        return range(len(plan.states)) if self.shard is None else self.shard.states(len(plan.states))

    def _walked(self, plan: EpochPlan, epoch: int, round: int | None, *, lookahead: bool
                ) -> tuple[Sequence[int], list[tuple[int, ...]], tuple[int, ...] | None]:
        """What this rank walks of ``plan``: its states' indices in the plan, the states,
        and the part of the next epoch's first state read during the last (or None)."""
        # A rank of a data-parallel run loads its block of the states only (with rounds, its
        # states of the round); each loaded state keeps its index in the whole plan, which
        # says what it trains.
        mine = self._mine(plan, round)
        states = [plan.states[i] for i in mine]
        # The next epoch's first state is read while this epoch's last state trains, as much
        # of it as fits in the slots this epoch needs (the budget counted no more). Not across
        # rounds: the next round's partitions are other ranks' until they wrote them back.
        following = None
        if lookahead and states and plan.state_rounds is None:
            nxt = self.planner.plan(epoch + 1)
            following = nxt.states[self._mine(nxt)[0]]
        return mine, states, lookahead_within(states, following, prefetch=self.prefetch)

    def planned_bytes(self, epoch: int, *, lookahead: bool = True) -> int:
        """Bytes ``epoch`` reads from an empty buffer (the first epoch of a run, or one after
        `release`), as its `BufferStats.bytes_read` will say: its states' partitions and
        buckets, the hubs' edge segments, and what of the next epoch it reads ahead
        (`planned_read_bytes`). ``graphstore plan STORE`` reports it before training."""
        _, states, ahead = self._walked(self.planner.plan(epoch), epoch, None, lookahead=lookahead)
        if not states:
            return 0
        return planned_read_bytes(self.store, list(states) + ([ahead] if ahead else []), prefetch=self.prefetch,
                                  embedding_dim=self.embedding_dim, static_cache=self.cache)

    def states(self, ctx: EpochContext, *, lookahead: bool) -> Iterator[LoadedState]:
        rounds = ctx.plan.state_rounds is not None
        mine, states, ahead = self._walked(ctx.plan, ctx.epoch, ctx.round, lookahead=lookahead)
        if not states:  # a data-parallel rank with no state in this round
            self.epoch_stats.append(BufferStats(states=0, partitions_loaded=0, swaps=0, buckets_read=0,
                                                requests=0, bytes_read=0, read_seconds=0.0,
                                                assemble_seconds=0.0, stall_seconds=0.0))
            return
        need = slots_needed(list(states) + ([ahead] if ahead else []), prefetch=self.prefetch)
        if self.memory is None or self.memory.num_slots < need:
            # Allocated once for the run (re-allocated only if a later epoch needs more slots).
            self.memory = BufferMemory.allocate(
                self.store, need, embedding_dim=self.embedding_dim,
                cache_rows=0 if self.cache is None else self.cache.num_nodes)
        buffer = BufferManager(self.store, states, prefetch=self.prefetch, memory=self.memory,
                               embeddings=self.embeddings, static_cache=self.cache, lookahead=ahead,
                               write_back=self.write_back)
        try:
            if self.shard is None and not rounds:
                yield from buffer
            else:
                for loaded in buffer:
                    yield replace(loaded, index=mine[loaded.index])
        finally:
            buffer.close()  # writes back every dirty partition
            self.epoch_stats.append(buffer.stats)
        if rounds and self.embeddings is not None:
            # Other ranks update partitions in the store before this rank holds them again.
            self.memory.forget()


class StructureWalk:
    """Source stage of the ``macrobatch`` scheme: the whole graph's structure and labels,
    built once for the run (`build_structure_graph`), one state per epoch; the features
    stay in the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.graph: ResidentGraph | None = None
        self.memory = None  # no buffer slots: nothing of the features is resident
        self.epoch_stats: list[BufferStats] = []

    def planned_bytes(self, epoch: int, *, lookahead: bool = True) -> int:
        """Bytes the walk reads in ``epoch``: the structure and labels the first time
        (`build_structure_graph`), nothing once built (the macro-batches' feature rows are
        the fetch stage's, sampled)."""
        if self.graph is not None:
            return 0
        return planned_read_bytes(self.store, [range(self.store.num_partitions)], with_features=False)

    def states(self, ctx: EpochContext, *, lookahead: bool) -> Iterator[LoadedState]:
        built, t0 = 0, time.perf_counter()
        if self.graph is None:
            self.graph, built = build_structure_graph(self.store)
        seconds = time.perf_counter() - t0
        p = self.store.num_partitions
        self.epoch_stats.append(BufferStats(
            states=1, partitions_loaded=p if built else 0, swaps=0, buckets_read=p * p if built else 0,
            requests=2 * p if built else 0, bytes_read=built, read_seconds=seconds, assemble_seconds=0.0,
            stall_seconds=seconds, planned_bytes=built))  # the structure, read once a run
        yield LoadedState(0, self.graph, tuple(range(p)) if built else ())


# ------------------------------------------------------------------ node classification


class NodeTargets:
    """Each state's targets (all of its training partitions' nodes, or with DISPERSED a
    random share), shuffled per pass, cut into batches."""

    def __init__(self, targets: np.ndarray, *, partition_size: int, batch_size: int, shuffle: bool,
                 passes: Callable[[EpochPlan], list[int]], shard: Shard | None = None,
                 balance: np.ndarray | None = None, owner_bounds: np.ndarray | None = None) -> None:
        self.targets, self.partition_size = targets, partition_size
        self.batch_size, self.shuffle, self.passes = batch_size, shuffle, passes
        self.shard = shard
        # Divided by batches with owner_bounds (store ids where each rank's block of feature
        # rows starts): each rank trains its own block's targets (`Shard.local_shares`).
        self.owner_bounds = owner_bounds
        self.balance = None if balance is None else np.asarray(balance, dtype=np.float64)

    def _class_weights(self, g, local: torch.Tensor) -> torch.Tensor | None:
        """Per class, the split's share of it over the state's (0 for classes the state
        lacks): weighted so, a state's targets have the training split's label mix.

        Why: a state trains the targets of a few METIS partitions, whose labels cluster (on
        Amazon Photo with 2 of 8 partitions resident, half the label mass of a state is
        misplaced against the split), so consecutive steps pull the classifier towards
        each state's classes in turn. Not in HierBatching or MariusGNN, whose mega-batches
        hold hundreds of partitions; an option, off in the trainers by default (measured:
        faster early, lower at the end)."""
        if self.balance is None or g.labels is None or local.numel() == 0:
            return None
        labels = g.labels[local].long()
        labels = labels[labels >= 0]
        k = self.balance.size
        counts = np.bincount(labels.numpy(), minlength=k)[:k].astype(np.float64)
        share = counts / max(1.0, counts.sum())
        weights = np.divide(self.balance, share, out=np.zeros(k), where=share > 0)
        return torch.from_numpy(weights.astype(np.float32))

    def __call__(self, states: Iterator[LoadedState], ctx: EpochContext) -> Iterator[TargetBatch]:
        order_gen = ctx.generator(SALT_NODE_ORDER)
        passes = self.passes(ctx.plan)
        per_state = ctx.plan.target_states(self.targets // self.partition_size)
        # Divided by batches, every rank walks every state and draws the same orders, and
        # keeps every N-th batch; divided by states, the walk brought this rank's states only.
        by_batches = self.shard is not None and not self.shard.by_states(len(ctx.plan.states))
        by_owner = by_batches and self.owner_bounds is not None
        index = 0
        for loaded in states:
            g = loaded.graph
            mine = self.targets[per_state[loaded.index]]
            if by_owner:
                mine = self.shard.local_shares(mine, self.owner_bounds)[self.shard.rank]
            local = g.to_local(mine)
            weights = self._class_weights(g, local)
            kept: list[tuple[int, torch.Tensor]] = []  # the state's batches, so its last is known
            for _ in range(passes[loaded.index]):
                ids = local[torch.randperm(local.numel(), generator=order_gen)] if self.shuffle else local
                for start in range(0, ids.numel(), self.batch_size):
                    if by_owner or not by_batches or self.shard.takes_batch(index):
                        kept.append((index, ids[start:start + self.batch_size]))
                    index += 1
            for k, (i, batch) in enumerate(kept):
                yield TargetBatch(g, batch, i, k == len(kept) - 1, weights)


class NeighbourSampling:
    """DENSE over each batch's targets, within the resident graph (a per-batch step,
    `graphstore.loaders.pipeline`)."""

    def __init__(self, fanouts: Sequence[int], *, direction: str = "in", salt: int = SALT_NODE_SAMPLE) -> None:
        self.fanouts, self.direction, self.salt = tuple(fanouts), direction, salt

    def bind(self, ctx: EpochContext) -> Callable[[TargetBatch, int], SampledBatch]:
        workspace = ThreadLocalWorkspace(new_workspace)

        def sample(b: TargetBatch, index: int) -> SampledBatch:
            g = b.graph
            dense = sample_dense(g, b.targets, self.fanouts, generator=ctx.batch_generator(self.salt, index),
                                 workspace=workspace.get(g), direction=self.direction,
                                 return_edge_ids=g.rel is not None)
            return SampledBatch(g, dense, b.class_weights)

        return sample


class GatherRows:
    """The sampled nodes' feature rows and the targets' labels, from the resident rows (a
    per-batch step)."""

    def bind(self, ctx: EpochContext) -> Callable[[SampledBatch, int], NodeBatch]:
        def gather(b: SampledBatch, index: int) -> NodeBatch:
            gathered = Batch.gather(b.dense, b.graph.features, b.graph.labels)
            return NodeBatch(gathered.dense, gathered.features, gathered.labels.long(), b.graph,
                             class_weights=b.class_weights)

        return gather


class MicroBatchSplit:
    """Betty's micro-batches: each batch split into K (fixed) or the fewest whose training
    step fits ``budget`` bytes by ``estimator``; the batch carries them in
    ``micro_batches`` and the trainer accumulates their gradients into one update.

    With a fixed K the split is a per-batch step (`bind`: it runs in the loader's pool,
    each batch's split seeded by its index). With a budget it is a stage of its own after
    the pool (`__call__`, in the consumer's thread): each batch's search for K starts from
    the previous batch's K, an order the pool would not keep; the first batch of every epoch
    starts from 1, so a resumed run chooses the same Ks.

    ``stats`` (reset every epoch) counts batches, micro-batches, the largest and last K, and
    input rows with and without the split (the duplication micro-batching costs)."""

    def __init__(self, *, num_micro_batches: int | None, budget: int | None, strategy: str, seed: int,
                 estimator: Callable[[DenseSizes], int] | None = None) -> None:
        if (num_micro_batches is None) == (budget is None):
            raise ConfigError("micro-batching needs micro_batches K or micro_batch_budget BYTES (one of them)")
        if budget is not None and estimator is None:
            raise ConfigError("micro_batch_budget needs a step-memory estimator "
                              "(graphstore.nn.step_estimator(model))")
        self.num_micro_batches, self.budget, self.strategy = num_micro_batches, budget, strategy
        self.seed, self.estimator = seed, estimator
        self.stats: dict[str, int] = {}

    @property
    def per_batch(self) -> bool:
        """Whether the split is a per-batch step (a fixed K), else a stage after the pool."""
        return self.budget is None

    def _count(self, stats: dict[str, int], batch: NodeBatch, parts: list) -> None:
        stats["batches"] = stats.get("batches", 0) + 1
        stats["micro_batches"] = stats.get("micro_batches", 0) + len(parts)
        stats["max_k"] = max(stats.get("max_k", 0), len(parts))
        stats["last_k"] = len(parts)
        stats["input_rows"] = stats.get("input_rows", 0) + sum(int(p.dense.num_nodes) for p in parts)
        stats["batch_input_rows"] = stats.get("batch_input_rows", 0) + int(batch.dense.num_nodes)

    def bind(self, ctx: EpochContext) -> Callable[[NodeBatch, int], NodeBatch]:
        stats: dict[str, int] = {}
        self.stats = stats
        lock = threading.Lock()
        base = epoch_seed(self.seed, ctx.epoch, salt=SALT_MICRO_SPLIT)

        def split(batch: NodeBatch, index: int) -> NodeBatch:
            parts = split_dense(batch.dense, min(self.num_micro_batches, batch.dense.num_targets),
                                strategy=self.strategy, seed=base + index)
            with lock:  # counters only: sums and a maximum, the same in any order
                self._count(stats, batch, parts)
            return replace(batch, micro_batches=tuple(parts))

        return split

    def __call__(self, batches: Iterator[NodeBatch], ctx: EpochContext) -> Iterator[NodeBatch]:
        """The split as a stage in the batches' order (a budget's, or any after
        macro-batching), each batch seeded by its position."""
        if self.per_batch:
            split = self.bind(ctx)
            for step, batch in enumerate(batches):
                yield split(batch, step)
            return
        stats: dict[str, int] = {}
        self.stats = stats
        base = epoch_seed(self.seed, ctx.epoch, salt=SALT_MICRO_SPLIT)
        for step, batch in enumerate(batches):
            parts = choose_micro_batches(batch.dense, self.budget, estimator=self.estimator,
                                         strategy=self.strategy, seed=base + step,
                                         start_k=stats.get("last_k", 1))
            self._count(stats, batch, parts)
            yield replace(batch, micro_batches=tuple(parts))


# ------------------------------------------------------------------ link prediction


class EdgeTargets:
    """Each state's training edges (the buckets the plan gives it, `ResidentGraph.
    training_edges`), shuffled, cut into batches of positives. Divided among data-parallel
    ranks by batches (one state: the minibatch scheme), every rank draws the same order and
    keeps every N-th batch, as `NodeTargets` does."""

    def __init__(self, batch_size: int, shard: Shard | None = None) -> None:
        self.batch_size = batch_size
        self.shard = shard

    def __call__(self, states: Iterator[LoadedState], ctx: EpochContext) -> Iterator[PositiveEdges]:
        order_gen = ctx.generator(SALT_EDGE_ORDER)
        bucket_states = ctx.plan.bucket_states
        by_batches = (self.shard is not None and ctx.plan.state_rounds is None
                      and not self.shard.by_states(len(ctx.plan.states)))
        index = 0
        for loaded in states:
            g = loaded.graph
            src, dst, edges = g.training_edges(bucket_states, loaded.index)
            order = torch.randperm(edges.numel(), generator=order_gen)
            starts = []  # the state's batches, so its last is known
            for start in range(0, edges.numel(), self.batch_size):
                if not by_batches or self.shard.takes_batch(index):
                    starts.append((index, start))
                index += 1
            yield from positive_batches(g, src[order], dst[order], edges[order], starts, self.batch_size)


def positive_batches(g: ResidentGraph, src: torch.Tensor, dst: torch.Tensor, edges: torch.Tensor,
                     starts: Sequence[tuple[int, int]], batch_size: int) -> Iterator[PositiveEdges]:
    """A state's batches of positives: ``(index, start)`` of each, in order, the last one
    marked as the state's end."""
    for k, (index, start) in enumerate(starts):
        e = edges[start:start + batch_size]
        rel = g.rel[e] if g.rel is not None else torch.zeros(e.numel(), dtype=torch.int64)
        yield PositiveEdges(g, src[start:start + batch_size], dst[start:start + batch_size], rel, index,
                            k == len(starts) - 1)


class Negatives:
    """Negatives for each batch of positives, shared by chunks (MariusGNN's ``num_chunks``,
    ``degree_fraction``), drawn among the state's resident nodes (a per-batch step)."""

    def __init__(self, *, negatives: int, num_chunks: int, degree_fraction: float) -> None:
        self.negatives, self.num_chunks, self.degree_fraction = negatives, num_chunks, degree_fraction

    def bind(self, ctx: EpochContext) -> Callable[[PositiveEdges, int], EdgeBatch]:
        lock = threading.Lock()
        latest: list = [None, None, None]  # the graph, its resident nodes and degrees (one state's)

        def candidates(g: ResidentGraph):
            with lock:  # once a state, by the first thread that meets it
                if latest[0] is not g:
                    degrees = g.indptr.diff().to(torch.float64) if self.degree_fraction > 0 else None
                    latest[:] = [g, g.resident_nodes(), degrees]
                return latest[1], latest[2]

        def draw(pos: PositiveEdges, index: int) -> EdgeBatch:
            g = pos.graph
            resident, degrees = candidates(g)
            b = pos.src.numel()
            negs = sample_negatives(
                b, num_chunks=min(self.num_chunks, max(1, b)), negatives_per_positive=self.negatives,
                num_nodes=g.num_nodes, generator=ctx.batch_generator(SALT_NEGATIVES, index),
                degree_fraction=self.degree_fraction, candidates=resident, degrees=degrees)
            return EdgeBatch(pos.src, pos.dst, pos.rel, negs, g)

        return draw


class EdgeNeighbourSampling:
    """For a GNN encoder: DENSE over each batch's distinct endpoints and negatives (a
    per-batch step)."""

    def __init__(self, fanouts: Sequence[int]) -> None:
        self.fanouts = tuple(fanouts)

    def bind(self, ctx: EpochContext) -> Callable[[EdgeBatch, int], EdgeBatch]:
        workspace = ThreadLocalWorkspace(new_workspace)

        def sample(batch: EdgeBatch, index: int) -> EdgeBatch:
            g, src, dst, negs = batch.graph, batch.src, batch.dst, batch.negatives
            nodes, inverse = torch.unique(torch.cat([src, dst, negs.nodes.flatten()]), return_inverse=True)
            # Targets in store-id order (not local-id order, which depends on the slots), so
            # the sampler consumes its random stream the same way under any slot layout.
            order = torch.argsort(g.node_ids[nodes])
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel())
            nodes, inverse = nodes[order], rank[inverse]
            b = src.numel()
            index_ = EdgeIndex(inverse[:b], inverse[b:2 * b], inverse[2 * b:].view(negs.nodes.shape))
            dense = sample_dense(g, nodes, self.fanouts, generator=ctx.batch_generator(SALT_EDGE_SAMPLE, index),
                                 workspace=workspace.get(g), return_edge_ids=g.rel is not None)
            return replace(batch, dense=dense, nodes=nodes, index=index_)

        return sample


def bucket_edge_counts(plan: EpochPlan, bucket_sizes: np.ndarray) -> list[int]:
    """Training edges of each state of ``plan`` (``bucket_sizes[i, j]``: edges of bucket
    (i, j)); one entry for a plan without buckets (the whole graph in one state)."""
    if plan.bucket_states is None:
        return [int(bucket_sizes.sum())]
    states = np.asarray(plan.bucket_states)
    return np.bincount(states.ravel(), weights=bucket_sizes.ravel(), minlength=len(plan.states)).astype(
        np.int64).tolist()
