"""Handing the C allocator's free memory back to the system.

glibc keeps freed blocks in its heaps (one arena per thread that allocated), and its mmap
threshold rises to the size of the largest block freed, so after an epoch's partition- and
batch-sized buffers are freed the process's resident memory stays at the epoch's peak. A
phase that must fit in what the budget left (exact evaluation after training, the next
layer's slots after a prepare pass) trims first. Not per batch: a trim walks every free
chunk of every arena (milliseconds).
"""

from __future__ import annotations

import ctypes

__all__ = ["HEAP_MMAP_THRESHOLD", "bound_heap_growth", "trim_heap"]

try:
    _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc: nothing to trim with
    _MALLOC_TRIM = None


def trim_heap() -> bool:
    """``malloc_trim(0)`` where glibc is the allocator; whether it ran."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


HEAP_MMAP_THRESHOLD = 4 << 20
"""Blocks at least this large are mapped on their own once `bound_heap_growth` ran."""

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)

try:
    _MALLOPT = ctypes.CDLL("libc.so.6").mallopt
except (OSError, AttributeError):
    _MALLOPT = None


def bound_heap_growth(threshold: int = HEAP_MMAP_THRESHOLD) -> bool:
    """Have glibc map every block of at least ``threshold`` bytes on its own, and unmap it
    when freed; whether it applied (glibc only).

    Why: a byte budget bounds the buffer, the batches made ahead and the batch in training,
    but glibc's default raises its mmap threshold to the largest block freed (up to 32 MiB)
    and then keeps batch- and partition-sized blocks in the heap of whichever thread freed
    them, where another thread's next allocation cannot reuse them: on the wide stand-in
    (33 KiB rows) a 512 MiB budget peaked 60-190 MiB above budget plus the runtime, and at
    824 MiB, within it, with the threshold fixed at 4 MiB. A fixed threshold also stops the
    dynamic raise. Process-wide, so only a run under a byte budget asks for it.
    """
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, int(threshold)))
