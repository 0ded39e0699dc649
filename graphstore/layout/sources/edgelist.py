"""Plain edge lists: one ``src dst`` pair per line, with optional ``.npy`` features and labels.

Accepted: a file (whitespace-, comma- or tab-separated, ``#`` comments, optionally
gzipped), or a directory with ``edges.{txt,csv,tsv}[.gz]`` and optional
``features.npy`` [N, D] and ``labels.npy`` [N]. Columns after the first two (weights,
timestamps, an edge type) are ignored, with a warning naming the file and the columns.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import _io
from graphstore.layout.sources._io import (
    ReadContext,
    count_columns,
    dataset_name,
    feature_chunk_rows,
    find_data_line,
    iter_csv,
    iter_data_lines,
    iter_rows_of,
)
from graphstore.layout.sources._splits import link_split, per_class_split
from graphstore.layout.sources.base import TASK_LINK, TASK_NODE, EdgeChunk, EdgeSplit, SourceGraph

__all__ = ["find_edge_file", "read_edgelist"]

EDGE_FILE_NAMES = tuple(f"edges.{ext}{gz}" for ext in ("txt", "csv", "tsv") for gz in ("", ".gz"))
_COMMENT = "#"
_VALID_FRACTION = 0.05
_TEST_FRACTION = 0.10


def find_edge_file(path: Path) -> Path:
    """``path`` itself, or the one ``edges.{txt,csv,tsv}[.gz]`` in the directory ``path``."""
    if path.is_file():
        return path
    found = [path / n for n in EDGE_FILE_NAMES if (path / n).is_file()]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise SourceError(f"{path}: several edge files ({', '.join(p.name for p in found)}); keep one")
    raise SourceNotFoundError(f"edges.txt/.csv/.tsv: file not found (looked in {path})")


def _sniff_separator(file: Path, display: str) -> str:
    try:
        for _, _, text in iter_data_lines(file, comment=_COMMENT, skip_blank=True):
            if "," in text:
                return ","
            if "\t" in text:
                return "\t"
            return r"\s+"
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SourceError(f"{display}: cannot read ({_io.one_line(e)})") from None
    return r"\s+"


def _load_npy(file: Path, display: str, *, what: str) -> np.ndarray:
    if not file.is_file():
        raise SourceNotFoundError(f"{display}: {what} file not found (looked in {file.parent})")
    try:
        # Memory-mapped: feature files may be larger than memory; chunks are copied out.
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except _io.NPY_ERRORS as e:
        raise SourceError(f"{display}: not a readable .npy array ({_io.one_line(e)})") from None
    if not isinstance(array, np.ndarray):
        raise SourceError(f"{display}: expected a single .npy array, got an archive")
    if array.dtype.kind not in "biuf":
        raise SourceError(f"{display}: expected numbers, got dtype {array.dtype}")
    return array


def _labels_from(array: np.ndarray, display: str) -> np.ndarray:
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise SourceError(f"{display}: expected labels of shape [N] (one class per node), got {array.shape}")
    return _io.class_ids(np.asarray(array), lambda i: f"{display}[{i}]")


def read_edgelist(path: Path, ctx: ReadContext) -> SourceGraph:
    """Read a plain edge list.

    Undirected by default (as PyG treats edge lists); ``num_nodes`` is the option if
    given, else the rows of the features or labels, else the largest id + 1. Splits are
    generated, seeded with ``ctx.seed``: with labels, per class 20 train nodes, then
    500 valid and 1000 test from the remaining labeled nodes (PyG ``RandomNodeSplit``
    defaults); without labels, 5 % valid and 10 % test of the distinct (undirected)
    edges are held out of the graph, each with one uniformly drawn non-edge negative.
    """
    file = find_edge_file(path)
    display = ctx.show(file)
    directory = file.parent if path.is_file() else path
    directed = bool(ctx.option("directed", False))
    files = {"edges": str(file)}

    feature_file = ctx.option("features")
    label_file = ctx.option("labels")
    if feature_file is None and path.is_dir() and (path / "features.npy").is_file():
        feature_file = path / "features.npy"
    if label_file is None and path.is_dir() and (path / "labels.npy").is_file():
        label_file = path / "labels.npy"

    features = labels = None
    if feature_file is not None:
        feature_file = Path(feature_file)
        features = _load_npy(feature_file, ctx.show(feature_file), what="features")
        if features.ndim != 2:
            raise SourceError(
                f"{ctx.show(feature_file)}: expected features of shape [N, D], got {features.shape}"
            )
        files["features"] = str(feature_file)
    if label_file is not None:
        label_file = Path(label_file)
        label_display = ctx.show(label_file)
        labels = _labels_from(_load_npy(label_file, label_display, what="labels"), label_display)
        files["labels"] = str(label_file)

    sep = _sniff_separator(file, display)
    ncols = count_columns(file, display=display, sep=sep, comment=_COMMENT)
    if ncols == 1:
        line = find_data_line(file, 0, comment=_COMMENT)
        raise SourceError(f"{display} line {line}: expected 2 columns (source, destination), got 1")
    if ncols > 2:
        _warn_dropped_columns(file, display, sep, ncols)
    # Two columns are checked strictly; with more (weights, timestamps) only the two id
    # columns are parsed, and pandas then tolerates ragged extra columns.
    read = dict(ncols=max(ncols, 2), dtype=np.int64, display=display, sep=sep, comment=_COMMENT,
                skip_blank=True, usecols=(0, 1) if ncols > 2 else None)

    link = labels is None
    # One pass to validate and size the graph. In the link case the whole list is kept
    # in memory, because holding out edges needs all of them at once.
    count, max_id, kept = 0, -1, []
    for chunk in iter_csv(file, chunk_rows=_io.EDGE_CHUNK_ROWS, **read):
        count += len(chunk)
        if len(chunk):
            max_id = max(max_id, int(chunk.max()))
        if link:
            kept.append(chunk)

    num_nodes = _resolve_num_nodes(ctx, features, labels, files, max_id)
    if link and kept:
        # Out-of-range ids are the converter's to report, except that a link split
        # cannot be drawn over them, so name the first one here.
        pairs = np.concatenate(kept)
        bad = np.flatnonzero(((pairs < 0) | (pairs >= num_nodes)).any(axis=1))
        if len(bad):
            line = find_data_line(file, int(bad[0]), comment=_COMMENT)
            raise SourceError(
                f"{display} line {line}: node id out of range [0, {num_nodes}) "
                f"({int(pairs[bad[0], 0])}, {int(pairs[bad[0], 1])})"
            )
        kept = [pairs]

    node_splits: dict[str, np.ndarray] = {}
    edge_splits: dict[str, EdgeSplit] = {}
    if link:
        pairs = np.concatenate(kept) if kept else np.zeros((0, 2), np.int64)
        keep, splits = link_split(
            pairs[:, 0], pairs[:, 1], num_nodes=num_nodes, directed=directed, seed=ctx.seed,
            valid_fraction=_VALID_FRACTION, test_fraction=_TEST_FRACTION, display=display,
        )
        graph_src, graph_dst = pairs[keep, 0].copy(), pairs[keep, 1].copy()
        file_rows = np.flatnonzero(keep)
        del pairs, kept
        for name, (s, d, ns, nd) in splits.items():
            edge_splits[name] = EdgeSplit(src=s, dst=d, neg_src=ns if len(ns) else None,
                                          neg_dst=nd if len(nd) else None)
        split_origin = {
            "kind": "generated",
            "rule": "link: 5% valid, 10% test of distinct non-loop "
            f"{'directed' if directed else 'undirected'} edges held out of the graph, "
            "one uniform non-edge negative each; train = remaining edges",
            "seed": int(ctx.seed),
        }

        def edges():
            for start in range(0, len(graph_src), _io.EDGE_CHUNK_ROWS):
                stop = start + _io.EDGE_CHUNK_ROWS
                yield EdgeChunk(src=graph_src[start:stop].copy(), dst=graph_dst[start:stop].copy())

        def describe_edge(i: int) -> str:
            return f"line {find_data_line(file, int(file_rows[i]), comment=_COMMENT)}"

        tasks = (TASK_LINK,)
    else:
        node_splits = per_class_split(labels, seed=ctx.seed, train_per_class=20, num_valid=500, num_test=1000)
        split_origin = {
            "kind": "generated",
            "rule": "node: per class 20 train, then 500 valid and 1000 test from the remaining "
            "labeled nodes (PyG RandomNodeSplit defaults)",
            "seed": int(ctx.seed),
        }

        def edges():
            for chunk in iter_csv(file, chunk_rows=_io.EDGE_CHUNK_ROWS, **read):
                yield EdgeChunk(src=np.ascontiguousarray(chunk[:, 0]), dst=np.ascontiguousarray(chunk[:, 1]))

        def describe_edge(i: int) -> str:
            return f"line {find_data_line(file, i, comment=_COMMENT)}"

        tasks = (TASK_NODE,)

    feature_stream = None
    if features is not None:
        rows = feature_chunk_rows(features.shape[1], _io.feature_dtype(features.dtype).itemsize)
        feature_path = feature_file

        def feature_stream():
            mm = np.load(feature_path, mmap_mode="r", allow_pickle=False)
            yield from iter_rows_of(mm, rows, _io.feature_dtype(mm.dtype))

    num_classes = int(labels.max() + 1) if labels is not None and len(labels) and labels.max() >= 0 else 0
    return SourceGraph(
        name=dataset_name(ctx.origin) or directory.name,
        format="edgelist",
        path=ctx.origin,
        num_nodes=num_nodes,
        directed=directed,
        edges=edges,
        feature_dim=int(features.shape[1]) if features is not None else 0,
        features=feature_stream,
        labels=labels,
        num_classes=num_classes,
        node_splits=node_splits,
        edge_splits=edge_splits,
        split_origin=split_origin,
        tasks=tasks,
        files=files,
        describe_edge=describe_edge,
        describe_feature_row=lambda i: f"row {i}",
        extra={"edge_lines": int(count), "ignored_columns": max(0, ncols - 2)},
    )


def _warn_dropped_columns(file: Path, display: str, sep: str, ncols: int) -> None:
    """Once per read: a type or weight column dropped without a word would turn a typed or
    weighted graph into a plain one."""
    lineno, _, text = next(iter_data_lines(file, comment=_COMMENT, skip_blank=True, display=display))
    fields = text.split() if sep == r"\s+" else text.split(sep)
    dropped = " ".join(field.strip() for field in fields[2:])
    which = "column 3" if ncols == 3 else f"columns 3-{ncols}"
    warnings.warn(f"{display}: {which} ignored (line {lineno}: {dropped!r}): an edge list keeps source "
                  "and destination only; typed edges convert as head/relation/tail triples (--format kg)",
                  stacklevel=4)


def _resolve_num_nodes(ctx: ReadContext, features, labels, files: dict, max_id: int) -> int:
    sizes: list[tuple[str, int]] = []
    given = ctx.option("num_nodes")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < 0:
            raise SourceError(f"option num_nodes must be a non-negative integer (got {given!r})")
        sizes.append((f"num_nodes option is {int(given)}", int(given)))
    if features is not None:
        sizes.append((f"{ctx.show(files['features'])} has {features.shape[0]} rows", int(features.shape[0])))
    if labels is not None:
        sizes.append((f"{ctx.show(files['labels'])} has {len(labels)} labels", int(len(labels))))
    if len({v for _, v in sizes}) > 1:
        raise SourceError(f"node counts disagree: {', '.join(text for text, _ in sizes)}")
    if sizes:
        return sizes[0][1]
    return max_id + 1
