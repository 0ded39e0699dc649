"""What a sampler sees and what it hands on: the `SampleGraph` Protocol (buffer to sampler)
and the `DENSE` / `Batch` data classes (sampler to layers).

Every id in this module is a *local* id of the resident graph, ``0 <= id < num_nodes``;
translating to store ids is the buffer's business, not the sampler's.

DENSE layout contract
---------------------
A DENSE holds the ``L = len(fanouts)``-hop sampled neighbourhood of ``T`` target nodes.
``fanouts[d]`` is the fanout of the nodes first reached at hop ``d`` (hop 0 = the targets),
so ``fanouts[0]`` is the hop nearest the targets and is consumed by the *last* GNN layer:
the reverse of DGL, whose ``fanouts[i]`` belongs to layer ``i`` counted from the input.

* ``node_ids``, int64 [N]: every node of the neighbourhood once, grouped by the hop at which
  it was first reached, outermost hop first and the targets last, in the order given::

      node_ids = [ hop L | hop L-1 | ... | hop 1 | targets ]
                 ^off[0]  ^off[1]          ^off[L-1] ^off[L]

  Inside a hop block, nodes are in the order they first appear in the samples of the
  previous block (so the sampler needs no sort; deterministic for a given generator).
* ``node_id_offsets`` (``off``), int64 [L+1]: block ``i`` (nodes first reached at hop
  ``L - i``) is ``node_ids[off[i]:off[i+1]]`` (``off[L+1]`` being N). Hence the nodes within
  ``j`` hops of the targets are the suffix ``node_ids[off[L-j]:]``.
* Every node within ``L - 1`` hops, i.e. the suffix ``node_ids[off[1]:]`` (``S = N - off[1]``
  nodes), has exactly one one-hop sample, drawn once with ``fanouts[its hop]`` where it was
  first reached. ``nbr_offsets``, int64 [S+1], is the CSR over those nodes in ``node_ids``
  order: node ``node_ids[off[1] + j]`` has sample ``nbrs[nbr_offsets[j]:nbr_offsets[j+1]]``.
* ``nbrs``, int64 [E]: each sampled neighbour as an index into ``node_ids``.
* ``repr_map``: a tuple of L int64 tensors. GNN layer ``k`` (``k = 0`` is the input layer)
  reads representations of the suffix ``node_ids[off[k]:]`` (the layer input has that many
  rows) and writes them for the suffix ``node_ids[off[k+1]:]``; those output nodes' samples
  are the suffix of ``nbrs`` starting at ``nbr_offsets[off[k+1] - off[1]]``, and
  ``repr_map[k]`` holds them as *row numbers of the layer's input*:
  ``repr_map[k] == nbrs[nbr_offsets[off[k+1] - off[1]]:] - off[k]`` (so ``repr_map[0]`` is
  ``nbrs``). The sampler computes these once, so a layer does only::

      h_nbr  = h.index_select(0, repr_map[k])                    # [E_k, D]
      h_agg  = segment_sum(h_nbr, lengths=diff(nbr_offsets)[off[k+1] - off[1]:])
      h_self = h[off[k+1] - off[k]:]                             # output nodes' own rows
      h      = update(h_self, h_agg)                             # [N - off[k+1], D']

  and the outermost hop is pruned by those slices alone; `DENSE.layer` returns them.
* ``edge_ids``, int64 [E] or None (``sample_dense(..., return_edge_ids=True)``): aligned
  with ``nbrs``, the position of each sampled edge in the graph's ``indices``, so per-edge
  data (RGCN's relation types) is ``rel[edge_ids]``; layer ``k``'s slice starts where
  ``repr_map[k]`` does. With ``direction="both"``, an out-edge's id is
  ``indices.numel()`` + its position in ``out_indices``.

A node's sample may contain nodes of any hop up to its own hop plus one (including
itself on a self loop): a neighbour already reached is not reached again, and the sample is
the same tensor slice for every layer that computes that node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from graphstore.errors import ConfigError

__all__ = ["DENSE", "Batch", "CSCGraph", "DenseLayer", "SampleGraph"]


@runtime_checkable
class SampleGraph(Protocol):
    """The resident graph as a sampler sees it (the buffer's ``ResidentGraph`` satisfies it).

    CSC over local ids: the in-neighbours of node ``v`` are
    ``indices[indptr[v]:indptr[v + 1]]``. ``out_indptr`` / ``out_indices`` are the same for
    out-neighbours (CSR), or None when only one direction is resident.
    """

    @property
    def num_nodes(self) -> int:
        """Number of resident nodes (local ids are ``0 .. num_nodes - 1``)."""
        ...

    @property
    def indptr(self) -> torch.Tensor:
        """int64 [num_nodes + 1], CSC column pointers (in-edges of each node)."""
        ...

    @property
    def indices(self) -> torch.Tensor:
        """int64 [num_edges], source local id of each in-edge, grouped by destination."""
        ...

    @property
    def out_indptr(self) -> torch.Tensor | None:
        """int64 [num_nodes + 1], CSR row pointers (out-edges), or None."""
        ...

    @property
    def out_indices(self) -> torch.Tensor | None:
        """int64 [num_edges], destination local id of each out-edge, or None."""
        ...


@dataclass(frozen=True, slots=True)
class CSCGraph:
    """A plain in-memory `SampleGraph`, for tests and for graphs that fit in memory.

    Examples
    --------
    >>> g = CSCGraph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 1]), num_nodes=3)
    >>> g.indptr.tolist(), g.indices.tolist()
    ([0, 0, 2, 3], [0, 2, 1])
    >>> g.out_indptr.tolist(), g.out_indices.tolist()
    ([0, 1, 2, 3], [1, 2, 1])
    """

    num_nodes: int
    """Number of nodes."""
    indptr: torch.Tensor
    """int64 [num_nodes + 1], in-edges of node v are ``indices[indptr[v]:indptr[v+1]]``."""
    indices: torch.Tensor
    """int64 [num_edges], sources of the in-edges, ascending within each destination."""
    out_indptr: torch.Tensor | None = None
    """int64 [num_nodes + 1], out-edges of node v are ``out_indices[out_indptr[v]:...]``."""
    out_indices: torch.Tensor | None = None
    """int64 [num_edges], destinations of the out-edges, ascending within each source."""

    @property
    def num_edges(self) -> int:
        """Number of stored directed edges."""
        return int(self.indices.numel())

    @classmethod
    def from_edges(cls, src: torch.Tensor, dst: torch.Tensor, num_nodes: int, *,
                   out_edges: bool = True) -> CSCGraph:
        """Build the CSC (and, with ``out_edges``, the CSR) of the edges ``src[i] -> dst[i]``.

        Parameters
        ----------
        src, dst : int tensor [E]
            Edge endpoints in ``[0, num_nodes)``; parallel edges and self loops are kept.
        num_nodes : int
            Number of nodes.
        out_edges : bool
            Also build ``out_indptr`` / ``out_indices``.

        Raises
        ------
        ConfigError
            If the shapes differ or an endpoint is out of range.
        """
        src = torch.as_tensor(src).to(torch.int64).reshape(-1)
        dst = torch.as_tensor(dst).to(torch.int64).reshape(-1).to(src.device)
        if src.shape != dst.shape:
            raise ConfigError(f"src and dst must have the same length (got {src.numel()} and {dst.numel()})")
        for name, ends in (("src", src), ("dst", dst)):
            if ends.numel() and (int(ends.min()) < 0 or int(ends.max()) >= num_nodes):
                raise ConfigError(f"{name} ids must be in [0, {num_nodes}) (got [{int(ends.min())}, "
                                  f"{int(ends.max())}]); pass a larger num_nodes")
        indptr, indices = _compress(dst, src, num_nodes)
        out_indptr = out_indices = None
        if out_edges:
            out_indptr, out_indices = _compress(src, dst, num_nodes)
        return cls(num_nodes, indptr, indices, out_indptr, out_indices)


def _compress(major: torch.Tensor, minor: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pointers and minor ids of the edges grouped by ``major``, ``minor`` ascending inside."""
    # Sorting the minor key first and then stably by major gives (major, minor) order
    # without forming major * num_nodes + minor, which could overflow for huge graphs.
    order = torch.sort(minor, stable=True).indices
    order = order[torch.sort(major[order], stable=True).indices]
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=major.device)
    torch.cumsum(torch.bincount(major, minlength=num_nodes), 0, out=indptr[1:])
    return indptr, minor[order].contiguous()


class DenseLayer(NamedTuple):
    """What GNN layer ``k`` needs from a `DENSE`, obtained by slicing only (`DENSE.layer`).

    With ``h`` the layer input, float [num_inputs, D], rows in ``node_ids[off[k]:]`` order,
    the output rows are ``node_ids[off[k+1]:]`` (``num_outputs`` of them).
    """

    num_inputs: int
    """Rows of the layer input: ``N - off[k]``."""
    num_outputs: int
    """Rows of the layer output: ``N - off[k+1]``."""
    self_start: int
    """``h[self_start:]`` are the output nodes' own input rows: ``off[k+1] - off[k]``."""
    nbr_index: torch.Tensor
    """int64 [E_k], ``repr_map[k]``: input row of each sampled neighbour, grouped by output."""
    nbr_counts: torch.Tensor
    """int64 [num_outputs], sample size of each output node (segment lengths of nbr_index)."""
    edge_ids: torch.Tensor | None = None
    """int64 [E_k], graph edge position of each ``nbr_index`` entry (`DENSE.edge_ids`'s
    slice), or None when the DENSE was sampled without edge ids."""


@dataclass(frozen=True, slots=True)
class DENSE:
    """The sampled multi-hop neighbourhood of a batch of targets; see the module docstring.

    Examples
    --------
    A 5-node graph, edges ``src -> dst``: 1->0, 2->0, 3->0, 3->1, 4->1, 0->2, 4->3.
    Two hops from target 0 with ``fanouts = (-1, 1)`` (all in-neighbours of the target, one
    of each node reached at hop 1):

    >>> from graphstore.sample import CSCGraph, sample_dense
    >>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 3, 4, 0, 4]),
    ...                         torch.tensor([0, 0, 0, 1, 1, 2, 3]), num_nodes=5)
    >>> d = sample_dense(g, torch.tensor([0]), (-1, 1), generator=torch.Generator().manual_seed(0))
    >>> d.node_ids.tolist(), d.node_id_offsets.tolist()        # [hop 2 | hop 1 | targets]
    ([4, 1, 2, 3, 0], [0, 1, 4])

    Node 4 was reached at hop 2 and has no sample. Nodes 1, 2, 3 (hop 1) and 0 (target),
    ``node_ids[1:]``, have one sample each; node 2's only in-neighbour is node 0 (index 4),
    node 3's is node 4 (index 0), node 1 drew one of {3, 4}, and target 0 has all of 1, 2, 3:

    >>> d.nbr_offsets.tolist(), d.nbrs.tolist()
    ([0, 1, 2, 3, 6], [0, 4, 0, 1, 2, 3])
    >>> d.node_ids[d.nbrs].tolist()
    [4, 0, 4, 1, 2, 3]

    Layer 0 reads rows for all 5 nodes and writes rows for ``node_ids[1:]``; layer 1 reads
    those 4 rows and writes the target's; its neighbours are input rows 0, 1, 2 (nodes 1, 2, 3):

    >>> [t.tolist() for t in d.repr_map]
    [[0, 4, 0, 1, 2, 3], [0, 1, 2]]
    >>> d.layer(1)  # doctest: +NORMALIZE_WHITESPACE
    DenseLayer(num_inputs=4, num_outputs=1, self_start=3, nbr_index=tensor([0, 1, 2]),
               nbr_counts=tensor([3]), edge_ids=None)
    """

    node_ids: torch.Tensor
    """int64 [N], local ids, unique; outermost hop first, the targets last in given order."""
    node_id_offsets: torch.Tensor
    """int64 [L+1], start of each hop's block in node_ids: block i is hop ``L - i``."""
    nbrs: torch.Tensor
    """int64 [E], sampled neighbours as indices into node_ids, grouped by sampled node."""
    nbr_offsets: torch.Tensor
    """int64 [S+1], CSR of the samples of ``node_ids[off[1]:]`` (S = N - off[1]) into nbrs."""
    repr_map: tuple[torch.Tensor, ...]
    """L int64 tensors; ``repr_map[k]`` = ``nbrs[nbr_offsets[off[k+1]-off[1]]:] - off[k]``, and
    ``repr_map[0]`` is ``nbrs`` itself (the same tensor)."""
    fanouts: tuple[int, ...]
    """The fanouts sampled with; ``fanouts[0]`` is the hop nearest the targets, -1 = all."""
    edge_ids: torch.Tensor | None = None
    """int64 [E] aligned with ``nbrs``: each sampled edge's position in the graph's
    ``indices`` (``indices.numel()`` + position in ``out_indices`` for an out-edge), or None
    unless sampled with ``return_edge_ids=True``."""

    @property
    def num_layers(self) -> int:
        """L, the number of hops (and of GNN layers that consume this DENSE)."""
        return len(self.fanouts)

    @property
    def num_nodes(self) -> int:
        """N, the number of distinct nodes in the neighbourhood."""
        return int(self.node_ids.numel())

    @property
    def num_edges(self) -> int:
        """E, the number of sampled (node, neighbour) pairs."""
        return int(self.nbrs.numel())

    @property
    def num_targets(self) -> int:
        """T, the number of targets."""
        return self.num_nodes - int(self.node_id_offsets[-1])

    @property
    def targets(self) -> torch.Tensor:
        """int64 [T], the targets' local ids (a view of the end of node_ids)."""
        return self.node_ids[int(self.node_id_offsets[-1]):]

    def layer(self, k: int) -> DenseLayer:
        """The slices GNN layer ``k`` (0 = input layer) consumes; no index arithmetic.

        Raises
        ------
        ConfigError
            If ``k`` is not in ``[0, num_layers)``.
        """
        if not 0 <= k < self.num_layers:
            raise ConfigError(f"layer must be in [0, {self.num_layers}) (got {k})")
        off = self.node_id_offsets.tolist() + [self.num_nodes]
        first = off[k + 1] - off[1]
        counts = self.nbr_offsets[first + 1:] - self.nbr_offsets[first:-1]
        edge_ids = None
        if self.edge_ids is not None:
            # repr_map[k] is the suffix of nbrs of the same length; slice edge_ids alike.
            edge_ids = self.edge_ids[self.edge_ids.numel() - self.repr_map[k].numel():]
        return DenseLayer(self.num_nodes - off[k], self.num_nodes - off[k + 1], off[k + 1] - off[k],
                          self.repr_map[k], counts, edge_ids)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> DENSE:
        """A copy with every tensor on ``device``."""
        return self.map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def map_tensors(self, move: Callable[[torch.Tensor], torch.Tensor]) -> DENSE:
        """A copy with ``move`` applied to every tensor (e.g. a staged copy to a device)."""
        nbrs = move(self.nbrs)
        # repr_map[0] is nbrs itself; keep it shared rather than holding two device copies.
        repr_map = (nbrs,) + tuple(move(t) for t in self.repr_map[1:])
        edge_ids = None if self.edge_ids is None else move(self.edge_ids)
        return DENSE(move(self.node_ids), move(self.node_id_offsets), nbrs, move(self.nbr_offsets),
                     repr_map, self.fanouts, edge_ids)


def lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``table[ids]`` on ``ids``' device, wherever ``table`` lives: a batch copied to a GPU
    (`graphstore.loaders.DeviceFeeder`) keeps its resident graph's tables on the host."""
    if table.device == ids.device:
        return table.index_select(0, ids)
    return table.index_select(0, ids.to(table.device)).to(ids.device)


@dataclass(frozen=True, slots=True)
class Batch:
    """One training step's input: a `DENSE`, its input feature rows and the targets' labels.

    Examples
    --------
    >>> from graphstore.sample import CSCGraph, sample_dense
    >>> g = CSCGraph.from_edges(torch.tensor([1, 2]), torch.tensor([0, 0]), num_nodes=3)
    >>> d = sample_dense(g, torch.tensor([0]), (2,), generator=torch.Generator().manual_seed(0))
    >>> b = Batch.gather(d, torch.arange(3.0)[:, None] * 10, torch.tensor([7, 8, 9]))
    >>> b.features.tolist(), b.labels.tolist()
    ([[10.0], [20.0], [0.0]], [7])
    """

    dense: DENSE
    """The sampled neighbourhood."""
    features: torch.Tensor
    """float [N, D], input feature row of each ``dense.node_ids`` entry, in that order."""
    labels: torch.Tensor | None
    """[T] (int64 class ids, or any per-target tensor), labels of ``dense.targets``; or None."""

    @classmethod
    def gather(cls, dense: DENSE, features: torch.Tensor, labels: torch.Tensor | None = None) -> Batch:
        """Gather the rows of ``features`` [num_nodes, D] and ``labels`` [num_nodes, ...]
        (indexed by local id) for ``dense``; the gathers run where the source tensors live."""
        rows = features.index_select(0, dense.node_ids.to(features.device))
        picked = None if labels is None else labels.index_select(0, dense.targets.to(labels.device))
        return cls(dense, rows, picked)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        labels = None if self.labels is None else self.labels.to(device, non_blocking=non_blocking)
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.features.to(device, non_blocking=non_blocking), labels)
