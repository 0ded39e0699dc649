"""The store format, version 1: the contract between `convert` (writer) and `open` (reader).

A store is a Zarr v3 group on disk::

    OUT.gs/
      zarr.json                   group; attrs["graphstore"] is the `Manifest` (written last:
                                  a directory without it is not a store)
      nodes/
        features   [N, D]  float32|float16|uint16  rows in store order; a chunk is one partition's
                                            rows or an equal slice of them (never straddles);
                                            uint16: bfloat16 bit patterns (layout/dtypes.py)
        labels     [N]     int32   class id, -1 = unlabeled          (when labeled)
        orig_id    [N]     index   source id of each store row
        store_id   [N]     index   store row of each source id (inverse of orig_id)
        in_degree  [N]     int64   stored edges ending at the node
        out_degree [N]     int64   stored edges starting at the node
        name       [N]     str     source name of each node          (knowledge graphs)
      edges/
        src, dst   [E]     index   store ids, sorted by (dst partition, src partition, dst, src)
        rel        [E]     int32   relation id                  (when the source has relations)
        bucket_offsets [p*p+1] int64
                   the edges with src in partition i and dst in partition j are
                   src[o[j*p + i] : o[j*p + i + 1]]: all buckets into partition j are adjacent
      splits/
        nodes/<name>            [n] index    store ids, ascending
        edges/<name>/src, dst   [n] index    positive edges, store ids
        edges/<name>/rel        [n] int32    (knowledge graphs)
        edges/<name>/neg_src, neg_dst [m]    negative edge pairs shipped by the source, or
        edges/<name>/neg_dst    [n, k]       k candidate negatives per positive

"index" is int32 when N < 2**31 and int64 otherwise (`Manifest.index_dtype`). Store ids are
partition-contiguous: partition k holds rows ``[k*P, min((k+1)*P, N))`` with
``P = partition_size``; inside a partition rows are in ascending source id. Every array
carries a crc32c checksum codec, so a flipped byte fails the read that touches it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from graphstore.errors import StoreError

__all__ = [
    "EDGE_ARRAYS",
    "FORMAT_VERSION",
    "MANIFEST_KEY",
    "Manifest",
    "index_dtype_for",
]

FORMAT_VERSION = 1
"""The only format version this graphstore reads and writes."""

MANIFEST_KEY = "graphstore"
"""Key of the manifest in the root group's attributes."""

EDGE_ARRAYS = ("edges/src", "edges/dst")


def index_dtype_for(num_nodes: int) -> str:
    """Smallest signed integer dtype that holds every store id (int32 halves edge IO)."""
    return "int32" if num_nodes < 2**31 - 1 else "int64"


@dataclass(frozen=True, slots=True)
class Manifest:
    """Store metadata, kept as JSON in the root group's attributes."""

    format_version: int
    """Always `FORMAT_VERSION` for stores this code writes."""
    num_nodes: int
    """N, number of nodes."""
    num_edges: int
    """E, number of stored directed edges (an undirected source edge counts twice)."""
    directed: bool
    """False when every edge is stored in both directions."""
    num_partitions: int
    """p, number of node partitions."""
    partition_size: int
    """P, rows per partition (the last partition may be shorter)."""
    feature_dim: int
    """D, feature width; 0 when the store has no features."""
    feature_dtype: str | None
    """``"float32"``, ``"float16"`` or ``"bfloat16"`` (stored as uint16 bits,
    `graphstore.layout.dtypes`); None without features."""
    index_dtype: str
    """dtype of every array of node ids (``"int32"`` or ``"int64"``)."""
    num_classes: int
    """Number of label classes; 0 when unlabeled."""
    num_relations: int
    """Number of relation types; 0 for an untyped graph."""
    relation_names: list[str] | None
    """Name of each relation id, when the source names them."""
    tasks: list[str]
    """``"node_classification"`` and/or ``"link_prediction"``."""
    splits: dict[str, int]
    """Split name -> number of items (nodes for node splits, positive edges for edge splits)."""
    split_kinds: dict[str, str]
    """Split name -> ``"nodes"`` or ``"edges"``."""
    split_origin: dict[str, Any]
    """Shipped with the source, or the generated rule and its seed."""
    source: dict[str, Any]
    """Where the data came from: name, format, path, reader facts."""
    partitioner: dict[str, Any]
    """Method, seed, rule for p, edge cut achieved on the final partitions, seconds."""
    conversion: dict[str, Any]
    """Counts from conversion: source edges, self loops found and dropped, duplicates found
    and merged (rows the source repeats in the same direction), reverse edges present and
    added (undirected sources)."""
    chunks: dict[str, int]
    """Chunk lengths: ``node_rows`` (features), ``node_rows_1d``, ``edges``."""
    created_by: str
    """``"graphstore <version>"``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Room for later issues (embeddings, ...) without a format bump."""

    def to_json(self) -> dict[str, Any]:
        """Plain dict for the group attributes."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str) -> Manifest:
        """Parse the manifest; a missing or extra field raises `StoreError` naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - data.keys())
        if missing:
            raise StoreError(f"{where}: manifest lacks field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def has_features(self) -> bool:
        return self.feature_dim > 0

    @property
    def has_labels(self) -> bool:
        return self.num_classes > 0

    @property
    def has_relations(self) -> bool:
        return self.num_relations > 0
