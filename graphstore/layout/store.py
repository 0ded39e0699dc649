"""`graphstore.open`: a format-v1 store as a Python object.

Opening reads the manifest and checks that every array it implies is there with the right
shape and dtype; arrays stay lazy (Zarr) until a ``read_*`` method touches them. Reads are
whole partitions or whole buckets, which map onto whole chunks (see `graphstore.layout.base`
for the layout).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zarr
import zarr.errors

from graphstore.errors import ConfigError, StoreError, StoreNotFoundError, StoreVersionError
from graphstore.layout._chunkio import shared_reader
from graphstore.layout.base import FORMAT_VERSION, MANIFEST_KEY, Manifest
from graphstore.layout.sources.base import EdgeSplit

__all__ = ["Store", "open_store"]

_MODES = ("r", "r+")


def open_store(path: str | os.PathLike, mode: str = "r") -> Store:
    """Open the store at ``path``.

    Parameters
    ----------
    path : str or PathLike
        A directory written by `graphstore convert`.
    mode : {"r", "r+"}
        ``"r+"`` allows later writers (embeddings) to update the store.

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``, or a directory that is not a complete store.
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
    return Store(path, mode=mode)


class Store:
    """A graphstore store: manifest, lazy arrays, partition and bucket reads, splits, id maps."""

    def __init__(self, path: str | os.PathLike, *, mode: str = "r") -> None:
        if mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES} (got {mode!r})")
        self.path = Path(path)
        self.mode = mode
        if not self.path.exists():
            raise StoreNotFoundError(f"{self.path}: no such store")
        if not (self.path / "zarr.json").is_file():
            raise StoreNotFoundError(f"{self.path}: not a graphstore store (no zarr.json)")
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
        self.bucket_offsets: np.ndarray = self._array("edges/bucket_offsets")[...]
        """[p*p+1] int64: see `bucket_range`."""

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
            expected["nodes/features"] = ((n, m.feature_dim), str(m.feature_dtype))
        if m.has_labels:
            expected["nodes/labels"] = ((n,), "int32")
        if m.has_relations:
            expected["edges/rel"] = ((e,), "int32")
        for name, kind in m.split_kinds.items():
            count = m.splits[name]
            if kind == "nodes":
                expected[f"splits/nodes/{name}"] = ((count,), idx)
            else:
                expected[f"splits/edges/{name}/src"] = ((count,), idx)
                expected[f"splits/edges/{name}/dst"] = ((count,), idx)
        return expected

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

    def read_many(self, requests: Sequence[tuple[str, int, int, np.ndarray | None]]) -> list[np.ndarray]:
        """Read several row ranges at once, straight from the chunk files.

        Each request is ``(array name, start, stop, out)``; ``out`` (shape
        ``[stop - start, ...]``, the array's dtype, C-contiguous) receives the rows, or is
        None for a new array. All reads are in flight together on the process's
        `ChunkReader` (several requests deep, ``O_DIRECT`` into 4096-aligned outputs); whole
        chunks are checksummed, parts of chunks are not (see `graphstore.layout._chunkio`).
        This is the buffer's only read path, so tests and benchmarks can wrap it.

        Raises
        ------
        CorruptStoreError
            A chunk file is missing or short, or a whole chunk fails its checksum.
        """
        arrays = [(self._array(name), int(lo), int(hi), out) for name, lo, hi, out in requests]
        outs = [out if out is not None else np.empty((max(0, hi - lo), *a.shape[1:]), a.dtype)
                for a, lo, hi, out in arrays]
        shared_reader().read_into([(a, lo, hi, out) for (a, lo, hi, _), out in zip(arrays, outs)])
        return outs

    def read_rows(self, name: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of array ``name`` (one `read_many` request)."""
        return self.read_many([(name, start, stop, out)])[0]

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

    def read_features(self, k: int) -> np.ndarray:
        """[P_k, D] features of partition ``k`` (whole chunks, one sequential read)."""
        if not self.manifest.has_features:
            raise StoreError(f"{self.path}: the store has no features")
        start, stop = self.partition_range(k)
        return self._array("nodes/features")[start:stop]

    def read_labels(self, k: int) -> np.ndarray:
        """[P_k] int32 labels of partition ``k``."""
        if not self.manifest.has_labels:
            raise StoreError(f"{self.path}: the store has no labels")
        start, stop = self.partition_range(k)
        return self._array("nodes/labels")[start:stop]

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
        src = self._array("edges/src")[start:stop]
        dst = self._array("edges/dst")[start:stop]
        rel = self._array("edges/rel")[start:stop] if self.manifest.has_relations else None
        return src, dst, rel

    def read_degree(self, kind: str = "in") -> np.ndarray:
        """[N] int64 degree of every node: ``"in"``, ``"out"`` or ``"total"``."""
        if kind == "total":
            return self.read_degree("in") + self.read_degree("out")
        if kind not in ("in", "out"):
            raise ConfigError(f"degree kind must be 'in', 'out' or 'total' (got {kind!r})")
        return self._array(f"nodes/{kind}_degree")[...]

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
        return self._array(f"splits/nodes/{name}")[...]

    def read_edge_split(self, name: str) -> EdgeSplit:
        """Edge split ``name`` in store ids (negatives as shipped, or None)."""
        if self._split_kind(name) != "edges":
            raise ConfigError(f"split {name!r} is a node split; use read_node_split")
        group = self._root[f"splits/edges/{name}"]
        members = set(group.array_keys())

        def get(key: str) -> np.ndarray | None:
            return group[key][...] if key in members else None

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
            table = self._id_cache[name] = self._array(name)[...].astype(np.int64)
        return table[ids]

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Drop cached arrays (a local Zarr store holds no open files between reads)."""
        self._arrays.clear()
        self._id_cache.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
