"""ctypes binding of the compiled CSC builder (``csc.c`` beside this file).

Built by ``setup.py`` at install time as ``graphstore.buffer._native._csc``, a plain C
library loaded with ctypes (as the DENSE kernel, `graphstore.sample._native`). When it is
missing, `library` returns None, `load_error` says why, and `graphstore.buffer.resident`
assembles with numpy instead (the same result, about 5x slower).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from graphstore._native_lib import load_library

__all__ = ["ABI_VERSION", "build_csc", "library", "load_error"]

logger = logging.getLogger(__name__)

ABI_VERSION = 1
"""What ``gs_csc_abi_version()`` must return: a stale build from an older source is refused."""

_OK, _BAD_ID, _BAD_ARGUMENT = range(3)


class _Part(ctypes.Structure):
    """Mirror of ``gs_part`` in csc.c (field order and types must match)."""

    _fields_ = [
        ("src", ctypes.c_void_p),
        ("dst", ctypes.c_void_p),
        ("rel", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("src_shift", ctypes.c_int64),
        ("dst_shift", ctypes.c_int64),
        ("src_is64", ctypes.c_int32),
        ("dst_is64", ctypes.c_int32),
        ("rel_is64", ctypes.c_int32),
    ]


EdgePart = tuple[np.ndarray, int, np.ndarray, int, "np.ndarray | None"]
"""``(src, src_shift, dst, dst_shift, rel)``: [n] ids whose local ids are ``src + src_shift``
and ``dst + dst_shift``, and [n] relations or None."""

_state: dict = {}


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, error = load_library(Path(__file__).resolve().parent, "_csc", "gs_csc_abi_version", ABI_VERSION)
    if lib is None:
        return None, error
    lib.gs_csc_build.restype = ctypes.c_int
    lib.gs_csc_build.argtypes = [ctypes.POINTER(_Part), ctypes.c_int32, ctypes.c_int64,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib, None


def library() -> ctypes.CDLL | None:
    """The loaded builder, or None when it is unavailable (see `load_error`); loads once."""
    if "lib" not in _state:
        _state["lib"], _state["error"] = _load()
        if _state["error"] is not None:  # once per process, as the DENSE kernel's
            logger.warning("compiled CSC builder unavailable, assembling with numpy (slower): %s", _state["error"])
    return _state["lib"]


def load_error() -> str | None:
    """Why `library` returned None, or None when the builder is loaded."""
    library()
    return _state["error"]


def _ids(a: np.ndarray) -> np.ndarray:
    """``a`` as contiguous int32 or int64 (the two widths the kernel reads)."""
    a = np.asarray(a)
    if a.dtype not in (np.int32, np.int64):
        a = a.astype(np.int64)
    return np.ascontiguousarray(a)


def build_csc(parts: Sequence[EdgePart], num_nodes: int, *, with_rel: bool
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(indptr, indices, rel)`` of the edges of ``parts``, grouped by destination: [num_nodes
    + 1], [E] and [E] (or None) int64, edges of a destination in the order of the parts, then
    of each part (a stable sort by destination). Needs `library`.

    Raises
    ------
    ValueError
        An edge's local id is outside ``[0, num_nodes)``.
    """
    lib = library()
    if lib is None:
        raise RuntimeError(load_error())
    keep = []  # the arrays the structs point into, alive until the call returns
    structs = (_Part * max(len(parts), 1))()
    for k, (src, src_shift, dst, dst_shift, rel) in enumerate(parts):
        src, dst = _ids(src), _ids(dst)
        if src.shape != dst.shape or (rel is not None and np.shape(rel) != src.shape):
            raise ValueError(f"edge part {k}: src, dst and rel must have the same length")
        if with_rel != (rel is not None):
            raise ValueError(f"edge part {k}: relations {'missing' if with_rel else 'given without with_rel'}")
        rel = None if rel is None else _ids(rel)
        keep += [src, dst, rel]
        structs[k] = _Part(src.ctypes.data, dst.ctypes.data, None if rel is None else rel.ctypes.data,
                           src.size, int(src_shift), int(dst_shift), int(src.dtype == np.int64),
                           int(dst.dtype == np.int64), int(rel is not None and rel.dtype == np.int64))
    total = sum(int(np.size(part[0])) for part in parts)
    indptr = np.empty(num_nodes + 1, np.int64)
    indices = np.empty(total, np.int64)
    rel_out = np.empty(total, np.int64) if with_rel else None
    code = lib.gs_csc_build(structs, len(parts), num_nodes, indptr.ctypes.data,
                            indices.ctypes.data if total else None,
                            None if rel_out is None else rel_out.ctypes.data)
    del keep
    if code == _BAD_ID:
        raise ValueError(f"an edge's local id is outside [0, {num_nodes})")
    if code != _OK:
        raise ValueError(f"gs_csc_build refused its arguments (code {code})")
    return indptr, indices, rel_out
