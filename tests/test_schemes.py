"""Every registered scheme keeps the loader invariants (`graphstore.testing.schemes`), and a
scheme added by a registration alone is checked the same way."""

from __future__ import annotations

import math

import pytest

import graphstore
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.loaders import SCHEMES, NodeLoader, Scheme
from graphstore.testing.schemes import check_link_scheme, check_node_scheme
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=300, num_edges=2000, directed=True, num_relations=2)
    out = tmp_path_factory.mktemp("schemes") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=6, partitioner="random", seed=1))
    with graphstore.open(out) as s:
        yield s


@pytest.mark.parametrize("name", SCHEMES.names(lambda s: "node" in s.tasks))
def test_node_schemes_keep_the_invariants(store, name):
    options = {"micro_batches": 2} if SCHEMES.get(name).split_batches else {}
    check_node_scheme(store, name, **options)


@pytest.mark.parametrize("name", SCHEMES.names(lambda s: "link" in s.tasks))
def test_link_schemes_keep_the_invariants(store, name):
    check_link_scheme(store, name)


def _register(name: str, **fields) -> None:
    defaults = dict(tasks=("node",), summary="a test's toy scheme", policy=lambda task, p, c, parts: "dispersed",
                    capacity=lambda p: max(2, math.ceil(p / 3)))
    SCHEMES.register(name, Scheme(name=name, **{**defaults, **fields}))


def test_a_toy_scheme_is_one_registration_and_is_checked(store):
    _register("thirds")
    try:
        loader = NodeLoader(store, fanouts=(2,), batch_size=16, scheme="thirds")
        assert loader.capacity == 2 and loader.policy == "dispersed"
        check_node_scheme(store, "thirds")
    finally:
        SCHEMES.unregister("thirds")
    assert "thirds" not in SCHEMES


def test_a_broken_toy_scheme_is_caught(store):
    _register("never", reuse=0)  # passes = reuse x plan passes = 0: no target ever trains
    try:
        with pytest.raises(AssertionError, match=r"scheme 'never': epoch 0: training target \d+ never trained"):
            check_node_scheme(store, "never")
    finally:
        SCHEMES.unregister("never")


def test_settings_round_trip_and_reject_bad_fields(store):
    from graphstore.errors import ConfigError
    from graphstore.loaders import NodeLoaderSettings

    loader = NodeLoader(store, fanouts=(2,), batch_size=16, scheme="microbatch", micro_batches=3)
    record = loader.settings.to_dict()
    assert record["micro_batches"] == 3 and record["fanouts"] == [2]
    assert NodeLoaderSettings.from_dict(record) == loader.settings
    with pytest.raises(ConfigError, match="run.json: unknown field 'colour'"):
        NodeLoaderSettings.from_dict({**record, "colour": 1}, source="run.json")
    with pytest.raises(ConfigError, match="capacity must be an int"):
        NodeLoaderSettings.from_dict({**record, "capacity": "4"})
    plain = NodeLoader(store, fanouts=(2,), batch_size=16).settings.to_dict()
    assert "micro_batches" not in plain  # records of runs without it keep their old fields
