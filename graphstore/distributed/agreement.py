"""Ranks refuse to train unless they agree on the store and the settings.

torchrun starts every rank with its own command line and its own store path, and nothing
else makes them the same: a rank on another partitioning of the data, or with another
``--lr``, ``--seed`` or ``--batch-size``, trained without a word (replicas diverging, targets
trained twice or never, the reported accuracy mixing two models) or waited out a collective
timeout naming no cause. After joining, every rank gathers every rank's facts
(`check_ranks_agree`) and all of them raise the same one-line `ConfigError` naming the first
rank and field that differ from rank 0's, before any data is read for training.

What is compared: the store's shape and partitioning (`store_facts`: not its path, which may
differ between machines, nor conversion timings), and the resolved options (flags, config
file and derived defaults) less those that are each rank's own (where it writes, how much it
logs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch.distributed as dist

from graphstore.errors import ConfigError

__all__ = ["LOCAL_OPTIONS", "check_ranks_agree", "store_facts"]

LOCAL_OPTIONS = frozenset({"store", "config", "metrics_out", "checkpoint_dir", "verbose", "derived",
                           "loader_threads"})
"""Options a rank may set for itself: paths it reads or writes, logging, the threads its
machine spares for loading (the batches are the same for any number), and the derived
defaults' rules (prose with each machine's memory figures; the values they chose are
compared as options)."""

_PARTITIONER = ("method", "seed", "num_partitions_rule", "edge_cut", "cut_edges")
_SHAPE = ("format_version", "num_nodes", "num_edges", "directed", "num_partitions", "partition_size",
          "feature_dim", "feature_dtype", "index_dtype", "num_classes", "num_relations", "splits", "split_origin")


def store_facts(store) -> dict[str, Any]:
    """What identifies ``store``'s content and layout, as ``{"store.<field>": value}``: its
    shape, splits and partitioning (method, seed and the edge cut it achieved, which two
    partitionings of one graph rarely share), and the names of any derived arrays."""
    m = store.manifest.to_json()
    facts = {f"store.{k}": m[k] for k in _SHAPE}
    facts.update({f"store.partitioner.{k}": m["partitioner"].get(k) for k in _PARTITIONER})
    facts["store.extra"] = sorted(m.get("extra") or {})
    return facts


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _first_difference(reference: Mapping[str, str], other: Mapping[str, str]) -> str | None:
    for key in sorted(set(reference) | set(other)):
        if reference.get(key) != other.get(key):
            return key
    return None


def _flag(key: str) -> str:
    return key if key.startswith("store.") else "--" + key.replace("_", "-")


def check_ranks_agree(options: Mapping[str, Any], store=None, *, local: Iterable[str] = LOCAL_OPTIONS) -> None:
    """Raise `ConfigError` on every rank unless every rank has the same ``options`` (less
    the ``local`` ones) and the same `store_facts`; nothing to do in one process.

    Every rank sees every rank's facts (one ``all_gather_object``), so all of them raise the
    same error and none is left waiting in a later collective."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    skip = frozenset(local)
    facts = {k: _canonical(v) for k, v in options.items() if k not in skip}
    if store is not None:
        facts.update({k: _canonical(v) for k, v in store_facts(store).items()})
    gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts)
    reference = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        key = _first_difference(reference, other)
        if key is not None:
            theirs, ours = other.get(key, "(absent)"), reference.get(key, "(absent)")
            raise ConfigError(f"rank {rank} disagrees with rank 0 on {_flag(key)}: {theirs} against {ours}; every "
                              "rank must train the same store with the same settings")
