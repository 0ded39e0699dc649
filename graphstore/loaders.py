"""Loaders: an epoch of training batches from a store, through the buffer and the samplers.

This is the machinery the trainer scripts use, for user code: a loader plans each epoch
with a buffer policy, walks its states with a `BufferManager` (the next state loading in
the background), and cuts each state's training examples into batches ready for the
layers::

    store ──plan_epoch──> states ──BufferManager──> ResidentGraph ──sample_dense──> Batch

Schemes (what an experienced user of DGL/PyG, HierBatching or MariusGNN would expect):

=========== ============== ================================================================
scheme      policy         resident
=========== ============== ================================================================
minibatch   in_memory      the whole graph (read once, kept across epochs): the reference
megabatch   hierbatching   a quarter of the partitions (at least 2) + the static cache: the
                           store's hub group (1 % highest-degree nodes' rows resident, their
                           edges re-read per state); each mega-batch trained ``reuse=2`` times
disk        sequential /   half the partitions (MariusGNN); node classification uses
            dispersed /    ``sequential`` when every training partition fits, else
            comet / beta   ``dispersed``; link prediction ``comet`` (l = ceil(p / floor(c/2)),
                           MariusGNN's 2p/c, so two logical partitions are resident)
=========== ============== ================================================================

Every choice a loader makes is in its ``settings`` dict (printed and recorded by the
trainers). Randomness comes from ``(seed, epoch)`` alone, so an epoch can be replayed (the
trainers' ``--resume`` relies on it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphstore.buffer import BufferManager, BufferMemory, BufferStats, StaticCache, plan_epoch
from graphstore.buffer.budget import capacity_for_budget
from graphstore.buffer.memory import lookahead_within, slots_needed
from graphstore.buffer.resident import ResidentGraph
from graphstore.errors import ConfigError, OutOfCoreWarning
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store
from graphstore.sample import Batch, sample_dense
from graphstore.sample.dense import new_workspace
from graphstore.sample.negatives import NegativeSample, sample_negatives

__all__ = ["EdgeBatch", "EdgeLoader", "NodeBatch", "NodeLoader", "SCHEMES"]

SCHEMES = ("minibatch", "megabatch", "disk")


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, OutOfCoreWarning, stacklevel=3)


def _warn_if_partitions_scatter(store: Store, capacity: int) -> None:
    """Warn once when the store's partitions cut so many edges that a partition-based
    scheme would lose most of a target's neighbours (e.g. random partitions)."""
    info = store.manifest.partitioner or {}
    cut, p = info.get("edge_cut"), store.num_partitions
    if cut is None or p <= 1 or capacity >= p:
        return
    # A cut edge leads to a uniformly random other partition, resident with probability
    # (c - 1) / (p - 1); an uncut edge stays with its target.
    kept = (1 - cut) + cut * (capacity - 1) / (p - 1)
    if kept < 0.5:
        _warn_once(f"{store.path}: its {info.get('method', '?')} partitions cut {cut:.1%} of the edges, so with "
                   f"{capacity} of {p} partitions resident a target keeps about {kept:.0%} of its neighbours; "
                   f"convert with --partitioner metis (or stream, for graphs METIS cannot hold), or use the "
                   f"minibatch scheme")


def _epoch_generator(seed: int, epoch: int, salt: int) -> torch.Generator:
    # A generator per (seed, epoch, purpose): epochs replay exactly, whatever ran before.
    mixed = np.random.SeedSequence([int(seed), int(epoch), salt]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) & ((1 << 63) - 1))


class _Loader:
    """What node and edge loaders share: scheme defaults, capacity, memory, epoch stats."""

    task = "node"

    def __init__(self, store: Store, *, scheme: str, policy: str | None, capacity: int | None,
                 buffer_bytes: int | None, seed: int, prefetch: bool, embedding_dim: int = 0,
                 cache_fraction: float | None = 0.0, policy_options: dict[str, Any] | None = None) -> None:
        if scheme not in SCHEMES:
            raise ConfigError(f"scheme must be one of {SCHEMES} (got {scheme!r})")
        if capacity is not None and buffer_bytes is not None:
            raise ConfigError("give the buffer as partitions (capacity) or as bytes (buffer_bytes), not both")
        self.store, self.scheme, self.seed, self.prefetch = store, scheme, int(seed), bool(prefetch)
        p = store.num_partitions
        self.policy = policy or self._default_policy(scheme)
        self.options = dict(policy_options or {})
        # None: the store's hub group when it has one (HierBatching's static cache), else
        # none; a fraction asks for exactly that group (`StaticCache.open` says how to write it).
        self.cache: StaticCache | None = None
        if cache_fraction is not None and (isinstance(cache_fraction, bool) or not 0 <= cache_fraction <= 1):
            raise ConfigError(f"static_cache must be a fraction of the nodes in [0, 1] (got {cache_fraction!r})")
        if cache_fraction is None:
            if store.hubs is not None:
                self.cache = StaticCache.open(store)
            else:
                _warn_once(f"{store.path}: no hubs/ group, so mega-batches run without HierBatching's static "
                           f"cache; `graphstore hubs {store.path}` writes it")
        elif cache_fraction > 0:
            self.cache = StaticCache.open(store, float(cache_fraction))
        self.cache_fraction = 0.0 if self.cache is None else self.cache.fraction
        if scheme == "minibatch":
            c = p
        elif buffer_bytes is not None:
            c, self.footprint = capacity_for_budget(
                store, buffer_bytes, self.policy, prefetch=prefetch, embedding_dim=embedding_dim,
                static_cache=self.cache, seed=seed, **self._plan_options())
        elif capacity is not None:
            c = int(capacity)
        else:
            c = max(2, math.ceil(p / 4)) if scheme == "megabatch" else max(2, math.ceil(p / 2))
        self.capacity = min(c, p)
        if scheme != "minibatch":
            _warn_if_partitions_scatter(store, self.capacity)
        self.memory: BufferMemory | None = None
        self.embedding_dim = embedding_dim
        self.epoch_stats: list[BufferStats] = []
        self.settings: dict[str, Any] = {
            "scheme": scheme, "policy": self.policy, "num_partitions": p, "capacity": self.capacity,
            "buffer_bytes": buffer_bytes, "prefetch": self.prefetch, "seed": self.seed,
            "static_cache_fraction": self.cache_fraction,
            "static_cache_nodes": 0 if self.cache is None else self.cache.num_nodes,
        }

    def _default_policy(self, scheme: str) -> str:
        raise NotImplementedError

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options)

    def plan(self, epoch: int):
        """The epoch's `EpochPlan` (a pure function of the settings and ``epoch``)."""
        return plan_epoch(self.policy, num_partitions=self.store.num_partitions, capacity=self.capacity,
                          epoch=epoch, seed=self.seed, **self._plan_options())

    def _buffer(self, epoch: int, states: Sequence[Sequence[int]], embeddings: EmbeddingTable | None,
                lookahead: bool) -> BufferManager:
        # The next epoch's first state is read while this epoch's last state trains, as much
        # of it as fits in the slots this epoch needs (the budget counted no more).
        ahead = lookahead_within(states, self.plan(epoch + 1).states[0] if lookahead else None,
                                 prefetch=self.prefetch)
        need = slots_needed(list(states) + ([ahead] if ahead else []), prefetch=self.prefetch)
        if self.memory is None or self.memory.num_slots < need:
            # Allocated once for the run (re-allocated only if a later epoch needs more slots).
            self.memory = BufferMemory.allocate(
                self.store, need, embedding_dim=self.embedding_dim,
                cache_rows=0 if self.cache is None else self.cache.num_nodes)
        return BufferManager(self.store, states, prefetch=self.prefetch, memory=self.memory,
                             embeddings=embeddings, static_cache=self.cache, lookahead=ahead)

    @property
    def last_stats(self) -> BufferStats | None:
        """The buffer's counters of the last epoch run (None before the first)."""
        return self.epoch_stats[-1] if self.epoch_stats else None


@dataclass(frozen=True, slots=True)
class NodeBatch(Batch):
    """A `Batch` that also knows the buffer state it was sampled from."""

    graph: ResidentGraph | None = None
    """The state's resident graph (valid until the next batch is requested)."""

    @property
    def store_ids(self) -> torch.Tensor:
        """int64 [N], store id of each ``dense.node_ids`` entry."""
        return self.graph.node_ids[self.dense.node_ids]

    @property
    def edge_types(self) -> torch.Tensor | None:
        """int64 [E], relation of each sampled edge (aligned with ``dense.nbrs``), or None
        without relations (RGCN's ``edge_type``)."""
        if self.graph.rel is None or self.dense.edge_ids is None:
            return None
        return self.graph.rel[self.dense.edge_ids]

    @property
    def degrees(self) -> torch.Tensor:
        """int64 [N], resident in-degree of each ``dense.node_ids`` entry (GCN's normalisation;
        the whole graph's in-degree under the minibatch scheme)."""
        return self.graph.indptr.diff()[self.dense.node_ids]


class NodeLoader(_Loader):
    """Batches of a node split's nodes, each with its sampled neighbourhood (`Batch`).

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
    scheme : {"minibatch", "megabatch", "disk"}
        See the module docstring.
    policy : str, optional
        Override the scheme's policy (``sequential``, ``dispersed``, ``hierbatching``...).
    capacity : int, optional
        Partitions resident; default by scheme.
    buffer_bytes : int, optional
        A byte budget instead of ``capacity`` (`capacity_for_budget`).
    reuse : int, optional
        Passes over each state's targets (megabatch default 2, else 1).
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

    Examples
    --------
    Typical use::

        loader = NodeLoader(store, split="train", fanouts=(10, 5), batch_size=512, scheme="megabatch")
        for epoch in range(3):
            for batch in loader.epoch(epoch):
                loss = F.cross_entropy(model(batch.dense, batch.features), batch.labels)
    """

    def __init__(self, store: Store, *, split: str = "train", fanouts: Sequence[int], batch_size: int,
                 scheme: str = "minibatch", policy: str | None = None, capacity: int | None = None,
                 buffer_bytes: int | None = None, reuse: int | None = None, static_cache: float | None = None,
                 shuffle: bool = True, seed: int = 0, prefetch: bool = True, direction: str = "in",
                 nodes=None) -> None:
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
        target_parts = np.unique(self.targets // store.partition_size)
        self.train_partitions = target_parts.tolist()
        if static_cache is None and not (scheme == "megabatch" and (policy or "hierbatching") == "hierbatching"):
            static_cache = 0.0  # only HierBatching has a static cache by default
        self.reuse = int(reuse) if reuse is not None else (2 if scheme == "megabatch" else 1)
        self._capacity_arg = capacity
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, cache_fraction=static_cache)
        self.settings.update(split=self.split, fanouts=list(self.fanouts), batch_size=self.batch_size,
                             reuse=self.reuse, shuffle=shuffle, num_targets=int(self.targets.size))

    def _default_policy(self, scheme: str) -> str:
        if scheme == "minibatch":
            return "in_memory"
        if scheme == "megabatch":
            return "hierbatching"
        # MariusGNN's sequential keeps every training partition resident; it fits only
        # when they are at most the capacity. Otherwise spread them over states.
        p = self.store.num_partitions
        c = self._capacity_arg or max(2, math.ceil(p / 2))
        return "sequential" if len(self.train_partitions) <= c else "dispersed"

    def _plan_options(self) -> dict[str, Any]:
        options = dict(self.options, train_partitions=self.train_partitions)
        if self.policy == "hierbatching":
            options["reuse"] = self.reuse
        return options

    def __len__(self) -> int:
        """Batches of epoch 0 (`num_batches`)."""
        return self.num_batches(0)

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` (with ``reuse`` passes; states cut batches separately)."""
        plan = self.plan(epoch)
        per_state = plan.target_states(self.targets // self.store.partition_size)
        return sum(passes * math.ceil(len(mine) / self.batch_size)
                   for mine, passes in zip(per_state, self._passes(plan)))

    def _passes(self, plan) -> list[int]:
        passes = getattr(plan, "passes", None)
        if passes is None:
            return [1] * len(plan.states)
        return [int(x) for x in passes] if self.policy == "hierbatching" else [int(x) * self.reuse for x in passes]

    def epoch(self, epoch: int, *, lookahead: bool = True) -> Iterator[NodeBatch]:
        """The batches of ``epoch`` (each valid until the next one is requested); with
        ``lookahead``, the next epoch's first partitions are read during the last state."""
        plan = self.plan(epoch)
        order_gen = _epoch_generator(self.seed, epoch, 1)
        sample_gen = _epoch_generator(self.seed, epoch, 2)
        passes = self._passes(plan)
        # Which targets each state trains (all of its training partitions' nodes, or with
        # DISPERSED a random share of them), ascending store ids.
        per_state = plan.target_states(self.targets // self.store.partition_size)
        buffer = self._buffer(epoch, plan.states, None, lookahead)
        workspace = None
        try:
            for loaded in buffer:
                g = loaded.graph
                if workspace is None or workspace.numel() != g.num_nodes:
                    workspace = new_workspace(g)
                local = g.to_local(self.targets[per_state[loaded.index]])
                for _ in range(passes[loaded.index]):
                    order = torch.randperm(local.numel(), generator=order_gen) if self.shuffle else None
                    ids = local if order is None else local[order]
                    for start in range(0, ids.numel(), self.batch_size):
                        yield self._batch(g, ids[start:start + self.batch_size], sample_gen, workspace)
        finally:
            buffer.close()
            self.epoch_stats.append(buffer.stats)

    def _batch(self, g: ResidentGraph, targets: torch.Tensor, generator: torch.Generator,
               workspace: torch.Tensor) -> NodeBatch:
        dense = sample_dense(g, targets, self.fanouts, generator=generator, workspace=workspace,
                             direction=self.direction, return_edge_ids=g.rel is not None)
        batch = Batch.gather(dense, g.features, g.labels)
        return NodeBatch(batch.dense, batch.features, batch.labels.long(), g)

    def __repr__(self) -> str:
        return f"<NodeLoader {self.settings}>"


@dataclass(frozen=True, slots=True)
class EdgeBatch:
    """Positive edges of one batch with their shared negatives, in the state's local ids."""

    src: torch.Tensor
    """int64 [B] local ids."""
    dst: torch.Tensor
    """int64 [B] local ids."""
    rel: torch.Tensor
    """int64 [B] relation ids (zeros without relations)."""
    negatives: NegativeSample
    """``nodes`` [C, K] local ids shared by chunks of the batch."""
    graph: ResidentGraph
    """The state's graph (embeddings, features, CSC for an encoder)."""
    dense: Any = None
    """With fanouts: the DENSE over ``nodes`` (targets = ``nodes``; with relations it carries
    ``edge_ids``, so ``graph.rel[dense.edge_ids]`` are the sampled edges' types), else None."""
    nodes: torch.Tensor | None = None
    """With fanouts: int64 [U] distinct local ids of src, dst and negatives; the encoder's
    outputs come in this order (``src_index``... map into it)."""
    index: dict = field(default_factory=dict)
    """With fanouts: ``src``, ``dst``, ``neg`` positions of each id in ``nodes``."""


class EdgeLoader(_Loader):
    """Batches of training edges (the store's edges) with negatives, for link prediction.

    The training edges are the store's edges; each state trains the buckets the plan
    assigns to it (COMET/BETA: every bucket exactly once an epoch), shuffled, in batches of
    ``batch_size`` positives with ``negatives`` shared per chunk (MariusGNN's
    ``num_chunks``, ``degree_fraction``), drawn from the state's resident nodes.

    With ``embeddings`` (an `EmbeddingTable`), the resident rows are
    ``batch.graph.embeddings`` and every update to them is written back to the store.
    With ``fanouts``, each batch also carries a DENSE over its distinct endpoints and
    negatives, for a GNN encoder.
    """

    task = "link"

    def __init__(self, store: Store, *, batch_size: int, negatives: int, num_chunks: int = 1,
                 degree_fraction: float = 0.0, scheme: str = "minibatch", policy: str | None = None,
                 capacity: int | None = None, buffer_bytes: int | None = None,
                 embeddings: EmbeddingTable | None = None, fanouts: Sequence[int] | None = None,
                 num_logical_partitions: int | None = None, seed: int = 0, prefetch: bool = True) -> None:
        if scheme == "megabatch":
            raise ConfigError("link prediction runs the minibatch or disk scheme (megabatch is for node classification)")
        if int(batch_size) < 1 or int(negatives) < 0 or int(num_chunks) < 1:
            raise ConfigError("batch_size and num_chunks must be >= 1 and negatives >= 0")
        self.batch_size, self.negatives, self.num_chunks = int(batch_size), int(negatives), int(num_chunks)
        self.degree_fraction = float(degree_fraction)
        self.table = embeddings
        self.fanouts = None if fanouts is None else tuple(fanouts)
        options = {}
        if num_logical_partitions is not None:
            if (policy or "comet") != "comet" or scheme != "disk":
                raise ConfigError("num_logical_partitions is COMET's setting (scheme 'disk', policy 'comet')")
            options["num_logical_partitions"] = num_logical_partitions
        # Without it, COMET picks l from the capacity the budget settles on
        # (`default_logical_partitions`: two logical partitions always fit), so every
        # capacity the budget search tries is a valid plan.
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, embedding_dim=0 if embeddings is None else embeddings.dim,
                         policy_options=options)
        self.settings.update(batch_size=self.batch_size, negatives=self.negatives, num_chunks=self.num_chunks,
                             degree_fraction=self.degree_fraction, fanouts=self.fanouts and list(self.fanouts),
                             embedding_dim=self.embedding_dim)
        if self.policy == "comet":
            # The l the plans use, chosen or derived (the same every epoch).
            self.settings.update(self.plan(0).options)

    def _default_policy(self, scheme: str) -> str:
        return "in_memory" if scheme == "minibatch" else "comet"

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options, task="link") if self.policy == "in_memory" else dict(self.options)

    def __len__(self) -> int:
        """Batches of epoch 0 (`num_batches`)."""
        return self.num_batches(0)

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch``: each state's assigned buckets' edges, cut into batches
        (COMET regroups every epoch, so the count varies a little)."""
        plan = self.plan(epoch)
        p = self.store.num_partitions
        sizes = np.diff(self.store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: bucket (i, j)
        if plan.bucket_states is None:
            return math.ceil(int(sizes.sum()) / self.batch_size)
        states = np.asarray(plan.bucket_states)
        per_state = np.bincount(states.ravel(), weights=sizes.ravel(), minlength=len(plan.states))
        return int(sum(math.ceil(n / self.batch_size) for n in per_state))

    def epoch(self, epoch: int, *, lookahead: bool = True) -> Iterator[EdgeBatch]:
        """The batches of ``epoch`` (each valid until the next one is requested); with
        ``lookahead``, the next epoch's first partitions are read during the last state."""
        plan = self.plan(epoch)
        order_gen = _epoch_generator(self.seed, epoch, 3)
        neg_gen = _epoch_generator(self.seed, epoch, 4)
        sample_gen = _epoch_generator(self.seed, epoch, 5)
        state_of = (torch.from_numpy(np.asarray(plan.bucket_states).astype(np.int64))
                    if plan.bucket_states is not None else None)
        buffer = self._buffer(epoch, plan.states, self.table, lookahead)
        P, p = self.store.partition_size, self.store.num_partitions
        workspace = None
        try:
            for loaded in buffer:
                g = loaded.graph
                if workspace is None or workspace.numel() != g.num_nodes:
                    workspace = new_workspace(g)
                dst = torch.repeat_interleave(torch.arange(g.num_nodes), g.indptr.diff())
                src = g.indices
                ids = g.node_ids
                keep = (ids[src] >= 0) & (ids[src] // P < p)
                if g.cache_ids.size:  # static-cache edges are not training edges
                    keep &= (src < g.cache_start) & (dst < g.cache_start)
                if state_of is not None:
                    keep &= state_of[ids[src] // P, ids[dst] // P] == loaded.index
                edges = torch.nonzero(keep).flatten()
                # Enumerate edges and candidates by store id, not by local id: which slots
                # the partitions occupy (it depends on earlier epochs) must not change what
                # an epoch draws, or a resumed run would diverge.
                edges = edges[torch.argsort(ids[dst[edges]], stable=True)]
                edges = edges[torch.randperm(edges.numel(), generator=order_gen)]
                resident = torch.nonzero(ids >= 0).flatten()
                resident = resident[torch.argsort(ids[resident])]
                degrees = g.indptr.diff().to(torch.float64) if self.degree_fraction > 0 else None
                rel_all = g.rel if g.rel is not None else None
                for start in range(0, edges.numel(), self.batch_size):
                    e = edges[start:start + self.batch_size]
                    negs = sample_negatives(
                        e.numel(), num_chunks=min(self.num_chunks, max(1, e.numel())),
                        negatives_per_positive=self.negatives, num_nodes=g.num_nodes, generator=neg_gen,
                        degree_fraction=self.degree_fraction, candidates=resident, degrees=degrees)
                    rel = rel_all[e] if rel_all is not None else torch.zeros(e.numel(), dtype=torch.int64)
                    yield self._batch(g, src[e], dst[e], rel, negs, sample_gen, workspace)
        finally:
            buffer.close()
            self.epoch_stats.append(buffer.stats)

    def _batch(self, g, src, dst, rel, negs, generator, workspace) -> EdgeBatch:
        if self.fanouts is None:
            return EdgeBatch(src, dst, rel, negs, g)
        nodes, inverse = torch.unique(torch.cat([src, dst, negs.nodes.flatten()]), return_inverse=True)
        # Targets in store-id order (not local-id order, which depends on the slots), so the
        # sampler consumes its random stream the same way under any slot layout.
        order = torch.argsort(g.node_ids[nodes])
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel())
        nodes, inverse = nodes[order], rank[inverse]
        b = src.numel()
        index = {"src": inverse[:b], "dst": inverse[b:2 * b], "neg": inverse[2 * b:].view(negs.nodes.shape)}
        dense = sample_dense(g, nodes, self.fanouts, generator=generator, workspace=workspace,
                             return_edge_ids=g.rel is not None)
        return EdgeBatch(src, dst, rel, negs, g, dense, nodes, index)

    def __repr__(self) -> str:
        return f"<EdgeLoader {self.settings}>"
