"""Durability and hostile filesystems, for real: every file of a new store is fsynced before
it is renamed into place; on a filesystem without O_DIRECT the whole path works; a full disk
(ENOSPC) fails a conversion with one line and nothing left behind, and fails an embedding
write-back without losing the partitions it could not write.

Which filesystem refuses O_DIRECT depends on the kernel: tmpfs did (EINVAL) until Linux 6.6
and accepts it since (these machines run 6.18); ramfs still refuses it. So the no-O_DIRECT
test mounts ramfs, and the full-disk tests a small tmpfs (ramfs has no size limit)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr

import graphstore
from graphstore.buffer import BufferManager, BufferMemory, plan_epoch
from graphstore.errors import StoreWriteError
from graphstore.layout import _durable
from graphstore.layout._arrays import new_array
from graphstore.layout._chunkio import ChunkReader, aligned_empty
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import verify_store
from graphstore.layout.embeddings import EmbeddingTable
from tests.conftest import make_graph

REPO = Path(__file__).resolve().parents[2]
CORA = REPO / "data" / "cora"


@contextlib.contextmanager
def mounted(fstype: str, size: str | None = None):
    """A real ``fstype`` filesystem (``tmpfs`` of ``size``: fills up for real; ``ramfs``: no
    O_DIRECT) mounted on a new directory, unmounted afterwards.

    Mounting needs root; elsewhere the test is skipped with the reason on one line.
    """
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {fstype} needs root (running as uid {os.geteuid()}): the no-O_DIRECT "
                    "and disk-full paths were not exercised")
    where = Path(tempfile.mkdtemp(prefix=f"graphstore-{fstype}-"))
    options = ["-o", f"size={size}"] if size else []
    done = subprocess.run(["mount", "-t", fstype, *options, fstype, str(where)], capture_output=True, text=True)
    if done.returncode:
        where.rmdir()
        pytest.skip(f"mount -t {fstype} failed ({done.stderr.strip()}): the no-O_DIRECT and disk-full "
                    "paths were not exercised")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def test_every_file_is_fsynced_before_the_store_appears(tmp_path, monkeypatch):
    synced: set[tuple[int, int]] = set()
    real_fsync = os.fsync

    def counting_fsync(fd):  # records what reached the disk, then does it
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        real_fsync(fd)

    renamed_after: list[int] = []
    real_replace = os.replace

    def watching_replace(src, dst):
        renamed_after.append(len(synced))
        real_replace(src, dst)

    monkeypatch.setattr(_durable.os, "fsync", counting_fsync)
    monkeypatch.setattr("graphstore.layout._convert.os.replace", watching_replace)
    out = tmp_path / "cora.gs"
    convert(CORA, out, ConvertOptions(num_partitions=4))
    entries = [out, *out.rglob("*")]
    missing = [p for p in entries if (p.stat().st_dev, p.stat().st_ino) not in synced]
    assert not missing, f"not fsynced: {missing[:3]}"
    assert (tmp_path.stat().st_dev, tmp_path.stat().st_ino) in synced  # the rename itself
    # Everything was synced before the rename that published it.
    assert renamed_after and renamed_after[-1] >= len(entries)


def test_embedding_write_back_is_fsynced(tmp_path, monkeypatch):
    graph, _ = make_graph(num_nodes=60, num_edges=200, feature_dim=0)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=2))
    store = graphstore.open(tmp_path / "g.gs", mode="r+")
    table = EmbeddingTable.create(store, 4)
    calls: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(_durable.os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                          real_fsync(fd)))
    table.write_partition(1, np.ones((30, 2, 4), np.float32))
    target = table.chunk_path(1)
    assert any(".tmp" in c and c.startswith(str(target.parent)) for c in calls)  # the data, before the rename
    assert calls[-1] == str(target.parent)  # the directory, after it
    np.testing.assert_array_equal(table.read_partition(1), np.ones((30, 2, 4), np.float32))


def test_whole_path_on_a_filesystem_without_o_direct(tmp_path):
    with mounted("ramfs") as mount:
        out = mount / "cora.gs"
        with pytest.raises(OSError) as refused:  # the premise: this filesystem has no O_DIRECT
            os.close(os.open(mount / "probe", os.O_RDONLY | os.O_CREAT | os.O_DIRECT))
        assert refused.value.errno == 22
        convert(CORA, out, ConvertOptions(num_partitions=4))
        assert verify_store(out)["ok"]
        with ChunkReader(direct=True) as reader:
            store = graphstore.open(out)
            feats = store.array("nodes/features")
            rows, stats = reader.read(store._layout("nodes/features"), 0, feats.shape[0])
            np.testing.assert_array_equal(rows, feats[...])
            assert stats.direct_bytes == 0 and stats.chunks_verified > 0
            # O_DIRECT is given up for that filesystem only: an array on the real disk keeps it.
            group = zarr.open_group(str(tmp_path / "a.zarr"), mode="w")
            arr = new_array(group, "x", shape=(64, 256), dtype="float32", chunks=(16, 256))  # 16 KiB chunks
            arr[...] = 1.0
            out_rows = aligned_empty(arr.shape, arr.dtype)
            stats = reader.read_rows(arr, 0, arr.shape[0], out_rows)
            assert stats.direct_bytes > 0, "the disk array should still be read with O_DIRECT"
        run = subprocess.run([sys.executable, str(REPO / "trainers" / "node_classification.py"),
                              "--store", str(out), "--scheme", "megabatch", "--epochs", "1",
                              "--fanouts", "5,5", "--batch-size", "256", "--hidden", "16"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert "final: valid acc" in run.stdout


def test_disk_full_during_convert(tmp_path):
    with mounted("tmpfs", "2m") as mount:
        out = mount / "cora.gs"
        with pytest.raises(StoreWriteError, match=rf"{out}: no space left on device") as info:
            convert(CORA, out, ConvertOptions(num_partitions=4))
        assert "\n" not in str(info.value)
        assert sorted(p.name for p in mount.iterdir()) == []  # no store, no temporary directory
        cli = subprocess.run([sys.executable, "-m", "graphstore", "convert", str(CORA), str(out)],
                             capture_output=True, text=True, timeout=120)
        assert cli.returncode == 1
        assert cli.stderr.count("\n") == 1 and str(out) in cli.stderr and "no space left" in cli.stderr
        assert list(mount.iterdir()) == []


def test_disk_full_during_write_back_loses_nothing(tmp_path):
    graph, _ = make_graph(num_nodes=400, num_edges=1500, feature_dim=0)
    with mounted("tmpfs", "4m") as mount:
        out = mount / "g.gs"
        convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random"))
        store = graphstore.open(out, mode="r+")
        table = EmbeddingTable.create(store, 64)  # 100 rows x 512 B: 51 KB a partition
        before = table.read_all()
        ballast = mount / "ballast"
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk, for real
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        memory = BufferMemory.allocate(store, 2, with_features=False, embedding_dim=64)
        buffer = BufferManager(store, [(0, 1)], memory=memory, embeddings=table, with_features=False)
        # The epoch's end writes every dirty partition back: that is where the disk is full.
        with pytest.raises(StoreWriteError, match=r"No space left on device; writing back embeddings "
                                                  r"failed for 2 partition\(s\) \[0, 1\]; they stay in memory") as info:
            for loaded in buffer:
                loaded.graph.embeddings[:, 0] += 1.0
        assert "\n" not in str(info.value)
        assert list(memory.dirty) == [True, True]  # kept, not dropped
        np.testing.assert_array_equal(table.read_all(), before)  # the old partitions, whole
        assert not list((out / "embeddings").rglob("*.tmp"))
        ballast.unlink()
        # With room again, the next pass over the same memory writes them.
        with BufferManager(store, [(0, 1)], memory=memory, embeddings=table, with_features=False) as again:
            pass
        assert again.stats.partitions_written == 2
        after = table.read_all()
        np.testing.assert_array_equal(after[:200, 0], before[:200, 0] + 1.0)
        np.testing.assert_array_equal(after[200:], before[200:])
        store.close()


def test_shutdown_tries_every_dirty_slot(tmp_path):
    graph, _ = make_graph(num_nodes=300, num_edges=1200, feature_dim=0)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=3, partitioner="random"))
    store = graphstore.open(tmp_path / "g.gs", mode="r+")
    table = EmbeddingTable.create(store, 4)
    before = table.read_all()
    plan = plan_epoch("in_memory", num_partitions=3, capacity=3, epoch=0, seed=0)
    buffer = BufferManager(store, plan.states, embeddings=table, with_features=False)
    for loaded in buffer:
        loaded.graph.embeddings[:, 0] += 1.0
        break  # stopped early: close() writes back
    # Partition 1's chunk directory becomes a file: its write fails for real (ENOTDIR).
    chunk_dir = table.chunk_path(1).parent.parent
    moved = chunk_dir.with_name("1.moved")
    chunk_dir.rename(moved)
    chunk_dir.write_bytes(b"")
    with pytest.raises(StoreWriteError, match=r"failed for 1 partition\(s\) \[1\]"):
        buffer.close()
    chunk_dir.unlink()
    moved.rename(chunk_dir)
    after = table.read_all()
    for k in (0, 2):  # the other partitions were written all the same
        lo, hi = store.partition_range(k)
        np.testing.assert_array_equal(after[lo:hi, 0], before[lo:hi, 0] + 1.0)
    lo, hi = store.partition_range(1)
    np.testing.assert_array_equal(after[lo:hi], before[lo:hi])
