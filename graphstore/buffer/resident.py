"""The resident graph: what the samplers see of the partitions currently in the buffer.

Local ids number the resident nodes partition by partition, in the order the buffer state
lists its partitions: partition ``partitions[s]`` occupies local ids
``[local_start[s], local_start[s] + size_s)``, row r of it being store id
``partitions[s] * P + r``. Because store ids are partition-contiguous, mapping between
store and local ids is arithmetic on the partition number, not a hash table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphstore.errors import ConfigError
from graphstore.layout.store import Store

__all__ = ["ResidentGraph", "assemble_resident_graph", "build_resident_graph"]


@dataclass(frozen=True, eq=False)
class ResidentGraph:
    """CSC adjacency, features and id maps over the nodes of the resident partitions."""

    partitions: tuple[int, ...]
    """Resident partition ids, in local-id order."""
    partition_size: int
    """P of the store: rows per partition."""
    local_start: np.ndarray
    """[len(partitions) + 1] int64, first local id of each resident partition (and the total)."""
    slot_of: np.ndarray
    """[num_partitions] int64, index of each store partition in `partitions`, -1 if absent."""
    node_ids: torch.Tensor
    """[num_nodes] int64, store id of each local node."""
    indptr: torch.Tensor
    """[num_nodes + 1] int64, CSC: the in-neighbours of local node v are
    ``indices[indptr[v]:indptr[v + 1]]``."""
    indices: torch.Tensor
    """[num_edges] int64, local id of each edge's source, grouped by destination."""
    rel: torch.Tensor | None
    """[num_edges] int64 relation of each edge (aligned with ``indices``), or None."""
    features: torch.Tensor | None
    """[num_nodes, D] feature rows of the local nodes, or None."""
    labels: torch.Tensor | None
    """[num_nodes] int64 labels (-1 unlabeled), or None."""

    @property
    def num_nodes(self) -> int:
        return int(self.local_start[-1])

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def to_local(self, store_ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """[n] int64 local id of each store id, -1 where its partition is not resident."""
        ids = torch.as_tensor(np.asarray(store_ids), dtype=torch.int64)
        part = ids // self.partition_size
        if len(ids) and (ids.min() < 0 or part.max() >= len(self.slot_of)):
            raise ConfigError(f"store ids must be in [0, {len(self.slot_of) * self.partition_size})")
        slot = torch.from_numpy(self.slot_of)[part]
        starts = torch.from_numpy(self.local_start)
        local = starts[slot.clamp(min=0)] + ids - part * self.partition_size
        return torch.where(slot >= 0, local, torch.full_like(local, -1))


Bucket = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]
"""One edge bucket as `Store.read_bucket` returns it: ``(src, dst, rel)``, [m] store ids each."""


def build_resident_graph(store: Store, partitions: Sequence[int], *, with_features: bool = True) -> ResidentGraph:
    """Read ``partitions`` and every bucket among them from ``store`` into a `ResidentGraph`.

    Edge buckets (i, j) for resident i and j are exactly the edges of the subgraph the
    resident nodes induce; they become a CSC over local ids (sources sorted within each
    destination, as the store keeps them).

    Raises
    ------
    ConfigError
        An unknown or repeated partition id.
    """
    parts = _check_partitions(store, partitions)
    buckets = {(i, j): store.read_bucket(i, j) for j in parts for i in parts}
    features = labels = None
    if with_features and store.manifest.has_features:
        features = {k: store.read_features(k) for k in parts}
    if store.manifest.has_labels:
        labels = {k: store.read_labels(k) for k in parts}
    return assemble_resident_graph(store, parts, buckets=buckets, features=features, labels=labels)


def _check_partitions(store: Store, partitions: Sequence[int]) -> tuple[int, ...]:
    parts = tuple(int(k) for k in partitions)
    if len(set(parts)) != len(parts):
        raise ConfigError(f"resident partitions must be distinct (got {list(parts)})")
    for k in parts:
        store.partition_range(k)  # raises ConfigError naming a bad id
    return parts


def assemble_resident_graph(
    store: Store,
    partitions: Sequence[int],
    *,
    buckets: Mapping[tuple[int, int], Bucket],
    features: Mapping[int, np.ndarray] | None,
    labels: Mapping[int, np.ndarray] | None,
) -> ResidentGraph:
    """Build the `ResidentGraph` of ``partitions`` from rows and buckets already read.

    Touches only ``store``'s metadata (sizes, dtypes), never its arrays, so a loader thread
    can do the IO and the assembly can run wherever is convenient. The result is
    identical to `build_resident_graph` given the same data.

    Parameters
    ----------
    store : Store
        The store the data came from (for partition sizes and dtypes).
    partitions : sequence of int
        Resident partition ids, in local-id order.
    buckets : mapping (i, j) -> (src, dst, rel)
        Every bucket among ``partitions``: [m] store ids each, ``rel`` [m] or None.
    features : mapping k -> [P_k, D] array, or None
        Feature rows of each partition (None: no features in the result).
    labels : mapping k -> [P_k] int32 array, or None
        Labels of each partition (None: no labels in the result).

    Raises
    ------
    ConfigError
        An unknown or repeated partition id.
    KeyError
        A bucket, feature or label block of a resident partition is missing.
    """
    parts = _check_partitions(store, partitions)
    P = store.partition_size
    ranges = [store.partition_range(k) for k in parts]
    local_start = np.concatenate([[0], np.cumsum([stop - start for start, stop in ranges], dtype=np.int64)])
    node_ids = np.concatenate([np.zeros(0, np.int64)] + [np.arange(start, stop) for start, stop in ranges])
    slot_of = np.full(store.num_partitions, -1, dtype=np.int64)
    slot_of[list(parts)] = np.arange(len(parts))

    def local(ids: np.ndarray) -> np.ndarray:
        ids = ids.astype(np.int64, copy=False)
        part = ids // P
        return local_start[slot_of[part]] + ids - part * P

    src_parts, dst_parts, rel_parts = [], [], []
    for j in parts:
        # Buckets (i, j) for all i lie side by side; read the resident ones.
        for i in parts:
            s, d, r = buckets[(i, j)]
            src_parts.append(local(s))
            dst_parts.append(local(d))
            if r is not None:
                rel_parts.append(r.astype(np.int64))
    empty = np.zeros(0, np.int64)
    src = np.concatenate([empty, *src_parts])
    dst = np.concatenate([empty, *dst_parts])
    rel = np.concatenate([empty, *rel_parts]) if store.manifest.has_relations else None
    # Group by destination; within a destination keep ascending source. The concatenation
    # already has it: buckets of one j come in state order of i, which is local-id order,
    # and each bucket is sorted by (dst, src) in the store. So a stable sort by dst alone
    # gives the (dst, src) order, and timsort only merges those sorted runs (several times
    # faster than a lexsort on millions of edges).
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    rel = None if rel is None else rel[order]
    indptr = np.zeros(int(local_start[-1]) + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=int(local_start[-1])), out=indptr[1:])

    if features is not None:
        dtype = np.dtype(store.manifest.feature_dtype)
        rows = [np.zeros((0, store.feature_dim), dtype)] + [features[k] for k in parts]
        features = torch.from_numpy(np.concatenate(rows))
    if labels is not None:
        rows = [np.zeros(0, np.int32)] + [labels[k] for k in parts]
        labels = torch.from_numpy(np.concatenate(rows).astype(np.int64))
    return ResidentGraph(
        partitions=parts,
        partition_size=P,
        local_start=local_start,
        slot_of=slot_of,
        node_ids=torch.from_numpy(node_ids.astype(np.int64)),
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(src),
        rel=None if rel is None else torch.from_numpy(rel),
        features=features,
        labels=labels,
    )
