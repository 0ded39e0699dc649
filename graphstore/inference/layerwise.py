"""Exact full-graph inference out of core: every layer for every node, with all neighbours,
one edge bucket at a time.

Layer ``l`` reads its input rows (the store's features for the first layer, the previous
layer's output after) a partition at a time and aggregates with the layers' partial form
(`graphstore.nn.layers`: ``partial_begin/update/finish``; SAR, section 3.2). The order is a
link-prediction plan over the partitions (BETA: ``c`` partitions resident, one swap per
state, every bucket (i, j) in exactly one state where i and j are both resident): bucket
(i, j) adds the rows of partition i to the accumulators of partition j. A destination's
accumulator lives while its partition is resident; when the partition leaves before all its
in-buckets are done, the accumulator is written to the work directory (checksummed) and read
back when it returns, as the buffer writes embeddings back. When its last in-bucket is done
its rows are finished (the layer's output function, then the activation) and written to the
next layer's scratch array (checksummed per partition). Memory is ``c`` partitions of input
rows and accumulators plus one bucket, whatever the graph.

Where this departs from the issue's design, and why: the walk reads partitions and buckets
through the store's verified reads directly rather than through `BufferManager`, because the
buffer's slots hold the store's feature array and this walk's input changes every layer
(scratch arrays); the plan, the one-swap order, the write-back and the byte accounting are
the buffer's.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from graphstore.buffer.policies import plan_epoch
from graphstore.errors import ConfigError, CorruptStoreError
from graphstore.layout.store import Store
from graphstore.nn import GNN, PartialAggregate

__all__ = ["InferenceStats", "ScratchRows", "infer_layerwise"]


@dataclass
class InferenceStats:
    """What one `infer_layerwise` call read, wrote and held."""

    bytes_read: int = 0
    """Input rows, degrees, buckets and spilled accumulators read back."""
    bytes_written: int = 0
    """Layer outputs and spilled accumulators written."""
    planned_bytes: int = 0
    """What the plan says must be read: per layer, every admitted partition's rows and
    degrees and every non-empty bucket (spills come on top)."""
    spill_bytes: int = 0
    """Accumulators written out because their partition left before its last in-bucket."""
    max_resident_partitions: int = 0
    """Most partitions held at once (at most the capacity)."""
    seconds: float = 0.0
    per_layer_seconds: list[float] = field(default_factory=list)


class ScratchRows:
    """A float32 [N, D] array in a file, written and read a partition at a time, each
    partition's bytes checked against the CRC-32 recorded when it was written."""

    def __init__(self, path: Path, num_rows: int, width: int, partition_size: int) -> None:
        self.path, self.num_rows, self.width, self.partition_size = path, num_rows, width, partition_size
        self.rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_rows, width))
        self.crc: dict[int, int] = {}

    def write(self, k: int, rows: np.ndarray) -> int:
        start = k * self.partition_size
        block = np.ascontiguousarray(rows, dtype=np.float32)
        self.rows[start:start + block.shape[0]] = block
        self.crc[k] = zlib.crc32(block)
        return block.nbytes

    def read(self, k: int) -> np.ndarray:
        start = k * self.partition_size
        block = np.array(self.rows[start:min(start + self.partition_size, self.num_rows)])
        if k not in self.crc:
            raise ConfigError(f"{self.path}: partition {k} was never written")
        if zlib.crc32(block) != self.crc[k]:
            raise CorruptStoreError(f"{self.path}: rows of partition {k} fail their checksum")
        return block

    def flush(self) -> None:
        self.rows.flush()


def _spill(path: Path, acc: PartialAggregate) -> int:
    # Not h_dst: the partition's input rows are read again when it returns.
    arrays = {f.name: getattr(acc, f.name).numpy() for f in fields(acc)
              if f.name != "h_dst" and getattr(acc, f.name) is not None}
    crc = 0
    for name in sorted(arrays):
        crc = zlib.crc32(np.ascontiguousarray(arrays[name]), crc)
    np.savez(path, __crc__=np.array([crc], dtype=np.int64), **arrays)
    return sum(a.nbytes for a in arrays.values())


def _restore(path: Path, h_dst: torch.Tensor) -> tuple[PartialAggregate, int]:
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files if name != "__crc__"}
        crc = 0
        for name in sorted(arrays):
            crc = zlib.crc32(np.ascontiguousarray(arrays[name]), crc)
        if crc != int(data["__crc__"][0]):
            raise CorruptStoreError(f"{path}: a spilled accumulator fails its checksum")
    path.unlink()
    return PartialAggregate(h_dst, **{k: torch.from_numpy(v) for k, v in arrays.items()}), sum(
        a.nbytes for a in arrays.values())


def infer_layerwise(model: GNN, store: Store, *, capacity: int | None = None, work_dir: str | Path | None = None,
                    keep: bool = False, nodes: np.ndarray | None = None, seed: int = 0,
                    stats: InferenceStats | None = None,
                    input_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    input_rows: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
    """Every layer of ``model`` over the whole graph of ``store``, exactly (all neighbours,
    global in-degrees for GCN), out of core.

    Parameters
    ----------
    model : GNN
        A trained `graphstore.nn.GNN` (run in eval mode; its mode is restored after).
    store : Store
        The store with the features the model was trained on.
    capacity : int, optional
        Partitions resident at once (>= 2; default a quarter of them, at least 2).
    work_dir : path, optional
        Where the scratch arrays and spilled accumulators go: a new ``graphstore-infer-*``
        directory inside it (the system's temporary directory by default), removed afterwards
        unless ``keep``; nothing else in ``work_dir`` is touched.
    nodes : int array, optional
        Store ids whose outputs to return (default every node).
    seed : int
        Seeds the BETA order (the result does not depend on it).
    stats : InferenceStats, optional
        Filled with the bytes read and written and the peak residency.
    input_transform : callable, optional
        Applied to each partition's feature rows as they are read (e.g. the trainers'
        row normalisation, which training applied per batch).
    input_rows : callable, optional
        ``k -> [P_k, in_dim]`` the first layer's input rows of partition k, instead of the
        store's features (e.g. learnable embeddings: ``table.read_partition(k)[:, 0]``).

    Returns
    -------
    numpy.ndarray
        float32 [len(nodes) or N, out_dim]: the last layer's output (logits, or node
        embeddings for a link-prediction encoder).
    """
    if input_rows is None and not store.manifest.has_features:
        raise ConfigError(f"{store.path}: layer-wise inference needs the store's features")
    if model.kind == "rgcn" and not store.manifest.has_relations:
        raise ConfigError(f"{store.path}: an RGCN needs edge relations; the store has none")
    p, P, n = store.num_partitions, store.partition_size, store.num_nodes
    c = capacity if capacity is not None else max(2, math.ceil(p / 4))
    if c < min(2, p):
        raise ConfigError(f"capacity must be at least 2 partitions (got {c})")
    c = min(c, p)
    stats = stats if stats is not None else InferenceStats()
    started = time.perf_counter()
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="graphstore-infer-", dir=work_dir))
    was_training = model.training
    model.eval()
    try:
        # One plan for every layer: BETA over the partitions (with c >= p, one state).
        plan = plan_epoch("beta", num_partitions=p, capacity=c, epoch=0, seed=seed) if c < p else None
        sizes = np.diff(store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: edges of bucket (i, j)
        source: ScratchRows | None = None  # None: the store's features
        for l, layer in enumerate(model.layers):
            t0 = time.perf_counter()
            width = _out_width(layer)
            target = ScratchRows(root / f"layer{l + 1}.npy", n, width, P)
            _run_layer(model, l, layer, store, plan, sizes, source, target, root, stats,
                       input_transform if l == 0 else None, input_rows)
            target.flush()
            if source is not None:
                del source.rows
                source.path.unlink()
            source = target
            stats.per_layer_seconds.append(time.perf_counter() - t0)
        out = source.rows if nodes is None else source.rows[np.asarray(nodes, dtype=np.int64)]
        result = np.array(out)
        del source.rows
        return result
    finally:
        model.train(was_training)
        stats.seconds = time.perf_counter() - started
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _out_width(layer) -> int:
    if hasattr(layer, "heads"):
        return layer.heads * layer.out_dim if layer.concat else layer.out_dim
    return layer.out_dim


def _run_layer(model: GNN, l: int, layer, store: Store, plan, sizes: np.ndarray, source: ScratchRows | None,
               target: ScratchRows, root: Path, stats: InferenceStats,
               transform: Callable[[torch.Tensor], torch.Tensor] | None,
               input_rows: Callable[[int], np.ndarray] | None) -> None:
    p, P = store.num_partitions, store.partition_size
    gcn, rgcn = model.kind == "gcn", model.kind == "rgcn"
    last = l == model.num_layers - 1
    remaining = (sizes > 0).sum(axis=0)  # in-buckets still to add, per destination partition
    finished = np.zeros(p, dtype=bool)
    states = plan.states if plan is not None else [tuple(range(p))]
    state_of = np.asarray(plan.bucket_states) if plan is not None else np.zeros((p, p), dtype=np.int64)
    rows: dict[int, torch.Tensor] = {}
    sources = {}  # per resident partition, its rows prepared once for every bucket they feed
    degrees: dict[int, torch.Tensor] = {}
    accs: dict[int, PartialAggregate] = {}
    spilled: set[int] = set()

    def admit(k: int) -> None:
        if source is not None:
            block = source.read(k)
        else:
            block = input_rows(k) if input_rows is not None else store.read_features(k)
        rows[k] = torch.from_numpy(np.asarray(block, dtype=np.float32))
        stats.bytes_read += rows[k].numel() * 4
        stats.planned_bytes += rows[k].numel() * 4
        if transform is not None:
            rows[k] = transform(rows[k])
        if gcn:
            deg = store.read_rows("nodes/in_degree", *store.partition_range(k))
            degrees[k] = torch.from_numpy(np.asarray(deg, dtype=np.int64))
            stats.bytes_read += deg.nbytes
            stats.planned_bytes += deg.nbytes
        sources[k] = layer.partial_sources(rows[k], degrees_src=degrees.get(k))
        if k in spilled:
            accs[k], nbytes = _restore(root / f"acc{k}.npz", rows[k])
            spilled.discard(k)
            stats.bytes_read += nbytes
        elif not finished[k]:
            accs[k] = layer.partial_begin(rows[k], degrees_dst=degrees.get(k))

    def finish(k: int) -> None:
        y = layer.partial_finish(accs.pop(k))
        if not last:
            y = model.activation(y)
        stats.bytes_written += target.write(k, y.numpy())
        finished[k] = True

    def evict(k: int) -> None:
        rows.pop(k, None)
        sources.pop(k, None)
        degrees.pop(k, None)
        if k in accs:  # an in-bucket is still to come: the accumulator waits on disk
            nbytes = _spill(root / f"acc{k}.npz", accs.pop(k))
            spilled.add(k)
            stats.spill_bytes += nbytes
            stats.bytes_written += nbytes

    with torch.no_grad():
        for s, state in enumerate(states):
            for k in [k for k in rows if k not in state]:
                evict(k)
            for k in state:
                if k not in rows:
                    admit(k)
            stats.max_resident_partitions = max(stats.max_resident_partitions, len(rows))
            for j in state:
                for i in state:
                    if state_of[i, j] != s or sizes[i, j] == 0:
                        continue
                    src, dst, rel = store.read_bucket(i, j)
                    nbytes = src.nbytes + dst.nbytes + (0 if rel is None else rel.nbytes)
                    stats.bytes_read += nbytes
                    stats.planned_bytes += nbytes
                    src_local = torch.from_numpy(src.astype(np.int64) - i * P)
                    dst_local = torch.from_numpy(dst.astype(np.int64) - j * P)
                    layer.partial_update(accs[j], sources[i], src_local, dst_local,
                                         edge_type=None if not rgcn else torch.from_numpy(rel.astype(np.int64)))
                    remaining[j] -= 1
                if remaining[j] == 0 and not finished[j]:
                    finish(j)
        for k in list(rows):
            evict(k)
    if not finished.all():
        missing = np.flatnonzero(~finished)[:5].tolist()
        raise AssertionError(f"layer {l}: partitions {missing} never finished (a plan without their buckets)")
