"""Full-batch GNN training across ranks: a `GNN` stack with optional BatchNorm between its
layers, run over every rank's block (SAR or domain parallel), its loss over the whole
graph's training nodes, and the gradient all-reduce; plus the single-process full-batch
forward the distributed one must equal.

Between layers, in this order: BatchNorm (`distributed_batch_norm`), the activation, and
dropout keyed by node (`node_dropout`), so the result does not depend on the number of
ranks. The loss is the mean cross-entropy over every training node of the graph: each rank
sums over its own and divides by the global count, so the ranks' losses add up to it, and
the gradients, all-reduced with a sum, are the single process's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from graphstore.distributed.batchnorm import distributed_batch_norm
from graphstore.distributed.comm import all_reduce_sum
from graphstore.distributed.dropout import node_dropout
from graphstore.distributed.halo import HaloGraph, halo_layer
from graphstore.distributed.rank_graph import RankGraph
from graphstore.distributed.sar import DEFAULT_EDGE_CHUNK, CommStats, sar_layer
from graphstore.errors import ConfigError
from graphstore.nn import GNN, GCNConv, GINConv, LayerView, RGCNConv, SAGEConv

__all__ = ["MODES", "FullBatchGNN", "all_reduce_gradients", "full_batch_loss", "reference_forward"]

MODES = ("sar", "domain_parallel")
"""How a layer reaches other ranks' rows: sequentially (SAR) or all at once (the halo)."""


class FullBatchGNN(nn.Module):
    """A `GNN` stack (``gnn``) and, with ``batch_norm``, an ``nn.BatchNorm1d`` after each
    hidden layer (``norms``). Keyword arguments are `GNN`'s; GAT has no attention dropout.

    A layer followed by BatchNorm has no bias: BatchNorm subtracts the mean, so that bias's
    true gradient is zero, and what it gets is round-off, which differs with the number of
    ranks; Adam scales any gradient to a step of about ``lr``, so the bias (and through it
    BatchNorm's running mean) would drift differently on 1 and on N ranks. BatchNorm's own
    shift (``norms[k].bias``) takes its place."""

    def __init__(self, kind: str, *, batch_norm: bool = False, **gnn_kwargs) -> None:
        super().__init__()
        self.gnn = GNN(kind, **gnn_kwargs)
        hidden = gnn_kwargs["hidden_dim"]
        count = self.gnn.num_layers - 1 if batch_norm else 0
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(count))
        for layer in list(self.gnn.layers)[:count]:
            _drop_output_bias(layer)
        self.hyperparameters = {**self.gnn.hyperparameters, "batch_norm": batch_norm}

    @property
    def kind(self) -> str:
        return self.gnn.kind

    def _between(self, h: torch.Tensor, k: int, *, norm, partition_starts, first_partition, seed, epoch):
        if self.norms:
            h = norm(h, self.norms[k])
        h = self.gnn.activation(h)
        if self.training and self.gnn.dropout:
            h = node_dropout(h, self.gnn.dropout, partition_starts, first_partition, seed=seed, epoch=epoch,
                             layer=k)
        return h

    def forward(self, x: torch.Tensor, graph: RankGraph, *, mode: str = "sar", halo: HaloGraph | None = None,
                seed: int = 0, epoch: int = 0, edge_chunk: int | None = DEFAULT_EDGE_CHUNK, prefetch: bool = True,
                stats: CommStats | None = None) -> torch.Tensor:
        """This rank's block's outputs, float [n, out_dim] (collective).

        ``mode`` "sar" aggregates other ranks' rows one rank at a time; "domain_parallel"
        fetches the whole halo (``halo``, built once per graph, or built here)."""
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
        if mode == "domain_parallel" and halo is None:
            halo = HaloGraph(graph)
        h = x
        for k, layer in enumerate(self.gnn.layers):
            if mode == "sar":
                h = sar_layer(layer, h, graph, edge_chunk=edge_chunk, prefetch=prefetch, stats=stats)
            else:
                h = halo_layer(layer, h, halo, stats=stats)
            if k < self.gnn.num_layers - 1:
                h = self._between(h, k, norm=distributed_batch_norm, partition_starts=graph.partition_starts,
                                  first_partition=graph.first_partition, seed=seed, epoch=epoch)
        return h


def _drop_output_bias(layer: nn.Module) -> None:
    """Remove the bias ``layer`` adds to its output (SAGE's and RGCN's self term carries it,
    GIN's MLP ends in it; GCN and GAT hold their own)."""
    if isinstance(layer, (SAGEConv, RGCNConv)):
        owner = layer.fc_self
    elif isinstance(layer, GINConv):
        owner = layer.mlp[-1]
    else:
        owner = layer
    if not isinstance(getattr(owner, "bias", None), nn.Parameter):
        raise ConfigError(f"{type(layer).__name__}: no output bias to drop before BatchNorm")
    owner.register_parameter("bias", None)


def reference_forward(model: FullBatchGNN, x: torch.Tensor, view: LayerView, *, partition_starts: Sequence[int],
                      degrees: torch.Tensor | None = None, edge_type: torch.Tensor | None = None, seed: int = 0,
                      epoch: int = 0) -> torch.Tensor:
    """Single-process full-batch forward: every layer one-shot over ``view`` (every node an
    output, all its in-edges), torch's own batch norm over all rows, the same dropout
    masks (``partition_starts``: every partition's first store id, then num_nodes)."""

    def torch_norm(h, bn):
        momentum = bn.momentum if bn.momentum is not None else 0.1
        if bn.training:
            bn.num_batches_tracked.add_(1)
        return F.batch_norm(h, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.training, momentum, bn.eps)

    h = x
    for k, layer in enumerate(model.gnn.layers):
        if isinstance(layer, GCNConv):
            h = layer(h, view, degrees)
        elif isinstance(layer, RGCNConv):
            h = layer(h, view, edge_type)
        else:
            h = layer(h, view)
        if k < model.gnn.num_layers - 1:
            h = model._between(h, k, norm=torch_norm, partition_starts=partition_starts, first_partition=0,
                               seed=seed, epoch=epoch)
    return h


def full_batch_loss(out: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, global_count: int) -> torch.Tensor:
    """This rank's share of the mean cross-entropy over the graph's ``global_count`` rows:
    the sum over its ``rows`` divided by the global count (the shares add up to the mean)."""
    if global_count <= 0:
        raise ConfigError("the training split has no node: nothing to train on")
    return F.cross_entropy(out.index_select(0, rows), labels.index_select(0, rows), reduction="sum") / global_count


def all_reduce_gradients(params: Sequence[nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in one all-reduce of all of them."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = all_reduce_sum(torch.cat([g.reshape(-1) for g in grads]))
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
