"""Exact full-graph inference out of core: every layer for every node, with all neighbours,
one edge bucket at a time.

Each layer runs in two passes over the store (the partial form of `graphstore.nn.layers`:
``partial_sources/begin/update/finish``; SAR, section 3.2):

1. **Prepare**, one sequential pass: partition k's layer input (the store's features for the
   first layer, the previous layer's output after) is read once and turned into what the
   aggregation needs of it, its *prepared sources* (SAGE and GCN: the projected, normalised
   messages; GAT: the projection and the source scores; GIN: the rows; RGCN: the rows under
   every basis) and its destinations' opening *accumulator* (the self terms). Both go to the
   work directory, checksummed. Nothing later needs the layer input: when a layer narrows
   the rows (256 features to 32 hidden units), the second pass moves the narrow rows only.
2. **Aggregate**, a link-prediction walk over the partitions (BETA: ``c`` partitions
   resident, one swap per state, every bucket (i, j) in exactly one state where i and j are
   both resident): bucket (i, j) adds partition i's prepared sources to partition j's
   accumulator. An accumulator is read in with its partition and written back when the
   partition leaves before all its in-buckets are done, as the buffer writes embeddings
   back. After its last in-bucket the partition is finished (the layer's output function,
   then the activation) and written to the next layer's scratch array (checksummed per
   partition).

Both passes read one step ahead in a background thread (the next partition; the next
state's admitted partitions and its buckets, contiguous buckets in one request), so the
disk works while the CPU aggregates. The capacity ``c`` is chosen per layer from a byte
budget and that layer's prepared widths, so narrow layers hold more partitions and re-read
less; memory is bounded by the budget, not by the graph.

Where this departs from the issue's design, and why: the walk reads partitions and buckets
through the store's verified reads (`Store.read_many`) and its own scratch files rather
than through `BufferManager`, because the buffer's slots hold the store's feature array
and this walk's rows are a different array every layer; the plan (`plan_epoch`), the slot
assignment (`assign_slots`, prefetch included), the coalesced bucket reads, the write-back
and the byte accounting are the buffer's. And the walk re-reads prepared sources, not the
layer input the issue names: the same result, fewer bytes (the first layer's 256-wide
features are read once per layer instead of once per admission).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Self

import numpy as np
import torch

from graphstore.buffer.manager import _bucket_spans
from graphstore.buffer.policies import plan_epoch
from graphstore.buffer.slots import assign_slots, slots_needed
from graphstore.errors import ConfigError, CorruptStoreError
from graphstore.layout.store import Store
from graphstore.nn import GNN, PartialAggregate, PartialSources

__all__ = ["InferenceStats", "ScratchRows", "infer_layerwise", "min_buffer_bytes"]

EDGE_SHARE = 0.25
"""The share of the byte budget a walk gives to edges in flight (the rest holds slots of
prepared rows and accumulators): a state's buckets are taken in pieces of at most that many
bytes, so a large first state does not shrink the capacity of every state."""

INDEX_BYTES = 32
"""Bytes per edge besides its stored ids while a piece is filed: int64 source and
destination rows, and their concatenation."""


@dataclass
class InferenceStats:
    """What one `infer_layerwise` call read, wrote and held."""

    bytes_read: int = 0
    """Input rows, degrees, prepared sources, accumulators read back, buckets."""
    bytes_written: int = 0
    """Prepared sources, accumulators written out and layer outputs."""
    planned_bytes: int = 0
    """What the plan says must be read: per layer, every partition's input rows and degrees
    once, then every admitted partition's prepared sources and every non-empty bucket
    (accumulators read back come on top)."""
    spill_bytes: int = 0
    """Accumulators written out: the opening ones, and those whose partition left before its
    last in-bucket."""
    max_resident_partitions: int = 0
    """Most partitions aggregated together in a state (at most the capacity; with prefetch
    the next state's admission is being read besides)."""
    capacities: list[int] = field(default_factory=list)
    """Partitions resident per state, per layer."""
    seconds: float = 0.0
    per_layer_seconds: list[float] = field(default_factory=list)


class ScratchRows:
    """A float32 [N, *shape] array in a ``.npy`` file, written and read a partition at a time
    with positioned IO, each partition's bytes checked against the CRC-32 recorded when it
    was written."""

    def __init__(self, path: Path, num_rows: int, width: int | tuple[int, ...], partition_size: int) -> None:
        shape = (width,) if isinstance(width, int) else tuple(width)
        self.path, self.num_rows, self.shape, self.partition_size = path, num_rows, shape, partition_size
        self.row_bytes = 4 * math.prod(shape)
        header = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_rows, *shape))
        self.offset = header.offset
        del header
        self.fd = os.open(path, os.O_RDWR)
        self.crc: dict[int, int] = {}

    def _span(self, k: int) -> tuple[int, int]:
        start = k * self.partition_size
        return start, min(start + self.partition_size, self.num_rows)

    def write(self, k: int, rows: np.ndarray) -> int:
        start, stop = self._span(k)
        block = np.ascontiguousarray(rows, dtype=np.float32)
        if block.shape != (stop - start, *self.shape):
            raise ConfigError(f"{self.path}: partition {k} needs rows of shape {[stop - start, *self.shape]} "
                              f"(got {list(block.shape)})")
        os.pwrite(self.fd, memoryview(block).cast("B"), self.offset + start * self.row_bytes)
        self.crc[k] = zlib.crc32(block)
        return block.nbytes

    def read(self, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """Partition k's rows, into ``out`` (C-contiguous float32, its rows) when given."""
        if k not in self.crc:
            raise ConfigError(f"{self.path}: partition {k} was never written")
        start, stop = self._span(k)
        block = np.empty((stop - start, *self.shape), dtype=np.float32) if out is None else out
        view, pos, done = memoryview(block).cast("B"), self.offset + start * self.row_bytes, 0
        while done < view.nbytes:  # a positioned read may return short
            got = os.preadv(self.fd, [view[done:]], pos + done)
            if got == 0:
                raise CorruptStoreError(f"{self.path}: rows of partition {k} are cut short")
            done += got
        if zlib.crc32(block) != self.crc[k]:
            raise CorruptStoreError(f"{self.path}: rows of partition {k} fail their checksum")
        return block

    def rows(self) -> np.ndarray:
        """The whole array, memory-mapped read-only."""
        return np.load(self.path, mmap_mode="r")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _spill(path: Path, acc: PartialAggregate) -> int:
    """Write ``acc`` to ``path`` (npz, checksummed); returns the bytes written. A field that
    is all zeros (SAGE's and RGCN's opening sums) is written as its shape and dtype only."""
    arrays = {}
    for f in fields(acc):
        value = getattr(acc, f.name)
        if value is None:
            continue
        if value.any():
            arrays[f.name] = value.numpy()
        else:
            arrays[f"{f.name}{_ZEROS}{str(value.dtype).removeprefix('torch.')}"] = np.array(value.shape, np.int64)
    crc = 0
    for name in sorted(arrays):
        crc = zlib.crc32(np.ascontiguousarray(arrays[name]), crc)
    np.savez(path, __crc__=np.array([crc], dtype=np.int64), **arrays)
    return sum(a.nbytes for a in arrays.values())


_ZEROS = "__zeros__"


def _restore(path: Path) -> tuple[PartialAggregate, int]:
    """Read back and remove an accumulator `_spill` wrote; returns it and the bytes read."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files if name != "__crc__"}
        crc = 0
        for name in sorted(arrays):
            crc = zlib.crc32(np.ascontiguousarray(arrays[name]), crc)
        if crc != int(data["__crc__"][0]):
            raise CorruptStoreError(f"{path}: a spilled accumulator fails its checksum")
    path.unlink()
    nbytes = sum(a.nbytes for a in arrays.values())
    values = {}
    for name, a in arrays.items():
        if _ZEROS in name:
            field_name, dtype = name.split(_ZEROS)
            values[field_name] = torch.zeros(tuple(a.tolist()), dtype=getattr(torch, dtype))
        else:
            values[name] = torch.from_numpy(a)
    return PartialAggregate(**values), nbytes


def _row_bytes(layer, kind: str) -> tuple[int, int, int]:
    """Bytes per node of a layer's prepared sources, of its accumulator (the self term
    excluded) and of its self term, read off the partial form of one zero row."""
    with torch.no_grad():
        h, degrees = torch.zeros(1, layer.in_dim), torch.zeros(1, dtype=torch.int64)
        sources = layer.partial_sources(h, degrees_src=degrees)
        acc = layer.partial_begin(h, degrees_dst=degrees)

    def size(item, name):
        value = getattr(item, name)
        return 0 if value is None else value.numel() * value.element_size()

    return (sum(size(sources, f.name) for f in fields(sources)),
            sum(size(acc, f.name) for f in fields(acc) if f.name != "own"), size(acc, "own"))


def min_buffer_bytes(model: GNN, store: Store, *, prefetch: bool = True) -> int:
    """The least ``buffer_bytes`` `infer_layerwise` accepts for ``model`` over ``store``: two
    partitions of its widest layer (its input read ahead in the prepare pass; its prepared
    rows, accumulators and the largest bucket in the walk)."""
    walk = _Walk(model, store, Path("."), InferenceStats(), seed=0, prefetch=prefetch)
    return max(walk._need(layer, 2, 0)[0] for layer in model.layers)


class _Pipeline:
    """``load(i)`` for i = 0, 1, ... one step ahead of the consumer, in one background
    thread. ``take(i)`` returns load(i)'s result (its error re-raised in the consumer); the
    consumer calls ``start(i + 1)`` once it has written what load(i + 1) reads. Without
    prefetch, ``take`` runs the load itself. ``close`` joins the thread (a running load
    finishes; nothing queued starts)."""

    def __init__(self, load: Callable[[int], object], count: int, *, prefetch: bool) -> None:
        self.load, self.count = load, count
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="graphstore-infer") if prefetch else None
        self.pending: dict[int, object] = {}

    def start(self, index: int) -> None:
        if self.pool is not None and index < self.count and index not in self.pending:
            self.pending[index] = self.pool.submit(self.load, index)

    def take(self, index: int):
        if self.pool is None:
            return self.load(index)
        self.start(index)
        return self.pending.pop(index).result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def infer_layerwise(model: GNN, store: Store, *, capacity: int | None = None, buffer_bytes: int | None = None,
                    work_dir: str | Path | None = None, keep: bool = False, nodes: np.ndarray | None = None,
                    seed: int = 0, stats: InferenceStats | None = None, prefetch: bool = True,
                    input_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    input_rows: Callable[[int], np.ndarray] | None = None,
                    output: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray | None:
    """Every layer of ``model`` over the whole graph of ``store``, exactly (all neighbours,
    global in-degrees for GCN), out of core.

    Parameters
    ----------
    model : GNN
        A trained `graphstore.nn.GNN` (run in eval mode; its mode is restored after).
    store : Store
        The store with the features the model was trained on.
    capacity : int, optional
        Partitions resident at once in every layer's aggregation (>= 2).
    buffer_bytes : int, optional
        The byte budget instead: each layer holds as many partitions as its prepared rows,
        accumulators and edges in flight allow; below `min_buffer_bytes` (two partitions of
        the widest layer) it is refused. Default, when neither is given: what a quarter of
        the partitions' first-layer input rows take, or `min_buffer_bytes` when more.
    work_dir : path, optional
        Where the scratch arrays and accumulators go: a new ``graphstore-infer-*``
        directory inside it (the system's temporary directory by default), removed afterwards
        unless ``keep``; nothing else in ``work_dir`` is touched.
    nodes : int array, optional
        Store ids whose outputs to return (default every node).
    seed : int
        Seeds the BETA order (the result does not depend on it).
    stats : InferenceStats, optional
        Filled with the bytes read and written, the capacities and the peak residency.
    prefetch : bool
        Read the next partition or state in a background thread.
    input_transform : callable, optional
        Applied to each partition's feature rows as they are read (e.g. the trainers'
        row normalisation, which training applied per batch).
    input_rows : callable, optional
        ``k -> [P_k, in_dim]`` the first layer's input rows of partition k, instead of the
        store's features (e.g. learnable embeddings: ``table.read_partition(k)[:, 0]``).
    output : callable, optional
        ``(k, rows) -> None``, called with each partition's last-layer rows (float32
        [P_k, out_dim], checksum-verified) in partition order, instead of returning the
        whole result: the output of a graph larger than memory streams to its destination
        (``graphstore aggregate`` writes it into the store). Not with ``nodes``.

    Returns
    -------
    numpy.ndarray or None
        float32 [len(nodes) or N, out_dim]: the last layer's output (logits, or node
        embeddings for a link-prediction encoder); None with ``output``.
    """
    if input_rows is None and not store.manifest.has_features:
        raise ConfigError(f"{store.path}: layer-wise inference needs the store's features")
    if model.kind == "rgcn" and not store.manifest.has_relations:
        raise ConfigError(f"{store.path}: an RGCN needs edge relations; the store has none")
    if capacity is not None and buffer_bytes is not None:
        raise ConfigError("give capacity (partitions) or buffer_bytes (a byte budget), not both")
    if output is not None and nodes is not None:
        raise ConfigError("give nodes (return their rows) or output (stream every partition), not both")
    p, P = store.num_partitions, store.partition_size
    if capacity is not None and capacity < min(2, p):
        raise ConfigError(f"capacity must be at least 2 partitions (got {capacity})")
    if capacity is None and buffer_bytes is None:
        buffer_bytes = max(math.ceil(p / 4) * P * model.layers[0].in_dim * 4,
                           min_buffer_bytes(model, store, prefetch=prefetch))
    stats = stats if stats is not None else InferenceStats()
    started = time.perf_counter()
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="graphstore-infer-", dir=work_dir))
    was_training = model.training
    model.eval()
    walk = _Walk(model, store, root, stats, seed=seed, prefetch=prefetch)
    source: ScratchRows | None = None  # None: the store's features (or input_rows)
    target: ScratchRows | None = None
    try:
        for l, layer in enumerate(model.layers):
            t0 = time.perf_counter()
            target = ScratchRows(root / f"layer{l + 1}.npy", store.num_nodes, _out_width(layer), P)
            first = l == 0
            walk.layer(l, layer, source, target, capacity=capacity, buffer_bytes=buffer_bytes,
                       transform=input_transform if first else None, input_rows=input_rows if first else None)
            if source is not None:
                source.close()
                source.path.unlink()
            source = target
            stats.per_layer_seconds.append(time.perf_counter() - t0)
        if output is not None:
            for k in range(p):
                output(k, source.read(k))
            return None
        source.close()
        out = source.rows()
        result = np.array(out if nodes is None else out[np.asarray(nodes, dtype=np.int64)])
        del out
        return result
    finally:
        for rows in (source, target):
            if rows is not None:
                rows.close()
        model.train(was_training)
        stats.seconds = time.perf_counter() - started
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _out_width(layer) -> int:
    if hasattr(layer, "heads"):
        return layer.heads * layer.out_dim if layer.concat else layer.out_dim
    return layer.out_dim


@dataclass(frozen=True, slots=True)
class _State:
    """What the loader read for one step of the aggregation walk (a state's admissions, with
    its first piece, and a piece of its buckets)."""

    accs: dict[int, PartialAggregate]
    """Admitted partitions' accumulators (unfinished ones), read back."""
    pieces: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]]
    """Per destination partition j: its in-edges of this step as (rows of the source
    slots, rows of j, relations or None, buckets)."""


class _Walk:
    """One layer at a time: the prepare pass, then the aggregation walk (module docstring)."""

    def __init__(self, model: GNN, store: Store, root: Path, stats: InferenceStats, *, seed: int,
                 prefetch: bool) -> None:
        self.model, self.store, self.root, self.stats = model, store, root, stats
        self.seed, self.prefetch = seed, prefetch
        self._lock = threading.Lock()  # the loader thread and this one both count
        p = store.num_partitions
        self.sizes = np.diff(store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: edges of bucket (i, j)
        self.edge_names = ["edges/src", "edges/dst"] + (["edges/rel"] if store.manifest.has_relations else [])

    def _add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    # ------------------------------------------------------------------ pass 1: prepare

    def layer(self, l: int, layer, source: ScratchRows | None, target: ScratchRows, *, capacity: int | None,
              buffer_bytes: int | None, transform, input_rows) -> None:
        store, p = self.store, self.store.num_partitions
        gcn = self.model.kind == "gcn"
        last = l == self.model.num_layers - 1
        self.remaining = (self.sizes > 0).sum(axis=0)  # in-buckets still to add, per destination
        self.finished = np.zeros(p, dtype=bool)
        self.layer_, self.target, self.last, self.l = layer, target, last, l
        prepared: dict[str, ScratchRows] = {}
        self.own: ScratchRows | None = None

        def read_input(k: int):
            if source is not None:
                block = source.read(k)
            else:
                block = input_rows(k) if input_rows is not None else store.read_features(k)
            block = np.asarray(block, dtype=np.float32)
            deg = store.read_rows("nodes/in_degree", *store.partition_range(k)) if gcn else None
            return block, deg

        try:
            with torch.no_grad(), _Pipeline(read_input, p, prefetch=self.prefetch) as pipe:
                for k in range(p):
                    block, deg = pipe.take(k)
                    pipe.start(k + 1)
                    nbytes = block.nbytes + (0 if deg is None else deg.nbytes)
                    self._add(bytes_read=nbytes, planned_bytes=nbytes)
                    rows = torch.from_numpy(block)
                    if transform is not None:
                        rows = transform(rows)
                    degrees = None if deg is None else torch.from_numpy(np.asarray(deg, dtype=np.int64))
                    sources = layer.partial_sources(rows, degrees_src=degrees)
                    acc = layer.partial_begin(rows, degrees_dst=degrees)
                    del rows, block
                    for f in fields(sources):
                        value = getattr(sources, f.name)
                        if value is None:
                            continue
                        if f.name not in prepared:
                            prepared[f.name] = ScratchRows(self.root / f"sources{l}.{f.name}.npy", store.num_nodes,
                                                           tuple(value.shape[1:]), store.partition_size)
                        self._add(bytes_written=prepared[f.name].write(k, value.numpy()))
                    if acc.own is not None:
                        # The self term is needed once, when the partition finishes: it waits in
                        # a scratch array, not in the accumulator that travels with every swap.
                        if self.own is None:
                            self.own = ScratchRows(self.root / f"own{l}.npy", store.num_nodes, tuple(acc.own.shape[1:]),
                                                   store.partition_size)
                        self._add(bytes_written=self.own.write(k, acc.own.numpy()))
                        acc.own = None
                    if self.remaining[k] == 0:  # no in-edges at all: its output is the self term's
                        self._finish(k, acc)
                    else:
                        written = _spill(self.root / f"acc{k}.npz", acc)
                        self._add(spill_bytes=written, bytes_written=written)
            self._aggregate(prepared, capacity, buffer_bytes)
        finally:
            for rows in [*prepared.values(), *([self.own] if self.own is not None else [])]:
                rows.close()
                rows.path.unlink(missing_ok=True)
        if not self.finished.all():
            missing = np.flatnonzero(~self.finished)[:5].tolist()
            raise AssertionError(f"layer {l}: partitions {missing} never finished (a plan without their buckets)")

    def _finish(self, k: int, acc: PartialAggregate) -> None:
        if self.own is not None:
            acc.own = torch.from_numpy(self.own.read(k))
            self._add(bytes_read=acc.own.numel() * 4, planned_bytes=acc.own.numel() * 4)
        y = self.layer_.partial_finish(acc)
        if not self.last:
            y = self.model.activation(y)
        self._add(bytes_written=self.target.write(k, y.numpy()))
        self.finished[k] = True

    # ------------------------------------------------------------------ pass 2: aggregate

    def _capacity(self, layer, capacity: int | None, buffer_bytes: int | None):
        """This layer's capacity, its plan and the most edges a piece may hold: the given
        capacity, or the most partitions whose walk fits ``buffer_bytes`` (`_need`)."""
        p = self.store.num_partitions
        if capacity is not None:
            c = min(capacity, p)
            return c, self._plan(c), self._need(layer, c, buffer_bytes or 0)[1]
        if p > 2 and self._need(layer, 2, buffer_bytes)[0] > buffer_bytes:
            raise ConfigError(f"buffer_bytes {buffer_bytes} is too small for layer {self.l} of the model: "
                              f"two partitions of it need {self._need(layer, 2, buffer_bytes)[0]} bytes "
                              f"(min_buffer_bytes gives the least that works)")
        lo, hi = 2, p  # the largest c that fits, by bisection (the need grows with c)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._need(layer, mid, buffer_bytes)[0] <= buffer_bytes:
                lo = mid
            else:
                hi = mid - 1
        c = min(lo, p)
        return c, self._plan(c), self._need(layer, c, buffer_bytes)[1]

    def _plan(self, c: int):
        p = self.store.num_partitions
        return plan_epoch("beta", num_partitions=p, capacity=c, epoch=0, seed=self.seed) if c < p else None

    def _need(self, layer, c: int, buffer_bytes: int) -> tuple[int, int]:
        """Bytes a layer's passes hold at capacity ``c`` and the edges a piece may take.

        Prepare: two partitions of the layer input (one read ahead) and one partition's
        prepared rows, accumulator and self term. Walk: the slots (prefetch included) of
        prepared rows and accumulators, and two pieces of edges: an edge costs its stored ids
        and int64 indices in each, and while aggregated its gathered source row and the
        weighted copy of it (GAT). Pieces take ``EDGE_SHARE`` of the budget, and at least the
        largest bucket."""
        p, P = self.store.num_partitions, self.store.partition_size
        source_row, acc_row, own_row = _row_bytes(layer, self.model.kind)
        prepare = P * (2 * 4 * layer.in_dim + source_row + acc_row + own_row)
        per_edge = 2 * (4 * len(self.edge_names) + INDEX_BYTES) + 2 * source_row
        piece_edges = max(int(self.sizes.max(initial=0)), int(buffer_bytes * EDGE_SHARE) // per_edge, 1)
        plan = self._plan(c)
        slots = slots_needed(plan.states, prefetch=self.prefetch) if plan is not None else p
        rows = slots * P * (source_row + acc_row)
        if plan is None and buffer_bytes > rows + piece_edges * per_edge:
            piece_edges = (buffer_bytes - rows) // per_edge  # all resident: edges may take the rest
        return max(prepare, rows + piece_edges * per_edge), piece_edges

    def _pieces(self, states, state_of: np.ndarray, piece_edges: int) -> list[tuple[int, list[int]]]:
        """The walk's steps: each state's non-empty buckets ``b = j * p + i`` (ascending), cut
        into pieces of at most ``piece_edges`` edges (at least one bucket each); a state with
        no bucket is a step too (its admissions may be needed later)."""
        p = self.store.num_partitions
        steps = []
        for s, state in enumerate(states):
            buckets = sorted(j * p + i for j in state for i in state if state_of[i, j] == s and self.sizes[i, j] > 0)
            piece, edges = [], 0
            for b in buckets:
                size = int(self.sizes[b % p, b // p])
                if piece and edges + size > piece_edges:
                    steps.append((s, piece))
                    piece, edges = [], 0
                piece.append(b)
                edges += size
            steps.append((s, piece))
        return steps

    def _aggregate(self, prepared: dict[str, ScratchRows], capacity: int | None,
                   buffer_bytes: int | None) -> None:
        store, stats, layer, root = self.store, self.stats, self.layer_, self.root
        p, P = store.num_partitions, store.partition_size
        rgcn = self.model.kind == "rgcn"
        c, plan, piece_edges = self._capacity(layer, capacity, buffer_bytes)
        stats.capacities.append(c)
        states = [tuple(s) for s in plan.states] if plan is not None else [tuple(range(p))]
        state_of = np.asarray(plan.bucket_states) if plan is not None else np.zeros((p, p), dtype=np.int64)
        num_slots = slots_needed(states, prefetch=self.prefetch) if plan is not None else p
        slot_plan = assign_slots(states, num_slots, prefetch=self.prefetch)
        steps = self._pieces(states, state_of, piece_edges)
        # Every prepared field's slots: slot z holds a partition's rows at [z * P, (z + 1) * P).
        slots = {name: torch.empty(num_slots * P, *r.shape) for name, r in prepared.items()}
        sources = PartialSources(**slots)
        offsets = store.bucket_offsets
        finished = self.finished

        def load(t: int) -> _State:
            s, buckets = steps[t]
            where = dict(zip(states[s], slot_plan.slots[s]))
            accs = {}
            if t == 0 or steps[t - 1][0] != s:  # the state's first step admits its partitions
                for k in slot_plan.admitted[s]:
                    start, stop = store.partition_range(k)
                    z = where[k]
                    for name, rows in prepared.items():
                        out = slots[name][z * P:z * P + stop - start].numpy()
                        rows.read(k, out)
                        self._add(bytes_read=out.nbytes, planned_bytes=out.nbytes)
                    if not finished[k]:
                        accs[k], nbytes = _restore(root / f"acc{k}.npz")
                        self._add(bytes_read=nbytes)
            spans = _bucket_spans(buckets, offsets)
            got = store.read_many([(name, lo, hi, None) for lo, hi, _ in spans for name in self.edge_names])
            nbytes = sum(a.nbytes for a in got)
            self._add(bytes_read=nbytes, planned_bytes=nbytes)
            per_dst: dict[int, list] = {}
            for n, (lo, _, members) in enumerate(spans):
                arrays = got[n * len(self.edge_names):(n + 1) * len(self.edge_names)]
                for b in members:
                    i, j = b % p, b // p
                    b_lo, b_hi = int(offsets[b]) - lo, int(offsets[b + 1]) - lo
                    src, dst, *rel = (a[b_lo:b_hi] for a in arrays)
                    # Source rows live in i's slot; destination rows are j's local rows.
                    per_dst.setdefault(j, []).append((src.astype(np.int64) + (where[i] * P - i * P),
                                                      dst.astype(np.int64) - j * P, rel[0] if rel else None))
            del got
            pieces = {}
            for j, parts in per_dst.items():
                src = torch.from_numpy(np.concatenate([x[0] for x in parts]))
                dst = torch.from_numpy(np.concatenate([x[1] for x in parts]))
                rel = torch.from_numpy(np.concatenate([x[2] for x in parts]).astype(np.int64)) if rgcn else None
                pieces[j] = (src, dst, rel, len(parts))
            return _State(accs, pieces)

        accs: dict[int, PartialAggregate] = {}
        with torch.no_grad(), _Pipeline(load, len(steps), prefetch=self.prefetch) as pipe:
            for t, (s, _) in enumerate(steps):
                if t == 0 or steps[t - 1][0] != s:
                    # An accumulator stays while its partition holds a slot (it is counted in
                    # the slot's bytes); the partitions whose slots state s takes wait on disk,
                    # written before the next load, the earliest that may read one back, starts.
                    for k in [k for _, k in slot_plan.evicted[s] if k in accs]:
                        nbytes = _spill(root / f"acc{k}.npz", accs.pop(k))
                        self._add(spill_bytes=nbytes, bytes_written=nbytes)
                    stats.max_resident_partitions = max(stats.max_resident_partitions, len(states[s]))
                loaded = pipe.take(t)
                pipe.start(t + 1)
                accs.update(loaded.accs)
                for j, (src, dst, rel, count) in loaded.pieces.items():
                    layer.partial_update(accs[j], sources, src, dst, edge_type=rel)
                    self.remaining[j] -= count
                    if self.remaining[j] == 0:
                        self._finish(j, accs.pop(j))
                del loaded
        if accs:
            raise AssertionError(f"layer {self.l}: partitions {sorted(accs)[:5]} left unfinished")
