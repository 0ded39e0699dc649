"""The edge phase's C kernel against its numpy fallback: the same store, byte for byte.

`graphstore.layout._buckets` sorts and merges edges either in C (packed 64-bit keys, radix
sorts on worker threads) or in numpy (columns, comparison sorts). Each source here is
converted both ways and every file of the two stores compared, the manifests but for their
timings; then the kernel's pieces are checked alone against the numpy functions they replace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from graphstore.layout import _buckets
from graphstore.layout import _convert
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._native import edges as native
from tests.conftest import make_graph


@pytest.fixture(autouse=True)
def kernel():
    if native.library() is None:
        if os.environ.get("CI"):  # CI builds it: a missing kernel there is a broken build
            pytest.fail(f"the C edge kernel is not built: {native.load_error()}")
        pytest.skip(f"the C edge kernel is not built: {native.load_error()}")


def without_timings(value):
    """A parsed JSON value less every ``seconds`` entry (the manifest's phase timings, the
    partitioner's)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store by relative path: chunks as bytes, metadata (``zarr.json``) as
    parsed JSON less its timings, with keys sorted (the checksum tables list arrays in the
    order the file system lists them, which two runs need not share)."""
    files = {}
    for f in sorted(path.rglob("*")):
        if not f.is_file():
            continue
        data = f.read_bytes()
        if f.name == "zarr.json":
            data = json.dumps(without_timings(json.loads(data)), sort_keys=True).encode()
        files[f.relative_to(path).as_posix()] = data
    return files


def convert_both_ways(graph, tmp_path: Path, monkeypatch, **options) -> tuple[dict, dict, int]:
    """The store from the C path, the one from numpy, and how many groups C sorted."""
    calls = []
    sort_group = native.sort_group

    def counting(*args, **kwargs):
        calls.append(1)
        return sort_group(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(native, "sort_group", counting)
        convert(graph, tmp_path / "c.gs", ConvertOptions(**options))
    with monkeypatch.context() as mp:
        mp.setattr(native, "library", lambda: None)
        convert(graph, tmp_path / "numpy.gs", ConvertOptions(**options))
    return store_files(tmp_path / "c.gs"), store_files(tmp_path / "numpy.gs"), len(calls)


def assert_same(c: dict, ref: dict) -> None:
    assert sorted(c) == sorted(ref)
    differ = [k for k in ref if c[k] != ref[k]]
    assert not differ, f"files differ between the C and numpy edge paths: {differ}"


CASES = {
    # An undirected source with self loops, repeats and rows listing both directions.
    "symmetric": dict(graph=dict(num_nodes=700, num_edges=6000, duplicates=300, self_loops=40, edge_chunk=333),
                      options=dict(num_partitions=5, partitioner="random")),
    "symmetric_kept": dict(graph=dict(num_nodes=700, num_edges=6000, duplicates=300, edge_chunk=333),
                           options=dict(num_partitions=5, partitioner="random", keep_duplicates=True,
                                        keep_self_loops=True)),
    "directed": dict(graph=dict(num_nodes=900, num_edges=7000, directed=True, duplicates=200),
                     options=dict(num_partitions=7, partitioner="sequential", chunk_edges=777)),
    "relations": dict(graph=dict(num_nodes=400, num_edges=5000, num_relations=37, feature_dim=0, duplicates=250),
                      options=dict(num_partitions=3, partitioner="random")),
    "relations_undirected_kept": dict(graph=dict(num_nodes=400, num_edges=5000, num_relations=5, feature_dim=0,
                                                 directed=False, duplicates=250),
                                      options=dict(num_partitions=4, partitioner="random", keep_duplicates=True)),
    "featureless": dict(graph=dict(num_nodes=1000, num_edges=3000, feature_dim=0),
                        options=dict(num_partitions=6, partitioner="random")),
    # Few edges over many partitions: many empty groups, and one partition.
    "empty_partitions": dict(graph=dict(num_nodes=2000, num_edges=60, directed=True, duplicates=5),
                             options=dict(num_partitions=64, partitioner="sequential", chunk_edges=7)),
    "one_partition": dict(graph=dict(num_nodes=300, num_edges=2000, duplicates=50),
                          options=dict(num_partitions=1, partitioner="random")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_c_path_writes_the_numpy_store(tmp_path, monkeypatch, case):
    spec = CASES[case]
    graph, _ = make_graph(seed=len(case), **spec["graph"])
    c, ref, groups = convert_both_ways(graph, tmp_path, monkeypatch, **spec["options"])
    assert groups > 0  # the C path ran
    assert_same(c, ref)


def test_64_bit_store_ids_on_both_paths(tmp_path, monkeypatch):
    """int64 ids (graphs past 2**31 nodes) through the kernel's 8-byte branches."""
    monkeypatch.setattr(_convert, "index_dtype_for", lambda n: "int64")
    graph, _ = make_graph(num_nodes=600, num_edges=5000, num_relations=3, feature_dim=0, duplicates=100)
    c, ref, groups = convert_both_ways(graph, tmp_path, monkeypatch, num_partitions=4, partitioner="random")
    assert groups > 0
    assert '"int64"' in json.dumps(json.loads(c["edges/src/zarr.json"]))
    assert_same(c, ref)


@pytest.mark.parametrize("path", ["c", "numpy"])
def test_staged_edges_are_removed_before_the_store_is_written(tmp_path, monkeypatch, path):
    """A conversion drops its staged endpoints once they are grouped: at 2**31 stored edges
    they are 16 GB that need not sit beside the grouped copy and the growing store."""
    graph, _ = make_graph(seed=3, num_nodes=700, num_edges=6000, num_relations=4, duplicates=100)
    seen = []
    if path == "c":
        sort_group = native.sort_group

        def sorting(fd, grouped_path, *args, **kwargs):
            seen.append(sorted(f.name for f in Path(grouped_path).parent.rglob("edges_*")))
            return sort_group(fd, grouped_path, *args, **kwargs)

        monkeypatch.setattr(native, "sort_group", sorting)
    else:
        monkeypatch.setattr(native, "library", lambda: None)
        sort_groups = _buckets._sort_groups_into_store

        def sorting(layout, scratch, *args, **kwargs):
            work = Path(next(iter(scratch.values())).path).parent
            seen.append(sorted(f.name for f in work.rglob("edges_*")))
            return sort_groups(layout, scratch, *args, **kwargs)

        monkeypatch.setattr(_buckets, "_sort_groups_into_store", sorting)
    convert(graph, tmp_path / "s.gs", ConvertOptions(num_partitions=3, partitioner="random"))
    assert seen and all(names == [] for names in seen), seen
    # and the store holds every edge: the same store as one converted without removal
    ref = tmp_path / "ref.gs"
    monkeypatch.setattr(_convert, "write_edges",
                        lambda *a, consume, **k: _buckets.write_edges(*a, consume=False, **k))
    convert(graph, ref, ConvertOptions(num_partitions=3, partitioner="random"))
    assert_same(store_files(tmp_path / "s.gs"), store_files(ref))


def test_a_key_past_64_bits_falls_back_to_numpy():
    class Layout:  # 1024 partitions of 2**20 nodes: 10 + 2 * 20 + 1 = 51 bits before relations
        p, partition_size, n = 1 << 10, 1 << 20, 1 << 30

    ids = np.zeros(4, dtype=np.int32)
    assert _buckets._key_fields(Layout, _staged(None), ids).key_bits == 51
    assert _buckets._key_fields(Layout, _staged((1 << 13) - 1), ids).key_bits == 64
    assert _buckets._key_fields(Layout, _staged(1 << 13), ids) is None  # 65 bits: numpy
    assert _buckets._key_fields(Layout, _staged(None), ids[::2]) is None  # not contiguous


def _staged(max_rel):
    from graphstore.layout._staging import StagedEdges

    return StagedEdges("s", "d", None if max_rel is None else "r", 0, 1, max_rel=max_rel)


def test_staged_endpoints_are_int32_when_ids_fit_and_read_back_as_int64(tmp_path):
    from graphstore.layout._staging import EdgeStager

    src, dst, rel = np.array([0, 5, 9]), np.array([9, 0, 5]), np.array([2, 0, 1])
    for num_nodes, suffix in [(10, "i32"), ((1 << 31) + 1, "i64")]:
        with EdgeStager(str(tmp_path / suffix), num_nodes=num_nodes, with_rel=True) as stager:
            stager.append(src, dst, rel)
            staged = stager.finish()
        assert staged.src_path.endswith(suffix) and staged.rel_path.endswith("i64")
        assert os.path.getsize(staged.src_path) == 3 * staged.id_bytes and staged.max_rel == 2
        (_, s, d, r), = staged.iter_chunks(10)
        assert s.dtype == d.dtype == r.dtype == np.int64
        np.testing.assert_array_equal(np.stack([s, d, r]), np.stack([src, dst, rel]))


# ------------------------------------------------------------ the kernel's pieces alone


def random_group(rng, m, *, size, p, first, num_relations, added_share):
    s = rng.integers(0, p * size, m)
    d = rng.integers(first, first + size, m)
    # Repeats and exact copies with the other bit, so every merge count is exercised.
    repeat = rng.random(m) < 0.3
    src_of = rng.integers(0, m, m)
    s[repeat], d[repeat] = s[src_of[repeat]], d[src_of[repeat]]
    r = rng.integers(0, num_relations, m) if num_relations else None
    if r is not None:
        r[repeat] = r[src_of[repeat]]
    added = rng.random(m) < added_share
    return s, d, r, added


@pytest.mark.parametrize(("size", "p", "num_relations", "keep_duplicates"),
                         [(10, 4, 0, False), (10, 4, 0, True), (3000, 33, 0, False), (1 << 18, 3, 9, False),
                          (1000, 100, 300, True), (1, 50, 0, False)])
def test_sort_group_matches_numpy(tmp_path, size, p, num_relations, keep_duplicates):
    rng = np.random.default_rng(size + p)
    n = p * size
    b = (size - 1).bit_length()
    rel_bits = (num_relations - 1).bit_length() if num_relations else 0
    key_bits = (p - 1).bit_length() + 2 * b + rel_bits + 1
    for j, m in [(0, 1), (p - 1, 5000), (p // 2, 40000)]:
        first = j * size
        s, d, r, added = random_group(rng, m, size=size, p=p, first=first, num_relations=num_relations,
                                      added_share=0.4)
        keys = ((s // size).astype(np.uint64) << np.uint64(2 * b + rel_bits + 1)
                | (d - first).astype(np.uint64) << np.uint64(b + rel_bits + 1)
                | (s % size).astype(np.uint64) << np.uint64(rel_bits + 1)
                | (np.zeros(m, np.uint64) if r is None else r.astype(np.uint64) << np.uint64(1))
                | added.astype(np.uint64))
        path = tmp_path / f"group{j}.u64"
        offset = 3  # not at the file's start
        path.write_bytes(np.zeros(offset, np.uint64).tobytes() + keys.tobytes())
        in_degree = np.zeros(n, dtype=np.int64)
        out_degree = np.zeros(n, dtype=np.int64)
        fd = os.open(path, os.O_RDONLY)
        try:
            got_s, got_d, got_r, buckets, merge = native.sort_group(
                fd, str(path), offset, m, key_bits=key_bits, size=size, first=first, b=b, rel_bits=rel_bits,
                with_rel=r is not None, keep_duplicates=keep_duplicates, idx=np.dtype(np.int32), p=p,
                in_degree=in_degree[first : first + size], out_degree=out_degree)
        finally:
            os.close(fd)
        want_s, want_d, want_r, want_merge = _buckets._sort_group(
            s.copy(), d.copy(), r, added, first=first, size=size, n=n, keep_duplicates=keep_duplicates)
        np.testing.assert_array_equal(got_s, want_s)
        np.testing.assert_array_equal(got_d, want_d)
        if r is not None:
            np.testing.assert_array_equal(got_r, want_r)
        np.testing.assert_array_equal(merge, want_merge)
        np.testing.assert_array_equal(buckets, np.bincount(want_s // size, minlength=p))
        np.testing.assert_array_equal(in_degree, np.bincount(want_d, minlength=n))
        np.testing.assert_array_equal(out_degree, np.bincount(want_s, minlength=n))


@pytest.mark.parametrize("staged_bytes", [4, 8])
def test_pack_chunk_groups_by_destination_partition(tmp_path, staged_bytes):
    rng = np.random.default_rng(5)
    n, size, p, m, start = 5000, 700, 8, 200_000, 1000  # more than one BLOCK of reads
    store_id = rng.permutation(n).astype(np.int32)
    src, dst = rng.integers(0, n, start + m), rng.integers(0, n, start + m)
    rel = rng.integers(0, 6, start + m)
    runs = np.array([[0, 500], [1200, 70_000], [150_000, 150_001], [190_000, 400_000]], dtype=np.int64)
    paths = {}
    ids = np.int32 if staged_bytes == 4 else np.int64
    for name, values, dtype in [("src", src, ids), ("dst", dst, ids), ("rel", rel, np.int64)]:
        paths[name] = tmp_path / f"{name}.bin"
        paths[name].write_bytes(values.astype(dtype).tobytes())
    fds = [os.open(paths[k], os.O_RDONLY) for k in ("src", "dst", "rel")]
    try:
        grouped, counts = native.pack_chunk(tuple(fds), {}, start, m, runs, store_id, staged_bytes=staged_bytes,
                                            size=size, p=p, b=10, rel_bits=3)
    finally:
        for fd in fds:
            os.close(fd)
    rows = np.arange(start, start + m)
    added = np.zeros(m, dtype=bool)
    for lo, hi in runs:
        added |= (rows >= lo) & (rows < hi)
    s, d, r = store_id[src[rows]].astype(np.int64), store_id[dst[rows]].astype(np.int64), rel[rows]
    want = ((s // size) << 24 | (d % size) << 14 | (s % size) << 4 | r << 1 | added).astype(np.uint64)
    order = np.argsort(d // size, kind="stable")
    np.testing.assert_array_equal(counts, np.bincount(d // size, minlength=p))
    np.testing.assert_array_equal(grouped, want[order])


def test_offsets_past_2_to_the_32_elements(tmp_path):
    """Cursors, file offsets and counts are 64-bit: a group written and read back 40 GB into
    a (sparse) file."""
    path = tmp_path / "grouped.u64"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        big = 5 << 30  # elements
        keys = np.array([9 << 1, 3 << 1 | 1, 3 << 1, 9 << 1], dtype=np.uint64)
        cursor = np.array([big], dtype=np.int64)
        native.write_groups(fd, str(path), keys, np.array([4], dtype=np.int64), cursor)
        assert cursor[0] == big + 4 and os.path.getsize(path) == (big + 4) * 8
        in_degree, out_degree = np.zeros(16, np.int64), np.zeros(16, np.int64)
        s, d, _, _, merge = native.sort_group(fd, str(path), big, 4, key_bits=9, size=16, first=0, b=4,
                                              rel_bits=0, with_rel=False, keep_duplicates=False,
                                              idx=np.dtype(np.int64), p=1, in_degree=in_degree,
                                              out_degree=out_degree)
        np.testing.assert_array_equal(s, [3, 9])
        np.testing.assert_array_equal(d, [0, 0])
        np.testing.assert_array_equal(merge, [1, 1, 1, 0])  # (3, given + added) present, (9) repeated
    finally:
        os.close(fd)


def test_a_short_group_names_the_file(tmp_path):
    path = tmp_path / "grouped.u64"
    path.write_bytes(np.arange(10, dtype=np.uint64).tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(EOFError, match="grouped.u64: short read"):
            native.sort_group(fd, str(path), 5, 10, key_bits=8, size=4, first=0, b=2, rel_bits=0, with_rel=False,
                              keep_duplicates=False, idx=np.dtype(np.int32), p=1,
                              in_degree=np.zeros(4, np.int64), out_degree=np.zeros(4, np.int64))
    finally:
        os.close(fd)


@pytest.mark.parametrize("stage", ["pack_chunk", "sort_group"])
def test_a_worker_error_reaches_the_caller_and_no_thread_outlives_it(tmp_path, monkeypatch, stage):
    import errno
    import threading

    real = getattr(native, stage)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.EIO, "injected", "grouped_keys.u64")
        return real(*args, **kwargs)

    graph, _ = make_graph(num_nodes=500, num_edges=4000, feature_dim=0)
    convert(graph, tmp_path / "warm.gs", ConvertOptions(num_partitions=8, partitioner="random"))  # zarr's threads
    monkeypatch.setattr(native, stage, failing)
    before = threading.active_count()
    with pytest.raises(OSError, match="injected"):
        convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=8, partitioner="random", chunk_edges=300))
    assert not (tmp_path / "g.gs").exists() and not list(tmp_path.glob(".g.gs.tmp-*"))
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("gs-edges")]
