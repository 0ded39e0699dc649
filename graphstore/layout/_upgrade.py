"""`graphstore upgrade`: add what later versions verify with to a store written earlier.

Today that is the segment checksums (`graphstore.layout._segments`): a format-v1 store
written before them still opens, but its reads of single buckets and partitions are not
verified. Upgrading takes the store's writer lock, builds the tables from chunk-verified
reads, and syncs them to disk; readers that have the store open keep working (they see
the tables the next time they open it).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from graphstore.errors import UnverifiedReadsWarning
from graphstore.layout._durable import fsync_tree
from graphstore.layout._segments import CHECKSUMS_GROUP, write_segment_checksums
from graphstore.layout.store import Store

__all__ = ["upgrade_store"]


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
        arrays = write_segment_checksums(store.path, num_partitions=store.num_partitions,
                                         partition_size=store.partition_size)
        fsync_tree(store.path / CHECKSUMS_GROUP)
    finally:
        store.close()
    return {"path": str(store.path), "arrays": arrays, "had_checksums": had}
