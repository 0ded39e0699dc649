"""Gradient accumulation over the micro-batches of one batch (Betty's training step).

`micro_batch_backward` runs forward and backward on each micro-batch in turn with its loss
scaled by the micro-batch's share of the batch's labelled targets (`loss_weights`), so the
accumulated gradient is the whole batch's (up to float rounding) while only one
micro-batch's activations are alive at a time. The caller then steps its optimizer once.

Examples
--------
>>> from graphstore.sample import Batch, CSCGraph, sample_dense, split_dense
>>> from graphstore.nn import GNN
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 1, 2]), num_nodes=4)
>>> dense = sample_dense(g, torch.tensor([0, 1, 2]), (-1, -1))
>>> batch = Batch(dense, torch.randn(dense.num_nodes, 3, dtype=torch.float64), torch.tensor([0, 1, 1]))
>>> model = GNN("sage", in_dim=3, hidden_dim=4, out_dim=2, num_layers=2).double()
>>> whole = torch.nn.functional.cross_entropy(model(batch.features, dense), batch.labels)
>>> whole.backward()
>>> expected = [p.grad.clone() for p in model.parameters()]
>>> model.zero_grad()
>>> loss = micro_batch_backward(model, batch, split_dense(dense, 3, strategy="range"))
>>> bool(torch.allclose(loss, whole))
True
>>> all(torch.allclose(p.grad, e) for p, e in zip(model.parameters(), expected))
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn.layers import GNN
from graphstore.sample.base import Batch
from graphstore.sample.microbatch import MicroBatch, loss_weights

__all__ = ["class_weighted_cross_entropy", "micro_batch_backward"]


def class_weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor | None = None,
                                 *, ignore_index: int = -1, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the labelled targets, each times its class's weight, summed or
    averaged over their *count* (not over the weights, as ``F.cross_entropy(weight=)``
    does): with weights whose mean over a buffer state is 1 (`NodeBatch.class_weights`) a
    batch's loss is an unbiased share of the state's reweighted loss, and micro-batches,
    which average by count (`micro_batch_backward`), accumulate to the whole batch's.
    Without weights it is ``F.cross_entropy``."""
    if class_weights is None:
        return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction)
    per = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
    labelled = labels != ignore_index
    w = torch.zeros_like(per)
    w[labelled] = class_weights.to(device=per.device, dtype=per.dtype)[labels[labelled]]
    total = (per * w).sum()
    return total if reduction == "sum" else total / labelled.sum().clamp(min=1)


def micro_batch_backward(model: GNN, batch: Batch, parts: Sequence[MicroBatch], *,
                         edge_type: torch.Tensor | None = None, degrees: torch.Tensor | None = None,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                         ignore_index: int = -1, device: torch.device | str | None = None) -> torch.Tensor:
    """Accumulate the whole batch's gradient into ``model``'s ``.grad``, one micro-batch at
    a time; returns the whole batch's loss (detached).

    Parameters
    ----------
    model : GNN
    batch : Batch
        The whole batch (its features are sliced, never gathered again).
    parts : sequence of MicroBatch
        A split of ``batch.dense`` (`graphstore.sample.split_dense`).
    edge_type : int64 tensor [E], RGCN only
        Relation of each of the parent's sampled edges (aligned with ``batch.dense.nbrs``).
    degrees : tensor [N], GCN only
        Degree of each of the parent's nodes. Pass it (e.g. ``layer_degrees(dense)[0]`` or the
        graph's in-degrees): a micro-batch's own default sampled degrees differ from the
        parent's for nodes that sit one hop farther out in it.
    loss_fn : callable, optional
        ``(logits, labels) -> mean loss over the labelled targets``; default
        ``cross_entropy(..., ignore_index=ignore_index)``.
    ignore_index : int
        Label of an unlabelled target (weights count only the others).
    device : torch.device or str, optional
        Where each micro-batch runs (default: the model's parameters' device). The batch
        and ``parts`` may stay on the host: each micro-batch's rows, labels, DENSE and
        ``edge_type``/``degrees`` entries are moved there as it runs, so the device holds
        one micro-batch at a time (what a micro-batch memory budget counts), never the
        whole batch.

    Raises
    ------
    ConfigError
        If the batch has no labels.
    """
    if batch.labels is None:
        raise ConfigError("micro-batch training needs the batch's labels (got a Batch without them)")
    if loss_fn is None:
        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits, labels, ignore_index=ignore_index)
    if device is None:
        device = next(model.parameters()).device
    weights = loss_weights(parts, batch.labels, ignore_index=ignore_index).tolist()
    total = None
    for part, weight in zip(parts, weights):
        if weight == 0:
            continue  # no labelled target: contributes nothing (its mean loss would be NaN)
        sub = part.batch(batch)
        kwargs = {}
        if edge_type is not None:
            kwargs["edge_type"] = edge_type[part.edges.to(edge_type.device)].to(device)
        if degrees is not None:
            kwargs["degrees"] = degrees[part.rows.to(degrees.device)].to(device)
        logits = model(sub.features.to(device), part.dense.to(device), **kwargs)
        loss = loss_fn(logits, sub.labels.to(device)) * weight
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    if total is None:
        return torch.zeros((), dtype=batch.features.dtype, device=device)
    return total
