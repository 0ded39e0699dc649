"""Planetoid citation graphs (Cora, CiteSeer, PubMed): ``raw/ind.<name>.*`` pickles.

The files are Python 2 pickles of numpy arrays, scipy CSR matrices and a
``defaultdict`` adjacency list. They are unpickled with an allow-list of exactly those
classes, so a tampered file cannot run code. Small graphs: read whole into memory.
"""

from __future__ import annotations

import collections
import itertools
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources._io import (
    ReadContext,
    feature_chunk_rows,
    read_csv_all,
)
from graphstore.layout.sources.base import TASK_NODE, SourceGraph, EdgeChunk

__all__ = ["find_planetoid_dir", "read_planetoid"]

_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VALID = 500


def _allowed_classes() -> dict[tuple[str, str], object]:
    import numpy._core.multiarray as multiarray  # where numpy 2 keeps _reconstruct

    reconstruct = multiarray._reconstruct
    return {
        # The pickles name the pre-2019 module paths; map them to today's homes.
        ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse", "csr_matrix"): sp.csr_matrix,
        ("numpy.core.multiarray", "_reconstruct"): reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
        ("__builtin__", "dict"): dict,
        ("builtins", "dict"): dict,
    }


class _PlanetoidUnpickler(pickle.Unpickler):
    def __init__(self, file, display: str) -> None:
        super().__init__(file, encoding="latin1")
        self._display = display
        self._allowed = _allowed_classes()

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle hook
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise SourceError(
                f"{self._display}: pickle refers to {module}.{name}, which a Planetoid "
                "file never contains; refusing to load it"
            ) from None


def _load_pickle(path: Path, ctx: ReadContext):
    display = ctx.show(path)
    try:
        with open(path, "rb") as f:
            return _PlanetoidUnpickler(f, display).load()
    except FileNotFoundError:
        raise SourceNotFoundError(f"{display}: file not found (looked in {path.parent})") from None
    except SourceError:
        raise
    except Exception as e:  # any unpickling failure is a bad file, whatever pickle raises
        raise SourceError(f"{display}: not a readable Planetoid pickle ({type(e).__name__}: {e})") from None


def find_planetoid_dir(path: Path) -> tuple[Path, str]:
    """Directory holding ``ind.<name>.*`` (``path`` or ``path/raw``) and the prefix name."""
    candidates = [path, path / "raw"]
    for directory in candidates:
        if not directory.is_dir():
            continue
        prefixes = sorted(p.name[len("ind."):-len(".graph")] for p in directory.glob("ind.*.graph"))
        if len(prefixes) == 1:
            return directory, prefixes[0]
        if len(prefixes) > 1:
            raise SourceError(
                f"{directory}: holds several Planetoid datasets ({', '.join(prefixes)}); "
                "point at a directory with one"
            )
    raise SourceNotFoundError(
        f"ind.<name>.graph: file not found (looked in {', '.join(str(c) for c in candidates)})"
    )


def _as_2d(value, display: str) -> sp.csr_matrix | np.ndarray:
    if sp.issparse(value):
        return value.tocsr()
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return value
    raise SourceError(f"{display}: expected a 2-D matrix, got {type(value).__name__}")


def _class_ids(onehot: np.ndarray | sp.spmatrix) -> np.ndarray:
    dense = np.asarray(onehot.todense() if sp.issparse(onehot) else onehot)
    labels = dense.argmax(axis=1).astype(np.int64)
    # An all-zero row carries no class: unlabeled, not class 0.
    labels[~dense.any(axis=1)] = -1
    return labels


def read_planetoid(path: Path, ctx: ReadContext) -> SourceGraph:
    """Read a Planetoid dataset the way its authors' loader (and PyG) assemble it.

    Node order: ``allx`` rows first, then the test-range nodes, where test node
    ``test.index[j]`` gets row ``j`` of ``tx``/``ty``. Test-range ids without a row
    (15 in CiteSeer) get zero features and label -1 (PyG gives them class 0).
    Splits: train = the first ``len(y)`` nodes, valid = the next 500, test = the
    sorted test index. Edges: the adjacency lists as unique undirected pairs
    ``(min, max)``, self loops kept (the converter decides), ``directed=False``.
    """
    directory, prefix = find_planetoid_dir(path)
    files = {part: directory / f"ind.{prefix}.{part}" for part in (*_PARTS, "test.index")}
    data = {part: _load_pickle(files[part], ctx) for part in _PARTS}
    show = {part: ctx.show(f) for part, f in files.items()}

    x, allx, tx = (_as_2d(data[k], show[k]) for k in ("x", "allx", "tx"))
    y, ally, ty = (_as_2d(data[k], show[k]) for k in ("y", "ally", "ty"))
    test_index = read_csv_all(files["test.index"], ncols=1, dtype=np.int64,
                              display=show["test.index"])[:, 0]

    for a, b in (("x", "y"), ("allx", "ally"), ("tx", "ty")):
        if data[a].shape[0] != data[b].shape[0]:
            raise SourceError(
                f"{show[b]}: {data[b].shape[0]} label rows but {show[a]} has "
                f"{data[a].shape[0]} feature rows"
            )
    if len(test_index) != tx.shape[0]:
        raise SourceError(
            f"{show['test.index']}: {len(test_index)} ids but {show['tx']} has {tx.shape[0]} rows"
        )
    if len({x.shape[1], allx.shape[1], tx.shape[1]}) != 1:
        raise SourceError(
            f"{show['tx']}: feature widths differ (x {x.shape[1]}, allx {allx.shape[1]}, "
            f"tx {tx.shape[1]})"
        )
    if len({y.shape[1], ally.shape[1], ty.shape[1]}) != 1:
        raise SourceError(
            f"{show['ty']}: class counts differ (y {y.shape[1]}, ally {ally.shape[1]}, "
            f"ty {ty.shape[1]})"
        )
    if len(test_index) and test_index.min() < 0:
        raise SourceError(f"{show['test.index']}: negative node id {int(test_index.min())}")
    if len(np.unique(test_index)) != len(test_index):
        raise SourceError(f"{show['test.index']}: a node id appears twice")

    num_allx = allx.shape[0]
    num_nodes = int(max(num_allx, test_index.max() + 1 if len(test_index) else 0))
    dim = allx.shape[1]

    # Row of the stacked [allx; tx; zero] matrix each node takes; the zero row fills
    # test-range ids the test index skips.
    zero_row = num_allx + tx.shape[0]
    take = np.full(num_nodes, zero_row, dtype=np.int64)
    take[:num_allx] = np.arange(num_allx)
    take[test_index] = num_allx + np.arange(len(test_index))
    stacked = sp.vstack([sp.csr_matrix(allx), sp.csr_matrix(tx), sp.csr_matrix((1, dim))]).tocsr()
    features = stacked[take].astype(np.float32).tocsr()
    num_missing = int((take == zero_row).sum())

    class_of = np.concatenate([_class_ids(ally), _class_ids(ty), np.array([-1])])
    labels = class_of[take]
    num_classes = int(ally.shape[1])

    num_train = y.shape[0]
    if num_train + _NUM_VALID > num_nodes:
        raise SourceError(
            f"{show['y']}: {num_train} training nodes + {_NUM_VALID} validation nodes exceed "
            f"the {num_nodes} nodes"
        )
    node_splits = {
        "train": np.arange(num_train, dtype=np.int64),
        "valid": np.arange(num_train, num_train + _NUM_VALID, dtype=np.int64),
        "test": np.sort(test_index),
    }

    src, dst = _graph_pairs(data["graph"], show["graph"])
    # Each undirected edge once, as (min, max): the adjacency lists name most edges
    # from both ends, and some twice.
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    width = int(max(num_nodes, hi.max() + 1 if len(hi) else 0))
    keys = np.unique(lo * width + hi)
    src, dst = keys // width, keys % width
    num_self_loops = int((src == dst).sum())

    rows = feature_chunk_rows(dim)

    def edges():
        yield EdgeChunk(src=src.copy(), dst=dst.copy())

    def feature_chunks():
        for start in range(0, num_nodes, rows):
            yield features[start : start + rows].toarray()

    return SourceGraph(
        name=prefix,
        format="planetoid",
        path=ctx.origin,
        num_nodes=num_nodes,
        directed=bool(ctx.option("directed", False)),
        edges=edges,
        feature_dim=int(dim),
        features=feature_chunks,
        labels=labels,
        num_classes=num_classes,
        node_splits=node_splits,
        split_origin={
            "kind": "shipped",
            "name": "public",
            "rule": "train = first len(y) nodes, valid = next 500, test = ind.<name>.test.index",
        },
        tasks=(TASK_NODE,),
        files={
            "edges": str(files["graph"]),
            "features": str(files["allx"]),
            "labels": str(files["ally"]),
            "split:train": str(files["y"]),
            "split:valid": str(files["y"]),
            "split:test": str(files["test.index"]),
        },
        describe_edge=lambda i: f"adjacency list of node {int(src[i])} (neighbour {int(dst[i])})",
        describe_feature_row=lambda i: f"node {i}",
        extra={
            "prefix": prefix,
            "missing_feature_rows": num_missing,
            "missing_rows_rule": "test-range ids absent from test.index: zero features, label -1",
            "self_loops": num_self_loops,
            "edge_rule": "unique undirected pairs (min, max) of the adjacency lists",
        },
    )


def _graph_pairs(graph, display: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(graph, dict):
        raise SourceError(f"{display}: expected a dict of adjacency lists, got {type(graph).__name__}")
    try:
        keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        counts = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
        dst = np.fromiter(itertools.chain.from_iterable(graph.values()), dtype=np.int64,
                          count=int(counts.sum()))
    except (TypeError, ValueError, OverflowError) as e:
        raise SourceError(f"{display}: adjacency lists must map node ids to lists of ids ({e})") from None
    return np.repeat(keys, counts), dst
