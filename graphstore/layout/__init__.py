"""The on-disk store: format (`base`), conversion, reading (`store`), verification.

Besides the store, the few layout helpers the buffer builds on are public here: the
4096-aligned allocation its slots are read into (`aligned_empty`, what ``O_DIRECT`` reads
need), the read counters it reports (`ReadStats`), and the rule that picks HierBatching's
static-cache nodes (`hub_ids`, the one the store's ``hubs/`` group is written with).
"""

import importlib

# Resolved on first use (PEP 562): importing a light submodule such as
# `graphstore.layout.hashing` (the synthetic-graph generator does) must not pull in zarr,
# pandas and the readers, which the store's modules import.
_LAZY = {"ReadStats": "_chunkio", "aligned_empty": "_chunkio", "hub_ids": "_hubs", "FORMAT_VERSION": "base",
         "Manifest": "base", "Store": "store", "open_store": "store"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"graphstore.layout.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'graphstore.layout' has no attribute {name!r}")

__all__ = ["FORMAT_VERSION", "Manifest", "ReadStats", "Store", "aligned_empty", "hub_ids", "open_store"]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
