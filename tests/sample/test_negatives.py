"""Chunked negative sampling: shapes, chunking, the degree/uniform split, draw statistics
(chi-square at fixed seeds), determinism and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from graphstore.errors import ConfigError
from graphstore.sample.base import CSCGraph
from graphstore.sample.negatives import NegativeSample, num_degree_negatives, sample_negatives

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# A chi-square goodness-of-fit test passes when its p-value is above this; at fixed seeds the
# outcome is deterministic, and a correct sampler fails a single test with probability 1e-3.
P_MIN = 1e-3


def gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("p", "c", "k", "frac"), [(10, 3, 7, 0.0), (10, 10, 4, 0.5), (1, 1, 1, 1.0),
                                                   (100, 7, 0, 0.3), (0, 4, 5, 0.2), (9, 1, 13, 0.25)])
def test_shapes_and_dtypes(device: str, p: int, c: int, k: int, frac: float) -> None:
    deg = torch.arange(20, device=device)
    s = sample_negatives(p, num_chunks=c, negatives_per_positive=k, degree_fraction=frac,
                         num_nodes=20, degrees=deg, generator=gen(0, device), device=device)
    assert isinstance(s, NegativeSample)
    assert s.nodes.shape == (c, k) and s.nodes.dtype == torch.int64
    assert s.chunk_of.shape == (p,) and s.chunk_of.dtype == torch.int64
    assert s.chunk_offsets.shape == (c + 1,) and s.chunk_offsets.dtype == torch.int64
    assert s.nodes.device.type == s.chunk_of.device.type == torch.device(device).type
    assert (s.num_chunks, s.negatives_per_positive) == (c, k)
    assert s.negatives_of_positives().shape == (p, k)
    assert torch.equal(s.negatives_of_positives(), s.nodes[s.chunk_of])
    assert s.to("cpu").nodes.device.type == "cpu"
    with pytest.raises(AttributeError):
        s.nodes = s.nodes  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(("p", "c"), [(10, 3), (10, 10), (10, 1), (1000, 7), (5, 2), (0, 3)])
def test_chunks_contiguous_and_near_equal(p: int, c: int) -> None:
    s = sample_negatives(p, num_chunks=c, negatives_per_positive=2, num_nodes=5, generator=gen(1))
    sizes = torch.bincount(s.chunk_of, minlength=c)
    assert sizes.numel() == c and int(sizes.sum()) == p
    assert int(sizes.max()) - int(sizes.min()) <= 1
    # the torch.tensor_split convention: the larger chunks first
    assert sizes.tolist() == [t.numel() for t in torch.arange(p).tensor_split(c)]
    assert bool((s.chunk_of.diff() >= 0).all())  # contiguous: non-decreasing
    assert s.chunk_offsets.tolist() == [0, *torch.cumsum(sizes, 0).tolist()]
    if p > 0:
        assert bool((sizes > 0).all())  # no empty chunk when num_chunks <= num_positives


@pytest.mark.parametrize(("k", "frac", "expected"), [(10, 0.0, 0), (10, 1.0, 10), (10, 0.25, 3), (2, 0.25, 1),
                                                     (3, 0.5, 2), (4, 0.1, 0), (4, 0.125, 1), (7, 0.3, 2),
                                                     (0, 0.5, 0), (1, 0.5, 1), (1, 0.49, 0)])
def test_degree_uniform_split(k: int, frac: float, expected: int) -> None:
    """``floor(frac * k + 0.5)`` degree-based columns first; checked by where they can land."""
    assert num_degree_negatives(k, frac) == expected
    # candidates are {0, 1, 2, 3} and node 0 has all the degree, so the degree-based columns
    # hold only node 0 while the uniform ones also reach 1, 2, 3.
    deg = torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0])
    cands = torch.tensor([0, 1, 2, 3])
    s = sample_negatives(200, num_chunks=50, negatives_per_positive=k, degree_fraction=frac,
                         candidates=cands, num_nodes=5, degrees=deg, generator=gen(2))
    assert s.num_degree == expected
    assert bool((s.nodes[:, :expected] == 0).all())  # degree part: only node 0 has weight
    if k - expected > 0:  # the uniform part does reach the zero-degree candidates
        assert bool((s.nodes[:, expected:] != 0).any())


@pytest.mark.parametrize("frac", [0.0, 0.4, 1.0])
def test_negatives_come_from_candidates(frac: float) -> None:
    cands = torch.tensor([3, 17, 17, 40, 99, 5])
    deg = torch.rand(100, generator=gen(3)) + 0.1
    s = sample_negatives(64, num_chunks=8, negatives_per_positive=50, degree_fraction=frac,
                         candidates=cands, num_nodes=100, degrees=deg, generator=gen(4))
    assert bool(torch.isin(s.nodes, cands).all())
    s = sample_negatives(64, num_chunks=8, negatives_per_positive=50, degree_fraction=frac,
                         num_nodes=7, degrees=torch.ones(7), generator=gen(4))
    assert int(s.nodes.min()) >= 0 and int(s.nodes.max()) < 7


def test_uniform_frequencies_chi_square() -> None:
    """Each of M candidates is drawn with frequency 1/M (chi-square, p > P_MIN)."""
    cands = torch.tensor([2, 5, 7, 11, 13, 17, 19, 23, 29, 31])
    s = sample_negatives(400, num_chunks=400, negatives_per_positive=100, candidates=cands,
                         num_nodes=40, generator=gen(5))
    counts = torch.bincount(s.nodes.reshape(-1), minlength=40)[cands].numpy()
    assert counts.sum() == 40_000
    assert scipy.stats.chisquare(counts).pvalue > P_MIN
    # and not trivially: a biased expectation is rejected
    skewed = np.full(10, 4000.0)
    skewed[0], skewed[1] = 4400.0, 3600.0
    assert scipy.stats.chisquare(counts, skewed).pvalue < P_MIN


def test_degree_frequencies_chi_square() -> None:
    """Degree-based draws are proportional to the candidates' degrees (chi-square), from a
    real graph's in-degrees; zero-degree candidates are never drawn."""
    rng = np.random.default_rng(6)
    n = 30
    dst = torch.from_numpy(rng.zipf(1.6, 3000) % n)
    src = torch.from_numpy(rng.integers(0, n, 3000))
    graph = CSCGraph.from_edges(src, dst, num_nodes=n)
    deg = graph.indptr.diff()
    deg[[4, 9]] = 0  # two zero-degree candidates
    cands = torch.arange(n)
    s = sample_negatives(300, num_chunks=300, negatives_per_positive=200, degree_fraction=1.0,
                         candidates=cands, num_nodes=n, degrees=deg, generator=gen(7))
    counts = torch.bincount(s.nodes.reshape(-1), minlength=n).numpy()
    assert counts[4] == counts[9] == 0
    positive = deg.numpy() > 0
    expected = deg.numpy()[positive] / deg.sum().item() * counts.sum()
    assert expected.min() > 5  # the chi-square approximation holds
    assert scipy.stats.chisquare(counts[positive], expected).pvalue > P_MIN
    assert scipy.stats.chisquare(counts[positive]).pvalue < P_MIN  # not uniform


def test_mixed_parts_have_their_own_distributions() -> None:
    """With degree_fraction 0.5, the first half follows degree and the second half is uniform."""
    deg = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    s = sample_negatives(500, num_chunks=500, negatives_per_positive=40, degree_fraction=0.5,
                         num_nodes=5, degrees=deg, generator=gen(8))
    d = torch.bincount(s.nodes[:, :20].reshape(-1), minlength=5).numpy()
    u = torch.bincount(s.nodes[:, 20:].reshape(-1), minlength=5).numpy()
    assert scipy.stats.chisquare(d, deg.numpy() / deg.sum().item() * d.sum()).pvalue > P_MIN
    assert scipy.stats.chisquare(u).pvalue > P_MIN


@pytest.mark.parametrize("device", DEVICES)
def test_seeded(device: str) -> None:
    kw = dict(num_chunks=4, negatives_per_positive=30, degree_fraction=0.5, num_nodes=1000,
              degrees=torch.arange(1000, device=device), device=device)
    a = sample_negatives(16, generator=gen(9, device), **kw)
    b = sample_negatives(16, generator=gen(9, device), **kw)
    c = sample_negatives(16, generator=gen(10, device), **kw)
    assert torch.equal(a.nodes, b.nodes) and torch.equal(a.chunk_of, b.chunk_of)
    assert not torch.equal(a.nodes[:, :15], c.nodes[:, :15])  # degree part differs
    assert not torch.equal(a.nodes[:, 15:], c.nodes[:, 15:])  # uniform part differs


def test_huge_candidate_set() -> None:
    """Degree draws have no 2**24-category limit (unlike torch.multinomial)."""
    n = (1 << 24) + 10
    deg = torch.zeros(n, dtype=torch.int32)
    deg[-3:] = torch.tensor([1, 0, 2], dtype=torch.int32)
    s = sample_negatives(2, num_chunks=2, negatives_per_positive=100, degree_fraction=1.0,
                         num_nodes=n, degrees=deg, generator=gen(11))
    assert set(s.nodes.unique().tolist()) <= {n - 3, n - 1}


def test_errors() -> None:
    g = gen(0)
    ok = dict(num_chunks=2, negatives_per_positive=3, num_nodes=10, generator=g)

    def bad(match: str, p: int = 4, **change: object) -> None:
        with pytest.raises(ConfigError, match=match):
            sample_negatives(p, **{**ok, **change})  # type: ignore[arg-type]

    bad("num_chunks must be at least 1", num_chunks=0)
    bad("cannot exceed num_positives", num_chunks=5)
    bad("num_chunks must be an int", num_chunks=2.0)
    bad("num_positives must be at least 0", p=-1)
    bad("negatives_per_positive must be at least 0", negatives_per_positive=-1)
    bad("degree_fraction must be in", degree_fraction=-0.1)
    bad("degree_fraction must be in", degree_fraction=1.5)
    bad("degree_fraction must be in", degree_fraction=float("nan"))
    bad("needs degrees", degree_fraction=0.5)
    bad("shape", degree_fraction=0.5, degrees=torch.ones(9))
    bad("every candidate has degree 0", degree_fraction=0.5, degrees=torch.zeros(10))
    bad("every candidate has degree 0", degree_fraction=1.0, candidates=torch.tensor([1, 2]),
        degrees=torch.tensor([1.0] + [0.0] * 9))
    bad("non-negative", degree_fraction=0.5, degrees=-torch.ones(10))
    bad("non-negative", degree_fraction=0.5, degrees=torch.full((10,), float("inf")))
    bad("no candidate nodes", candidates=torch.tensor([], dtype=torch.int64))
    bad("no candidate nodes", num_nodes=0)
    bad("local ids in", candidates=torch.tensor([0, 10]))
    bad("local ids in", candidates=torch.tensor([-1, 3]))
    bad("1-D integer tensor", candidates=torch.tensor([0.0, 1.0]))
    bad("1-D integer tensor", candidates=torch.tensor([[0, 1]]))
    bad("torch.Generator", generator=None)
    # ConfigError is a ValueError
    with pytest.raises(ValueError):
        sample_negatives(1, num_chunks=0, negatives_per_positive=1, num_nodes=1, generator=g)


def test_edge_cases_without_error() -> None:
    g = gen(12)
    # no negatives requested: empty candidates and all-zero degrees are fine
    s = sample_negatives(3, num_chunks=3, negatives_per_positive=0, num_nodes=0, generator=g)
    assert s.nodes.shape == (3, 0)
    # degree fraction that rounds to zero draws does not need non-zero degrees
    s = sample_negatives(3, num_chunks=1, negatives_per_positive=4, degree_fraction=0.1,
                         num_nodes=5, degrees=torch.zeros(5), generator=g)
    assert s.num_degree == 0 and s.nodes.shape == (1, 4)
    # no positives: chunk_of is empty, the chunks still get negatives
    s = sample_negatives(0, num_chunks=2, negatives_per_positive=3, num_nodes=5, generator=g)
    assert s.chunk_of.numel() == 0 and s.nodes.shape == (2, 3) and s.chunk_offsets.tolist() == [0, 0, 0]
