"""The C allocator's free memory goes back to the system under a byte budget."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from graphstore import _heap


def _rss_after(script: str) -> int:
    """VmRSS in KiB printed by ``script`` run in a fresh interpreter (the heap's settings
    are process-wide, so each case gets its own process)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


SCRIPT = """
import threading
import numpy as np
from graphstore import _heap
{setup}
pins = []
def churn():
    # Batch-sized blocks made and freed on another thread, as loader and prefetch threads
    # do. Once a 40 MiB block was freed, glibc's default serves blocks below 40 MiB from the
    # thread's heap; a small block allocated after each keeps the heap from being trimmed.
    big = np.ones(40 << 20, dtype=np.uint8)
    del big
    for _ in range(4):
        block = np.ones(30 << 20, dtype=np.uint8)
        pins.append(np.ones(64, dtype=np.uint8))
        del block
t = threading.Thread(target=churn); t.start(); t.join()
print([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
"""


@pytest.mark.skipif(_heap._MALLOPT is None or not sys.platform.startswith("linux"),
                    reason="glibc's mallopt and /proc are Linux/glibc only")
def test_bounded_heap_growth_returns_freed_blocks():
    """With glibc's default the threshold rises to each freed block's size, and the next
    block (just larger) stays in the thread's heap when freed; with the threshold fixed,
    every block is unmapped when freed."""
    default = _rss_after(SCRIPT.format(setup=""))
    bounded = _rss_after(SCRIPT.format(setup="assert _heap.bound_heap_growth()"))
    assert default - bounded > 20 << 10, (default, bounded)  # KiB: over 20 MiB kept by default
    assert _heap.trim_heap() is True
