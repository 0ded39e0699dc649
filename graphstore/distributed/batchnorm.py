"""BatchNorm over every rank's rows, from sums and counts (SAR section 3.4).

``torch.nn.SyncBatchNorm`` runs on CUDA only; this is the same normalisation on any device:
forward sums each feature over the rank's rows, and with one all-reduce of ``[sum, count]``
every rank has the global mean; a second all-reduce of the centred squares gives the
(biased) variance, as a two-pass variance does on one process. Backward needs the global
sums of the output gradient and of its product with the normalised rows: one all-reduce.
The affine part (``weight``, ``bias``) and the running statistics are the wrapped
``nn.BatchNorm1d``'s, so a model trained here evaluates (and saves) like any other.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from graphstore.distributed.comm import all_reduce_sum

__all__ = ["distributed_batch_norm"]


class _GlobalStandardize(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps)`` with mean and var over every rank's rows; also
    returns them (not differentiable) for the running statistics."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float):
        sums = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
        all_reduce_sum(sums)
        count = sums[-1]
        mean = sums[:-1] / count
        centred = x - mean
        var = all_reduce_sum((centred * centred).sum(0)) / count
        inv_std = torch.rsqrt(var + eps)
        xhat = centred * inv_std
        ctx.save_for_backward(xhat, inv_std, count)
        ctx.mark_non_differentiable(mean, var, count)
        return xhat, mean, var, count

    @staticmethod
    def backward(ctx, grad_xhat: torch.Tensor, _mean, _var, _count):
        xhat, inv_std, count = ctx.saved_tensors
        sums = all_reduce_sum(torch.cat([grad_xhat.sum(0), (grad_xhat * xhat).sum(0)]))
        d = xhat.shape[1]
        mean_grad, mean_grad_xhat = sums[:d] / count, sums[d:] / count
        return inv_std * (grad_xhat - mean_grad - xhat * mean_grad_xhat), None


def distributed_batch_norm(x: torch.Tensor, norm: nn.BatchNorm1d) -> torch.Tensor:
    """``norm`` applied to the rows of every rank together: ``x`` float [n, C] is this
    rank's share. Training: batch statistics over all ranks' rows (collective: every rank
    calls it), running statistics updated as ``nn.BatchNorm1d`` does (unbiased variance).
    Evaluation: the running statistics, no communication."""
    if not norm.training:
        return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0, norm.eps)
    xhat, mean, var, count = _GlobalStandardize.apply(x, norm.eps)
    if norm.track_running_stats and norm.running_mean is not None:
        with torch.no_grad():
            m = norm.momentum if norm.momentum is not None else 0.1
            n = float(count)
            norm.running_mean.mul_(1 - m).add_(mean.to(norm.running_mean.dtype), alpha=m)
            unbiased = var * (n / max(n - 1.0, 1.0))
            norm.running_var.mul_(1 - m).add_(unbiased.to(norm.running_var.dtype), alpha=m)
            norm.num_batches_tracked.add_(1)
    if norm.affine:
        return xhat * norm.weight + norm.bias
    return xhat
