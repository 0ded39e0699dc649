"""Weightless neighbour aggregation of input features: BatchGNN's aggregation cache.

BatchGNN (Appendix B) precomputes, for every node, the aggregate of its in-neighbours' input
features; a GraphSage, GCN or GIN first layer then needs that row and the node's own row, not
its neighbours' (the last hop is neither sampled nor fetched). `FeatureAggregate` is that
aggregation as a layer without parameters, in both forms every layer here has: one-shot
over a sampled layer, and the partial form (`partial_begin` / `partial_update` /
`partial_finish`) that `graphstore.inference.infer_layerwise` streams over a store's edge
buckets, so the aggregate of a graph larger than memory is computed out of core, exactly
(every neighbour, global in-degrees).

Operations (``d_v``: in-degree of ``v``, the store's ``nodes/in_degree``):

- ``sum``: ``sum_{u in N(v)} x_u`` (GIN's neighbour sum);
- ``mean``: ``sum_{u in N(v)} x_u / d_v``, zero without in-neighbours (GraphSage's);
- ``gcn``: ``sum_{u in N(v) + {v}} x_u / sqrt((d_u + 1)(d_v + 1))`` (GCN's normalized
  propagation with its self loop, before the weight: ``GCNConv`` is ``W`` times this).

`AggregationModel` wraps one such layer in the shape `infer_layerwise` walks (``layers``,
``kind``, ``num_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphstore.errors import ConfigError
from graphstore.nn.base import layer_view, segment_mean, segment_sum
from graphstore.nn.layers import Layer, PartialAggregate, PartialSources, _PartialForm

__all__ = ["AGGREGATIONS", "AggregateSource", "AggregationModel", "FeatureAggregate"]

AGGREGATIONS = ("mean", "sum", "gcn")


@dataclass(frozen=True, slots=True)
class AggregateSource:
    """What stored aggregate rows are: carried by a batch beside them (``NodeBatch.
    aggregated_from``) so the model can refuse another op than its first layer's
    (`graphstore.nn.GNN`) and a trainer another input normalisation than its own."""

    array: str
    """Where they were read: the store's path and the array (``.../nodes/aggregated_sum``)."""
    op: str
    """The aggregation, one of `AGGREGATIONS`."""
    input: str
    """What was aggregated: ``"features"`` or ``"row-normalized features"`` (the manifest
    record's ``input``, `graphstore.inference.AGGREGATE_INPUTS`)."""


class FeatureAggregate(_PartialForm, nn.Module):
    """The neighbour aggregate of ``dim``-wide input rows by ``op`` (module docstring).

    Shapes: ``h`` float [num_inputs, dim] -> float [num_outputs, dim].
    """

    def __init__(self, op: str, dim: int) -> None:
        super().__init__()
        if op not in AGGREGATIONS:
            raise ConfigError(f"aggregation must be one of {', '.join(AGGREGATIONS)} (got {op!r})")
        self.op, self.in_dim, self.out_dim = op, dim, dim

    @staticmethod
    def _norm(degrees: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (degrees.to(dtype) + 1.0).rsqrt()

    def forward(self, h: torch.Tensor, layer: Layer, degrees: torch.Tensor | None = None) -> torch.Tensor:
        """One shot over a sampled layer; ``gcn`` needs ``degrees`` [num_inputs], every input
        row's in-degree (the graph's, for the full-graph aggregate)."""
        view = layer_view(layer)
        if self.op == "mean":
            return segment_mean(h.index_select(0, view.nbr_index), view.segment, view.nbr_counts)
        if self.op == "sum":
            return segment_sum(h.index_select(0, view.nbr_index), view.segment, view.num_outputs)
        if degrees is None or degrees.shape != (view.num_inputs,):
            raise ConfigError(f"gcn aggregation needs degrees of shape [{view.num_inputs}]")
        x = h * self._norm(degrees, h.dtype)[:, None]
        total = segment_sum(x.index_select(0, view.nbr_index), view.segment, view.num_outputs)
        return (total + x[view.self_rows]) * self._norm(degrees[view.self_rows], h.dtype)[:, None]

    def partial_begin(self, h_dst: torch.Tensor, *, degrees_dst: torch.Tensor | None = None,
                      **_) -> PartialAggregate:
        n = h_dst.shape[0]
        if self.op == "gcn":
            if degrees_dst is None or degrees_dst.shape != (n,):
                raise ConfigError(f"gcn aggregation needs degrees_dst of shape [{n}]")
            norm = self._norm(degrees_dst, h_dst.dtype)
            return PartialAggregate(h_dst * norm[:, None], norm=norm)  # the self loop opens the sum
        count = torch.zeros(n, dtype=torch.int64, device=h_dst.device) if self.op == "mean" else None
        return PartialAggregate(h_dst.new_zeros(n, self.in_dim), count=count)

    def partial_sources(self, h_src: torch.Tensor, *, degrees_src: torch.Tensor | None = None,
                        **_) -> PartialSources:
        if self.op != "gcn":
            return PartialSources(h_src)
        if degrees_src is None or degrees_src.shape != (h_src.shape[0],):
            raise ConfigError(f"gcn aggregation needs degrees_src of shape [{h_src.shape[0]}]")
        return PartialSources(h_src * self._norm(degrees_src, h_src.dtype)[:, None])

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        acc.total.index_add_(0, dst, sources.rows.index_select(0, src))
        if acc.count is not None:
            acc.count += torch.bincount(dst, minlength=acc.count.numel())

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        if self.op == "gcn":
            return acc.total * acc.norm[:, None]
        if self.op == "mean":
            return acc.total / acc.count.clamp(min=1).to(acc.total.dtype)[:, None]
        return acc.total

    def extra_repr(self) -> str:
        return f"op={self.op!r}, dim={self.in_dim}"


class AggregationModel(nn.Module):
    """One `FeatureAggregate`, shaped as the models `infer_layerwise` walks: ``kind`` is
    ``"gcn"`` for the gcn aggregate (so the walk reads the global in-degrees), else the op."""

    def __init__(self, op: str, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([FeatureAggregate(op, dim)])
        self.kind, self.num_layers = op, 1

    @staticmethod
    def activation(x: torch.Tensor) -> torch.Tensor:  # never applied: the only layer is the last
        return x
