"""Partial aggregation (SAR 3.2): a layer fed its in-edges a piece at a time, pieces split
any way and taken in any order, per destination block, equals the one-shot layer over
the whole graph: to 1e-6 in float32 and 1e-12 in float64, GAT included with logits of 1e4
(where a softmax without the shift overflows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphstore.errors import ConfigError
from graphstore.nn import GATConv, GCNConv, GINConv, LayerView, RGCNConv, SAGEConv

NUM_NODES, NUM_EDGES, RELATIONS = 90, 600, 3


def full_graph(seed: int):
    """A random directed multigraph over every node (isolated nodes included) as a LayerView
    of the whole graph (every node an output, its in-edges its neighbours), plus the edges."""
    rng = np.random.default_rng(seed)
    src = torch.as_tensor(rng.integers(0, NUM_NODES - 5, NUM_EDGES))
    dst = torch.as_tensor(rng.integers(0, NUM_NODES - 5, NUM_EDGES))
    rel = torch.as_tensor(rng.integers(0, RELATIONS, NUM_EDGES))
    order = torch.argsort(dst, stable=True)
    src, dst, rel = src[order], dst[order], rel[order]
    counts = torch.bincount(dst, minlength=NUM_NODES)
    view = LayerView(NUM_NODES, NUM_NODES, slice(0, NUM_NODES), src, counts, dst)
    return view, src, dst, rel, counts


def make_layer(kind: str, in_dim: int, out_dim: int):
    if kind == "sage":
        return SAGEConv(in_dim, out_dim)
    if kind == "gcn":
        return GCNConv(in_dim, out_dim)
    if kind == "gin":
        return GINConv(in_dim, out_dim, learn_eps=True, eps=0.3)
    if kind == "rgcn":
        return RGCNConv(in_dim, out_dim, num_relations=RELATIONS, num_bases=2)
    if kind == "gat":
        return GATConv(in_dim, out_dim, heads=3, concat=True)
    if kind == "gat-mean":
        return GATConv(in_dim, out_dim, heads=2, concat=False)
    raise AssertionError(kind)


KINDS = ["sage", "gcn", "gin", "rgcn", "gat", "gat-mean"]
# Both widths: SAGE and GCN project before aggregating when that shrinks the rows.
WIDTHS = [(12, 5), (5, 12)]


def one_shot(layer, h, view, rel, degrees):
    if isinstance(layer, GCNConv):
        return layer(h, view, degrees)
    if isinstance(layer, RGCNConv):
        return layer(h, view, rel)
    return layer(h, view)


def partial(layer, h, src, dst, rel, degrees, *, num_blocks: int, seed: int):
    """Nodes in random blocks; each destination block's aggregate takes the edges from
    every source block, each cut into random pieces, in a random order."""
    rng = np.random.default_rng(seed)
    block_of = torch.as_tensor(rng.integers(0, num_blocks, NUM_NODES))
    members = [torch.nonzero(block_of == b).flatten() for b in range(num_blocks)]
    local = torch.empty(NUM_NODES, dtype=torch.int64)
    for m in members:
        local[m] = torch.arange(m.numel())
    out = torch.empty(NUM_NODES, layer.partial_finish(layer.partial_begin(
        h[:1], degrees_dst=degrees[:1].clone())).shape[1], dtype=h.dtype)
    for j in rng.permutation(num_blocks):
        nodes_j = members[j]
        acc = layer.partial_begin(h[nodes_j], degrees_dst=degrees[nodes_j])
        pieces = []
        for i in range(num_blocks):
            mask = (block_of[src] == i) & (block_of[dst] == j)
            edges = torch.nonzero(mask).flatten()
            edges = edges[torch.as_tensor(rng.permutation(edges.numel()), dtype=torch.int64)]
            cuts = np.sort(rng.integers(0, edges.numel() + 1, rng.integers(1, 4)))  # 2-4 pieces
            pieces += [(i, e) for e in np.split(edges.numpy(), cuts)]
        for k in rng.permutation(len(pieces)):
            i, e = pieces[k]
            e = torch.as_tensor(e, dtype=torch.int64)
            nodes_i = members[i]
            layer.partial_update(acc, h[nodes_i], local[src[e]], local[dst[e]], degrees_src=degrees[nodes_i],
                                 edge_type=rel[e])
        out[nodes_j] = layer.partial_finish(acc)
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_pieces_in_any_order_equal_the_one_shot_layer(kind, width, dtype, tol, seed):
    torch.manual_seed(seed)
    view, src, dst, rel, counts = full_graph(seed)
    layer = make_layer(kind, *width).to(dtype).eval()
    h = torch.randn(NUM_NODES, width[0], dtype=dtype)
    with torch.no_grad():
        want = one_shot(layer, h, view, rel, counts)
        for blocks in (1, 4):
            got = partial(layer, h, src, dst, rel, counts, num_blocks=blocks, seed=seed + 10 * blocks)
            scale = max(1.0, float(want.abs().max()))
            assert float((got - want).abs().max()) <= tol * scale, (kind, blocks)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_gat_with_logits_of_1e4_stays_exact(dtype, tol):
    torch.manual_seed(3)
    view, src, dst, rel, counts = full_graph(3)
    layer = GATConv(6, 4, heads=2).to(dtype).eval()
    h = torch.randn(NUM_NODES, 6, dtype=dtype)
    with torch.no_grad():
        x, score_src = layer._project(h)
        score_dst = (x * layer.attn_dst).sum(-1)
        # Scale the attention vectors so the logits reach 1e4.
        factor = 1e4 / float((score_src.abs().max() + score_dst.abs().max()))
        layer.attn_src.mul_(factor)
        layer.attn_dst.mul_(factor)
        x, score_src = layer._project(h)
        logits = layer._logits(score_src[src], (x * layer.attn_dst).sum(-1)[dst])
        assert float(logits.abs().max()) > 5e3
        assert torch.isinf(torch.exp(logits)).any()  # what an unshifted softmax would meet
        want = layer(h, view)
        # In float32 a logit of 1e4 is only known to ~1e-3 (its ulp), so the source rows are
        # projected in one matmul, as the one-shot layer does (a matmul over a subset of rows
        # may round differently); the pieces still come split and shuffled, so the running
        # maximum rescales. In float64 the blocks split the sources too.
        blocks = 1 if dtype == torch.float32 else 5
        got = partial(layer, h, src, dst, rel, counts, num_blocks=blocks, seed=4)
    assert torch.isfinite(got).all() and torch.isfinite(want).all()
    assert float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


def test_the_partial_form_has_the_layers_gradients():
    # Not the inference path, but the same math: autograd through pieces equals the layer's.
    view, src, dst, rel, counts = full_graph(5)
    layer = SAGEConv(7, 3).double()
    h = torch.randn(NUM_NODES, 7, dtype=torch.float64, requires_grad=True)
    layer(h, view).square().sum().backward()
    want = h.grad.clone()
    h.grad = None
    acc = layer.partial_begin(h)
    half = NUM_EDGES // 2
    layer.partial_update(acc, h, src[half:], dst[half:])
    layer.partial_update(acc, h, src[:half], dst[:half])
    layer.partial_finish(acc).square().sum().backward()
    assert torch.allclose(h.grad, want, atol=1e-12)


def test_bad_pieces_are_refused():
    layer = SAGEConv(4, 2)
    acc = layer.partial_begin(torch.randn(3, 4))
    with pytest.raises(ConfigError, match="src and dst must be 1-d and aligned"):
        layer.partial_update(acc, torch.randn(5, 4), torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ConfigError, match=r"h_src must have shape \[n, 4\]"):
        layer.partial_update(acc, torch.randn(5, 3), torch.tensor([0]), torch.tensor([0]))
    gcn = GCNConv(4, 2)
    with pytest.raises(ConfigError, match="degrees_dst must have shape"):
        gcn.partial_begin(torch.randn(3, 4), degrees_dst=torch.zeros(2))
    gat = GATConv(4, 2, attn_dropout=0.5).train()
    acc = gat.partial_begin(torch.randn(3, 4))
    with pytest.raises(ConfigError, match="model.eval"):
        gat.partial_update(acc, torch.randn(5, 4), torch.tensor([0]), torch.tensor([0]))
