"""DENSE multi-hop neighbour sampling (MariusGNN's structure), vectorised over each frontier.

Sampling is uniform without replacement over a node's edge slots: a node with ``deg``
candidate edges and fanout ``k`` keeps all of them when ``k == -1`` or ``deg <= k``, and
otherwise a uniformly random ``k``-subset, so each candidate is kept with probability
``k / deg``. The subset is drawn with Floyd's algorithm, ``k`` vectorised steps over all the
frontier's high-degree nodes at once, so the cost is ``O(frontier * k^2)`` and never touches
the unsampled slots of a hub (random keys over every slot would cost the sum of the degrees).
Parallel edges are distinct slots, so a neighbour repeats in a sample only if the graph
repeats the edge (with ``direction="both"``, an edge present both ways counts twice).

Everything runs with torch ops on the graph's device; the only host synchronisations are
the tensor sizes each hop produces.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from graphstore.errors import ConfigError
from graphstore.sample.base import DENSE, SampleGraph

__all__ = ["DIRECTIONS", "new_workspace", "sample_dense", "sample_neighbours"]

DIRECTIONS = ("in", "both")
"""``"in"``: in-neighbours (the CSC); ``"both"``: in-neighbours then out-neighbours."""


def sample_neighbours(graph: SampleGraph, nodes: torch.Tensor, fanout: int, *,
                      generator: torch.Generator | None = None,
                      direction: str = "in") -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one one-hop sample for every entry of ``nodes`` (repeats draw independently).

    Parameters
    ----------
    graph : SampleGraph
        The resident graph.
    nodes : int64 tensor [n]
        Local ids on the graph's device.
    fanout : int
        Sample size cap, ``-1`` for all neighbours, ``0`` for none.
    generator : torch.Generator, optional
        Source of randomness, on the graph's device.
    direction : {"in", "both"}
        Which neighbours are candidates.

    Returns
    -------
    counts : int64 tensor [n]
        ``min(deg, fanout)`` (``deg`` when fanout is -1), the size of each node's sample.
    nbrs : int64 tensor [counts.sum()]
        The samples' local ids, node after node in ``nodes`` order.
    """
    device = nodes.device
    # index_select, not t[idx]: on CPU it is several times faster for 1-D gathers.
    in_start = graph.indptr.index_select(0, nodes)
    in_deg = graph.indptr.index_select(0, nodes + 1) - in_start
    if direction == "both":
        out_start = graph.out_indptr.index_select(0, nodes)
        deg = in_deg + (graph.out_indptr.index_select(0, nodes + 1) - out_start)
    else:
        deg = in_deg
    counts = deg if fanout < 0 else torch.clamp(deg, max=fanout)
    total = int(counts.sum())
    if total == 0:
        return counts, torch.empty(0, dtype=torch.int64, device=device)

    # Entry i of the output takes slot `i - seg_start[owner]` of its owner's candidate
    # edges: the identity, right for the nodes that keep everything; the nodes with more
    # candidates than the fanout then get their drawn slots written over it.
    seg_start = torch.cumsum(counts, 0) - counts
    drawn = chosen = where = None
    if fanout > 0:
        drawn = torch.nonzero(deg > fanout).squeeze(1)
        if drawn.numel():
            chosen = _floyd(deg.index_select(0, drawn), fanout, generator)
            where = seg_start.index_select(0, drawn)[:, None] + torch.arange(fanout, device=device)
            where = where.reshape(-1)
        else:
            drawn = None

    if direction == "in":
        # Edge position directly: one repeat_interleave of the per-node shift, no owner gathers.
        pos = torch.repeat_interleave(in_start - seg_start, counts, output_size=total)
        pos += torch.arange(total, device=device)
        if drawn is not None:
            pos[where] = (in_start.index_select(0, drawn)[:, None] + chosen).reshape(-1)
        return counts, graph.indices.index_select(0, pos)

    owner = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), counts, output_size=total)
    slot = torch.arange(total, device=device) - seg_start.index_select(0, owner)
    if drawn is not None:
        slot[where] = chosen.reshape(-1)
    in_deg_e = in_deg.index_select(0, owner)
    is_in = slot < in_deg_e
    pos_in = torch.where(is_in, in_start.index_select(0, owner) + slot, 0)
    pos_out = torch.where(is_in, 0, out_start.index_select(0, owner) + slot - in_deg_e)
    nbrs = torch.where(is_in, graph.indices.index_select(0, pos_in),
                       graph.out_indices.index_select(0, pos_out))
    return counts, nbrs


def _floyd(deg: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """int64 [n, k]: for each row a uniform ``k``-subset of ``range(deg[i])`` (``deg > k``).

    Floyd's algorithm: for ``j = deg-k .. deg-1`` draw ``t`` in ``[0, j]`` and take ``t``, or
    ``j`` when ``t`` is already taken. Every ``k``-subset comes out with equal probability.
    """
    n = deg.numel()
    chosen = torch.empty(n, k, dtype=torch.int64, device=deg.device)
    # float64 keeps floor(u * (j + 1)) unbiased for any degree below 2**40 or so.
    uniform = torch.rand(n, k, dtype=torch.float64, device=deg.device, generator=generator)
    for i in range(k):
        j = deg - k + i
        t = torch.minimum((uniform[:, i] * (j + 1).to(torch.float64)).to(torch.int64), j)
        if i:
            taken = (chosen[:, :i] == t[:, None]).any(1)
            t = torch.where(taken, j, t)
        chosen[:, i] = t
    return chosen


def _check(graph: SampleGraph, targets: torch.Tensor, fanouts: Sequence[int], direction: str) -> torch.Tensor:
    """Validate the arguments of `sample_dense`; return the targets as int64 on the graph's device."""
    if direction not in DIRECTIONS:
        raise ConfigError(f"direction must be one of {DIRECTIONS} (got {direction!r})")
    if direction == "both" and (graph.out_indptr is None or graph.out_indices is None):
        raise ConfigError("direction='both' needs out_indptr/out_indices on the graph; build it with them")
    if len(fanouts) == 0:
        raise ConfigError("fanouts must name at least one hop (got an empty sequence)")
    for f in fanouts:
        # numbers.Integral admits numpy integers from a config; bool is refused as a likely slip.
        if isinstance(f, bool) or not isinstance(f, numbers.Integral) or f < -1:
            raise ConfigError(f"each fanout must be an int >= -1, -1 meaning all neighbours (got {f!r})")
    targets = torch.as_tensor(targets)
    if targets.dim() != 1 or targets.is_floating_point() or targets.is_complex():
        raise ConfigError(f"targets must be a 1-D integer tensor (got {targets.dtype} of shape "
                          f"{tuple(targets.shape)})")
    targets = targets.to(device=graph.indptr.device, dtype=torch.int64)
    if targets.numel():
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= graph.num_nodes:
            raise ConfigError(f"targets must be local ids in [0, {graph.num_nodes}) (got [{lo}, {hi}])")
        if torch.unique(targets).numel() != targets.numel():
            raise ConfigError("targets must be distinct; de-duplicate them (torch.unique) first")
    return targets


def new_workspace(graph: SampleGraph) -> torch.Tensor:
    """A `sample_dense` workspace for ``graph``: int64 [num_nodes] of -1 on its device."""
    return torch.full((graph.num_nodes,), -1, dtype=torch.int64, device=graph.indptr.device)


def sample_dense(graph: SampleGraph, targets: torch.Tensor, fanouts: Sequence[int], *,
                 generator: torch.Generator | None = None, direction: str = "in",
                 workspace: torch.Tensor | None = None) -> DENSE:
    """Sample the ``len(fanouts)``-hop neighbourhood of ``targets`` into a `DENSE`.

    Each node is sampled once, at the hop where it is first reached: the targets with
    ``fanouts[0]``, the new nodes of hop ``d`` with ``fanouts[d]``; nodes first reached at the
    last hop are not sampled. Layout: `graphstore.sample.base`.

    Parameters
    ----------
    graph : SampleGraph
        The resident graph; every tensor is made on ``graph.indptr.device``.
    targets : int tensor [T]
        Distinct local ids.
    fanouts : sequence of int, length L >= 1
        ``fanouts[0]`` is the hop nearest the targets (used by the last GNN layer); -1 = all.
    generator : torch.Generator, optional
        On the graph's device; the same seed gives the same DENSE.
    direction : {"in", "both"}
        In-neighbours (default), or in- and out-neighbours.
    workspace : int64 tensor [num_nodes], optional
        All -1, from `new_workspace`; handed back all -1 again. Passing the same one to every
        call saves allocating and filling ``num_nodes`` entries per batch, which dominates
        for small batches on a large graph. Not for concurrent calls.

    Returns
    -------
    DENSE

    Raises
    ------
    ConfigError
        On a bad fanout, direction, workspace, or target (out of range, repeated, not 1-D
        integer).
    """
    targets = _check(graph, targets, fanouts, direction)
    device = targets.device
    if workspace is None:
        mark = new_workspace(graph)
    elif (workspace.shape != (graph.num_nodes,) or workspace.dtype != torch.int64
          or workspace.device != device):
        raise ConfigError(f"workspace must be int64 [{graph.num_nodes}] on {device} (got {workspace.dtype} "
                          f"{list(workspace.shape)} on {workspace.device}); "
                          "make it with new_workspace(graph)")
    else:
        mark = workspace
    try:
        # mark[v] < 0: v not reached yet. The dedup is a scatter into this node-indexed map
        # rather than a sort of the samples: sorting (unique + searchsorted) was ~60% of the time.
        mark.index_fill_(0, targets, 0)
        blocks = [targets]
        nbrs_per_hop: list[torch.Tensor] = []
        counts_per_hop: list[torch.Tensor] = []
        frontier = targets
        for hop, fanout in enumerate(fanouts):
            counts, nbrs = sample_neighbours(graph, frontier, fanout, generator=generator,
                                             direction=direction)
            candidates = nbrs[mark.index_select(0, nbrs) < 0]
            # Each unreached node keeps its first appearance: every appearance offers its
            # (negative, below -1) position key and amin keeps the earliest, deterministically
            # on every device, unlike a plain scatter whose winner among duplicates is unspecified.
            key = torch.arange(candidates.numel(), device=device) - (candidates.numel() + 1)
            mark.scatter_reduce_(0, candidates, key, "amin")
            new = candidates[mark.index_select(0, candidates) == key]
            mark.index_fill_(0, new, hop + 1)
            nbrs_per_hop.append(nbrs)
            counts_per_hop.append(counts)
            blocks.append(new)
            frontier = new

        # blocks[d] = nodes first reached at hop d; node_ids puts the outermost hop first.
        node_ids = torch.cat(blocks[::-1])
        num_nodes = node_ids.numel()
        sizes = torch.tensor([b.numel() for b in blocks], dtype=torch.int64, device=device)
        node_id_offsets = torch.flip(num_nodes - torch.cumsum(sizes, 0), (0,))
        # Now the map gives each reached node its node_ids index, which translates the samples.
        mark.index_copy_(0, node_ids, torch.arange(num_nodes, device=device))
        nbrs = mark.index_select(0, torch.cat(nbrs_per_hop[::-1]))
    except BaseException:
        # A half-used workspace would silently corrupt the next batch: reset all of it.
        mark.fill_(-1)
        raise
    if workspace is not None:
        mark.index_fill_(0, node_ids, -1)
    counts = torch.cat(counts_per_hop[::-1])
    nbr_offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=nbr_offsets[1:])

    off = node_id_offsets.tolist()
    # Only L - 1 entries of nbr_offsets are needed on the host, not all S + 1.
    firsts = torch.tensor([off[k + 1] - off[1] for k in range(1, len(fanouts))], dtype=torch.int64,
                          device=device)
    starts = nbr_offsets[firsts].tolist()
    repr_map = [nbrs] + [nbrs[start:] - off[k] for k, start in enumerate(starts, 1)]
    return DENSE(node_ids, node_id_offsets, nbrs, nbr_offsets, tuple(repr_map),
                 tuple(int(f) for f in fanouts))
