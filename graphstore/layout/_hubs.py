"""The hub group: HierBatching's static-cache nodes and a second, contiguous copy of their edges.

HierBatching (Appendix C.1) keeps the highest-degree nodes' *features* in memory for the
whole run, but not their edge lists: on a power-law graph those touch a large share of all
edges (32 % for the top 1 % of the out-of-core benchmark's graph). The paper stores another
copy of the hubs' edges contiguously on disk, re-reads it with each mega-batch, and keeps
only the edges the mega-batch induces. This module writes that copy::

    STORE/hubs/                      group; attrs["graphstore_hubs"] = {"version": 1,
                                     "fraction", "num_hubs", "num_edges", "degree": "in+out"}
                                     (written last: a group without it is incomplete)
      ids          [k]      int64    hub store ids, ascending: the k = ceil(fraction * N)
                                     highest in+out degrees, ties to the lower id
      features     [k, D]            their feature rows (one sequential read fills the cache)
      labels       [k]      int32    their labels
      offsets      [p + 2]  int64    segment bounds of the edge arrays
      edges/src, edges/dst, edges/rel
                   [m]               every stored edge with a hub end, once, by segment:
                                     segment g < p holds the edges between a hub and a
                                     non-hub node of partition g; segment p the hub-hub edges;
                                     inside a segment by (dst is a hub, dst, src)

Where we depart from the paper, and why: the paper groups the copy by hub and reads all of
it for each mega-batch. Grouped by the partition of the non-hub end, a mega-batch of c
partitions reads only its c segments (plus the hub-hub one): the same sequential access
with c/p of the bytes, and every edge it reads is one the mega-batch may keep (its other
end is resident). Only edges whose hub end's partition is not resident are kept; the
others come with their bucket.

The group is checksummed like the rest of the store (`graphstore.layout._segments`: one
crc32c per segment of the edge arrays, one per whole array for ids, features, labels).
`convert` writes it (``hub_fraction``, default 0.01, HierBatching's r_s) and
``graphstore hubs STORE --fraction F`` rewrites it for another fraction.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from graphstore.errors import ConfigError, CorruptStoreError, StoreError
from graphstore.layout._arrays import new_array
from graphstore.layout._chunkio import ArrayLayout, ChunkReader
from graphstore.layout._durable import fsync_dir, fsync_tree
from graphstore.layout._native import edges as _edge_kernels

__all__ = ["DEFAULT_HUB_FRACTION", "HUBS_GROUP", "HubIndex", "hub_ids", "read_hub_index", "write_hubs"]

log = logging.getLogger(__name__)

DEFAULT_HUB_FRACTION = 0.01
"""HierBatching's r_s: the hub group `convert` and `upgrade` write by default."""
HUBS_GROUP = "hubs"
"""Path of the group inside the store."""
ATTRS_KEY = "graphstore_hubs"
"""Key of the group's completion record."""
_VERSION = 1
_BUILDING = ".hubs-building"
"""The new group is built here (beside the store's arrays) and renamed into place."""
_REPLACED = ".hubs-replaced"
_STEP_ROWS = 1 << 22
"""Rows (edges or nodes) per step while building: bounds the builder's temporaries."""
_USE_COMPILED = True
"""Whether the two edge passes run in C (`graphstore.layout._native.edges.hub_segments`) when
the library is built; the numpy path writes the same group (tests compare them)."""


@dataclass(frozen=True, eq=False)
class HubIndex:
    """What a reader needs to use the hub group: the hubs and where each segment lies."""

    ids: np.ndarray
    """[k] int64 hub store ids, ascending."""
    offsets: np.ndarray
    """[p + 2] int64: segment g is edge rows ``[offsets[g], offsets[g + 1])``; segment p
    holds the hub-hub edges."""
    fraction: float
    """The fraction of nodes the group was built for."""

    @property
    def num_hubs(self) -> int:
        return int(self.ids.size)

    @property
    def num_edges(self) -> int:
        return int(self.offsets[-1])

    @property
    def segment_sizes(self) -> np.ndarray:
        """[p + 1] int64 edges per segment."""
        return np.diff(self.offsets)


def hub_ids(degrees: np.ndarray, fraction: float) -> np.ndarray:
    """Store ids of the ``ceil(fraction * N)`` highest ``degrees``, ties to the lower id,
    ascending (HierBatching's static cache).

    The one rule for the cache's nodes: the hub group is written with it (streamed, by
    `_top_degree_ids`) and the buffer chooses with it (`graphstore.buffer.cache`).

    Examples
    --------
    >>> hub_ids(np.array([3, 9, 1, 9, 4]), 0.5).tolist()
    [1, 3, 4]
    """
    deg = np.asarray(degrees)
    return _highest(deg, math.ceil(fraction * len(deg)))


def _highest(degrees: np.ndarray, k: int) -> np.ndarray:
    """[k] int64 positions of the k highest ``degrees``, ties to the lower position, ascending."""
    # A stable sort on the negated degree keeps equal degrees in position order. Widen
    # first: negating an unsigned array would wrap around.
    order = np.argsort(-degrees.astype(np.float64 if degrees.dtype.kind == "f" else np.int64), kind="stable")
    return np.sort(order[:k]).astype(np.int64)


def _top_degree_ids(root: zarr.Group, reader: ChunkReader, num_nodes: int, k: int) -> np.ndarray:
    """`hub_ids` of the store's in+out degrees, streamed: O(k + step) memory, not O(N)."""
    layouts = [ArrayLayout.of(root[name], name=name) for name in ("nodes/in_degree", "nodes/out_degree")]
    best_ids = np.zeros(0, np.int64)
    best_deg = np.zeros(0, np.int64)
    for lo in range(0, num_nodes, _STEP_ROWS):
        hi = min(num_nodes, lo + _STEP_ROWS)
        deg = reader.read(layouts[0], lo, hi)[0].astype(np.int64) + reader.read(layouts[1], lo, hi)[0]
        # The best so far (ascending, all below lo) then this step's ids: positions are in
        # id order, so `_highest`'s ties to the lower position are ties to the lower id.
        ids = np.concatenate([best_ids, np.arange(lo, hi, dtype=np.int64)])
        deg = np.concatenate([best_deg, deg])
        keep = _highest(deg, k)
        best_ids, best_deg = ids[keep], deg[keep]
    return best_ids


def _segment_of(src: np.ndarray, dst: np.ndarray, is_hub: np.ndarray, partition_size: int,
                num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """For edges with a hub end: their positions in the chunk and their segment."""
    hub_src, hub_dst = is_hub[src], is_hub[dst]
    touch = np.flatnonzero(hub_src | hub_dst)
    other = np.where(hub_src[touch], dst[touch], src[touch]).astype(np.int64) // partition_size
    segment = np.where(hub_src[touch] & hub_dst[touch], num_partitions, other)
    return touch, segment


def write_hubs(path: str | os.PathLike, *, fraction: float, num_nodes: int, num_partitions: int,
               partition_size: int, reader: ChunkReader | None = None) -> HubIndex | None:
    """Build the hub group of the store (or store being built) at ``path``.

    Reads the degrees, edges, features and labels through chunk-verified reads, builds the
    new group beside the arrays, syncs it and renames it into place (an old group is
    replaced only once the new one is complete). ``fraction == 0`` removes the group.
    Memory: O(N) bytes (a hub flag per node) plus O(k + step); the edge copy is assembled
    in a file-backed scratch array, not in memory.

    The caller holds the store's writer lock (or builds a store nobody can open yet), and
    rebuilds the segment checksums afterwards (`write_segment_checksums`).

    Raises
    ------
    ConfigError
        ``fraction`` outside [0, 1].
    CorruptStoreError
        A chunk read on the way fails its own checksum.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"hub fraction must be in [0, 1] (got {fraction!r})")
    path = Path(path)
    for leftover in (_BUILDING, _REPLACED):  # from a killed earlier build
        shutil.rmtree(path / leftover, ignore_errors=True)
    if fraction == 0:
        if (path / HUBS_GROUP).exists():
            os.replace(path / HUBS_GROUP, path / _REPLACED)
            fsync_dir(path)
            shutil.rmtree(path / _REPLACED)
        return None
    own = reader is None
    reader = reader or ChunkReader(name="graphstore-hubs")
    try:
        index = _build(path, path / _BUILDING, reader, float(fraction), num_nodes, num_partitions, partition_size)
    except BaseException:
        shutil.rmtree(path / _BUILDING, ignore_errors=True)
        raise
    finally:
        if own:
            reader.close()
    fsync_tree(path / _BUILDING)
    if (path / HUBS_GROUP).exists():
        os.replace(path / HUBS_GROUP, path / _REPLACED)
    os.replace(path / _BUILDING, path / HUBS_GROUP)
    fsync_dir(path)
    shutil.rmtree(path / _REPLACED, ignore_errors=True)
    log.info("%s: %d hubs (%.3g of the nodes), %d of their edges copied", path, index.num_hubs, fraction,
             index.num_edges)
    return index


def _build(path: Path, out: Path, reader: ChunkReader, fraction: float, num_nodes: int, p: int,
           P: int) -> HubIndex:
    root = zarr.open_group(str(path), mode="r", zarr_format=3)
    k = math.ceil(fraction * num_nodes)
    ids = _top_degree_ids(root, reader, num_nodes, k)
    is_hub = np.zeros(num_nodes, dtype=bool)
    is_hub[ids] = True
    names = [n for n in ("src", "dst", "rel") if f"edges/{n}" in root]
    edge_layouts = {n: ArrayLayout.of(root[f"edges/{n}"], name=f"edges/{n}") for n in names}
    num_edges = root["edges/src"].shape[0]

    def chunks():
        for lo in range(0, num_edges, _STEP_ROWS):
            hi = min(num_edges, lo + _STEP_ROWS)
            src = reader.read(edge_layouts["src"], lo, hi)[0]
            dst = reader.read(edge_layouts["dst"], lo, hi)[0]
            yield lo, hi, src, dst

    # Pass 1: segment sizes. Pass 2: every hub edge to its segment's next free position.
    # Each pass is one C call a chunk where the library is built (`hub_segments`), else numpy.
    kernel = _USE_COMPILED and _edge_kernels.library() is not None \
        and edge_layouts["src"].dtype in (np.int32, np.int64)
    counts = np.zeros(p + 1, dtype=np.int64)
    for _, _, src, dst in chunks():
        if kernel:
            _edge_kernels.hub_segments(src, dst, is_hub, P, p, counts=counts)
            continue
        _, segment = _segment_of(src, dst, is_hub, P, p)
        counts += np.bincount(segment, minlength=p + 1)
    offsets = np.zeros(p + 2, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    m = int(offsets[-1])

    group = zarr.open_group(str(out), mode="w", zarr_format=3)
    scratch_dir = out / "_scratch"
    scratch_dir.mkdir()
    scratch = {n: np.lib.format.open_memmap(str(scratch_dir / f"{n}.npy"), mode="w+",
                                            dtype=edge_layouts[n].dtype, shape=(m,)) for n in names}
    cursor = offsets[:-1].copy()
    for lo, hi, src, dst in chunks():
        rel = reader.read(edge_layouts["rel"], lo, hi)[0] if "rel" in names else None
        if kernel:
            try:
                _edge_kernels.hub_segments(src, dst, is_hub, P, p, cursor=cursor, end=offsets[1:],
                                           out=tuple(scratch[n] for n in names), rel=rel)
            except ValueError:
                raise CorruptStoreError(f"{path}: the edges changed between two reads while building hubs/") from None
            continue
        touch, segment = _segment_of(src, dst, is_hub, P, p)
        order = np.argsort(segment, kind="stable")  # keeps store order inside a segment
        segment = segment[order]
        size = np.bincount(segment, minlength=p + 1)
        first = np.cumsum(size) - size  # where each segment starts in this chunk's sorted run
        target = cursor[segment] + np.arange(segment.size) - first[segment]
        rows = {"src": src, "dst": dst, "rel": rel}
        for n in names:
            scratch[n][target] = rows[n][touch[order]]
        cursor += size
    if not np.array_equal(cursor, offsets[1:]):
        raise CorruptStoreError(f"{path}: the edges changed between two reads while building hubs/")
    _sort_segments(scratch, offsets, is_hub, names)

    chunk = root["edges/src"].chunks[0]
    for n in names:
        array = new_array(group, f"edges/{n}", shape=(m,), dtype=edge_layouts[n].dtype, chunks=(chunk,))
        for lo in range(0, m, chunk * 16):
            array[lo:lo + chunk * 16] = scratch[n][lo:lo + chunk * 16]
        del scratch[n]
    shutil.rmtree(scratch_dir)
    new_array(group, "offsets", shape=(p + 2,), dtype="int64", chunks=(p + 2,))[...] = offsets
    new_array(group, "ids", shape=(k,), dtype="int64", chunks=(max(1, k),))[...] = ids
    _copy_rows(root, group, reader, ids)
    group.attrs[ATTRS_KEY] = {"version": _VERSION, "fraction": fraction, "num_hubs": int(k),
                              "num_edges": m, "degree": "in+out"}
    return HubIndex(ids, offsets, fraction)


def _sort_segments(scratch: dict[str, np.ndarray], offsets: np.ndarray, is_hub: np.ndarray,
                   names: list[str]) -> None:
    """Order each segment by (destination is a hub, destination, source): a state maps
    the non-hub destinations of a segment to one slot and the hub ones to the cache rows,
    both in id order, so a segment joins the resident graph as two sorted runs and the
    by-destination sort of the assembly merges runs instead of sorting at random. One
    segment in memory at a time."""
    for g in range(len(offsets) - 1):
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        if hi - lo < 2:
            continue
        src, dst = scratch["src"][lo:hi], scratch["dst"][lo:hi]
        if is_hub.shape[0] <= 1 << 31:
            # One int64 key, (hub bit, dst, src) in 1 + 31 + 31 bits: one stable sort (a
            # merge of the segment's runs, which arrive sorted by bucket) instead of
            # lexsort's three; equal keys (relations of one pair) keep their order as before.
            key = is_hub[dst].astype(np.int64) << 62
            key |= dst.astype(np.int64) << 31
            key |= src.astype(np.int64)
            order = np.argsort(key, kind="stable")
            del key
        else:
            order = np.lexsort((src, dst, is_hub[dst]))
        for n in names:
            scratch[n][lo:hi] = scratch[n][lo:hi][order]


def _copy_rows(root: zarr.Group, group: zarr.Group, reader: ChunkReader, ids: np.ndarray) -> None:
    """The hubs' feature rows and labels, read a chunk of the source array at a time, each
    chunk holding a hub once (read a partition at a time, a chunk of several small
    partitions, three at 8M nodes, was read once per partition: 7 of the hub group's 16 s)."""
    for name in ("features", "labels"):
        if f"nodes/{name}" not in root:
            continue
        source = ArrayLayout.of(root[f"nodes/{name}"], name=f"nodes/{name}")
        rows = np.empty((ids.size, *source.shape[1:]), source.dtype)
        step = max(1, source.chunk_rows)
        chunk_of = ids // step
        bounds = np.searchsorted(chunk_of, np.arange(int(chunk_of[-1]) + 2)) if ids.size else [0]
        for c in np.unique(chunk_of).tolist():
            lo, hi = c * step, min((c + 1) * step, source.shape[0])
            block, _ = reader.read(source, lo, hi)
            sel = slice(int(bounds[c]), int(bounds[c + 1]))
            rows[sel] = block[ids[sel] - lo]
        row_bytes = max(1, int(np.prod(source.shape[1:], dtype=np.int64)) * source.dtype.itemsize)
        chunk = max(1, min(ids.size, (4 << 20) // row_bytes))
        new_array(group, name, shape=rows.shape, dtype=source.dtype, chunks=(chunk, *source.shape[1:]))[...] = rows


def read_hub_index(root: zarr.Group, where: str, *, num_partitions: int, read_whole) -> HubIndex | None:
    """The store's `HubIndex`, or None without a (complete) hub group.

    ``read_whole(name)`` reads a small array whole through verified chunks.

    Raises
    ------
    StoreError
        A hub group whose arrays do not match its record or the store.
    """
    if HUBS_GROUP not in root:
        return None
    record = root[HUBS_GROUP].attrs.get(ATTRS_KEY)
    if not isinstance(record, dict) or record.get("version") != _VERSION:
        return None
    ids = read_whole(f"{HUBS_GROUP}/ids")
    offsets = read_whole(f"{HUBS_GROUP}/offsets")
    if ids.size != record.get("num_hubs") or offsets.shape != (num_partitions + 2,) \
            or int(offsets[-1]) != record.get("num_edges") or (np.diff(offsets) < 0).any() \
            or (ids.size and (np.diff(ids) <= 0).any()):
        raise StoreError(f"{where}: {HUBS_GROUP}/ does not match its record "
                         f"({ids.size} ids, offsets of shape {offsets.shape}); "
                         f"rebuild it with `graphstore hubs {where}`")
    return HubIndex(ids.astype(np.int64), offsets.astype(np.int64), float(record["fraction"]))
