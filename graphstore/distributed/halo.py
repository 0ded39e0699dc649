"""Plain domain-parallel full-batch layers, the baseline SAR is measured against.

Every rank fetches its whole halo (the rows of other ranks its in-edges read) at each
layer, appends it to its own rows and runs the one-shot layer over that local graph with
ordinary autograd, which keeps the halo and every per-edge tensor until backward. The
fetch is an autograd Function whose backward sends the halo's gradient to its owners.
Exact like SAR; its memory grows with the halo and the edges, SAR's with one rank's share.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from graphstore.distributed.comm import Exchange, ring_peers
from graphstore.distributed.rank_graph import RankGraph
from graphstore.distributed.sar import CommStats
from graphstore.errors import ConfigError
from graphstore.nn import GCNConv, LayerView, RGCNConv

__all__ = ["HaloGraph", "fetch_halo", "halo_layer"]

_GRAD_TAG = 1 << 17


def _fetch(graph: RankGraph, h: torch.Tensor, stats: CommStats | None) -> torch.Tensor:
    """The halo rows of ``h`` [n, ...], by source rank (the order of `RankGraph.halo_view`)."""
    world, rank = graph.world_size, graph.rank
    parts: list[torch.Tensor | None] = [None] * world
    flat = h.reshape(h.shape[0], math.prod(h.shape[1:]))
    for step in range(1, world):
        to, source = ring_peers(rank, world, step)
        payload = flat.index_select(0, graph.send_rows[to])
        if stats is not None:
            stats.bytes_sent += payload.numel() * payload.element_size()
            stats.rows_fetched_remote += graph.pieces[source].num_rows
        parts[source] = Exchange(payload, to, (graph.pieces[source].num_rows, flat.shape[1]), source,
                                 dtype=h.dtype, device=h.device, tag=step).wait()
    rows = [p for s, p in enumerate(parts) if s != rank]
    out = torch.cat(rows) if rows else flat.new_zeros(0, flat.shape[1])
    return out.reshape((out.shape[0],) + tuple(h.shape[1:]))


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: RankGraph, stats: CommStats | None, h: torch.Tensor) -> torch.Tensor:
        ctx.graph, ctx.stats, ctx.shape = graph, stats, h.shape
        return _fetch(graph, h, stats)

    @staticmethod
    def backward(ctx, grad_halo: torch.Tensor):
        graph: RankGraph = ctx.graph
        world, rank = graph.world_size, graph.rank
        grad = grad_halo.new_zeros(ctx.shape)
        width = math.prod(ctx.shape[1:])
        flat_grad, flat_halo = grad.view(grad.shape[0], width), grad_halo.reshape(grad_halo.shape[0], width)
        offsets, at = {}, 0
        for s in range(world):
            if s != rank:
                offsets[s] = at
                at += graph.pieces[s].num_rows
        for step in range(1, world):
            # Forward's step: this rank received from `source` and sent to `to`; now back.
            to, source = ring_peers(rank, world, step)
            payload = flat_halo[offsets[source]:offsets[source] + graph.pieces[source].num_rows]
            if ctx.stats is not None:
                ctx.stats.bytes_sent += payload.numel() * payload.element_size()
            arrived = Exchange(payload, source, (graph.send_rows[to].numel(), flat_grad.shape[1]), to,
                               dtype=grad.dtype, device=grad.device, tag=_GRAD_TAG + step).wait()
            flat_grad.index_add_(0, graph.send_rows[to], arrived)
        return None, None, grad


def fetch_halo(graph: RankGraph, h: torch.Tensor, stats: CommStats | None = None) -> torch.Tensor:
    """``h``'s halo rows [halo_rows, ...], differentiable (backward returns their gradient
    to the owners). Collective."""
    return _Halo.apply(graph, stats, h)


class HaloGraph:
    """A rank's local graph for domain parallelism: the halo view, its relations, and GCN's
    degrees of the halo rows (fetched once)."""

    def __init__(self, graph: RankGraph) -> None:
        self.graph = graph
        self.view, self.edge_type = graph.halo_view()
        self.degrees = torch.cat([graph.in_degree, _fetch(graph, graph.in_degree, None)])


def halo_layer(layer: nn.Module, h: torch.Tensor, halo: HaloGraph, *, stats: CommStats | None = None) -> torch.Tensor:
    """One layer's output for the rank's block, from its rows and its halo (collective)."""
    graph = halo.graph
    if h.dim() != 2 or h.shape[0] != graph.num_nodes:
        raise ConfigError(f"h must have one row per node of the rank's block, [{graph.num_nodes}, D] "
                          f"(got {list(h.shape)})")
    if stats is not None:
        stats.rows_fetched_local += graph.num_nodes
    h_all = torch.cat([h, fetch_halo(graph, h, stats)])
    view: LayerView = halo.view
    if isinstance(layer, GCNConv):
        return layer(h_all, view, halo.degrees)
    if isinstance(layer, RGCNConv):
        return layer(h_all, view, halo.edge_type)
    return layer(h_all, view)
