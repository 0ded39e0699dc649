"""The compiled CSC builder against the numpy assembly it replaces, and resident graphs
assembled either way."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore.buffer.resident as resident
from graphstore.buffer import _native as native
from graphstore.buffer.cache import StaticCache
from graphstore.buffer.resident import _build_csc_numpy, build_resident_graph
from tests.buffer.helpers import assert_same_graph


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if native.library() is None:
        if os.environ.get("CI"):
            pytest.fail(f"the CSC builder must be built under CI: {native.load_error()}")
        pytest.skip(f"the compiled CSC builder is not built here: {native.load_error()}")


@st.composite
def edge_parts(draw):
    num_nodes = draw(st.integers(1, 40))
    with_rel = draw(st.booleans())
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        n = draw(st.integers(0, 30))
        src_shift, dst_shift = draw(st.integers(-5, 5)), draw(st.integers(-5, 5))
        src_type, dst_type = draw(st.sampled_from([np.int32, np.int64])), draw(st.sampled_from([np.int32, np.int64]))
        src = np.array(draw(st.lists(st.integers(0, num_nodes - 1), min_size=n, max_size=n)), np.int64)
        dst = np.array(draw(st.lists(st.integers(0, num_nodes - 1), min_size=n, max_size=n)), np.int64)
        rel = np.array(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), np.int32) if with_rel else None
        # Stored ids are local ids minus the shift (as a bucket's store ids are).
        parts.append(((src - src_shift).astype(src_type), src_shift, (dst - dst_shift).astype(dst_type), dst_shift,
                      rel))
    return parts, num_nodes, with_rel


@settings(max_examples=200, deadline=None)
@given(edge_parts())
def test_the_kernel_equals_a_stable_sort_by_destination(case):
    parts, num_nodes, with_rel = case
    got = native.build_csc(parts, num_nodes, with_rel=with_rel)
    want = _build_csc_numpy(parts, num_nodes, with_rel=with_rel)
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None
        else:
            assert a.dtype == np.int64 and np.array_equal(a, b)


@pytest.mark.parametrize("bad", [-1, 7])
def test_an_id_outside_the_graph_is_refused(bad):
    src, dst = np.array([0, 1, 2], np.int32), np.array([1, bad, 0], np.int32)
    with pytest.raises(ValueError, match=r"outside \[0, 7\)"):
        native.build_csc([(src, 0, dst, 0, None)], 7, with_rel=False)
    with pytest.raises(ValueError, match="relations missing"):
        native.build_csc([(src, 0, src, 0, None)], 7, with_rel=True)


def test_resident_graphs_are_the_same_with_and_without_the_kernel(monkeypatch, tmp_path):
    import graphstore
    from graphstore.layout._convert import ConvertOptions, convert
    from tests.conftest import make_graph

    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    path = tmp_path / "g.gs"
    convert(graph, path, ConvertOptions(num_partitions=6, partitioner="random", seed=2, hub_fraction=0.05))
    store = graphstore.open(path)
    cache = StaticCache.open(store, 0.05)
    for parts in ([0, 3, 5], [4, 1], list(range(6))):
        fast = build_resident_graph(store, parts, static_cache=cache)
        with monkeypatch.context() as m:
            m.setattr(resident.native, "library", lambda: None)
            slow = build_resident_graph(store, parts, static_cache=cache)
        assert fast.num_edges == slow.num_edges > 0
        assert_same_graph(fast, slow)
        assert torch.equal(fast.indptr, slow.indptr) and torch.equal(fast.indices, slow.indices)
        assert torch.equal(fast.rel, slow.rel)
