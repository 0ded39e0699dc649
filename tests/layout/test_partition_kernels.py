"""The stream partitioner's compiled kernels against its numpy path.

Each kernel (`graphstore.layout._native.partition`) must give what the numpy and scipy
code it replaces gives, bit for bit: the partitioner's labels, hence every store's
layout, must not depend on whether the library was built. Checked kernel by kernel on
random inputs built to provoke ties, duplicates, empty and very long rows, then on whole
partitionings.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse

from graphstore.layout import partition as part_mod
from graphstore.layout._native import partition as kernels
from tests.layout.test_partition_stream import community_graph, stage

# As the DENSE kernel's tests: without a C compiler the package installs without the
# library (setup.py's optional extension) and the partitioner runs its numpy path; under
# CI, which builds with a compiler, a missing library is a broken build and fails below.
pytestmark = pytest.mark.skipif(kernels.library() is None and not os.environ.get("CI"),
                                reason=f"partitioner kernels not built: {kernels.load_error()}")


def test_the_library_is_built_here():
    # Otherwise every comparison below would compare numpy with itself.
    assert kernels.load_error() is None


def random_piece(rng, *, rows: int, labels: int, f64: bool):
    """A CSR piece (indptr from 0) with repeated columns, empty rows and one long row."""
    degree = rng.integers(0, 12, rows)
    degree[rng.integers(0, rows)] = 300
    degree[rng.random(rows) < 0.1] = 0
    indptr = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(degree, out=indptr[1:])
    num_cols = 5 * rows
    indices = rng.integers(0, num_cols, int(indptr[-1])).astype(np.int32)
    # Small integer weights: sums tie often, as multiplicities do.
    data = rng.integers(1, 4, int(indptr[-1])).astype(np.float64 if f64 else np.float32)
    assign = rng.integers(0, labels, num_cols)
    return indptr, indices, data, assign, num_cols


def numpy_choose(indptr, indices, data, assign, own, salt, allowed_of):
    ptr, rows, targets, weights = part_mod._aggregate(indptr, indices, data, assign, int(assign.max()) + 1)
    return part_mod._choose(ptr, rows, targets, weights, own, allowed_of(rows, targets), salt)


@pytest.mark.parametrize("label_dtype", [np.int16, np.int32])
@pytest.mark.parametrize("f64", [False, True])
@pytest.mark.parametrize("test", ["none", "mask", "mask_unset", "scalar_cap", "array_cap", "row_flag"])
def test_choose_equals_aggregate_then_choose(label_dtype, f64, test):
    rng = np.random.default_rng([7, f64, len(test)])
    for trial in range(20):
        labels = int(rng.choice([3, 17, 1000]))
        indptr, indices, data, assign, _ = random_piece(rng, rows=int(rng.integers(1, 400)), labels=labels, f64=f64)
        assign = assign.astype(label_dtype)
        rows = indptr.shape[0] - 1
        own = rng.integers(0, labels, rows).astype(label_dtype)
        salt = int(rng.integers(2**32))
        mask = rng.random(labels) < 0.6
        load32 = rng.integers(0, 20, labels).astype(np.int32)
        load64 = load32.astype(np.int64)
        cap = rng.integers(10, 30, labels).astype(np.int64)
        row_weight = rng.integers(1, 8, rows).astype(np.int64)
        flag = rng.random(rows) < 0.5
        cases = {
            "none": ({}, lambda r, t: None),
            "mask": ({"mask": mask}, lambda r, t: mask[t].copy()),
            "mask_unset": ({"mask": mask, "mask_want": False}, lambda r, t: ~mask[t]),
            "scalar_cap": ({"load": load32, "cap": 21, "row_weight": row_weight},
                           lambda r, t: load64[t] + row_weight[r] <= 21),
            "array_cap": ({"load": load64, "cap": cap, "row_weight": row_weight},
                          lambda r, t: load64[t] + row_weight[r] <= cap[t]),
            "row_flag": ({"mask": mask, "row_flag": flag}, lambda r, t: flag[r] & mask[t]),
        }
        options, allowed_of = cases[test]
        got = kernels.choose(indptr, indices, data, assign, own, salt, **options)
        want = numpy_choose(indptr, indices, data, assign, own, salt, allowed_of)
        for g, w, name in zip(got, want, ("own_weight", "best", "best_weight"), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{name}, trial {trial}")
            assert g.dtype == w.dtype, name
    # The comparison is not vacuous: some rows chose, some could not.
    assert (got[1] >= 0).any() and (got[1] == -1).any()


@pytest.mark.parametrize("f64", [False, True])
def test_contract_gives_the_numpy_entries(f64):
    rng = np.random.default_rng(11)
    for _ in range(20):
        indptr, indices, data, _, num_cols = random_piece(rng, rows=int(rng.integers(1, 300)), labels=1, f64=f64)
        num_clusters = int(rng.integers(1, 60))
        cluster = rng.integers(0, num_clusters, num_cols).astype(np.int32)
        first = int(rng.integers(0, num_cols - indptr.shape[0] + 2))
        rows, targets, weights = kernels.contract(indptr, indices, data, cluster, first)
        _, r, t, w = part_mod._aggregate(indptr, indices, data, cluster, num_clusters)
        r = cluster[first + r]
        keep = r != t
        want = np.stack([r[keep], t[keep], w[keep].astype(np.float64)])
        got = np.stack([rows, targets, weights])
        # The kernel's order is its own (the level builder sorts): compare sorted entries.
        np.testing.assert_array_equal(got[:, np.lexsort(got[:2])], want[:, np.lexsort(want[:2])])
        assert weights.dtype == np.float64 and rows.dtype == targets.dtype == np.int32


@pytest.mark.parametrize("weight_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64])
def test_csr_merges_as_scipy_does(weight_dtype, out_dtype):
    rng = np.random.default_rng(3)
    for trial in range(40):
        rows, cols, num_rows, num_cols = random_entries(rng, trial)
        weights = rng.integers(1, 5, rows.shape[0]).astype(weight_dtype)
        indptr, indices, data = kernels.csr(rows, cols, weights, num_rows, np.dtype(out_dtype))
        want = scipy.sparse.coo_matrix((weights.astype(out_dtype), (rows, cols)), shape=(num_rows, num_cols)).tocsr()
        np.testing.assert_array_equal(indptr, want.indptr)
        # Each row's columns are distinct but in first-arrival order: scipy's are ascending.
        got = scipy.sparse.csr_matrix((data, indices, indptr), shape=(num_rows, num_cols))
        assert indices.shape == want.indices.shape
        for r in range(num_rows):
            row = slice(indptr[r], indptr[r + 1])
            assert np.unique(indices[row]).shape[0] == indices[row].shape[0], f"row {r} repeats a column"
            first_seen = cols[rows == r][np.sort(np.unique(cols[rows == r], return_index=True)[1])]
            np.testing.assert_array_equal(indices[row], first_seen)
        got.sort_indices()
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
        assert data.dtype == out_dtype and indptr.dtype == indices.dtype == np.int32


def test_csr_without_weights_groups_the_entries_as_they_came():
    # The input level: rows grouped by a stable counting sort, duplicates kept, no data.
    rng = np.random.default_rng(4)
    for trial in range(40):
        rows, cols, num_rows, _ = random_entries(rng, trial)
        indptr, indices, data = kernels.csr(rows, cols, None, num_rows, np.dtype(np.float64))
        assert data is None
        order = np.argsort(rows, kind="stable")
        np.testing.assert_array_equal(indices, cols[order])
        np.testing.assert_array_equal(indptr, np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=num_rows))]))
        assert indptr.dtype == indices.dtype == np.int32


@pytest.mark.parametrize("weighted", [False, True])
def test_csr_reads_a_blocks_pairs_in_place(weighted):
    # A block's scratch file holds (column, row) int32 pairs: its two columns are passed
    # as strided views and must give what contiguous copies give.
    rng = np.random.default_rng(6)
    for trial in range(10):
        rows, cols, num_rows, _ = random_entries(rng, trial)
        pair = np.stack([cols, rows], axis=1)
        weights = rng.integers(1, 5, rows.shape[0]).astype(np.float64) if weighted else None
        strided = kernels.csr(pair[:, 1], pair[:, 0], weights, num_rows, np.dtype(np.float64))
        copied = kernels.csr(rows.copy(), cols.copy(), weights, num_rows, np.dtype(np.float64))
        for got, want in zip(strided, copied, strict=True):
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want)


def random_entries(rng, trial):
    """(rows, cols, num_rows, num_cols) int32 entries with duplicates, empty rows, one long row."""
    num_rows, num_cols = int(rng.integers(1, 200)), int(rng.integers(1, 300))
    m = int(rng.integers(0, 4000))
    if trial % 5 == 0:
        num_cols = 2  # nearly every entry a duplicate
    rows = rng.integers(0, num_rows, m).astype(np.int32)
    if trial % 7 == 0:
        rows[:] = num_rows - 1  # one long row, the rest empty
    cols = rng.integers(0, num_cols, m).astype(np.int32)
    return rows, cols, num_rows, num_cols


def test_level_zero_entries_are_the_numpy_builders_per_block(tmp_path):
    rng = np.random.default_rng(5)
    num_nodes, m = 5_000, 40_000
    src, dst = rng.integers(0, num_nodes, m), rng.integers(0, num_nodes, m)
    src[:100] = dst[:100]  # self loops are dropped
    order = rng.permutation(num_nodes).astype(np.int32)
    builder = part_mod._LevelBuilder(num_nodes, 2 * m, 1 << 16, str(tmp_path), "t", weighted=False)
    assert not builder.in_memory and len(builder.bounds) > 3
    counts, pairs = kernels.level_zero(src, dst, order, builder.rows_per_block, len(builder.bounds) - 1)
    keep = src != dst
    a, b = order[src[keep]], order[dst[keep]]
    want_counts, want_pairs, _ = builder.prepare(np.concatenate([a, b]), np.concatenate([b, a]), None)
    np.testing.assert_array_equal(counts, want_counts)
    assert pairs.shape == want_pairs.shape == (2 * int(keep.sum()), 2)
    # Within a block the order is the kernel's own (the block's CSR sorts): compare sorted.
    ends = np.cumsum(counts)
    for lo, hi in zip(ends - counts, ends, strict=True):
        got, want = pairs[lo:hi], want_pairs[lo:hi]
        np.testing.assert_array_equal(got[np.lexsort(got.T)], want[np.lexsort(want.T)])


@pytest.mark.parametrize("on_disk", [False, True])
@pytest.mark.parametrize("threads", [1, 3])
def test_partitions_are_the_same_with_and_without_the_kernels(tmp_path, monkeypatch, on_disk, threads):
    num_nodes = 20_000
    src, dst = community_graph(num_nodes, seed=9)
    edges = stage(tmp_path, num_nodes, src, dst)
    options = {}
    if on_disk:  # every level through row-block files, many blocks
        monkeypatch.setattr(part_mod, "_STREAM_BLOCK_ENTRIES", 20_000)
        monkeypatch.setattr(part_mod, "_STREAM_MIN_BLOCK_BYTES", 4 << 20)
        options["partition_memory_bytes"] = part_mod._STREAM_NODE_BYTES * num_nodes + part_mod._STREAM_MIN_BLOCK_BYTES
    monkeypatch.setattr(part_mod, "_stream_threads", lambda: threads)
    results = {}
    for compiled in (True, False):
        monkeypatch.setattr(part_mod, "_USE_COMPILED", compiled)
        results[compiled] = partition_nodes_stream(edges, **options)
    c, numpy_ = results[True], results[False]
    assert c.info["kernels"] == "c" and numpy_.info["kernels"] == "numpy"
    assert (c.info["blocks"] > 8) == on_disk
    np.testing.assert_array_equal(c.labels, numpy_.labels)
    for key in ("levels", "cluster_moves", "refinement_moves", "coarse_refinement_moves", "rebalanced_nodes"):
        assert c.info[key] == numpy_.info[key], key


def partition_nodes_stream(edges, **options):
    return part_mod.partition_nodes("stream", edges=edges, num_partitions=16, seed=2, **options)


def test_choose_breaks_an_exact_tie_by_the_smaller_label():
    # Two labels whose salted hashes share their top 16 bits score exactly alike at equal
    # weight: numpy takes the first in ascending order, and so must the kernel.
    salt = 12345
    candidates = np.arange(1, 1 << 18, dtype=np.int64)
    key = (((candidates.astype(np.uint32) ^ np.uint32(salt)) * np.uint32(0x9E3779B1)) >> np.uint32(16))
    order = np.argsort(key, kind="stable")
    same = np.flatnonzero(key[order][1:] == key[order][:-1])
    low, high = sorted(candidates[order][[same[0], same[0] + 1]].tolist())
    # Row 0 sees both labels with weight 2 (high listed first), its own label 0 with 1.
    indices = np.array([0, 1, 2, 3, 4], dtype=np.int32)
    assign = np.array([high, high, low, low, 0], dtype=np.int32)
    indptr = np.array([0, 5], dtype=np.int32)
    data = np.ones(5, dtype=np.float32)
    own = np.zeros(1, dtype=np.int32)
    got = kernels.choose(indptr, indices, data, assign, own, salt)
    want = numpy_choose(indptr, indices, data, assign, own, salt, lambda r, t: None)
    assert want[1][0] == low and want[2][0] == 2.0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
