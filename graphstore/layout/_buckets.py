"""Edges into buckets: the staged edges, mapped to store ids, grouped by destination
partition on disk, then sorted into (src partition, dst, src) order one destination
partition at a time, with duplicates merged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphstore.layout._arrays import ChunkedAppender
from graphstore.layout._staging import NODE_CHUNK, ScratchFile, StagedEdges, node_scratch
from graphstore.layout._writer import StoreWriter

__all__ = ["write_edges"]


def write_edges(layout: StoreWriter, staged: StagedEdges, store_id: np.ndarray, work: Path,
               chunk_edges: int, keep_duplicates: bool) -> tuple[int, int]:
    """Group the staged edges by destination partition on disk, then, one destination
    partition at a time, sort them into buckets and merge duplicates.

    Returns ``(num_edges, cut_edges)`` of the stored edges.
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
        for _, src, dst, rel in staged.iter_chunks(chunk_edges):
            s, d = store_id[src], store_id[dst]
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
        return _sort_groups_into_store(layout, scratch, starts, with_rel, keep_duplicates, work)
    finally:
        for f in scratch.values():
            f.close(remove=True)


def _sort_group(s: np.ndarray, d: np.ndarray, r: np.ndarray | None, *, first: int, size: int, n: int,
                keep_duplicates: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sort one destination partition's edges by (src partition, dst, src[, rel]) and, unless
    kept, drop repeats. [m] int64 each in, the same (shorter) out.

    Without relations the three keys pack into one int64, ``(src // size, dst - first, src)``
    in mixed radix (src // size is implied by src, so ``(dst - first) * n + src`` with the
    partition on top), and one sort beats a three-key lexsort by a wide margin.
    """
    if r is None and (n // size + 1) * size * n < 2**62:
        key = ((s // size) * size + (d - first)) * n + s
        key.sort()
        if not keep_duplicates and len(key) > 1:
            key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        s = key % n
        d = (key // n) % size + first
        return s, d, None
    order = np.lexsort((s, d, s // size) if r is None else (r, s, d, s // size))
    s, d = s[order], d[order]
    r = None if r is None else r[order]
    if not keep_duplicates and len(s) > 1:
        new = np.ones(len(s), dtype=bool)
        new[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
        if r is not None:
            new[1:] |= r[1:] != r[:-1]
        s, d = s[new], d[new]
        r = None if r is None else r[new]
    return s, d, r


def _sort_groups_into_store(layout: StoreWriter, scratch: dict[str, ScratchFile], starts: np.ndarray,
                            with_rel: bool, keep_duplicates: bool, work_dir: Path) -> tuple[int, int]:
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
    for j in range(p):
        lo, count = int(starts[j]), int(starts[j + 1] - starts[j])
        s = scratch["src"].read_rows(lo, count)
        d = scratch["dst"].read_rows(lo, count)
        r = scratch["rel"].read_rows(lo, count) if with_rel else None
        s, d, r = _sort_group(s, d, r, first=j * size, size=size, n=n, keep_duplicates=keep_duplicates)
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
    return stored, cut
