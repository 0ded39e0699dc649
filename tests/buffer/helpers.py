"""A resident graph in store ids, so graphs with different slot layouts compare equal."""

from __future__ import annotations

import numpy as np


def canonical(g):
    """``(nodes, edges, features, labels)`` of a `ResidentGraph`, keyed by store id.

    Also checks the layout's invariants: ``indptr`` covers every local row, no edge touches
    a vacant row, and every valid row's local id maps back to it through ``to_local``.
    """
    ids = g.node_ids.numpy()
    indptr = g.indptr.numpy()
    assert indptr.shape == (g.num_nodes + 1,) and indptr[0] == 0 and indptr[-1] == g.num_edges
    valid = np.flatnonzero(ids >= 0)
    np.testing.assert_array_equal(g.to_local(ids[valid]).numpy(), valid)
    dst_local = np.repeat(np.arange(g.num_nodes), np.diff(indptr))
    src_local = g.indices.numpy()
    assert (ids[src_local] >= 0).all() and (ids[dst_local] >= 0).all(), "an edge touches a vacant row"
    rel = g.rel.numpy() if g.rel is not None else np.zeros(g.num_edges, np.int64)
    edges = sorted(zip(ids[src_local].tolist(), ids[dst_local].tolist(), rel.tolist()))
    order = valid[np.argsort(ids[valid])]
    features = None if g.features is None else g.features.numpy()[order]
    labels = None if g.labels is None else g.labels.numpy()[order]
    return ids[order], edges, features, labels


def assert_same_graph(got, want):
    """Same partitions, nodes, edges (with relations), feature rows and labels, by store id."""
    assert got.partitions == want.partitions
    for a, b, name in zip(canonical(got), canonical(want), ("nodes", "edges", "features", "labels")):
        if isinstance(a, list):
            assert a == b, name
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def induced_edges(store, nodes):
    """Sorted ``(src, dst, rel)`` store ids of every edge with both ends in ``nodes``,
    computed from the whole edge arrays in memory."""
    src = store.array("edges/src")[...].astype(np.int64)
    dst = store.array("edges/dst")[...].astype(np.int64)
    rel = store.array("edges/rel")[...].astype(np.int64) if store.manifest.has_relations else np.zeros_like(src)
    keep = np.isin(src, nodes) & np.isin(dst, nodes)
    return sorted(zip(src[keep].tolist(), dst[keep].tolist(), rel[keep].tolist()))
