"""Macro-batching (BatchGNN, sections 3-4): the structure resident, the features in the
store, each group of mini-batches' input rows fetched once.

`MacroBatchGather` replaces `GatherRows` in the ``macrobatch`` scheme. It takes ``B``
sampled mini-batches at a time (a *macro-batch*; ``B = -1``: every batch of the epoch), takes
the union of their input nodes, reads those rows from the store once, in store-id order, and
hands the mini-batches on in their order, each gathering its rows from the macro-batch's
rows. A background thread samples and reads macro-batch ``k + 1`` while ``k`` trains. The
mini-batches are exactly the ones the ``minibatch`` scheme draws (same sampler, same
streams, the whole graph), so training is unchanged; only the reads differ.

Reads. The store verifies every byte it returns. `FeatureFetch` reads a round's union with
`Store.read_row_set`: the ~4 KiB feature blocks holding the rows (each with its own
checksum), neighbouring blocks in one request. Its counters separate the rows asked for
(the union) from the blocks and bytes read. Where this departs from BatchGNN, and why:
BatchGNN fetches rows over the network from their owners, row by row; here they come from
a local SSD, whose least read is a 4 KiB page.

``macro_batch_bytes`` bounds what a macro-batch holds: its samples (a macro-batch is cut
short, at one mini-batch at least, when the samples of its mini-batches reach the bound:
``B = all`` under a small budget holds what fits, not the epoch) and its rows (a union
larger than the bound is read in ``F`` rounds, each of consecutive mini-batches whose union
fits, at least one mini-batch per round). With the prefetch thread, two macro-batches are
held at once: the one training and the next. A `FeatureCache` (optional,
``feature_cache_bytes``) keeps rows between rounds, by Belady's policy over the rounds
sampled ahead, or by LRU.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from graphstore.buffer.slots import feature_tensor_dtype
from graphstore.errors import ConfigError
from graphstore.layout._rowsets import RowSetStats
from graphstore.layout.dtypes import decode, storage_dtype
from graphstore.layout.store import Store
from graphstore.loaders.batches import NodeBatch
from graphstore.loaders.feature_cache import CacheStats, FeatureCache
from graphstore.nn.aggregate import AggregateSource

__all__ = ["DEFAULT_CACHE_LOOKAHEAD", "FeatureFetch", "FetchStats", "MacroBatchGather", "fetch_dtype"]

DEFAULT_CACHE_LOOKAHEAD = 32
"""Mini-batches a Belady feature cache sees ahead (their samples are held in memory)."""


@dataclass
class FetchStats:
    """What the macro-batches of one epoch fetched."""

    macro_batches: int = 0
    rounds: int = 0
    mini_batches: int = 0
    rows_requested: int = 0
    """Input rows of the mini-batches, each counted in its own mini-batch (what fetching every
    mini-batch alone would fetch)."""
    rows_union: int = 0
    """Rows of the rounds' unions: what macro-batching needed."""
    rows_fetched: int = 0
    """Rows read from the store (the unions' rows less the feature cache's hits)."""
    cache_hits: int = 0
    """Rows of the unions served by the feature cache."""
    cache_rows: int = 0
    """Rows the feature cache held after the last round."""
    blocks_read: int = 0
    """Feature blocks read and verified (whole chunks, for a store without block checksums)."""
    requests: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    stall_seconds: float = 0.0
    """Wall time the consumer waited for a round's rows (with ``prefetch=False``: all of
    the sampling and reading)."""
    rows_local: int = 0
    """Distributed fetch (`graphstore.distributed.feature_fetch`): rows of the unions this
    rank owns, served from its own memory."""
    rows_remote: int = 0
    """Distributed fetch: rows of the unions fetched from the ranks owning them."""
    bytes_sent: int = 0
    """Distributed fetch: bytes this rank sent to other ranks (request counts and ids, rows served)."""
    exchanges: int = 0
    """Distributed fetch: collective rounds carrying this rank's requests (one per round above)."""
    padding_exchanges: int = 0
    """Distributed fetch: empty collective rounds at the epoch's end, matching the ranks with
    more rounds (and the last one, in which every rank learns that all are done)."""

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))


class FeatureFetch:
    """Rows of ``nodes/features`` for ascending store ids, through the store's verified
    scattered reads (`Store.read_row_set`: the ~4 KiB blocks holding them); with
    ``aggregated``, each row followed by the same node's stored aggregate
    (``nodes/aggregated_<op>``, read the same way), so a row is ``[x_v | agg_v]``."""

    def __init__(self, store: Store, aggregated: str | None = None) -> None:
        self.store = store
        self.arrays = store.input_arrays(aggregated)
        self.feature_dim = store.feature_dim
        self.dim = store.feature_dim * len(self.arrays)
        """Width of a fetched row."""
        self.feature_dtype = store.manifest.feature_dtype
        # Alone, rows stay as stored (bfloat16: uint16 bits); beside the float32 aggregates
        # they are decoded to float32 numbers first (concatenating would convert bfloat16's
        # bits as integers).
        self.dtype = storage_dtype(self.feature_dtype) if len(self.arrays) == 1 else np.dtype(np.float32)
        """dtype of a fetched row: the features' as stored (float16 stays float16, bfloat16
        its uint16 bits), float32 with the aggregates beside them (they are stored float32)."""

    def __call__(self, ids: np.ndarray, stats: FetchStats) -> np.ndarray:
        """[len(ids), dim]: the rows of ``ids`` (ascending, distinct)."""
        read = RowSetStats()
        parts = [self.store.read_row_set(name, ids, stats=read) for name in self.arrays]
        out = parts[0] if len(parts) == 1 else np.concatenate([decode(parts[0], self.feature_dtype), *parts[1:]], axis=1)
        stats.blocks_read += read.blocks
        stats.requests += read.requests
        stats.bytes_read += read.bytes_read
        stats.read_seconds += read.seconds
        stats.rows_fetched += int(ids.size)
        return out


@dataclass
class _Failure:
    error: BaseException


@dataclass
class _Round:
    """A round's rows and its mini-batches; each batch's features are gathered from the
    rows when the consumer takes it (holding one batch's gather at a time, not B)."""

    rows: torch.Tensor
    union: np.ndarray
    sampled: list
    ids: list[np.ndarray]
    feature_dim: int
    """Columns of ``rows`` that are features; the rest, if any, the stored aggregates."""
    feature_dtype: torch.dtype
    """The store's features' dtype: a batch's features come in it, whatever the rows were
    held in (float32 beside the aggregates, or from a distributed fetch)."""
    aggregated_from: AggregateSource | None = None
    """What the columns after ``feature_dim`` are, if any."""

    def batches(self) -> Iterator[NodeBatch]:
        d = self.feature_dim
        for s, mine in zip(self.sampled, self.ids):
            g = s.graph
            rows = self.rows.index_select(0, torch.from_numpy(np.searchsorted(self.union, mine)))
            labels = g.labels.index_select(0, s.dense.targets).long()
            features = rows[:, :d].to(self.feature_dtype)  # exact: half values widened, then narrowed back
            if rows.shape[1] == d:
                yield NodeBatch(s.dense, features, labels, g)
            else:
                yield NodeBatch(s.dense, features, labels, g, aggregated=rows[:, d:],
                                aggregated_from=self.aggregated_from)


_END = object()


def _timed(wait, stats: FetchStats):
    """``wait()``, its wall time counted as the consumer's stall."""
    t0 = time.perf_counter()
    try:
        return wait()
    finally:
        stats.stall_seconds += time.perf_counter() - t0


def aggregate_source(store: Store, op: str) -> AggregateSource:
    """The stored aggregate ``op`` of ``store`` as batches carry it (its manifest record)."""
    record = store.aggregates[op]
    return AggregateSource(f"{store.path}/{record['array']}", op, record["input"])


def fetch_dtype(fetch) -> np.dtype:
    """dtype of the rows ``fetch`` returns (an injected fetch without ``dtype``: float32)."""
    return np.dtype(getattr(fetch, "dtype", np.float32))


def _sample_bytes(dense) -> int:
    """Bytes of a DENSE's tensors (what a held, not yet trained mini-batch costs)."""
    tensors = [dense.node_ids, dense.node_id_offsets, dense.nbrs, dense.nbr_offsets, *dense.repr_map]
    if dense.edge_ids is not None:
        tensors.append(dense.edge_ids)
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class _Macro:
    """One macro-batch, sampled: its mini-batches, their input ids, and its rounds."""

    sampled: list
    ids: list[np.ndarray]
    rounds: list[tuple[int, int, np.ndarray]]
    """``(start, stop, union)``: mini-batches ``[start, stop)`` and their sorted input ids."""


class MacroBatchGather:
    """The stage: sampled mini-batches in, `NodeBatch` out, rows fetched per macro-batch.

    Parameters
    ----------
    store : Store
        Where the feature rows are read from.
    macro_batches : int
        Mini-batches per macro-batch ``B`` (>= 1), or -1 for every batch of the epoch.
    macro_batch_bytes : int, optional
        Most bytes of samples a macro-batch holds, and of rows a round holds; default no
        bound (B mini-batches, one round per macro-batch).
    prefetch : bool
        Sample and read the next macro-batch in a background thread.
    cache : FeatureCache, optional
        Rows kept between rounds (`graphstore.loaders.feature_cache`); it lasts across epochs.
    cache_lookahead : int
        Mini-batches sampled ahead so a Belady cache knows their rows (whole macro-batches:
        ``ceil(cache_lookahead / B)`` of them are held, sampled, beyond the current one).
    aggregated : str, optional
        Also read each row's stored neighbour aggregate (``mean``, ``sum`` or ``gcn``;
        `FeatureFetch`) into the batches' ``aggregated``.
    fetch : optional
        What reads a round's rows instead of a `FeatureFetch` of ``store``: an object with
        its interface (``dim``, ``feature_dim``, optionally ``dtype`` (default float32),
        ``__call__(ids, stats) -> rows``) and
        optionally ``finish(stats)``, called once after the epoch's last round (from the
        thread that fetched). The distributed fetch
        (`graphstore.distributed.feature_fetch.PartitionedFetch`) is injected here, so this
        room needs no torch.distributed.
    """

    def __init__(self, store: Store, *, macro_batches: int, macro_batch_bytes: int | None = None,
                 prefetch: bool = True, cache: FeatureCache | None = None,
                 cache_lookahead: int = DEFAULT_CACHE_LOOKAHEAD, aggregated: str | None = None,
                 fetch=None) -> None:
        if macro_batches == 0 or macro_batches < -1:
            raise ConfigError(f"macro_batches must be >= 1, or -1 for all (got {macro_batches})")
        if macro_batch_bytes is not None and macro_batch_bytes < 1:
            raise ConfigError(f"macro_batch_bytes must be >= 1 (got {macro_batch_bytes})")
        if cache_lookahead < 0:
            raise ConfigError(f"cache_lookahead must be >= 0 (got {cache_lookahead})")
        self.fetch = FeatureFetch(store, aggregated) if fetch is None else fetch
        if cache is not None and cache.dim != self.fetch.dim:
            raise ConfigError(f"the feature cache holds rows of width {cache.dim}; the fetch reads {self.fetch.dim}")
        if cache is not None and cache.dtype != fetch_dtype(self.fetch):
            raise ConfigError(f"the feature cache holds {cache.dtype} rows; the fetch reads {fetch_dtype(self.fetch)}")
        self.feature_dtype = feature_tensor_dtype(store.manifest.feature_dtype)
        self.aggregated_from = None if aggregated is None else aggregate_source(store, aggregated)
        self.macro_batches, self.macro_batch_bytes, self.prefetch = macro_batches, macro_batch_bytes, prefetch
        self.cache, self.cache_lookahead = cache, cache_lookahead
        self.stats = FetchStats()

    @property
    def macro_batches_ahead(self) -> int:
        """Macro-batches sampled beyond the current one (only a Belady cache uses them)."""
        if self.cache is None or self.cache.policy != "belady" or self.macro_batches == -1:
            return 0
        return -(-self.cache_lookahead // self.macro_batches)

    def __call__(self, batches: Iterator, ctx) -> Iterator[NodeBatch]:
        stats = FetchStats()
        self.stats = stats
        if not self.prefetch:
            rounds = self._rounds(batches, stats, lambda: False)
            while (round_ := _timed(lambda: next(rounds, _END), stats)) is not _END:
                yield from round_.batches()
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
                item = _timed(handoff.get, stats)
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield from item.batches()
        finally:
            stop.set()
            while thread.is_alive():  # unblock a put, then wait for the thread
                try:
                    handoff.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()

    def _rounds(self, batches: Iterator, stats: FetchStats, stopped) -> Iterator[_Round]:
        """Each round of each macro-batch, its rows read, in order. Holds the current
        macro-batch and ``macro_batches_ahead`` sampled ones after it."""
        source = iter(batches)
        window: deque[_Macro] = deque()
        exhausted = False
        while True:
            while not exhausted and len(window) < 1 + self.macro_batches_ahead:
                macro = self._next_macro(source)
                if macro is None:
                    exhausted = True
                else:
                    window.append(macro)
            if not window:
                finish = getattr(self.fetch, "finish", None)
                if finish is not None:  # a collective fetch matches the ranks' round counts
                    finish(stats)
                return
            macro = window.popleft()
            stats.macro_batches += 1
            for r, (start, stop, union) in enumerate(macro.rounds):
                if self.cache is None:
                    rows = self.fetch(union, stats)
                else:
                    future = [u for *_, u in macro.rounds[r + 1:]] + [u for m in window for *_, u in m.rounds]
                    served = CacheStats()
                    rows = self.cache.serve(union, future, lambda ids: self.fetch(ids, stats), served)
                    stats.cache_hits += served.hits
                    stats.cache_rows = served.rows_kept
                stats.rows_union += int(union.size)
                stats.rounds += 1
                # uint16 rows are a bfloat16 store's bits (the only uint16 a fetch returns).
                held = torch.from_numpy(rows)
                yield self._round(macro, start, stop, union, held.view(torch.bfloat16) if rows.dtype == np.uint16
                                  else held, stats)
                if stopped():
                    return

    def _next_macro(self, source: Iterator) -> _Macro | None:
        """The next ``B`` sampled mini-batches (all that are left for ``B = -1``), fewer when
        their samples reach ``macro_batch_bytes`` (at least one), or None at the end."""
        limit = None if self.macro_batches == -1 else self.macro_batches
        sampled, ids, held = [], [], 0
        for s in source:
            sampled.append(s)
            ids.append(s.graph.node_ids[s.dense.node_ids].numpy())
            held += _sample_bytes(s.dense) + ids[-1].nbytes
            if len(sampled) == limit or (self.macro_batch_bytes is not None and held >= self.macro_batch_bytes):
                break
        if not sampled:
            return None
        return _Macro(sampled, ids, self._split(ids))

    def _split(self, ids: list[np.ndarray]) -> list[tuple[int, int, np.ndarray]]:
        """Rounds: from each start, the longest run of mini-batches whose union fits
        ``macro_batch_bytes`` (at least one)."""
        if self.macro_batch_bytes is None:
            return [(0, len(ids), np.unique(np.concatenate(ids)))]
        row_bytes = fetch_dtype(self.fetch).itemsize * self.fetch.dim
        rounds, start = [], 0
        while start < len(ids):
            stop, union = start + 1, np.unique(ids[start])
            while stop < len(ids):
                grown = np.union1d(union, ids[stop])
                if grown.size * row_bytes > self.macro_batch_bytes:
                    break
                union, stop = grown, stop + 1
            rounds.append((start, stop, union))
            start = stop
        return rounds

    def _round(self, macro: _Macro, start: int, stop: int, union: np.ndarray, rows: torch.Tensor,
               stats: FetchStats) -> _Round:
        stats.mini_batches += stop - start
        stats.rows_requested += sum(int(mine.size) for mine in macro.ids[start:stop])
        return _Round(rows, union, macro.sampled[start:stop], macro.ids[start:stop], self.fetch.feature_dim,
                      self.feature_dtype, self.aggregated_from)
