"""Scattered row reads (`Store.read_row_set`): exactly the rows asked for, read as ~4 KiB
blocks that are each verified, in few requests; damaged blocks and files are named."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

import graphstore
from graphstore.errors import CorruptStoreError
from graphstore.layout import _arrays
from graphstore.layout import _native as native
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout import _rowsets
from graphstore.layout._rowsets import MERGE_GAP_BYTES, RowSetStats
from graphstore.layout._segments import BLOCK_BYTES, CHECKSUMS_GROUP, block_bounds
from tests.conftest import make_graph

D = 64  # 256-byte rows: 16 rows per block
N = 3001  # the last partition is short


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=N, num_edges=12000, feature_dim=D)
    out = tmp_path_factory.mktemp("rowsets") / "g.gs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_arrays, "TARGET_CHUNK_BYTES", 200_000)  # chunks that do not align with partitions
        convert(graph, out, ConvertOptions(num_partitions=7, partitioner="random", seed=1))
    return out


@pytest.fixture(params=["native", "python"])
def reader(request, monkeypatch):
    """Each test runs with the C block reader and with the Python one it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        if os.environ.get("CI"):  # CI builds it: a missing reader there is a broken build
            pytest.fail(f"the C block reader is not built: {native.load_error()}")
        pytest.skip(f"the C block reader is not built: {native.load_error()}")
    return request.param


@pytest.fixture(scope="module")
def features(store_path):
    return graphstore.open(store_path).array("nodes/features")[...]


def test_block_bounds_tile_every_partition_and_chunk():
    for n, rb, R, P in [(10, 2048, 3, 5), (3001, 256, 781, 429), (1, 8, 1, 1), (100, 5000, 100, 7)]:
        b = block_bounds(num_rows=n, row_bytes=rb, chunk_rows=R, partition_size=P)
        assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) > 0)
        assert set(range(0, n, P)) <= set(b.tolist()) and set(range(0, n, R)) <= set(b.tolist())
        assert np.diff(b).max() <= max(1, BLOCK_BYTES // rb)


@pytest.mark.parametrize("density", [0.0, 0.0004, 0.01, 0.2, 1.0])
def test_rows_are_exact_and_only_their_blocks_are_read(store_path, features, density, reader, monkeypatch):
    monkeypatch.setattr(_rowsets, "WHOLE_BYTES_PER_S", 0)  # blocks only: no chunk is read whole
    store = graphstore.open(store_path)
    rng = np.random.default_rng(int(density * 1e4))
    ids = np.flatnonzero(rng.random(N) < density) if density < 1 else np.arange(N)
    stats = RowSetStats()
    got = store.read_row_set("nodes/features", ids, stats=stats)
    np.testing.assert_array_equal(got, features[ids])
    table = store._layout("nodes/features").segments
    assert table.kind == "blocks"
    blocks = np.unique(np.searchsorted(table.bounds, ids, side="right") - 1)
    assert stats.rows == ids.size
    # Every block holding a row was read; besides those, only the gaps merged into runs.
    assert stats.blocks >= blocks.size
    row_bytes = D * 4
    gap_rows = MERGE_GAP_BYTES // row_bytes
    assert stats.bytes_read <= (np.diff(table.bounds)[blocks].sum() + stats.requests * gap_rows) * row_bytes
    assert stats.requests <= max(blocks.size, 0)
    if density == 1.0:
        assert stats.bytes_read == N * row_bytes


def test_a_preallocated_output_and_bad_ids_are_checked(store_path, features):
    store = graphstore.open(store_path)
    ids = np.array([0, 17, 2999, 3000])
    out = np.empty((4, D), np.float32)
    assert store.read_row_set("nodes/features", ids, out) is out
    np.testing.assert_array_equal(out, features[ids])
    with pytest.raises(ValueError, match="ascending, distinct"):
        store.read_row_set("nodes/features", np.array([5, 5]))
    with pytest.raises(ValueError, match=r"in \[0, 3001\)"):
        store.read_row_set("nodes/features", np.array([3001]))


@pytest.mark.parametrize("seed", range(4))
def test_dense_chunks_are_read_whole_and_sparse_ones_as_blocks(store_path, features, reader, seed):
    """The cost model's choice, per chunk: every row of a chunk asked for -> the chunk file
    read whole (its crc checked); one row of a chunk -> its block. The rows are the same."""
    store = graphstore.open(store_path)
    layout = store._layout("nodes/features")
    R, rb, C = layout.chunk_rows, layout.row_bytes, layout.num_chunks
    rng = np.random.default_rng(seed)
    dense = np.sort(rng.choice(C, 2, replace=False))
    sparse = np.setdiff1d(np.arange(C), dense)
    one = np.minimum(sparse * R + rng.integers(0, R, sparse.size), N - 1)
    ids = np.unique(np.concatenate([np.arange(c * R, min((c + 1) * R, N)) for c in dense] + [one]))
    stats = RowSetStats()
    np.testing.assert_array_equal(store.read_row_set("nodes/features", ids, stats=stats), features[ids])
    table = layout.segments
    blocks = np.unique(np.searchsorted(table.bounds, one, side="right") - 1)
    block_bytes = int(np.diff(table.bounds)[blocks].sum()) * rb
    assert stats.bytes_read == dense.size * layout.file_bytes + block_bytes
    assert stats.blocks == dense.size + blocks.size
    # The same set with the model told that whole chunks are slow: blocks only, same rows.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_rowsets, "WHOLE_BYTES_PER_S", 1.0)
        stats = RowSetStats()
        np.testing.assert_array_equal(store.read_row_set("nodes/features", ids, stats=stats), features[ids])
    assert stats.bytes_read < dense.size * layout.chunk_bytes + block_bytes + 2 * MERGE_GAP_BYTES * blocks.size
    assert stats.blocks > dense.size * (R // 16)


def test_the_cost_model_reads_a_chunk_whole_when_its_requests_cost_more():
    layout = type("L", (), dict(chunk_rows=8192, row_bytes=1024, file_bytes=8192 * 1024 + 4))()
    R = layout.chunk_rows

    def whole(row_lo, row_hi):
        lo, hi = np.asarray(row_lo, np.int64), np.asarray(row_hi, np.int64)
        return _rowsets._whole_chunks(layout, _rowsets._Runs(lo, lo, lo, hi)).tolist()

    # Chunk 0: one 4 KiB block; chunk 1: 200 blocks of 16 KiB runs (3.3 MB); chunk 2: one run of
    # all of it; chunk 3: 40 runs of 4 KiB.
    lo = [0] + [R + 40 * k for k in range(200)] + [2 * R] + [3 * R + 200 * k for k in range(40)]
    hi = [4] + [R + 40 * k + 16 for k in range(200)] + [3 * R] + [3 * R + 200 * k + 4 for k in range(40)]
    assert whole(lo, hi) == [1, 2]
    assert whole([], []) == []


def test_a_damaged_chunk_read_whole_is_named(store_path, tmp_path):
    copy = tmp_path / "copy.gs"
    shutil.copytree(store_path, copy)
    store = graphstore.open(copy)
    layout = store._layout("nodes/features")
    R, rb = layout.chunk_rows, layout.row_bytes
    f = layout.chunk_path(1)
    data = bytearray(f.read_bytes())
    data[(R - 1) * rb] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=r"nodes/features chunk 1\b.*checksum mismatch") as e:
        store.read_row_set("nodes/features", np.arange(R, 2 * R))  # all of chunk 1: read whole
    assert "\n" not in str(e.value)
    f.write_bytes(bytes(data[:100]))
    with pytest.raises(CorruptStoreError, match=r"nodes/features chunk 1\b.*chunk file is 100 bytes"):
        store.read_row_set("nodes/features", np.arange(R, 2 * R))
    # Chunk 0 read whole and chunk 2's blocks are intact.
    ids = np.concatenate([np.arange(R), [2 * R + 5]])
    np.testing.assert_array_equal(store.read_row_set("nodes/features", ids),
                                  np.asarray(graphstore.open(store_path).array("nodes/features")[...])[ids])


def test_a_damaged_block_fails_only_the_reads_that_touch_it(store_path, tmp_path, reader):
    copy = tmp_path / "copy.gs"
    shutil.copytree(store_path, copy)
    store = graphstore.open(copy)
    layout = store._layout("nodes/features")
    R, rb = layout.chunk_rows, layout.row_bytes
    row = 1234
    chunk, within = divmod(row, R)
    f = layout.chunk_path(chunk)
    data = bytearray(f.read_bytes())
    data[within * rb + 3] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=rf"nodes/features block \d+ \(rows \[\d+, \d+\), .*c/{chunk}.*\): "
                                                "checksum mismatch") as e:
        store.read_row_set("nodes/features", np.array([3, row, 2000]))
    assert "\n" not in str(e.value)
    # Rows far from it read (their blocks are intact), in the same chunk too.
    far = np.array([chunk * R, chunk * R + 1]) if within > 100 else np.array([(chunk + 1) * R - 1])
    np.testing.assert_array_equal(store.read_row_set("nodes/features", far),
                                  np.asarray(graphstore.open(store_path).array("nodes/features")[...])[far])


def test_a_short_chunk_file_is_named(store_path, tmp_path, reader):
    copy = tmp_path / "copy.gs"
    shutil.copytree(store_path, copy)
    store = graphstore.open(copy)
    layout = store._layout("nodes/features")
    f = layout.chunk_path(1)
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CorruptStoreError, match=r"chunk file .*c/1.* is short"):
        store.read_row_set("nodes/features", np.array([layout.chunk_rows + 50]))


def test_a_store_without_block_checksums_reads_whole_chunks_and_says_so(store_path, features, tmp_path):
    copy = tmp_path / "copy.gs"
    shutil.copytree(store_path, copy)
    shutil.rmtree(copy / CHECKSUMS_GROUP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the open's own warning about unverified partial reads
        store = graphstore.open(copy)
    ids = np.array([1, 900, 901, 2500])
    stats = RowSetStats()
    with pytest.warns(UserWarning, match=r"no block checksums.*graphstore upgrade"):
        got = store.read_row_set("nodes/features", ids, stats=stats)
    np.testing.assert_array_equal(got, features[ids])
    R = store._layout("nodes/features").chunk_rows
    assert stats.blocks == np.unique(ids // R).size and stats.bytes_read >= stats.blocks * R * D * 4 - R * D * 4
    graphstore.upgrade(copy)
    stats = RowSetStats()
    np.testing.assert_array_equal(graphstore.open(copy).read_row_set("nodes/features", ids, stats=stats), features[ids])
    assert stats.bytes_read <= 4 * BLOCK_BYTES + 4 * MERGE_GAP_BYTES


def test_the_c_readers_checksum_is_crc32c():
    import crc32c

    if native.library() is None:
        if os.environ.get("CI"):
            pytest.fail(f"the C block reader is not built: {native.load_error()}")
        pytest.skip(f"the C block reader is not built: {native.load_error()}")
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 63, 4096, 100_003):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert native.crc32c(data) == crc32c.crc32c(data), n
