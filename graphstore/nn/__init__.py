"""GNN layers on `DENSE` (and reference blocks), link prediction decoders, metrics.

`layers` holds the message-passing layers and the `GNN` stack; `decoders` the edge
scorers and their loss; `metrics` accuracy, MRR / Hits@k and OGB's evaluator rules;
`base` the `LayerView` both samplers' layers are read through; `step_memory` the estimate
and measurement of a training step's memory, `link_step` a link-prediction step's bound and
its micro-batches; `accumulate` micro-batch gradient accumulation;
`aggregate` the weightless neighbour aggregate of input features (BatchGNN's cache).
"""

from graphstore.nn.accumulate import class_weighted_cross_entropy, micro_batch_backward
from graphstore.nn.aggregate import AGGREGATIONS, AggregateSource, AggregationModel, FeatureAggregate
from graphstore.nn.base import LayerView, layer_view, normalize_rows, segment_mean, segment_softmax, segment_sum
from graphstore.nn.decoders import DECODERS, ComplEx, Decoder, DistMult, HadamardMLP, TransE, link_loss
from graphstore.nn.layers import (
    AGGREGATE_FOR,
    GNN,
    LAYERS,
    GATConv,
    GCNConv,
    GINConv,
    PartialAggregate,
    PartialSources,
    RGCNConv,
    SAGEConv,
    layer_degrees,
)
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
from graphstore.nn.link_step import estimate_link_step_bytes, link_micro_batches
from graphstore.nn.step_memory import (
    OPTIMIZERS,
    StepMemory,
    estimate_step_memory,
    measure_step_memory,
    model_state_bytes,
    step_estimator,
)

__all__ = [
    "AGGREGATE_FOR",
    "AGGREGATIONS",
    "DECODERS",
    "GNN",
    "KS",
    "LAYERS",
    "PartialAggregate",
    "PartialSources",
    "class_weighted_cross_entropy",
    "OPTIMIZERS",
    "AggregateSource",
    "AggregationModel",
    "ComplEx",
    "Decoder",
    "DistMult",
    "FeatureAggregate",
    "GATConv",
    "GCNConv",
    "GINConv",
    "HadamardMLP",
    "LayerView",
    "RGCNConv",
    "SAGEConv",
    "StepMemory",
    "TransE",
    "accuracy",
    "estimate_link_step_bytes",
    "estimate_step_memory",
    "full_ranks",
    "layer_degrees",
    "layer_view",
    "link_loss",
    "link_micro_batches",
    "measure_step_memory",
    "micro_batch_backward",
    "ogb_hits_at_k",
    "ogb_mrr",
    "ogbn_accuracy",
    "ranking_metrics",
    "ranks",
    "normalize_rows",
    "segment_mean",
    "segment_softmax",
    "segment_sum",
    "model_state_bytes",
    "step_estimator",
]
