"""Segment checksums: the crc32c of every edge bucket and node partition of a store.

A chunk's crc32c covers the whole chunk, but the training path reads pieces of chunks: an
edge bucket is a range inside a 4 MiB edge chunk, and a 1-D node array keeps several
partitions in one chunk. So that those reads are verified too, each such array gets a table
with one checksum per piece it is read in (`graphstore.layout._chunkio.SegmentTable`)::

    OUT.gs/checksums/                 group; attrs["graphstore_checksums"] = {"version": 1,
                                      "algorithm": "crc32c", "arrays": {name: kind}}
                                      (written last: a group without it is incomplete)
      edges/src, edges/dst, edges/rel [p*p] uint32  bucket b = j*p + i, in storage order:
                                      rows [bucket_offsets[b], bucket_offsets[b+1])
      nodes/<array>                   [p] uint32    partition k: rows [k*P, min((k+1)*P, N))
                                      (labels, orig_id, store_id, degrees)
      nodes/features                  [S] uint32    block s: rows [bounds[s], bounds[s+1]), the
      nodes/aggregated_<op>                         blocks of about BLOCK_BYTES that tile each partition
                                      and each chunk (`block_bounds`)
      hubs/edges/src, dst, rel        [p+1] uint32  hub segment g: rows [offsets[g], offsets[g+1])
                                      of the hub group's edge copy (`graphstore.layout._hubs`)
      hubs/ids, features, labels      [1] uint32    the whole array (read whole, at once)

Feature rows get blocks rather than partitions because the macro-batch scheme reads sets of
rows scattered over the whole graph (`graphstore.layout._rowsets`): with one checksum per
partition, verifying one row would mean reading its partition. A 4 KiB block is the
smallest read the disk serves anyway; the table costs 4 bytes per 4 KiB of features.
A store whose features table is per partition (written before blocks) still reads and
verifies correctly; its scattered reads fall back to whole chunks until `graphstore
upgrade` rebuilds the tables.

Each entry is the crc32c of the rows' raw little-endian bytes, exactly the bytes of the
chunk files, so a reader checks what it read without decoding anything. The tables are
built by reading the arrays back through `ChunkReader` in whole chunks, whose own checksums
are verified on the way: a table is computed from data already known good. `convert`
writes them for every new store, `graphstore upgrade` adds them to a store written before
they existed (format v1 either way: the tables are an addition, not a format change).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import crc32c
import numpy as np
import zarr

from graphstore.errors import CorruptStoreError
from graphstore.layout._arrays import new_array
from graphstore.layout._chunkio import ArrayLayout, ChunkReader, SegmentTable, shared_reader
from graphstore.layout._durable import fsync_tree

__all__ = ["BLOCK_BYTES", "CHECKSUMS_GROUP", "block_bounds", "load_segment_tables", "segment_arrays", "segment_crcs", "write_segment_checksums"]

log = logging.getLogger(__name__)

CHECKSUMS_GROUP = "checksums"
"""Path of the group holding the tables, inside the store."""
ATTRS_KEY = "graphstore_checksums"
"""Key of the group's completion record."""
_VERSION = 1
BLOCK_BYTES = 4096
"""Target bytes of a feature block (one page: the least the disk reads)."""
_READ_ROWS_BYTES = 64 << 20
"""Bytes read per step while building a table (memory bound of `write_segment_checksums`)."""


def segment_arrays(group: zarr.Group) -> dict[str, str]:
    """The store's arrays that get a table, and their kind (``"buckets"``/``"partitions"``).

    Per-node arrays are the numeric arrays under ``nodes/`` (``nodes/name``, strings, is
    read only whole, through zarr); edge arrays are ``edges/src``, ``dst`` and ``rel``.
    """
    kinds: dict[str, str] = {}
    for prefix, kind, names in (("nodes", "partitions", None), ("edges", "buckets", ("src", "dst", "rel")),
                                ("hubs/edges", "hub_segments", ("src", "dst", "rel")),
                                ("hubs", "whole", ("ids", "features", "labels"))):
        if prefix not in group:
            continue
        for name, member in group[prefix].members():
            if not isinstance(member, zarr.Array) or (names is not None and name not in names):
                continue
            if np.dtype(member.dtype).kind in "biuf":
                full = f"{prefix}/{name}"
                # Feature-like rows (the features, their stored aggregates) are read as
                # scattered row sets, so they get blocks.
                blocks = full == "nodes/features" or full.startswith("nodes/aggregated_")
                kinds[full] = "blocks" if blocks else kind
    return kinds


def block_bounds(*, num_rows: int, row_bytes: int, chunk_rows: int, partition_size: int) -> np.ndarray:
    """[S+1] int64 boundaries of the feature blocks: every ``max(1, BLOCK_BYTES // row_bytes)``
    rows from each partition's first row, cut again at every chunk boundary, so a block lies
    in one partition and one chunk file (a partition read covers whole blocks, a block read
    is one range of one file).

    >>> block_bounds(num_rows=10, row_bytes=2048, chunk_rows=3, partition_size=5).tolist()
    [0, 2, 3, 4, 5, 6, 7, 9, 10]
    """
    per = max(1, BLOCK_BYTES // max(1, row_bytes))
    starts = np.arange(0, num_rows, max(1, partition_size), dtype=np.int64)
    within = np.arange(0, max(1, partition_size), per, dtype=np.int64)
    grid = (starts[:, None] + within[None, :]).reshape(-1)
    cuts = np.arange(0, num_rows, max(1, chunk_rows), dtype=np.int64)
    bounds = np.union1d(np.union1d(grid[grid < num_rows], cuts), [0, num_rows])
    return bounds.astype(np.int64)


def _bounds(kind: str, *, num_rows: int, partition_size: int, num_partitions: int,
            bucket_offsets: np.ndarray, hub_offsets=None, array: zarr.Array | None = None) -> np.ndarray:
    if kind == "blocks":
        layout = ArrayLayout.of(array)
        return block_bounds(num_rows=num_rows, row_bytes=layout.row_bytes, chunk_rows=layout.chunk_rows,
                            partition_size=partition_size)
    if kind == "buckets":
        return np.asarray(bucket_offsets, dtype=np.int64)
    if kind == "hub_segments":
        return np.asarray(hub_offsets(), dtype=np.int64)
    if kind == "whole":
        return np.array([0, num_rows], dtype=np.int64)
    return np.minimum(np.arange(num_partitions + 1, dtype=np.int64) * partition_size, num_rows)


def _hub_offsets(root: zarr.Group, reader: ChunkReader):
    """A function reading ``hubs/offsets`` whole (chunk-verified), once, when first asked."""
    got: list[np.ndarray] = []

    def read() -> np.ndarray:
        if not got:
            array = root["hubs/offsets"]
            got.append(reader.read(ArrayLayout.of(array, name="hubs/offsets"), 0, array.shape[0])[0])
        return got[0]

    return read


def segment_crcs(reader: ChunkReader, layout: ArrayLayout, bounds: np.ndarray) -> np.ndarray:
    """[S] uint32 crc32c of rows ``[bounds[s], bounds[s+1])`` of ``layout``'s array.

    Reads the array in whole chunks (each verified by its own checksum), ``_READ_ROWS_BYTES``
    at a time, and carries a segment's running crc from one step into the next.
    """
    n, rb = layout.shape[0], layout.row_bytes
    crcs = np.zeros(len(bounds) - 1, dtype=np.uint32)
    step = max(1, _READ_ROWS_BYTES // max(1, rb * layout.chunk_rows)) * layout.chunk_rows
    s = 0  # the first segment not finished yet
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        rows, _ = reader.read(layout, lo, hi)
        data = memoryview(rows.reshape(-1)).cast("B")
        # Segments that hold rows of [lo, hi): from s up to the one holding row hi - 1.
        last = int(np.searchsorted(bounds, hi - 1, side="right")) - 1
        for t in range(s, last + 1):
            a, b = max(int(bounds[t]), lo), min(int(bounds[t + 1]), hi)
            if b > a:
                crcs[t] = crc32c.crc32c(data[(a - lo) * rb : (b - lo) * rb], int(crcs[t]))
        s = last if int(bounds[last + 1]) > hi else last + 1
    return crcs


def write_segment_checksums(path: str | Path, *, num_partitions: int, partition_size: int,
                            reader: ChunkReader | None = None) -> dict[str, str]:
    """Build and write the tables of the store (or store being built) at ``path``.

    An existing ``checksums`` group is replaced. The tables are synced to disk, then the
    completion record goes in, so a crash part-way leaves a group that
    `load_segment_tables` ignores and the next call rebuilds.

    Returns
    -------
    dict
        Array name -> kind, as recorded.

    Raises
    ------
    CorruptStoreError
        A chunk read to build a table is missing, short or fails its own checksum.
    """
    path = Path(path)
    root = zarr.open_group(str(path), mode="r+", zarr_format=3)
    if CHECKSUMS_GROUP in root:
        shutil.rmtree(path / CHECKSUMS_GROUP)
        root = zarr.open_group(str(path), mode="r+", zarr_format=3)
    offsets = np.asarray(root["edges/bucket_offsets"][...], dtype=np.int64)
    kinds = segment_arrays(root)
    own = reader is None
    reader = reader or ChunkReader(name="graphstore-checksums")
    try:
        group = root.create_group(CHECKSUMS_GROUP)
        for name, kind in kinds.items():
            array = root[name]
            bounds = _bounds(kind, num_rows=array.shape[0], partition_size=partition_size,
                             num_partitions=num_partitions, bucket_offsets=offsets,
                             hub_offsets=_hub_offsets(root, reader), array=array)
            crcs = segment_crcs(reader, ArrayLayout.of(array), bounds)
            table = new_array(group, name, shape=crcs.shape, dtype="uint32", chunks=(max(1, len(crcs)),))
            table[...] = crcs
    finally:
        if own:
            reader.close()
    # The tables reach the disk before the record that says they are complete.
    fsync_tree(path / CHECKSUMS_GROUP)
    group.attrs[ATTRS_KEY] = {"version": _VERSION, "algorithm": "crc32c", "arrays": kinds}
    fsync_tree(path / CHECKSUMS_GROUP)
    log.info("%s: segment checksums for %d arrays", path, len(kinds))
    return kinds


def load_segment_tables(root: zarr.Group, where: str, *, num_partitions: int, partition_size: int,
                        bucket_offsets: np.ndarray) -> dict[str, SegmentTable] | None:
    """The store's tables by array name, or None when it has none (or an incomplete group).

    Raises
    ------
    CorruptStoreError
        A table that fails its own checksum or does not match its array.
    """
    if CHECKSUMS_GROUP not in root:
        return None
    group = root[CHECKSUMS_GROUP]
    record = group.attrs.get(ATTRS_KEY)
    if not isinstance(record, dict) or record.get("version") != _VERSION:
        return None
    tables = {}
    reader = shared_reader()
    hub_offsets = _hub_offsets(root, reader)
    for name, kind in dict(record.get("arrays", {})).items():
        try:
            array = group[name]
        except KeyError:
            raise CorruptStoreError(f"{where}: {CHECKSUMS_GROUP}/{name} is missing") from None
        # Whole chunks, each verified by its own crc32c (a missing file fails too).
        crcs, _ = reader.read(ArrayLayout.of(array, name=f"{CHECKSUMS_GROUP}/{name}"), 0, array.shape[0])
        try:
            bounds = _bounds(kind, num_rows=root[name].shape[0], partition_size=partition_size,
                             num_partitions=num_partitions, bucket_offsets=bucket_offsets, hub_offsets=hub_offsets,
                             array=root[name])
        except KeyError:
            raise CorruptStoreError(f"{where}: {name}, which {CHECKSUMS_GROUP}/ covers, is missing") from None
        if len(crcs) != len(bounds) - 1:
            raise CorruptStoreError(f"{where}: {CHECKSUMS_GROUP}/{name} has {len(crcs)} entries, "
                                    f"expected {len(bounds) - 1} ({kind})")
        tables[name] = SegmentTable(bounds, crcs, kind=kind, num_partitions=num_partitions)
    return tables
