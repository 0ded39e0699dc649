"""Fixtures of the trainer tests: the embedded Cora and a small clustered knowledge graph,
converted once per module; the trainer scripts imported from ``trainers/`` (not a package
of the wheel, so the repository root goes on ``sys.path``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def write_clustered_kg(directory: Path, *, num_nodes: int = 240, num_clusters: int = 8,
                       num_relations: int = 3, num_triples: int = 3000, seed: int = 0) -> None:
    """train/valid/test.txt of triples whose tail is in the head's cluster: learnable, so a
    trained model beats the random ranking baseline by a wide margin."""
    rng = np.random.default_rng(seed)
    cluster = np.arange(num_nodes) % num_clusters
    members = [np.flatnonzero(cluster == c) for c in range(num_clusters)]
    head = rng.integers(0, num_nodes, num_triples * 2)
    tail = np.array([rng.choice(members[cluster[h]]) for h in head])  # test data only: tiny
    rel = rng.integers(0, num_relations, head.size)
    triples = np.unique(np.stack([head, rel, tail], 1), axis=0)
    triples = triples[rng.permutation(len(triples))][:num_triples]
    # Every entity appears in train (a KG split's usual guarantee), then 10 % valid, 10 % test.
    n_eval = len(triples) // 10
    parts = {"valid": triples[:n_eval], "test": triples[n_eval:2 * n_eval], "train": triples[2 * n_eval:]}
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in parts.items():
        lines = [f"e{h}\tr{r}\te{t}" for h, r, t in rows]
        if name == "train":
            # Every entity in training, linked to the next member of its cluster.
            lines += [f"e{v}\tr0\te{(v + num_clusters) % num_nodes}" for v in range(num_nodes)]
        (directory / f"{name}.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def cora_store(tmp_path_factory) -> Path:
    import graphstore

    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    return out


@pytest.fixture(scope="module")
def kg_store(tmp_path_factory) -> Path:
    import graphstore

    root = tmp_path_factory.mktemp("kg")
    write_clustered_kg(root / "src")
    out = root / "kg.gs"
    graphstore.convert(root / "src", out, num_partitions=4, partitioner="random")
    return out


@pytest.fixture
def fresh_kg(kg_store, tmp_path) -> Path:
    """A private copy of the KG store: link prediction writes embeddings into it."""
    dest = tmp_path / "kg.gs"
    shutil.copytree(kg_store, dest)
    return dest
