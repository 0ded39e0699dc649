"""`graphstore verify` and `graphstore info`: re-read a store and check it, or summarise it.

`verify` reads every chunk of every array once (the crc32c codec fails a damaged chunk),
checks that no chunk file is missing, and checks the invariants `convert` promises:

- ``nodes/orig_id`` is a permutation of ``[0, N)`` and ``nodes/store_id`` its inverse;
- every edge lies in the bucket its offsets say: src in partition i, dst in partition j,
  and inside a bucket edges ascend by (dst, src); bucket offsets run from 0 to E;
- degrees equal the counts of stored edges; labels are in ``[-1, C)``; relations in
  ``[0, R)``; features are finite; split ids are in range (node splits ascending);
- every segment checksum (per edge bucket, per node partition) matches its rows, so the
  tables the training path verifies against are themselves right.

It stops at the first problem with a `CorruptStoreError` naming the array and the chunk.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr

from graphstore.errors import CorruptStoreError, UnverifiedReadsWarning
from graphstore.layout._chunkio import shared_reader
from graphstore.layout._segments import segment_crcs
from graphstore.layout.dtypes import decode
from graphstore.layout.store import Store

__all__ = ["store_summary", "verify_store"]


def _chunk_file(store_path: Path, name: str, coords: tuple[int, ...]) -> Path:
    return store_path / name / "c" / Path(*[str(c) for c in coords])


def _iter_chunks(store: Store, name: str) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield ``(chunk_index, first_row, rows)`` over an array, chunk by chunk along axis 0.

    A missing chunk file or a checksum failure raises `CorruptStoreError` naming both.
    Arrays here are chunked along axis 0 only, so chunk i is ``(i, 0, ...)``.
    """
    arr = store.array(name)
    step = arr.chunks[0]
    for index, start in enumerate(range(0, arr.shape[0], step)):
        coords = (index,) + (0,) * (arr.ndim - 1)
        where = f"{name} chunk {'/'.join(map(str, coords))}"
        path = _chunk_file(store.path, name, coords)
        if not path.is_file():
            raise CorruptStoreError(f"{store.path}: {where}: chunk file is missing")
        try:
            rows = arr[start : start + step]
        except ValueError as exc:  # the crc32c codec's mismatch
            raise CorruptStoreError(f"{store.path}: {where}: {_checksum_problem(path) or exc}") from None
        yield index, start, rows


def _checksum_problem(path: Path) -> str | None:
    """A chunk file's failed crc32c in the words of every other read (zarr's message shows
    the checksums as raw bytes); None when the checksum holds (another failure)."""
    data = path.read_bytes()
    if len(data) < 4:
        return None
    # The crc32c codec is the last one: the file's last 4 bytes, little-endian, check the rest.
    stored, computed = int.from_bytes(data[-4:], "little"), crc32c.crc32c(data[:-4])
    if stored == computed:
        return None
    return f"checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"


def _all_arrays(group: zarr.Group, prefix: str = "") -> list[str]:
    names = []
    for key, member in group.members():
        full = f"{prefix}{key}"
        if isinstance(member, zarr.Array):
            names.append(full)
        else:
            names.extend(_all_arrays(member, full + "/"))
    return sorted(names)


def _open_quietly(path: str | os.PathLike) -> Store:
    """Open for `verify`/`info`, which report a store without segment checksums themselves."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedReadsWarning)
        return Store(path)


def _check_segment_tables(store: Store) -> int:
    """Recompute every segment checksum from the (chunk-verified) rows; returns how many
    tables were checked."""
    tables = store._segment_tables or {}
    for name, table in tables.items():
        computed = segment_crcs(shared_reader(), store._layout(name), table.bounds)
        bad = np.flatnonzero(computed != table.crcs)
        if len(bad):
            s = int(bad[0])
            raise CorruptStoreError(
                f"{store.path}: checksums/{name}: the checksum of {table.describe(s)} is "
                f"{int(table.crcs[s]):#010x}, its rows give {int(computed[s]):#010x}")
    return len(tables)


def verify_store(path: str | os.PathLike) -> dict[str, Any]:
    """Check a store end to end; return counts of what was checked.

    Raises
    ------
    StoreError
        The store cannot be opened (missing or mis-shaped array, unknown version).
    CorruptStoreError
        The first damaged chunk or broken invariant, named by array and chunk.
    """
    store = _open_quietly(path)
    m = store.manifest
    n, p, size = m.num_nodes, m.num_partitions, m.partition_size
    where = store.path

    def fail(name: str, chunk: int, problem: str) -> None:
        raise CorruptStoreError(f"{where}: {name} chunk {chunk}: {problem}")

    # Id maps: a permutation and its inverse.
    id_maps = {}
    for name in ("nodes/orig_id", "nodes/store_id"):
        rows_per_chunk = store.array(name).chunks[0]
        ids = np.concatenate([r for _, _, r in _iter_chunks(store, name)]).astype(np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if len(bad):
            fail(name, bad[0] // rows_per_chunk, f"row {bad[0]} holds {ids[bad[0]]}, outside [0, {n})")
        repeated = np.flatnonzero(np.bincount(ids, minlength=n)[ids] != 1)
        if len(repeated):
            row = int(repeated[0])
            fail(name, row // rows_per_chunk, f"not a permutation: {ids[row]} (row {row}) appears twice")
        id_maps[name] = ids
    orig, store_id = id_maps["nodes/orig_id"], id_maps["nodes/store_id"]
    mismatch = np.flatnonzero(store_id[orig] != np.arange(n))
    if len(mismatch):
        row = int(orig[mismatch[0]])
        fail("nodes/store_id", row // store.array("nodes/store_id").chunks[0],
             f"not the inverse of nodes/orig_id (source id {row})")

    # Edges against their buckets.
    offsets = store.bucket_offsets
    e = m.num_edges
    if offsets[0] != 0 or offsets[-1] != e or (np.diff(offsets) < 0).any():
        fail("edges/bucket_offsets", 0, f"offsets must rise from 0 to num_edges={e}")
    in_degree = np.zeros(n, dtype=np.int64)
    out_degree = np.zeros(n, dtype=np.int64)
    prev: tuple[int, int, int] | None = None  # (bucket, dst, src) of the previous edge
    src_chunks = _iter_chunks(store, "edges/src")
    rel_chunks = _iter_chunks(store, "edges/rel") if m.has_relations else None
    for (index, start, dst), (_, _, src) in zip(_iter_chunks(store, "edges/dst"), src_chunks, strict=True):
        src, dst = src.astype(np.int64), dst.astype(np.int64)
        for name, ids in (("edges/src", src), ("edges/dst", dst)):
            bad = np.flatnonzero((ids < 0) | (ids >= n))
            if len(bad):
                fail(name, index, f"edge {start + bad[0]} has node id {ids[bad[0]]} outside [0, {n})")
        positions = np.arange(start, start + len(src))
        bucket = np.searchsorted(offsets, positions, side="right") - 1
        i, j = bucket % p, bucket // p
        wrong = np.flatnonzero((src // size != i) | (dst // size != j))
        if len(wrong):
            k = wrong[0]
            fail("edges/src" if src[k] // size != i[k] else "edges/dst", index,
                 f"edge {start + k} ({src[k]} -> {dst[k]}) lies in bucket (src partition {i[k]}, "
                 f"dst partition {j[k]}) but its endpoints are in partitions "
                 f"({src[k] // size}, {dst[k] // size})")
        key_b, key_d, key_s = bucket, dst, src
        if prev is not None:
            key_b = np.concatenate([[prev[0]], bucket])
            key_d = np.concatenate([[prev[1]], dst])
            key_s = np.concatenate([[prev[2]], src])
        same_bucket = key_b[1:] == key_b[:-1]
        descending = same_bucket & ((key_d[1:] < key_d[:-1]) | ((key_d[1:] == key_d[:-1]) & (key_s[1:] < key_s[:-1])))
        if descending.any():
            k = int(np.flatnonzero(descending)[0]) - (1 if prev is not None else 0)
            fail("edges/dst", index, f"edge {start + k} breaks the (dst, src) order inside its bucket")
        if len(src):
            prev = (int(bucket[-1]), int(dst[-1]), int(src[-1]))
        in_degree += np.bincount(dst, minlength=n)
        out_degree += np.bincount(src, minlength=n)
        if rel_chunks is not None:
            _, _, rel = next(rel_chunks)
            bad = np.flatnonzero((rel < 0) | (rel >= m.num_relations))
            if len(bad):
                fail("edges/rel", index, f"relation {rel[bad[0]]} outside [0, {m.num_relations})")
    for name, expected in (("nodes/in_degree", in_degree), ("nodes/out_degree", out_degree)):
        for index, start, rows in _iter_chunks(store, name):
            bad = np.flatnonzero(rows != expected[start : start + len(rows)])
            if len(bad):
                fail(name, index, f"node {start + bad[0]} has degree {rows[bad[0]]}, edges say {expected[start + bad[0]]}")

    if m.has_labels:
        for index, start, rows in _iter_chunks(store, "nodes/labels"):
            bad = np.flatnonzero((rows < -1) | (rows >= m.num_classes))
            if len(bad):
                fail("nodes/labels", index, f"node {start + bad[0]} has label {rows[bad[0]]} outside [-1, {m.num_classes})")
    if m.has_features:
        for index, start, rows in _iter_chunks(store, "nodes/features"):
            rows = decode(rows, m.feature_dtype)  # bfloat16's uint16 bits are always "finite" as integers
            if not np.isfinite(rows).all():
                row = int(np.argwhere(~np.isfinite(rows))[0][0])
                fail("nodes/features", index, f"node {start + row} has a non-finite feature")

    checked = {"nodes/orig_id", "nodes/store_id", "edges/src", "edges/dst", "edges/rel",
               "nodes/in_degree", "nodes/out_degree", "nodes/labels", "nodes/features"}
    arrays = _all_arrays(store._root)
    for name in arrays:
        if name in checked:
            continue
        for index, _, rows in _iter_chunks(store, name):
            if name.startswith("splits/") and not name.endswith("/rel") and rows.dtype.kind == "i":
                bad = np.flatnonzero((rows < 0) | (rows >= n))
                if len(bad):
                    fail(name, index, f"node id {rows.flat[bad[0]]} outside [0, {n})")
        if name.startswith("splits/nodes/"):
            ids = store.array(name)[...]
            if len(ids) > 1 and (np.diff(ids.astype(np.int64)) <= 0).any():
                fail(name, 0, "node ids are not strictly ascending")
    tables = _check_segment_tables(store)
    store.close()
    return {"path": str(store.path), "arrays": len(arrays), "num_nodes": n, "num_edges": e,
            "segment_tables": tables, "segment_checksums": tables > 0, "ok": True}


def _bytes_on_disk(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def store_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Everything `graphstore info` prints, as JSON-ready data."""
    store = _open_quietly(path)
    m = store.manifest
    arrays = {}
    for name in _all_arrays(store._root):
        arr = store.array(name)
        arrays[name] = {
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "chunks": list(arr.chunks),
            "bytes_on_disk": _bytes_on_disk(store.path / name),
        }
    return {
        "path": str(store.path),
        "format_version": m.format_version,
        "name": m.source.get("name"),
        "num_nodes": m.num_nodes,
        "num_edges": m.num_edges,
        "directed": m.directed,
        "num_partitions": m.num_partitions,
        "partition_size": m.partition_size,
        "feature_dim": m.feature_dim,
        "feature_dtype": m.feature_dtype,
        "num_classes": m.num_classes,
        "num_relations": m.num_relations,
        "tasks": m.tasks,
        "splits": m.splits,
        "split_kinds": m.split_kinds,
        "split_origin": m.split_origin,
        "source": m.source,
        "partitioner": m.partitioner,
        "edge_cut": m.partitioner.get("edge_cut"),
        "conversion": m.conversion,
        "bytes_on_disk": _bytes_on_disk(store.path),
        "arrays": arrays,
        "segment_checksums": store.verifies_partial_reads,
        "aggregates": store.aggregates,
        "created_by": m.created_by,
    }
