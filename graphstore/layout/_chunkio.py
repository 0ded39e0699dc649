"""Reading row ranges of the store's own arrays straight from their chunk files.

zarr 3.1 reads one chunk at a time on one thread, decodes it into a temporary buffer and
copies it into the result, and a request for a few rows still reads and checksums the whole
chunk. For the store's uncompressed arrays none of that is needed: a chunk file is the
chunk's rows in C order, little endian, followed by a 4-byte checksum, so a row range is a
byte range of one file per chunk. `ChunkReader` reads those byte ranges with several
``preadv`` calls in flight (the calls release the GIL), straight into the caller's array.

The chunk files this module understands (what `graphstore.layout._arrays.new_array` writes,
checked for every array by `ArrayLayout.of`)::

    <array dir>/zarr.json          zarr_format 3, regular chunk grid chunked on axis 0 only,
                                   chunk_key_encoding "default", codecs
                                   [bytes (little endian), crc32c], no storage transformers
    <array dir>/c/<i>[/0...]       chunk i: rows [i*R, (i+1)*R) as raw little-endian bytes,
                                   R * row_bytes of them, then crc32c(those bytes) as a
                                   little-endian uint32. The last chunk is full size too:
                                   rows past the array's end are padding (the fill value).

Any other array (zstd-compressed, sharded, transposed, chunked on a second axis) gets an
`ArrayLayout` with ``fast=False`` and is read through zarr instead, by the same calls.

Checksums: every byte a read delivers is verified. A read that covers every row a chunk
holds reads the whole chunk file (padding and trailer included) and verifies its crc32c.
A read of part of a chunk (an edge bucket inside a 4 MiB edge chunk, one partition's
labels in a chunk of several partitions) is checked against the array's `SegmentTable`
when it has one: the crc32c of every edge bucket or node partition, written at conversion
(`graphstore.layout._segments`). Such a read reads exactly its bytes, and once they are in,
the segments they cover are checksummed by the worker that read the last piece. A part of
a chunk that no segment covers exactly (a range cut inside a bucket, or an array without a
table) is read as the whole chunk into scratch, verified, and copied out: slower, never
unchecked. Stores written before segment checksums existed set
``ArrayLayout.verify_partial=False``: their partial reads stay exact and unverified (the
store warns once and ``graphstore upgrade`` adds the tables).

Direct IO: with ``direct=True`` a whole-chunk read whose destination is 4096-byte aligned
(see `aligned_empty`) and whose chunk size is a multiple of 4096 bytes uses ``O_DIRECT``:
no page cache, so the copy from the cache is saved and, under a cgroup memory cap (where
the page cache counts against the cap), nothing is left behind to evict. Other reads are
buffered; they drop the pages they read afterwards (``POSIX_FADV_DONTNEED``) when
``drop_cache=True``, for the same reason, and reads of part of a chunk turn the kernel's
readahead off first (``POSIX_FADV_RANDOM``): it would fetch far more than an edge bucket.

Defaults, measured cold under a 1 GiB cap on the development machine (virtio SSD, 2 cores;
``tools/bench_chunkio.py``): 4 threads and O_DIRECT read 4 partitions' features (235 MB,
28 chunks of 8 MiB) at 1.3-1.4x the bandwidth of ``dd iflag=direct bs=4M`` (zarr: 0.3-0.5x);
buffered reads reached 0.8-1.0x. Splitting 8 MiB chunk reads into 2 MiB pieces or going to
8 or 16 threads did not help. For 480 edge-bucket ranges (~18k edges each) buffered reads
without readahead were about 20 % faster than O_DIRECT through a scratch block, and 15-20x
faster than zarr (which reads and checks a whole 4 MiB chunk per range).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import numpy as np
import zarr
import zarr.codecs

from graphstore.errors import CorruptStoreError

__all__ = ["ALIGN", "ArrayLayout", "ChunkReader", "ReadStats", "SegmentTable", "aligned_empty", "shared_reader"]

ALIGN = 4096
"""Alignment of file offsets, lengths and memory addresses for ``O_DIRECT`` reads."""
TRAILER_BYTES = 4
"""Size of the crc32c checksum after each chunk's bytes."""
INLINE_FINISH_BYTES = 1 << 20
"""Jobs checking or copying at most this many bytes finish on the thread that read them:
crc32c runs at about 12 GB/s here (80 us a MiB), less than handing the job to a verifier
thread and waiting for it (on Cora's out-of-core epochs, hundreds of requests of a few KiB
to 500 KiB, the handoffs were 5-7 of 44 ms an epoch). Larger ones go to the verifiers,
so the reader goes straight on to its next read while crc32c runs."""


def aligned_empty(shape: int | tuple[int, ...], dtype: str | np.dtype, *, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of ``align`` bytes.

    Rows read into it at chunk boundaries can then use ``O_DIRECT``. Wrap it without a copy
    with ``torch.from_numpy``.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : str or numpy.dtype
    align : int
        A power of two.

    Returns
    -------
    numpy.ndarray
        Shape ``shape``, dtype ``dtype``, ``ctypes.data % align == 0``, writeable.

    Examples
    --------
    >>> a = aligned_empty((3, 5), "float32")
    >>> a.shape, a.dtype.name, a.ctypes.data % 4096, a.flags.c_contiguous
    ((3, 5), 'float32', 0, True)
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


# ---------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True, eq=False)
class SegmentTable:
    """crc32c checksums of consecutive row ranges of one array (edge buckets, partitions).

    A chunk's checksum covers the whole chunk, so a read of part of it cannot use it; these
    cover the pieces the training path reads on their own. Segment ``s`` is rows
    ``[bounds[s], bounds[s + 1])``; empty segments are allowed (an empty bucket).

    Examples
    --------
    >>> import numpy as np, crc32c
    >>> rows = np.arange(6, dtype="<i4")
    >>> bounds = np.array([0, 2, 2, 6])
    >>> crcs = np.array([crc32c.crc32c(rows[a:b].tobytes()) for a, b in zip(bounds, bounds[1:])], np.uint32)
    >>> table = SegmentTable(bounds, crcs, kind="partitions", num_partitions=3)
    >>> table.overlapping(3, 5), table.describe(2)
    ((2, 3), 'partition 2')
    """

    bounds: np.ndarray
    """[S+1] int64 row boundaries, ascending, from 0 to the array's length."""
    crcs: np.ndarray
    """[S] uint32 crc32c of each segment's raw little-endian bytes (0 when empty)."""
    kind: str
    """``"buckets"`` (segment ``b = j * p + i``: edges from partition i into j),
    ``"partitions"`` (segment k: the rows of partition k), ``"blocks"`` (a few KiB of
    feature rows, `graphstore.layout._segments.block_bounds`), ``"hub_segments"`` (segment g:
    the hub edges of partition g, p: hub-hub) or ``"whole"`` (one segment)."""
    num_partitions: int
    """p, to name a bucket by its two partitions."""

    def overlapping(self, lo: int, hi: int) -> tuple[int, int]:
        """Indices ``[s0, s1)`` of the segments that hold rows of ``[lo, hi)`` (``lo < hi``);
        their union is rows ``[bounds[s0], bounds[s1])``."""
        s0 = int(np.searchsorted(self.bounds, lo, side="right")) - 1
        s1 = int(np.searchsorted(self.bounds, hi, side="left"))
        return s0, s1

    def describe(self, s: int) -> str:
        """``"bucket (src partition 3, dst partition 5)"`` or ``"partition 7"``."""
        if self.kind == "buckets":
            p = self.num_partitions
            return f"bucket (src partition {s % p}, dst partition {s // p})"
        if self.kind == "hub_segments":
            return "hub-hub edges" if s == self.num_partitions else f"hub edges of partition {s}"
        if self.kind == "whole":
            return "the whole array"
        if self.kind == "blocks":
            return f"block {s}"
        return f"partition {s}"


# ---------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class ArrayLayout:
    """Where an array's rows live in its chunk files, or why this module cannot tell."""

    array: zarr.Array
    """The zarr array (the fallback reads through it)."""
    name: str
    """The array's path inside the store, e.g. ``"edges/src"`` (names it in errors)."""
    where: str
    """The store's directory, for error messages."""
    directory: Path
    """The array's directory (holding ``zarr.json`` and ``c/``)."""
    shape: tuple[int, ...]
    """The array's shape; rows are along axis 0."""
    dtype: np.dtype
    """Element dtype (native byte order)."""
    chunk_rows: int
    """R, rows per chunk."""
    row_bytes: int
    """Bytes of one row: ``prod(shape[1:]) * itemsize``."""
    checksum: bool
    """True when each chunk file ends in a crc32c of its bytes."""
    fast: bool
    """True when `ChunkReader` reads the chunk files itself; False: it reads through zarr."""
    reason: str | None = None
    """Why ``fast`` is False (an unsupported codec, ...); None when fast."""
    key_prefix: str = "c/"
    """The chunk key up to the chunk index: ``"c/"`` or ``"c."``, by the key separator."""
    key_suffix: str = ""
    """The chunk key after the index: ``"/0"`` per further axis (``".0"`` with ``"."``)."""
    segments: SegmentTable | None = None
    """Checksums of the row ranges read on their own (see `SegmentTable`); None: none."""
    verify_partial: bool = True
    """False: a read of part of a chunk is exact and unverified (stores written before
    segment checksums). True: it is verified by `segments`, or read as the whole chunk."""
    device: int = -1
    """``st_dev`` of the array's directory: O_DIRECT is given up per filesystem, not per
    reader, when one refuses it (ramfs; tmpfs before Linux 6.6), so stores on other disks keep it."""

    @classmethod
    def of(cls, array: zarr.Array, *, path: str | os.PathLike | None = None,
           name: str | None = None) -> ArrayLayout:
        """Inspect ``array``'s metadata; ``fast`` says whether its chunk files can be read directly.

        Parameters
        ----------
        array : zarr.Array
            An array of a local store.
        path : str or PathLike, optional
            The array's directory; default: the local store's root joined with
            ``array.path``.
        name : str, optional
            The name used in error messages; default ``array.path``.
        """
        shape = tuple(int(s) for s in array.shape)
        dtype = np.dtype(array.dtype)
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
        root = getattr(array.store, "root", None)
        if path is not None:
            directory, where = Path(path), str(Path(path).parent)
        elif root is not None:
            directory, where = Path(root) / array.path, str(Path(root))
        else:
            directory, where = None, "<memory>"
        name = name if name is not None else (array.path or (directory.name if directory else "array"))
        meta = array.metadata
        chunk_rows = int(array.chunks[0]) if shape else 1
        base = dict(array=array, name=name, where=where, directory=directory or Path("."), shape=shape,
                    dtype=dtype, chunk_rows=chunk_rows, row_bytes=row_bytes, checksum=False)
        reason = _unsupported(array, directory, shape, dtype)
        if reason is not None:
            return cls(**base, fast=False, reason=reason)
        codecs = list(meta.codecs)
        separator = meta.chunk_key_encoding.separator
        try:
            device = os.stat(directory).st_dev
        except OSError:
            device = -1
        return cls(**{**base, "checksum": len(codecs) == 2}, fast=True, key_prefix=f"c{separator}",
                   key_suffix=f"{separator}0" * (len(shape) - 1), device=device)

    @property
    def num_chunks(self) -> int:
        """Number of chunk files along axis 0."""
        return -(-self.shape[0] // self.chunk_rows) if self.shape else 0

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk's rows (every chunk file, the last included, holds this many)."""
        return self.chunk_rows * self.row_bytes

    @property
    def file_bytes(self) -> int:
        """Size of every chunk file: the rows plus the checksum trailer."""
        return self.chunk_bytes + (TRAILER_BYTES if self.checksum else 0)

    def chunk_key(self, index: int) -> str:
        """The chunk's key, e.g. ``"c/3/0"``."""
        return f"{self.key_prefix}{index}{self.key_suffix}"

    def chunk_path(self, index: int) -> Path:
        """The chunk's file."""
        return self.directory / self.chunk_key(index)

    def _where(self, index: int) -> str:
        return f"{self.where}: {self.name} chunk {self.chunk_key(index)[2:]}"

    def _holds(self, index: int) -> str:
        """`` (partitions 2-3)``: what a chunk of a per-partition array holds, for messages."""
        table = self.segments
        if table is None or table.kind != "partitions":
            return ""
        c0 = index * self.chunk_rows
        s0, s1 = table.overlapping(c0, min(c0 + self.chunk_rows, self.shape[0]))
        return f" (partition {s0})" if s1 - s0 == 1 else f" (partitions {s0}-{s1 - 1})"

    def _chunk_span(self, lo: int, hi: int) -> str:
        """The chunk file(s) holding rows ``[lo, hi)``, for error messages."""
        first, last = lo // self.chunk_rows, max(lo, hi - 1) // self.chunk_rows
        files = self.chunk_key(first) if first == last else f"{self.chunk_key(first)} .. {self.chunk_key(last)}"
        return f"chunk file {files}" if first == last else f"chunk files {files}"


def _unsupported(array: zarr.Array, directory: Path | None, shape: tuple[int, ...],
                 dtype: np.dtype) -> str | None:
    """Why the chunk files of ``array`` cannot be read as raw rows; None when they can."""
    meta = array.metadata
    if getattr(meta, "zarr_format", None) != 3:
        return "not a Zarr v3 array"
    if directory is None:
        return "not in a local directory store"
    if not shape:
        return "a 0-d array"
    if dtype.kind not in "biuf" or dtype.hasobject:
        return f"dtype {dtype} is not a fixed-size number"
    if sys.byteorder != "little" and dtype.itemsize > 1:
        return "this machine is big endian"
    if type(meta.chunk_grid).__name__ != "RegularChunkGrid":
        return f"chunk grid {type(meta.chunk_grid).__name__} is not regular"
    if tuple(array.chunks[1:]) != shape[1:]:
        return f"chunks {tuple(array.chunks)} split rows (only axis 0 may be chunked)"
    if meta.storage_transformers:
        return "storage transformers"
    encoding = meta.chunk_key_encoding
    if type(encoding).__name__ != "DefaultChunkKeyEncoding" or encoding.separator not in "/.":
        return f"chunk key encoding {encoding}"
    codecs = list(meta.codecs)
    if not codecs or not isinstance(codecs[0], zarr.codecs.BytesCodec):
        return f"codecs {[type(c).__name__ for c in codecs]} (transposed or sharded)"
    endian = codecs[0].endian
    if dtype.itemsize > 1 and (endian is None or endian.value != "little"):
        return f"bytes codec endian {endian} (little expected)"
    rest = codecs[1:]
    if rest and not (len(rest) == 1 and isinstance(rest[0], zarr.codecs.Crc32cCodec)):
        return f"codecs {[type(c).__name__ for c in rest]} after bytes (compressed: read through zarr)"
    return None


# ---------------------------------------------------------------------- stats


@dataclass(slots=True)
class ReadStats:
    """What one `ChunkReader` call did; add two with ``+`` to accumulate."""

    requests: int = 0
    """Row ranges asked for (empty ranges included)."""
    bytes_delivered: int = 0
    """Bytes written into the callers' arrays."""
    bytes_read: int = 0
    """Bytes read from chunk files: rows, padding, checksums, O_DIRECT alignment slack."""
    file_reads: int = 0
    """``preadv`` calls (a chunk read split into pieces counts each piece)."""
    chunks_verified: int = 0
    """Whole chunks read and crc32c-checked."""
    partial_reads: int = 0
    """Reads of exactly part of a chunk (verified by segments, unless ``unverified_reads``)."""
    segments_verified: int = 0
    """Non-empty segments (buckets, partitions) checked against their `SegmentTable`."""
    chunks_expanded: int = 0
    """Parts of chunks no segment covers, read as the whole chunk to verify it."""
    unverified_reads: int = 0
    """Reads of part of a chunk with nothing to check them (``verify_partial=False``)."""
    direct_bytes: int = 0
    """Part of ``bytes_read`` read with ``O_DIRECT``."""
    fallback_requests: int = 0
    """Row ranges read through zarr (arrays whose layout is not ``fast``)."""
    seconds: float = 0.0
    """Wall time of the call(s)."""

    def __add__(self, other: ReadStats) -> ReadStats:
        return ReadStats(*(getattr(self, f) + getattr(other, f) for f in self.__slots__))

    @property
    def bytes_per_s(self) -> float:
        """Delivered bytes per second of wall time."""
        return self.bytes_delivered / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------- planning


@dataclass(slots=True, eq=False)
class _ChunkJob:
    """One chunk's part of one request: a contiguous byte range of one file."""

    layout: ArrayLayout
    index: int
    segments: list[tuple[int, memoryview]]
    """(file offset, destination) pairs, consecutive in the file."""
    whole: bool
    """The whole chunk, checksum included when the array has one."""
    direct: bool = False
    """Read with O_DIRECT (every segment aligned)."""
    data_views: list[memoryview] = field(default_factory=list)
    """The chunk's rows (and padding), in file order, for the checksum."""
    trailer: memoryview | None = None
    """Receives the stored checksum (a whole aligned block when direct)."""
    copy: tuple[memoryview, memoryview] | None = None
    """(destination, source): a direct partial read lands in an aligned scratch block first."""
    need_end: int = 0
    """A partial read: the file offset after the last byte asked for."""
    pending: int = 0
    """Pieces not yet read; the worker that reads the last one verifies the checksum."""
    request: _Request | None = None
    """The request this job reads for, when it has segments to verify."""


@dataclass(slots=True, eq=False)
class _Request:
    """One ``(array, lo, hi, out)`` request whose partial chunk reads its segments verify."""

    layout: ArrayLayout
    lo: int
    out: np.ndarray
    segments: list[tuple[int, int]] = field(default_factory=list)
    """Ranges ``[s0, s1)`` of indices into ``layout.segments`` to check once every job of
    the request is read (possibly overlapping: a segment may straddle two chunks)."""
    pending: int = 0
    """Jobs of the request not yet fully read; the worker finishing the last one checks."""


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data if len(view) else 0


class ChunkReader:
    """Reads row ranges of store arrays into caller-provided arrays, several reads in flight.

    One reader serves any number of arrays (of one or several stores) and any number of
    threads: each call plans its own reads, runs them on the shared worker pool and waits
    for them, so a loader thread and the training thread may both use it.

    Parameters
    ----------
    threads : int
        Worker threads, i.e. file reads in flight. ``preadv`` releases the GIL; on the
        development machine (virtio SSD) 4 reaches the disk's bandwidth (see
        ``tools/bench_chunkio.py``).
    direct : bool
        Use ``O_DIRECT`` for whole-chunk reads into 4096-aligned destinations (falls back to
        buffered reads where the filesystem refuses it).
    piece_bytes : int
        Split a chunk read larger than this into pieces read in parallel (rounded up to a
        multiple of 4096; a read may exceed it by one 4096-byte block, so the checksum rides
        along). The default reads the store's 4-8 MiB chunks whole: 2 MiB pieces measured no
        faster, a state's reads already being several chunks.
    partial_direct : bool
        Read parts of chunks (edge buckets) with ``O_DIRECT`` too, into an aligned scratch
        block then copied (at most 8 KiB more than asked). False (measured faster): buffered
        ``preadv`` straight into ``out``, with readahead off for the file.
    drop_cache : bool
        After a buffered read, tell the kernel to drop the pages it read: the rows now live
        in the caller's array, and under a memory cap the page cache counts against the cap.
    verify : bool
        Check checksums (default). False reads the same bytes without computing any
        checksum, and reads parts of chunks exactly: only for measuring what verification
        costs (``tools/bench_buffer.py``); never for training.
    name : str
        Prefix of the worker threads' names.

    Examples
    --------
    >>> import zarr, numpy as np, tempfile, os
    >>> from graphstore.layout._arrays import new_array
    >>> tmp = tempfile.TemporaryDirectory()
    >>> group = zarr.open_group(os.path.join(tmp.name, "s.gs"), mode="w")
    >>> arr = new_array(group, "x", shape=(10, 2), dtype="int32", chunks=(4, 2))
    >>> arr[:] = np.arange(20).reshape(10, 2)
    >>> with ChunkReader(threads=2) as reader:
    ...     out = np.empty((5, 2), dtype=np.int32)
    ...     stats = reader.read_rows(arr, 3, 8, out)
    >>> out[:, 0].tolist(), stats.chunks_verified, stats.chunks_expanded  # rows 4-7: chunk 1, whole
    ([6, 8, 10, 12, 14], 2, 1)
    >>> tmp.cleanup()
    """

    def __init__(self, *, threads: int = 4, direct: bool = True, piece_bytes: int = 8 << 20,
                 partial_direct: bool = False, drop_cache: bool = True, verify: bool = True,
                 name: str = "graphstore-chunkio") -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1 (got {threads})")
        if piece_bytes < ALIGN:
            raise ValueError(f"piece_bytes must be >= {ALIGN} (got {piece_bytes})")
        self.threads = threads
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.partial_direct = partial_direct and self.direct
        self.piece_bytes = -(-piece_bytes // ALIGN) * ALIGN
        self.drop_cache = drop_cache and hasattr(os, "posix_fadvise")
        self.verify = verify
        self._name = name
        self._start_workers()
        self._no_direct: set[int] = set()
        """Devices (``st_dev``) that refused O_DIRECT: read buffered from then on."""
        self._layouts: dict[tuple[int, str], ArrayLayout] = {}
        self._closed = False
        _LIVE_READERS.add(self)

    def _start_workers(self) -> None:
        """New pools (their threads start at the first read) and lock: at construction, and
        in a forked child, which inherits the parent's pools without their threads (a read
        would wait forever) and perhaps a lock some parent thread held at the fork."""
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self._name)
        # Checksums run on threads of their own, so a reader thread goes straight on to
        # its next read: the disk's queue stays full while crc32c runs (it releases the GIL).
        self._verify_pool = ThreadPoolExecutor(2, thread_name_prefix=f"{self._name}-verify")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public

    def layout(self, array: zarr.Array | ArrayLayout) -> ArrayLayout:
        """The (cached) `ArrayLayout` of ``array``."""
        if isinstance(array, ArrayLayout):
            return array
        key = (id(array), array.path)
        with self._lock:
            found = self._layouts.get(key)
            # The cache holds the array itself, so its id cannot be reused while cached.
            if found is None or found.array is not array:
                found = self._layouts[key] = ArrayLayout.of(array)
            return found

    def read_rows(self, array: zarr.Array | ArrayLayout, lo: int, hi: int, out: np.ndarray) -> ReadStats:
        """Fill ``out`` with rows ``[lo, hi)`` of ``array``.

        Parameters
        ----------
        array : zarr.Array or ArrayLayout
        lo, hi : int
            ``0 <= lo <= hi <= array.shape[0]``.
        out : numpy.ndarray
            ``[hi - lo, *array.shape[1:]]``, the array's dtype, C-contiguous and writeable
            (a tensor's ``.numpy()`` view works). Aligned with `aligned_empty`, whole chunks
            are read with ``O_DIRECT``.

        Returns
        -------
        ReadStats

        Raises
        ------
        CorruptStoreError
            A chunk file is missing or too short, or a whole chunk's checksum fails.
        ValueError
            A range outside the array, or a mis-shaped ``out``; the reader is closed.
        """
        return self.read_into([(array, lo, hi, out)])

    def read(self, array: zarr.Array | ArrayLayout, lo: int, hi: int) -> tuple[np.ndarray, ReadStats]:
        """Rows ``[lo, hi)`` in a new aligned array, and the stats of reading them."""
        layout = self.layout(array)
        out = aligned_empty((max(0, hi - lo), *layout.shape[1:]), layout.dtype)
        return out, self.read_into([(layout, lo, hi, out)])

    def read_into(
        self, requests: Iterable[tuple[zarr.Array | ArrayLayout, int, int, np.ndarray]]
    ) -> ReadStats:
        """Fill several arrays at once: each request is ``(array, lo, hi, out)`` as in `read_rows`.

        All reads of all requests are in flight together, so a buffer state's feature
        rows, labels and edge buckets load in one call at the disk's queue depth.

        Returns once every read has finished, also on error: no worker writes into an
        ``out`` after this returns. The first error is raised, the other reads cancelled.
        """
        if self._closed:
            raise ValueError("I/O operation on a closed ChunkReader")
        t0 = time.perf_counter()
        stats = ReadStats()
        jobs: list[_ChunkJob] = []
        fallbacks: list[tuple[ArrayLayout, int, int, np.ndarray]] = []
        for array, lo, hi, out in requests:
            layout = self.layout(array)
            lo, hi = int(lo), int(hi)
            _check_request(layout, lo, hi, out)
            stats.requests += 1
            stats.bytes_delivered += out.nbytes
            if hi == lo:
                continue
            if not layout.fast:
                fallbacks.append((layout, lo, hi, out))
                continue
            planned, request = self._plan(layout, lo, hi, out)
            if request is not None:
                request.pending = len(planned)
                for job in planned:
                    job.request = request
                request.segments = _merged(request.segments)
                bounds = layout.segments.bounds
                stats.segments_verified += sum(
                    int(np.count_nonzero(bounds[s0 + 1 : s1 + 1] > bounds[s0:s1])) for s0, s1 in request.segments)
            jobs.extend(planned)
        pieces = [piece for job in jobs for piece in self._pieces(job)]
        futures: list[Future] = []
        try:
            with self._lock:  # against a concurrent close(): submit all or raise
                if self._closed:
                    raise ValueError("I/O operation on a closed ChunkReader")
                futures = [self._pool.submit(self._read_piece, *piece) for piece in pieces]
            # zarr reads run here while the workers read the rest.
            for layout, lo, hi, out in fallbacks:
                _read_through_zarr(layout, lo, hi, out)
                stats.fallback_requests += 1
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            error = next((f.exception() for f in done if f.exception() is not None), None)
            if error is not None:
                raise error
            finishing = [f.result()[2] for f in futures if f.result()[2] is not None]
            done, _ = wait(finishing, return_when=FIRST_EXCEPTION)
            error = next((f.exception() for f in done if f.exception() is not None), None)
            if error is not None:
                raise error
        except BaseException:
            for f in futures:
                f.cancel()
            wait(futures)
            # A job's finish copies into ``out``: none may still run once this returns.
            wait([f.result()[2] for f in futures
                  if not f.cancelled() and f.exception() is None and f.result()[2] is not None])
            raise
        for f in futures:
            got, direct_bytes, finish = f.result()
            stats.bytes_read += got
            stats.direct_bytes += direct_bytes
            stats.chunks_verified += finish.result() if finish is not None else 0
        stats.file_reads += len(pieces)
        stats.partial_reads += sum(not job.whole for job in jobs)
        stats.chunks_expanded += sum(job.whole and job.copy is not None for job in jobs)
        stats.unverified_reads += sum(not job.whole and (not job.layout.verify_partial or not self.verify)
                                      for job in jobs)
        stats.seconds = time.perf_counter() - t0
        return stats

    def close(self) -> None:
        """Stop the workers (waiting for reads in progress). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._verify_pool.shutdown(wait=True)

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"ChunkReader(threads={self.threads}, direct={self.direct}, "
                f"piece_bytes={self.piece_bytes}, {state})")

    # ------------------------------------------------------------------ planning

    def _plan(self, layout: ArrayLayout, lo: int, hi: int,
              out: np.ndarray) -> tuple[list[_ChunkJob], _Request | None]:
        """One job per chunk the range touches (a per-chunk loop, never per row), and the
        request's segment checks (None when no job needs one)."""
        R, rb, n = layout.chunk_rows, layout.row_bytes, layout.shape[0]
        dest = memoryview(out.reshape(-1)).cast("B")
        jobs = []
        request: _Request | None = None
        for index in range(lo // R, (hi - 1) // R + 1):
            c0 = index * R
            a, b = max(lo, c0), min(hi, c0 + R)
            rows = dest[(a - lo) * rb : (b - lo) * rb]
            whole_chunk = a == c0 and b == min(c0 + R, n)
            if not whole_chunk:
                covered = self._covering_segments(layout, a, b, lo, hi) if self.verify else None
                if covered is None and layout.checksum and layout.verify_partial and self.verify:
                    # Nothing checks these rows on their own: read (and verify) the chunk.
                    jobs.append(self._whole_job(layout, index, scratch_for=rows, skip=(a - c0) * rb))
                    continue
                if covered is not None:
                    if request is None:
                        request = _Request(layout, lo, out)
                    request.segments.append(covered)
                off, end = (a - c0) * rb, (b - c0) * rb
                if not self.partial_direct:
                    jobs.append(_ChunkJob(layout, index, [(off, rows)], whole=False, need_end=end))
                    continue
                f0, f1 = off // ALIGN * ALIGN, -(-end // ALIGN) * ALIGN
                scratch = memoryview(aligned_empty(f1 - f0, np.uint8))
                jobs.append(_ChunkJob(layout, index, [(f0, scratch)], whole=False, direct=True,
                                      copy=(rows, scratch[off - f0 : end - f0]), need_end=end))
                continue
            jobs.append(self._whole_job(layout, index, rows=rows, valid=(b - a) * rb))
        return jobs, request

    @staticmethod
    def _covering_segments(layout: ArrayLayout, a: int, b: int, lo: int, hi: int) -> tuple[int, int] | None:
        """The segments holding rows ``[a, b)`` when they all lie inside the request
        ``[lo, hi)`` (so the request delivers every byte they cover); else None."""
        table = layout.segments
        if table is None:
            return None
        s0, s1 = table.overlapping(a, b)
        if table.bounds[s0] < lo or table.bounds[s1] > hi:
            return None
        return s0, s1

    def _whole_job(self, layout: ArrayLayout, index: int, *, rows: memoryview | None = None,
                   valid: int = 0, scratch_for: memoryview | None = None, skip: int = 0) -> _ChunkJob:
        """A read of every byte of chunk ``index`` with its checksum: into ``rows`` (its
        first ``valid`` bytes; the rest is padding read into scratch), or, for rows that
        are only part of the chunk, into a scratch chunk whose bytes ``[skip, skip +
        len(scratch_for))`` are copied to ``scratch_for`` once verified."""
        if scratch_for is not None:
            whole = memoryview(aligned_empty(layout.chunk_bytes, np.uint8))
            job = _ChunkJob(layout, index, [(0, whole)], whole=True, data_views=[whole],
                            copy=(scratch_for, whole[skip : skip + len(scratch_for)]))
        else:
            job = _ChunkJob(layout, index, [(0, rows)], whole=True, data_views=[rows])
            if valid < layout.chunk_bytes:
                pad = memoryview(aligned_empty(layout.chunk_bytes - valid, np.uint8))
                job.segments.append((valid, pad))
                job.data_views.append(pad)
        job.direct = self.direct and layout.device not in self._no_direct and all(
            off % ALIGN == 0 and len(view) % ALIGN == 0 and _address(view) % ALIGN == 0
            for off, view in job.segments
        )
        if layout.checksum:
            # O_DIRECT reads whole blocks: the trailer gets one (the file ends 4 bytes in).
            job.trailer = memoryview(aligned_empty(ALIGN if job.direct else TRAILER_BYTES, np.uint8))
            job.segments.append((layout.chunk_bytes, job.trailer))
        return job

    def _pieces(self, job: _ChunkJob) -> list[tuple[_ChunkJob, int, list[memoryview], int]]:
        """Cut a job's file range into reads of about ``piece_bytes`` (up to one block more).

        Returns ``(job, file offset, destination views, bytes the file must supply)`` each.
        """
        start = job.segments[0][0]
        end = job.segments[-1][0] + len(job.segments[-1][1])
        # The bytes the file must hold: all of it for a checksummed read, else up to the
        # last byte asked for (a direct read's scratch block may reach past the file's end).
        file_end = job.layout.file_bytes if job.whole else job.need_end
        # Equal pieces, and the checksum block rides along with the rows (a read of its
        # own would cost a whole request).
        count = max(1, -(-(end - start - ALIGN) // self.piece_bytes))
        step = -(-(end - start) // count // ALIGN) * ALIGN if count > 1 else end - start
        pieces = []
        for p0 in range(start, end, step):
            p1 = min(end, p0 + step)
            views = [view[max(p0, off) - off : min(p1, off + len(view)) - off]
                     for off, view in job.segments if off < p1 and off + len(view) > p0]
            pieces.append((job, p0, views, max(0, min(p1, file_end) - p0)))
        job.pending = len(pieces)
        return pieces

    # ------------------------------------------------------------------ workers

    def _read_piece(self, job: _ChunkJob, offset: int, views: list[memoryview],
                    wanted: int) -> tuple[int, int, Future | None]:
        """Read one piece; returns (bytes read, of them direct, the job's finish or None).

        The reader of a job's last piece hands the rest of the job (checksum, copy out of
        scratch, the request's segment checks) to the verifier threads and returns.
        """
        layout = job.layout
        got, direct = self._pread(job, views, offset)
        if got < wanted:
            try:
                size = os.stat(layout.chunk_path(job.index)).st_size
            except OSError:
                size = "no"
            raise CorruptStoreError(
                f"{layout._where(job.index)}: chunk file is {size} bytes, expected {layout.file_bytes}"
            )
        with self._lock:
            job.pending -= 1
            last = job.pending == 0
        finish = None
        if last and (job.copy is not None or job.request is not None
                     or (job.trailer is not None and self.verify)):
            if _finish_bytes(job) <= INLINE_FINISH_BYTES:
                # Handing a few KiB to the verifiers costs more than checking them here.
                finish = Future()
                try:
                    finish.set_result(self._finish_job(job))
                except BaseException as exc:
                    finish.set_exception(exc)
            else:
                finish = self._verify_pool.submit(self._finish_job, job)
        return got, got if direct else 0, finish

    def _finish_job(self, job: _ChunkJob) -> int:
        """Once a job's bytes are in: verify its chunk's checksum, copy rows out of scratch,
        and check the request's segments if this was its last job. Returns 1 for a chunk
        verified, else 0."""
        layout = job.layout
        verified = 0
        if job.trailer is not None and self.verify:
            crc = 0
            for view in job.data_views:
                crc = crc32c.crc32c(view, crc)
            stored = int.from_bytes(job.trailer[:TRAILER_BYTES], "little")
            if crc != stored:
                raise CorruptStoreError(
                    f"{layout._where(job.index)}{layout._holds(job.index)}: checksum mismatch "
                    f"(stored {stored:#010x}, computed {crc:#010x})"
                )
            verified = 1
        if job.copy is not None:
            dest, source = job.copy
            dest[:] = source
        request = job.request
        if request is not None:
            with self._lock:
                request.pending -= 1
                done = request.pending == 0
            if done:  # every byte of the request is in: check its segments
                _check_segments(request)
        return verified

    def _pread(self, job: _ChunkJob, views: list[memoryview], offset: int) -> tuple[int, bool]:
        """preadv into ``views`` from ``offset`` until they are full or the file ends.

        Returns the bytes read and whether O_DIRECT was used.
        """
        path = job.layout.chunk_path(job.index)
        direct = job.direct and job.layout.device not in self._no_direct
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0))
        except FileNotFoundError:
            raise CorruptStoreError(f"{job.layout._where(job.index)}: chunk file is missing") from None
        except OSError as exc:
            if not (direct and exc.errno == errno.EINVAL):
                raise
            # A filesystem without O_DIRECT (ramfs; tmpfs before Linux 6.6): buffered from now on, on that filesystem.
            self._no_direct.add(job.layout.device)
            direct = False
            fd = os.open(path, flags)
        try:
            if not direct and not job.whole and hasattr(os, "posix_fadvise"):
                # Readahead would fetch up to read_ahead_kb past a small range, into the cache.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            total = 0
            while views:
                try:
                    n = os.preadv(fd, views, offset + total)
                except OSError as exc:
                    if not (direct and exc.errno == errno.EINVAL):
                        raise
                    # An alignment this device refuses: buffered from now on, on this device.
                    self._no_direct.add(job.layout.device)
                    direct = False
                    os.close(fd)
                    fd = os.open(path, flags)
                    continue
                if n == 0:
                    break
                total += n
                views = _advance(views, n)
                if direct and n % ALIGN:
                    break  # a short O_DIRECT read means the end of the file
            if not direct and self.drop_cache and total:
                os.posix_fadvise(fd, offset, total, os.POSIX_FADV_DONTNEED)
            return total, direct
        finally:
            os.close(fd)


def _read_through_zarr(layout: ArrayLayout, lo: int, hi: int, out: np.ndarray) -> None:
    """Rows ``[lo, hi)`` of an array this module cannot read itself (compressed, ...).

    zarr returns the fill value for a chunk whose file is missing, so the files are looked
    for first: a deleted chunk must fail the read, not read as zeros. A checksum failure
    is narrowed down to its chunk, so the message names the file.
    """
    array = layout.array
    R = int(array.chunks[0]) if array.shape else 1
    tail = (0,) * (len(array.shape) - 1)
    chunks = range(lo // R, (hi - 1) // R + 1)
    if layout.directory != Path("."):
        for index in chunks:
            key = array.metadata.encode_chunk_key((index, *tail))
            if not (layout.directory / key).is_file():
                raise CorruptStoreError(f"{layout.where}: {layout.name} chunk {key[2:]}: chunk file is missing")
    try:
        out[...] = array[lo:hi]
    except ValueError:  # the crc32c codec's mismatch: find the chunk, for the message
        for index in chunks:
            try:
                array[index * R : (index + 1) * R]
            except ValueError:
                key = array.metadata.encode_chunk_key((index, *tail))
                raise CorruptStoreError(f"{layout.where}: {layout.name} chunk {key[2:]}: checksum mismatch "
                                        "(read through zarr)") from None
        raise


def _finish_bytes(job: _ChunkJob) -> int:
    """Bytes `ChunkReader._finish_job` checksums or copies for ``job``: its chunk when it
    has a trailer, the rows it copies out, and its request's rows (an upper bound: the
    request's last job checks them all)."""
    total = sum(len(view) for view in job.data_views) if job.trailer is not None else 0
    if job.copy is not None:
        total += len(job.copy[0])
    if job.request is not None:
        total += job.request.out.nbytes
    return total


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint ascending ranges covering the union of ``ranges``."""
    out: list[tuple[int, int]] = []
    for s0, s1 in sorted(ranges):
        if out and s0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], s1))
        else:
            out.append((s0, s1))
    return out


def _check_segments(request: _Request) -> None:
    """Compare each segment's crc32c with its table (the rows are in ``request.out``).

    A partition's feature rows are a hundred or more blocks of a few KiB: the bounds and
    checksums of a range are taken out of numpy once, so the loop is one crc32c call a
    segment (per-element numpy indexing cost several times the checksum itself)."""
    layout, table = request.layout, request.layout.segments
    data = memoryview(request.out.reshape(-1)).cast("B")
    rb, lo = layout.row_bytes, request.lo
    for s0, s1 in request.segments:
        bounds = table.bounds[s0 : s1 + 1].tolist()
        stored = table.crcs[s0:s1].tolist()
        for k in range(s1 - s0):
            r0, r1 = bounds[k], bounds[k + 1]
            if r1 == r0:
                continue
            crc = crc32c.crc32c(data[(r0 - lo) * rb : (r1 - lo) * rb])
            if crc != stored[k]:
                s = s0 + k
                raise CorruptStoreError(
                    f"{layout.where}: {layout.name} {table.describe(s)} (rows [{r0}, {r1}), "
                    f"{layout._chunk_span(r0, r1)}): checksum mismatch "
                    f"(stored {stored[k]:#010x}, computed {crc:#010x})"
                )


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """The views left after ``n`` bytes were read into them."""
    out = []
    for view in views:
        if n >= len(view):
            n -= len(view)
            continue
        out.append(view[n:] if n else view)
        n = 0
    return out


def _check_request(layout: ArrayLayout, lo: int, hi: int, out: np.ndarray) -> None:
    n = layout.shape[0] if layout.shape else 0
    if not 0 <= lo <= hi <= n:
        raise ValueError(f"{layout.name}: rows [{lo}, {hi}) must lie in [0, {n})")
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{layout.name}: out must be a numpy array (got {type(out).__name__}); "
                         "pass tensor.numpy() for a tensor")
    expected = (hi - lo, *layout.shape[1:])
    if out.shape != expected or out.dtype != layout.dtype:
        raise ValueError(
            f"{layout.name}: out must be {expected} {layout.dtype} (got {out.shape} {out.dtype})"
        )
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{layout.name}: out must be C-contiguous and writeable")


_SHARED: ChunkReader | None = None
_SHARED_LOCK = threading.Lock()
_LIVE_READERS: weakref.WeakSet[ChunkReader] = weakref.WeakSet()
"""Every open reader, so that a forked child can give each new workers."""


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for reader in list(_LIVE_READERS):
        if not reader._closed:
            reader._start_workers()


# A DataLoader worker (PyG's NodeLoader over `remote_backend`, say) is a fork of a process
# that has usually read already: without this its first read waits forever.
os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_reader() -> ChunkReader:
    """The process's `ChunkReader` (created on first use, with the defaults): one worker
    pool for every store, so opening many stores does not start many threads."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED._closed:
            _SHARED = ChunkReader(name="graphstore-shared-reader")
        return _SHARED
