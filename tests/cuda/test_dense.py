"""DENSE batches on CUDA: moved (`DENSE.to`, `Batch.to`) with every tensor and value kept,
sampled on a CUDA graph (torch backend), trained on the device with the CPU's losses, and
micro-batched with the parent batch left on the host."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graphstore.nn import GNN, micro_batch_backward
from graphstore.sample import Batch, CSCGraph, sample_dense, split_dense

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")

NUM_NODES, NUM_EDGES, IN_DIM, CLASSES = 500, 4000, 8, 4


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    rng = np.random.default_rng(0)
    return CSCGraph.from_edges(torch.as_tensor(rng.integers(0, NUM_NODES, NUM_EDGES)),
                               torch.as_tensor(rng.integers(0, NUM_NODES, NUM_EDGES)), NUM_NODES)


def dense_tensors(dense) -> dict[str, torch.Tensor]:
    out = {f.name: getattr(dense, f.name) for f in dataclasses.fields(dense)
           if isinstance(getattr(dense, f.name), torch.Tensor)}
    out.update({f"repr_map{k}": t for k, t in enumerate(dense.repr_map)})
    return out


def labelled_batch(graph, seed: int, targets=torch.arange(0, NUM_NODES, 3), fanouts=(5, 3)) -> Batch:
    dense = sample_dense(graph, targets, fanouts, generator=torch.Generator().manual_seed(seed),
                         return_edge_ids=True)
    gen = torch.Generator().manual_seed(100 + seed)
    features = torch.randn(NUM_NODES, IN_DIM, generator=gen)
    labels = torch.randint(-1, CLASSES, (NUM_NODES,), generator=gen)  # some unlabelled (-1)
    return Batch.gather(dense, features, labels)


def test_dense_to_the_device_moves_every_tensor_and_keeps_every_value(graph):
    dense = labelled_batch(graph, 1).dense
    moved = dense.to(DEVICE)
    before, after = dense_tensors(dense), dense_tensors(moved)
    assert before.keys() == after.keys() and "edge_ids" in after and len(before) == 6 + 1  # 5 fields, 2 maps
    for name, t in after.items():
        assert t.device.type == DEVICE.type, name
        assert torch.equal(t.cpu(), before[name]), name
    assert moved.repr_map[0] is moved.nbrs  # shared, not two device copies
    assert moved.fanouts == dense.fanouts and moved.num_targets == dense.num_targets
    for k in range(dense.num_layers):
        a, b = dense.layer(k), moved.layer(k)
        assert (a.num_inputs, a.num_outputs, a.self_start) == (b.num_inputs, b.num_outputs, b.self_start)
        assert torch.equal(b.nbr_counts.cpu(), a.nbr_counts) and b.nbr_counts.device.type == DEVICE.type


def test_batch_to_the_device_and_back(graph):
    batch = labelled_batch(graph, 2)
    moved = batch.to(DEVICE)
    assert moved.features.device.type == moved.labels.device.type == moved.dense.nbrs.device.type == DEVICE.type
    back = moved.to("cpu")
    assert torch.equal(back.features, batch.features) and torch.equal(back.labels, batch.labels)
    assert torch.equal(back.dense.nbr_offsets, batch.dense.nbr_offsets)
    # Gathering on the device: the rows picked where the source tensor lives.
    features = torch.arange(NUM_NODES * 2, dtype=torch.float32).view(NUM_NODES, 2)
    on_device = Batch.gather(moved.dense, features.to(DEVICE))
    assert on_device.features.device.type == DEVICE.type
    assert torch.equal(on_device.features.cpu(), features[batch.dense.node_ids])


def test_all_neighbour_sampling_on_a_cuda_graph_equals_the_cpu(graph):
    # With every neighbour there is nothing random: the torch backend on the device must
    # build the very DENSE the CPU builds (node order, offsets, neighbour lists).
    targets = torch.arange(0, NUM_NODES, 11)
    want = sample_dense(graph, targets, (-1, -1), backend="torch")
    on_device = CSCGraph(graph.num_nodes, graph.indptr.to(DEVICE), graph.indices.to(DEVICE))
    got = sample_dense(on_device, targets.to(DEVICE), (-1, -1), backend="torch")  # "auto" on a device
    assert got.nbrs.device.type == DEVICE.type
    for name, t in dense_tensors(want).items():
        assert torch.equal(dense_tensors(got)[name].cpu(), t), name


def test_sampling_on_a_cuda_graph_draws_true_neighbours(graph):
    on_device = CSCGraph(graph.num_nodes, graph.indptr.to(DEVICE), graph.indices.to(DEVICE))
    targets = torch.arange(0, NUM_NODES, 4)
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    dense = sample_dense(on_device, targets.to(DEVICE), (4, 2), generator=gen, backend="torch").to("cpu")
    assert torch.equal(dense.targets, targets)
    off = dense.node_id_offsets.tolist()
    indptr, indices = graph.indptr, graph.indices
    counts = dense.nbr_offsets.diff()
    owners = dense.node_ids[off[1]:]
    degree = indptr[owners + 1] - indptr[owners]
    # Hop 1 (the targets, last block) samples up to 4, hop 2 up to 2; never more than its degree.
    fanout = torch.full_like(counts, 2)
    fanout[-targets.numel():] = 4
    assert torch.equal(counts, torch.minimum(degree, fanout))
    rows = torch.repeat_interleave(torch.arange(owners.numel()), counts)
    for owner, nbr in zip(owners[rows].tolist(), dense.node_ids[dense.nbrs].tolist()):
        assert nbr in indices[indptr[owner]:indptr[owner + 1]].tolist()


def test_training_on_device_batches_has_the_cpus_losses(graph):
    torch.manual_seed(0)
    cpu_model = GNN("sage", in_dim=IN_DIM, hidden_dim=16, out_dim=CLASSES, num_layers=2)
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (cpu_model, dev_model)]
    losses = {"cpu": [], "device": []}
    for seed in range(5):
        batch = labelled_batch(graph, 10 + seed)
        for name, model, opt, b in (("cpu", cpu_model, opts[0], batch), ("device", dev_model, opts[1],
                                                                          batch.to(DEVICE))):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(b.features, b.dense), b.labels, ignore_index=-1)
            loss.backward()
            opt.step()
            losses[name].append(float(loss.detach()))
    assert losses["device"] == pytest.approx(losses["cpu"], rel=1e-4)
    assert losses["cpu"][-1] != losses["cpu"][0]
    for p, q in zip(cpu_model.parameters(), dev_model.parameters()):
        assert q.device.type == DEVICE.type
        assert torch.allclose(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_micro_batches_on_the_device_from_a_parent_on_the_host(graph, kind):
    """`micro_batch_backward(device=...)`: the parent batch stays on the host, each
    micro-batch moves as it runs; the accumulated gradient is the whole batch's on the
    device (GCN with its parent's degrees)."""
    from graphstore.nn import layer_degrees

    batch = labelled_batch(graph, 20, targets=torch.arange(0, NUM_NODES, 2))
    torch.manual_seed(1)
    model = GNN(kind, in_dim=IN_DIM, hidden_dim=16, out_dim=CLASSES, num_layers=2).double().to(DEVICE)
    batch = dataclasses.replace(batch, features=batch.features.double())
    degrees = layer_degrees(batch.dense)[0] if kind == "gcn" else None
    whole = batch.to(DEVICE)
    kwargs = {"degrees": degrees.to(DEVICE)} if degrees is not None else {}
    F.cross_entropy(model(whole.features, whole.dense, **kwargs), whole.labels, ignore_index=-1).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    parts = split_dense(batch.dense, 3, strategy="reg")
    loss = micro_batch_backward(model, batch, parts, degrees=degrees, device=DEVICE)
    assert loss.device.type == DEVICE.type
    assert batch.features.device.type == "cpu" and all(p.dense.nbrs.device.type == "cpu" for p in parts)
    for p, w in zip(model.parameters(), want):
        assert p.grad.device.type == DEVICE.type
        torch.testing.assert_close(p.grad, w, atol=1e-10, rtol=1e-8)
    assert sum(float(w.abs().sum()) for w in want) > 0
