"""What node and edge loaders share: resolving a scheme into settings, the planner and the
buffer walk, and the epoch's buffer counters."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from graphstore._heap import bound_heap_growth
from graphstore.buffer import BufferMemory, BufferStats, StaticCache
from graphstore.buffer.budget import BufferFootprint, capacity_for_budget
from graphstore.buffer.policies import EpochPlan
from graphstore.errors import ConfigError, OutOfCoreWarning
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store
from graphstore.loaders.pipeline import QUEUE_SHARE, BatchStep, Pipelined, PipelineStats, check_loader_threads
from graphstore.loaders.schemes import SCHEMES, Scheme
from graphstore.loaders.shard import Shard
from graphstore.loaders.stages import BufferWalk, EpochContext, Planner, Stage, StructureWalk, run_stages

__all__ = ["BufferedLoader"]

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, OutOfCoreWarning, stacklevel=4)


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


class Transform:
    """A user's per-batch function (e.g. ``NodeBatch.to_pyg``) as a per-batch step, so it
    runs on the loader's threads."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def bind(self, ctx) -> Callable[[Any, int], Any]:
        return lambda batch, index: self.fn(batch)


def resolve_scheme(name: str, task: str) -> Scheme:
    """The registered scheme ``name``, checked to serve ``task``."""
    if name not in SCHEMES:
        raise ConfigError(f"scheme must be one of {SCHEMES.names(lambda s: task in s.tasks)} (got {name!r})")
    scheme = SCHEMES.get(name)
    if task not in scheme.tasks:
        serving = [n for n in SCHEMES.names() if task in SCHEMES.get(n).tasks]
        other = "node classification" if task == "link" else "link prediction"
        raise ConfigError(f"{'link prediction' if task == 'link' else 'node classification'} runs the "
                          f"{' or '.join(serving)} scheme ({name} is for {other})")
    return scheme


class BufferedLoader:
    """Resolves the scheme, the capacity and the static cache once; owns the `Planner` and
    the `BufferWalk` every epoch starts from. Subclasses set ``task`` and the stages."""

    task = "node"

    def __init__(self, store: Store, *, scheme: str, policy: str | None, capacity: int | None,
                 buffer_bytes: int | None, seed: int, prefetch: bool, embedding_dim: int = 0,
                 cache_fraction: float | None = 0.0, policy_options: dict[str, Any] | None = None,
                 train_partitions: Sequence[int] = (), embeddings: EmbeddingTable | None = None,
                 shard: Shard | None = None, write_back: bool = True, loader_threads: int | None = None,
                 transform: Callable[[Any], Any] | None = None) -> None:
        self.scheme_spec = resolve_scheme(scheme, self.task)
        self.loader_threads = check_loader_threads(loader_threads)
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be a callable taking a batch (got {transform!r})")
        self.transform = transform
        if capacity is not None and buffer_bytes is not None:
            raise ConfigError("give the buffer as partitions (capacity) or as bytes (buffer_bytes), not both")
        if buffer_bytes is not None:
            bound_heap_growth()  # freed buffers go back to the system, not to a thread's heap
        self.store, self.scheme, self.seed, self.prefetch = store, scheme, int(seed), bool(prefetch)
        p = store.num_partitions
        self.policy = policy or self.scheme_spec.policy(self.task, p, capacity, train_partitions)
        self.options = dict(policy_options or {})
        self.cache = StaticCache.choose(store, cache_fraction)
        self.cache_fraction = 0.0 if self.cache is None else self.cache.fraction
        self.footprint: BufferFootprint | None = None
        # The batches the threads make ahead are held beside the buffer: with a byte budget
        # they get a share of it, and the buffer the rest.
        self.queue_bytes = (buffer_bytes // QUEUE_SHARE if buffer_bytes is not None and self.loader_threads > 0
                            else None)
        if self.scheme_spec.whole_graph:
            c = p
        elif buffer_bytes is not None:
            c, self.footprint = capacity_for_budget(
                store, buffer_bytes, self.policy, prefetch=prefetch, embedding_dim=embedding_dim,
                reserved_bytes=self.queue_bytes or 0,
                static_cache=self.cache, seed=seed, **self._plan_options())
        elif capacity is not None:
            c = int(capacity)
        else:
            c = self.scheme_spec.capacity(p)
        self.capacity = min(c, p)
        self._capacity_resolved()
        if not self.scheme_spec.whole_graph and self._samples_neighbours():
            _warn_if_partitions_scatter(store, self.capacity)
        self.buffer_bytes = buffer_bytes
        self.embedding_dim = embedding_dim
        self.planner = Planner(store, self.policy, self.capacity, self.seed, self._plan_options())
        if self.scheme_spec.resident_features:
            self.walk = BufferWalk(store, self.planner, prefetch=self.prefetch, embedding_dim=embedding_dim,
                                   cache=self.cache, embeddings=embeddings, shard=shard, write_back=write_back)
        else:  # features stay in the store: the structure alone, built once
            self.walk = StructureWalk(store)

    def _common_settings(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "policy": self.policy, "num_partitions": self.store.num_partitions,
                "capacity": self.capacity, "buffer_bytes": self.buffer_bytes, "prefetch": self.prefetch,
                "seed": self.seed, "static_cache_fraction": self.cache_fraction,
                "static_cache_nodes": 0 if self.cache is None else self.cache.num_nodes,
                "loader_threads": self.loader_threads, "loader_queue_bytes": self.queue_bytes}

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options)

    def _samples_neighbours(self) -> bool:
        """Whether batches sample neighbourhoods among the resident partitions (a cut edge
        is then a lost neighbour): node classification always; link prediction with an
        encoder."""
        return True

    def _capacity_resolved(self) -> None:
        """Called once ``self.capacity`` is known, before the plan is made (a subclass's
        defaults that depend on it)."""

    @property
    def held_bytes(self) -> int:
        """Bytes of buffer slots held between epochs (0 for macro-batching's structure walk,
        whose structure is built once for the run)."""
        memory = getattr(self.walk, "memory", None)
        return 0 if memory is None else memory.nbytes

    def release_memory(self) -> int:
        """Free the buffer slots held between epochs (`BufferWalk.release`): the next epoch
        reads its first state again. Returns the bytes freed."""
        release = getattr(self.walk, "release", None)
        return 0 if release is None else release()

    def plan(self, epoch: int) -> EpochPlan:
        """The epoch's `EpochPlan` (a pure function of the settings and ``epoch``)."""
        return self.planner.plan(epoch)

    def stages(self) -> list[Stage]:
        """The stages after the buffer walk, in order (the subclass's composition)."""
        raise NotImplementedError

    def _pipeline(self, targets: Stage, per_batch: list[BatchStep], after: list[Stage]) -> list[Stage]:
        """``targets``, then ``per_batch`` on the loader's threads (`Pipelined`), then
        ``after`` in the consumer's order; the ``transform`` last, on the threads too (with
        the per-batch steps when nothing runs after them)."""
        transform = [] if self.transform is None else [Transform(self.transform)]
        self._pool = Pipelined(per_batch + (transform if not after else []), threads=self.loader_threads,
                               max_bytes=self.queue_bytes)
        stages = [targets, self._pool]
        stages += after
        if after and transform:
            # Items after ``after`` carry no state end, so the pool could not hold the walk
            # back at one: threads only when the epoch is one state (minibatch, macrobatch).
            one_state = self.scheme_spec.whole_graph or not self.scheme_spec.resident_features
            stages.append(Pipelined(transform, threads=self.loader_threads if one_state else 0, keyed=False))
        return stages

    def num_batches(self, epoch: int) -> int:
        raise NotImplementedError

    def epoch(self, epoch: int, *, lookahead: bool = True) -> Iterator:
        """The batches of ``epoch`` (each valid until the next one is requested); with
        ``lookahead``, the next epoch's first partitions are read during the last state."""
        ctx = EpochContext(epoch, self.plan(epoch), self.seed)
        yield from run_stages(self.walk.states(ctx, lookahead=lookahead), self.stages(), ctx)

    def __len__(self) -> int:
        """Batches of epoch 0 (`num_batches`)."""
        return self.num_batches(0)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.settings.to_dict()}>"

    @property
    def pipeline_stats(self) -> PipelineStats | None:
        """What the loader threads held ahead of the consumer in the last epoch (None
        before the first)."""
        pool = getattr(self, "_pool", None)
        return None if pool is None else pool.stats

    @property
    def memory(self) -> BufferMemory | None:
        """The buffer's slot memory (allocated by the first epoch, kept for the run)."""
        return self.walk.memory

    @property
    def epoch_stats(self) -> list[BufferStats]:
        """The buffer's counters of every epoch run, in order."""
        return self.walk.epoch_stats

    @property
    def last_stats(self) -> BufferStats | None:
        """The buffer's counters of the last epoch run (None before the first)."""
        return self.walk.epoch_stats[-1] if self.walk.epoch_stats else None
