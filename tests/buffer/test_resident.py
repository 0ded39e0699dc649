"""The resident graph equals the subgraph its nodes induce, computed directly from the whole
graph in memory; features, labels and id maps line up."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.buffer import StaticCache, static_cache_ids
from graphstore.buffer.resident import build_resident_graph
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from tests.buffer.helpers import canonical, induced_edges
from tests.conftest import make_graph

P = 7  # partitions


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    path = tmp_path_factory.mktemp("r") / "g.gs"
    convert(graph, path, ConvertOptions(num_partitions=P, partitioner="random", seed=2))
    return graphstore.open(path)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, P - 1), min_size=0, max_size=P, unique=True))
def test_resident_graph_is_the_induced_subgraph(store, partitions):
    g = build_resident_graph(store, partitions)
    nodes, edges, features, labels = canonical(g)
    expected_nodes = np.sort(np.concatenate([[]] + [np.arange(*store.partition_range(k)) for k in partitions]))
    np.testing.assert_array_equal(nodes, expected_nodes)
    assert edges == induced_edges(store, nodes)
    # Within each destination, bucket edges come in ascending source store id, whatever
    # the slots (samplers draw positions in these lists).
    for v in range(g.num_nodes):
        seg = g.node_ids[g.indices[g.indptr[v] : g.indptr[v + 1]]]
        assert bool((seg[1:] >= seg[:-1]).all())
    np.testing.assert_array_equal(features, store.features[...][nodes])
    np.testing.assert_array_equal(labels, store.labels[...][nodes])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, P - 1), min_size=0, max_size=P, unique=True), st.sampled_from([0.0, 0.05, 0.3]))
def test_with_a_static_cache_it_is_the_subgraph_induced_with_the_cache(store, partitions, fraction):
    """HierBatching: resident partitions plus the top-degree nodes, their rows and edges."""
    ids = static_cache_ids(store.read_degree("in") + store.read_degree("out"), fraction)
    cache = StaticCache.load(store, ids)
    g = build_resident_graph(store, partitions, static_cache=cache)
    nodes, edges, features, labels = canonical(g)
    resident = np.concatenate([[]] + [np.arange(*store.partition_range(k)) for k in partitions])
    expected_nodes = np.union1d(resident, ids)
    np.testing.assert_array_equal(nodes, expected_nodes)
    assert edges == induced_edges(store, expected_nodes)
    np.testing.assert_array_equal(features, store.features[...][nodes])
    np.testing.assert_array_equal(labels, store.labels[...][nodes])


def test_static_cache_holds_the_edges_of_its_nodes(store):
    degree = store.read_degree("in") + store.read_degree("out")
    ids = static_cache_ids(degree, 0.1)
    cache = StaticCache.load(store, ids)
    src = store.array("edges/src")[...].astype(np.int64)
    dst = store.array("edges/dst")[...].astype(np.int64)
    touch = np.isin(src, ids) | np.isin(dst, ids)
    assert sorted(zip(cache.src.tolist(), cache.dst.tolist())) == sorted(zip(src[touch].tolist(), dst[touch].tolist()))
    np.testing.assert_array_equal(cache.features, store.features[...][ids])
    assert cache.bytes_read > 0
    with pytest.raises(ConfigError, match="static cache ids"):
        StaticCache.load(store, [store.num_nodes])


def test_id_maps(store):
    g = build_resident_graph(store, [5, 1, 3])
    assert g.slots == (0, 1, 2)
    valid = torch.nonzero(g.node_ids >= 0).flatten()
    assert torch.equal(g.to_local(g.node_ids[valid]), valid)
    absent = torch.arange(*store.partition_range(0))
    assert bool((g.to_local(absent) == -1).all())
    start, stop = store.partition_range(5)
    assert g.local_range(5) == (0, stop - start) and g.local_range(1) == (store.partition_size, 2 * store.partition_size)
    assert torch.equal(g.node_ids[slice(*g.local_range(5))], torch.arange(start, stop))
    with pytest.raises(ConfigError, match="partition 0 is not resident"):
        g.local_range(0)
    with pytest.raises(ConfigError, match="store ids must be in"):
        g.to_local(torch.tensor([store.num_partitions * store.partition_size]))


def test_bad_partitions(store):
    with pytest.raises(ConfigError, match="distinct"):
        build_resident_graph(store, [1, 1])
    with pytest.raises(ConfigError, match=r"partition_id must be in \[0, 7\) \(got 9\)"):
        build_resident_graph(store, [9])
