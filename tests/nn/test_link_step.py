"""A link-prediction step's memory bound against the CPU allocator's peak, and its runs
(`graphstore.nn.link_step`); ``tests/trainers/test_link_prediction.py`` checks that the runs'
gradients are the whole batch's."""

from __future__ import annotations

import pytest
import torch

from graphstore.nn import DECODERS, estimate_link_step_bytes, link_micro_batches
from graphstore.nn.link_step import least_run_positives
from graphstore.nn.step_memory import _cpu_allocator_peak
from trainers import link_prediction as lp

SHAPES = [  # positives, chunks, negatives per chunk, width
    (1000, 1, 2048, 100),  # MariusGNN's knowledge-graph setting
    (300, 1, 2048, 100),
    (1000, 8, 256, 100),
    (1000, 1, 512, 400),
    (200, 200, 4, 64),  # one chunk per positive (OGB's negative edges)
]


def step_peak(model: str, loss: str, b: int, c: int, k: int, d: int, corrupt: str = "both") -> tuple[int, int]:
    """The allocator's peak of one step (gather the rows, loss, backward), and the bound."""
    gen = torch.Generator().manual_seed(0)
    dec = DECODERS[model](d, 11) if model != "mlp" else DECODERS[model](d, 11, hidden=d, num_layers=3)
    table = torch.randn(40_000, d, generator=gen)
    rows, inverse = torch.unique(torch.randint(0, 40_000, (2 * b + c * k,), generator=gen), return_inverse=True)
    rel = torch.randint(0, 11, (b,), generator=gen)
    chunk_of = torch.arange(b) * c // b

    def step():
        x = table[rows].requires_grad_(True)
        n = x[inverse[2 * b:]].view(c, k, -1)
        lp.link_prediction_loss(dec, x[inverse[:b]], rel, x[inverse[b:2 * b]], n, chunk_of, corrupt=corrupt,
                                kind=loss).backward()

    bound = estimate_link_step_bytes(positives=b, chunks=c, negatives=k, dim=d, sides=2 if corrupt == "both" else 1,
                                     rows=rows.numel(),
                                     mlp_width=sum(layer.in_features for layer in getattr(dec, "mlp", [])))
    return _cpu_allocator_peak(step), bound


@pytest.mark.parametrize("loss", ["softmax", "logistic", "margin"])
@pytest.mark.parametrize("model", ["distmult", "complex", "transe", "mlp"])
def test_the_bound_holds_the_allocators_peak_within_2_2x(model, loss):
    ratios = []
    for b, c, k, d in SHAPES:
        if model == "mlp" and k > 256:  # [C, P, K, d]: meant for few negatives
            continue
        peak, bound = step_peak(model, loss, b, c, k, d)
        ratios.append(bound / peak)
    assert min(ratios) >= 1.0, ratios
    assert max(ratios) <= 2.2, ratios


def test_the_bound_holds_for_pair_corruption():
    peak, bound = step_peak("distmult", "logistic", 200, 200, 4, 64, corrupt="pair")
    assert peak <= bound <= 2.2 * peak


def test_runs_fit_the_budget_and_cover_the_batch():
    chunk_of = torch.arange(1000) * 8 // 1000
    kw = dict(negatives=256, dim=100, sides=2, rows=3000)
    assert link_micro_batches(chunk_of, budget_bytes=1 << 30, **kw) == [slice(0, 1000)]
    runs = link_micro_batches(chunk_of, budget_bytes=4 << 20, **kw)
    assert len(runs) > 1
    assert runs[0].start == 0 and runs[-1].stop == 1000
    assert all(a.stop == b.start for a, b in zip(runs[:-1], runs[1:]))
    room = (4 << 20) - 8 * 3000 * 100
    for r in runs:
        chunks = int(chunk_of[r.stop - 1] - chunk_of[r.start]) + 1
        assert estimate_link_step_bytes(positives=r.stop - r.start, chunks=chunks, **{k: v for k, v in kw.items()
                                                                                       if k != "rows"}) <= room
    # below the floor, runs of the fewest positives the floor allows, never fewer
    least = least_run_positives(negatives=256, dim=100, sides=2)
    tiny = link_micro_batches(chunk_of, budget_bytes=1, **kw)
    assert len(tiny) == 1000 // least
    assert min(r.stop - r.start for r in tiny) >= least
    assert link_micro_batches(chunk_of[:least], budget_bytes=1, **kw) == [slice(0, least)]
