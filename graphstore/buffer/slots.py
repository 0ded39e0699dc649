"""The buffer's slots: partition rows allocated once, and which partition each slot holds.

Not to be confused with the byte budget that sizes them (`graphstore.buffer.budget`) or
with a training step's memory (`graphstore.nn.step_memory`).

A buffer of ``num_slots`` slots holds one partition per slot in preallocated tensors
(pinned when CUDA is present, so copies to the GPU are asynchronous)::

    local id   0 .. P-1 | P .. 2P-1 | ... | (num_slots-1)P .. num_slots*P-1 | cache rows
               slot 0   | slot 1    | ... | slot num_slots-1                | static cache

Partition k in slot z is local ids ``[z*P, z*P + P_k)``. The features, labels and
embeddings of the resident graph are these tensors themselves, so admitting a partition is
one read straight into its slot: no per-state concatenation, no copy.

Double buffering needs more slots than a state has partitions: the next state's new
partitions are read while the current state is trained, so they go to slots the current
state does not use. `slots_needed` counts them (``max |S_t ∪ S_{t+1}|`` with prefetch,
``max |S_t|`` without), and `assign_slots` plans which slot each partition goes to, as a
pure function of the states, so the bytes an epoch will read are known before it starts
(`planned_read_bytes` in the manager uses the same plan).

A slot keeps its partition after eviction until the slot is reused; if that partition is
needed again before then, it is not read again (its rows are unchanged: dirty embeddings
are written back when the slot is reused or at epoch end, never discarded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from graphstore.errors import ConfigError
from graphstore.layout import aligned_empty
from graphstore.layout.dtypes import storage_dtype
from graphstore.layout.store import Store

__all__ = ["BufferMemory", "SlotPlan", "assign_slots", "feature_tensor_dtype", "host_array",
           "lookahead_within", "rows_as_tensor", "slots_needed"]


def feature_tensor_dtype(name: str | None) -> torch.dtype:
    """The torch dtype of feature rows as a store holds them (its manifest's
    ``feature_dtype``; `graphstore.layout.dtypes`): bfloat16's stored uint16 bits are
    ``torch.bfloat16`` values."""
    return torch.bfloat16 if name == "bfloat16" else getattr(torch, storage_dtype(name).name)


def rows_as_tensor(rows: np.ndarray, name: str | None) -> torch.Tensor:
    """Stored feature rows as a tensor of `feature_tensor_dtype`, sharing their memory (no
    cast: rows travel in the stored dtype; the model widens them where it computes)."""
    t = torch.from_numpy(np.asarray(rows))
    return t.view(torch.bfloat16) if name == "bfloat16" else t


def host_array(t: torch.Tensor) -> np.ndarray:
    """A host tensor's numpy view, for reads straight into it: a bfloat16 tensor (which
    numpy cannot hold) as its uint16 bits, the dtype the store's chunks have."""
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """Where each state's partitions live and what must be read for it."""

    slots: tuple[tuple[int, ...], ...]
    """Per state, the slot of each of its partitions (in the state's order)."""
    admitted: tuple[tuple[int, ...], ...]
    """Per state, the partitions read for it (ascending); the rest are held already."""
    evicted: tuple[tuple[tuple[int, int], ...], ...]
    """Per state, ``(slot, partition)`` pairs whose partition is replaced by an admission."""
    final_holder: tuple[int, ...]
    """Partition held by each slot after the last state (-1: empty)."""


def slots_needed(states: Sequence[Sequence[int]], *, prefetch: bool) -> int:
    """Slots a buffer needs for ``states``: the largest state, or with prefetch the largest
    union of two consecutive states (the one trained and the one being read)."""
    sizes = [len(s) for s in states]
    if prefetch:
        sizes += [len(set(a) | set(b)) for a, b in zip(states, states[1:])]
    return max(sizes, default=0)


def lookahead_within(states: Sequence[Sequence[int]], ahead: Sequence[int] | None, *,
                     prefetch: bool) -> tuple[int, ...] | None:
    """The part of the next epoch's first state ``ahead`` to read while ``states``' last
    state trains: what fits in the slots ``states`` need anyway, so looking ahead never
    makes the buffer larger than its epoch (and than the budget that chose its capacity).

    Partitions of ``ahead`` that the last state holds cost nothing; the others take the
    slots the last state leaves free, in ``ahead``'s order. A policy whose next epoch
    starts where this one ended (mega-batches: c of 2c slots free) reads all of it; one
    whose first state is c random partitions after a one-swap epoch (DISPERSED: 1 free
    slot of c + 1) reads what fits and the rest when the next epoch starts. None: nothing
    to read ahead (no prefetch, no states, or no room).
    """
    if not prefetch or not states or not ahead:
        return None
    last = set(states[-1])
    room = slots_needed(states, prefetch=True) - len(last)
    new = [k for k in dict.fromkeys(ahead) if k not in last][:max(0, room)]
    chosen = tuple(k for k in dict.fromkeys(ahead) if k in last or k in set(new))
    return chosen or None


def assign_slots(states: Sequence[Sequence[int]], num_slots: int, *, prefetch: bool,
                 holder: Sequence[int] | None = None) -> SlotPlan:
    """Plan the slot of every partition of every state.

    A partition already in a slot stays there. A new one takes a slot that neither the
    state nor (with prefetch) the previous state uses: an empty slot first, else the one
    least recently used, lowest index on ties. Deterministic.

    Parameters
    ----------
    states : sequence of sequence of int
        Partition ids of each state.
    num_slots : int
        Slots available.
    prefetch : bool
        The previous state's slots are in use while a state is read.
    holder : sequence of int, optional
        Partition held by each slot at the start (-1 empty); default all empty.

    Raises
    ------
    ConfigError
        ``num_slots`` is too small for the states.

    Examples
    --------
    >>> plan = assign_slots([(0, 1), (1, 2), (0, 2)], 3, prefetch=True)
    >>> plan.slots, plan.admitted
    (((0, 1), (1, 2), (0, 2)), ((0, 1), (2,), ()))
    """
    need = slots_needed(states, prefetch=prefetch)
    if need > num_slots:
        raise ConfigError(f"these states need {need} buffer slots "
                          f"({'with' if prefetch else 'without'} prefetch); the buffer has {num_slots}")
    held = list(holder) if holder is not None else [-1] * num_slots
    if len(held) != num_slots:
        raise ConfigError(f"holder must list {num_slots} slots (got {len(held)})")
    where = {k: z for z, k in enumerate(held) if k >= 0}
    last_used = [-1] * num_slots
    previous: set[int] = set()
    all_slots, all_admitted, all_evicted = [], [], []
    for t, state in enumerate(states):
        state = [int(k) for k in state]
        kept = {where[k] for k in state if k in where}
        busy = kept | (previous if prefetch else set())
        new = sorted(k for k in state if k not in where)
        free = sorted((z for z in range(num_slots) if z not in busy),
                      key=lambda z: (held[z] >= 0, last_used[z], z))
        evicted = []
        for k, z in zip(new, free, strict=False):
            if held[z] >= 0:
                evicted.append((z, held[z]))
                del where[held[z]]
            held[z], where[k] = k, z
        slots = tuple(where[k] for k in state)
        for z in slots:
            last_used[z] = t
        previous = set(slots)
        all_slots.append(slots)
        all_admitted.append(tuple(new))
        all_evicted.append(tuple(evicted))
    return SlotPlan(tuple(all_slots), tuple(all_admitted), tuple(all_evicted), tuple(held))


@dataclass(eq=False)
class BufferMemory:
    """Preallocated slot tensors, the partition each slot holds, and which are dirty.

    Create with `BufferMemory.allocate`. One `BufferManager` uses it at a time; passing
    the same memory to the next epoch's manager keeps what is resident (the next epoch
    does not re-read partitions it finds in their slots).
    """

    num_slots: int
    partition_size: int
    features: torch.Tensor | None
    """[num_slots * P + cache_rows, D], the store's feature dtype."""
    labels: torch.Tensor | None
    """[num_slots * P + cache_rows] int32 (the store's dtype; -1 unlabeled)."""
    embeddings: torch.Tensor | None
    """[num_slots * P, 2, d] float32: embedding and optimizer state of each row."""
    cache_rows: int
    holder: list[int] = field(default_factory=list)
    """Partition whose rows slot z holds, -1 if none (or mid-read)."""
    dirty: list[bool] = field(default_factory=list)
    """Slot z's embeddings differ from the store's."""
    buckets: dict = field(default_factory=dict)
    """Edge buckets ``(i, j) -> (src, dst, rel)`` read while i and j are held: views into
    the arrays of the span they were read with (`graphstore.buffer.manager._Span`), or
    shared empty arrays."""
    spans: dict = field(default_factory=dict)
    """Bucket ``(i, j)`` -> the span (`graphstore.buffer.manager._Span`) whose arrays it
    views (non-empty buckets)."""
    hub_edges: dict = field(default_factory=dict)
    """Static cache: hub segments ``g -> (src, dst, rel)`` read while partition g is held
    (g = p, the hub-hub segment, stays once read)."""
    hub_positions: dict = field(default_factory=dict)
    """The hub-hub segment's ends as positions among the cache ids (computed once)."""
    cache_filled: tuple | None = None
    """Which static cache the cache rows hold (read once per memory, not per epoch)."""
    last_graph: tuple | None = None
    """``(key, ResidentGraph)`` of the last state assembled, reused while its slots hold the
    same partitions (the graph's arrays are not copied)."""
    in_use: bool = False

    @classmethod
    def allocate(cls, store: Store, num_slots: int, *, with_features: bool = True,
                 embedding_dim: int = 0, cache_rows: int = 0, pin: bool | None = None) -> BufferMemory:
        """Allocate tensors for ``num_slots`` partitions of ``store`` plus ``cache_rows``.

        ``pin`` defaults to whether CUDA is available (pinned host memory only helps
        host-to-device copies and costs more to allocate).
        """
        if int(num_slots) < 0 or int(cache_rows) < 0 or int(embedding_dim) < 0:
            raise ConfigError("num_slots, cache_rows and embedding_dim must be >= 0")
        pin = torch.cuda.is_available() if pin is None else bool(pin)
        m, P = store.manifest, store.partition_size
        rows = int(num_slots) * P + int(cache_rows)

        def empty(shape, dtype):
            if pin:
                return torch.zeros(shape, dtype=dtype, pin_memory=True)  # page-aligned
            # 4096-aligned, so whole chunks are read with O_DIRECT straight into the slots.
            np_dtype = host_array(torch.empty(0, dtype=dtype)).dtype
            array = aligned_empty(shape, np_dtype)
            array.fill(0)
            return torch.from_numpy(array).view(dtype)

        features = labels = embeddings = None
        if with_features and m.has_features:
            features = empty((rows, m.feature_dim), feature_tensor_dtype(m.feature_dtype))
        if m.has_labels:
            labels = empty((rows,), torch.int32)
        if embedding_dim:
            if cache_rows:
                raise ConfigError("a static cache with learnable embeddings is not supported "
                                  "(cached rows would need their own write-back)")
            embeddings = empty((int(num_slots) * P, 2, int(embedding_dim)), torch.float32)
        # No edge memory is reserved here: the buckets a state reads get arrays of their
        # own size (`graphstore.buffer.manager._Span`). Slot regions sized to the partition
        # with the most in-edges were 2.5x the edges on a 4M-node power-law graph, and numpy
        # backs large arrays with huge pages, so they were resident whole once read into.
        return cls(int(num_slots), P, features, labels, embeddings, int(cache_rows),
                   holder=[-1] * int(num_slots), dirty=[False] * int(num_slots))

    def forget(self) -> None:
        """Mark every slot empty, so the next manager reads its partitions again: for a
        data-parallel rank whose partitions other ranks update in the store between its
        states (`graphstore.buffer.policies._disjoint`). Its updates must be written back
        first."""
        if any(self.dirty):
            raise ConfigError("write back the dirty embeddings before forgetting the resident partitions")
        self.holder = [-1] * self.num_slots
        self.buckets.clear()
        self.spans.clear()
        self.hub_edges.clear()
        self.hub_positions.clear()
        self.last_graph = None

    @property
    def cache_start(self) -> int:
        """Local id of the first static-cache row."""
        return self.num_slots * self.partition_size

    @property
    def nbytes(self) -> int:
        """Bytes of the slot tensors."""
        return sum(t.numel() * t.element_size() for t in (self.features, self.labels, self.embeddings)
                   if t is not None)

    def slot_rows(self, z: int, rows: int) -> slice:
        """Local-id slice of the first ``rows`` rows of slot z."""
        return slice(z * self.partition_size, z * self.partition_size + rows)

    def __repr__(self) -> str:
        held = sum(k >= 0 for k in self.holder)
        return (f"<BufferMemory {self.num_slots} slots of {self.partition_size} rows, {held} held, "
                f"{self.nbytes / 2**20:.1f} MiB>")
