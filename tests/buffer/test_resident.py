"""The resident graph equals the subgraph its nodes induce, computed directly from the whole
graph in memory; features, labels and id maps line up."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.buffer.resident import build_resident_graph
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import make_graph

P = 7  # partitions


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    path = tmp_path_factory.mktemp("r") / "g.gs"
    convert(graph, path, ConvertOptions(num_partitions=P, partitioner="random", seed=2))
    return graphstore.open(path)


def induced_edges(store, resident_nodes):
    src = store.array("edges/src")[...].astype(np.int64)
    dst = store.array("edges/dst")[...].astype(np.int64)
    rel = store.array("edges/rel")[...].astype(np.int64)
    keep = np.isin(src, resident_nodes) & np.isin(dst, resident_nodes)
    return sorted(zip(src[keep].tolist(), dst[keep].tolist(), rel[keep].tolist()))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, P - 1), min_size=0, max_size=P, unique=True))
def test_resident_graph_is_the_induced_subgraph(store, partitions):
    g = build_resident_graph(store, partitions)
    node_ids = g.node_ids.numpy()
    expected_nodes = np.concatenate([[]] + [np.arange(*store.partition_range(k)) for k in partitions])
    np.testing.assert_array_equal(node_ids, expected_nodes)
    # CSC back to (src, dst) in store ids.
    dst_local = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr.numpy()))
    got = sorted(zip(node_ids[g.indices.numpy()].tolist(), node_ids[dst_local].tolist(), g.rel.numpy().tolist()))
    assert got == induced_edges(store, node_ids)
    # Within each destination, sources ascend (local order follows the state's partition order).
    for v in range(g.num_nodes):
        seg = g.indices[g.indptr[v] : g.indptr[v + 1]]
        assert bool((seg[1:] >= seg[:-1]).all())
    np.testing.assert_array_equal(g.features.numpy(), store.features[...][node_ids])
    np.testing.assert_array_equal(g.labels.numpy(), store.labels[...][node_ids])


def test_id_maps(store):
    g = build_resident_graph(store, [5, 1, 3])
    local = g.to_local(g.node_ids)
    assert torch.equal(local, torch.arange(g.num_nodes))
    absent = torch.arange(*store.partition_range(0))
    assert bool((g.to_local(absent) == -1).all())
    assert g.local_start.tolist()[:2] == [0, store.partition_range(5)[1] - store.partition_range(5)[0]]
    with pytest.raises(ConfigError, match="store ids must be in"):
        g.to_local(torch.tensor([store.num_partitions * store.partition_size]))


def test_bad_partitions(store):
    with pytest.raises(ConfigError, match="distinct"):
        build_resident_graph(store, [1, 1])
    with pytest.raises(ConfigError, match=r"partition_id must be in \[0, 7\) \(got 9\)"):
        build_resident_graph(store, [9])
