"""The one view of a layer's bipartite graph that every GNN layer reads, and the segment
operations the layers aggregate with.

Both samplers describe "which input rows does each output row aggregate" but lay the rows
out differently:

* `DenseLayer` (from `DENSE.layer`): the output nodes' own rows are the *last*
  ``num_outputs`` input rows, ``h[self_start:]``.
* `Block` (the reference sampler): the dst nodes come *first* among the src nodes,
  ``h[:num_dst]``.

`layer_view` turns either into a `LayerView` whose ``self_rows`` is a ``slice``, so a layer
takes its output nodes' own rows as ``h[view.self_rows]``, a view of ``h`` and not a copy,
whichever sampler made it. Edges stay grouped by output row in both (``segment`` is
non-decreasing), which is what makes the segment sums below plain ``index_add_`` calls.

Examples
--------
>>> from graphstore.sample import DenseLayer
>>> v = layer_view(DenseLayer(4, 2, 2, torch.tensor([0, 1, 3]), torch.tensor([2, 1])))
>>> v.self_rows, v.segment.tolist()
(slice(2, 4, None), [0, 0, 1])
>>> h = torch.arange(4.0)[:, None]
>>> segment_sum(h[v.nbr_index], v.segment, v.num_outputs).tolist()   # rows 0+1, row 3
[[1.0], [3.0]]
>>> segment_mean(h[v.nbr_index], v.segment, v.nbr_counts).tolist()
[[0.5], [3.0]]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from graphstore.errors import ConfigError
from graphstore.sample.base import DenseLayer
from graphstore.sample.reference import Block

__all__ = ["LayerView", "layer_view", "normalize_rows", "segment_max", "segment_mean", "segment_softmax",
           "segment_sum"]


class LayerView(NamedTuple):
    """One GNN layer's bipartite graph, the same for `DenseLayer` and `Block`.

    With ``h`` the layer input, float [num_inputs, D], the layer writes ``num_outputs`` rows;
    output row ``i`` aggregates the input rows ``nbr_index[segment == i]``.
    """

    num_inputs: int
    """Rows of the layer input."""
    num_outputs: int
    """Rows of the layer output."""
    self_rows: slice
    """``h[self_rows]``, [num_outputs, D], are the output nodes' own input rows (a view)."""
    nbr_index: torch.Tensor
    """int64 [E], input row of each sampled neighbour, grouped by output row."""
    nbr_counts: torch.Tensor
    """int64 [num_outputs], number of sampled neighbours of each output row."""
    segment: torch.Tensor
    """int64 [E], output row of each edge, non-decreasing (``nbr_counts`` expanded)."""


def layer_view(layer: DenseLayer | Block | LayerView) -> LayerView:
    """The `LayerView` of a DENSE layer, a reference block, or a view (returned as is).

    Raises
    ------
    ConfigError
        If ``layer`` is none of those.
    """
    if isinstance(layer, LayerView):
        return layer
    if isinstance(layer, DenseLayer):
        counts = layer.nbr_counts
        segment = torch.repeat_interleave(torch.arange(layer.num_outputs, device=counts.device), counts,
                                          output_size=layer.nbr_index.numel())
        return LayerView(layer.num_inputs, layer.num_outputs, slice(layer.self_start, layer.num_inputs),
                         layer.nbr_index, counts, segment)
    if isinstance(layer, Block):
        counts = torch.bincount(layer.edge_dst, minlength=layer.num_dst)
        return LayerView(int(layer.src_nodes.numel()), layer.num_dst, slice(0, layer.num_dst),
                         layer.edge_src, counts, layer.edge_dst)
    raise ConfigError(f"a layer needs a DenseLayer (DENSE.layer(k)), a Block or a LayerView "
                      f"(got {type(layer).__name__})")


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its sum of absolute values (L1 norm); rows of zeros stay zero
    (PyG's ``NormalizeFeatures``, applied per batch or per partition, so it needs no pass
    over the store). Half rows (float16, bfloat16) are normalised in float32 and returned
    float32: a float16 row sum of a wide bag-of-words row overflows past 65504, and its
    inf would zero the row."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    norm = x.abs().sum(dim=1, keepdim=True)
    return x / torch.where(norm > 0, norm, torch.ones_like(norm))


def segment_sum(x: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum the rows of ``x`` [E, ...] by ``segment`` int64 [E]: returns [num_segments, ...].

    Empty segments give zeros. ``index_add_`` rather than ``torch.segment_reduce``: it takes
    the per-edge segment ids directly (the `Block` form) and has a backward for every dtype.
    """
    out = x.new_zeros((num_segments,) + tuple(x.shape[1:]))
    return out.index_add_(0, segment, x)


def segment_mean(x: torch.Tensor, segment: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean of the rows of ``x`` [E, ...] per segment; empty segments give zeros."""
    total = segment_sum(x, segment, counts.numel())
    scale = 1.0 / counts.clamp(min=1).to(x.dtype)
    return total * scale.view((-1,) + (1,) * (x.dim() - 1))


def segment_max(x: torch.Tensor, segment: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """Per-segment maximum of ``x`` [E, ...] and ``initial`` [num_segments, ...] (a value each
    segment contains besides its edges, e.g. a self loop's), without gradient."""
    index = segment.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    return initial.detach().clone().scatter_reduce_(0, index, x.detach(), "amax", include_self=True)


def segment_softmax(logits: torch.Tensor, segment: torch.Tensor, self_logits: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over each segment's edges plus one extra entry per segment (its self loop).

    Parameters
    ----------
    logits : float tensor [E, ...]
        One score per edge.
    segment : int64 tensor [E]
        Segment (output row) of each edge.
    self_logits : float tensor [num_segments, ...]
        The self loop's score of each segment; every segment has one, so none is empty.

    Returns
    -------
    edge_weights : float tensor [E, ...]
    self_weights : float tensor [num_segments, ...]
        Non-negative, summing to 1 over each segment's edges and its self loop.

    Notes
    -----
    The segment maximum is subtracted before ``exp`` so logits of any size stay finite; it
    is detached because softmax does not depend on the shift (its gradient through the shift
    is exactly zero).
    """
    top = segment_max(logits, segment, self_logits)
    edge_exp = torch.exp(logits - top.index_select(0, segment))
    self_exp = torch.exp(self_logits - top)
    # The self loop holds the maximum or is below it, and the maximum entry gives exp(0) = 1,
    # so the denominator is >= 1: no division by zero.
    denom = self_exp + segment_sum(edge_exp, segment, self_logits.shape[0])
    return edge_exp / denom.index_select(0, segment), self_exp / denom
