"""One writer, many readers, across real processes: a second writer and ``--overwrite`` of
an open store are refused at once naming the holder, readers never wait, read-only stores
never write, and a killed holder leaves nothing to clean up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import graphstore
from graphstore.errors import ReadOnlyStoreError, StoreLockedError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout.embeddings import EmbeddingTable
from tests.conftest import make_graph

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=120, num_edges=600, num_relations=2, feature_dim=0)
    out = tmp_path_factory.mktemp("locks") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=3, partitioner="random", seed=0))
    return out


def _holder(path, mode: str) -> subprocess.Popen:
    """A process that opens the store in ``mode``, says so, and waits to be told to exit."""
    code = textwrap.dedent(f"""
        import sys, graphstore
        store = graphstore.open({str(path)!r}, mode={mode!r})
        print("open", flush=True)
        sys.stdin.readline()
        store.close()
        print("closed", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line == "open", proc.stderr.read()
    return proc


def _release(proc: subprocess.Popen) -> None:
    out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0 and "closed" in out, err


def test_second_writer_is_refused_naming_the_holder(copy):
    writer = _holder(copy, "r+")
    try:
        t0 = time.perf_counter()
        with pytest.raises(StoreLockedError, match=rf"copy\.gs: another process is writing to this store "
                                                   rf"\(pid {writer.pid}\)") as info:
            graphstore.open(copy, mode="r+")
        assert time.perf_counter() - t0 < 5  # at once, not after a wait
        assert "\n" not in str(info.value)
        # Readers do not wait for the writer, and read.
        reader = graphstore.open(copy)
        assert reader.read_bucket(0, 1)[0].dtype == np.int32
        reader.close()
    finally:
        _release(writer)
    graphstore.open(copy, mode="r+").close()  # free again


def test_overwrite_of_an_open_store_is_refused_and_leaves_it_intact(copy, tmp_path):
    reader = _holder(copy, "r")
    graph, _ = make_graph(num_nodes=50, num_edges=100, feature_dim=0)
    try:
        with pytest.raises(StoreLockedError, match=rf"copy\.gs: the store is open in another process "
                                                   rf"\(pid {reader.pid}\)"):
            convert(graph, copy, ConvertOptions(overwrite=True, num_partitions=2))
        assert graphstore.open(copy).num_nodes == 120
        assert not list(copy.parent.glob(".copy.gs.tmp-*"))
        cli = subprocess.run([sys.executable, "-m", "graphstore", "convert", str(REPO / "data" / "cora"), str(copy), "--overwrite"],
                             capture_output=True, text=True, timeout=120)
        assert cli.returncode == 1
        assert cli.stderr.count("\n") == 1 and "is open in another process" in cli.stderr
    finally:
        _release(reader)
    convert(graph, copy, ConvertOptions(overwrite=True, num_partitions=2))  # nobody has it open now
    assert graphstore.open(copy).num_nodes == 50


def test_a_store_being_replaced_refuses_new_openers(copy):
    from graphstore.layout._lock import StoreLock

    lock = StoreLock(copy, mode="replace")
    try:
        with pytest.raises(StoreLockedError, match="being replaced by another process"):
            graphstore.open(copy)
    finally:
        lock.release()
    graphstore.open(copy).close()


def test_kill_9_leaves_no_stale_lock(copy):
    writer = _holder(copy, "r+")
    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=30)  # reaps it and closes the pipes
    assert writer.returncode == -signal.SIGKILL
    store = graphstore.open(copy, mode="r+")  # flock died with its process
    store.close()


def test_readers_of_different_stores_and_many_readers(copy, store_path):
    readers = [_holder(copy, "r") for _ in range(2)] + [_holder(store_path, "r+")]
    try:
        graphstore.open(copy).close()
        graphstore.open(copy, mode="r+").close()  # a writer among readers is fine
    finally:
        for proc in readers:
            _release(proc)


def test_read_only_store_never_writes(copy):
    with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
        EmbeddingTable.create(graphstore.open(copy), 4, seed=0)  # creating a table is a write too
    assert not EmbeddingTable.exists(graphstore.open(copy))
    writable = graphstore.open(copy, mode="r+")
    table = EmbeddingTable.create(writable, 4, seed=0)
    before = table.read_partition(1)
    writable.close()
    store = graphstore.open(copy)
    with pytest.raises(ReadOnlyStoreError, match=r"copy\.gs: the store is opened read-only \(mode 'r'\); "
                                                 r"open it with graphstore\.open\(path, mode='r\+'\)"):
        EmbeddingTable.open(store).write_partition(1, np.zeros_like(before))
    np.testing.assert_array_equal(EmbeddingTable.open(store).read_partition(1), before)
    with pytest.raises(ReadOnlyStoreError, match="the store is closed"):
        EmbeddingTable(writable).write_partition(1, before)


def test_a_killed_writers_temporary_files_are_removed_by_the_next_writer(copy):
    store = graphstore.open(copy, mode="r+")
    table = EmbeddingTable.create(store, 4, seed=0)
    before = table.read_all()
    leftover = table.chunk_path(1).with_name(".0.999999.tmp")  # as a kill -9 mid-write leaves it
    leftover.write_bytes(b"half a partition")
    mine = table.chunk_path(2).with_name(f".0.{os.getpid()}.tmp")  # this process's: in flight
    mine.write_bytes(b"")
    store.close()
    reader = graphstore.open(copy)
    EmbeddingTable.open(reader)  # a reader never deletes anything
    assert leftover.exists()
    reader.close()
    writer = graphstore.open(copy, mode="r+")
    table = EmbeddingTable.open(writer)
    assert not leftover.exists() and mine.exists()
    np.testing.assert_array_equal(table.read_all(), before)
    writer.close()
