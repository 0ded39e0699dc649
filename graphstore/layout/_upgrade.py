"""`graphstore upgrade` and `graphstore hubs`: add to a store what later versions use.

`upgrade` adds the segment checksums (`graphstore.layout._segments`): a format-v1 store
written before them still opens, but its reads of single buckets and partitions are not
verified. It also adds the hub group (`graphstore.layout._hubs`, HierBatching's static
cache) when the store has none. Both take the store's writer lock, build from
chunk-verified reads, and sync to disk; readers that have the store open keep working
(they see the additions the next time they open it).

`hubs` rewrites the hub group for another fraction of nodes (0 removes it), then the
checksum tables, which cover it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from graphstore.errors import UnverifiedReadsWarning
from graphstore.layout._durable import fsync_tree
from graphstore.layout._hubs import DEFAULT_HUB_FRACTION, write_hubs
from graphstore.layout._segments import CHECKSUMS_GROUP, write_segment_checksums
from graphstore.layout.store import Store

__all__ = ["upgrade_store", "write_store_hubs"]


def upgrade_store(path: str | os.PathLike) -> dict[str, Any]:
    """Add (or rebuild) the segment checksums of the store at ``path``.

    Returns
    -------
    dict
        ``{"path", "arrays": {name: kind}, "had_checksums": bool}``.

    Raises
    ------
    StoreLockedError
        Another process writes to the store.
    CorruptStoreError
        A chunk fails its own checksum while the tables are built (nothing is recorded:
        the tables would describe damaged data).
    """
    with warnings.catch_warnings():
        # Upgrading is the remedy the warning names: do not print it here.
        warnings.simplefilter("ignore", UnverifiedReadsWarning)
        store = Store(path, mode="r+")
    try:
        had = store.verifies_partial_reads
        added_hubs = store.hubs is None
        if added_hubs:
            write_hubs(store.path, fraction=DEFAULT_HUB_FRACTION, num_nodes=store.num_nodes,
                       num_partitions=store.num_partitions, partition_size=store.partition_size)
        arrays = write_segment_checksums(store.path, num_partitions=store.num_partitions,
                                         partition_size=store.partition_size)
        fsync_tree(store.path / CHECKSUMS_GROUP)
    finally:
        store.close()
    return {"path": str(store.path), "arrays": arrays, "had_checksums": had, "added_hubs": added_hubs}


def write_store_hubs(path: str | os.PathLike, fraction: float) -> dict[str, Any]:
    """Rewrite the hub group of the store at ``path`` for ``fraction`` (0: remove it), then
    its checksum tables.

    Returns
    -------
    dict
        ``{"path", "fraction", "num_hubs", "num_edges", "num_store_edges"}``.

    Raises
    ------
    ConfigError
        ``fraction`` outside [0, 1].
    StoreLockedError
        Another process writes to the store.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedReadsWarning)
        store = Store(path, mode="r+")
    try:
        index = write_hubs(store.path, fraction=fraction, num_nodes=store.num_nodes,
                           num_partitions=store.num_partitions, partition_size=store.partition_size)
        write_segment_checksums(store.path, num_partitions=store.num_partitions, partition_size=store.partition_size)
    finally:
        store.close()
    return {"path": str(store.path), "fraction": fraction, "num_hubs": 0 if index is None else index.num_hubs,
            "num_edges": 0 if index is None else index.num_edges, "num_store_edges": store.num_edges}
