"""The domain-parallel baseline on one rank: what it keeps is the layer's own, never a copy
of the rank's rows beside the halo, and it projects before it aggregates where SAR does
(issue 31, item 12: at N = 1 the baseline held 5.9x SAR's memory, mostly a copy of the
features). Exactness across ranks is tests/distributed/test_full_batch.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphstore.distributed import CommStats, FullBatchGNN, HaloGraph, load_block_data, load_rank_graph
from graphstore.nn.step_memory import _cpu_allocator_peak
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory) -> Path:
    import graphstore

    # Wide features, narrow layers: a copy of the input would dwarf everything the layers keep.
    graph, _ = make_graph(num_nodes=4000, num_edges=16000, feature_dim=512, num_classes=4, seed=1)
    out = tmp_path_factory.mktemp("halo") / "wide.gs"
    graphstore.convert(graph, out, num_partitions=2, partitioner="metis")
    return out


@pytest.mark.parametrize(("kind", "share"), [("sage", 1 / 4), ("gcn", 1 / 4), ("gat", 3 / 4)])
def test_one_rank_keeps_no_copy_of_its_features(wide_store, kind, share):
    from graphstore.layout.store import open_store

    store = open_store(wide_store)
    graph = load_rank_graph(store, 0, 1)  # one rank: no process group needed, no halo
    data = load_block_data(store, graph)
    torch.manual_seed(0)
    model = FullBatchGNN(kind, in_dim=store.feature_dim, hidden_dim=8, out_dim=4, num_layers=2, heads=2)
    halo, stats = HaloGraph(graph), CommStats()

    def step() -> None:
        out = model(data.features, graph, mode="domain_parallel", halo=halo, stats=stats)
        out.sum().backward()

    peak = _cpu_allocator_peak(step)
    # The old baseline concatenated the input with its (empty) halo: one whole copy of the
    # features, 8 MB here, held until backward, and autograd's index_add kept every layer's
    # gathered messages (peaks 10.8, 10.7 and 17.6 MB). Now SAGE and GCN project to 8 before
    # they gather and keep no per-edge message (1.4 MB); GAT keeps each edge's logit and
    # weight [E, heads], as DGL's GATConv does (5.0 MB).
    assert peak < share * data.features.nbytes, (kind, peak, data.features.nbytes)
    assert stats.rows_fetched_remote == 0 and stats.bytes_sent == 0
    store.close()
