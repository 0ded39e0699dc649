"""Feature rows into ``nodes/features``, streamed in store order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphstore.errors import ConfigError, SourceError
from graphstore.layout._arrays import ChunkedAppender, chunk_rows_for
from graphstore.layout._progress import progress_bar
from graphstore.layout._staging import NODE_CHUNK, ScratchFile
from graphstore.layout._writer import StoreWriter
from graphstore.layout.dtypes import FEATURE_DTYPES, FLOAT16_MAX, encode, first_overflow, storage_dtype
from graphstore.layout.sources.base import SourceGraph

__all__ = ["write_features"]


def write_features(layout: StoreWriter, graph: SourceGraph, store_id: np.ndarray, work: Path,
                    progress: bool | None, feature_dtype: str | None = None) -> str | None:
    """Stream feature rows into ``nodes/features`` in store order; returns the stored dtype's
    name (`graphstore.layout.dtypes`), None without features.

    ``feature_dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``) casts each chunk as it
    streams, never the whole matrix; None keeps the source's: float16 stays float16
    (papers100M ships it), the rest is float32. A value beyond float16's range is refused
    with the file, row and column (a silent inf would poison every layer it reaches).

    Rows arrive in source order. Unless the store order is the source order, each chunk is
    scattered into a staging file laid out like the store: the rows a chunk sends to one
    partition are the next contiguous run of that partition (rows inside a partition keep
    source order), so a chunk costs one write per partition it touches. The staging file is
    then copied in store order into chunk-aligned Zarr writes.
    """
    if feature_dtype is not None and feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)} "
                          f"(got {feature_dtype!r})")
    if graph.features is None or graph.feature_dim == 0:
        return None
    n, d = graph.num_nodes, graph.feature_dim
    identity = all(np.array_equal(store_id[a : a + NODE_CHUNK], np.arange(a, min(a + NODE_CHUNK, n)))
                   for a in range(0, n, NODE_CHUNK))
    appender: ChunkedAppender | None = None
    staging: _ScatterBuffer | None = None
    name = "float32"
    seen = 0
    try:
        with progress_bar(n, "features", progress) as bar:
            for chunk in graph.features():
                chunk = _checked_feature_chunk(graph, np.asarray(chunk), seen)
                if appender is None:
                    # float16 sources stay float16 (papers100M ships them); the rest is float32.
                    name = feature_dtype or ("float16" if chunk.dtype == np.float16 else "float32")
                    dtype = storage_dtype(name)
                    layout.feature_rows = chunk_rows_for(layout.partition_size, d * dtype.itemsize, n)
                    appender = ChunkedAppender(layout.array("nodes/features", (n, d), dtype,
                                                            (layout.feature_rows, d)))
                    if not identity:
                        scratch = ScratchFile(str(work / "features.stage"), dtype, row_width=d)
                        staging = _ScatterBuffer(scratch, layout.p, d * dtype.itemsize)
                chunk = _encoded(graph, chunk, name, seen)
                if staging is None:
                    appender.append(chunk)
                else:
                    staging.add(store_id[seen : seen + len(chunk)], chunk)
                seen += len(chunk)
                bar.update(len(chunk))
        if staging is not None:
            staging.flush()
        if seen != n:
            raise SourceError(f"{graph.where('features')}: {seen} feature rows, expected {n} (one per node)")
        if staging is not None:
            rows = layout.feature_rows
            for start in range(0, n, rows):
                appender.append(staging.scratch.read_rows(start, min(rows, n - start)))
        appender.finish()
    finally:
        if staging is not None:
            staging.scratch.close(remove=True)
    return name


def _encoded(graph: SourceGraph, chunk: np.ndarray, name: str, seen: int) -> np.ndarray:
    """The chunk as stored under ``name``; a value the cast would turn into inf is a
    `SourceError` naming the file, the row and the column."""
    stored = encode(chunk, name)
    bad = first_overflow(stored, name)
    if bad is not None:
        row, col = bad
        limit = f"|x| <= {FLOAT16_MAX:g}" if name == "float16" else "|x| < 3.39e38"
        wider = "bfloat16 or float32" if name == "float16" else "float32"
        raise SourceError(f"{graph.where('features')} {graph.describe_feature_row(seen + row)}: feature "
                          f"value {chunk[row, col]:g} in column {col} is out of {name}'s range ({limit}); "
                          f"convert with --feature-dtype {wider}, or rescale the features")
    return stored


def _checked_feature_chunk(graph: SourceGraph, chunk: np.ndarray, seen: int) -> np.ndarray:
    """The chunk, after checking its width, the row count so far, and finiteness."""
    n, d = graph.num_nodes, graph.feature_dim
    where = graph.where("features")
    if chunk.ndim != 2 or chunk.shape[1] != d:
        raise SourceError(f"{where} {graph.describe_feature_row(seen)}: feature rows have "
                          f"shape {chunk.shape[1:]}, expected ({d},)")
    if seen + len(chunk) > n:
        raise SourceError(f"{where}: more than {n} feature rows (one per node expected)")
    finite = np.isfinite(chunk)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise SourceError(f"{where} {graph.describe_feature_row(seen + int(row))}: "
                          f"non-finite value {chunk[row, col]} in column {col}")
    return chunk


class _ScatterBuffer:
    """Gathers feature rows bound for scattered store positions, then writes them in runs.

    One source chunk sends only a few rows to each of the p partitions; written as they come,
    that is p small writes per chunk, which the disk serves as random IO. Buffering
    `budget_bytes` of rows first makes each partition's run (and each write) p times
    larger than a source chunk would.
    """

    def __init__(self, scratch: ScratchFile, num_partitions: int, row_bytes: int) -> None:
        budget_bytes = min(256 << 20, max(64 << 20, num_partitions * (64 << 10)))
        self.scratch = scratch
        self.rows = np.empty((max(1, budget_bytes // row_bytes), scratch.row_width), dtype=scratch.dtype)
        self.positions = np.empty(len(self.rows), dtype=np.int64)
        self.filled = 0

    def add(self, positions: np.ndarray, rows: np.ndarray) -> None:
        """Queue ``rows[i]`` for store row ``positions[i]``; writes when the buffer is full."""
        while len(rows):
            take = min(len(rows), len(self.rows) - self.filled)
            self.rows[self.filled : self.filled + take] = rows[:take]
            self.positions[self.filled : self.filled + take] = positions[:take]
            self.filled += take
            rows, positions = rows[take:], positions[take:]
            if self.filled == len(self.rows):
                self.flush()

    def flush(self) -> None:
        """Write what is queued, one write per run of consecutive store positions."""
        if not self.filled:
            return
        order = np.argsort(self.positions[: self.filled], kind="stable")
        positions = self.positions[order]
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        stops = np.concatenate([breaks, [len(positions)]]).tolist()
        for a, b in zip(starts, stops, strict=True):
            self.scratch.write_rows(int(positions[a]), self.rows[order[a:b]])
        self.filled = 0
