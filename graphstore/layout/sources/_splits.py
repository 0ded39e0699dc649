"""Seeded splits for sources that ship none (gnn-benchmark npz, plain edge lists)."""

from __future__ import annotations

import numpy as np

from graphstore.errors import SourceError
from graphstore.layout._fast import unique

__all__ = ["link_split", "per_class_split"]


def per_class_split(
    labels: np.ndarray,
    *,
    seed: int,
    train_per_class: int,
    valid_per_class: int | None = None,
    num_valid: int | None = None,
    num_test: int | None = None,
) -> dict[str, np.ndarray]:
    """Per-class train (and valid) nodes, drawn uniformly with ``default_rng(seed)``.

    Two rules, both over labeled nodes only (label >= 0):

    - ``valid_per_class`` given (gnn-benchmark): per class the first ``train_per_class``
      of a random order are train, the next ``valid_per_class`` valid, the rest test.
    - otherwise (PyG ``RandomNodeSplit``): ``train_per_class`` per class train, then
      ``num_valid`` and ``num_test`` nodes drawn from the remaining labeled nodes.

    A class smaller than asked gives what it has.

    Returns
    -------
    dict
        ``train``/``valid``/``test`` -> sorted [n] int64 node ids.
    """
    rng = np.random.default_rng(seed)
    labeled = np.flatnonzero(labels >= 0)
    shuffled = rng.permutation(labeled)
    # Stable sort by class keeps the random order inside each class, so the rank of a
    # node within its class is its position minus where the class starts.
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    cls = labels[order]
    starts = np.searchsorted(cls, cls, side="left")
    rank = np.arange(len(order)) - starts
    train = order[rank < train_per_class]
    if valid_per_class is not None:
        valid = order[(rank >= train_per_class) & (rank < train_per_class + valid_per_class)]
        test = order[rank >= train_per_class + valid_per_class]
    else:
        rest = rng.permutation(order[rank >= train_per_class])
        valid = rest[: num_valid or 0]
        test = rest[num_valid or 0 : (num_valid or 0) + (num_test or 0)]
    return {"train": np.sort(train), "valid": np.sort(valid), "test": np.sort(test)}


def link_split(
    src: np.ndarray,
    dst: np.ndarray,
    *,
    num_nodes: int,
    directed: bool,
    seed: int,
    valid_fraction: float,
    test_fraction: float,
    display: str,
) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]:
    """Hold out edges for validation and test, each with one uniform negative.

    Candidates are the distinct non-loop edges, as unordered pairs when undirected
    (so holding out ``(u, v)`` also removes ``(v, u)`` from the graph).

    Returns
    -------
    keep : [E] bool
        Which input edges stay in the graph (held-out pairs removed in both directions).
    splits : dict
        ``train``/``valid``/``test`` -> ``(src, dst, neg_src, neg_dst)`` int64 arrays;
        train has empty negatives.

    Raises
    ------
    SourceError
        The graph is too dense to draw negatives, or too large for 64-bit pair keys.
    """
    if num_nodes > 3_000_000_000:
        raise SourceError(f"{display}: {num_nodes} nodes is too many to generate a link split; ship one")
    n = np.int64(max(1, num_nodes))
    if directed:
        a, b = src, dst
    else:
        a, b = np.minimum(src, dst), np.maximum(src, dst)
    keys = a * n + b
    candidates = unique(keys[a != b])
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(candidates)
    num_valid = int(valid_fraction * len(candidates))
    num_test = int(test_fraction * len(candidates))
    held = {"valid": shuffled[:num_valid], "test": shuffled[num_valid : num_valid + num_test]}
    held_all = np.sort(shuffled[: num_valid + num_test])
    keep = ~_member(keys, held_all)
    all_keys = unique(keys)

    splits = {}
    train_keys = unique(keys[keep])
    splits["train"] = (train_keys // n, train_keys % n, np.zeros(0, np.int64), np.zeros(0, np.int64))
    for name, pos in held.items():
        neg_src, neg_dst = _negatives(len(pos), all_keys, n, directed, rng, display)
        splits[name] = (pos // n, pos % n, neg_src, neg_dst)
    return keep, splits


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.searchsorted(sorted_set, values).clip(max=len(sorted_set) - 1)
    return sorted_set[pos] == values


def _negatives(count, edge_keys, n, directed, rng, display, max_rounds: int = 100):
    neg_src = np.empty(count, np.int64)
    neg_dst = np.empty(count, np.int64)
    todo = np.arange(count)
    for _ in range(max_rounds):
        if len(todo) == 0:
            return neg_src, neg_dst
        u = rng.integers(0, n, len(todo))
        v = rng.integers(0, n, len(todo))
        a, b = (u, v) if directed else (np.minimum(u, v), np.maximum(u, v))
        ok = (u != v) & ~_member(a * n + b, edge_keys)
        neg_src[todo[ok]], neg_dst[todo[ok]] = u[ok], v[ok]
        todo = todo[~ok]
    if len(todo) == 0:
        return neg_src, neg_dst
    raise SourceError(
        f"{display}: cannot draw negative edges: the graph is (nearly) complete; ship "
        "valid/test splits with negatives instead"
    )
