"""Reading a set of rows scattered over an array, a few KiB per row, verified.

`ChunkReader` reads row *ranges*: a partition, an edge bucket. The macro-batch scheme asks
for *sets*: the sorted union of some mini-batches' input nodes, spread over the whole graph.
Reading the whole chunk of every row asked for would read the graph's features over and
over; reading row by row would send one request per row. `read_row_set` reads the feature
*blocks* that hold the rows (a block is about 4 KiB: `graphstore.layout._segments`), with
runs of neighbouring blocks in one request, checks every block it read against its crc32c,
and copies the rows out.

How::

    ids (sorted, distinct)  -> the blocks holding them (one searchsorted over the bounds)
    blocks                  -> runs: consecutive blocks, and blocks at most MERGE_GAP_BYTES
                               apart, of the same chunk file (the gap is read too: one
                               request is cheaper than two on an SSD)
    runs                    -> groups of at most PIECE_BYTES, one per worker task: each
                               reads its runs into a scratch buffer (buffered ``pread``,
                               readahead off), checks each block, copies its rows to ``out``

Everything per row or per block is numpy; a group's reads and checks are one call of a small
C reader (`graphstore.layout._native`) that holds no GIL, so the worker threads keep several
requests in flight (in Python, the per-request and per-block calls held them to about one:
~30k requests/s). Without the compiled reader the same work runs in Python. Buffered reads,
not ``O_DIRECT``: a block starts at a multiple of the row size, not of 4096 bytes. The pages read are dropped when the call ends (a cgroup memory cap
counts the page cache, and the next macro-batch should not find the rows there).

Dense sets: where a chunk holds so many of the rows that its block requests would take
longer than reading the chunk file whole, it is read whole instead, through `ChunkReader`
(``O_DIRECT`` in large requests, at the disk's sequential bandwidth; its crc32c checked; no
pages left in the page cache). The choice is per chunk, by a cost model (`_whole_chunks`):
a scattered read costs REQUEST_SECONDS per request plus its bytes at
SCATTERED_BYTES_PER_S, a whole chunk its file's bytes at WHOLE_BYTES_PER_S. Sparse sets
stay scattered: a macro-batch of 32 MiB of 1 KiB rows (1.5 % of a 2 GiB array's rows, one
in ~4 of its blocks) still is; from about 5 % of the rows of a chunk on it is read whole
(measured: 7 % as fast, at a third of the CPU; 30 % 1.4x faster).

A store whose features table is per partition (older stores) has no blocks: its rows are
read as whole chunks through `ChunkReader`, verified by the chunks' checksums, and the
reader warns once that `graphstore upgrade` makes the reads finer.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import crc32c
import numpy as np

from graphstore.errors import CorruptStoreError
from graphstore.layout import _native as native
from graphstore.layout._chunkio import ArrayLayout, aligned_empty, shared_reader

__all__ = ["MERGE_GAP_BYTES", "PIECE_BYTES", "REQUEST_SECONDS", "RowSetStats", "SCATTERED_BYTES_PER_S",
           "WHOLE_BYTES_PER_S", "read_row_set"]

MERGE_GAP_BYTES = 16 << 10
"""Two runs of blocks closer than this (in one file) are read as one request. Measured on the
development machine's SSD (cold, 4 threads): 33,000 rows scattered over 3.5 GiB took 1.06 s
as 31,000 requests (133 MB), 1.25 s merging gaps under 8 KiB and 1.11 s under 64 KiB (569
MB); 600,000 rows took 7.7, 4.5 and 3.7 s. Time varies little and bytes by 4x, and under a
memory cap bytes read are page cache to reclaim: a small gap, above one 4 KiB block."""
PIECE_BYTES = 1 << 20
"""Most bytes one worker task reads into its scratch buffer before copying rows out (a run
alone may be longer; at densities where runs get long, `_whole_chunks` reads chunks whole)."""
WHOLE_CHUNK_RUN_BYTES = 64 << 20
"""Most bytes one request of the whole-chunk fallback reads."""
REQUEST_SECONDS = 30e-6
"""Cost model (`_whole_chunks`): wall seconds one scattered request adds with THREADS in
flight. SCATTERED_BYTES_PER_S: the bandwidth of the bytes those requests read.
WHOLE_BYTES_PER_S: the bandwidth of whole chunk files read by `ChunkReader` (O_DIRECT,
4 MiB+ requests). Fitted on the development machine's virtio SSD (cold cache, loaded
machine, 2.1M rows of 1 KiB in 8 MiB chunks, 16 threads): 31,200 requests of 36 KB (1.12
GB) took 1.9 s, 1,250 requests of 1.6 MB (2.06 GB) 1.7-2.3 s, i.e. ~1.1 GB/s and ~30 us
per request; ``dd iflag=direct bs=4M`` and whole 8 MiB chunks read at 1.3-1.9 GB/s. So an
8 MiB chunk is read whole once its blocks need more than ~4 MB in ~70 requests (about 4 %
of its rows asked for, at random)."""
SCATTERED_BYTES_PER_S = 1.1e9
WHOLE_BYTES_PER_S = 1.4e9
WHOLE_CHUNK_BATCH = 4
"""Chunks read whole per `ChunkReader` call (one each for its 4 threads): the scratch they
share is this many chunks (32 MiB of 8 MiB chunks)."""
THREADS = 64
"""Worker threads, each with one request in flight. Measured with the C reader on the
development machine's SSD (cold, 33,000 rows scattered over 3.5 GiB, ~27,000 requests):
33k requests/s with 4 threads, 45k with 8, 49k with 16, 60k with 64; 600,000 rows (15,000
longer requests) reach the disk's sequential bandwidth from 8 threads on. Again for a
macro-batch's rows (32,600 of 2.1M rows of 1 KiB, 23,000 requests, 195 MB; cold, loaded
machine, median of 4): 0.61 s with 16 threads, 0.49 s with 64 (0.57 s with 64 and 256 KiB
pieces: more tasks, more CPU). 64 tasks hold at most 64 MiB of scratch."""


@dataclass
class RowSetStats:
    """What one or more `read_row_set` calls read."""

    rows: int = 0
    """Rows asked for."""
    blocks: int = 0
    """Blocks (or whole chunks, without blocks) read and verified."""
    requests: int = 0
    """Read requests issued (runs of blocks)."""
    bytes_read: int = 0
    """Bytes read from the files."""
    seconds: float = 0.0

    def add(self, other: RowSetStats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_warned: set[str] = set()


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="graphstore-rowset")
        return _pool


def _after_fork_in_child() -> None:
    # A fork copies the pool without its threads (a task submitted there never runs) and the
    # lock as it was (held, if a parent thread was in `_workers`): the child starts afresh.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def read_row_set(layout: ArrayLayout, ids: np.ndarray, out: np.ndarray) -> RowSetStats:
    """Fill ``out[i]`` with row ``ids[i]`` of ``layout``'s array; ``ids`` ascending, distinct.

    Raises
    ------
    CorruptStoreError
        A chunk file is missing or short, or a block (a chunk, without blocks) fails its
        checksum; the message names the array, the block, its rows and the file.
    """
    t0 = time.perf_counter()
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or out.shape[0] != ids.size or out.dtype != layout.dtype or not out.flags.c_contiguous:
        raise ValueError(f"{layout.name}: out must be C-contiguous {layout.dtype} with one row per id")
    if ids.size and (ids[0] < 0 or ids[-1] >= layout.shape[0] or np.any(np.diff(ids) <= 0)):
        raise ValueError(f"{layout.name}: ids must be ascending, distinct and in [0, {layout.shape[0]})")
    table = layout.segments
    if ids.size == 0:
        stats = RowSetStats()
    elif layout.fast and layout.checksum and table is not None and table.kind == "blocks":
        stats = _read_blocks(layout, ids, out)
    else:
        if layout.name not in _warned:
            _warned.add(layout.name)
            warnings.warn(f"{layout.where}: {layout.name} has no block checksums; scattered rows are read "
                          "as whole chunks (run `graphstore upgrade` to read only their blocks)", stacklevel=3)
        stats = _read_whole_chunks(layout, ids, out)
    stats.rows = int(ids.size)
    stats.seconds = time.perf_counter() - t0
    return stats


# ---------------------------------------------------------------------- blocks


@dataclass(frozen=True, slots=True)
class _Runs:
    """Runs of blocks to read: run k is blocks ``[first[k], last[k]]`` of one chunk."""

    first: np.ndarray
    last: np.ndarray
    row_lo: np.ndarray
    """First row of each run."""
    row_hi: np.ndarray
    """One past its last row."""


def _plan_runs(layout: ArrayLayout, ids: np.ndarray) -> _Runs:
    bounds, R, rb = layout.segments.bounds, layout.chunk_rows, layout.row_bytes
    of_id = np.searchsorted(bounds, ids, side="right") - 1
    keep = np.ones(of_id.size, dtype=bool)
    keep[1:] = of_id[1:] != of_id[:-1]
    blocks = of_id[keep]
    lo, hi = bounds[blocks], bounds[blocks + 1]
    # A new run where the gap from the previous block is too wide or the chunk changes.
    new = np.ones(blocks.size, dtype=bool)
    new[1:] = ((lo[1:] - hi[:-1]) * rb > MERGE_GAP_BYTES) | (lo[1:] // R != (hi[:-1] - 1) // R)
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], blocks.size) - 1
    return _Runs(blocks[starts], blocks[ends], lo[starts], hi[ends])


def _whole_chunks(layout: ArrayLayout, runs: _Runs) -> np.ndarray:
    """The chunks (ascending) cheaper to read whole than as their runs of blocks, by the cost
    model of REQUEST_SECONDS, SCATTERED_BYTES_PER_S and WHOLE_BYTES_PER_S."""
    if WHOLE_BYTES_PER_S <= 0:
        return np.empty(0, dtype=np.int64)
    chunk = runs.row_lo // layout.chunk_rows
    requests = np.bincount(chunk)
    scattered_bytes = np.bincount(chunk, weights=(runs.row_hi - runs.row_lo) * layout.row_bytes)
    scattered = requests * REQUEST_SECONDS + scattered_bytes / SCATTERED_BYTES_PER_S
    return np.flatnonzero(scattered > layout.file_bytes / WHOLE_BYTES_PER_S)


def _read_blocks(layout: ArrayLayout, ids: np.ndarray, out: np.ndarray) -> RowSetStats:
    runs = _plan_runs(layout, ids)
    whole = _whole_chunks(layout, runs)
    if whole.size:
        keep = ~np.isin(runs.row_lo // layout.chunk_rows, whole)
        runs = _Runs(runs.first[keep], runs.last[keep], runs.row_lo[keep], runs.row_hi[keep])
    rb = layout.row_bytes
    # Groups of consecutive runs of at most PIECE_BYTES (a run alone may be larger).
    run_bytes = (runs.row_hi - runs.row_lo) * rb
    group_of = (np.cumsum(run_bytes) - run_bytes) // PIECE_BYTES
    cuts = np.flatnonzero(np.diff(group_of)) + 1
    groups = np.split(np.arange(runs.first.size), cuts) if runs.first.size else []
    files = _Files(layout)
    futures = []
    first_error = None
    stats = RowSetStats(blocks=int((runs.last - runs.first + 1).sum()), requests=int(runs.first.size),
                        bytes_read=int(run_bytes.sum()))
    try:
        futures = [_workers().submit(_read_group, layout, runs, g, ids, out, files) for g in groups]
        # The whole chunks are read here (by the ChunkReader's threads) while the workers
        # read the blocks: both kinds of request in flight together.
        stats.add(_read_chunks(layout, whole, ids, out))
    except BaseException as e:  # noqa: BLE001 (re-raised below, once the workers are done)
        first_error = e
    finally:
        for f in futures:  # wait for every task: none may write into ``out`` after we return
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 (the first one is re-raised below)
                first_error = first_error or e
        files.close()
    if first_error is not None:
        raise first_error
    return stats


def _read_chunks(layout: ArrayLayout, chunks: np.ndarray, ids: np.ndarray, out: np.ndarray) -> RowSetStats:
    """The rows of ``ids`` in ``chunks`` (ascending), each chunk read whole and verified by
    `ChunkReader` (O_DIRECT into an aligned scratch of WHOLE_CHUNK_BATCH chunks)."""
    stats = RowSetStats()
    if chunks.size == 0:
        return stats
    n, R = layout.shape[0], layout.chunk_rows
    batch = min(WHOLE_CHUNK_BATCH, int(chunks.size))
    scratch = aligned_empty((batch * R, *layout.shape[1:]), layout.dtype)
    for k in range(0, chunks.size, batch):
        mine = chunks[k : k + batch]
        starts = mine * R
        stops = np.minimum(starts + R, n)
        requests = [(layout, int(a), int(b), scratch[j * R : j * R + int(b - a)])
                    for j, (a, b) in enumerate(zip(starts, stops))]
        read = shared_reader().read_into(requests)
        i = np.searchsorted(ids, starts)
        j = np.searchsorted(ids, stops)
        # Row ids[t] of chunk c sits at (c's slot) * R + ids[t] - c * R of the scratch.
        slot = np.repeat(np.arange(mine.size), j - i)
        take = np.concatenate([np.arange(a, b) for a, b in zip(i, j)]) if mine.size > 1 else np.arange(i[0], j[0])
        out[take] = scratch[slot * R + ids[take] - starts[slot]]
        stats.blocks += int(mine.size)
        stats.requests += read.file_reads
        stats.bytes_read += read.bytes_read
    return stats


def _read_group(layout: ArrayLayout, runs: _Runs, group: np.ndarray, ids: np.ndarray, out: np.ndarray,
                files: _Files) -> None:
    lo, hi = runs.row_lo[group], runs.row_hi[group]
    offsets = np.cumsum(hi - lo) - (hi - lo)  # each run's first row in the scratch buffer
    scratch = np.empty((int((hi - lo).sum()), *layout.shape[1:]), dtype=layout.dtype)
    if native.library() is not None:
        _read_group_native(layout, runs, group, lo, hi, offsets, scratch, files)
    else:
        _read_group_python(layout, runs, group, lo, hi, offsets, scratch, files)
    # The rows asked for that these runs hold: where each sits in the scratch buffer. Between
    # two runs of a group may lie chunks read whole (`_read_chunks`): their rows are not here.
    i0, i1 = np.searchsorted(ids, [lo[0], hi[-1]])
    mine = ids[i0:i1]
    run = np.searchsorted(lo, mine, side="right") - 1
    held = mine < hi[run]
    if held.all():
        out[i0:i1] = scratch[offsets[run] + mine - lo[run]]
    else:
        at = np.flatnonzero(held)
        out[i0 + at] = scratch[offsets[run[at]] + mine[at] - lo[run[at]]]


def _read_group_native(layout: ArrayLayout, runs: _Runs, group: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                       offsets: np.ndarray, scratch: np.ndarray, files: _Files) -> None:
    """The group's reads and checks in one call of the C reader (the GIL released)."""
    rb, R, table = layout.row_bytes, layout.chunk_rows, layout.segments
    chunk = lo // R
    chunks, which = np.unique(chunk, return_inverse=True)
    fds = np.array([files.fd(int(c)) for c in chunks], dtype=np.int32)[which]
    first, last = runs.first[group], runs.last[group]
    count = last - first + 1
    run_of_block = np.repeat(np.arange(group.size), count)
    blocks = first[run_of_block] + np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    a, b = table.bounds[blocks], table.bounds[blocks + 1]
    try:
        native.read_runs(fds, (lo - chunk * R) * rb, (hi - lo) * rb, offsets * rb, scratch,
                         (offsets[run_of_block] + a - lo[run_of_block]) * rb, (b - a) * rb, table.crcs[blocks])
    except native.GroupError as e:
        if e.kind == "crc":
            s, c = int(blocks[e.index]), int(chunk[run_of_block[e.index]])
            raise CorruptStoreError(
                f"{layout.where}: {layout.name} {table.describe(s)} (rows [{int(a[e.index])}, {int(b[e.index])}), "
                f"{layout.chunk_path(c)}): checksum mismatch "
                f"(stored {int(table.crcs[s]):#010x}, computed {e.got:#010x})") from None
        c, r0 = int(chunk[e.index]), int(lo[e.index])
        span = f"bytes [{(r0 - c * R) * rb}, {(int(hi[e.index]) - c * R) * rb})"
        if e.kind == "short":
            raise CorruptStoreError(f"{layout.where}: {layout.name} chunk file {layout.chunk_path(c)} is short "
                                    f"(wanted {span})") from None
        raise OSError(e.errno, f"{layout.name}: reading {span} of {layout.chunk_path(c)}: "
                               f"{os.strerror(e.errno)}") from None


def _read_group_python(layout: ArrayLayout, runs: _Runs, group: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                       offsets: np.ndarray, scratch: np.ndarray, files: _Files) -> None:
    """The same reads and checks as `_read_group_native`, a request and a checksum call at a
    time (when the C reader is not built)."""
    rb, R, table = layout.row_bytes, layout.chunk_rows, layout.segments
    data = memoryview(scratch.reshape(-1)).cast("B")
    for k, run in enumerate(group):
        r0, r1 = int(lo[k]), int(hi[k])
        chunk = r0 // R
        view = data[int(offsets[k]) * rb : (int(offsets[k]) + r1 - r0) * rb]
        _pread_exactly(files.fd(chunk), view, (r0 - chunk * R) * rb, layout, chunk)
        for s in range(int(runs.first[run]), int(runs.last[run]) + 1):
            a, b = int(table.bounds[s]), int(table.bounds[s + 1])
            crc = crc32c.crc32c(view[(a - r0) * rb : (b - r0) * rb])
            if crc != int(table.crcs[s]):
                raise CorruptStoreError(
                    f"{layout.where}: {layout.name} {table.describe(s)} (rows [{a}, {b}), "
                    f"{layout.chunk_path(chunk)}): checksum mismatch "
                    f"(stored {int(table.crcs[s]):#010x}, computed {crc:#010x})")


def _pread_exactly(fd: int, view: memoryview, offset: int, layout: ArrayLayout, chunk: int) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise CorruptStoreError(f"{layout.where}: {layout.name} chunk file {layout.chunk_path(chunk)} is "
                                    f"short (wanted bytes [{offset}, {offset + len(view)}))")
        done += got


class _Files:
    """The chunk files one call reads, opened once each (readahead off), their pages
    dropped and descriptors closed at the end."""

    def __init__(self, layout: ArrayLayout) -> None:
        self.layout = layout
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def fd(self, chunk: int) -> int:
        with self._lock:
            fd = self._fds.get(chunk)
            if fd is None:
                path = self.layout.chunk_path(chunk)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptStoreError(f"{self.layout.where}: {self.layout.name} chunk file {path} "
                                            "is missing") from None
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self._fds[chunk] = fd
            return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            self._fds.clear()


# ---------------------------------------------------------------------- whole chunks


def _read_whole_chunks(layout: ArrayLayout, ids: np.ndarray, out: np.ndarray) -> RowSetStats:
    """Every chunk holding a row, read whole (its crc32c checked), runs of consecutive chunks
    in requests of at most WHOLE_CHUNK_RUN_BYTES."""
    n, R = layout.shape[0], layout.chunk_rows
    chunks = np.unique(ids // R)
    per_request = max(1, WHOLE_CHUNK_RUN_BYTES // max(1, R * layout.row_bytes))
    stats = RowSetStats(blocks=int(chunks.size))
    for run in np.split(chunks, np.flatnonzero(np.diff(chunks) != 1) + 1):
        for k in range(0, run.size, per_request):
            first, last = int(run[k]), int(run[min(k + per_request, run.size) - 1])
            start, stop = first * R, min((last + 1) * R, n)
            block, _ = shared_reader().read(layout, start, stop)
            i, j = np.searchsorted(ids, [start, stop])
            out[i:j] = block[ids[i:j] - start]
            stats.requests += 1
            stats.bytes_read += block.nbytes
    return stats
