"""Metrics: hand-checked ranks with pessimistic ties, filtered vs unfiltered, MRR and Hits@k,
full ranking against a plain loop, and agreement with OGB's own evaluators."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ogb.linkproppred import Evaluator as LinkEvaluator
from ogb.nodeproppred import Evaluator as NodeEvaluator

from graphstore.errors import ConfigError
from graphstore.nn import (
    DistMult,
    accuracy,
    full_ranks,
    ogb_hits_at_k,
    ogb_mrr,
    ogbn_accuracy,
    ranking_metrics,
    ranks,
)


def test_ranks_count_ties_against_the_positive():
    pos = torch.tensor([3.0, 1.0, 2.0])
    neg = torch.tensor([[1.0, 3.0, 0.0],     # one tie -> rank 2
                        [2.0, 5.0, 1.0],     # two above, one tie -> rank 4
                        [2.0, 2.0, 2.0]])    # all tie -> the worst rank
    assert ranks(pos, neg).tolist() == [2, 4, 4]


def test_filtered_ranks_skip_known_edges_only():
    pos = torch.tensor([3.0, 1.0])
    neg = torch.tensor([[1.0, 3.0, 0.0], [2.0, 5.0, 1.0]])
    mask = torch.tensor([[False, True, False], [False, True, True]])
    assert ranks(pos, neg).tolist() == [2, 4]
    assert ranks(pos, neg, filter_mask=mask).tolist() == [1, 2]
    # A known edge scoring below the positive changes nothing.
    below = torch.tensor([[True, False, True], [False, False, False]])
    assert ranks(pos, neg, filter_mask=below).tolist() == [2, 4]


def test_non_finite_scores_never_improve_a_rank():
    nan, inf = float("nan"), float("inf")
    pos = torch.tensor([nan, inf, -inf, 2.0, 2.0, 2.0])
    neg = torch.tensor([[0.0, 1.0, -5.0],    # NaN positive: last, not first (>= is False for NaN)
                        [0.0, 1.0, 9.0],     # +inf positive: a diverged score, last too
                        [0.0, 1.0, 9.0],     # -inf positive: last
                        [nan, 0.0, 1.0],     # a NaN negative counts as above
                        [inf, 0.0, 1.0],     # +inf negative is above
                        [-inf, 0.0, 1.0]])   # -inf negative is below
    assert ranks(pos, neg).tolist() == [4, 4, 4, 2, 2, 1]
    # A filtered negative stays out of the count even beside a NaN positive.
    mask = torch.zeros_like(neg, dtype=torch.bool)
    mask[0, 1] = True
    assert ranks(pos, neg, filter_mask=mask).tolist() == [3, 4, 4, 2, 2, 1]
    assert ranking_metrics(ranks(pos[:3], neg[:3]))["mrr"] == pytest.approx(0.25)


@pytest.mark.parametrize("candidate_chunk", [1 << 16, 2])
def test_full_ranks_rank_non_finite_scores_as_ranks_does(candidate_chunk):
    nan, inf = float("nan"), float("inf")
    table = torch.tensor([[nan, 0.0, 1.0, 2.0],   # positive dst 0 is NaN: last
                          [inf, 0.0, 1.0, 2.0],   # positive dst 0 is +inf: last
                          [0.0, 3.0, nan, 1.0],   # positive dst 1; a NaN candidate counts as above
                          [0.0, 3.0, inf, -inf]])  # positive dst 1; +inf above, -inf below
    src, dst = torch.arange(4), torch.tensor([0, 0, 1, 1])

    def score_fn(index, candidates):
        return table[index][:, candidates]

    got = full_ranks(score_fn, src, dst, 4, candidate_chunk=candidate_chunk)
    assert got.tolist() == [4, 4, 2, 2]
    want = ranks(table[src, dst], torch.stack([table[i][torch.arange(4) != dst[i]] for i in range(4)]))
    assert got.tolist() == want.tolist()


def test_mrr_and_hits_on_a_hand_example():
    metrics = ranking_metrics(torch.tensor([1, 2, 4, 25, 60]))
    assert metrics == {
        "mrr": pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 25 + 1 / 60) / 5, abs=1e-15),
        "hits@1": 0.2, "hits@3": 0.4, "hits@10": 0.6, "hits@20": 0.6, "hits@50": 0.8,
    }
    assert list(ranking_metrics(torch.tensor([3]), ks=(3, 2))) == ["mrr", "hits@3", "hits@2"]


def test_accuracy():
    assert accuracy(torch.tensor([1, 0, 2, 2]), torch.tensor([1, 1, 2, 0])) == 0.5
    assert accuracy(torch.tensor([[0.0, 1.0], [2.0, 1.0]]), torch.tensor([[1], [1]])) == 0.5
    with pytest.raises(ConfigError, match="same number of rows"):
        accuracy(torch.tensor([1, 0]), torch.tensor([1]))
    with pytest.raises(ConfigError, match="no rows"):
        accuracy(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))


# --- full ranking ---------------------------------------------------------------------------

def brute_force_ranks(scores, dst, known):
    """rank_i = 1 + #{c != dst_i: scores[i, c] >= scores[i, dst_i], c not in known[i]}."""
    out = []
    for i in range(scores.shape[0]):
        p = scores[i, dst[i]]
        out.append(1 + sum(1 for c in range(scores.shape[1])
                           if c != dst[i] and scores[i, c] >= p and c not in known[i]))
    return out


@pytest.mark.parametrize("batch_size, candidate_chunk", [(1024, 1 << 16), (3, 7), (1, 1), (5, 40)])
def test_full_ranks_equal_a_plain_loop(batch_size, candidate_chunk):
    num_nodes = 40
    gen = torch.Generator().manual_seed(0)
    # Embeddings on a coarse grid, so many candidates tie exactly with the positive.
    emb = torch.randint(-2, 3, (num_nodes, 3), generator=gen).double()
    dec = DistMult(3, num_relations=2).double()
    with torch.no_grad():
        dec.relations.copy_(torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 2.0]]))
    src = torch.randint(0, num_nodes, (11,), generator=gen)
    dst = torch.randint(0, num_nodes, (11,), generator=gen)
    rel = torch.randint(0, 2, (11,), generator=gen)
    known_src = torch.cat([src, torch.randint(0, num_nodes, (60,), generator=gen), src[:3]])
    known_dst = torch.cat([dst, torch.randint(0, num_nodes, (60,), generator=gen), dst[:3]])
    known_rel = torch.cat([rel, torch.randint(0, 2, (60,), generator=gen), rel[:3]])   # with repeats

    def score_fn(index, candidates):
        q = emb[src[index]]
        return dec.score_negatives(q, rel[index], q, emb[candidates][None],
                                   torch.zeros(index.numel(), dtype=torch.long))

    scores = score_fn(torch.arange(11), torch.arange(num_nodes))
    known = [{int(d) for s, d, r in zip(known_src, known_dst, known_rel)
              if s == src[i] and r == rel[i]} for i in range(11)]
    none = [set() for _ in range(11)]
    unfiltered = full_ranks(score_fn, src, dst, num_nodes, rel=rel, batch_size=batch_size,
                            candidate_chunk=candidate_chunk)
    filtered = full_ranks(score_fn, src, dst, num_nodes, rel=rel, known_src=known_src, known_dst=known_dst,
                          known_rel=known_rel, batch_size=batch_size, candidate_chunk=candidate_chunk)
    assert unfiltered.tolist() == brute_force_ranks(scores, dst.tolist(), none)
    assert filtered.tolist() == brute_force_ranks(scores, dst.tolist(), known)
    assert (filtered <= unfiltered).all() and (filtered < unfiltered).any()
    # The ties matter: an optimistic count would give better ranks.
    optimistic = [1 + int((scores[i] > scores[i, dst[i]]).sum()) for i in range(11)]
    assert any(u > o for u, o in zip(unfiltered.tolist(), optimistic))


def test_full_ranks_ignore_the_relation_of_other_known_edges():
    emb = torch.tensor([[1.0], [3.0], [2.0], [3.0]])

    def fn(i, c):
        return emb[torch.zeros_like(i)] @ emb[c].T

    src, dst = torch.tensor([0]), torch.tensor([2])
    kw = dict(known_src=torch.tensor([0, 0]), known_dst=torch.tensor([1, 3]))
    assert full_ranks(fn, src, dst, 4).tolist() == [3]
    assert full_ranks(fn, src, dst, 4, **kw).tolist() == [1]
    # Known under relation 1 only: they do not filter a relation-0 query.
    other = full_ranks(fn, src, dst, 4, rel=torch.tensor([0]), known_rel=torch.tensor([1, 1]), **kw)
    assert other.tolist() == [3]


# --- OGB ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 3, 20, 50, 200])
@pytest.mark.parametrize("ties", [True, False])
def test_ogb_hits_at_k_matches_ogb_evaluator(seed, k, ties):
    rng = np.random.default_rng(seed)
    if ties:   # integer-valued scores: many ties between positives and negatives, and among negatives
        pos = rng.integers(0, 30, 80).astype(np.float64)
        neg = rng.integers(0, 30, 150).astype(np.float64)
    else:
        pos, neg = rng.normal(1.0, 1.0, 80), rng.normal(0.0, 1.0, 150)
    evaluator = LinkEvaluator("ogbl-ddi")
    evaluator.K = k                        # as OGB's own examples do to report other K
    want = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})[f"hits@{k}"]
    assert ogb_hits_at_k(pos, neg, k) == want
    want_torch = evaluator.eval({"y_pred_pos": torch.from_numpy(pos), "y_pred_neg": torch.from_numpy(neg)})
    assert ogb_hits_at_k(torch.from_numpy(pos), torch.from_numpy(neg), k) == want_torch[f"hits@{k}"]


def test_ogb_hits_default_k_and_strictness():
    evaluator = LinkEvaluator("ogbl-ddi")
    assert evaluator.K == 20
    neg = np.arange(20, dtype=np.float64)       # the 20th best negative is 0.0
    pos = np.array([0.0, 0.5, 0.0])             # ties with it are not hits
    assert ogb_hits_at_k(pos, neg, 20) == evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@20"]
    assert ogb_hits_at_k(pos, neg, 20) == pytest.approx(1 / 3)
    assert ogb_hits_at_k(pos, neg[:5], 20) == 1.0          # fewer negatives than K


@pytest.mark.parametrize("seed", range(3))
def test_ogb_mrr_matches_ogb_evaluator(seed):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 10, (50,), generator=gen).float()
    neg = torch.randint(0, 10, (50, 30), generator=gen).float()
    result = LinkEvaluator("ogbl-citation2").eval({"y_pred_pos": pos, "y_pred_neg": neg})
    assert ogb_mrr(pos, neg) == pytest.approx(float(result["mrr_list"].mean()), abs=1e-7)
    # With ties, the pessimistic MRR is below OGB's tie-averaged one.
    assert ranking_metrics(ranks(pos, neg))["mrr"] < ogb_mrr(pos, neg) - 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_ogbn_accuracy_matches_ogb_evaluator(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 5, (200, 1))
    y_pred = rng.integers(0, 5, (200, 1))
    want = NodeEvaluator("ogbn-arxiv").eval({"y_true": y_true, "y_pred": y_pred})["acc"]
    assert ogbn_accuracy(y_true, y_pred) == want
    assert ogbn_accuracy(torch.from_numpy(y_true[:, 0]), torch.from_numpy(y_pred[:, 0])) == want


def test_ogbn_accuracy_skips_unlabelled_and_averages_tasks():
    y_true = np.array([[1.0, 0.0], [np.nan, 1.0], [2.0, 1.0]])
    y_pred = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    # task 0: 1 of 2 labelled right; task 1: 2 of 3.
    assert ogbn_accuracy(y_true, y_pred) == pytest.approx((1 / 2 + 2 / 3) / 2)
    with pytest.raises(ConfigError, match="one shape"):
        ogbn_accuracy(y_true, y_pred[:2])
