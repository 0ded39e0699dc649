"""Memory of one link-prediction step on learnable embeddings, and its split into
micro-batches that fit a byte budget.

A link-prediction step without an encoder gathers the batch's input rows ``x`` [R, d]
(its sources, destinations and negatives, each once), scores every positive against its
chunk's ``K`` negatives on each corrupted side, and backpropagates into ``x``. What grows
with the batch is the scores and their temporaries, ``[b, K + 1]`` per side (the softmax
loss concatenates the positive's score), and the chunk-padded queries and the gathered
negatives, ``d`` wide. A budget that the buffer holds almost whole (`step_share` gives the
step an eighth) leaves the step a few MiB; at MariusGNN's 1000 positives against 2048
negatives on both sides the step alone takes 44.5 MiB of the CPU allocator.

The estimate (`estimate_link_step_bytes`) is an upper bound, not a replay of the step
(`graphstore.nn.step_memory` replays a GNN's step op by op): each term is a tensor the
step allocates, counted `SCORE_COPIES` and `ROW_COPIES` times, the most copies the CPU
allocator held at once (``torch.profiler``'s allocation events) for any decoder and loss of
`graphstore.nn.decoders`: DistMult and ComplEx 2.6 copies of the scores, TransE (``cdist``)
3.6, with ``d``-wide terms up to 2.7 copies. ``tests/nn/test_link_step.py`` checks that
the bound holds and is within 2.2x of the allocator's peak (1.1-2.1x measured) for every
decoder and loss.

Splitting (`link_micro_batches`): positives are cut into contiguous runs, each with the
chunks its positives use, so the gradient summed over the runs, each loss weighted by its
share of positives, is the batch's: every loss of `graphstore.nn.decoders.link_loss` is a
mean over positives of a term of one positive and its negatives. Each run's input rows
are a leaf of their own whose gradient is added into the batch's (the trainer's
`batch_backward`), so the sparse embedding update is applied once, as without splitting. This is Betty's micro-batching
(the node trainer's `micro_batch_backward`) applied to a decoder's step: Betty splits a
GNN's sampled blocks; here there is no block, only positives and their negatives.
"""

from __future__ import annotations

import math

import torch

__all__ = ["MLP_COPIES", "NEGATIVE_ROW_COPIES", "ROW_COPIES", "SCORE_COPIES", "estimate_link_step_bytes",
           "least_run_positives", "link_micro_batches"]

SCORE_COPIES = 4
"""[b, K + 1] float32 score-sized tensors the step may hold at once per corrupted side
(measured: 2.6 for DistMult and ComplEx, 3.6 for TransE, at K = 2048)."""
ROW_COPIES = 3
"""d-wide float32 tensors per positive the step may hold at once beside the input rows:
queries, their chunk padding and gradients (measured: up to 2.7)."""
NEGATIVE_ROW_COPIES = 4
"""d-wide float32 tensors per negative: the gathered ``[C, K, d]`` and its gradient, and with
one chunk per positive (OGB's one negative edge each) the per-negative products (measured:
just under 4 there)."""
MLP_COPIES = 2
"""`HadamardMLP`'s ``[C, P, K, w]`` activations held per MLP width ``w`` (its input and
hidden layers; measured: 1.33)."""


def estimate_link_step_bytes(*, positives: int, chunks: int, negatives: int, dim: int, sides: int,
                             rows: int = 0, mlp_width: int = 0) -> int:
    """Upper bound on the CPU allocator's peak for one step of ``positives`` edges with
    ``chunks`` chunks of ``negatives`` each, ``dim``-wide float32 embeddings, ``sides``
    corrupted sides (1 or 2), ``rows`` input rows (``x`` and its gradient, held by the
    whole batch: pass 0 for a micro-batch's own share), and ``mlp_width`` the widths of
    `HadamardMLP`'s input and hidden layers summed (it forms ``[C, P, K, w]`` for each; 0 for
    the bilinear and distance decoders).

    >>> estimate_link_step_bytes(positives=1000, chunks=1, negatives=2048, dim=100, sides=2) >> 20
    70
    """
    scores = sides * positives * (SCORE_COPIES * (negatives + 1) + MLP_COPIES * negatives * mlp_width)
    row_terms = dim * (ROW_COPIES * positives * (2 + sides) + NEGATIVE_ROW_COPIES * chunks * negatives)
    return 4 * (scores + row_terms + 2 * rows * dim)


def link_micro_batches(chunk_of: torch.Tensor, *, budget_bytes: int, negatives: int, dim: int, sides: int,
                       rows: int, mlp_width: int = 0) -> list[slice]:
    """Contiguous runs of a batch's positives whose steps each fit ``budget_bytes``
    (`estimate_link_step_bytes`, the input rows ``rows`` counted once for the batch):
    one run when the whole batch fits, else equal runs, as many as the estimate asks for.
    ``chunk_of`` [b] (non-decreasing) is each positive's negative chunk.

    A run never has fewer positives than make its own terms as large as one chunk of
    negatives (`least_run_positives`): below that the chunk, which every run holds whole,
    is most of the run's memory, so a smaller run saves less than half of it and costs a
    pass over the chunk each. A budget below that floor is exceeded by at most the floor."""
    b = int(chunk_of.numel())
    if b == 0:
        return [slice(0, 0)]
    num_chunks = int(chunk_of[-1]) + 1

    def cost(p: int, c: int) -> int:
        return estimate_link_step_bytes(positives=p, chunks=c, negatives=negatives, dim=dim, sides=sides,
                                        mlp_width=mlp_width)

    room = budget_bytes - 2 * 4 * rows * dim
    if cost(b, num_chunks) <= room:
        return [slice(0, b)]
    most = max(1, b // least_run_positives(negatives=negatives, dim=dim, sides=sides, mlp_width=mlp_width))
    parts = min(most, max(2, math.ceil(cost(b, num_chunks) / max(room, 1))))
    while True:
        bounds = [round(i * b / parts) for i in range(parts + 1)]
        runs = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
        worst = max(cost(r.stop - r.start, int(chunk_of[r.stop - 1] - chunk_of[r.start]) + 1) for r in runs)
        if worst <= room or parts >= most:
            return runs
        parts = min(most, parts + max(1, parts // 4))


def least_run_positives(*, negatives: int, dim: int, sides: int, mlp_width: int = 0) -> int:
    """The fewest positives of a run (`link_micro_batches`): as many as make the run's
    positive terms of `estimate_link_step_bytes` as large as one chunk's negatives.

    >>> least_run_positives(negatives=2048, dim=100, sides=2)   # MariusGNN's KG setting at d=100
    47
    """
    def cost(p: int, c: int) -> int:
        return estimate_link_step_bytes(positives=p, chunks=c, negatives=negatives, dim=dim, sides=sides,
                                        mlp_width=mlp_width)

    return max(1, math.ceil(cost(0, 1) / cost(1, 0)))
