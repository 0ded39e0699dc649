"""The resident graph equals the subgraph its nodes induce, computed directly from the whole
graph in memory; features, labels and id maps line up."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.buffer import StaticCache, static_cache_ids
from graphstore.buffer.resident import build_resident_graph, read_hub_segment
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from tests.buffer.helpers import canonical, induced_edges
from tests.conftest import make_graph

P = 7  # partitions


FRACTIONS = (0.0, 0.05, 0.3)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same graph, with hub groups for each of ``FRACTIONS`` (0: none)."""
    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    out = {}
    for fraction in FRACTIONS:
        path = tmp_path_factory.mktemp("r") / "g.gs"
        convert(graph, path, ConvertOptions(num_partitions=P, partitioner="random", seed=2, hub_fraction=fraction))
        out[fraction] = graphstore.open(path)
    return out


@pytest.fixture(scope="module")
def store(stores):
    return stores[0.05]


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
@given(st.lists(st.integers(0, P - 1), min_size=0, max_size=P, unique=True), st.sampled_from(FRACTIONS))
def test_with_a_static_cache_it_is_the_subgraph_induced_with_the_cache(stores, partitions, fraction):
    """HierBatching: resident partitions plus the top-degree nodes, their rows, and the
    edges the two induce (read from the hub segments of the resident partitions)."""
    store = stores[fraction]
    ids = static_cache_ids(store.read_degree("in") + store.read_degree("out"), fraction)
    cache = StaticCache.open(store, fraction) if fraction else None
    g = build_resident_graph(store, partitions, static_cache=cache)
    nodes, edges, features, labels = canonical(g)
    resident = np.concatenate([[]] + [np.arange(*store.partition_range(k)) for k in partitions])
    expected_nodes = np.union1d(resident, ids)
    np.testing.assert_array_equal(nodes, expected_nodes)
    assert edges == induced_edges(store, expected_nodes)
    np.testing.assert_array_equal(features, store.features[...][nodes])
    np.testing.assert_array_equal(labels, store.labels[...][nodes])


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_the_hub_group_holds_each_hub_edge_once_by_segment(stores, fraction):
    store = stores[fraction]
    hubs = store.hubs
    degree = store.read_degree("in") + store.read_degree("out")
    np.testing.assert_array_equal(hubs.ids, static_cache_ids(degree, fraction))
    src = store.array("edges/src")[...].astype(np.int64)
    dst = store.array("edges/dst")[...].astype(np.int64)
    rel = store.array("edges/rel")[...]
    is_hub = np.zeros(store.num_nodes, bool)
    is_hub[hubs.ids] = True
    touch = is_hub[src] | is_hub[dst]
    got = []
    for g in range(P + 1):
        s, d, r = read_hub_segment(store, g)
        s, d = s.astype(np.int64), d.astype(np.int64)
        if g < P:  # one hub end; the other end is a non-hub node of partition g
            other = np.where(is_hub[s], d, s)
            assert (is_hub[s] ^ is_hub[d]).all() and (other // store.partition_size == g).all()
        else:
            assert (is_hub[s] & is_hub[d]).all()
        # Ordered by (the destination is a hub, destination, source): already sorted so.
        np.testing.assert_array_equal(np.lexsort((s, d, is_hub[d])), np.arange(s.size))
        got += list(zip(s.tolist(), d.tolist(), r.tolist()))
    assert sorted(got) == sorted(zip(src[touch].tolist(), dst[touch].tolist(), rel[touch].tolist()))
    np.testing.assert_array_equal(store.array("hubs/features")[...], store.features[...][hubs.ids])
    np.testing.assert_array_equal(store.array("hubs/labels")[...], store.labels[...][hubs.ids])


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_the_hub_group_is_the_same_with_and_without_its_kernel(stores, fraction, tmp_path, monkeypatch):
    # The edge passes run in C where the library is built (`hub_segments`); the numpy path
    # must write the same group, byte for byte.
    from graphstore.layout import _hubs
    from graphstore.layout._native import edges as kernels

    if kernels.library() is None and not os.environ.get("CI"):
        pytest.skip(f"edge kernels not built: {kernels.load_error()}")
    store = stores[fraction]
    monkeypatch.setattr(_hubs, "_STEP_ROWS", 300)  # several chunks a pass, relations too
    built = {}
    for compiled in (True, False):
        monkeypatch.setattr(_hubs, "_USE_COMPILED", compiled)
        copy = tmp_path / f"compiled_{compiled}.gs"
        shutil.copytree(store.path, copy)
        _hubs.write_hubs(copy, fraction=fraction, num_nodes=store.num_nodes, num_partitions=P,
                         partition_size=store.partition_size)
        built[compiled] = {name: zarr.open_array(str(copy / "hubs" / name), mode="r")[...]
                           for name in ("offsets", "ids", "edges/src", "edges/dst", "edges/rel")}
    assert store.num_edges > 2 * 300 and built[True]["edges/src"].shape[0] > 0  # several chunks, hub edges
    for name, want in built[False].items():
        np.testing.assert_array_equal(built[True][name], want, err_msg=name)
        assert built[True][name].dtype == want.dtype, name


def test_a_store_without_hubs_names_the_command(stores):
    assert stores[0.0].hubs is None
    with pytest.raises(ConfigError, match="graphstore hubs"):
        StaticCache.open(stores[0.0])


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
