"""Graphs already in memory: numpy arrays, ``np.memmap``, torch tensors, for `from_arrays`.

A PyG or DGL user holds the graph as arrays (``edge_index`` [2, E], ``x`` [N, D], ``y`` [N],
masks). `array_source` wraps them in a `SourceGraph` whose streams slice the caller's
arrays a chunk at a time, so conversion holds one chunk beyond what the caller already
holds: a memory-mapped feature matrix is read from its file chunk by chunk, a CUDA tensor
is copied to the host a chunk at a time. The converter then does what it does for files
(staging, partitioning, the atomic rename); this module only checks what it alone can
name (the argument, its shape and dtype, counts that disagree) and says it in one line::

    from_arrays: edge_index: expected shape [2, E] (or a pair (src, dst)), got (3, 10)

`from_arrays` is the public entry (``graphstore.from_arrays``); `graphstore.interop`'s
``from_pyg`` and ``from_dgl`` call `array_source` with their own names for the arrays
(``data.x``, ``graph.ndata['feat']``), so their messages name what the user holds.

Defaults follow the edge-list reader, so arrays and the same data written as
``edges.txt`` + ``features.npy`` + ``labels.npy`` convert to the same store: undirected
(each edge stored both ways, duplicates merged; idempotent on a symmetric graph), with
labels a node task whose split, when none is given, is PyG ``RandomNodeSplit``'s
defaults, without labels a link task holding out 5 % / 10 % of the edges.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from graphstore.errors import ConfigError, SourceError
from graphstore.layout.sources import _io
from graphstore.layout.sources._splits import link_split, per_class_split
from graphstore.layout.sources.base import TASK_LINK, TASK_NODE, EdgeChunk, EdgeSplit, SourceGraph

__all__ = ["array_source", "from_arrays"]

_VALID_FRACTION = 0.05
_TEST_FRACTION = 0.10
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SPLIT_ALIASES = {"val": "valid", "validation": "valid"}
"""PyG's ``val_mask`` and the long form land where the trainers look: ``valid``."""
# ConvertOptions fields that make no sense without a path to read.
_NOT_FOR_ARRAYS = frozenset({"format", "reader_options"})


class _Input:
    """One argument as given, read a slice at a time without copying the rest.

    numpy arrays and memmaps are sliced (a memmap reads only the slice from its file), and
    so is any array-like with ``shape``, ``dtype`` and slicing (an h5py or Zarr array);
    torch tensors are sliced on their device, then copied to the host (bfloat16 widened
    to float32, exactly). Anything else (a list) becomes a numpy array once.
    """

    def __init__(self, value: Any, display: str) -> None:
        self.display = display
        self.torch = False
        self.bfloat16 = False
        torch = sys.modules.get("torch")  # a tensor's module is loaded; never import it here
        if torch is not None and isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise SourceError(f"{display}: a sparse tensor ({value.layout}); pass a dense one "
                                  "(tensor.to_dense())")
            self.torch = True
            value = value.detach()
            if value.dtype == torch.bfloat16:
                self.bfloat16, dtype = True, np.dtype(np.float32)
            else:
                try:
                    dtype = torch.empty(0, dtype=value.dtype).numpy().dtype
                except (TypeError, RuntimeError):
                    raise SourceError(f"{display}: expected numbers, got dtype {value.dtype}") from None
        else:
            if hasattr(value, "tocsr") or hasattr(value, "toarray"):
                raise SourceError(f"{display}: a sparse matrix ({type(value).__name__}); pass a dense "
                                  "array (or write it as an npz source and convert that)")
            lazy = all(hasattr(value, a) for a in ("shape", "dtype", "__getitem__"))
            if not isinstance(value, np.ndarray) and not lazy:
                try:
                    value = np.asarray(value)
                except (TypeError, ValueError) as e:
                    raise SourceError(f"{display}: not an array ({_io.one_line(e)})") from None
            try:
                dtype = np.dtype(value.dtype)
            except TypeError:
                raise SourceError(f"{display}: expected numbers, got dtype {value.dtype}") from None
        self.value = value
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in value.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def read(self, index: Any = slice(None)) -> np.ndarray:
        """``value[index]`` as a numpy array of its own (never a view of the caller's)."""
        part = self.value[index]
        if self.torch:
            if self.bfloat16:
                part = part.float()
            return part.cpu().numpy().copy()
        return np.array(part, copy=True)

    def at(self, i: int) -> str:
        """How messages name entry ``i``: ``from_arrays: edge_index[1, 17]``."""
        return f"{self.display}[{i}]"

    def check_kind(self, kinds: str, expected: str) -> None:
        if self.dtype.kind not in kinds:
            raise SourceError(f"{self.display}: expected {expected}, got dtype {self.dtype}")

    def describe_type(self) -> str:
        kind = ("torch" if self.torch else "memmap" if isinstance(self.value, np.memmap)
                else "numpy" if isinstance(self.value, np.ndarray) else type(self.value).__name__)
        return f"{kind} {'bfloat16' if self.bfloat16 else self.dtype} {list(self.shape)}"


@dataclass(frozen=True)
class _Names:
    """How messages name each input (the caller's own words: ``data.x``, ``graph.ndata['feat']``)."""

    edge_index: str = "edge_index"
    features: str = "features"
    labels: str = "labels"
    edge_types: str = "edge_types"
    num_nodes: str = "num_nodes"


def array_source(
    *,
    edge_index: Any,
    features: Any = None,
    labels: Any = None,
    splits: Mapping[str, Any] | None = None,
    num_nodes: int | None = None,
    edge_types: Any = None,
    directed: bool = False,
    name: str = "arrays",
    seed: int = 0,
    caller: str = "from_arrays",
    names: Mapping[str, str] | None = None,
    split_names: Mapping[str, str] | None = None,
) -> SourceGraph:
    """A `SourceGraph` streaming from arrays in memory (see `from_arrays` for the arguments).

    ``caller`` opens every message (``"from_pyg"``); ``names`` renames the inputs in
    messages (``{"features": "data.x"}``) and ``split_names`` each split's input
    (``{"train": "data.train_mask"}``).

    Raises
    ------
    SourceError
        An input of the wrong shape or dtype, counts that disagree, an id out of range.
    """
    words = _Names(**dict(names or {}))
    show = {f.name: f"{caller}: {getattr(words, f.name)}" for f in fields(_Names)}
    if not isinstance(directed, bool):
        raise SourceError(f"{caller}: directed must be True or False (got {directed!r})")
    src, dst = _edge_inputs(edge_index, show["edge_index"])
    num_edges = len(src)

    feats = None
    if features is not None:
        feats = _Input(features, show["features"])
        if feats.ndim != 2:
            raise SourceError(f"{feats.display}: expected shape [N, D] (one row per node), got {feats.shape}")
        feats.check_kind("biuf", "numbers")

    label_values = None
    if labels is not None:
        lab = _Input(labels, show["labels"])
        if lab.ndim != 1 and lab.shape[1:] != (1,):
            raise SourceError(f"{lab.display}: expected shape [N] (one class id per node; multi-label "
                              f"[N, C] is not supported), got {lab.shape}")
        lab.check_kind("biuf", "class ids (numbers)")
        # [N] int64 in memory, as every reader holds labels; [N, 1] (a PyG habit) flattened.
        label_values = _io.class_ids(lab.read().reshape(-1), lambda i: f"{lab.display}[{i}]")

    rel = None
    if edge_types is not None:
        rel = _Input(edge_types, show["edge_types"])
        if rel.ndim != 1 or len(rel) != num_edges:
            raise SourceError(f"{rel.display}: expected shape [E] = ({num_edges},) (one relation id per "
                              f"edge of {show['edge_index'].split(': ', 1)[1]}), got {rel.shape}")
        rel.check_kind("iu", "integer relation ids")

    low, high, num_relations = _scan_edges(src, dst, rel)
    n = _resolve_num_nodes(caller, show, num_nodes, feats, label_values, high)
    _check_edge_range(src, dst, low, high, n, show)

    node_splits: dict[str, np.ndarray] = {}
    edge_splits: dict[str, EdgeSplit] = {}
    files = {"edges": show["edge_index"]}
    if feats is not None:
        files["features"] = show["features"]
    if label_values is not None:
        files["labels"] = show["labels"]
    given = _named_splits(caller, splits, split_names)
    owner = np.full(n, -1, np.int16) if label_values is not None and given else None
    for k, (key, (value, where)) in enumerate(given.items()):
        files[f"split:{key}"] = where
        if label_values is not None:
            ids = node_splits[key] = _node_split(value, where, n)
            # A node in two splits (train and test) is a leak, not something to merge.
            taken = owner[ids]
            if (taken >= 0).any():
                i = int(np.flatnonzero(taken >= 0)[0])
                first = list(given)[int(taken[i])]
                raise SourceError(f"{where}: node {int(ids[i])} is also in split {first!r} ({given[first][1]}); "
                                  "a node belongs to one split")
            owner[ids] = k
        else:
            edge_splits[key] = _edge_split(value, where, n, num_relations if rel is not None else None)

    keep_mask = None
    if label_values is not None:
        tasks = (TASK_NODE,)
        if not given:
            node_splits = per_class_split(label_values, seed=seed, train_per_class=20, num_valid=500,
                                          num_test=1000)
            origin = {"kind": "generated",
                      "rule": "node: per class 20 train, then 500 valid and 1000 test from the remaining "
                      "labeled nodes (PyG RandomNodeSplit defaults)", "seed": int(seed)}
        else:
            origin = {"kind": "given", "name": caller}
    else:
        tasks = (TASK_LINK,)
        if not given:
            if rel is not None:
                raise SourceError(f"{show['edge_types']}: a typed graph without labels trains link prediction, "
                                  "and its held-out triples cannot be drawn here: pass splits={'valid': "
                                  "(edge_index, edge_types), 'test': (...)}")
            # Holding edges out needs all of them at once (as the edge-list reader does).
            pairs_src, pairs_dst = src.read(), dst.read()
            keep_mask, drawn = link_split(
                pairs_src.astype(np.int64), pairs_dst.astype(np.int64), num_nodes=n, directed=directed,
                seed=seed, valid_fraction=_VALID_FRACTION, test_fraction=_TEST_FRACTION,
                display=show["edge_index"])
            del pairs_src, pairs_dst
            for key, (s, d, ns, nd) in drawn.items():
                edge_splits[key] = EdgeSplit(src=s, dst=d, neg_src=ns if len(ns) else None,
                                             neg_dst=nd if len(nd) else None)
            origin = {"kind": "generated",
                      "rule": "link: 5% valid, 10% test of distinct non-loop "
                      f"{'directed' if directed else 'undirected'} edges held out of the graph, "
                      "one uniform non-edge negative each; train = remaining edges",
                      "seed": int(seed)}
        else:
            origin = {"kind": "given", "name": caller}

    edges, describe_edge = _edge_stream(src, dst, rel, keep_mask)
    feature_stream = None
    dim = 0
    if feats is not None:
        dim = feats.shape[1]
        out_dtype = _io.feature_dtype(feats.dtype)
        rows = _io.feature_chunk_rows(dim, out_dtype.itemsize)

        def feature_stream() -> Iterator[np.ndarray]:
            for start in range(0, n, rows):
                yield _io._cast(feats.read(slice(start, start + rows)), out_dtype)

    num_classes = int(label_values.max() + 1) if label_values is not None and len(label_values) and \
        label_values.max() >= 0 else 0
    inputs = {"edge_index": src._whole.describe_type() if isinstance(src, _Row)
              else f"({src.describe_type()}, {dst.describe_type()})"}
    if feats is not None:
        inputs["features"] = feats.describe_type()
    return SourceGraph(
        name=name,
        format="arrays",
        path=caller,
        num_nodes=n,
        directed=directed,
        edges=edges,
        num_relations=num_relations,
        feature_dim=dim,
        features=feature_stream,
        labels=label_values,
        num_classes=num_classes,
        node_splits=node_splits,
        edge_splits=edge_splits,
        split_origin=origin,
        tasks=tasks,
        files=files,
        describe_edge=describe_edge,
        describe_feature_row=lambda i: f"row {i}",
        extra={"api": caller, "inputs": inputs, "edges_given": num_edges},
    )


# ---------------------------------------------------------------------------- edges


def _edge_inputs(edge_index: Any, display: str) -> tuple[_Input, _Input]:
    """The two endpoint rows: of a [2, E] array (views, no copy), or of a pair (src, dst)."""
    if isinstance(edge_index, (tuple, list)) and len(edge_index) == 2 and all(
            hasattr(part, "shape") for part in edge_index):
        src = _Input(edge_index[0], display + "[0]")
        dst = _Input(edge_index[1], display + "[1]")
        if src.ndim != 1 or dst.ndim != 1 or len(src) != len(dst):
            raise SourceError(f"{display}: a pair (src, dst) needs two [E] arrays of one length, got shapes "
                              f"{src.shape} and {dst.shape}")
    else:
        whole = _Input(edge_index, display)
        if whole.ndim != 2 or whole.shape[0] != 2:
            hint = " (transpose it: edge_index.T)" if whole.ndim == 2 and whole.shape[1] == 2 else ""
            raise SourceError(f"{display}: expected shape [2, E] (or a pair (src, dst)), got {whole.shape}{hint}")
        whole.check_kind("iu", "integer node ids")
        src, dst = _Row(whole, 0), _Row(whole, 1)
    src.check_kind("iu", "integer node ids")
    dst.check_kind("iu", "integer node ids")
    return src, dst


class _Row(_Input):
    """Row ``row`` of a [2, E] input, read a slice at a time."""

    def __init__(self, whole: _Input, row: int) -> None:  # noqa: D107
        self.__dict__.update(whole.__dict__)
        self.display = f"{whole.display}[{row}]"
        self._whole = whole
        self._row = row
        self.shape = (whole.shape[1],)

    def read(self, index: Any = slice(None)) -> np.ndarray:
        return self._whole.read((self._row, index))

    def at(self, i: int) -> str:
        return f"{self._whole.display}[{self._row}, {i}]"


def _chunks(length: int) -> Iterator[slice]:
    step = _io.EDGE_CHUNK_ROWS
    for start in range(0, length, step):
        yield slice(start, min(start + step, length))


def _scan_edges(src: _Input, dst: _Input, rel: _Input | None) -> tuple[int, int, int]:
    """Smallest and largest node id, and the number of relations, in one chunked pass."""
    low, high, top_rel = 0, -1, -1
    for part in _chunks(len(src)):
        for side in (src, dst):
            ids = side.read(part)
            if len(ids):
                low, high = min(low, int(ids.min())), max(high, int(ids.max()))
        if rel is not None:
            r = rel.read(part)
            if len(r):
                if int(r.min()) < 0:
                    at = part.start + int(np.flatnonzero(r < 0)[0])
                    raise SourceError(f"{rel.at(at)}: relation id {int(r.min())} is negative")
                top_rel = max(top_rel, int(r.max()))
    return low, high, (top_rel + 1 if rel is not None else 0)


def _check_edge_range(src: _Input, dst: _Input, low: int, high: int, n: int, show: dict[str, str]) -> None:
    if low >= 0 and high < n:
        return
    for part in _chunks(len(src)):
        for side in (src, dst):
            ids = side.read(part)
            bad = np.flatnonzero((ids < 0) | (ids >= n))
            if len(bad):
                raise SourceError(f"{side.at(part.start + int(bad[0]))}: node id {int(ids[bad[0]])} is "
                                  f"out of range [0, {n})")


def _edge_stream(src: _Input, dst: _Input, rel: _Input | None, keep: np.ndarray | None
                 ) -> tuple[Callable[[], Iterator[EdgeChunk]], Callable[[int], str]]:
    """The converter's edge stream, and how it names edge ``i`` of the stream.

    With ``keep`` (a drawn link split) the held-out edges are skipped; the stream's index
    then maps back to the column of the input through the kept columns.
    """
    kept = None if keep is None else np.flatnonzero(keep)

    def edges() -> Iterator[EdgeChunk]:
        for part in _chunks(len(src)):
            s, d = src.read(part).astype(np.int64, copy=False), dst.read(part).astype(np.int64, copy=False)
            r = None if rel is None else rel.read(part).astype(np.int64, copy=False)
            if keep is not None:
                mask = keep[part]
                s, d = s[mask], d[mask]
                r = None if r is None else r[mask]
            yield EdgeChunk(src=s, dst=d, rel=r)

    def describe(i: int) -> str:
        return f"column {int(kept[i]) if kept is not None else i}"

    return edges, describe


# ---------------------------------------------------------------------------- nodes


def _resolve_num_nodes(caller: str, show: dict[str, str], given: Any, feats: _Input | None,
                       labels: np.ndarray | None, high: int) -> int:
    """N: ``num_nodes`` if given, else the feature rows, else the labels, else max id + 1;
    every count given must agree with the first."""
    counts: list[tuple[int, str]] = []
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given <= 0:
            raise SourceError(f"{show['num_nodes']}: expected a positive integer (got {given!r})")
        counts.append((int(given), f"{show['num_nodes'].split(': ', 1)[1]} = {int(given)}"))
    if feats is not None:
        counts.append((feats.shape[0], f"{feats.shape[0]} rows of {show['features'].split(': ', 1)[1]}"))
    if labels is not None:
        counts.append((len(labels), f"{len(labels)} entries of {show['labels'].split(': ', 1)[1]}"))
    if counts:
        n, source = counts[0]
        if feats is not None and feats.shape[0] != n:
            raise SourceError(f"{feats.display}: {feats.shape[0]} rows, expected {n} (one per node: {source})")
        if labels is not None and len(labels) != n:
            raise SourceError(f"{show['labels']}: {len(labels)} entries, expected {n} (one per node: {source})")
        return n
    if high < 0:
        raise SourceError(f"{show['edge_index']}: no edges, and no num_nodes, features or labels to count "
                          "the nodes by")
    return high + 1


def _named_splits(caller: str, splits: Mapping[str, Any] | None,
                  displays: Mapping[str, str] | None) -> dict[str, tuple[Any, str]]:
    """Split name (aliases resolved) -> (value, how messages name it)."""
    if splits is None:
        return {}
    if not isinstance(splits, Mapping):
        raise SourceError(f"{caller}: splits: expected a dict of name -> ids or mask, got "
                          f"{type(splits).__name__}")
    out: dict[str, tuple[Any, str]] = {}
    for key, value in splits.items():
        where = f"{caller}: {(displays or {}).get(key, f'splits[{key!r}]')}"
        if not isinstance(key, str) or not _SPLIT_NAME.match(key):
            raise SourceError(f"{where}: a split name must be letters, digits, '_', '.' or '-' (got {key!r})")
        name = _SPLIT_ALIASES.get(key, key)
        if name in out:
            raise SourceError(f"{where}: split {name!r} given twice (as {key!r} too)")
        out[name] = (value, where)
    return out


def _node_split(value: Any, where: str, n: int) -> np.ndarray:
    """A split given as ids or as a boolean mask, as [n] int64 ids."""
    split = _Input(value, where)
    if split.ndim != 1:
        more = (f" ({split.shape[1]} splits side by side: pick one column)" if split.ndim == 2 else "")
        raise SourceError(f"{where}: expected node ids [n] or a boolean mask [N], got shape {split.shape}{more}")
    if split.dtype.kind == "b":
        if len(split) != n:
            raise SourceError(f"{where}: a boolean mask of {len(split)} entries, expected {n} (one per node)")
        return np.flatnonzero(split.read()).astype(np.int64)
    split.check_kind("iu", "node ids (integers) or a boolean mask")
    ids = split.read().astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if len(bad):
        raise SourceError(f"{where}: node id {int(ids[bad[0]])} at position {int(bad[0])} is out of range "
                          f"[0, {n})")
    return np.unique(ids)  # a repeated id means the node once, as a mask would


def _edge_split(value: Any, where: str, n: int, num_relations: int | None) -> EdgeSplit:
    """A link split: [2, n] endpoints, or (edge_index [2, n], edge_types [n]) on a typed graph."""
    rel = None
    if num_relations is not None:
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise SourceError(f"{where}: a typed graph's split is a pair (edge_index [2, n], edge_types [n])")
        value, rel_value = value
        rel_in = _Input(rel_value, f"{where}[1]")
        rel_in.check_kind("iu", "integer relation ids")
        rel = rel_in.read().astype(np.int64)
        where_edges = f"{where}[0]"
    else:
        where_edges = where
    pairs = _Input(value, where_edges)
    if pairs.ndim != 2 or pairs.shape[0] != 2:
        raise SourceError(f"{where_edges}: without labels a split holds edges: expected shape [2, n], got "
                          f"{pairs.shape} (node splits need labels)")
    pairs.check_kind("iu", "integer node ids")
    ends = pairs.read().astype(np.int64)
    bad = np.flatnonzero(((ends < 0) | (ends >= n)).any(axis=0))
    if len(bad):
        col = int(bad[0])
        raise SourceError(f"{where_edges}: edge ({int(ends[0, col])}, {int(ends[1, col])}) at column {col} has a "
                          f"node id out of range [0, {n})")
    if rel is not None:
        if rel.shape != (ends.shape[1],):
            raise SourceError(f"{where}[1]: {len(rel)} relation ids for {ends.shape[1]} edges")
        bad = np.flatnonzero((rel < 0) | (rel >= num_relations))
        if len(bad):
            raise SourceError(f"{where}[1]: relation id {int(rel[bad[0]])} at position {int(bad[0])} is out of "
                              f"range [0, {num_relations})")
    return EdgeSplit(src=ends[0].copy(), dst=ends[1].copy(), rel=rel)


# ---------------------------------------------------------------------------- public


def convert_options(caller: str, options: Mapping[str, Any]):
    """`ConvertOptions` from keyword options, refusing unknown names in one line."""
    from graphstore.layout._convert import ConvertOptions

    known = sorted(f.name for f in fields(ConvertOptions) if f.name not in _NOT_FOR_ARRAYS)
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"{caller}: unknown option {key!r}{hint}")
    return ConvertOptions(**options)


def from_arrays(
    path: str | os.PathLike,
    *,
    edge_index: Any,
    features: Any = None,
    labels: Any = None,
    splits: Mapping[str, Any] | None = None,
    num_nodes: int | None = None,
    edge_types: Any = None,
    directed: bool = False,
    name: str | None = None,
    **convert_options_: Any,
):
    """Convert a graph held in memory into a store at ``path``; returns its `Manifest`.

    The arrays are read a chunk at a time through the same converter as
    ``graphstore convert`` (staged on disk, partitioned, written to a temporary directory
    and renamed into place only when complete): beyond the caller's arrays, conversion
    needs the memory it needs for files. numpy arrays, ``np.memmap`` (read from its file
    chunk by chunk), torch tensors (CPU or CUDA, copied a chunk at a time) and plain
    lists are accepted.

    Parameters
    ----------
    path : path-like
        The store to create (refused if it exists, unless ``overwrite=True``).
    edge_index : [2, E] integer array, or a pair (src [E], dst [E])
        Source and destination node of each edge (PyG's layout; DGL's ``graph.edges()``).
    features : [N, D] numeric array, optional
        Row i is node i's features. float16 stays float16, bfloat16 tensors are stored as
        bfloat16, anything else as float32 (``feature_dtype=`` overrides).
    labels : [N] (or [N, 1]) class ids, optional
        -1 (or NaN) = unlabeled. With labels the store is for node classification, without
        for link prediction.
    splits : dict, optional
        Node task: name -> node ids [n] or a boolean mask [N] (``"val"`` is stored as
        ``"valid"``). Link task: name -> edges [2, n] (with ``edge_types``: a pair
        ``(edge_index [2, n], edge_types [n])``). None: drawn with ``seed``, as the
        edge-list reader does (per class 20 train, 500 valid, 1000 test; or 5 % / 10 % of
        the edges held out with one negative each).
    num_nodes : int, optional
        N; else the feature rows, else the labels, else the largest id + 1.
    edge_types : [E] integer array, optional
        Relation id of each edge (RGCN, knowledge graphs); ids in ``[0, R)``.
    directed : bool
        False (default): each edge stands for both directions; the reverse is added and
        duplicates merged, which changes nothing on an already symmetric graph (PyG's and
        DGL's citation graphs). True: stored as given.
    name : str, optional
        Dataset name recorded in the store; the path's name without suffix by default.
    **convert_options_
        `ConvertOptions` fields: ``num_partitions``, ``partitioner``, ``seed``,
        ``overwrite``, ``feature_dtype``, ``keep_self_loops``, ...

    Raises
    ------
    SourceError
        One line naming the argument and the problem, e.g.
        ``from_arrays: features: 9 rows, expected 10 (one per node: num_nodes = 10)``.
    ConfigError
        An unknown option, or an option value that cannot work.
    StoreExistsError
        ``path`` exists and ``overwrite`` was not given.

    Examples
    --------
    >>> import numpy as np, tempfile, os, graphstore
    >>> out = os.path.join(tempfile.mkdtemp(), "tiny.gs")
    >>> edge_index = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    >>> m = graphstore.from_arrays(out, edge_index=edge_index, features=np.eye(4),
    ...                            labels=np.array([0, 1, 0, 1]), splits={"train": [0, 1], "test": [2, 3]})
    >>> m.num_nodes, m.num_edges, sorted(m.splits)
    (4, 8, ['test', 'train'])
    """
    return convert_arrays(path, caller="from_arrays", edge_index=edge_index, features=features,
                          labels=labels, splits=splits, num_nodes=num_nodes, edge_types=edge_types,
                          directed=directed, name=name, options=convert_options_)


def convert_arrays(path: str | os.PathLike, *, caller: str, options: Mapping[str, Any],
                   name: str | None = None, names: Mapping[str, str] | None = None,
                   split_names: Mapping[str, str] | None = None, **arrays: Any):
    """`from_arrays` for the framework adaptors: their caller name and their names for the inputs."""
    from graphstore.layout._convert import convert

    options = dict(options)
    features = arrays.get("features")
    torch = sys.modules.get("torch")
    if (options.get("feature_dtype") is None and torch is not None and isinstance(features, torch.Tensor)
            and features.dtype == torch.bfloat16):
        options["feature_dtype"] = "bfloat16"  # the source's dtype, as float16 stays float16
    opts = convert_options(caller, options)
    if name is None:
        name = Path(path).name.removesuffix(".gs") or "arrays"
    graph = array_source(**arrays, name=name, seed=opts.seed, caller=caller, names=names,
                         split_names=split_names)
    return convert(graph, path, opts)
