"""Scratch files that let conversion stream: edges and feature rows parked on disk.

Source files are slow to parse (gzip + CSV), so the converter parses them once into
flat binary files in its temporary directory and makes every later pass (partitioning,
bucketing) over those. Nothing here holds more than one chunk in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["EdgeStager", "ScratchFile", "StagedEdges", "file_dtype", "node_scratch"]

NODE_CHUNK = 1 << 22
"""Nodes per step when a pass walks a per-node array (32 MiB of int64)."""


def node_scratch(directory: str, name: str, num_nodes: int, dtype) -> np.ndarray:
    """A zero-filled [num_nodes] array backed by ``directory/name.npy``.

    Per-node arrays (id maps, counts, degrees) live on disk during conversion: the page
    cache keeps them as fast as memory while they fit, and reclaims them when they do not,
    so conversion memory does not grow with the number of nodes.
    """
    os.makedirs(directory, exist_ok=True)
    return np.lib.format.open_memmap(os.path.join(directory, f"{name}.npy"), mode="w+", dtype=dtype,
                                     shape=(num_nodes,))

FLUSH_BYTES = 64 << 20
"""Scratch writes are synced and dropped from the page cache every this many bytes.

Scratch files are written once and read once. Left in the page cache as dirty pages they
crowd out everything else, and under a cgroup v1 memory cap (where dirty pages are not
throttled per group) they can get the converter OOM-killed; written back and dropped as
we go, they cost the cache nothing.
"""


def file_dtype(path: str) -> np.dtype:
    """The dtype a staging file's name gives: ``*.i32`` int32, anything else int64.

    >>> file_dtype("edges_src.i32"), file_dtype("edges_src.i64")
    (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32 if str(path).endswith(".i32") else np.int64)


class ScratchFile:
    """A flat binary file written and read at explicit offsets, kept out of the page cache.

    Parameters
    ----------
    path : str
        Created (truncated) on open.
    dtype : numpy dtype
        Element type; offsets and counts are in elements of ``dtype`` times ``row_width``.
    row_width : int
        Elements per row (feature rows are ``D`` wide, edge arrays 1).
    """

    def __init__(self, path: str, dtype: np.dtype | str, row_width: int = 1) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * row_width
        self.row_width = row_width
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._unflushed = 0

    def write_rows(self, first_row: int, rows: np.ndarray) -> None:
        """Write [m, row_width] (or [m]) ``rows`` starting at row ``first_row``."""
        data = np.ascontiguousarray(rows, dtype=self.dtype).tobytes()
        offset = first_row * self.row_bytes
        while data:
            written = os.pwrite(self._fd, data, offset)
            data, offset = data[written:], offset + written
            self._unflushed += written
        if self._unflushed >= FLUSH_BYTES:
            self.drop_cache()

    def fileno(self) -> int:
        """The open descriptor, for writers outside this class (the C edge phase)."""
        return self._fd

    def note_written(self, nbytes: int) -> None:
        """Account ``nbytes`` written through `fileno` by someone else, so the file is still
        synced and dropped every `FLUSH_BYTES`."""
        self._unflushed += nbytes
        if self._unflushed >= FLUSH_BYTES:
            self.drop_cache()

    def read_rows(self, first_row: int, count: int) -> np.ndarray:
        """[count, row_width] (or [count]) rows from ``first_row``; dropped from the cache after."""
        nbytes = count * self.row_bytes
        buffer = bytearray(nbytes)
        view = memoryview(buffer)
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], first_row * self.row_bytes + done)
            if got == 0:
                raise EOFError(f"{self.path}: short read at row {first_row + done // self.row_bytes}")
            done += got
        if _HAS_FADVISE:
            os.posix_fadvise(self._fd, first_row * self.row_bytes, nbytes, os.POSIX_FADV_DONTNEED)
        out = np.frombuffer(buffer, dtype=self.dtype)
        return out.reshape(count, self.row_width) if self.row_width > 1 else out

    def drop_cache(self) -> None:
        """Write dirty pages back and let the kernel forget them."""
        os.fdatasync(self._fd)
        if _HAS_FADVISE:
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self._unflushed = 0

    def close(self, *, remove: bool = False) -> None:
        """Close (idempotent); ``remove`` deletes the file too."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove and os.path.exists(self.path):
            os.unlink(self.path)


_HAS_FADVISE = hasattr(os, "posix_fadvise")


@dataclass(frozen=True)
class StagedEdges:
    """Directed edges (source ids) in two flat files, in staging order.

The endpoint files hold int32 when every node id fits (``*.i32``: half the bytes to write
here and to read back in every later pass), int64 otherwise (``*.i64``); the name says
which, so a description of the files (a path) is enough to read them. Relation ids are int64.

    Undirected sources are already expanded to both directions and self loops already
    dropped (unless kept); duplicates may still be present. Which rows are reverse edges
    the converter added (not listed by the source) is kept as row ranges, `reverse_runs`,
    so that merging can tell a repeated source edge from a reverse the source already had.
    """

    src_path: str
    """File of [num_edges] source endpoints, int32 (``*.i32``) or int64."""
    dst_path: str
    """File of [num_edges] destination endpoints, in the source file's dtype."""
    rel_path: str | None
    """File of [num_edges] int64 relation ids, or None."""
    num_edges: int
    """Number of staged directed edges."""
    num_nodes: int
    """Every endpoint is in ``[0, num_nodes)``."""
    in_count: np.ndarray | None = None
    """[num_nodes] int64 staged edges ending at each node (duplicates counted; a file-backed
    array), or None."""
    reverse_runs: np.ndarray | None = None
    """[k, 2] int64 ``[start, stop)`` row ranges, ascending and disjoint, of the reverse edges
    the converter added to an undirected source; None when it added none (a directed source)."""
    max_rel: int | None = None
    """The largest relation id staged (bounds the bits a relation takes in the edge phase's
    packed keys), or None when unknown or without relations."""

    @property
    def id_bytes(self) -> int:
        """Bytes of one endpoint in the src and dst files (4 or 8)."""
        return file_dtype(self.src_path).itemsize

    def _read(self, path: str, start: int, count: int) -> np.ndarray:
        # Plain reads, not a memory map: pages a map touches stay charged to this process
        # (and its cgroup) until unmapped, which on a large file defeats the memory bound.
        dtype = file_dtype(path)
        with open(path, "rb") as f:
            f.seek(start * dtype.itemsize)
            out = np.fromfile(f, dtype=dtype, count=count)
        if len(out) != count:
            raise EOFError(f"{path}: {len(out)} of {count} staged edges from {start}")
        return out.astype(np.int64, copy=False)

    def iter_chunks(
        self, chunk_edges: int
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Yield ``(start, src, dst, rel)`` for consecutive runs of ``chunk_edges`` edges.

        The arrays are fresh int64 arrays ([m] each), safe to modify; ``rel`` is None for an
        untyped graph.
        """
        for start in range(0, self.num_edges, max(1, chunk_edges)):
            count = min(chunk_edges, self.num_edges - start)
            rel = self._read(self.rel_path, start, count) if self.rel_path else None
            yield start, self._read(self.src_path, start, count), self._read(self.dst_path, start, count), rel

    def added_reverse(self, start: int, count: int) -> np.ndarray | None:
        """[count] bool: which staged rows of ``[start, start + count)`` are added reverse
        edges (True) rather than given by the source; None when no row is.

        Examples
        --------
        >>> runs = np.array([[2, 4], [6, 9]])
        >>> StagedEdges("s", "d", None, 9, 5, reverse_runs=runs).added_reverse(3, 5).astype(int)
        array([1, 0, 0, 1, 1])
        """
        runs = self.reverse_runs
        if runs is None:
            return None
        # Runs are few (two per source chunk): mark their ends and integrate, O(count + k).
        lo = np.clip(runs[:, 0] - start, 0, count)
        hi = np.clip(runs[:, 1] - start, 0, count)
        delta = np.zeros(count + 1, dtype=np.int64)
        np.add.at(delta, lo, 1)
        np.add.at(delta, hi, -1)
        return np.cumsum(delta[:-1]) > 0

    def listed_ranges(self, start: int, count: int) -> list[tuple[int, int]]:
        """The ``[lo, hi)`` offsets within rows ``[start, start + count)`` that the source
        listed (not added reverses), ascending; one range covering all when none was added.

        Examples
        --------
        >>> runs = np.array([[2, 4], [6, 9]])
        >>> StagedEdges("s", "d", None, 9, 5, reverse_runs=runs).listed_ranges(3, 5)
        [(1, 3)]
        >>> StagedEdges("s", "d", None, 9, 5, reverse_runs=runs).listed_ranges(0, 9)
        [(0, 2), (4, 6)]
        """
        runs = self.reverse_runs
        if runs is None or count == 0:
            return [(0, count)] if count else []
        # The runs that overlap [start, start + count), clipped to it: few (two per chunk).
        first = int(np.searchsorted(runs[:, 1], start, side="right"))
        last = int(np.searchsorted(runs[:, 0], start + count, side="left"))
        ranges, at = [], 0
        for lo, hi in runs[first:last].tolist():
            lo, hi = max(lo - start, 0), min(hi - start, count)
            if lo > at:
                ranges.append((at, lo))
            at = max(at, hi)
        if at < count:
            ranges.append((at, count))
        return ranges

    def iter_listed(self, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(src, dst)`` (fresh int64 arrays) of the rows the source listed, in order,
        at most ``chunk_edges`` at a time: the added reverses are not read at all."""
        for lo, hi in self.listed_ranges(0, self.num_edges):
            for start in range(lo, hi, max(1, chunk_edges)):
                count = min(chunk_edges, hi - start)
                yield self._read(self.src_path, start, count), self._read(self.dst_path, start, count)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """All ``(src, dst)`` in memory, [num_edges] int64 each (for METIS, which needs it)."""
        return self._read(self.src_path, 0, self.num_edges), self._read(self.dst_path, 0, self.num_edges)


class EdgeStager:
    """Appends edge chunks to the staging files; `finish` returns the `StagedEdges`.

    A context manager, so that an error while staging closes the files.
    """

    def __init__(self, directory: str, *, num_nodes: int, with_rel: bool) -> None:
        os.makedirs(directory, exist_ok=True)
        names = ["src", "dst", "rel"] if with_rel else ["src", "dst"]
        # Node ids are < num_nodes: int32 files when that fits; relation ids stay int64.
        ids = "i32" if num_nodes <= 1 << 31 else "i64"
        paths = {k: os.path.join(directory, f"edges_{k}.{'i64' if k == 'rel' else ids}") for k in names}
        self._files = {k: ScratchFile(path, file_dtype(path)) for k, path in paths.items()}
        self._num_nodes = num_nodes
        self.num_edges = 0
        self.in_count = node_scratch(directory, "in_count", num_nodes, np.int64)
        self._reverse_runs: list[tuple[int, int]] = []
        self._max_rel = -1

    def append(self, src: np.ndarray, dst: np.ndarray, rel: np.ndarray | None, *,
               added_reverse: bool = False) -> None:
        """Add [m] int64 edges (already validated) at the end; ``added_reverse`` marks them as
        reverse edges the converter added, not edges the source listed."""
        if added_reverse and len(src):
            self._reverse_runs.append((self.num_edges, self.num_edges + len(src)))
        self._files["src"].write_rows(self.num_edges, src)
        self._files["dst"].write_rows(self.num_edges, dst)
        if "rel" in self._files:
            assert rel is not None  # the caller checked the source's relation column
            self._files["rel"].write_rows(self.num_edges, rel)
            if len(rel):
                self._max_rel = max(self._max_rel, int(rel.max()))
        self.num_edges += len(src)
        if len(dst):
            np.add.at(self.in_count, dst, 1)  # O(chunk), not O(N) like a bincount

    def close(self) -> None:
        """Close the files (idempotent); `finish` calls it, an error path must too."""
        for f in self._files.values():
            f.close()

    def __enter__(self) -> EdgeStager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finish(self) -> StagedEdges:
        for f in self._files.values():
            f.drop_cache()
        self.close()
        rel = self._files.get("rel")
        return StagedEdges(
            src_path=self._files["src"].path,
            dst_path=self._files["dst"].path,
            rel_path=rel.path if rel else None,
            num_edges=self.num_edges,
            num_nodes=self._num_nodes,
            in_count=self.in_count,
            reverse_runs=np.array(self._reverse_runs, dtype=np.int64) if self._reverse_runs else None,
            max_rel=max(self._max_rel, 0) if rel else None,
        )
