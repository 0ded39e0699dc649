"""DENSE multi-hop neighbour sampling (MariusGNN's structure), vectorised over each frontier.

Sampling is uniform without replacement over a node's edge slots: a node with ``deg``
candidate edges and fanout ``k`` keeps all of them when ``k == -1`` or ``deg <= k``, and
otherwise a uniformly random ``k``-subset, so each candidate is kept with probability
``k / deg``. The subset is drawn with Floyd's algorithm, ``k`` vectorised steps over all the
frontier's high-degree nodes at once, so the cost is ``O(frontier * k^2)`` and never touches
the unsampled slots of a hub (random keys over every slot would cost the sum of the degrees).
Parallel edges are distinct slots, so a neighbour repeats in a sample only if the graph
repeats the edge (with ``direction="both"``, an edge present both ways counts twice).

Two backends draw the same distribution (not the same numbers for a seed):

* ``"native"``: the whole hop loop in a compiled C kernel (`graphstore.sample._native`,
  built at install time), one pass per batch on the CPU. Its random stream is seeded once
  per batch from the caller's generator, so a seed still gives the same DENSE.
* ``"torch"``: whole-frontier torch ops on the graph's device (the CUDA path, and the
  fallback when the kernel was not built); the only host synchronisations are the tensor
  sizes each hop produces.

``backend="auto"`` (the default) takes the kernel when it is loaded and the graph is on the
CPU, and torch otherwise.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from graphstore.errors import ConfigError
from graphstore.sample import _native
from graphstore.sample.base import DENSE, SampleGraph

__all__ = ["BACKENDS", "DIRECTIONS", "native_available", "new_workspace", "sample_dense", "sample_neighbours"]

DIRECTIONS = ("in", "both")
"""``"in"``: in-neighbours (the CSC); ``"both"``: in-neighbours then out-neighbours."""

BACKENDS = ("auto", "native", "torch")
"""``"native"``: the compiled kernel (CPU); ``"torch"``: torch ops on any device;
``"auto"``: native when it is loaded and the graph is on the CPU, else torch."""


def native_available() -> bool:
    """Whether the compiled DENSE kernel is built and loaded (see `graphstore.sample._native`).

    When it is not, ``graphstore.sample._native.load_error()`` says why, and
    ``backend="auto"`` uses torch.
    """
    return _native.library() is not None


def sample_neighbours(graph: SampleGraph, nodes: torch.Tensor, fanout: int, *,
                      generator: torch.Generator | None = None, direction: str = "in",
                      return_edge_ids: bool = False
                      ) -> tuple[torch.Tensor, ...]:
    """Draw one one-hop sample for every entry of ``nodes`` (repeats draw independently).

    Torch ops on the graph's device (this is the torch backend's hop; the compiled kernel
    does its hops inside `sample_dense`).

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
    return_edge_ids : bool
        Also return each sampled edge's position (see `sample_dense`).

    Returns
    -------
    counts : int64 tensor [n]
        ``min(deg, fanout)`` (``deg`` when fanout is -1), the size of each node's sample.
    nbrs : int64 tensor [counts.sum()]
        The samples' local ids, node after node in ``nodes`` order.
    edge_ids : int64 tensor [counts.sum()]
        Only with ``return_edge_ids``: position of each sampled edge in ``graph.indices``,
        or ``graph.indices.numel()`` + its position in ``graph.out_indices``.
    """
    device = nodes.device
    # index_select, not t[idx]: on CPU it is several times faster for 1-D gathers.
    # .to(int64) is a no-op for int64 graphs and widens int32 ones before any arithmetic.
    in_start = graph.indptr.index_select(0, nodes).to(torch.int64)
    in_deg = graph.indptr.index_select(0, nodes + 1).to(torch.int64) - in_start
    if direction == "both":
        out_start = graph.out_indptr.index_select(0, nodes).to(torch.int64)
        deg = in_deg + (graph.out_indptr.index_select(0, nodes + 1).to(torch.int64) - out_start)
    else:
        deg = in_deg
    counts = deg if fanout < 0 else torch.clamp(deg, max=fanout)
    total = int(counts.sum())
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return (counts, empty, empty) if return_edge_ids else (counts, empty)

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
        nbrs = graph.indices.index_select(0, pos).to(torch.int64)
        return (counts, nbrs, pos) if return_edge_ids else (counts, nbrs)

    owner = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), counts, output_size=total)
    slot = torch.arange(total, device=device) - seg_start.index_select(0, owner)
    if drawn is not None:
        slot[where] = chosen.reshape(-1)
    in_deg_e = in_deg.index_select(0, owner)
    is_in = slot < in_deg_e
    pos_in = torch.where(is_in, in_start.index_select(0, owner) + slot, 0)
    pos_out = torch.where(is_in, 0, out_start.index_select(0, owner) + slot - in_deg_e)
    nbrs = torch.where(is_in, graph.indices.index_select(0, pos_in).to(torch.int64),
                       graph.out_indices.index_select(0, pos_out).to(torch.int64))
    if not return_edge_ids:
        return counts, nbrs
    return counts, nbrs, torch.where(is_in, pos_in, pos_out + graph.indices.numel())


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


_INT32_LIMIT = 2**31 - 1


def new_workspace(graph: SampleGraph) -> torch.Tensor:
    """A `sample_dense` workspace for ``graph``: [num_nodes] of -1 on its device.

    int32 below 2**31 nodes, else int64. Its entries are looked up once per sampled edge at
    random, so half the bytes means fewer cache misses (about 8 % of the compiled kernel's
    time at four hops of 20 on a 2M-node graph).
    """
    dtype = torch.int32 if graph.num_nodes <= _INT32_LIMIT else torch.int64
    return torch.full((graph.num_nodes,), -1, dtype=dtype, device=graph.indptr.device)


def sample_dense(graph: SampleGraph, targets: torch.Tensor, fanouts: Sequence[int], *,
                 generator: torch.Generator | None = None, direction: str = "in",
                 workspace: torch.Tensor | None = None, return_edge_ids: bool = False,
                 backend: str = "auto") -> DENSE:
    """Sample the ``len(fanouts)``-hop neighbourhood of ``targets`` into a `DENSE`.

    Each node is sampled once, at the hop where it is first reached: the targets with
    ``fanouts[0]``, the new nodes of hop ``d`` with ``fanouts[d]``; nodes first reached at the
    last hop are not sampled. Layout: `graphstore.sample.base`.

    Parameters
    ----------
    graph : SampleGraph
        The resident graph; every tensor is made on ``graph.indptr.device``. Index arrays
        may be int32 or int64.
    targets : int tensor [T]
        Distinct local ids.
    fanouts : sequence of int, length L >= 1
        ``fanouts[0]`` is the hop nearest the targets (used by the last GNN layer); -1 = all.
    generator : torch.Generator, optional
        On the graph's device; the same seed gives the same DENSE (for one backend: the
        two backends draw the same distribution from different random streams).
    direction : {"in", "both"}
        In-neighbours (default), or in- and out-neighbours.
    workspace : int32 or int64 tensor [num_nodes], optional
        All -1, from `new_workspace`; handed back all -1 again. Passing the same one to every
        call saves allocating and filling ``num_nodes`` entries per batch, which dominates
        for small batches on a large graph. Not for concurrent calls. int32 only for graphs
        below 2**31 nodes.
    return_edge_ids : bool
        Also fill `DENSE.edge_ids`: the position of each sampled edge in ``graph.indices``
        (so ``graph.indices[edge_ids] == node_ids[nbrs]``), for per-edge data such as RGCN's
        relation types. With ``direction="both"`` an out-edge's id is
        ``graph.indices.numel()`` + its position in ``graph.out_indices``.
    backend : {"auto", "native", "torch"}
        ``"native"``: the compiled kernel (CPU only; `ConfigError` when it is not built);
        ``"torch"``: torch ops on the graph's device; ``"auto"``: native when available and
        the graph is on the CPU, else torch.

    Returns
    -------
    DENSE

    Raises
    ------
    ConfigError
        On a bad fanout, direction, backend, workspace, or target (out of range, repeated,
        not 1-D integer); with ``backend="native"`` when the kernel is unavailable or the
        graph is not on the CPU.
    """
    targets = _check(graph, targets, fanouts, direction)
    fanouts = tuple(int(f) for f in fanouts)
    device = targets.device
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS} (got {backend!r})")
    dtypes = (torch.int32, torch.int64) if graph.num_nodes <= _INT32_LIMIT else (torch.int64,)
    if workspace is not None and (workspace.shape != (graph.num_nodes,) or workspace.dtype not in dtypes
                                  or workspace.device != device or not workspace.is_contiguous()):
        raise ConfigError(f"workspace must be contiguous {' or '.join(map(str, dtypes))} [{graph.num_nodes}] "
                          f"on {device} (got {workspace.dtype} {list(workspace.shape)} on "
                          f"{workspace.device}); make it with new_workspace(graph)")
    if backend != "torch":
        why_not = _native.load_error() or _native.supports(graph)
        if why_not is None:
            return _dense_native(graph, targets, fanouts, generator, direction, workspace, return_edge_ids)
        if backend == "native":
            raise ConfigError(f"backend='native' cannot run: {why_not}; use backend='torch' or 'auto'")
    return _dense_torch(graph, targets, fanouts, generator, direction, workspace, return_edge_ids)


def _dense_native(graph: SampleGraph, targets: torch.Tensor, fanouts: tuple[int, ...],
                  generator: torch.Generator | None, direction: str, workspace: torch.Tensor | None,
                  return_edge_ids: bool) -> DENSE:
    """`sample_dense` through the compiled kernel (arguments checked by the caller)."""
    # One draw from the caller's generator seeds the kernel's stream for this batch, so the
    # generator's seed fixes the DENSE and consecutive batches get independent streams.
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, dtype=torch.int64))
    mark = new_workspace(graph) if workspace is None else workspace
    node_ids, sizes, nbrs, nbr_offsets, edge_ids = _native.sample_dense_native(
        graph, targets, fanouts, seed=seed, both=direction == "both", return_edge_ids=return_edge_ids,
        workspace=mark)
    return _assemble(node_ids, sizes, nbrs, nbr_offsets, edge_ids, fanouts, empty=_native.empty_int64)


def _assemble(node_ids: torch.Tensor, sizes: list[int], nbrs: torch.Tensor, nbr_offsets: torch.Tensor,
              edge_ids: torch.Tensor | None, fanouts: tuple[int, ...], empty=None) -> DENSE:
    """The DENSE of sampled arrays; ``sizes[h]`` = nodes first reached at hop ``h``.

    ``empty(n)`` makes the int64 [n] tensors of ``repr_map`` (default: a new tensor).
    """
    num_nodes = node_ids.numel()
    # Block i of node_ids is hop L - i, so it starts after every hop farther out.
    off, start = [], num_nodes
    for size in sizes:
        start -= size
        off.append(start)
    off = off[::-1]
    # Only L - 1 entries of nbr_offsets are needed on the host, not all S + 1.
    firsts = torch.tensor([off[k + 1] - off[1] for k in range(1, len(fanouts))], dtype=torch.int64,
                          device=nbr_offsets.device)
    starts = nbr_offsets[firsts].tolist()
    repr_map = [nbrs]
    for k, start in enumerate(starts, 1):
        tail = nbrs[start:]
        repr_map.append(tail - off[k] if empty is None else torch.sub(tail, off[k], out=empty(tail.numel())))
    node_id_offsets = torch.tensor(off, dtype=torch.int64, device=node_ids.device)
    return DENSE(node_ids, node_id_offsets, nbrs, nbr_offsets, tuple(repr_map), fanouts, edge_ids)


def _dense_torch(graph: SampleGraph, targets: torch.Tensor, fanouts: tuple[int, ...],
                 generator: torch.Generator | None, direction: str, workspace: torch.Tensor | None,
                 return_edge_ids: bool) -> DENSE:
    """`sample_dense` with whole-frontier torch ops (arguments checked by the caller)."""
    device = targets.device
    mark = new_workspace(graph) if workspace is None else workspace
    try:
        # mark[v] < 0: v not reached yet. The dedup is a scatter into this node-indexed map
        # rather than a sort of the samples: sorting (unique + searchsorted) was ~60% of the time.
        mark.index_fill_(0, targets, 0)
        blocks = [targets]
        nbrs_per_hop: list[torch.Tensor] = []
        counts_per_hop: list[torch.Tensor] = []
        ids_per_hop: list[torch.Tensor] = []
        frontier = targets
        for hop, fanout in enumerate(fanouts):
            counts, nbrs, *ids = sample_neighbours(graph, frontier, fanout, generator=generator,
                                                   direction=direction, return_edge_ids=return_edge_ids)
            candidates = nbrs[mark.index_select(0, nbrs) < 0]
            # Each unreached node keeps its first appearance: every appearance offers its
            # (negative, below -1) position key and amin keeps the earliest, deterministically
            # on every device, unlike a plain scatter whose winner among duplicates is unspecified.
            if mark.dtype == torch.int32 and candidates.numel() >= _INT32_LIMIT - 1:
                raise ConfigError(f"{candidates.numel()} sampled edges in one hop overflow an int32 "
                                  "workspace; pass an int64 one (torch.full((num_nodes,), -1))")
            key = torch.arange(candidates.numel(), device=device, dtype=mark.dtype) - (candidates.numel() + 1)
            mark.scatter_reduce_(0, candidates, key, "amin")
            new = candidates[mark.index_select(0, candidates) == key]
            mark.index_fill_(0, new, hop + 1)
            nbrs_per_hop.append(nbrs)
            counts_per_hop.append(counts)
            ids_per_hop += ids
            blocks.append(new)
            frontier = new

        # blocks[d] = nodes first reached at hop d; node_ids puts the outermost hop first.
        node_ids = torch.cat(blocks[::-1])
        num_nodes = node_ids.numel()
        # Now the map gives each reached node its node_ids index, which translates the samples.
        mark.index_copy_(0, node_ids, torch.arange(num_nodes, device=device, dtype=mark.dtype))
        nbrs = mark.index_select(0, torch.cat(nbrs_per_hop[::-1])).to(torch.int64)
    except BaseException:
        # A half-used workspace would silently corrupt the next batch: reset all of it.
        mark.fill_(-1)
        raise
    if workspace is not None:
        mark.index_fill_(0, node_ids, -1)
    counts = torch.cat(counts_per_hop[::-1])
    nbr_offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=nbr_offsets[1:])
    edge_ids = torch.cat(ids_per_hop[::-1]) if return_edge_ids else None
    return _assemble(node_ids, [b.numel() for b in blocks], nbrs, nbr_offsets, edge_ids, fanouts)
