"""Knowledge-graph triples: ``train.txt``, ``valid.txt``, ``test.txt`` of ``head<TAB>relation<TAB>tail``.

The layout of FB15k-237 and WN18RR (Dettmers et al.). Triple files of this kind are
small, so they are read whole; names become ids by first appearance.
"""

from __future__ import annotations

import csv
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import _io
from graphstore.layout.sources._io import ReadContext, dataset_name, find_data_line
from graphstore.layout.sources.base import TASK_LINK, EdgeChunk, EdgeSplit, SourceGraph

__all__ = ["find_kg_dir", "read_kg"]

SPLITS = ("train", "valid", "test")


def find_kg_dir(path: Path) -> Path:
    """``path`` or its single subdirectory, whichever holds ``train/valid/test.txt``."""
    candidates = [path]
    if path.is_dir():
        subdirs = [p for p in path.iterdir() if p.is_dir() and p.name != "__MACOSX"]
        if len(subdirs) == 1:
            candidates.append(subdirs[0])
    for directory in candidates:
        if all((directory / f"{s}.txt").is_file() for s in SPLITS):
            return directory
    missing = [f"{s}.txt" for s in SPLITS if not (path / f"{s}.txt").is_file()]
    raise SourceNotFoundError(
        f"{', '.join(missing)}: file not found (looked in {', '.join(str(c) for c in candidates)})"
    )


def _read_triples(file: Path, display: str) -> np.ndarray:
    """[n, 3] str array of one split file; a line without exactly 3 fields is an error."""
    try:
        frame = pd.read_csv(
            file, sep="\t", header=None, dtype=str, na_filter=False,
            quoting=csv.QUOTE_NONE, skip_blank_lines=True, engine="c",
        )
    except pd.errors.EmptyDataError:
        return np.zeros((0, 3), dtype=object)
    except pd.errors.ParserError:
        frame = None  # too many fields on some line: located below
    except (OSError, UnicodeDecodeError, zlib.error, EOFError) as e:
        raise SourceError(f"{display}: cannot read ({_io.one_line(e)})") from None
    if frame is not None and frame.shape[1] == 3:
        values = frame.to_numpy(dtype=object)
        # na_filter=False leaves a missing trailing field as "" rather than NaN.
        empty = np.flatnonzero((values == "").any(axis=1))
        if len(empty) == 0:
            return values
        row = int(empty[0])
    else:
        row = 0
    # Error path: walk the lines to name the first one that is not a triple.
    with open(file, encoding="utf-8", errors="replace", newline="") as f:
        data_row = -1
        for lineno, line in enumerate(f, start=1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            data_row += 1
            fields = text.split("\t")
            if data_row >= row and (len(fields) != 3 or any(x == "" for x in fields)):
                return _fail(display, lineno, fields)
    raise SourceError(f"{display}: expected 3 tab-separated fields (head, relation, tail) per line")


def _fail(display: str, lineno: int, fields: list[str]):
    if len(fields) != 3:
        raise SourceError(
            f"{display} line {lineno}: expected 3 tab-separated fields (head, relation, tail), "
            f"got {len(fields)}"
        )
    raise SourceError(f"{display} line {lineno}: empty field in a triple")


def read_kg(path: Path, ctx: ReadContext) -> SourceGraph:
    """Read a triple-file knowledge graph.

    Entities and relations are numbered by first appearance over train, then valid,
    then test, reading each line's head before its tail. The graph's edges are the
    training triples (``directed=True``, with relation ids); ``edge_splits`` holds all
    three splits with relations.
    """
    directory = find_kg_dir(path)
    files = {s: directory / f"{s}.txt" for s in SPLITS}
    triples = {s: _read_triples(files[s], ctx.show(files[s])) for s in SPLITS}

    counts = [len(triples[s]) for s in SPLITS]
    all_triples = np.concatenate([triples[s] for s in SPLITS]) if sum(counts) else np.zeros((0, 3), object)
    # Interleave head and tail per line so that "first appearance" follows reading order.
    entity_seq = all_triples[:, [0, 2]].ravel()
    entity_codes, entity_names = pd.factorize(entity_seq, sort=False)
    relation_codes, relation_names = pd.factorize(all_triples[:, 1], sort=False)
    heads = entity_codes[0::2].astype(np.int64)
    tails = entity_codes[1::2].astype(np.int64)
    rels = relation_codes.astype(np.int64)

    bounds = np.cumsum([0, *counts])
    edge_splits = {
        s: EdgeSplit(
            src=heads[bounds[i] : bounds[i + 1]].copy(),
            dst=tails[bounds[i] : bounds[i + 1]].copy(),
            rel=rels[bounds[i] : bounds[i + 1]].copy(),
        )
        for i, s in enumerate(SPLITS)
    }
    train = edge_splits["train"]

    def edges():
        step = _io.EDGE_CHUNK_ROWS
        for start in range(0, len(train.src), step):
            stop = start + step
            yield EdgeChunk(src=train.src[start:stop].copy(), dst=train.dst[start:stop].copy(),
                            rel=train.rel[start:stop].copy())

    train_file = files["train"]
    return SourceGraph(
        name=dataset_name(ctx.origin),
        format="kg",
        path=ctx.origin,
        num_nodes=len(entity_names),
        directed=bool(ctx.option("directed", True)),
        edges=edges,
        num_relations=len(relation_names),
        relation_names=tuple(str(r) for r in relation_names),
        edge_splits=edge_splits,
        split_origin={"kind": "shipped", "name": "train/valid/test.txt"},
        tasks=(TASK_LINK,),
        node_names=np.asarray(entity_names, dtype=str),
        files={"edges": str(train_file), **{f"split:{s}": str(files[s]) for s in SPLITS}},
        describe_edge=lambda i: f"line {find_data_line(train_file, i)}",
        extra={
            "id_rule": "entities and relations numbered by first appearance over train, "
            "valid, test (head before tail on each line)",
            "num_triples": {s: int(c) for s, c in zip(SPLITS, counts)},
        },
    )
