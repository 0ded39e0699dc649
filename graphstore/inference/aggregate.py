"""``graphstore aggregate``: BatchGNN's input-feature aggregation cache, computed out of core.

Every node's aggregate of its in-neighbours' input features (`graphstore.nn.FeatureAggregate`:
``mean``, ``sum`` or ``gcn``) is one weightless layer over the whole graph, so it is
`infer_layerwise` of an `AggregationModel`: the store's partitions and edge buckets streamed
under a byte budget, every neighbour, global in-degrees. Its output goes partition by
partition into the store (`graphstore.layout._aggregates`: built beside, synced, renamed in,
checksummed, recorded in the manifest), never whole in memory.

A GraphSage, GCN or GIN first layer then reads a node's aggregate and its own row instead of
its sampled neighbours' rows (`graphstore.nn.GNN`'s ``aggregated``), so the last hop is
neither sampled nor fetched. Which aggregate each kind needs is `AGGREGATE_FOR`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from graphstore._version import __version__
from graphstore.errors import ConfigError
from graphstore.inference.layerwise import InferenceStats, infer_layerwise
from graphstore.layout._aggregates import AggregateWriter
from graphstore.layout.store import Store
from graphstore.nn import AggregationModel, normalize_rows

__all__ = ["AGGREGATE_INPUTS", "aggregate_store"]

AGGREGATE_INPUTS = ("features", "row-normalized features")
"""What an aggregate can be of: the stored rows, or each row divided by its L1 norm (the
trainers' ``--normalize-features row``, applied before aggregating, as training applies it
to every input row)."""


def aggregate_store(path: str | os.PathLike, op: str, *, normalize: bool = False, buffer_bytes: int | None = None,
                    work_dir: str | os.PathLike | None = None, stats: InferenceStats | None = None) -> dict[str, Any]:
    """Compute and store ``nodes/aggregated_<op>`` for the store at ``path``.

    Parameters
    ----------
    op : {"mean", "sum", "gcn"}
        GraphSage's mean, GIN's sum, GCN's normalized propagation (self loop included).
    normalize : bool
        Aggregate row-normalized features (for models trained with ``--normalize-features
        row``); recorded as the aggregate's ``input``.
    buffer_bytes : int, optional
        The walk's byte budget (`infer_layerwise`; default a quarter of the features).
    work_dir : path, optional
        Where the walk's scratch files go (default the system's temporary directory).

    Returns
    -------
    dict
        The manifest record: ``array``, ``op``, ``dim``, ``dtype``, ``input``, ``degrees``,
        ``created_by``, ``seconds``, ``bytes_read``.

    Raises
    ------
    ConfigError
        An unknown op, or a store without features.
    StoreLockedError
        Another process writes to the store.
    """
    started = time.perf_counter()
    store = Store(path, mode="r+")
    try:
        if not store.manifest.has_features:
            raise ConfigError(f"{store.path}: nothing to aggregate, the store has no features")
        model = AggregationModel(op, store.feature_dim)
        stats = stats if stats is not None else InferenceStats()
        features = store.array("nodes/features")
        with AggregateWriter(store.path, op, num_nodes=store.num_nodes, dim=store.feature_dim,
                             partition_size=store.partition_size, num_partitions=store.num_partitions,
                             chunk_rows=features.chunks[0]) as writer:
            infer_layerwise(model, store, buffer_bytes=buffer_bytes, work_dir=work_dir, stats=stats,
                            input_transform=normalize_rows if normalize else None, output=writer.write)
            record = {"input": AGGREGATE_INPUTS[int(normalize)],
                      "degrees": "global in-degree" if op == "gcn" else "not used",
                      "created_by": f"graphstore {__version__}",
                      "seconds": round(time.perf_counter() - started, 3), "bytes_read": stats.bytes_read}
            return writer.commit(record)
    finally:
        store.close()
