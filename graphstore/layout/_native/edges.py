"""ctypes binding of the compiled edge phase (``edges.c`` beside this file).

Built by ``setup.py`` as ``graphstore.layout._native._edges``, a plain C library loaded with
ctypes like the package's other kernels (`graphstore._native_lib`). It packs staged edges
into 64-bit keys grouped by destination partition, and sorts and merges one destination
partition's keys into stored columns, bucket sizes and degrees, all without the GIL, so
`graphstore.layout._buckets` runs two of them at once. When it is missing, `library`
returns None, `load_error` says why, and `_buckets` writes the same bytes with numpy.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from graphstore._native_lib import load_library

__all__ = ["ABI_VERSION", "BLOCK", "hub_segments", "library", "load_error", "pack_chunk", "sort_group",
           "threadsafe", "write_groups"]

logger = logging.getLogger(__name__)

ABI_VERSION = 3
"""What ``gs_edges_abi_version()`` must return: a stale build is refused."""
BLOCK = 1 << 16
"""Edges `pack_chunk` reads per request (``BLOCK`` in edges.c): its io scratch is 3 * BLOCK int64."""

_OK, _SHORT, _IO_ERROR = range(3)
_state: dict = {}
_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, error = load_library(Path(__file__).resolve().parent, "_edges", "gs_edges_abi_version", ABI_VERSION)
    if lib is None:
        return None, error
    lib.gs_edges_threadsafe.restype, lib.gs_edges_threadsafe.argtypes = _I32, []
    lib.gs_edges_pack_chunk.restype = ctypes.c_int
    lib.gs_edges_pack_chunk.argtypes = [_I32, _I32, _I32, _I32, _I64, _I64, _P, _I64, _P, _I32, _I64, _I64, _I32,
                                        _I32, _P, _P, _P, _P, _P, _P, _P]
    lib.gs_edges_write_groups.restype = ctypes.c_int
    lib.gs_edges_write_groups.argtypes = [_I32, _P, _P, _P, _I64, _P]
    lib.gs_hub_segments.restype = _I64
    lib.gs_hub_segments.argtypes = [_I64, _P, _P, _I32, _P, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _I32]
    lib.gs_edges_sort_group.restype = ctypes.c_int
    lib.gs_edges_sort_group.argtypes = [_I32, _I64, _I64, _P, _P, _I32, _I64, _I64, _I32, _I32, _I32, _P, _P, _P,
                                        _I32, _P, _P, _P, _P, _P, _P]
    return lib, None


def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None when it is unavailable (see `load_error`); loads once."""
    if "lib" not in _state:
        _state["lib"], _state["error"] = _load()
        if _state["error"] is not None:
            logger.warning("compiled edge sort unavailable, converting edges with numpy (slower): %s",
                           _state["error"])
    return _state["lib"]


def load_error() -> str | None:
    """Why `library` returned None, or None when the kernel is loaded."""
    library()
    return _state["error"]


def threadsafe() -> bool:
    """Whether several `sort_group` calls may run at once (their out-degree adds are atomic)."""
    return bool(library().gs_edges_threadsafe())


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _raise(code: int, err: int, path: str, what: str) -> None:
    if code == _SHORT:
        raise EOFError(f"{path}: short read of {what}")
    raise OSError(err, f"{os.strerror(err)} ({what})", path)


def pack_chunk(fds: tuple[int, int, int], paths: dict[int, str], start: int, count: int, runs: np.ndarray,
               store_id: np.ndarray, *, staged_bytes: int, size: int, p: int, b: int, rel_bits: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Staged rows ``[start, start + count)`` (files ``fds`` = src, dst, rel or -1; endpoints
    of ``staged_bytes`` each, relations int64) as keys grouped by destination partition:
    ``([count] uint64, [p] int64 counts)``. ``runs``
    ([k, 2] int64) are the added-reverse row ranges; ``store_id`` the [N] id map (int32 or
    int64, possibly file-backed). ``paths`` names each fd for errors."""
    lib = library()
    io = np.empty(3 * BLOCK, dtype=np.int64)
    part = np.empty(count, dtype=np.int32)
    keys = np.empty(count, dtype=np.uint64)
    grouped = np.empty(count, dtype=np.uint64)
    counts = np.empty(p, dtype=np.int64)
    bad_fd, err = ctypes.c_int32(-1), ctypes.c_int32(0)
    code = lib.gs_edges_pack_chunk(fds[0], fds[1], fds[2], staged_bytes, start, count, _ptr(runs), len(runs),
                                   _ptr(store_id), store_id.itemsize, size, p, b, rel_bits, _ptr(io), _ptr(part),
                                   _ptr(keys), _ptr(grouped), _ptr(counts), ctypes.byref(bad_fd), ctypes.byref(err))
    if code != _OK:
        _raise(code, err.value, paths.get(bad_fd.value, "staged edges"), f"staged rows {start}..{start + count}")
    return grouped, counts


def write_groups(fd: int, path: str, grouped: np.ndarray, counts: np.ndarray, cursor: np.ndarray) -> None:
    """Write each partition's run of ``grouped`` at its element ``cursor`` in ``fd``; advances
    ``cursor`` ([p] int64, in place)."""
    err = ctypes.c_int32(0)
    code = library().gs_edges_write_groups(fd, _ptr(grouped), _ptr(counts), _ptr(cursor), len(counts),
                                           ctypes.byref(err))
    if code != _OK:
        _raise(code, err.value, path, "grouped edges")


def sort_group(fd: int, path: str, offset: int, count: int, *, key_bits: int, size: int, first: int, b: int,
               rel_bits: int, with_rel: bool, keep_duplicates: bool, idx: np.dtype, p: int,
               in_degree: np.ndarray, out_degree: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """One destination partition's ``count`` keys from element ``offset`` of ``fd``, sorted
    and merged: ``(src, dst, rel or None, bucket_sizes [p] int64, merge counts [4] int64)``,
    src and dst in ``idx``, rel int32. Adds to ``in_degree`` (this partition's [size] slice)
    and ``out_degree`` ([N]) in place."""
    keys = np.empty(count, dtype=np.uint64)
    tmp = np.empty(count, dtype=np.uint64)
    out_s = np.empty(count, dtype=idx)
    out_d = np.empty(count, dtype=idx)
    out_r = np.empty(count, dtype=np.int32) if with_rel else None
    bucket_sizes = np.zeros(p, dtype=np.int64)
    merge = np.zeros(4, dtype=np.int64)
    stored, err = ctypes.c_int64(0), ctypes.c_int32(0)
    code = library().gs_edges_sort_group(fd, offset, count, _ptr(keys), _ptr(tmp), key_bits, size, first, b,
                                         rel_bits, int(keep_duplicates), _ptr(out_s), _ptr(out_d), _ptr(out_r),
                                         np.dtype(idx).itemsize, _ptr(bucket_sizes), _ptr(in_degree),
                                         _ptr(out_degree), _ptr(merge), ctypes.byref(stored), ctypes.byref(err))
    if code != _OK:
        _raise(code, err.value, path, f"grouped edges {offset}..{offset + count}")
    m = stored.value
    return out_s[:m], out_d[:m], None if out_r is None else out_r[:m], bucket_sizes, merge


def hub_segments(src: np.ndarray, dst: np.ndarray, is_hub: np.ndarray, partition_size: int, num_partitions: int,
                 *, counts: np.ndarray | None = None, cursor: np.ndarray | None = None,
                 end: np.ndarray | None = None, out: tuple[np.ndarray, ...] | None = None,
                 rel: np.ndarray | None = None) -> int:
    """The hub group's pass over a chunk of stored edges (``src``, ``dst`` of one int dtype):
    with ``counts`` ([p + 1] int64, in place) each segment's edges with a hub end are
    counted; with ``cursor`` ([p + 1] int64, advanced in place) they are written at their
    segment's cursor into ``out`` = (src, dst[, rel]) arrays (memory maps allowed), in chunk
    order, and a cursor reaching its segment's ``end`` ([p + 1]) raises ValueError before
    writing past it. Returns the chunk's edges with a hub end."""
    src, dst = np.ascontiguousarray(src), np.ascontiguousarray(dst)
    if src.dtype != dst.dtype or src.dtype not in (np.int32, np.int64):
        raise TypeError(f"hub_segments: endpoints must share int32 or int64, not {src.dtype} and {dst.dtype}")
    is_hub = np.ascontiguousarray(is_hub, dtype=np.bool_)
    for name, array in (("counts", counts), ("cursor", cursor), ("end", end)):
        if array is not None and (array.dtype != np.int64 or array.shape != (num_partitions + 1,)
                                  or not array.flags.c_contiguous):
            raise TypeError(f"hub_segments: {name} must be a contiguous [p + 1] int64 array")
    out_src = out_dst = out_rel = None
    if cursor is not None:
        if end is None or out is None:
            raise TypeError("hub_segments: a cursor needs its segments' end and the output arrays")
        if not all(a.flags.c_contiguous for a in out):
            raise TypeError("hub_segments: the output arrays must be contiguous")
        if int(end.max(initial=0)) > min(out[0].shape[0], out[1].shape[0]):
            raise ValueError("hub_segments: the segments end past the output arrays")
        out_src, out_dst = out[0], out[1]
        if rel is not None:
            rel, out_rel = np.ascontiguousarray(rel), out[2]
            if out_rel.dtype != rel.dtype:
                raise TypeError(f"hub_segments: relations {rel.dtype} into {out_rel.dtype}")
            if out_rel.shape[0] < int(end.max(initial=0)):
                raise ValueError("hub_segments: the segments end past the relations' output array")
        if out_src.dtype != src.dtype or out_dst.dtype != src.dtype:
            raise TypeError(f"hub_segments: endpoints {src.dtype} into {out_src.dtype} and {out_dst.dtype}")
    else:
        rel = None  # counting reads no relations
    touched = int(library().gs_hub_segments(
        src.shape[0], _ptr(src), _ptr(dst), src.itemsize, _ptr(is_hub), partition_size, num_partitions,
        _ptr(counts), _ptr(cursor), _ptr(end), _ptr(out_src), _ptr(out_dst), _ptr(rel), _ptr(out_rel),
        0 if rel is None else rel.itemsize))
    if touched < 0:
        raise ValueError("hub_segments: a segment holds more edges than were counted for it")
    return touched
