"""Sources and stores for the half-precision tests (issue 34, 1): one float32 edge-list
source, converted at each feature dtype, and the float32 store of its rows already rounded
to a dtype (the "upcast reference": what a half store's rows are as numbers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import graphstore
from graphstore.layout.dtypes import decode, encode

DTYPES = ("float16", "bfloat16", "float32")
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def source_rows(num_nodes: int = 1200, feature_dim: int = 24, num_classes: int = 4, seed: int = 0):
    """Feature rows [N, D] float32 whose values mostly are not representable in 16 bits
    (so a half store differs from its source), with each row's class column raised (so a
    model learns), and int64 labels [N]."""
    rng = np.random.default_rng(seed)
    labels = np.arange(num_nodes) % num_classes
    features = rng.normal(0, 1, (num_nodes, feature_dim)).astype(np.float32)
    features[np.arange(num_nodes), labels] += 2.5
    return features, labels.astype(np.int64)


def write_source(directory: Path, features: np.ndarray, labels: np.ndarray | None, *, seed: int = 0) -> Path:
    """An edge-list directory: edges join nodes of one class (``labels``, or ``id % 4``
    without labels, for link prediction), ``features.npy`` as given."""
    n = features.shape[0]
    classes = 4
    rng = np.random.default_rng(seed + 1)
    src = rng.integers(0, n, 6 * n)
    dst = (src + classes * rng.integers(1, n // classes, src.size)) % n
    directory.mkdir(parents=True, exist_ok=True)
    np.savetxt(directory / "edges.txt", np.stack([src, dst], 1), fmt="%d")
    np.save(directory / "features.npy", features)
    if labels is not None:
        np.save(directory / "labels.npy", labels)
    return directory


def rounded(features: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows of ``features`` rounded to ``dtype`` by torch (the reference cast,
    independent of `graphstore.layout.dtypes`)."""
    return torch.from_numpy(features).to(TORCH[dtype]).float().numpy()


def convert(source: Path, out: Path, dtype: str | None, **options) -> Path:
    """4 random partitions (seed 1: the same store order for every dtype of one source)."""
    graphstore.convert(source, out, num_partitions=4, partitioner="random", seed=1, feature_dtype=dtype, **options)
    return out


def stored_rows(store) -> np.ndarray:
    """Every feature row as float32 numbers, in store order."""
    return decode(store.features[...], store.manifest.feature_dtype)


def upcast_source(root: Path, features: np.ndarray, labels: np.ndarray | None, dtype: str) -> Path:
    """The source whose float32 rows are ``features`` already rounded to ``dtype``."""
    return write_source(root, decode(encode(features, dtype), dtype), labels)
