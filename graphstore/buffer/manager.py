"""The buffer manager: walks an epoch's buffer states, hiding the disk behind training.

A `BufferManager` is given the states of one epoch (tuples of partition ids, e.g. a
policy's ``plan.states``) and yields one `LoadedState` per state, whose `ResidentGraph`
holds the state's partitions and every edge bucket among them. While the consumer trains
on state ``s``, a loader thread reads what state ``s + 1`` lacks into free slots of the
preallocated `BufferMemory` and assembles its graph (double buffering)::

    consumer   | train s-1        | train s           | train s+1 ...
    loader     |   load s  | wait |   load s+1 | wait |
    handoff            slot (one state) ──> consumer

A state's tensors are the buffer's own memory: they are valid until the consumer asks for
the next state (as with a DataLoader's shared memory), when the loader may reuse the slots.

Reads are incremental and coalesced: which slot each partition takes, and so which
partitions must be read, is planned before the epoch (`graphstore.buffer.slots.assign_slots`);
partitions found in their slots are not read again, and neither are buckets between two
held partitions; new partitions with consecutive ids in consecutive slots are read as one
row range; needed buckets whose byte ranges abut in ``edges/src``, ``edges/dst`` (and
``edges/rel``) are read as one range, since all buckets (i, j) of one destination j are
adjacent there (see `graphstore.layout.base`), and so are needed buckets of one destination
with at most `COALESCE_GAP_BYTES` of unneeded ones between them (small buckets cost more in
requests than in bytes; the span's needed buckets are copied out of it). Rows are read
straight into their slot; a span of buckets into arrays of its own size, its buckets views
of them, and the buckets still held when others of their span are evicted are copied out,
so the edges resident are the held buckets' (what the budget counts), whatever the
partitions' in-degrees.

Learnable embeddings (an `EmbeddingTable`) are read with their partition and marked dirty
when a state is handed to the consumer; a dirty partition is written back (atomically,
`EmbeddingTable.write_partition`) by the loader before its slot is reused, and every dirty
partition at the end of the epoch and on `close`, so no update is lost.

Threading: one `threading.Condition` guards a one-state handoff slot, the counters, the
dirty flags and the closing flag. The loader waits for the handoff slot to empty *before*
it reads the next state, so at most two states are live at once (the one being trained and
the one ready). An exception in the loader is stored, handed to the consumer after the
states loaded before it, and re-raised there (the same object, so its type, message and
the loader-side traceback survive). `close` sets the flag, wakes everyone, joins the thread
and writes back; the loader checks the flag between requests, so close never waits for
more than one request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphstore.buffer.cache import StaticCache
from graphstore.buffer.resident import Bucket, ResidentGraph, assemble_resident_graph, fill_cache_rows
from graphstore.buffer.slots import BufferMemory, SlotPlan, assign_slots, host_array, slots_needed
from graphstore.errors import BufferClosedError, ConfigError, StoreWriteError
from graphstore.layout import ReadStats
from graphstore.layout.dtypes import storage_dtype
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store

__all__ = ["BufferClosedError", "BufferManager", "BufferStats", "LoadedState", "planned_read_bytes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BufferStats:
    """What one pass over the states cost (a snapshot; `BufferManager.stats` makes a new one).

    Counters include a state that was read ahead but not yet delivered.
    """

    states: int
    """States delivered to the consumer."""
    partitions_loaded: int
    """Partitions read from the store (the first state's included)."""
    swaps: int
    """Partitions read for states after the first: the replacement traffic."""
    buckets_read: int
    """Edge buckets read (empty ones included: they cost no bytes and no request)."""
    requests: int
    """Array read requests issued (after coalescing adjacent ranges)."""
    bytes_read: int
    """Bytes delivered by reads: features, labels, embeddings, src, dst, rel."""
    read_seconds: float
    """Wall time the loader spent inside array reads."""
    assemble_seconds: float
    """Wall time spent building `ResidentGraph` objects from resident data (in the loader
    thread or the consumer: `BufferManager`'s ``assemble``)."""
    stall_seconds: float
    """Wall time the consumer waited for the loader (with ``prefetch=False``: all of the
    load; with ``assemble="consumer"``, not the assembly)."""
    partitions_written: int = 0
    """Dirty embedding partitions written back."""
    bytes_written: int = 0
    """Bytes of embedding chunks written back."""
    write_seconds: float = 0.0
    """Wall time spent writing back (loader and consumer)."""
    planned_bytes: int = 0
    """`planned_read_bytes` for the states and slots: the minimum this pass must read."""
    chunks_verified: int = 0
    """Whole chunks whose crc32c the reads checked (features, whole edge chunks, ...)."""
    segments_verified: int = 0
    """Edge buckets and node partitions checked against the store's segment checksums."""
    unverified_reads: int = 0
    """Reads of parts of chunks nothing checked: 0 unless the store predates segment
    checksums (``graphstore upgrade`` adds them). Embedding chunks are checked on their own."""
    hub_segments_read: int = 0
    """Static cache: hub edge segments read (the non-empty ones)."""

    @property
    def read_bandwidth(self) -> float:
        """Bytes per second of read time (0.0 before any read)."""
        return self.bytes_read / self.read_seconds if self.read_seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LoadedState:
    """One buffer state, ready to train (valid until the next state is requested)."""

    index: int
    """Position of the state in the epoch."""
    graph: ResidentGraph
    """The resident partitions (``graph.partitions`` is the state, in the order given) and
    every bucket among them."""
    admitted: tuple[int, ...]
    """Partitions read for this state (ascending); the rest were already in their slots."""


# ---------------------------------------------------------------------- read planning


def _runs(pairs: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Group ``(partition, slot)`` pairs (ascending partition) into runs where both the
    partition ids and the slots are consecutive: one contiguous read into contiguous memory."""
    runs: list[list[tuple[int, int]]] = []
    for k, z in pairs:
        if runs and k == runs[-1][-1][0] + 1 and z == runs[-1][-1][1] + 1:
            runs[-1].append((k, z))
        else:
            runs.append([(k, z)])
    return runs


COALESCE_GAP_BYTES = 64 << 10
"""Needed buckets of one destination partition are read as one range across the buckets
between them that are not needed, when those take at most this many bytes (all edge
arrays together). A read request costs its bookkeeping (open, advise, ``preadv``, checksum,
close: tens of microseconds, more than the bytes of small buckets take at the disk's 1.7
GB/s, about 38 us for 64 KiB), and a small graph cut into many partitions has buckets of a
few dozen edges: Cora in 32 partitions averages 10 edges a bucket, 245 bucket reads an
epoch at 8 of 32 resident. Reading across them trades a few KiB for a request. Not in
MariusGNN or HierBatching, whose buckets are read exactly."""

COALESCE_SPAN_BYTES = 1 << 20
"""A span read across unneeded buckets stays at most this large (all edge arrays together),
and its needed buckets are copied out of it once read (`_Loader._bucket_requests`), so the
buckets not needed are never resident: the edges held are the held buckets' (what the
budget counts). Larger buckets are read exactly, as before."""


def _spans(needed: Sequence[int], offsets: np.ndarray, *, gap_edges: int = 0, span_edges: int = 0,
           group: int = 0, abutting: bool = True) -> list[tuple[int, int, list[int]]]:
    """Group needed segments (ascending indices into ``offsets``, whose segment ``b`` is
    edges ``[offsets[b], offsets[b + 1])``) into ranges read as one: segments that abut
    (only empty ones between; with ``abutting`` False, only within ``span_edges``), or, with
    ``gap_edges``, that have at most that many edges of segments not needed between them
    while the range stays within ``span_edges`` edges. With ``group`` > 0, a range never
    joins segments ``b`` of two values of ``b // group``. Returns ``(lo, hi, segments)``
    edge-position ranges."""
    spans: list[tuple[int, int, list[int]]] = []
    for b in needed:
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        if spans and (group == 0 or spans[-1][2][-1] // group == b // group) and (
                (abutting and spans[-1][1] == lo)
                or (lo - spans[-1][1] <= gap_edges and hi - spans[-1][0] <= span_edges)):
            spans[-1][2].append(b)
            spans[-1] = (spans[-1][0], hi, spans[-1][2])
        else:
            spans.append((lo, hi, [b]))
    return spans


def _bucket_spans(needed: Sequence[int], offsets: np.ndarray, *, gap_edges: int = 0,
                  span_edges: int = 0) -> list[tuple[int, int, list[int]]]:
    """Group needed bucket indices (``b = j * p + i``, ascending) into byte-contiguous spans.

    Two needed buckets of one destination share a span when nothing but empty buckets lies
    between them, so a span is read with exactly the bytes of its buckets; or, with
    ``gap_edges``, when at most that many edges of buckets not needed lie between them and
    the span stays within ``span_edges`` edges. Returns ``(lo, hi, buckets)`` edge-position
    ranges.
    """
    # A span stays within one destination partition: its buckets all leave when that
    # partition is evicted, so the span is dropped whole rather than copied out.
    p = round((len(offsets) - 1) ** 0.5)
    return _spans(needed, offsets, gap_edges=gap_edges, span_edges=span_edges, group=p)


def _coalescing(store: Store) -> dict[str, int]:
    """`_bucket_spans`' allowance for the buffer's reads of ``store`` (`COALESCE_GAP_BYTES`,
    `COALESCE_SPAN_BYTES` in edges)."""
    edge = _edge_bytes(store)
    return {"gap_edges": COALESCE_GAP_BYTES // edge, "span_edges": COALESCE_SPAN_BYTES // edge}


def _check_states(store: Store, states: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    checked = []
    p = store.num_partitions
    for s, state in enumerate(states):
        parts = tuple(int(k) for k in state)
        if len(set(parts)) != len(parts):
            raise ConfigError(f"state {s}: partitions must be distinct (got {list(parts)})")
        bad = [k for k in parts if not 0 <= k < p]
        if bad:
            raise ConfigError(f"state {s}: partition ids must be in [0, {p}) (got {bad[0]})")
        checked.append(parts)
    return checked


def _bucket_reads(states: Sequence[tuple[int, ...]], plan: SlotPlan, p: int, *,
                  holder: Sequence[int] = (), cached: Sequence[tuple[int, int]] = ()) -> list[list[int]]:
    """Per state, the buckets (``b = j * p + i``, ascending) it must read: those among its
    partitions not read since both ends entered their slots. ``holder`` and ``cached``
    describe the memory at the start (partitions held, buckets held)."""
    held = {k for k in holder if k >= 0}
    have = {j * p + i for i, j in cached}
    reads = []
    for parts, admitted, evicted in zip(states, plan.admitted, plan.evicted, strict=True):
        held -= {k for _, k in evicted}
        held |= set(admitted)
        have = {b for b in have if b % p in held and b // p in held}
        needed = sorted(b for b in {j * p + i for j in parts for i in parts} if b not in have)
        have.update(needed)
        reads.append(needed)
    return reads


def _hub_reads(states: Sequence[tuple[int, ...]], plan: SlotPlan, p: int, *, holder: Sequence[int] = (),
               held_segments: Sequence[int] = ()) -> list[list[int]]:
    """Per state, the hub segments it must read: those of its partitions not read since the
    partition entered its slot, and the hub-hub segment (p) the first time."""
    held = {k for k in holder if k >= 0}
    have = set(held_segments)
    reads = []
    for parts, admitted, evicted in zip(states, plan.admitted, plan.evicted, strict=True):
        held -= {k for _, k in evicted}
        held |= set(admitted)
        have = {g for g in have if g == p or g in held}
        needed = sorted(g for g in (*parts, p) if g not in have)
        have.update(needed)
        reads.append(needed)
    return reads


def _edge_bytes(store: Store) -> int:
    """Bytes of one stored edge (src, dst, and rel when typed), in buckets and hub segments."""
    m = store.manifest
    return 2 * np.dtype(m.index_dtype).itemsize + (4 if m.has_relations else 0)


def _row_bytes(store: Store, *, with_features: bool, embedding_dim: int) -> int:
    m = store.manifest
    row = 8 * embedding_dim  # float32 value + optimizer state
    if with_features and m.has_features:
        row += m.feature_dim * storage_dtype(m.feature_dtype).itemsize
    if m.has_labels:
        row += 4
    return row


def _plan_bytes(store: Store, states: Sequence[tuple[int, ...]], plan: SlotPlan, *, row_bytes: int,
                holder: Sequence[int] = (), cached: Sequence[tuple[int, int]] = (),
                static_cache: StaticCache | None = None, held_segments: Sequence[int] = ()) -> int:
    edge_bytes = _edge_bytes(store)
    offsets, total, coalescing = store.bucket_offsets, 0, _coalescing(store)
    reads = _bucket_reads(states, plan, store.num_partitions, holder=holder, cached=cached)
    for admitted, needed in zip(plan.admitted, reads, strict=True):
        total += sum(np.subtract(*store.partition_range(k)[::-1]) for k in admitted) * row_bytes
        # The spans as `_Loader._bucket_requests` reads them: small gaps included.
        total += sum(hi - lo for lo, hi, _ in _bucket_spans(needed, offsets, **coalescing)) * edge_bytes
    if static_cache is not None:
        hub_offsets = static_cache.segment_offsets
        for needed in _hub_reads(states, plan, store.num_partitions, holder=holder, held_segments=held_segments):
            spans = _spans(needed, hub_offsets, abutting=False, **coalescing)
            total += sum(hi - lo for lo, hi, _ in spans) * edge_bytes
    return int(total)


def planned_read_bytes(store: Store, states: Sequence[Sequence[int]], *, with_features: bool = True,
                       prefetch: bool = True, num_slots: int | None = None, embedding_dim: int = 0,
                       static_cache: StaticCache | None = None) -> int:
    """Bytes a `BufferManager` with an empty `BufferMemory` reads for ``states``: each
    partition when it enters a slot (not again while it stays there) and each bucket
    between two partitions when they are first held together.

    Parameters
    ----------
    store : Store
        Only its metadata and ``bucket_offsets`` are used.
    states : sequence of sequence of int
        The buffer states of the epoch, in order.
    with_features : bool
        Count feature rows (as `BufferManager` does when its ``with_features`` is true).
    prefetch, num_slots : bool, int
        As the manager's; ``num_slots`` defaults to `slots_needed`.
    embedding_dim : int
        d of the learnable embeddings read with each partition (0: none).
    static_cache : StaticCache, optional
        HierBatching's hubs: each state's hub edge segments count too (the hubs' rows are
        read once per memory, not per pass, and are not counted).

    Returns
    -------
    int
        Bytes of features, labels, embeddings and edge arrays (src, dst, rel).

    Raises
    ------
    ConfigError
        A repeated or out-of-range partition id in a state, or too few slots.
    """
    states = _check_states(store, states)
    slots = slots_needed(states, prefetch=prefetch) if num_slots is None else num_slots
    plan = assign_slots(states, slots, prefetch=prefetch)
    return _plan_bytes(store, states, plan, static_cache=static_cache,
                       row_bytes=_row_bytes(store, with_features=with_features, embedding_dim=embedding_dim))


# ---------------------------------------------------------------------- the loader


@dataclass(eq=False, slots=True)
class _Span:
    """The buckets filed as views of one coalesced read's arrays, and how many of its edges
    they still hold."""

    keys: list[tuple[int, int]]
    live: int


class _Cancelled(Exception):
    """Raised inside the loader between requests once close() was asked for."""


class _Loader:
    """Reads states into their slots, writes back evicted dirty partitions, assembles graphs.

    Touched by one thread at a time (the loader thread, or the consumer with
    ``prefetch=False``); the counters and dirty flags are shared, under ``lock``.
    """

    def __init__(self, store: Store, states: list[tuple[int, ...]], plan: SlotPlan, *, memory: BufferMemory,
                 embeddings: EmbeddingTable | None, static_cache: StaticCache | None,
                 lock: threading.Condition, write_back: bool = True):
        m = store.manifest
        self.store, self.states, self.plan, self.lock = store, states, plan, lock
        self.memory, self.table, self.static_cache = memory, embeddings, static_cache
        self.writes = write_back
        self.edge_names = ["edges/src", "edges/dst"] + (["edges/rel"] if m.has_relations else [])
        self.offsets = store.bucket_offsets
        self.coalescing = _coalescing(store)
        self.buckets: dict[tuple[int, int], Bucket] = memory.buckets  # held buckets outlive an epoch
        self.spans: dict[tuple[int, int], _Span] = memory.spans
        index = np.dtype(m.index_dtype)
        self.empty_bucket: Bucket = (np.zeros(0, index), np.zeros(0, index),
                                     np.zeros(0, np.int32) if m.has_relations else None)
        self.counts = dict(partitions_loaded=0, swaps=0, buckets_read=0, requests=0, bytes_read=0,
                           read_seconds=0.0, assemble_seconds=0.0, partitions_written=0,
                           bytes_written=0, write_seconds=0.0, chunks_verified=0, segments_verified=0,
                           unverified_reads=0, hub_segments_read=0)
        self.stop_requested: Callable[[], bool] = lambda: False

    def _count(self, seconds: float, **added: int) -> None:
        with self.lock:
            for key, value in added.items():
                self.counts[key] += value
            self.counts["read_seconds" if "bytes_read" in added else "write_seconds"] += seconds

    def _read(self, requests: list[tuple[str, int, int, np.ndarray | None]]) -> list[np.ndarray]:
        """One `Store.read_many` call: every range of a state in flight together."""
        if self.stop_requested():
            raise _Cancelled
        if not requests:
            return []
        t0 = time.perf_counter()
        checked = ReadStats()
        got = self.store.read_many(requests, stats=checked)
        self._count(time.perf_counter() - t0, requests=len(requests), bytes_read=sum(a.nbytes for a in got),
                    chunks_verified=checked.chunks_verified, segments_verified=checked.segments_verified,
                    unverified_reads=checked.unverified_reads)
        return got

    def write_back(self, z: int) -> None:
        """Write slot z's embeddings to the store if dirty (any thread that owns the slot)."""
        memory = self.memory
        with self.lock:
            k, dirty = memory.holder[z], memory.dirty[z]
        if self.table is None or not dirty or k < 0:
            return
        if not self.writes:  # a replica: another process writes the same rows back
            with self.lock:
                memory.dirty[z] = False
            return
        start, stop = self.store.partition_range(k)
        t0 = time.perf_counter()
        written = self.table.write_partition(k, memory.embeddings[memory.slot_rows(z, stop - start)].numpy())
        with self.lock:
            memory.dirty[z] = False
        self._count(time.perf_counter() - t0, partitions_written=1, bytes_written=written)

    def load(self, index: int, *, assemble: bool = True) -> LoadedState | None:
        """Read state ``index`` into its slots and (with ``assemble``) build its graph."""
        admitted = self.read(index)
        return self.assemble(index, admitted) if assemble else None

    def read(self, index: int) -> tuple[int, ...]:
        """Read state ``index``'s admitted partitions, buckets and hub segments into place
        (after writing back what it evicts); returns the admitted partitions."""
        parts, slots = self.states[index], self.plan.slots[index]
        memory = self.memory
        for z, _ in self.plan.evicted[index]:
            self.write_back(z)
            memory.holder[z] = -1
            memory.last_graph = None
        admitted = self.plan.admitted[index]
        where = dict(zip(parts, slots))
        pairs = [(k, where[k]) for k in admitted]
        held = {k for k in memory.holder if k >= 0} | set(admitted)
        self._drop_buckets([key for key in self.buckets if key[0] not in held or key[1] not in held])
        row_requests = self._row_requests(pairs)
        bucket_requests, place_buckets = self._bucket_requests(parts)
        hub_requests, place_hubs = self._hub_requests(parts, held)
        got = self._read(row_requests + bucket_requests + hub_requests)
        place_buckets(got[len(row_requests):len(row_requests) + len(bucket_requests)])
        place_hubs(got[len(row_requests) + len(bucket_requests):])
        self._read_embeddings(pairs)
        for k, z in pairs:
            memory.holder[z] = k
        with self.lock:
            self.counts["partitions_loaded"] += len(admitted)
            if index > 0:
                self.counts["swaps"] += len(admitted)
        return tuple(admitted)

    def assemble(self, index: int, admitted: Sequence[int]) -> LoadedState:
        """The `LoadedState` of state ``index``, read already (`read`). Safe beside the
        loader thread reading the next state: that never touches this state's slots,
        buckets or hub segments (`assign_slots` keeps them), and only adds and removes
        other keys of the dicts read here."""
        parts, slots = self.states[index], self.plan.slots[index]
        memory = self.memory
        t0 = time.perf_counter()
        key = (parts, slots, id(self.static_cache))
        if not admitted and memory.last_graph is not None and memory.last_graph[0] == key:
            # Nothing entered or left these slots since this exact state was assembled (e.g.
            # the in-memory scheme's single state, epoch after epoch): its CSC is still valid.
            graph = memory.last_graph[1]
        else:
            graph = assemble_resident_graph(self.store, parts, slots, memory=memory, buckets=self.buckets,
                                            static_cache=self.static_cache, hub_edges=memory.hub_edges,
                                            hub_positions=memory.hub_positions)
            memory.last_graph = (key, graph)
        with self.lock:
            self.counts["assemble_seconds"] += time.perf_counter() - t0
        logger.debug("state %d: read partitions %s, %d resident", index, list(admitted), len(parts))
        return LoadedState(index=index, graph=graph, admitted=tuple(admitted))

    def _row_requests(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[str, int, int, np.ndarray]]:
        """Reads of the admitted partitions' rows straight into their slots: one range per
        run of consecutive partitions in consecutive slots."""
        memory, store, requests = self.memory, self.store, []
        for run in _runs(pairs):
            start = store.partition_range(run[0][0])[0]
            stop = store.partition_range(run[-1][0])[1]
            rows = memory.slot_rows(run[0][1], stop - start)
            for name, tensor in (("nodes/features", memory.features), ("nodes/labels", memory.labels)):
                if tensor is not None:
                    requests.append((name, start, stop, host_array(tensor[rows])))
        return requests

    def _read_embeddings(self, pairs: Sequence[tuple[int, int]]) -> None:
        if self.table is None:
            return
        memory = self.memory
        for k, z in pairs:
            if self.stop_requested():
                raise _Cancelled
            start, stop = self.store.partition_range(k)
            t0 = time.perf_counter()
            out = memory.embeddings[memory.slot_rows(z, stop - start)].numpy()
            self.table.read_partition(k, out)
            self._count(time.perf_counter() - t0, requests=1, bytes_read=out.nbytes)

    def _hub_requests(self, parts: Sequence[int], held: set[int]):
        """Reads of the hub segments of ``parts`` (and the hub-hub one) not held, one range
        per segment and edge array, and the function that files them. Segments of
        partitions no longer held are dropped first."""
        cache, memory = self.static_cache, self.memory
        if cache is None:
            return [], lambda arrays: None
        p = self.store.num_partitions
        for g in [g for g in memory.hub_edges if g != p and g not in held]:
            del memory.hub_edges[g]
        needed = [g for g in (*sorted(parts), p) if g not in memory.hub_edges]
        names = ["hubs/" + name for name in self.edge_names]
        nonempty = [g for g in needed if cache.segment_sizes[g] > 0]
        offsets = cache.segment_offsets
        # Small segments are read together (`COALESCE_GAP_BYTES`, `COALESCE_SPAN_BYTES`), each
        # then copied out, so a held segment holds its own edges only; larger ones alone.
        spans = _spans(nonempty, offsets, abutting=False, **self.coalescing)
        requests = [(name, lo, hi, None) for lo, hi, _ in spans for name in names]

        def place(arrays: list[np.ndarray]) -> None:
            got = iter(arrays)
            for lo, hi, members in spans:
                span = [next(got) for _ in names]
                shared = len(members) > 1
                for g in members:
                    a, b = int(offsets[g]) - lo, int(offsets[g + 1]) - lo
                    src, dst, *rel = (x[a:b].copy() if shared else x for x in span)
                    memory.hub_edges[g] = (src, dst, rel[0] if rel else None)
            for g in needed:
                if g not in memory.hub_edges:  # empty
                    rel = np.zeros(0, np.int32) if len(names) == 3 else None
                    memory.hub_edges[g] = (np.zeros(0, np.int64), np.zeros(0, np.int64), rel)
            with self.lock:
                self.counts["hub_segments_read"] += len(nonempty)

        return requests, place

    def _bucket_requests(self, parts: Sequence[int]):
        """Reads of the buckets among ``parts`` not held, one range per byte-contiguous span
        and edge array, each into an array of the span's size; and the function that files
        the read spans as buckets (views of the span's arrays, the empty ones shared)."""
        p = self.store.num_partitions
        needed = sorted(j * p + i for j in parts for i in parts if (i, j) not in self.buckets)
        offsets = self.offsets
        spans = _bucket_spans(needed, offsets, **self.coalescing)
        requests = [(name, lo, hi, None) for lo, hi, _ in spans if hi > lo for name in self.edge_names]
        empty = self.empty_bucket

        def place(arrays: list[np.ndarray]) -> None:
            per_span = iter(arrays)
            for lo, hi, members in spans:
                if hi == lo:  # only empty buckets: no request at all
                    for b in members:
                        self.buckets[(b % p, b // p)] = empty
                    continue
                span = [next(per_span) for _ in self.edge_names]
                # Where each member lies in the span; a span read across buckets not needed
                # (`COALESCE_GAP_BYTES`) keeps only its members' edges, copied together.
                at = [(int(offsets[b]) - lo, int(offsets[b + 1]) - lo) for b in members]
                live = sum(b_hi - b_lo for b_lo, b_hi in at)
                if live < hi - lo:
                    span = [np.concatenate([a[b_lo:b_hi] for b_lo, b_hi in at]) for a in span]
                    ends = np.cumsum([0] + [b_hi - b_lo for b_lo, b_hi in at]).tolist()
                    at = list(zip(ends[:-1], ends[1:]))
                record = _Span([], live)
                for b, (b_lo, b_hi) in zip(members, at):
                    key = (b % p, b // p)
                    if b_hi == b_lo:  # a view would keep the span's arrays alive for nothing
                        self.buckets[key] = empty
                        continue
                    # Views into the span: no copy (`_drop_buckets` copies the survivors out
                    # once some of a span's buckets are evicted).
                    src, dst, *rel = (a[b_lo:b_hi] for a in span)
                    self.buckets[key] = (src, dst, rel[0] if rel else None)
                    self.spans[key] = record
                    record.keys.append(key)
            with self.lock:
                self.counts["buckets_read"] += len(needed)

        return requests, place

    def _drop_buckets(self, keys: Sequence[tuple[int, int]]) -> None:
        """Forget buckets ``keys`` (an end evicted); a span that still files other buckets
        has those copied into arrays of their own size, so that what stays resident is the
        held buckets' edges, as the budget counts them (`graphstore.buffer.budget`), not the
        spans they were read with."""
        shrunk: dict[int, _Span] = {}
        for key in keys:
            src = self.buckets.pop(key)[0]
            span = self.spans.pop(key, None)
            if span is not None:
                span.live -= src.shape[0]
                shrunk[id(span)] = span
        for span in shrunk.values():
            if span.live > 0:
                self._compact(span)

    def _compact(self, span: _Span) -> None:
        """Copy the buckets still filed from ``span`` into one new span of their size."""
        keys = [key for key in span.keys if self.spans.get(key) is span]
        held = [self.buckets[key] for key in keys]
        columns = [np.concatenate([b[a] for b in held]) for a in range(len(self.edge_names))]
        moved, lo = _Span(keys, span.live), 0
        for key, bucket in zip(keys, held):
            hi = lo + bucket[0].shape[0]
            src, dst, *rel = (a[lo:hi] for a in columns)
            # Replacing a held key's value is safe beside an assembly reading it: both the old
            # views and the new copy hold the same edges.
            self.buckets[key] = (src, dst, rel[0] if rel else None)
            self.spans[key] = moved
            lo = hi


# ---------------------------------------------------------------------- the handoff

_EMPTY = object()


@dataclass(frozen=True, slots=True)
class _Read:
    """A state the loader thread read but left for the consumer to assemble."""

    index: int
    admitted: tuple[int, ...]


class _Handoff:
    """A one-item slot between the loader thread and the consumer, plus the thread itself.

    Holds no reference to the `BufferManager`, so a manager that is dropped without
    `close` can still be finalized (which closes this).
    """

    def __init__(self, loader: _Loader, count: int, cond: threading.Condition, *, prefetch: bool,
                 lookahead: bool = False, assemble_in_consumer: bool = False):
        self.loader, self.count, self.cond = loader, count, cond
        self.assemble_in_consumer = assemble_in_consumer and prefetch
        self.lookahead = lookahead and prefetch
        self.slot: object = _EMPTY
        self.error: BaseException | None = None
        self.error_raised = False
        self.finished = False  # the loader produced everything it will
        self.closing = False
        self.next_index = 0  # prefetch=False: the next state to load in the consumer
        self.delivered = 0  # prefetch=True: states handed to the consumer
        self.stall_seconds = 0.0
        self.thread: threading.Thread | None = None
        loader.stop_requested = lambda: self.closing
        if prefetch:
            self.thread = threading.Thread(target=self._run, name="graphstore-buffer-loader", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            for index in range(self.count + self.lookahead):
                with self.cond:
                    # Wait for the consumer to take the previous state before reading the
                    # next: two assembled states at most (double, not triple, buffering).
                    while self.slot is not _EMPTY and not self.closing:
                        self.cond.wait()
                    if self.closing:
                        return
                if index == self.count:  # the next epoch's first state: read, not delivered
                    self.loader.load(index, assemble=False)
                    return
                if self.assemble_in_consumer:
                    item = _Read(index, self.loader.read(index))
                else:
                    item = self.loader.load(index)
                with self.cond:
                    if self.closing:  # nobody will take it: do not keep it alive
                        return
                    self.slot = item
                    self.cond.notify_all()
        except _Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the consumer
            with self.cond:
                self.error = exc
        finally:
            with self.cond:
                self.finished = True
                self.cond.notify_all()

    def get(self) -> LoadedState | None:
        """The next state, None after the last; raises the loader's error in its turn."""
        t0 = time.perf_counter()
        try:
            if self.thread is None:
                return self._load_here()
            with self.cond:
                while (self.slot is _EMPTY and not self.finished and not self.closing
                       and self.delivered < self.count):
                    self.cond.wait()
                if self.slot is not _EMPTY:
                    item, self.slot = self.slot, _EMPTY
                    self.delivered += 1
                    self.cond.notify_all()
                    if not isinstance(item, _Read):
                        return item  # type: ignore[return-value]
                else:
                    if self.closing:
                        raise BufferClosedError("the BufferManager was closed while iterating")
                    if self.error is not None and self.delivered < self.count:
                        self.error_raised = True
                        raise self._annotated(self.error)
                    return None  # every state delivered (a lookahead read may still run)
        finally:
            with self.cond:
                self.stall_seconds += time.perf_counter() - t0
        # Read by the loader thread, assembled here, while the thread reads the next state.
        try:
            return self.loader.assemble(item.index, item.admitted)
        except Exception as exc:
            raise self._annotated(exc, item.index)

    def _load_here(self) -> LoadedState | None:
        if self.closing:
            raise BufferClosedError("the BufferManager was closed while iterating")
        if self.next_index >= self.count:
            return None
        try:
            item = self.loader.load(self.next_index)
        except _Cancelled:  # close() from another thread during this load
            raise BufferClosedError("the BufferManager was closed while iterating") from None
        except Exception as exc:
            raise self._annotated(exc)
        self.next_index += 1
        return item

    def _annotated(self, exc: BaseException, index: int | None = None) -> BaseException:
        # The failing state is the first one not delivered: errors come after the states
        # loaded before them.
        if index is None:
            index = self.next_index if self.thread is None else self.delivered
        exc.add_note(f"raised in the buffer loader while loading state {index} "
                     f"(partitions {list(self.loader.states[index])})")
        return exc

    def close(self) -> None:
        t0 = time.perf_counter()
        with self.cond:
            # After the last state, let a lookahead read finish: the next epoch wants it.
            self.closing = self.closing or not (self.lookahead and self.delivered == self.count)
            self.slot = _EMPTY  # drop a state nobody will train
            self.cond.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self.cond:
            self.closing = True
            self.stall_seconds += time.perf_counter() - t0  # the consumer waits here too
        if self.error is not None and not self.error_raised and self.delivered == self.count:
            # A failed lookahead read, after every state was delivered: nothing else would
            # report it. (A consumer that stopped early never asked for the failed state.)
            self.error_raised = True
            raise self.error


# ---------------------------------------------------------------------- the manager


class BufferManager:
    """Iterate over an epoch's buffer states with the next state loaded in the background.

    Parameters
    ----------
    store : Store
        An open store.
    states : sequence of sequence of int
        The resident partitions of each state, in order (e.g. ``plan.states``).
    prefetch : bool
        Load state ``s + 1`` in a background thread while state ``s`` is trained. False
        loads each state in the consumer when it is asked for (a baseline for the stats).
    with_features : bool
        Read feature rows (labels are always read when the store has them).
    memory : BufferMemory, optional
        Preallocated slots (`BufferMemory.allocate`); pass the previous epoch's to keep
        what it holds. Default: allocate `slots_needed` slots for ``states``.
    embeddings : EmbeddingTable, optional
        Learnable embeddings read with each partition into ``graph.embeddings``, marked
        dirty when a state is delivered, written back on eviction, at the end and on close.
    static_cache : StaticCache, optional
        Hub nodes kept resident in every state (HierBatching); its rows go to the
        memory's cache rows.
    lookahead : sequence of int, optional
        The next epoch's first state: with prefetch, read while the last state trains, so
        the next epoch's manager (given the same ``memory``) finds it resident. Its reads
        are in this manager's stats and ``planned_bytes``.
    write_back : bool
        With ``embeddings``: write updated partitions back to the store (the default).
        False for a data-parallel replica whose rows another process writes back (the
        minibatch scheme's replicated table: rank 0 writes, the other ranks hold copies).
    assemble : {"auto", "loader", "consumer"}
        With prefetch, where a state's `ResidentGraph` is built once its data is read: in
        the loader thread, or in the consumer when it takes the state (the reads stay in
        the background either way). "auto" picks "consumer" when torch's threads cover
        every core this process may use, "loader" otherwise: CPU training on every core
        runs OpenMP regions that wait for their slowest thread, so a background thread's
        CPU work (the assembly: 0.1 s a state at 8M edges) slows every region it
        preempts, while reads (the disk's time, not the CPU's) do not. Measured on the
        out-of-core benchmark's paper configuration (2 cores, 2 torch threads): 12.5 s an
        epoch assembling in the loader, 10.5 s in the consumer, 11.6 s without prefetch.

    Raises
    ------
    ConfigError
        A state with a repeated or out-of-range partition id; a memory too small for the
        states, without the arrays asked for, or in use by another manager.

    Notes
    -----
    One manager serves one pass over ``states``; iterate it once, then `close` it (or use
    it as a context manager). An error raised while loading a state is re-raised by the
    iteration after the states before it were yielded, with its loader-side traceback.
    A yielded state's tensors are valid until the next one is requested.

    Examples
    --------
    >>> from graphstore.buffer.manager import BufferStats
    >>> BufferStats(states=2, partitions_loaded=3, swaps=1, buckets_read=7, requests=5,
    ...             bytes_read=1000, read_seconds=0.5, assemble_seconds=0.0,
    ...             stall_seconds=0.1).read_bandwidth
    2000.0

    Typical use (``plan`` from ``graphstore.buffer.plan_epoch``)::

        with BufferManager(store, plan.states) as buffer:
            for loaded in buffer:
                train_on(loaded.graph)
        print(buffer.stats)
    """

    def __init__(
        self,
        store: Store,
        states: Sequence[Sequence[int]],
        *,
        prefetch: bool = True,
        with_features: bool = True,
        memory: BufferMemory | None = None,
        embeddings: EmbeddingTable | None = None,
        static_cache: StaticCache | None = None,
        lookahead: Sequence[int] | None = None,
        assemble: str = "auto",
        write_back: bool = True,
    ) -> None:
        if assemble not in ("auto", "loader", "consumer"):
            raise ConfigError(f"assemble must be 'auto', 'loader' or 'consumer' (got {assemble!r})")
        self.store = store
        self.states = _check_states(store, states)
        self.prefetch = prefetch
        self.assemble = _assemble_where() if assemble == "auto" else assemble
        # The next epoch's first state, read while the last state trains (prefetch only).
        ahead = _check_states(store, [lookahead])[0] if lookahead and prefetch and self.states else None
        planned = self.states + ([ahead] if ahead else [])
        dim = 0 if embeddings is None else embeddings.dim
        cache_rows = 0 if static_cache is None else static_cache.num_nodes
        if memory is None:
            memory = BufferMemory.allocate(store, slots_needed(planned, prefetch=prefetch),
                                           with_features=with_features, embedding_dim=dim, cache_rows=cache_rows)
        self._check_memory(memory, with_features=with_features and store.manifest.has_features,
                           embedding_dim=dim, cache_rows=cache_rows)
        plan = assign_slots(planned, memory.num_slots, prefetch=prefetch, holder=memory.holder)
        self.memory = memory
        cache_key = None if static_cache is None else (str(store.path), static_cache.fraction)
        cache_is_new = cache_key is not None and memory.cache_filled != cache_key
        if cache_key is None or cache_is_new:
            memory.hub_edges.clear()  # segments of another cache, or none
            memory.hub_positions.clear()
        self.planned_bytes = _plan_bytes(
            store, planned, plan, holder=memory.holder, cached=list(memory.buckets),
            row_bytes=_row_bytes(store, with_features=memory.features is not None, embedding_dim=dim),
            static_cache=static_cache, held_segments=list(memory.hub_edges))
        if cache_is_new:
            # The hubs' rows are read once per memory, not per epoch; that one read is not
            # in the buffer's stats (they count what the states read).
            fill_cache_rows(memory, static_cache, store)
            memory.cache_filled = cache_key
        memory.in_use = True
        self._cond = threading.Condition()
        self._loader = _Loader(store, planned, plan, memory=memory, embeddings=embeddings,
                               static_cache=static_cache, lock=self._cond, write_back=write_back)
        self._handoff = _Handoff(self._loader, len(self.states), self._cond, prefetch=prefetch,
                                 lookahead=ahead is not None, assemble_in_consumer=self.assemble == "consumer")
        self._delivered = 0
        self._iterated = False
        self._closed = False
        # A manager dropped mid-epoch without close() must not leave its thread blocked
        # nor its updates unwritten.
        self._finalizer = weakref.finalize(self, _shutdown, self._handoff, self._loader)

    @staticmethod
    def _check_memory(memory: BufferMemory, *, with_features: bool, embedding_dim: int, cache_rows: int) -> None:
        if memory.in_use:
            raise ConfigError("this BufferMemory is in use by another BufferManager; close that one first")
        problems = []
        if with_features != (memory.features is not None):
            problems.append("it has feature rows but with_features is false" if memory.features is not None
                            else "it has no feature rows")
        if embedding_dim and (memory.embeddings is None or memory.embeddings.shape[2] != embedding_dim):
            problems.append(f"it has no embeddings of dim {embedding_dim}")
        if memory.cache_rows != cache_rows:
            problems.append(f"it has {memory.cache_rows} cache rows, the static cache {cache_rows} nodes")
        if problems:
            raise ConfigError(f"the BufferMemory does not fit: {'; '.join(problems)}")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[LoadedState]:
        if self._closed:
            raise BufferClosedError("the BufferManager is closed; create a new one to iterate again")
        if self._iterated:
            raise BufferClosedError("a BufferManager iterates its states once; create a new one per epoch")
        self._iterated = True
        return self._iterate()

    def _iterate(self) -> Iterator[LoadedState]:
        while True:
            try:
                item = self._handoff.get()
            except BaseException:
                self.close()  # no thread outlives a failed (or interrupted) epoch
                raise
            if item is None:
                self.close()  # the epoch's end: write back every dirty partition
                return
            if self._loader.table is not None:
                with self._cond:
                    for z in item.graph.slots:
                        self.memory.dirty[z] = True
            self._delivered += 1
            yield item

    @property
    def stats(self) -> BufferStats:
        """A snapshot of the counters so far (complete once the iteration ended)."""
        with self._cond:
            return BufferStats(states=self._delivered, stall_seconds=self._handoff.stall_seconds,
                               planned_bytes=self.planned_bytes, **self._loader.counts)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the loader, join its thread, write back dirty embeddings. Idempotent; safe
        mid-iteration. A write-back error is raised here (the updates stay marked dirty)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> BufferManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._delivered}/{len(self.states)} states"
        return f"<BufferManager {state}, prefetch={self.prefetch}>"


def _assemble_where() -> str:
    """`BufferManager`'s ``assemble="auto"``: "consumer" when torch's intra-op threads
    cover every core this process may run on, else "loader"."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return "consumer" if torch.get_num_threads() >= cores else "loader"


def _shutdown(handoff: _Handoff, loader: _Loader) -> None:
    """Join the loader, then write back what is dirty (the consumer's last updates too).

    Every dirty slot is tried even when one write fails (a full disk, a bad sector): the
    others' updates must not be lost to it. A failed slot stays dirty, so a later close
    (or the next epoch) tries it again; the first failure is raised, with the count.
    """
    try:
        try:
            handoff.close()
        finally:  # even after a loader error: the consumer's updates must not be lost
            failures: list[tuple[int, BaseException]] = []
            for z in range(loader.memory.num_slots):
                try:
                    loader.write_back(z)
                except Exception as exc:  # noqa: BLE001 - try the other slots, then report
                    failures.append((int(loader.memory.holder[z]), exc))
            if failures:
                raise _write_back_error(loader, failures)
    finally:
        loader.memory.in_use = False


def _write_back_error(loader: _Loader, failures: list[tuple[int, BaseException]]) -> BaseException:
    """The first write-back failure, its message saying how many partitions failed and
    that they are still held (dirty) in memory."""
    _, first = failures[0]
    parts = [p for p, _ in failures]
    note = (f"writing back embeddings failed for {len(failures)} partition(s) {parts}; "
            "they stay in memory, marked dirty")
    if isinstance(first, OSError) and not isinstance(first, StoreWriteError):
        where = first.filename or (loader.table.path if loader.table is not None else loader.store.path)
        error = StoreWriteError(f"{where}: {first.strerror or first}; {note}")
        error.__cause__ = first
        return error
    first.add_note(note)
    return first
