"""`targets_first` holds the DENSE's sample in PyG's and DGL's order: for every layer, the
prefix of rows and edges it names is exactly the DENSE layer's inputs, outputs and edges."""

from __future__ import annotations

import pytest
import torch

from graphstore.errors import ConfigError
from graphstore.interop import targets_first
from graphstore.interop.hops import check_hops
from graphstore.nn import layer_view
from graphstore.sample import CSCGraph, sample_dense


def _random_graph(num_nodes: int, num_edges: int, seed: int) -> CSCGraph:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(num_nodes, (num_edges,), generator=g)
    dst = torch.randint(num_nodes, (num_edges,), generator=g)
    return CSCGraph.from_edges(src, dst, num_nodes=num_nodes)


@pytest.mark.parametrize("fanouts", [(3,), (4, 2), (5, 3, 2), (-1, 2, -1)])
@pytest.mark.parametrize("direction", ["in", "both"])
def test_every_layer_is_a_prefix_holding_the_dense_layer(fanouts, direction):
    graph = _random_graph(300, 1500, seed=len(fanouts))
    dense = sample_dense(graph, torch.tensor([5, 77, 3, 200, 150]), fanouts, direction=direction,
                         generator=torch.Generator().manual_seed(1))
    h = targets_first(dense)
    n = dense.num_nodes
    assert sorted(h.node_order.tolist()) == list(range(n))
    assert torch.equal(dense.node_ids[h.node_order][:5], dense.targets)            # targets first, in order
    assert sum(h.num_sampled_nodes) == n and sum(h.num_sampled_edges) == dense.num_edges
    assert bool((h.dst.diff() >= 0).all())                                           # grouped by destination
    assert sorted(h.edge_order.tolist()) == list(range(dense.num_edges))
    # Each hop's nodes stay a block: a row's hop is where its DENSE block says.
    off = dense.node_id_offsets.tolist() + [n]
    hop_of_dense = torch.repeat_interleave(torch.arange(len(fanouts), -1, -1), torch.tensor(off).diff())
    hop_of_row = torch.repeat_interleave(torch.arange(len(fanouts) + 1), torch.tensor(h.num_sampled_nodes))
    assert torch.equal(hop_of_dense[h.node_order], hop_of_row)
    for k in range(dense.num_layers):
        view = layer_view(dense.layer(k))
        num_in, num_out, num_edges = h.layer_sizes(k)
        assert (num_in, num_out, num_edges) == (view.num_inputs, view.num_outputs, view.nbr_index.numel())
        # The layer's input rows are a suffix of node_ids: map both edge lists to node ids.
        inputs = dense.node_ids[n - view.num_inputs:]
        want = sorted(zip(inputs[view.nbr_index].tolist(), inputs[view.self_rows][view.segment].tolist()))
        ids = dense.node_ids[h.node_order]
        assert int(h.src[:num_edges].max()) < num_in and int(h.dst[:num_edges].max()) < num_out
        got = sorted(zip(ids[h.src[:num_edges]].tolist(), ids[h.dst[:num_edges]].tolist()))
        assert got == want


def test_edge_order_carries_per_edge_data():
    graph = _random_graph(100, 600, seed=7)
    dense = sample_dense(graph, torch.tensor([1, 2, 3]), (4, 3), return_edge_ids=True,
                         generator=torch.Generator().manual_seed(0))
    h = targets_first(dense)
    ids = dense.node_ids[h.node_order]
    # Edge e of the new order is the CSC entry dense.edge_ids[edge_order[e]]: its source.
    assert torch.equal(graph.indices[dense.edge_ids[h.edge_order]], ids[h.src])


def test_a_batch_with_stored_aggregates_is_refused():
    class WithAggregates:
        aggregated = torch.zeros(1)

    with pytest.raises(ConfigError, match="stored aggregates"):
        check_hops(WithAggregates(), "to_pyg")
    check_hops(object(), "to_pyg")  # no aggregates: nothing to say
