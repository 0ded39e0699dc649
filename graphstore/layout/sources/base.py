"""What a source reader hands to the converter.

A reader (one module per source format) turns files on disk into a `SourceGraph`:
small per-node arrays in memory, and the two large parts, edges and features, as
re-iterable streams of chunks so that conversion never holds them whole. Ids here are
*source ids*: ``0 .. num_nodes-1`` in the order the source defines (a row of the
feature matrix, an OGB node index, the first-appearance order of a KG entity).

Readers check what only they can see (file present, a row has the right number of
columns, a value parses) and raise `SourceError` naming the file and line. Checks
that are the same for every format (ids in range, finite features, lengths that
agree, an empty graph) live in the converter, which names the file through
`SourceGraph.files` and the row through `describe_edge` / `describe_feature_row`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["EdgeChunk", "EdgeSplit", "SourceGraph", "TASK_LINK", "TASK_NODE"]

TASK_NODE = "node_classification"
TASK_LINK = "link_prediction"


@dataclass(frozen=True, slots=True)
class EdgeChunk:
    """A run of consecutive source edges."""

    src: np.ndarray
    """[m] int64, source id of each edge's source endpoint."""
    dst: np.ndarray
    """[m] int64, source id of each edge's destination endpoint."""
    rel: np.ndarray | None = None
    """[m] int64 relation id of each edge, or None for an untyped graph."""


@dataclass(frozen=True, slots=True)
class EdgeSplit:
    """Held-out or training edges of a link-prediction split, in source ids."""

    src: np.ndarray
    """[n] int64 positive edges' source endpoints."""
    dst: np.ndarray
    """[n] int64 positive edges' destination endpoints."""
    rel: np.ndarray | None = None
    """[n] int64 relation ids (knowledge graphs), else None."""
    neg_src: np.ndarray | None = None
    """[m] int64 negative edges' sources, when the source ships negatives as edge pairs
    (ogbl-ddi ``edge_neg``); None otherwise."""
    neg_dst: np.ndarray | None = None
    """[m] int64 negative edges' destinations paired with ``neg_src``; or [n, k] int64
    candidate negatives per positive (ogbl-citation2 ``target_node_neg``) when
    ``neg_src`` is None; or None."""


def _describe_index(i: int) -> str:
    return f"row {i}"


@dataclass(frozen=True)
class SourceGraph:
    """A dataset as read from its source files, ready for `graphstore convert`."""

    name: str
    """Dataset name recorded in the store, e.g. ``"cora"`` or ``"ogbl-ddi"``."""
    format: str
    """Reader that produced it: ``"ogb"``, ``"planetoid"``, ``"npz"``, ``"kg"``, ``"edgelist"``."""
    path: str
    """The source path as the user gave it."""
    num_nodes: int
    """Number of nodes N; every id is in ``[0, N)``."""
    directed: bool
    """False when each source edge stands for both directions (stored both ways)."""
    edges: Callable[[], Iterator[EdgeChunk]]
    """Each call starts a fresh pass over all source edges, in source order."""
    num_relations: int = 0
    """Number of relation types (0 for an untyped graph)."""
    relation_names: tuple[str, ...] | None = None
    """Name of each relation id, when the source names them."""
    feature_dim: int = 0
    """Width D of the feature matrix (0: no features)."""
    features: Callable[[], Iterator[np.ndarray]] | None = None
    """Each call streams all N feature rows in source-id order as [m, D] float chunks."""
    labels: np.ndarray | None = None
    """[N] int64 class of each node, -1 where unlabeled; None when the source has none."""
    num_classes: int = 0
    """Number of classes (0 when unlabeled)."""
    node_splits: dict[str, np.ndarray] = field(default_factory=dict)
    """Split name (``train``/``valid``/``test``) -> [n] int64 source ids."""
    edge_splits: dict[str, EdgeSplit] = field(default_factory=dict)
    """Split name -> edges (link prediction)."""
    split_origin: dict = field(default_factory=dict)
    """How the splits were made: ``{"kind": "shipped", "name": "time"}`` or, when the
    converter or reader generated them, the rule and its seed."""
    tasks: tuple[str, ...] = ()
    """`TASK_NODE` and/or `TASK_LINK`."""
    node_names: np.ndarray | None = None
    """[N] str name of each node (KG entities), or None."""
    files: dict[str, str] = field(default_factory=dict)
    """Role (``"edges"``, ``"features"``, ``"labels"``, ``"split:train"``...) -> the file
    that role was read from, for error messages."""
    describe_edge: Callable[[int], str] = _describe_index
    """Maps the index of an edge in the stream to its place in the file (``"line 18"``)."""
    describe_feature_row: Callable[[int], str] = _describe_index
    """Maps a feature row (= source id) to its place in the file."""
    extra: dict = field(default_factory=dict)
    """Format-specific facts recorded under the manifest's ``source`` entry."""

    def where(self, role: str) -> str:
        """The file a role (``"edges"``, ``"split:train"``...) was read from, for messages."""
        return self.files.get(role, f"{self.path} ({role})")
