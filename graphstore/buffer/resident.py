"""The resident graph: what the samplers see of the partitions currently in the buffer.

Local ids are buffer rows (`graphstore.buffer.slots`): partition k in slot z is local ids
``[z*P, z*P + P_k)``, row r being store id ``k*P + r``; static-cache node i (when the
buffer has a cache and i's partition is not resident) is local id ``cache_start + i``.
Rows of empty slots, the padding after a short last partition, and cache rows whose
partition is resident are vacant: ``node_ids`` is -1 there and no edge touches them.
Mapping a store id to a local id is arithmetic on its partition number (and a binary
search among the cache ids), never a hash table.

The edges are those of the subgraph induced by the resident nodes (every bucket (i, j)
with i and j resident) plus, with a static cache, every edge between a cache node and a
resident or cache node that no bucket already holds: from the store's hub segments of the
resident partitions and the hub-hub segment (`graphstore.layout._hubs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphstore.buffer import _native as native
from graphstore.buffer._native import EdgePart
from graphstore.buffer.cache import StaticCache
from graphstore.buffer.slots import BufferMemory, host_array, rows_as_tensor
from graphstore.errors import ConfigError
from graphstore.layout.store import Store

__all__ = ["Bucket", "ResidentGraph", "assemble_resident_graph", "build_resident_graph", "build_structure_graph",
           "fill_cache_rows"]

Bucket = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]
"""One edge bucket as `Store.read_bucket` returns it: ``(src, dst, rel)``, [m] store ids each."""

_NO_CACHE = np.zeros(0, np.int64)


def _local_ids(ids: np.ndarray, slot_of: np.ndarray, P: int, cache_ids: np.ndarray, cache_start: int) -> np.ndarray:
    """[n] int64 local id of each store id: its slot row, else its cache row, else -1."""
    ids = np.asarray(ids).astype(np.int64, copy=False)
    part = ids // P
    slot = slot_of[part]
    local = np.where(slot >= 0, slot * P + ids - part * P, -1)
    if cache_ids.size:
        pos = np.minimum(np.searchsorted(cache_ids, ids), cache_ids.size - 1)
        cached = (slot < 0) & (cache_ids[pos] == ids)
        local = np.where(cached, cache_start + pos, local)
    return local


@dataclass(frozen=True, eq=False)
class ResidentGraph:
    """CSC adjacency, features, embeddings and id maps over the buffer's resident nodes."""

    partitions: tuple[int, ...]
    """Resident partition ids, in the state's order."""
    slots: tuple[int, ...]
    """Buffer slot of each of ``partitions``."""
    partition_size: int
    """P of the store: rows per partition (and per slot)."""
    store_num_nodes: int
    """N of the store."""
    slot_of: np.ndarray
    """[num_partitions] int64, slot of each store partition, -1 if not resident."""
    cache_ids: np.ndarray
    """[k] int64 store ids of the static cache (ascending; empty without a cache)."""
    cache_start: int
    """Local id of static-cache row 0 (``num_slots * P``)."""
    node_ids: torch.Tensor
    """[num_nodes] int64, store id of each local row, -1 where the row is vacant."""
    indptr: torch.Tensor
    """[num_nodes + 1] int64, CSC: the in-neighbours of local node v are
    ``indices[indptr[v]:indptr[v + 1]]``."""
    indices: torch.Tensor
    """[num_edges] int64, local id of each edge's source, grouped by destination; within a
    destination, bucket edges in ascending source store id, then static-cache edges."""
    rel: torch.Tensor | None
    """[num_edges] int64 relation of each edge (aligned with ``indices``), or None."""
    features: torch.Tensor | None
    """[num_nodes, D] feature rows by local id (vacant rows hold stale data), or None."""
    labels: torch.Tensor | None
    """[num_nodes] int32 labels by local id (-1 unlabeled), or None."""
    embeddings: torch.Tensor | None = None
    """[cache_start, 2, d] float32 learnable embedding (``[:, 0]``) and optimizer state
    (``[:, 1]``) by local id, or None. Updates are written back to the store."""

    @property
    def num_nodes(self) -> int:
        """Local id space: every slot row and cache row, vacant ones included."""
        return int(self.node_ids.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def out_indptr(self) -> None:
        """Only in-edges are resident (the samplers' ``SampleGraph`` protocol asks)."""
        return None

    @property
    def out_indices(self) -> None:
        return None

    def local_range(self, k: int) -> tuple[int, int]:
        """Local ids ``[start, stop)`` of resident partition k's rows."""
        z = int(self.slot_of[k]) if 0 <= k < len(self.slot_of) else -1
        if z < 0:
            raise ConfigError(f"partition {k} is not resident (resident: {sorted(self.partitions)})")
        P = self.partition_size
        return z * P, z * P + min(P, self.store_num_nodes - k * P)

    def __repr__(self) -> str:
        return (f"<ResidentGraph partitions={list(self.partitions)} slots={list(self.slots)} "
                f"cache={self.cache_ids.size} nodes={self.num_nodes} edges={self.num_edges}>")

    def to_local(self, store_ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """[n] int64 local id of each store id, -1 where it is neither resident nor cached."""
        ids = np.asarray(store_ids).astype(np.int64, copy=False)
        P = self.partition_size
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.slot_of) * P):
            raise ConfigError(f"store ids must be in [0, {len(self.slot_of) * P})")
        return torch.from_numpy(_local_ids(ids, self.slot_of, P, self.cache_ids, self.cache_start))

    def training_edges(self, bucket_states: np.ndarray | None,
                       state: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The resident edges state ``state`` trains: ``(src, dst, positions)``, int64 local
        ids of each edge's ends and its position in ``indices``/``rel``.

        An edge of bucket (i, j) trains here when ``bucket_states[i, j] == state`` (a link
        plan's assignment; None: every bucket). Static-cache copies of hub edges and vacant
        rows are never training edges. Edges come ordered by destination store id (stable,
        so by source store id within one): the order does not depend on which slots the
        partitions occupy (earlier epochs decide that), so a resumed run draws the same.
        """
        P, p = self.partition_size, len(self.slot_of)
        ids = self.node_ids
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), self.indptr.diff())
        src = self.indices
        keep = (ids[src] >= 0) & (ids[src] // P < p)
        if self.cache_ids.size:  # the cache's copies of hub edges are also in their buckets
            keep &= (src < self.cache_start) & (dst < self.cache_start)
        if bucket_states is not None:
            state_of = torch.from_numpy(np.asarray(bucket_states).astype(np.int64))
            keep &= state_of[ids[src] // P, ids[dst] // P] == state
        edges = torch.nonzero(keep).flatten()
        edges = edges[torch.argsort(ids[dst[edges]], stable=True)]
        return src[edges], dst[edges], edges

    def resident_nodes(self) -> torch.Tensor:
        """int64 local ids of the occupied rows, in store-id order (slot-independent, as
        `training_edges`)."""
        resident = torch.nonzero(self.node_ids >= 0).flatten()
        return resident[torch.argsort(self.node_ids[resident])]


def fill_cache_rows(memory: BufferMemory, cache: StaticCache, store: Store) -> int:
    """Read the cache's feature rows and labels from the store's hub group straight into
    the buffer's cache rows (one sequential, verified read each); returns the bytes read."""
    if memory.cache_rows != cache.num_nodes:
        raise ConfigError(f"the buffer has {memory.cache_rows} cache rows for a cache of {cache.num_nodes} nodes")
    rows = slice(memory.cache_start, memory.cache_start + cache.num_nodes)
    requests = [(f"hubs/{name}", 0, cache.num_nodes, host_array(tensor[rows]))
                for name, tensor in (("features", memory.features), ("labels", memory.labels))
                if tensor is not None]
    return sum(a.nbytes for a in store.read_many(requests)) if cache.num_nodes else 0


def read_hub_segment(store: Store, g: int) -> Bucket:
    """Hub segment g of the store (`Store.hub_segment_range`) as ``(src, dst, rel)``."""
    lo, hi = store.hub_segment_range(g)
    names = ["hubs/edges/src", "hubs/edges/dst"] + (["hubs/edges/rel"] if store.manifest.has_relations else [])
    src, dst, *rel = store.read_many([(name, lo, hi, None) for name in names])
    return src, dst, rel[0] if rel else None


def build_structure_graph(store: Store) -> tuple[ResidentGraph, int]:
    """The whole graph's structure and labels, no features: the ``macrobatch`` scheme's
    graph (features stay in the store), and the bytes read to build it.

    Local id = store id. The CSC is built one destination partition at a time (its edges are
    one contiguous range of the store: buckets ``(*, j)``), so the temporaries are one
    partition's edges, not the graph's; sources are int32 below 2**31 nodes (half the
    memory of the buffer's int64), ``indptr`` int64. Within a destination the sources come
    in ascending store id, as in `assemble_resident_graph`: samples drawn here are the ones
    the ``minibatch`` scheme draws.
    """
    n, p, P = store.num_nodes, store.num_partitions, store.partition_size
    small = n < 2**31
    indptr = np.zeros(n + 1, dtype=np.int32 if store.num_edges < 2**31 else np.int64)
    indices = np.empty(store.num_edges, dtype=np.int32 if small else np.int64)
    rel = np.empty(store.num_edges, dtype=np.int64) if store.manifest.has_relations else None
    labels = np.full(n, -1, dtype=np.int32)
    nbytes = 0
    for j in range(p):
        lo, hi = store.bucket_range(0, j)[0], store.bucket_range(p - 1, j)[1]  # buckets (0, j) .. (p-1, j)
        start, stop = store.partition_range(j)
        names = ["edges/src", "edges/dst"] + (["edges/rel"] if rel is not None else [])
        got = store.read_many([(name, lo, hi, None) for name in names]
                              + ([("nodes/labels", start, stop, None)] if store.manifest.has_labels else []))
        src, dst = got[0], got[1]
        order = np.argsort(dst, kind="stable")  # buckets by source partition: sources stay ascending
        indices[lo:hi] = src[order]
        if rel is not None:
            rel[lo:hi] = got[2][order]
        indptr[start + 1:stop + 1] = np.bincount(dst - start, minlength=stop - start)
        if store.manifest.has_labels:
            labels[start:stop] = got[-1]
        nbytes += sum(a.nbytes for a in got)
    np.cumsum(indptr, out=indptr)
    graph = ResidentGraph(
        partitions=tuple(range(p)), slots=tuple(range(p)), partition_size=P, store_num_nodes=n,
        slot_of=np.arange(p, dtype=np.int64), cache_ids=_NO_CACHE, cache_start=p * P,
        node_ids=torch.arange(n, dtype=torch.int64), indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(indices), rel=None if rel is None else torch.from_numpy(rel), features=None,
        labels=torch.from_numpy(labels) if store.manifest.has_labels else None)
    return graph, nbytes


def build_resident_graph(store: Store, partitions: Sequence[int], *, with_features: bool = True,
                         static_cache: StaticCache | None = None) -> ResidentGraph:
    """Read ``partitions`` (slot s = position s) and every bucket among them from ``store``.

    The direct, unbuffered build: a reference for `BufferManager` and a convenience for
    graphs that fit in memory.

    Raises
    ------
    ConfigError
        An unknown or repeated partition id.
    """
    parts = _check_partitions(store, partitions)
    cache_rows = 0 if static_cache is None else static_cache.num_nodes
    memory = BufferMemory.allocate(store, len(parts), with_features=with_features, cache_rows=cache_rows,
                                   pin=False)
    for z, k in enumerate(parts):
        start, stop = store.partition_range(k)
        rows = memory.slot_rows(z, stop - start)
        if memory.features is not None:
            memory.features[rows] = rows_as_tensor(store.read_features(k), store.manifest.feature_dtype)
        if memory.labels is not None:
            memory.labels[rows] = torch.from_numpy(store.read_labels(k))
    hub_edges = {}
    if static_cache is not None:
        fill_cache_rows(memory, static_cache, store)
        hub_edges = {g: read_hub_segment(store, g) for g in (*parts, store.num_partitions)}
    buckets = {(i, j): store.read_bucket(i, j) for j in parts for i in parts}
    return assemble_resident_graph(store, parts, tuple(range(len(parts))), memory=memory, buckets=buckets,
                                   static_cache=static_cache, hub_edges=hub_edges)


def _add_hub_edges(store: Store, parts: Sequence[int], slot_of: np.ndarray, cache_ids: np.ndarray,
                   memory: BufferMemory, hub_edges: Mapping[int, Bucket], hub_positions: dict | None,
                   edge_parts: list[EdgePart]) -> None:
    """Append, in local ids, the hub edges no bucket holds: those with an end outside the
    resident partitions (which is then a hub, in its cache row)."""
    P, p = store.partition_size, store.num_partitions
    hub_slot = slot_of[cache_ids // P]
    hub_resident = hub_slot >= 0
    # Each hub's local id this state: its slot row when its partition is resident, else
    # its cache row.
    hub_local = np.where(hub_resident, hub_slot * P + cache_ids % P,
                         memory.cache_start + np.arange(cache_ids.size, dtype=np.int64))
    for g in sorted(parts):
        s, d, r = hub_edges[g]
        if s.size == 0:
            continue
        # Segment g: one end is a non-hub node of partition g (resident). An edge is kept
        # when its hub end's partition is not resident, so that end is outside g: the end
        # outside g is the hub whenever it matters (an edge with both ends in g is dropped).
        hub_is_src = s // P != g
        hub = np.where(hub_is_src, s, d)
        keep = np.flatnonzero(slot_of[hub // P] < 0)
        hub_is_src = hub_is_src[keep]
        hub_loc = memory.cache_start + np.searchsorted(cache_ids, hub[keep])
        other = np.where(hub_is_src, d[keep], s[keep]).astype(np.int64) + int(slot_of[g] - g) * P
        edge_parts.append((np.where(hub_is_src, hub_loc, other), 0, np.where(hub_is_src, other, hub_loc), 0,
                           None if r is None else r[keep]))
    s, d, r = hub_edges[p]
    if s.size == 0:
        return
    positions = None if hub_positions is None else hub_positions.get(p)
    if positions is None:
        positions = (np.searchsorted(cache_ids, s).astype(np.int32), np.searchsorted(cache_ids, d).astype(np.int32))
        if hub_positions is not None:
            hub_positions[p] = positions
    sp, dp = positions
    keep = np.flatnonzero(~(hub_resident[sp] & hub_resident[dp]))
    edge_parts.append((hub_local[sp[keep]], 0, hub_local[dp[keep]], 0, None if r is None else r[keep]))


def _check_partitions(store: Store, partitions: Sequence[int]) -> tuple[int, ...]:
    parts = tuple(int(k) for k in partitions)
    if len(set(parts)) != len(parts):
        raise ConfigError(f"resident partitions must be distinct (got {list(parts)})")
    for k in parts:
        store.partition_range(k)  # raises ConfigError naming a bad id
    return parts


def _build_csc_numpy(edge_parts: Sequence[EdgePart], num_nodes: int, *, with_rel: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`graphstore.buffer._native.build_csc` in numpy, where the C builder is not built: the
    same result by a stable argsort of the concatenated destinations."""
    empty = np.zeros(0, np.int64)
    # The shifted copies live only while joined: this runs beside training, and its
    # temporaries count against the same memory (`graphstore.buffer.budget`).
    dst = np.concatenate([empty, *(d.astype(np.int64) + shift for _, _, d, shift, _ in edge_parts)])
    order = np.argsort(dst, kind="stable")  # timsort merges the sorted runs
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    del dst
    src = np.concatenate([empty, *(s.astype(np.int64) + shift for s, shift, _, _, _ in edge_parts)])[order]
    rel = np.concatenate([empty, *(r.astype(np.int64) for *_, r in edge_parts)])[order] if with_rel else None
    return indptr, src, rel


def assemble_resident_graph(
    store: Store,
    partitions: Sequence[int],
    slots: Sequence[int],
    *,
    memory: BufferMemory,
    buckets: Mapping[tuple[int, int], Bucket],
    static_cache: StaticCache | None = None,
    hub_edges: Mapping[int, Bucket] | None = None,
    hub_positions: dict | None = None,
) -> ResidentGraph:
    """Build the `ResidentGraph` of ``partitions`` held in ``slots`` of ``memory``.

    Touches only ``store``'s metadata, never its arrays: the rows are already in
    ``memory`` and the buckets given, so the assembly can run in the loader thread.

    Parameters
    ----------
    store : Store
        The store the data came from (sizes, dtypes).
    partitions, slots : sequence of int
        Resident partition ids and the slot holding each.
    memory : BufferMemory
        Slot tensors (features, labels, embeddings become the graph's, uncopied).
    buckets : mapping (i, j) -> (src, dst, rel)
        Every bucket among ``partitions``: [m] store ids each, ``rel`` [m] or None.
    static_cache : StaticCache, optional
        Cache nodes (their rows must be in ``memory``'s cache rows).
    hub_edges : mapping g -> (src, dst, rel)
        With a static cache: hub segment g of every resident partition g and the hub-hub
        segment (g = p), as `read_hub_segment` returns them.
    hub_positions : dict, optional
        Where the hub-hub segment's ends sit among the cache ids, computed on first use
        and kept here (the buffer keeps it with the segment, so later states skip it).

    Raises
    ------
    ConfigError
        An unknown or repeated partition id, or a slot out of range.
    KeyError
        A bucket among the resident partitions is missing.
    """
    parts = _check_partitions(store, partitions)
    slots = tuple(int(z) for z in slots)
    if len(slots) != len(parts) or len(set(slots)) != len(slots) or any(not 0 <= z < memory.num_slots for z in slots):
        raise ConfigError(f"slots {list(slots)} do not fit partitions {list(parts)} in {memory.num_slots} slots")
    P = store.partition_size
    cache_ids = _NO_CACHE if static_cache is None else static_cache.ids
    slot_of = np.full(store.num_partitions, -1, dtype=np.int64)
    slot_of[list(parts)] = slots
    num_nodes = memory.cache_start + cache_ids.size
    node_ids = np.full(num_nodes, -1, dtype=np.int64)
    for k, z in zip(parts, slots):
        start, stop = store.partition_range(k)
        node_ids[z * P:z * P + stop - start] = np.arange(start, stop)
    if cache_ids.size:
        uncovered = slot_of[cache_ids // P] < 0
        node_ids[memory.cache_start:][uncovered] = cache_ids[uncovered]

    # Every id of a bucket's side lies in one resident partition k: its local id is the
    # store id moved by a constant, (slot_of[k] - k) * P, with no per-edge partition lookup.
    edge_parts: list[EdgePart] = []
    # Buckets in partition-id order, so that each destination's sources come in ascending
    # store id whatever slots the partitions occupy: a sampler drawing positions in a
    # node's neighbour list then picks the same neighbours under any slot layout.
    for j in sorted(parts):
        for i in sorted(parts):
            s, d, r = buckets[(i, j)]
            edge_parts.append((s, int(slot_of[i] - i) * P, d, int(slot_of[j] - j) * P, r))
    if cache_ids.size:
        _add_hub_edges(store, parts, slot_of, cache_ids, memory, hub_edges, hub_positions, edge_parts)
    # Group by destination, stably: each bucket is sorted by (dst, src) in the store and the
    # buckets come in partition order of j, then i, so within a destination bucket edges
    # are in ascending source store id; hub edges follow them, segment by segment.
    with_rel = store.manifest.has_relations
    if native.library() is not None:
        indptr, src, rel = native.build_csc(edge_parts, num_nodes, with_rel=with_rel)
    else:
        indptr, src, rel = _build_csc_numpy(edge_parts, num_nodes, with_rel=with_rel)
    return ResidentGraph(
        partitions=parts,
        slots=slots,
        partition_size=P,
        store_num_nodes=store.num_nodes,
        slot_of=slot_of,
        cache_ids=cache_ids,
        cache_start=memory.cache_start,
        node_ids=torch.from_numpy(node_ids),
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(src),
        rel=None if rel is None else torch.from_numpy(rel),
        features=memory.features,
        labels=memory.labels,
        embeddings=memory.embeddings,
    )
