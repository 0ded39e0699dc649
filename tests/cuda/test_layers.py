"""Every layer type on CUDA: a sampled batch's forward and backward in float32 against the
float64 CPU reference (the same weights), float64 on CUDA equal to float64 on the CPU, and
the partial form (inference's and SAR's) fed pieces of edges on the device equal to the
one-shot layer on the CPU.

Inputs are drawn fresh and non-zero (no zero biases: every parameter matters); errors are
measured as ``|got - want| / |want|`` over the whole tensor, which float32 arithmetic keeps
far under 1e-4 and TF32 would not (it is off for matmuls by default)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graphstore.nn import GNN, LAYERS, GATConv, GCNConv, GINConv, LayerView, RGCNConv, SAGEConv
from graphstore.sample import CSCGraph, sample_dense

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")

NUM_NODES, NUM_EDGES, RELATIONS = 400, 3000, 3
IN_DIM, HIDDEN, OUT_DIM = 12, 16, 5
FLOAT32 = 1e-4   # relative error of a float32 result against the float64 reference
FLOAT64 = 1e-10  # float64 on CUDA against float64 on the CPU (summation order only)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape and torch.isfinite(got).all()
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


def make_graph(seed: int = 0) -> CSCGraph:
    rng = np.random.default_rng(seed)
    src = torch.as_tensor(rng.integers(0, NUM_NODES, NUM_EDGES))
    dst = torch.as_tensor(rng.integers(0, NUM_NODES, NUM_EDGES))
    return CSCGraph.from_edges(src, dst, NUM_NODES)


def make_model(kind: str, seed: int = 0) -> GNN:
    torch.manual_seed(seed)
    model = GNN(kind, in_dim=IN_DIM, hidden_dim=HIDDEN, out_dim=OUT_DIM, num_layers=2, heads=2,
                num_relations=RELATIONS, num_bases=2, learn_eps=True).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def batch(seed: int = 0):
    g = make_graph(seed)
    dense = sample_dense(g, torch.arange(0, NUM_NODES, 7), (6, 4), generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    features = torch.randn(dense.num_nodes, IN_DIM, dtype=torch.float64, generator=gen)
    labels = torch.randint(0, OUT_DIM, (dense.num_targets,), generator=gen)
    edge_type = torch.randint(0, RELATIONS, (dense.num_edges,), generator=gen)
    return dense, features, labels, edge_type


def step(model: GNN, dense, features, labels, edge_type) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every parameter's gradient of a cross-entropy step (GCN on its default
    sampled degrees, computed on the structure's device)."""
    kwargs = {"edge_type": edge_type} if model.kind == "rgcn" else {}
    model.zero_grad(set_to_none=True)
    out = model(features, dense, **kwargs)
    F.cross_entropy(out, labels).backward()
    return out, [p.grad for p in model.parameters()]


def on(device, dense, features, labels, edge_type, dtype):
    return dense.to(device), features.to(device, dtype), labels.to(device), edge_type.to(device)


@pytest.mark.parametrize("kind", LAYERS)
def test_float32_forward_and_backward_on_cuda_match_the_float64_cpu_reference(kind):
    inputs = batch(1)
    reference = make_model(kind)
    want, want_grads = step(reference, *inputs)
    model = copy.deepcopy(reference).float().to(DEVICE)
    got, grads = step(model, *on(DEVICE, *inputs, torch.float32))
    assert got.device.type == DEVICE.type and got.dtype == torch.float32
    assert rel_error(got, want) < FLOAT32
    assert float(want.detach().abs().max()) > 0.1  # outputs of a size where the error means something
    for (name, _), g, w in zip(reference.named_parameters(), grads, want_grads):
        assert g is not None and g.device.type == DEVICE.type, name
        assert rel_error(g, w) < FLOAT32, name
    assert sum(float(w.abs().sum()) for w in want_grads) > 0


@pytest.mark.parametrize("kind", LAYERS)
def test_float64_on_cuda_equals_float64_on_the_cpu(kind):
    inputs = batch(2)
    reference = make_model(kind, seed=1)
    want, want_grads = step(reference, *inputs)
    model = copy.deepcopy(reference).to(DEVICE)
    got, grads = step(model, *on(DEVICE, *inputs, torch.float64))
    assert rel_error(got, want) < FLOAT64
    for (name, _), g, w in zip(reference.named_parameters(), grads, want_grads):
        assert rel_error(g, w) < FLOAT64, name


# ------------------------------------------------------------------------- partial form


def make_layer(kind: str) -> torch.nn.Module:
    torch.manual_seed(3)
    layer = {"sage": lambda: SAGEConv(IN_DIM, OUT_DIM), "gcn": lambda: GCNConv(IN_DIM, OUT_DIM),
             "gin": lambda: GINConv(IN_DIM, OUT_DIM, learn_eps=True, eps=0.3),
             "rgcn": lambda: RGCNConv(IN_DIM, OUT_DIM, num_relations=RELATIONS, num_bases=2),
             "gat": lambda: GATConv(IN_DIM, OUT_DIM, heads=3, concat=True)}[kind]()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer.double().eval()


def whole_graph(seed: int):
    """Every node an output, its in-edges its neighbours (sorted by destination)."""
    rng = np.random.default_rng(seed)
    src = torch.as_tensor(rng.integers(0, NUM_NODES - 5, NUM_EDGES))
    dst = torch.as_tensor(rng.integers(0, NUM_NODES - 5, NUM_EDGES))  # the last 5 nodes: no in-edges
    rel = torch.as_tensor(rng.integers(0, RELATIONS, NUM_EDGES))
    order = torch.argsort(dst, stable=True)
    src, dst, rel = src[order], dst[order], rel[order]
    counts = torch.bincount(dst, minlength=NUM_NODES)
    return LayerView(NUM_NODES, NUM_NODES, slice(0, NUM_NODES), src, counts, dst), src, dst, rel, counts


def one_shot(layer, h, view, rel, degrees):
    if isinstance(layer, GCNConv):
        return layer(h, view, degrees)
    if isinstance(layer, RGCNConv):
        return layer(h, view, rel)
    return layer(h, view)


@pytest.mark.parametrize("kind", LAYERS)
def test_the_partial_form_on_cuda_equals_the_one_shot_layer_on_the_cpu(kind):
    """Two destination blocks; each takes its in-edges from both source blocks in shuffled
    pieces, every tensor on the device (what inference and SAR do with a model on CUDA)."""
    view, src, dst, rel, counts = whole_graph(4)
    layer = make_layer(kind)
    h = torch.randn(NUM_NODES, IN_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = one_shot(layer, h, view, rel, counts)
    dev = DEVICE
    cuda_layer = copy.deepcopy(layer).to(dev)
    rng = np.random.default_rng(6)
    block_of = torch.as_tensor(rng.integers(0, 2, NUM_NODES))
    members = [torch.nonzero(block_of == b).flatten() for b in range(2)]
    local = torch.empty(NUM_NODES, dtype=torch.int64)
    for m in members:
        local[m] = torch.arange(m.numel())
    hd, countsd, srcd, dstd, reld = (t.to(dev) for t in (h, counts, src, dst, rel))
    out = torch.full((NUM_NODES, want.shape[1]), float("nan"), dtype=torch.float64, device=dev)  # poisoned
    with torch.no_grad():
        for j in (1, 0):
            nodes_j = members[j].to(dev)
            acc = cuda_layer.partial_begin(hd[nodes_j], degrees_dst=countsd[nodes_j])
            for i in (0, 1):
                nodes_i = members[i].to(dev)
                sources = cuda_layer.partial_sources(hd[nodes_i], degrees_src=countsd[nodes_i])
                edges = torch.nonzero((block_of[src] == i) & (block_of[dst] == j)).flatten()
                edges = edges[torch.as_tensor(rng.permutation(edges.numel()), dtype=torch.int64)]
                for piece in torch.tensor_split(edges, 3):
                    e = piece.to(dev)
                    cuda_layer.partial_update(acc, sources, local.to(dev)[srcd[e]], local.to(dev)[dstd[e]],
                                              edge_type=reld[e])
            out[nodes_j] = cuda_layer.partial_finish(acc)
    assert out.device.type == DEVICE.type and not torch.isnan(out).any()  # every row written
    assert rel_error(out, want) < FLOAT64
    assert float(want.abs().max()) > 0.1
