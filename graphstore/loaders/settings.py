"""Every choice a loader made, as a typed record (printed and recorded by the trainers).

A loader resolves its arguments once (the scheme's defaults, the capacity a byte budget
allows, the static cache the store holds) into one of these frozen dataclasses. ``to_dict``
is what the metrics JSON records (the same fields the trainers have always written);
``from_dict`` reads such a record back, checking every field, so a run's record can be
compared with, or replayed from, what it says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from graphstore.errors import ConfigError

__all__ = ["EdgeLoaderSettings", "LoaderSettings", "NodeLoaderSettings"]

# Field kinds for from_dict's checks (the annotations are strings under
# ``from __future__ import annotations``; this table is the checked contract).
_INT, _FLOAT, _BOOL, _STR, _INTS = "int", "float", "bool", "str", "ints"


def _check(source: str, name: str, value: Any, kind: str, optional: bool) -> Any:
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{source}: {name} is required")
    if kind == _BOOL:
        ok = isinstance(value, bool)
    elif kind == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == _FLOAT:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind == _STR:
        ok = isinstance(value, str)
    else:  # a sequence of ints (fanouts)
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                      for v in value)
        value = tuple(value) if ok else value
    if not ok:
        raise ConfigError(f"{source}: {name} must be {'an' if kind == _INT else 'a'} {kind} (got {value!r})")
    return value


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """What every loader decides: the scheme, the buffer and the static cache."""

    scheme: str
    """Registered scheme (`graphstore.loaders.SCHEMES`)."""
    policy: str
    """Buffer policy the plans come from (`graphstore.buffer.POLICIES`)."""
    num_partitions: int
    """p, partitions of the store."""
    capacity: int
    """c, partitions resident at once (clamped to p)."""
    buffer_bytes: int | None
    """The byte budget the capacity was derived from, or None when given as partitions."""
    prefetch: bool
    """The next state is read in the background."""
    seed: int
    """With the epoch number, every random choice of an epoch."""
    static_cache_fraction: float
    """Fraction of the nodes in HierBatching's static cache (0.0: none)."""
    static_cache_nodes: int
    """Nodes in the static cache."""
    loader_threads: int | None
    """Threads that sample and gather the batches (`graphstore.loaders.pipeline`; 0: in the
    consumer's thread); None in records written before it was recorded."""
    loader_queue_bytes: int | None
    """With threads and a byte budget: the bytes of batches they may hold ahead of the
    consumer (`QUEUE_SHARE` of the budget, the buffer sized from the rest); else None."""

    _KINDS: ClassVar[dict[str, str]] = {
        "scheme": _STR, "policy": _STR, "num_partitions": _INT, "capacity": _INT, "buffer_bytes": _INT,
        "prefetch": _BOOL, "seed": _INT, "static_cache_fraction": _FLOAT, "static_cache_nodes": _INT,
        "loader_threads": _INT, "loader_queue_bytes": _INT}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"buffer_bytes", "loader_threads", "loader_queue_bytes"})
    _OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset()
    """Fields left out of `to_dict` when None: the ones added after records were first
    written, so a record of a run that does not use them keeps its old shape."""

    def to_dict(self) -> dict[str, Any]:
        """Field -> JSON value (tuples as lists), in declaration order."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self._OMIT_IF_NONE:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "loader settings"):
        """The settings in ``values`` (e.g. a metrics JSON's ``config.loaders.train``).

        Raises
        ------
        ConfigError
            One line naming ``source`` and the field: unknown, missing or of the wrong type.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ConfigError(f"{source}: unknown field {unknown[0]!r} (known: {', '.join(names)})")
        kinds = cls._all_kinds()
        optional = cls._all_optional()
        return cls(**{n: _check(source, n, values.get(n), kinds[n], n in optional) for n in names})

    @classmethod
    def _all_kinds(cls) -> dict[str, str]:
        kinds: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            kinds.update(klass.__dict__.get("_KINDS", {}))
        return kinds

    @classmethod
    def _all_optional(cls) -> frozenset[str]:
        out: set[str] = set()
        for klass in cls.__mro__:
            out |= klass.__dict__.get("_OPTIONAL", frozenset()) | klass.__dict__.get("_OMIT_IF_NONE", frozenset())
        return frozenset(out)


@dataclass(frozen=True, slots=True)
class NodeLoaderSettings(LoaderSettings):
    """A `NodeLoader`'s choices."""

    split: str
    """Node split of the targets, or ``"custom"`` for given ids."""
    fanouts: tuple[int, ...]
    """Neighbours per hop, nearest first; -1 = all."""
    batch_size: int
    """Targets per batch."""
    reuse: int
    """Passes over each state's targets (HierBatching's reuse)."""
    shuffle: bool
    """Targets shuffled in each pass."""
    num_targets: int
    """Targets an epoch trains (each ``reuse`` times per state that trains it)."""
    micro_batches: int | None = None
    """Micro-batches per batch (Betty), fixed; None: not split or split by budget."""
    micro_batch_budget: int | None = None
    """Bytes a micro-batch's training step may take; the fewest micro-batches that fit."""
    micro_strategy: str | None = None
    """How targets are grouped into micro-batches (`graphstore.sample.STRATEGIES`)."""
    macro_batches: int | None = None
    """Mini-batches per macro-batch (BatchGNN; -1: every batch of the epoch), or None."""
    macro_batch_bytes: int | None = None
    """Most bytes of feature rows a macro-batch round holds, or None (no bound)."""
    feature_cache_bytes: int | None = None
    """Bytes of the macro-batch scheme's feature cache, or None (no cache)."""
    feature_cache: str | None = None
    """Its policy (``belady`` or ``lru``), with a cache."""
    cache_lookahead: int | None = None
    """Mini-batches a Belady cache sees ahead, with a cache."""
    aggregated: str | None = None
    """The stored neighbour aggregate read with the features (BatchGNN's aggregation cache:
    ``mean``, ``sum`` or ``gcn``), or None."""
    world_size: int | None = None
    """Data-parallel ranks sharing each epoch (`graphstore.loaders.shard`; the rank itself is
    not recorded: every rank's record is the same), or None for one process."""
    balance_labels: bool | None = None
    """True: each state's loss weighs its classes to the training split's label mix
    (`NodeBatch.class_weights`); None: unweighted."""
    label_skew: float | None = None
    """With ``balance_labels=None`` (decided by the data): how much further the epoch-0
    states' label mixes are from the split's than random states of their sizes (total
    variation distance, `graphstore.loaders.node.label_skew`), which decided it; else None."""
    seed_assignment: str | None = None
    """With ``world_size``: ``"local"`` (each rank trains the targets of the rows it holds,
    `graphstore.loaders.shard.Shard.local_shares`) or ``"interleaved"`` (every N-th batch),
    as the loader divided them by batches; None for one process."""

    _KINDS: ClassVar[dict[str, str]] = {
        "split": _STR, "fanouts": _INTS, "batch_size": _INT, "reuse": _INT, "shuffle": _BOOL,
        "num_targets": _INT, "micro_batches": _INT, "micro_batch_budget": _INT, "micro_strategy": _STR,
        "macro_batches": _INT, "macro_batch_bytes": _INT, "feature_cache_bytes": _INT, "feature_cache": _STR,
        "cache_lookahead": _INT, "aggregated": _STR, "world_size": _INT,
        "balance_labels": _BOOL, "label_skew": _FLOAT, "seed_assignment": _STR}
    _OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"loader_queue_bytes", "micro_batches", "micro_batch_budget", "micro_strategy",
                                                         "macro_batches", "macro_batch_bytes", "feature_cache_bytes",
                                                         "feature_cache", "cache_lookahead", "aggregated",
                                                         "world_size", "balance_labels", "label_skew",
                                                         "seed_assignment"})


@dataclass(frozen=True, slots=True)
class EdgeLoaderSettings(LoaderSettings):
    """An `EdgeLoader`'s choices."""

    batch_size: int
    """Positive edges per batch."""
    negatives: int
    """Negatives per chunk."""
    num_chunks: int
    """Chunks of a batch, each sharing one set of negatives (MariusGNN)."""
    degree_fraction: float
    """Share of the negatives drawn by degree, the rest uniformly."""
    fanouts: tuple[int, ...] | None
    """Neighbours per hop for a GNN encoder, or None (embeddings or features only)."""
    embedding_dim: int
    """Width of the learnable embeddings the buffer holds (0: none)."""
    num_logical_partitions: int | None = None
    """COMET's l (the same every epoch), else None."""
    logical_capacity: int | None = None
    """COMET's logical partitions resident at once, else None."""
    world_size: int | None = None
    """Data-parallel ranks sharing each epoch, or None for one process."""
    embedding_placement: str | None = None
    """With ``world_size``: ``"owned"`` (each rank holds and writes back the partitions of its
    states; rounds of disjoint states) or ``"replicated"`` (every rank holds every row, rank 0
    writes back); None otherwise."""
    spread_buckets: bool | None = None
    """Whether each edge bucket's edges are spread over every state holding both its
    partitions (`SpreadEdgeTargets`) rather than trained whole in the first; None in records
    written before it was recorded."""

    _KINDS: ClassVar[dict[str, str]] = {
        "batch_size": _INT, "negatives": _INT, "num_chunks": _INT, "degree_fraction": _FLOAT,
        "fanouts": _INTS, "embedding_dim": _INT, "num_logical_partitions": _INT, "logical_capacity": _INT,
        "world_size": _INT, "embedding_placement": _STR, "spread_buckets": _BOOL}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"fanouts"})
    _OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"loader_queue_bytes", "num_logical_partitions", "logical_capacity",
                                                         "world_size", "embedding_placement", "spread_buckets"})
