#!/usr/bin/env python
"""Write synthetic graph datasets of any size in the OGB raw layout, streaming.

The output is what an OGB download unpacks to, so the converter can be tested and
benchmarked on graphs of any size without a network::

    OUT/
      raw/
        edge.csv.gz            "u,v" per line, no header; each undirected edge once
        num-node-list.csv.gz   one line: N
        num-edge-list.csv.gz   one line: E (edges in edge.csv.gz)
        node-feat.csv.gz       D comma-separated decimals per line   (D > 0)
        node-label.csv.gz      one int per line                      (node kind)
        -- or, with --layout npz (the ogbn-papers100M variant) --
        data.npz               edge_index.npy [2, E] int64 (--edge-dtype), node_feat.npy [N, D],
                               num_nodes_list.npy [1] int64, num_edges_list.npy [1] int64
        node-label.npz         node_label.npy [N, 1] float64, NaN = unlabeled (node kind)
      split/random/
        train.csv.gz, valid.csv.gz, test.csv.gz      node kind: one node id per line
        valid.pt, test.pt (train.pt with --write-train-pt)
                               link kind: torch.save({'edge': [n, 2] int64,
                               'edge_neg': [n, 2] int64}) as in ogbl-ddi
      synthetic.json           every parameter, the seed, counts and timings

The model
---------
Degrees follow a Chung-Lu model with Zipf-Mandelbrot weights: the node of rank ``r``
has weight ``(r + x0) ** -a`` with ``a = 1 / (gamma - 1)`` (``gamma`` = 2.5 by default),
and ``x0`` is solved so that the largest expected degree is ``--max-degree`` (by default
``min(2000, sqrt(N * d))``: a few thousand on large graphs, never so large that the
few hubs hold most edges or collide into many duplicate edges). Because the weights are
a closed-form function of the rank, their CDF can be inverted analytically: no per-node
array is ever held, which is what keeps memory independent of ``N``.

Nodes belong to ``C`` classes, ``class = rank mod C`` (balanced, each class with the same
degree distribution), relabelled by a seeded permutation of the ``C`` labels. Ranks are
mapped to node ids by a seeded pseudo-random permutation (a Feistel network with cycle
walking, invertible in O(1) memory), so hubs and neighbourhoods are spread over the
whole id space.

Edge ``i`` is a pure function of ``(seed, i)`` (counter-based hashing): its source rank
is drawn ``∝ w``; with probability ``h`` its destination is drawn ``∝ w`` inside the
source's class, otherwise ``∝ w`` inside one of the other ``C - 1`` classes, chosen
uniformly. Since classes carry (almost) equal weight, the destination marginal is still
``∝ w`` and the expected fraction of edges inside a class is ``h`` itself (drawing the
rest from the whole graph would give ``h + (1 - h) / C`` instead). Self loops are
redrawn. Duplicate edges are possible, as in any Chung-Lu graph, and left for the
converter to merge: about 1-3 % of edges on graphs of 200k+ nodes, more on small graphs
with small classes (about 6 % at 2,500 nodes in 10 classes).

Locality (``--communities K --locality L``, off by default): real graphs are not only
homophilous, they are local, which is what lets METIS-style partitions keep most of a
node's neighbours next to it (and what partition-based out-of-core training relies on).
Node of rank ``r`` belongs to community ``r mod K``; ``K`` is a multiple of ``C`` so a
community lies inside one class. With probability ``L`` an edge's destination is drawn
``∝ w`` inside the source's community, otherwise as above. The fraction of edges inside a
class is then ``L + (1 - L) h`` and about ``L`` of the edges lie inside a community
(slightly more: a non-local draw can land in it). Communities are spread over the id
space by the same permutation, so a partitioner has to find them.

Features are ``centroid[label] + sigma * noise`` with orthonormal centroids (random unit
vectors when ``D < C``); ``sigma`` is solved so the best classifier on features alone
reaches ``--feature-accuracy`` (0.75 by default, exact for ``D >= C``). Features are
rounded to 5 decimals in both layouts so a csv dataset and an npz dataset of the same
seed hold the same values (parse the csv as float64, then cast to the feature dtype).

Memory is bounded by the chunk size: about 100 MB (npz) or 150 MB (csv) whatever N
is. The link kind also holds its held-out edges and negative candidates (about
150 bytes per held-out edge) and imports torch (about 200 MB) to write the ``.pt``
files; ``--write-train-pt`` holds every train edge (16 bytes each).

Examples
--------
::

    python tools/make_synthetic.py --kind node --num-nodes 1000000 --avg-degree 20 \\
        --feature-dim 128 --num-classes 40 --layout npz --out /tmp/syn1m --seed 0

From Python (``tools/`` is not a package), load the file and register it in
``sys.modules`` before running it, as dataclasses needs::

    spec = importlib.util.spec_from_file_location("make_synthetic", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_synthetic"] = module
    spec.loader.exec_module(module)
    module.generate(module.SyntheticConfig(out=Path("/tmp/syn"), num_nodes=10_000))
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import logging
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from graphstore.layout.hashing import FeistelPermutation, mix64

logger = logging.getLogger("make_synthetic")

__all__ = ["KGConfig", "SyntheticConfig", "SyntheticError", "generate", "generate_kg", "main", "write_kg"]

GENERATOR_VERSION = 1
FEATURE_DECIMALS = 5
# Noise is drawn per block of this many rows from its own seeded stream, so the bytes
# written do not depend on --chunk-nodes (a chunk is a whole number of blocks).
FEATURE_BLOCK_ROWS = 1024
DEFAULT_MAX_DEGREE = 2000
DEFAULT_SPLIT = {"node": (0.6, 0.2, 0.2), "link": (0.9, 0.05, 0.05)}
# Distinct stream ids keep the random numbers of different purposes independent.
_STREAM_SRC, _STREAM_SAME, _STREAM_OTHER, _STREAM_DST = 1, 2, 3, 4
_STREAM_NEG_U, _STREAM_NEG_V, _STREAM_FEAT, _STREAM_LOCAL = 5, 6, 7, 8
_PERM_NODES, _PERM_SPLIT, _PERM_EDGES, _PERM_LABELS = 11, 12, 13, 14

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)


class SyntheticError(ValueError):
    """A request that cannot be carried out (existing output, impossible parameters).

    The command line prints the message on one line and exits 1.
    """


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    """Everything that determines a synthetic dataset (with the seed, its bytes).

    ``chunk_nodes`` only bounds memory: it does not change the data written.
    """

    out: Path
    """Output directory; ``raw/``, ``split/`` and ``synthetic.json`` are made in it."""
    kind: str = "node"
    """``"node"`` (node classification, node splits) or ``"link"`` (held-out edges)."""
    num_nodes: int = 10_000
    """Number of nodes N."""
    avg_degree: float = 10.0
    """Mean node degree ``2 E / N`` of the generated graph (each undirected edge is
    written once and counts towards the degree of both endpoints)."""
    feature_dim: int = 128
    """Feature columns D; 0 writes no features."""
    num_classes: int = 10
    """Classes C (communities for the link kind)."""
    layout: str = "csv"
    """``"csv"`` (gzip csv files) or ``"npz"`` (the ogbn-papers100M binary variant)."""
    seed: int = 0
    """Seed of every random choice."""
    chunk_nodes: int | None = None
    """Rows per chunk (rounded up to a multiple of 1024); None picks about 1M feature
    values per chunk. Edges are processed ``4 * chunk_nodes`` at a time (at most 2**19)."""
    homophily: float = 0.8
    """Expected fraction of edges whose endpoints share a class (of the non-local edges,
    when ``locality`` > 0)."""
    communities: int = 0
    """Communities K (a multiple of ``num_classes``; 0: none). See ``locality``."""
    locality: float = 0.0
    """Probability that an edge stays inside its source's community (needs communities)."""
    name: str = "synthetic"
    """Dataset name recorded in ``synthetic.json``."""
    feature_dtype: str = "float32"
    """``"float32"`` or ``"float16"``: dtype of ``node_feat`` in the npz layout."""
    edge_dtype: str = "int64"
    """``"int64"`` (OGB's own) or ``"int32"``: dtype of ``edge_index`` in the npz layout.
    int32 halves the source's edge bytes, which is what lets a graph past 2**31 stored edges
    fit beside its store and the conversion's staging on a 64 GB disk (tools/bench_scale.py)."""
    split: tuple[float, float, float] | None = None
    """Train, valid, test fractions; None gives 0.6/0.2/0.2 (node) or 0.9/0.05/0.05
    (link, where valid and test are held-out edges and train is what stays in raw/)."""
    split_name: str = "random"
    """Folder name under ``split/``."""
    unlabeled_fraction: float = 0.0
    """Fraction of nodes with a NaN label and in no split (npz layout, node kind only)."""
    write_train_pt: bool = False
    """Link kind: also write ``train.pt``; holds all train edges in memory."""
    max_degree: int | None = None
    """Largest expected degree; None gives ``min(2000, sqrt(N * avg_degree))`` (so
    the hubs of a small graph do not collide into many duplicate edges)."""
    degree_exponent: float = 2.5
    """Exponent gamma of the power-law degree distribution ``P(k) ~ k ** -gamma``."""
    feature_accuracy: float = 0.75
    """Accuracy of the best classifier on features alone (exact for D >= C)."""
    gzip_level: int = 1
    """gzip level of the csv.gz files (1 is fast; 6 is gzip's default)."""
    overwrite: bool = False
    """Replace an existing output directory that this tool made."""
    progress: bool | None = None
    """Show a progress bar; None shows one when stderr is a terminal."""


def _validate(cfg: SyntheticConfig) -> tuple[float, float, float]:
    """Check a config and return its split fractions.

    Raises
    ------
    SyntheticError
        When a value or a combination of values cannot work.
    """
    if cfg.kind not in ("node", "link"):
        raise SyntheticError(f"kind must be 'node' or 'link' (got {cfg.kind!r})")
    if cfg.layout not in ("csv", "npz"):
        raise SyntheticError(f"layout must be 'csv' or 'npz' (got {cfg.layout!r})")
    if cfg.feature_dtype not in ("float32", "float16"):
        raise SyntheticError(
            f"feature dtype must be 'float32' or 'float16' (got {cfg.feature_dtype!r})"
        )
    if cfg.edge_dtype not in ("int64", "int32"):
        raise SyntheticError(f"edge dtype must be 'int64' or 'int32' (got {cfg.edge_dtype!r})")
    if cfg.edge_dtype == "int32" and cfg.num_nodes > 2**31:
        raise SyntheticError(f"edge dtype int32 holds node ids below 2**31 (num_nodes {cfg.num_nodes})")
    if cfg.num_nodes < 2:
        raise SyntheticError(f"num_nodes must be at least 2 (got {cfg.num_nodes})")
    if not (cfg.avg_degree > 0 and math.isfinite(cfg.avg_degree)):
        raise SyntheticError(f"avg_degree must be positive (got {cfg.avg_degree})")
    if cfg.avg_degree > (cfg.num_nodes - 1) / 4:
        raise SyntheticError(
            f"avg_degree must be at most (N - 1) / 4 = {(cfg.num_nodes - 1) / 4:g} for a "
            f"sparse graph with few duplicate edges (got {cfg.avg_degree:g})"
        )
    if cfg.feature_dim < 0:
        raise SyntheticError(f"feature_dim must be >= 0 (got {cfg.feature_dim})")
    if not 1 <= cfg.num_classes <= cfg.num_nodes // 2:
        # A class needs two nodes for an edge inside it without a self loop.
        raise SyntheticError(f"num_classes must be in [1, N // 2] = [1, {cfg.num_nodes // 2}] "
                             f"(got {cfg.num_classes})")
    if not 0.0 <= cfg.homophily <= 1.0:
        raise SyntheticError(f"homophily must be in [0, 1] (got {cfg.homophily})")
    if not 0.0 <= cfg.locality <= 1.0:
        raise SyntheticError(f"locality must be in [0, 1] (got {cfg.locality})")
    if cfg.communities < 0:
        raise SyntheticError(f"communities must be >= 0 (got {cfg.communities})")
    if cfg.locality > 0 and cfg.communities == 0:
        raise SyntheticError("locality > 0 needs communities > 0")
    if cfg.communities and cfg.communities % cfg.num_classes:
        raise SyntheticError(f"communities must be a multiple of num_classes = {cfg.num_classes}, so a "
                             f"community lies inside one class (got {cfg.communities})")
    if cfg.communities and cfg.num_nodes // cfg.communities < 2:
        # A community needs two nodes for an edge inside it without a self loop.
        raise SyntheticError(f"communities must be at most N // 2 = {cfg.num_nodes // 2} "
                             f"(got {cfg.communities})")
    if cfg.chunk_nodes is not None and cfg.chunk_nodes < 1:
        raise SyntheticError(f"chunk_nodes must be positive (got {cfg.chunk_nodes})")
    if not cfg.degree_exponent > 2.0:
        raise SyntheticError(
            f"degree_exponent must be > 2 for a finite mean degree (got {cfg.degree_exponent})"
        )
    if cfg.max_degree is not None and cfg.max_degree < 2 * cfg.avg_degree:
        raise SyntheticError(
            f"max_degree must be at least 2 * avg_degree = {2 * cfg.avg_degree:g} "
            f"(got {cfg.max_degree})"
        )
    if cfg.num_classes > 1 and not 1.0 / cfg.num_classes < cfg.feature_accuracy < 1.0:
        raise SyntheticError(
            f"feature_accuracy must be in (1/C, 1) = ({1 / cfg.num_classes:g}, 1) "
            f"(got {cfg.feature_accuracy})"
        )
    if not 0 <= cfg.gzip_level <= 9:
        raise SyntheticError(f"gzip_level must be in [0, 9] (got {cfg.gzip_level})")
    if not 0.0 <= cfg.unlabeled_fraction < 1.0:
        raise SyntheticError(
            f"unlabeled_fraction must be in [0, 1) (got {cfg.unlabeled_fraction})"
        )
    if cfg.unlabeled_fraction > 0 and (cfg.layout != "npz" or cfg.kind != "node"):
        raise SyntheticError(
            "unlabeled_fraction needs --layout npz and --kind node: OGB marks unlabeled "
            "nodes with NaN in node-label.npz; the csv layout has no way to say it"
        )
    if cfg.write_train_pt and cfg.kind != "link":
        raise SyntheticError("write_train_pt applies to --kind link only")
    if not cfg.split_name or "/" in cfg.split_name or cfg.split_name in (".", ".."):
        raise SyntheticError(f"split_name must be a plain folder name (got {cfg.split_name!r})")
    fractions = cfg.split if cfg.split is not None else DEFAULT_SPLIT[cfg.kind]
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise SyntheticError(
            f"split must be three non-negative fractions summing to 1 (got {fractions})"
        )
    return (float(fractions[0]), float(fractions[1]), float(fractions[2]))


# ------------------------------------------------------------------ random numbers


def _stream_key(seed: int, stream: int) -> np.uint64:
    """A 64-bit key for one purpose's random numbers under one seed."""
    base = np.array([(seed * 0x2545F4914F6CDD1D + stream * 0x9E3779B97F4A7C15) % 2**64],
                    dtype=np.uint64)
    return _U64(mix64(mix64(base))[0])


def _uniform(key: np.uint64, counter: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1), a pure function of ``(key, counter)``.

    Counter-based (rather than a sequential generator) so that any edge can be made
    on its own: held-out edges are generated before the edges around them.
    """
    z = mix64(counter.astype(np.uint64) * _GOLDEN + key)
    return (z >> _U64(11)).astype(np.float64) * (1.0 / 2**53)


class _FeistelPermutation(FeistelPermutation):
    """A seeded pseudo-random permutation of ``[0, n)`` that costs O(1) memory: round keys
    from this tool's key streams (one per ``purpose``), the top bits of each round's hash
    (the best mixed ones). At most 4x oversized, so few cycle walks are needed."""

    _ROUNDS = 4

    def __init__(self, n: int, seed: int, purpose: int) -> None:
        keys = [_stream_key(seed, purpose * 64 + r) for r in range(self._ROUNDS)]
        super().__init__(n, keys, round_bits="high")


# ---------------------------------------------------------------------- the model


class _ZipfSampler:
    """Inverse-CDF sampling of index ``k`` in ``[0, n)`` with weight ``(k + x0) ** -a``.

    The continuous density ``(x + x0) ** -a`` on ``[0, n)`` is integrated in closed form
    and ``floor`` of a sample is the index, so no cumulative array is needed. Arrays of
    parameters give one distribution per class, selected per sample.
    """

    def __init__(self, n: np.ndarray, x0: np.ndarray, a: float) -> None:
        self.s = 1.0 - a
        self.n = np.asarray(n, dtype=np.float64)
        self.x0 = np.asarray(x0, dtype=np.float64)
        self.base = self.x0**self.s
        self.span = (self.n + self.x0) ** self.s - self.base
        self.last = np.asarray(n, dtype=np.int64) - 1

    def sample(self, u: np.ndarray, which: np.ndarray | int = 0) -> np.ndarray:
        """Indices (int64) for uniforms ``u``; ``which`` picks each sample's distribution."""
        x = (self.base[which] + u * self.span[which]) ** (1.0 / self.s) - self.x0[which]
        # Rounding at the ends of the range can step just outside it.
        return np.minimum(np.maximum(x, 0.0).astype(np.int64), self.last[which])

    def mass_of_first(self, which: int = 0) -> float:
        """Probability of index 0 under distribution ``which``."""
        x0, s = self.x0[which], self.s
        return float(((1.0 + x0) ** s - x0**s) / self.span[which])


def _gauss_cdf(z: np.ndarray) -> np.ndarray:
    erf = np.frompyfunc(math.erf, 1, 1)
    return 0.5 * (1.0 + erf(z / math.sqrt(2.0)).astype(np.float64))


def _noise_for_accuracy(num_classes: int, accuracy: float) -> float:
    """Noise ``sigma`` at which argmax over C orthonormal centroids is right ``accuracy``
    of the time: ``P = E_z[Phi(z + 1 / sigma) ** (C - 1)]``, solved by bisection."""
    if num_classes == 1:
        return 1.0
    z = np.linspace(-9.0, 9.0, 3601)
    weights = np.exp(-0.5 * z * z)
    weights /= weights.sum()

    def acc(sigma: float) -> float:
        return float((weights * _gauss_cdf(z + 1.0 / sigma) ** (num_classes - 1)).sum())

    lo, hi = 1e-3, 1e3  # acc falls from ~1 to ~1/C as sigma grows
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if acc(mid) > accuracy:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


class _Model:
    """The seeded graph: ranks, classes, ids, edges and features as pure functions."""

    def __init__(self, cfg: SyntheticConfig) -> None:
        n, c = cfg.num_nodes, cfg.num_classes
        self.cfg = cfg
        self.num_nodes, self.num_classes = n, c
        self.num_edges = int(round(n * cfg.avg_degree / 2))
        self.a = 1.0 / (cfg.degree_exponent - 1.0)
        self.node_perm = _FeistelPermutation(n, cfg.seed, _PERM_NODES)
        rng = np.random.Generator(np.random.PCG64([cfg.seed, _PERM_LABELS]))
        self.class_to_label = rng.permutation(c).astype(np.int64)
        self.class_sizes = np.array([(n - k + c - 1) // c for k in range(c)], dtype=np.int64)
        self.max_degree = (
            cfg.max_degree
            if cfg.max_degree is not None
            else int(min(DEFAULT_MAX_DEGREE, max(math.sqrt(n * cfg.avg_degree),
                                                 2 * cfg.avg_degree)))
        )
        self.x0 = self._solve_x0()
        self.glob = _ZipfSampler(np.array([n]), np.array([self.x0]), self.a)
        # Class k holds ranks k, k + C, k + 2C, ...: (C j + k + x0) ** -a ∝ (j + x_k) ** -a.
        self.per_class = _ZipfSampler(
            self.class_sizes, (np.arange(c) + self.x0) / c, self.a
        )
        self.p_same = cfg.homophily if c > 1 else 1.0
        k = self.num_communities = cfg.communities
        self.locality = cfg.locality if k else 0.0
        # Community j holds ranks j, j + K, j + 2K, ...: the same closed form as a class.
        self.per_community = (
            _ZipfSampler(np.array([(n - j + k - 1) // k for j in range(k)], dtype=np.int64),
                         (np.arange(k) + self.x0) / k, self.a)
            if k else None
        )
        self.keys = {s: _stream_key(cfg.seed, s) for s in
                     (_STREAM_SRC, _STREAM_SAME, _STREAM_OTHER, _STREAM_DST,
                      _STREAM_NEG_U, _STREAM_NEG_V, _STREAM_LOCAL)}
        d = cfg.feature_dim
        self.sigma = _noise_for_accuracy(c, cfg.feature_accuracy) if d else 0.0
        self.centroids = self._centroids(rng) if d else np.zeros((c, 0), np.float32)

    def expected_max_degree(self, x0: float) -> float:
        """Expected degree of the rank-0 node (as source, plus as destination)."""
        c = self.num_classes
        glob = _ZipfSampler(np.array([self.num_nodes]), np.array([x0]), self.a)
        cls = _ZipfSampler(self.class_sizes[:1], np.array([x0 / c]), self.a)
        mass = glob.mass_of_first() + cls.mass_of_first() / c
        k = self.cfg.communities
        if k and self.cfg.locality:
            # A local destination is rank 0 only when the source is in community 0 (~1/K).
            comm = _ZipfSampler(np.array([(self.num_nodes + k - 1) // k]), np.array([x0 / k]), self.a)
            mass = glob.mass_of_first() + ((1.0 - self.cfg.locality) * cls.mass_of_first() / c
                                           + self.cfg.locality * comm.mass_of_first() / k)
        return self.num_edges * mass

    def _solve_x0(self) -> float:
        # The rank-0 degree falls as x0 grows (the head flattens); bisect on log x0.
        if self.expected_max_degree(1.0) <= self.max_degree:
            return 1.0  # the plain Zipf head is already below the cap
        lo, hi = 0.0, math.log(float(self.num_nodes) * 1e3)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if self.expected_max_degree(math.exp(mid)) > self.max_degree:
                lo = mid
            else:
                hi = mid
        return math.exp(hi)

    def _centroids(self, rng: np.random.Generator) -> np.ndarray:
        c, d = self.num_classes, self.cfg.feature_dim
        g = rng.standard_normal((d, c))
        if d >= c:
            # Orthonormal centroids make the accuracy target exact.
            q, r = np.linalg.qr(g)
            q = q * np.sign(np.diag(r))  # a unique, seed-determined QR
            return np.ascontiguousarray(q.T, dtype=np.float32)
        return (g / np.linalg.norm(g, axis=0, keepdims=True)).T.astype(np.float32)

    # Nodes ------------------------------------------------------------------

    def labels_of(self, node_ids: np.ndarray) -> np.ndarray:
        """Label (int64) of each node id."""
        return self.class_to_label[self.node_perm.inverse(node_ids) % self.num_classes]

    def features(self, start: int, stop: int, labels: np.ndarray) -> np.ndarray:
        """Features of nodes ``[start, stop)``, as integers ``q``: a feature is
        ``q / 10**FEATURE_DECIMALS``, which the csv writes exactly as a decimal.

        Returns ``q`` ([stop - start, D] int32); ``start`` must be a multiple of
        ``FEATURE_BLOCK_ROWS``.
        """
        d = self.cfg.feature_dim
        q = np.empty((stop - start, d), dtype=np.int32)
        key = int(_stream_key(self.cfg.seed, _STREAM_FEAT))
        scale = np.float32(10.0**FEATURE_DECIMALS)
        # float32 arithmetic: q only has to be a deterministic integer, and |q| < 2**31
        # holds for any |feature| < 21474 (the clip guards the impossible rest).
        limit = np.float32(2**31 - 128)
        for b0 in range(start, stop, FEATURE_BLOCK_ROWS):
            b1 = min(b0 + FEATURE_BLOCK_ROWS, stop)
            gen = np.random.Generator(np.random.Philox(key=key + b0 // FEATURE_BLOCK_ROWS))
            x = gen.standard_normal((b1 - b0, d), dtype=np.float32)
            x *= np.float32(self.sigma)
            x += self.centroids[labels[b0 - start:b1 - start]]
            x *= scale
            np.rint(x, out=x)
            np.clip(x, -limit, limit, out=x)
            q[b0 - start:b1 - start] = x
        return q

    # Edges ------------------------------------------------------------------

    def edges(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Endpoints (int64 node ids) of the edges with indices ``idx``."""
        k = self.keys
        c = self.num_classes
        src = self.glob.sample(_uniform(k[_STREAM_SRC], idx))
        src_cls = src % c
        if c > 1:
            other = _uniform(k[_STREAM_SAME], idx) >= self.p_same
            shift = 1 + (_uniform(k[_STREAM_OTHER], idx) * (c - 1)).astype(np.int64)
            dst_cls = np.where(other, (src_cls + shift) % c, src_cls)
        else:
            dst_cls = src_cls
        local = (_uniform(k[_STREAM_LOCAL], idx) < self.locality) if self.locality else None
        counter = idx.astype(np.uint64) * _U64(64)
        dst = self._draw_dst(_uniform(k[_STREAM_DST], counter), src, dst_cls, local)
        # Redraw self loops with the next counters; the 64 slots per edge are never
        # exhausted in practice (a hub's chance of drawing itself is < 1/2 per try).
        loops = np.flatnonzero(dst == src)
        attempt = 1
        while loops.size and attempt < 64:
            u = _uniform(k[_STREAM_DST], counter[loops] + _U64(attempt))
            dst[loops] = self._draw_dst(u, src[loops], dst_cls[loops], None if local is None else local[loops])
            loops = loops[dst[loops] == src[loops]]
            attempt += 1
        if loops.size:
            raise SyntheticError("could not avoid a self loop; lower --max-degree")
        return self.node_perm.forward(src), self.node_perm.forward(dst)

    def _draw_dst(self, u: np.ndarray, src: np.ndarray, dst_cls: np.ndarray,
                  local: np.ndarray | None) -> np.ndarray:
        """Destination ranks for uniforms ``u``: ``∝ w`` inside ``dst_cls``, or inside the
        source's community where ``local`` is set."""
        c = self.num_classes
        dst = dst_cls + c * self.per_class.sample(u, dst_cls)
        if local is not None and local.any():
            k = self.num_communities
            comm = src[local] % k  # inside src's class, as K is a multiple of C
            dst[local] = comm + k * self.per_community.sample(u[local], comm)
        return dst

    def random_pairs(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Uniform node pairs for negatives (may contain ``u == v``)."""
        n = self.num_nodes
        u = (_uniform(self.keys[_STREAM_NEG_U], idx) * n).astype(np.int64)
        v = (_uniform(self.keys[_STREAM_NEG_V], idx) * n).astype(np.int64)
        return np.minimum(u, n - 1), np.minimum(v, n - 1)


def _pair_keys(u: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """One int64 per undirected pair, the same for (u, v) and (v, u)."""
    return np.minimum(u, v) * n + np.maximum(u, v)


# ---------------------------------------------------------------------- writing


def format_decimal_rows(q: np.ndarray, decimals: int = 0) -> bytes:
    """Format integer rows as csv text of fixed-point decimals, fully vectorised.

    Each value ``q[i, j]`` is written as the decimal ``q / 10**decimals`` with exactly
    ``decimals`` fraction digits (``-0.00123``, ``12``), comma-separated, one line per
    row. Values are laid out in fixed-width fields and the padding is dropped, which is
    an order of magnitude faster than ``np.savetxt``.

    Parameters
    ----------
    q : ndarray, [n, k] integer
        The scaled values.
    decimals : int
        Digits after the decimal point.

    Returns
    -------
    bytes
        ASCII text, ``n`` lines each ending in ``\\n``.

    Examples
    --------
    >>> format_decimal_rows(np.array([[1, -20], [0, 123456]]), decimals=3)
    b'0.001,-0.020\\n0.000,123.456\\n'
    >>> format_decimal_rows(np.array([[7], [10]]))
    b'7\\n10\\n'
    """
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"q must be 2-D [n, k] (got shape {q.shape})")
    n, k = q.shape
    if n == 0 or k == 0:
        return b"\n" * n if k == 0 else b""
    negative = q < 0
    magnitude = np.abs(q)
    largest = int(magnitude.max())
    # uint32 division is several times faster than uint64 in numpy.
    magnitude = magnitude.astype(np.uint32 if largest < 2**32 else np.uint64)
    num_digits = max(len(str(largest)), decimals + 1)
    width = 1 + num_digits + (1 if decimals else 0) + 1
    buf = np.zeros((n, k, width), dtype=np.uint8)  # NUL marks padding, dropped below
    buf[:, :, -1] = ord(",")
    buf[:, -1, -1] = ord("\n")
    buf[:, :, 0] = negative * np.uint8(ord("-"))
    rest = magnitude
    pos = width - 2
    for j in range(num_digits):
        if decimals and j == decimals:
            buf[:, :, pos] = ord(".")
            pos -= 1
        higher = rest // 10
        digit = (rest - higher * 10).astype(np.uint8)
        digit += np.uint8(ord("0"))
        if j > decimals:  # leading zeros of the integer part are padding
            digit *= rest > 0
        buf[:, :, pos] = digit
        rest = higher
        pos -= 1
    # bytes.translate deletes the padding about 4x faster than a boolean mask.
    return buf.tobytes().translate(None, b"\0")


class _Pipe:
    """Calls ``consume(item)`` for each item on a background thread, in order.

    Used to overlap compressing or writing one chunk with making the next (zlib, crc32
    and file writes release the GIL). The queue holds two items, so memory stays bounded.
    An error in the thread is re-raised by the next ``put`` or by ``close``.
    """

    def __init__(self, consume, name: str) -> None:
        self._consume = consume
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                self._consume(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the producer
            self._error = exc
            while self._queue.get() is not None:  # keep the producer from blocking
                pass

    def put(self, item) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def close(self) -> None:
        """Wait for every item to be consumed; idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


class _GzipSink:
    """A gzip file fed from a background thread. The bytes do not depend on the
    threading: one deflate stream fed in order, with a fixed header (mtime 0, no file
    name), so equal content gives equal files."""

    def __init__(self, path: Path, level: int) -> None:
        self.path = path
        self._raw = open(path, "wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw,
                                 compresslevel=level, mtime=0)
        self._pipe = _Pipe(self._gz.write, name=f"gzip-{path.name}")
        self.uncompressed_bytes = 0

    def write(self, data: bytes) -> None:
        self.uncompressed_bytes += len(data)
        self._pipe.put(data)

    def close(self) -> None:
        """Flush and close; idempotent."""
        try:
            self._pipe.close()
        finally:
            self._gz.close()
            self._raw.close()


def _write_small_gzip(path: Path, text: str, level: int) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                compresslevel=level, mtime=0) as gz:
        gz.write(text.encode("ascii"))


class _NpzWriter:
    """An ``.npz`` archive written member by member without holding any array.

    Members are stored (not compressed), as ``np.savez`` does, with zip64 forced so
    members above 4 GiB work; the date is fixed so equal content gives equal files.
    One member is open at a time (a zipfile rule).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED,
                                    allowZip64=True)

    def member(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> _NpyStream:
        """Open member ``name.npy`` for an array of ``shape`` and ``dtype`` (C order)."""
        info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o644 << 16
        fp = self._zip.open(info, "w", force_zip64=True)
        return _NpyStream(fp, name, shape, np.dtype(dtype))

    def add_array(self, name: str, array: np.ndarray) -> None:
        """Write a small in-memory array as member ``name.npy``."""
        stream = self.member(name, array.shape, array.dtype)
        stream.write(array)
        stream.close()

    def close(self) -> None:
        """Write the central directory; idempotent."""
        self._zip.close()


class _NpyStream:
    """One ``.npy`` member: the header, then rows in C order from a background thread.

    ``close`` checks that the bytes written match the header's shape.
    """

    def __init__(self, fp, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._fp, self.name, self.dtype = fp, name, dtype
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": tuple(int(s) for s in shape)}
        np.lib.format.write_array_header_1_0(fp, header)
        self._expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.written = 0
        self._closed = False
        # A byte view, because zipfile counts len(data) and len() of an n-d view is rows.
        self._pipe = _Pipe(lambda arr: fp.write(memoryview(arr).cast("B")),
                           name=f"npy-{name}")

    def write(self, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=self.dtype)
        self.written += chunk.nbytes
        self._pipe.put(chunk)

    def write_file(self, path: Path) -> None:
        """Append a flat binary file of ``dtype`` values."""
        with open(path, "rb") as src:
            while block := src.read(16 << 20):
                self.written += len(block)
                self._pipe.put(np.frombuffer(block, dtype=np.uint8))

    def close(self, check: bool = True) -> None:
        """Finish the member; idempotent. ``check=False`` is for unwinding after an
        error, when a short member is expected and the first error should show.

        Raises
        ------
        RuntimeError
            If the bytes written differ from what the header promised.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._pipe.close()
        finally:
            self._fp.close()
        if check and self.written != self._expected:
            raise RuntimeError(f"{self.name}.npy: wrote {self.written} bytes, header "
                               f"promises {self._expected}")


# ---------------------------------------------------------------------- generation


def _progress(total: int, unit: str, enabled: bool):
    """A tqdm bar, or None when disabled or tqdm is missing (it is optional here)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=unit + "s", unit=unit, unit_scale=True, leave=False)


def _chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(start + size, total)


class _KeySet:
    """A sorted set of pair keys that remembers which of them were seen again."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = np.unique(keys)
        self.seen = np.zeros(self.keys.size, dtype=bool)

    def _find(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self.keys, queries)
        pos = np.minimum(pos, max(self.keys.size - 1, 0))
        found = self.keys[pos] == queries if self.keys.size else np.zeros(queries.shape, bool)
        return pos, found

    def contains(self, queries: np.ndarray) -> np.ndarray:
        """Mask of the queries that are in the set."""
        return self._find(queries)[1]

    def mark(self, queries: np.ndarray) -> None:
        """Remember the members among ``queries`` as seen."""
        if self.keys.size == 0 or queries.size == 0:
            return
        # Sorted queries make searchsorted walk the set in order (several times faster
        # than random probes of a large set).
        queries = np.sort(queries)
        pos, found = self._find(queries)
        self.seen[pos[found]] = True

    def was_seen(self, queries: np.ndarray) -> np.ndarray:
        """Mask of the queries that are members and were marked."""
        pos, found = self._find(queries)
        return found & self.seen[pos] if self.keys.size else found


class _HeldOut:
    """Link kind: which edges leave raw/ for valid and test, and their negatives.

    Held-out edges are the edges whose index maps below ``num_valid + num_test`` under a
    seeded permutation of edge indices, so they are known (and generated) before the
    pass that writes the others. That pass marks held-out pairs that also occur among
    the remaining edges (a duplicate edge) and candidate negatives that are edges; both
    are dropped at the end, so held-out edges are never in raw/ and negatives are never
    edges. Memory: about 60 bytes per held-out edge.
    """

    def __init__(self, model: _Model, fractions: tuple[float, float, float]) -> None:
        e, n = model.num_edges, model.num_nodes
        self.model = model
        self.num_valid = int(round(fractions[1] * e))
        self.num_test = int(round(fractions[2] * e))
        self.num_held = self.num_valid + self.num_test
        if self.num_held >= e:
            raise SyntheticError(f"valid + test would hold out all {e} edges")
        self.edge_perm = _FeistelPermutation(e, model.cfg.seed, _PERM_EDGES)
        # Edge indices in permuted order: the first num_valid are valid, then test.
        self.u = np.empty(self.num_held, dtype=np.int64)
        self.v = np.empty(self.num_held, dtype=np.int64)
        for a, b in _chunks(self.num_held, 2**18):  # bounds the edge temporaries
            idx = self.edge_perm.inverse(np.arange(a, b, dtype=np.int64))
            self.u[a:b], self.v[a:b] = model.edges(idx)
        self.held = _KeySet(_pair_keys(self.u, self.v, n))
        # Oversample negative candidates: some are loops, repeats or edges.
        m = self.num_held + max(64, self.num_held // 8)
        parts_u, parts_v = [], []
        for a, b in _chunks(m, 2**18):
            cu, cv = model.random_pairs(np.arange(a, b, dtype=np.int64))
            ok = (cu != cv) & ~self.held.contains(_pair_keys(cu, cv, n))
            parts_u.append(cu[ok])
            parts_v.append(cv[ok])
        cu, cv = np.concatenate(parts_u), np.concatenate(parts_v)
        ckeys = _pair_keys(cu, cv, n)
        _, first = np.unique(ckeys, return_index=True)
        first.sort()  # keep the first copy of a repeated pair, in draw order
        self.cu, self.cv = cu[first], cv[first]
        self.candidates = _KeySet(ckeys[first])

    def select(self, idx: np.ndarray) -> np.ndarray:
        """Mask of the edges among ``idx`` that are held out."""
        return self.edge_perm.forward(idx) < self.num_held

    def observe(self, u: np.ndarray, v: np.ndarray) -> None:
        """Record edges that stay in raw/, seen in the writing pass."""
        keys = _pair_keys(u, v, self.model.num_nodes)
        self.held.mark(keys)
        self.candidates.mark(keys)

    def finish(self) -> dict[str, dict[str, np.ndarray]]:
        """The valid and test splits, each ``{'edge': [n, 2], 'edge_neg': [n, 2]}``."""
        keys = _pair_keys(self.u, self.v, self.model.num_nodes)
        _, first = np.unique(keys, return_index=True)
        keep = np.zeros(self.num_held, dtype=bool)
        keep[first] = True  # a pair held out twice stays in the first split only
        keep &= ~self.held.was_seen(keys)  # a duplicate of it stays in raw/
        good_neg = ~self.candidates.was_seen(_pair_keys(self.cu, self.cv,
                                                        self.model.num_nodes))
        neg_u, neg_v = self.cu[good_neg], self.cv[good_neg]
        out, taken = {}, 0
        for split, lo, hi in (("valid", 0, self.num_valid),
                              ("test", self.num_valid, self.num_held)):
            sel = np.flatnonzero(keep[lo:hi]) + lo
            count = sel.size
            if taken + count > neg_u.size:
                raise SyntheticError("not enough non-edge pairs for negatives; the graph "
                                     "is too dense (lower --avg-degree)")
            out[split] = {
                "edge": np.stack([self.u[sel], self.v[sel]], axis=1),
                "edge_neg": np.stack([neg_u[taken:taken + count],
                                      neg_v[taken:taken + count]], axis=1),
            }
            taken += count
        return out


def _auto_chunk_nodes(feature_dim: int) -> int:
    # About 1M feature values per chunk keeps the csv formatting temporaries (~60 bytes
    # a value) near 60 MB; larger chunks are not faster.
    return int(min(max(2**20 // max(feature_dim, 1), FEATURE_BLOCK_ROWS), 2**16))


def _prepare_output(out: Path, overwrite: bool) -> Path:
    """Check the output path; return a fresh sibling directory to write into."""
    if out.exists():
        if not out.is_dir():
            raise SyntheticError(f"--out {out} exists and is not a directory")
        entries = list(out.iterdir())
        if entries and not overwrite:
            raise SyntheticError(f"--out {out} exists and is not empty; pass --overwrite "
                                 "to replace it")
        if entries and not (out / "synthetic.json").is_file():
            raise SyntheticError(f"--out {out} is not empty and was not made by this tool "
                                 "(no synthetic.json); refusing to delete it: remove it "
                                 "by hand")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed at the end: a crash leaves no directory
    # that looks like a complete dataset.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the dataset is not
    return tmp


@contextlib.contextmanager
def _written_atomically(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a fresh sibling directory (`_prepare_output`) to write the dataset into; on
    success it replaces ``out`` by one rename, on any error it is removed."""
    tmp = _prepare_output(out, overwrite)
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_summary(directory: Path, summary: dict) -> None:
    with open(directory / "synthetic.json", "w") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
        fh.write("\n")


def generate(cfg: SyntheticConfig) -> dict:
    """Write the dataset described by ``cfg`` and return its summary (as in the json).

    Parameters
    ----------
    cfg : SyntheticConfig
        What to write and where.

    Returns
    -------
    dict
        Parameters, counts (``num_nodes``, ``num_edges`` written to raw/, split sizes),
        model constants and timings; also written to ``OUT/synthetic.json``.

    Raises
    ------
    SyntheticError
        Invalid parameters, or an output directory that exists.
    """
    fractions = _validate(cfg)
    t_start = time.perf_counter()
    model = _Model(cfg)
    logger.info("model: E=%d, x0=%.4g (max expected degree %.0f), feature sigma=%.4g",
                model.num_edges, model.x0, model.expected_max_degree(model.x0), model.sigma)
    with _written_atomically(Path(cfg.out), cfg.overwrite) as tmp:
        summary = _write_all(cfg, model, fractions, tmp)
        summary["timing"]["total_s"] = round(time.perf_counter() - t_start, 3)
        _write_summary(tmp, summary)
    return summary


def _write_edges(cfg: SyntheticConfig, model: _Model, held: _HeldOut | None,
                 npz: _NpzWriter | None, raw: Path, num_raw_edges: int,
                 chunk_edges: int, show: bool) -> tuple[float, list[np.ndarray]]:
    """The edge pass: ``raw/edge.csv.gz`` or ``edge_index`` in ``data.npz``.

    Returns the seconds taken and, with ``write_train_pt``, the train edge chunks.
    """
    t0 = time.perf_counter()
    train_pt: list[np.ndarray] = []
    with contextlib.ExitStack() as stack:
        bar = _progress(model.num_edges, "edge", show)
        if bar is not None:
            stack.callback(bar.close)
        if npz is not None:
            # Row 0 (sources) streams into the member; row 1 (destinations) waits in a
            # flat temporary file, since a zip member must be written front to back.
            edge_dtype = np.dtype(cfg.edge_dtype)
            src_stream = npz.member("edge_index", (2, num_raw_edges), edge_dtype)
            stack.callback(src_stream.close, check=False)
            dst_tmp = raw / ".edge_dst.tmp"
            dst_file = stack.enter_context(open(dst_tmp, "wb"))
        else:
            edge_sink = _GzipSink(raw / "edge.csv.gz", cfg.gzip_level)
            stack.callback(edge_sink.close)
        for e0, e1 in _chunks(model.num_edges, chunk_edges):
            idx = np.arange(e0, e1, dtype=np.int64)
            u, v = model.edges(idx)
            if held is not None:
                # Held-out edges were made up front; they only need leaving out here.
                stay = ~held.select(idx)
                u, v = u[stay], v[stay]
                held.observe(u, v)
                if cfg.write_train_pt:
                    train_pt.append(np.stack([u, v], axis=1))
            if npz is not None:
                src_stream.write(u.astype(edge_dtype, copy=False))
                v.astype(edge_dtype, copy=False).tofile(dst_file)
            else:
                edge_sink.write(format_decimal_rows(np.stack([u, v], axis=1)))
            if bar is not None:
                bar.update(e1 - e0)
        if npz is not None:
            dst_file.close()
            src_stream.write_file(dst_tmp)
            src_stream.close()
            dst_tmp.unlink()
    return round(time.perf_counter() - t0, 3), train_pt


def _write_nodes(cfg: SyntheticConfig, model: _Model,
                 fractions: tuple[float, float, float], npz: _NpzWriter | None,
                 raw: Path, split_dir: Path, chunk_nodes: int,
                 show: bool) -> tuple[int, dict[str, int], np.ndarray]:
    """The node pass: features, labels and node splits, chunk by chunk.

    Returns the number of labeled nodes, the split sizes and the labeled nodes per class.
    """
    n, d = model.num_nodes, cfg.feature_dim
    node_kind = cfg.kind == "node"
    feat_dtype = np.dtype(cfg.feature_dtype)
    num_labeled = n - int(round(cfg.unlabeled_fraction * n)) if node_kind else 0
    num_train = int(round(fractions[0] * num_labeled))
    num_valid = int(round(fractions[1] * num_labeled))
    # A node's place under a seeded permutation decides its split, so the split sizes
    # are exact without holding a permutation: [0, train) train, ..., >= labeled none.
    bounds = np.array([num_train, num_train + num_valid, num_labeled])
    split_perm = _FeistelPermutation(n, cfg.seed, _PERM_SPLIT) if node_kind else None
    label_counts = np.zeros(cfg.num_classes, dtype=np.int64)
    sinks: dict[str, _GzipSink] = {}
    feat_stream = label_stream = None
    with contextlib.ExitStack() as stack:
        bar = _progress(n, "node", show)
        if bar is not None:
            stack.callback(bar.close)

        def sink(key: str, path: Path) -> None:
            sinks[key] = _GzipSink(path, cfg.gzip_level)
            stack.callback(sinks[key].close)

        if npz is not None:
            if d:
                feat_stream = npz.member("node_feat", (n, d), feat_dtype)
                stack.callback(feat_stream.close, check=False)
            if node_kind:
                label_npz = _NpzWriter(raw / "node-label.npz")
                stack.callback(label_npz.close)
                label_stream = label_npz.member("node_label", (n, 1), np.dtype(np.float64))
                stack.callback(label_stream.close, check=False)
        else:
            if d:
                sink("feat", raw / "node-feat.csv.gz")
            if node_kind:
                sink("label", raw / "node-label.csv.gz")
        if node_kind:
            for part in ("train", "valid", "test"):
                sink(part, split_dir / f"{part}.csv.gz")
        for a, b in _chunks(n, chunk_nodes):
            ids = np.arange(a, b, dtype=np.int64)
            labels = model.labels_of(ids)
            if d:
                q = model.features(a, b, labels)
                if feat_stream is not None:
                    # Through float64, as a csv reader parses the decimal text.
                    feat_stream.write((q / 10.0**FEATURE_DECIMALS).astype(feat_dtype))
                else:
                    sinks["feat"].write(format_decimal_rows(q, FEATURE_DECIMALS))
                del q
            if node_kind:
                which = np.searchsorted(bounds, split_perm.forward(ids), side="right")
                for k, part in enumerate(("train", "valid", "test")):
                    sinks[part].write(format_decimal_rows(ids[which == k][:, None]))
                labeled = which < 3
                label_counts += np.bincount(labels[labeled], minlength=cfg.num_classes)
                if label_stream is not None:
                    col = labels.astype(np.float64)
                    col[~labeled] = np.nan
                    label_stream.write(col)
                else:
                    sinks["label"].write(format_decimal_rows(labels[:, None]))
            if bar is not None:
                bar.update(b - a)
        for stream in (feat_stream, label_stream):
            if stream is not None:
                stream.close()  # with the size check
    split_sizes = {"train": num_train, "valid": num_valid,
                   "test": num_labeled - num_train - num_valid}
    return num_labeled, split_sizes, label_counts


def _write_all(cfg: SyntheticConfig, model: _Model,
               fractions: tuple[float, float, float], root: Path) -> dict:
    raw = root / "raw"
    split_dir = root / "split" / cfg.split_name
    raw.mkdir()
    split_dir.mkdir(parents=True)
    n, d = model.num_nodes, cfg.feature_dim
    chunk_nodes = cfg.chunk_nodes or _auto_chunk_nodes(d)
    chunk_nodes = -(-chunk_nodes // FEATURE_BLOCK_ROWS) * FEATURE_BLOCK_ROWS
    chunk_edges = int(min(max(4 * chunk_nodes, 1024), 2**19))
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    feat_dtype = np.dtype(cfg.feature_dtype)
    level = cfg.gzip_level

    held = _HeldOut(model, fractions) if cfg.kind == "link" else None
    num_raw_edges = model.num_edges - (held.num_held if held else 0)
    timing: dict[str, float] = {}

    _write_small_gzip(raw / "num-node-list.csv.gz", f"{n}\n", level)
    _write_small_gzip(raw / "num-edge-list.csv.gz", f"{num_raw_edges}\n", level)
    with contextlib.ExitStack() as stack:
        npz = None
        if cfg.layout == "npz":
            npz = _NpzWriter(raw / "data.npz")
            stack.callback(npz.close)
        edges_s, train_pt = _write_edges(cfg, model, held, npz, raw, num_raw_edges,
                                         chunk_edges, show)
        timing["edges_s"] = edges_s
        t0 = time.perf_counter()
        num_labeled, split_sizes, label_counts = _write_nodes(
            cfg, model, fractions, npz, raw, split_dir, chunk_nodes, show)
        timing["nodes_s"] = round(time.perf_counter() - t0, 3)
        if npz is not None:
            npz.add_array("num_nodes_list", np.array([n], dtype=np.int64))
            npz.add_array("num_edges_list", np.array([num_raw_edges], dtype=np.int64))
    node_kind = cfg.kind == "node"

    # Link splits -----------------------------------------------------------------
    splits: dict[str, int] = {}
    if held is not None:
        import torch  # only the link kind needs torch; it is slow to import

        parts = held.finish()
        for part, arrays in parts.items():
            torch.save({key: torch.from_numpy(np.ascontiguousarray(val))
                        for key, val in arrays.items()}, split_dir / f"{part}.pt")
            splits[part] = int(arrays["edge"].shape[0])
            splits[f"{part}_neg"] = int(arrays["edge_neg"].shape[0])
        if cfg.write_train_pt:
            train = (np.concatenate(train_pt) if train_pt
                     else np.zeros((0, 2), dtype=np.int64))
            torch.save({"edge": torch.from_numpy(train)}, split_dir / "train.pt")
        splits["train"] = num_raw_edges
    else:
        splits = split_sizes

    feature_bytes = n * d * feat_dtype.itemsize
    nodes_s = max(timing["nodes_s"], 1e-9)
    params = dataclasses.asdict(cfg)
    params["out"] = str(cfg.out)
    params["split"] = list(fractions)
    params["chunk_nodes"] = chunk_nodes
    files = {str(p.relative_to(root)): p.stat().st_size
             for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        "generator": "graphstore tools/make_synthetic.py",
        "generator_version": GENERATOR_VERSION,
        "parameters": params,
        "seed": cfg.seed,
        "num_nodes": n,
        "num_edges": num_raw_edges,
        "num_edges_generated": model.num_edges,
        "num_classes": cfg.num_classes,
        "num_labeled": num_labeled,
        "label_counts": label_counts.tolist() if node_kind else None,
        "splits": splits,
        "model": {
            "degree_exponent": cfg.degree_exponent,
            "zipf_a": model.a,
            "zipf_x0": model.x0,
            "max_expected_degree": model.expected_max_degree(model.x0),
            "max_degree_target": model.max_degree,
            "homophily": cfg.homophily,
            "communities": cfg.communities,
            "locality": cfg.locality,
            "feature_noise_sigma": model.sigma,
            "feature_decimals": FEATURE_DECIMALS,
            "node_label_dtype": "float64" if cfg.layout == "npz" else "int64",
        },
        "feature_bytes": feature_bytes,
        "feature_mb_per_s": round(feature_bytes / nodes_s / 1e6, 2),
        "files": files,
        "timing": timing,
    }


# ------------------------------------------------------------- knowledge graphs (kg)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KGConfig:
    """A synthetic knowledge graph with hubs, in FB15k-237's proportions by default.

    Entities have a type and, inside it, a cluster; relation ``r`` links heads of one
    type to tails of another, mapping each head cluster to one tail cluster. A triple of
    ``r`` draws its head ``∝ w`` among the head type, and its tail ``∝ w`` inside the
    head cluster's image with probability ``cluster_fidelity``, else ``∝ w`` over the
    whole tail type. ``w`` is a Zipf-Mandelbrot popularity (as `SyntheticConfig`'s
    degrees) scaled so that the most popular entity's expected degree is ``max_degree``:
    a few hub entities (FB15k-237's ``USA``, ``male``) sit in thousands of triples, most
    in a few dozen. Relation frequencies are Zipf(``relation_exponent``).
    """

    num_entities: int = 15_000
    """Entities N (FB15k-237: 14,541). Some may end up in no triple."""
    num_relations: int = 200
    """Relations R (FB15k-237: 237)."""
    num_triples: int = 270_000
    """Training triples (FB15k-237: 272,115), after removing duplicates and self loops."""
    num_valid: int = 17_500
    """Validation triples (held out; both entities and the relation occur in training)."""
    num_test: int = 20_500
    """Test triples (as valid)."""
    num_types: int = 40
    """Entity types; type sizes are Zipf(1), so a few types are large."""
    clusters_per_type: int = 8
    """Clusters inside each type (the learnable structure beyond types)."""
    cluster_fidelity: float = 0.7
    """Probability that a tail is drawn inside the head cluster's image."""
    degree_exponent: float = 2.1
    """gamma of the degree tail ``P(k) ~ k ** -gamma`` (popularity ``(r + x0) ** (-1 / (gamma - 1))``)."""
    max_degree: int = 10_000
    """Expected degree of the most popular entity before duplicate triples are merged
    (the default gives a top degree of about 3,400 and mean 37; FB15k-237's is 7,600)."""
    relation_exponent: float = 1.0
    """Relation ``r`` (by rank) is used ``∝ (r + 1) ** -relation_exponent``."""
    seed: int = 0
    """Seed of every random choice."""


def generate_kg(cfg: KGConfig) -> dict[str, np.ndarray]:
    """The triples of a synthetic knowledge graph (`KGConfig`), in memory.

    Returns
    -------
    dict
        ``"train"``, ``"valid"``, ``"test"``: int64 [n, 3] ``(head, relation, tail)``
        arrays, distinct triples, no self loops, no triple in two splits, every held-out
        entity and relation present in ``"train"``; ``"entity_type"``, ``"entity_cluster"``:
        int64 [N].

    Raises
    ------
    SyntheticError
        On impossible parameters.

    Examples
    --------
    >>> kg = generate_kg(KGConfig(num_entities=500, num_relations=10, num_triples=4000, num_valid=100,
    ...                           num_test=100, num_types=8, clusters_per_type=4, max_degree=400))
    >>> kg["train"].shape, kg["valid"].shape, kg["test"].shape
    ((4000, 3), (100, 3), (100, 3))
    """
    n, num_rel = int(cfg.num_entities), int(cfg.num_relations)
    if n < 4 or num_rel < 1 or cfg.num_triples < 1 or cfg.num_valid < 0 or cfg.num_test < 0:
        raise SyntheticError("need num_entities >= 4, num_relations >= 1, num_triples >= 1 and "
                             "held-out counts >= 0")
    if not 1 <= cfg.num_types * cfg.clusters_per_type <= n // 2:
        raise SyntheticError(f"num_types * clusters_per_type must be in [1, N // 2] (got "
                             f"{cfg.num_types} * {cfg.clusters_per_type})")
    if not 0.0 <= cfg.cluster_fidelity <= 1.0 or not cfg.degree_exponent > 2.0:
        raise SyntheticError("cluster_fidelity must be in [0, 1] and degree_exponent > 2")
    total = cfg.num_triples + cfg.num_valid + cfg.num_test
    if not 2 * total / n < cfg.max_degree:
        raise SyntheticError(f"max_degree must exceed the mean degree {2 * total / n:.1f}")
    rng = np.random.default_rng([int(cfg.seed), 0x6B67])  # "kg"

    # Entities: popularity by rank, ids a random permutation of the ranks; types of Zipf(1)
    # sizes (each with at least clusters_per_type members), clusters inside a type at random.
    t, k = int(cfg.num_types), int(cfg.clusters_per_type)
    sizes = 1.0 / np.arange(1, t + 1)
    sizes = k + np.floor(sizes / sizes.sum() * (n - t * k)).astype(np.int64)
    sizes[0] += n - sizes.sum()
    entity_type = rng.permutation(np.repeat(np.arange(t), sizes))
    entity_cluster = entity_type * k + rng.integers(0, k, n)
    # a cluster may come out empty by chance: give each one a member of its type
    for c in np.setdiff1d(np.arange(t * k), entity_cluster):
        members = np.flatnonzero(entity_type == c // k)
        entity_cluster[members[rng.integers(0, len(members))]] = c
    a = 1.0 / (cfg.degree_exponent - 1.0)
    ranks = np.arange(n, dtype=np.float64)

    def top_share(x0: float) -> float:
        w = (ranks + x0) ** -a
        return 2 * total * w[0] / w.sum()

    lo, hi = 0.0, float(n)  # top_share decreases in x0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top_share(mid) > cfg.max_degree else (lo, mid)
    popularity = np.empty(n)
    popularity[rng.permutation(n)] = (ranks + hi) ** -a

    # Entities laid out by (type, cluster) with cumulative popularity: a draw ∝ w inside a
    # type or a cluster is a binary search inside its contiguous range.
    order = np.lexsort((np.arange(n), entity_cluster))
    cum = np.concatenate([[0.0], np.cumsum(popularity[order])])
    cluster_start = np.searchsorted(entity_cluster[order], np.arange(t * k + 1))
    type_start = cluster_start[::k]

    def draw(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        u = rng.random(len(start))
        target = cum[start] + u * (cum[stop] - cum[start])
        pos = np.clip(np.searchsorted(cum, target, side="right") - 1, start, stop - 1)
        return order[pos]

    # Relations: head type, tail type (∝ type popularity mass), a cluster map, a frequency.
    type_mass = np.bincount(entity_type, weights=popularity, minlength=t)
    head_type = rng.choice(t, size=num_rel, p=type_mass / type_mass.sum())
    tail_type = rng.choice(t, size=num_rel, p=type_mass / type_mass.sum())
    cluster_map = rng.integers(0, k, (num_rel, k))  # head cluster index -> tail cluster index
    rel_p = (np.arange(num_rel) + 1.0) ** -cfg.relation_exponent
    rel_p = rel_p[rng.permutation(num_rel)]

    chosen = np.zeros((0, 3), dtype=np.int64)
    seen = np.zeros(0, dtype=np.int64)
    for _ in range(20):  # draw until enough distinct triples (duplicates pile up on hubs)
        m = int((total - len(chosen)) * 1.3) + 1000
        rel = rng.choice(num_rel, size=m, p=rel_p / rel_p.sum())
        ht = head_type[rel]
        head = draw(type_start[ht], type_start[ht + 1])
        tt = tail_type[rel]
        tail_cluster = tt * k + cluster_map[rel, entity_cluster[head] % k]
        local = rng.random(m) < cfg.cluster_fidelity
        start = np.where(local, cluster_start[tail_cluster], type_start[tt])
        stop = np.where(local, cluster_start[tail_cluster + 1], type_start[tt + 1])
        tail = draw(start, stop)
        batch = np.stack([head, rel, tail], axis=1)[head != tail]
        key = (batch[:, 0] * num_rel + batch[:, 1]) * n + batch[:, 2]
        _, first = np.unique(key, return_index=True)
        first = np.sort(first)
        batch, key = batch[first], key[first]
        fresh = ~np.isin(key, seen)
        chosen = np.concatenate([chosen, batch[fresh]])[:total]
        seen = np.concatenate([seen, key[fresh]])
        if len(chosen) >= total:
            break
    else:
        raise SyntheticError(f"could not draw {total} distinct triples; lower num_triples or raise "
                             "num_entities")

    # Held-out triples only where their entities and relation stay in training.
    chosen = chosen[rng.permutation(len(chosen))]
    held = cfg.num_valid + cfg.num_test
    train_mask = np.ones(len(chosen), dtype=bool)
    ent_count = np.bincount(chosen[:, [0, 2]].ravel(), minlength=n)
    rel_count = np.bincount(chosen[:, 1], minlength=num_rel)
    picked: list[int] = []
    for i in range(len(chosen)):
        if len(picked) == held:
            break
        h, r, o = chosen[i]
        if ent_count[h] > 1 and ent_count[o] > 1 and rel_count[r] > 1:
            ent_count[h] -= 1
            ent_count[o] -= 1
            rel_count[r] -= 1
            picked.append(i)
    if len(picked) < held:
        raise SyntheticError(f"only {len(picked)} triples can be held out (asked {held})")
    train_mask[picked] = False
    picked_arr = np.asarray(picked, dtype=np.int64)
    return {
        "train": chosen[train_mask],
        "valid": chosen[picked_arr[: cfg.num_valid]],
        "test": chosen[picked_arr[cfg.num_valid:]],
        "entity_type": entity_type,
        "entity_cluster": entity_cluster,
    }


def write_kg(out: Path, cfg: KGConfig, *, overwrite: bool = False) -> dict:
    """Write `generate_kg`'s triples as graphstore's ``kg`` source: ``OUT/train.txt``,
    ``valid.txt``, ``test.txt`` of ``head<TAB>relation<TAB>tail`` (names ``e<id>``,
    ``r<id>``), and ``OUT/synthetic.json`` (the parameters and counts). Returns the summary.
    ``graphstore convert OUT store.gs --format kg`` reads it."""
    t0 = time.perf_counter()
    kg = generate_kg(cfg)
    with _written_atomically(Path(out), overwrite) as tmp:
        for name in ("train", "valid", "test"):
            triples = kg[name]
            lines = [f"e{h}\tr{r}\te{o}\n" for h, r, o in triples.tolist()]
            (tmp / f"{name}.txt").write_text("".join(lines))
        train = kg["train"]
        degree = np.bincount(train[:, [0, 2]].ravel(), minlength=cfg.num_entities)
        summary = {
            "generator": "make_synthetic.write_kg", "version": GENERATOR_VERSION,
            "params": {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)},
            "splits": {name: int(len(kg[name])) for name in ("train", "valid", "test")},
            "entities_in_train": int((degree > 0).sum()),
            "relations_in_train": int(len(np.unique(train[:, 1]))),
            "degree": {"mean": round(float(degree[degree > 0].mean()), 2), "max": int(degree.max()),
                       "top10": np.sort(degree)[::-1][:10].tolist()},
            "timing": {"total_s": round(time.perf_counter() - t0, 3)},
        }
        _write_summary(tmp, summary)
    return summary


# ---------------------------------------------------------------------- command line


def _split_arg(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three fractions like 0.6,0.2,0.2 "
                                         f"(got {text!r})") from None
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected three fractions (got {len(parts)})")
    return parts  # type: ignore[return-value]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command line."""
    p = argparse.ArgumentParser(
        prog="make_synthetic.py",
        description="Write a seeded synthetic graph dataset in the OGB raw layout, "
                    "streaming (memory bounded by --chunk-nodes, not by the dataset).",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--kind", choices=("node", "link", "kg"), default="node",
                   help="kg: a knowledge graph with hubs (train/valid/test.txt triples, KGConfig; "
                        "uses --num-nodes (default 15000 for kg), --num-relations, --num-triples, "
                        "--max-degree (default 10000 for kg), --degree-exponent (default 2.1 for kg), "
                        "--seed)")
    p.add_argument("--num-relations", type=int, default=200, help="kg only")
    p.add_argument("--num-triples", type=int, default=270_000,
                   help="kg only: training triples (valid and test in FB15k-237's proportion)")
    p.add_argument("--num-nodes", type=int, default=10_000)
    p.add_argument("--avg-degree", type=float, default=10.0,
                   help="mean degree 2E/N (each undirected edge written once)")
    p.add_argument("--feature-dim", type=int, default=128, help="0 writes no features")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--layout", choices=("csv", "npz"), default="csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-nodes", type=int, default=None,
                   help="rows per chunk (memory bound; default: ~1M feature values)")
    p.add_argument("--homophily", type=float, default=0.8,
                   help="expected fraction of edges inside a class (of the non-local ones)")
    p.add_argument("--communities", type=int, default=0,
                   help="communities K, a multiple of --num-classes (0: none)")
    p.add_argument("--locality", type=float, default=0.0,
                   help="probability that an edge stays inside its source's community")
    p.add_argument("--name", default="synthetic")
    p.add_argument("--feature-dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--edge-dtype", choices=("int64", "int32"), default="int64",
                   help="dtype of edge_index in the npz layout (int64 as OGB writes it)")
    p.add_argument("--split", type=_split_arg, default=None,
                   help="train,valid,test fractions (node default 0.6,0.2,0.2; "
                        "link default 0.9,0.05,0.05)")
    p.add_argument("--split-name", default="random", help="folder under split/")
    p.add_argument("--unlabeled-fraction", type=float, default=0.0,
                   help="nodes with NaN label, in no split (npz layout only)")
    p.add_argument("--write-train-pt", action="store_true",
                   help="link kind: also write train.pt (holds the train edges in memory)")
    p.add_argument("--max-degree", type=int, default=None,
                   help="largest expected degree (default min(2000, sqrt(N*d)))")
    p.add_argument("--degree-exponent", type=float, default=2.5)
    p.add_argument("--feature-accuracy", type=float, default=0.75,
                   help="accuracy of the best classifier on features alone")
    p.add_argument("--gzip-level", type=int, default=1)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output directory made by this tool")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 error, 2 bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kind == "kg":
        explicit = set(argv if argv is not None else sys.argv[1:])
        kg_cfg = KGConfig(
            num_entities=args.num_nodes if "--num-nodes" in explicit else KGConfig.num_entities,
            num_relations=args.num_relations, num_triples=args.num_triples, seed=args.seed,
            # held-out triples in FB15k-237's proportion to the training ones
            num_valid=round(args.num_triples * KGConfig.num_valid / KGConfig.num_triples),
            num_test=round(args.num_triples * KGConfig.num_test / KGConfig.num_triples),
            **({"max_degree": args.max_degree} if args.max_degree is not None else {}),
            **({"degree_exponent": args.degree_exponent} if "--degree-exponent" in explicit else {}))
        try:
            s = write_kg(args.out, kg_cfg, overwrite=args.overwrite)
        except SyntheticError as exc:
            print(f"make_synthetic: error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote kg dataset to {args.out}: splits {s['splits']}, {s['entities_in_train']} entities, "
              f"{s['relations_in_train']} relations, degree mean {s['degree']['mean']} "
              f"max {s['degree']['max']}")
        return 0
    cfg = SyntheticConfig(
        out=args.out, kind=args.kind, num_nodes=args.num_nodes, avg_degree=args.avg_degree,
        feature_dim=args.feature_dim, num_classes=args.num_classes, layout=args.layout,
        seed=args.seed, chunk_nodes=args.chunk_nodes, homophily=args.homophily,
        communities=args.communities, locality=args.locality,
        name=args.name, feature_dtype=args.feature_dtype, edge_dtype=args.edge_dtype, split=args.split,
        split_name=args.split_name, unlabeled_fraction=args.unlabeled_fraction,
        write_train_pt=args.write_train_pt, max_degree=args.max_degree,
        degree_exponent=args.degree_exponent, feature_accuracy=args.feature_accuracy,
        gzip_level=args.gzip_level, overwrite=args.overwrite,
        progress=False if args.no_progress else None,
    )
    try:
        _validate(cfg)
    except SyntheticError as exc:
        parser.error(str(exc))  # exits 2
    try:
        s = generate(cfg)
    except SyntheticError as exc:
        print(f"make_synthetic: error: {exc}", file=sys.stderr)
        return 1
    splits = ", ".join(f"{k} {v}" for k, v in s["splits"].items())
    print(f"wrote {cfg.kind} dataset {cfg.name!r} ({cfg.layout}) to {cfg.out}: "
          f"{s['num_nodes']} nodes, {s['num_edges']} edges, {cfg.feature_dim} x "
          f"{cfg.feature_dtype} features, {cfg.num_classes} classes, splits: {splits}; "
          f"{s['timing']['total_s']:.1f} s, features {s['feature_mb_per_s']:.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
