"""A forked child reads the store its parent opened: the readers' thread pools and locks are
process-wide state a fork copies without their threads (or with a lock another thread held),
so each module resets them in the child. Every child here runs under a timeout: a
regression fails instead of hanging the suite."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

import graphstore
from graphstore.layout import _chunkio, _rowsets
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.sample import _native as sample_native
from tests.conftest import make_graph

TIMEOUT_S = 30  # a child that reads a few KiB takes well under a second; a hung one never ends
# Forking a process with threads is the case under test (Python 3.12 warns about it).
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=2000, num_edges=8000, feature_dim=64)
    out = tmp_path_factory.mktemp("fork") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random", seed=1))
    with graphstore.open(out) as opened:
        yield opened


def _reads(store) -> list[np.ndarray]:
    """A scattered row set (the row-set pool), a partition (the shared ChunkReader), and
    an index tensor from the DENSE kernel's output pool (its lock)."""
    ids = np.arange(3, store.num_nodes, 37)
    pooled = sample_native.empty_int64(sample_native._OutputPool.MIN_ELEMENTS).numpy()
    pooled[:4] = 7  # numpy: a torch op of this size would start OpenMP, which is not fork-safe
    return [store.read_row_set("nodes/features", ids), store.read_features(1), pooled[:4].copy()]


def _child(store, conn) -> None:
    try:
        conn.send(("ok", _reads(store)))
    except BaseException as exc:  # noqa: BLE001 (the parent reports it)
        conn.send(("error", repr(exc)))


def _in_forked_child(store) -> list[np.ndarray]:
    """`_reads` in a child forked now; fails (not hangs) when the child does not finish."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(store, send), daemon=True)
    child.start()
    send.close()  # the child's copy is the only writer: its death ends the wait
    try:
        if not receive.poll(TIMEOUT_S):
            pytest.fail(f"the forked child did not read its rows within {TIMEOUT_S} s (hung on inherited state)")
        kind, value = receive.recv()
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    assert kind == "ok", value
    return value


def test_a_child_forked_after_reads_reads_the_same_rows(store):
    expected = _reads(store)  # the parent's pools now have threads, which the child lacks
    got = _in_forked_child(store)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


def test_a_child_forked_while_another_thread_holds_a_lock_still_reads(store):
    """A lock a parent thread held at the fork is held forever in the child, whose copy of
    that thread never runs: the child gets new locks."""
    _reads(store)
    locks = [_rowsets._pool_lock, _chunkio._SHARED_LOCK, _chunkio.shared_reader()._lock,
             store._layout_lock, sample_native._pool._lock]
    held, release = threading.Event(), threading.Event()

    def hold():
        for lock in locks:
            lock.acquire()
        held.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        got = _in_forked_child(store)
    finally:
        release.set()
        holder.join()
    np.testing.assert_array_equal(got[0], _reads(store)[0])


def test_the_parent_still_reads_after_forking(store):
    before = _reads(store)
    _in_forked_child(store)
    after = _reads(store)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
