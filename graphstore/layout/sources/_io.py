"""Helpers shared by the source readers: chunked CSV, streamed ``.npz`` members, archives.

Everything here reads in bounded chunks. Parse failures become one-line `SourceError`
messages naming the file and line; the offending line is found by re-reading the file,
which only happens on the error path.
"""

from __future__ import annotations

import csv
import gzip
import os
import re
import tarfile
import tempfile
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

import numpy as np
import pandas as pd

from graphstore.errors import SourceError, SourceNotFoundError

__all__ = [
    "ARCHIVE_ERRORS",
    "EDGE_CHUNK_ROWS",
    "FEATURE_CHUNK_BYTES",
    "MAX_CLASS_ID",
    "MAX_NUM_NODES",
    "NPY_ERRORS",
    "Int64Spill",
    "NpyMember",
    "ReadContext",
    "class_ids",
    "count_columns",
    "dataset_name",
    "extract_archive",
    "feature_chunk_rows",
    "feature_dtype",
    "find_data_line",
    "is_archive",
    "iter_csv",
    "iter_data_lines",
    "iter_npy_flat",
    "iter_npy_rows",
    "iter_rows_of",
    "list_archive",
    "names_under",
    "npz_members",
    "one_line",
    "printable",
    "read_csv_all",
    "show_names",
    "single_root",
    "spill_dir",
]

EDGE_CHUNK_ROWS = 1 << 21
"""Edges per chunk (2 Mi edges: 32 MiB as two int64 columns). Read at call time, so
tests can shrink it to exercise the multi-chunk paths."""

FEATURE_CHUNK_BYTES = 4 << 20
"""Target size of one chunk of float32 feature rows."""

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
_NAME_SUFFIXES = (*ARCHIVE_SUFFIXES, ".gz", ".npz", ".txt", ".csv", ".tsv", ".edges", ".el")
_INT_RE = re.compile(r"[+-]?\d+")
_INT64_MAX = np.iinfo(np.int64).max
ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError, ValueError,
    NotImplementedError, RuntimeError,
)
"""What `zipfile`, `tarfile` and `gzip` raise for a damaged archive. Flipped flag bits in
a zip directory read as an unsupported method or version (NotImplementedError) or as
encryption (RuntimeError)."""
NPY_ERRORS: tuple[type[BaseException], ...] = (
    *ARCHIVE_ERRORS, SyntaxError, tokenize.TokenError, MemoryError,
)
"""What numpy's ``.npy``/``.npz`` loading raises for a damaged file: an ``.npz`` is a zip
(`ARCHIVE_ERRORS`), and a header is a Python literal parsed with `tokenize` and `ast`."""
MAX_NUM_NODES = 1 << 40
"""Largest node count a source may declare (about 10**12, 10**4 times ogbn-papers100M).
A count file says N before any per-node data is read, and the reader and converter then
size [N] files by it: a damaged count must not become an 8-exabyte allocation."""
MAX_CLASS_ID = int(np.iinfo(np.int32).max) - 1
"""Largest class (or relation) id a source may use: the store keeps labels and relation
ids as int32, and the count (largest id + 1) must fit as well."""
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def printable(text: str) -> str:
    """``text`` as is, or its ``repr`` if it holds control characters (a damaged file's
    names must not break a one-line message).

    Examples
    --------
    >>> printable("edge_index"), printable("a\\rb")
    ('edge_index', "'a\\\\rb'")
    """
    return text if text.isprintable() else repr(text)


def show_names(items) -> str:
    """Names found in a file (archive members, array keys) for a message: sorted, printable."""
    return ", ".join(printable(str(item)) for item in sorted(items, key=str))


def one_line(error: BaseException | str, limit: int = 200) -> str:
    """A low-level error's text as one short line, for the tail of a `SourceError`.

    Library messages (zlib, pickle, torch) may span lines or carry terminal colours; the
    command line prints a `SourceError` as exactly one line, so both go.

    Examples
    --------
    >>> one_line(ValueError("bad\\n  header"))
    'bad header'
    >>> one_line(EOFError())
    'EOFError'
    """
    text = _ANSI_ESCAPE.sub("", str(error))
    text = " ".join(text.split())
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ReadContext:
    """What `read_source` hands every reader besides the path to read."""

    origin: str
    """The source as the user gave it (a path or an OGB name); recorded as `SourceGraph.path`."""
    work_dir: Path
    """Scratch directory inside the converter's temporary output (archives go here)."""
    seed: int = 0
    """Seed of any split the reader has to generate."""
    options: Mapping[str, object] = field(default_factory=dict)
    """Reader options that were given (None values already dropped)."""
    archive_root: Path | None = None
    """Directory an archive source was extracted into, else None."""

    def option(self, key: str, default: object = None) -> object:
        """The option ``key`` if the user gave it, else ``default``."""
        return self.options.get(key, default)

    def show(self, path: str | os.PathLike) -> str:
        """Name ``path`` for messages: ``archive.tar.gz/member`` for extracted files."""
        path = Path(path)
        if self.archive_root is not None:
            try:
                rel = path.relative_to(self.archive_root)
            except ValueError:
                return str(path)
            return f"{self.origin}/{rel.as_posix()}"
        return str(path)


def dataset_name(origin: str) -> str:
    """Dataset name from a path: the last component without archive/data suffixes."""
    text = str(origin)
    if os.path.exists(text):
        text = str(Path(text).resolve())  # "." and "data/" name their folder
    name = PurePosixPath(text.replace("\\", "/").rstrip("/")).name or str(origin)
    stripped = True
    while stripped:
        stripped = False
        for suffix in _NAME_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
                break
    return name


def class_ids(values: np.ndarray, describe: Callable[[int], str]) -> np.ndarray:
    """Numeric labels as int64 class ids; NaN (and -1) mean unlabeled.

    Parameters
    ----------
    values : [n] numeric array
        Class ids as read (float when the source marks unlabeled nodes with NaN).
    describe : callable
        ``describe(i)`` names entry ``i`` in messages, e.g. ``"raw/node-label.csv.gz line 3"``.

    Returns
    -------
    [n] int64 array
        Ids in ``[-1, MAX_CLASS_ID]``.

    Raises
    ------
    SourceError
        The first entry that is not an integer in ``[-1, MAX_CLASS_ID]`` (1.5, inf, -2, 2**40).

    Examples
    --------
    >>> class_ids(np.array([0.0, np.nan, 2.0]), lambda i: f"row {i}").tolist()
    [0, -1, 2]
    """
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind == "f":
        unlabeled = np.isnan(values)
        ok = unlabeled | ((values == np.round(values)) & (values >= -1) & (values <= MAX_CLASS_ID))
    elif values.dtype.kind in "biu":
        unlabeled = np.zeros(len(values), dtype=bool)
        ok = (values >= -1) & (values <= MAX_CLASS_ID)
    else:
        raise SourceError(f"{describe(0)}: class ids must be numbers, got dtype {values.dtype}")
    bad = np.flatnonzero(~ok)
    if len(bad):
        raise SourceError(
            f"{describe(int(bad[0]))}: {values[bad[0]]} is not a class id "
            f"(an integer in [-1, {MAX_CLASS_ID}]; -1 = unlabeled)"
        )
    # Checked above: every value left is an integer in range, so the cast is exact.
    return np.where(unlabeled, -1, values).astype(np.int64)


# --------------------------------------------------------------------------- text files


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_text(path: Path) -> IO[str]:
    # Decide by content, not suffix: a file decompressed in place but not renamed still reads.
    if _is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _check_exists(path: Path, display: str) -> None:
    if not path.is_file():
        where = path.parent if path.parent.is_dir() else "(directory missing)"
        raise SourceNotFoundError(f"{display}: file not found (looked in {where})")


def _strip_line(line: str, comment: str | None) -> str:
    line = line.rstrip("\r\n")
    if comment is not None:
        line = line.split(comment, 1)[0]
    return line


def _split_fields(line: str, sep: str) -> list[str]:
    if sep == r"\s+":
        return line.split()
    return line.split(sep)


def _field_problem(value: str, kind: str, column: int) -> str | None:
    text = value.strip().strip('"')
    if text == "":
        if kind == "float_or_empty":
            return None
        return f"empty value in column {column}"
    if kind == "int":
        if not _INT_RE.fullmatch(text):
            return f"{value.strip()!r} is not an integer (column {column})"
        if abs(int(text)) > _INT64_MAX:
            return f"{text} does not fit in int64 (column {column})"
        return None
    try:
        float(text)
    except ValueError:
        return f"{value.strip()!r} is not a number (column {column})"
    return None


def iter_data_lines(
    path: Path, *, comment: str | None, skip_blank: bool, display: str | None = None
) -> Iterator[tuple[int, int, str]]:
    """Yield ``(line_number, data_row, text)`` the way pandas counts data rows.

    Raises
    ------
    SourceError
        ``"<display>: cannot read (...)"`` for a damaged gzip stream (``display``
        defaults to the path).
    """
    row = 0
    try:
        with _open_text(path) as f:
            for lineno, raw in enumerate(f, start=1):
                text = _strip_line(raw, comment)
                if skip_blank and not text.strip():
                    continue
                yield lineno, row, text
                row += 1
    except (OSError, EOFError, zlib.error) as e:
        # gzip raises all three for a damaged stream (BadGzipFile is an OSError).
        raise SourceError(f"{display or path}: cannot read ({one_line(e)})") from None


def _locate_problem(
    path: Path,
    *,
    first_row: int,
    ncols: int,
    kind: str,
    sep: str,
    comment: str | None,
    skip_blank: bool,
    rows: np.ndarray | None = None,
    usecols: tuple[int, ...] | None = None,
    display: str | None = None,
) -> tuple[int, str] | None:
    """First ``(line, problem)`` at data row >= ``first_row`` (restricted to ``rows``).

    Error path only: a Python loop over lines, which is why the happy path never calls it.
    """
    wanted = None if rows is None else set(int(r) for r in rows)
    last = None if rows is None else int(rows.max())
    for lineno, row, text in iter_data_lines(path, comment=comment, skip_blank=skip_blank, display=display):
        if row < first_row or (wanted is not None and row not in wanted):
            if last is not None and row > last:
                return None
            continue
        if text.strip():
            fields = _split_fields(text, sep)
        else:
            # A blank line is one empty value in a one-column file where empties are
            # allowed (unlabeled node), and a row with no columns anywhere else.
            fields = [""] if (kind == "float_or_empty" and ncols == 1) else []
        if len(fields) != ncols:
            return lineno, f"expected {ncols} columns, got {len(fields)}"
        for j, value in enumerate(fields):
            if usecols is not None and j not in usecols:
                continue
            problem = _field_problem(value, kind, j + 1)
            if problem is not None:
                return lineno, problem
    return None


def count_columns(
    path: str | os.PathLike, *, display: str, sep: str = ",", comment: str | None = None
) -> int:
    """Number of fields on the first data line of a (possibly gzipped) text file; 0 if empty."""
    path = Path(path)
    _check_exists(path, display)
    for _, _, text in iter_data_lines(path, comment=comment, skip_blank=True, display=display):
        return len(_split_fields(text, sep))
    return 0


def find_data_line(
    path: str | os.PathLike, row: int, *, comment: str | None = None, skip_blank: bool = True,
    display: str | None = None,
) -> int:
    """Line number (1-based) of data row ``row``: used to name a bad edge after the fact."""
    for lineno, r, _ in iter_data_lines(Path(path), comment=comment, skip_blank=skip_blank,
                                        display=display):
        if r == row:
            return lineno
    return -1


def iter_csv(
    path: str | os.PathLike,
    *,
    ncols: int,
    dtype: type | np.dtype,
    chunk_rows: int,
    display: str,
    sep: str = ",",
    comment: str | None = None,
    skip_blank: bool = False,
    missing_ok: bool = False,
    usecols: tuple[int, ...] | None = None,
) -> Iterator[np.ndarray]:
    """Stream a headerless CSV(.gz) of ``ncols`` numeric columns as [m, ncols] arrays.

    Parameters
    ----------
    path : path-like
        Plain or gzip-compressed text (detected from the content).
    ncols : int
        Columns every data line must have.
    dtype : numpy integer or float type
        Type of the yielded arrays; integer columns reject NaN/empty values.
    chunk_rows : int
        Rows per yielded chunk.
    display : str
        How messages name the file.
    sep, comment, skip_blank
        As in `pandas.read_csv` (``sep=r"\\s+"`` splits on runs of whitespace).
        With ``skip_blank=False`` data row ``i`` is line ``i + 1``, which is what lets
        `SourceGraph.describe_edge` say ``"line {i+1}"``.
    missing_ok : bool
        Float columns only: empty values are allowed (they become NaN). Otherwise an
        empty or missing field is an error even for floats.
    usecols : tuple of int, optional
        Only these columns are parsed and yielded ([m, len(usecols)]); the others are
        skipped unread (edge weights, timestamps).

    Raises
    ------
    SourceNotFoundError
        The file does not exist.
    SourceError
        ``"<file> line <n>: <problem>"`` for a row with the wrong number of columns or a
        value that does not parse; ``"<file>: cannot read (...)"`` for a corrupt gzip.
    """
    path = Path(path)
    _check_exists(path, display)
    dtype = np.dtype(dtype)
    kind = "int" if dtype.kind in "iu" else ("float_or_empty" if missing_ok else "float")
    locate = dict(ncols=ncols, kind=kind, sep=sep, comment=comment, skip_blank=skip_blank,
                  usecols=usecols, display=display)
    width = ncols if usecols is None else len(usecols)

    def fail(first_row: int, detail: str, rows: np.ndarray | None = None) -> SourceError:
        found = _locate_problem(path, first_row=first_row, rows=rows, **locate)
        if found is None:
            return SourceError(f"{display} after data row {first_row}: {detail}")
        return SourceError(f"{display} line {found[0]}: {found[1]}")

    try:
        reader = pd.read_csv(
            path,
            header=None,
            # Explicit names: column count never depends on the first line (which may be
            # a blank "unlabeled" line), and a longer line is an error, not an index.
            names=list(range(ncols)),
            index_col=False,
            sep=sep,
            dtype=dtype,
            chunksize=max(1, int(chunk_rows)),
            comment=comment,
            skip_blank_lines=skip_blank,
            usecols=list(usecols) if usecols is not None else None,
            compression="gzip" if _is_gzip(path) else None,
            quoting=csv.QUOTE_MINIMAL,
            engine="c",
        )
    except pd.errors.EmptyDataError:
        return
    except (UnicodeDecodeError, pd.errors.ParserError, ValueError, OverflowError, TypeError) as e:
        raise fail(0, one_line(e)) from None
    except (OSError, EOFError, zlib.error) as e:
        raise SourceError(f"{display}: cannot read ({one_line(e)})") from None

    row = 0
    with reader:
        while True:
            try:
                with warnings.catch_warnings():
                    # pandas only warns (and drops data) when the first line is too long.
                    warnings.simplefilter("error", pd.errors.ParserWarning)
                    # "inf" in an integer column: numpy warns about the cast before pandas
                    # raises TypeError, which is reported below with its line.
                    warnings.simplefilter("ignore", RuntimeWarning)
                    frame = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise SourceError(f"{display}: not UTF-8 text ({one_line(e)})") from None
            except (pd.errors.ParserError, pd.errors.ParserWarning, ValueError, OverflowError,
                    TypeError) as e:
                lines = str(e).strip().splitlines()
                raise fail(row, one_line(lines[-1] if lines else e)) from None
            except (OSError, EOFError, zlib.error) as e:
                raise SourceError(f"{display}: cannot read ({one_line(e)})") from None
            if frame.shape[1] != width:
                raise fail(row, f"expected {ncols} columns, got {frame.shape[1]}")
            values = frame.to_numpy(dtype=dtype)
            if kind == "float":
                bad = np.flatnonzero(np.isnan(values).any(axis=1))
                if len(bad):
                    # A short or empty row also reads as NaN; a literal "nan" is left to
                    # the converter's finiteness check.
                    found = _locate_problem(path, first_row=row, rows=bad + row, **locate)
                    if found is not None:
                        raise SourceError(f"{display} line {found[0]}: {found[1]}")
            yield values
            row += len(values)


def read_csv_all(path: str | os.PathLike, *, ncols: int, dtype, display: str, **kwargs) -> np.ndarray:
    """All rows of a small CSV as one [n, ncols] array (split files, count files)."""
    chunks = list(iter_csv(path, ncols=ncols, dtype=dtype, chunk_rows=EDGE_CHUNK_ROWS,
                           display=display, **kwargs))
    if not chunks:
        return np.zeros((0, ncols), dtype=dtype)
    return np.concatenate(chunks)


# --------------------------------------------------------------------------- spill files


def spill_dir(ctx: ReadContext, prefix: str) -> Path:
    """A fresh folder under ``ctx.work_dir`` for one read's spilled arrays.

    Fresh per call: reading the same source twice into one work directory must not
    overwrite files that an earlier `SourceGraph` still maps.
    """
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=ctx.work_dir))


class Int64Spill:
    """Collect int64 values chunk by chunk in a ``.npy`` file instead of memory.

    ``finish()`` returns the values as a read-only `np.memmap` (``np.load(path,
    mmap_mode="r")``), so building an [N] array never holds more than one chunk.
    The file is created (header and size) with ``np.lib.format.open_memmap`` but filled
    with plain sequential writes: dirty pages of a writable map would count in the
    process's resident memory until unmapped, [N] of them by the end.
    Use as a context manager: on an exception the handles are closed and the partial
    files removed.

    Parameters
    ----------
    path : path-like
        The ``.npy`` file to write (its folder must exist).
    length : int, optional
        Number of values when known up front (labels: one per node). Values past
        ``length`` are counted but not stored, so the caller can still report the true
        count; ``finish`` then returns only the first ``length``. When None, values go
        to a raw side file first and are copied into the ``.npy`` at the end (split
        files, whose line count is only known once read).

    Attributes
    ----------
    count : int
        Values appended so far.
    max : int
        Largest value appended so far (-1 before any; what ``num_classes`` needs).
    """

    def __init__(self, path: str | os.PathLike, *, length: int | None = None) -> None:
        self.path = Path(path)
        self.count = 0
        self.max = -1
        self.length = None if length is None else int(length)
        self._out: IO[bytes] | None = None
        self._raw: IO[bytes] | None = None
        self._raw_path = self.path.with_name(self.path.name + ".part")
        if self.length is not None:
            self._out = self._create(self.length)
        else:
            self._raw = open(self._raw_path, "wb")

    def _create(self, length: int) -> IO[bytes]:
        """Create the ``.npy`` of ``length`` values; a handle positioned at its data."""
        created = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.int64, shape=(length,))
        offset = int(created.offset)
        del created  # unmapped before anything is written
        f = open(self.path, "r+b")
        f.seek(offset)
        return f

    def append(self, values: np.ndarray) -> None:
        """Add a chunk (any integer array; flattened)."""
        values = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
        if not len(values):
            return
        self.max = max(self.max, int(values.max()))
        if self._out is not None:
            room = max(0, self.length - self.count)
            if room:
                values[:room].tofile(self._out)
        elif self._raw is not None:
            values.tofile(self._raw)
        self.count += len(values)

    def finish(self) -> np.memmap:
        """Close the writer and return the stored values, mapped read-only."""
        if self._out is None:
            # Unknown length: copy the raw side file into a .npy of the final size.
            if self._raw is not None:
                self._raw.close()
                self._raw = None
            self._out = self._create(self.count)
            step = EDGE_CHUNK_ROWS
            with open(self._raw_path, "rb") as f:
                for start in range(0, self.count, step):
                    np.fromfile(f, dtype=np.int64, count=min(step, self.count - start)).tofile(self._out)
            self._raw_path.unlink()
        # (Fewer values than `length` leave zeros; callers reject a short count.)
        self._out.close()
        self._out = None
        return np.load(self.path, mmap_mode="r")

    def close(self) -> None:
        """Drop the handles without returning anything (error path)."""
        for handle in (self._out, self._raw):
            if handle is not None:
                handle.close()
        self._out = self._raw = None

    def __enter__(self) -> "Int64Spill":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        if exc_type is not None:
            for p in (self.path, self._raw_path):
                try:
                    p.unlink()
                except OSError:
                    pass


# --------------------------------------------------------------------------- .npz members


@dataclass(frozen=True)
class NpyMember:
    """One ``.npy`` array inside an ``.npz`` zip, located but not read."""

    archive: Path
    """The ``.npz`` file."""
    member: str
    """Name inside the zip, e.g. ``"node_feat.npy"``."""
    display: str
    """How messages name the array, e.g. ``"raw/data.npz[node_feat]"``."""
    shape: tuple[int, ...]
    """Array shape from the header."""
    dtype: np.dtype
    """Element type from the header (may be non-native byte order)."""
    fortran_order: bool
    """True when the data is laid out column-major."""
    header_bytes: int
    """Offset of the first data byte inside the member."""

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def _read_npy_header(f: IO[bytes], display: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
    except NPY_ERRORS as e:
        raise SourceError(f"{display}: not a .npy array ({one_line(e)})") from None
    raise SourceError(f"{display}: .npy format version {version} is not supported (1.0, 2.0)")


def _check_npy_size(shape: tuple[int, ...], dtype: np.dtype, available: int, display: str) -> None:
    """Refuse a header whose shape needs more data than the member holds.

    Checked before anything is allocated: a damaged header can promise terabytes.
    """
    if any(int(s) < 0 for s in shape):
        raise SourceError(f"{display}: negative dimension in shape {tuple(shape)}")
    if dtype.hasobject:
        return  # pickled: its size says nothing, and it is never read anyway
    need = int(np.prod([int(s) for s in shape], dtype=object)) * dtype.itemsize
    if need > available:
        raise SourceError(
            f"{display}: truncated: shape {tuple(shape)} of {dtype} needs {need} bytes of data, "
            f"the member holds {max(available, 0)}"
        )


def npz_members(path: str | os.PathLike, *, display: str) -> dict[str, NpyMember]:
    """Headers of every array in an ``.npz``, keyed by array name (no data is read).

    Works whether members are stored or deflated (`np.savez` / `np.savez_compressed`).
    """
    path = Path(path)
    _check_exists(path, display)
    members: dict[str, NpyMember] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[: -len(".npy")]
                with zf.open(info) as f:
                    shape, fortran, dtype = _read_npy_header(f, f"{display}[{key}]")
                    _check_npy_size(shape, dtype, info.file_size - f.tell(), f"{display}[{key}]")
                    members[key] = NpyMember(
                        archive=path,
                        member=info.filename,
                        display=f"{display}[{key}]",
                        shape=tuple(int(s) for s in shape),
                        dtype=dtype,
                        fortran_order=bool(fortran) and len(shape) > 1,
                        header_bytes=f.tell(),
                    )
    except SourceError:
        raise
    except NPY_ERRORS as e:
        raise SourceError(f"{display}: not a readable .npz archive ({one_line(e)})") from None
    return members


def iter_npy_flat(m: NpyMember, *, start: int, stop: int, chunk: int) -> Iterator[np.ndarray]:
    """Yield elements ``[start, stop)`` of the member's flat data as [<=chunk] arrays.

    Each call opens its own handle, so two of these can walk one member in step
    (rows 0 and 1 of a C-order [2, E] ``edge_index``). Seeking forward in a deflated
    member decompresses what it skips; nothing is held.
    """
    if m.dtype.hasobject:
        raise SourceError(f"{m.display}: holds Python objects, not numbers")
    itemsize = m.dtype.itemsize
    chunk = max(1, int(chunk))
    stored_at = _stored_data_offset(m)
    if stored_at is not None:
        yield from _iter_stored(m, stored_at, start=start, stop=stop, chunk=chunk)
        return
    try:
        with zipfile.ZipFile(m.archive) as zf, zf.open(m.member) as f:
            f.seek(m.header_bytes + start * itemsize)
            pos = start
            while pos < stop:
                n = min(chunk, stop - pos)
                buf = f.read(n * itemsize)
                if len(buf) != n * itemsize:
                    raise SourceError(
                        f"{m.display}: truncated: shape {m.shape} needs {m.size} elements, "
                        f"data ends after {pos + len(buf) // itemsize}"
                    )
                yield np.frombuffer(buf, dtype=m.dtype)
                pos += n
    except SourceError:
        raise
    except ARCHIVE_ERRORS as e:
        raise SourceError(f"{m.display}: corrupt data ({one_line(e)})") from None


def _stored_data_offset(m: NpyMember) -> tuple[int, int] | None:
    """(byte offset, byte size) of an uncompressed member's data in the archive, or None if
    deflated.

    np.savez (and ogbn-papers100M's data.npz) store members uncompressed; reading those
    straight from the file skips zipfile's per-read CRC and copies, which otherwise cost
    as much as the disk read itself. The converter validates every value anyway.
    """
    try:
        with zipfile.ZipFile(m.archive) as zf:
            info = zf.getinfo(m.member)
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        with open(m.archive, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            return None
        name_len = int.from_bytes(local[26:28], "little")
        extra_len = int.from_bytes(local[28:30], "little")
        return info.header_offset + 30 + name_len + extra_len, info.file_size
    except (*ARCHIVE_ERRORS, KeyError):
        return None  # the deflated path reads it, or names what is wrong


def _iter_stored(m: NpyMember, stored: tuple[int, int], *, start: int, stop: int,
                 chunk: int) -> Iterator[np.ndarray]:
    itemsize = m.dtype.itemsize
    data_at, member_bytes = stored
    available = max(0, (member_bytes - m.header_bytes) // itemsize)
    if stop > available:
        raise SourceError(
            f"{m.display}: truncated: shape {m.shape} needs {m.size} elements, data ends after {available}"
        )
    with open(m.archive, "rb") as f:
        pos = start
        while pos < stop:
            n = min(chunk, stop - pos)
            f.seek(data_at + m.header_bytes + pos * itemsize)
            out = np.fromfile(f, dtype=m.dtype, count=n)
            if len(out) != n:
                raise SourceError(
                    f"{m.display}: truncated: shape {m.shape} needs {m.size} elements, "
                    f"data ends after {pos + len(out)}"
                )
            yield out
            pos += n


def iter_npy_rows(m: NpyMember, *, chunk_rows: int, dtype) -> Iterator[np.ndarray]:
    """Stream a C-order [N, ...] member as [<=chunk_rows, ...] arrays of ``dtype`` (copies)."""
    if not m.shape:
        raise SourceError(f"{m.display}: expected an array, got a scalar")
    if m.fortran_order:
        raise SourceError(
            f"{m.display}: stored column-major (Fortran order), which cannot be read by "
            "rows; re-save it with np.ascontiguousarray"
        )
    row_elems = int(np.prod(m.shape[1:], dtype=np.int64)) if len(m.shape) > 1 else 1
    chunk_rows = max(1, int(chunk_rows))
    for flat in iter_npy_flat(m, start=0, stop=m.size, chunk=chunk_rows * row_elems):
        yield _cast(flat.reshape((-1, *m.shape[1:])), dtype)


# --------------------------------------------------------------------------- archives


def is_archive(path: str | os.PathLike) -> bool:
    """True for ``.zip``, ``.tar``, ``.tar.gz`` and ``.tgz`` files (not ``.npz``)."""
    name = str(path).lower()
    return Path(path).is_file() and name.endswith(ARCHIVE_SUFFIXES)


def _unsafe_member(name: str) -> bool:
    name = name.replace("\\", "/")
    parts = PurePosixPath(name).parts
    return name.startswith("/") or re.match(r"^[A-Za-z]:", name) is not None or ".." in parts


def list_archive(path: str | os.PathLike, *, display: str) -> list[str]:
    """Names (posix, relative) of the regular files in an archive."""
    path = Path(path)
    try:
        if str(path).lower().endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                return [i.filename for i in zf.infolist() if not i.is_dir()]
        with tarfile.open(path, "r:*") as tf:
            return [t.name for t in tf.getmembers() if t.isfile()]
    except ARCHIVE_ERRORS as e:
        raise SourceError(f"{display}: not a readable archive ({one_line(e)})") from None


def extract_archive(path: str | os.PathLike, dest: str | os.PathLike, *, display: str) -> Path:
    """Extract a zip or tar(.gz) archive into ``dest`` and return ``dest``.

    Raises
    ------
    SourceError
        A member would land outside ``dest`` (absolute path, ``..``), a tar member is a
        link or device, or the archive is unreadable.
    """
    path, dest = Path(path), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()

    def check(name: str) -> None:
        target = (root / name.replace("\\", "/")).resolve()
        if _unsafe_member(name) or (target != root and root not in target.parents):
            raise SourceError(
                f"{display}: member {name!r} would be written outside the extraction "
                "directory; refusing to extract"
            )

    try:
        if str(path).lower().endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
                for info in infos:
                    check(info.filename)
                for info in infos:
                    zf.extract(info, root)
        else:
            with tarfile.open(path, "r:*") as tf:
                members = tf.getmembers()
                for t in members:
                    check(t.name)
                    if not (t.isfile() or t.isdir()):
                        raise SourceError(
                            f"{display}: member {t.name!r} is a link or special file; "
                            "refusing to extract"
                        )
                kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tf.extractall(root, members=members, **kwargs)
    except SourceError:
        raise
    except ARCHIVE_ERRORS as e:
        raise SourceError(f"{display}: cannot extract ({one_line(e)})") from None
    return dest


def single_root(directory: Path) -> Path:
    """Descend while a directory holds exactly one subdirectory and nothing else.

    Archives often wrap the dataset in one folder (``WN18RR/train.txt``, ``arxiv/raw``).
    Never descends into ``raw/``: that folder is part of the OGB and Planetoid layouts.
    """
    directory = Path(directory)
    while True:
        entries = [e for e in directory.iterdir() if e.name not in ("__MACOSX", ".DS_Store")]
        if len(entries) == 1 and entries[0].is_dir() and entries[0].name != "raw":
            directory = entries[0]
        else:
            return directory


def _cast(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` as ``dtype``; a float too large for it becomes inf without a warning.

    The converter's finiteness check then names the row, which a numpy overflow warning
    here could not.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dtype, copy=False)


def iter_rows_of(array: np.ndarray, chunk_rows: int, dtype=np.float32) -> Iterator[np.ndarray]:
    """Yield [<=chunk_rows, ...] copies of a (possibly memory-mapped) array, in order."""
    for start in range(0, len(array), max(1, int(chunk_rows))):
        yield np.array(_cast(np.asarray(array[start : start + chunk_rows]), dtype), copy=True)


def feature_dtype(dtype: np.dtype) -> np.dtype:
    """float16 stays float16 (ogbn-papers100M ships it, halving the store); else float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float16) if dtype.kind == "f" and dtype.itemsize == 2 else np.dtype(np.float32)


def feature_chunk_rows(dim: int, itemsize: int = 4) -> int:
    """Rows per feature chunk so one chunk is about `FEATURE_CHUNK_BYTES`."""
    return max(1, FEATURE_CHUNK_BYTES // max(1, dim * itemsize))


def names_under(directory: Path, *, max_depth: int = 3, limit: int = 20000) -> list[str]:
    """Relative posix names of files (and ``dir/`` for folders) up to ``max_depth`` deep.

    Bounded so detection never walks a huge tree.
    """
    out: list[str] = []
    base = Path(directory)
    stack: list[tuple[Path, int]] = [(base, 0)]
    while stack and len(out) < limit:
        current, depth = stack.pop()
        try:
            entries = sorted(current.iterdir())
        except OSError:
            continue
        for entry in entries:
            rel = entry.relative_to(base).as_posix()
            if entry.is_dir():
                out.append(rel + "/")
                if depth + 1 < max_depth:
                    stack.append((entry, depth + 1))
            else:
                out.append(rel)
    return out
