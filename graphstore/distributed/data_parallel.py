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
ranks share nothing but gradients.

Link prediction (`trainers/link_prediction.py`) weighs each rank's mean loss by its share
of the step's positives, ``b / total``, and has DDP sum the gradients (``wrap_model(...,
sum_gradients=True)``) rather than average them: the embedding rows' gradients (outside
DDP) then need no factor N either, so a rank's update of its rows is bit for bit the one
a single process makes on the union of the batches. It pads with a zero loss over every parameter
(`padding_loss`: no batch needed, so a rank may have none in a round). Its learnable
embeddings are sparse, outside DDP, and placed one of two ways (`EdgeLoader`'s
``embedding_placement``):

- **owned** (disk scheme): the ``disjoint`` plan's rounds give each rank partitions no
  other rank holds in that round, so a batch touches only rows its rank owns and each
  rank applies its own rows' sparse update and writes them back, exactly as one process
  would on the union of the batches (whose rows are then disjoint). Between rounds every
  rank waits for the others' write-back (`sync_ranks`) before reading partitions they
  held. We chose ownership over merging because merging needs every rank that holds a
  row to see every update to it: with a buffer of a few partitions per rank, a rank
  reading a partition from the store would miss the updates another rank has not yet
  written, so copies would diverge. Ownership needs no exchange of embedding rows at all.
  It needs the store on a filesystem every rank shares (`check_shared_embeddings`);
- **replicated** (minibatch scheme, the whole table in memory on every rank): each step
  the ranks' (row, gradient) pairs are all-gathered (`gather_rows`) and every rank applies
  the summed update to its copy, so the copies stay identical; rank 0 alone writes back.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from graphstore.errors import ConfigError
from graphstore.nn.accumulate import class_weighted_cross_entropy, micro_batch_backward

__all__ = ["DROPOUT_SALT", "all_gather_varlen", "all_reduce_values", "check_shared_embeddings", "dropout_salt",
           "equal_steps", "gather_rows", "node_classification_backward", "padding_loss", "rank_and_world",
           "step_targets", "sync_ranks", "wrap_model"]

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


def wrap_model(model: torch.nn.Module, device: torch.device | str = "cpu", *,
               sum_gradients: bool = False) -> DistributedDataParallel:
    """``model`` in `DistributedDataParallel` on ``device`` (``cuda:LOCAL_RANK`` under NCCL,
    as `init_process_group` set it; the CPU under gloo). DDP broadcasts rank 0's
    parameters at construction, so every rank starts from the same model even if their
    initialisations differed. ``sum_gradients``: the ranks' gradients are summed rather than
    averaged (`_sum_hook`), for losses already weighted by each rank's share."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        ddp = DistributedDataParallel(model, device_ids=[index], output_device=index)
    else:
        ddp = DistributedDataParallel(model)
    if sum_gradients:
        ddp.register_comm_hook(None, _sum_hook)
    return ddp


def _sum_hook(state, bucket):
    """DDP's all-reduce without its division by the world size (a `dist.GradBucket` in, a
    future of the summed bucket out)."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


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
    # The batch's class weights (a loader's balance_labels) weigh each target's loss; the
    # mean stays over the step's count of labelled targets.
    class_weights = getattr(batch, "class_weights", None)
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
                return class_weighted_cross_entropy(logits, y, class_weights) * factor

            if sync:
                mean = micro_batch_backward(model, whole, chunk, degrees=degrees, loss_fn=loss_fn, device=device)
            else:
                with model.no_sync():
                    mean = micro_batch_backward(model, whole, chunk, degrees=degrees, loss_fn=loss_fn,
                                                device=device)
            loss_sum += float(mean) / scale if scale else 0.0
        return loss_sum, n
    aggregated = None if batch.aggregated is None else batch.aggregated.to(device=device, dtype=dtype)
    out = model(features.to(device), batch.dense.to(device), aggregated=aggregated,
                aggregated_from=batch.aggregated_from)
    if int(labelled.sum()) == 0:
        (out.sum() * 0.0).backward()  # nothing to learn from, but DDP's all-reduce must run
        return 0.0, 0
    loss = class_weighted_cross_entropy(out, labels, class_weights, reduction="sum")
    (loss * scale).backward()
    return (float(loss.detach()) if n else 0.0), n


# ---------------------------------------------------------------------- link prediction

def padding_loss(model: torch.nn.Module) -> torch.Tensor:
    """A zero that depends on every parameter of ``model``: the loss of a padding step.
    Its backward gives every parameter an exact zero gradient, so DDP's all-reduce runs
    and no batch (or resident graph) is needed to take part in the step."""
    return sum(p.sum() for p in model.parameters()) * 0.0


def sync_ranks(timeout_s: float | None = None) -> None:
    """Wait until every rank got here (e.g. wrote its round's partitions back). gloo's
    monitored barrier names a rank that does not arrive within the timeout."""
    world = rank_and_world()[1]
    if world < 2:
        return
    if dist.get_backend() == "gloo":
        kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        dist.monitored_barrier(**kwargs)
    else:
        dist.barrier()


def all_gather_varlen(t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` (same dtype and trailing shape, any length), concatenated in rank
    order; ``t`` itself in a group of one."""
    world = rank_and_world()[1]
    if world < 2:
        return t
    size = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(x.item()) for x in sizes]
    longest = max(counts)
    padded = t.new_zeros((longest, *t.shape[1:]))
    padded[:t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, counts)])


def gather_rows(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The replicated table's step: every rank's ``(ids [n], grads [n, d])`` gathered, then
    summed per id; returns ``(unique ids, summed gradients)`` (the same on every rank).
    Rows are summed in rank order, as one process accumulating the ranks' batches would."""
    every_id = all_gather_varlen(ids.to(torch.int64))
    every_grad = all_gather_varlen(grads)
    unique, inverse = torch.unique(every_id, return_inverse=True)
    summed = grads.new_zeros((unique.numel(), grads.shape[1]))
    summed.index_add_(0, inverse, every_grad)
    return unique, summed


def check_shared_embeddings(table: Any) -> None:
    """Raise unless every rank sees the same embedding chunk files (same size and
    modification time, which a shared filesystem reports alike and copies do not): the
    owned placement hands partitions between ranks through the store."""
    world = rank_and_world()[1]
    if world < 2:
        return
    stamps = []
    for k in range(table.store.num_partitions):
        st = os.stat(table.chunk_path(k))
        stamps.append((st.st_size, st.st_mtime_ns))
    mine = torch.tensor(stamps, dtype=torch.int64).flatten()
    every = all_gather_varlen(mine[None])
    differ = [r for r in range(world) if not torch.equal(every[r], every[0])]
    if differ:
        raise ConfigError(f"{table.path}: rank(s) {differ} see other embedding files than rank 0: with learnable "
                          f"embeddings the disk scheme hands partitions between ranks through the store, so every "
                          f"rank must open the same store on a shared filesystem")
