"""Edges into buckets: the staged edges, mapped to store ids, grouped by destination
partition on disk, then sorted into (src partition, dst, src) order one destination
partition at a time, with duplicates merged.

Every staged edge carries one bit from staging to the merge: given by the source, or a
reverse edge the converter added to an undirected source. Equal edges merge whatever their
bits (the stored edges do not depend on them); the bits only let the counts tell a source
that repeats an edge from a source that already lists both directions (`EdgeCounts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphstore.layout._arrays import ChunkedAppender
from graphstore.layout._staging import NODE_CHUNK, ScratchFile, StagedEdges, node_scratch
from graphstore.layout._writer import StoreWriter

__all__ = ["EdgeCounts", "write_edges"]

_ADDED_SHIFT = 62
_ADDED = np.int64(1 << _ADDED_SHIFT)
"""The added-reverse bit, carried above the store id in the grouped scratch files."""


@dataclass(frozen=True, slots=True)
class EdgeCounts:
    """What `write_edges` stored, and what merging found.

    ``num_edges == kept source edges - duplicates_merged + reverse_edges_added``, where the
    kept source edges are the source's less the self loops dropped.
    """

    num_edges: int
    """Edges stored."""
    cut_edges: int
    """Stored edges whose endpoints are in different partitions."""
    duplicates: int
    """Source edges repeating an earlier source edge in the same direction (and relation):
    the source's own duplicates, whether merged or kept. A reverse edge the converter added
    is never counted here."""
    duplicates_merged: int
    """``duplicates``, or 0 when duplicates are kept."""
    reverse_edges_present: int
    """Distinct source edges (u, v) whose reverse (v, u) the source lists too: the reverse
    the converter added for each merged into it. 0 for a directed source."""
    reverse_edges_added: int
    """Reverse edges stored that the source did not list itself (every added reverse when
    duplicates are kept). 0 for a directed source."""


def write_edges(layout: StoreWriter, staged: StagedEdges, store_id: np.ndarray, work: Path,
               chunk_edges: int, keep_duplicates: bool) -> EdgeCounts:
    """Group the staged edges by destination partition on disk, then, one destination
    partition at a time, sort them into buckets and merge duplicates.

    Returns the counts of the stored edges and of the merges (`EdgeCounts`).
    """
    p, size = layout.p, layout.partition_size
    with_rel = staged.rel_path is not None
    names = ["src", "dst", "rel"] if with_rel else ["src", "dst"]

    # Edges into each partition, known from staging: partition j's group starts at starts[j].
    in_count = staged.in_count
    if in_count is None:
        raise ValueError("staged edges lack in_count")  # EdgeStager always sets it
    per_partition = np.zeros(p, dtype=np.int64)
    for a in range(0, len(in_count), NODE_CHUNK):
        part_of = np.asarray(store_id[a : a + NODE_CHUNK]) // size
        per_partition += np.bincount(part_of, weights=in_count[a : a + NODE_CHUNK], minlength=p).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(per_partition)])
    scratch = {k: ScratchFile(str(work / f"grouped_{k}.i64"), np.int64) for k in names}
    try:
        # Pass 1: a counting-sort scatter by destination partition, in store ids.
        cursor = starts[:-1].copy()
        for start, src, dst, rel in staged.iter_chunks(chunk_edges):
            s, d = store_id[src], store_id[dst]
            added = staged.added_reverse(start, len(src))
            if added is not None:
                s = s | (added.astype(np.int64) << _ADDED_SHIFT)  # int64 whatever the index dtype
            part = d // size
            # A stable sort of small integers is a radix sort in numpy: O(m), not O(m log m).
            order = np.argsort(part.astype(np.uint16) if p <= 1 << 16 else part, kind="stable")
            counts = np.bincount(part, minlength=p)
            columns = {"src": s[order], "dst": d[order], "rel": None if rel is None else rel[order]}
            first = 0
            for j in np.flatnonzero(counts).tolist():
                stop = first + int(counts[j])
                for k in names:
                    scratch[k].write_rows(int(cursor[j]), columns[k][first:stop])
                cursor[j] += counts[j]
                first = stop
        for f in scratch.values():
            f.drop_cache()
        # Pass 2: per destination partition, sort by (src partition, dst, src[, rel]),
        # merge duplicates, append to the store.
        return _sort_groups_into_store(layout, scratch, starts, with_rel, keep_duplicates, work,
                                       with_added=staged.reverse_runs is not None)
    finally:
        for f in scratch.values():
            f.close(remove=True)


def _sort_group(s: np.ndarray, d: np.ndarray, r: np.ndarray | None, added: np.ndarray | None, *,
                first: int, size: int, n: int, keep_duplicates: bool,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Sort one destination partition's edges by (src partition, dst, src[, rel]) and, unless
    kept, drop repeats. [m] int64 each in, the same (shorter) out, with the group's
    `_merge_counts`. ``added`` ([m] bool or None) marks the reverse edges the converter added;
    it orders equal edges (source-given first) and so changes no stored edge.

    Without relations the three keys pack into one int64, ``(src // size, dst - first, src)``
    in mixed radix (src // size is implied by src, so ``(dst - first) * n + src`` with the
    partition on top), the added bit below them, and one sort beats a three-key lexsort by
    a wide margin.
    """
    if r is None and (n // size + 1) * size * n < 2**62:
        key = ((s // size) * size + (d - first)) * n + s
        if added is not None:
            key <<= 1  # < 2**63; in place, as the bit's cost is in memory passes
            key |= added
        key.sort()
        if added is not None:
            added = (key & 1).astype(bool)
            key >>= 1
        new = _first_of_runs(key)
        counts = _merge_counts(new, added, keep_duplicates)
        if not keep_duplicates:
            key = key[new]
        s = key % n
        d = (key // n) % size + first
        return s, d, None, counts
    keys = (s, d, s // size) if r is None else (r, s, d, s // size)
    order = np.lexsort(keys if added is None else (added, *keys))
    s, d = s[order], d[order]
    r = None if r is None else r[order]
    added = None if added is None else added[order]
    new = np.ones(len(s), dtype=bool)
    new[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    if r is not None:
        new[1:] |= r[1:] != r[:-1]
    counts = _merge_counts(new, added, keep_duplicates)
    if not keep_duplicates:
        s, d = s[new], d[new]
        r = None if r is None else r[new]
    return s, d, r, counts


def _first_of_runs(key: np.ndarray) -> np.ndarray:
    """[m] bool: True where a sorted ``key`` differs from the one before it."""
    new = np.ones(len(key), dtype=bool)
    np.not_equal(key[1:], key[:-1], out=new[1:])
    return new


def _merge_counts(new: np.ndarray, added: np.ndarray | None, keep_duplicates: bool) -> np.ndarray:
    """[4] int64 ``(duplicates, duplicates_merged, reverse_edges_present, reverse_edges_added)``
    of one sorted group (`EdgeCounts`).

    ``new`` ([m] bool) starts each run of equal edges; ``added`` ([m] bool or None) marks
    added reverse edges, after the source-given ones within a run. A run holds ``a`` source
    edges and ``b`` added ones: ``a - 1`` of them are duplicates when ``a > 0``; the run is a
    reverse the source had when ``a > 0 < b``, and a new reverse when ``a == 0``.
    """
    m = len(new)
    if added is None:
        duplicates, present, new_reverse, added_rows = m - int(np.count_nonzero(new)), 0, 0, 0
    else:
        given = ~added
        duplicates = int(np.count_nonzero(given)) - int(np.count_nonzero(new & given))
        # A run with both kinds has exactly one step from a source edge to an added one.
        present = int(np.count_nonzero(given[:-1] & added[1:] & ~new[1:]))
        new_reverse = int(np.count_nonzero(new & added))
        added_rows = m - int(np.count_nonzero(given))
    if keep_duplicates:
        return np.array([duplicates, 0, present, added_rows], dtype=np.int64)
    return np.array([duplicates, duplicates, present, new_reverse], dtype=np.int64)


def _sort_groups_into_store(layout: StoreWriter, scratch: dict[str, ScratchFile], starts: np.ndarray,
                            with_rel: bool, keep_duplicates: bool, work_dir: Path, *,
                            with_added: bool) -> EdgeCounts:
    p, size, n, idx = layout.p, layout.partition_size, layout.n, layout.idx
    total = int(starts[-1])
    out = {
        "src": ChunkedAppender(layout.array("edges/src", (total,), idx, (layout.edge_chunk,))),
        "dst": ChunkedAppender(layout.array("edges/dst", (total,), idx, (layout.edge_chunk,))),
    }
    if with_rel:
        out["rel"] = ChunkedAppender(layout.array("edges/rel", (total,), "int32", (layout.edge_chunk,)))
    in_degree = node_scratch(str(work_dir), "in_degree", n, np.int64)
    out_degree = node_scratch(str(work_dir), "out_degree", n, np.int64)
    offsets = np.zeros(p * p + 1, dtype=np.int64)
    stored = cut = 0
    merges = np.zeros(4, dtype=np.int64)
    for j in range(p):
        lo, count = int(starts[j]), int(starts[j + 1] - starts[j])
        s = scratch["src"].read_rows(lo, count)
        d = scratch["dst"].read_rows(lo, count)
        r = scratch["rel"].read_rows(lo, count) if with_rel else None
        added = None
        if with_added:
            added = s >= _ADDED
            s &= _ADDED - 1
        s, d, r, counts = _sort_group(s, d, r, added, first=j * size, size=size, n=n,
                                      keep_duplicates=keep_duplicates)
        merges += counts
        bucket_sizes = np.bincount(s // size, minlength=p)
        offsets[j * p + 1 : (j + 1) * p + 1] = stored + np.cumsum(bucket_sizes)
        stored += len(s)
        cut += len(s) - int(bucket_sizes[j])
        first = j * size
        in_degree[first : first + size] += np.bincount(d - first, minlength=min(size, n - first))
        np.add.at(out_degree, s, 1)  # unbuffered: a source repeats within the group
        out["src"].append(s.astype(idx))
        out["dst"].append(d.astype(idx))
        if r is not None:
            out["rel"].append(r.astype(np.int32))
    for appender in out.values():
        appender.finish()
    layout.node_array("nodes/in_degree", in_degree)
    layout.node_array("nodes/out_degree", out_degree)
    offsets_arr = layout.array("edges/bucket_offsets", (p * p + 1,), "int64", ((4 << 20) // 8,))
    offsets_arr[...] = offsets
    duplicates, merged, present, reverse_added = (int(c) for c in merges)
    return EdgeCounts(num_edges=stored, cut_edges=cut, duplicates=duplicates, duplicates_merged=merged,
                      reverse_edges_present=present, reverse_edges_added=reverse_added)
