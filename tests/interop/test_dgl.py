"""DGL: `to_dgl` gives the message-flow-graph blocks DGL models consume (int64 ids, the
destination nodes first among the sources, features and labels in place), a link batch
gives DGL's (positive graph, negative graph, blocks), and a DGL GraphSAGE reaches Cora's
accuracy with the mega-batch scheme (examples/dgl_graphsage.py, run as a user runs it)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from graphstore.errors import ConfigError
from graphstore.interop import dgl as interop_dgl
from graphstore.interop import targets_first
from graphstore.loaders import EdgeLoader
from tests.conftest import REPO

ACCURACY = 0.78


@pytest.mark.parametrize("fanouts", [(4, 3), (3, 2, 2)])
def test_node_batches_become_blocks(dgl, small, fanouts):
    features = torch.from_numpy(np.asarray(small.features[...]))
    loader = small.node_loader(split="train", fanouts=fanouts, batch_size=32, scheme="megabatch", seed=0)
    for batch in loader.epoch(0):
        blocks = batch.to_dgl()
        assert len(blocks) == len(fanouts)
        for k, block in enumerate(blocks):
            assert block.is_block and block.idtype == torch.int64
            src_ids, dst_ids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
            assert torch.equal(dst_ids, src_ids[:block.num_dst_nodes()])       # destinations first
            if k:  # a block's sources are the previous block's destinations
                assert torch.equal(src_ids, blocks[k - 1].dstdata[dgl.NID])
            # Each destination's in-edges are its DENSE sample: in-degree = sample size.
            sampled = batch.dense.layer(k).nbr_counts
            view_ids = batch.graph.node_ids[batch.dense.node_ids[batch.dense.num_nodes - sampled.numel():]]
            degree = dict(zip(dst_ids.tolist(), block.in_degrees().tolist()))
            assert [degree[i] for i in view_ids.tolist()] == sampled.tolist()
        assert torch.equal(blocks[0].srcdata["feat"], features[blocks[0].srcdata[dgl.NID]])
        assert torch.equal(blocks[-1].dstdata["label"], batch.labels)
        assert torch.equal(blocks[-1].dstdata[dgl.NID], batch.store_ids[-batch.dense.num_targets:])
        edge_types = batch.edge_types[targets_first(batch.dense).edge_order]    # relations follow their edges
        assert all(torch.equal(b.edata["etype"], edge_types[:b.num_edges()]) for b in blocks)
    with pytest.raises(ConfigError, match="a self loop has no relation"):
        batch.to_dgl(self_loops=True)


def test_self_loops_give_every_destination_its_own_edge(dgl, cora):
    batch = next(iter(cora.node_loader(split="train", fanouts=(5, 3), batch_size=64, seed=0).epoch(0)))
    plain, looped = batch.to_dgl(), batch.to_dgl(self_loops=True)
    for a, b in zip(plain, looped):
        assert b.num_edges() == a.num_edges() + a.num_dst_nodes()
        assert torch.equal(b.in_degrees(), a.in_degrees() + 1)
        loops = torch.arange(a.num_dst_nodes())
        assert bool(b.has_edges_between(loops, loops).all())


def test_edge_batches_become_dgl_link_triples(dgl, small):
    loader = EdgeLoader(small, batch_size=40, negatives=5, num_chunks=4, scheme="disk", fanouts=(3, 2), seed=0)
    for batch in loader.epoch(0):
        pos, neg, blocks = batch.to_dgl()
        ids = blocks[-1].dstdata[dgl.NID]
        assert pos.num_nodes() == neg.num_nodes() == blocks[-1].num_dst_nodes() == batch.nodes.numel()
        s, d = pos.edges()
        assert torch.equal(ids[s], batch.graph.node_ids[batch.src]) and torch.equal(ids[d], batch.graph.node_ids[batch.dst])
        assert torch.equal(pos.edata["rel"], batch.rel)
        s, d = neg.edges()
        negatives = batch.negatives.negatives_of_positives()                 # [B, K] local ids
        assert torch.equal(ids[d].view(-1, 5), batch.graph.node_ids[negatives])
        assert torch.equal(ids[s].view(-1, 5)[:, 0], batch.graph.node_ids[batch.src])
        features = torch.from_numpy(np.asarray(small.features[...]))
        assert torch.equal(blocks[0].srcdata["feat"], features[blocks[0].srcdata[dgl.NID]])


def test_without_dgl_to_dgl_says_which_extra(small, monkeypatch):
    monkeypatch.setattr(interop_dgl, "_MISSING", ImportError("No module named 'dgl'"))
    batch = next(iter(small.node_loader(split="train", fanouts=(2,), batch_size=8, seed=0).epoch(0)))
    with pytest.raises(ImportError, match=r"pip install 'graphstore\[dgl\]'") as info:
        batch.to_dgl()
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_dgl_example_reaches_cora_accuracy(dgl, cora_path, capsys):
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("example_dgl_graphsage", REPO / "examples" / "dgl_graphsage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    accuracy = module.main([str(cora_path)])
    assert f"test accuracy {accuracy:.3f}" in capsys.readouterr().out
    print(f"test accuracy {accuracy:.3f}")  # shown by pytest -rP
    assert accuracy >= ACCURACY, accuracy
