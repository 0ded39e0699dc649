"""`graphstore convert`: a source dataset in, a format-v1 store out, streaming and atomic.

The stages, each a function below, in the order they run::

    read_source ─> stage edges (validate ids, drop self loops, add reverse edges)
                ─> choose p ─> partition nodes ─> store order (equal blocks)
                ─> node arrays ─> features (staged per partition, then chunk by chunk)
                ─> edge buckets (counting sort on disk, then sort + dedup per dst partition)
                ─> splits ─> manifest ─> rename the temporary directory into place

Memory: O(N) for id maps, labels and degrees, plus one chunk of edges or feature rows,
plus the edges into one partition while they are sorted. Features and edges never sit in
memory whole; the one exception is METIS, which needs the graph (``stream`` does not).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from graphstore._version import __version__
from graphstore.errors import ConfigError, SourceError, StoreExistsError
from graphstore.layout._fast import unique
from graphstore.layout._arrays import ChunkedAppender, chunk_rows_for, new_array
from graphstore.layout._staging import EdgeStager, ScratchFile, StagedEdges
from graphstore.layout.base import FORMAT_VERSION, MANIFEST_KEY, Manifest, index_dtype_for
from graphstore.layout.partition import equal_blocks, partition_nodes
from graphstore.layout.sources.base import EdgeSplit, SourceGraph

__all__ = ["ConvertOptions", "convert"]

log = logging.getLogger(__name__)

DEFAULT_PARTITION_BYTES = 4 << 20
"""A partition of about this many bytes of features + edges is one efficient disk request
(HierBatching's rule); the default p is total bytes over this."""
MAX_DEFAULT_PARTITIONS = 1024
"""Bound on the default p: bucket_offsets has p*p+1 entries."""
METIS_AUTO_MAX_EDGES = 50_000_000
"""``partitioner=None`` picks METIS below this many staged edges, ``stream`` above it."""


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    """Everything `graphstore convert` can be told, with the defaults of the CLI."""

    format: str | None = None
    """Source format; None detects it from the path."""
    num_partitions: int | None = None
    """p; None derives it from `partition_bytes`."""
    partition_bytes: int | None = None
    """Target bytes (features + edges) per partition when p is not given."""
    partitioner: str | None = None
    """``metis``, ``random``, ``sequential``, ``stream``; None: METIS when it fits."""
    seed: int = 0
    """Seeds the partitioner and generated splits."""
    overwrite: bool = False
    """Replace an existing output (only once the new store is complete)."""
    keep_self_loops: bool | None = None
    """Store self loops instead of dropping them. None: drop them (as the PyG and OGB loaders
    do), except in knowledge graphs, whose triples are stored as given."""
    keep_duplicates: bool = False
    """Store repeated edges instead of merging them."""
    compress: bool = False
    """zstd on every array (off: float features barely compress and cost CPU)."""
    chunk_edges: int = 1 << 20
    """Edges per streaming step; with feature chunks this bounds conversion memory."""
    reader_options: dict[str, Any] = field(default_factory=dict)
    """Passed to the source reader (``directed``, ``features``, ``labels``, ``root``...)."""
    progress: bool | None = None
    """tqdm bars: None shows them only on a terminal."""


def convert(source: str | os.PathLike | SourceGraph, out: str | os.PathLike,
            options: ConvertOptions | None = None) -> Manifest:
    """Convert ``source`` into a store at ``out`` and return its manifest.

    ``source`` is a path (its format detected, or ``options.format``) or a `SourceGraph`
    built in memory, which is how user code and tests hand over data of their own.

    The store is built in a hidden temporary directory beside ``out`` and renamed into
    place only when complete, so an error or a kill part-way leaves ``out`` as it was.

    Raises
    ------
    StoreExistsError
        ``out`` exists and ``options.overwrite`` is false (nothing is read or written).
    SourceError
        The source is missing or malformed; the message names the file and the line.
    ConfigError
        An option that cannot work (p > N, unknown partitioner).
    """
    opts = options or ConvertOptions()
    out_path = Path(out).absolute()
    if out_path.exists() and not opts.overwrite:
        raise StoreExistsError(f"{out_path}: already exists (pass --overwrite to replace it)")
    _remove_stale_temporaries(out_path)
    tmp = out_path.parent / f".{out_path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        manifest = _build(source if isinstance(source, SourceGraph) else Path(source), tmp, opts)
        _move_into_place(tmp, out_path, overwrite=opts.overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _remove_stale_temporaries(out_path: Path) -> None:
    """Delete temporaries of earlier conversions to this output whose process is gone."""
    if not out_path.parent.is_dir():
        return
    for entry in out_path.parent.glob(f".{out_path.name}.tmp-*"):
        pid_text = entry.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        try:
            os.kill(int(pid_text), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _move_into_place(tmp: Path, out_path: Path, *, overwrite: bool) -> None:
    if out_path.exists():
        if not overwrite:  # appeared while we converted
            raise StoreExistsError(f"{out_path}: already exists (pass --overwrite to replace it)")
        old = tmp.with_name(tmp.name + ".old")
        os.replace(out_path, old)
        os.replace(tmp, out_path)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        os.replace(tmp, out_path)
    _fsync_dir(out_path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _phase(name: str, timings: dict[str, float]) -> Iterator[None]:
    start = time.perf_counter()
    log.info("%s ...", name)
    yield
    timings[name] = round(time.perf_counter() - start, 3)
    log.info("%s done in %.2f s (%s)", name, timings[name], _memory_note())


def _memory_note() -> str:
    """Anonymous and file-backed resident memory, and the peak (Linux; for -v logs)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile", "VmHWM")))
    except OSError:
        return "memory unknown"
    return ", ".join(f"{k} {v.strip()}" for k, v in fields.items())


def _bar(total: int | None, desc: str, enabled: bool | None):
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, disable=disable, leave=False)


def _build(source: Path | SourceGraph, tmp: Path, opts: ConvertOptions) -> Manifest:
    timings: dict[str, float] = {}
    root = zarr.open_group(str(tmp), mode="w", zarr_format=3)  # "w" empties tmp: before _work
    work = tmp / "_work"
    work.mkdir()
    with _phase("read source", timings):
        if isinstance(source, SourceGraph):
            graph = source
        else:
            from graphstore.layout.sources import read_source

            graph = read_source(
                source, format=opts.format, work_dir=work / "source", seed=opts.seed,
                options=dict(opts.reader_options),
            )
    _check_source_shape(graph)
    with _phase("stage edges", timings):
        staged, edge_counts = _stage_edges(graph, work, opts)
    p, p_rule = _choose_num_partitions(graph, staged, opts)
    method = opts.partitioner or ("metis" if staged.num_edges <= METIS_AUTO_MAX_EDGES else "stream")
    with _phase("partition", timings):
        part = partition_nodes(method, edges=staged, num_partitions=p, seed=opts.seed,
                               chunk_edges=opts.chunk_edges)
        orig_id, partition_size = equal_blocks(part.labels, p)
        partition_info = part.info
        del part  # its [N] labels: the store order replaces them
        # Inside a partition, rows follow source order: feature rows can then be appended
        # per partition as the source streams them, and neighbouring ids stay neighbours.
        # (equal_blocks already orders by source id within a label; a block that spans two
        # labels needs this.) In place, one block at a time: no O(N) temporaries.
        for start in range(0, graph.num_nodes, partition_size):
            orig_id[start : start + partition_size].sort()
        # The id maps in the store's index dtype: half the memory, and the gathers that map
        # every edge (store_id[src]) miss the cache half as often.
        idx = index_dtype_for(graph.num_nodes)
        orig_id = orig_id.astype(idx)
        store_id = np.empty_like(orig_id)
        store_id[orig_id] = np.arange(graph.num_nodes, dtype=idx)

    layout = _Layout(root, graph.num_nodes, p, partition_size, idx, opts.compress)
    with _phase("write nodes", timings):
        _write_node_arrays(layout, graph, orig_id, store_id)
    with _phase("write features", timings):
        feature_dtype = _write_features(layout, graph, store_id, work, opts)
    with _phase("write edges", timings):
        num_edges, cut_edges = _write_edges(layout, staged, store_id, work, opts)
    with _phase("write splits", timings):
        split_counts, split_kinds = _write_splits(layout, graph, store_id)

    manifest = Manifest(
        format_version=FORMAT_VERSION,
        num_nodes=graph.num_nodes,
        num_edges=num_edges,
        directed=graph.directed,
        num_partitions=p,
        partition_size=partition_size,
        feature_dim=graph.feature_dim if graph.features is not None else 0,
        feature_dtype=feature_dtype,
        index_dtype=idx,
        num_classes=graph.num_classes if graph.labels is not None else 0,
        num_relations=graph.num_relations,
        relation_names=list(graph.relation_names) if graph.relation_names else None,
        tasks=list(graph.tasks),
        splits=split_counts,
        split_kinds=split_kinds,
        split_origin=_jsonable(graph.split_origin),
        source={
            "name": graph.name,
            "format": graph.format,
            "path": str(graph.path),
            "files": {k: str(v) for k, v in graph.files.items()},
            "extra": _jsonable(graph.extra),
        },
        partitioner={
            "method": method,
            "requested": opts.partitioner or "auto",
            "seed": opts.seed,
            "num_partitions_rule": p_rule,
            "edge_cut": cut_edges / num_edges if num_edges else 0.0,
            "cut_edges": int(cut_edges),
            "info": _jsonable(partition_info),
        },
        conversion={**edge_counts, "duplicates_merged": edge_counts["staged_edges"] - num_edges,
                    "keep_self_loops": _keeps_self_loops(graph, opts),
                    "keep_duplicates": opts.keep_duplicates,
                    "compress": opts.compress, "seconds": timings},
        chunks=layout.chunk_summary(),
        created_by=f"graphstore {__version__}",
    )
    shutil.rmtree(work)
    # The manifest goes in last: until it is there, `open` refuses the directory.
    root.attrs[MANIFEST_KEY] = manifest.to_json()
    return manifest


def _jsonable(value: Any) -> Any:
    """Turn numpy scalars/arrays and tuples inside reader metadata into JSON types."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return value


def _where(graph: SourceGraph, role: str) -> str:
    return graph.files.get(role, f"{graph.path} ({role})")


def _check_source_shape(graph: SourceGraph) -> None:
    """Checks every format shares: sizes that agree, labels in range."""
    if graph.num_nodes <= 0:
        raise SourceError(f"{graph.path}: the graph has no nodes")
    if graph.labels is not None:
        labels = graph.labels
        if labels.shape != (graph.num_nodes,):
            raise SourceError(
                f"{_where(graph, 'labels')}: labels have shape {labels.shape}, "
                f"expected ({graph.num_nodes},) (one per node)"
            )
        bad = np.flatnonzero((labels < -1) | (labels >= max(graph.num_classes, 0)))
        if len(bad):
            raise SourceError(
                f"{_where(graph, 'labels')}: label {labels[bad[0]]} of node {bad[0]} is "
                f"outside [-1, {graph.num_classes})"
            )


# ---------------------------------------------------------------------------- edges in


def _stage_edges(graph: SourceGraph, work: Path, opts: ConvertOptions) -> tuple[StagedEdges, dict]:
    """Parse the source edges once into flat files: validated, self loops handled,
    reverse edges added for an undirected source."""
    n = graph.num_nodes
    with_rel = graph.num_relations > 0
    keep_loops = _keeps_self_loops(graph, opts)
    with EdgeStager(str(work / "staged"), num_nodes=n, with_rel=with_rel) as stager:
        source_edges = 0
        self_loops = 0
        with _bar(None, "edges", opts.progress) as bar:
            for chunk in graph.edges():
                src, dst, rel = _checked_edge_chunk(graph, chunk, source_edges)
                source_edges += len(src)
                loop = src == dst
                loops_here = int(loop.sum())
                self_loops += loops_here
                if loops_here and not keep_loops:
                    keep = ~loop
                    src, dst = src[keep], dst[keep]
                    rel = None if rel is None else rel[keep]
                    loop = np.zeros(len(src), dtype=bool)
                stager.append(src, dst, rel)
                if not graph.directed:
                    # A self loop is its own reverse: adding it again would be a duplicate.
                    rev = ~loop
                    stager.append(dst[rev], src[rev], None if rel is None else rel[rev])
                bar.update(len(src))
        staged = stager.finish()
    if staged.num_edges == 0:
        raise SourceError(
            f"{_where(graph, 'edges')}: the graph has no edges"
            + (f" after dropping {self_loops} self loops" if self_loops else "")
        )
    counts = {
        "source_edges": source_edges,
        "self_loops": self_loops,
        "self_loops_dropped": 0 if keep_loops else self_loops,
        "staged_edges": staged.num_edges,
    }
    return staged, counts


def _keeps_self_loops(graph: SourceGraph, opts: ConvertOptions) -> bool:
    if opts.keep_self_loops is not None:
        return opts.keep_self_loops
    return graph.num_relations > 0  # a triple (x, r, x) is a fact, not noise


def _checked_edge_chunk(graph: SourceGraph, chunk, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The chunk's arrays as int64, after checking lengths, node ids and relation ids.

    ``offset`` is the index of the chunk's first edge in the source, for error messages.
    """
    src = np.asarray(chunk.src, dtype=np.int64)
    dst = np.asarray(chunk.dst, dtype=np.int64)
    rel = None if chunk.rel is None else np.asarray(chunk.rel, dtype=np.int64)
    where = _where(graph, "edges")
    if len(src) != len(dst) or (rel is not None and len(rel) != len(src)):
        lengths = f"src {len(src)}, dst {len(dst)}" + (f", rel {len(rel)}" if rel is not None else "")
        raise SourceError(f"{where}: edge arrays of different lengths ({lengths})")
    _check_ids(graph, src, dst, offset)
    if graph.num_relations > 0:
        if rel is None:
            raise SourceError(f"{where}: edges lack relation ids")
        bad = np.flatnonzero((rel < 0) | (rel >= graph.num_relations))
        if len(bad):
            raise SourceError(f"{where} {graph.describe_edge(offset + int(bad[0]))}: "
                              f"relation {rel[bad[0]]} outside [0, {graph.num_relations})")
    return src, dst, rel


def _check_ids(graph: SourceGraph, src: np.ndarray, dst: np.ndarray, offset: int) -> None:
    n = graph.num_nodes
    for name, ids in (("source", src), ("destination", dst)):
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if len(bad):
            raise SourceError(
                f"{_where(graph, 'edges')} {graph.describe_edge(offset + int(bad[0]))}: "
                f"{name} node id {ids[bad[0]]} out of range [0, {n})"
            )


def _choose_num_partitions(graph: SourceGraph, staged: StagedEdges, opts: ConvertOptions) -> tuple[int, str]:
    n = graph.num_nodes
    if opts.num_partitions is not None:
        if not 1 <= opts.num_partitions <= n:
            raise ConfigError(f"--partitions must be in [1, {n}] (the number of nodes) (got {opts.num_partitions})")
        return opts.num_partitions, "--partitions"
    target = opts.partition_bytes or DEFAULT_PARTITION_BYTES
    if target <= 0:
        raise ConfigError(f"--partition-bytes must be positive (got {target})")
    row_bytes = graph.feature_dim * 4 if graph.features is not None else 0
    index_bytes = np.dtype(index_dtype_for(n)).itemsize
    total = n * row_bytes + staged.num_edges * 2 * index_bytes
    p = int(min(max(1, math.ceil(total / target)), MAX_DEFAULT_PARTITIONS, n))
    source = "--partition-bytes" if opts.partition_bytes else "default"
    return p, f"{source}: ceil({total} bytes / {target}) capped at [1, {min(n, MAX_DEFAULT_PARTITIONS)}]"


# ---------------------------------------------------------------------------- store out


class _Layout:
    """The open output group and the chunking every writer agrees on."""

    def __init__(self, root: zarr.Group, n: int, p: int, partition_size: int, idx: str, compress: bool):
        self.root, self.n, self.p, self.partition_size = root, n, p, partition_size
        self.idx, self.compress = idx, compress
        self.node_rows_1d = chunk_rows_for(partition_size, 8, n)
        self.edge_chunk = (4 << 20) // np.dtype(idx).itemsize
        self.feature_rows = 0

    def node_array(self, name: str, values: np.ndarray) -> None:
        arr = new_array(self.root, name, shape=values.shape, dtype=values.dtype,
                        chunks=(self.node_rows_1d, *values.shape[1:]), compress=self.compress)
        arr[...] = values

    def array(self, name: str, shape: tuple[int, ...], dtype, chunks: tuple[int, ...]) -> zarr.Array:
        return new_array(self.root, name, shape=shape, dtype=dtype, chunks=chunks, compress=self.compress)

    def chunk_summary(self) -> dict[str, int]:
        return {"node_rows": self.feature_rows, "node_rows_1d": self.node_rows_1d, "edges": self.edge_chunk}


def _write_node_arrays(layout: _Layout, graph: SourceGraph, orig_id: np.ndarray, store_id: np.ndarray) -> None:
    layout.node_array("nodes/orig_id", orig_id.astype(layout.idx, copy=False))
    layout.node_array("nodes/store_id", store_id.astype(layout.idx, copy=False))
    if graph.labels is not None:
        layout.node_array("nodes/labels", np.asarray(graph.labels)[orig_id].astype(np.int32))
    if graph.node_names is not None:
        names = np.asarray(graph.node_names, dtype=str)[orig_id]
        arr = new_array(layout.root, "nodes/name", shape=names.shape, dtype=str,
                        chunks=(layout.node_rows_1d,), compress=layout.compress)
        arr[...] = names


def _write_features(layout: _Layout, graph: SourceGraph, store_id: np.ndarray, work: Path,
                    opts: ConvertOptions) -> str | None:
    """Stream feature rows into ``nodes/features`` in store order.

    Rows arrive in source order. Unless the store order is the source order, each chunk is
    scattered into a staging file laid out like the store: the rows a chunk sends to one
    partition are the next contiguous run of that partition (rows inside a partition keep
    source order), so a chunk costs one write per partition it touches. The staging file is
    then copied in store order into chunk-aligned Zarr writes.
    """
    if graph.features is None or graph.feature_dim == 0:
        return None
    n, d = graph.num_nodes, graph.feature_dim
    identity = bool(np.array_equal(store_id, np.arange(n)))
    appender: ChunkedAppender | None = None
    staging: _ScatterBuffer | None = None
    dtype = np.dtype(np.float32)
    seen = 0
    try:
        with _bar(n, "features", opts.progress) as bar:
            for chunk in graph.features():
                chunk = _checked_feature_chunk(graph, np.asarray(chunk), seen)
                if appender is None:
                    # float16 sources stay float16 (papers100M ships them); the rest is float32.
                    dtype = np.dtype(np.float16) if chunk.dtype == np.float16 else np.dtype(np.float32)
                    layout.feature_rows = chunk_rows_for(layout.partition_size, d * dtype.itemsize, n)
                    appender = ChunkedAppender(layout.array("nodes/features", (n, d), dtype,
                                                            (layout.feature_rows, d)))
                    if not identity:
                        scratch = ScratchFile(str(work / "features.stage"), dtype, row_width=d)
                        staging = _ScatterBuffer(scratch, layout.p, d * dtype.itemsize)
                chunk = chunk.astype(dtype, copy=False)
                if staging is None:
                    appender.append(chunk)
                else:
                    staging.add(store_id[seen : seen + len(chunk)], chunk)
                seen += len(chunk)
                bar.update(len(chunk))
        if staging is not None:
            staging.flush()
        if seen != n:
            raise SourceError(f"{_where(graph, 'features')}: {seen} feature rows, expected {n} (one per node)")
        if staging is not None:
            rows = layout.feature_rows
            for start in range(0, n, rows):
                appender.append(staging.scratch.read_rows(start, min(rows, n - start)))
        appender.finish()
    finally:
        if staging is not None:
            staging.scratch.close(remove=True)
    return dtype.name


def _checked_feature_chunk(graph: SourceGraph, chunk: np.ndarray, seen: int) -> np.ndarray:
    """The chunk, after checking its width, the row count so far, and finiteness."""
    n, d = graph.num_nodes, graph.feature_dim
    where = _where(graph, "features")
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


def _write_edges(layout: _Layout, staged: StagedEdges, store_id: np.ndarray, work: Path,
                 opts: ConvertOptions) -> tuple[int, int]:
    """Group the staged edges by destination partition on disk, then, one destination
    partition at a time, sort them into buckets and merge duplicates.

    Returns ``(num_edges, cut_edges)`` of the stored edges.
    """
    p, size, n = layout.p, layout.partition_size, layout.n
    with_rel = staged.rel_path is not None
    names = ["src", "dst", "rel"] if with_rel else ["src", "dst"]

    # Edges into each partition, known from staging: partition j's group starts at starts[j].
    in_count = staged.in_count
    if in_count is None:
        raise ValueError("staged edges lack in_count")  # EdgeStager always sets it
    per_partition = np.bincount(store_id // size, weights=in_count, minlength=p).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(per_partition)])
    scratch = {k: ScratchFile(str(work / f"grouped_{k}.i64"), np.int64) for k in names}
    try:
        # Pass 1: a counting-sort scatter by destination partition, in store ids.
        cursor = starts[:-1].copy()
        for _, src, dst, rel in staged.iter_chunks(opts.chunk_edges):
            s, d = store_id[src], store_id[dst]
            part = d // size
            # A stable sort of small integers is a radix sort in numpy: O(m), not O(m log m).
            order = np.argsort(part.astype(np.uint16) if p <= 1 << 16 else part, kind="stable")
            counts = np.bincount(part, minlength=p)
            columns = {"src": s[order], "dst": d[order], "rel": None if rel is None else rel[order]}
            first = 0
            for j in np.flatnonzero(counts).tolist():
                stop = first + int(counts[j])
                for k in names:
                    scratch[k].write_rows(int(cursor[j]), columns[k][first:stop])
                cursor[j] += counts[j]
                first = stop
        for f in scratch.values():
            f.drop_cache()
        # Pass 2: per destination partition, sort by (src partition, dst, src[, rel]),
        # merge duplicates, append to the store.
        return _sort_groups_into_store(layout, scratch, starts, with_rel, opts.keep_duplicates)
    finally:
        for f in scratch.values():
            f.close(remove=True)


def _sort_group(s: np.ndarray, d: np.ndarray, r: np.ndarray | None, *, first: int, size: int, n: int,
                keep_duplicates: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sort one destination partition's edges by (src partition, dst, src[, rel]) and, unless
    kept, drop repeats. [m] int64 each in, the same (shorter) out.

    Without relations the three keys pack into one int64, ``(src // size, dst - first, src)``
    in mixed radix (src // size is implied by src, so ``(dst - first) * n + src`` with the
    partition on top), and one sort beats a three-key lexsort by a wide margin.
    """
    if r is None and (n // size + 1) * size * n < 2**62:
        key = ((s // size) * size + (d - first)) * n + s
        key.sort()
        if not keep_duplicates and len(key) > 1:
            key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        s = key % n
        d = (key // n) % size + first
        return s, d, None
    order = np.lexsort((s, d, s // size) if r is None else (r, s, d, s // size))
    s, d = s[order], d[order]
    r = None if r is None else r[order]
    if not keep_duplicates and len(s) > 1:
        new = np.ones(len(s), dtype=bool)
        new[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
        if r is not None:
            new[1:] |= r[1:] != r[:-1]
        s, d = s[new], d[new]
        r = None if r is None else r[new]
    return s, d, r


def _sort_groups_into_store(layout: _Layout, scratch: dict[str, ScratchFile], starts: np.ndarray,
                            with_rel: bool, keep_duplicates: bool) -> tuple[int, int]:
    p, size, n, idx = layout.p, layout.partition_size, layout.n, layout.idx
    total = int(starts[-1])
    out = {
        "src": ChunkedAppender(layout.array("edges/src", (total,), idx, (layout.edge_chunk,))),
        "dst": ChunkedAppender(layout.array("edges/dst", (total,), idx, (layout.edge_chunk,))),
    }
    if with_rel:
        out["rel"] = ChunkedAppender(layout.array("edges/rel", (total,), "int32", (layout.edge_chunk,)))
    in_degree = np.zeros(n, dtype=np.int64)
    out_degree = np.zeros(n, dtype=np.int64)
    offsets = np.zeros(p * p + 1, dtype=np.int64)
    stored = cut = 0
    for j in range(p):
        lo, count = int(starts[j]), int(starts[j + 1] - starts[j])
        s = scratch["src"].read_rows(lo, count)
        d = scratch["dst"].read_rows(lo, count)
        r = scratch["rel"].read_rows(lo, count) if with_rel else None
        s, d, r = _sort_group(s, d, r, first=j * size, size=size, n=n, keep_duplicates=keep_duplicates)
        bucket_sizes = np.bincount(s // size, minlength=p)
        offsets[j * p + 1 : (j + 1) * p + 1] = stored + np.cumsum(bucket_sizes)
        stored += len(s)
        cut += len(s) - int(bucket_sizes[j])
        first = j * size
        in_degree[first : first + size] += np.bincount(d - first, minlength=min(size, n - first))
        np.add.at(out_degree, s, 1)  # unbuffered: a source repeats within the group
        out["src"].append(s.astype(idx))
        out["dst"].append(d.astype(idx))
        if r is not None:
            out["rel"].append(r.astype(np.int32))
    for appender in out.values():
        appender.finish()
    layout.node_array("nodes/in_degree", in_degree)
    layout.node_array("nodes/out_degree", out_degree)
    offsets_arr = layout.array("edges/bucket_offsets", (p * p + 1,), "int64", ((4 << 20) // 8,))
    offsets_arr[...] = offsets
    return stored, cut


# ---------------------------------------------------------------------------- splits


def _write_splits(layout: _Layout, graph: SourceGraph, store_id: np.ndarray) -> tuple[dict[str, int], dict[str, str]]:
    n = graph.num_nodes
    counts: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for name, ids in graph.node_splits.items():
        where = _where(graph, f"split:{name}")
        ids = _checked_ids(np.asarray(ids), n, where, "node id")
        uniq = unique(store_id[ids])
        if len(uniq) != len(ids):
            log.warning("%s: %d repeated node ids merged", where, len(ids) - len(uniq))
        layout.node_array(f"splits/nodes/{name}", uniq.astype(layout.idx))
        counts[name], kinds[name] = len(uniq), "nodes"
    for name, split in graph.edge_splits.items():
        if name in counts:
            raise SourceError(f"{graph.path}: split {name!r} is both a node split and an edge split")
        _write_edge_split(layout, graph, name, split, store_id)
        counts[name], kinds[name] = len(split.src), "edges"
    return counts, kinds


def _checked_ids(ids: np.ndarray, n: int, where: str, what: str) -> np.ndarray:
    ids = ids.astype(np.int64, copy=False)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if len(bad):
        raise SourceError(f"{where}: {what} {ids[bad[0]]} at position {bad[0]} is outside [0, {n}) (unknown node)")
    return ids


def _write_edge_split(layout: _Layout, graph: SourceGraph, name: str, split: EdgeSplit, store_id: np.ndarray) -> None:
    n = graph.num_nodes
    where = _where(graph, f"split:{name}")
    base = f"splits/edges/{name}"
    if len(split.src) != len(split.dst) or (split.rel is not None and len(split.rel) != len(split.src)):
        raise SourceError(f"{where}: positive edges have mismatched lengths (src {len(split.src)}, dst {len(split.dst)})")
    parts = {
        "src": store_id[_checked_ids(np.asarray(split.src), n, where, "source node")],
        "dst": store_id[_checked_ids(np.asarray(split.dst), n, where, "destination node")],
    }
    if split.neg_dst is not None:
        neg_dst = np.asarray(split.neg_dst)
        if split.neg_src is not None:
            if len(split.neg_src) != len(neg_dst) or neg_dst.ndim != 1:
                raise SourceError(f"{where}: negative edges have mismatched lengths "
                                  f"(neg_src {len(split.neg_src)}, neg_dst {len(neg_dst)})")
            parts["neg_src"] = store_id[_checked_ids(np.asarray(split.neg_src), n, where, "negative source node")]
        elif neg_dst.ndim != 2 or len(neg_dst) != len(split.src):
            raise SourceError(f"{where}: per-positive negatives have shape {neg_dst.shape}, "
                              f"expected ({len(split.src)}, k)")
        parts["neg_dst"] = store_id[_checked_ids(neg_dst, n, where, "negative destination node")]
    for key, values in parts.items():
        values = values.astype(layout.idx)
        rows = max(1, (4 << 20) // max(1, values.itemsize * int(np.prod(values.shape[1:]))))
        arr = layout.array(f"{base}/{key}", values.shape, values.dtype, (rows, *values.shape[1:]))
        arr[...] = values
    if split.rel is not None:
        rel = np.asarray(split.rel).astype(np.int32)
        bad = np.flatnonzero((rel < 0) | (rel >= max(graph.num_relations, 1)))
        if len(bad):
            raise SourceError(f"{where}: relation {rel[bad[0]]} at position {bad[0]} outside [0, {graph.num_relations})")
        arr = layout.array(f"{base}/rel", rel.shape, "int32", (1 << 20,))
        arr[...] = rel
