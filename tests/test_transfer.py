"""`DeviceFeeder`: batches staged through pinned buffers onto a CUDA device one step ahead.
On the CPU it hands batches on untouched; the CUDA tests run on the GPU machine's check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.loaders import NodeLoader
from graphstore.loaders.transfer import DeviceFeeder
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=500, num_edges=4000, directed=True)
    out = tmp_path_factory.mktemp("transfer") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random", seed=0))
    return graphstore.open(out)


def loader(store, **kw):
    return NodeLoader(store, split="train", fanouts=(4, 3), batch_size=20, scheme="megabatch", capacity=2,
                      seed=1, loader_threads=2, **kw)


def test_on_the_cpu_the_batches_pass_untouched(store):
    host = list(loader(store).epoch(0))
    fed = list(DeviceFeeder("cpu")(iter(host)))
    assert len(fed) == len(host) > 3 and all(a is b for a, b in zip(fed, host))


@pytest.mark.cuda
def test_batches_arrive_on_the_device_equal_to_the_host_batches(store):
    feeder = DeviceFeeder("cuda")
    host = [(b.features.clone(), b.labels.clone(), b.dense) for b in loader(store).epoch(0)]
    fed = list(feeder(loader(store).epoch(0)))
    assert len(fed) == len(host)
    for batch, (features, labels, dense) in zip(fed, host):
        assert batch.features.device.type == "cuda" and batch.dense.nbrs.device.type == "cuda"
        assert torch.equal(batch.features.cpu(), features) and torch.equal(batch.labels.cpu(), labels)
        assert torch.equal(batch.dense.nbr_offsets.cpu(), dense.nbr_offsets)
        assert batch.graph.node_ids.device.type == "cpu"  # the resident graph stays on the host
    # The pinned slots are kept: the next epoch stages into the same buffers.
    pointers = [slot.buffer.data_ptr() for slot in feeder._slots]
    list(feeder(loader(store).epoch(1)))
    assert [slot.buffer.data_ptr() for slot in feeder._slots] == pointers
    assert all(slot.buffer.is_pinned() for slot in feeder._slots)


@pytest.mark.cuda
def test_a_step_on_fed_batches_matches_a_step_on_plain_copies(store):
    from graphstore.nn import GNN

    def losses(feed: bool) -> list[float]:
        torch.manual_seed(0)
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=2).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = loader(store).epoch(0)
        out = []
        for b in (DeviceFeeder("cuda")(batches) if feed else batches):
            opt.zero_grad()
            logits = model(b.features.cuda().float(), b.dense.to("cuda"))
            loss = torch.nn.functional.cross_entropy(logits, b.labels.cuda())
            loss.backward()
            opt.step()
            out.append(float(loss))
        return out

    # Equal up to the order of CUDA's float atomics (index_add_ is not deterministic there).
    np.testing.assert_allclose(losses(True), losses(False), rtol=1e-5)


@pytest.mark.cuda
def test_a_micro_batched_batch_stays_on_the_host(store):
    fed = list(DeviceFeeder("cuda")(loader(store, micro_batches=2).epoch(0)))
    assert fed and all(b.features.device.type == "cpu" and b.micro_batches for b in fed)
