"""Exact full-graph inference out of core: every layer for every node, with all neighbours,
a piece of edges at a time.

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
   partition leaves before all its in-edges are added, as the buffer writes embeddings
   back. After its last in-edge the partition is finished (the layer's output function,
   then the activation) and written to the next layer's scratch array (checksummed per
   partition).

A state's buckets are added in *pieces* of at most ``piece_edges`` edges, a number the byte
budget sets (`_Walk._fit`), not the graph: small buckets go whole, several to a piece; a
bucket larger than a piece is cut into consecutive ranges of its edges. A bucket is stored
sorted by (destination, source), so a range is a range of destinations (a destination's
in-edges may straddle two pieces: the partial form takes edges split any way, GAT's softmax
included). A partition is finished once its count of in-edges still to add reaches 0, after
its last piece. A piece is added `UPDATE_BYTES` of gathered source rows at a time, so the
``[E, width]`` temporaries of an update are bounded and of one size; the budget's floor is
then two partitions of prepared rows and accumulators (with the one read ahead), finishing
one, and a piece of `MIN_PIECE_EDGES` edges, whatever the largest bucket. The ranges of a
cut bucket are read a window at a time (`_EdgeWindows`): a read of part of a bucket is
verified by reading its whole edge chunk (no checksum covers less), so windows aligned to
chunks read each chunk once, however many pieces it feeds. The accumulators are read back
into slots allocated once per layer, as the prepared rows are, and the allocator's free
blocks are handed back between the passes (`_trim`): what the process holds follows the
budget, not the allocator's history.

Both passes read one step ahead in a background thread (the next partition; the next
state's admitted partitions and its pieces, contiguous whole buckets in one request), so
the disk works while the CPU aggregates. The capacity ``c`` is chosen per layer from a byte
budget and that layer's prepared widths, so narrow layers hold more partitions and re-read
less; memory is bounded by the budget, not by the graph.

The layer math runs where the model is (the CPU or a CUDA device; `infer_layerwise`'s
``device``). Storage, scratch files and the reading threads stay on the host: on a device,
each partition's input rows, a state's admitted prepared rows and accumulators and each
piece's edges are read into pinned host buffers by the reading thread and copied to the
device by the consumer, where the slots, the accumulators and the update's temporaries
live; prepared rows, a spilled accumulator and a finished partition come back to the host
to be written. The bytes read and written, and so `InferenceStats`, are the CPU's.

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

import itertools
import json
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

from graphstore._heap import trim_heap
from graphstore.buffer.manager import _bucket_spans
from graphstore.buffer.policies import plan_epoch
from graphstore.buffer.slots import assign_slots, slots_needed
from graphstore.errors import ConfigError, CorruptStoreError
from graphstore.layout.dtypes import decode
from graphstore.layout.store import Store
from graphstore.nn import GNN, PartialAggregate, PartialSources, RGCNConv

__all__ = ["InferenceStats", "ScratchRows", "infer_layerwise", "min_buffer_bytes", "resolve_device"]

EDGE_SHARE = 0.25
"""The share of the byte budget a walk gives to edges in flight (the rest holds slots of
prepared rows and accumulators): a state's buckets are taken in pieces of at most that many
bytes, so a large first state does not shrink the capacity of every state."""

MIN_PIECE_EDGES = 1024
"""The fewest edges a piece may hold: a budget too small for two partitions and a piece of
this many edges is refused (below it, per-piece overheads outweigh the bytes saved)."""

INDEX_BYTES = 16
"""Bytes per edge and edge array besides its stored id while a piece is filed: the id as an
int64 row, and that row's concatenation with the destination's other buckets."""

UPDATE_BYTES = 4 << 20
"""Source rows gathered per ``partial_update`` call: a piece's edges are added this many
bytes of rows at a time, so an update's temporaries are small and of one size."""

WINDOW_EDGES: int | None = None
"""Edges per read of a bucket that is cut into pieces (`_EdgeWindows`): None reads the
store's edge chunks (the unit a read of part of a bucket is verified in anyway)."""


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
    """Write ``acc`` to ``path`` (checksummed); returns the bytes of its fields written. A
    field that is all zeros (SAGE's and RGCN's opening sums) is written as its shape and
    dtype only.

    The file is a little-endian uint64 header length, the header (JSON: every field's name,
    dtype, shape and whether its bytes follow), the bytes of the fields that follow in that
    order, and the crc32 of the header and those bytes (uint32). The bytes go out from the
    tensors' own memory: an accumulator is a partition of rows, and a copy of it on the way
    (as ``np.savez`` makes, a zip member not being a file) would be memory the budget does
    not count. A device's accumulator goes out through one host copy of each stored field."""
    header, arrays = [], []
    for f in fields(acc):
        value = getattr(acc, f.name)
        if value is None:
            continue
        stored = bool(value.any())
        header.append([f.name, str(value.dtype).removeprefix("torch."), list(value.shape), stored])
        if stored:
            # A device's accumulator comes to the host to be written; a host one is written
            # from its own memory (``.cpu()`` of a host tensor is that tensor).
            arrays.append(np.ascontiguousarray(value.cpu().numpy()))
    head = json.dumps(header).encode()
    crc = zlib.crc32(head)
    with open(path, "wb") as out:
        out.write(len(head).to_bytes(8, "little"))
        out.write(head)
        for a in arrays:
            out.write(memoryview(a).cast("B"))
            crc = zlib.crc32(a, crc)
        out.write(crc.to_bytes(4, "little"))
    return sum(a.nbytes for a in arrays)


def _restore(path: Path, out: dict[str, torch.Tensor] | None = None) -> tuple[PartialAggregate, int]:
    """Read back and remove an accumulator `_spill` wrote; returns it and the bytes read.
    With ``out`` (field name -> C-contiguous tensor of the field's shape and dtype), the
    fields are read into those tensors, and the accumulator is made of them."""

    def read(f, n: int, out: memoryview | None = None) -> memoryview:
        view = memoryview(bytearray(n)) if out is None else out
        done = 0
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                raise CorruptStoreError(f"{path}: a spilled accumulator is cut short")
            done += got
        return view

    values, nbytes = {}, 0
    with open(path, "rb", buffering=0) as f:
        head = read(f, int.from_bytes(read(f, 8), "little"))
        crc = zlib.crc32(head)
        try:
            header = json.loads(bytes(head))
        except ValueError:
            raise CorruptStoreError(f"{path}: a spilled accumulator fails its checksum") from None
        for name, dtype, shape, stored in header:
            into = None if out is None else out.get(name)
            kept = None if into is None else (list(into.shape), str(into.dtype).removeprefix("torch."))
            if kept is not None and kept != (shape, dtype):
                raise CorruptStoreError(f"{path}: a spilled accumulator's {name} is {dtype} {shape}, "
                                        f"not {into.dtype} {list(into.shape)}")
            if not stored:
                if into is None:
                    into = torch.empty(shape, dtype=getattr(torch, dtype))
                values[name] = into.zero_()
                continue
            a = np.empty(shape, dtype=dtype) if into is None else into.numpy()
            read(f, a.nbytes, memoryview(a).cast("B"))  # straight into the array
            crc = zlib.crc32(a, crc)
            nbytes += a.nbytes
            values[name] = torch.from_numpy(a) if into is None else into
        if crc != int.from_bytes(read(f, 4), "little"):
            raise CorruptStoreError(f"{path}: a spilled accumulator fails its checksum")
    path.unlink()
    return PartialAggregate(**values), nbytes


def _trim(device: torch.device | None = None) -> None:
    """Hand the memory the C allocator holds free back to the system (glibc's
    ``malloc_trim``; elsewhere nothing). Between the passes: the prepare pass frees its
    partition-sized blocks into the heap, where glibc keeps them (its mmap threshold rises
    to the size of the blocks it has freed), and the walk's slots are new mappings that
    cannot reuse them, so without this the freed blocks would sit under the walk's budget.
    Not per state: a trim walks every free chunk (milliseconds). On a CUDA ``device`` the
    caching allocator's free blocks go back too, for the same reason: each layer's slots
    are of its own widths, and blocks cached from the last would sit beside them."""
    trim_heap()
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (or such a `torch.device`) as a device of this
    machine, with its index (``"cuda"``: the current CUDA device).

    Raises
    ------
    ConfigError
        Another kind of device, CUDA where torch sees none, or an index past the devices
        there are.

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu, cuda or cuda:N (got {str(device)!r})")
    if resolved.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r}: torch sees no CUDA device on this machine (use cpu)")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if resolved.index is None else resolved.index
    if index >= count:
        raise ConfigError(f"device {str(device)!r}: the CUDA index must be in [0, {count}) on this machine")
    return torch.device("cuda", index)


def _held_on(module: torch.nn.Module) -> torch.device | None:
    """The one device of ``module``'s parameters and buffers (None: it has neither)."""
    found = {t.device for t in itertools.chain(module.parameters(), module.buffers())}
    if len(found) > 1:
        raise ConfigError(f"the model is on several devices ({', '.join(sorted(map(str, found)))}); "
                          "move it to one (model.to(device))")
    return found.pop() if found else None


def _run_device(model: torch.nn.Module, device: str | torch.device | None) -> torch.device:
    """Where the layer math runs: ``device``, or the model's (the CPU for a weightless one).
    The model is not moved: one given on another device than ``device`` is refused."""
    held = _held_on(model)
    if device is None:
        return held if held is not None else torch.device("cpu")
    device = resolve_device(device)
    if held is not None and held != device:
        raise ConfigError(f"device is {device} but the model is on {held} (move it first: model.to(device))")
    return device


def _staged(device: torch.device) -> bool:
    """Whether the walk's rows reach the layer math through host buffers (a device's
    memory: read into host staging, then copied) rather than being read straight into its
    slots (the CPU). A test forces it on the CPU to run the device's path without one."""
    return device.type != "cpu"


def _compact(layer, device: torch.device | None = None) -> tuple[dict, dict]:
    """Extra arguments of ``partial_sources`` and ``partial_begin`` for one zero row: an RGCN
    runs in its compact form here (sums per destination with every relation's count known
    up front, input rows as sources where projecting them by every relation would widen
    them; `RGCNConv.partial_begin`), which `_Walk` feeds with each block's counts."""
    if not isinstance(layer, RGCNConv):
        return {}, {}
    return {"compact": True}, {"relation_counts": torch.ones(1, layer.num_relations, dtype=torch.int32,
                                                            device=device)}


def _acc_fields(layer) -> dict[str, torch.Tensor]:
    """The fields of a layer's accumulator but the self term, as one zero row's."""
    device = _held_on(layer) or torch.device("cpu")  # a layer on CUDA takes its input there
    with torch.no_grad():
        acc = layer.partial_begin(torch.zeros(1, layer.in_dim, device=device),
                                  degrees_dst=torch.zeros(1, dtype=torch.int64, device=device),
                                  **_compact(layer, device)[1])
    return {f.name: getattr(acc, f.name) for f in fields(acc)
            if f.name != "own" and getattr(acc, f.name) is not None}


def _row_bytes(layer, kind: str) -> tuple[int, int, int]:
    """Bytes per node of a layer's prepared sources, of its accumulator (the self term
    excluded) and of its self term, read off the partial form of one zero row."""
    device = _held_on(layer) or torch.device("cpu")
    with torch.no_grad():
        h = torch.zeros(1, layer.in_dim, device=device)
        degrees = torch.zeros(1, dtype=torch.int64, device=device)
        source_kw, begin_kw = _compact(layer, device)
        sources = layer.partial_sources(h, degrees_src=degrees, **source_kw)
        acc = layer.partial_begin(h, degrees_dst=degrees, **begin_kw)

    def size(item, name):
        value = getattr(item, name)
        return 0 if value is None else value.numel() * value.element_size()

    return (sum(size(sources, f.name) for f in fields(sources)),
            sum(size(acc, f.name) for f in fields(acc) if f.name != "own"), size(acc, "own"))


def min_buffer_bytes(model: GNN, store: Store, *, prefetch: bool = True) -> int:
    """The least ``buffer_bytes`` `infer_layerwise` accepts for ``model`` over ``store``: for
    its most demanding layer, the prepare pass (three partitions of layer input: one
    prepared, the next read ahead, a transformed copy; one partition's prepared rows and
    accumulator) or the walk at two partitions (their prepared rows and accumulators, the
    next state's admission read ahead, finishing one, and a piece of `MIN_PIECE_EDGES`
    edges), whichever is more. It does not depend on the size of the largest bucket: a
    bucket larger than a piece is cut."""
    walk = _Walk(model, store, Path("."), InferenceStats(), seed=0, prefetch=prefetch)
    return max(walk._least_bytes(walk._costs(layer)) for layer in model.layers)


def _check_budget(model: GNN, store: Store, buffer_bytes: int, *, prefetch: bool) -> None:
    """Refuse a budget some layer cannot run in before anything is read (`_Walk._fit`)."""
    walk = _Walk(model, store, Path("."), InferenceStats(), seed=0, prefetch=prefetch)
    for l, layer in enumerate(model.layers):
        walk._fit(l, walk._costs(layer), buffer_bytes)


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
                    output: Callable[[int, np.ndarray], None] | None = None,
                    on_layer: Callable[[int, int, float], None] | None = None,
                    device: str | torch.device | None = None) -> np.ndarray | None:
    """Every layer of ``model`` over the whole graph of ``store``, exactly (all neighbours,
    global in-degrees for GCN), out of core.

    Parameters
    ----------
    model : GNN
        A trained `graphstore.nn.GNN` (run in eval mode; its mode is restored after), on
        the CPU or a CUDA device: the layer math runs where its parameters are.
    store : Store
        The store with the features the model was trained on.
    capacity : int, optional
        Partitions resident at once in every layer's aggregation (>= 2).
    buffer_bytes : int, optional
        The byte budget instead: each layer holds as many partitions as its prepared rows,
        accumulators and edges in flight allow, and takes its edges in pieces the rest of
        the budget holds (a bucket larger than a piece is cut); below `min_buffer_bytes`
        (two partitions of the most demanding layer and a small piece of edges) it is
        refused before anything is read, the message saying what the floor is made of.
        Default, when neither is given: what a quarter of the partitions' first-layer input
        rows take, or `min_buffer_bytes` when more. Not counted: the process itself (the
        interpreter, torch, the store's maps) and the window of a cut bucket's edges read
        at once (at most one edge chunk, 4 MiB, per edge array). On CUDA the budget is
        device memory (the slots of prepared rows and accumulators, a piece's edges, the
        updates' temporaries, the prepare pass's partition), plus host staging it does not
        count: pinned copies of a state's admitted rows and accumulators and of a piece's
        edges (the next ones too, read ahead), and of a partition's input rows in the
        prepare pass, blocks that torch's pinned allocator keeps for reuse.
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
        row normalisation, which training applied per batch), on the model's device.
    input_rows : callable, optional
        ``k -> [P_k, in_dim]`` the first layer's input rows of partition k, instead of the
        store's features (e.g. learnable embeddings: ``table.read_partition(k)[:, 0]``).
    output : callable, optional
        ``(k, rows) -> None``, called with each partition's last-layer rows (float32
        [P_k, out_dim], checksum-verified) in partition order, instead of returning the
        whole result: the output of a graph larger than memory streams to its destination
        (``graphstore aggregate`` writes it into the store). Not with ``nodes``.
    on_layer : callable, optional
        ``(layer, num_layers, seconds) -> None`` after each layer (1-based), for a
        progress display: a layer is a pass over the whole store.
    device : str or torch.device, optional
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``: where the layer math runs (`resolve_device`).
        Default: where the model's parameters are (the CPU for a weightless model such
        as `graphstore.nn.AggregationModel`). A model with parameters elsewhere is refused,
        not moved. Rows are read on the host, copied to the device for each partition and
        piece, and its outputs come back to the host (the scratch rows, the result);
        `InferenceStats` counts the bytes of the store and scratch IO, never the copies.

    Returns
    -------
    numpy.ndarray or None
        float32 [len(nodes) or N, out_dim]: the last layer's output (logits, or node
        embeddings for a link-prediction encoder), on the host; None with ``output``.

    Raises
    ------
    ConfigError
        A store without what the model reads, capacity and buffer_bytes both given, a
        budget below `min_buffer_bytes`, or a device that is not the model's or not here.
    """
    if input_rows is None and not store.manifest.has_features:
        raise ConfigError(f"{store.path}: layer-wise inference needs the store's features")
    if model.kind == "rgcn" and not store.manifest.has_relations:
        raise ConfigError(f"{store.path}: an RGCN needs edge relations; the store has none")
    if capacity is not None and buffer_bytes is not None:
        raise ConfigError("give capacity (partitions) or buffer_bytes (a byte budget), not both")
    if output is not None and nodes is not None:
        raise ConfigError("give nodes (return their rows) or output (stream every partition), not both")
    device = _run_device(model, device)  # refused before anything is read
    p, P = store.num_partitions, store.partition_size
    if capacity is not None and capacity < min(2, p):
        raise ConfigError(f"capacity must be at least 2 partitions (got {capacity})")
    if capacity is None and buffer_bytes is None:
        buffer_bytes = max(math.ceil(p / 4) * P * model.layers[0].in_dim * 4,
                           min_buffer_bytes(model, store, prefetch=prefetch))
    if buffer_bytes is not None:
        _check_budget(model, store, buffer_bytes, prefetch=prefetch)
    stats = stats if stats is not None else InferenceStats()
    started = time.perf_counter()
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="graphstore-infer-", dir=work_dir))
    was_training = model.training
    model.eval()
    walk = _Walk(model, store, root, stats, seed=seed, prefetch=prefetch, device=device)
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
            if on_layer is not None:
                on_layer(l + 1, model.num_layers, stats.per_layer_seconds[-1])
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
    its first piece, and a piece of its edges)."""

    accs: dict[int, PartialAggregate]
    """Admitted partitions' accumulators (unfinished ones), read back: views of their slots
    (on a device, filled by ``copies``)."""
    pieces: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    """Per destination partition j: its in-edges of this step as (rows of the source
    slots, rows of j, relations or None), int64 [E_j] each, on the host (pinned for CUDA;
    the consumer copies them to the device)."""
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """A device's admissions: (slot rows on the device, the same rows read into host
    staging), prepared rows and accumulators, for the consumer to copy before the step's
    updates. Empty on the CPU, where the loader reads straight into the slots."""


@dataclass(frozen=True, slots=True)
class _Costs:
    """The bytes one layer's passes hold (`_Walk._costs`), what ``buffer_bytes`` pays for."""

    prepare: int
    """The prepare pass: three partitions of layer input (the one prepared, the next read
    ahead, a transformed or converted copy), one partition's prepared rows, accumulator and
    self term, and finishing a partition without in-edges."""
    slot: int
    """One resident partition in the walk: its prepared rows and its accumulator."""
    finish: int
    """Finishing a partition (its self term read back, the output function's temporaries,
    the activation); an update's accumulator-sized temporaries (GAT's new maximum) fit in it
    too, as the two never overlap."""
    edge_ids: int
    """One edge of a piece: its stored ids and int64 rows in the piece being filed and in the
    piece being aggregated."""
    edge_update: int
    """One edge while it is added: its gathered source row and one product of it (GAT: the
    weighted copy; RGCN: the mixed bases), and its index temporaries. At most
    ``update_edges`` edges are added at a time."""
    update_edges: int
    """Edges per ``partial_update`` call (`UPDATE_BYTES` of source rows; GAT: at least a
    partition, as each call rescales the whole accumulator)."""

    def edge_bytes(self, edges: int) -> int:
        """What a piece of ``edges`` edges holds."""
        return edges * self.edge_ids + min(edges, self.update_edges) * self.edge_update

    def edges_within(self, nbytes: int) -> int:
        """The most edges a piece may hold in ``nbytes`` (the inverse of `edge_bytes`)."""
        full = self.update_edges * (self.edge_ids + self.edge_update)
        if nbytes >= full:
            return self.update_edges + (nbytes - full) // self.edge_ids
        return max(nbytes, 0) // (self.edge_ids + self.edge_update)


class _EdgeWindows:
    """Ranges of a cut bucket's edges, served from a window of the bucket read at once.

    A read of part of a bucket is verified by reading the edge chunk that holds it (no
    checksum covers less, `graphstore.layout._chunkio`), so reading each piece's range on its
    own would read and checksum a whole chunk per piece. A window is the stretch of the
    bucket inside one ``window_edges``-aligned block (the store's edge chunk by default), read
    once (exactly its bytes when it is the whole bucket) and sliced for every piece it
    feeds; the pieces of a bucket come in order, so one window is held at a time, by the one
    thread that loads steps.
    """

    def __init__(self, store: Store, names: list[str], window_edges: int) -> None:
        self.store, self.names, self.window_edges = store, names, window_edges
        self.offsets = store.bucket_offsets
        self.lo = self.hi = 0
        self.arrays: list[np.ndarray] = []

    def take(self, b: int, lo: int, hi: int) -> tuple[list[np.ndarray], int]:
        """Edges ``[lo, hi)`` (store positions, inside bucket ``b``) of every edge array, and
        the bytes read from the store to serve them."""
        parts, nbytes, w = [], 0, self.window_edges
        while lo < hi:
            if not self.lo <= lo < self.hi:
                start = max(int(self.offsets[b]), lo // w * w)
                stop = min(int(self.offsets[b + 1]), (lo // w + 1) * w)
                self.arrays = []  # the old window goes before the next is read
                self.arrays = self.store.read_many([(name, start, stop, None) for name in self.names])
                self.lo, self.hi = start, stop
                nbytes += sum(a.nbytes for a in self.arrays)
            stop = min(hi, self.hi)
            parts.append([a[lo - self.lo:stop - self.lo] for a in self.arrays])
            lo = stop
        return [cols[0] if len(cols) == 1 else np.concatenate(cols) for cols in zip(*parts)], nbytes


class _Walk:
    """One layer at a time: the prepare pass, then the aggregation walk (module docstring)."""

    def __init__(self, model: GNN, store: Store, root: Path, stats: InferenceStats, *, seed: int,
                 prefetch: bool, device: torch.device | None = None) -> None:
        self.model, self.store, self.root, self.stats = model, store, root, stats
        self.seed, self.prefetch = seed, prefetch
        self.device = device if device is not None else _held_on(model) or torch.device("cpu")
        self.staged = _staged(self.device)
        # Page-locked staging on CUDA: the loader thread fills it, and the consumer's copy
        # is then a DMA it does not wait on.
        self.pin = self.device.type == "cuda"
        self._lock = threading.Lock()  # the loader thread and this one both count
        p = store.num_partitions
        self.sizes = np.diff(store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: edges of bucket (i, j)
        # Only an RGCN reads the relations (the others would read them for nothing).
        self.edge_names = ["edges/src", "edges/dst"] + (["edges/rel"] if model.kind == "rgcn" else [])
        self.window_edges = int(WINDOW_EDGES or store.manifest.chunks["edges"])
        self._plans: dict[int, object] = {}

    def _add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    def _host(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A host buffer for rows on their way to the device (pinned on CUDA). It may be
        dropped once its copy is issued: torch's pinned allocator does not hand the block
        out again before the copy is done."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (host), copied into pinned memory on CUDA: done by the loader thread,
        so that the consumer's copy to the device does not wait on pageable memory."""
        return tensor.pin_memory() if self.pin else tensor

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the walk's device (itself on the CPU). Asynchronous from pinned
        memory (from pageable memory a copy is synchronous anyway): every later use is on
        the same stream, and what comes back to the host (`_finish`, `_spill`, the
        prepared rows) is a synchronous copy after it."""
        return tensor.to(self.device, non_blocking=self.pin and tensor.is_pinned())

    # ------------------------------------------------------------------ pass 1: prepare

    def layer(self, l: int, layer, source: ScratchRows | None, target: ScratchRows, *, capacity: int | None,
              buffer_bytes: int | None, transform, input_rows) -> None:
        store, p = self.store, self.store.num_partitions
        gcn = self.model.kind == "gcn"
        last = l == self.model.num_layers - 1
        # In-edges still to add, per destination: a partition finishes after its last piece,
        # however its buckets were cut (a count of buckets would finish it after the first).
        self.remaining = self.sizes.sum(axis=0)
        self.finished = np.zeros(p, dtype=bool)
        self.layer_, self.target, self.last, self.l = layer, target, last, l
        prepared: dict[str, ScratchRows] = {}
        self.own: ScratchRows | None = None

        source_kw, _ = _compact(layer)
        rgcn = bool(source_kw)

        def read_input(k: int):
            if source is not None:
                block = source.read(k)
            else:
                block = input_rows(k) if input_rows is not None else store.read_features(k)
            # The bytes as read (half rows count half), then numbers to compute on: a
            # bfloat16 store's uint16 bits decoded, float16 widened (exact).
            read_bytes = np.asarray(block).nbytes
            stored = source is None and input_rows is None
            name = store.manifest.feature_dtype if stored else "float32"
            block = decode(block, name)
            deg = store.read_rows("nodes/in_degree", *store.partition_range(k)) if gcn else None
            counts = self._relation_counts(k, layer.num_relations) if rgcn else None
            return self._pinned(torch.from_numpy(block)), deg, counts, read_bytes

        try:
            with torch.no_grad(), _Pipeline(read_input, p, prefetch=self.prefetch) as pipe:
                for k in range(p):
                    block, deg, counts, read_bytes = pipe.take(k)
                    pipe.start(k + 1)
                    nbytes = read_bytes + (0 if deg is None else deg.nbytes) + self._count_bytes(k, counts)
                    self._add(bytes_read=nbytes, planned_bytes=nbytes)
                    rows = self._to_device(block)
                    if transform is not None:
                        rows = transform(rows)
                    degrees = None if deg is None else self._to_device(
                        torch.from_numpy(np.asarray(deg, dtype=np.int64)))
                    begin_kw = {} if counts is None else {
                        "relation_counts": self._to_device(torch.from_numpy(counts))}
                    sources = layer.partial_sources(rows, degrees_src=degrees, **source_kw)
                    acc = layer.partial_begin(rows, degrees_dst=degrees, **begin_kw)
                    del rows, block
                    for f in fields(sources):
                        value = getattr(sources, f.name)
                        if value is None:
                            continue
                        if f.name not in prepared:
                            prepared[f.name] = ScratchRows(self.root / f"sources{l}.{f.name}.npy", store.num_nodes,
                                                           tuple(value.shape[1:]), store.partition_size)
                        # Back to the host for the scratch rows (a host tensor is itself).
                        self._add(bytes_written=prepared[f.name].write(k, value.cpu().numpy()))
                    if acc.own is not None:
                        # The self term is needed once, when the partition finishes: it waits in
                        # a scratch array, not in the accumulator that travels with every swap.
                        if self.own is None:
                            self.own = ScratchRows(self.root / f"own{l}.npy", store.num_nodes, tuple(acc.own.shape[1:]),
                                                   store.partition_size)
                        self._add(bytes_written=self.own.write(k, acc.own.cpu().numpy()))
                        acc.own = None
                    if self.remaining[k] == 0:  # no in-edges at all: its output is the self term's
                        self._finish(k, acc)
                    else:
                        written = _spill(self.root / f"acc{k}.bin", acc)
                        self._add(spill_bytes=written, bytes_written=written)
                    # Nothing of partition k may outlive its turn: the walk's budget does not
                    # count a prepare pass's rows.
                    del sources, acc, deg, degrees, counts, begin_kw
            _trim(self.device)
            self._aggregate(prepared, capacity, buffer_bytes)
            _trim(self.device)
        finally:
            for rows in [*prepared.values(), *([self.own] if self.own is not None else [])]:
                rows.close()
                rows.path.unlink(missing_ok=True)
        if not self.finished.all():
            missing = np.flatnonzero(~self.finished)[:5].tolist()
            raise AssertionError(f"layer {l}: partitions {missing} never finished (a plan without their buckets)")

    def _relation_counts(self, k: int, num_relations: int) -> np.ndarray:
        """[P_k, R] int32: partition k's in-edges per destination and relation, from the
        relations and destinations of its column of buckets (contiguous: edges are stored by
        destination partition), read once per layer (in the prepare pass's reading thread:
        the caller counts the bytes, ``hi - lo`` edges of both arrays)."""
        store, p = self.store, self.store.num_partitions
        lo, hi = int(store.bucket_offsets[k * p]), int(store.bucket_offsets[(k + 1) * p])
        dst, rel = store.read_many([("edges/dst", lo, hi, None), ("edges/rel", lo, hi, None)])
        start, stop = store.partition_range(k)
        group = (dst.astype(np.int64) - start) * num_relations + rel.astype(np.int64)
        return np.bincount(group, minlength=(stop - start) * num_relations).astype(np.int32).reshape(
            stop - start, num_relations)

    def _count_bytes(self, k: int, counts: np.ndarray | None) -> int:
        """Bytes `_relation_counts` read for partition k (none without counts)."""
        if counts is None:
            return 0
        p = self.store.num_partitions
        edges = int(self.store.bucket_offsets[(k + 1) * p]) - int(self.store.bucket_offsets[k * p])
        return edges * (self.store.array("edges/dst").dtype.itemsize + self.store.array("edges/rel").dtype.itemsize)

    def _finish(self, k: int, acc: PartialAggregate) -> None:
        if self.own is not None:
            acc.own = self._to_device(torch.from_numpy(self.own.read(k)))
            self._add(bytes_read=acc.own.numel() * 4, planned_bytes=acc.own.numel() * 4)
        y = self.layer_.partial_finish(acc)
        if not self.last:
            y = self.model.activation(y)
        self._add(bytes_written=self.target.write(k, y.cpu().numpy()))
        self.finished[k] = True

    # ------------------------------------------------------------------ pass 2: aggregate

    def _capacity(self, layer, capacity: int | None, buffer_bytes: int | None):
        """This layer's capacity, its plan and the most edges a piece may hold: the given
        capacity with whole buckets, or what ``buffer_bytes`` allows (`_fit`)."""
        if capacity is not None:  # no budget: pieces of the largest bucket, none cut
            c = min(capacity, self.store.num_partitions)
            return c, self._plan(c), max(int(self.sizes.max(initial=0)), 1)
        c, piece_edges = self._fit(self.l, self._costs(layer), buffer_bytes)
        return c, self._plan(c), piece_edges

    def _plan(self, c: int):
        """BETA's plan at capacity ``c`` (None: every partition resident), made once per c."""
        p = self.store.num_partitions
        if c >= p:
            return None
        if c not in self._plans:
            self._plans[c] = plan_epoch("beta", num_partitions=p, capacity=c, epoch=0, seed=self.seed)
        return self._plans[c]

    def _slots(self, c: int) -> int:
        """Partitions of prepared rows and accumulators held at capacity ``c`` (with prefetch,
        the next state's admission besides)."""
        plan = self._plan(c)
        if plan is None:
            return self.store.num_partitions
        return slots_needed(plan.states, prefetch=self.prefetch)

    def _costs(self, layer) -> _Costs:
        """What a layer's passes hold, per partition and per edge (`_Costs`)."""
        P = self.store.partition_size
        source_row, acc_row, own_row = _row_bytes(layer, self.model.kind)
        finish = P * (own_row + acc_row + 3 * 4 * _out_width(layer))
        prepare = P * (3 * 4 * layer.in_dim + source_row + acc_row + own_row) + finish
        id_bytes = 2 * np.dtype(self.store.manifest.index_dtype).itemsize + 4 * (len(self.edge_names) - 2)
        update_edges = max(1, UPDATE_BYTES // source_row)
        if self.model.kind == "gat":
            # Logits, gathered scores, weights and the expanded index: [E, heads] each.
            temporaries = 8 * 4 * layer.heads
            update_edges = max(update_edges, P)
        elif self.model.kind == "rgcn":
            # Compact form: each edge's message [out] besides its gathered row, and the sort
            # order, the sorted relations, the group sizes and the scale.
            temporaries = 4 * _out_width(layer) + 4 * 8
        else:
            temporaries = 0
        return _Costs(prepare=prepare, slot=P * (source_row + acc_row), finish=finish,
                      edge_ids=2 * (id_bytes + INDEX_BYTES * len(self.edge_names)),
                      edge_update=2 * source_row + temporaries, update_edges=update_edges)

    def _room(self, costs: _Costs, c: int, buffer_bytes: int) -> int:
        """Edges a piece may hold at capacity ``c``: what the budget leaves after the slots."""
        return costs.edges_within(buffer_bytes - self._slots(c) * costs.slot - costs.finish)

    def _least_bytes(self, costs: _Costs) -> int:
        walk = self._slots(min(2, self.store.num_partitions)) * costs.slot + costs.finish
        return max(costs.prepare, walk + costs.edge_bytes(MIN_PIECE_EDGES))

    def _fit(self, l: int, costs: _Costs, buffer_bytes: int) -> tuple[int, int]:
        """The capacity and piece size of layer ``l`` under ``buffer_bytes``: the most
        partitions that leave pieces their ``EDGE_SHARE`` of the budget, every partition when
        they all fit (edges then take the rest), else two with whatever the slots leave, as
        long as that is `MIN_PIECE_EDGES` or more. The largest bucket plays no part: a bucket
        larger than a piece is cut (`_pieces`).

        Raises
        ------
        ConfigError
            Not even that fits: the message gives the floor and what it is made of.
        """
        p = self.store.num_partitions
        least = min(2, p)
        if costs.prepare > buffer_bytes or self._room(costs, least, buffer_bytes) < MIN_PIECE_EDGES:
            raise self._too_small(l, costs, buffer_bytes)
        share = max(costs.edges_within(int(buffer_bytes * EDGE_SHARE)), MIN_PIECE_EDGES)
        lo, hi = least, p  # the largest c that fits, by bisection (the slots grow with c)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._room(costs, mid, buffer_bytes) >= share:
                lo = mid
            else:
                hi = mid - 1
        room = self._room(costs, lo, buffer_bytes)
        return lo, room if lo == p else min(share, room)

    def _too_small(self, l: int, costs: _Costs, buffer_bytes: int) -> ConfigError:
        c = min(2, self.store.num_partitions)
        slots = self._slots(c)
        edges = costs.edge_bytes(MIN_PIECE_EDGES)
        walk = slots * costs.slot + costs.finish + edges
        if walk >= costs.prepare:
            ahead = f", {slots - c} more read ahead" if slots > c else ""
            what = (f"{slots} partitions of prepared rows and accumulators ({slots * costs.slot}; "
                    f"{c} resident{ahead}) + finishing one ({costs.finish}) "
                    f"+ a piece of {MIN_PIECE_EDGES} edges ({edges})")
        else:
            what = (f"its prepare pass: three partitions of its {self.model.layers[l].in_dim}-wide input "
                    f"and one of prepared rows and accumulators")
        return ConfigError(f"buffer_bytes {buffer_bytes} is too small for layer {l} of the model: it needs "
                           f"{max(walk, costs.prepare)} bytes: {what} "
                           f"(min_buffer_bytes gives the least that works)")

    def _pieces(self, states, state_of: np.ndarray,
                piece_edges: int) -> list[tuple[int, list[tuple[int, int, int]]]]:
        """The walk's steps: each state's non-empty buckets ``b = j * p + i`` (ascending) as
        pieces of at most ``piece_edges`` edges, each a list of ``(b, lo, hi)`` edge
        positions. A bucket that fits a piece is never cut (read as it is stored, with its own
        checksum); a larger one fills the open piece, then whole pieces, then opens the next
        with its rest: consecutive ranges of its edges, so of its destinations (a bucket is
        sorted by destination). A state with no bucket is a step too (its admissions may be
        needed later)."""
        p, offsets = self.store.num_partitions, self.store.bucket_offsets
        steps = []
        for s, state in enumerate(states):
            buckets = sorted(j * p + i for j in state for i in state if state_of[i, j] == s and self.sizes[i, j] > 0)
            piece, edges = [], 0
            for b in buckets:
                lo, hi = int(offsets[b]), int(offsets[b + 1])
                whole = hi - lo <= piece_edges
                while lo < hi:
                    if edges == piece_edges or (whole and edges + hi - lo > piece_edges):
                        steps.append((s, piece))
                        piece, edges = [], 0
                    stop = min(hi, lo + piece_edges - edges)
                    piece.append((b, lo, stop))
                    edges += stop - lo
                    lo = stop
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
        slots = {name: torch.empty(num_slots * P, *r.shape, device=self.device)
                 for name, r in prepared.items()}
        sources = PartialSources(**slots)
        # The accumulators live in slots too, read back into the slot of their partition:
        # allocated once, they are the slot bytes the budget counts, not a partition-sized
        # allocation per admission for the allocator to keep when it is freed.
        acc_slots = {name: torch.empty(num_slots * P, *value.shape[1:], dtype=value.dtype, device=self.device)
                     for name, value in _acc_fields(layer).items()}
        offsets = store.bucket_offsets
        finished = self.finished
        windows = _EdgeWindows(store, self.edge_names, self.window_edges)
        update_edges = self._costs(layer).update_edges
        names = len(self.edge_names)
        staged = self.staged

        def load(t: int) -> _State:
            s, ranges = steps[t]
            where = dict(zip(states[s], slot_plan.slots[s]))
            accs, copies = {}, []
            if t == 0 or steps[t - 1][0] != s:  # the state's first step admits its partitions
                for k in slot_plan.admitted[s]:
                    start, stop = store.partition_range(k)
                    z = where[k]
                    for name, rows in prepared.items():
                        slot = slots[name][z * P:z * P + stop - start]
                        # On the CPU straight into the slot; for a device into host staging,
                        # copied into the slot by the consumer (`_State.copies`).
                        into = self._host(slot.shape) if staged else slot
                        out = into.numpy()
                        rows.read(k, out)
                        self._add(bytes_read=out.nbytes, planned_bytes=out.nbytes)
                        if staged:
                            copies.append((slot, into))
                    if not finished[k]:
                        here = {name: a[z * P:z * P + stop - start] for name, a in acc_slots.items()}
                        into = ({name: self._host(a.shape, a.dtype) for name, a in here.items()}
                                if staged else here)
                        accs[k], nbytes = _restore(root / f"acc{k}.bin", into)
                        self._add(bytes_read=nbytes)
                        if staged:  # the accumulator is made of its slot's rows, filled by the copies
                            restored = {f.name: getattr(accs[k], f.name) for f in fields(accs[k])
                                        if getattr(accs[k], f.name) is not None}
                            copies.extend((here[name], value) for name, value in restored.items())
                            accs[k] = PartialAggregate(**{name: here[name] for name in restored})
            # Whole buckets in coalesced requests of exactly their bytes; ranges of a cut
            # bucket from its window.
            whole_buckets = [b for b, lo, hi in ranges if (lo, hi) == (offsets[b], offsets[b + 1])]
            spans = _bucket_spans(whole_buckets, offsets)
            got = store.read_many([(name, lo, hi, None) for lo, hi, _ in spans for name in self.edge_names])
            nbytes = sum(a.nbytes for a in got)
            whole = {}
            for n, (lo, _, members) in enumerate(spans):
                arrays = got[n * names:(n + 1) * names]
                for b in members:
                    whole[b] = [a[int(offsets[b]) - lo:int(offsets[b + 1]) - lo] for a in arrays]
            del got
            per_dst: dict[int, list] = {}
            for b, lo, hi in ranges:
                if b in whole:
                    arrays = whole.pop(b)
                else:
                    arrays, read = windows.take(b, lo, hi)
                    nbytes += read
                i, j = b % p, b // p
                # Source rows live in i's slot; destination rows are j's local rows.
                src = arrays[0].astype(np.int64)
                src += where[i] * P - i * P
                dst = arrays[1].astype(np.int64)
                dst -= j * P
                per_dst.setdefault(j, []).append((src, dst, arrays[2] if rgcn else None))
            self._add(bytes_read=nbytes, planned_bytes=nbytes)
            pieces = {}
            for j, parts in per_dst.items():
                src, dst, rel = (None if x[0] is None else x[0] if len(x) == 1 else np.concatenate(x)
                                 for x in zip(*parts))
                pieces[j] = tuple(None if x is None else self._pinned(torch.from_numpy(x))
                                  for x in (src, dst, None if rel is None else rel.astype(np.int64)))
            return _State(accs, pieces, copies)

        accs: dict[int, PartialAggregate] = {}

        def make_room(t: int) -> None:
            """Write back the accumulators of the partitions whose slots step t's state takes,
            before the load that reads admissions into those slots starts."""
            if t < len(steps) and (t == 0 or steps[t - 1][0] != steps[t][0]):
                for k in [k for _, k in slot_plan.evicted[steps[t][0]] if k in accs]:
                    nbytes = _spill(root / f"acc{k}.bin", accs.pop(k))
                    self._add(spill_bytes=nbytes, bytes_written=nbytes)

        with torch.no_grad(), _Pipeline(load, len(steps), prefetch=self.prefetch) as pipe:
            for t, (s, _) in enumerate(steps):
                make_room(t)  # a no-op when written already, before its load started
                if t == 0 or steps[t - 1][0] != s:
                    stats.max_resident_partitions = max(stats.max_resident_partitions, len(states[s]))
                loaded = pipe.take(t)
                if self.prefetch:
                    # The next state's load starts now, while this state aggregates: with
                    # prefetch its slots are none this state uses (`assign_slots`), so the
                    # partitions leaving them are done with until they are read back.
                    make_room(t + 1)
                pipe.start(t + 1)
                for slot, host in loaded.copies:  # before this step's updates, on their stream
                    slot.copy_(host, non_blocking=self.pin)
                accs.update(loaded.accs)
                for j, piece in loaded.pieces.items():
                    src, dst, rel = (None if x is None else self._to_device(x) for x in piece)
                    # In equal runs of edges: the temporaries of an update (a gathered row per
                    # edge) are then one size, which the allocator reuses, where pieces of
                    # every size would leave it holding freed blocks of every size.
                    for lo in range(0, src.numel(), update_edges):
                        hi = lo + update_edges
                        layer.partial_update(accs[j], sources, src[lo:hi], dst[lo:hi],
                                             edge_type=None if rel is None else rel[lo:hi])
                    self.remaining[j] -= src.numel()
                    if self.remaining[j] == 0:
                        self._finish(j, accs.pop(j))
                del loaded
        if accs:
            raise AssertionError(f"layer {self.l}: partitions {sorted(accs)[:5]} left unfinished")
