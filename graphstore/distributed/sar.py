"""Sequential aggregation and rematerialization (SAR, Mostafa 2022): one GNN layer over a
graph split across ranks, holding one other rank's rows at a time.

Forward, for each layer: a rank prepares its own rows once (the layer's per-source
transform, `partial_sources`: SAGE's and GCN's messages, GAT's projection and scores,
RGCN's basis projections), opens an accumulator, aggregates its own block's in-edges,
then fetches from each other rank, in ring order, exactly the prepared rows its edges read,
aggregates them with the layer's partial form (`_accumulate`) and frees them; the next
rank's rows are already on their way (prefetch). All of it runs inside one autograd
Function, so autograd records nothing across the gap: what a layer keeps for backward is its
local inputs and its accumulated sums, never the fetched rows or any per-edge tensor.

Backward rematerializes piece by piece:

* SAGE, GCN, GIN and RGCN without bases aggregate linearly, so the gradient of the rows a
  rank fetched is the scatter of its sums' gradient over the piece's edges: it is computed
  without the rows and sent to their owner, who adds it to its own rows' gradient (and
  autograd takes it through the per-source transform there).
* GAT's weights depend on the fetched scores: the rows are fetched again and the attention
  of each edge recomputed (under the final per-destination maximum kept from forward), its
  gradient taken, and the fetched rows' gradient sent to their owner. RGCN with bases
  mixes each edge's rows with the relation's coefficients, whose gradient needs the rows:
  it re-fetches too (the paper lists only sum, mean and attention layers).

Fused aggregation. Each piece is aggregated ``edge_chunk`` edges at a time (at most an eighth
of the rank's own in-edges, `fitted_edge_chunk`), forward and backward, so no per-edge tensor
(gathered messages, attention logits and weights) ever has more than ``edge_chunk`` rows: GAT's coefficients are computed on the fly and never stored
per edge. This stands in for the paper's fused kernels (DGL's SpMM, its fused attention),
written with torch ops instead of a custom kernel; ``edge_chunk=None`` is the unfused form
(each piece's per-edge tensors whole), the comparison the benchmark makes.

Departure from the paper: the paper fetches the layer inputs ``h``; here the owner sends its
rows already through the per-source transform (SAGE and GCN send the narrower of the input
and the projection, as the layers aggregate; GCN's source factor uses the owner's degrees),
so the receiver needs no remote degrees and no re-projection, and every rank transforms
each of its rows once per layer instead of once per rank that reads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from graphstore.distributed.comm import Exchange, ring_peers
from graphstore.distributed.rank_graph import Piece, RankGraph
from graphstore.errors import ConfigError
from graphstore.nn import GATConv, GCNConv, GINConv, PartialAggregate, PartialSources, RGCNConv, SAGEConv

__all__ = ["DEFAULT_EDGE_CHUNK", "CommStats", "fitted_edge_chunk", "sar_layer"]

DEFAULT_EDGE_CHUNK = 1 << 17
"""Edges aggregated at a time: bounds every per-edge tensor to this many rows."""
OWN_EDGE_CHUNKS = 8
"""A chunk is also at most 1/8 of the rank's own in-edges (`fitted_edge_chunk`): with a fixed
chunk a rank's per-edge buffers did not shrink with N where its own edges fill less than a
few chunks (GAT on a 34k-node graph: 4 ranks at 0.53x one rank's step peak instead of
0.25x)."""
MIN_EDGE_CHUNK = 4096
"""Chunks no smaller than this (each is a few torch calls: smaller ones cost time, not memory)."""

_GRAD_TAG = 1 << 16  # backward's gradient messages: tags apart from the fetches' ring steps


class CommStats:
    """Rows a rank read to aggregate (its own block's and fetched ones) and bytes it sent."""

    def __init__(self) -> None:
        self.rows_fetched_local = 0
        self.rows_fetched_remote = 0
        self.bytes_sent = 0

    def as_dict(self) -> dict[str, int]:
        return {"rows_fetched_local": self.rows_fetched_local, "rows_fetched_remote": self.rows_fetched_remote,
                "bytes_sent": self.bytes_sent}


def fitted_edge_chunk(edge_chunk: int | None, graph: RankGraph) -> int | None:
    """The chunk a rank aggregates with: ``edge_chunk``, at most 1/`OWN_EDGE_CHUNKS` of its
    own in-edges and at least `MIN_EDGE_CHUNK` (None: unfused, each piece whole). So its
    per-edge buffers are a share of its own edges at every N, and shrink as N grows."""
    if edge_chunk is None:
        return None
    own = int(graph.pieces[graph.rank].src.numel())
    return min(edge_chunk, max(MIN_EDGE_CHUNK, math.ceil(own / OWN_EDGE_CHUNKS)))


def _chunks(piece: Piece, edge_chunk: int | None) -> Iterator[slice]:
    m = int(piece.src.numel())
    step = m if edge_chunk is None else edge_chunk
    for start in range(0, m, max(step, 1)):
        yield slice(start, start + step)


def _pack(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Tensors with rows aligned, as one [n, width] tensor (one message per peer)."""
    return torch.cat([t.reshape(t.shape[0], math.prod(t.shape[1:])) for t in tensors], 1)


def _unpack(packed: torch.Tensor, like: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    out, col = [], 0
    for t in like:
        width = math.prod(t.shape[1:])
        out.append(packed[:, col:col + width].reshape((packed.shape[0],) + tuple(t.shape[1:])))
        col += width
    return tuple(out)


class _Ring:
    """The pieces of one pass over a layer's in-edges: the own block first, then each other
    rank's fetched rows in ring order, the next rank's fetch posted before this one is
    used (so at most two fetched pieces are held: the paper's 3/N with prefetch)."""

    def __init__(self, graph: RankGraph, stats: CommStats, *, prefetch: bool = True) -> None:
        self.graph, self.stats, self.prefetch = graph, stats, prefetch

    def pieces(self, local: tuple[torch.Tensor, ...]) -> Iterator[tuple[Piece, tuple[torch.Tensor, ...]]]:
        g = self.graph
        world, rank = g.world_size, g.rank
        def post(step: int) -> Exchange:
            to, source = ring_peers(rank, world, step)
            # Only the rows `to` reads are gathered and packed (no copy of the whole block).
            payload = _pack(tuple(t.index_select(0, g.send_rows[to]) for t in local))
            self.stats.bytes_sent += payload.numel() * payload.element_size()
            return Exchange(payload, to, (g.pieces[source].num_rows, payload.shape[1]), source,
                            dtype=payload.dtype, device=payload.device, tag=step)

        pending = post(1) if world > 1 else None
        self.stats.rows_fetched_local += g.num_nodes
        yield g.pieces[rank], local
        for step in range(1, world):
            current = pending
            pending = post(step + 1) if self.prefetch and step + 1 < world else None
            rows = current.wait()
            del current
            self.stats.rows_fetched_remote += rows.shape[0]
            yield g.pieces[ring_peers(rank, world, step)[1]], _unpack(rows, local)
            del rows
            if not self.prefetch and step + 1 < world:
                pending = post(step + 1)


class _GradReturn:
    """Backward's messages the other way: the gradient of rows fetched from rank ``s`` goes
    back to ``s``; the gradient other ranks computed for this block's rows arrives and is
    added to ``grads`` (one step in flight while the next piece is computed)."""

    def __init__(self, graph: RankGraph, grads: tuple[torch.Tensor, ...], stats: CommStats) -> None:
        self.graph, self.grads, self.stats = graph, grads, stats
        self.pending: tuple[Exchange, int] | None = None

    def send(self, step: int, piece_grads: tuple[torch.Tensor, ...]) -> None:
        g = self.graph
        to, source = ring_peers(g.rank, g.world_size, step)
        payload = _pack(piece_grads)
        self.stats.bytes_sent += payload.numel() * payload.element_size()
        # Rank `to` fetched this block's send_rows[to] at this step; `source` fed this rank.
        ex = Exchange(payload, source, (g.send_rows[to].numel(), payload.shape[1]), to,
                      dtype=payload.dtype, device=payload.device, tag=_GRAD_TAG + step)
        self.flush()
        self.pending = (ex, to)

    def flush(self) -> None:
        if self.pending is None:
            return
        ex, to = self.pending
        self.pending = None
        rows = self.graph.send_rows[to]
        for grad, arrived in zip(self.grads, _unpack(ex.wait(), self.grads)):
            grad.index_add_(0, rows, arrived)


def _kind(layer: nn.Module) -> str:
    for cls, name in ((SAGEConv, "sage"), (GCNConv, "gcn"), (GINConv, "gin"), (RGCNConv, "rgcn"), (GATConv, "gat")):
        if isinstance(layer, cls):
            return name
    raise ConfigError(f"SAR aggregates SAGEConv, GCNConv, GINConv, RGCNConv and GATConv layers "
                      f"(got {type(layer).__name__})")


class _Run:
    """One layer's sequential aggregation: what the Function needs besides tensors."""

    def __init__(self, layer: nn.Module, graph: RankGraph, *, edge_chunk: int | None, prefetch: bool,
                 stats: CommStats) -> None:
        self.layer, self.graph, self.kind = layer, graph, _kind(layer)
        self.edge_chunk, self.prefetch, self.stats = fitted_edge_chunk(edge_chunk, graph), prefetch, stats
        self.recompute = self.kind == "gat" or (self.kind == "rgcn" and layer.coeff is not None)

    # ------------------------------------------------------------------ forward

    def _open(self, inputs: tuple[torch.Tensor, ...]) -> PartialAggregate:
        """An accumulator holding no edge yet (the self terms are added outside, in autograd)."""
        n, first = self.graph.num_nodes, inputs[0]
        if self.kind == "gat":
            x, score_src, score_dst = inputs
            # The self loop's logit opens the running maximum: the final maximum is then the
            # one-shot softmax's shift, and the self term is weighted under it outside.
            return PartialAggregate(x.new_zeros(x.shape), score_dst=score_dst,
                                    max=self.layer._logits(score_src, score_dst),
                                    denom=score_dst.new_zeros(score_dst.shape))
        if self.kind == "rgcn":
            return PartialAggregate(first.new_zeros(n, self.layer.num_relations, self.layer.out_dim),
                                    count=torch.zeros(n, self.layer.num_relations, dtype=torch.int64,
                                                      device=first.device))
        return PartialAggregate(first.new_zeros(first.shape),
                                count=torch.zeros(n, dtype=torch.int64, device=first.device))

    def forward(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        acc = self._open(inputs)
        exchanged = inputs[:2] if self.kind == "gat" else inputs[:1]
        for piece, rows in _Ring(self.graph, self.stats, prefetch=self.prefetch).pieces(exchanged):
            sources = PartialSources(*rows)
            for sl in _chunks(piece, self.edge_chunk):
                rel = piece.rel[sl] if piece.rel is not None else None
                self.layer._accumulate(acc, sources, piece.src[sl], piece.dst[sl], rel)
            del sources, rows
        if self.kind == "gat":
            return acc.total, acc.denom, acc.max
        return (acc.total,)

    # ------------------------------------------------------------------ backward

    def _scatter_back(self, grad_total: torch.Tensor, piece: Piece, like: torch.Tensor) -> torch.Tensor:
        """The gradient of a linear piece's source rows: its sums' gradient gathered at each
        edge's destination and added at its source (no source row needed)."""
        out = like.new_zeros((piece.num_rows,) + tuple(like.shape[1:]))
        for sl in _chunks(piece, self.edge_chunk):
            src, dst = piece.src[sl], piece.dst[sl]
            if self.kind == "rgcn":
                r, width = self.layer.num_relations, self.layer.out_dim
                out.view(-1, width).index_add_(0, src * r + piece.rel[sl],
                                               grad_total.view(-1, width).index_select(0, dst * r + piece.rel[sl]))
            else:
                out.index_add_(0, src, grad_total.index_select(0, dst))
        return out

    def backward_linear(self, rows: torch.Tensor, grad_total: torch.Tensor) -> torch.Tensor:
        g = self.graph
        grad_rows = self._scatter_back(grad_total, g.pieces[g.rank], rows)
        back = _GradReturn(g, (grad_rows,), self.stats)
        for step in range(1, g.world_size):
            source = ring_peers(g.rank, g.world_size, step)[1]
            back.send(step, (self._scatter_back(grad_total, g.pieces[source], rows),))
        back.flush()
        return grad_rows

    def _gat_piece_grads(self, rows: tuple[torch.Tensor, torch.Tensor], piece: Piece, top: torch.Tensor,
                         grad_total: torch.Tensor, grad_denom: torch.Tensor, grad_score_dst: torch.Tensor,
                         score_dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute each edge's attention weight ``w = exp(logit - max[dst])`` a chunk at a
        time and return the gradient of the piece's source rows (x, score); the destination
        scores' gradient is added to ``grad_score_dst``."""
        x, score = rows
        grad_x, grad_score = torch.zeros_like(x), torch.zeros_like(score)
        for sl in _chunks(piece, self.edge_chunk):
            src, dst = piece.src[sl], piece.dst[sl]
            with torch.enable_grad():
                s_e = score.index_select(0, src).requires_grad_()
                d_e = score_dst.index_select(0, dst).requires_grad_()
                weight = torch.exp(self.layer._logits(s_e, d_e) - top.index_select(0, dst))        # [E, H]
            g_t = grad_total.index_select(0, dst)                                                  # [E, H, F]
            grad_weight = (g_t * x.index_select(0, src)).sum(-1) + grad_denom.index_select(0, dst)
            g_s, g_d = torch.autograd.grad(weight, (s_e, d_e), grad_weight)
            grad_x.index_add_(0, src, g_t * weight.detach()[..., None])
            grad_score.index_add_(0, src, g_s)
            grad_score_dst.index_add_(0, dst, g_d)
        return grad_x, grad_score

    def _rgcn_piece_grads(self, proj: torch.Tensor, piece: Piece, grad_total: torch.Tensor,
                          grad_coeff: torch.Tensor) -> torch.Tensor:
        layer, r, width = self.layer, self.layer.num_relations, self.layer.out_dim
        grad_proj = torch.zeros_like(proj)
        for sl in _chunks(piece, self.edge_chunk):
            src, dst, rel = piece.src[sl], piece.dst[sl], piece.rel[sl]
            with torch.enable_grad():
                p_e = proj.index_select(0, src).requires_grad_()
                msg = layer._gather(p_e, torch.arange(src.numel(), device=src.device), rel)       # [E, out]
            g_p, g_c = torch.autograd.grad(msg, (p_e, layer.coeff),
                                           grad_total.view(-1, width).index_select(0, dst * r + rel))
            grad_proj.index_add_(0, src, g_p)
            grad_coeff += g_c
        return grad_proj

    def backward_recompute(self, inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...],
                           grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
        g = self.graph
        if self.kind == "gat":
            x, score_src, score_dst = inputs
            top = outputs[2]
            grad_total, grad_denom = grads[0], grads[1]
            grad_score_dst = torch.zeros_like(score_dst)
            exchanged = (x, score_src)

            def piece_grads(piece, rows):
                return self._gat_piece_grads(rows, piece, top, grad_total, grad_denom, grad_score_dst, score_dst)
        else:
            exchanged = inputs[:1]
            grad_coeff = torch.zeros_like(self.layer.coeff)

            def piece_grads(piece, rows):
                return (self._rgcn_piece_grads(rows[0], piece, grads[0], grad_coeff),)
        own = None
        back = None
        for step, (piece, rows) in enumerate(_Ring(g, self.stats, prefetch=self.prefetch).pieces(exchanged)):
            piece_g = piece_grads(piece, rows)
            del rows
            if step == 0:
                own = piece_g  # fresh tensors: the other ranks' gradients are added to them
                back = _GradReturn(g, own, self.stats)
            else:
                back.send(step, piece_g)
        back.flush()
        if self.kind == "gat":
            return own[0], own[1], grad_score_dst
        return own[0], grad_coeff


class _SequentialAggregation(torch.autograd.Function):
    """The in-edge sums of one layer over every rank's block: the inputs are this rank's
    prepared rows (and GAT's destination scores, RGCN's coefficients); the outputs the
    sums its `partial_finish` takes (GAT: weighted sum, denominator, and the maximum they
    are scaled under, not differentiable)."""

    @staticmethod
    def forward(ctx, run: _Run, *inputs: torch.Tensor):
        outputs = run.forward(inputs)
        ctx.run = run
        if run.kind == "gat":
            ctx.mark_non_differentiable(outputs[2])
            ctx.save_for_backward(*inputs, outputs[2])
        else:
            ctx.save_for_backward(*inputs)
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        run: _Run = ctx.run
        saved = ctx.saved_tensors
        if run.kind == "gat":
            result = run.backward_recompute(saved[:3], (None, None, saved[3]), grads)
        elif run.recompute:
            result = run.backward_recompute(saved, (), grads)
        else:
            result = (run.backward_linear(saved[0], grads[0]),)
        return (None, *result)


def sar_layer(layer: nn.Module, h: torch.Tensor, graph: RankGraph, *, edge_chunk: int | None = DEFAULT_EDGE_CHUNK,
              prefetch: bool = True, stats: CommStats | None = None) -> torch.Tensor:
    """One layer's output for this rank's block, aggregating every rank's rows in turn.

    Collective: every rank calls it for the same layer (and its backward runs together).

    Parameters
    ----------
    layer : SAGEConv, GCNConv, GINConv, RGCNConv or GATConv
        GCN uses the whole graph's in-degrees (``graph.in_degree``, the owner's for a
        source row); GAT must have no attention dropout.
    h : float tensor [n, in_dim]
        The layer input of this rank's block.
    graph : RankGraph
    edge_chunk : int or None
        Edges aggregated at a time (None: each piece whole, the unfused form).
    prefetch : bool
        Post the next rank's fetch before aggregating the current one.
    stats : CommStats, optional
        Rows read and bytes sent are added to it.

    Returns
    -------
    float tensor [n, out]
        What the one-shot layer gives for these rows over the whole graph.
    """
    if h.dim() != 2 or h.shape[0] != graph.num_nodes:
        raise ConfigError(f"h must have one row per node of the rank's block, [{graph.num_nodes}, D] "
                          f"(got {list(h.shape)})")
    run = _Run(layer, graph, edge_chunk=edge_chunk, prefetch=prefetch, stats=stats or CommStats())
    if run.kind == "gat":
        if layer.training and layer.attn_dropout > 0:
            raise ConfigError("SAR's GAT has no attention dropout (set attn_dropout=0)")
        sources = layer.partial_sources(h)
        x, score_src = sources.rows, sources.score
        score_dst = (x * layer.attn_dst).sum(-1)                           # as partial_begin
        total, denom, top = _SequentialAggregation.apply(run, x, score_src, score_dst)
        # The self loop, under the same maximum as the edges (its weight is exp(0) = 1 when
        # it holds the maximum); the shift cancels in total / denom, so it carries no gradient.
        self_weight = torch.exp(layer._logits(score_src, score_dst) - top)
        acc = PartialAggregate(total + x * self_weight[..., None], denom=denom + self_weight)
        return layer.partial_finish(acc)
    if run.kind == "gcn":
        rows = layer.partial_sources(h, degrees_src=graph.in_degree).rows
        agg = _SequentialAggregation.apply(run, rows)
        # partial_begin's opening is the self loop's message, the block's own prepared row.
        return layer.partial_finish(PartialAggregate(rows + agg, norm=layer._norm(graph.in_degree, h.dtype)))
    if run.kind == "gin":
        agg = _SequentialAggregation.apply(run, h)
        return layer.partial_finish(PartialAggregate(layer._own(h) + agg))
    rows = layer.partial_sources(h).rows
    if run.kind == "rgcn":
        agg = _SequentialAggregation.apply(run, rows, *([layer.coeff] if run.recompute else []))
        return layer.partial_finish(PartialAggregate(agg, own=layer.fc_self(h), count=graph.relation_counts()))
    agg = _SequentialAggregation.apply(run, rows)
    return layer.partial_finish(PartialAggregate(agg, own=layer.fc_self(h), count=graph.in_degree))
