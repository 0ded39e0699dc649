"""What the loaders yield: `NodeBatch` (node classification) and `EdgeBatch` (link
prediction), each valid until the next batch is requested."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphstore.buffer.resident import ResidentGraph
from graphstore.sample import DENSE, Batch
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

    @property
    def store_ids(self) -> torch.Tensor:
        """int64 [N], store id of each ``dense.node_ids`` entry."""
        return self.graph.node_ids[self.dense.node_ids]

    @property
    def edge_types(self) -> torch.Tensor | None:
        """int64 [E], relation of each sampled edge (aligned with ``dense.nbrs``), or None
        without relations (RGCN's ``edge_type``)."""
        if self.graph.rel is None or self.dense.edge_ids is None:
            return None
        return self.graph.rel[self.dense.edge_ids]

    @property
    def degrees(self) -> torch.Tensor:
        """int64 [N], resident in-degree of each ``dense.node_ids`` entry (GCN's normalisation;
        the whole graph's in-degree under the minibatch scheme)."""
        return self.graph.indptr.diff()[self.dense.node_ids]


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
