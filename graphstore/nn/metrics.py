"""Evaluation metrics: accuracy, ranking metrics (MRR, Hits@k) and OGB's evaluator rules.

Ranks are pessimistic: a negative that ties the positive counts as ranked above it, so
``rank = 1 + #(negatives with score >= positive)``. A model that scores everything equal
therefore gets the worst rank, not the best. In *filtered* ranking, negatives that are
known true edges (other than the positive itself) are not counted.

OGB's rules differ and are kept apart, in the ``ogb*`` functions: ogbl Hits@K (ogbl-ddi,
-collab, -ppa) ranks every positive against one shared set of negatives and counts a hit
when the positive is *strictly above* the K-th best negative score; ogbl MRR
(ogbl-citation2, -wikikg2) averages the optimistic and pessimistic ranks.

Examples
--------
>>> pos = torch.tensor([3.0, 1.0])
>>> neg = torch.tensor([[1.0, 3.0, 0.0], [2.0, 5.0, 1.0]])
>>> ranks(pos, neg).tolist()          # the tie 3.0 counts against the first positive
[2, 4]
>>> ranking_metrics(ranks(pos, neg), ks=(1, 3))
{'mrr': 0.375, 'hits@1': 0.0, 'hits@3': 0.5}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from graphstore.errors import ConfigError

__all__ = ["KS", "accuracy", "full_ranks", "ogb_hits_at_k", "ogb_mrr", "ogbn_accuracy", "ranking_metrics",
           "ranks"]

KS = (1, 3, 10, 20, 50)
"""The default k of Hits@k."""


def accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of correct predictions.

    Parameters
    ----------
    pred : int tensor [N] (class ids) or float tensor [N, C] (scores; argmax taken)
    labels : int tensor [N]

    Raises
    ------
    ConfigError
        On mismatched sizes or no rows.

    Examples
    --------
    >>> accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), torch.tensor([1, 1, 1]))
    0.6666666666666666
    """
    if pred.dim() == 2:
        pred = pred.argmax(1)
    labels = labels.reshape(-1)
    if pred.shape != labels.shape:
        raise ConfigError(f"pred and labels must have the same number of rows (got {list(pred.shape)} "
                          f"and {list(labels.shape)})")
    if labels.numel() == 0:
        raise ConfigError("accuracy of no rows is undefined; pass at least one labelled row")
    return int((pred == labels).sum()) / labels.numel()


def ranks(pos: torch.Tensor, neg: torch.Tensor, *, filter_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Pessimistic rank of each positive among its negatives.

    Parameters
    ----------
    pos : float tensor [B]
        Positive scores.
    neg : float tensor [B, K]
        Each positive's negatives' scores.
    filter_mask : bool tensor [B, K], optional
        True where a negative is a known true edge: it is left out of the count (filtered
        ranking). None: every negative counts (unfiltered).

    Returns
    -------
    int64 tensor [B]
        ``1 + #(neg[i] >= pos[i])`` over the unfiltered negatives. A NaN negative counts
        as above its positive, and a NaN or infinite positive ranks last: a diverged score
        never improves a rank (with ``>=`` alone a NaN positive would rank first).
    """
    if neg.dim() != 2 or neg.shape[0] != pos.shape[0]:
        raise ConfigError(f"neg must have shape [{pos.shape[0]}, K] (got {list(neg.shape)})")
    above = _at_or_above(neg, pos)
    if filter_mask is not None:
        if filter_mask.shape != neg.shape:
            raise ConfigError(f"filter_mask must have the shape of neg {list(neg.shape)} "
                              f"(got {list(filter_mask.shape)})")
        above &= ~filter_mask
    return 1 + above.sum(1)


def _at_or_above(neg: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B, K] whether each negative counts as scoring at or above its positive: ``neg >=
    pos``, and also a NaN negative, and every negative of a non-finite positive."""
    return (neg >= pos[:, None]) | torch.isnan(neg) | ~torch.isfinite(pos)[:, None]


def ranking_metrics(rank: torch.Tensor, ks: Sequence[int] = KS) -> dict[str, float]:
    """MRR and Hits@k of ranks (1 = best): ``{"mrr": mean(1 / rank), "hits@k": mean(rank <= k)}``.

    Raises
    ------
    ConfigError
        On an empty ``rank``.
    """
    if rank.numel() == 0:
        raise ConfigError("ranking metrics of no positives are undefined; pass at least one rank")
    out = {"mrr": float((1.0 / rank.to(torch.float64)).mean())}
    for k in ks:
        out[f"hits@{k}"] = float((rank <= k).to(torch.float64).mean())
    return out


def _known_candidates(group: torch.Tensor, known_group: torch.Tensor, known_cand: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner, candidate) pairs: every known candidate of each query's group, sorted known."""
    start = torch.searchsorted(known_group, group)
    counts = torch.searchsorted(known_group, group, right=True) - start
    total = int(counts.sum())
    device = group.device
    owner = torch.repeat_interleave(torch.arange(group.numel(), device=device), counts, output_size=total)
    first = (torch.cumsum(counts, 0) - counts).index_select(0, owner)
    within = torch.arange(total, device=device) - first
    return owner, known_cand.index_select(0, start.index_select(0, owner) + within)


FULL_RANKS_CANDIDATE_CHUNK = 1 << 16
"""`full_ranks`' default candidates a score block holds (``batch_size`` by this many scores)."""


def full_ranks(score_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], src: torch.Tensor,
               dst: torch.Tensor, num_nodes: int, *, rel: torch.Tensor | None = None,
               known_src: torch.Tensor | None = None, known_dst: torch.Tensor | None = None,
               known_rel: torch.Tensor | None = None, batch_size: int = 1024,
               candidate_chunk: int = FULL_RANKS_CANDIDATE_CHUNK) -> torch.Tensor:
    """Pessimistic rank of each positive ``dst[i]`` among *all* nodes as destinations.

    ``rank[i] = 1 + #{c != dst[i] : score(i, c) >= score(i, dst[i])}``, and with known edges
    (filtered), candidates ``c`` with ``(src[i], rel[i], c)`` known are not counted. Non-finite
    scores are ranked as in `ranks`: a NaN candidate counts as above, a NaN or infinite
    positive ranks last. To rank
    sources instead, swap ``src`` and ``dst`` (and the known arrays) and let ``score_fn``
    put the candidates at the source end.

    Memory is bounded by ``batch_size * candidate_chunk`` scores: positives go in batches,
    candidates in chunks. With more than one chunk each block is scored twice (once to find
    the positive's own score, once to count), so that every comparison uses scores from the
    same call and ties are judged consistently.

    Parameters
    ----------
    score_fn : callable
        ``score_fn(index, candidates)``: ``index`` int64 [b] (positions in ``src``/``dst``),
        ``candidates`` int64 [c] (node ids) -> float [b, c], the score of edge ``(src[i],
        rel[i], candidates[j])``. It must be deterministic.
    src, dst : int64 tensor [B]
        The positive edges (node ids in ``[0, num_nodes)``).
    num_nodes : int
        Candidates are ``0 .. num_nodes - 1``.
    rel : int64 tensor [B], optional
        Relations of the positives (for filtering); None: all relation 0.
    known_src, known_dst, known_rel : int64 tensor [M], optional
        Known true edges to filter out (e.g. train + valid + test); None: unfiltered.
    batch_size, candidate_chunk : int
        Positives per batch, candidates per chunk.

    Returns
    -------
    int64 tensor [B]

    Examples
    --------
    >>> emb = torch.tensor([[1.0], [3.0], [2.0], [3.0]])       # scores = dot products
    >>> fn = lambda i, c: emb[src[i]] @ emb[c].T
    >>> src, dst = torch.tensor([0]), torch.tensor([2])
    >>> full_ranks(fn, src, dst, 4).tolist()                  # nodes 1 and 3 score 3 > 2
    [3]
    >>> full_ranks(fn, src, dst, 4, known_src=torch.tensor([0]), known_dst=torch.tensor([1])).tolist()
    [2]
    """
    if src.shape != dst.shape or src.dim() != 1:
        raise ConfigError(f"src and dst must be 1-D of one length (got {list(src.shape)} and "
                          f"{list(dst.shape)})")
    if batch_size < 1 or candidate_chunk < 1:
        raise ConfigError(f"batch_size and candidate_chunk must be >= 1 (got {batch_size}, "
                          f"{candidate_chunk})")
    device = src.device
    rel_of = torch.zeros_like(src) if rel is None else rel
    filtered = known_src is not None or known_dst is not None
    if filtered:
        if known_src is None or known_dst is None or known_src.shape != known_dst.shape:
            raise ConfigError("filtered ranking needs known_src and known_dst of one length")
        krel = torch.zeros_like(known_src) if known_rel is None else known_rel
        # Sorted unique keys (relation, source, candidate); a query finds its known
        # candidates by binary search on the (relation, source) group.
        keys = torch.unique((krel.to(device) * num_nodes + known_src.to(device)) * num_nodes
                            + known_dst.to(device))
        known_group, known_cand = keys // num_nodes, keys % num_nodes
    chunks = [(c0, min(c0 + candidate_chunk, num_nodes)) for c0 in range(0, num_nodes, candidate_chunk)]
    out = torch.empty(src.numel(), dtype=torch.int64, device=device)
    for b0 in range(0, src.numel(), batch_size):
        index = torch.arange(b0, min(b0 + batch_size, src.numel()), device=device)
        d = dst.index_select(0, index)
        rows = torch.arange(index.numel(), device=device)
        blocks = {}
        pos = None
        for c0, c1 in chunks:
            block = score_fn(index, torch.arange(c0, c1, device=device))
            here = (d >= c0) & (d < c1)
            if pos is None:
                pos = block.new_empty(index.numel())
            pos[here] = block[rows[here], d[here] - c0]
            if len(chunks) == 1:
                blocks[c0] = block
        if filtered:
            group = rel_of.index_select(0, index) * num_nodes + src.index_select(0, index)
            owner, cand = _known_candidates(group, known_group, known_cand)
        count = torch.zeros(index.numel(), dtype=torch.int64, device=device)
        for c0, c1 in chunks:
            block = blocks[c0] if blocks else score_fn(index, torch.arange(c0, c1, device=device))
            above = _at_or_above(block, pos)
            here = (d >= c0) & (d < c1)
            above[rows[here], d[here] - c0] = False              # the positive itself
            if filtered:
                sel = (cand >= c0) & (cand < c1)
                above[owner[sel], cand[sel] - c0] = False
            count += above.sum(1)
        out[index] = 1 + count
    return out


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def ogb_hits_at_k(pos_scores: torch.Tensor | np.ndarray, neg_scores: torch.Tensor | np.ndarray,
                  k: int) -> float:
    """ogbl Hits@K exactly as ``ogb.linkproppred.Evaluator`` (ogbl-ddi, -collab, -ppa).

    Every positive is compared with one shared set of negatives: a hit is a positive scoring
    *strictly above* the K-th highest negative score; with fewer than K negatives, 1.0.

    Parameters
    ----------
    pos_scores : float [P]
    neg_scores : float [M]
        Scores of the shared negatives (flattened if given as a matrix).
    k : int

    Examples
    --------
    >>> ogb_hits_at_k(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([2.0, 0.0, 5.0]), 2)   # 2nd best: 2.0
    0.3333333333333333
    """
    pos = _numpy(pos_scores).reshape(-1)
    neg = _numpy(neg_scores).reshape(-1)
    if len(neg) < k:
        return 1.0
    kth = np.sort(neg)[-k]
    return float(np.sum(pos > kth)) / len(pos)


def ogb_mrr(pos_scores: torch.Tensor, neg_scores: torch.Tensor) -> float:
    """ogbl MRR exactly as ``ogb.linkproppred.Evaluator`` (ogbl-citation2, -wikikg2): the
    rank of ``pos[i]`` among ``neg[i]`` [P, K] is the mean of the optimistic and pessimistic
    ranks, ``1 + (#(neg > pos) + #(neg >= pos)) / 2``; returns the mean of ``1 / rank``."""
    pos = pos_scores.reshape(-1, 1)
    rank = 0.5 * ((neg_scores > pos).sum(1) + (neg_scores >= pos).sum(1)) + 1
    return float((1.0 / rank.to(torch.float)).mean())


def ogbn_accuracy(y_true: torch.Tensor | np.ndarray, y_pred: torch.Tensor | np.ndarray) -> float:
    """ogbn accuracy exactly as ``ogb.nodeproppred.Evaluator`` (ogbn-arxiv, -products, ...).

    ``y_true`` and ``y_pred`` are class ids, [N] or [N, T] (one column per task); a NaN
    label is unlabelled and skipped; the result is the mean over tasks of each task's
    accuracy.

    Examples
    --------
    >>> ogbn_accuracy(torch.tensor([[1], [2], [0]]), torch.tensor([[1], [0], [0]]))
    0.6666666666666666
    """
    true, pred = _numpy(y_true), _numpy(y_pred)
    if true.ndim == 1:
        true, pred = true[:, None], pred.reshape(-1, 1)
    if true.shape != pred.shape:
        raise ConfigError(f"y_true and y_pred must have one shape (got {true.shape} and {pred.shape})")
    per_task = []
    for i in range(true.shape[1]):      # a loop over tasks (columns), not nodes
        labelled = true[:, i] == true[:, i]
        correct = true[labelled, i] == pred[labelled, i]
        per_task.append(float(np.sum(correct)) / len(correct))
    return sum(per_task) / len(per_task)
