"""GNN layers on a `DENSE` layer (or a reference `Block`), and a multi-layer `GNN` stack.

Every layer's ``forward(h, layer, ...)`` takes the layer input ``h``, float
[num_inputs, in_dim], and a `DenseLayer` (``dense.layer(k)``), a `Block` or a `LayerView`,
and returns float [num_outputs, out_dim] (GAT with ``concat``: [num_outputs, heads *
out_dim]). Aggregation is ``index_select`` of the neighbours' rows and a segment sum
(``index_add_``); no Python loop runs over nodes.

Notation: for output node ``v``, ``S(v)`` is its sampled neighbour multiset (the rows
``nbr_index`` of its segment; with all-neighbour fanouts, its in-neighbours), ``h_v`` its
own input row ``h[self_rows]``.

* `SAGEConv`, mean aggregator (DGL ``SAGEConv(aggregator_type="mean")``):
  ``W_self h_v + W_nbr mean_{u in S(v)} h_u + b``; the mean of an empty sample is 0.
* `GCNConv`, symmetric normalisation with a self loop (Kipf and Welling):
  ``sum_{u in S(v) + {v}} W h_u / sqrt((d_v + 1)(d_u + 1)) + b``, where ``d_x`` is the
  degree of ``x``; see `GCNConv` for which degrees are used when sampling.
* `GATConv` (Velickovic et al., DGL ``GATConv``): per head, ``alpha_vu = softmax_u
  LeakyReLU(a_src . W h_u + a_dst . W h_v)`` over ``S(v)`` and the self loop ``v``, then
  ``sum_u alpha_vu W h_u``; heads concatenated or averaged, then ``+ b``.
* `GINConv` (Xu et al.): ``MLP((1 + eps) h_v + sum_{u in S(v)} h_u)``, ``eps`` fixed or learnt.
* `RGCNConv` (Schlichtkrull et al.), basis decomposition ``W_r = sum_b a_rb V_b``:
  ``W_0 h_v + sum_r mean_{u in S_r(v)} W_r h_u + b``, a mean per relation (``c_vr =
  |S_r(v)|``, the paper's normalisation), relations given per edge.

Partial aggregation (SAR, section 3.2: every aggregation here is associative, so a layer
can take its in-edges a piece at a time). Every layer also has
``partial_begin(h_dst, ...) -> PartialAggregate`` (the destination block's self terms),
``partial_update(acc, h_src, src, dst, ...)`` (one piece of in-edges: ``src`` indexes the
rows ``h_src``, ``dst`` the block's rows; ``h_src`` may be a source block's
``partial_sources(h_src)``, prepared once for all the pieces it feeds) and
``partial_finish(acc) -> output rows``. The
pieces may come in any order and split the edges any way: the result is the one-shot
layer's. ``forward`` and the partial form call the same per-source transform and the same
output function (`_messages`, `_output`...), so the math is written once; what differs is
only how the sum is kept (one ``index_add_`` over all edges, or one per piece), and for GAT
the softmax: the one-shot layer shifts by each destination's maximum logit, the partial
form keeps a running maximum per destination and head and rescales what it has summed
when the maximum grows (numerically stable for any logits).

Examples
--------
>>> from graphstore.sample import CSCGraph, sample_dense
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 1, 2]), num_nodes=4)
>>> dense = sample_dense(g, torch.tensor([0, 1]), (-1, -1))
>>> model = GNN("sage", in_dim=3, hidden_dim=8, out_dim=2, num_layers=2)
>>> model(torch.randn(dense.num_nodes, 3), dense).shape                # the targets' rows
torch.Size([2, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn.base import LayerView, layer_view, segment_mean, segment_softmax, segment_sum
from graphstore.sample.base import DENSE, DenseLayer
from graphstore.sample.reference import Block

if TYPE_CHECKING:  # aggregate.py builds on this module's layers
    from graphstore.nn.aggregate import AggregateSource

__all__ = [
    "AGGREGATE_FOR",
    "GNN",
    "LAYERS",
    "GATConv",
    "GCNConv",
    "GINConv",
    "PartialAggregate",
    "PartialSources",
    "RGCNConv",
    "SAGEConv",
    "layer_degrees",
]

Layer = DenseLayer | Block | LayerView


@dataclass(slots=True)
class PartialAggregate:
    """A destination block's running aggregate (`partial_begin` ... `partial_finish`).

    ``total`` is what the layer sums over in-edges (messages; GAT: attention-weighted
    messages under the running maximum); the other fields are set by the layers that need
    them. The tensors are updated in place and belong to the block: keep one per block.
    Nothing in it refers to the destinations' layer input: an accumulator can be written
    out and read back without its block's input rows.
    """

    total: torch.Tensor
    """Running sum: [n, width] (RGCN: [n, R, out_dim]; GAT: [n, heads, out_dim]; GIN: it
    opens with the self term ``(1 + eps) h_v``; GCN and GAT: with the self loop's message)."""
    own: torch.Tensor | None = None
    """SAGE, RGCN: the destination rows' self term ``W_self h_v`` [n, out_dim], computed when
    the block opens, so the block's layer input is not needed again."""
    count: torch.Tensor | None = None
    """In-edges seen per row (SAGE: [n]; RGCN: per relation [n, R]), int64; RGCN's compact
    form: every in-edge per relation, known when the block opens, [n, R] int32."""
    norm: torch.Tensor | None = None
    """GCN: the destination factor ``(d_v + 1)^-1/2`` [n]."""
    score_dst: torch.Tensor | None = None
    """GAT: the destination's attention score per head [n, heads]."""
    max: torch.Tensor | None = None
    """GAT: running maximum logit per row and head [n, heads] (the self loop's at first)."""
    denom: torch.Tensor | None = None
    """GAT: running softmax denominator under ``max`` [n, heads]."""


@dataclass(frozen=True, slots=True)
class PartialSources:
    """A source block prepared once for every piece it feeds (`partial_sources`): the
    per-source transform of the layer (projection, GCN's source factor, GAT's scores), so a
    block read once and aggregated into many destinations is transformed once."""

    rows: torch.Tensor
    """[n, ...] what the pieces gather per source row (SAGE, GCN: the messages; GIN: the
    input rows; RGCN: the rows under every basis [n, B, out]; GAT: the projection [n, H, F])."""
    score: torch.Tensor | None = None
    """GAT: each source row's attention score per head [n, H]."""


class _PartialForm:
    """``partial_update`` for every layer: the checks, the source block prepared (unless it
    already is), then the layer's ``_accumulate``."""

    def partial_update(self, acc: PartialAggregate, h_src: torch.Tensor | PartialSources, src: torch.Tensor,
                       dst: torch.Tensor, *, degrees_src: torch.Tensor | None = None,
                       edge_type: torch.Tensor | None = None) -> None:
        """Add one piece of in-edges: ``src`` [E] rows of ``h_src`` (the source block's layer
        input [n, in_dim], or its `partial_sources`), ``dst`` [E] rows of ``acc``'s block;
        ``degrees_src`` (GCN) the source rows' in-degrees, ``edge_type`` (RGCN) each edge's
        relation."""
        if src.shape != dst.shape or src.dim() != 1:
            raise ConfigError(f"src and dst must be 1-d and aligned (got {list(src.shape)} and {list(dst.shape)})")
        if isinstance(h_src, torch.Tensor):
            if h_src.dim() != 2 or h_src.shape[1] != self.in_dim:
                raise ConfigError(f"h_src must have shape [n, {self.in_dim}] (got {list(h_src.shape)})")
            h_src = self.partial_sources(h_src, degrees_src=degrees_src)
        self._accumulate(acc, h_src, src, dst, edge_type)


def _check_input(h: torch.Tensor, view: LayerView) -> None:
    if h.dim() != 2 or h.shape[0] != view.num_inputs:
        raise ConfigError(f"layer input must have shape [{view.num_inputs}, D] (one row per input node; "
                          f"got {list(h.shape)})")


class SAGEConv(_PartialForm, nn.Module):
    """GraphSAGE with the mean aggregator: ``W_self h_v + W_nbr mean_{u in S(v)} h_u + b``.

    Parameters
    ----------
    in_dim, out_dim : int
        Input and output widths.
    bias : bool
        Add a learnable bias ``b``.

    Shapes: ``h`` float [num_inputs, in_dim] -> float [num_outputs, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.fc_self = nn.Linear(in_dim, out_dim, bias=bias)
        self.fc_nbr = nn.Linear(in_dim, out_dim, bias=False)

    def _messages(self, h: torch.Tensor) -> torch.Tensor:
        # The mean is linear: project first when that shrinks the rows to gather (DGL does too).
        # Only rows someone reads are projected, which is all of them in a DENSE layer.
        return self.fc_nbr(h) if self.in_dim > self.out_dim else h

    def _aggregated(self, mean: torch.Tensor) -> torch.Tensor:
        return mean if self.in_dim > self.out_dim else self.fc_nbr(mean)

    def forward(self, h: torch.Tensor, layer: Layer) -> torch.Tensor:
        view = layer_view(layer)
        _check_input(h, view)
        mean = segment_mean(self._messages(h).index_select(0, view.nbr_index), view.segment, view.nbr_counts)
        agg = self._aggregated(mean)
        return self.fc_self(h[view.self_rows]) + agg  # the self term: partial_begin's ``own``

    def from_aggregate(self, h: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        """The layer given every node's stored mean of all its in-neighbours' rows
        (``nodes/aggregated_mean``): ``W_self h_v + W_nbr agg_v + b``, rows aligned."""
        return self.fc_self(h) + self.fc_nbr(aggregated)

    def partial_begin(self, h_dst: torch.Tensor, **_) -> PartialAggregate:
        width = self.out_dim if self.in_dim > self.out_dim else self.in_dim
        n = h_dst.shape[0]
        return PartialAggregate(h_dst.new_zeros(n, width), own=self.fc_self(h_dst),
                                count=torch.zeros(n, dtype=torch.int64, device=h_dst.device))

    def partial_sources(self, h_src: torch.Tensor, **_) -> PartialSources:
        return PartialSources(self._messages(h_src))

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        acc.total.index_add_(0, dst, sources.rows.index_select(0, src))
        acc.count += torch.bincount(dst, minlength=acc.count.numel())

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        scale = 1.0 / acc.count.clamp(min=1).to(acc.total.dtype)
        return acc.own + self._aggregated(acc.total * scale[:, None])


class GCNConv(_PartialForm, nn.Module):
    """GCN: ``sum_{u in S(v) + {v}} W h_u / sqrt((d_v + 1)(d_u + 1)) + b``.

    Degrees. ``d_x`` counts the in-neighbours of ``x`` (no self loop; the ``+ 1`` is the self
    loop). ``forward`` takes them as ``degrees`` [num_inputs], one per input row, and uses
    ``degrees[self_rows]`` for the output nodes: pass the graph's in-degrees to get the
    full-graph GCN exactly when every neighbour is sampled. `GNN` passes, by default, the
    *sampled* counts (a node's sample size, its in-degree when its fanout covers it; 0 for a
    node reached at the last hop, which has no sample), the gcn_norm of the sampled subgraph
    that PyG computes for a neighbour-sampled batch. Called without ``degrees``, the layer
    uses its own output rows' sample sizes and 0 for the other input rows.

    Shapes: ``h`` float [num_inputs, in_dim] -> float [num_outputs, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.fc = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def forward(self, h: torch.Tensor, layer: Layer, degrees: torch.Tensor | None = None) -> torch.Tensor:
        view = layer_view(layer)
        _check_input(h, view)
        if degrees is None:
            degrees = torch.zeros(view.num_inputs, dtype=view.nbr_counts.dtype, device=h.device)
            degrees[view.self_rows] = view.nbr_counts
        elif degrees.shape != (view.num_inputs,):
            raise ConfigError(f"degrees must have shape [{view.num_inputs}] (one per input row; "
                              f"got {list(degrees.shape)})")
        norm = self._norm(degrees, h.dtype)                              # [num_inputs]
        x = self._messages(h, norm)
        agg = segment_sum(x.index_select(0, view.nbr_index), view.segment, view.num_outputs)
        return self._output((agg + x[view.self_rows]) * norm[view.self_rows, None])

    @staticmethod
    def _norm(degrees: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (degrees.to(dtype) + 1.0).rsqrt()

    def _messages(self, h: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        # Source-side factor first (per input row), destination-side factor after the sum.
        x = self.fc(h) if self.in_dim > self.out_dim else h
        return x * norm[:, None]

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        if self.in_dim <= self.out_dim:
            out = self.fc(out)
        return out if self.bias is None else out + self.bias

    def from_aggregate(self, h: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        """The layer given every node's stored normalized propagation (``nodes/aggregated_gcn``:
        the sum over all in-neighbours and the self loop, global degrees): ``W agg_v + b``.
        ``h`` is not needed (the self loop is in the aggregate); it is taken for a uniform call."""
        out = self.fc(aggregated)
        return out if self.bias is None else out + self.bias

    def partial_begin(self, h_dst: torch.Tensor, *, degrees_dst: torch.Tensor, **_) -> PartialAggregate:
        """``degrees_dst`` [n]: the destination rows' in-degrees (the whole graph's, for the
        full-graph GCN); the self loop is the first term of the sum."""
        if degrees_dst.shape != (h_dst.shape[0],):
            raise ConfigError(f"degrees_dst must have shape [{h_dst.shape[0]}] (got {list(degrees_dst.shape)})")
        norm = self._norm(degrees_dst, h_dst.dtype)
        return PartialAggregate(self._messages(h_dst, norm), norm=norm)

    def partial_sources(self, h_src: torch.Tensor, *, degrees_src: torch.Tensor | None = None,
                        **_) -> PartialSources:
        """``degrees_src`` [len(h_src)]: the source rows' in-degrees."""
        if degrees_src is None or degrees_src.shape != (h_src.shape[0],):
            got = None if degrees_src is None else list(degrees_src.shape)
            raise ConfigError(f"degrees_src must have shape [{h_src.shape[0]}] (got {got})")
        return PartialSources(self._messages(h_src, self._norm(degrees_src, h_src.dtype)))

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        acc.total.index_add_(0, dst, sources.rows.index_select(0, src))

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        return self._output(acc.total * acc.norm[:, None])


class GATConv(_PartialForm, nn.Module):
    """Multi-head graph attention with a self loop and a max-shifted segment softmax.

    Per head, ``e_vu = LeakyReLU(a_src . W h_u + a_dst . W h_v)`` for ``u`` in ``S(v)``
    and ``u = v``; ``alpha_vu`` is its softmax over those; the head's output is
    ``sum_u alpha_vu W h_u``. Heads are concatenated (``concat=True``, width ``heads *
    out_dim``) or averaged (width ``out_dim``); ``b`` is added last.

    Parameters
    ----------
    in_dim, out_dim : int
        Input width and width per head.
    heads : int
        Number of attention heads.
    concat : bool
        Concatenate the heads (hidden layers) or average them (an output layer).
    negative_slope : float
        LeakyReLU slope of the attention logits.
    attn_dropout : float
        Dropout on the attention weights during training.
    bias : bool
        Add a learnable bias.

    Shapes: ``h`` float [num_inputs, in_dim] -> float [num_outputs, heads * out_dim] or
    [num_outputs, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, *, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attn_dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if heads < 1:
            raise ConfigError(f"heads must be at least 1 (got {heads})")
        self.in_dim, self.out_dim, self.heads, self.concat = in_dim, out_dim, heads, concat
        self.negative_slope, self.attn_dropout = negative_slope, attn_dropout
        self.fc = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.attn_src = nn.Parameter(torch.empty(heads, out_dim))
        self.attn_dst = nn.Parameter(torch.empty(heads, out_dim))
        width = heads * out_dim if concat else out_dim
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_src, gain=gain)
        nn.init.xavier_normal_(self.attn_dst, gain=gain)

    def forward(self, h: torch.Tensor, layer: Layer) -> torch.Tensor:
        view = layer_view(layer)
        _check_input(h, view)
        x, score_src = self._project(h)                                  # [num_inputs, H, F], [.., H]
        x_self = x[view.self_rows]
        score_dst = (x_self * self.attn_dst).sum(-1)                     # [num_outputs, H]
        logits = self._logits(score_src.index_select(0, view.nbr_index), score_dst.index_select(0, view.segment))
        self_logits = self._logits(score_src[view.self_rows], score_dst)
        alpha, alpha_self = segment_softmax(logits, view.segment, self_logits)
        if self.training and self.attn_dropout > 0:
            alpha = F.dropout(alpha, self.attn_dropout)
            alpha_self = F.dropout(alpha_self, self.attn_dropout)
        msg = x.index_select(0, view.nbr_index) * alpha[..., None]
        out = segment_sum(msg, view.segment, view.num_outputs)
        out = out + x_self * alpha_self[..., None]
        return self._output(out)

    def _project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(h).view(-1, self.heads, self.out_dim)
        return x, (x * self.attn_src).sum(-1)

    def _logits(self, score_src: torch.Tensor, score_dst: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(score_src + score_dst, self.negative_slope)

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        """Heads [n, H, F] concatenated or averaged, then the bias."""
        out = out.reshape(out.shape[0], -1) if self.concat else out.mean(1)
        return out if self.bias is None else out + self.bias

    def partial_begin(self, h_dst: torch.Tensor, **_) -> PartialAggregate:
        x_self, score_src = self._project(h_dst)
        score_dst = (x_self * self.attn_dst).sum(-1)
        # The self loop opens the sum: its logit is the running maximum, its weight exp(0) = 1.
        top = self._logits(score_src, score_dst)
        return PartialAggregate(x_self.clone(), score_dst=score_dst, max=top, denom=torch.ones_like(top))

    def partial_sources(self, h_src: torch.Tensor, **_) -> PartialSources:
        x, score = self._project(h_src)
        return PartialSources(x, score)

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        if self.training and self.attn_dropout > 0:
            raise ConfigError("partial aggregation is for inference: call model.eval() (attention dropout)")
        x, score_src = sources.rows, sources.score
        logits = self._logits(score_src.index_select(0, src), acc.score_dst.index_select(0, dst))  # [E, H]
        top = acc.max.scatter_reduce(0, dst[:, None].expand_as(logits), logits, "amax", include_self=True)
        # What was summed under the old maximum is rescaled to the new one (<= 1: no overflow).
        rescale = torch.exp(acc.max - top)
        acc.denom.mul_(rescale)
        acc.total.mul_(rescale[..., None])
        weight = torch.exp(logits - top.index_select(0, dst))                                        # <= 1
        acc.denom.index_add_(0, dst, weight)
        acc.total.index_add_(0, dst, x.index_select(0, src) * weight[..., None])
        acc.max = top

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        return self._output(acc.total / acc.denom[..., None])


class GINConv(_PartialForm, nn.Module):
    """GIN: ``MLP((1 + eps) h_v + sum_{u in S(v)} h_u)``.

    Parameters
    ----------
    in_dim, out_dim : int
        Input and output widths; the MLP is ``Linear(in, out) -> ReLU -> Linear(out, out)``
        unless ``mlp`` is given.
    eps : float
        Initial (or fixed) ``eps``.
    learn_eps : bool
        Make ``eps`` a parameter.
    mlp : nn.Module, optional
        Replaces the default MLP; maps [*, in_dim] to [*, out_dim].

    Shapes: ``h`` float [num_inputs, in_dim] -> float [num_outputs, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, *, eps: float = 0.0, learn_eps: bool = False,
                 mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.mlp = mlp if mlp is not None else nn.Sequential(
            nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))
        if learn_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def forward(self, h: torch.Tensor, layer: Layer) -> torch.Tensor:
        view = layer_view(layer)
        _check_input(h, view)
        agg = segment_sum(h.index_select(0, view.nbr_index), view.segment, view.num_outputs)
        return self.mlp(self._own(h[view.self_rows]) + agg)

    def _own(self, h_dst: torch.Tensor) -> torch.Tensor:
        return (1 + self.eps) * h_dst

    def from_aggregate(self, h: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        """The layer given every node's stored sum of all its in-neighbours' rows
        (``nodes/aggregated_sum``): ``MLP((1 + eps) h_v + agg_v)``, rows aligned."""
        return self.mlp(self._own(h) + aggregated)

    def partial_begin(self, h_dst: torch.Tensor, **_) -> PartialAggregate:
        # The sum opens with the self term: the block's input rows are not needed after.
        return PartialAggregate(self._own(h_dst))

    def partial_sources(self, h_src: torch.Tensor, **_) -> PartialSources:
        return PartialSources(h_src)

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        acc.total.index_add_(0, dst, sources.rows.index_select(0, src))

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        return self.mlp(acc.total)


class RGCNConv(_PartialForm, nn.Module):
    """Relational GCN with basis decomposition and a mean per relation.

    ``W_0 h_v + sum_r (1 / |S_r(v)|) sum_{u in S_r(v)} W_r h_u + b`` where ``S_r(v)`` are
    the sampled neighbours reached through an edge of relation ``r`` and ``W_r = sum_b
    a_rb V_b`` (``num_bases`` bases; ``None`` learns each ``W_r`` directly).

    Parameters
    ----------
    in_dim, out_dim : int
        Input and output widths.
    num_relations : int
        Relation types; ``edge_type`` values are in ``[0, num_relations)``.
    num_bases : int, optional
        Number of bases ``B``; default: one weight per relation, no decomposition.
    bias : bool
        Add a learnable bias.

    Shapes: ``h`` float [num_inputs, in_dim], ``edge_type`` int64 [E] (aligned with the
    layer's ``nbr_index``) -> float [num_outputs, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, *, num_relations: int, num_bases: int | None = None,
                 bias: bool = True) -> None:
        super().__init__()
        if num_relations < 1:
            raise ConfigError(f"num_relations must be at least 1 (got {num_relations})")
        if num_bases is not None and num_bases < 1:
            raise ConfigError(f"num_bases must be at least 1 or None (got {num_bases})")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.num_relations, self.num_bases = num_relations, num_bases
        num_weights = num_relations if num_bases is None else num_bases
        self.basis = nn.Parameter(torch.empty(num_weights, in_dim, out_dim))
        self.coeff = None if num_bases is None else nn.Parameter(torch.empty(num_relations, num_bases))
        self.fc_self = nn.Linear(in_dim, out_dim, bias=bias)
        nn.init.xavier_uniform_(self.basis, gain=nn.init.calculate_gain("relu"))
        if self.coeff is not None:
            nn.init.xavier_uniform_(self.coeff)

    def forward(self, h: torch.Tensor, layer: Layer, edge_type: torch.Tensor) -> torch.Tensor:
        view = layer_view(layer)
        _check_input(h, view)
        if edge_type.shape != view.nbr_index.shape:
            raise ConfigError(f"edge_type must have one relation per sampled edge, shape "
                              f"[{view.nbr_index.numel()}] (got {list(edge_type.shape)})")
        msg = self._messages(h, view.nbr_index, edge_type)
        # Mean per (output node, relation): divide each edge by its group's size.
        group = view.segment * self.num_relations + edge_type
        size = torch.bincount(group, minlength=view.num_outputs * self.num_relations)
        msg = msg / size.index_select(0, group).to(msg.dtype)[:, None]
        return self.fc_self(h[view.self_rows]) + segment_sum(msg, view.segment, view.num_outputs)

    def _messages(self, h: torch.Tensor, src: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        """W_r h_u of every edge [E, out_dim]."""
        # Project every input row by every basis once ([n, B, out]) instead of every edge
        # by its own W_r: the edges then only gather and mix rows.
        return self._gather(torch.einsum("ni,bio->nbo", h, self.basis), src, edge_type)

    def _gather(self, proj: torch.Tensor, src: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        num_weights = self.basis.shape[0]
        if self.coeff is None:
            return proj.reshape(-1, self.out_dim).index_select(0, src * num_weights + edge_type)
        return torch.einsum("ebo,eb->eo", proj.index_select(0, src), self.coeff.index_select(0, edge_type))

    def partial_begin(self, h_dst: torch.Tensor, *, relation_counts: torch.Tensor | None = None,
                      **_) -> PartialAggregate:
        """Open a block. Without ``relation_counts`` the sums are kept per relation, [n, R,
        out], and divided once every edge has been seen (SAR's form). With them ([n, R], every
        in-edge of each row per relation, the compact form `graphstore.inference` uses), each
        message is divided by its group's size as it arrives and the sum is [n, out]: R times
        less memory (a 237-relation graph's accumulators were most of the walk's budget)."""
        n, r = h_dst.shape[0], self.num_relations
        own = self.fc_self(h_dst)
        if relation_counts is not None:
            if relation_counts.shape != (n, r):
                raise ConfigError(f"relation_counts must have shape [{n}, {r}] (got {list(relation_counts.shape)})")
            return PartialAggregate(h_dst.new_zeros(n, self.out_dim), own=own,
                                    count=relation_counts.to(device=h_dst.device, dtype=torch.int32))
        return PartialAggregate(h_dst.new_zeros(n, r, self.out_dim), own=own,
                                count=torch.zeros(n, r, dtype=torch.int64, device=h_dst.device))

    def partial_sources(self, h_src: torch.Tensor, *, compact: bool = False, **_) -> PartialSources:
        """The rows under every basis, [n, B, out]; with ``compact`` and one weight per
        relation where that is wider than the input (R x out > in), the input rows themselves
        [n, in], projected per edge by its relation's weight as they are gathered."""
        if compact and self.coeff is None and self.num_relations * self.out_dim > self.in_dim:
            return PartialSources(h_src)
        return PartialSources(torch.einsum("ni,bio->nbo", h_src, self.basis))

    def _accumulate(self, acc: PartialAggregate, sources: PartialSources, src, dst, edge_type) -> None:
        if edge_type is None or edge_type.shape != src.shape:
            got = None if edge_type is None else list(edge_type.shape)
            raise ConfigError(f"edge_type must have one relation per edge, shape [{src.numel()}] (got {got})")
        if acc.total.dim() == 2:  # compact: counts known, each message scaled as it arrives
            msg = self._compact_messages(sources.rows, src, edge_type)
            size = acc.count[dst, edge_type].clamp(min=1).to(msg.dtype)
            acc.total.index_add_(0, dst, msg / size[:, None])
            return
        group = dst * self.num_relations + edge_type
        acc.total.view(-1, self.out_dim).index_add_(0, group, self._gather(sources.rows, src, edge_type))
        acc.count.view(-1).add_(torch.bincount(group, minlength=acc.count.numel()))

    def _compact_messages(self, rows: torch.Tensor, src: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        """W_r h_u of every edge [E, out] from prepared rows: projected ones gathered, input
        rows [n, in] projected relation by relation (one matmul per relation in the piece)."""
        if rows.dim() == 3:
            return self._gather(rows, src, edge_type)
        out = rows.new_empty(src.numel(), self.out_dim)
        if src.numel() == 0:
            return out
        order = torch.argsort(edge_type, stable=True)
        rels, sizes = torch.unique_consecutive(edge_type.index_select(0, order), return_counts=True)
        gathered = rows.index_select(0, src.index_select(0, order))
        out[order] = torch.cat([part @ self.basis[r] for part, r in zip(torch.split(gathered, sizes.tolist()),
                                                                          rels.tolist())])
        return out

    def partial_finish(self, acc: PartialAggregate) -> torch.Tensor:
        if acc.total.dim() == 2:  # compact: already a sum of per-relation means
            return acc.own + acc.total
        # A mean per relation (sums kept per relation until every edge has been seen).
        mean = acc.total / acc.count.clamp(min=1).to(acc.total.dtype)[..., None]
        return acc.own + mean.sum(1)


LAYERS = ("gat", "gcn", "gin", "rgcn", "sage")
"""The layer kinds `GNN` builds."""

AGGREGATE_FOR = {"sage": "mean", "gcn": "gcn", "gin": "sum"}
"""Layer kind -> the stored aggregate (`graphstore.nn.FeatureAggregate` op) its first layer
takes in place of its sampled neighbours (`GNN.forward`'s ``aggregated``). GAT's attention
and RGCN's per-relation weights are not linear in a node-independent neighbour sum, so they
cannot."""


def layer_degrees(structure: DENSE | Sequence[Block]) -> list[torch.Tensor]:
    """Sampled in-degree of every input row of every layer: int64 tensors [num_inputs_k].

    A node's degree is its sample size (0 for nodes reached at the last hop, which have no
    sample); for blocks, a node's size in the block where it is a dst node (the next block
    outward), and for the dst nodes the layer's own block. `GNN` feeds these to `GCNConv`
    when no degrees are given.
    """
    if isinstance(structure, DENSE):
        off = structure.node_id_offsets.tolist()
        # Only node_ids[off[1]:] have a sample; the outermost hop's nodes have none.
        sampled = torch.cat([torch.zeros(off[1], dtype=torch.int64, device=structure.nbrs.device),
                             structure.nbr_offsets.diff()])
        return [sampled[off[k]:] for k in range(structure.num_layers)]
    out = []
    for k, block in enumerate(structure):
        deg = torch.zeros(int(block.src_nodes.numel()), dtype=torch.int64, device=block.src_nodes.device)
        if k > 0:
            outer = structure[k - 1]
            deg[:outer.num_dst] = torch.bincount(outer.edge_dst, minlength=outer.num_dst)
        deg[:block.num_dst] = torch.bincount(block.edge_dst, minlength=block.num_dst)
        out.append(deg)
    return out


class GNN(nn.Module):
    """A stack of ``num_layers`` layers of one kind, with activation and dropout between them.

    Parameters
    ----------
    kind : {"gat", "gcn", "gin", "rgcn", "sage"}
        Layer type.
    in_dim, hidden_dim, out_dim : int
        Input, hidden and output widths (GAT: ``hidden_dim`` is the concatenation of the
        heads, so it must be divisible by ``heads``; its last layer averages the heads).
    num_layers : int
        Layers; the structure passed to ``forward`` must have as many.
    dropout : float
        Dropout after each hidden layer's activation.
    activation : callable
        Between layers (not after the last).
    heads : int
        GAT heads.
    num_relations, num_bases : int
        RGCN relation types and bases (``num_bases=None``: no decomposition).
    learn_eps : bool
        GIN's learnable ``eps``.

    Raises
    ------
    ConfigError
        On an unknown kind or a bad size.
    """

    def __init__(self, kind: str, *, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int,
                 dropout: float = 0.0, activation: Callable[[torch.Tensor], torch.Tensor] = F.relu,
                 heads: int = 1, num_relations: int = 1, num_bases: int | None = None,
                 learn_eps: bool = False) -> None:
        super().__init__()
        if kind not in LAYERS:
            raise ConfigError(f"unknown layer kind {kind!r}; known kinds: {', '.join(LAYERS)}")
        if num_layers < 1:
            raise ConfigError(f"num_layers must be at least 1 (got {num_layers})")
        if kind == "gat" and num_layers > 1 and hidden_dim % heads:
            raise ConfigError(f"GAT hidden_dim ({hidden_dim}) must be divisible by heads ({heads})")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1) (got {dropout})")
        self.kind, self.num_layers, self.dropout, self.activation = kind, num_layers, dropout, activation
        self.hyperparameters = {"kind": kind, "in_dim": in_dim, "hidden_dim": hidden_dim, "out_dim": out_dim,
                                "num_layers": num_layers, "dropout": dropout, "heads": heads,
                                "num_relations": num_relations, "num_bases": num_bases, "learn_eps": learn_eps}
        """What rebuilds this stack (`GNN(**hyperparameters)`; the activation is F.relu unless
        the caller passes another), saved with its weights by `graphstore.inference.save_model`."""
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList()
        for k in range(num_layers):
            last = k == num_layers - 1
            if kind == "sage":
                layer = SAGEConv(dims[k], dims[k + 1])
            elif kind == "gcn":
                layer = GCNConv(dims[k], dims[k + 1])
            elif kind == "gat":
                per_head = dims[k + 1] if last else dims[k + 1] // heads
                layer = GATConv(dims[k], per_head, heads=heads, concat=not last)
            elif kind == "gin":
                layer = GINConv(dims[k], dims[k + 1], learn_eps=learn_eps)
            else:
                layer = RGCNConv(dims[k], dims[k + 1], num_relations=num_relations, num_bases=num_bases)
            self.layers.append(layer)

    def forward(self, h: torch.Tensor, structure: DENSE | Sequence[Block], *,
                edge_type: torch.Tensor | Sequence[torch.Tensor] | None = None,
                degrees: torch.Tensor | None = None, aggregated: torch.Tensor | None = None,
                aggregated_from: AggregateSource | None = None) -> torch.Tensor:
        """Run every layer; returns the targets' rows, float [T, out_dim].

        Parameters
        ----------
        h : float tensor [N, in_dim]
            Input rows: in ``dense.node_ids`` order, or ``blocks[0].src_nodes`` order; any
            float dtype (a float16 or bfloat16 store's rows as read, on the device they were
            copied to in that dtype), cast to the model's here, where the compute needs it.
        structure : DENSE or list of Block
            Layer ``k`` reads ``dense.layer(k)`` or ``blocks[k]``.
        edge_type : int64 tensor or sequence of them, RGCN only
            Relation of each sampled edge: one tensor aligned with ``dense.nbrs`` (layer
            ``k`` takes the suffix its ``repr_map[k]`` covers), or one tensor per layer
            aligned with that layer's ``nbr_index`` / ``edge_src``.
        degrees : int or float tensor [N], GCN only
            In-degree of every node, in the order of ``h``; default the sampled sizes
            (`layer_degrees`).
        aggregated : float tensor [N, in_dim], optional
            BatchGNN's aggregation cache (SAGE, GCN, GIN): every input node's stored
            aggregate of all its in-neighbours' rows (``AGGREGATE_FOR[kind]``), rows aligned
            with ``h``. The first layer then runs on ``(h, aggregated)`` row by row
            (``from_aggregate``) and ``structure`` has one hop fewer than the model has
            layers: the last hop is neither sampled nor read. Semantics: that layer sees every
            neighbour (GCN: with global degrees), not a sample.
        aggregated_from : AggregateSource, optional
            What ``aggregated`` is (a batch's ``aggregated_from``): its op is checked against
            the one this kind's first layer takes.

        Raises
        ------
        ConfigError
            On a structure with another number of layers, a missing ``edge_type``, or a
            stored aggregate of another op than ``AGGREGATE_FOR[kind]``.
        """
        if isinstance(structure, DENSE):
            views = [layer_view(structure.layer(k)) for k in range(structure.num_layers)]
        else:
            views = [layer_view(b) for b in structure]
        # Rows come as the store holds them (float16 features, float32 aggregates): the
        # first layer computes in the model's dtype.
        h = self._as_model_dtype(h)
        layers = list(self.layers)
        if aggregated is not None:
            aggregated = self._as_model_dtype(aggregated)
            if self.kind not in AGGREGATE_FOR:
                raise ConfigError(f"a {self.kind} model cannot take stored aggregates (only "
                                  f"{', '.join(AGGREGATE_FOR)}: their first layer is linear in the neighbours)")
            if aggregated_from is not None and aggregated_from.op != AGGREGATE_FOR[self.kind]:
                need = AGGREGATE_FOR[self.kind]
                raise ConfigError(f"{aggregated_from.array}: the stored aggregate is op {aggregated_from.op!r}; a "
                                  f"{self.kind} model's first layer needs {need!r} (`graphstore aggregate STORE "
                                  f"--op {need}`, and read that one)")
            if aggregated.shape != h.shape:
                raise ConfigError(f"aggregated must be aligned with h: shape {list(h.shape)} "
                                  f"(got {list(aggregated.shape)})")
            h = layers.pop(0).from_aggregate(h, aggregated)
            if layers:
                h = self._between(h)
        if len(views) != len(layers):
            if aggregated is not None:
                raise ConfigError(f"with stored aggregates the model's {self.num_layers} layers need "
                                  f"{len(layers)} sampled hops (got {len(views)})")
            raise ConfigError(f"the model has {self.num_layers} layers but the sample has {len(views)} hops; "
                              f"sample with {self.num_layers} fanouts")
        if self.kind == "rgcn":
            if edge_type is None:
                raise ConfigError("an RGCN needs edge_type, the relation of every sampled edge")
            if isinstance(edge_type, torch.Tensor):
                edge_type = [edge_type[edge_type.numel() - v.nbr_index.numel():] for v in views]
        if self.kind == "gcn":
            if degrees is None:
                per_layer = layer_degrees(structure)
            elif isinstance(structure, DENSE):
                per_layer = [degrees[degrees.numel() - v.num_inputs:] for v in views]
            else:
                # Block k's src nodes are a prefix of blocks[0].src_nodes (dst nodes come first).
                per_layer = [degrees[:v.num_inputs] for v in views]
        for k, (layer, view) in enumerate(zip(layers, views)):
            if self.kind == "rgcn":
                h = layer(h, view, edge_type[k])
            elif self.kind == "gcn":
                h = layer(h, view, per_layer[k])
            else:
                h = layer(h, view)
            if k < len(layers) - 1:
                h = self._between(h)
        return h

    def _as_model_dtype(self, rows: torch.Tensor) -> torch.Tensor:
        dtype = next(self.parameters()).dtype
        return rows.to(dtype) if rows.is_floating_point() and rows.dtype != dtype else rows

    def _between(self, h: torch.Tensor) -> torch.Tensor:
        """What follows every layer but the last: the activation, then dropout."""
        h = self.activation(h)
        return F.dropout(h, self.dropout, self.training) if self.dropout else h
