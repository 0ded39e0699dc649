"""The buffer manager: walks an epoch's buffer states, hiding the disk behind training.

A `BufferManager` is given the states of one epoch (tuples of partition ids, e.g. a
policy's ``plan.states``) and yields one `LoadedState` per state, whose `ResidentGraph`
holds the state's partitions and every edge bucket among them. While the consumer trains
on state ``s``, a loader thread reads what state ``s + 1`` lacks and assembles its graph
(double buffering)::

    consumer   | train s-1        | train s           | train s+1 ...
    loader     |   load s  | wait |   load s+1 | wait |
    handoff            slot (one state) ──> consumer

Reads are incremental and coalesced: partitions resident in both states are not read
again (their feature rows, labels and buckets stay in the loader's cache, keyed by
partition and by bucket, and are dropped when evicted); new partitions whose ids are
consecutive are read as one row range; needed buckets whose byte ranges abut in
``edges/src``, ``edges/dst`` (and ``edges/rel``) are read as one range, since all buckets
(i, j) of one destination j are adjacent there (see `graphstore.layout.base`).

Threading: one `threading.Condition` guards a one-state handoff slot, the loader's
counters and the closing flag. The loader waits for the slot to empty *before* it reads
the next state, so at most two assembled states exist at once (the one being trained and
the one ready). An exception in the loader is stored, handed to the consumer after the
states loaded before it, and re-raised there (the same object, so its type, message and
the loader-side traceback survive). `close` sets the flag, wakes everyone and joins the
thread; the loader checks the flag between read requests, so close never waits for more
than one request.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from graphstore.buffer.resident import Bucket, ResidentGraph, assemble_resident_graph
from graphstore.errors import BufferClosedError, ConfigError
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
    """Bytes of the arrays read, ``sum(rows * row_itemsize)``: features, labels, src, dst, rel."""
    read_seconds: float
    """Wall time the loader spent inside array reads."""
    assemble_seconds: float
    """Wall time the loader spent building `ResidentGraph` objects from cached data."""
    stall_seconds: float
    """Wall time the consumer waited for a state (with ``prefetch=False``: all of the load)."""

    @property
    def read_bandwidth(self) -> float:
        """Bytes per second of read time (0.0 before any read)."""
        return self.bytes_read / self.read_seconds if self.read_seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LoadedState:
    """One buffer state, ready to train."""

    index: int
    """Position of the state in the epoch."""
    graph: ResidentGraph
    """The resident partitions (``graph.partitions`` is the state, in the order given) and
    every bucket among them."""
    admitted: tuple[int, ...]
    """Partitions read for this state (ascending); the rest were already resident."""


# ---------------------------------------------------------------------- read planning


def _runs(sorted_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs ``[first, last]`` of consecutive integers in an ascending sequence."""
    runs: list[tuple[int, int]] = []
    for k in sorted_ids:
        if runs and k == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    return runs


def _bucket_spans(needed: Sequence[int], offsets: np.ndarray) -> list[tuple[int, int, list[int]]]:
    """Group needed bucket indices (``b = j * p + i``, ascending) into byte-contiguous spans.

    Two needed buckets share a span when nothing but empty buckets lies between them, so a
    span is read with exactly the bytes of its buckets. Returns ``(lo, hi, buckets)``
    edge-position ranges.
    """
    spans: list[tuple[int, int, list[int]]] = []
    for b in needed:
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        if spans and spans[-1][1] == lo:
            spans[-1][2].append(b)
            spans[-1] = (spans[-1][0], hi, spans[-1][2])
        else:
            spans.append((lo, hi, [b]))
    return spans


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


def planned_read_bytes(store: Store, states: Sequence[Sequence[int]], *, with_features: bool = True) -> int:
    """Bytes a `BufferManager` reads for ``states``: each state's new partitions' rows and
    the buckets it lacks, nothing twice while resident (the minimum for that order).

    Parameters
    ----------
    store : Store
        Only its metadata and ``bucket_offsets`` are used.
    states : sequence of sequence of int
        The buffer states of the epoch, in order.
    with_features : bool
        Count feature rows (as `BufferManager` does when its ``with_features`` is true).

    Returns
    -------
    int
        Bytes of features, labels and edge arrays (src, dst, rel).

    Raises
    ------
    ConfigError
        A repeated or out-of-range partition id in a state.
    """
    m = store.manifest
    row_bytes = 0
    if with_features and m.has_features:
        row_bytes += m.feature_dim * np.dtype(m.feature_dtype).itemsize
    if m.has_labels:
        row_bytes += 4
    edge_bytes = 2 * np.dtype(m.index_dtype).itemsize + (4 if m.has_relations else 0)
    p, offsets = store.num_partitions, store.bucket_offsets
    total, prev = 0, set()
    for parts in _check_states(store, states):
        for k in set(parts) - prev:
            start, stop = store.partition_range(k)
            total += (stop - start) * row_bytes
        for j in parts:
            for i in parts:
                if i not in prev or j not in prev:
                    total += (int(offsets[j * p + i + 1]) - int(offsets[j * p + i])) * edge_bytes
        prev = set(parts)
    return total


# ---------------------------------------------------------------------- the loader


class _Cancelled(Exception):
    """Raised inside the loader between requests once close() was asked for."""


class _Loader:
    """Reads states incrementally and assembles their graphs; keeps the resident data.

    Touched by one thread at a time (the loader thread, or the consumer with
    ``prefetch=False``); only the counters are shared, under ``lock``.
    """

    def __init__(
        self, store: Store, states: list[tuple[int, ...]], *, with_features: bool, lock: threading.Condition
    ):
        m = store.manifest
        self.store, self.states, self.lock = store, states, lock
        # Resolve the arrays here, in the caller's thread, so the loader never mutates
        # the store's lazy array cache concurrently with the consumer.
        self.features = store.array("nodes/features") if with_features and m.has_features else None
        self.labels = store.array("nodes/labels") if m.has_labels else None
        self.edges = [store.array("edges/src"), store.array("edges/dst")]
        if m.has_relations:
            self.edges.append(store.array("edges/rel"))
        self.offsets = store.bucket_offsets
        self.rows: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = {}
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.counts = dict(partitions_loaded=0, swaps=0, buckets_read=0, requests=0, bytes_read=0,
                           read_seconds=0.0, assemble_seconds=0.0)
        self.stop_requested: Callable[[], bool] = lambda: False

    def _read(self, array, lo: int, hi: int) -> np.ndarray:
        if self.stop_requested():
            raise _Cancelled
        t0 = time.perf_counter()
        out = np.asarray(array[lo:hi])
        seconds = time.perf_counter() - t0
        with self.lock:
            self.counts["requests"] += 1
            self.counts["bytes_read"] += out.nbytes
            self.counts["read_seconds"] += seconds
        return out

    def load(self, index: int) -> LoadedState:
        parts = self.states[index]
        want = set(parts)
        # Evict first so the cache never holds more than the new state needs.
        for k in [k for k in self.rows if k not in want]:
            del self.rows[k]
        for key in [key for key in self.buckets if key[0] not in want or key[1] not in want]:
            del self.buckets[key]
        admitted = tuple(sorted(want - set(self.rows)))
        self._read_rows(admitted)
        self._read_buckets(parts)
        with self.lock:
            self.counts["partitions_loaded"] += len(admitted)
            if index > 0:
                self.counts["swaps"] += len(admitted)
        t0 = time.perf_counter()
        features = {k: self.rows[k][0] for k in parts} if self.features is not None else None
        labels = {k: self.rows[k][1] for k in parts} if self.labels is not None else None
        graph = assemble_resident_graph(
            self.store, parts, buckets=self.buckets, features=features, labels=labels
        )
        with self.lock:
            self.counts["assemble_seconds"] += time.perf_counter() - t0
        logger.debug("state %d: read partitions %s, %d resident", index, admitted, len(parts))
        return LoadedState(index=index, graph=graph, admitted=admitted)

    def _read_rows(self, admitted: Sequence[int]) -> None:
        P, N = self.store.partition_size, self.store.num_nodes
        for first, last in _runs(admitted):
            start, stop = first * P, min((last + 1) * P, N)
            feats = self._read(self.features, start, stop) if self.features is not None else None
            labs = self._read(self.labels, start, stop) if self.labels is not None else None
            for k in range(first, last + 1):
                lo, hi = k * P - start, min((k + 1) * P, N) - start
                self.rows[k] = (
                    None if feats is None else feats[lo:hi],
                    None if labs is None else labs[lo:hi],
                )

    def _read_buckets(self, parts: Sequence[int]) -> None:
        p = self.store.num_partitions
        needed = sorted(j * p + i for j in parts for i in parts if (i, j) not in self.buckets)
        for lo, hi, members in _bucket_spans(needed, self.offsets):
            if hi > lo:
                arrays = [self._read(a, lo, hi) for a in self.edges]
            else:  # only empty buckets: no request at all
                arrays = [np.zeros(0, a.dtype) for a in self.edges]
            for b in members:
                # Views into the span: no copy; a span lives until its last bucket is evicted.
                b_lo, b_hi = int(self.offsets[b]) - lo, int(self.offsets[b + 1]) - lo
                src, dst, *rel = (a[b_lo:b_hi] for a in arrays)
                self.buckets[(b % p, b // p)] = (src, dst, rel[0] if rel else None)
        with self.lock:
            self.counts["buckets_read"] += len(needed)


# ---------------------------------------------------------------------- the handoff

_EMPTY = object()


class _Handoff:
    """A one-item slot between the loader thread and the consumer, plus the thread itself.

    Holds no reference to the `BufferManager`, so a manager that is dropped without
    `close` can still be finalized (which closes this).
    """

    def __init__(self, loader: _Loader, count: int, cond: threading.Condition, *, prefetch: bool):
        self.loader, self.count, self.cond = loader, count, cond
        self.slot: object = _EMPTY
        self.error: BaseException | None = None
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
            for index in range(self.count):
                with self.cond:
                    # Wait for the consumer to take the previous state before reading the
                    # next: two assembled states at most (double, not triple, buffering).
                    while self.slot is not _EMPTY and not self.closing:
                        self.cond.wait()
                    if self.closing:
                        return
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
                while self.slot is _EMPTY and not self.finished and not self.closing:
                    self.cond.wait()
                if self.slot is not _EMPTY:
                    item, self.slot = self.slot, _EMPTY
                    self.delivered += 1
                    self.cond.notify_all()
                    return item  # type: ignore[return-value]
                if self.closing:
                    raise BufferClosedError("the BufferManager was closed while iterating")
                if self.error is not None:
                    raise self._annotated(self.error)
                return None
        finally:
            with self.cond:
                self.stall_seconds += time.perf_counter() - t0

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

    def _annotated(self, exc: BaseException) -> BaseException:
        # The failing state is the first one not delivered: errors come after the states
        # loaded before them.
        index = self.next_index if self.thread is None else self.delivered
        exc.add_note(f"raised in the buffer loader while loading state {index} "
                     f"(partitions {list(self.loader.states[index])})")
        return exc

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.slot = _EMPTY  # drop a state nobody will train
            self.cond.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


# ---------------------------------------------------------------------- the manager


class BufferManager:
    """Iterate over an epoch's buffer states with the next state loaded in the background.

    Parameters
    ----------
    store : Store
        An open store (only read).
    states : sequence of sequence of int
        The resident partitions of each state, in order (e.g. ``plan.states``). A state's
        order is its local-id order in the `ResidentGraph`.
    prefetch : bool
        Load state ``s + 1`` in a background thread while state ``s`` is trained. False
        loads each state in the consumer when it is asked for (a baseline for the stats).
    with_features : bool
        Read feature rows (labels are always read when the store has them).

    Raises
    ------
    ConfigError
        A state with a repeated or out-of-range partition id.

    Notes
    -----
    One manager serves one pass over ``states``; iterate it once, then `close` it (or use
    it as a context manager). An error raised while loading a state is re-raised by the
    iteration after the states before it were yielded, with its loader-side traceback.

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
    ) -> None:
        self.store = store
        self.states = _check_states(store, states)
        self.prefetch = prefetch
        self._cond = threading.Condition()
        self._loader = _Loader(store, self.states, with_features=with_features, lock=self._cond)
        self._handoff = _Handoff(self._loader, len(self.states), self._cond, prefetch=prefetch)
        self._delivered = 0
        self._iterated = False
        self._closed = False
        # A manager dropped mid-epoch without close() must not leave its thread blocked.
        self._finalizer = weakref.finalize(self, self._handoff.close)

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
                return
            self._delivered += 1
            yield item

    @property
    def stats(self) -> BufferStats:
        """A snapshot of the counters so far (complete once the iteration ended)."""
        with self._cond:
            return BufferStats(states=self._delivered, stall_seconds=self._handoff.stall_seconds,
                               **self._loader.counts)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the loader and join its thread. Idempotent; safe mid-iteration."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> BufferManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._delivered}/{len(self.states)} states"
        return f"<BufferManager {state}, prefetch={self.prefetch}>"
