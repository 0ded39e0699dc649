"""GNN layers: exactness against full-graph adjacency-matrix math, gradients, gradcheck,
DENSE vs reference blocks, numerical stability of GAT, and argument checks.

The references below are written from each layer's definition with dense matrices
(``A[v, u] = 1`` for an edge ``u -> v``); they share only the parameter tensors with the
layers under test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn import (
    GNN,
    LAYERS,
    GATConv,
    GCNConv,
    GINConv,
    LayerView,
    RGCNConv,
    SAGEConv,
    layer_degrees,
    layer_view,
)
from graphstore.sample import CSCGraph, DenseLayer, dense_neighbours, sample_blocks, sample_dense

NUM_RELATIONS = 3


def random_graph(num_nodes: int, num_edges: int, seed: int, *,
                 isolated: int) -> tuple[CSCGraph, torch.Tensor]:
    """A simple directed graph (no parallel edges, no self loops) whose last ``isolated``
    nodes have no edge at all, and R[v, u] = relation of the edge u -> v (-1: no edge)."""
    rng = np.random.default_rng(seed)
    live = num_nodes - isolated
    pairs = np.unique(rng.integers(0, live, (num_edges, 2)), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    src, dst = torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1])
    rel = torch.as_tensor(rng.integers(0, NUM_RELATIONS, len(pairs)))
    relation = torch.full((num_nodes, num_nodes), -1, dtype=torch.int64)
    relation[dst, src] = rel
    return CSCGraph.from_edges(src, dst, num_nodes), relation


@pytest.fixture(scope="module")
def graph():
    g, relation = random_graph(48, 150, seed=3, isolated=6)
    degrees = g.indptr.diff()
    assert int(degrees.max()) >= 5 and int((degrees[:-6] == 0).sum()) >= 1   # hubs and sinks
    return g, relation


TARGETS = torch.tensor([0, 5, 7, 11, 20, 33, 42, 44, 47])   # 42.. are isolated


def dense_edge_types(dense, relation):
    """Relation of every sampled edge of a DENSE, aligned with dense.nbrs."""
    counts = dense.nbr_offsets.diff()
    owner_rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    owner = dense.node_ids[int(dense.node_id_offsets[1]) + owner_rows]
    return relation[owner, dense.node_ids[dense.nbrs]]


def block_edge_types(blocks, relation):
    return [relation[b.src_nodes[b.edge_dst], b.src_nodes[b.edge_src]] for b in blocks]


# --- full-graph references ------------------------------------------------------------------

def ref_sage(layer: SAGEConv, h, adj, relation):
    deg = adj.sum(1, keepdim=True)
    mean = (adj / deg.clamp(min=1)) @ h
    return h @ layer.fc_self.weight.T + layer.fc_self.bias + mean @ layer.fc_nbr.weight.T


def ref_gcn(layer: GCNConv, h, adj, relation):
    a_hat = adj + torch.eye(adj.shape[0], dtype=adj.dtype)
    d = (adj.sum(1) + 1) ** -0.5
    return (d[:, None] * a_hat * d[None, :]) @ h @ layer.fc.weight.T + layer.bias


def ref_gat(layer: GATConv, h, adj, relation):
    x = (h @ layer.fc.weight.T).view(h.shape[0], layer.heads, layer.out_dim)
    s_src = (x * layer.attn_src).sum(-1)                      # [N, H]
    s_dst = (x * layer.attn_dst).sum(-1)
    e = F.leaky_relu(s_dst[:, None, :] + s_src[None, :, :], layer.negative_slope)   # [v, u, H]
    allowed = (adj + torch.eye(adj.shape[0], dtype=adj.dtype)) > 0
    alpha = torch.softmax(e.masked_fill(~allowed[:, :, None], float("-inf")), dim=1)
    out = torch.einsum("vuh,uhf->vhf", alpha, x)
    out = out.reshape(h.shape[0], -1) if layer.concat else out.mean(1)
    return out + layer.bias


def ref_gin(layer: GINConv, h, adj, relation):
    return layer.mlp((1 + layer.eps) * h + adj @ h)


def ref_rgcn(layer: RGCNConv, h, adj, relation):
    if layer.coeff is None:
        weights = layer.basis
    else:
        weights = torch.einsum("rb,bio->rio", layer.coeff, layer.basis)
    out = h @ layer.fc_self.weight.T + layer.fc_self.bias
    for r in range(layer.num_relations):        # a loop over relations, in the test only
        a_r = (relation == r).to(h.dtype)
        out = out + (a_r / a_r.sum(1, keepdim=True).clamp(min=1)) @ h @ weights[r]
    return out


REFERENCES = {"sage": ref_sage, "gcn": ref_gcn, "gat": ref_gat, "gin": ref_gin, "rgcn": ref_rgcn}


def make_model(kind: str, seed: int = 0, *, in_dim=5, hidden_dim=8, out_dim=3, num_layers=2) -> GNN:
    torch.manual_seed(seed)
    model = GNN(kind, in_dim=in_dim, hidden_dim=hidden_dim, out_dim=out_dim, num_layers=num_layers,
                heads=2, num_relations=NUM_RELATIONS, num_bases=2, learn_eps=True).double()
    with torch.no_grad():
        for p in model.parameters():          # no zero biases / eps: every parameter matters
            p.add_(0.3 * torch.randn_like(p))
    return model


def reference_model(model: GNN, h, adj, relation):
    for k, layer in enumerate(model.layers):
        h = REFERENCES[model.kind](layer, h, adj, relation)
        if k < len(model.layers) - 1:
            h = F.relu(h)
    return h


def run_dense(model: GNN, features, graph, relation, dense, **kwargs):
    kw = dict(kwargs)
    if model.kind == "rgcn":
        kw["edge_type"] = dense_edge_types(dense, relation)
    if model.kind == "gcn" and "degrees" not in kw:
        kw["degrees"] = graph.indptr.diff()[dense.node_ids]          # the graph's in-degrees
    return model(features[dense.node_ids], dense, **kw)


def adjacency(graph: CSCGraph) -> torch.Tensor:
    adj = torch.zeros(graph.num_nodes, graph.num_nodes, dtype=torch.float64)
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr.diff())
    adj[dst, graph.indices] = 1.0
    return adj


# --- exactness ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", LAYERS)
def test_all_neighbour_dense_equals_full_graph_forward_and_gradients(kind, graph):
    g, relation = graph
    torch.manual_seed(1)
    features = torch.randn(g.num_nodes, 5, dtype=torch.float64)
    dense = sample_dense(g, TARGETS, (-1, -1))
    model = make_model(kind)
    out = run_dense(model, features, g, relation, dense)
    expected = reference_model(model, features, adjacency(g), relation)[TARGETS]
    assert out.shape == (len(TARGETS), 3)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    assert out.abs().max() > 0.1                      # not trivially zero

    weight = torch.randn_like(out)
    params = list(model.parameters())
    got = torch.autograd.grad((out * weight).sum(), params)
    want = torch.autograd.grad((expected * weight).sum(), params)
    for p, a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"gradient of {p[0]}")
    assert sum(float(a.abs().sum()) for a in got) > 0


@pytest.mark.parametrize("kind", LAYERS)
def test_single_layer_on_a_dense_layer_equals_full_graph(kind, graph):
    g, relation = graph
    torch.manual_seed(2)
    features = torch.randn(g.num_nodes, 5, dtype=torch.float64)
    dense = sample_dense(g, TARGETS, (-1,))
    model = make_model(kind, num_layers=1, out_dim=4)
    out = run_dense(model, features, g, relation, dense)
    expected = REFERENCES[kind](model.layers[0], features, adjacency(g), relation)[TARGETS]
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


def test_float32_matches_within_1e_5(graph):
    g, relation = graph
    torch.manual_seed(3)
    features = torch.randn(g.num_nodes, 5)
    dense = sample_dense(g, TARGETS, (-1, -1))
    for kind in LAYERS:
        model = make_model(kind).float()
        out = run_dense(model, features, g, relation, dense)
        expected = reference_model(model.double(), features.double(), adjacency(g), relation)[TARGETS]
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_gcn_default_degrees_are_the_sampled_counts(graph):
    g, relation = graph
    dense = sample_dense(g, TARGETS, (-1, -1))
    true = g.indptr.diff()[dense.node_ids]
    off = dense.node_id_offsets.tolist()
    degs = layer_degrees(dense)
    # Every node with a sample has its full in-degree (fanout -1); the outermost hop has none.
    assert torch.equal(degs[1], true[off[1]:])
    assert torch.equal(degs[0][off[1]:], true[off[1]:])
    assert torch.equal(degs[0][:off[1]], torch.zeros(off[1], dtype=torch.int64))
    # So the default equals the full-graph GCN exactly when no outermost node has in-edges,
    # and differs here, where some do.
    torch.manual_seed(4)
    features = torch.randn(g.num_nodes, 5, dtype=torch.float64)
    model = make_model("gcn")
    exact = run_dense(model, features, g, relation, dense)
    default = model(features[dense.node_ids], dense)
    assert int(true[:off[1]].sum()) > 0
    assert not torch.allclose(exact, default)


# --- DENSE vs reference blocks ----------------------------------------------------------------

@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("fanouts", [(2, 3), (3, 1, 2), (-1, -1)])
def test_dense_and_reference_blocks_give_the_same_outputs(kind, fanouts, graph):
    g, relation = graph
    torch.manual_seed(5)
    features = torch.randn(g.num_nodes, 5, dtype=torch.float64)
    dense = sample_dense(g, TARGETS, fanouts, generator=torch.Generator().manual_seed(7))
    blocks = sample_blocks(g, TARGETS, fanouts, neighbours=dense_neighbours(dense))
    assert torch.equal(blocks[-1].dst_nodes, TARGETS)
    model = make_model(kind, num_layers=len(fanouts))
    kw_dense, kw_blocks = {}, {}
    if kind == "rgcn":
        kw_dense["edge_type"] = dense_edge_types(dense, relation)
        kw_blocks["edge_type"] = block_edge_types(blocks, relation)
    out_dense = model(features[dense.node_ids], dense, **kw_dense)
    out_blocks = model(features[blocks[0].src_nodes], blocks, **kw_blocks)
    torch.testing.assert_close(out_dense, out_blocks, atol=1e-10, rtol=1e-10)
    if kind == "gcn":                     # given degrees are aligned with either node order
        deg = g.indptr.diff()
        src = blocks[0].src_nodes
        torch.testing.assert_close(model(features[dense.node_ids], dense, degrees=deg[dense.node_ids]),
                                   model(features[src], blocks, degrees=deg[src]), atol=1e-10, rtol=1e-10)


def test_edge_types_per_layer_equal_one_tensor_aligned_with_nbrs(graph):
    g, relation = graph
    dense = sample_dense(g, TARGETS, (3, 2), generator=torch.Generator().manual_seed(1))
    types = dense_edge_types(dense, relation)
    per_layer = [types[types.numel() - t.numel():] for t in dense.repr_map]
    model = make_model("rgcn")
    h = torch.randn(dense.num_nodes, 5, dtype=torch.float64)
    torch.testing.assert_close(model(h, dense, edge_type=types), model(h, dense, edge_type=per_layer))


# --- gradcheck ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", LAYERS)
def test_gradcheck_every_layer(kind):
    g, _ = random_graph(9, 20, seed=11, isolated=1)
    relation = torch.randint(0, NUM_RELATIONS, (9, 9), generator=torch.Generator().manual_seed(0))
    dense = sample_dense(g, torch.tensor([0, 3, 8]), (-1, 2), generator=torch.Generator().manual_seed(2))
    model = make_model(kind, in_dim=3, hidden_dim=4, out_dim=2)
    names = [n for n, _ in model.named_parameters()]
    kw = {"edge_type": dense_edge_types(dense, relation)} if kind == "rgcn" else {}
    h = torch.randn(dense.num_nodes, 3, dtype=torch.float64, requires_grad=True)

    def f(h, *params):
        return torch.func.functional_call(model, dict(zip(names, params)), (h, dense), kw)

    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
    assert torch.autograd.gradcheck(f, (h,) + params)


# --- stability and edge cases ---------------------------------------------------------------

def test_gat_huge_logits_stay_finite(graph):
    g, _ = graph
    dense = sample_dense(g, TARGETS, (-1, -1))
    torch.manual_seed(6)
    model = GNN("gat", in_dim=5, hidden_dim=8, out_dim=3, num_layers=2, heads=2)
    with torch.no_grad():
        for layer in model.layers:
            layer.attn_src.mul_(1e4)
            layer.attn_dst.mul_(1e4)
    h = (torch.randn(dense.num_nodes, 5) * 10).requires_grad_(True)
    logits = (model.layers[0].fc(h).view(-1, 2, 4) * model.layers[0].attn_src).sum(-1)
    assert logits.abs().max() > 1e4                              # exp would overflow unshifted
    out = model(h, dense)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(h.grad).all()


def test_gat_attention_is_a_softmax_over_neighbours_and_self():
    # One output node (row 2) with neighbours rows 0 and 1; W = identity, one head, so the
    # output is alpha-weighted input rows, hand-checkable.
    layer = GATConv(1, 1, heads=1, concat=False, bias=False).double()
    with torch.no_grad():
        layer.fc.weight.fill_(1.0)
        layer.attn_src.fill_(1.0)
        layer.attn_dst.fill_(0.0)
    h = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    out = layer(h, DenseLayer(3, 1, 2, torch.tensor([0, 1]), torch.tensor([2])))
    w = torch.exp(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))    # logits = h (>= 0)
    assert out.item() == pytest.approx(float((w / w.sum()) @ h[:, 0]))


def test_isolated_targets_use_only_their_own_row():
    # No neighbours at all: SAGE gives W_self h + b, GCN W h + b (d = 0), GIN MLP((1+eps) h).
    view = DenseLayer(2, 2, 0, torch.empty(0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    h = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    sage, gcn = SAGEConv(2, 3), GCNConv(2, 3)
    torch.testing.assert_close(sage(h, view), sage.fc_self(h))
    torch.testing.assert_close(gcn(h, view), gcn.fc(h) + gcn.bias)
    gin = GINConv(2, 3, eps=0.5)
    torch.testing.assert_close(gin(h, view), gin.mlp(1.5 * h))
    gat = GATConv(2, 3, heads=2)
    torch.testing.assert_close(gat(h, view), gat.fc(h) + gat.bias)    # alpha_self = 1


def test_layer_view_of_dense_layer_and_block():
    from graphstore.sample import Block

    v = layer_view(DenseLayer(5, 2, 3, torch.tensor([0, 4, 1]), torch.tensor([1, 2])))
    assert v.self_rows == slice(3, 5) and v.segment.tolist() == [0, 1, 1]
    b = layer_view(Block(torch.tensor([9, 8, 7]), 2, torch.tensor([2, 0, 1]), torch.tensor([0, 0, 1])))
    assert b.self_rows == slice(0, 2) and b.nbr_counts.tolist() == [2, 1] and b.num_inputs == 3
    assert layer_view(b) is b and isinstance(b, LayerView)
    h = torch.arange(3.0)[:, None]
    assert h[b.self_rows].data_ptr() == h.data_ptr()                 # a view, not a copy
    with pytest.raises(ConfigError, match="DenseLayer"):
        layer_view((1, 2))


def test_bad_arguments_raise_config_error(graph):
    g, _ = graph
    dense = sample_dense(g, TARGETS, (2, 2))
    with pytest.raises(ConfigError, match="known kinds: gat, gcn, gin, rgcn, sage"):
        GNN("gcnn", in_dim=2, hidden_dim=2, out_dim=2, num_layers=2)
    with pytest.raises(ConfigError, match="divisible by heads"):
        GNN("gat", in_dim=2, hidden_dim=5, out_dim=2, num_layers=2, heads=2)
    model = GNN("sage", in_dim=5, hidden_dim=4, out_dim=2, num_layers=3)
    with pytest.raises(ConfigError, match="3 layers but the sample has 2 hops"):
        model(torch.randn(dense.num_nodes, 5), dense)
    with pytest.raises(ConfigError, match=r"shape \[\d+, D\]"):
        SAGEConv(5, 2)(torch.randn(3, 5), dense.layer(0))
    with pytest.raises(ConfigError, match="needs edge_type"):
        GNN("rgcn", in_dim=5, hidden_dim=4, out_dim=2, num_layers=2)(torch.randn(dense.num_nodes, 5), dense)
    with pytest.raises(ConfigError, match="one relation per sampled edge"):
        RGCNConv(5, 2, num_relations=2)(torch.randn(dense.num_nodes, 5), dense.layer(0),
                                        torch.zeros(1, dtype=torch.int64))


def test_dropout_only_in_training():
    g, _ = random_graph(20, 60, seed=4, isolated=2)
    dense = sample_dense(g, torch.tensor([1, 2, 3]), (-1, -1))
    model = GNN("sage", in_dim=4, hidden_dim=16, out_dim=2, num_layers=2, dropout=0.5)
    h = torch.randn(dense.num_nodes, 4)
    model.eval()
    torch.testing.assert_close(model(h, dense), model(h, dense))
    model.train()
    torch.manual_seed(0)
    a = model(h, dense)
    torch.manual_seed(1)
    assert not torch.allclose(a, model(h, dense))
