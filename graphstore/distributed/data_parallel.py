"""Data-parallel training of the loaders' schemes with torch's `DistributedDataParallel`.

Launched with ``torchrun --nproc-per-node N`` (the process group, its timeouts and the
failing-rank exit are `graphstore.distributed.comm`'s). Every rank builds the same model
(same seed) and the same loaders with its ``rank`` and ``world_size``; each rank's loader
yields a disjoint share of every epoch (`graphstore.loaders.shard`: a contiguous block of
the buffer states when the plan has at least N of them, as megabatch's mega-batches and
disk's DISPERSED states do, else every N-th batch, as for minibatch, microbatch and
macrobatch, whose one state is the whole graph). ``batch_size`` is per rank: one optimizer
step trains one batch of every rank.

The step's update is the one a single process would make on the union of the ranks'
batches: each rank's loss is the **sum** of its targets' losses times ``N / n``, with
``n`` the step's labelled targets over all ranks (one all-reduced integer per step), so
DDP's average of the ranks' gradients is the gradient of the mean loss over the union,
whatever the batches' sizes (plain DDP would weight a 3-target last batch like a full
one). A one-process run accumulating the ranks' batches' gradients the same way, then
stepping, reaches the same parameters (`tests/distributed/test_data_parallel.py`: 1e-10
in float64 for every scheme).

Uneven counts: the ranks' batch counts can differ (states of different sizes, the tail of
an epoch). DDP needs every rank in every step's all-reduce, so `equal_steps` pads a
rank's epoch after its last batch with that batch again at weight 0 (its gradient is
exactly zero; it draws dropout masks nobody uses), up to the most batches any rank has
(`NodeLoader.num_steps`, computed from the plan, the same on every rank): no deadlock and
no dropped targets (BatchGNN drops the last mini-batch instead).

Micro-batches (Betty) inside a rank's batch accumulate under `DistributedDataParallel.
no_sync`, and the last one that has a labelled target runs outside it, so DDP all-reduces
once per step, the accumulated gradient.

Node classification has no learnable embeddings, so no state is written back and the
ranks share nothing but gradients. (Link prediction's disk scheme, with embeddings owned
by partition, is not done here.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from graphstore.errors import ConfigError
from graphstore.nn.accumulate import micro_batch_backward

__all__ = ["DROPOUT_SALT", "all_reduce_values", "dropout_salt", "equal_steps", "node_classification_backward",
           "rank_and_world", "step_targets", "wrap_model"]

T = TypeVar("T")

DROPOUT_SALT = 11
"""The trainers' per-epoch dropout seed salt; rank ``r`` uses ``DROPOUT_SALT + 1000 * r``
(`dropout_salt`), so rank 0 draws a single-process run's masks and no two ranks share a
stream."""


def dropout_salt(rank: int) -> int:
    """The salt of rank ``rank``'s dropout stream (`graphstore.loaders.seeds.epoch_seed`)."""
    return DROPOUT_SALT + 1000 * int(rank)


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_model(model: torch.nn.Module, device: torch.device | str = "cpu") -> DistributedDataParallel:
    """``model`` in `DistributedDataParallel` on ``device`` (``cuda:LOCAL_RANK`` under NCCL,
    as `init_process_group` set it; the CPU under gloo). DDP broadcasts rank 0's
    parameters at construction, so every rank starts from the same model even if their
    initialisations differed."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return DistributedDataParallel(model, device_ids=[index], output_device=index)
    return DistributedDataParallel(model)


def equal_steps(batches: Iterable[T], own: int, steps: int, *, what: str = "batches") -> Iterator[tuple[T, float]]:
    """``(batch, 1.0)`` for each of this rank's ``own`` batches, then ``(last batch, 0.0)``
    until ``steps`` items were yielded (before the next batch is asked for, so the last
    batch is still valid); every rank thus takes part in ``steps`` optimizer steps.

    Raises
    ------
    ConfigError
        When this rank has no batch at all (more ranks than the epoch's batches), or when
        ``batches`` does not yield ``own`` items (the counts the ranks agreed on were wrong).
    """
    rank, world = rank_and_world()
    if own < 1:
        raise ConfigError(f"rank {rank} has no {what} this epoch ({world} ranks share {steps} step(s)); use fewer "
                          "ranks or a smaller --batch-size")
    if own > steps:
        raise ConfigError(f"rank {rank} has {own} {what} but the epoch has {steps} steps")
    seen = 0
    for batch in batches:
        seen += 1
        if seen > own:
            break
        yield batch, 1.0
        if seen == own:
            for _ in range(steps - own):
                yield batch, 0.0
    if seen != own:
        raise ConfigError(f"rank {rank}: the loader yielded {seen} {what}, its plan promised {own}")


def step_targets(count: int, device: torch.device | str = "cpu") -> int:
    """The step's labelled targets over all ranks (this rank's ``count`` all-reduced)."""
    t = torch.tensor([int(count)], dtype=torch.int64, device=device)
    if rank_and_world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item())


def all_reduce_values(values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
    """Sums of ``values`` over the ranks (float64; one all-reduce), e.g. an evaluation's
    correct predictions, labelled targets and loss sum."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    if rank_and_world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def node_classification_backward(model: torch.nn.Module, batch: Any, *, weight: float, device: torch.device,
                                 degrees: torch.Tensor | None = None) -> tuple[float, int]:
    """Forward and backward of this rank's share of one step; returns this rank's summed
    cross-entropy over its labelled targets and their count (0 and 0 for a padding step).

    ``model`` is the `DistributedDataParallel` module; ``batch`` a `NodeBatch` (with
    ``micro_batches``, accumulated over them; ``aggregated`` passed on); ``weight`` 1 for
    a batch, 0 for padding (`equal_steps`). The gradient left in ``model`` after DDP's
    average is that of the mean loss over the step's labelled targets on every rank."""
    world = rank_and_world()[1]
    labels = batch.labels.to(device)
    labelled = labels >= 0
    n = int(labelled.sum()) if weight else 0
    total = step_targets(n, device)
    # DDP divides the summed gradients by N: N / total turns the ranks' loss sums into the
    # mean over the step's targets. A padding step (and a batch with no labelled target)
    # scales by 0: zero gradients, but DDP's all-reduce still happens.
    scale = world / total if n else 0.0
    dtype = next(model.parameters()).dtype
    # In the model's dtype (float64 in the exactness test), still on the host: micro-batches
    # move to ``device`` one at a time.
    features = batch.features if batch.features.dtype == dtype else batch.features.to(dtype)
    parts = list(batch.micro_batches) if batch.micro_batches is not None else None
    if parts is not None and int(labelled.sum()) > 0:
        counts = [int(labelled[p.target_index.to(labels.device)].sum()) for p in parts]
        # The last micro-batch with a labelled target syncs: micro_batch_backward runs no
        # forward for one without, and a sync step without a backward would leave DDP waiting.
        last = max(i for i, c in enumerate(counts) if c)
        whole = batch if features is batch.features else dataclasses.replace(batch, features=features)
        loss_sum = 0.0
        for chunk, sync in ((parts[:last], False), (parts[last:], True)):
            n_chunk = sum(counts[:last]) if not sync else sum(counts[last:])
            if n_chunk == 0:
                continue
            # micro_batch_backward's weights make its gradient the chunk's mean loss: times
            # n_chunk * scale, the chunk's loss sum times N / total.
            factor = n_chunk * scale

            def loss_fn(logits: torch.Tensor, y: torch.Tensor, factor: float = factor) -> torch.Tensor:
                return F.cross_entropy(logits, y, ignore_index=-1) * factor

            if sync:
                mean = micro_batch_backward(model, whole, chunk, degrees=degrees, loss_fn=loss_fn, device=device)
            else:
                with model.no_sync():
                    mean = micro_batch_backward(model, whole, chunk, degrees=degrees, loss_fn=loss_fn,
                                                device=device)
            loss_sum += float(mean) / scale if scale else 0.0
        return loss_sum, n
    aggregated = None if batch.aggregated is None else batch.aggregated.to(device=device, dtype=dtype)
    out = model(features.to(device), batch.dense.to(device), aggregated=aggregated)
    if int(labelled.sum()) == 0:
        (out.sum() * 0.0).backward()  # nothing to learn from, but DDP's all-reduce must run
        return 0.0, 0
    loss = F.cross_entropy(out, labels, ignore_index=-1, reduction="sum")
    (loss * scale).backward()
    return (float(loss.detach()) if n else 0.0), n
