"""`NodeLoader`: batches of a node split's targets with their sampled neighbourhoods."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from graphstore.buffer import BufferStats
from graphstore.buffer.policies import EpochPlan
from graphstore.errors import ConfigError
from graphstore.layout.store import Store
from graphstore.loaders.base import BufferedLoader
from graphstore.loaders.batches import NodeBatch
from graphstore.loaders.feature_cache import FeatureCache, default_cache_bytes
from graphstore.loaders.macro import (
    DEFAULT_CACHE_LOOKAHEAD,
    FeatureFetch,
    FetchStats,
    MacroBatchGather,
    fetch_dtype,
)
from graphstore.loaders.schemes import SCHEMES
from graphstore.loaders.settings import NodeLoaderSettings
from graphstore.loaders.shard import Shard, block_bounds
from graphstore.loaders.stages import (
    GatherRows,
    MicroBatchSplit,
    NeighbourSampling,
    NodeTargets,
    Stage,
)
from graphstore.sample import STRATEGIES
from graphstore.sample.microbatch import DenseSizes

__all__ = ["BALANCE_SKEW", "DEFAULT_MACRO_BATCHES", "SEED_ASSIGNMENTS", "NodeLoader", "label_skew"]

SEED_ASSIGNMENTS = ("interleaved", "local")
"""How data-parallel ranks divided by batches share the targets (`NodeLoader`'s ``seed_assignment``)."""

ASSEMBLY_PASSES = 4
"""The disk scheme's (DISPERSED) states an epoch are at most this many times ``p / c``: each
state assembles its c resident partitions' edges, so its states together assemble at most
about this many passes over the graph's edges, whatever the batch count asks (a departure
from MariusGNN's one swap per state, which assembles ``p - c + 1`` states)."""
DEFAULT_MACRO_BATCHES = 16
"""Mini-batches per macro-batch of the macrobatch scheme when none is given."""
BALANCE_SKEW = 0.15
"""``balance_labels=None`` weighs a state's classes when the states' label mixes are on
average further than this (total variation distance, beyond what random states of the same
sizes would show) from the training split's: Amazon Photo with 2 of 8 METIS partitions
resident is 0.30 beyond random, with 8 of 32 0.08. Not the trainers' default: weighted,
megabatch there learns faster in its first epochs but ends lower (test 0.852 against 0.876
unweighted, run until validation stops improving; docs/benchmarks.md, "Out of core
converges like in memory")."""
SKEW_DRAWS = 16
"""Random states drawn per state to measure the skew random states of its size show."""


def _with_fetch(io: BufferStats, fetched: FetchStats) -> BufferStats:
    """``io`` with macro-batching's reads and waits of the same epoch added."""
    return replace(io, requests=io.requests + fetched.requests, bytes_read=io.bytes_read + fetched.bytes_read,
                   read_seconds=io.read_seconds + fetched.read_seconds,
                   stall_seconds=io.stall_seconds + fetched.stall_seconds)


def label_skew(plan: EpochPlan, partitions: np.ndarray, labels: np.ndarray, share: np.ndarray) -> float:
    """How much further the plan's states' label mixes are from ``share`` than random states
    of the same sizes: the mean over states (each counted by its targets) of the total
    variation distance of its mix from ``share``, less the same for `SKEW_DRAWS` random
    draws of as many of the targets (a state of six targets is far from any mix by chance
    alone). ``partitions`` and ``labels`` are the targets' (labels -1: unlabelled, left
    out). Deterministic: the draws come from a fixed seed."""
    k = share.size
    labelled = labels >= 0
    pool = labels[labelled]
    rng = np.random.default_rng(0)
    excess, weight = 0.0, 0
    for mine in plan.target_states(partitions):
        y = labels[mine]
        y = y[y >= 0]
        if y.size == 0:
            continue
        observed = 0.5 * float(np.abs(np.bincount(y, minlength=k)[:k] / y.size - share).sum())
        draws = pool[rng.integers(0, pool.size, (SKEW_DRAWS, y.size))]
        mixes = np.stack([np.bincount(d, minlength=k)[:k] for d in draws]) / y.size
        chance = 0.5 * float(np.abs(mixes - share).sum(axis=1).mean())
        excess += (observed - chance) * y.size
        weight += y.size
    return excess / weight if weight else 0.0


class NodeLoader(BufferedLoader):
    """Batches of a node split's nodes, each with its sampled neighbourhood (`NodeBatch`).

    An epoch is the stages ``BufferWalk -> NodeTargets -> NeighbourSampling -> GatherRows
    [-> MicroBatchSplit]`` (`graphstore.loaders.stages`).

    Parameters
    ----------
    store : Store
        An open store with labels and features.
    split : str
        Node split whose nodes are the targets (``"train"``, ``"valid"``, ``"test"``).
    fanouts : sequence of int
        Per hop, nearest first; -1 = all neighbours.
    batch_size : int
        Targets per batch.
    scheme : str
        A registered scheme (`graphstore.loaders.SCHEMES`: minibatch, megabatch, disk,
        microbatch); see `graphstore.loaders.schemes`.
    policy : str, optional
        Override the scheme's policy (``sequential``, ``dispersed``, ``hierbatching``...).
    capacity : int, optional
        Partitions resident; default by scheme.
    buffer_bytes : int, optional
        A byte budget instead of ``capacity`` (`capacity_for_budget`).
    reuse : int, optional
        Passes over each state's targets (default 1; HierBatching's is 2).
    static_cache : float, optional
        Fraction of nodes in the static cache: the store's hub group must be for that
        fraction (``graphstore hubs STORE --fraction F``); 0 = none. Default for the
        megabatch scheme: the store's hub group (1 % of the nodes unless converted
        otherwise), or none, with a warning, for a store without one.
    shuffle : bool
        Shuffle targets in each pass (off for evaluation: every target exactly once).
    nodes : array of int, optional
        Store ids to use as targets instead of ``split``'s nodes.
    seed : int
        With the epoch number, all randomness of an epoch.
    prefetch : bool
        Load the next state in the background.
    macro_batches : int or "all", optional
        The ``macrobatch`` scheme's mini-batches per macro-batch ``B`` (default
        `DEFAULT_MACRO_BATCHES`); their input rows are read from the store once
        (`graphstore.loaders.macro`).
    macro_batch_bytes : int, optional
        Most bytes of samples a macro-batch holds (it is cut short there) and of feature
        rows held at once (a larger union is read in rounds).
    feature_cache_bytes : int, optional
        The ``macrobatch`` scheme's feature cache between rounds (default none): at most
        this many bytes of rows, kept by ``feature_cache`` (``"belady"``, the default,
        over the next ``cache_lookahead`` mini-batches, which are sampled ahead; or
        ``"lru"``); it lasts across epochs (`graphstore.loaders.feature_cache`).
        ``feature_cache`` named without it: every row when they fit the memory default,
        else that default (`default_cache_bytes`); ``settings.feature_cache_bytes`` says
        which.
    aggregated : str, optional
        The ``macrobatch`` scheme reads, with each input row, the node's stored aggregate
        of its in-neighbours' features (``"mean"``, ``"sum"`` or ``"gcn"``: ``graphstore
        aggregate``) into ``batch.aggregated``, BatchGNN's aggregation cache. ``fanouts``
        then name one hop fewer than the model has layers: its first layer takes the
        aggregate instead of a sampled last hop (`graphstore.nn.GNN`).
    feature_fetch : optional
        The ``macrobatch`` scheme reads each round's rows through this instead of the
        store (`MacroBatchGather`'s ``fetch``): BatchGNN's distributed fetch from the ranks
        owning the rows, `graphstore.distributed.PartitionedFetch`.
    micro_batches, micro_batch_budget : int, optional
        Split every batch into K micro-batches, or into the fewest whose training step
        fits the budget in bytes by ``step_estimator`` (Betty); required by the
        ``microbatch`` scheme, allowed with the others (micro-batches of a mega-batch).
    micro_strategy : str
        How targets are grouped (`graphstore.sample.STRATEGIES`; ``reg`` by default).
    step_estimator : callable, optional
        ``DenseSizes -> bytes`` of a training step (`graphstore.nn.step_estimator(model)`),
        needed with ``micro_batch_budget``.
    rank, world_size : int
        Data parallelism: this loader yields rank ``rank``'s share of every epoch among
        ``world_size`` ranks (its block of the buffer states when the plan has at least
        ``world_size`` of them, else every ``world_size``-th batch; `graphstore.loaders.shard`).
        ``num_batches`` is then this rank's, ``num_steps`` the most any rank has.
    seed_assignment : str, optional
        Divided by batches, which targets rank ``rank`` trains: ``"interleaved"`` (every
        ``world_size``-th batch of one shared order) or ``"local"`` (the targets of the block
        of rows it owns, balanced to equal shares, `graphstore.loaders.shard.Shard.local_shares`:
        a ``feature_fetch``'s ``bounds``, else the full-batch ranks' blocks of partitions;
        every rank still samples over the whole graph's structure). Default: ``"local"``
        for the macrobatch scheme (BatchGNN's distributed fetch then asks the others for
        few rows), ``"interleaved"`` for the schemes that hold their rows.
    loader_threads : int, optional
        Threads that sample and gather batches ahead of the consumer, at most twice as many
        batches in flight (`graphstore.loaders.pipeline`); 0: in the consumer's thread.
        The batches are the same for every value. Default: the cores torch's threads leave
        free, at least 1 (`default_loader_threads`).
    transform : callable, optional
        Applied to every batch on the loader's threads, e.g. ``NodeBatch.to_pyg``; the epoch
        yields what it returns.

    Examples
    --------
    Typical use::

        loader = NodeLoader(store, split="train", fanouts=(10, 5), batch_size=512, scheme="megabatch")
        for epoch in range(3):
            for batch in loader.epoch(epoch):
                loss = F.cross_entropy(model(batch.features, batch.dense), batch.labels)
    """

    task = "node"

    def __init__(self, store: Store, *, split: str = "train", fanouts: Sequence[int], batch_size: int,
                 scheme: str = "minibatch", policy: str | None = None, capacity: int | None = None,
                 buffer_bytes: int | None = None, reuse: int | None = None, static_cache: float | None = None,
                 shuffle: bool = True, seed: int = 0, prefetch: bool = True, direction: str = "in",
                 nodes=None, micro_batches: int | None = None, micro_batch_budget: int | None = None,
                 micro_strategy: str = "reg",
                 step_estimator: Callable[[DenseSizes], int] | None = None,
                 macro_batches: int | str | None = None, macro_batch_bytes: int | None = None,
                 feature_cache_bytes: int | None = None, feature_cache: str | None = None,
                 cache_lookahead: int = DEFAULT_CACHE_LOOKAHEAD, aggregated: str | None = None,
                 rank: int = 0, world_size: int = 1, feature_fetch=None, balance_labels: bool | None = False,
                 seed_assignment: str | None = None, loader_threads: int | None = None,
                 transform: Callable[[NodeBatch], Any] | None = None) -> None:
        if not store.manifest.has_labels:
            raise ConfigError(f"{store.path}: node classification needs labels; the store has none")
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be >= 1 (got {batch_size})")
        self.split = split if nodes is None else "custom"
        if nodes is None:
            self.targets = np.asarray(store.read_node_split(split), dtype=np.int64)
        else:
            self.targets = np.unique(np.asarray(nodes, dtype=np.int64))
            if self.targets.size and (self.targets[0] < 0 or self.targets[-1] >= store.num_nodes):
                raise ConfigError(f"nodes must be store ids in [0, {store.num_nodes})")
        self.fanouts, self.batch_size, self.shuffle, self.direction = tuple(fanouts), int(batch_size), shuffle, direction
        self.train_partitions = np.unique(self.targets // store.partition_size).tolist()
        # The base class reports an unknown scheme; here only the defaults it implies matter.
        scheme_spec = SCHEMES.get(scheme) if scheme in SCHEMES else None
        default_policy_cache = scheme_spec is not None and scheme_spec.static_cache and (
            policy is None or policy == scheme_spec.policy(self.task, store.num_partitions, capacity,
                                                           self.train_partitions))
        if static_cache is None and not default_policy_cache:
            static_cache = 0.0  # only HierBatching has a static cache by default
        self.reuse = int(reuse) if reuse is not None else (scheme_spec.reuse if scheme_spec else 1)
        self._reuse_given = reuse is not None
        shard = Shard(int(rank), int(world_size))  # checks the pair
        self.shard = shard if shard.world_size > 1 else None
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, cache_fraction=static_cache,
                         train_partitions=self.train_partitions, shard=self.shard,
                         loader_threads=loader_threads, transform=transform)
        self.balance, self.label_skew = None, None
        if (balance_labels or balance_labels is None) and self.targets.size:
            labels = np.asarray(store.labels[self.targets], dtype=np.int64)
            share = np.bincount(labels[labels >= 0], minlength=store.num_classes)[:store.num_classes]
            share = share / max(1, share.sum())
            if balance_labels is None:  # auto: when the states' label mixes stray far from the split's
                self.label_skew = label_skew(self.plan(0), self.targets // store.partition_size, labels, share)
            if balance_labels or (self.label_skew is not None and self.label_skew > BALANCE_SKEW):
                self.balance = share
        self.owner_bounds = self._owner_bounds(seed_assignment, feature_fetch)
        self.micro = self._micro_stage(micro_batches, micro_batch_budget, micro_strategy, step_estimator)
        self.macro = self._macro_stage(macro_batches, macro_batch_bytes, feature_cache_bytes, feature_cache,
                                       cache_lookahead, aggregated, feature_fetch)
        if aggregated is not None and self.micro is not None:
            raise ConfigError("aggregated rows and micro-batching do not combine yet: the micro-batch split "
                              "does not carry batch.aggregated")
        self.settings = NodeLoaderSettings(
            **self._common_settings(), split=self.split, fanouts=self.fanouts, batch_size=self.batch_size,
            reuse=self.reuse, shuffle=shuffle, num_targets=int(self.targets.size),
            micro_batches=micro_batches if self.micro else None,
            micro_batch_budget=micro_batch_budget if self.micro else None,
            micro_strategy=micro_strategy if self.micro else None,
            macro_batches=self.macro.macro_batches if self.macro else None,
            macro_batch_bytes=macro_batch_bytes if self.macro else None,
            feature_cache_bytes=self.macro.cache.capacity_bytes if self.macro and self.macro.cache else None,
            feature_cache=self.macro.cache.policy if self.macro and self.macro.cache else None,
            cache_lookahead=cache_lookahead if self.macro and self.macro.cache else None,
            aggregated=aggregated, world_size=None if self.shard is None else self.shard.world_size,
            balance_labels=True if self.balance is not None else None, label_skew=self.label_skew,
            seed_assignment=None if self.shard is None else ("interleaved" if self.owner_bounds is None else "local"))

    def _owner_bounds(self, assignment: str | None, fetch) -> np.ndarray | None:
        """Store ids where each rank's block of rows starts (then num_nodes) when ranks
        train their own blocks' targets, else None."""
        if assignment not in (None, *SEED_ASSIGNMENTS):
            raise ConfigError(f"seed_assignment must be one of {', '.join(SEED_ASSIGNMENTS)} (got {assignment!r})")
        if assignment is None:
            # Macro-batching reads rows by owner (`feature_fetch`) or from the store: with a
            # rank's targets in its block, its unions are mostly its own rows either way.
            assignment = "interleaved" if self.scheme_spec.resident_features else "local"
        if assignment == "interleaved" or self.shard is None:
            return None
        s = self.store
        bounds = getattr(fetch, "bounds", None)
        return np.asarray(bounds if bounds is not None else
                          block_bounds(s.num_partitions, s.partition_size, s.num_nodes, self.shard.world_size),
                          dtype=np.int64)

    def _macro_stage(self, macro_batches: int | str | None, budget: int | None, cache_bytes: int | None,
                     cache_policy: str | None, lookahead: int, aggregated: str | None,
                     fetch=None) -> MacroBatchGather | None:
        if self.scheme_spec.resident_features:
            if (macro_batches is not None or budget is not None or cache_bytes is not None or aggregated is not None
                    or fetch is not None or cache_policy is not None):
                raise ConfigError(f"macro_batches, macro_batch_bytes, feature_cache(_bytes), aggregated and "
                                  f"feature_fetch are for "
                                  f"the macrobatch scheme (scheme {self.scheme!r} holds the feature rows it trains on)")
            return None
        if macro_batches is None:
            macro_batches = DEFAULT_MACRO_BATCHES
        elif macro_batches == "all":
            macro_batches = -1
        elif not isinstance(macro_batches, int) or isinstance(macro_batches, bool):
            raise ConfigError(f"macro_batches must be a positive integer or 'all' (got {macro_batches!r})")
        width = self.store.feature_dim * (1 if aggregated is None else 2)  # [x_v | agg_v] rows
        if fetch is not None and not self.prefetch:
            # A collective fetch in the training thread would wait on a rank that is waiting
            # for it in DDP's all-reduce; in the prefetch thread, it waits only on fetches.
            raise ConfigError("feature_fetch runs in the prefetch thread: give prefetch=True")
        if fetch is not None and fetch.dim != width:
            raise ConfigError(f"feature_fetch returns rows of width {fetch.dim}; this loader reads {width}")
        fetch = FeatureFetch(self.store, aggregated) if fetch is None else fetch
        if cache_policy is not None and cache_bytes is None:  # a policy named without a size: from memory
            cache_bytes, _ = default_cache_bytes(self.store.num_nodes, fetch_dtype(fetch).itemsize * width)
        cache = None if cache_bytes is None else FeatureCache(width, cache_bytes, cache_policy or "belady",
                                                              fetch_dtype(fetch))
        return MacroBatchGather(self.store, macro_batches=macro_batches, macro_batch_bytes=budget,
                                prefetch=self.prefetch, cache=cache, cache_lookahead=lookahead,
                                aggregated=aggregated, fetch=fetch)

    @property
    def fetch_stats(self):
        """Macro-batching counters of the last epoch (`FetchStats`), or None without it."""
        return None if self.macro is None else self.macro.stats

    def epoch(self, epoch: int, *, lookahead: bool = True) -> Iterator:
        """The batches of ``epoch`` (`BufferedLoader.epoch`); under macro-batching the rows it
        read are added to the epoch's `BufferStats` when the epoch ends, so the epoch's reads
        are counted in one place whatever the scheme (the structure walk reads no rows)."""
        if self.macro is None:
            yield from super().epoch(epoch, lookahead=lookahead)
            return
        started = len(self.walk.epoch_stats)
        try:
            yield from super().epoch(epoch, lookahead=lookahead)
        finally:
            # Every stage is closed (the fetch thread joined): its counters are final.
            if len(self.walk.epoch_stats) > started:
                self.walk.epoch_stats[-1] = _with_fetch(self.walk.epoch_stats[-1], self.macro.stats)

    def _micro_stage(self, k: int | None, budget: int | None, strategy: str,
                     estimator: Callable[[DenseSizes], int] | None) -> MicroBatchSplit | None:
        if k is None and budget is None:
            if self.scheme_spec.split_batches:
                raise ConfigError(f"scheme {self.scheme!r} needs micro_batches K or micro_batch_budget BYTES")
            return None
        if k is not None and budget is not None:
            raise ConfigError("give micro_batches or micro_batch_budget, not both")
        STRATEGIES.get(strategy)  # an unknown strategy fails here, naming the known ones
        return MicroBatchSplit(num_micro_batches=k, budget=budget, strategy=strategy, seed=self.seed,
                               estimator=estimator)

    @property
    def micro_stats(self) -> dict[str, int] | None:
        """Micro-batching counters of the last epoch (`MicroBatchSplit`), or None without it."""
        return None if self.micro is None else self.micro.stats

    def _capacity_resolved(self) -> None:
        # Every partition resident (a budget the whole graph fits in): one state holds the
        # graph, so reuse would only repeat the epoch; the scheme then trains as minibatch.
        if not self._reuse_given and self.capacity >= self.store.num_partitions:
            self.reuse = 1

    def _plan_options(self) -> dict[str, Any]:
        options = dict(self.options, train_partitions=self.train_partitions)
        if self.policy == "hierbatching":
            options["reuse"] = self.reuse
        if self.policy == "dispersed" and "training_states" not in options:
            # About one state per batch of the split: a small split over many partitions
            # then trains in a few full states instead of many part-filled ones
            # (`plan_dispersed`); a large one keeps MariusGNN's one swap per state. Each rank
            # of a data-parallel run needs a state of its own.
            world = 1 if self.shard is None else self.shard.world_size
            options["training_states"] = max(world, -(-self.targets.size // self.batch_size), 2)
            # Each state assembles its resident partitions' edges anew, so with most of the
            # graph resident a state per batch assembles it dozens of times while the reads
            # stay one pass (4M nodes at 318 of 480 partitions: 55 states, 111 s of a
            # 113 s epoch reading 1.5 GB): at most ASSEMBLY_PASSES passes over the edges.
            # Per rank: each of a data-parallel run's ranks needs states of its own.
            options["assembly_passes"] = ASSEMBLY_PASSES * world
        return options

    def stages(self) -> list[Stage]:
        """The stages after the buffer walk, in order."""
        targets = NodeTargets(self.targets, partition_size=self.store.partition_size, batch_size=self.batch_size,
                              shuffle=self.shuffle, passes=self._passes, shard=self.shard, balance=self.balance,
                              owner_bounds=self.owner_bounds)
        per_batch: list = [NeighbourSampling(self.fanouts, direction=self.direction)]
        # Macro-batching gathers a macro-batch's rows in order after the pool sampled them.
        after: list[Stage] = [] if self.macro is None else [self.macro]
        if self.macro is None:
            per_batch.append(GatherRows())
        if self.micro is not None:
            # A fixed K splits each batch alone (on the threads); a budget's search follows
            # the batches' order (after them).
            (per_batch if self.micro.per_batch and not after else after).append(self.micro)
        return self._pipeline(targets, per_batch, after)

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` (with ``reuse`` passes; states cut batches separately); with
        ``world_size > 1``, this rank's."""
        return self._rank_batches(epoch)[0 if self.shard is None else self.shard.rank]

    def num_steps(self, epoch: int) -> int:
        """Optimizer steps of ``epoch``: `num_batches`, or with ``world_size > 1`` the most
        batches any rank has (a rank with fewer pads with zero-weight steps)."""
        return max(self._rank_batches(epoch))

    def _rank_batches(self, epoch: int) -> list[int]:
        """Batches of ``epoch`` of every rank (one entry without data parallelism)."""
        per_state = self._state_batches(epoch)
        if self.shard is None:
            return [sum(per_state)]
        by_states = self.shard.by_states(len(per_state))
        if self.owner_bounds is None or by_states:
            return self.shard.batch_counts(per_state, by_states=by_states)
        plan = self.plan(epoch)
        counts = [0] * self.shard.world_size
        for mine, passes in zip(plan.target_states(self.targets // self.store.partition_size), self._passes(plan)):
            for r, share in enumerate(self.shard.local_shares(self.targets[mine], self.owner_bounds)):
                counts[r] += passes * math.ceil(share.size / self.batch_size)
        return counts

    def _state_batches(self, epoch: int) -> list[int]:
        """Batches of each state of ``epoch``'s plan, all ranks together."""
        plan = self.plan(epoch)
        per_state = plan.target_states(self.targets // self.store.partition_size)
        return [passes * math.ceil(len(mine) / self.batch_size) for mine, passes in zip(per_state, self._passes(plan))]

    def _passes(self, plan: EpochPlan) -> list[int]:
        passes = getattr(plan, "passes", None)
        if passes is None:
            return [1] * len(plan.states)
        return [int(x) for x in passes] if self.policy == "hierbatching" else [int(x) * self.reuse for x in passes]
