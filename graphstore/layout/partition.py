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
- ``stream``: multilevel, for graphs METIS cannot hold (the converter's default above
  METIS's reach): the symmetrised graph goes to disk in row blocks, size-constrained
  label propagation coarsens it level by level, METIS partitions the small coarsest
  level, and balanced label propagation refines every level on the way back up. Memory:
  24 bytes per node of node state plus blocks sized to fit ``partition_memory_bytes``
  (default `PARTITION_MEMORY_BYTES`, 1 GiB; more when N needs it,
  `default_memory_bytes`). On the synthetic graphs with communities of
  ``tools/bench_partition.py`` (100k to 7.3M nodes) it cuts 1.01-1.09x METIS's edges,
  and at 7.3M nodes runs 7x faster in a sixteenth of the memory.

`partition_nodes` validates labels chunk by chunk, so it adds O(chunk) to a
partitioner's own memory. `store_order` then turns labels into the store order (both
id maps, file-backed) in O(chunk) memory whenever the label sizes are the equal block
sizes, which every built-in partitioner guarantees; otherwise it falls back to the
in-memory, O(N) `equal_blocks` path. ``metis`` remains O(E) and ``stream`` O(N) plus
its budget: only ``random`` and ``sequential`` make conversion memory independent of N.

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

import collections
import concurrent.futures
import functools
import itertools
import logging
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from graphstore._metis import metis_index_dtype, metis_parts
from graphstore.errors import ConfigError
from graphstore.layout._fast import unique
from graphstore.layout._native import partition as _compiled
from graphstore.layout._staging import FLUSH_BYTES, StagedEdges
from graphstore.layout.hashing import FeistelPermutation
from graphstore.registry import Registry

__all__ = [
    "PARTITIONERS",
    "PartitionResult",
    "Partitioner",
    "available_partitioners",
    "default_memory_bytes",
    "equal_blocks",
    "partition_nodes",
    "register_partitioner",
    "store_order",
]

logger = logging.getLogger(__name__)

NODE_CHUNK = 1 << 20
"""Nodes per step when a partitioner or check walks the [N] labels chunk by chunk."""

PARTITION_MEMORY_BYTES = 1 << 30
"""Default memory budget of the ``stream`` partitioner, raised to what the node state
of a graph needs (`default_memory_bytes`)."""

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
    memory_bytes : int
        Memory budget (bytes) for partitioners that can keep to one (``stream``); the
        others state their memory in their docstrings and ignore it.

    Returns
    -------
    labels : ndarray of int64, shape (N,)
        Partition of each node in ``[0, p)``; may be a disk-backed `numpy.memmap`
        (`partition_nodes` checks it chunk by chunk).
    info : dict
        JSON-safe facts about the run (``partition_nodes`` adds ``seconds``).
    """

    def __call__(
        self, edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int,
        memory_bytes: int,
    ) -> tuple[np.ndarray, dict[str, Any]]: ...


PARTITIONERS: Registry[Partitioner] = Registry("partitioner")
"""The partitioners by name; a new one registers with `register_partitioner`."""


def register_partitioner(name: str, *, summary: str | None = None) -> Callable[[Partitioner], Partitioner]:
    """Decorator that registers a `Partitioner` under ``name`` in `PARTITIONERS`, with a
    one-line ``summary`` for ``--help`` (default: the first line of its docstring).

    Raises
    ------
    ConfigError
        If ``name`` is already registered (a second registration would silently change
        what an existing store's ``partitioner`` attribute means).
    """
    return PARTITIONERS.register(name, summary=summary)


def available_partitioners() -> tuple[str, ...]:
    """Sorted names of the registered partitioners."""
    return PARTITIONERS.names()


def default_memory_bytes(num_nodes: int) -> int:
    """The ``stream`` budget when none is given: `PARTITION_MEMORY_BYTES`, or its O(N)
    node state plus 256 MiB of blocks when that is more (above about 33M nodes).

    Examples
    --------
    >>> default_memory_bytes(1000) == PARTITION_MEMORY_BYTES
    True
    >>> default_memory_bytes(100_000_000) // 2**20
    2544
    """
    return max(PARTITION_MEMORY_BYTES, _STREAM_NODE_BYTES * num_nodes + (256 << 20))


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
    partition_memory_bytes: int | None = None,
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
    partition_memory_bytes : int, optional
        Memory budget of ``stream`` (its arrays; the interpreter and libraries come on
        top); None: `default_memory_bytes`. The other partitioners ignore it.

    Returns
    -------
    PartitionResult
        ``labels`` [N] int64 in ``[0, p)`` (a memmap for ``random`` / ``sequential``);
        ``info`` always has ``seconds``. Feed it to `store_order` for the store order.

    Raises
    ------
    ConfigError
        Unknown ``method`` (the message lists the known names), ``p`` outside
        ``[1, N]``, a negative seed, ``chunk_edges < 1``, a
        ``partition_memory_bytes`` that is not a positive int, or (``stream``) one
        below what N nodes need.
    """
    partitioner = PARTITIONERS.get(method)
    num_nodes = int(edges.num_nodes)
    _check_num_partitions(num_partitions, num_nodes)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int (got {seed!r})")
    if chunk_edges < 1:
        raise ConfigError(f"chunk_edges must be >= 1 (got {chunk_edges})")
    if partition_memory_bytes is None:
        memory_bytes = default_memory_bytes(num_nodes)
    elif (isinstance(partition_memory_bytes, bool)
          or not isinstance(partition_memory_bytes, int | np.integer) or partition_memory_bytes < 1):
        raise ConfigError(
            f"partition_memory_bytes (--partition-memory) must be a positive int "
            f"(got {partition_memory_bytes!r})"
        )
    else:
        memory_bytes = int(partition_memory_bytes)

    began = time.perf_counter()
    labels, info = partitioner(edges, int(num_partitions), int(seed), int(chunk_edges),
                               memory_bytes)
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
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int, memory_bytes: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Source id order cut into contiguous equal blocks (keeps the source's locality).

    Written chunk by chunk to a disk-backed [N] int64 array: O(chunk) memory.
    """
    del seed, chunk_edges, memory_bytes  # deterministic and edge-free by definition
    num_nodes = edges.num_nodes
    size = _partition_size(num_nodes, num_partitions)
    labels = _disk_array(_labels_file(edges), num_nodes, np.int64)
    for start in range(0, num_nodes, NODE_CHUNK):
        stop = min(start + NODE_CHUNK, num_nodes)
        labels[start:stop] = np.arange(start, stop, dtype=np.int64) // size
        _release(labels)
    return labels, {}


_FEISTEL_ROUNDS = 4


class _FeistelPermutation(FeistelPermutation):
    """The ``random`` partitioner's seeded bijection of ``[0, n)``: round keys drawn from
    ``default_rng(seed)``, and the low bits of each round's hash (what its stores' labels
    were made with)."""

    def __init__(self, n: int, seed: int) -> None:
        keys = np.random.default_rng(seed).integers(
            0, 2**64 - 1, size=_FEISTEL_ROUNDS, dtype=np.uint64, endpoint=True
        )
        super().__init__(n, keys, round_bits="low")


@register_partitioner("random")
def _random(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int, memory_bytes: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """A seeded pseudo-random permutation cut into equal groups (MariusGNN's default).

    ``label(i) = perm(i) // partition_size`` with ``perm`` a seeded bijection of
    ``[0, N)`` (`_FeistelPermutation`): the group sizes equal the store's block sizes,
    so `equal_blocks` / `store_order` keep them intact. Computed chunk by chunk into a
    disk-backed [N] int64 array: O(chunk) memory.
    """
    del chunk_edges, memory_bytes  # O(chunk) by construction
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
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int, memory_bytes: int
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
    del memory_bytes  # METIS needs the whole graph; nothing to trade for memory
    num_nodes = edges.num_nodes
    if num_partitions == 1:
        return np.zeros(num_nodes, dtype=np.int64), {"edge_cuts": 0}

    # Built in METIS's own index dtype: the CSR of both directions is the peak memory.
    indptr, indices, num_undirected = _symmetric_csr(edges, chunk_edges, metis_index_dtype())
    began = time.perf_counter()
    labels, edge_cuts = metis_parts(indptr, indices, num_partitions, seed=seed, ufactor=_METIS_UFACTOR)
    metis_seconds = time.perf_counter() - began

    # Even METIS's 0.1 % imbalance would shift every later block boundary in
    # `equal_blocks`; moving the few excess nodes makes the labels the store's blocks.
    rows = np.repeat(np.arange(num_nodes), np.diff(indptr))
    own = np.bincount(rows, weights=labels[indices] == labels[rows], minlength=num_nodes)
    del rows
    capacity = _block_sizes(num_nodes, num_partitions)
    sizes = np.bincount(labels, minlength=num_partitions)
    rebalanced = _rebalance(own, labels, sizes, capacity, np.random.default_rng(seed))
    return labels, {
        "edge_cuts": edge_cuts,
        "undirected_edges": int(num_undirected),
        "ufactor": _METIS_UFACTOR,
        "rebalanced_nodes": rebalanced,
        "metis_seconds": round(metis_seconds, 6),
    }


# -------------------------------------------------------------------------------- stream

_STREAM_NODE_BYTES = 24
"""Bytes per node of ``stream``'s O(N) state at its peak: int32 cluster ids, sizes and
cluster map while coarsening; int16 labels, float32 own-partition weights and the int32
node order beside the int64 labels it returns at the end."""
_STREAM_RAW_ENTRY_BYTES = 32
"""Peak bytes per raw (row, column) entry while a block's CSR is built, and per entry of
a block being worked on (its CSR, gathered ids, weights and scores)."""
_STREAM_STAGED_EDGE_BYTES = 96
"""Peak bytes per staged edge of a chunk during the distribution pass (both directions,
block ids, the sort order)."""
_STREAM_BLOCK_ENTRIES = 1 << 22
"""Entries per disk block at most: building a block's CSR scatters over the block, which
runs about twice as fast when the block stays within the processor's caches."""
_STREAM_MIN_BLOCK_BYTES = 16 << 20
"""The budget must leave at least this much beside the O(N) state for the blocks."""
_STREAM_GROUPS = 16
"""Row groups per pass, at least: moves are decided for a whole group at once from the
state before it, so two neighbours in one group can swap past each other; with rows in
a random order a group holds 1/16 of a node's neighbours on average."""
_STREAM_CLUSTER_PASSES = 2
"""Label-propagation passes per coarsening level: the next level catches what they
miss, and at the input level each pass costs a sweep over all the edges."""
_STREAM_REFINE_PASSES = 2
"""Refinement passes per level on the way back up: one within the slack, then (at the
input level) one that restores the exact block sizes. A single exact pass cut 20 %
more edges on a 400k-node graph: full partitions only take nodes by swaps there."""
_STREAM_STOP = 0.002
"""A pass that moves fewer than this share of the nodes ends its loop."""
_STREAM_CLUSTER_SHARE = 8
"""A cluster weighs at most ``partition_size // 8`` nodes, so the coarsest graph still has
at least 8 nodes per partition for METIS to arrange."""
_STREAM_COARSEST_PER_PART = 16
"""Coarsening stops at ``16 * p`` nodes (or when a level shrinks by less than 10 %)."""
_STREAM_METIS_BYTES = 96
"""METIS's memory per entry plus node of the graph it is given, about (64-bit arrays,
and its own coarser copies): the coarsest level must fit the block budget by it."""
_STREAM_METIS_UFACTOR = 30
"""METIS's imbalance on the coarsest graph (3 %): coarse nodes are lumps of up to
``partition_size / 8`` nodes, so a tight balance there would cost cut for nothing; the
input level restores the exact block sizes."""
_STREAM_SLACK = 0.03
"""Partitions may exceed their block size by this share while levels are refined."""
_STREAM_MAX_THREADS = 4
"""Threads per group at most: the work is memory-bound, more rarely pays."""
_WRITES_IN_FLIGHT = 1
"""Prepared pieces a level builder holds while its writer thread writes another."""


_USE_COMPILED = True
"""Whether the stream partitioner runs its per-row work in C (`graphstore.layout._native.partition`)
when the library is built; the numpy path computes the same results (tests compare them)."""


def _kernels():
    """The compiled kernels' module, or None for the numpy path."""
    return _compiled if _USE_COMPILED and _compiled.library() is not None else None


def _stream_budget(num_nodes: int, memory_bytes: int) -> int:
    """Bytes left for blocks beside the O(N) state; ConfigError when there are too few."""
    node_bytes = _STREAM_NODE_BYTES * num_nodes
    need = node_bytes + _STREAM_MIN_BLOCK_BYTES
    if memory_bytes < need:
        raise ConfigError(
            f"partition_memory_bytes (--partition-memory) must be at least {need} "
            f"({-(-need // (1 << 20))} MiB) for the stream partitioner on {num_nodes} nodes "
            f"(got {memory_bytes}); raise it or use another partitioner"
        )
    return memory_bytes - node_bytes


def _stream_threads() -> int:
    """Threads for the per-group work: the CPUs this process may use, at most
    `_STREAM_MAX_THREADS` (the results do not depend on it)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(available, _STREAM_MAX_THREADS))


class _Workers:
    """The threads of one `_stream` run (none beyond the caller's when ``threads`` is 1)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="stream") if threads > 1 else None

    def map(self, fn: Callable[..., Any], *iterables: Any) -> list[Any]:
        """``list(map(fn, *iterables))``, on the threads; results in order."""
        if self._executor is None:
            return list(map(fn, *iterables))
        return list(self._executor.map(fn, *iterables))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(*args)`` on a thread (there is one at least when ``threads > 1``)."""
        assert self._executor is not None, "submit needs threads > 1"  # internal contract
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        """Wait for the threads and stop them (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


def _stream_order(num_nodes: int, seed: int) -> np.ndarray:
    """[N] int32 internal id of each source node: a seeded random permutation.

    Rows are processed in groups of consecutive internal ids; a random order makes every
    group a random sample of the graph whatever the source's numbering (so synchronous
    moves inside a group rarely involve two neighbours, and blocks are even), and makes
    ties broken by position random ones.
    """
    return np.random.default_rng([seed, 0x5EED]).permutation(np.arange(num_nodes, dtype=np.int32))


def _write_flat(path: str, array: np.ndarray) -> None:
    """Write ``array``'s bytes to a new file and wait until they are on disk.

    The pages stay cached, clean: each pass reads the block again, and under a cgroup
    memory cap clean pages can be reclaimed where dirty ones could not.
    """
    with open(path, "wb") as f:
        array.tofile(f)
        f.flush()
        os.fdatasync(f.fileno())


@dataclass(slots=True)
class _Level:
    """One level of the multilevel hierarchy: a symmetric weighted graph in row blocks.

    Level 0 is the input graph in internal ids (`_stream_order`), each edge in both
    directions, duplicates summed into weights, self loops dropped. Level ``l + 1``
    contracts the clusters of level ``l`` into nodes.
    """

    num_nodes: int
    """n, the nodes of this level."""
    node_weight: np.ndarray | None
    """[n] int64 input nodes inside each node; None at level 0 (all 1)."""
    bounds: np.ndarray
    """[B + 1] int64: block ``b`` holds the rows ``[bounds[b], bounds[b + 1])``."""
    blocks: list[Any]
    """Per block, ``(indptr, indices, data)`` in memory or the path prefix of its files:
    indptr [rows + 1] int32, indices [nnz] int32, data [nnz] float64 (summed weights;
    columns distinct within a row, in no particular order). Level 0 has no data: each entry
    weighs 1 and a duplicate edge is its entries repeated (``data`` None), which every pass
    sums per label as it would a merged entry's multiplicity; its rows are grouped, not
    sorted or merged, which saved a sort of every row of the input."""
    data_dtype: np.dtype | None
    """Dtype of the blocks' ``data``; None at level 0 (no data)."""
    num_entries: int
    """Stored entries (each undirected edge twice)."""

    @property
    def unit(self) -> bool:
        """Every node weighs 1 (the input level)."""
        return self.node_weight is None

    def weights(self, nodes: slice) -> np.ndarray:
        """[k] int64 weights of a slice of nodes."""
        if self.node_weight is None:
            return np.ones(len(range(*nodes.indices(self.num_nodes))), dtype=np.int64)
        return self.node_weight[nodes]

    def total_weight(self) -> np.ndarray:
        """[n] int64 node weights (a fresh array of ones at level 0)."""
        if self.node_weight is None:
            return np.ones(self.num_nodes, dtype=np.int64)
        return self.node_weight

    def block(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Block ``b``'s ``(indptr, indices, data)``, read from disk if it lives there."""
        stored = self.blocks[b]
        if not isinstance(stored, str):
            return stored
        return (np.fromfile(stored + ".indptr", dtype=np.int32),
                np.fromfile(stored + ".indices", dtype=np.int32),
                None if self.data_dtype is None else np.fromfile(stored + ".data", dtype=self.data_dtype))

    def count_isolated(self) -> int:
        """Nodes without a neighbour (reads only the blocks' ``indptr``)."""
        count = 0
        for stored in self.blocks:
            indptr = stored[0] if not isinstance(stored, str) else \
                np.fromfile(stored + ".indptr", dtype=np.int32)
            count += int(np.count_nonzero(indptr[1:] == indptr[:-1]))
        return count

    @property
    def num_groups(self) -> int:
        """Row groups per pass (see `groups`)."""
        return len(self.blocks) * -(-_STREAM_GROUPS // max(len(self.blocks), 1))

    def groups(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Yield ``(first_row, indptr, indices, data)`` per row group, in row order.

        At least `_STREAM_GROUPS` groups; blocks are sliced, not copied (``indptr``
        rebased to the group). Empty groups are skipped.
        """
        per_block = self.num_groups // max(len(self.blocks), 1)
        for b in range(len(self.blocks)):
            indptr, indices, data = self.block(b)
            lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
            cuts = np.linspace(0, hi - lo, per_block + 1).astype(np.int64)
            for start, stop in itertools.pairwise(cuts.tolist()):
                if stop == start:
                    continue
                first, last = int(indptr[start]), int(indptr[stop])
                yield (lo + start, indptr[start : stop + 1] - first,
                       indices[first:last], None if data is None else data[first:last])
            del indptr, indices, data

    def drop(self) -> None:
        """Delete the block files and forget the blocks (idempotent)."""
        for stored in self.blocks:
            if isinstance(stored, str):
                for suffix in (".indptr", ".indices", ".data"):
                    if os.path.exists(stored + suffix):
                        os.unlink(stored + suffix)
        self.blocks = []


class _LevelBuilder:
    """Collects (row, column, weight) entries of a level and sorts them into row blocks.

    Entries arrive in any order (a chunk of edges, a contracted group). When the level's
    entries fit half the block budget at once (``max_entries`` bounds them) they are
    kept in memory as one block; otherwise each entry is appended to its row block's
    scratch file, and `finish` turns each file into that block's CSR (distinct columns,
    weights summed), on disk. `prepare` (pure: safe in a worker thread) and `write`
    (in order) split `add` so that a caller can overlap them.
    """

    def __init__(self, num_nodes: int, max_entries: int, block_bytes: int, directory: str,
                 name: str, *, weighted: bool) -> None:
        self.num_nodes = num_nodes
        # Level 0 keeps no weights (see `_Level.blocks`); the summed weights of coarse
        # levels can pass 2**24, hence float64.
        self.data_dtype = np.dtype(np.float64) if weighted else None
        self.weighted = weighted
        self.directory = directory
        self.name = name
        # Half the budget, shared by the blocks built at once (one per thread, at most
        # `_STREAM_MAX_THREADS`: a fixed share, so that the blocks, hence the groups and
        # the result, do not depend on the threads); the other half is the level being
        # read while this one grows.
        fit = max(1, block_bytes // 2 // _STREAM_RAW_ENTRY_BYTES)
        self.in_memory = max_entries <= fit
        per_block = fit if self.in_memory else \
            max(1, min(fit // _STREAM_MAX_THREADS, _STREAM_BLOCK_ENTRIES))
        num_blocks = max(1, min(-(-max_entries // per_block), num_nodes))
        self.rows_per_block = -(-num_nodes // num_blocks)
        self.bounds = np.minimum(np.arange(num_blocks + 1, dtype=np.int64) * self.rows_per_block,
                                 num_nodes)
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._writer: ThreadPoolExecutor | None = None
        self._pending: collections.deque = collections.deque()
        self._counts = np.zeros(num_blocks, dtype=np.int64)
        self._unflushed = np.zeros(num_blocks, dtype=np.int64)

    def _raw(self, b: int) -> str:
        return os.path.join(self.directory, f"{self.name}_raw{b}")

    def prepare(self, rows: np.ndarray, cols: np.ndarray, weights: np.ndarray | None) -> Any:
        """[m] int32 ``rows`` and ``cols`` (level ids) with [m] weights (None: 1), sorted
        into blocks; hand the result to `write`."""
        if self.in_memory or rows.shape[0] == 0:
            return rows, cols, weights
        block = rows // self.rows_per_block
        # One int64 per entry holding (column, row within its block) as two int32 in
        # memory order, so the shuffle below moves one array instead of two.
        packed = (rows - self.bounds[block]).astype(np.int64)
        if np.little_endian:
            packed <<= 32
            packed |= cols.astype(np.int64) & 0xFFFFFFFF
        else:
            packed |= cols.astype(np.int64) << 32
        # A stable sort of 16-bit keys is a radix sort: linear in the chunk.
        narrow = np.uint16 if len(self._counts) <= 1 << 16 else np.int64
        order = np.argsort(block.astype(narrow), kind="stable")
        counts = np.bincount(block, minlength=len(self._counts))
        del block
        pair = packed[order].view(np.int32).reshape(-1, 2)
        del packed
        weights = None if weights is None else weights[order]
        return counts, pair, weights

    def write(self, prepared: Any) -> None:
        """Append what `prepare` returned: to memory, or to each block's scratch file.

        The files are written on the builder's own thread, in order, while the caller goes
        on (the next chunk or group is read and prepared meanwhile: written on the caller's
        thread, the writes left the workers idle for 3-4 s of each 7 s edge pass at 8M
        nodes); at most `_WRITES_IN_FLIGHT` prepared pieces wait, which the chunk sizes
        count. `finish` (or `close`) waits for them and raises what a write raised.
        """
        if self.in_memory:
            if prepared[0].shape[0]:
                self._parts.append(prepared)
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="stream-write")
        self._pending.append(self._writer.submit(self._write_files, prepared))
        while len(self._pending) > _WRITES_IN_FLIGHT:
            self._pending.popleft().result()

    def _drain(self) -> None:
        """Wait for the pending writes; the first error among them is raised."""
        while self._pending:
            self._pending.popleft().result()

    def close(self, *, quiet: bool = False) -> None:
        """Wait for the writer thread and stop it (idempotent). A write's error is raised,
        unless ``quiet`` (the caller is already raising another: the scratch directory is
        removed after this returns, never under a running write)."""
        try:
            if quiet:
                concurrent.futures.wait(self._pending)
            else:
                self._drain()
        finally:
            self._pending.clear()
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None

    def _write_files(self, prepared: Any) -> None:
        counts, pair, weights = prepared
        start = 0
        for b in np.flatnonzero(counts).tolist():
            stop = start + int(counts[b])
            self._append(self._raw(b) + ".ids", pair[start:stop], b)
            if self.weighted:
                self._append(self._raw(b) + ".w", weights[start:stop].astype(self.data_dtype), b)
            self._counts[b] += stop - start
            start = stop

    def _append(self, path: str, array: np.ndarray, b: int) -> None:
        # Opened per write: a level can have more blocks than a process has descriptors.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            view = memoryview(np.ascontiguousarray(array)).cast("B")
            while view:
                view = view[os.write(fd, view):]
            self._unflushed[b] += array.nbytes
            if self._unflushed[b] >= FLUSH_BYTES:
                # Written once, read once: not worth the page cache, and dirty pages
                # under a cgroup v1 cap are not reclaimable until written back.
                os.fdatasync(fd)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self._unflushed[b] = 0
        finally:
            os.close(fd)

    def add(self, rows: np.ndarray, cols: np.ndarray, weights: np.ndarray | None) -> None:
        """`prepare` then `write`."""
        self.write(self.prepare(rows, cols, weights))

    def _csr(self, rows: np.ndarray, cols: np.ndarray, weights: np.ndarray | None,
             num_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Unweighted (level 0): the entries grouped by row, as they come; weighted: merged."""
        import scipy.sparse

        if self.weighted and weights is None:  # an empty block of a weighted level
            weights = np.ones(rows.shape[0], dtype=self.data_dtype)
        kernels = _kernels()
        if kernels is not None:
            built = kernels.csr(rows, cols, weights if self.weighted else None, num_rows,
                                self.data_dtype or np.float64)
            if built is not None:  # None past 2**31 entries
                return built
        if not self.weighted:
            # A stable sort by row keeps each row's entries in arrival order, as the kernel does.
            order = np.argsort(rows, kind="stable")
            indptr = np.zeros(num_rows + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=num_rows), out=indptr[1:])
            return indptr.astype(np.int32), cols[order].astype(np.int32, copy=False), None
        if weights is None:
            weights = np.ones(rows.shape[0], dtype=self.data_dtype)
        matrix = scipy.sparse.coo_matrix(
            (weights.astype(self.data_dtype, copy=False), (rows, cols)),
            shape=(num_rows, self.num_nodes),
        ).tocsr()  # sums duplicates, sorts columns within a row
        return (matrix.indptr.astype(np.int32, copy=False),
                matrix.indices.astype(np.int32, copy=False),
                matrix.data.astype(self.data_dtype, copy=False))

    def _build_block(self, b: int) -> tuple[str, int]:
        """Block ``b``'s scratch file into its CSR files; returns (path prefix, entries)."""
        count = int(self._counts[b])
        raw = self._raw(b)
        pair = np.fromfile(raw + ".ids", dtype=np.int32).reshape(-1, 2) if count else \
            np.zeros((0, 2), np.int32)
        weights = np.fromfile(raw + ".w", dtype=self.data_dtype) if self.weighted and count else None
        for suffix in (".ids", ".w"):
            if os.path.exists(raw + suffix):
                os.unlink(raw + suffix)
        num_rows = int(self.bounds[b + 1] - self.bounds[b])
        # Stored as (column, row): see `prepare`.
        indptr, indices, data = self._csr(pair[:, 1], pair[:, 0], weights, num_rows)
        del pair, weights
        prefix = os.path.join(self.directory, f"{self.name}_block{b}")
        _write_flat(prefix + ".indptr", indptr)
        _write_flat(prefix + ".indices", indices)
        if data is not None:
            _write_flat(prefix + ".data", data)
        return prefix, indices.shape[0]

    def finish(self, node_weight: np.ndarray | None, workers: _Workers) -> _Level:
        """The level, once every entry is in (the scratch files are removed); blocks are
        built on the ``workers``' threads, one each at a time."""
        if self.in_memory:
            parts, self._parts = self._parts, []
            rows = np.concatenate([p[0] for p in parts] or [np.zeros(0, np.int32)])
            cols = np.concatenate([p[1] for p in parts] or [np.zeros(0, np.int32)])
            weights = None
            if any(p[2] is not None for p in parts):
                weights = np.concatenate([np.ones(p[0].shape[0], self.data_dtype) if p[2] is None
                                          else p[2] for p in parts])
            del parts
            block = self._csr(rows, cols, weights, self.num_nodes)
            del rows, cols, weights
            return _Level(self.num_nodes, node_weight, self.bounds, [block], self.data_dtype,
                          block[1].shape[0])
        self.close()
        blocks = range(len(self._counts))
        built = workers.map(self._build_block, blocks)
        return _Level(self.num_nodes, node_weight, self.bounds, [prefix for prefix, _ in built],
                      self.data_dtype, sum(entries for _, entries in built))


def _aggregate(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, assign: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a group, the summed edge weight toward each ``assign`` of its neighbours
    (``data`` None: 1 an entry, as float32).

    A CSR whose column is ``assign[column]``, duplicates summed: scipy's per-row sort and
    merge, no global sort and no [rows, width] table.

    Returns
    -------
    indptr : ndarray of int32, shape (rows + 1,)
    rows : ndarray of int32, shape (k,)
        Row (within the group) of each entry.
    targets : ndarray of int32, shape (k,)
        Distinct and ascending within a row.
    weights : ndarray, shape (k,)
    """
    import scipy.sparse

    num_rows = indptr.shape[0] - 1
    data = np.ones(indices.shape[0], dtype=np.float32) if data is None else data.copy()
    matrix = scipy.sparse.csr_matrix((data, assign[indices], indptr), shape=(num_rows, width))
    matrix.sum_duplicates()
    rows = np.repeat(np.arange(num_rows, dtype=np.int32), np.diff(matrix.indptr))
    return matrix.indptr, rows, matrix.indices, matrix.data


def _tie_break(targets: np.ndarray, salt: int) -> np.ndarray:
    """[k] float64 in [0, 0.5): a pseudo-random priority of each target under ``salt``.

    A hash of the target, not of the entry: every row of a group prefers the same one
    among equally heavy targets, so rows agree (which is what grows clusters), and the
    next group, with another salt, prefers another. Weights are sums of integers, so
    adding it never reorders unequal weights.
    """
    # Multiplicative hashing of the salted id; the top 16 bits are the well mixed ones.
    mix = targets.astype(np.uint32) ^ np.uint32(salt)
    mix *= np.uint32(0x9E3779B1)
    mix >>= np.uint32(16)
    return mix * (0.5 / 65536)


def _choose(
    indptr: np.ndarray,
    rows: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    own: np.ndarray,
    allowed: np.ndarray | None,
    salt: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: its weight toward its own target, and the heaviest allowed other target.

    Arrays as `_aggregate` returns them; ``own`` [rows] the rows' current targets;
    ``allowed`` [k] bool (changed in place), or None for all. Equal weights go by
    `_tie_break` under ``salt``.

    Returns
    -------
    own_weight : ndarray of float64, shape (rows,)
    best : ndarray of int64, shape (rows,)
        The chosen target, -1 where no other target is allowed.
    best_weight : ndarray of float64, shape (rows,)
    """
    num_rows = own.shape[0]
    is_own = targets == own[rows]
    own_weight = np.zeros(num_rows)
    own_weight[rows[is_own]] = weights[is_own]
    score = _tie_break(targets, salt)
    score += weights
    np.putmask(score, is_own if allowed is None else ~allowed | is_own, -1.0)
    # NaN where nothing is allowed: no entry equals it.
    top = np.full(num_rows, np.nan)
    nonempty = np.flatnonzero(indptr[:-1] < indptr[1:])
    if nonempty.shape[0]:
        top[nonempty] = np.maximum.reduceat(score, indptr[:-1][nonempty])
    top[top < 0] = np.nan
    win = np.flatnonzero(score == top[rows])
    first = np.ones(win.shape[0], dtype=bool)
    first[1:] = rows[win[1:]] != rows[win[:-1]]
    win = win[first]
    best = np.full(num_rows, -1, dtype=np.int64)
    best_weight = np.zeros(num_rows)
    best[rows[win]] = targets[win]
    best_weight[rows[win]] = weights[win]
    return own_weight, best, best_weight


def _admit(target: np.ndarray, gain: np.ndarray, weight: np.ndarray, room: np.ndarray) -> np.ndarray:
    """[m] bool: which of m movers fit, per target largest gain first, while the summed
    ``weight`` of those admitted stays within their target's ``room``.

    ``target`` [m] int, ``gain`` [m] float, ``weight`` [m] int, ``room`` [m] int (the room
    of each mover's target). One step can therefore never overfill a target however many
    movers chose it at once. Equal gains go by position, which is random (rows are in
    the random internal order).
    """
    order = np.lexsort((-gain, target))
    sorted_target = target[order]
    running = np.cumsum(weight[order])
    first = np.ones(order.shape[0], dtype=bool)
    first[1:] = sorted_target[1:] != sorted_target[:-1]
    before_group = np.maximum.accumulate(np.where(first, running - weight[order], 0))
    fits = np.empty(order.shape[0], dtype=bool)
    fits[order] = running - before_group <= room[order]
    return fits


def _in_pieces(
    workers: _Workers,
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    work: Callable[[int, np.ndarray, np.ndarray, np.ndarray], Any],
) -> list[Any]:
    """``work(first_row, indptr, indices, data)`` on consecutive row ranges of a group,
    about equal in entries, one per thread of ``workers``.

    The pieces only read shared state, so the results, returned in row order, are the
    same whatever the number of threads. The heavy steps (scipy's sorts, numpy's
    gathers) release the GIL, which is what the threads buy.
    """
    num_rows = indptr.shape[0] - 1
    pieces = min(workers.threads, max(1, num_rows))
    if pieces == 1:
        return [work(0, indptr, indices, data)]
    cuts = np.searchsorted(indptr, np.linspace(0, int(indptr[-1]), pieces + 1)[1:-1])
    bounds = [0, *sorted(set(np.clip(cuts, 0, num_rows).tolist())), num_rows]

    def run(lo: int, hi: int) -> Any:
        first, last = int(indptr[lo]), int(indptr[hi])
        return work(lo, indptr[lo : hi + 1] - first, indices[first:last],
                    None if data is None else data[first:last])

    return workers.map(run, bounds[:-1], bounds[1:])


def _cluster_decide(
    lo: int, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, *,
    assign: np.ndarray, size: np.ndarray, full: np.ndarray | None, weight: np.ndarray,
    own: np.ndarray, max_weight: int, salt: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_choose` for rows ``lo...`` of a group in `_cluster` (a `_in_pieces` work item).

    A cluster is allowed when the row fits in it: with unit weights (``full`` given)
    when it is not full, a 1-byte gather instead of an 8-byte one.
    """
    kernels = _kernels()
    if kernels is not None:
        mine = own[lo : lo + indptr.shape[0] - 1]
        if full is not None:
            return kernels.choose(indptr, indices, data, assign, mine, salt, mask=full, mask_want=False)
        return kernels.choose(indptr, indices, data, assign, mine, salt, load=size, cap=max_weight,
                              row_weight=weight[lo : lo + indptr.shape[0] - 1])
    ptr, rows, targets, weights = _aggregate(indptr, indices, data, assign, assign.shape[0])
    if full is not None:
        allowed = ~full[targets]
    else:
        allowed = size[targets] + weight[lo + rows] <= max_weight
    return _choose(ptr, rows, targets, weights, own[lo : lo + ptr.shape[0] - 1], allowed, salt)


def _cluster(level: _Level, max_weight: int, rng: np.random.Generator,
             workers: _Workers) -> tuple[np.ndarray, int, list[int]]:
    """Size-constrained label propagation: clusters of at most ``max_weight`` nodes.

    Every node starts alone; each pass visits the row groups in order and moves every
    node of a group at once to the neighbouring cluster it has the most edge weight to,
    among those it fits in (equal weights: `_tie_break`'s choice, common to the group,
    which lets clusters agree; equal to its own cluster's: the larger one, which is how
    clusters grow past pairs). Nodes without neighbours are then packed into clusters
    of consecutive ids. Returns ``(cluster, num_clusters, moves per pass)`` with [n]
    int32 ``cluster`` in ``[0, num_clusters)``.
    """
    n = level.num_nodes
    assign = np.arange(n, dtype=np.int32)
    # int32: a cluster never exceeds max_weight (at most a partition).
    size = np.ones(n, dtype=np.int32) if level.unit else level.node_weight.astype(np.int32)
    full = size >= max_weight  # unit weights: fits iff not full, a 1-byte gather
    has_edges = np.zeros(n, dtype=bool)
    moves = []
    for _pass in range(_STREAM_CLUSTER_PASSES):
        moved = 0
        for first, indptr, indices, data in level.groups():
            count = indptr.shape[0] - 1
            nodes = slice(first, first + count)
            if _pass == 0:
                has_edges[nodes] = indptr[1:] > indptr[:-1]
            own = assign[nodes]
            weight = level.weights(nodes)
            decide = functools.partial(
                _cluster_decide, assign=assign, size=size, full=full if level.unit else None,
                weight=weight, own=own, max_weight=max_weight, salt=int(rng.integers(2**32)))
            parts = _in_pieces(workers, indptr, indices, data, decide)
            own_weight, best, best_weight = (np.concatenate(x) for x in zip(*parts, strict=True))
            del parts
            gain = best_weight - own_weight
            go = (best >= 0) & ((gain > 0) | ((gain == 0) & (size[np.maximum(best, 0)] >= size[own])))
            local = np.flatnonzero(go)
            if local.shape[0] == 0:
                continue
            to = best[local]
            fits = _admit(to, gain[local], weight[local], max_weight - size[to])
            local, to = local[fits], to[fits]
            np.subtract.at(size, own[local], weight[local].astype(np.int32))
            np.add.at(size, to, weight[local].astype(np.int32))
            full[to] = size[to] >= max_weight
            full[own[local]] = size[own[local]] >= max_weight
            assign[first + local] = to
            moved += local.shape[0]
        moves.append(moved)
        if moved < _STREAM_STOP * n:
            break
    # Nodes without neighbours never move: pack them, in id order, into clusters of
    # about max_weight (a level of isolated singletons would never shrink).
    lonely = np.flatnonzero(~has_edges)
    if lonely.shape[0]:
        weight = level.total_weight()[lonely]
        offset = (np.cumsum(weight) - weight) // max_weight
        assign[lonely] = assign[lonely[np.searchsorted(offset, offset)]]
    used = np.zeros(n, dtype=bool)
    used[assign] = True
    new_id = np.cumsum(used, dtype=np.int32)
    new_id -= 1
    return new_id[assign], int(new_id[-1]) + 1, moves


def _contract(level: _Level, cluster: np.ndarray, num_clusters: int, block_bytes: int,
              directory: str, name: str, workers: _Workers) -> _Level:
    """The graph of the clusters: edge weights summed, edges inside a cluster dropped."""
    builder = _LevelBuilder(num_clusters, level.num_entries, block_bytes, directory, name,
                            weighted=True)
    try:
        return _fill_contracted(builder, level, cluster, num_clusters, workers)
    except BaseException:
        builder.close(quiet=True)
        raise


def _fill_contracted(builder: _LevelBuilder, level: _Level, cluster: np.ndarray, num_clusters: int,
                     workers: _Workers) -> _Level:
    """`_contract`'s pass over the level, then the coarser level."""
    for first, indptr, indices, data in level.groups():

        def emit(lo, indptr, indices, data, first=first):
            kernels = _kernels()
            if kernels is not None:
                entries = kernels.contract(indptr, indices, data, cluster, first + lo)
            else:
                _ptr, rows, targets, weights = _aggregate(indptr, indices, data, cluster, num_clusters)
                rows = cluster[first + lo + rows]
                keep = rows != targets
                entries = rows[keep], targets[keep], weights[keep].astype(np.float64)
            # Sorted into the builder's blocks here, on the worker (`prepare` is pure):
            # on the main thread it was a sixth of the partitioner's serial time.
            return builder.prepare(*entries)

        for prepared in _in_pieces(workers, indptr, indices, data, emit):
            builder.write(prepared)
    node_weight = np.bincount(cluster, weights=None if level.unit else level.node_weight,
                              minlength=num_clusters)
    return builder.finish(node_weight.astype(np.int64), workers)


def _refine(
    level: _Level,
    labels: np.ndarray,
    part_weight: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
    workers: _Workers,
    *,
    final: bool,
    own_out: np.ndarray | None = None,
) -> list[int]:
    """Balanced label propagation on partitions, then (``final``) exact block sizes.

    A node moves to the partition it has the most edge weight to when that beats its own
    partition's and the target stays within its capacity plus `_STREAM_SLACK`; row
    groups in order, each decided at once and admitted largest gain first (`_admit`).
    With unit weights, movers whose target is full trade places pairwise (`_swaps`),
    which keeps the sizes. With ``final`` the last pass allows no slack and also empties
    the partitions over ``capacity``: in each group, up to its share of a partition's
    excess leaves, best (least negative) gain first, for neighbouring partitions with
    room. ``labels`` ([n] int16 or int32) and ``part_weight`` ([p] int64) are updated in
    place; ``own_out`` ([n] float32) receives each node's weight toward its partition
    after the last pass (for `_rebalance`). Returns the moves per pass.
    """
    num_partitions = part_weight.shape[0]
    slack = np.ceil(capacity * (1 + _STREAM_SLACK)).astype(np.int64)
    moves = []
    passes = _STREAM_REFINE_PASSES
    for index in range(passes):
        last = index == passes - 1 or (index > 0 and moves[-1] < _STREAM_STOP * level.num_nodes)
        exact = final and last
        limit = capacity if exact else slack
        groups_left = level.num_groups
        moved = 0
        for first, indptr, indices, data in level.groups():
            count = indptr.shape[0] - 1
            nodes = slice(first, first + count)
            own = labels[nodes]
            weight = level.weights(nodes)
            # Exact pass: this group's share of each partition's excess must leave, at
            # any gain, for a partition with room.
            quota = -(-np.maximum(part_weight - capacity, 0) // max(groups_left, 1)) if exact else None
            decide = functools.partial(
                _refine_decide, labels=labels, part_weight=part_weight,
                limit=None if level.unit else limit, weight=weight, own=own, quota=quota,
                has_room=part_weight < capacity, salt=int(rng.integers(2**32)))
            parts = _in_pieces(workers, indptr, indices, data, decide)
            own_weight, best, best_weight, exit_to, exit_weight = (
                np.concatenate(x) for x in zip(*parts, strict=True))
            del parts
            gain = best_weight - own_weight
            local = np.flatnonzero((best >= 0) & (gain > 0))
            if quota is not None:
                forced = np.flatnonzero((exit_to >= 0) & (quota[own] > 0))
                forced = forced[(best[forced] != exit_to[forced]) | (gain[forced] <= 0)]
                source = own[forced].astype(np.int64)
                exit_gain = exit_weight[forced] - own_weight[forced]
                order = np.lexsort((-exit_gain, source))
                keep = np.zeros(forced.shape[0], dtype=bool)
                keep[order] = _group_rank(source[order]) < quota[source[order]]
                forced = forced[keep]
                # A forced node goes to its best partition with room instead.
                best[forced] = exit_to[forced]
                best_weight[forced] = exit_weight[forced]
                gain[forced] = exit_gain[keep]
                local = np.union1d(local, forced)
            groups_left -= 1
            if local.shape[0] == 0:
                if own_out is not None:
                    own_out[nodes] = own_weight
                continue
            to = best[local]
            fits = _admit(to, gain[local], weight[local], limit[to] - part_weight[to])
            swap = _swaps(local[~fits], own, to[~fits], gain[local[~fits]], num_partitions) \
                if level.unit else np.zeros(0, dtype=np.int64)
            local, to = local[fits], to[fits]
            np.subtract.at(part_weight, own[local], weight[local])
            np.add.at(part_weight, to, weight[local])
            local = np.concatenate([local, swap])
            labels[first + local] = best[local]
            own_weight[local] = best_weight[local]
            if own_out is not None:
                own_out[nodes] = own_weight
            moved += local.shape[0]
        moves.append(moved)
        if last:
            break
    return moves


def _refine_decide(
    lo: int, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, *,
    labels: np.ndarray, part_weight: np.ndarray, limit: np.ndarray | None, weight: np.ndarray,
    own: np.ndarray, quota: np.ndarray | None, has_room: np.ndarray, salt: int,
) -> tuple[np.ndarray, ...]:
    """Rows ``lo...`` of a group in `_refine` (a `_in_pieces` work item).

    Returns `_choose`'s three arrays for the heaviest other partition (any partition
    with unit weights, where a full one can still be reached by a swap; with weights
    one the row fits in within ``limit``), then the target and weight of the heaviest
    partition with room (``has_room`` [p] bool) for rows whose partition has a
    ``quota`` to shed (-1 and 0 elsewhere, or the first choice again without a quota).
    """
    num_partitions = part_weight.shape[0]
    kernels = _kernels()
    if kernels is not None:
        mine = own[lo : lo + indptr.shape[0] - 1]
        fits = {} if limit is None else {"load": part_weight, "cap": limit,
                                         "row_weight": weight[lo : lo + indptr.shape[0] - 1]}
        chosen = kernels.choose(indptr, indices, data, labels, mine, salt, **fits)
        if quota is None or not (quota > 0).any():
            return (*chosen, chosen[1], chosen[2])
        _, exit_to, exit_weight = kernels.choose(indptr, indices, data, labels, mine, salt, mask=has_room,
                                                 row_flag=quota[mine] > 0)
        return (*chosen, exit_to, exit_weight)
    ptr, rows, targets, weights = _aggregate(indptr, indices, data, labels, num_partitions)
    mine = own[lo : lo + ptr.shape[0] - 1]
    allowed = None if limit is None else part_weight[targets] + weight[lo + rows] <= limit[targets]
    chosen = _choose(ptr, rows, targets, weights, mine, allowed, salt)
    if quota is None or not (quota > 0).any():
        return (*chosen, chosen[1], chosen[2])
    leaving = (quota[mine] > 0)[rows] & has_room[targets]
    _, exit_to, exit_weight = _choose(ptr, rows, targets, weights, mine, leaving, salt)
    return (*chosen, exit_to, exit_weight)


def _swaps(movers: np.ndarray, own: np.ndarray, to: np.ndarray, gain: np.ndarray,
           num_partitions: int) -> np.ndarray:
    """Movers that can trade places: as many ``i -> j`` as ``j -> i``, largest gains first.

    For movers that did not fit (their target is full), with unit weights: a swap leaves
    both partitions' sizes as they were. Only positive gains are paired. Returns the
    movers to move (indices into the group's rows).
    """
    positive = gain > 0
    movers, to, gain = movers[positive], to[positive], gain[positive]
    if movers.shape[0] < 2:
        return np.zeros(0, dtype=np.int64)
    key = own[movers].astype(np.int64) * num_partitions + to
    order = np.lexsort((-gain, key))
    movers, key = movers[order], key[order]
    pairs, counts = unique(key, return_counts=True)
    reverse = (key % num_partitions) * num_partitions + key // num_partitions
    at = np.minimum(np.searchsorted(pairs, reverse), pairs.shape[0] - 1)
    partners = np.where(pairs[at] == reverse, counts[at], 0)
    return movers[_group_rank(key) < partners]


def _metis_bytes(level: _Level) -> int:
    """About what METIS needs for ``level`` (see `_STREAM_METIS_BYTES`)."""
    return _STREAM_METIS_BYTES * (level.num_entries + level.num_nodes)


def _initial_partition(level: _Level, num_partitions: int, seed: int, *,
                       use_metis: bool) -> tuple[np.ndarray, dict]:
    """[n] int32 labels of the coarsest level: METIS with node and edge weights.

    Without edges (or with fewer nodes than partitions) METIS has nothing to do, and
    without ``use_metis`` (the level did not coarsen enough to fit the budget) it may
    not run: nodes fill the partitions in id order by weight instead (a random order),
    for refinement to improve.
    """
    weight = level.total_weight()
    if not use_metis:
        logger.warning("stream: the coarsest level (%d nodes, %d entries) is too large for "
                       "METIS within partition_memory_bytes; starting from an arbitrary "
                       "balanced partition", level.num_nodes, level.num_entries)
    if level.num_entries == 0 or level.num_nodes < num_partitions or not use_metis:
        total = int(weight.sum())
        start = np.cumsum(weight) - weight
        return (start * num_partitions // max(total, 1)).astype(np.int32), {"metis": False}
    indptr, indices, data = _whole(level)
    began = time.perf_counter()
    parts, _ = metis_parts(indptr, indices, num_partitions, node_weights=weight,
                           edge_weights=np.maximum(1, np.rint(data)), seed=seed,
                           ufactor=_STREAM_METIS_UFACTOR)
    info = {"metis": True, "metis_seconds": round(time.perf_counter() - began, 6),
            "metis_nodes": level.num_nodes, "metis_entries": level.num_entries}
    return parts.astype(np.int32), info


def _whole(level: _Level) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole level as one CSR (int64 indptr), for METIS: duplicates merged into weights
    and each row's columns ascending (the blocks keep neither; METIS's matching visits a
    row's neighbours in order, so sorted, its input does not depend on the order the
    entries arrived in, nor on whether the kernels built the blocks)."""
    import scipy.sparse

    indptrs, indices, data = [], [], []
    offset = 0
    for b in range(len(level.blocks)):
        ptr, idx, dat = level.block(b)
        indptrs.append(ptr[:-1].astype(np.int64) + offset)
        offset += idx.shape[0]
        indices.append(idx)
        data.append(np.ones(idx.shape[0], dtype=np.float32) if dat is None else dat)
    indptrs.append(np.array([offset], dtype=np.int64))
    matrix = scipy.sparse.csr_matrix((np.concatenate(data), np.concatenate(indices), np.concatenate(indptrs)),
                                     shape=(level.num_nodes, level.num_nodes))
    matrix.sum_duplicates()  # sorts each row's columns, then merges equal ones
    return matrix.indptr.astype(np.int64), matrix.indices.astype(np.int32), matrix.data


def _level_zero(edges: StagedEdges, order: np.ndarray, chunk_edges: int, block_bytes: int,
                directory: str, workers: _Workers) -> _Level:
    """The input graph in internal ids, both directions, in row blocks (one edge pass over
    the staged edges the source listed: the reverses the converter added are skipped).

    With several threads, chunks are prepared on the workers while this one reads the
    next chunk and hands the finished ones to the builder's writer, in order (so the files
    do not depend on the threads).
    """
    listed = edges.num_edges
    if edges.reverse_runs is not None:
        listed -= int((edges.reverse_runs[:, 1] - edges.reverse_runs[:, 0]).sum())
    builder = _LevelBuilder(edges.num_nodes, 2 * listed, block_bytes, directory, "level0", weighted=False)
    kernels = _kernels()
    try:
        return _fill_level_zero(builder, edges, order, chunk_edges, workers, kernels)
    except BaseException:
        builder.close(quiet=True)
        raise


def _fill_level_zero(builder: _LevelBuilder, edges: StagedEdges, order: np.ndarray, chunk_edges: int,
                     workers: _Workers, kernels: Any) -> _Level:
    """`_level_zero`'s pass over the staged edges, then the level."""

    def prepare(src: np.ndarray, dst: np.ndarray) -> Any:
        if kernels is not None and not builder.in_memory:
            counts, pairs = kernels.level_zero(src, dst, order, builder.rows_per_block, len(builder.bounds) - 1)
            return counts, pairs, None
        keep = src != dst
        a, b = order[src[keep]], order[dst[keep]]
        del src, dst, keep
        return builder.prepare(np.concatenate([a, b]), np.concatenate([b, a]), None)

    pending: collections.deque = collections.deque()
    # An undirected source is staged with the reverse of each edge added; this level puts
    # every edge in both directions itself, so with the added reverses each entry would
    # come twice: twice the entries for every pass to read, to the same choices (every
    # weight doubled). They are not read.
    for src, dst in edges.iter_listed(chunk_edges):
        if workers.threads == 1:
            builder.write(prepare(src, dst))
            continue
        pending.append(workers.submit(prepare, src, dst))
        if len(pending) >= workers.threads:
            builder.write(pending.popleft().result())
    while pending:
        builder.write(pending.popleft().result())
    return builder.finish(None, workers)


@register_partitioner(
    "stream", summary="multilevel partitioning in bounded memory (coarsen, METIS, refine)"
)
def _stream(
    edges: StagedEdges, num_partitions: int, seed: int, chunk_edges: int, memory_bytes: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Multilevel partitioning in bounded memory: label-propagation coarsening, METIS on
    the coarsest graph, balanced label-propagation refinement on the way back up.

    Memory is the O(N) node state (`_STREAM_NODE_BYTES` per node) plus blocks sized to
    what ``memory_bytes`` leaves beside it: the edge list is never held. Steps:

    1. One pass over the staged edges the source listed puts each edge, in both
       directions and in internal ids (`_stream_order`), into the scratch file of its row
       block (`_LevelBuilder`, which writes them on its own thread); each block then
       becomes a CSR whose rows are grouped, not sorted, a duplicate edge repeated rather
       than merged into a weight (in memory instead when the whole graph fits half the
       budget).
    2. Coarsening (`_cluster`, `_contract`): size-constrained label propagation groups
       nodes into clusters of at most ``partition_size // 8`` nodes; the clusters
       become the nodes of the next level (node weights: sizes; edge weights: summed),
       until a level has at most ``16 p`` nodes or stops shrinking.
    3. METIS on the coarsest level, with node and edge weights (`_initial_partition`).
    4. Uncoarsening: each level takes its clusters' partitions and is refined by
       balanced label propagation (`_refine`) within a slack of `_STREAM_SLACK`; the
       input level's last pass and `_rebalance` bring every partition to exactly its
       block size, so the labels are the store's blocks.

    Every pass decides a row group's moves at once, groups in order; the per-row work of
    a group (each row's weight per neighbouring label and its choice, a contraction's
    sums, a block's CSR, the input level's entries) runs in C without the GIL
    (`graphstore.layout._native.partition`; numpy and scipy where the library is not
    built, with the same result) and is split over up to `_STREAM_MAX_THREADS` threads
    (`_Workers`), which changes nothing in the result either. The result is
    deterministic for a seed and a memory budget (the budget sets the blocks, hence the
    groups) and does not depend on ``chunk_edges`` (it only sizes the reads of step 1)
    or on the threads.
    """
    began = time.perf_counter()
    num_nodes = edges.num_nodes
    block_bytes = _stream_budget(num_nodes, memory_bytes)
    if num_partitions == 1:
        return np.zeros(num_nodes, dtype=np.int64), {"levels": []}
    rng = np.random.default_rng(seed)
    # One chunk per thread in flight, plus the one being read, the one being written and
    # those waiting for the writer.
    chunk_edges = max(1, min(chunk_edges, block_bytes // _STREAM_STAGED_EDGE_BYTES
                             // (_STREAM_MAX_THREADS + 2 + _WRITES_IN_FLIGHT)))
    capacity = _block_sizes(num_nodes, num_partitions)
    partition_size = _partition_size(num_nodes, num_partitions)
    max_cluster = max(1, partition_size // _STREAM_CLUSTER_SHARE)
    coarsest = _STREAM_COARSEST_PER_PART * num_partitions
    seconds: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        seconds[name] = round(now - since, 3)
        return now

    directory = tempfile.mkdtemp(prefix="stream-", dir=os.path.dirname(os.path.abspath(edges.src_path)))
    levels: list[_Level] = []
    threads = _stream_threads()
    workers = _Workers(threads)
    try:
        order = _stream_order(num_nodes, seed)
        levels.append(_level_zero(edges, order, chunk_edges, block_bytes, directory, workers))
        del order
        isolated = levels[0].count_isolated()
        now = lap("distribute", began)
        clusters: list[np.ndarray | None] = []
        cluster_moves = []
        while levels[-1].num_nodes > coarsest and max_cluster > 1:
            level = levels[-1]
            cluster, num_clusters, moves = _cluster(level, max_cluster, rng, workers)
            cluster_moves.append(moves)
            if num_clusters > 0.9 * level.num_nodes:
                if _metis_bytes(level) <= block_bytes or max_cluster >= partition_size:
                    break
                # Stalled but too large for METIS in the budget: coarser clusters.
                max_cluster = min(2 * max_cluster, partition_size)
                continue
            clusters.append(cluster)
            levels.append(_contract(level, cluster, num_clusters, block_bytes, directory,
                                    f"level{len(levels)}", workers))
            del cluster
        now = lap("coarsen", now)

        labels, metis_info = _initial_partition(levels[-1], num_partitions, seed,
                                                use_metis=_metis_bytes(levels[-1]) <= block_bytes)
        # The label gathers of refinement jump all over [n]: 2-byte labels halve the
        # cache they need.
        labels = labels.astype(np.int16 if num_partitions <= 1 << 15 else np.int32)
        now = lap("initial", now)

        refine_moves = []
        own = np.zeros(num_nodes, dtype=np.float32)
        for depth in range(len(levels) - 1, -1, -1):
            level = levels[depth]
            if depth < len(levels) - 1:
                labels = labels[clusters[depth]]
                clusters[depth] = None
                levels[depth + 1].drop()
            part_weight = np.bincount(labels, weights=level.node_weight,
                                      minlength=num_partitions).astype(np.int64)
            refine_moves.append(_refine(level, labels, part_weight, capacity, rng, workers,
                                        final=depth == 0, own_out=own if depth == 0 else None))
        now = lap("refine", now)

        rebalanced = _rebalance(own, labels, part_weight, capacity, rng)
        levels[0].drop()
        del own
        # Back to source ids: source node i is internal node order[i].
        order = _stream_order(num_nodes, seed)
        result = np.empty(num_nodes, dtype=np.int64)
        for start in range(0, num_nodes, NODE_CHUNK):
            result[start : start + NODE_CHUNK] = labels[order[start : start + NODE_CHUNK]]
        del order, labels
        lap("finish", now)
    finally:
        workers.close()
        for level in levels:
            level.drop()
        shutil.rmtree(directory, ignore_errors=True)

    return result, {
        "levels": [[lv.num_nodes, lv.num_entries] for lv in levels],
        "blocks": len(levels[0].bounds) - 1,
        "max_cluster_weight": max_cluster,
        "cluster_moves": cluster_moves,
        "refinement_moves": refine_moves[-1],
        "coarse_refinement_moves": refine_moves[-2::-1],
        "placed_without_edges": isolated,
        "rebalanced_nodes": rebalanced,
        "memory_bytes": memory_bytes,
        "threads": threads,
        "kernels": "numpy" if _kernels() is None else "c",
        "phase_seconds": seconds,
        **metis_info,
    }
