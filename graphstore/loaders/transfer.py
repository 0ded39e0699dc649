"""Batches copied to a CUDA device one step ahead of the step that trains them.

`DeviceFeeder` takes a loader's batches (host tensors) and yields them with their tensors on
the device, while the previous batch trains:

1. each batch's tensors are copied into a *pinned* host buffer (a slot, reused across
   batches, grown to the largest batch seen: pinning memory costs far more than copying
   into it, so it is done once per slot, not per batch);
2. from there to the device with ``non_blocking=True`` on a side stream, so the copy
   engine moves batch k+1 while the compute stream trains batch k;
3. an event recorded after the copies: the compute stream waits on it (not the host)
   before the batch is used, and the slot is rewritten only once its event has passed.

Each device tensor is marked as used by the compute stream (``record_stream``), so the
caching allocator does not hand its memory to another tensor while a step may still read
it. Which fields move: a `NodeBatch`'s ``features``, ``labels``, ``dense``, ``aggregated``
and ``class_weights``; its resident ``graph`` stays on the host (its ids index host tables).
Features cross in the dtype the store holds (float16 and bfloat16 rows: half the bytes of
float32); the model widens them on the device. Handed on as they are: a batch split into micro-batches (each micro-batch moves as it
runs, so the device holds one, which is what a micro-batch budget counts), and link
prediction's `EdgeBatch` (its ids index the embedding rows the buffer holds on the host;
the trainer moves what the model reads).

On the CPU the feeder hands the batches on untouched. Written to be timed by the GPU
device check (issue 33); nothing here has run on a GPU yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["DeviceFeeder"]

_ALIGN = 128
"""Byte alignment of each tensor inside a slot (the copy engine's fast path)."""

NODE_FIELDS = ("features", "labels", "dense", "aggregated", "class_weights")


class _PinnedSlot:
    """One pinned host buffer that a batch's tensors are staged in, and the event after
    which the copies out of it are done."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None
        self.offset = 0

    def reserve(self, nbytes: int) -> None:
        """Wait until the last copies out of the slot are done; make room for ``nbytes``."""
        if self.event is not None:
            self.event.synchronize()
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        self.offset = 0

    def stage(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` copied into the slot (a pinned view of the same dtype and shape)."""
        t = t.contiguous()
        n = t.numel() * t.element_size()
        view = self.buffer[self.offset:self.offset + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        self.offset += -(-n // _ALIGN) * _ALIGN
        return view


def _tensors_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in tensors)


class DeviceFeeder:
    """``feeder(batches)``: the batches with their tensors on ``device``, each copied while
    the one before it trains (see the module docstring). ``slots`` pinned buffers rotate;
    two let batch k+1 be staged while batch k's copy may still be running."""

    def __init__(self, device: torch.device | str, *, slots: int = 2) -> None:
        self.device = torch.device(device)
        # Kept across calls (epochs): pinned once, reused by every epoch's batches.
        self._slots = [_PinnedSlot() for _ in range(max(2, int(slots)))]
        self._side = None

    def __call__(self, batches: Iterable) -> Iterator:
        if self.device.type != "cuda":
            yield from batches
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        side, slots = self._side, self._slots
        compute = torch.cuda.current_stream(self.device)
        ready = None  # (batch on the device, its copies' event): yielded once the next is staged
        for k, batch in enumerate(batches):
            moved, event = self._copy(batch, slots[k % len(slots)], side, compute)
            if ready is not None:
                yield self._when_copied(*ready, compute)
            ready = (moved, event)
        if ready is not None:
            yield self._when_copied(*ready, compute)

    @staticmethod
    def _when_copied(batch: Any, event, compute) -> Any:
        if event is not None:
            compute.wait_event(event)  # the compute stream waits, not the host
        return batch

    def _copy(self, batch: Any, slot: _PinnedSlot, side, compute) -> tuple[Any, Any]:
        """``batch`` with its fields on the device and the event after their copies (None:
        handed on as it is)."""
        if not hasattr(batch, "features") or getattr(batch, "micro_batches", None) is not None:
            return batch, None
        present = {name: getattr(batch, name) for name in NODE_FIELDS if getattr(batch, name) is not None}
        slot.reserve(sum(_tensors_bytes(_tensors_of(v)) for v in present.values()))

        def move(t: torch.Tensor) -> torch.Tensor:
            on_device = slot.stage(t).to(self.device, non_blocking=True)
            on_device.record_stream(compute)  # the allocator keeps it until the compute stream is past it
            return on_device

        with torch.cuda.stream(side):
            changes = {name: _map(value, move) for name, value in present.items()}
            event = torch.cuda.Event()
            event.record(side)
        slot.event = event
        return dataclasses.replace(batch, **changes), event


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[torch.Tensor] = []
    value.map_tensors(lambda t: out.append(t) or t)  # a DENSE: every tensor it holds
    return out


def _map(value: Any, move) -> Any:
    return move(value) if isinstance(value, torch.Tensor) else value.map_tensors(move)
