"""Macro-batching (BatchGNN, sections 3-4): the structure resident, the features in the
store, each group of mini-batches' input rows fetched once.

`MacroBatchGather` replaces `GatherRows` in the ``macrobatch`` scheme. It takes ``B``
sampled mini-batches at a time (a *macro-batch*; ``B = -1``: every batch of the epoch), takes
the union of their input nodes, reads those rows from the store once, in store-id order, and
hands the mini-batches on in their order, each gathering its rows from the macro-batch's
rows. A background thread samples and reads macro-batch ``k + 1`` while ``k`` trains. The
mini-batches are exactly the ones the ``minibatch`` scheme draws (same sampler, same
streams, the whole graph), so training is unchanged; only the reads differ.

Reads. The store verifies every byte it returns. Feature chunks carry one checksum each, so
a read of part of a chunk is verified by reading the whole chunk. `FeatureFetch` therefore
reads each chunk that holds a needed row once per round, whole, and runs of consecutive
chunks in one request, then picks the rows. Its counters separate the rows asked for (the
union) from the bytes read. Where this departs from BatchGNN, and why: BatchGNN fetches rows
over the network from their owners, row by row. Here the rows come from a local SSD, where
a request costs the same for a 4 KiB page or a 4 MiB chunk range, and where checksums are
per chunk.

``macro_batch_bytes`` bounds the rows held: a macro-batch whose union is larger is read in
``F`` rounds, each of consecutive mini-batches whose union fits (at least one mini-batch
per round).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from graphstore.errors import ConfigError
from graphstore.layout.store import Store
from graphstore.loaders.batches import NodeBatch

__all__ = ["FeatureFetch", "FetchStats", "MacroBatchGather"]

READ_PIECE_BYTES = 64 << 20
"""Most bytes one request of a run of chunks reads before its rows are picked (so a round's
reads stay bounded whatever the union)."""


@dataclass
class FetchStats:
    """What the macro-batches of one epoch fetched."""

    macro_batches: int = 0
    rounds: int = 0
    mini_batches: int = 0
    rows_requested: int = 0
    """Input rows of the mini-batches, each counted in its own mini-batch (what fetching every
    mini-batch alone would fetch)."""
    rows_fetched: int = 0
    """Rows of the rounds' unions: what macro-batching fetched."""
    chunks_read: int = 0
    requests: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))


class FeatureFetch:
    """Rows of ``nodes/features`` for ascending store ids, read whole chunk by whole chunk
    (verified by the chunks' checksums), one request per run of consecutive chunks."""

    def __init__(self, store: Store) -> None:
        if not store.manifest.has_features:
            raise ConfigError(f"{store.path}: macro-batching reads feature rows; the store has none")
        self.store = store
        self.chunk_rows = int(store.array("nodes/features").chunks[0])
        self.dim = store.feature_dim

    def __call__(self, ids: np.ndarray, stats: FetchStats) -> np.ndarray:
        """float32 [len(ids), D]: the rows of ``ids`` (ascending, distinct)."""
        import time

        out = np.empty((ids.size, self.dim), dtype=np.float32)
        if ids.size == 0:
            return out
        n, R = self.store.num_nodes, self.chunk_rows
        chunks = np.unique(ids // R)
        # Runs of consecutive chunks, cut so one request reads at most READ_PIECE_BYTES.
        per_piece = max(1, READ_PIECE_BYTES // (R * self.dim * 4))
        breaks = np.flatnonzero(np.diff(chunks) != 1) + 1
        t0 = time.perf_counter()
        for run in np.split(chunks, breaks):
            for lo in range(0, run.size, per_piece):
                first, last = int(run[lo]), int(run[min(lo + per_piece, run.size) - 1])
                start, stop = first * R, min((last + 1) * R, n)
                block = self.store.read_rows("nodes/features", start, stop)
                i, j = np.searchsorted(ids, [start, stop])
                out[i:j] = block[ids[i:j] - start]
                stats.requests += 1
                stats.chunks_read += last - first + 1
                stats.bytes_read += block.nbytes
        stats.read_seconds += time.perf_counter() - t0
        stats.rows_fetched += int(ids.size)
        return out


@dataclass
class _Failure:
    error: BaseException


@dataclass
class _Round:
    batches: list[NodeBatch] = field(default_factory=list)


_END = object()


class MacroBatchGather:
    """The stage: sampled mini-batches in, `NodeBatch` out, rows fetched per macro-batch.

    Parameters
    ----------
    store : Store
        Where the feature rows are read from.
    macro_batches : int
        Mini-batches per macro-batch ``B`` (>= 1), or -1 for every batch of the epoch.
    macro_batch_bytes : int, optional
        Most bytes of rows a round holds; default no bound (one round per macro-batch).
    prefetch : bool
        Sample and read the next macro-batch in a background thread.
    """

    def __init__(self, store: Store, *, macro_batches: int, macro_batch_bytes: int | None = None,
                 prefetch: bool = True) -> None:
        if macro_batches == 0 or macro_batches < -1:
            raise ConfigError(f"macro_batches must be >= 1, or -1 for all (got {macro_batches})")
        if macro_batch_bytes is not None and macro_batch_bytes < 1:
            raise ConfigError(f"macro_batch_bytes must be >= 1 (got {macro_batch_bytes})")
        self.fetch = FeatureFetch(store)
        self.macro_batches, self.macro_batch_bytes, self.prefetch = macro_batches, macro_batch_bytes, prefetch
        self.stats = FetchStats()

    def __call__(self, batches: Iterator, ctx) -> Iterator[NodeBatch]:
        stats = FetchStats()
        self.stats = stats
        if not self.prefetch:
            for round_ in self._rounds(batches, stats, lambda: False):
                yield from round_.batches
            return
        handoff: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    handoff.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for round_ in self._rounds(batches, stats, stop.is_set):
                    if not put(round_):
                        return
                put(_END)
            except BaseException as exc:  # noqa: BLE001 (reaches the consumer, re-raised there)
                put(_Failure(exc))

        thread = threading.Thread(target=work, name="graphstore-macrobatch", daemon=True)
        thread.start()
        try:
            while True:
                item = handoff.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield from item.batches
        finally:
            stop.set()
            while thread.is_alive():  # unblock a put, then wait for the thread
                try:
                    handoff.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()

    def _rounds(self, batches: Iterator, stats: FetchStats, stopped) -> Iterator[_Round]:
        B = self.macro_batches
        pending = []
        for sampled in batches:
            pending.append(sampled)
            if B != -1 and len(pending) == B:
                yield from self._macro(pending, stats)
                pending = []
            if stopped():
                return
        if pending:
            yield from self._macro(pending, stats)

    def _macro(self, sampled: list, stats: FetchStats) -> Iterator[_Round]:
        stats.macro_batches += 1
        ids = [s.graph.node_ids[s.dense.node_ids].numpy() for s in sampled]
        row_bytes = 4 * self.fetch.dim
        start = 0
        while start < len(sampled):
            # The longest run of mini-batches from ``start`` whose union fits (at least one).
            stop, union = start + 1, np.unique(ids[start])
            while stop < len(sampled) and self.macro_batch_bytes is not None:
                grown = np.union1d(union, ids[stop])
                if grown.size * row_bytes > self.macro_batch_bytes:
                    break
                union, stop = grown, stop + 1
            if self.macro_batch_bytes is None and stop < len(sampled):
                union, stop = np.unique(np.concatenate(ids[start:])), len(sampled)
            rows = torch.from_numpy(self.fetch(union, stats))
            stats.rounds += 1
            out = _Round()
            for s, mine in zip(sampled[start:stop], ids[start:stop]):
                g = s.graph
                features = rows.index_select(0, torch.from_numpy(np.searchsorted(union, mine)))
                labels = g.labels.index_select(0, s.dense.targets).long()
                out.batches.append(NodeBatch(s.dense, features, labels, g))
                stats.mini_batches += 1
                stats.rows_requested += int(mine.size)
            yield out
            start = stop
