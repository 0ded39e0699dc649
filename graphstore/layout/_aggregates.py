"""The aggregation cache's home in the store: ``nodes/aggregated_<op>`` (BatchGNN, App. B).

For every node, the aggregate of its in-neighbours' input features (``mean``, ``sum`` or
``gcn``, `graphstore.nn.FeatureAggregate`), computed out of core by ``graphstore aggregate``
(`graphstore.inference.aggregate_store`) and stored beside the features::

    OUT.gs/nodes/aggregated_<op>   [N, D] float32   row v: the aggregate for node v; chunked
                                                   like nodes/features, one crc32c per chunk
                                                   and per ~4 KiB block (read as scattered
                                                   row sets, like the features)
    manifest.extra["aggregates"][op] = {"array", "op", "dim", "dtype", "input",
                                        "degrees", "created_by"}

float32 whatever the features' dtype: a sum over thousands of float16 rows would lose the
precision the cache is there to keep.

Writing is atomic the way the hub group's is. The rows are built in a scratch group beside
the store's arrays (``.aggregate-<op>-building``), a partition at a time in order, synced,
then renamed into ``nodes/``; the checksum tables are rebuilt (they cover the new array);
the manifest's record goes in last, by an atomic rewrite of the root ``zarr.json``. A
crash before the record leaves at most an array no reader looks for, which the next run
replaces; the caller holds the store's writer lock throughout.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Self

import numpy as np
import zarr

from graphstore.errors import ConfigError, StoreError
from graphstore.layout._arrays import ChunkedAppender, new_array
from graphstore.layout._durable import fsync_dir, fsync_tree, write_atomically
from graphstore.layout._segments import write_segment_checksums
from graphstore.layout.base import MANIFEST_KEY

__all__ = ["AGGREGATES_KEY", "AGGREGATE_OPS", "AggregateWriter", "aggregate_array"]

AGGREGATES_KEY = "aggregates"
"""Key of the records in ``Manifest.extra``."""
AGGREGATE_OPS = ("mean", "sum", "gcn")
"""What can be stored (`graphstore.nn.AGGREGATIONS`, repeated here: layout imports no nn)."""
_PREFIX = "nodes/aggregated_"


def aggregate_array(op: str) -> str:
    """Path of the aggregate ``op`` inside a store.

    >>> aggregate_array("mean")
    'nodes/aggregated_mean'
    """
    if op not in AGGREGATE_OPS:
        raise ConfigError(f"aggregation must be one of {', '.join(AGGREGATE_OPS)} (got {op!r})")
    return _PREFIX + op


def is_aggregate_array(name: str) -> bool:
    return name.startswith(_PREFIX)


class AggregateWriter:
    """Builds ``nodes/aggregated_<op>`` of the store at ``path``: `write` every partition in
    order, then `commit`; `abort` (or an exception inside ``with``) removes the scratch group.

    Parameters
    ----------
    path : path
        The store; the caller holds its writer lock.
    op : str
        One of `AGGREGATE_OPS`.
    num_nodes, dim, partition_size, num_partitions : int
        The store's shape (the array is [num_nodes, dim]).
    chunk_rows : int
        Rows per chunk: the features', so both arrays are read in the same pieces.
    """

    def __init__(self, path: str | os.PathLike, op: str, *, num_nodes: int, dim: int, partition_size: int,
                 num_partitions: int, chunk_rows: int) -> None:
        self.path, self.op, self.name = Path(path), op, aggregate_array(op)
        self.num_nodes, self.dim, self.P, self.p = num_nodes, dim, partition_size, num_partitions
        self.building = self.path / f".aggregate-{op}-building"
        shutil.rmtree(self.building, ignore_errors=True)  # from a killed earlier run
        group = zarr.open_group(str(self.building), mode="w", zarr_format=3)
        self.array = new_array(group, "rows", shape=(num_nodes, dim), dtype="float32", chunks=(chunk_rows, dim))
        self.appender = ChunkedAppender(self.array)
        self.next = 0

    def write(self, k: int, rows: np.ndarray) -> None:
        """Partition ``k``'s rows, float [P_k, dim]; partitions come in order 0, 1, ..."""
        start, stop = k * self.P, min((k + 1) * self.P, self.num_nodes)
        if k != self.next:
            raise ConfigError(f"{self.building}: partition {k} written out of order (expected {self.next})")
        if rows.shape != (stop - start, self.dim):
            raise ConfigError(f"{self.building}: partition {k} needs rows of shape {[stop - start, self.dim]} "
                              f"(got {list(rows.shape)})")
        self.appender.append(np.asarray(rows, dtype=np.float32))
        self.next += 1

    def commit(self, record: dict[str, Any]) -> dict[str, Any]:
        """Put the array in place, rebuild the checksum tables, record it in the manifest.
        Returns the record as written."""
        if self.next != self.p or self.appender.finish() != self.num_nodes:
            raise StoreError(f"{self.building}: {self.next} of {self.p} partitions written; nothing committed")
        fsync_tree(self.building)
        target = self.path / self.name
        replaced = self.path / f".aggregate-{self.op}-replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        if target.exists():
            os.replace(target, replaced)
        os.replace(self.building / "rows", target)
        fsync_dir(target.parent)
        shutil.rmtree(replaced, ignore_errors=True)
        shutil.rmtree(self.building, ignore_errors=True)
        write_segment_checksums(self.path, num_partitions=self.p, partition_size=self.P)
        record = {"array": self.name, "op": self.op, "dim": self.dim, "dtype": "float32", **record}
        _record_in_manifest(self.path, self.op, record)
        return record

    def abort(self) -> None:
        shutil.rmtree(self.building, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *_: object) -> None:
        if exc_type is not None:
            self.abort()


def _record_in_manifest(path: Path, op: str, record: dict[str, Any]) -> None:
    """Rewrite the root group's ``zarr.json`` with the record added: atomically (readers see
    the old manifest or the new one), not through zarr, whose attribute writes are not."""
    meta_path = path / "zarr.json"
    meta = json.loads(meta_path.read_text())
    manifest = meta.get("attributes", {}).get(MANIFEST_KEY)
    if not isinstance(manifest, dict):
        raise StoreError(f"{meta_path}: no graphstore manifest to record the aggregate in")
    extra = manifest.setdefault("extra", {})
    extra.setdefault(AGGREGATES_KEY, {})[op] = record
    write_atomically(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
