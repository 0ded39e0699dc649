"""`to_pyg()` / `to_dgl()` of batches on CUDA: a `Batch` moved to the device, and a loader's
`NodeBatch` as the trainers receive it (`DeviceFeeder`: rows and DENSE on the device, the
resident graph on the host). PyG's layers on the device, weights copied from ours, give our
outputs. DGL is an optional extra that the GPU machine's image does not hold (KINDS.md): its
test skips, naming the missing package, where dgl cannot be imported."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import graphstore
from graphstore.loaders import NodeLoader
from graphstore.loaders.transfer import DeviceFeeder
from graphstore.nn import GNN
from graphstore.sample import Batch

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")


def host_batch(store):
    loader = NodeLoader(store, split="train", fanouts=(4, 3), batch_size=40, scheme="minibatch", seed=2,
                        loader_threads=1)
    return loader, next(iter(loader.epoch(0)))


def sage_model(store) -> GNN:
    torch.manual_seed(0)
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=2).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


def need_pyg():
    return pytest.importorskip("torch_geometric", reason="torch_geometric missing: pip install 'graphstore[pyg]'")


def test_a_batch_on_cuda_to_pyg_runs_pygs_layers_as_ours(small_store):
    need_pyg()
    from torch_geometric.nn import SAGEConv

    from graphstore.interop.pyg import to_pyg

    with graphstore.open(small_store) as store:
        _, batch = host_batch(store)
        model = sage_model(store).to(DEVICE)
    plain = Batch(batch.dense, batch.features.float() / 600.0, batch.labels).to(DEVICE)
    data = to_pyg(plain)
    assert data.x.device.type == data.edge_index.device.type == DEVICE.type
    assert data.batch_size == plain.dense.num_targets
    with torch.no_grad():
        want = model(plain.features, plain.dense)
        convs = []
        for ours in model.layers:
            conv = SAGEConv(ours.in_dim, ours.out_dim)  # lin_l: neighbours (+ bias), lin_r: root
            conv.lin_l.weight.data.copy_(ours.fc_nbr.weight)
            conv.lin_l.bias.data.copy_(ours.fc_self.bias)
            conv.lin_r.weight.data.copy_(ours.fc_self.weight)
            convs.append(conv.to(DEVICE).eval())
        h = data.x
        for i, conv in enumerate(convs):
            h = conv(h, data.edge_index)
            if i < len(convs) - 1:
                h = F.relu(h)
        got = h[:data.batch_size]
    assert got.device.type == DEVICE.type and got.shape == want.shape
    assert float((got - want).abs().max()) < 1e-5 and float(want.abs().max()) > 0.1


def test_a_fed_node_batch_to_pyg_on_cuda_equals_the_host_batchs(small_store):
    need_pyg()
    with graphstore.open(small_store) as store:
        loader, host = host_batch(store)
        want = host.to_pyg()
        fed = next(iter(DeviceFeeder(DEVICE)(loader.epoch(0))))
        assert fed.features.device.type == DEVICE.type
        got = fed.to_pyg()
    assert got.x.device.type == got.edge_index.device.type == DEVICE.type
    assert torch.equal(got.x.cpu(), want.x) and torch.equal(got.edge_index.cpu(), want.edge_index)
    assert torch.equal(got.n_id.cpu(), want.n_id) and torch.equal(got.y.cpu(), want.y)
    assert torch.equal(got.edge_type.cpu(), want.edge_type)  # the store has relations
    assert got.batch_size == want.batch_size and got.num_sampled_nodes == want.num_sampled_nodes


def test_a_batch_on_cuda_to_dgl_gives_blocks_on_the_device(small_store):
    dgl = pytest.importorskip("dgl", reason="dgl missing (an optional extra; the GPU machine's image has none): "
                                            "pip install 'graphstore[dgl]'")
    from graphstore.interop.dgl import to_dgl

    with graphstore.open(small_store) as store:
        _, batch = host_batch(store)
    plain = Batch(batch.dense, batch.features, batch.labels)
    want = to_dgl(plain)
    got = to_dgl(plain.to(DEVICE))
    assert len(got) == len(want) == plain.dense.num_layers
    for a, b in zip(got, want):
        assert a.device.type == DEVICE.type
        assert (a.num_src_nodes(), a.num_dst_nodes(), a.num_edges()) == (b.num_src_nodes(), b.num_dst_nodes(),
                                                                          b.num_edges())
        for x, y in zip(a.edges(), b.edges()):
            assert torch.equal(x.cpu(), y)
    assert torch.equal(got[0].srcdata["feat"].cpu(), want[0].srcdata["feat"])
    assert torch.equal(got[-1].dstdata["label"].cpu(), want[-1].dstdata["label"])
    assert dgl.__version__
