"""Integrity on every read: a flipped bit in any bucket or partition fails the read that
touches it (not only `verify`), stores without segment checksums warn and upgrade, and the
tables themselves are checked by `verify`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import zarr

import graphstore
from graphstore.buffer import BufferManager
from graphstore.errors import CorruptStoreError, UnverifiedReadsWarning
from graphstore.layout import _arrays
from graphstore.layout._chunkio import ChunkReader
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._segments import CHECKSUMS_GROUP
from graphstore.layout._verify import store_summary, verify_store
from graphstore.layout._writer import StoreWriter
from tests.conftest import make_graph

P = 6
EDGE_CHUNK = 512  # several buckets per edge chunk, and buckets across chunk boundaries


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """p=6 with chunks that hold several partitions (1-D arrays, features) and several
    buckets (edges): every partition and bucket read is a read of part of a chunk."""
    graph, _ = make_graph(num_nodes=600, num_edges=4000, num_relations=3, feature_dim=6)
    original = StoreWriter.__init__

    def small_edge_chunks(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.edge_chunk = EDGE_CHUNK

    out = tmp_path_factory.mktemp("integrity") / "g.gs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StoreWriter, "__init__", small_edge_chunks)
        mp.setattr(_arrays, "TARGET_CHUNK_BYTES", 1 << 20)  # 1-D arrays: all partitions in one chunk
        convert(graph, out, ConvertOptions(num_partitions=P, partitioner="random", seed=1))
    return out


def _flip(path, name, row, *, row_bytes, chunk_rows, suffix=""):
    """Flip one bit of row ``row`` of array ``name`` in its chunk file; returns the file."""
    index, within = divmod(row, chunk_rows)
    f = path / name / "c" / f"{index}{suffix}"
    data = bytearray(f.read_bytes())
    data[within * row_bytes] ^= 0x01
    f.write_bytes(bytes(data))
    return f


def test_every_partial_read_is_verified(store_path):
    store = graphstore.open(store_path)
    assert store.verifies_partial_reads
    for name in ("edges/src", "nodes/labels", "nodes/features"):
        assert store.array(name).chunks[0] > store.partition_size or name.startswith("edges")
    reader = ChunkReader(threads=2)
    total = None
    try:
        p = store.num_partitions
        for j in range(p):
            for i in range(p):
                lo, hi = store.bucket_range(i, j)
                for name in ("edges/src", "edges/dst", "edges/rel"):
                    layout = store._layout(name)
                    out, stats = reader.read(layout, lo, hi)
                    np.testing.assert_array_equal(out, store.array(name)[lo:hi])
                    total = stats if total is None else total + stats
            lo, hi = store.partition_range(j)
            for name in ("nodes/labels", "nodes/features", "nodes/in_degree", "nodes/orig_id"):
                out, stats = reader.read(store._layout(name), lo, hi)
                total += stats
    finally:
        reader.close()
    assert total.unverified_reads == 0
    assert total.partial_reads > 0 and total.segments_verified > 0
    # Every partial read was covered by segments: none needed its whole chunk.
    assert total.chunks_expanded == 0


def test_unaligned_ranges_read_whole_chunks_and_equal_zarr(store_path):
    store = graphstore.open(store_path)
    rng = np.random.default_rng(0)
    for name in ("edges/src", "nodes/labels", "nodes/features"):
        arr = store.array(name)
        n = arr.shape[0]
        for lo in rng.integers(0, n - 1, 15).tolist():
            hi = int(min(n, lo + rng.integers(1, 3 * arr.chunks[0])))
            np.testing.assert_array_equal(store.read_rows(name, lo, hi), arr[lo:hi])


BUCKET = (2, 4)


@pytest.mark.parametrize("name", ["edges/src", "edges/dst", "edges/rel"])
def test_flipped_bit_in_a_bucket_fails_its_read(copy, name):
    store = graphstore.open(copy)
    lo, hi = store.bucket_range(*BUCKET)
    assert hi - lo > 2
    arr = store.array(name)
    f = _flip(copy, name, lo + 1, row_bytes=arr.dtype.itemsize, chunk_rows=arr.chunks[0])
    store = graphstore.open(copy)
    message = (rf"copy\.gs: {name} bucket \(src partition 2, dst partition 4\) \(rows \[{lo}, {hi}\), "
               rf"chunk files? c/\d+.*\): checksum mismatch")
    with pytest.raises(CorruptStoreError, match=message) as info:
        store.read_bucket(*BUCKET)
    assert "\n" not in str(info.value) and f.name in str(info.value)
    # Other buckets of the same chunk still read.
    for i in range(P):
        if (i, BUCKET[1]) != BUCKET and store.bucket_range(i, BUCKET[1])[1] <= lo:
            store.read_bucket(i, BUCKET[1])
    with pytest.raises(CorruptStoreError, match=name):
        verify_store(copy)


def test_flipped_neighbour_id_is_caught_by_the_buffer(copy):
    """The review's case: one bit of edges/src turned a neighbour id into another, and the
    buffer loaded the state without a word."""
    store = graphstore.open(copy)
    lo, _ = store.bucket_range(*BUCKET)
    arr = store.array("edges/src")
    _flip(copy, "edges/src", lo, row_bytes=4, chunk_rows=arr.chunks[0])
    store = graphstore.open(copy)
    with BufferManager(store, [(0, 1), (BUCKET[0], BUCKET[1])], prefetch=True) as buffer:
        it = iter(buffer)
        next(it)  # state (0, 1) does not hold the bucket
        with pytest.raises(CorruptStoreError, match=r"edges/src bucket \(src partition 2, dst partition 4\)"):
            next(it)


@pytest.mark.parametrize("name", ["nodes/labels", "nodes/features", "nodes/in_degree"])
def test_flipped_bit_in_a_partition_fails_its_read(copy, name):
    store = graphstore.open(copy)
    k = 3
    lo, hi = store.partition_range(k)
    arr = store.array(name)
    row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
    assert arr.chunks[0] > hi - lo, "the partition must be part of a chunk"
    _flip(copy, name, lo + 2, row_bytes=row_bytes, chunk_rows=arr.chunks[0],
          suffix="/0" if arr.ndim == 2 else "")
    store = graphstore.open(copy)
    # Features are checked by ~4 KiB blocks (here a block is the whole 100-row partition).
    what = "block 3" if name == "nodes/features" else "partition 3"
    with pytest.raises(CorruptStoreError, match=rf"{name} {what} \(rows \[{lo}, {hi}\), chunk file c/0"):
        store.read_rows(name, lo, hi)
    store.read_rows(name, *store.partition_range(2))  # its neighbour in the chunk is intact
    if name == "nodes/labels":
        with pytest.raises(CorruptStoreError, match="nodes/labels partition 3"):
            store.read_labels(3)


def test_flipped_bit_in_splits_and_offsets(copy):
    store = graphstore.open(copy)
    split = store.array("splits/nodes/train")
    f = copy / "splits" / "nodes" / "train" / "c" / "0"
    data = bytearray(f.read_bytes())
    data[0] ^= 0x04
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="splits/nodes/train"):
        graphstore.open(copy).read_node_split("train")
    assert split.shape[0] > 0
    f = copy / "edges" / "bucket_offsets" / "c" / "0"
    data = bytearray(f.read_bytes())
    data[16] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="edges/bucket_offsets"):
        graphstore.open(copy)


def test_verify_checks_the_tables_themselves(copy):
    table = zarr.open_array(str(copy / CHECKSUMS_GROUP / "edges" / "dst"), mode="r+")
    values = table[...]
    b = 4 * P + 2  # bucket (2, 4)
    values[b] ^= 1
    table[...] = values  # rewritten through zarr: the table's own chunk checksum is valid
    with pytest.raises(CorruptStoreError, match=r"checksums/edges/dst: the checksum of bucket "
                                                r"\(src partition 2, dst partition 4\) is"):
        verify_store(copy)
    with pytest.raises(CorruptStoreError, match="checksum mismatch"):
        graphstore.open(copy).read_bucket(*BUCKET)


def test_store_without_segment_checksums_warns_once_and_upgrades(copy):
    shutil.rmtree(copy / CHECKSUMS_GROUP)
    with pytest.warns(UnverifiedReadsWarning, match=r"graphstore upgrade .*copy\.gs"):
        store = graphstore.open(copy)
    assert not store.verifies_partial_reads
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graphstore.open(copy)  # once per store and process
    assert store_summary(copy)["segment_checksums"] is False
    info = subprocess.run([sys.executable, "-m", "graphstore", "info", str(copy)], capture_output=True, text=True)
    assert info.returncode == 0 and "NOT verified" in info.stdout and "Warning" not in info.stderr
    # Partial reads stay exact and unverified: a flipped bit in a bucket is not seen...
    store = graphstore.open(copy)
    lo, hi = store.bucket_range(*BUCKET)
    _flip(copy, "edges/dst", lo, row_bytes=4, chunk_rows=EDGE_CHUNK)
    graphstore.open(copy).read_bucket(*BUCKET)
    # ... and upgrading, which reads whole chunks, refuses to record damaged data.
    with pytest.raises(CorruptStoreError, match="edges/dst chunk"):
        graphstore.upgrade(copy)
    _flip(copy, "edges/dst", lo, row_bytes=4, chunk_rows=EDGE_CHUNK)  # flip it back
    up = subprocess.run([sys.executable, "-m", "graphstore", "upgrade", str(copy)], capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    assert "added segment checksums" in up.stdout
    store = graphstore.open(copy)
    assert store.verifies_partial_reads
    _flip(copy, "edges/dst", lo, row_bytes=4, chunk_rows=EDGE_CHUNK)
    with pytest.raises(CorruptStoreError, match=r"edges/dst bucket \(src partition 2, dst partition 4\)"):
        graphstore.open(copy).read_bucket(*BUCKET)
    report = json.loads(subprocess.run([sys.executable, "-m", "graphstore", "info", "--json", str(copy)],
                                       capture_output=True, text=True, check=True).stdout)
    assert report["segment_checksums"] is True


def test_interrupted_table_write_is_ignored_and_rebuilt(copy):
    """The completion record goes in last: a group without it counts as no tables."""
    group = zarr.open_group(str(copy / CHECKSUMS_GROUP), mode="r+")
    record = group.attrs.asdict()
    group.attrs.clear()
    with pytest.warns(UnverifiedReadsWarning):
        assert not graphstore.open(copy).verifies_partial_reads
    result = graphstore.upgrade(copy)
    assert result["had_checksums"] is False
    assert set(result["arrays"]) == set(record["graphstore_checksums"]["arrays"])
    assert graphstore.open(copy).verifies_partial_reads


def test_corrupt_state_still_writes_back_the_others(copy):
    """A bad checksum while loading a state reaches the consumer, and the embeddings it
    updated in earlier states are written back first."""
    from graphstore.layout.embeddings import EmbeddingTable

    store = graphstore.open(copy, mode="r+")
    table = EmbeddingTable.create(store, 4, seed=1)
    before = table.read_all()
    lo, _ = store.bucket_range(*BUCKET)
    _flip(copy, "edges/dst", lo, row_bytes=4, chunk_rows=EDGE_CHUNK)
    states = [(0, 1), (BUCKET[0], BUCKET[1])]
    buffer = BufferManager(store, states, embeddings=table, with_features=False)
    seen = 0
    with pytest.raises(CorruptStoreError, match=r"edges/dst bucket \(src partition 2, dst partition 4\)"):
        for loaded in buffer:
            loaded.graph.embeddings[:, 0] += 1.0
            seen += 1
    assert seen == 1 and buffer.closed
    after = table.read_all()
    for k in (0, 1):
        a, b = store.partition_range(k)
        np.testing.assert_array_equal(after[a:b, 0], before[a:b, 0] + 1.0)
    untouched = np.r_[store.partition_range(1)[1]:store.num_nodes]
    np.testing.assert_array_equal(after[untouched], before[untouched])


def test_buffer_stats_count_what_was_verified(store_path, tmp_path):
    store = graphstore.open(store_path)
    states = [(0, 1, 2), (2, 3, 4), (4, 5, 0)]
    with BufferManager(store, states) as buffer:
        for _ in buffer:
            pass
    stats = buffer.stats
    assert stats.unverified_reads == 0 and stats.segments_verified > 0
    # The same pass over a store without segment checksums counts its unchecked reads.
    legacy = tmp_path / "legacy.gs"
    shutil.copytree(store_path, legacy)
    shutil.rmtree(legacy / CHECKSUMS_GROUP)
    with pytest.warns(UnverifiedReadsWarning):
        old = graphstore.open(legacy)
    with BufferManager(old, states) as buffer:
        for _ in buffer:
            pass
    assert buffer.stats.unverified_reads > 0 and buffer.stats.segments_verified == 0
    assert buffer.stats.bytes_read == stats.bytes_read


@pytest.mark.parametrize("name", ["edges/bucket_offsets", "splits/nodes/train"])
def test_missing_chunk_of_an_array_read_whole_is_an_error_not_zeros(copy, name):
    """zarr reads a missing chunk as the fill value; the store must not."""
    (copy / name / "c" / "0").unlink()
    with pytest.raises(CorruptStoreError, match=rf"{name} chunk 0: chunk file is missing"):
        graphstore.open(copy).read_node_split("train")


def test_missing_or_damaged_chunk_of_a_compressed_store(tmp_path):
    graph, _ = make_graph(num_nodes=300, num_edges=1200, feature_dim=4)
    out = tmp_path / "z.gs"
    convert(graph, out, ConvertOptions(num_partitions=3, compress=True))
    store = graphstore.open(out)
    assert not store._layout("nodes/features").fast  # read through zarr
    features = store.read_features(1)
    (out / "nodes" / "features" / "c" / "0" / "0").unlink()
    with pytest.raises(CorruptStoreError, match=r"nodes/features chunk 0/0: chunk file is missing"):
        graphstore.open(out).read_features(1)
    assert features.any()


def test_a_replaced_store_moved_aside_by_a_killed_convert_is_restored(tmp_path):
    """Where the atomic exchange is not available, --overwrite renames the old store aside
    first; a kill between the two renames must not cost the user that store."""
    out = tmp_path / "g.gs"
    graph, _ = make_graph(num_nodes=100, num_edges=300, feature_dim=0)
    convert(graph, out, ConvertOptions(num_partitions=2))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    aside = tmp_path / f".g.gs.tmp-{dead}-abcd1234.old"
    out.rename(aside)
    small, _ = make_graph(num_nodes=50, num_edges=100, feature_dim=0)
    with pytest.raises(graphstore.StoreExistsError):  # it is back, so a plain convert refuses
        convert(small, out, ConvertOptions(num_partitions=2))
    assert graphstore.open(out).num_nodes == 100 and not aside.exists()


def test_flipped_bit_in_the_hub_group_fails_its_read(copy):
    from graphstore.buffer.resident import read_hub_segment

    store = graphstore.open(copy)
    sizes = store.hubs.segment_sizes
    g = int(np.argmax(sizes[:-1]))  # the largest partition segment
    lo, hi = store.hub_segment_range(g)
    chunk = store.array("hubs/edges/dst").chunks[0]
    assert hi - lo > 2 and (lo > 0 or hi < store.hubs.num_edges)  # a part of a chunk
    _flip(copy, "hubs/edges/dst", lo + 1, row_bytes=4, chunk_rows=chunk)
    store = graphstore.open(copy)
    with pytest.raises(CorruptStoreError, match=rf"hubs/edges/dst hub edges of partition {g} .*checksum mismatch"):
        read_hub_segment(store, g)
    with pytest.raises(CorruptStoreError, match="hubs/edges/dst"):
        verify_store(copy)
    _flip(copy, "hubs/features", 0, row_bytes=4 * 6, chunk_rows=store.array("hubs/features").chunks[0], suffix="/0")
    store = graphstore.open(copy)
    from graphstore.buffer import BufferMemory, StaticCache
    from graphstore.buffer.resident import fill_cache_rows
    cache = StaticCache.open(store)
    with pytest.raises(CorruptStoreError, match="hubs/features"):
        fill_cache_rows(BufferMemory.allocate(store, 1, cache_rows=cache.num_nodes), cache, store)
