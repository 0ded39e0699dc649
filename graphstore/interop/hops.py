"""A `DENSE` laid out the way PyG's and DGL's samplers lay out a sample: targets first.

A DENSE puts the outermost hop first and the targets last (`graphstore.sample.base`), so
that each layer's input is a suffix of the previous one. PyG's ``NeighborLoader`` and DGL's
message-flow graphs use the mirror image: the targets are rows ``0 .. T-1``, then the nodes
first reached at hop 1, then hop 2, ..., so each layer's input is a *prefix* (PyG's
``trim_to_layer`` cuts the tail, DGL's blocks put the destination nodes first among the
sources). `targets_first` computes that order once; `graphstore.interop.pyg` and
`graphstore.interop.dgl` only slice it.

The two layouts hold the same sample: every node once, each node of hops ``0 .. L-1``
with the one neighbour sample the DENSE drew for it. Reordering changes no number, so a
layer that aggregates a node's sample gives the same output in both.

Examples
--------
>>> from graphstore.sample import CSCGraph, sample_dense
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 3, 4, 0, 4]),
...                         torch.tensor([0, 0, 0, 1, 1, 2, 3]), num_nodes=5)
>>> d = sample_dense(g, torch.tensor([0]), (-1, 1), generator=torch.Generator().manual_seed(0))
>>> d.node_ids.tolist()                                   # [hop 2 | hop 1 | target]
[4, 1, 2, 3, 0]
>>> h = targets_first(d)
>>> d.node_ids[h.node_order].tolist()                     # [target | hop 1 | hop 2]
[0, 1, 2, 3, 4]
>>> h.num_sampled_nodes, h.num_sampled_edges
((1, 3, 1), (3, 3))
>>> torch.stack([h.src, h.dst]).tolist()                  # source -> destination, new rows
[[1, 2, 3, 4, 0, 4], [0, 0, 0, 1, 2, 3]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphstore.errors import ConfigError
from graphstore.sample.base import DENSE

__all__ = ["HopOrder", "check_hops", "targets_first"]


@dataclass(frozen=True, slots=True)
class HopOrder:
    """A DENSE's nodes and sampled edges in targets-first order (`targets_first`).

    Row ``r`` of the new order is ``dense.node_ids[node_order[r]]``. With ``L`` hops and
    ``n_h = num_sampled_nodes[h]``, rows ``[0, n_0)`` are the targets and the nodes first
    reached at hop ``h`` follow those of hop ``h - 1``. GNN layer ``k`` (0 = input layer)
    reads the first ``sum(num_sampled_nodes[:L-k+1])`` rows, writes the first
    ``sum(num_sampled_nodes[:L-k])`` and aggregates over the first
    ``sum(num_sampled_edges[:L-k])`` edges.
    """

    node_order: torch.Tensor
    """int64 [N]: the DENSE index (into ``dense.node_ids``) of each new row."""
    src: torch.Tensor
    """int64 [E]: new row of each edge's source (the sampled neighbour)."""
    dst: torch.Tensor
    """int64 [E]: new row of each edge's destination (the node whose sample it is);
    non-decreasing: the edges into the targets first, then those into the nodes of hop 1,
    and so on."""
    edge_order: torch.Tensor
    """int64 [E]: position in ``dense.nbrs`` of each new edge (to carry per-edge data such as
    ``dense.edge_ids`` or relation types across)."""
    num_sampled_nodes: tuple[int, ...]
    """L + 1 counts: targets, then the nodes first reached at each hop (PyG's
    ``num_sampled_nodes``)."""
    num_sampled_edges: tuple[int, ...]
    """L counts: edges into the targets' samples (hop 1), then into hop 1's samples, ...
    (PyG's ``num_sampled_edges``)."""

    def layer_sizes(self, k: int) -> tuple[int, int, int]:
        """``(inputs, outputs, edges)`` of GNN layer ``k`` (0 = input layer): prefixes of
        the rows and edges."""
        hops = len(self.num_sampled_edges)
        return (sum(self.num_sampled_nodes[:hops - k + 1]), sum(self.num_sampled_nodes[:hops - k]),
                sum(self.num_sampled_edges[:hops - k]))


def targets_first(dense: DENSE) -> HopOrder:
    """The targets-first layout of ``dense`` (`HopOrder`): whole-tensor ops, one slice per hop.

    Block ``i`` of ``dense.node_ids`` (hop ``L - i``) becomes the ``L - i``-th block of the
    new order, its nodes in the same order; a sampled node's edges stay together and in
    the same order, the blocks of edges reversed the same way.
    """
    num_nodes, hops = dense.num_nodes, dense.num_layers
    off = dense.node_id_offsets.tolist() + [num_nodes]
    device = dense.node_ids.device
    # Node blocks in reverse: the targets (block L) first, the outermost hop (block 0) last.
    node_order = torch.cat([torch.arange(off[i], off[i + 1], device=device) for i in range(hops, -1, -1)])
    new_row = torch.empty_like(node_order)
    new_row[node_order] = torch.arange(num_nodes, device=device)
    # The sampled nodes are node_ids[off[1]:]; nbr_offsets is their CSR in that order, so
    # block i's edges are one range of nbrs.
    sampled_counts = dense.nbr_offsets.diff()
    edge_start = dense.nbr_offsets[torch.tensor([off[i] - off[1] for i in range(1, hops + 2)], device=device)]
    bounds = edge_start.tolist()
    edge_order = torch.cat([torch.arange(bounds[i - 1], bounds[i], device=device) for i in range(hops, 0, -1)])
    owner = torch.repeat_interleave(torch.arange(off[1], num_nodes, device=device), sampled_counts,
                                    output_size=dense.num_edges)
    src = new_row.index_select(0, dense.nbrs.index_select(0, edge_order))
    dst = new_row.index_select(0, owner.index_select(0, edge_order))
    return HopOrder(
        node_order=node_order, src=src, dst=dst, edge_order=edge_order,
        num_sampled_nodes=tuple(off[i + 1] - off[i] for i in range(hops, -1, -1)),
        num_sampled_edges=tuple(bounds[i] - bounds[i - 1] for i in range(hops, 0, -1)))


def check_hops(batch: object, caller: str) -> None:
    """Refuse a node batch whose DENSE is not the whole model's sample: with stored
    aggregates (a loader's ``aggregated``) it has one hop fewer than the model has layers,
    and PyG's and DGL's layers would not know to use them.

    Raises
    ------
    ConfigError
        ``batch.aggregated`` is set.
    """
    if getattr(batch, "aggregated", None) is not None:
        raise ConfigError(f"{caller} hands over the sampled neighbourhood, and this batch replaces its last hop "
                          f"by stored aggregates (aggregated=...); make the loader without them")
