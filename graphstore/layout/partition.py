"""Node partitioners: which partition each source node belongs to, and the store order.

A partitioner reads the staged edges (`graphstore.layout._staging.StagedEdges`) and
returns one label per source node. The converter then calls `store_order` (in memory:
`equal_blocks`), which sorts nodes by ``(label, source id)`` and cuts the sorted
sequence into ``num_partitions`` blocks of ``partition_size = ceil(N / p)`` rows: that
is the store order (rows inside a block in source id order), and store partition
``k`` is rows ``[k * partition_size, (k + 1) * partition_size)``. A partitioner whose
labels are unbalanced would see some of its nodes moved to a neighbouring block
(every excess node shifts all later boundaries), so the four built-in partitioners
return labels whose sizes are exactly the equal block sizes: for them the store blocks
are the labels, and the cut they optimise is the store's.

Registered partitioners (`available_partitioners`), with the memory they need:

- ``metis``: METIS k-way minimum edge cut (pymetis) on the symmetrised graph without
  self loops and duplicates (HierBatching's choice). O(E): the whole graph in memory.
- ``random``: seeded balanced random assignment (MariusGNN's default): a seeded
  pseudo-random bijection of ``[0, N)`` (Feistel network with cycle walking) cut into
  equal blocks. O(chunk): labels are computed chunk by chunk into a disk-backed
  ``partition_labels.npy`` next to the staged edges.
- ``sequential``: source id order cut into contiguous blocks. O(chunk), disk-backed
  like ``random``.
- ``stream``: chunked, vectorised Linear Deterministic Greedy placement followed by
  balanced label-propagation passes, for graphs METIS cannot hold. O(N + chunk): its
  labels and refinement counters live in memory.

`partition_nodes` validates labels chunk by chunk, so it adds O(chunk) to a
partitioner's own memory. `store_order` then turns labels into the store order (both
id maps, file-backed) in O(chunk) memory whenever the label sizes are the equal block
sizes, which every built-in partitioner guarantees; otherwise it falls back to the
in-memory, O(N) `equal_blocks` path. ``metis`` and ``stream`` remain O(E) and O(N)
respectively: only ``random`` and ``sequential`` make conversion memory independent of N.

Examples
--------
>>> import tempfile
>>> from graphstore.layout._staging import EdgeStager
>>> with tempfile.TemporaryDirectory() as tmp:
...     stager = EdgeStager(tmp, num_nodes=6, with_rel=False)
...     stager.append(np.array([0, 1, 3, 4]), np.array([1, 2, 4, 5]), None)
...     result = partition_nodes("sequential", edges=stager.finish(), num_partitions=2,
...                              seed=0)
...     print(result.labels.tolist())
...     orig_id, store_id, partition_size = store_order(result.labels, 2, out_dir=tmp)
...     print(orig_id.tolist(), store_id.tolist(), partition_size)
[0, 0, 0, 1, 1, 1]
[0, 1, 2, 3, 4, 5] [0, 1, 2, 3, 4, 5] 3
>>> equal_blocks(np.array([0, 0, 0, 1, 1, 1]), 2)
(array([0, 1, 2, 3, 4, 5]), 3)
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from graphstore.errors import ConfigError
from graphstore.layout._fast import unique
from graphstore.layout._staging import StagedEdges

__all__ = [
    "PARTITIONERS",
    "PartitionResult",
    "Partitioner",
    "available_partitioners",
    "equal_blocks",
    "partition_nodes",
    "register_partitioner",
    "store_order",
]

logger = logging.getLogger(__name__)

NODE_CHUNK = 1 << 20
"""Nodes per step when a partitioner or check walks the [N] labels chunk by chunk."""

LABELS_FILE = "partition_labels.npy"
"""Disk-backed labels of ``random`` / ``sequential``, next to the staged edges."""


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a partitioner decided, and what is worth recording about it."""

    labels: np.ndarray
    """[N] int64: partition of each source node, in ``[0, num_partitions)``.

    ``random`` and ``sequential`` return a read-write `numpy.memmap` of
    ``partition_labels.npy`` next to the staged edges (a later run replaces the file
    but not an earlier result's contents); the others an in-memory array."""
    method: str
    """Registered name of the partitioner that produced ``labels``."""
    info: dict[str, Any] = field(default_factory=dict)
    """JSON-safe facts for the store's metadata (``seconds``, METIS ``edge_cuts``, ...)."""


class Partitioner(Protocol):
    """A registered partitioner: called by `partition_nodes` with validated arguments.

    Parameters
    ----------
    edges : StagedEdges
        Directed edges in source ids; endpoints are in ``[0, edges.num_nodes)``.
    num_partitions : int
        ``p``, already checked to satisfy ``1 <= p <= edges.num_nodes``.
    seed : int
        Non-negative seed; the same seed must give the same labels.
    chunk_edges : int
        Edges per chunk for partitioners that stream over ``edges.iter_chunks``.

    Returns
    -------
    labels : ndarray of int64, shape (N,)
        Partition of each node in ``[0, p)``; may be a disk-backed `numpy.memmap`
        (`partition_nodes` checks it chunk by chunk).
    info : dict
        JSON-safe facts about the run (``partition_nodes`` adds ``seconds``).
    """

    def __call__(
        self, edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int
    ) -> tuple[np.ndarray, dict[str, Any]]: ...


_REGISTRY: dict[str, Partitioner] = {}

PARTITIONERS: Mapping[str, Partitioner] = MappingProxyType(_REGISTRY)
"""Read-only view of the registered partitioners by name."""


def register_partitioner(name: str) -> Callable[[Partitioner], Partitioner]:
    """Decorator that registers a `Partitioner` under ``name``.

    Raises
    ------
    ConfigError
        If ``name`` is already registered (a second registration would silently change
        what an existing store's ``partitioner`` attribute means).
    """

    def decorate(fn: Partitioner) -> Partitioner:
        if name in _REGISTRY:
            raise ConfigError(
                f"partitioner {name!r} is already registered; pick another name"
            )
        _REGISTRY[name] = fn
        return fn

    return decorate


def available_partitioners() -> tuple[str, ...]:
    """Sorted names of the registered partitioners."""
    return tuple(sorted(_REGISTRY))


def _partition_size(num_nodes: int, num_partitions: int) -> int:
    return -(-num_nodes // num_partitions)


def _check_num_partitions(num_partitions: int, num_nodes: int) -> None:
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise ConfigError(f"num_partitions must be an int (got {num_partitions!r})")
    if not 1 <= num_partitions <= num_nodes:
        raise ConfigError(
            f"num_partitions must be in [1, {num_nodes}] for a graph of {num_nodes} "
            f"nodes (got {num_partitions}); use fewer partitions"
        )


def _block_sizes(num_nodes: int, num_partitions: int) -> np.ndarray:
    """[p] int64 row counts of the equal blocks: ``partition_size`` each, the last short.

    With ``partition_size = ceil(N / p)`` the trailing blocks can even be empty
    (N=10, p=6 gives 2, 2, 2, 2, 2, 0).
    """
    size = _partition_size(num_nodes, num_partitions)
    starts = np.arange(num_partitions, dtype=np.int64) * size
    return np.clip(num_nodes - starts, 0, size)


def _label_array(labels, num_partitions: int) -> np.ndarray:
    """``labels`` as a 1-D integer array (a memmap stays a memmap), p checked against it."""
    if not isinstance(labels, np.ndarray):
        labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ConfigError(f"labels must be 1-D (got shape {labels.shape})")
    _check_num_partitions(num_partitions, labels.shape[0])
    if not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"labels must be integers (got dtype {labels.dtype})")
    return labels


def equal_blocks(labels: np.ndarray, num_partitions: int) -> tuple[np.ndarray, int]:
    """Store order for ``labels``: sort by (label, source id), cut into equal blocks.

    The store needs equal partitions (one chunk size, offsets ``k * partition_size``),
    while a partitioner may return unbalanced labels; the equal cut is what the store
    uses, so the last nodes (by id) of an oversized label land in the next block. The
    built-in partitioners return labels of exactly the block sizes, which this keeps.

    Parameters
    ----------
    labels : ndarray of int, shape (N,)
        Partition of each source node, in ``[0, num_partitions)``.
    num_partitions : int
        ``p``, with ``1 <= p <= N``.

    Returns
    -------
    orig_id : ndarray of int64, shape (N,)
        Source id of each store row; a permutation of ``range(N)``.
    partition_size : int
        ``ceil(N / p)``: store partition ``k`` is rows
        ``[k * partition_size, min((k + 1) * partition_size, N))`` (possibly empty for
        the last ones).

    Raises
    ------
    ConfigError
        If ``p`` is not in ``[1, N]``, or ``labels`` is not 1-D or has a value outside
        ``[0, p)``.

    Examples
    --------
    >>> equal_blocks(np.array([1, 0, 1, 0, 0]), 2)
    (array([1, 3, 4, 0, 2]), 3)
    """
    labels = _label_array(labels, num_partitions)
    num_nodes = labels.shape[0]
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_partitions:
        raise ConfigError(
            f"labels must be in [0, {num_partitions}) (got values in [{lo}, {hi}])"
        )
    # A stable sort of the labels keeps source ids ascending inside each label.
    orig_id = np.argsort(labels, kind="stable").astype(np.int64, copy=False)
    return orig_id, _partition_size(num_nodes, num_partitions)


def partition_nodes(
    method: str,
    *,
    edges: StagedEdges,
    num_partitions: int,
    seed: int,
    chunk_edges: int = 1 << 22,
) -> PartitionResult:
    """Partition the source nodes of ``edges`` with the partitioner named ``method``.

    Parameters
    ----------
    method : str
        A name from `available_partitioners` (``"metis"``, ``"random"``,
        ``"sequential"``, ``"stream"``, ...).
    edges : StagedEdges
        The staged directed edges; ``edges.num_nodes`` is N.
    num_partitions : int
        ``p``, with ``1 <= p <= N``.
    seed : int
        Non-negative seed; the same seed gives the same labels.
    chunk_edges : int, default 2**22
        Edges per chunk for streaming partitioners (one chunk is held at a time).

    Returns
    -------
    PartitionResult
        ``labels`` [N] int64 in ``[0, p)`` (a memmap for ``random`` / ``sequential``);
        ``info`` always has ``seconds``. Feed it to `store_order` for the store order.

    Raises
    ------
    ConfigError
        Unknown ``method`` (the message lists the known names), ``p`` outside
        ``[1, N]``, a negative seed or ``chunk_edges < 1``.
    """
    if method not in _REGISTRY:
        raise ConfigError(
            f"unknown partitioner {method!r}; expected one of "
            f"{', '.join(available_partitioners())}"
        )
    num_nodes = int(edges.num_nodes)
    _check_num_partitions(num_partitions, num_nodes)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int (got {seed!r})")
    if chunk_edges < 1:
        raise ConfigError(f"chunk_edges must be >= 1 (got {chunk_edges})")

    began = time.perf_counter()
    labels, info = _REGISTRY[method](edges, int(num_partitions), int(seed), int(chunk_edges))
    seconds = time.perf_counter() - began

    if not isinstance(labels, np.ndarray):
        labels = np.asarray(labels)
    # A third-party partitioner with a bug must not reach the store: the converter
    # trusts these labels to index [p]-sized arrays.
    if labels.shape != (num_nodes,) or not np.issubdtype(labels.dtype, np.integer):
        raise RuntimeError(
            f"partitioner {method!r} returned labels of shape {labels.shape} and dtype "
            f"{labels.dtype}; expected ({num_nodes},) int64"
        )
    labels = labels.astype(np.int64, copy=False)
    # Chunked: disk-backed labels are checked without an [N] temporary.
    sizes = _label_counts(labels, num_partitions)
    if sizes is None:
        raise RuntimeError(
            f"partitioner {method!r} returned labels outside [0, {num_partitions})"
        )
    info = {
        **info,
        "seconds": round(seconds, 6),
        "max_label_size": int(sizes.max()),
        "min_label_size": int(sizes.min()),
    }
    logger.info("partitioner %s: %d nodes into %d parts in %.2f s",
                method, num_nodes, num_partitions, seconds)
    return PartitionResult(labels=labels, method=method, info=info)


def store_order(
    labels: np.ndarray,
    num_partitions: int,
    *,
    out_dir: str,
    chunk: int = 1 << 22,
    dtype: np.dtype | type = np.int64,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The store order for ``labels`` as two file-backed id maps, in O(chunk) memory.

    The order is `equal_blocks`' (sort by ``(label, source id)``, cut into equal blocks
    of ``partition_size = ceil(N / p)`` rows) with rows inside each block sorted by
    source id, which is what the converter writes.

    When the label sizes are exactly the equal block sizes (every built-in partitioner
    guarantees it), the blocks are the labels and this is a chunked counting sort: one
    pass counts the labels, a second walks the source ids in chunks of ``chunk`` with a
    running cursor per label, writes ``store_id`` sequentially and ``orig_id`` as one
    contiguous run per label and chunk. Memory is O(chunk + p); the [N] maps live in
    ``out_dir/orig_id.npy`` and ``out_dir/store_id.npy`` (pages are released as the
    pass goes). Otherwise (unbalanced labels from a third-party partitioner) it falls
    back to the in-memory `equal_blocks` + in-block sort + inverse, which is O(N), and
    copies the result to the same files.

    Parameters
    ----------
    labels : ndarray of int, shape (N,)
        Partition of each source node in ``[0, p)``; may be a memmap (read by chunks).
    num_partitions : int
        ``p``, with ``1 <= p <= N``.
    out_dir : str
        Directory for the two ``.npy`` files (created if missing; existing files of
        those names are replaced).
    chunk : int, default 2**22
        Nodes per step.
    dtype : numpy integer dtype, default int64
        Dtype of both maps (must hold ``N - 1``).

    Returns
    -------
    orig_id : memmap of ``dtype``, shape (N,)
        Source id of each store row.
    store_id : memmap of ``dtype``, shape (N,)
        Store row of each source id: ``orig_id[store_id[i]] == i``.
    partition_size : int
        ``ceil(N / p)``.

    Raises
    ------
    ConfigError
        As `equal_blocks` for bad ``labels`` / ``p``; ``chunk < 1``; a ``dtype`` that
        cannot hold ``N - 1``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     orig_id, store_id, size = store_order(np.array([1, 0, 1, 0, 0]), 2, out_dir=tmp)
    ...     print(orig_id.tolist(), store_id.tolist(), size)
    [1, 3, 4, 0, 2] [3, 0, 4, 1, 2] 3
    """
    labels = _label_array(labels, num_partitions)
    num_nodes = labels.shape[0]
    if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk < 1:
        raise ConfigError(f"chunk must be a positive int (got {chunk!r})")
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.integer) or np.iinfo(dtype).max < num_nodes - 1:
        raise ConfigError(f"dtype {dtype} cannot hold node ids up to {num_nodes - 1}")
    num_partitions = int(num_partitions)
    partition_size = _partition_size(num_nodes, num_partitions)

    counts = np.zeros(num_partitions, dtype=np.int64)
    lo, hi = num_partitions, -1
    for start in range(0, num_nodes, chunk):
        part = np.asarray(labels[start : start + chunk])
        lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
        if lo >= 0 and hi < num_partitions:
            counts += np.bincount(part, minlength=num_partitions)
        _release(labels)
    if lo < 0 or hi >= num_partitions:
        raise ConfigError(
            f"labels must be in [0, {num_partitions}) (got values in [{lo}, {hi}])"
        )

    os.makedirs(out_dir, exist_ok=True)
    orig_id = _disk_array(os.path.join(out_dir, "orig_id.npy"), num_nodes, dtype)
    store_id = _disk_array(os.path.join(out_dir, "store_id.npy"), num_nodes, dtype)

    if not np.array_equal(counts, _block_sizes(num_nodes, num_partitions)):
        # Unbalanced labels: blocks straddle labels. O(N), in memory.
        logger.info("store order: labels are not the equal blocks; sorting in memory")
        order, _ = equal_blocks(np.asarray(labels), num_partitions)
        for start in range(0, num_nodes, partition_size):
            order[start : start + partition_size].sort()
        orig_id[:] = order
        inverse = np.empty_like(order)
        inverse[order] = np.arange(num_nodes, dtype=np.int64)
        store_id[:] = inverse
        del order, inverse
        _release(orig_id)
        _release(store_id)
        return orig_id, store_id, partition_size

    # Counting sort: label k's nodes, in ascending source id, fill block k in order.
    # Labels are narrowed to 16 bits when p allows: numpy's stable sort of those is a
    # radix sort, linear in the chunk.
    narrow = np.uint16 if num_partitions <= 1 << 16 else np.int64
    cursor = np.arange(num_partitions, dtype=np.int64) * partition_size
    for start in range(0, num_nodes, chunk):
        part = np.asarray(labels[start : start + chunk]).astype(narrow)
        size = part.shape[0]
        local = np.bincount(part, minlength=num_partitions)
        first = np.cumsum(local) - local  # start of each label's run in the sorted chunk
        order = np.argsort(part, kind="stable")  # source ids ascending inside each label
        # Sorted position j of label k goes to row cursor[k] + (j - first[k]).
        rows = (cursor - first)[part[order]]
        del part
        rows += np.arange(size, dtype=np.int64)
        rows_by_id = np.empty(size, dtype=dtype)
        rows_by_id[order] = rows
        del rows
        store_id[start : start + size] = rows_by_id
        del rows_by_id
        order += start  # now the source ids in store order
        for k in np.flatnonzero(local):
            run = slice(int(first[k]), int(first[k] + local[k]))
            orig_id[cursor[k] : cursor[k] + local[k]] = order[run]
        del order
        cursor += local
        _release(store_id)
        _release(orig_id)
        _release(labels)
    return orig_id, store_id, partition_size


# --------------------------------------------------------------------------- simple ones


def _disk_array(path: str, num: int, dtype: np.dtype | type) -> np.memmap:
    """A new ``.npy`` file of ``num`` elements, mapped for writing.

    An existing file is unlinked first rather than truncated: a memmap still open on it
    (an earlier `PartitionResult`) keeps its own contents.
    """
    if os.path.exists(path):
        os.unlink(path)
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(num,))


def _release(array: np.ndarray) -> None:
    """Drop the pages of a file-backed ``array`` from this process (no-op otherwise).

    Pages a map touches stay charged to the process (RSS, and its cgroup) until unmapped,
    which would make a chunked pass O(N) again. Written pages are synced to the file
    first; the data stays readable (a later access faults it back in).
    """
    mm = getattr(array, "_mmap", None)
    if not isinstance(mm, mmap.mmap) or getattr(array, "mode", None) not in ("r", "r+", "w+"):
        return  # in memory, or a private copy-on-write map whose pages are the data
    if array.mode != "r":
        mm.flush()
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)
    filename = getattr(array, "filename", None)
    if filename and hasattr(os, "posix_fadvise"):
        fd = os.open(filename, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _label_counts(labels: np.ndarray, num_partitions: int) -> np.ndarray | None:
    """[p] int64 nodes per label, chunk by chunk; None if a label is outside ``[0, p)``."""
    counts = np.zeros(num_partitions, dtype=np.int64)
    for start in range(0, labels.shape[0], NODE_CHUNK):
        chunk = np.asarray(labels[start : start + NODE_CHUNK])
        if chunk.min() < 0 or chunk.max() >= num_partitions:
            return None
        counts += np.bincount(chunk, minlength=num_partitions)
        _release(labels)
    return counts


def _labels_file(edges: StagedEdges) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(edges.src_path)), LABELS_FILE)


@register_partitioner("sequential")
def _sequential(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Source id order cut into contiguous equal blocks (keeps the source's locality).

    Written chunk by chunk to a disk-backed [N] int64 array: O(chunk) memory.
    """
    del seed, chunk_edges  # deterministic and edge-free by definition
    num_nodes = edges.num_nodes
    size = _partition_size(num_nodes, num_partitions)
    labels = _disk_array(_labels_file(edges), num_nodes, np.int64)
    for start in range(0, num_nodes, NODE_CHUNK):
        stop = min(start + NODE_CHUNK, num_nodes)
        labels[start:stop] = np.arange(start, stop, dtype=np.int64) // size
        _release(labels)
    return labels, {}


_FEISTEL_ROUNDS = 4
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on [k] uint64 (wrapping arithmetic): a good 64-bit hash."""
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


class _FeistelPermutation:
    """A seeded pseudo-random bijection of ``[0, n)``, evaluated on any chunk of ids.

    A balanced ``_FEISTEL_ROUNDS``-round Feistel network on ``2h``-bit integers (the
    smallest even bit width covering ``n``, so the domain is less than ``4 n``) is a
    bijection of ``[0, 4**h)``; cycle walking (apply it again while the value is
    ``>= n``) restricts it to a bijection of ``[0, n)``. The round keys come from
    ``seed``. O(chunk) memory, no [n] table.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        bits = max(1, (max(n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = np.random.default_rng(seed).integers(
            0, 2**64 - 1, size=_FEISTEL_ROUNDS, dtype=np.uint64, endpoint=True
        )

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix64(right ^ key) & self.mask)
        return (left << half) | right

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """[k] int64 images of [k] int64 ``ids`` in ``[0, n)``."""
        out = self._rounds(ids.astype(np.uint64))
        walking = np.flatnonzero(out >= np.uint64(self.n))
        while walking.shape[0]:
            again = self._rounds(out[walking])
            out[walking] = again
            walking = walking[again >= np.uint64(self.n)]
        return out.astype(np.int64)


@register_partitioner("random")
def _random(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """A seeded pseudo-random permutation cut into equal groups (MariusGNN's default).

    ``label(i) = perm(i) // partition_size`` with ``perm`` a seeded bijection of
    ``[0, N)`` (`_FeistelPermutation`): the group sizes equal the store's block sizes,
    so `equal_blocks` / `store_order` keep them intact. Computed chunk by chunk into a
    disk-backed [N] int64 array: O(chunk) memory.
    """
    del chunk_edges
    num_nodes = edges.num_nodes
    size = _partition_size(num_nodes, num_partitions)
    perm = _FeistelPermutation(num_nodes, seed)
    labels = _disk_array(_labels_file(edges), num_nodes, np.int64)
    for start in range(0, num_nodes, NODE_CHUNK):
        stop = min(start + NODE_CHUNK, num_nodes)
        labels[start:stop] = perm(np.arange(start, stop, dtype=np.int64)) // size
        _release(labels)
    return labels, {}


# ------------------------------------------------------------------ balance helpers


def _fill_most_room(room: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """How many of ``count`` new nodes each partition takes, filling the emptiest first.

    Water filling on the remaining room: the result leaves the rooms as even as
    possible (the most-room partition first), never exceeds a room, and breaks ties
    among equally empty partitions at random.

    Parameters
    ----------
    room : ndarray of int64, shape (p,)
        Free places per partition; ``count <= room.sum()``.
    count : int
        Nodes to place.
    rng : numpy.random.Generator
        Breaks ties.

    Returns
    -------
    ndarray of int64, shape (p,)
        Nodes given to each partition; sums to ``count``.
    """
    if count == 0:
        return np.zeros_like(room)
    # The smallest level L >= 0 with sum(max(0, room - L)) <= count, by bisection on
    # the integer levels: O(p log max(room)), no per-node work.
    lo, hi = 0, int(room.max())
    while lo < hi:
        mid = (lo + hi) // 2
        if int(np.maximum(room - mid, 0).sum()) <= count:
            hi = mid
        else:
            lo = mid + 1
    take = np.maximum(room - lo, 0)
    extra = count - int(take.sum())
    if extra:
        # Partitions now at level L take one more each, chosen at random; there are
        # more of them than ``extra`` by the choice of L.
        at_level = np.flatnonzero(room >= lo)
        take[rng.choice(at_level, size=extra, replace=False)] += 1
    return take


def _place_least_loaded(
    nodes: np.ndarray,
    labels: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """Put ``nodes`` ([k] int64, unassigned) into the partitions with the most room.

    Consecutive ``nodes`` go to the same partition, so ids sorted on entry keep
    whatever locality the source's numbering has.
    """
    take = _fill_most_room(capacity - sizes, nodes.shape[0], rng)
    labels[nodes] = np.repeat(np.arange(take.shape[0], dtype=np.int64), take)
    sizes += take


def _group_rank(sorted_keys: np.ndarray) -> np.ndarray:
    """[k] int64 position of each element inside its run of equal ``sorted_keys``."""
    idx = np.arange(sorted_keys.shape[0], dtype=np.int64)
    first = np.ones(sorted_keys.shape[0], dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return idx - np.maximum.accumulate(np.where(first, idx, 0))


def _descending_within(
    group: np.ndarray, score: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Order by ``group`` ascending, then ``score`` descending, equal scores at random."""
    shuffle = rng.permutation(group.shape[0])
    # Stable sorts compose: the last sort decides, earlier ones break its ties.
    by_score = shuffle[np.argsort(-score[shuffle], kind="stable")]
    return by_score[np.argsort(group[by_score], kind="stable")]


def _rebalance(
    own: np.ndarray,
    labels: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
) -> int:
    """Bring every partition back to exactly ``capacity``; returns the nodes moved.

    Overfull partitions give up their nodes with the fewest neighbours inside (``own``,
    [N] counts: a node costs at most that many newly cut edges), which go to the
    partitions with the most room. ``labels`` and ``sizes`` are updated in place.
    """
    excess = np.maximum(sizes - capacity, 0)
    if not excess.any():
        return 0
    candidates = np.flatnonzero(excess[labels] > 0)
    order = _descending_within(labels[candidates], -own[candidates].astype(np.int64), rng)
    candidates = candidates[order]
    part = labels[candidates]
    leaving = np.sort(candidates[_group_rank(part) < excess[part]])
    sizes -= excess
    labels[leaving] = -1
    _place_least_loaded(leaving, labels, sizes, capacity, rng)
    return int(leaving.shape[0])


# --------------------------------------------------------------------------------- METIS


def _symmetric_csr(
    edges: StagedEdges, chunk_edges: int, index_dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, int]:
    """Undirected simple graph of ``edges`` as CSR.

    Returns
    -------
    indptr : ndarray, shape (N + 1,)
    indices : ndarray, shape (2 * U,)
        Both directions of each of the ``U`` undirected edges, sorted within a row.
    num_undirected : int
        ``U``: distinct unordered pairs without self loops.
    """
    num_nodes = edges.num_nodes
    # One int64 key per unordered pair (lo * N + hi) deduplicates both directions and
    # repeats at once; N * N fits int64 for any N below 3e9.
    pair_keys = []
    for _, src, dst, _rel in edges.iter_chunks(chunk_edges):
        keep = src != dst
        lo = np.minimum(src[keep], dst[keep])
        hi = np.maximum(src[keep], dst[keep])
        pair_keys.append(unique(lo * num_nodes + hi))
    keys = unique(np.concatenate(pair_keys)) if pair_keys else np.zeros(0, np.int64)
    del pair_keys
    lo, hi = np.divmod(keys, num_nodes)
    del keys
    rows = np.concatenate([lo, hi])
    cols = np.concatenate([hi, lo])
    del lo, hi
    order = np.lexsort((cols, rows))
    indices = cols[order].astype(index_dtype, copy=False)
    counts = np.bincount(rows, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=index_dtype)
    np.cumsum(counts, out=indptr[1:])
    return indptr, indices, indices.shape[0] // 2


_METIS_UFACTOR = 1
"""METIS's allowed imbalance in thousandths (its k-way default is 30, i.e. 3 %).

The store cuts equal blocks, so every node of imbalance shifts all later block
boundaries: on a 200k-node power-law graph in 64 parts the default 3 % turned a 52 %
cut into 70 % on the blocks, while 0.1 % costs one point of METIS's own cut.
"""


@register_partitioner("metis")
def _metis(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """METIS k-way minimum edge cut on the symmetrised simple graph (HierBatching).

    Holds the whole graph in memory (CSR of both directions, plus the dedup keys while
    building it); use ``stream`` when that does not fit. METIS is seeded through
    ``pymetis.Options(seed=...)``, so a seed gives the same labels on the same METIS
    build. Isolated nodes are allowed (METIS spreads them for balance); ``p == 1``
    never calls METIS.

    METIS runs with a tight balance (``_METIS_UFACTOR``) and the few nodes over a
    block's size then move to the emptiest partitions (`_rebalance`), so the labels are
    exactly the store's equal blocks. ``info["edge_cuts"]`` is METIS's own objective
    (cut undirected edges) before that move.
    """
    num_nodes = edges.num_nodes
    if num_partitions == 1:
        return np.zeros(num_nodes, dtype=np.int64), {"edge_cuts": 0}

    import pymetis  # imported here: the other partitioners must work without it

    index_dtype = pymetis.zero_copy_dtype()
    indptr, indices, num_undirected = _symmetric_csr(edges, chunk_edges, index_dtype)
    # METIS stores its seed in a C int; fold larger seeds into range deterministically.
    options = pymetis.Options(seed=int(seed % (2**31 - 1)), ufactor=_METIS_UFACTOR)
    began = time.perf_counter()
    result = pymetis.part_graph(
        num_partitions,
        adjacency=pymetis.CSRAdjacency(adj_starts=indptr, adjacent=indices),
        options=options,
    )
    metis_seconds = time.perf_counter() - began
    labels = np.asarray(result.vertex_part, dtype=np.int64)

    # Even METIS's 0.1 % imbalance would shift every later block boundary in
    # `equal_blocks`; moving the few excess nodes makes the labels the store's blocks.
    rows = np.repeat(np.arange(num_nodes), np.diff(indptr))
    own = np.bincount(rows, weights=labels[indices] == labels[rows], minlength=num_nodes)
    del rows
    capacity = _block_sizes(num_nodes, num_partitions)
    sizes = np.bincount(labels, minlength=num_partitions)
    rebalanced = _rebalance(own, labels, sizes, capacity, np.random.default_rng(seed))
    return labels, {
        "edge_cuts": int(result.edge_cuts),
        "undirected_edges": int(num_undirected),
        "ufactor": _METIS_UFACTOR,
        "rebalanced_nodes": rebalanced,
        "metis_seconds": round(metis_seconds, 6),
    }


# -------------------------------------------------------------------------------- stream

_STREAM_MAX_ROUNDS = 64
"""Growth rounds per chunk before its leftovers wait for later chunks."""
_STREAM_REFINE_PASSES = 4
"""Refinement passes over the edges after the placement pass, at most."""
_STREAM_REFINE_STOP = 0.001
"""Refinement stops once a pass moves fewer than this share of the nodes."""
_STREAM_REFINE_SLACK = 0.03
"""Partitions may exceed their block size by this share during refinement."""


def _argmax_per_run(
    sorted_keys: np.ndarray, score: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Index of the best ``score`` in each run of equal ``sorted_keys``, ties at random.

    Two segmented maxima (score, then a random number among the tied) instead of a
    multi-key sort: linear time, which matters at millions of entries per chunk.

    Parameters
    ----------
    sorted_keys : ndarray of int64, shape (k,)
        Group of each entry, equal keys adjacent; ``k > 0``.
    score : ndarray of float64 or int64, shape (k,)

    Returns
    -------
    ndarray of int64, shape (number of runs,)
        One index into ``score`` per run, in run order.
    """
    first = np.ones(sorted_keys.shape[0], dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    starts = np.flatnonzero(first)
    run = np.cumsum(first) - 1
    top = score == np.maximum.reduceat(score, starts)[run]
    lottery = np.where(top, rng.random(score.shape[0]), -1.0)
    winner = np.flatnonzero(lottery == np.maximum.reduceat(lottery, starts)[run])
    # Two equal random doubles in one run are practically impossible; keep one anyway.
    keep = np.ones(winner.shape[0], dtype=bool)
    keep[1:] = run[winner[1:]] != run[winner[:-1]]
    return winner[keep]


def _assign_by_votes(
    voter: np.ndarray,
    voted: np.ndarray,
    labels: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """One LDG step for every unassigned ``voter`` at once.

    Each edge ``(voter[i], voted[i])`` ([m] int64 each, ``voted`` assigned) is a vote
    of ``voter[i]`` for partition ``labels[voted[i]]``. A voter picks
    ``argmax votes * (1 - size / capacity)`` (LDG's score, with the sizes before this
    step; random tie breaking). Winners are admitted in descending score up to each
    partition's room; voters whose best score is not positive (every neighbouring
    partition full) or that did not fit go to the partitions with the most room.
    """
    num_partitions = sizes.shape[0]
    keys, votes = unique(voter * num_partitions + labels[voted], return_counts=True)
    node, part = np.divmod(keys, num_partitions)
    # An empty trailing block has capacity 0: never a target (weight -inf).
    weight = np.full(num_partitions, -np.inf)
    open_ = capacity > 0
    weight[open_] = 1.0 - sizes[open_] / capacity[open_]
    score = votes * weight[part]

    best = _argmax_per_run(node, score, rng)
    node, part, score = node[best], part[best], score[best]

    # Admit by partition in descending score until it is full, so that one step never
    # overfills a partition however many voters chose it at once.
    good = score > 0
    order = _descending_within(part[good], score[good], rng)
    cand_node, cand_part = node[good][order], part[good][order]
    admitted = _group_rank(cand_part) < (capacity - sizes)[cand_part]
    labels[cand_node[admitted]] = cand_part[admitted]
    sizes += np.bincount(cand_part[admitted], minlength=num_partitions)

    rest = np.concatenate([node[~good], cand_node[~admitted]])
    _place_least_loaded(np.sort(rest), labels, sizes, capacity, rng)


def _grow(
    node_a: np.ndarray,
    node_b: np.ndarray,
    labels: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Place the unassigned endpoints of one chunk by LDG rounds.

    ``node_a`` / ``node_b`` are the chunk's [m] int64 edge endpoints listed in both
    directions. Returns ``(rounds, seeded_nodes)``.
    """
    seeds = sizes.shape[0]
    rounds = seeded = 0
    for _round in range(_STREAM_MAX_ROUNDS):
        # Edges whose first endpoint is placed cannot place anything any more.
        open_ = labels[node_a] < 0
        node_a, node_b = node_a[open_], node_b[open_]
        if node_a.shape[0] == 0:
            break
        rounds += 1
        votes = labels[node_b] >= 0
        if votes.any():
            _assign_by_votes(node_a[votes], node_b[votes], labels, sizes, capacity, rng)
            continue
        # Nothing to follow: seed a random sample, drawn from edge endpoints so that
        # it is degree-biased (hubs are good centres to grow from).
        candidates = unique(node_a[rng.integers(0, node_a.shape[0], size=seeds)])
        _place_least_loaded(candidates, labels, sizes, capacity, rng)
        seeded += candidates.shape[0]
        seeds *= 2
    return rounds, seeded


@dataclass(slots=True)
class _Refinement:
    """Per-node counters of one refinement pass: O(N) memory, int32 to halve it.

    During a pass over the edges, ``own`` and ``toward`` count each node's neighbours
    in its own partition and in ``target`` (the candidate found by the pass before),
    exactly; ``next_target`` / ``next_weight`` run a weighted Boyer-Moore majority vote
    over the chunk-local favourite other partitions, which finds the next candidate
    without a [N, p] table.
    """

    target: np.ndarray
    """[N] int32 candidate partition to move to, -1 for none."""
    own: np.ndarray
    """[N] int32 neighbours (both directions) in the node's current partition."""
    toward: np.ndarray
    """[N] int32 neighbours (both directions) in ``target``."""
    next_target: np.ndarray
    """[N] int32 candidate being voted for the next pass, -1 for none."""
    next_weight: np.ndarray
    """[N] int32 Boyer-Moore weight of ``next_target``."""

    @classmethod
    def empty(cls, num_nodes: int) -> _Refinement:
        def full(value: int) -> np.ndarray:
            return np.full(num_nodes, value, dtype=np.int32)

        return cls(full(-1), full(0), full(0), full(-1), full(0))

    def next_pass(self) -> _Refinement:
        fresh = _Refinement.empty(self.target.shape[0])
        fresh.target = self.next_target
        return fresh

    def observe(
        self,
        node_a: np.ndarray,
        node_b: np.ndarray,
        labels: np.ndarray,
        num_partitions: int,
        rng: np.random.Generator,
    ) -> None:
        """Add one chunk's edges ([m] int64 endpoints, both directions, all placed)."""
        num_nodes = labels.shape[0]
        label_a, label_b = labels[node_a], labels[node_b]
        same = label_a == label_b
        self.own += np.bincount(node_a[same], minlength=num_nodes).astype(np.int32)
        hit = label_b == self.target[node_a]
        self.toward += np.bincount(node_a[hit], minlength=num_nodes).astype(np.int32)

        other = ~same
        if not other.any():
            return
        keys, votes = unique(
            node_a[other] * num_partitions + label_b[other], return_counts=True
        )
        node, part = np.divmod(keys, num_partitions)
        best = _argmax_per_run(node, votes, rng)
        node, part, votes = node[best], part[best].astype(np.int32), votes[best]
        # Weighted Boyer-Moore: the favourite of this chunk adds to the running
        # candidate if it agrees, otherwise cancels against it and takes over when it
        # outweighs it. A partition holding most of a node's outside neighbours wins.
        held, weight = self.next_target[node], self.next_weight[node].astype(np.int64)
        agree = held == part
        keep = agree | (weight >= votes)
        self.next_target[node] = np.where(keep, held, part)
        self.next_weight[node] = np.where(
            agree, weight + votes, np.abs(weight - votes)
        ).astype(np.int32)


def _swap_toward_targets(
    state: _Refinement,
    labels: np.ndarray,
    sizes: np.ndarray,
    room: np.ndarray,
    rng: np.random.Generator,
) -> int:
    """Move every node whose exact gain is positive, if balance allows; returns moves.

    Gain is ``toward - own``: edges that stop being cut minus edges that start being
    cut, with the labels of the pass. Moves are first admitted in pairs, as many
    ``i -> j`` as ``j -> i`` (largest gains first), which keeps the sizes; the unpaired
    rest moves one way while the target stays within ``room`` ([p] int64, the
    capacities plus slack). ``labels``, ``sizes`` and ``state.own`` are updated.
    """
    num_partitions = sizes.shape[0]
    gain = state.toward.astype(np.int64) - state.own
    mover = np.flatnonzero((gain > 0) & (state.target >= 0))
    if mover.shape[0] == 0:
        return 0
    gain = gain[mover]
    frm, to = labels[mover], state.target[mover].astype(np.int64)
    pair = frm * num_partitions + to
    order = _descending_within(pair, gain, rng)
    mover, frm, to, pair, gain = mover[order], frm[order], to[order], pair[order], gain[order]
    pair_keys, pair_counts = unique(pair, return_counts=True)
    reverse = to * num_partitions + frm
    at = np.minimum(np.searchsorted(pair_keys, reverse), pair_keys.shape[0] - 1)
    reverse_count = np.where(pair_keys[at] == reverse, pair_counts[at], 0)
    swap = _group_rank(pair) < reverse_count
    labels[mover[swap]] = to[swap]
    state.own[mover[swap]] = state.toward[mover[swap]]

    # The unpaired rest moves one way while the target is below its slack capacity.
    rest = ~swap
    mover, frm, to, gain = mover[rest], frm[rest], to[rest], gain[rest]
    order = _descending_within(to, gain, rng)
    mover, frm, to = mover[order], frm[order], to[order]
    fits = _group_rank(to) < (room - sizes)[to]
    labels[mover[fits]] = to[fits]
    state.own[mover[fits]] = state.toward[mover[fits]]
    sizes += np.bincount(to[fits], minlength=num_partitions)
    sizes -= np.bincount(frm[fits], minlength=num_partitions)
    return int(swap.sum() + fits.sum())


@register_partitioner("stream")
def _stream(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Chunked, vectorised Linear Deterministic Greedy (LDG), then balanced refinement.

    Never holds the edge list: memory is the [N] int64 labels, five [N] int32 counters,
    [p] sizes and one chunk (a few arrays of ``2 * chunk_edges`` int64); the edges are
    read ``1 + _STREAM_REFINE_PASSES`` times at most through ``edges.iter_chunks``.
    Edges are used in both directions: a node follows its in- and out-neighbours alike.

    Placement pass, per chunk (`_grow`): rounds until every endpoint in the chunk is
    placed (at most ``_STREAM_MAX_ROUNDS``). Every unplaced endpoint with placed
    neighbours in the chunk votes for their partitions, and all voters are placed at
    once by LDG's rule ``argmax votes * (1 - size / capacity)`` (`_assign_by_votes`).
    When a round has no voter (the first chunk, or a region the stream reaches for the
    first time), a degree-biased random sample of unplaced endpoints is seeded into
    the least-loaded partitions; the sample doubles at each such stall, so a chunk of
    many small components needs few rounds. Nodes never seen in an edge (isolated)
    then fill the remaining room in id order.

    Refinement passes (balanced label propagation with exact gains in O(N) memory):
    each pass counts, for every node, its neighbours in its own partition and in a
    candidate partition found by the previous pass, and meanwhile elects the next
    candidate by a weighted majority vote over the chunks (`_Refinement`). After the
    pass, nodes with a positive gain move in balanced ``i <-> j`` pairs, and one way
    within a slack of ``_STREAM_REFINE_SLACK`` (`_swap_toward_targets`). It stops
    early when a pass moves fewer than ``_STREAM_REFINE_STOP`` of the nodes; then
    `_rebalance` moves the least-attached nodes out of the partitions over capacity.

    Capacities are the store's equal block sizes (``ceil(N / p)``, the last ones
    shorter): partitions end exactly full, so the labels already are the store's
    blocks and `equal_blocks` moves nothing. The result depends on the edge order and
    on ``chunk_edges`` (the placement sees one chunk at a time), and is deterministic
    for a given seed, edge order and chunk size.
    """
    num_nodes = edges.num_nodes
    rng = np.random.default_rng(seed)
    capacity = _block_sizes(num_nodes, num_partitions)
    labels = np.full(num_nodes, -1, dtype=np.int64)
    sizes = np.zeros(num_partitions, dtype=np.int64)

    def both_directions(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = src != dst
        return np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])

    growth_rounds = seeded = 0
    state = _Refinement.empty(num_nodes)
    for _, src, dst, _rel in edges.iter_chunks(chunk_edges):
        node_a, node_b = both_directions(src, dst)
        rounds, seeds = _grow(node_a, node_b, labels, sizes, capacity, rng)
        growth_rounds += rounds
        seeded += seeds
        # Elect first candidates already, with the labels of the chunks seen so far.
        placed = labels[node_b] >= 0
        state.observe(node_a[placed], node_b[placed], labels, num_partitions, rng)
    unplaced = np.flatnonzero(labels < 0)
    _place_least_loaded(unplaced, labels, sizes, capacity, rng)

    # Slack lets unpaired moves happen; `_rebalance` takes it back at the end.
    room = np.ceil(capacity * (1 + _STREAM_REFINE_SLACK)).astype(np.int64)
    moves = []
    for _pass in range(_STREAM_REFINE_PASSES):
        state = state.next_pass()
        for _, src, dst, _rel in edges.iter_chunks(chunk_edges):
            state.observe(*both_directions(src, dst), labels, num_partitions, rng)
        moves.append(_swap_toward_targets(state, labels, sizes, room, rng))
        if moves[-1] < _STREAM_REFINE_STOP * num_nodes:
            break
    rebalanced = _rebalance(state.own, labels, sizes, capacity, rng)

    return labels, {
        "growth_rounds": growth_rounds,
        "seeded_nodes": seeded,
        "placed_without_edges": int(unplaced.shape[0]),
        "refinement_moves": moves,
        "rebalanced_nodes": rebalanced,
    }
