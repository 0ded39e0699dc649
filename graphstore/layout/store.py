"""`Store`: a format-v1 store as a Python object (`graphstore.open` returns it as a `Dataset`).

Opening reads the manifest and checks that every array it implies is there with the right
shape and dtype; arrays stay lazy (Zarr) until a ``read_*`` method touches them. Reads are
whole partitions or whole buckets, which map onto whole chunks (see `graphstore.layout.base`
for the layout).

Where a new read goes: `Store` is the format. Every read of a stored array (a verified
read through `Store.read_many`, or the lazy Zarr array itself) is a method here, returning
numpy arrays in store ids, and nothing here knows about torch, loaders or training.
`graphstore.dataset.Dataset` is the user-facing view built on it: it composes these reads
into what user code asks for (loaders, tensors, splits, embeddings) and never opens a Zarr
array or a chunk file itself. A method that needs a new array, or reads an existing one
another way, belongs here; one that only combines reads belongs on `Dataset`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.errors

from graphstore.errors import (
    ConfigError,
    ReadOnlyStoreError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
    UnverifiedReadsWarning,
)
from graphstore.layout._aggregates import AGGREGATE_OPS, AGGREGATES_KEY, aggregate_array
from graphstore.layout._chunkio import ArrayLayout, ReadStats, shared_reader
from graphstore.layout._hubs import HubIndex, read_hub_index
from graphstore.layout._lock import StoreLock
from graphstore.layout._rowsets import RowSetStats, read_row_set
from graphstore.layout._segments import load_segment_tables
from graphstore.layout.base import FORMAT_VERSION, MANIFEST_KEY, Manifest
from graphstore.layout.dtypes import storage_dtype
from graphstore.layout.sources.base import EdgeSplit

__all__ = ["Store", "open_store"]

_MODES = ("r", "r+")
_WARNED_UNVERIFIED: set[str] = set()
"""Stores already warned about in this process (the warning is one-time per store)."""
_WARN_LOCK = threading.Lock()
_OPEN_STORES: weakref.WeakSet[Store] = weakref.WeakSet()
"""Every open store, so that a forked child can give each a new lock."""


def _after_fork_in_child() -> None:
    # A lock some parent thread held at the fork (a buffer loader in `_layout`) stays held in
    # the child, whose copy of that thread never runs: DataLoader workers are such forks.
    global _WARN_LOCK
    _WARN_LOCK = threading.Lock()
    for store in list(_OPEN_STORES):
        store._layout_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def open_store(path: str | os.PathLike, mode: str = "r", *, writer_lock: bool = True) -> Store:
    """Open the store at ``path``.

    Parameters
    ----------
    path : str or PathLike
        A directory written by `graphstore convert`.
    mode : {"r", "r+"}
        ``"r"`` takes a shared lock and never writes; ``"r+"`` also takes the store's
        writer lock (one writer at a time) and allows writers (embeddings, ``upgrade``).
        Readers never wait for a writer. The locks are released by `Store.close` or when
        the process ends.
    writer_lock : bool
        With ``"r+"``: False writes without taking the writer lock, for the ranks of one
        data-parallel job whose rank 0 holds it on the job's behalf
        (`graphstore.distributed.data_parallel`: the ranks write disjoint embedding
        partitions, ordered by the job's barriers). Never for independent processes.

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``, or a directory that is not a complete store.
    StoreLockedError
        ``"r+"`` while another process writes to the store, or any mode while the store
        is being replaced (``convert --overwrite``).
    StoreVersionError
        A format version this graphstore does not read.
    StoreError
        A missing or mis-shaped array; the message names it.

    Examples
    --------
    >>> import graphstore
    >>> graphstore.open("missing.gs")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    graphstore.errors.StoreNotFoundError: missing.gs: no such store
    """
    return Store(path, mode=mode, writer_lock=writer_lock)


class Store:
    """A graphstore store: manifest, lazy arrays, partition and bucket reads, splits, id maps."""

    def __init__(self, path: str | os.PathLike, *, mode: str = "r", writer_lock: bool = True) -> None:
        if mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES} (got {mode!r})")
        self.path = Path(path)
        self.mode = mode
        if not self.path.exists():
            raise StoreNotFoundError(f"{self.path}: no such store")
        if not (self.path / "zarr.json").is_file():
            raise StoreNotFoundError(f"{self.path}: not a graphstore store (no zarr.json)")
        self.holds_writer_lock = mode == "r+" and bool(writer_lock)
        """Whether this opener holds the writer lock (False for a data-parallel rank > 0 that
        writes under rank 0's)."""
        self._lock = StoreLock(self.path, mode="write" if self.holds_writer_lock else "read")
        try:
            self._open(mode)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, mode: str) -> None:
        try:
            self._root = zarr.open_group(str(self.path), mode=mode, zarr_format=3)
        except (zarr.errors.GroupNotFoundError, ValueError, OSError) as exc:
            raise StoreError(f"{self.path}: cannot open as a Zarr v3 group ({exc})") from exc
        attrs = self._root.attrs.asdict()
        if MANIFEST_KEY not in attrs:
            raise StoreNotFoundError(
                f"{self.path}: no graphstore manifest (an interrupted conversion?); convert again"
            )
        raw = attrs[MANIFEST_KEY]
        version = raw.get("format_version") if isinstance(raw, dict) else None
        if version != FORMAT_VERSION:
            raise StoreVersionError(
                f"{self.path}: format_version {version!r} is not supported "
                f"(this graphstore reads version {FORMAT_VERSION})"
            )
        self.manifest = Manifest.from_json(raw, where=str(self.path))
        self._arrays: dict[str, zarr.Array] = {}
        self._id_cache: dict[str, np.ndarray] = {}
        self._check_arrays()
        self.bucket_offsets: np.ndarray = self._read_whole("edges/bucket_offsets")
        """[p*p+1] int64: see `bucket_range`."""
        self._layouts: dict[str, ArrayLayout] = {}
        self._layout_lock = threading.Lock()
        _OPEN_STORES.add(self)
        self._segment_tables = load_segment_tables(
            self._root, str(self.path), num_partitions=self.num_partitions,
            partition_size=self.partition_size, bucket_offsets=self.bucket_offsets)
        if self._segment_tables is None:
            _warn_unverified(self.path)
        self._hubs = read_hub_index(self._root, str(self.path), num_partitions=self.num_partitions,
                                    read_whole=self._read_whole)

    @property
    def verifies_partial_reads(self) -> bool:
        """True when the store has segment checksums, so every read is verified; False for
        a store written before them (``graphstore upgrade`` adds them)."""
        return self._segment_tables is not None

    # ------------------------------------------------------------------ validation

    def expected_arrays(self) -> dict[str, tuple[tuple[int | None, ...], str]]:
        """Array name -> (shape, dtype) the manifest implies (None: any length)."""
        m = self.manifest
        n, e, p, idx = m.num_nodes, m.num_edges, m.num_partitions, m.index_dtype
        expected: dict[str, tuple[tuple[int | None, ...], str]] = {
            "nodes/orig_id": ((n,), idx),
            "nodes/store_id": ((n,), idx),
            "nodes/in_degree": ((n,), "int64"),
            "nodes/out_degree": ((n,), "int64"),
            "edges/src": ((e,), idx),
            "edges/dst": ((e,), idx),
            "edges/bucket_offsets": ((p * p + 1,), "int64"),
        }
        if m.has_features:
            expected["nodes/features"] = ((n, m.feature_dim), storage_dtype(m.feature_dtype).name)  # bfloat16: uint16 bits
        if m.has_labels:
            expected["nodes/labels"] = ((n,), "int32")
        if m.has_relations:
            expected["edges/rel"] = ((e,), "int32")
        for record in self.aggregates.values():
            expected[record["array"]] = ((n, m.feature_dim), "float32")
        for name, kind in m.split_kinds.items():
            count = m.splits[name]
            if kind == "nodes":
                expected[f"splits/nodes/{name}"] = ((count,), idx)
            else:
                expected[f"splits/edges/{name}/src"] = ((count,), idx)
                expected[f"splits/edges/{name}/dst"] = ((count,), idx)
        return expected

    def check_writable(self) -> None:
        """Raise `ReadOnlyStoreError` unless the store was opened with mode ``"r+"``."""
        if self.mode != "r+" or not self._lock.held:
            state = "closed" if not self._lock.held else "opened read-only (mode 'r')"
            raise ReadOnlyStoreError(f"{self.path}: the store is {state}; open it with "
                                     "graphstore.open(path, mode='r+') to write to it")

    def _check_arrays(self) -> None:
        m = self.manifest
        if m.num_nodes <= 0 or m.num_partitions <= 0 or m.partition_size <= 0:
            raise StoreError(f"{self.path}: manifest has non-positive num_nodes/num_partitions/partition_size")
        if (m.num_partitions - 1) * m.partition_size >= m.num_nodes or m.num_partitions * m.partition_size < m.num_nodes:
            raise StoreError(
                f"{self.path}: {m.num_partitions} partitions of {m.partition_size} rows do not "
                f"cover {m.num_nodes} nodes exactly"
            )
        for name, (shape, dtype) in self.expected_arrays().items():
            arr = self._array(name)
            if arr.shape != shape:
                raise StoreError(f"{self.path}: array {name} has shape {arr.shape}, expected {shape}")
            if str(arr.dtype) != dtype:
                raise StoreError(f"{self.path}: array {name} has dtype {arr.dtype}, expected {dtype}")

    def _array(self, name: str) -> zarr.Array:
        arr = self._arrays.get(name)
        if arr is None:
            try:
                arr = self._root[name]
            except KeyError:
                raise StoreError(f"{self.path}: array {name} is missing") from None
            if not isinstance(arr, zarr.Array):
                raise StoreError(f"{self.path}: {name} is a group, expected an array")
            self._arrays[name] = arr
        return arr

    def _read_whole(self, name: str) -> np.ndarray:
        """All of array ``name``, whole chunks, each checked (a missing file included).

        For the small arrays read whole (bucket offsets, splits); it does not need the
        segment tables, so it works before they are loaded.
        """
        array = self._array(name)
        out, _ = shared_reader().read(ArrayLayout.of(array, name=name), 0, array.shape[0])
        return out

    def _layout(self, name: str) -> ArrayLayout:
        """How `read_many` reads ``name``: its chunk files, plus its segment checksums."""
        with self._layout_lock:
            layout = self._layouts.get(name)
            if layout is None:
                layout = ArrayLayout.of(self._array(name), name=name)
                tables = self._segment_tables
                if tables is None:  # written before segment checksums: as it always was
                    layout = dataclasses.replace(layout, verify_partial=False)
                elif name in tables:
                    layout = dataclasses.replace(layout, segments=tables[name])
                self._layouts[name] = layout
            return layout

    # ------------------------------------------------------------------ metadata

    @property
    def num_nodes(self) -> int:
        return self.manifest.num_nodes

    @property
    def num_edges(self) -> int:
        return self.manifest.num_edges

    @property
    def num_partitions(self) -> int:
        return self.manifest.num_partitions

    @property
    def partition_size(self) -> int:
        return self.manifest.partition_size

    @property
    def feature_dim(self) -> int:
        return self.manifest.feature_dim

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    @property
    def num_relations(self) -> int:
        return self.manifest.num_relations

    @property
    def directed(self) -> bool:
        return self.manifest.directed

    @property
    def split_names(self) -> list[str]:
        return list(self.manifest.splits)

    def __repr__(self) -> str:
        m = self.manifest
        parts = [
            f"{m.num_nodes:,} nodes",
            f"{m.num_edges:,} edges ({'directed' if m.directed else 'both directions'})",
            f"{m.num_partitions} partitions x {m.partition_size:,}",
        ]
        if m.feature_dim:
            parts.append(f"{m.feature_dim} features")
        if m.num_classes:
            parts.append(f"{m.num_classes} classes")
        if m.num_relations:
            parts.append(f"{m.num_relations} relations")
        return f"<graphstore.Store {str(self.path)!r} v{m.format_version} {m.source.get('name', '?')}: {', '.join(parts)}>"

    # ------------------------------------------------------------------ lazy arrays

    def array(self, name: str) -> zarr.Array:
        """The lazy Zarr array ``name`` (e.g. ``"nodes/features"``); nothing is read yet."""
        return self._array(name)

    def read_many(self, requests: Sequence[tuple[str, int, int, np.ndarray | None]], *,
                  stats: ReadStats | None = None) -> list[np.ndarray]:
        """Read several row ranges at once, straight from the chunk files.

        Each request is ``(array name, start, stop, out)``; ``out`` (shape
        ``[stop - start, ...]``, the array's dtype, C-contiguous) receives the rows, or is
        None for a new array. All reads are in flight together on the process's
        `ChunkReader` (several requests deep, ``O_DIRECT`` into 4096-aligned outputs). Every
        byte is verified: whole chunks by their crc32c, parts of chunks by the checksums of
        the buckets or partitions they hold, or by reading the whole chunk (see
        `graphstore.layout._chunkio`); a store without segment checksums leaves parts of
        chunks unverified (`verifies_partial_reads`). This is the buffer's only read path,
        so tests and benchmarks can wrap it.

        Raises
        ------
        CorruptStoreError
            A chunk file is missing or short, or a chunk, bucket or partition fails its
            checksum; the message names the array, the bucket or partition, and the file.
        """
        arrays = [(self._layout(name), int(lo), int(hi), out) for name, lo, hi, out in requests]
        outs = [out if out is not None else np.empty((max(0, hi - lo), *a.shape[1:]), a.dtype)
                for a, lo, hi, out in arrays]
        done = shared_reader().read_into([(a, lo, hi, out) for (a, lo, hi, _), out in zip(arrays, outs)])
        if stats is not None:
            for name in ReadStats.__slots__:
                setattr(stats, name, getattr(stats, name) + getattr(done, name))
        return outs

    def read_rows(self, name: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of array ``name`` (one `read_many` request)."""
        return self.read_many([(name, start, stop, out)])[0]

    def read_row_set(self, name: str, ids: np.ndarray, out: np.ndarray | None = None, *,
                     stats: RowSetStats | None = None) -> np.ndarray:
        """Rows ``ids`` (ascending, distinct) of array ``name``, scattered anywhere in it.

        Reads the ~4 KiB blocks holding them, neighbouring blocks in one request, each
        block verified by its checksum (`graphstore.layout._rowsets`); a store without
        block checksums reads the rows' whole chunks instead (and warns once).
        """
        layout = self._layout(name)
        if out is None:
            out = np.empty((len(ids), *layout.shape[1:]), layout.dtype)
        done = read_row_set(layout, ids, out)
        if stats is not None:
            stats.add(done)
        return out

    @property
    def aggregates(self) -> dict[str, dict[str, Any]]:
        """The stored neighbour aggregates of the features (``graphstore aggregate``), by op
        (``"mean"``, ``"sum"``, ``"gcn"``): each a record with its ``array`` name, the
        ``input`` it aggregated and the ``degrees`` it used (`graphstore.layout._aggregates`)."""
        records = self.manifest.extra.get(AGGREGATES_KEY, {})
        if not isinstance(records, dict) or any(
                op not in AGGREGATE_OPS or not isinstance(r, dict) or r.get("array") != aggregate_array(op)
                for op, r in records.items()):
            raise StoreError(f"{self.path}: manifest field extra.{AGGREGATES_KEY} is malformed ({records!r:.200})")
        return records

    def input_arrays(self, aggregated: str | None = None) -> list[str]:
        """The arrays a row of model input is read from: the features, and with
        ``aggregated`` (an op of `aggregates`) their stored neighbour aggregate beside them
        (a row is then ``[x_v | agg_v]``, twice the feature width).

        Raises
        ------
        ConfigError
            The store has no features, or no aggregate ``aggregated``.
        """
        if not self.manifest.has_features:
            raise ConfigError(f"{self.path}: macro-batching reads feature rows; the store has none")
        if aggregated is None:
            return ["nodes/features"]
        if aggregated not in self.aggregates:
            raise ConfigError(f"{self.path}: no stored {aggregated} aggregate of the features; "
                              f"run `graphstore aggregate {self.path} --op {aggregated}`")
        return ["nodes/features", self.aggregates[aggregated]["array"]]

    @property
    def features(self) -> zarr.Array | None:
        """[N, D] lazy features, or None."""
        return self._array("nodes/features") if self.manifest.has_features else None

    @property
    def labels(self) -> zarr.Array | None:
        """[N] int32 lazy labels (-1 unlabeled), or None."""
        return self._array("nodes/labels") if self.manifest.has_labels else None

    # ------------------------------------------------------------------ partitions

    def _check_partition(self, k: int) -> None:
        if not 0 <= k < self.num_partitions:
            raise ConfigError(f"partition_id must be in [0, {self.num_partitions}) (got {k})")

    def partition_range(self, k: int) -> tuple[int, int]:
        """Store ids ``[start, stop)`` of partition ``k``."""
        self._check_partition(k)
        start = k * self.partition_size
        return start, min(start + self.partition_size, self.num_nodes)

    def partition_of(self, store_ids: np.ndarray) -> np.ndarray:
        """[n] partition of each store id."""
        return np.asarray(store_ids) // self.partition_size

    def read_features(self, k: int | np.ndarray | Sequence[int]) -> np.ndarray:
        """[P_k, D] features of partition ``k`` (one sequential read, verified); given an
        array of store ids instead (any order, repeats allowed), [n, D] their rows, read as
        the ~4 KiB blocks that hold them, each verified (`read_row_set`).

        Raises
        ------
        CorruptStoreError
            The rows fail their checksum (the message names the partition and chunk file).
        """
        if not self.manifest.has_features:
            raise StoreError(f"{self.path}: the store has no features")
        if np.ndim(k) == 0:
            return self.read_rows("nodes/features", *self.partition_range(int(k)))
        ids = self._store_ids(k, "read_features")
        unique, inverse = np.unique(ids, return_inverse=True)
        return self.read_row_set("nodes/features", unique)[inverse]

    def _store_ids(self, ids: np.ndarray | Sequence[int], caller: str) -> np.ndarray:
        """``ids`` as int64 store ids, checked: integers in ``[0, num_nodes)``."""
        ids = np.asarray(ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise ConfigError(f"{self.path}: {caller}: store ids must be integers (got {ids.dtype})")
        ids = ids.astype(np.int64, copy=False).reshape(-1)
        bad = (ids < 0) | (ids >= self.num_nodes)
        if bad.any():
            raise ConfigError(f"{self.path}: {caller}: store ids must be in [0, {self.num_nodes}) "
                              f"(got {int(ids[np.argmax(bad)])})")
        return ids

    def read_labels(self, k: int | np.ndarray | Sequence[int]) -> np.ndarray:
        """[P_k] int32 labels of partition ``k`` (verified, as `read_features`); given an array
        of store ids instead (any order, repeats allowed), [n] int32 their labels, read with
        the partitions that hold them."""
        if not self.manifest.has_labels:
            raise StoreError(f"{self.path}: the store has no labels")
        if np.ndim(k) == 0:
            return self.read_rows("nodes/labels", *self.partition_range(int(k)))
        ids = self._store_ids(k, "read_labels")
        # Whole partitions, so that each read is checked against its partition's checksum.
        parts = np.flatnonzero(np.bincount(ids // self.partition_size, minlength=self.num_partitions))
        rows = self.read_many([("nodes/labels", *self.partition_range(int(j)), None) for j in parts])
        held = np.concatenate(rows) if rows else np.zeros(0, np.int32)
        first = np.cumsum([0] + [len(r) for r in rows])[:-1]  # where each read partition starts in held
        part = ids // self.partition_size
        return held[first[np.searchsorted(parts, part)] + ids - part * self.partition_size]

    def bucket_range(self, i: int, j: int) -> tuple[int, int]:
        """Edge positions ``[start, stop)`` of bucket (i, j): src in partition i, dst in j."""
        self._check_partition(i)
        self._check_partition(j)
        b = j * self.num_partitions + i
        return int(self.bucket_offsets[b]), int(self.bucket_offsets[b + 1])

    def read_bucket(self, i: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Edges of bucket (i, j) as ``(src, dst, rel)`` store ids ([m] each; rel None when
        untyped), sorted by (dst, src)."""
        start, stop = self.bucket_range(i, j)
        names = ["edges/src", "edges/dst"] + (["edges/rel"] if self.manifest.has_relations else [])
        src, dst, *rel = self.read_many([(name, start, stop, None) for name in names])
        return src, dst, rel[0] if rel else None

    @property
    def hubs(self) -> HubIndex | None:
        """The hub group (HierBatching's static-cache nodes and the contiguous copy of their
        edges: `graphstore.layout._hubs`), or None when the store has none."""
        return self._hubs

    def hub_segment_range(self, g: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` of ``hubs/edges/*`` holding the edges between hubs and the
        non-hub nodes of partition g (``g == num_partitions``: the hub-hub edges)."""
        hubs = self.hubs
        if hubs is None:
            raise ConfigError(f"{self.path}: no hubs/ group; `graphstore hubs {self.path}` writes it")
        if not 0 <= g <= self.num_partitions:
            raise ConfigError(f"hub segment must be in [0, {self.num_partitions}] (got {g})")
        return int(hubs.offsets[g]), int(hubs.offsets[g + 1])

    def read_degree(self, kind: str = "in") -> np.ndarray:
        """[N] int64 degree of every node: ``"in"``, ``"out"`` or ``"total"``."""
        if kind == "total":
            return self.read_degree("in") + self.read_degree("out")
        if kind not in ("in", "out"):
            raise ConfigError(f"degree kind must be 'in', 'out' or 'total' (got {kind!r})")
        return self.read_rows(f"nodes/{kind}_degree", 0, self.num_nodes)

    # ------------------------------------------------------------------ splits and ids

    def _split_kind(self, name: str) -> str:
        kind = self.manifest.split_kinds.get(name)
        if kind is None:
            known = ", ".join(self.split_names) or "none"
            raise ConfigError(f"no split named {name!r} in {self.path} (known: {known})")
        return kind

    def read_node_split(self, name: str) -> np.ndarray:
        """[n] store ids (ascending) of node split ``name``."""
        if self._split_kind(name) != "nodes":
            raise ConfigError(f"split {name!r} is an edge split; use read_edge_split")
        return self._read_whole(f"splits/nodes/{name}")

    def read_edge_split(self, name: str) -> EdgeSplit:
        """Edge split ``name`` in store ids (negatives as shipped, or None)."""
        if self._split_kind(name) != "edges":
            raise ConfigError(f"split {name!r} is a node split; use read_node_split")
        group = self._root[f"splits/edges/{name}"]
        members = set(group.array_keys())

        def get(key: str) -> np.ndarray | None:
            return self._read_whole(f"splits/edges/{name}/{key}") if key in members else None

        return EdgeSplit(src=get("src"), dst=get("dst"), rel=get("rel"),
                         neg_src=get("neg_src"), neg_dst=get("neg_dst"))

    def to_store_ids(self, source_ids: np.ndarray) -> np.ndarray:
        """Map source ids to store ids (reads ``nodes/store_id``)."""
        return self._id_map("nodes/store_id", source_ids)

    def to_source_ids(self, store_ids: np.ndarray) -> np.ndarray:
        """Map store ids back to the source's ids (reads ``nodes/orig_id``)."""
        return self._id_map("nodes/orig_id", store_ids)

    def _id_map(self, name: str, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= self.num_nodes))
        if len(bad):
            raise ConfigError(f"node id {ids[bad[0]]} is outside [0, {self.num_nodes})")
        table = self._id_cache.get(name)
        if table is None:
            table = self._id_cache[name] = self.read_rows(name, 0, self.num_nodes).astype(np.int64)
        return table[ids]

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the store's locks and drop cached arrays. Idempotent."""
        self._lock.release()
        self._arrays.clear()
        self._id_cache.clear()
        self._layouts.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _warn_unverified(path: Path) -> None:
    """Once per store and process: its reads of parts of chunks are not verified."""
    key = str(path.resolve())
    with _WARN_LOCK:
        if key in _WARNED_UNVERIFIED:
            return
        _WARNED_UNVERIFIED.add(key)
    warnings.warn(f"{path}: written without segment checksums, so reads of single edge buckets and "
                  f"partitions are not verified; run `graphstore upgrade {path}` to add them",
                  UnverifiedReadsWarning, stacklevel=4)
