"""The same batch through graphstore's layers, PyG's and DGL's, weights copied across: equal
outputs (float32, 1e-5), for GraphSAGE and GAT, 2 and 3 layers.

The batch is a mega-batch loader's (part of the graph resident, the static cache) on the
embedded Cora. Where the definitions differ, the tests say how:

* GAT, DGL: DGL's ``GATConv`` attends over in-edges only, graphstore's also over the node
  itself; ``to_dgl(self_loops=True)`` adds that edge, and then they agree, self loops of
  the graph included.
* GAT, PyG: PyG's ``GATConv`` drops a node's own edge before adding its self loop, while
  graphstore's counts both; they agree on a sample without self loops (a store converted
  with the default, which drops them, as Cora here) and differ on one with them (checked).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import graphstore
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.nn import GNN
from tests.conftest import make_graph

TOLERANCE = 1e-5
FANOUTS = {2: (6, 4), 3: (5, 3, 2)}


def _batch(store, layers: int, scheme: str = "megabatch"):
    loader = store.node_loader(split="train", fanouts=FANOUTS[layers], batch_size=64, scheme=scheme, seed=3)
    return next(iter(loader.epoch(0)))


def _graphstore_model(kind: str, store, layers: int) -> GNN:
    torch.manual_seed(layers)
    model = GNN(kind, in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=layers,
                heads=2).eval()
    with torch.no_grad():  # GAT's biases start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


def _stack(convs, forward):
    """Run ``forward(i, conv, h)`` per layer, ReLU between layers: the GNN's shape."""
    def run(h):
        for i, conv in enumerate(convs):
            h = forward(i, conv, h)
            if i < len(convs) - 1:
                h = F.relu(h)
        return h
    return run


# --------------------------------------------------------------------------- PyG


def _pyg_stack(pyg, kind: str, model: GNN, trim: bool):
    from torch_geometric.nn import GATConv, SAGEConv
    from torch_geometric.utils import trim_to_layer

    convs = []
    for i, ours in enumerate(model.layers):
        last = i == len(model.layers) - 1
        if kind == "sage":
            conv = SAGEConv(ours.in_dim, ours.out_dim)           # lin_l: neighbours (+ bias), lin_r: root
            conv.lin_l.weight.data.copy_(ours.fc_nbr.weight)
            conv.lin_l.bias.data.copy_(ours.fc_self.bias)
            conv.lin_r.weight.data.copy_(ours.fc_self.weight)
        else:
            conv = GATConv(ours.in_dim, ours.out_dim, heads=ours.heads, concat=not last)
            conv.lin.weight.data.copy_(ours.fc.weight)
            conv.att_src.data.copy_(ours.attn_src[None])
            conv.att_dst.data.copy_(ours.attn_dst[None])
            conv.bias.data.copy_(ours.bias)
        convs.append(conv.eval())

    def forward(data):
        def layer(i, conv, h):
            nonlocal edge_index
            if trim:
                h, edge_index, _ = trim_to_layer(i, data.num_sampled_nodes, data.num_sampled_edges, h, edge_index)
            return conv(h, edge_index)

        edge_index = data.edge_index
        return _stack(convs, layer)(data.x)[:data.batch_size]
    return forward


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_pyg_layers_equal_graphstore_layers(pyg, cora, kind, layers):
    batch = _batch(cora, layers)
    model = _graphstore_model(kind, cora, layers)
    with torch.no_grad():
        want = model(batch.features, batch.dense)
        data = batch.to_pyg()
        for trim in (True, False):   # with trim_to_layer (PyG's sampled models) and without
            got = _pyg_stack(pyg, kind, model, trim)(data)
            diff = float((got - want).abs().max())
            print(f"pyg {kind} layers={layers} trim={trim}: max |diff| {diff:.2e}")
            assert got.shape == want.shape and diff < TOLERANCE, (trim, diff)
    assert float(want.abs().max()) > 0.1  # outputs of a size where 1e-5 means something


# --------------------------------------------------------------------------- DGL


def _dgl_stack(dgl, kind: str, model: GNN):
    from dgl.nn import GATConv, SAGEConv

    convs = []
    for i, ours in enumerate(model.layers):
        last = i == len(model.layers) - 1
        if kind == "sage":
            conv = SAGEConv(ours.in_dim, ours.out_dim, "mean")
            conv.fc_self.weight.data.copy_(ours.fc_self.weight)
            conv.fc_self.bias.data.copy_(ours.fc_self.bias)
            conv.fc_neigh.weight.data.copy_(ours.fc_nbr.weight)
        else:
            conv = GATConv(ours.in_dim, ours.out_dim, num_heads=ours.heads)
            conv.fc.weight.data.copy_(ours.fc.weight)
            conv.attn_l.data.copy_(ours.attn_src[None])
            conv.attn_r.data.copy_(ours.attn_dst[None])
            # DGL adds a bias per head; averaged heads then carry its mean: the same vector per head.
            conv.bias.data.copy_(ours.bias.repeat(ours.heads) if last else ours.bias)
        convs.append(conv.eval())

    def layer(i, conv, h, blocks):
        out = conv(blocks[i], h)
        if kind == "gat":
            out = out.mean(1) if i == len(convs) - 1 else out.flatten(1)
        return out

    def forward(blocks):
        return _stack(convs, lambda i, conv, h: layer(i, conv, h, blocks))(blocks[0].srcdata["feat"])
    return forward


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_dgl_layers_equal_graphstore_layers(dgl, cora, kind, layers):
    batch = _batch(cora, layers)
    model = _graphstore_model(kind, cora, layers)
    with torch.no_grad():
        want = model(batch.features, batch.dense)
        got = _dgl_stack(dgl, kind, model)(batch.to_dgl(self_loops=kind == "gat"))
    diff = float((got - want).abs().max())
    print(f"dgl {kind} layers={layers}: max |diff| {diff:.2e}")
    assert got.shape == want.shape and diff < TOLERANCE
    assert float(want.abs().max()) > 0.1


# --------------------------------------------------------------------------- where GAT differs


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    """A store that keeps its self loops (make_graph puts 5 in)."""
    graph, _ = make_graph(num_nodes=300, num_edges=2400, feature_dim=8, directed=True)
    out = tmp_path_factory.mktemp("interop_loops") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random", seed=1, keep_self_loops=True))
    with graphstore.open(out) as store:
        yield store


def test_gat_with_self_loops_in_the_sample_equals_dgl_and_differs_from_pyg(pyg, dgl, looped):
    loader = looped.node_loader(split="train", fanouts=(-1, -1), batch_size=150, scheme="minibatch", seed=0)
    batch = next(iter(loader.epoch(0)))
    # The sample holds a self loop: some sampled node lists itself among its neighbours.
    d = batch.dense
    owner = d.node_id_offsets[1] + torch.repeat_interleave(torch.arange(d.nbr_offsets.numel() - 1),
                                                           d.nbr_offsets.diff())
    assert bool((d.nbrs == owner).any())
    torch.manual_seed(0)
    model = GNN("gat", in_dim=8, hidden_dim=8, out_dim=3, num_layers=2, heads=2).eval()
    features = batch.features / batch.features.max()
    with torch.no_grad():
        want = model(features, batch.dense)
        blocks = batch.to_dgl(self_loops=True)
        blocks[0].srcdata["feat"] = blocks[0].srcdata["feat"] / batch.features.max()
        assert float((_dgl_stack(dgl, "gat", model)(blocks) - want).abs().max()) < TOLERANCE
        data = batch.to_pyg()
        data.x = data.x / batch.features.max()
        assert float((_pyg_stack(pyg, "gat", model, True)(data) - want).abs().max()) > 1e-3
