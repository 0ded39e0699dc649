"""Planetoid citation graphs (Cora, CiteSeer, PubMed): ``raw/ind.<name>.*`` pickles.

The files are Python 2 pickles of numpy arrays, scipy CSR matrices and a
``defaultdict`` adjacency list. They are unpickled with an allow-list of exactly those
classes, so a tampered file cannot run code, and arrays are rebuilt from checked state
(`_pickle`), so a damaged one cannot crash numpy. Everything unpickled is then checked
(shapes, finite numbers, node ids in range) before use. Small graphs: read whole into
memory.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import struct
from pathlib import Path
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources._io import (
    ReadContext,
    feature_chunk_rows,
    one_line,
    printable,
    read_csv_all,
)
from graphstore.layout.sources._pickle import NUMPY_GLOBALS, materialize
from graphstore.layout.sources.base import TASK_NODE, EdgeChunk, SourceGraph

__all__ = ["find_planetoid_dir", "read_planetoid"]

_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VALID = 500


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as pickle protocol 2 uses it for bytes, and nothing else."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(
            f"_codecs.encode({type(text).__name__}, {encoding!r}) is not a bytes literal"
        )
    return text.encode("latin1")


def _bytes(*args) -> bytes:
    """``bytes`` as pickle protocol 2 uses it (``bytes()`` for b""), never ``bytes(10**12)``."""
    if not args:
        return b""
    if isinstance(args[0], (bytes, bytearray)) and len(args) == 1:
        return bytes(args[0])
    raise pickle.UnpicklingError(f"bytes({', '.join(type(a).__name__ for a in args)}) is not a bytes literal")


def _allowed_classes() -> dict[tuple[str, str], object]:
    numpy_globals = {tuple(name.rsplit(".", 1)): obj for name, obj in NUMPY_GLOBALS.items()}
    return {
        # numpy arrays and dtypes: checked stand-ins, never numpy's own __setstate__.
        **numpy_globals,
        # Python 3 writing protocol 2 spells bytes as _codecs.encode(str, "latin1") or bytes().
        ("_codecs", "encode"): _latin1_encode,
        ("__builtin__", "bytes"): _bytes,
        ("builtins", "bytes"): _bytes,
        # The pickles name the pre-2019 module paths; map them to today's homes.
        ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse", "csr_matrix"): sp.csr_matrix,
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
        ("__builtin__", "dict"): dict,
        ("builtins", "dict"): dict,
    }


class _PlanetoidUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with an allow-list of classes and bounded allocations.

    Not the C one (`pickle.Unpickler`): it keeps its memo in an array indexed by the
    pickle's memo ids, so one damaged ``LONG_BINPUT`` id makes it allocate and clear
    gigabytes; the Python one keeps a dict. Planetoid files are small (a few MB).
    ``BYTEARRAY8`` is the one opcode that allocates (and zeroes) the length it reads
    before reading the bytes, so that length is checked against the file's size.
    """

    dispatch: ClassVar[dict] = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, display: str, size: int) -> None:
        super().__init__(file, encoding="latin1")
        self._display = display
        self._size = size
        self._allowed = _allowed_classes()

    def _load_bytearray8(self) -> None:
        (length,) = struct.unpack("<Q", self.read(8))
        if length > self._size:
            raise pickle.UnpicklingError(f"a bytearray of {length} bytes in a file of {self._size}")
        self.append(bytearray(self.read(length)))

    dispatch[pickle.BYTEARRAY8[0]] = _load_bytearray8

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle hook
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise SourceError(
                f"{self._display}: pickle refers to {printable(f'{module}.{name}')}, which a "
                "Planetoid file never contains; refusing to load it"
            ) from None


def _load_pickle(path: Path, ctx: ReadContext):
    display = ctx.show(path)
    try:
        with open(path, "rb") as f:
            return materialize(_PlanetoidUnpickler(f, display, os.fstat(f.fileno()).st_size).load())
    except FileNotFoundError:
        raise SourceNotFoundError(f"{display}: file not found (looked in {path.parent})") from None
    except SourceError:
        raise
    except Exception as e:  # any unpickling failure is a bad file, whatever pickle raises
        raise SourceError(
            f"{display}: not a readable Planetoid pickle ({type(e).__name__}: {one_line(e)})"
        ) from None


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
    """An unpickled matrix, checked: a CSR matrix or 2-D array of finite numbers.

    A pickle rebuilds a matrix from whatever state the file holds, so a damaged file can
    give an object with attributes missing or arrays that disagree; scipy's own format
    check names the problem, and any failure becomes a `SourceError`.
    """
    if sp.issparse(value):
        try:
            matrix = sp.csr_matrix(value)
            matrix = sp.csr_matrix((np.asarray(matrix.data), np.asarray(matrix.indices),
                                    np.asarray(matrix.indptr)), shape=matrix.shape)
            matrix.check_format(full_check=True)
        except Exception as e:  # a broken object fails in scipy in many ways; all mean "damaged"
            raise SourceError(f"{display}: not a valid sparse matrix ({type(e).__name__}: "
                              f"{one_line(e)})") from None
        numbers = matrix.data
    elif isinstance(value, np.ndarray) and value.ndim == 2:
        # A pickle keeps the writer's byte order; scipy takes native numbers only.
        matrix = numbers = value.astype(value.dtype.newbyteorder("="), copy=False)
    else:
        shape = getattr(value, "shape", None)
        got = type(value).__name__ + (f" of shape {shape}" if shape is not None else "")
        raise SourceError(f"{display}: expected a 2-D matrix, got {got}")
    if numbers.dtype.kind not in "biuf":
        raise SourceError(f"{display}: expected numbers, got dtype {numbers.dtype}")
    if numbers.dtype.kind == "f" and len(numbers.reshape(-1)):
        if not np.isfinite(numbers).all():
            raise SourceError(f"{display}: holds a non-finite value (NaN or infinity)")
        if np.abs(numbers).max() > np.finfo(np.float32).max:
            raise SourceError(f"{display}: holds a value beyond the float32 range")
    return matrix


def _class_ids(onehot: np.ndarray | sp.spmatrix) -> np.ndarray:
    dense = np.asarray(onehot.todense() if sp.issparse(onehot) else onehot)
    labels = dense.argmax(axis=1).astype(np.int64)
    # An all-zero row carries no class: unlabeled, not class 0.
    labels[~dense.any(axis=1)] = -1
    return labels


def _odd_one_out(widths: dict[str, int]) -> str:
    """The part whose width the other two do not share (``allx``/``ally`` if all differ)."""
    first, full, test = widths
    if widths[full] == widths[test]:
        return first
    if widths[first] == widths[full]:
        return test
    return full


def _check_test_index(test_index: np.ndarray, num_allx: int, num_tx: int, display: str) -> None:
    """Test ids follow the ``allx`` nodes, and mostly have a ``tx`` row.

    An id below ``len(allx)`` would give a node two feature rows. CiteSeer's test range
    skips 15 of 1015 ids; a range that is mostly gaps is a damaged id, and it would make
    the converter allocate a node for every id up to it.
    """
    if not len(test_index):
        return
    low, high = int(test_index.min()), int(test_index.max())
    if low < num_allx:
        raise SourceError(
            f"{display}: node id {low} is below {num_allx}, the rows of allx (test nodes come after them)"
        )
    if len(np.unique(test_index)) != len(test_index):
        raise SourceError(f"{display}: a node id appears twice")
    gaps = (high - num_allx + 1) - num_tx
    if gaps > num_tx:
        raise SourceError(
            f"{display}: node id {high} leaves {gaps} ids of the test range [{num_allx}, {high}] "
            f"without a row, more than the {num_tx} rows of tx (a damaged id?)"
        )


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

    matrices = {"x": x, "allx": allx, "tx": tx, "y": y, "ally": ally, "ty": ty}
    for a, b in (("x", "y"), ("allx", "ally"), ("tx", "ty")):
        if matrices[a].shape[0] != matrices[b].shape[0]:
            raise SourceError(
                f"{show[b]}: {matrices[b].shape[0]} label rows but {show[a]} has "
                f"{matrices[a].shape[0]} feature rows"
            )
    if len(test_index) != tx.shape[0]:
        raise SourceError(
            f"{show['test.index']}: {len(test_index)} ids but {show['tx']} has {tx.shape[0]} rows"
        )
    for parts, what in ((("x", "allx", "tx"), "feature widths"), (("y", "ally", "ty"), "class counts")):
        widths = {part: matrices[part].shape[1] for part in parts}
        if len(set(widths.values())) != 1:
            raise SourceError(
                f"{show[_odd_one_out(widths)]}: {what} differ "
                f"({', '.join(f'{part} {width}' for part, width in widths.items())})"
            )
    _check_test_index(test_index, allx.shape[0], tx.shape[0], show["test.index"])

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

    src, dst = _graph_pairs(data["graph"], num_nodes, show["graph"],
                            nodes_from=f"{show['allx']} rows and {show['test.index']} ids")
    # Each undirected edge once, as (min, max): the adjacency lists name most edges
    # from both ends, and some twice. Ids are in [0, N), so the keys cannot overflow.
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    width = max(num_nodes, 1)
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


def _node_ids(values, count: int, num_nodes: int) -> tuple[np.ndarray, int | None]:
    """``count`` ids from an iterable as int64, and the position of the first bad one.

    Read as float64 first: a pickle may hold floats, None or huge Python ints, which a
    direct int64 read would truncate, wrap or refuse without saying where.
    """
    as_float = np.fromiter(values, dtype=np.float64, count=count)
    bad = np.flatnonzero(~((as_float >= 0) & (as_float < num_nodes) & (as_float == np.round(as_float))))
    if len(bad):
        return as_float, int(bad[0])
    return as_float.astype(np.int64), None


def _graph_pairs(graph, num_nodes: int, display: str, *, nodes_from: str) -> tuple[np.ndarray, np.ndarray]:
    """The adjacency lists as (src, dst) arrays, every id checked to be a node in [0, N).

    ``nodes_from`` names the files that fixed N, for the message about an id beyond it.
    """
    if not isinstance(graph, dict):
        raise SourceError(f"{display}: expected a dict of adjacency lists, got {type(graph).__name__}")
    try:
        counts = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
        keys, bad_key = _node_ids(graph.keys(), len(graph), num_nodes)
        dst, bad_dst = _node_ids(itertools.chain.from_iterable(graph.values()), int(counts.sum()), num_nodes)
    except (TypeError, ValueError, OverflowError) as e:
        raise SourceError(
            f"{display}: adjacency lists must map node ids to lists of ids ({one_line(e)})"
        ) from None
    if bad_key is not None:
        raise SourceError(f"{display}: adjacency list of node {list(graph)[bad_key]!r}: not a node id "
                          f"in [0, {num_nodes}) (the {nodes_from})")
    if bad_dst is not None:
        owner = int(np.searchsorted(np.cumsum(counts), bad_dst, side="right"))
        raise SourceError(f"{display}: adjacency list of node {int(keys[owner])} names "
                          f"{float(dst[bad_dst]):.17g}, not a node id in [0, {num_nodes}) (the {nodes_from})")
    return np.repeat(keys, counts), dst
