"""The static cache's nodes are chosen once (`graphstore.buffer.cache`): by the rule the
store's hub group is written with, picked for a loader by `StaticCache.choose`, and handed
to the hierbatching policy as chosen (the plan carries them; nothing is re-chosen)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphstore
from graphstore.buffer import StaticCache, plan_epoch, static_cache_ids
from graphstore.errors import ConfigError, OutOfCoreWarning
from graphstore.layout import hub_ids
from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One graph with a hub group of 5 % of the nodes, and without one."""
    graph, _ = make_graph(num_nodes=200, num_edges=2000, directed=True)
    out = {}
    for fraction in (0.05, 0.0):
        path = tmp_path_factory.mktemp("cache") / "g.gs"
        convert(graph, path, ConvertOptions(num_partitions=5, partitioner="random", seed=3, hub_fraction=fraction))
        out[fraction] = graphstore.open(path)
    yield out
    for store in out.values():
        store.close()


def test_the_rule_is_the_hub_groups(stores):
    store = stores[0.05]
    degree = store.read_degree("total")
    np.testing.assert_array_equal(static_cache_ids(degree, 0.05), hub_ids(degree, 0.05))
    np.testing.assert_array_equal(store.hubs.ids, static_cache_ids(degree, 0.05))
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        static_cache_ids(degree, 1.5)
    with pytest.raises(ConfigError, match="1-d numeric"):
        static_cache_ids(degree.reshape(2, -1), 0.1)


def test_choose_picks_the_loaders_cache(stores):
    with_hubs, without = stores[0.05], stores[0.0]
    assert StaticCache.choose(with_hubs, 0.0) is None
    cache = StaticCache.choose(with_hubs, None)
    assert cache.fraction == 0.05 and cache.num_nodes == with_hubs.hubs.num_hubs
    assert StaticCache.choose(with_hubs, 0.05).num_nodes == cache.num_nodes
    with pytest.raises(ConfigError, match="graphstore hubs"):
        StaticCache.choose(with_hubs, 0.1)  # the group is for another fraction
    with pytest.raises(ConfigError, match="static_cache must be a fraction"):
        StaticCache.choose(with_hubs, 1.5)
    with pytest.warns(OutOfCoreWarning, match="no hubs/ group"):
        assert StaticCache.choose(without, None) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutOfCoreWarning)
        assert StaticCache.choose(without, None) is None  # said once per store


def test_hierbatching_carries_the_chosen_ids(stores):
    cache = StaticCache.open(stores[0.05])
    bare = plan_epoch("hierbatching", num_partitions=5, capacity=2, epoch=1, seed=7)
    for given in (cache, cache.ids, cache.ids.tolist()):
        plan = plan_epoch("hierbatching", num_partitions=5, capacity=2, epoch=1, seed=7, static_cache=given)
        assert plan.states == bare.states and plan.train_partitions == bare.train_partitions
        assert plan.static_cache.dtype == np.int64 and not plan.static_cache.flags.writeable
        np.testing.assert_array_equal(plan.static_cache, cache.ids)
    assert bare.static_cache is None
    assert plan.to_dict()["static_cache"] == cache.ids.tolist()
    for bad in ([3, 1], [1, 1], [-1, 2], [[1, 2]], [0.5]):
        with pytest.raises(ConfigError, match="static_cache"):
            plan_epoch("hierbatching", num_partitions=5, capacity=2, static_cache=bad)
