"""`graphstore convert`: a source dataset in, a format-v1 store out, streaming and atomic.

The stages, in the order `_build` runs them::

    read_source ─> stage edges (validate ids, drop self loops, add reverse edges)
                ─> choose p ─> partition nodes ─> store order (equal blocks)
                ─> node arrays                          (_writer)
                ─> features, staged per partition       (_features)
                ─> edge buckets, sorted and merged      (_buckets)
                ─> splits                               (_writer)
                ─> bucket and partition checksums       (_segments)
                ─> manifest ─> rename the temporary directory into place

Memory is bounded by the chunk settings, not by the dataset: features and edges stream
through scratch files, and every per-node array (labels, splits, in-counts, partition
labels, the two id maps, degrees) is a file-backed array in the work directory, read and
written a chunk at a time, so the page cache holds it while it fits and gives it back
when it does not. Two partitioners are the exception by nature: ``stream`` keeps O(N)
node state plus a budget (``partition_memory_bytes``) and METIS the whole graph (the
default switches to ``stream`` above `METIS_AUTO_MAX_EDGES`); ``random`` and
``sequential`` are chunked.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from graphstore._memory import available_memory
from graphstore._version import __version__
from graphstore.errors import ConfigError, SourceError, StoreExistsError, StoreWriteError
from graphstore.layout._buckets import write_edges
from graphstore.layout._durable import exchange, fsync_dir, fsync_tree
from graphstore.layout._features import write_features
from graphstore.layout._hubs import DEFAULT_HUB_FRACTION, write_hubs
from graphstore.layout._lock import StoreLock
from graphstore.layout._progress import progress_bar
from graphstore.layout._segments import write_segment_checksums
from graphstore.layout._staging import NODE_CHUNK, EdgeStager, StagedEdges
from graphstore.layout._writer import StoreWriter, write_node_arrays, write_splits
from graphstore.layout.base import FORMAT_VERSION, MANIFEST_KEY, Manifest, index_dtype_for
from graphstore.layout.partition import partition_nodes, store_order
from graphstore.layout.sources.base import SourceGraph
from graphstore.units import jsonable

__all__ = ["ConvertOptions", "convert"]

log = logging.getLogger(__name__)

DEFAULT_PARTITION_BYTES = 4 << 20
"""A partition of about this many bytes of features + edges is one efficient disk request
(HierBatching's rule); the default p is total bytes over this."""
MIN_PARTITION_NODES = 4096
"""Floor of the default partition size in nodes, beside the byte rule: a partition should
hold whole neighbourhoods (a 2-hop sample at fanouts 15,10 reaches ~150 nodes), or a
partition-based scheme loses most of a target's neighbours to the cut. Without it a small,
wide graph (34k nodes, 8,415 features: 33 KiB a row) became 279 partitions of 124 nodes
with 88.5 % of its edges cut."""
MAX_DEFAULT_PARTITIONS = 1024
"""Bound on the default p: bucket_offsets has p*p+1 entries."""
METIS_AUTO_MAX_EDGES = 50_000_000
"""``partitioner=None`` picks METIS up to this many staged edges (and while it fits in
memory, `METIS_BYTES_PER_EDGE`), ``stream`` above it."""
METIS_BYTES_PER_EDGE = 128
"""What METIS's partition phase takes per staged edge, for the default's memory check:
measured 3,436 MiB at 29.4M staged edges and 2,992 MiB at 31.5M (117 and 100 bytes, the
converter's own state included; `tools/bench_scale.py`), and OOM-killed under a 4 GiB cap
at 45.9M."""


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
    """``metis``, ``random``, ``sequential``, ``stream``; None: METIS when it fits, else stream."""
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
    partition_memory_bytes: int | None = None
    """Memory budget of the ``stream`` partitioner (24 bytes per node of it is node state);
    None: 1 GiB, or more when the nodes need it. The other partitioners ignore it."""
    reader_options: dict[str, Any] = field(default_factory=dict)
    """Passed to the source reader (``directed``, ``features``, ``labels``, ``root``...)."""
    progress: bool | None = None
    """tqdm bars: None shows them only on a terminal."""
    hub_fraction: float = DEFAULT_HUB_FRACTION
    """Fraction of nodes (highest degree) in the hub group, HierBatching's static cache
    (`graphstore.layout._hubs`); 0 writes none."""
    feature_dtype: str | None = None
    """``"float32"``, ``"float16"`` or ``"bfloat16"`` (stored as uint16 bit patterns,
    `graphstore.layout.dtypes`): each feature chunk is cast as it streams. None: the
    source's (float16 stays float16, the rest float32)."""


def convert(source: str | os.PathLike | SourceGraph, out: str | os.PathLike,
            options: ConvertOptions | None = None) -> Manifest:
    """Convert ``source`` into a store at ``out`` and return its manifest.

    ``source`` is a path (its format detected, or ``options.format``) or a `SourceGraph`
    built in memory, which is how user code and tests hand over data of their own.

    The store is built in a hidden temporary directory beside ``out``, every file and
    directory of it fsynced, and renamed into place only when complete (then the parent
    directory is fsynced), so an error or a kill part-way leaves ``out`` as it was and a
    finished store survives a power cut. Replacing a store (``overwrite``) holds its
    exclusive lock from the start, so a store some process has open is refused at once.

    Raises
    ------
    StoreExistsError
        ``out`` exists and ``options.overwrite`` is false (nothing is read or written).
    StoreLockedError
        ``overwrite`` of a store that another process has open.
    StoreWriteError
        The disk filled up (or another write failed); the temporary directory is removed.
    SourceError
        The source is missing or malformed; the message names the file and the line.
    ConfigError
        An option that cannot work (p > N, unknown partitioner).
    """
    opts = options or ConvertOptions()
    out_path = Path(out).absolute()
    # First: a store a killed `--overwrite` moved aside is put back before anything else.
    _remove_stale_temporaries(out_path)
    if out_path.exists() and not opts.overwrite:
        raise StoreExistsError(f"{out_path}: already exists (pass --overwrite to replace it)")
    # Nobody may have the old store open while it is replaced; refuse now, not at the end.
    lock = StoreLock(out_path, mode="replace") if opts.overwrite and out_path.is_dir() else None
    try:
        tmp = out_path.parent / f".{out_path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            manifest = _build(source if isinstance(source, SourceGraph) else Path(source), tmp, opts)
            fsync_tree(tmp)
            _move_into_place(tmp, out_path, overwrite=opts.overwrite)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno == errno.ENOSPC:
                raise StoreWriteError(f"{out_path}: no space left on device in {out_path.parent} while "
                                      "converting; nothing was written (the partial store was removed)") from exc
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        if lock is not None:
            lock.release()
    return manifest


def _remove_stale_temporaries(out_path: Path) -> None:
    """Delete temporaries of earlier conversions to this output whose process is gone.

    One exception: an ``.old`` directory (a replaced store, kept until the new one is in
    place) of a dead process while no store is at ``out_path`` means that process died
    between its two renames (only where an atomic exchange was not available): that is
    the store the user had, so it is put back, not deleted.
    """
    if not out_path.parent.is_dir():
        return
    for entry in sorted(out_path.parent.glob(f".{out_path.name}.tmp-*")):
        pid_text = entry.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        try:
            os.kill(int(pid_text), 0)
        except (ValueError, ProcessLookupError):
            if entry.name.endswith(".old") and not out_path.exists():
                os.replace(entry, out_path)
                log.warning("%s: restored the store a killed `convert --overwrite` had moved aside", out_path)
                continue
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _move_into_place(tmp: Path, out_path: Path, *, overwrite: bool) -> None:
    if out_path.exists():
        if not overwrite:  # appeared while we converted
            raise StoreExistsError(f"{out_path}: already exists (pass --overwrite to replace it)")
        if exchange(tmp, out_path):
            # One atomic step: out_path is the old store or the new one at every moment;
            # tmp now holds the old one (a kill before the rmtree leaves it as a stale
            # temporary, which the next conversion deletes).
            fsync_dir(out_path.parent)
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
            return
        old = tmp.with_name(tmp.name + ".old")
        os.replace(out_path, old)
        os.replace(tmp, out_path)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        os.replace(tmp, out_path)
    fsync_dir(out_path.parent)


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


def _build(source: Path | SourceGraph, tmp: Path, opts: ConvertOptions) -> Manifest:
    hub_fraction = opts.hub_fraction
    if isinstance(hub_fraction, bool) or not isinstance(hub_fraction, (int, float)) or not 0 <= hub_fraction <= 1:
        raise ConfigError(f"--hub-fraction must be in [0, 1] (got {hub_fraction!r})")
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
    # Past METIS's reach the default is stream (METIS on a coarsened graph): close to METIS's
    # cut on graphs with communities (1.06x at 7.3M nodes, tools/bench_partition.py), where
    # random partitions lose the neighbourhoods mega-batches need, in memory bounded by
    # partition_memory_bytes.
    if opts.partitioner:
        method, method_rule = opts.partitioner, "--partitioner"
    elif graph.features is None:
        # A graph without features trains learnable embeddings (link prediction), whose
        # batches read their endpoints' and negatives' rows, not neighbourhoods: METIS's
        # communities buy nothing, and they make a disk epoch's states train far-from-average
        # parts of the graph in turn. At 16 partitions METIS left disk training 1.9 points of
        # MRR under in-memory training on an FB15k-237-shaped knowledge graph, random
        # partitions none; on ogbl-ddi at 4 of 8 partitions, valid Hits@20 0.17 against 0.30 in
        # memory, random partitions 0.22 (docs/benchmarks.md, "Link prediction"). MariusGNN's
        # choice for its embedding training.
        method, method_rule = "random", "default for a graph without features (learnable embeddings; MariusGNN's)"
    else:
        available, source = available_memory()
        need = staged.num_edges * METIS_BYTES_PER_EDGE
        method = "metis" if staged.num_edges <= METIS_AUTO_MAX_EDGES and need <= available else "stream"
        method_rule = (f"default: metis up to {METIS_AUTO_MAX_EDGES} edges while its {METIS_BYTES_PER_EDGE} bytes "
                       f"an edge ({need / 2**20:.0f} MiB) fit the {available / 2**20:.0f} MiB this process may "
                       f"use ({source}), else stream")
    with _phase("partition", timings):
        part = partition_nodes(method, edges=staged, num_partitions=p, seed=opts.seed,
                               chunk_edges=opts.chunk_edges,
                               partition_memory_bytes=opts.partition_memory_bytes)
        # Store order: by (partition, source id), cut into equal blocks, rows inside a
        # partition in source order (feature rows can then be appended per partition as
        # the source streams them). Both id maps are file-backed, in the index dtype.
        idx = index_dtype_for(graph.num_nodes)
        orig_id, store_id, partition_size = store_order(part.labels, p, out_dir=str(work / "nodes"),
                                                         dtype=idx)
        partition_info = part.info
        del part  # its [N] labels: the store order replaces them

    layout = StoreWriter(root, graph.num_nodes, p, partition_size, idx, opts.compress)
    with _phase("write nodes", timings):
        write_node_arrays(layout, graph, orig_id, store_id)
    with _phase("write features", timings):
        feature_dtype = write_features(layout, graph, store_id, work, opts.progress, opts.feature_dtype)
    with _phase("write edges", timings):
        stored = write_edges(layout, staged, store_id, work, opts.chunk_edges, opts.keep_duplicates, consume=True)
        num_edges, cut_edges = stored.num_edges, stored.cut_edges
    with _phase("write splits", timings):
        split_counts, split_kinds = write_splits(layout, graph, store_id, work)
    with _phase("hubs", timings):
        write_hubs(tmp, fraction=opts.hub_fraction, num_nodes=graph.num_nodes, num_partitions=p,
                   partition_size=partition_size)
    with _phase("segment checksums", timings):
        # Read back through the chunks' own checksums, so the tables describe verified data.
        write_segment_checksums(tmp, num_partitions=p, partition_size=partition_size)

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
        split_origin=jsonable(graph.split_origin),
        source={
            "name": graph.name,
            "format": graph.format,
            "path": str(graph.path),
            "files": {k: str(v) for k, v in graph.files.items()},
            "extra": jsonable(graph.extra),
        },
        partitioner={
            "method": method,
            "requested": opts.partitioner or "auto",
            "seed": opts.seed,
            "num_partitions_rule": p_rule,
            "method_rule": method_rule,
            "edge_cut": cut_edges / num_edges if num_edges else 0.0,
            "cut_edges": int(cut_edges),
            "info": jsonable(partition_info),
        },
        # Merging counts a source's repeats as duplicates, never the reverses an undirected
        # conversion adds: a source listing both directions is told so, not given millions
        # of "duplicates" (num_edges == source_edges - self_loops_dropped - duplicates_merged
        # + reverse_edges_added).
        conversion={**edge_counts, "duplicates": stored.duplicates,
                    "duplicates_merged": stored.duplicates_merged,
                    "reverse_edges_present": stored.reverse_edges_present,
                    "reverse_edges_added": stored.reverse_edges_added,
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


def _check_source_shape(graph: SourceGraph) -> None:
    """Checks every format shares: sizes that agree, labels in range."""
    if graph.num_nodes <= 0:
        raise SourceError(f"{graph.path}: the graph has no nodes")
    if graph.labels is not None:
        labels = graph.labels
        if labels.shape != (graph.num_nodes,):
            raise SourceError(
                f"{graph.where('labels')}: labels have shape {labels.shape}, "
                f"expected ({graph.num_nodes},) (one per node)"
            )
        for start in range(0, graph.num_nodes, NODE_CHUNK):
            chunk = np.asarray(labels[start : start + NODE_CHUNK])
            bad = np.flatnonzero((chunk < -1) | (chunk >= max(graph.num_classes, 0)))
            if len(bad):
                raise SourceError(
                    f"{graph.where('labels')}: label {chunk[bad[0]]} of node {start + bad[0]} is "
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
        with progress_bar(None, "edges", opts.progress) as bar:
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
                    stager.append(dst[rev], src[rev], None if rel is None else rel[rev], added_reverse=True)
                bar.update(len(src))
        staged = stager.finish()
    if staged.num_edges == 0:
        raise SourceError(
            f"{graph.where('edges')}: the graph has no edges"
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
    where = graph.where("edges")
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
                f"{graph.where('edges')} {graph.describe_edge(offset + int(bad[0]))}: "
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
    if opts.partition_bytes:  # the user's size in bytes is taken as given
        most = min(n, MAX_DEFAULT_PARTITIONS)
        p = int(min(max(1, math.ceil(total / target)), most))
        return p, f"--partition-bytes: ceil({total} bytes / {target}) capped at [1, {most}]"
    most = max(1, min(MAX_DEFAULT_PARTITIONS, n // MIN_PARTITION_NODES))
    p = int(min(max(1, math.ceil(total / target)), most))
    return p, (f"default: ceil({total} bytes / {target}) capped at [1, {most}] (at least {MIN_PARTITION_NODES} "
               f"nodes a partition, at most {MAX_DEFAULT_PARTITIONS} partitions)")


