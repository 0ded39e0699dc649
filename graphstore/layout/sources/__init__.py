"""Source readers: dataset files in, a `SourceGraph` out, for ``graphstore convert``.

``read_source(path)`` detects the format (or takes ``format=``), extracts an archive
into the converter's ``work_dir``, and calls the reader registered under that name in
`READERS` (`register_reader` adds one)::

    "ogb"        OGB raw layout (raw/*.csv.gz or raw/data.npz, split/<name>/...)
    "planetoid"  raw/ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}
    "npz"        gnn-benchmark .npz (adj_*, attr_*, labels), plain or zipped
    "kg"         train/valid/test.txt triples, directory or .tar.gz
    "edgelist"   an edge list file, or edges.{txt,csv,tsv} [+ features.npy, labels.npy]
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import _io
from graphstore.layout.sources._io import ReadContext
from graphstore.layout.sources.base import (
    TASK_LINK,
    TASK_NODE,
    EdgeChunk,
    EdgeSplit,
    SourceGraph,
)
from graphstore.layout.sources.edgelist import EDGE_FILE_NAMES, read_edgelist
from graphstore.layout.sources.kg import read_kg
from graphstore.layout.sources.npz import read_npz
from graphstore.layout.sources.ogb import is_ogb_name, locate_ogb, read_ogb
from graphstore.layout.sources.planetoid import read_planetoid
from graphstore.registry import Registry

__all__ = [
    "OPTION_NAMES",
    "READERS",
    "TASK_LINK",
    "TASK_NODE",
    "EdgeChunk",
    "EdgeSplit",
    "ReadContext",
    "SourceFormat",
    "SourceGraph",
    "SourceReader",
    "available_formats",
    "detect_format",
    "get_reader",
    "read_source",
    "register_reader",
]

SourceReader = Callable[[Path, ReadContext], SourceGraph]
"""A reader: ``(path, context) -> SourceGraph``; ``path`` is a local file or directory
(archives already extracted), the context carries the origin, seed and options."""

OPTION_NAMES = ("directed", "features", "labels", "num_nodes", "root", "split")
"""Reader options the command line can pass (``--directed``, ``--features`` ...)."""

# Options every reader accepts: an override of directedness, and where OGB names resolve.
_COMMON_OPTIONS = frozenset({"directed", "root"})


@dataclass(frozen=True, slots=True)
class SourceFormat:
    """What `READERS` holds for one format name."""

    reader: SourceReader
    """Called as ``reader(path, context)``."""
    options: frozenset[str]
    """Options of `OPTION_NAMES` the reader uses beyond ``directed`` and ``root``."""


READERS: Registry[SourceFormat] = Registry("source format", error=SourceError)
"""The source formats by name; a new one registers with `register_reader`."""


def register_reader(name: str, reader: SourceReader, *, options: Iterable[str] = (),
                    summary: str | None = None) -> None:
    """Register ``reader`` under the format ``name`` in `READERS`.

    Parameters
    ----------
    name : str
        Lower-case format name, e.g. ``"ogb"``.
    reader : SourceReader
        Called as ``reader(path, context)``.
    options : iterable of str
        Options from `OPTION_NAMES` this reader uses beyond ``directed`` and ``root``;
        `read_source` refuses the others for this format.
    summary : str, optional
        One line for ``--help``; the first line of the reader's docstring by default.

    Raises
    ------
    SourceError
        (a `ValueError`) ``name`` is already registered, malformed, or an option is unknown.
    """
    options = frozenset(options)
    if options - set(OPTION_NAMES):
        unknown = sorted(options - set(OPTION_NAMES))
        raise SourceError(f"unknown reader options {unknown} (known: {', '.join(OPTION_NAMES)})")
    if summary is None:  # the registry would read SourceFormat's docstring, not the reader's
        summary = (reader.__doc__ or "").strip().partition("\n")[0].rstrip(".")
    READERS.register(name, SourceFormat(reader, options), summary=summary, stacklevel=2)


def available_formats() -> tuple[str, ...]:
    """Registered format names, sorted."""
    return READERS.names()


def get_reader(name: str) -> SourceReader:
    """The reader registered as ``name``.

    Raises
    ------
    SourceError
        No such format; the message lists the known ones.
    """
    return READERS.get(name).reader


# --------------------------------------------------------------------------- detection


def _strip_wrappers(names: list[str]) -> list[str]:
    # Archives usually wrap a dataset in one folder; look inside it.
    while names and all("/" in n for n in names):
        first = {n.split("/", 1)[0] for n in names}
        if len(first) != 1 or first & {"__MACOSX", "raw"}:
            break
        names = [n.split("/", 1)[1] for n in names if n.split("/", 1)[1]]
    return names


def _detect_names(names: list[str]) -> str | None:
    """Format from the relative names of a dataset's files (``dir/`` for folders)."""
    files = set(names)
    ogb_marker = re.compile(r"^raw/(edge\.csv(\.gz)?|data\.npz|num-node-dict\.csv\.gz|relations/)")
    if any(ogb_marker.match(n) for n in files):
        return "ogb"
    if any(re.match(r"^(raw/)?ind\.[^/]+\.graph$", n) for n in files):
        return "planetoid"
    if {"train.txt", "valid.txt", "test.txt"} <= files:
        return "kg"
    if any(n in EDGE_FILE_NAMES for n in files):
        return "edgelist"
    if any(re.match(r"^[^/]+\.npz$", n) for n in files):
        return "npz"
    return None


def _undetected(path: str, seen: list[str]) -> SourceError:
    shown = _io.show_names(sorted(seen)[:8]) + (", ..." if len(seen) > 8 else "")
    return SourceError(
        f"{path}: cannot tell the source format (found: {shown or 'nothing'}); pass --format "
        f"({', '.join(available_formats())})"
    )


def detect_format(path: str | os.PathLike) -> str:
    """Name of the reader for ``path``: a directory, archive, file or OGB dataset name.

    Directories and archives are recognised by their files (``raw/edge.csv.gz`` ->
    ``"ogb"``, ``ind.*.graph`` -> ``"planetoid"``, ``train/valid/test.txt`` -> ``"kg"``,
    ``edges.txt`` -> ``"edgelist"``, a ``.npz`` -> ``"npz"``); single files by suffix;
    a non-existent path shaped like ``ogbn-arxiv`` is ``"ogb"``.

    Raises
    ------
    SourceNotFoundError
        ``path`` does not exist and is not an OGB name.
    SourceError
        Nothing recognisable.

    Examples
    --------
    >>> detect_format("ogbn-arxiv")
    'ogb'
    """
    text = os.fspath(path)
    p = Path(text)
    if not p.exists():
        if is_ogb_name(text):
            return "ogb"
        raise SourceNotFoundError(f"{text}: no such file or directory")
    if p.is_dir():
        root = _io.single_root(p)
        names = _io.names_under(root, max_depth=2)
        found = _detect_names(names)
        if found is None:
            raise _undetected(text, names)
        return found
    lower = p.name.lower()
    if _io.is_archive(p):
        names = _strip_wrappers(_io.list_archive(p, display=text))
        found = _detect_names(names)
        if found is None:
            raise _undetected(text, names)
        return found
    if lower.endswith(".npz"):
        return "npz"
    if re.search(r"\.(txt|csv|tsv|edges|el|edgelist)(\.gz)?$", lower):
        return "edgelist"
    raise _undetected(text, [p.name])


# --------------------------------------------------------------------------- reading


def _clean_options(options: Mapping[str, object] | None) -> dict[str, object]:
    given = {k: v for k, v in dict(options or {}).items() if v is not None}
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        raise SourceError(f"unknown reader option(s) {', '.join(unknown)} (known: {', '.join(OPTION_NAMES)})")
    if "directed" in given and not isinstance(given["directed"], bool):
        raise SourceError(f"option directed must be true or false (got {given['directed']!r})")
    if "split" in given and not isinstance(given["split"], str):
        raise SourceError(f"option split must be a split directory name (got {given['split']!r})")
    return given


def read_source(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    work_dir: str | os.PathLike,
    seed: int = 0,
    options: Mapping[str, object] | None = None,
) -> SourceGraph:
    """Read a dataset into a `SourceGraph`.

    Parameters
    ----------
    path : path-like or str
        Directory, file, archive (``.zip``, ``.tar.gz``, ``.tgz``, ``.tar``) or an OGB
        dataset name such as ``"ogbn-arxiv"`` (looked up under ``options["root"]``).
    format : str, optional
        A registered format name; detected when omitted.
    work_dir : path-like
        Scratch directory owned by the caller; archives are extracted below it, so the
        returned streams read from it and it must outlive them.
    seed : int
        Seed of any split the reader generates (recorded in ``split_origin``).
    options : mapping, optional
        Reader options (see `OPTION_NAMES`); None values are ignored.

    Raises
    ------
    SourceNotFoundError
        The source or a file it needs is missing.
    SourceError
        Anything else wrong with the input; the message names file, line/array, problem.
    """
    opts = _clean_options(options)
    origin = os.fspath(path)
    work_dir = Path(work_dir)
    if format is not None:
        READERS.get(format)
    p = Path(origin)
    if not p.exists():
        if is_ogb_name(origin) and format in (None, "ogb"):
            p = locate_ogb(origin, opts.get("root"))
            format = "ogb"
        else:
            raise SourceNotFoundError(f"{origin}: no such file or directory")

    archive_root = None
    if _io.is_archive(p):
        format = format or detect_format(p)
        work_dir.mkdir(parents=True, exist_ok=True)
        archive_root = Path(tempfile.mkdtemp(prefix="source-", dir=work_dir))
        _io.extract_archive(p, archive_root, display=origin)
        p = _io.single_root(archive_root)
    else:
        format = format or detect_format(p)

    entry = READERS.get(format)
    for key in sorted(opts):
        if key not in _COMMON_OPTIONS and key not in entry.options:
            users = READERS.names(where=lambda f: key in f.options)  # noqa: B023 (used at once)
            raise SourceError(
                f"option {key!r} is not used by the {format} reader (only by: {', '.join(users) or 'none'})"
            )
    ctx = ReadContext(origin=origin, work_dir=work_dir, seed=int(seed), options=opts,
                      archive_root=archive_root)
    try:
        return entry.reader(p, ctx)
    except SourceError as exc:
        if archive_root is None or str(archive_root) not in str(exc):
            raise
        # A reader that names the extraction (where a wrong --format looked) names a
        # temporary directory gone by the time the user reads it: name the archive instead.
        raise type(exc)(str(exc).replace(str(archive_root), origin)) from None


register_reader("edgelist", read_edgelist, options=("features", "labels", "num_nodes"),
                summary="an edge list file, or edges.{txt,csv,tsv} [+ features.npy, labels.npy]")
register_reader("kg", read_kg, summary="train/valid/test.txt triples, directory or .tar.gz")
register_reader("npz", read_npz, summary="gnn-benchmark .npz (adj_*, attr_*, labels), plain or zipped")
register_reader("ogb", read_ogb, options=("split",),
                summary="OGB raw layout (raw/*.csv.gz or raw/data.npz, split/<name>/...)")
register_reader("planetoid", read_planetoid,
                summary="raw/ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}")
