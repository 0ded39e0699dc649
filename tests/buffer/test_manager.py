"""The buffer manager yields exactly what a direct build gives, reads each byte once while
resident (checked by a counting wrapper around the store), hides reads behind a slow
consumer, and never leaves a thread behind: errors reach the consumer, close is idempotent,
an early stop does not hang."""

from __future__ import annotations

import gc
import threading
import time
import traceback

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.buffer import manager
from graphstore.buffer.manager import BufferManager, planned_read_bytes
from graphstore.buffer.resident import build_resident_graph
from graphstore.buffer.slots import assign_slots, slots_needed
from graphstore.errors import BufferClosedError, ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout.store import Store
from tests.buffer.helpers import assert_same_graph
from tests.conftest import make_graph

P = 7  # partitions
# Consecutive states share partitions; some states list them out of order (local-id order
# follows the state); state 0 holds a run of consecutive ids (one coalesced row read).
STATES = [(0, 1, 2), (1, 2, 3), (6, 2, 3), (6, 0, 5), (4, 5), (5, 4, 1, 2)]
LOADER = "graphstore-buffer-loader"


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == LOADER]


@pytest.fixture(autouse=True)
def no_thread_outlives_a_test():
    yield
    assert loader_threads() == []


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    out = tmp_path_factory.mktemp("m") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=P, partitioner="random", seed=2))
    return out


@pytest.fixture(scope="module")
def store(path):
    return graphstore.open(path)


class RecordingStore(Store):
    """The store with every buffer read logged as ``(name, start, stop, nbytes)`` (zarr's
    logging-store habit); subclasses may misbehave in `before_read`."""

    def __init__(self, path, **kwargs):
        super().__init__(path)
        self.log = []

    def read_many(self, requests, **options):
        for name, start, stop, _ in requests:
            self.before_read(name, slice(start, stop))
        got = super().read_many(requests, **options)
        self.log.extend((name, start, stop, a.nbytes) for (name, start, stop, _), a in zip(requests, got))
        return got

    def before_read(self, name, key):
        pass


def expected_bytes(store, states, *, prefetch=True, with_features=True, embedding_dim=0, coalesce=True):
    """Written from the slot plan independently of the manager: each admitted partition's
    rows, and each bucket among a state's partitions unless it was read while both of its
    partitions stayed in their slots; with ``coalesce``, the unneeded buckets of a
    destination read between two needed ones (`COALESCE_GAP_BYTES` of them at most, the
    span within `COALESCE_SPAN_BYTES`); without, the least the states need."""
    m = store.manifest
    row = (m.feature_dim * np.dtype(m.feature_dtype).itemsize if with_features else 0) + 4 + 8 * embedding_dim
    edge = 2 * np.dtype(m.index_dtype).itemsize + 4  # src, dst + int32 rel
    gap = manager.COALESCE_GAP_BYTES // edge if coalesce else 0
    most = manager.COALESCE_SPAN_BYTES // edge
    plan = assign_slots(states, slots_needed(states, prefetch=prefetch), prefetch=prefetch)
    o, total, held, have = store.bucket_offsets, 0, set(), set()
    for state, admitted, evicted in zip(states, plan.admitted, plan.evicted):
        total += sum(len(range(*store.partition_range(k))) for k in admitted) * row
        held = (held - {k for _, k in evicted}) | set(admitted)
        have = {(i, j) for i, j in have if i in held and j in held}
        for j in sorted(state):
            read = []  # [first edge, end] of each read into destination j
            for i in sorted(state):
                if (i, j) in have:
                    continue
                have.add((i, j))
                lo, hi = int(o[j * P + i]), int(o[j * P + i + 1])
                if read and (lo - read[-1][1] == 0 or (lo - read[-1][1] <= gap and hi - read[-1][0] <= most)):
                    read[-1][1] = hi
                else:
                    read.append([lo, hi])
            total += sum(hi - lo for lo, hi in read) * edge
    return int(total)


# Where the graph is assembled with prefetch: in the loader thread or in the consumer.
WHERE = [(True, "loader"), (True, "consumer"), (False, "auto")]


@pytest.mark.parametrize("prefetch, assemble", WHERE)
def test_states_equal_direct_builds_and_bytes_are_exact(path, store, prefetch, assemble):
    recording = RecordingStore(path)
    with BufferManager(recording, STATES, prefetch=prefetch, assemble=assemble) as buffer:
        seen = []
        for loaded in buffer:
            assert loaded.index == len(seen)
            assert_same_graph(loaded.graph, build_resident_graph(store, STATES[loaded.index]))
            seen.append(loaded.admitted)
    stats = buffer.stats
    # Partition 0 leaves at state 1 and returns at state 3: with prefetch (5 slots) its
    # slot was not reused meanwhile, so it is not read again; without (4 slots) it was.
    if prefetch:
        assert seen == [(0, 1, 2), (3,), (6,), (5,), (4,), (1, 2)]
    else:
        assert seen == [(0, 1, 2), (3,), (6,), (0, 5), (4,), (1, 2)]
    assert stats.states == len(STATES)
    assert stats.partitions_loaded == sum(map(len, seen)) and stats.swaps == stats.partitions_loaded - 3
    want = expected_bytes(store, STATES, prefetch=prefetch)
    assert stats.bytes_read == want == sum(entry[3] for entry in recording.log)
    assert planned_read_bytes(store, STATES, prefetch=prefetch) == want == stats.planned_bytes
    assert stats.requests == len(recording.log)
    assert stats.read_seconds > 0 and stats.stall_seconds > 0


STATE = st.permutations(range(P)).flatmap(lambda perm: st.integers(0, P).map(lambda c: tuple(perm[:c])))


@settings(max_examples=20, deadline=None)
@given(st.lists(STATE, max_size=5),
       st.sampled_from(WHERE))
def test_any_sequence_of_states(store, states, where):
    prefetch, assemble = where
    with BufferManager(store, states, prefetch=prefetch, assemble=assemble) as buffer:
        for loaded in buffer:
            assert_same_graph(loaded.graph, build_resident_graph(store, states[loaded.index]))
    assert buffer.stats.states == len(states)
    assert buffer.stats.bytes_read == expected_bytes(store, states, prefetch=prefetch) == buffer.stats.planned_bytes


def test_reads_are_coalesced(path, store):
    o = store.bucket_offsets
    # Buckets (i, j) into one destination j are adjacent: (0..2, j) is one span per j.
    assert all(o[j * P + i + 1] > o[j * P + i] for i in range(3) for j in range(3))
    recording = RecordingStore(path)
    with BufferManager(recording, STATES[:1]) as buffer:
        list(buffer)
    reads = [entry[:3] for entry in recording.log]
    n = store.partition_range(2)[1]
    assert ("nodes/features", 0, n) in reads and ("nodes/labels", 0, n) in reads
    for name in ("edges/src", "edges/dst", "edges/rel"):
        assert sorted(r[1:] for r in reads if r[0] == name) == [(o[j * P], o[j * P + 3]) for j in range(3)]
    assert len(reads) == 2 + 3 * 3
    assert buffer.stats.buckets_read == 9


def test_small_gaps_are_read_across_and_never_kept(path, store):
    # State (0, 2): the needed buckets (0, j) and (2, j) of each destination have (1, j),
    # not needed, between them; on this small graph it is read across.
    o = store.bucket_offsets
    assert all(o[j * P + 2] > o[j * P + 1] for j in (0, 2))  # the gaps hold edges
    recording = RecordingStore(path)
    with BufferManager(recording, [(0, 2)]) as buffer:
        for loaded in buffer:
            assert_same_graph(loaded.graph, build_resident_graph(store, (0, 2)))
        held = dict(buffer.memory.buckets)
    spans = sorted(r[1:3] for r in recording.log if r[0] == "edges/src")
    assert spans == [(o[j * P], o[j * P + 3]) for j in (0, 2)]
    exact = expected_bytes(store, [(0, 2)], coalesce=False)
    assert buffer.stats.bytes_read == expected_bytes(store, [(0, 2)]) > exact
    assert buffer.stats.bytes_read == buffer.stats.planned_bytes
    # What stays resident is the held buckets' edges, not the gaps: each destination's
    # buckets are views of one array of exactly their edges.
    for j in (0, 2):
        base = held[(0, j)][0].base
        assert base is held[(2, j)][0].base
        assert base.shape[0] == (o[j * P + 1] - o[j * P]) + (o[j * P + 3] - o[j * P + 2])
    for (i, j), bucket in held.items():
        assert np.array_equal(bucket[0], store.read_rows("edges/src", o[j * P + i], o[j * P + i + 1]))


def test_without_coalescing_the_reads_are_the_least(path, store, monkeypatch):
    coalesced = expected_bytes(store, STATES)
    monkeypatch.setattr(manager, "COALESCE_GAP_BYTES", 0)
    with BufferManager(store, STATES) as buffer:
        for loaded in buffer:
            assert_same_graph(loaded.graph, build_resident_graph(store, STATES[loaded.index]))
    exact = expected_bytes(store, STATES, coalesce=False)
    assert buffer.stats.bytes_read == buffer.stats.planned_bytes == exact < coalesced


def test_prefetch_on_and_off_agree(store):
    with (
        BufferManager(store, STATES, prefetch=True) as on,
        BufferManager(store, STATES, prefetch=False) as off,
    ):
        for a, b in zip(on, off, strict=True):
            assert a.index == b.index
            assert_same_graph(a.graph, b.graph)
    assert on.memory.num_slots == 5 and off.memory.num_slots == 4
    for buffer in (on, off):
        assert buffer.stats.bytes_read == buffer.stats.planned_bytes == expected_bytes(store, STATES, prefetch=buffer.prefetch)


def test_without_features(store):
    with BufferManager(store, STATES[:2], with_features=False) as buffer:
        graphs = [loaded.graph for loaded in buffer]
    assert all(g.features is None for g in graphs)
    assert buffer.stats.bytes_read == planned_read_bytes(store, STATES[:2], with_features=False)


class FailingStore(RecordingStore):
    """Raises OSError on the feature read that reaches the third partition loaded."""

    def __init__(self, path, fail_at=3):
        super().__init__(path)
        self.partitions_read = 0
        self.fail_at = fail_at

    def before_read(self, name, key):
        if name == "nodes/features":
            self.partitions_read += -(-(key.stop - key.start) // self.partition_size)
            if self.partitions_read >= self.fail_at:
                raise OSError(5, "injected: the disk went away")


@pytest.mark.parametrize("prefetch, assemble", WHERE)
def test_a_read_error_reaches_the_consumer(path, prefetch, assemble):
    states = [(0, 1), (1, 2), (2, 3), (3, 4)]  # partition 2, the third one read, is state 1's
    buffer = BufferManager(FailingStore(path), states, prefetch=prefetch, assemble=assemble)
    trained = []
    with pytest.raises(OSError, match="injected: the disk went away") as info:
        for loaded in buffer:
            trained.append(loaded.index)
    assert trained == [0]  # the state loaded before the failure was delivered first
    exc = info.value
    assert type(exc) is OSError and exc.errno == 5
    frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    assert "before_read" in frames and "read" in frames  # the loader-side traceback survives
    assert any("state 1" in note for note in exc.__notes__)
    assert buffer.closed and loader_threads() == []
    buffer.close()


def test_early_stop_and_idempotent_close(store):
    buffer = BufferManager(store, STATES)
    for loaded in buffer:
        assert loaded.index == 0
        break
    buffer.close()
    buffer.close()
    assert loader_threads() == []
    with pytest.raises(BufferClosedError, match="closed; create a new one"):
        iter(buffer)
    assert buffer.stats.states == 1


def test_close_mid_iteration_and_second_pass(store):
    buffer = BufferManager(store, STATES)
    it = iter(buffer)
    next(it)
    with pytest.raises(BufferClosedError, match="once"):
        iter(buffer)
    buffer.close()
    with pytest.raises(BufferClosedError, match="closed while iterating"):
        next(it)
    with BufferManager(store, []) as empty:
        assert list(empty) == []


def test_close_while_the_loader_is_blocked_in_a_read(path):
    """close() during a slow read returns once that one request ends, not after the state."""
    release = threading.Event()
    entered = threading.Event()

    class BlockingStore(RecordingStore):
        def before_read(self, name, key):
            if name == "nodes/features" and key.start > 0:
                entered.set()
                release.wait(10)

    buffer = BufferManager(BlockingStore(path), STATES)
    it = iter(buffer)
    next(it)
    assert entered.wait(10)
    threading.Timer(0.05, release.set).start()
    t0 = time.perf_counter()
    buffer.close()
    assert time.perf_counter() - t0 < 5
    assert loader_threads() == [] and buffer.closed
    for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
        timer.join()


def test_a_dropped_manager_stops_its_thread(store):
    buffer = BufferManager(store, STATES)
    it = iter(buffer)
    next(it)
    del buffer, it
    gc.collect()
    assert loader_threads() == []


def test_bad_states(store):
    with pytest.raises(ConfigError, match=r"state 1: partitions must be distinct"):
        BufferManager(store, [(0,), (1, 1)])
    with pytest.raises(ConfigError, match=r"state 0: partition ids must be in \[0, 7\) \(got 9\)"):
        BufferManager(store, [(9,)])
    assert loader_threads() == []


class SlowStore(RecordingStore):
    """Feature reads take at least ``delay`` seconds: a disk slower than this test machine."""

    delay = 0.04

    def before_read(self, name, key):
        if name == "nodes/features":
            time.sleep(self.delay)


def test_prefetch_hides_reads_behind_a_slow_consumer(path):
    compute = 0.1  # per state, well above a state's read time (one slow request + small ones)
    runs = {}
    for prefetch in (True, False):
        with BufferManager(SlowStore(path), STATES, prefetch=prefetch) as buffer:
            for _ in buffer:
                time.sleep(compute)
        runs[prefetch] = buffer.stats
    on, off = runs[True], runs[False]
    for stats in (on, off):
        assert stats.read_seconds >= len(STATES) * SlowStore.delay
    # Without prefetch every read happens while the consumer waits.
    assert off.stall_seconds >= off.read_seconds
    # With it, only the first state's load is exposed (loose bound: the machine is noisy).
    assert on.stall_seconds < 0.6 * on.read_seconds
    assert on.stall_seconds < 0.6 * off.stall_seconds


def test_a_failure_the_consumer_never_asked_for_is_not_raised_but_a_lookahead_failure_is(path):
    buffer = BufferManager(FailingStore(path), [(0, 1), (1, 2), (2, 3)])
    for loaded in buffer:
        break  # state 1 (partition 2, the third read) fails in the background
    buffer.close()  # the consumer stopped before it: nothing to report
    assert loader_threads() == []
    # A failed read of the next epoch's first state comes out of the epoch's end.
    buffer = BufferManager(FailingStore(path), [(0, 1)], lookahead=(2, 3))
    with pytest.raises(OSError, match="injected"):
        assert [s.index for s in buffer] == [0]
    assert loader_threads() == []


def test_auto_assembles_in_the_consumer_when_torch_uses_every_core(store, monkeypatch):
    import os

    import graphstore.buffer.manager as manager

    cores = len(os.sched_getaffinity(0))
    for threads, where in ((cores, "consumer"), (max(cores - 1, 1), "consumer" if cores == 1 else "loader")):
        monkeypatch.setattr(manager.torch, "get_num_threads", lambda t=threads: t)
        with BufferManager(store, STATES[:2]) as buffer:
            assert buffer.assemble == where
            assert [loaded.index for loaded in buffer] == [0, 1]
    with pytest.raises(ConfigError, match="assemble must be"):
        BufferManager(store, STATES, assemble="elsewhere")
