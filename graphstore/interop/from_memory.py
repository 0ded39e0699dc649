"""Stores from PyG's ``Data`` and DGL's ``DGLGraph``: `from_pyg`, `from_dgl`.

The other direction from `to_pyg` / `to_dgl`: a graph a PyG or DGL user already holds in
memory becomes a store through `graphstore.from_arrays` (the same streaming, atomic
converter as ``graphstore convert``), its tensors read a chunk at a time. Messages name
the attribute the user holds (``from_pyg: data.x: 2707 rows, expected 2708 ...``).

Which attributes are read:

=================  ===================================  =====================================
                   PyG ``Data``                         DGL ``DGLGraph`` (homogeneous)
=================  ===================================  =====================================
edges              ``edge_index`` [2, E]                ``graph.edges()``
features           ``x`` [N, D]                         ``ndata["feat"]``
labels             ``y`` [N]                            ``ndata["label"]``
node splits        ``train_mask``/``val_mask``/         ``ndata["train_mask"]``/``"val_mask"``
                   ``test_mask`` (or ``*_idx`` ids)     /``"test_mask"``
relation types     ``edge_type`` [E]                    ``edata[dgl.ETYPE]`` or ``"etype"``
number of nodes    ``num_nodes`` when set               ``graph.num_nodes()``
=================  ===================================  =====================================

Direction: ``directed=None`` (the default) stores the graph undirected, as graphstore's
samplers and PyG's and DGL's citation datasets expect: each edge both ways, duplicates
merged, which changes nothing on a graph that is already symmetric (Cora as PyG and DGL
ship it). When that default did add reverse edges, the graph was directed, and a warning
says how many and that ``directed=True`` keeps the edges as given. Edge weights and other
attributes are not stored (a warning names them).

Neither library is imported here: the functions read the object's attributes, and a
heterogeneous graph is recognised through the library its object came from.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from graphstore.errors import SourceError
from graphstore.layout.sources.arrays import convert_arrays

__all__ = ["from_dgl", "from_pyg"]

_SPLITS = ("train", "val", "valid", "test")


def _warn_if_symmetrised(caller: str, manifest, directed: bool | None, what: str) -> None:
    added = int(manifest.conversion.get("reverse_edges_added", 0))
    if directed is None and added:
        warnings.warn(f"{caller}: {what} was not symmetric: {added} reverse edges were added (the default "
                      "stores a graph undirected); pass directed=True to keep the edges as given, "
                      "directed=False to silence this", stacklevel=3)


def from_pyg(data: Any, path: str | os.PathLike, *, directed: bool | None = None,
             splits: Mapping[str, Any] | None = None, num_nodes: int | None = None,
             name: str | None = None, **convert_options: Any):
    """Convert a PyG ``Data`` into a store at ``path``; returns its `Manifest`.

    Parameters
    ----------
    data : torch_geometric.data.Data
        ``edge_index``, optional ``x``, ``y``, ``edge_type``, and node splits as boolean
        ``train_mask`` / ``val_mask`` / ``test_mask`` (or id tensors ``train_idx`` ...;
        ``val`` is stored as ``valid``). A ``HeteroData`` is refused: convert
        ``data.to_homogeneous()``.
    path : path-like
        The store to create.
    directed : bool, optional
        None (default): undirected, with a warning if the edges were not symmetric; False:
        undirected, silently; True: the edges as given.
    splits : dict, optional
        Overrides the masks (as `graphstore.from_arrays` takes them).
    num_nodes : int, optional
        Overrides ``data.num_nodes``.
    name : str, optional
        Dataset name recorded in the store (default: the path's name).
    **convert_options
        `ConvertOptions` fields (``num_partitions``, ``partitioner``, ``seed``, ``overwrite``...).

    Raises
    ------
    SourceError
        A heterogeneous graph, or an attribute of the wrong shape or dtype (named:
        ``from_pyg: data.y: ...``).
    """
    caller = "from_pyg"
    pyg_data = sys.modules.get("torch_geometric.data")
    hetero = getattr(pyg_data, "HeteroData", None)
    if hetero is not None and isinstance(data, hetero):
        raise SourceError(f"{caller}: data is a HeteroData ({len(data.node_types)} node types, "
                          f"{len(data.edge_types)} edge types); a store holds one node type: pass "
                          "data.to_homogeneous() (its edge_type becomes the store's relations)")
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        raise SourceError(f"{caller}: data has no edge_index (a {type(data).__name__})")
    ignored = [key for key in ("edge_weight", "edge_attr") if getattr(data, key, None) is not None]
    if ignored:
        warnings.warn(f"{caller}: data.{' and data.'.join(ignored)} not stored (a store keeps edges "
                      "unweighted, with relation ids from data.edge_type)", stacklevel=2)
    found: dict[str, Any] = {}
    shown: dict[str, str] = {}
    if splits is None:
        for split in _SPLITS:
            for suffix in ("mask", "idx"):
                value = getattr(data, f"{split}_{suffix}", None)
                if value is not None:
                    found[split] = value
                    shown[split] = f"data.{split}_{suffix}"
                    break
    else:
        found = dict(splits)
    if num_nodes is None:
        # Only a count set on the data: PyG infers one from edge_index otherwise, with a
        # warning, and from_arrays infers the same from x, y or the ids.
        keys = data.keys() if callable(getattr(data, "keys", None)) else getattr(data, "keys", ())
        num_nodes = data["num_nodes"] if "num_nodes" in keys else None
    manifest = convert_arrays(
        path, caller=caller, options=convert_options, name=name,
        names={"edge_index": "data.edge_index", "features": "data.x", "labels": "data.y",
               "edge_types": "data.edge_type", "num_nodes": "data.num_nodes"},
        split_names=shown,
        edge_index=edge_index, features=getattr(data, "x", None), labels=getattr(data, "y", None),
        splits=found or None, num_nodes=num_nodes, edge_types=getattr(data, "edge_type", None),
        directed=bool(directed))
    _warn_if_symmetrised(caller, manifest, directed, "data.edge_index")
    return manifest


def from_dgl(graph: Any, path: str | os.PathLike, *, directed: bool | None = None,
             feature_key: str = "feat", label_key: str = "label",
             splits: Mapping[str, Any] | None = None, name: str | None = None, **convert_options: Any):
    """Convert a homogeneous ``dgl.DGLGraph`` into a store at ``path``; returns its `Manifest`.

    Parameters
    ----------
    graph : dgl.DGLGraph
        One node type and one edge type (``dgl.to_homogeneous`` turns a heterograph into
        one, its types in ``edata[dgl.ETYPE]``, which become the store's relations).
        Reads ``graph.edges()``, ``ndata[feature_key]``, ``ndata[label_key]`` and the
        boolean ``ndata`` masks ``train_mask`` / ``val_mask`` / ``test_mask``.
    path : path-like
        The store to create.
    directed : bool, optional
        As in `from_pyg`: None undirected with a warning if the edges were not symmetric.
    feature_key, label_key : str
        The ``ndata`` names of the features and the labels (DGL's datasets: ``feat``,
        ``label``).
    splits : dict, optional
        Overrides the masks (as `graphstore.from_arrays` takes them).
    name : str, optional
        Dataset name recorded in the store (default: the path's name).
    **convert_options
        `ConvertOptions` fields.

    Raises
    ------
    SourceError
        A heterograph, or an attribute of the wrong shape or dtype (named:
        ``from_dgl: graph.ndata['feat']: ...``).
    """
    caller = "from_dgl"
    ntypes, etypes = list(getattr(graph, "ntypes", [])), list(getattr(graph, "canonical_etypes", []))
    if not hasattr(graph, "edges") or not hasattr(graph, "ndata"):
        raise SourceError(f"{caller}: expected a dgl.DGLGraph, got {type(graph).__name__}")
    if len(ntypes) > 1 or len(etypes) > 1:
        raise SourceError(f"{caller}: a heterograph ({len(ntypes)} node types, {len(etypes)} edge types); a "
                          "store holds one node type: pass dgl.to_homogeneous(graph, ndata=[...]) (its "
                          "edata[dgl.ETYPE] becomes the store's relations)")
    ndata, edata = graph.ndata, graph.edata
    found: dict[str, Any] = {}
    shown: dict[str, str] = {}
    if splits is None:
        for split in _SPLITS:
            key = f"{split}_mask"
            if key in ndata:
                found[split] = ndata[key]
                shown[split] = f"graph.ndata[{key!r}]"
    else:
        found = dict(splits)
    type_key = next((k for k in ("_TYPE", "etype") if k in edata), None)  # dgl.ETYPE is "_TYPE"
    src, dst = graph.edges()
    manifest = convert_arrays(
        path, caller=caller, options=convert_options, name=name,
        names={"edge_index": "graph.edges()", "features": f"graph.ndata[{feature_key!r}]",
               "labels": f"graph.ndata[{label_key!r}]", "edge_types": f"graph.edata[{type_key!r}]",
               "num_nodes": "graph.num_nodes()"},
        split_names=shown,
        edge_index=(src, dst), features=ndata[feature_key] if feature_key in ndata else None,
        labels=ndata[label_key] if label_key in ndata else None, splits=found or None,
        num_nodes=int(graph.num_nodes()), edge_types=edata[type_key] if type_key else None,
        directed=bool(directed))
    _warn_if_symmetrised(caller, manifest, directed, "graph.edges()")
    return manifest
