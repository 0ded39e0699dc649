"""Loaders: an epoch of training batches from a store, through the buffer and the samplers.

This is the machinery the trainer scripts use, for user code: a loader resolves a scheme
(`schemes`) into typed settings (`settings`) once, then runs each epoch as a chain of
stages (`stages`), each with one job and typed items in and out::

    Planner -> BufferWalk -> NodeTargets -> NeighbourSampling -> GatherRows [-> MicroBatchSplit]
    StructureWalk -> NodeTargets -> NeighbourSampling -> MacroBatchGather     (macrobatch)
    Planner -> BufferWalk -> EdgeTargets -> Negatives [-> EdgeNeighbourSampling]

The per-batch stages (sampling, gathering, negatives, a fixed micro-batch split, a
``transform``) run on ``loader_threads`` threads ahead of the consumer (`pipeline`), with the
same batches for any number of threads; `transfer.DeviceFeeder` stages batches onto a CUDA
device one step ahead.

With ``rank`` and ``world_size`` a node loader yields one data-parallel rank's share of
each epoch (`shard`: a block of the buffer states, or every N-th batch).

Every choice a loader makes is in its ``settings`` (printed and recorded by the trainers).
Randomness comes from ``(seed, epoch)`` alone (`seeds`), so an epoch can be replayed (the
trainers' ``--resume`` relies on it).
"""

from graphstore.loaders.batches import EdgeBatch, EdgeIndex, NodeBatch
from graphstore.loaders.edge import EdgeLoader
from graphstore.loaders.node import NodeLoader
from graphstore.loaders.pipeline import default_loader_threads
from graphstore.loaders.schemes import SCHEMES, Scheme
from graphstore.loaders.settings import EdgeLoaderSettings, LoaderSettings, NodeLoaderSettings
from graphstore.loaders.shard import Shard
from graphstore.loaders.transfer import DeviceFeeder

__all__ = [
    "SCHEMES",
    "DeviceFeeder",
    "EdgeBatch",
    "EdgeIndex",
    "EdgeLoader",
    "EdgeLoaderSettings",
    "LoaderSettings",
    "NodeBatch",
    "NodeLoader",
    "NodeLoaderSettings",
    "Scheme",
    "Shard",
    "default_loader_threads",
]
