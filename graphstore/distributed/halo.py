"""Plain domain-parallel full-batch layers, the baseline SAR is measured against.

Each layer, every rank prepares its own rows once (the layer's per-source transform,
`partial_sources`, as SAR's owner does: SAGE's and GCN's projection when it narrows the
rows, GCN's source degree factor with the owner's degrees, GAT's projection and scores,
RGCN's basis projections), fetches the prepared rows of its whole halo at once (only the
rows its in-edges read, from every other rank) and aggregates every in-edge in one pass
under autograd, which keeps the fetched halo until backward. Its own rows are read where
they lie, never copied beside the halo. The fetch is an autograd Function whose backward
sends the halo's gradient to its owners.

The aggregation is what the paper's baseline (DGL's layers) keeps: a sum over edges of
source rows (`_GatherSum`, DGL's SpMM ``copy_u``/``u_mul_e`` then ``sum``) keeps no per-edge
tensor for backward, only the indices and, for GAT, the attention logits and weights
[E, heads] (DGL's GATConv stores them too, unlike SAR's fused attention); RGCN with bases
keeps its per-edge messages, as DGL's RelGraphConv does. Each piece's per-edge tensors are
whole while it is aggregated (one pass, unfused). What differs from SAR is only what the
paper says differs: the halo is fetched whole and kept, and nothing is rematerialized.
Exact like SAR.
"""

from __future__ import annotations

import torch
from torch import nn

from graphstore.distributed.comm import Exchange, ring_peers
from graphstore.distributed.rank_graph import Piece, RankGraph

# The packing of several prepared tensors into one message, and the layer kinds, are SAR's:
# the two modes send the same rows and differ only in how they aggregate and what they keep.
from graphstore.distributed.sar import CommStats, _kind, _pack, _unpack
from graphstore.errors import ConfigError
from graphstore.nn import PartialAggregate, PartialSources

__all__ = ["HaloGraph", "fetch_halo", "halo_layer"]

_GRAD_TAG = 1 << 17


class _Halo(torch.autograd.Function):
    """The halo's prepared rows: one packed [rows, width] tensor per ring step (from rank
    ``ring_peers(rank, N, step)[1]``); backward returns their gradient to the owners."""

    @staticmethod
    def forward(ctx, graph: RankGraph, stats: CommStats | None, *local: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.graph, ctx.stats = graph, stats
        ctx.shapes = tuple(t.shape for t in local)
        world, rank = graph.world_size, graph.rank
        out = []
        for step in range(1, world):
            to, source = ring_peers(rank, world, step)
            # Only the rows `to` reads are gathered and packed: no copy of the whole block.
            payload = _pack(tuple(t.index_select(0, graph.send_rows[to]) for t in local))
            if stats is not None:
                stats.bytes_sent += payload.numel() * payload.element_size()
                stats.rows_fetched_remote += graph.pieces[source].num_rows
            out.append(Exchange(payload, to, (graph.pieces[source].num_rows, payload.shape[1]), source,
                                dtype=payload.dtype, device=payload.device, tag=step).wait())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        graph: RankGraph = ctx.graph
        world, rank = graph.world_size, graph.rank
        first = grads[0]
        local = tuple(first.new_zeros(shape) for shape in ctx.shapes)
        for step, grad in enumerate(grads, start=1):
            # Forward's step: this rank received from `source` and sent to `to`; now back.
            to, source = ring_peers(rank, world, step)
            if ctx.stats is not None:
                ctx.stats.bytes_sent += grad.numel() * grad.element_size()
            arrived = Exchange(grad, source, (graph.send_rows[to].numel(), grad.shape[1]), to,
                               dtype=grad.dtype, device=grad.device, tag=_GRAD_TAG + step).wait()
            for into, part in zip(local, _unpack(arrived, local), strict=True):
                into.index_add_(0, graph.send_rows[to], part)
        return (None, None, *local)


def fetch_halo(graph: RankGraph, *local: torch.Tensor,
               stats: CommStats | None = None) -> list[tuple[Piece, tuple[torch.Tensor, ...]]]:
    """Every other rank's piece of in-edges with the rows of ``local`` (tensors with a row
    per node of the block, [n, ...]) that its edges read, fetched from that rank, unpacked
    like ``local``; differentiable (backward returns their gradient to the owners).
    Collective."""
    world, rank = graph.world_size, graph.rank
    if world == 1:
        return []
    packed = _Halo.apply(graph, stats, *local)
    return [(graph.pieces[ring_peers(rank, world, step)[1]], _unpack(rows, local))
            for step, rows in enumerate(packed, start=1)]


class HaloGraph:
    """A rank's graph for domain parallelism (its `RankGraph`); the pieces of in-edges
    already say which rows each fetches, so nothing else is built."""

    def __init__(self, graph: RankGraph) -> None:
        self.graph = graph


class _GatherSum(torch.autograd.Function):
    """``out[d] = sum over edges (s, d) of rows[s] (* weight[e])``, [n, ...] (``weight``
    [E, H] scales rows [*, H, F]): a sparse-dense product whose backward needs the indices
    and, with weights, the weights and the rows (held anyway), never a per-edge message;
    autograd's ``index_add`` would keep the gathered [E, ...] messages of every layer."""

    @staticmethod
    def forward(ctx, n: int, src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor,
                weight: torch.Tensor | None = None) -> torch.Tensor:
        msg = rows.index_select(0, src)
        if weight is not None:
            msg.mul_(weight[..., None])
        ctx.save_for_backward(src, dst, rows if weight is not None else None, weight)
        ctx.num_rows = rows.shape[0]
        return rows.new_zeros((n,) + tuple(rows.shape[1:])).index_add_(0, dst, msg)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        src, dst, rows, weight = ctx.saved_tensors
        per_edge = grad.index_select(0, dst)
        grad_weight = None
        if weight is not None:
            if ctx.needs_input_grad[4]:
                grad_weight = (per_edge * rows.index_select(0, src)).sum(-1)
            per_edge.mul_(weight[..., None])
        grad_rows = grad.new_zeros((ctx.num_rows,) + tuple(grad.shape[1:])).index_add_(0, src, per_edge)
        return None, None, None, grad_rows, grad_weight


def _linear_sum(layer: nn.Module, kind: str, rows: torch.Tensor,
                pieces: list[tuple[Piece, tuple[torch.Tensor, ...]]], n: int) -> torch.Tensor:
    """The in-edge sums of a linear layer (SAGE, GCN, GIN, RGCN) over every piece at once."""
    if kind == "rgcn" and layer.coeff is None:  # one weight per relation: rows [*, R, out] by relation
        r, width = layer.num_relations, layer.out_dim
        total = sum(_GatherSum.apply(n * r, p.src * r + p.rel, p.dst * r + p.rel, rows_p.reshape(-1, width))
                    for p, (rows_p,) in pieces)
        return total.view(n, r, width)
    if kind != "rgcn":
        return sum(_GatherSum.apply(n, p.src, p.dst, rows_p) for p, (rows_p,) in pieces)
    # RGCN with bases mixes each edge's rows by its relation's coefficients: its own
    # ``_accumulate`` under autograd, which keeps the per-edge messages (DGL's does too).
    acc = PartialAggregate(rows.new_zeros(n, layer.num_relations, layer.out_dim),
                           count=torch.zeros(n, layer.num_relations, dtype=torch.int64, device=rows.device))
    for piece, (source_rows,) in pieces:
        layer._accumulate(acc, PartialSources(source_rows), piece.src, piece.dst, piece.rel)
    return acc.total


def _gat(layer: nn.Module, x: torch.Tensor, score_src: torch.Tensor,
         pieces: list[tuple[Piece, tuple[torch.Tensor, ...]]]) -> torch.Tensor:
    """GAT over every piece at once: the one-shot layer's softmax (edges and the self loop,
    shifted by each destination's maximum); autograd keeps each edge's logit and weight."""
    score_dst = (x * layer.attn_dst).sum(-1)                               # as partial_begin
    self_logits = layer._logits(score_src, score_dst)                     # [n, H]
    logits = [layer._logits(s.index_select(0, p.src), score_dst.index_select(0, p.dst)) for p, (_, s) in pieces]
    with torch.no_grad():  # softmax does not depend on the shift: it carries no gradient
        top = self_logits.clone()
        for (p, _), lg in zip(pieces, logits, strict=True):
            top = top.scatter_reduce(0, p.dst[:, None].expand_as(lg), lg, "amax", include_self=True)
    self_weight = torch.exp(self_logits - top)
    denom, total = self_weight, x * self_weight[..., None]
    for (p, (rows, _)), lg in zip(pieces, logits, strict=True):
        weight = torch.exp(lg - top.index_select(0, p.dst))                                 # [E, H]
        denom = denom.index_add(0, p.dst, weight)
        total = total + _GatherSum.apply(x.shape[0], p.src, p.dst, rows, weight)
    return layer.partial_finish(PartialAggregate(total, denom=denom))


def halo_layer(layer: nn.Module, h: torch.Tensor, halo: HaloGraph, *, stats: CommStats | None = None) -> torch.Tensor:
    """One layer's output for the rank's block, float [n, out], from its rows and its
    halo's (collective). ``layer`` as `graphstore.distributed.sar_layer` takes it."""
    graph = halo.graph
    if h.dim() != 2 or h.shape[0] != graph.num_nodes:
        raise ConfigError(f"h must have one row per node of the rank's block, [{graph.num_nodes}, D] "
                          f"(got {list(h.shape)})")
    kind = _kind(layer)
    if stats is not None:
        stats.rows_fetched_local += graph.num_nodes
    n, own = graph.num_nodes, graph.pieces[graph.rank]
    if kind == "gat":
        if layer.training and layer.attn_dropout > 0:
            raise ConfigError("the full-batch GAT has no attention dropout (set attn_dropout=0)")
        sources = layer.partial_sources(h)
        x, score = sources.rows, sources.score
        return _gat(layer, x, score, [(own, (x, score)), *fetch_halo(graph, x, score, stats=stats)])
    if kind == "gcn":
        rows = layer.partial_sources(h, degrees_src=graph.in_degree).rows
    else:
        rows = layer.partial_sources(h).rows                              # GIN: h itself
    total = _linear_sum(layer, kind, rows, [(own, (rows,)), *fetch_halo(graph, rows, stats=stats)], n)
    # The self terms and the finish, as sar_layer's.
    if kind == "gcn":
        return layer.partial_finish(PartialAggregate(rows + total, norm=layer._norm(graph.in_degree, h.dtype)))
    if kind == "gin":
        return layer.partial_finish(PartialAggregate(layer._own(h) + total))
    if kind == "rgcn":
        return layer.partial_finish(PartialAggregate(total, own=layer.fc_self(h), count=graph.relation_counts()))
    return layer.partial_finish(PartialAggregate(total, own=layer.fc_self(h), count=graph.in_degree))
