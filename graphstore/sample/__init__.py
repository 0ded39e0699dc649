"""Samplers: from the resident graph (seen through `SampleGraph`) to `DENSE` / `Batch`.

`sample_dense` is the production sampler (a compiled kernel on the CPU when it was built,
see `native_available`, and torch ops otherwise); `sample_blocks` (DGL-style per-layer
blocks) is the reference it is checked and compared against; `sample_negatives` draws link
prediction's negatives, shared per chunk of a batch; `split_dense` / `choose_micro_batches`
split a batch into micro-batches (Betty).
"""

from graphstore.sample.base import DENSE, Batch, CSCGraph, DenseLayer, SampleGraph
from graphstore.sample.dense import (
    BACKENDS,
    DIRECTIONS,
    native_available,
    new_workspace,
    sample_dense,
    sample_neighbours,
)
from graphstore.sample.microbatch import (
    STRATEGIES,
    DenseSizes,
    MicroBatch,
    TargetGrouping,
    choose_micro_batches,
    dense_sizes,
    loss_weights,
    micro_batch_sizes,
    micro_batches,
    partition_targets,
    split_dense,
    total_inputs,
)
from graphstore.sample.negatives import NegativeSample, num_degree_negatives, sample_negatives
from graphstore.sample.reference import Block, dense_neighbours, sample_blocks

__all__ = [
    "BACKENDS",
    "DENSE",
    "DIRECTIONS",
    "STRATEGIES",
    "Batch",
    "Block",
    "CSCGraph",
    "DenseLayer",
    "DenseSizes",
    "MicroBatch",
    "NegativeSample",
    "SampleGraph",
    "TargetGrouping",
    "choose_micro_batches",
    "dense_neighbours",
    "dense_sizes",
    "loss_weights",
    "micro_batch_sizes",
    "micro_batches",
    "native_available",
    "new_workspace",
    "num_degree_negatives",
    "partition_targets",
    "sample_blocks",
    "sample_dense",
    "sample_negatives",
    "sample_neighbours",
    "split_dense",
    "total_inputs",
]
