"""Training across processes on torch.distributed (launched with torchrun; gloo on CPU,
NCCL on GPU).

Full-batch training with sequential aggregation and rematerialization (SAR): each rank
owns a contiguous block of the store's partitions (`rank_graph`), aggregates every layer
over the other ranks' rows one rank at a time and rematerializes them in backward
(`sar`), with BatchNorm from all-reduced sums (`batchnorm`) and dropout keyed by node
(`dropout`); `halo` is the plain domain-parallel baseline; `full_batch` the model, loss
and gradient all-reduce; `comm` the process group, ring exchanges and error handling.
`data_parallel`: the loaders' schemes under DistributedDataParallel (each rank a disjoint
share of every epoch, steps padded to equal counts, the union's mean loss; link
prediction's embeddings owned by partition or replicated).
`feature_fetch`: BatchGNN's distributed fetch for macro-batching (each rank holds its
partitions' feature rows; a round's union comes from the owners in one collective round).
`agreement`: ranks refuse to train unless they agree on the store and the settings.
"""

from graphstore.distributed.batchnorm import distributed_batch_norm
from graphstore.distributed.comm import fail_fast, init_process_group
from graphstore.distributed.data_parallel import (
    all_gather_varlen,
    all_reduce_values,
    check_shared_embeddings,
    equal_steps,
    gather_rows,
    node_classification_backward,
    padding_loss,
    rank_and_world,
    sync_ranks,
    wrap_model,
)
from graphstore.distributed.dropout import dropout_mask, node_dropout
from graphstore.distributed.feature_fetch import PLACEMENTS, PartitionedFetch
from graphstore.distributed.full_batch import (
    MODES,
    FullBatchGNN,
    all_reduce_gradients,
    full_batch_loss,
    reference_forward,
)
from graphstore.distributed.halo import HaloGraph, halo_layer
from graphstore.distributed.rank_graph import (
    BlockData,
    RankGraph,
    load_block_data,
    load_rank_graph,
    rank_partitions,
)
from graphstore.distributed.sar import DEFAULT_EDGE_CHUNK, CommStats, sar_layer

__all__ = [
    "DEFAULT_EDGE_CHUNK", "MODES", "PLACEMENTS", "BlockData", "CommStats", "FullBatchGNN", "HaloGraph",
    "PartitionedFetch", "RankGraph",
    "all_gather_varlen", "all_reduce_gradients", "all_reduce_values", "check_shared_embeddings",
    "distributed_batch_norm", "dropout_mask", "equal_steps",
    "fail_fast", "full_batch_loss", "gather_rows", "halo_layer", "init_process_group", "load_block_data", "load_rank_graph",
    "node_classification_backward", "node_dropout", "padding_loss", "rank_and_world", "rank_partitions", "reference_forward",
    "sar_layer", "sync_ranks", "wrap_model",
]
