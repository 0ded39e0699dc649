"""Micro-batching (Betty): split one sampled batch into K micro-batches that together compute
exactly what the whole batch computes, so a batch too big for device memory keeps its size
(and its convergence behaviour) and accumulates K gradients into one update.

A split partitions the batch's *targets* (output nodes) into K groups; micro-batch ``m`` is
then the dependency closure of group ``m`` through all L layers, cut out of the parent
`DENSE` with the parent's own samples (nothing is resampled). Every micro-batch is a valid
`DENSE` with the parent's fanouts: a node keeps its parent sample, and its hop becomes its
distance from the group in the sampled graph (at least its parent hop, so it has a sample
whenever the micro-batch needs one). Inside a hop block the nodes are in the order they
first appear in the samples of the previous block, as `sample_dense` orders them, so with
``fanouts = (-1, ...)`` a micro-batch equals ``sample_dense(graph, group, fanouts)``.

Nodes needed by several groups appear in several micro-batches: that *redundancy* (the
total input nodes over the K micro-batches, `total_inputs`) is what the split strategies
differ in (`STRATEGIES`):

* ``"reg"``: Betty's redundancy-embedded graph. Targets ``t1, t2`` are joined by an edge
  of weight ``C[t1, t2]`` = the number of nodes both need, ``C = A^T A`` with
  ``A[u, t] = 1`` when ``u`` is in the ``reg_hops``-hop closure of ``t`` (default one hop:
  ``t`` and its sample; ``reg_hops = L`` uses the whole receptive field), and METIS cuts
  the least weight, i.e. splits the fewest shared inputs. A node shared by ``H`` targets
  adds ``H * (H - 1)`` entries to ``C``; nodes shared by more than ``hub_threshold``
  targets are left out (see `partition_targets`).
* ``"metis"``: METIS on the graph the targets induce in the batch's first-hop samples
  (target ``t1`` sampled ``t2``), unweighted.
* ``"random"``: a seeded uniform assignment into K near-equal groups.
* ``"range"``: K contiguous slices of the targets in batch order.

Every strategy puts each target in exactly one group and leaves no group empty.

`choose_micro_batches` picks the smallest K whose largest micro-batch fits a memory budget
under an estimator (`graphstore.nn.step_estimator`); `loss_weights` gives each
micro-batch's share of the loss, which `graphstore.nn.micro_batch_backward` uses to
accumulate exactly the whole batch's gradient.

Examples
--------
>>> from graphstore.sample import CSCGraph, sample_dense
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 3]), torch.tensor([0, 0, 1, 2]), num_nodes=4)
>>> dense = sample_dense(g, torch.tensor([0, 1, 2]), (-1,))
>>> parts = split_dense(dense, 2, strategy="range")
>>> [p.dense.targets.tolist() for p in parts]
[[0, 1], [2]]
>>> dense.node_ids.tolist()
[3, 0, 1, 2]
>>> [p.dense.node_ids.tolist() for p in parts], [p.rows.tolist() for p in parts]
([[2, 3, 0, 1], [3, 2]], [[3, 0, 1, 2], [0, 3]])

Target 0 samples node 2 and target 2 samples node 3, so both groups need nodes 2 and 3:

>>> total_inputs(parts), dense.num_nodes
(6, 4)
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from graphstore._metis import metis_parts
from graphstore.errors import ConfigError
from graphstore.registry import Registry
from graphstore.sample.base import DENSE, Batch
from graphstore.sample.dense import _assemble

__all__ = [
    "STRATEGIES",
    "DenseSizes",
    "MicroBatch",
    "TargetGrouping",
    "choose_micro_batches",
    "dense_sizes",
    "loss_weights",
    "micro_batch_sizes",
    "micro_batches",
    "partition_targets",
    "split_dense",
    "total_inputs",
]

logger = logging.getLogger(__name__)


class TargetGrouping(Protocol):
    """A micro-batch strategy: how `partition_targets` groups the targets.

    Called with validated arguments and ``1 < k < T`` (one group, or one target per group,
    needs no strategy). Returns int64 [T], the group of each target in ``0 .. k-1`` with
    none empty; the same ``seed`` must give the same groups. ``memo`` is one dict per batch
    and options, kept across the K that `choose_micro_batches` tries: a strategy stores
    there what does not depend on K (e.g. the graph it hands METIS). A strategy takes the
    keywords it does not use as ``**_``, so a new option reaches only those that want it.
    Register one with ``@STRATEGIES.register(name, summary=...)``.
    """

    def __call__(self, dense: DENSE, k: int, *, seed: int, reg_hops: int, hub_threshold: int,
                 memo: dict) -> torch.Tensor: ...


STRATEGIES: Registry[TargetGrouping] = Registry("micro-batch strategy")
"""How `partition_targets` groups the targets, by name; see the module docstring."""

DEFAULT_HUB_THRESHOLD = 64
"""``reg``: nodes shared by more targets than this add no REG edges (cost guard)."""


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One micro-batch: a `DENSE` and where its pieces sit in the parent batch.

    The parent's gathered rows are reused by slicing: ``parent.features[rows]`` is the
    micro-batch's input, ``parent.labels[target_index]`` its labels, per-edge data aligned
    with the parent's ``nbrs`` (RGCN's relations) is ``edge_type[edges]``, and per-node data
    aligned with the parent's ``node_ids`` (GCN's degrees) is ``degrees[rows]``.
    """

    dense: DENSE
    """The closure of the micro-batch's targets, a valid DENSE with the parent's fanouts."""
    rows: torch.Tensor
    """int64 [N_m], position of each ``dense.node_ids`` entry in the parent's ``node_ids``."""
    edges: torch.Tensor
    """int64 [E_m], position of each ``dense.nbrs`` entry in the parent's ``nbrs``."""
    target_index: torch.Tensor
    """int64 [T_m], position of each of ``dense.targets`` among the parent's targets,
    ascending (the targets keep the parent's order)."""

    def batch(self, parent: Batch) -> Batch:
        """The micro-batch's `Batch`, sliced from the parent's gathered features and labels."""
        labels = None if parent.labels is None else parent.labels[self.target_index.to(parent.labels.device)]
        return Batch(self.dense, parent.features[self.rows.to(parent.features.device)], labels)


@dataclass(frozen=True, slots=True)
class DenseSizes:
    """The sizes a memory estimate needs, without the tensors (`dense_sizes`)."""

    num_nodes: int
    """N, input rows of the first layer."""
    num_targets: int
    """T, output rows of the last layer."""
    layers: tuple[tuple[int, int, int], ...]
    """Per GNN layer ``k`` (0 = input layer): ``(num_inputs, num_outputs, num_edges)``."""


def dense_sizes(dense: DENSE) -> DenseSizes:
    """The `DenseSizes` of a DENSE (one host copy of its offsets)."""
    n, num_layers = dense.num_nodes, dense.num_layers
    off = dense.node_id_offsets.tolist() + [n]
    firsts = [off[k + 1] - off[1] for k in range(num_layers)]
    starts = dense.nbr_offsets[torch.tensor(firsts, device=dense.nbr_offsets.device)].tolist()
    total = dense.num_edges
    layers = tuple((n - off[k], n - off[k + 1], total - starts[k]) for k in range(num_layers))
    return DenseSizes(n, dense.num_targets, layers)


# ------------------------------------------------------------------------------ closures


def _segments(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """int64 [counts.sum()]: ``starts[i] .. starts[i] + counts[i] - 1`` for every i, in order."""
    total = int(counts.sum())
    shift = starts - (torch.cumsum(counts, 0) - counts)
    spread = torch.repeat_interleave(shift, counts, output_size=total)
    return spread + torch.arange(total, device=starts.device)


def _closures(dense: DENSE, parts: torch.Tensor, num_hops: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The closure of every group of targets at once, hop by hop.

    Returns ``blocks[d] = (part, index)`` for ``d = 0 .. num_hops``: the (group, parent
    position) pairs first reached at hop ``d`` of the group's closure, grouped by group
    (ascending) and, inside a group, in first-appearance order (targets: parent order).
    Working on pairs keeps it vectorised over all groups: each hop is one CSR gather, one
    membership test and one first-occurrence dedup of the keys ``part * N + index``.
    """
    n = dense.num_nodes
    off = dense.node_id_offsets.tolist()
    sampled_from = off[1]  # only node_ids[off[1]:] have samples
    sizes = dense.nbr_offsets.diff()
    order = torch.sort(parts, stable=True).indices
    part, index = parts.index_select(0, order), order + off[-1]
    blocks = [(part, index)]
    visited = torch.sort(part * n + index).values
    for _ in range(num_hops):
        local = index - sampled_from
        counts = sizes.index_select(0, local)
        pos = _segments(dense.nbr_offsets.index_select(0, local), counts)
        owner = torch.repeat_interleave(part, counts, output_size=pos.numel())
        key = owner * n + dense.nbrs.index_select(0, pos)
        # Membership by binary search in the sorted visited keys (torch.isin sorts both sides).
        at = torch.searchsorted(visited, key).clamp_(max=max(visited.numel() - 1, 0))
        key = key[visited.index_select(0, at) != key]
        unique, inverse = torch.unique(key, return_inverse=True)
        # First appearance of each new key; sorting by it keeps groups together (candidates
        # are grouped by group already) and reproduces sample_dense's in-block order.
        first = torch.full((unique.numel(),), key.numel(), dtype=torch.int64, device=key.device)
        first.scatter_reduce_(0, inverse, torch.arange(key.numel(), device=key.device), "amin")
        key = key.index_select(0, torch.sort(first).values)
        part, index = key // n, key % n
        blocks.append((part, index))
        visited = torch.sort(torch.cat([visited, unique])).values
    return blocks


def _check_parts(dense: DENSE, parts: torch.Tensor) -> tuple[torch.Tensor, int]:
    parts = torch.as_tensor(parts).to(device=dense.node_ids.device, dtype=torch.int64)
    t = dense.num_targets
    if parts.shape != (t,):
        raise ConfigError(f"parts must hold one group per target, shape [{t}] (got {list(parts.shape)})")
    if t == 0:
        raise ConfigError("cannot split a batch without targets")
    k = int(parts.max()) + 1
    if int(parts.min()) < 0 or torch.bincount(parts, minlength=k).min() == 0:
        raise ConfigError(f"parts must number the groups 0 .. K-1 with none empty (got groups "
                          f"{torch.unique(parts).tolist()[:20]})")
    return parts, k


def micro_batches(dense: DENSE, parts: torch.Tensor) -> list[MicroBatch]:
    """Cut ``dense`` into one `MicroBatch` per group of targets.

    Parameters
    ----------
    dense : DENSE
        The whole batch.
    parts : int tensor [T]
        Group of each target, numbered ``0 .. K-1``, none empty (`partition_targets`).

    Returns
    -------
    list of MicroBatch, length K
        Group ``m``'s targets in parent order, with their closure through all layers. With
        one group, the parent DENSE itself.

    Raises
    ------
    ConfigError
        If ``parts`` has the wrong shape or an empty or negative group.
    """
    parts, k = _check_parts(dense, parts)
    device = dense.node_ids.device
    if k == 1:
        return [MicroBatch(dense, torch.arange(dense.num_nodes, device=device),
                           torch.arange(dense.num_edges, device=device),
                           torch.arange(dense.num_targets, device=device))]
    num_layers = dense.num_layers
    off = dense.node_id_offsets.tolist()
    sampled_from = off[1]
    blocks = _closures(dense, parts, num_layers)
    # Group m's slice of block d is [bounds[d][m], bounds[d][m + 1]).
    bounds = []
    for part, _ in blocks:
        b = torch.zeros(k + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(part, minlength=k).cpu(), 0, out=b[1:])
        bounds.append(b.tolist())
    scratch = torch.empty(dense.num_nodes, dtype=torch.int64, device=device)
    sample_sizes = dense.nbr_offsets.diff()
    out = []
    for m in range(k):
        hop_rows = [index[bounds[d][m]:bounds[d][m + 1]] for d, (_, index) in enumerate(blocks)]
        rows = torch.cat(hop_rows[::-1])
        num_sampled = rows.numel() - hop_rows[-1].numel()
        sampled = rows[rows.numel() - num_sampled:] - sampled_from
        counts = sample_sizes.index_select(0, sampled)
        edges = _segments(dense.nbr_offsets.index_select(0, sampled), counts)
        # Every sampled neighbour is in the closure, so each lookup hits an entry written here.
        scratch.index_copy_(0, rows, torch.arange(rows.numel(), device=device))
        nbrs = scratch.index_select(0, dense.nbrs.index_select(0, edges))
        nbr_offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=nbr_offsets[1:])
        edge_ids = None if dense.edge_ids is None else dense.edge_ids.index_select(0, edges)
        sub = _assemble(dense.node_ids.index_select(0, rows), [r.numel() for r in hop_rows], nbrs,
                        nbr_offsets, edge_ids, dense.fanouts)
        out.append(MicroBatch(sub, rows, edges, hop_rows[0] - off[-1]))
    return out


def micro_batch_sizes(dense: DENSE, parts: torch.Tensor) -> list[DenseSizes]:
    """`DenseSizes` of every micro-batch of ``parts`` without building them (for choosing K)."""
    parts, k = _check_parts(dense, parts)
    num_layers = dense.num_layers
    off = dense.node_id_offsets.tolist()
    sampled_from = off[1]
    blocks = _closures(dense, parts, num_layers)
    sizes = dense.nbr_offsets.diff()
    nodes = torch.stack([torch.bincount(part, minlength=k) for part, _ in blocks]).cpu()       # [L+1, K]
    edges = torch.stack([torch.bincount(part, weights=sizes.index_select(0, index - sampled_from).double(),
                                        minlength=k).to(torch.int64) for part, index in blocks[:-1]]).cpu()
    # Layer j reads the nodes within L - j hops and writes those within L - 1 - j.
    within = torch.cumsum(nodes, 0).tolist()
    edges_within = torch.cumsum(edges, 0).tolist()
    return [DenseSizes(within[num_layers][m], within[0][m],
                       tuple((within[num_layers - j][m], within[num_layers - 1 - j][m],
                              edges_within[num_layers - 1 - j][m]) for j in range(num_layers)))
            for m in range(k)]


def total_inputs(parts: Sequence[MicroBatch] | Sequence[DenseSizes]) -> int:
    """Input nodes summed over the micro-batches (the parent's N plus the redundancy)."""
    return sum(p.dense.num_nodes if isinstance(p, MicroBatch) else p.num_nodes for p in parts)


# ---------------------------------------------------------------------------- strategies


def _balanced(order: torch.Tensor, k: int) -> torch.Tensor:
    """Groups of near-equal size: the i-th target of ``order`` goes to group ``i * k // T``."""
    t = order.numel()
    parts = torch.empty(t, dtype=torch.int64, device=order.device)
    parts[order] = torch.arange(t, device=order.device) * k // t
    return parts


def _metis(num_nodes: int, src: torch.Tensor, dst: torch.Tensor, weight: torch.Tensor | None,
           k: int, seed: int) -> torch.Tensor:
    """METIS k-way labels of the symmetric graph ``src -> dst`` (both directions listed)."""
    src, dst = src.cpu().numpy(), dst.cpu().numpy()
    order = np.lexsort((dst, src))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=num_nodes), out=indptr[1:])
    edge_weights = None if weight is None else weight.cpu().numpy()[order]
    parts, _ = metis_parts(indptr, dst[order], k, edge_weights=edge_weights, seed=seed)
    return torch.as_tensor(parts)


def _fill_empty(parts: torch.Tensor, k: int) -> torch.Tensor:
    """Move one target from the largest group into each empty one (METIS may leave some)."""
    sizes = torch.bincount(parts, minlength=k)
    for empty in torch.nonzero(sizes == 0).flatten().tolist():
        largest = int(torch.argmax(sizes))
        victim = int(torch.nonzero(parts == largest)[-1])
        parts[victim] = empty
        sizes[largest] -= 1
        sizes[empty] += 1
    return parts


def _reg_edges(dense: DENSE, reg_hops: int, hub_threshold: int) -> tuple[torch.Tensor, ...]:
    """The redundancy-embedded graph: (t1, t2, weight) for t1 != t2 sharing a closure node."""
    t = dense.num_targets
    # Each target its own group: the pairs are A's non-zeros (target, node).
    blocks = _closures(dense, torch.arange(t, device=dense.node_ids.device), reg_hops)
    target = torch.cat([b[0] for b in blocks])
    node = torch.cat([b[1] for b in blocks])
    order = torch.sort(node, stable=True).indices
    target, node = target.index_select(0, order), node.index_select(0, order)
    _, shared = torch.unique_consecutive(node, return_counts=True)
    # Hub guard: a node shared by g targets adds g * (g - 1) entries to C. A node in more
    # than hub_threshold closures is duplicated into most micro-batches whatever the split,
    # so its edges carry little signal at a quadratic cost: leave it out.
    starts = torch.cumsum(shared, 0) - shared
    keep = (shared > 1) & (shared <= hub_threshold)
    starts, shared = starts[keep], shared[keep]
    square = shared * shared
    total = int(square.sum())
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=node.device)
        return empty, empty, empty
    group = torch.repeat_interleave(torch.arange(shared.numel(), device=node.device), square,
                                    output_size=total)
    r = torch.arange(total, device=node.device) - (torch.cumsum(square, 0) - square).index_select(0, group)
    g = shared.index_select(0, group)
    i, j = r // g, r % g
    off_diag = i != j
    base = starts.index_select(0, group)
    a = target.index_select(0, (base + i)[off_diag])
    b = target.index_select(0, (base + j)[off_diag])
    key, weight = torch.unique(a * t + b, return_counts=True)
    return key // t, key % t, weight


def partition_targets(dense: DENSE, num_micro_batches: int, *, strategy: str = "reg", seed: int = 0,
                      reg_hops: int = 1, hub_threshold: int = DEFAULT_HUB_THRESHOLD) -> torch.Tensor:
    """Group the targets of ``dense`` into ``num_micro_batches`` non-empty groups.

    Parameters
    ----------
    dense : DENSE
        The sampled batch.
    num_micro_batches : int
        K, in ``[1, T]``.
    strategy : str
        A name in `STRATEGIES`: ``"reg"``, ``"metis"``, ``"random"``, ``"range"`` (see the
        module docstring) or one registered there.
    seed : int
        Seeds ``random`` and METIS (``reg``, ``metis``): a seed gives the same groups.
    reg_hops : int
        ``reg``: how far the shared-input count looks, in ``[1, L]``: 1 (default) counts the
        shared nodes of the targets' first hop (each target and its sample, the inputs of
        the last layer), ``L`` those of the whole receptive field (more faithful to the
        redundancy of early layers, more pairs to count).
    hub_threshold : int
        ``reg``: a node in more than this many targets' closures adds no edge to the REG
        (it costs ``g^2`` pairs for ``g`` targets, and is duplicated across micro-batches
        whatever the split). The graph then has at most ``pairs * hub_threshold`` entries
        for ``pairs`` = the non-zeros of ``A``.

    Returns
    -------
    int64 tensor [T]
        Group of each target, ``0 .. K-1``, every group non-empty. METIS balances the
        number of targets per group (its default 3 % imbalance).

    Raises
    ------
    ConfigError
        On an unknown strategy, K outside ``[1, T]``, or a bad ``reg_hops``/``hub_threshold``.
    """
    t, k = dense.num_targets, num_micro_batches
    group = STRATEGIES.get(strategy)
    # numbers.Integral admits numpy integers from a config; bool is refused as a likely slip.
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= max(t, 1):
        raise ConfigError(f"number of micro-batches must be an int in [1, {t}] (the batch has {t} targets; "
                          f"got {k!r}); use fewer micro-batches or a larger batch")
    if t == 0:
        raise ConfigError("cannot split a batch without targets")
    if not 1 <= reg_hops <= dense.num_layers:
        raise ConfigError(f"reg_hops must be in [1, {dense.num_layers}] (got {reg_hops})")
    if hub_threshold < 2:
        raise ConfigError(f"hub_threshold must be at least 2 (got {hub_threshold})")
    return _partition(dense, int(k), group, seed=seed, reg_hops=reg_hops, hub_threshold=hub_threshold,
                      memo={})


def _partition(dense: DENSE, k: int, group: TargetGrouping, **options) -> torch.Tensor:
    """`partition_targets` after the checks; ``options`` are ``group``'s keywords."""
    t, device = dense.num_targets, dense.node_ids.device
    if k == 1:
        return torch.zeros(t, dtype=torch.int64, device=device)
    if k == t:
        return torch.arange(t, device=device)
    return group(dense, k, **options)


@STRATEGIES.register("range", summary="K contiguous slices of the targets in batch order")
def _range_groups(dense: DENSE, k: int, **_) -> torch.Tensor:
    return _balanced(torch.arange(dense.num_targets, device=dense.node_ids.device), k)


@STRATEGIES.register("random", summary="a seeded uniform assignment into K near-equal groups")
def _random_groups(dense: DENSE, k: int, *, seed: int, **_) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return _balanced(torch.randperm(dense.num_targets, generator=gen).to(dense.node_ids.device), k)


@STRATEGIES.register("metis", summary="METIS on the graph the targets induce in their first-hop samples")
def _metis_groups(dense: DENSE, k: int, *, seed: int, memo: dict, **_) -> torch.Tensor:
    if "graph" not in memo:
        memo["graph"] = _sample_graph(dense)
    return _metis_on_targets(dense, k, seed, *memo["graph"])


@STRATEGIES.register("reg", summary="METIS on Betty's redundancy-embedded graph (fewest shared inputs)")
def _reg_groups(dense: DENSE, k: int, *, seed: int, reg_hops: int, hub_threshold: int, memo: dict,
                **_) -> torch.Tensor:
    if "graph" not in memo:
        memo["graph"] = _reg_edges(dense, reg_hops, hub_threshold)
    return _metis_on_targets(dense, k, seed, *memo["graph"])


def _metis_on_targets(dense: DENSE, k: int, seed: int, src: torch.Tensor, dst: torch.Tensor,
                      weight: torch.Tensor | None) -> torch.Tensor:
    parts = _metis(dense.num_targets, src, dst, weight, k, seed).to(dense.node_ids.device)
    return _fill_empty(parts, k)


def _sample_graph(dense: DENSE) -> tuple[torch.Tensor, torch.Tensor, None]:
    """``metis``'s graph over the targets: (src, dst, None), both directions listed."""
    t, device = dense.num_targets, dense.node_ids.device
    # Target-to-target samples of the last layer; listed both ways, self loops and
    # repeats dropped (METIS needs a simple symmetric graph).
    off_t = int(dense.node_id_offsets[-1])
    first = off_t - int(dense.node_id_offsets[1])
    start = int(dense.nbr_offsets[first])
    counts = dense.nbr_offsets.diff()[first:]
    owner = torch.repeat_interleave(torch.arange(t, device=device), counts)
    nbr = dense.nbrs[start:] - off_t
    inside = (nbr >= 0) & (nbr != owner)
    a, b = owner[inside], nbr[inside]
    key = torch.unique(torch.cat([a * t + b, b * t + a]))
    return key // t, key % t, None


def split_dense(dense: DENSE, num_micro_batches: int, *, strategy: str = "reg", seed: int = 0,
                reg_hops: int = 1, hub_threshold: int = DEFAULT_HUB_THRESHOLD) -> list[MicroBatch]:
    """Split ``dense`` into ``num_micro_batches`` micro-batches (`partition_targets`, then
    `micro_batches`); arguments as for `partition_targets`.

    Raises
    ------
    ConfigError
        As `partition_targets`, e.g. for more micro-batches than targets.
    """
    parts = partition_targets(dense, num_micro_batches, strategy=strategy, seed=seed, reg_hops=reg_hops,
                              hub_threshold=hub_threshold)
    return micro_batches(dense, parts)


def choose_micro_batches(dense: DENSE, budget_bytes: int, *, estimator: Callable[[DenseSizes], int],
                         strategy: str = "reg", seed: int = 0, reg_hops: int = 1,
                         hub_threshold: int = DEFAULT_HUB_THRESHOLD, start_k: int = 1) -> list[MicroBatch]:
    """The split into the fewest micro-batches whose largest estimate fits ``budget_bytes``,
    searched from ``start_k``.

    K = ``start_k`` is tried first. When it fits, K goes down while the next smaller K fits
    too, and the last that fits wins; when it does not, K goes up until one fits. From
    ``start_k = 1`` that is the fewest fitting K (every smaller K was tried); a trainer
    passes the previous batch's K, so consecutive batches of similar size cost one or two
    partitions each instead of one per K from 1 (a split's largest micro-batch need not
    shrink monotonically with K under METIS, so no bisection, and from a larger start the
    answer is the fewest fitting K down to the first that does not fit). Each try costs one
    partition and the closure sizes (`micro_batch_sizes`); only the chosen K is built.
    Whether one target per micro-batch fits (else nothing does) is checked only when the
    search has to go up: it costs a closure per target.

    Parameters
    ----------
    dense : DENSE
        The batch.
    budget_bytes : int
        Memory budget of one micro-batch's training step.
    estimator : callable
        `DenseSizes` -> bytes, e.g. ``graphstore.nn.step_estimator(model)``.
    strategy, seed, reg_hops, hub_threshold
        As for `partition_targets`.
    start_k : int
        Where the search starts (clamped to ``[1, T]``), e.g. the previous batch's K.

    Returns
    -------
    list of MicroBatch

    Raises
    ------
    ConfigError
        If even one target per micro-batch does not fit.
    """
    t = dense.num_targets
    if t == 0:
        raise ConfigError("cannot split a batch without targets")
    partition_targets(dense, 1, strategy=strategy, seed=seed, reg_hops=reg_hops,
                      hub_threshold=hub_threshold)  # validates the arguments
    group = STRATEGIES.get(strategy)
    memo: dict = {}  # what the strategy builds once for every K of the search (METIS's graph)

    def fitting(k: int) -> torch.Tensor | None:
        parts = _partition(dense, k, group, seed=seed, reg_hops=reg_hops, hub_threshold=hub_threshold,
                           memo=memo)
        worst = max(estimator(s) for s in micro_batch_sizes(dense, parts))
        return parts if worst <= budget_bytes else None

    k = min(max(int(start_k), 1), t)
    parts = fitting(k)
    if parts is not None:
        while k > 1 and (smaller := fitting(k - 1)) is not None:
            k, parts = k - 1, smaller
    else:
        # One target per micro-batch is the finest split: when it does not fit, none does,
        # and saying so at once spares trying every K up to T.
        singles = torch.arange(t, device=dense.node_ids.device)
        worst = max(estimator(s) for s in micro_batch_sizes(dense, singles))
        if worst > budget_bytes:
            raise ConfigError(f"even {t} micro-batches of one target each need up to {worst} bytes, over the "
                              f"budget of {budget_bytes} bytes; raise the budget or shrink the model or fanouts")
        while parts is None:
            k += 1
            parts = fitting(k)
    logger.debug("micro-batches: K=%d fits the budget of %d bytes (search from K=%d)", k, budget_bytes, start_k)
    return micro_batches(dense, parts)


def loss_weights(parts: Sequence[MicroBatch], labels: torch.Tensor | None = None, *,
                 ignore_index: int = -1) -> torch.Tensor:
    """float64 [K]: each micro-batch's share of the batch's labelled targets.

    With the whole batch's loss a mean over its labelled targets (``cross_entropy(...,
    ignore_index=-1)``), the mean over micro-batch ``m`` times ``weights[m]`` summed over m
    is that mean, so gradients accumulated this way equal the whole batch's. A micro-batch
    with no labelled target gets weight 0 (skip its backward: its mean loss is NaN).

    Parameters
    ----------
    parts : sequence of MicroBatch
    labels : tensor [T], optional
        The parent's target labels; None counts every target.
    ignore_index : int
        Label of an unlabelled target.
    """
    if labels is None:
        counts = torch.tensor([p.target_index.numel() for p in parts], dtype=torch.float64)
    else:
        counts = torch.tensor([int((labels[p.target_index.to(labels.device)] != ignore_index).sum())
                               for p in parts], dtype=torch.float64)
    total = counts.sum()
    return counts / total if total > 0 else counts
