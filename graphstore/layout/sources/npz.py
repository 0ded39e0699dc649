"""gnn-benchmark ``.npz`` graphs (Shchur et al.): Amazon, Coauthor, Cora-ML, ...

Adjacency and attributes are CSR matrices split into ``<name>_data/_indices/_indptr/
_shape`` arrays; labels are ``labels`` [N] or a one-hot CSR ``label_*``. These files are
small, so the reader holds them in memory and streams dense feature rows from the CSR.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import _io
from graphstore.layout.sources._io import ReadContext, dataset_name, feature_chunk_rows
from graphstore.layout.sources._splits import per_class_split
from graphstore.layout.sources.base import TASK_NODE, EdgeChunk, SourceGraph

__all__ = ["find_npz_file", "read_npz"]

_TRAIN_PER_CLASS = 20
_VALID_PER_CLASS = 30
_MAX_FEATURE_DIM = 1 << 28
"""Widest attribute matrix accepted: a dense float32 row of 1 GiB."""


def find_npz_file(path: Path) -> Path:
    """``path`` itself, or the single ``.npz`` inside the directory ``path``."""
    if path.is_file():
        return path
    found = sorted(path.glob("*.npz")) if path.is_dir() else []
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise SourceError(
            f"{path}: holds several .npz files ({', '.join(p.name for p in found)}); "
            "point at one of them"
        )
    raise SourceNotFoundError(f"*.npz: file not found (looked in {path})")


def _sparse_values(values: np.ndarray) -> np.ndarray:
    """Values in a dtype scipy.sparse takes (it refuses float16): float32, or float64 for
    8-byte numbers, which float32 would round."""
    return values.astype(np.float64 if values.dtype.itemsize > 4 else np.float32, copy=False)


class _Arrays:
    """Lazy access to the arrays of one npz with messages that name file and key.

    Only the arrays the reader asks for are read. The original gnn-benchmark files carry
    extras nobody needs here (``idx_to_node``, ``attr_text``, ...), some of them pickled
    object arrays: their headers are looked at, their data never (``allow_pickle`` stays
    off), so they cost nothing and cannot run code.
    """

    def __init__(self, path: Path, display: str) -> None:
        self.path = path
        self.display = display
        # Headers only: validates the zip and gives every dtype before any data is read.
        self._members = _io.npz_members(path, display=display)
        self.keys = set(self._members)

    def dtype(self, key: str) -> np.dtype:
        """Element type of array ``key`` from its header (no data is read)."""
        return self._members[key].dtype

    def get(self, key: str, *, ndim: int | None = None, kind: str | None = None) -> np.ndarray:
        """Read array ``key``, checking its rank and dtype kind before loading its data.

        Raises
        ------
        SourceError
            Missing, an object array, the wrong rank or dtype, or unreadable data.
        """
        if key not in self.keys:
            raise SourceError(
                f"{self.display}: array {key!r} missing (has {_io.show_names(self.keys)})"
            )
        member = self._members[key]
        if member.dtype.hasobject:
            raise SourceError(
                f"{member.display}: holds Python objects (dtype object), not numbers; "
                "pickled arrays are never loaded"
            )
        # Shape and dtype come from the header: check them before reading any data.
        if ndim is not None and len(member.shape) != ndim:
            raise SourceError(f"{member.display}: expected {ndim} dimensions, got shape {member.shape}")
        if kind is not None and member.dtype.kind not in kind:
            raise SourceError(f"{member.display}: expected numbers, got dtype {member.dtype}")
        try:
            # Opened per array and closed at once: no handle outlives a read or an error.
            with np.load(self.path, allow_pickle=False) as npz:
                value = npz[key]
        except (*_io.NPY_ERRORS, KeyError) as e:
            raise SourceError(f"{member.display}: cannot read ({_io.one_line(e)})") from None
        if value.shape != member.shape or value.dtype != member.dtype:
            # The zip's local header disagrees with what the directory said: corrupt.
            raise SourceError(f"{member.display}: cannot read (header changed while reading)")
        # Native byte order: scipy.sparse refuses big-endian arrays.
        return value.astype(value.dtype.newbyteorder("="), copy=False)

    def csr(self, prefix: str) -> sp.csr_matrix:
        indptr = self.get(f"{prefix}_indptr", ndim=1, kind="iu")
        indices = self.get(f"{prefix}_indices", ndim=1, kind="iu")
        shape = tuple(int(s) for s in self.get(f"{prefix}_shape", ndim=1, kind="iu"))
        if len(shape) == 2 and min(shape) < 0:
            raise SourceError(f"{self.display}[{prefix}_shape]: negative size in {shape}")
        if f"{prefix}_data" in self.keys:
            data = _sparse_values(self.get(f"{prefix}_data", ndim=1, kind="biuf"))
        else:
            data = np.ones(len(indices), dtype=np.float32)
        where = f"{self.display}[{prefix}_indptr]"
        if len(shape) != 2:
            raise SourceError(f"{self.display}[{prefix}_shape]: expected 2 values, got {len(shape)}")
        if len(indptr) != shape[0] + 1:
            raise SourceError(f"{where}: length {len(indptr)}, expected rows + 1 = {shape[0] + 1}")
        if len(indptr) and (indptr[0] != 0 or indptr[-1] != len(indices) or np.any(np.diff(indptr) < 0)):
            raise SourceError(f"{where}: not a valid CSR row pointer for {len(indices)} entries")
        if len(data) != len(indices):
            raise SourceError(
                f"{self.display}[{prefix}_data]: {len(data)} values for {len(indices)} indices"
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= shape[1]):
            raise SourceError(
                f"{self.display}[{prefix}_indices]: column ids must be in [0, {shape[1]})"
            )
        return sp.csr_matrix((data, indices.astype(np.int64), indptr.astype(np.int64)), shape=shape)


def read_npz(path: Path, ctx: ReadContext) -> SourceGraph:
    """Read a gnn-benchmark npz.

    Edges are the adjacency's stored entries in CSR order (the matrices are not
    symmetric; ``directed=False`` makes the converter store both directions and merge
    duplicates; edge weights are ignored). Features become dense float32 rows. No split
    ships with these files, so one is drawn: per class 20 train, 30 valid, rest test,
    with ``numpy.random.default_rng(seed)``.
    """
    file = find_npz_file(path)
    display = ctx.show(file)
    arrays = _Arrays(file, display)

    adj = arrays.csr("adj")
    num_nodes = adj.shape[0]
    if adj.shape[0] != adj.shape[1]:
        raise SourceError(f"{display}[adj_shape]: adjacency must be square, got {adj.shape}")

    if "attr_indptr" in arrays.keys:
        attr = arrays.csr("attr")
    elif "attr_matrix" in arrays.keys:
        attr = sp.csr_matrix(_sparse_values(arrays.get("attr_matrix", ndim=2, kind="biuf")))
    else:
        attr = None
    if attr is not None and attr.shape[0] != num_nodes:
        raise SourceError(f"{display}: {attr.shape[0]} attribute rows but {num_nodes} nodes in adj_shape")
    if attr is not None and attr.shape[1] > _MAX_FEATURE_DIM:
        # Only the shape says how wide the sparse rows are, and the store keeps them dense:
        # a damaged width would have the converter allocate rows of terabytes.
        raise SourceError(
            f"{display}[attr_shape]: {attr.shape[1]} attribute columns; dense float32 rows that "
            f"wide cannot be stored (at most {_MAX_FEATURE_DIM})"
        )

    labels = _labels(arrays, num_nodes)
    num_classes = int(labels.max() + 1) if labels is not None and (labels >= 0).any() else 0

    src = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(adj.indptr))
    dst = adj.indices.astype(np.int64)

    def edges():
        step = _io.EDGE_CHUNK_ROWS
        for start in range(0, len(src), step):
            yield EdgeChunk(src=src[start : start + step].copy(), dst=dst[start : start + step].copy())

    features = None
    dim = 0
    if attr is not None:
        dim = int(attr.shape[1])
        rows = feature_chunk_rows(dim)

        def features():
            for start in range(0, num_nodes, rows):
                # A value beyond float32 becomes inf, which the converter reports by row.
                with np.errstate(over="ignore", invalid="ignore"):
                    chunk = attr[start : start + rows].toarray().astype(np.float32)
                yield chunk

    splits, origin = {}, {}
    if labels is not None:
        splits = per_class_split(labels, seed=ctx.seed, train_per_class=_TRAIN_PER_CLASS,
                                 valid_per_class=_VALID_PER_CLASS)
        origin = {
            "kind": "generated",
            "rule": "per class: 20 train, 30 valid, rest test (labeled nodes), numpy default_rng",
            "seed": int(ctx.seed),
        }

    extra: dict = {"weighted": bool("adj_data" in arrays.keys and len(adj.data) and np.any(adj.data != 1))}
    if "class_names" in arrays.keys and arrays.dtype("class_names").kind in "US":
        # A nicety: an object array of names (the original collection's) is skipped unread.
        names = arrays.get("class_names")
        extra["class_names"] = [str(n) for n in names.reshape(-1).tolist()]

    return SourceGraph(
        name=dataset_name(ctx.origin),
        format="npz",
        path=ctx.origin,
        num_nodes=int(num_nodes),
        directed=bool(ctx.option("directed", False)),
        edges=edges,
        feature_dim=dim,
        features=features,
        labels=labels,
        num_classes=num_classes,
        node_splits=splits,
        split_origin=origin,
        tasks=(TASK_NODE,) if labels is not None else (),
        files={"edges": str(file), "features": str(file), "labels": str(file)},
        describe_edge=lambda i: f"adj_indices[{i}] (row {int(src[i])})",
        describe_feature_row=lambda i: f"attribute row {i}",
        extra=extra,
    )


def _labels(arrays: _Arrays, num_nodes: int) -> np.ndarray | None:
    display = arrays.display
    if "labels" in arrays.keys:
        raw = arrays.get("labels", kind="biuf")
        if raw.ndim == 2:  # one-hot rows
            if raw.dtype.kind == "f" and not np.isfinite(raw).all():
                raise SourceError(f"{display}[labels]: one-hot rows hold a non-finite value")
            labels = np.where(raw.any(axis=1), raw.argmax(axis=1), -1).astype(np.int64)
            if np.any((raw != 0).sum(axis=1) > 1):
                raise SourceError(
                    f"{display}[labels]: a node has several classes; multi-label is not supported"
                )
        elif raw.ndim == 1:
            labels = _io.class_ids(raw, lambda i: f"{display}[labels] row {i}")
        else:
            raise SourceError(f"{display}[labels]: expected [N] or [N, C], got shape {raw.shape}")
    elif "label_indptr" in arrays.keys:
        onehot = arrays.csr("label")
        per_row = np.diff(onehot.indptr)
        if np.any(per_row > 1):
            raise SourceError(
                f"{display}[label_indptr]: a node has several classes; multi-label is not supported"
            )
        columns = _io.class_ids(onehot.indices, lambda i: f"{display}[label_indices] entry {i}")
        labels = np.full(onehot.shape[0], -1, dtype=np.int64)
        labels[per_row == 1] = columns
    else:
        return None
    if len(labels) != num_nodes:
        raise SourceError(f"{display}: {len(labels)} labels but {num_nodes} nodes in adj_shape")
    return labels
