"""Dropout whose mask depends on the node, not on which rank holds it.

The mask of node ``v`` at ``(seed, epoch, layer)`` is a row of a uniform draw made for
``v``'s store partition with a generator seeded by ``(seed, epoch, layer, partition)``:
a function of ``(seed, epoch, layer, global node id)`` (the partition and the row within it
are functions of the id in a given store). So 1, 2 or 4 ranks, each drawing for the
partitions it owns, drop exactly the units one process drops over the whole graph.

Drawing per partition rather than hashing every (node, unit) keeps the draw at torch's
generator speed and its memory at one block's mask; the price is that the mask is tied to
the store's partitioning, which every rank of a job shares.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphstore.layout.hashing import mix64

__all__ = ["dropout_mask", "node_dropout"]


def _partition_seed(seed: int, epoch: int, layer: int, partition: int) -> int:
    key = np.array([seed, epoch, layer, partition], dtype=np.uint64)
    h = np.uint64(0)
    for value in mix64(key + np.arange(1, 5, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)):
        h = mix64(np.array([h ^ value], dtype=np.uint64))[0]
    return int(h >> np.uint64(1))  # torch seeds are < 2**63


def dropout_mask(p: float, width: int, partition_starts: Sequence[int], first_partition: int, *, seed: int,
                 epoch: int, layer: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The scaled keep mask, float [n, width] (0, or ``1 / (1 - p)``), of the nodes of the
    consecutive partitions ``first_partition, ...`` whose store ids start at
    ``partition_starts`` (the last entry ends the last partition)."""
    rows = []
    for k in range(len(partition_starts) - 1):
        gen = torch.Generator().manual_seed(_partition_seed(seed, epoch, layer, first_partition + k))
        n = partition_starts[k + 1] - partition_starts[k]
        rows.append(torch.rand((n, width), generator=gen) >= p)
    return torch.cat(rows).to(dtype) / (1.0 - p)


def node_dropout(h: torch.Tensor, p: float, partition_starts: Sequence[int], first_partition: int, *, seed: int,
                 epoch: int, layer: int) -> torch.Tensor:
    """``h`` [n, width] with the node-keyed mask applied (``p == 0``: ``h`` itself)."""
    if p == 0.0:
        return h
    mask = dropout_mask(p, h.shape[1], partition_starts, first_partition, seed=seed, epoch=epoch, layer=layer,
                        dtype=h.dtype)
    return h * mask.to(h.device)
