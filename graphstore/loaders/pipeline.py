"""The per-batch stages of an epoch run on a pool of loader threads.

An epoch's chain (`graphstore.loaders.stages`) has two kinds of stage. The *walk* and the
*targets* (which states are resident, which targets each batch trains) are cheap and
sequential: they decide what the batches are. Everything after them (neighbour sampling,
gathering the rows, negatives, the micro-batch split, a user's ``transform``) is work on
one batch alone, and is most of the data path's time. `Pipelined` runs that per-batch work
for N batches at once on N threads and hands the results on in order, through a bounded
window of batches in flight.

Threads, not processes: the sampling kernel is a C library called through ctypes, which
releases the GIL for the call, and torch's index and copy ops release it too, so N threads
sample and gather N batches in parallel in one address space, reading the resident graph
in place (worker processes would have to copy or share it). What still holds the GIL is the
Python glue around those calls, a small part of a batch (``tools/bench_loader.py`` measures
the scaling).

The same batches for every N. A batch draws its randomness from its own streams, keyed by
``(seed, epoch, batch index)`` (`EpochContext.batch_generator`), never from a stream shared
with the batches before it, so the thread that runs it and the order in which batches
finish change nothing: ``loader_threads=0`` (inline, in the consumer's thread), 1 or 16
give the same batches in the same order.

The buffer stays safe. A batch refers to its state's resident graph, whose slots the buffer
reuses for the next state. The targets stage marks each state's last batch
(``ends_state``); after handing that one to the pool, the pipeline pulls nothing more from
upstream (which would move the buffer on) until the consumer has taken every batch of the
state and asked for the next one: the moment the sequential chain moves on too.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from graphstore.errors import ConfigError

__all__ = ["QUEUE_SHARE", "BatchStep", "PipelineStats", "Pipelined", "ThreadLocalWorkspace", "available_cores",
           "check_loader_threads", "default_loader_threads"]

QUEUE_SHARE = 8
"""With loader threads and a byte budget, the batches made ahead of the consumer may hold
1/8 of the budget; the buffer is sized from the rest (the budget counts both)."""

BatchFn = Callable[[Any, int], Any]
"""A bound per-batch step: ``(item, batch index) -> item``; safe to call from any thread."""


class BatchStep(Protocol):
    """A stage whose work is per batch: `bind` gives the epoch's function of one item."""

    def bind(self, ctx) -> BatchFn: ...


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores among those this process may run on (``/proc/cpuinfo``'s distinct
    ``(physical id, core id)``), else `available_cores`: torch's own pool is one thread a
    physical core, so hyperthreads are not free cores."""
    allowed = set()
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return available_cores()
    cores = set()
    for block in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" not in fields or (allowed and int(fields["processor"]) not in allowed):
            continue
        cores.add((fields.get("physical id", "0"), fields.get("core id", fields["processor"])))
    return len(cores) or available_cores()


def default_loader_threads(device: str | torch.device = "cpu") -> int:
    """Loader threads when none are given.

    A model on the CPU: the physical cores torch's own threads leave free (`physical_cores`;
    its pool takes one a core by default), none when it uses them all (then the batches
    are made inline, in the consumer's thread). Measured on 2 cores
    with torch on 2 threads, one loader thread beside the model made epochs slower, not
    faster: Amazon Photo 0.035 -> 0.045 s an epoch (minibatch), 0.075 -> 0.094 (megabatch,
    2 of 8 partitions); a 1M-node graph 12.5 -> 12.7-13.7 s (docs/benchmarks.md, "The data
    path alone"). A model on a GPU leaves the host's cores to the loader: all but one (the
    training thread's), at least one."""
    if torch.device(device).type == "cuda":
        return max(1, available_cores() - 1)
    return max(0, physical_cores() - torch.get_num_threads())


def check_loader_threads(threads: int | None) -> int:
    """``threads`` checked (None: `default_loader_threads`)."""
    if threads is None:
        return default_loader_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConfigError(f"loader_threads must be an integer >= 0 (0: in the consumer's thread; got {threads!r})")
    return threads


def nbytes(value: Any) -> int:
    """Bytes of the tensors ``value`` holds (a batch: its rows, DENSE, labels, micro-batches;
    the resident graph it refers to is the buffer's, not counted)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "graph")
    return 0


@dataclass
class PipelineStats:
    """What the pool held in one epoch: its threads and its bounds, and the most batches
    and bytes made ahead of the consumer at once (done or in flight, the in-flight ones
    counted at the largest batch seen)."""

    threads: int
    depth: int
    max_bytes: int | None
    batches: int = 0
    peak_held_batches: int = 0
    peak_held_bytes: int = 0
    largest_batch_bytes: int = 0

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)


class Pipelined:
    """The stage that runs ``steps`` (each a `BatchStep`) for each item on ``threads``
    threads and yields the results in order, holding ahead of the consumer at most
    ``depth`` batches (done or in flight) and, with ``max_bytes``, no more bytes than that
    (the in-flight ones counted at the largest batch seen; one batch is always let
    through, or nothing would run).

    ``threads=0`` runs them inline in the consumer's thread (no pool). An error in a step
    reaches the consumer when it asks for that batch; when the consumer stops (early, or
    by an error), the batches not started are cancelled and the running ones finish before
    the stage closes, so nothing still reads a state the buffer is about to release.
    ``stats`` describes the last epoch (`PipelineStats`)."""

    def __init__(self, steps: Sequence[BatchStep], *, threads: int, depth: int | None = None,
                 max_bytes: int | None = None, keyed: bool = True) -> None:
        self.steps, self.threads, self.keyed = tuple(steps), int(threads), keyed
        self.depth = max(1, 2 * self.threads if depth is None else int(depth))
        self.max_bytes = max_bytes
        self.stats = PipelineStats(self.threads, self.depth, max_bytes)

    def __call__(self, items: Iterator, ctx) -> Iterator:
        """``items`` carry their batch index and state end (``index``, ``ends_state``: the
        targets' items) when ``keyed``; else (a user's transform after macro-batching) each
        is keyed by its position and no state end is known (the walk has one state)."""
        fns = [step.bind(ctx) for step in self.steps]
        self.stats = stats = PipelineStats(self.threads, self.depth, self.max_bytes)

        def work(item, index: int):
            for fn in fns:
                item = fn(item, index)
            return item, nbytes(item)

        if self.threads == 0:
            for position, item in enumerate(items):
                batch, size = work(item, item.index if self.keyed else position)
                stats.batches += 1
                stats.largest_batch_bytes = max(stats.largest_batch_bytes, size)
                yield batch
            return
        yield from self._pooled(iter(items), work, stats)

    def _room(self, pending: deque[Future], stats: PipelineStats) -> bool:
        """Whether one more batch may start: under ``depth``, and under ``max_bytes`` with
        the done batches at their size and the others at the largest seen."""
        if len(pending) >= self.depth:
            return False
        if self.max_bytes is None or not pending:
            return True
        held = self._held_bytes(pending, stats)
        if stats.largest_batch_bytes == 0:
            return False  # no batch's size known yet: one at a time until one is done
        return held + stats.largest_batch_bytes <= self.max_bytes

    @staticmethod
    def _held_bytes(pending: deque[Future], stats: PipelineStats) -> int:
        """Bytes held ahead: the done batches' own (each updating the largest seen), the
        others' at the largest seen."""
        done = [f.result()[1] for f in pending if f.done() and f.exception() is None]
        stats.largest_batch_bytes = max([stats.largest_batch_bytes, *done])
        return sum(done) + (len(pending) - len(done)) * stats.largest_batch_bytes

    def _pooled(self, source: Iterator, work: Callable, stats: PipelineStats) -> Iterator:
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="graphstore-loader")
        pending: deque[Future] = deque()
        exhausted = False
        held = False  # a state's last batch is in flight: pull nothing until it is consumed
        position = 0
        try:
            while True:
                while not (exhausted or held) and self._room(pending, stats):
                    item = next(source, None)
                    if item is None:
                        exhausted = True
                        break
                    pending.append(pool.submit(work, item, item.index if self.keyed else position))
                    position += 1
                    held = self.keyed and item.ends_state
                if not pending:
                    if exhausted:
                        return
                    held = False  # the consumer took the state's last batch and asked for more
                    continue
                stats.peak_held_batches = max(stats.peak_held_batches, len(pending))
                stats.peak_held_bytes = max(stats.peak_held_bytes, self._held_bytes(pending, stats))
                batch, size = pending.popleft().result()
                stats.batches += 1
                stats.largest_batch_bytes = max(stats.largest_batch_bytes, size)
                yield batch
        finally:
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True)


class ThreadLocalWorkspace:
    """A scratch tensor per thread, rebuilt when the graph it is for changes size (the
    sampler's node-sized workspace: one per thread, never shared)."""

    def __init__(self, make: Callable[[Any], torch.Tensor]) -> None:
        self._make, self._local = make, threading.local()

    def get(self, graph) -> torch.Tensor:
        ws = getattr(self._local, "tensor", None)
        if ws is None or ws.numel() != graph.num_nodes:
            ws = self._local.tensor = self._make(graph)
        return ws
