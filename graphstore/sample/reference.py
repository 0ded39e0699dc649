"""The reference sampler: DGL-style layer-wise blocks, one bipartite graph per GNN layer.

It is the plain, obviously-correct way to sample, kept to check `sample_dense` against
(given the same per-node samples via `dense_neighbours`, both must compute the same thing)
and to compare speed and accuracy with (left to itself, it draws afresh for every block, as
DGL's ``MultiLayerNeighborSampler`` does, so a node reached by two layers has two samples).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from graphstore.errors import ConfigError
from graphstore.sample.base import DENSE, SampleGraph
from graphstore.sample.dense import _check, sample_neighbours

__all__ = ["Block", "Neighbours", "dense_neighbours", "sample_blocks"]

Neighbours = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``nodes`` int64 [n] -> (``counts`` int64 [n], ``nbrs`` int64 [counts.sum()]), local ids."""


@dataclass(frozen=True, slots=True)
class Block:
    """One layer's bipartite graph: messages flow from ``src_nodes`` to the first ``num_dst``
    of them (the dst nodes, which DGL also puts first among the src nodes).

    Examples
    --------
    >>> b = Block(torch.tensor([5, 7, 2]), 2, torch.tensor([2, 0]), torch.tensor([0, 1]))
    >>> b.dst_nodes.tolist(), b.num_edges
    ([5, 7], 2)
    """

    src_nodes: torch.Tensor
    """int64 [n_src], local ids, distinct; ``src_nodes[:num_dst]`` are the dst nodes."""
    num_dst: int
    """n_dst, number of dst nodes (rows this layer outputs)."""
    edge_src: torch.Tensor
    """int64 [e], each edge's source as an index into src_nodes."""
    edge_dst: torch.Tensor
    """int64 [e], each edge's destination as an index into the dst nodes, non-decreasing."""

    @property
    def dst_nodes(self) -> torch.Tensor:
        """int64 [n_dst], the dst nodes' local ids."""
        return self.src_nodes[: self.num_dst]

    @property
    def num_edges(self) -> int:
        """e, number of edges."""
        return int(self.edge_src.numel())


def sample_blocks(graph: SampleGraph, targets: torch.Tensor, fanouts: Sequence[int], *,
                  generator: torch.Generator | None = None, direction: str = "in",
                  neighbours: Neighbours | None = None) -> list[Block]:
    """Sample one `Block` per layer, outward from the targets.

    Parameters
    ----------
    graph, targets, fanouts, generator, direction
        As for `sample_dense`; ``fanouts[0]`` is again the hop nearest the targets, i.e. the
        block of the last layer.
    neighbours : Neighbours, optional
        Where each dst node's sample comes from. None: a fresh draw per block with the
        block's fanout (DGL's behaviour). `dense_neighbours` of a DENSE: that DENSE's samples,
        making the two computations identical.

    Returns
    -------
    list of Block, length L
        In the order layers apply them (DGL's): ``blocks[0]`` is the input layer's,
        ``blocks[-1].dst_nodes`` are the targets.

    Examples
    --------
    >>> from graphstore.sample import CSCGraph
    >>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 3, 4, 0, 4]),
    ...                         torch.tensor([0, 0, 0, 1, 1, 2, 3]), num_nodes=5)
    >>> blocks = sample_blocks(g, torch.tensor([0]), (-1, -1))
    >>> [(b.src_nodes.tolist(), b.num_dst) for b in blocks]
    [([0, 1, 2, 3, 4], 4), ([0, 1, 2, 3], 1)]
    >>> blocks[1].edge_src.tolist(), blocks[1].edge_dst.tolist()
    ([1, 2, 3], [0, 0, 0])
    """
    dst = _check(graph, targets, fanouts, direction)
    blocks = []
    for fanout in fanouts:
        if neighbours is None:
            counts, nbrs = sample_neighbours(graph, dst, fanout, generator=generator, direction=direction)
        else:
            counts, nbrs = neighbours(dst)
        block = _block(dst, counts, nbrs)
        blocks.append(block)
        dst = block.src_nodes
    return blocks[::-1]


def _block(dst: torch.Tensor, counts: torch.Tensor, nbrs: torch.Tensor) -> Block:
    """The block whose dst nodes ``dst`` have the samples (``counts``, ``nbrs``)."""
    device = dst.device
    unique = torch.unique(nbrs)
    sorted_dst, _ = torch.sort(dst)
    pos = torch.searchsorted(sorted_dst, unique).clamp_(max=max(dst.numel() - 1, 0))
    in_dst = sorted_dst[pos] == unique if dst.numel() else torch.zeros_like(unique, dtype=torch.bool)
    src_nodes = torch.cat([dst, unique[~in_dst]])
    sorted_src, order = torch.sort(src_nodes)
    edge_src = order[torch.searchsorted(sorted_src, nbrs)]
    edge_dst = torch.repeat_interleave(torch.arange(dst.numel(), device=device), counts)
    return Block(src_nodes, int(dst.numel()), edge_src, edge_dst)


def dense_neighbours(dense: DENSE) -> Neighbours:
    """The samples stored in ``dense``, as a `Neighbours` lookup by local id.

    Only nodes within ``L - 1`` hops have a sample; asking for another raises ConfigError.
    """
    first = int(dense.node_id_offsets[1])
    sampled = dense.node_ids[first:]
    sorted_ids, order = torch.sort(sampled)

    def lookup(nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = nodes.device
        pos = torch.searchsorted(sorted_ids, nodes).clamp_(max=max(sorted_ids.numel() - 1, 0))
        if nodes.numel() and (sorted_ids.numel() == 0 or not bool((sorted_ids[pos] == nodes).all())):
            raise ConfigError("a node has no sample in this DENSE: only nodes within "
                              f"{dense.num_layers - 1} hops of the targets are sampled")
        row = order[pos]
        start = dense.nbr_offsets[row]
        counts = dense.nbr_offsets[row + 1] - start
        total = int(counts.sum())
        owner = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), counts, output_size=total)
        within = torch.arange(total, device=device) - (torch.cumsum(counts, 0) - counts)[owner]
        return counts, dense.node_ids[dense.nbrs[start[owner] + within]]

    return lookup
