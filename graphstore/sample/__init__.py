"""Samplers: from the resident graph (seen through `SampleGraph`) to `DENSE` / `Batch`.

`sample_dense` is the production sampler; `sample_blocks` (DGL-style per-layer blocks) is
the reference it is checked and compared against.
"""

from graphstore.sample.base import DENSE, Batch, CSCGraph, DenseLayer, SampleGraph
from graphstore.sample.dense import DIRECTIONS, new_workspace, sample_dense, sample_neighbours
from graphstore.sample.reference import Block, dense_neighbours, sample_blocks

__all__ = [
    "DENSE",
    "DIRECTIONS",
    "Batch",
    "Block",
    "CSCGraph",
    "DenseLayer",
    "SampleGraph",
    "dense_neighbours",
    "new_workspace",
    "sample_blocks",
    "sample_dense",
    "sample_neighbours",
]
