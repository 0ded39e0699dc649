"""The step-memory estimate against the saved-tensor measurement (exact: the estimate
counts, by formula, the tensors autograd saves), and the memory-aware choice of the
number of micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from graphstore.errors import ConfigError
from graphstore.nn import (
    GNN,
    LAYERS,
    estimate_step_memory,
    layer_degrees,
    measure_step_memory,
    step_estimator,
)
from graphstore.sample import (
    CSCGraph,
    choose_micro_batches,
    micro_batch_sizes,
    partition_targets,
    sample_dense,
    split_dense,
)


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(0)
    pairs = np.unique(rng.integers(0, 1000, (8000, 2)), axis=0)
    return CSCGraph.from_edges(torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]), 1000)


def measure(model, dense, in_dim, dtype):
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(dense.num_nodes, in_dim, dtype=dtype, generator=gen)
    labels = torch.randint(0, model.layers[-1].out_dim, (dense.num_targets,), generator=gen)
    kwargs = {}
    if model.kind == "rgcn":
        kwargs["edge_type"] = torch.randint(0, 3, (dense.num_edges,), generator=gen)
    if model.kind == "gcn":
        kwargs["degrees"] = layer_degrees(dense)[0].clone()
    return measure_step_memory(model, dense, features, labels, **kwargs)


def bytes_off(model, dense, in_dim, dtype=torch.float32):
    est = estimate_step_memory(model, dense)
    got = measure(model, dense, in_dim, dtype)
    assert est.parameter_bytes == got.parameter_bytes == est.gradient_bytes == got.gradient_bytes
    assert est.optimizer_bytes == got.optimizer_bytes
    assert est.input_bytes == got.input_bytes
    assert sum(est.layer_bytes) == est.activation_bytes
    return est.total_bytes - got.total_bytes, est.activation_bytes - got.activation_bytes


@pytest.mark.parametrize("targets, fanouts, widths", [
    (50, (10, 5), (16, 32)), (200, (10, 10, 5), (100, 16)), (500, (15, 10, 5), (64, 64)), (20, (-1,), (8, 8)),
])
def test_graphsage_estimate_is_exact(graph, targets, fanouts, widths):
    in_dim, hidden = widths
    dense = sample_dense(graph, torch.arange(targets), fanouts, generator=torch.Generator().manual_seed(1))
    model = GNN("sage", in_dim=in_dim, hidden_dim=hidden, out_dim=7, num_layers=len(fanouts))
    for d in [dense] + [p.dense for p in split_dense(dense, min(4, targets), strategy="reg")]:
        assert bytes_off(model, d, in_dim) == (0, 0)  # bytes off: total, activations


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("widths", [(7, 16), (32, 6)])
@pytest.mark.parametrize("kind", LAYERS)
def test_every_layer_kind_estimate_is_exact(graph, kind, widths, dropout, dtype):
    in_dim, hidden = widths
    dense = sample_dense(graph, torch.arange(80), (6, 4, 3), generator=torch.Generator().manual_seed(2),
                         return_edge_ids=True)
    model = GNN(kind, in_dim=in_dim, hidden_dim=hidden, out_dim=3, num_layers=3, dropout=dropout, heads=2,
                num_relations=3, num_bases=2 if hidden == 16 else None).to(dtype)
    assert bytes_off(model, dense, in_dim, dtype) == (0, 0)


def test_measurement_leaves_the_model_alone(graph):
    dense = sample_dense(graph, torch.arange(10), (3, 3))
    model = GNN("sage", in_dim=4, hidden_dim=4, out_dim=2, num_layers=2)
    before = [p.detach().clone() for p in model.parameters()]
    got = measure(model, dense, 4, torch.float32)
    assert got.activation_bytes > 0 and got.optimizer_bytes > 2 * got.parameter_bytes - 1
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_estimate_errors(graph):
    dense = sample_dense(graph, torch.arange(10), (3, 3))
    with pytest.raises(ConfigError, match="graphstore.nn.GNN"):
        estimate_step_memory(nn.Linear(2, 2), dense)
    with pytest.raises(ConfigError, match="2 layers but the batch has 3 hops"):
        estimate_step_memory(GNN("sage", in_dim=2, hidden_dim=2, out_dim=2, num_layers=2),
                             sample_dense(graph, torch.arange(10), (3, 3, 3)))
    with pytest.raises(ConfigError, match="optimizer"):
        estimate_step_memory(GNN("sage", in_dim=2, hidden_dim=2, out_dim=2, num_layers=2), dense,
                             optimizer="lamb")
    gin = GNN("gin", in_dim=2, hidden_dim=2, out_dim=2, num_layers=2)
    gin.layers[0].mlp = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="default MLP"):
        estimate_step_memory(gin, dense)


@pytest.mark.parametrize("strategy", ["reg", "metis", "random", "range"])
def test_chosen_k_fits_and_one_fewer_does_not(graph, strategy):
    dense = sample_dense(graph, torch.arange(0, 1000, 5), (10, 5, 3),
                         generator=torch.Generator().manual_seed(3))
    model = GNN("sage", in_dim=64, hidden_dim=64, out_dim=7, num_layers=3)
    estimator = step_estimator(model)
    whole = estimator(micro_batch_sizes(dense, torch.zeros(dense.num_targets, dtype=torch.int64))[0])
    for fraction in (1.0, 0.7, 0.5, 0.3):
        budget = int(whole * fraction)
        parts = choose_micro_batches(dense, budget, estimator=estimator, strategy=strategy)
        k = len(parts)
        assert max(estimate_step_memory(model, p.dense).total_bytes for p in parts) <= budget
        if fraction < 1.0:
            assert k > 1
            fewer = partition_targets(dense, k - 1, strategy=strategy)
            assert max(estimator(s) for s in micro_batch_sizes(dense, fewer)) > budget
        else:
            assert k == 1
    # Parameters, gradients and Adam state alone exceed this budget: no split can fit.
    fixed = estimate_step_memory(model, dense)
    with pytest.raises(ConfigError, match="over the budget"):
        choose_micro_batches(dense, fixed.parameter_bytes * 4, estimator=estimator, strategy=strategy)
