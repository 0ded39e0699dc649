"""Edges into buckets: the staged edges, mapped to store ids, grouped by destination
partition on disk, then sorted into (src partition, dst, src) order one destination
partition at a time, with duplicates merged.

Two implementations write the same bytes. The C one (`graphstore.layout._native.edges`)
packs each edge into one 64-bit key, groups the keys by destination partition into one
scratch file, and radix sorts and merges each destination partition's keys, on worker
threads that hold no GIL (`_write_edges_native`). numpy does the same in columns
(`_write_edges_numpy`), when the kernel is not built or a key would not fit in 64 bits.

Every staged edge carries one bit from staging to the merge: given by the source, or a
reverse edge the converter added to an undirected source. Equal edges merge whatever their
bits (the stored edges do not depend on them); the bits only let the counts tell a source
that repeats an edge from a source that already lists both directions (`EdgeCounts`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphstore.layout._arrays import ChunkedAppender
from graphstore.layout._native import edges as native
from graphstore.layout._staging import NODE_CHUNK, ScratchFile, StagedEdges, node_scratch
from graphstore.layout._writer import StoreWriter

__all__ = ["EdgeCounts", "write_edges"]

log = logging.getLogger(__name__)

_ADDED_SHIFT = 62
_ADDED = np.int64(1 << _ADDED_SHIFT)
"""The added-reverse bit, carried above the store id in the grouped scratch files."""
MAX_WORKERS = 4
"""Threads of the C edge phase at most; each packs a chunk or sorts a partition without the GIL."""


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
               chunk_edges: int, keep_duplicates: bool, *, consume: bool = False) -> EdgeCounts:
    """Group the staged edges by destination partition on disk, then, one destination
    partition at a time, sort them into buckets and merge duplicates.

    ``consume`` removes the staged files once they are grouped, before the store's edges
    are written: the conversion reads them no more, and at 2**31 stored edges they are
    16 GB of disk that would otherwise sit beside the grouped copy and the growing store.

    Returns the counts of the stored edges and of the merges (`EdgeCounts`).
    """
    p, size = layout.p, layout.partition_size
    # Edges into each partition, known from staging: partition j's group starts at starts[j].
    in_count = staged.in_count
    if in_count is None:
        raise ValueError("staged edges lack in_count")  # EdgeStager always sets it
    per_partition = np.zeros(p, dtype=np.int64)
    for a in range(0, len(in_count), NODE_CHUNK):
        part_of = np.asarray(store_id[a : a + NODE_CHUNK]) // size
        per_partition += np.bincount(part_of, weights=in_count[a : a + NODE_CHUNK], minlength=p).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(per_partition)])
    keys = _key_fields(layout, staged, store_id)
    if keys is not None:
        return _write_edges_native(layout, staged, store_id, work, chunk_edges, keep_duplicates, starts, keys,
                                   consume)
    return _write_edges_numpy(layout, staged, store_id, work, chunk_edges, keep_duplicates, starts, consume)


def _remove_staged(staged: StagedEdges) -> None:
    """Unlink the staged edge files (an open descriptor keeps its file until closed)."""
    for path in (staged.src_path, staged.dst_path, staged.rel_path):
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@dataclass(frozen=True, slots=True)
class _KeyFields:
    """Bit widths of the C path's packed key (the layout is drawn in edges.c)."""

    b: int
    """Bits of a node's offset in its partition (``d % size``, ``s % size``)."""
    rel_bits: int
    """Bits of a relation id (0 without relations)."""
    key_bits: int
    """All of them: source partition, two offsets, relation, the added bit."""


def _key_fields(layout: StoreWriter, staged: StagedEdges, store_id: np.ndarray) -> _KeyFields | None:
    """The key layout when the C path can run: the kernel is built, the id map is a plain
    int32/int64 array, and a key fits in 64 bits; else None (numpy)."""
    if native.library() is None:
        return None
    if not (isinstance(store_id, np.ndarray) and store_id.dtype in (np.int32, np.int64)
            and store_id.flags.c_contiguous and layout.n < 1 << 52):
        return None
    with_rel = staged.rel_path is not None
    if with_rel and staged.max_rel is None:
        return None
    b = (layout.partition_size - 1).bit_length()
    rel_bits = int(staged.max_rel).bit_length() if with_rel else 0
    key_bits = (layout.p - 1).bit_length() + 2 * b + rel_bits + 1
    return _KeyFields(b, rel_bits, key_bits) if key_bits <= 64 else None


def _workers() -> int:
    """Threads for the C path: the cores this process may use, up to `MAX_WORKERS`; one when
    the kernel's out-degree adds are not atomic."""
    if not native.threadsafe():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cores))


def _in_order(pool: ThreadPoolExecutor, tasks: Iterable[tuple[Callable[[], object], int]], *,
              most: int, budget: int) -> Iterator[object]:
    """Run ``(task, weight)`` pairs on ``pool`` and yield their results in order, with at most
    ``most`` tasks and ``budget`` weight (edges, so bytes) in flight, one task always allowed.

    Results come back in submission order so the store is written in partition order; the
    bound keeps conversion memory set by the chunk settings, whatever the thread count.
    """
    pending: deque[tuple[Future, int]] = deque()
    weight = 0
    try:
        for task, w in tasks:
            while pending and (len(pending) >= most or weight + w > budget):
                future, done_w = pending.popleft()
                weight -= done_w
                yield future.result()
            pending.append((pool.submit(task), w))
            weight += w
        while pending:
            future, done_w = pending.popleft()
            weight -= done_w
            yield future.result()
    finally:
        for future, _ in pending:
            future.cancel()


def _write_edges_native(layout: StoreWriter, staged: StagedEdges, store_id: np.ndarray, work: Path,
                        chunk_edges: int, keep_duplicates: bool, starts: np.ndarray, keys: _KeyFields,
                        consume: bool) -> EdgeCounts:
    """`write_edges` through the C kernel: pass 1 packs chunks of staged edges into keys
    grouped by destination partition (one scratch file of 8 bytes an edge), pass 2 sorts and
    merges each destination partition's keys; both on `_workers` threads."""
    p, size = layout.p, layout.partition_size
    with_rel = staged.rel_path is not None
    workers = _workers()
    chunk = max(1, chunk_edges)
    paths = [staged.src_path, staged.dst_path] + ([staged.rel_path] if with_rel else [])
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    grouped = ScratchFile(str(work / "grouped_keys.u64"), np.uint64)
    try:
        staged_fds = (fds[0], fds[1], fds[2] if with_rel else -1)
        names = dict(zip(fds, paths, strict=True))
        runs = np.ascontiguousarray(staged.reverse_runs if staged.reverse_runs is not None
                                    else np.zeros((0, 2)), dtype=np.int64)

        def pack(start: int, count: int) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
            return lambda: native.pack_chunk(staged_fds, names, start, count, runs, store_id,
                                             staged_bytes=staged.id_bytes, size=size, p=p, b=keys.b,
                                             rel_bits=keys.rel_bits)

        # Pass 1: workers pack chunks; this thread appends each chunk's groups at the
        # partitions' cursors, in chunk order, while the next chunks are packed.
        t0 = time.perf_counter()
        cursor = starts[:-1].copy()
        chunks = ((pack(a, min(chunk, staged.num_edges - a)), 1) for a in range(0, staged.num_edges, chunk))
        with ThreadPoolExecutor(workers, thread_name_prefix="gs-edges") as pool:
            with contextlib.closing(_in_order(pool, chunks, most=workers + 1, budget=workers + 1)) as results:
                for packed, counts in results:
                    native.write_groups(grouped.fileno(), grouped.path, packed, counts, cursor)
                    grouped.note_written(packed.nbytes)
            grouped.drop_cache()
            if consume:
                for fd in fds:
                    os.close(fd)
                fds = []
                _remove_staged(staged)
            t1 = time.perf_counter()
            # Pass 2: per destination partition, sort, merge, decode, count; appended in order.
            result = _sort_keys_into_store(layout, pool, grouped, starts, keys, with_rel=with_rel,
                                           keep_duplicates=keep_duplicates, work_dir=work,
                                           budget=2 * chunk, most=2 * workers + 2)
        log.debug("edges in C on %d threads: %d staged edges grouped in %.2f s, sorted and stored in %.2f s",
                  workers, staged.num_edges, t1 - t0, time.perf_counter() - t1)
        return result
    finally:
        grouped.close(remove=True)
        for fd in fds:
            os.close(fd)


def _sort_keys_into_store(layout: StoreWriter, pool: ThreadPoolExecutor, grouped: ScratchFile, starts: np.ndarray,
                          keys: _KeyFields, *, with_rel: bool, keep_duplicates: bool, work_dir: Path, budget: int,
                          most: int) -> EdgeCounts:
    p, size, n, idx = layout.p, layout.partition_size, layout.n, np.dtype(layout.idx)
    out = _edge_appenders(layout, int(starts[-1]), with_rel)
    in_degree = node_scratch(str(work_dir), "in_degree", n, np.int64)
    out_degree = node_scratch(str(work_dir), "out_degree", n, np.int64)
    fd = grouped.fileno()

    def sort(j: int, count: int) -> Callable[[], tuple]:
        first = j * size
        if count == 0:
            return lambda: None
        # Start reading the group now, so the disk works while earlier groups are sorted.
        if _HAS_FADVISE:
            os.posix_fadvise(fd, int(starts[j]) * 8, count * 8, os.POSIX_FADV_WILLNEED)
        return lambda: native.sort_group(fd, grouped.path, int(starts[j]), count, key_bits=keys.key_bits,
                                         size=size, first=first, b=keys.b, rel_bits=keys.rel_bits,
                                         with_rel=with_rel, keep_duplicates=keep_duplicates, idx=idx, p=p,
                                         in_degree=in_degree[first : first + size], out_degree=out_degree)

    offsets = np.zeros(p * p + 1, dtype=np.int64)
    stored = cut = 0
    merges = np.zeros(4, dtype=np.int64)
    counts = np.diff(starts)
    tasks = ((sort(j, int(counts[j])), int(counts[j])) for j in range(p))
    with contextlib.closing(_in_order(pool, tasks, most=most, budget=budget)) as results:
        for j, result in enumerate(results):
            if result is None:
                offsets[j * p + 1 : (j + 1) * p + 1] = stored
                continue
            s, d, r, bucket_sizes, merge = result
            merges += merge
            offsets[j * p + 1 : (j + 1) * p + 1] = stored + np.cumsum(bucket_sizes)
            stored += len(s)
            cut += len(s) - int(bucket_sizes[j])
            out["src"].append(s)
            out["dst"].append(d)
            if r is not None:
                out["rel"].append(r)
    return _finish_store(layout, out, in_degree, out_degree, offsets, stored, cut, merges)


def _edge_appenders(layout: StoreWriter, total: int, with_rel: bool) -> dict[str, ChunkedAppender]:
    out = {
        "src": ChunkedAppender(layout.array("edges/src", (total,), layout.idx, (layout.edge_chunk,))),
        "dst": ChunkedAppender(layout.array("edges/dst", (total,), layout.idx, (layout.edge_chunk,))),
    }
    if with_rel:
        out["rel"] = ChunkedAppender(layout.array("edges/rel", (total,), "int32", (layout.edge_chunk,)))
    return out


def _finish_store(layout: StoreWriter, out: dict[str, ChunkedAppender], in_degree: np.ndarray,
                  out_degree: np.ndarray, offsets: np.ndarray, stored: int, cut: int, merges: np.ndarray
                  ) -> EdgeCounts:
    for appender in out.values():
        appender.finish()
    layout.node_array("nodes/in_degree", in_degree)
    layout.node_array("nodes/out_degree", out_degree)
    offsets_arr = layout.array("edges/bucket_offsets", (len(offsets),), "int64", ((4 << 20) // 8,))
    offsets_arr[...] = offsets
    duplicates, merged, present, reverse_added = (int(c) for c in merges)
    return EdgeCounts(num_edges=stored, cut_edges=cut, duplicates=duplicates, duplicates_merged=merged,
                      reverse_edges_present=present, reverse_edges_added=reverse_added)


_HAS_FADVISE = hasattr(os, "posix_fadvise")


def _write_edges_numpy(layout: StoreWriter, staged: StagedEdges, store_id: np.ndarray, work: Path,
                       chunk_edges: int, keep_duplicates: bool, starts: np.ndarray, consume: bool) -> EdgeCounts:
    """`write_edges` in numpy: the same bytes as the C path, in columns of int64."""
    p, size = layout.p, layout.partition_size
    with_rel = staged.rel_path is not None
    names = ["src", "dst", "rel"] if with_rel else ["src", "dst"]
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
        if consume:
            _remove_staged(staged)
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
    out = _edge_appenders(layout, int(starts[-1]), with_rel)
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
        # max(0, ...): when size * (p - 1) >= n the last partitions hold no node at all.
        in_degree[first : first + size] += np.bincount(d - first, minlength=max(0, min(size, n - first)))
        np.add.at(out_degree, s, 1)  # unbuffered: a source repeats within the group
        out["src"].append(s.astype(idx))
        out["dst"].append(d.astype(idx))
        if r is not None:
            out["rel"].append(r.astype(np.int32))
    return _finish_store(layout, out, in_degree, out_degree, offsets, stored, cut, merges)
