"""A small, wide node-classification graph in the gnn-benchmark ``.npz`` layout.

    python tools/make_wide_graph.py OUT.npz [--nodes 34493] [--edges 247962] [--features 8415]
        [--classes 5] [--seed 0]

The defaults are Coauthor Physics' shape, the graph an outside review tried first (34k
nodes, 8,415 bag-of-words features: 33 KiB a row, so the old default conversion cut it
into 279 partitions of 124 nodes). Edges are homophilous (80 % inside the source's class),
and each node has about 30 binary words, 60 % of them from its class's slice of the
vocabulary, so a GNN learns it; `graphstore convert OUT.npz S.gs` reads it with the
generated 20/30-per-class split. docs/benchmarks.md, "Evaluation and memory on a small,
wide graph".
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def make_wide_graph(nodes: int = 34493, edges: int = 247962, features: int = 8415, classes: int = 5,
                    words: int = 30, seed: int = 0) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz``: CSR adjacency (directed as drawn; the converter
    symmetrises), CSR binary attributes and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, nodes)
    src = rng.integers(0, nodes, edges)
    dst = rng.integers(0, nodes, edges)
    inside = rng.random(edges) < 0.8
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(classes + 1))
    for c in range(classes):  # inside-class edges: a uniform member of the source's class
        pick = inside & (labels[src] == c)
        dst[pick] = order[rng.integers(starts[c], starts[c + 1], int(pick.sum()))]
    rows = np.repeat(np.arange(nodes), words)
    cols = rng.integers(0, features, nodes * words)
    topic = rng.random(nodes * words) < 0.6
    width = features // classes
    cols[topic] = labels[rows[topic]] * width + rng.integers(0, width, int(topic.sum()))
    adj = _csr(src, dst, nodes, nodes)
    attr = _csr(rows, cols, nodes, features)
    return {"adj_data": adj[0], "adj_indices": adj[1], "adj_indptr": adj[2], "adj_shape": np.array([nodes, nodes]),
            "attr_data": attr[0], "attr_indices": attr[1], "attr_indptr": attr[2],
            "attr_shape": np.array([nodes, features]), "labels": labels}


def _csr(rows: np.ndarray, cols: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Binary CSR of the (row, col) pairs, duplicates merged."""
    keys = np.unique(rows.astype(np.int64) * m + cols)
    r, c = keys // m, keys % m
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return np.ones(keys.size, np.float32), c.astype(np.int32), indptr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=34493)
    ap.add_argument("--edges", type=int, default=247962)
    ap.add_argument("--features", type=int, default=8415)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    arrays = make_wide_graph(args.nodes, args.edges, args.features, args.classes, seed=args.seed)
    np.savez(args.out, **arrays)
    print(f"wrote {args.out}: {args.nodes} nodes, {arrays['adj_data'].size} edges, {args.features} features")
    return 0


if __name__ == "__main__":
    sys.exit(main())
