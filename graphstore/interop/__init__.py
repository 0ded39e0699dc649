"""Interop: graphstore's batches and stores in PyG's and DGL's own forms.

For a model written for PyG or DGL, trained out of core from a store:

* `to_pyg` (``batch.to_pyg()`` on a loader's batch): the ``Data`` PyG's sampled training
  expects; `remote_backend`, `StoreFeatureStore`, `StoreGraphStore` and `DenseSampler`: a
  store as PyG's remote backend, for PyG's own ``NodeLoader`` / ``LinkLoader``
  (`graphstore.interop.pyg`).
* `to_dgl` (``batch.to_dgl()``): DGL's message-flow-graph blocks (`graphstore.interop.dgl`).
* `from_pyg` / `from_dgl` (``graphstore.from_pyg``): the other way, a PyG ``Data`` or a DGL
  graph held in memory converted into a store (`graphstore.interop.from_memory`).
* `targets_first`: the one re-layout both need, a `DENSE` with the targets first
  (`graphstore.interop.hops`; no PyG or DGL needed).

torch_geometric and dgl are optional (the ``graphstore[pyg]`` and ``graphstore[dgl]``
extras): the modules import without them, and their entry points raise `ImportError`
naming the extra. Names resolve on first use, so ``import graphstore.interop`` imports
neither library.
"""

from __future__ import annotations

import importlib

from graphstore.interop.hops import HopOrder, targets_first

__all__ = ["DenseSampler", "HopOrder", "StoreFeatureStore", "StoreGraphStore", "from_dgl", "from_pyg",
           "remote_backend", "targets_first", "to_dgl", "to_pyg"]

_LAZY = {"to_pyg": "pyg", "remote_backend": "pyg", "DenseSampler": "pyg", "StoreFeatureStore": "pyg",
         "StoreGraphStore": "pyg", "to_dgl": "dgl", "from_pyg": "from_memory", "from_dgl": "from_memory"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"graphstore.interop.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'graphstore.interop' has no attribute {name!r}")
