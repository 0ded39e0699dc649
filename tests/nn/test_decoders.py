"""Link prediction decoders: hand-computed scores, chunked negatives against a plain loop,
both corrupted ends, losses and argument checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn import DECODERS, ComplEx, DistMult, TransE, link_loss
from graphstore.sample import sample_negatives


def with_relations(decoder, rows):
    with torch.no_grad():
        decoder.relations.copy_(torch.tensor(rows, dtype=decoder.relations.dtype))
    return decoder


def test_distmult_hand_values():
    dec = with_relations(DistMult(2, num_relations=2), [[2.0, 3.0], [1.0, -1.0]])
    s = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    o = torch.tensor([[3.0, 4.0], [3.0, 4.0]])
    # 1*2*3 + 2*3*4 = 30 ; 1*1*3 - 2*1*4 = -5
    assert dec.score(s, torch.tensor([0, 1]), o).tolist() == [30.0, -5.0]


def test_complex_hand_value_and_complex_arithmetic():
    # s = 1 + 2i, r = 3 - i, o = 2 + i: s r = 5 + 5i, times conj(o) = 2 - i gives 15 + 5i.
    dec = with_relations(ComplEx(2), [[3.0, -1.0]])
    assert dec.score(torch.tensor([[1.0, 2.0]]), None, torch.tensor([[2.0, 1.0]])).tolist() == [15.0]

    torch.manual_seed(0)
    dec = ComplEx(8, num_relations=3)
    with torch.no_grad():
        dec.relations.normal_()
    s, o = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    rel = torch.tensor([0, 1, 2, 1, 0])
    r = dec.relations.double()[rel]

    def c(x):
        return torch.complex(x[:, :4], x[:, 4:])

    expected = (c(s) * c(r) * c(o).conj()).sum(1).real
    torch.testing.assert_close(dec.double().score(s, rel, o), expected)


@pytest.mark.parametrize("p, expected", [(2, -math.sqrt(13.0)), (1, -5.0)])
def test_transe_hand_values(p, expected):
    dec = with_relations(TransE(2, p=p), [[1.0, 0.0]])
    # s + r - o = [1 + 1 - 0, 2 + 0 - 5] = [2, -3]
    got = dec.score(torch.tensor([[1.0, 2.0]]), None, torch.tensor([[0.0, 5.0]]))
    assert got.item() == pytest.approx(expected)


def test_initial_relations_make_plain_similarities():
    s, o = torch.randn(4, 6), torch.randn(4, 6)
    torch.testing.assert_close(DistMult(6).score(s, None, o), (s * o).sum(1))
    torch.testing.assert_close(ComplEx(6).score(s, None, o), (s * o).sum(1))   # Re<s, o> for r = 1
    torch.testing.assert_close(TransE(6).score(s, None, o), -(s - o).norm(dim=1))


def test_shared_negatives_hand_example():
    # Two chunks: positives 0, 1 share negatives A; positive 2 has negatives B.
    dec = DistMult(2)
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    o = torch.zeros(3, 2)
    negs = torch.tensor([[[2.0, 3.0], [4.0, 5.0]], [[1.0, -1.0], [7.0, 0.0]]])
    got = dec.score_negatives(s, None, o, negs, torch.tensor([0, 0, 1]))
    assert got.tolist() == [[2.0, 4.0], [3.0, 5.0], [0.0, 7.0]]


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("corrupt", ["dst", "src"])
@pytest.mark.parametrize("num_positives, num_chunks", [(7, 3), (5, 1), (4, 4)])
def test_chunked_negatives_equal_scoring_each_pair(name, corrupt, num_positives, num_chunks):
    torch.manual_seed(1)
    kwargs = {"p": 1} if name == "transe" and num_chunks == 3 else {}
    dec = DECODERS[name](6, num_relations=3, **kwargs).double()
    with torch.no_grad():
        dec.relations.normal_()
    emb = torch.randn(30, 6, dtype=torch.float64)
    src, dst = torch.randint(0, 30, (num_positives,)), torch.randint(0, 30, (num_positives,))
    rel = torch.randint(0, 3, (num_positives,))
    sample = sample_negatives(num_positives, num_chunks=num_chunks, negatives_per_positive=5,
                              num_nodes=30, generator=torch.Generator().manual_seed(2))
    got = dec.score_negatives(emb[src], rel, emb[dst], emb[sample.nodes], sample.chunk_of, corrupt=corrupt)
    assert got.shape == (num_positives, 5)
    negs = sample.negatives_of_positives()
    for j in range(5):                       # a loop over negative columns, in the test only
        n = emb[negs[:, j]]
        want = dec.score(emb[src], rel, n) if corrupt == "dst" else dec.score(n, rel, emb[dst])
        torch.testing.assert_close(got[:, j], want)


def test_gradients_reach_embeddings_and_relations():
    dec = TransE(4, num_relations=2)
    with torch.no_grad():
        dec.relations.normal_()
    emb = torch.randn(10, 4, requires_grad=True)
    sample = sample_negatives(4, num_chunks=2, negatives_per_positive=3, num_nodes=10,
                              generator=torch.Generator().manual_seed(0))
    src, dst, rel = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7]), torch.tensor([0, 1, 0, 1])
    loss = dec.loss(emb[src], rel, emb[dst], chunk_of=sample.chunk_of, neg_dst=emb[sample.nodes],
                    neg_src=emb[sample.nodes])
    loss.backward()
    assert emb.grad.abs().sum() > 0 and dec.relations.grad.abs().sum(1).min() > 0


def test_loss_sums_both_corrupted_ends():
    torch.manual_seed(3)
    dec = DistMult(4)
    s, o = torch.randn(6, 4), torch.randn(6, 4)
    nd, ns = torch.randn(2, 5, 4), torch.randn(2, 3, 4)
    chunk_of = torch.tensor([0, 0, 0, 1, 1, 1])
    pos = dec.score(s, None, o)
    for kind in ("softmax", "logistic", "margin"):
        d = link_loss(pos, dec.score_negatives(s, None, o, nd, chunk_of), kind=kind)
        r = link_loss(pos, dec.score_negatives(s, None, o, ns, chunk_of, corrupt="src"), kind=kind)
        both = dec.loss(s, None, o, chunk_of=chunk_of, neg_dst=nd, neg_src=ns, kind=kind)
        torch.testing.assert_close(both, d + r)
        torch.testing.assert_close(dec.loss(s, None, o, chunk_of=chunk_of, neg_dst=nd, kind=kind), d)


def test_losses_hand_values():
    pos = torch.tensor([1.0, 0.0])
    neg = torch.tensor([[0.0, 2.0], [0.0, 0.0]])
    # softmax: -log(e / (e + 1 + e^2)) and -log(1 / 3), averaged
    want = (-math.log(math.e / (math.e + 1 + math.e ** 2)) + math.log(3.0)) / 2
    assert link_loss(pos, neg).item() == pytest.approx(want, rel=1e-6)
    logits = torch.cat([pos[:, None], neg], 1)
    torch.testing.assert_close(link_loss(pos, neg), F.cross_entropy(logits, torch.zeros(2, dtype=torch.long)))
    # margin 1: relu(1 - 1 + 0), relu(1 - 1 + 2), relu(1 - 0 + 0) twice -> (0 + 2 + 1 + 1) / 4
    assert link_loss(pos, neg, kind="margin").item() == pytest.approx(1.0)
    sp = lambda x: math.log1p(math.exp(x))   # noqa: E731
    want = (sp(-1.0) + sp(0.0)) / 2 + (sp(0.0) * 3 + sp(2.0)) / 4
    assert link_loss(pos, neg, kind="logistic").item() == pytest.approx(want, rel=1e-6)


def test_bad_arguments_raise_config_error():
    with pytest.raises(ConfigError, match="even dim"):
        ComplEx(5)
    with pytest.raises(ConfigError, match="must be 1 or 2"):
        TransE(4, p=3)
    with pytest.raises(ConfigError, match="num_relations must be at least 1"):
        DistMult(4, num_relations=0)
    dec = DistMult(2, num_relations=2)
    x = torch.randn(3, 2)
    with pytest.raises(ConfigError, match="rel is needed"):
        dec.score(x, None, x)
    with pytest.raises(ConfigError, match="corrupt must be one of"):
        dec.score_negatives(x, torch.zeros(3, dtype=torch.long), x, torch.randn(1, 2, 2),
                            torch.zeros(3, dtype=torch.long), corrupt="both")
    with pytest.raises(ConfigError, match=r"shape \[num_chunks, K, 2\]"):
        dec.score_negatives(x, torch.zeros(3, dtype=torch.long), x, torch.randn(2, 2),
                            torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="known losses: softmax, logistic, margin"):
        link_loss(torch.zeros(2), torch.zeros(2, 3), kind="hinge")
    with pytest.raises(ConfigError, match="needs negatives"):
        dec.loss(x, torch.zeros(3, dtype=torch.long), x, chunk_of=torch.zeros(3, dtype=torch.long))


def test_no_positives_give_an_empty_score_matrix():
    dec = DistMult(2)
    empty = torch.empty(0, 2)
    out = dec.score_negatives(empty, None, empty, torch.randn(1, 4, 2), torch.empty(0, dtype=torch.long))
    assert out.shape == (0, 4)


def test_hadamard_mlp_with_one_linear_layer_is_a_weighted_distmult():
    from graphstore.nn.decoders import HadamardMLP

    dec = with_relations(HadamardMLP(3, num_relations=2, num_layers=1), [[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    with torch.no_grad():
        dec.mlp[0].weight.copy_(torch.tensor([[1.0, -1.0, 0.5]]))
        dec.mlp[0].bias.fill_(2.0)
    s, o = torch.tensor([[1.0, 2.0, 4.0]] * 2), torch.tensor([[3.0, 1.0, 2.0]] * 2)
    # s*r*o = [3, 4, 24] -> 3 - 4 + 12 + 2 = 13 ; r = 1: [3, 2, 8] -> 3 - 2 + 4 + 2 = 7
    assert dec.score(s, torch.tensor([0, 1]), o).tolist() == [13.0, 7.0]


def test_hadamard_mlp_is_nonlinear_and_drops_out_only_in_training():
    from graphstore.nn.decoders import HadamardMLP

    torch.manual_seed(0)
    dec = HadamardMLP(8, hidden=16, num_layers=3, dropout=0.5)
    assert [tuple(lin.weight.shape) for lin in dec.mlp] == [(16, 8), (16, 16), (1, 16)]
    s, o = torch.randn(64, 8), torch.randn(64, 8)
    dec.eval()
    a = dec.score(s, None, o)
    torch.testing.assert_close(dec.score(s, None, o), a)              # deterministic in eval
    assert not torch.allclose(dec.score(2 * s, None, o), 2 * a)       # not linear in s (ReLU, bias)
    dec.train()
    assert not torch.allclose(dec.score(s, None, o), a)               # dropout in training
    loss = dec.loss(s, None, o, chunk_of=torch.zeros(64, dtype=torch.int64),
                    neg_dst=torch.randn(1, 1, 8), kind="logistic")
    loss.backward()
    assert all(lin.weight.grad.abs().sum() > 0 for lin in dec.mlp)
    with pytest.raises(ConfigError, match="dropout"):
        HadamardMLP(4, dropout=1.0)
    with pytest.raises(ConfigError, match="num_layers"):
        HadamardMLP(4, num_layers=0)
