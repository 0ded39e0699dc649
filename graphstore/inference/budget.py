"""The byte budget exact evaluation runs in beside training (the trainers' and ``graphstore
plan``'s): what the training buffer's resident partitions of features take, at most the
run's budget, at least the walk's floor (`min_buffer_bytes`)."""

from __future__ import annotations

import math

from graphstore.errors import ConfigError
from graphstore.inference.layerwise import _check_budget, min_buffer_bytes
from graphstore.layout.dtypes import storage_dtype
from graphstore.layout.store import Store
from graphstore.nn import GNN

__all__ = ["evaluation_budget", "floor_reason"]


def evaluation_budget(model: GNN, store: Store, *, capacity: int, cap_bytes: int,
                      resident_features: bool = True) -> tuple[int, str]:
    """``(bytes, rule)``: the budget of exact layer-wise evaluation of ``model`` over
    ``store`` beside a training buffer of ``capacity`` partitions: the bytes of that many
    partitions of features, at most ``cap_bytes`` (the buffer's byte budget, or the memory
    default), and at least what the walk needs (`min_buffer_bytes`, which does not grow
    with the largest edge bucket). ``resident_features=False`` (macrobatch, whose buffer
    holds no feature rows): a quarter of the partitions, as `infer_layerwise`'s own default,
    not the whole graph its structure covers."""
    if not resident_features:
        capacity = max(2, math.ceil(store.num_partitions / 4))
    rows = capacity * store.partition_size * store.feature_dim * storage_dtype(store.manifest.feature_dtype).itemsize
    least = min_buffer_bytes(model, store)
    budget = max(min(rows, int(cap_bytes)), least)
    return budget, (f"{budget} bytes: {capacity} partitions of features ({rows}), at most "
                    f"{int(cap_bytes)}, at least the walk's floor ({least})")


def floor_reason(model: GNN, store: Store) -> str:
    """What `min_buffer_bytes` is made of for ``model`` over ``store``: the message
    `infer_layerwise` refuses a budget one byte below it with (its most demanding layer's
    prepare pass or walk: partitions of prepared rows and accumulators, finishing one, a piece
    of edges)."""
    floor = min_buffer_bytes(model, store)
    try:
        _check_budget(model, store, floor - 1, prefetch=True)
    except ConfigError as e:
        return str(e)
    return f"{floor} bytes"  # not reached: one byte below the floor is refused
