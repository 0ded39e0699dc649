"""One optimizer step on K micro-batches equals one on the whole batch (float64, dropout off),
for every layer kind, K in {2, 3, 8} and every split strategy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn import GNN, LAYERS, layer_degrees, micro_batch_backward
from graphstore.sample import STRATEGIES, Batch, CSCGraph, sample_dense, split_dense

NUM_RELATIONS = 3


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    pairs = np.unique(rng.integers(0, 300, (1800, 2)), axis=0)
    graph = CSCGraph.from_edges(torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]), 300)
    rel = torch.as_tensor(rng.integers(0, NUM_RELATIONS, graph.num_edges))
    dense = sample_dense(graph, torch.arange(0, 300, 7), (4, 3, 2),
                         generator=torch.Generator().manual_seed(1), return_edge_ids=True)
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(300, 5, dtype=torch.float64, generator=gen)
    labels = torch.randint(-1, 4, (300,), generator=gen)          # some targets unlabelled (-1)
    return dense, Batch.gather(dense, features, labels), rel[dense.edge_ids]


def step(model, run):
    """Parameters and gradients after one Adam step whose gradients ``run`` accumulates."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt.zero_grad()
    run(model)
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return [p.detach() for p in model.parameters()], grads


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("k", [2, 3, 8])
@pytest.mark.parametrize("kind", LAYERS)
def test_micro_batches_step_like_the_whole_batch(setup, kind, k, strategy):
    dense, batch, edge_type = setup
    torch.manual_seed(3)
    model = GNN(kind, in_dim=5, hidden_dim=8, out_dim=4, num_layers=3, heads=2,
                num_relations=NUM_RELATIONS, num_bases=2).double()
    kwargs = {}
    if kind == "rgcn":
        kwargs["edge_type"] = edge_type
    if kind == "gcn":
        # The parent's sampled degrees, sliced by rows for each micro-batch.
        kwargs["degrees"] = layer_degrees(dense)[0]

    def whole(m):
        F.cross_entropy(m(batch.features, dense, **kwargs), batch.labels, ignore_index=-1).backward()

    parts = split_dense(dense, k, strategy=strategy)
    losses = []

    def split(m):
        losses.append(micro_batch_backward(m, batch, parts, **kwargs))

    want, want_grads = step(model, whole)
    got, got_grads = step(model, split)
    assert any(bool(g.abs().max() > 1e-6) for g in want_grads)   # a real update, not all zeros
    for a, b in zip(want_grads, got_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-10)
    for a, b in zip(want, got):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    whole_loss = F.cross_entropy(model(batch.features, dense, **kwargs), batch.labels, ignore_index=-1)
    assert torch.allclose(losses[0], whole_loss.detach())


def test_gcn_needs_the_parents_degrees(setup):
    """Without them a micro-batch recomputes sampled degrees, and nodes pushed one hop
    outward lose theirs: the gradient then differs (the reason for the degrees argument)."""
    dense, batch, _ = setup
    torch.manual_seed(3)
    model = GNN("gcn", in_dim=5, hidden_dim=8, out_dim=4, num_layers=3).double()
    parts = split_dense(dense, 8, strategy="random")
    degrees = layer_degrees(dense)[0]
    _, want = step(model, lambda m: F.cross_entropy(m(batch.features, dense, degrees=degrees), batch.labels,
                                                    ignore_index=-1).backward())
    _, got = step(model, lambda m: micro_batch_backward(m, batch, parts))
    assert not all(torch.allclose(a, b) for a, b in zip(want, got))


def test_needs_labels(setup):
    dense, batch, _ = setup
    model = GNN("sage", in_dim=5, hidden_dim=8, out_dim=4, num_layers=3).double()
    with pytest.raises(ConfigError, match="labels"):
        micro_batch_backward(model, Batch(dense, batch.features, None), split_dense(dense, 2))


@pytest.mark.parametrize("k", [2, 5])
def test_class_weighted_micro_batches_step_like_the_whole_batch(setup, k):
    """With per-class weights (a buffer state's `class_weights`), the count-averaged
    weighted loss accumulates over micro-batches to the whole batch's step, and it is the
    hand-computed weighted mean."""
    from graphstore.nn import class_weighted_cross_entropy

    dense, batch, _ = setup
    weights = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)
    torch.manual_seed(4)
    model = GNN("sage", in_dim=5, hidden_dim=8, out_dim=4, num_layers=3).double()
    logits = model(batch.features, dense)
    mask = batch.labels >= 0
    per = F.cross_entropy(logits[mask], batch.labels[mask], reduction="none")
    by_hand = (per * weights[batch.labels[mask]]).sum() / mask.sum()
    assert torch.allclose(class_weighted_cross_entropy(logits, batch.labels, weights), by_hand)
    assert torch.allclose(class_weighted_cross_entropy(logits, batch.labels, None),
                          F.cross_entropy(logits, batch.labels, ignore_index=-1))

    def loss_fn(out, y):
        return class_weighted_cross_entropy(out, y, weights)

    def whole(m):
        loss_fn(m(batch.features, dense), batch.labels).backward()

    parts = split_dense(dense, k, strategy="reg")
    want, want_grads = step(model, whole)
    got, got_grads = step(model, lambda m: micro_batch_backward(m, batch, parts, loss_fn=loss_fn))
    for a, b in zip(want_grads, got_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-10)
