"""What the loaders yield: `NodeBatch` (node classification) and `EdgeBatch` (link
prediction), each valid until the next batch is requested."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphstore.buffer.resident import ResidentGraph
from graphstore.nn.aggregate import AggregateSource
from graphstore.sample import DENSE, Batch
from graphstore.sample.base import lookup
from graphstore.sample.microbatch import MicroBatch
from graphstore.sample.negatives import NegativeSample

__all__ = ["EdgeBatch", "EdgeIndex", "NodeBatch"]


@dataclass(frozen=True, slots=True)
class NodeBatch(Batch):
    """A `Batch` that also knows the buffer state it was sampled from."""

    graph: ResidentGraph | None = None
    """The state's resident graph (valid until the next batch is requested)."""
    micro_batches: tuple[MicroBatch, ...] | None = None
    """Under micro-batching (the ``microbatch`` scheme, or ``micro_batches=`` with another):
    the batch's micro-batches, whose gradients accumulate into one update
    (`graphstore.nn.micro_batch_backward`); else None."""
    class_weights: torch.Tensor | None = None
    """float32 [num_classes]: the loss weight of each class in this batch's buffer state
    (the loader's ``balance_labels``: the training split's label mix over the state's), for
    ``F.cross_entropy(..., weight=class_weights)``; None: unweighted."""
    aggregated: torch.Tensor | None = None
    """float [N, D] with the loader's ``aggregated``: the stored aggregate of each
    ``dense.node_ids`` entry's in-neighbours' input rows (BatchGNN's aggregation cache), for
    ``model(features, dense, aggregated=...)``; ``dense`` then has one hop fewer than the
    model has layers. Else None."""
    aggregated_from: AggregateSource | None = None
    """With ``aggregated``: what it is (the store's array, its op and the input it
    aggregated); pass it on as ``model(..., aggregated_from=batch.aggregated_from)`` and
    `graphstore.nn.GNN` refuses an op its first layer does not take. Else None."""

    @property
    def store_ids(self) -> torch.Tensor:
        """int64 [N], store id of each ``dense.node_ids`` entry."""
        return lookup(self.graph.node_ids, self.dense.node_ids)

    @property
    def edge_types(self) -> torch.Tensor | None:
        """int64 [E], relation of each sampled edge (aligned with ``dense.nbrs``), or None
        without relations (RGCN's ``edge_type``)."""
        if self.graph.rel is None or self.dense.edge_ids is None:
            return None
        return lookup(self.graph.rel, self.dense.edge_ids)

    @property
    def degrees(self) -> torch.Tensor:
        """int64 [N], resident in-degree of each ``dense.node_ids`` entry (GCN's normalisation;
        the whole graph's in-degree under the minibatch scheme)."""
        return lookup(self.graph.indptr.diff(), self.dense.node_ids)

    def to_pyg(self):
        """This batch as the ``torch_geometric.data.Data`` PyG's sampled training expects
        (`graphstore.interop.pyg.to_pyg`: ``x``, ``edge_index``, ``y``, ``batch_size``,
        ``num_sampled_nodes``/``num_sampled_edges``, targets first). Needs ``graphstore[pyg]``."""
        # Imported here: torch_geometric is an optional extra, loaded only when asked for.
        from graphstore.interop.pyg import to_pyg

        return to_pyg(self)

    def to_dgl(self, *, self_loops: bool = False):
        """This batch as DGL's message-flow-graph blocks, ``blocks[0]`` the input layer
        (`graphstore.interop.dgl.to_dgl`; ``self_loops`` for DGL's GATConv). Needs
        ``graphstore[dgl]``."""
        from graphstore.interop.dgl import to_dgl

        return to_dgl(self, self_loops=self_loops)


@dataclass(frozen=True, slots=True)
class EdgeIndex:
    """Where a batch's endpoints and negatives sit among its encoded nodes
    (`EdgeBatch.nodes`): ``h[index.src]`` are the sources' encoder outputs."""

    src: torch.Tensor
    """int64 [B]."""
    dst: torch.Tensor
    """int64 [B]."""
    neg: torch.Tensor
    """int64 [C, K], shaped as ``negatives.nodes``."""

    def to(self, device: torch.device | str) -> EdgeIndex:
        return EdgeIndex(self.src.to(device), self.dst.to(device), self.neg.to(device))


@dataclass(frozen=True, slots=True)
class EdgeBatch:
    """Positive edges of one batch with their shared negatives, in the state's local ids."""

    src: torch.Tensor
    """int64 [B] local ids."""
    dst: torch.Tensor
    """int64 [B] local ids."""
    rel: torch.Tensor
    """int64 [B] relation ids (zeros without relations)."""
    negatives: NegativeSample
    """``nodes`` [C, K] local ids shared by chunks of the batch."""
    graph: ResidentGraph
    """The state's graph (embeddings, features, CSC for an encoder)."""
    dense: DENSE | None = None
    """With fanouts: the DENSE over ``nodes`` (targets = ``nodes``; with relations it carries
    ``edge_ids``, so ``graph.rel[dense.edge_ids]`` are the sampled edges' types), else None."""
    nodes: torch.Tensor | None = None
    """With fanouts: int64 [U] distinct local ids of src, dst and negatives, in store-id
    order; the encoder's outputs come in this order (`index` maps into it)."""
    index: EdgeIndex | None = None
    """With fanouts: positions of ``src``, ``dst`` and the negatives in ``nodes``."""

    def to_pyg(self):
        """This batch (sampled with fanouts) as PyG's ``Data``: the neighbourhood of
        ``nodes``, targets first, with the positive pairs and each positive's shared
        negatives (`graphstore.interop.pyg.to_pyg`). Needs ``graphstore[pyg]``."""
        from graphstore.interop.pyg import to_pyg

        return to_pyg(self)

    def to_dgl(self, *, self_loops: bool = False):
        """This batch (sampled with fanouts) as DGL's ``(pos_graph, neg_graph, blocks)``
        (`graphstore.interop.dgl.to_dgl`). Needs ``graphstore[dgl]``."""
        from graphstore.interop.dgl import to_dgl

        return to_dgl(self, self_loops=self_loops)
