"""GNN layers on `DENSE` (and reference blocks), link prediction decoders, metrics.

`layers` holds the message-passing layers and the `GNN` stack; `decoders` the edge
scorers and their loss; `metrics` accuracy, MRR / Hits@k and OGB's evaluator rules;
`base` the `LayerView` both samplers' layers are read through.
"""

from graphstore.nn.base import LayerView, layer_view, segment_mean, segment_softmax, segment_sum
from graphstore.nn.decoders import DECODERS, ComplEx, Decoder, DistMult, TransE, link_loss
from graphstore.nn.layers import LAYERS, GATConv, GCNConv, GINConv, GNN, RGCNConv, SAGEConv, layer_degrees
from graphstore.nn.metrics import (
    KS,
    accuracy,
    full_ranks,
    ogb_hits_at_k,
    ogb_mrr,
    ogbn_accuracy,
    ranking_metrics,
    ranks,
)

__all__ = [
    "DECODERS",
    "GNN",
    "KS",
    "LAYERS",
    "ComplEx",
    "Decoder",
    "DistMult",
    "GATConv",
    "GCNConv",
    "GINConv",
    "LayerView",
    "RGCNConv",
    "SAGEConv",
    "TransE",
    "accuracy",
    "full_ranks",
    "layer_degrees",
    "layer_view",
    "link_loss",
    "ogb_hits_at_k",
    "ogb_mrr",
    "ogbn_accuracy",
    "ranking_metrics",
    "ranks",
    "segment_mean",
    "segment_softmax",
    "segment_sum",
]
