"""`ChunkReader`: row ranges read from the chunk files equal zarr's reads bit for bit, damage
is reported naming the chunk, unsupported arrays go through zarr, threads behave."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading

import numpy as np
import pytest
import torch
import zarr

import graphstore
from graphstore.errors import CorruptStoreError
from graphstore.layout import _arrays, _chunkio
from graphstore.layout._arrays import new_array
from graphstore.layout._chunkio import ALIGN, ArrayLayout, ChunkReader, ReadStats, aligned_empty
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._writer import StoreWriter
from tests.conftest import make_graph

ARRAYS = ("nodes/features", "nodes/labels", "nodes/in_degree", "edges/src", "edges/dst", "edges/rel")


def _convert_small_chunks(path, **options):
    """A store whose arrays span several chunks (the real sizes would give one chunk each)."""
    graph, _ = make_graph(num_nodes=300, num_edges=1500, num_relations=3, feature_dim=5)
    original = StoreWriter.__init__

    def small_edges(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.edge_chunk = 97  # 2 * 1490 stored edges: 31 chunks, the last one short

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_arrays, "MAX_CHUNK_BYTES", 256)  # features: 60-row partitions in 4 chunks
        mp.setattr(_arrays, "TARGET_CHUNK_BYTES", 256)  # 1-D node arrays: a chunk per partition
        mp.setattr(StoreWriter, "__init__", small_edges)
        convert(graph, path, ConvertOptions(num_partitions=5, partitioner="random", seed=3, **options))
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return _convert_small_chunks(tmp_path_factory.mktemp("chunkio") / "g.gs")


READER_MODES = {
    "direct": {"direct": True},
    "direct-partial": {"partial_direct": True},
    "buffered": {"direct": False},
}


@pytest.fixture(params=sorted(READER_MODES))
def reader(request):
    with ChunkReader(threads=3, piece_bytes=ALIGN, **READER_MODES[request.param]) as r:
        yield r


def _ranges(n: int, chunk: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Whole chunks, parts of one, spans of several, the last (short) chunk, empty, all."""
    last = (n - 1) // chunk * chunk
    fixed = [(0, chunk), (chunk, 3 * chunk), (1, 2), (chunk - 1, chunk + 1), (last, n), (n - 1, n),
             (0, n), (5, 5), (n, n), (max(0, last - 3), n)]
    lo = rng.integers(0, n, 20)
    hi = np.minimum(n, lo + rng.integers(0, 3 * chunk, 20))
    return fixed + list(zip(lo.tolist(), hi.tolist(), strict=True))


@pytest.mark.parametrize("name", ARRAYS)
def test_random_ranges_equal_zarr(store_path, reader, name):
    store = graphstore.open(store_path)
    arr = store.array(name)
    layout = reader.layout(arr)
    assert layout.fast and layout.checksum and layout.reason is None
    assert layout.num_chunks > 2, "the fixture must spread the array over several chunks"
    rng = np.random.default_rng(len(name))
    for lo, hi in _ranges(arr.shape[0], arr.chunks[0], rng):
        out = np.full((hi - lo, *arr.shape[1:]), 7, dtype=arr.dtype)
        stats = reader.read_rows(arr, lo, hi, out)
        expected = arr[lo:hi]
        assert out.tobytes() == expected.tobytes(), (name, lo, hi)
        assert stats.bytes_delivered == expected.nbytes and stats.requests == 1


def test_dtypes_covered(store_path):
    store = graphstore.open(store_path)
    assert {str(store.array(n).dtype) for n in ARRAYS} == {"float32", "int32", "int64"}


def test_stats_count_whole_and_partial_chunks(store_path, reader):
    arr = graphstore.open(store_path).array("edges/src")
    R, n = arr.chunks[0], arr.shape[0]
    out = np.empty(2 * R, dtype=arr.dtype)
    stats = reader.read_rows(arr, R, 3 * R, out)
    assert (stats.chunks_verified, stats.partial_reads) == (2, 0)
    assert stats.bytes_read == 2 * (R * 4 + 4)
    # Part of a chunk, no segment table (a bare zarr array): the whole chunk is read and checked.
    stats = reader.read_rows(arr, R + 1, 3 * R, out[:-1])
    assert (stats.chunks_verified, stats.partial_reads, stats.chunks_expanded) == (2, 0, 1)
    assert stats.bytes_read == 2 * (R * 4 + 4) and stats.unverified_reads == 0
    np.testing.assert_array_equal(out[:-1], arr[R + 1 : 3 * R])
    # The last chunk is padded to full size on disk: reading its rows reads (and checks) it all.
    last = (n - 1) // R * R
    stats = reader.read_rows(arr, last, n, np.empty(n - last, arr.dtype))
    assert stats.chunks_verified == 1 and stats.bytes_read == R * 4 + 4
    assert os.path.getsize(store_path / "edges" / "src" / "c" / str(n // R)) == R * 4 + 4


def test_many_requests_in_one_call(store_path, reader):
    store = graphstore.open(store_path)
    requests, expected = [], []
    for name in ARRAYS:
        arr = store.array(name)
        for lo, hi in [(0, 10), (arr.shape[0] // 3, arr.shape[0] // 2), (arr.shape[0] - 1, arr.shape[0])]:
            requests.append((arr, lo, hi, np.empty((hi - lo, *arr.shape[1:]), arr.dtype)))
            expected.append(arr[lo:hi])
    stats = reader.read_into(requests)
    for (_, _, _, out), want in zip(requests, expected, strict=True):
        np.testing.assert_array_equal(out, want)
    assert stats.requests == len(requests) and stats.bytes_delivered == sum(e.nbytes for e in expected)
    assert stats.seconds > 0 and stats.fallback_requests == 0
    total = stats + stats
    assert total.requests == 2 * stats.requests and isinstance(total, ReadStats)


def test_into_a_torch_tensor(store_path, reader):
    arr = graphstore.open(store_path).array("nodes/features")
    tensor = torch.empty((100, arr.shape[1]), dtype=torch.float32)
    reader.read_rows(arr, 40, 140, tensor.numpy())
    assert torch.equal(tensor, torch.from_numpy(arr[40:140]))


def test_bad_requests(store_path, reader):
    arr = graphstore.open(store_path).array("nodes/labels")
    with pytest.raises(ValueError, match=r"rows \[5, 400\) must lie in \[0, 300\)"):
        reader.read_rows(arr, 5, 400, np.empty(395, np.int32))
    with pytest.raises(ValueError, match="out must be"):
        reader.read_rows(arr, 0, 10, np.empty(10, np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.read_rows(arr, 0, 10, np.empty(20, np.int32)[::2])


# ---------------------------------------------------------------------- direct IO


@pytest.fixture
def aligned_array(tmp_path):
    """A 2-D float32 array with 16 KiB chunks (O_DIRECT-able) and a short last chunk."""
    group = zarr.open_group(str(tmp_path / "a.gs"), mode="w")
    arr = new_array(group, "x", shape=(1000, 256), dtype="float32", chunks=(16, 256))
    arr[:] = np.random.default_rng(0).standard_normal((1000, 256), dtype=np.float32)
    return arr


def test_direct_reads_into_aligned_memory(aligned_array):
    with ChunkReader(threads=2, direct=True) as reader:
        out = aligned_empty((1000, 256), "float32")
        stats = reader.read_rows(aligned_array, 0, 1000, out)
        np.testing.assert_array_equal(out, aligned_array[:])
        assert reader.direct, "tmp_path is expected on a filesystem with O_DIRECT"
        assert stats.chunks_verified == 63 and stats.direct_bytes > 0
        # Misaligned destination: same bytes, read buffered.
        out = aligned_empty((1001, 256), "float32")[1:]
        stats = reader.read_rows(aligned_array, 16, 1000, out[:984])
        np.testing.assert_array_equal(out[:984], aligned_array[16:])
        assert stats.direct_bytes == 0


def test_buffered_and_piece_sizes_agree(aligned_array):
    want = aligned_array[:]
    for kwargs in ({"direct": False}, {"piece_bytes": ALIGN}, {"threads": 1}, {"drop_cache": False}):
        with ChunkReader(**kwargs) as reader:
            out, _ = reader.read(aligned_array, 0, 1000)
            np.testing.assert_array_equal(out, want)


def test_aligned_empty():
    a = aligned_empty(10, np.int64)
    assert a.shape == (10,) and a.ctypes.data % ALIGN == 0
    assert aligned_empty((0, 3), "float32").shape == (0, 3)


# ---------------------------------------------------------------------- damage


def _chunk_file(path, name, index):
    return path / name / "c" / str(index) / "0" if name == "nodes/features" else path / name / "c" / str(index)


def test_flipped_byte_fails_whole_chunk_reads(copy):
    store = graphstore.open(copy)
    arr = store.array("nodes/features")
    R = arr.chunks[0]
    f = _chunk_file(copy, "nodes/features", 1)
    data = bytearray(f.read_bytes())
    data[10] ^= 0x40
    f.write_bytes(bytes(data))
    with ChunkReader(threads=2) as reader:
        with pytest.raises(CorruptStoreError, match=r"nodes/features chunk 1/0: checksum mismatch \(stored 0x"):
            reader.read_rows(arr, 0, 3 * R, np.empty((3 * R, arr.shape[1]), arr.dtype))
        # Part of the chunk: read whole to verify it, so the flip is caught there too.
        with pytest.raises(CorruptStoreError, match=r"nodes/features chunk 1/0: checksum mismatch"):
            reader.read_rows(arr, R, R + 2, np.empty((2, arr.shape[1]), arr.dtype))
        # A store written before segment checksums reads parts of chunks unverified (it warns).
        legacy = dataclasses.replace(reader.layout(arr), verify_partial=False)
        stats = reader.read_rows(legacy, R, R + 2, np.empty((2, arr.shape[1]), arr.dtype))
        assert stats.partial_reads == stats.unverified_reads == 1 and stats.chunks_verified == 0
        # The reader survives the error.
        reader.read_rows(arr, 0, R, np.empty((R, arr.shape[1]), arr.dtype))


def test_flipped_checksum_byte(copy):
    f = _chunk_file(copy, "edges/dst", 2)
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    arr = graphstore.open(copy).array("edges/dst")
    with ChunkReader() as reader, pytest.raises(CorruptStoreError, match="edges/dst chunk 2: checksum mismatch"):
        reader.read(arr, 0, arr.shape[0])


def test_missing_chunk_file(copy):
    _chunk_file(copy, "edges/src", 3).unlink()
    arr = graphstore.open(copy).array("edges/src")
    R = arr.chunks[0]
    with ChunkReader() as reader:
        for lo, hi in [(0, arr.shape[0]), (3 * R + 1, 3 * R + 5)]:  # whole and partial reads
            with pytest.raises(CorruptStoreError, match=r"copy\.gs: edges/src chunk 3: chunk file is missing"):
                reader.read(arr, lo, hi)


def test_truncated_chunk_file(copy, store_path):
    f = _chunk_file(copy, "nodes/labels", 2)
    size = f.stat().st_size
    os.truncate(f, size // 2)
    arr = graphstore.open(copy).array("nodes/labels")
    R = arr.chunks[0]
    with ChunkReader() as reader:
        with pytest.raises(CorruptStoreError, match=rf"nodes/labels chunk 2: chunk file is {size // 2} bytes, expected {size}"):
            reader.read(arr, 2 * R, 3 * R)
        with pytest.raises(CorruptStoreError, match="chunk file is"):
            reader.read(arr, 3 * R - 2, 3 * R - 1)  # a partial read past the cut
        with pytest.raises(CorruptStoreError, match="chunk file is"):
            reader.read(arr, 2 * R, 2 * R + 2)  # before the cut: the chunk is read whole
        legacy = dataclasses.replace(reader.layout(arr), verify_partial=False)
        out, stats = reader.read(legacy, 2 * R, 2 * R + 2)  # unverified: nothing to notice
        intact = graphstore.open(store_path).array("nodes/labels")
        np.testing.assert_array_equal(out, intact[2 * R : 2 * R + 2])


def test_checksum_only_file_cut_by_four_bytes(copy):
    f = _chunk_file(copy, "nodes/in_degree", 0)
    os.truncate(f, f.stat().st_size - 4)
    arr = graphstore.open(copy).array("nodes/in_degree")
    with ChunkReader() as reader, pytest.raises(CorruptStoreError, match="in_degree chunk 0: chunk file is"):
        reader.read(arr, 0, arr.chunks[0])


# ---------------------------------------------------------------------- fallback


def test_compressed_store_reads_through_zarr(tmp_path):
    path = _convert_small_chunks(tmp_path / "z.gs", compress=True)
    store = graphstore.open(path)
    with ChunkReader() as reader:
        for name in ARRAYS:
            arr = store.array(name)
            layout = reader.layout(arr)
            assert not layout.fast and "compressed" in layout.reason
            out, stats = reader.read(arr, 3, arr.shape[0] - 2)
            np.testing.assert_array_equal(out, arr[3 : arr.shape[0] - 2])
            assert stats.fallback_requests == 1 and stats.bytes_read == 0
    f = _chunk_file(path, "edges/src", 1)
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with ChunkReader() as reader, pytest.raises(CorruptStoreError,
                                                match=r"edges/src chunk 1: checksum mismatch \(read through zarr\)"):
        reader.read(store.array("edges/src"), 0, 200)


def test_other_layouts_are_not_fast(tmp_path):
    group = zarr.open_group(str(tmp_path / "o.gs"), mode="w")
    two_axes = group.create_array("t", shape=(10, 8), dtype="int32", chunks=(5, 4))
    assert "split rows" in ArrayLayout.of(two_axes).reason
    memory = zarr.create_array(zarr.storage.MemoryStore(), shape=(10,), dtype="int32", chunks=(5,))
    assert "local" in ArrayLayout.of(memory).reason
    plain = group.create_array("p", shape=(10,), dtype="int32", chunks=(4,), compressors=None)
    plain[:] = np.arange(10)
    layout = ArrayLayout.of(plain)
    assert layout.fast and not layout.checksum and layout.chunk_path(2).name == "2"
    with ChunkReader() as reader:
        out, stats = reader.read(plain, 1, 9)
    assert out.tolist() == list(range(1, 9)) and stats.chunks_verified == 0


# ---------------------------------------------------------------------- threads


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("graphstore-chunkio")]


def test_worker_error_reaches_the_caller(store_path, monkeypatch):
    arr = graphstore.open(store_path).array("edges/src")
    real = os.preadv
    calls = []

    def failing(fd, views, offset):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(errno.EIO, "injected")
        return real(fd, views, offset)

    monkeypatch.setattr(_chunkio.os, "preadv", failing)
    with ChunkReader(threads=2) as reader:
        with pytest.raises(OSError, match="injected"):
            reader.read(arr, 0, arr.shape[0])
        monkeypatch.setattr(_chunkio.os, "preadv", real)
        out, _ = reader.read(arr, 0, arr.shape[0])  # usable afterwards
        np.testing.assert_array_equal(out, arr[:])


def test_two_threads_share_a_reader(store_path):
    store = graphstore.open(store_path)
    feats, src = store.array("nodes/features"), store.array("edges/src")
    want = {"f": feats[:], "s": src[:]}
    errors = []
    with ChunkReader(threads=2, piece_bytes=ALIGN) as reader:
        def work(key, arr):
            try:
                for _ in range(20):
                    out, _ = reader.read(arr, 0, arr.shape[0])
                    np.testing.assert_array_equal(out, want[key])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=a) for a in (("f", feats), ("s", src))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not errors


def test_close_is_idempotent_and_joins_workers(store_path):
    arr = graphstore.open(store_path).array("edges/dst")
    reader = ChunkReader(threads=3)
    reader.read(arr, 0, arr.shape[0])
    assert _workers()
    reader.close()
    reader.close()
    assert not _workers()
    assert "closed" in repr(reader)
    with pytest.raises(ValueError, match="closed ChunkReader"):
        reader.read(arr, 0, 5)
    with pytest.raises(ValueError, match="threads must be"):
        ChunkReader(threads=0)


def test_partial_reads_direct_or_buffered(store_path):
    arr = graphstore.open(store_path).array("edges/dst")
    R = arr.chunks[0]
    for partial_direct in (True, False):
        with ChunkReader(partial_direct=partial_direct) as reader:
            exact = dataclasses.replace(reader.layout(arr), verify_partial=False)
            out, stats = reader.read(exact, R + 3, 2 * R - 5)
        np.testing.assert_array_equal(out, arr[R + 3 : 2 * R - 5])
        assert stats.partial_reads == 1 and stats.chunks_verified == 0
        if partial_direct:  # the aligned block around the rows
            assert stats.direct_bytes == stats.bytes_read == R * 4 + 4
        else:  # exactly the rows asked for
            assert stats.direct_bytes == 0 and stats.bytes_read == out.nbytes
