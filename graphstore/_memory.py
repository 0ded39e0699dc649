"""What memory this process may still use: the cgroup's headroom, the kernel's
MemAvailable, or ``GRAPHSTORE_MEMORY_BYTES``.

Read by the loaders' default budget and by conversion's choice of partitioner (METIS holds
the whole graph), so it lives where every stage may import it.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphstore.errors import ConfigError
from graphstore.units import parse_byte_size

__all__ = ["available_memory", "cgroup_headroom", "mem_available"]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _cgroup_dirs() -> list[tuple[str, Path]]:
    """``(version, directory)`` of this process's memory cgroup, v2 then v1; the mounted
    root is tried too (a container sees its own group there)."""
    out = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":
            out += [("v2", Path("/sys/fs/cgroup") / rel), ("v2", Path("/sys/fs/cgroup"))]
        elif "memory" in controllers.split(","):
            out += [("v1", Path("/sys/fs/cgroup/memory") / rel), ("v1", Path("/sys/fs/cgroup/memory"))]
    return out


def cgroup_headroom() -> int | None:
    """Bytes this process's memory cgroup may still take (limit less its usage, the
    reclaimable page cache not counted as used), or None when no limit is set."""
    best = None
    for version, d in _cgroup_dirs():
        limit = _read_int(d / ("memory.max" if version == "v2" else "memory.limit_in_bytes"))
        if limit is None or limit >= 1 << 60:  # v1 writes "no limit" as a huge number
            continue
        usage = _read_int(d / ("memory.current" if version == "v2" else "memory.usage_in_bytes")) or 0
        cache = 0
        try:
            for line in (d / "memory.stat").read_text().splitlines():
                key, value = line.split()[:2]
                if key in ("inactive_file", "total_inactive_file"):
                    cache = max(cache, int(value))
        except (OSError, ValueError):
            pass
        headroom = max(0, limit - max(0, usage - cache))
        best = headroom if best is None else min(best, headroom)
    return best


def mem_available() -> int | None:
    """The kernel's estimate of memory available without swapping (``/proc/meminfo``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> tuple[int, str]:
    """``(bytes, source)``: what this process may still allocate, the cgroup's headroom or
    MemAvailable, whichever is less. ``GRAPHSTORE_MEMORY_BYTES`` (``4294967296``, ``4GiB``)
    overrides what is read, for a machine whose limit the process cannot see; a value that
    is not a size is a one-line `ConfigError`."""
    override = os.environ.get("GRAPHSTORE_MEMORY_BYTES")
    if override:
        try:
            return parse_byte_size(override), "GRAPHSTORE_MEMORY_BYTES"
        except ValueError as e:
            raise ConfigError(f"environment variable GRAPHSTORE_MEMORY_BYTES: {e}") from None
    free, cgroup = mem_available(), cgroup_headroom()
    if cgroup is not None and (free is None or cgroup <= free):
        return cgroup, "cgroup"
    if free is not None:
        return free, "MemAvailable"
    return 4 << 30, "unknown; assumed 4 GiB"  # neither readable (not Linux): said as such
