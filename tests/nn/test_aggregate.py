"""BatchGNN's aggregation cache as a weightless layer: mean, sum and GCN propagation of the
input features equal a dense-matrix reference, its partial form equals its one-shot form for
any split of the edges in any order, and `infer_layerwise` computes it over a store out of
core exactly (the aggregate of every node, all neighbours, global degrees)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.inference import infer_layerwise
from graphstore.nn.aggregate import AggregationModel, FeatureAggregate
from tests.nn.test_partial import NUM_NODES, full_graph, partial

REPO = Path(__file__).resolve().parents[2]


def dense_reference(op: str, x: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The aggregate by a dense adjacency matrix (float64): A[v, u] = edges u -> v."""
    n = x.shape[0]
    A = np.zeros((n, n))
    np.add.at(A, (dst, src), 1.0)
    deg = A.sum(axis=1)
    if op == "sum":
        return A @ x
    if op == "mean":
        return (A @ x) / np.maximum(deg, 1)[:, None]
    norm = 1.0 / np.sqrt(deg + 1.0)
    return norm[:, None] * ((A + np.eye(n)) @ (norm[:, None] * x))


@pytest.mark.parametrize("op", ["mean", "sum", "gcn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_shot_and_pieces_equal_the_dense_reference(op, seed):
    view, src, dst, rel, counts = full_graph(seed)
    x = torch.randn(NUM_NODES, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    layer = FeatureAggregate(op, 6)
    want = dense_reference(op, x.numpy(), src.numpy(), dst.numpy())
    one = layer(x, view, counts if op == "gcn" else None)
    pieces = partial(layer, x, src, dst, rel, counts, num_blocks=4, seed=seed)
    np.testing.assert_allclose(one.numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pieces.numpy(), want, rtol=0, atol=1e-12)
    assert not list(layer.parameters())  # nothing to learn


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="mean, sum, gcn"):
        FeatureAggregate("max", 4)
    view, *_ = full_graph(0)
    with pytest.raises(ConfigError, match="degrees"):
        FeatureAggregate("gcn", 4)(torch.zeros(NUM_NODES, 4), view)


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=7, partitioner="metis")
    with graphstore.open(out) as store:
        yield store


@pytest.mark.parametrize("op", ["mean", "sum", "gcn"])
def test_the_walk_over_a_store_computes_every_nodes_aggregate(cora, op):
    p = cora.num_partitions
    buckets = [cora.read_bucket(i, j) for j in range(p) for i in range(p)]
    src = np.concatenate([b[0] for b in buckets]).astype(np.int64)
    dst = np.concatenate([b[1] for b in buckets]).astype(np.int64)
    x = np.asarray(cora.features[...], dtype=np.float64)
    want = dense_reference(op, x, src, dst)
    assert np.array_equal(np.bincount(dst, minlength=cora.num_nodes), cora.read_degree("in"))
    for capacity in (2, 7):
        got = infer_layerwise(AggregationModel(op, cora.feature_dim), cora, capacity=capacity)
        assert got.shape == x.shape
        assert float(np.abs(got - want).max()) < 1e-5, (op, capacity)
