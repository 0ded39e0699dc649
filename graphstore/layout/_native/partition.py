"""ctypes binding of the stream partitioner's compiled kernels (``partition.c`` beside this file).

Built by ``setup.py`` as ``graphstore.layout._native._partition``, a plain C library loaded
with ctypes like the package's other kernels (`graphstore._native_lib`). Label
propagation's per-row choice (`choose`), contraction's per-row sums (`contract`), the
input level's entries by row block (`level_zero`) and a block's CSR (`csr`), each without
the GIL, so `graphstore.layout.partition`'s worker threads run them side by side. When it
is missing, `library` returns None, `load_error` says why, and the partitioner computes the
same results with numpy and scipy.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from graphstore._native_lib import load_library

__all__ = ["ABI_VERSION", "choose", "contract", "csr", "level_zero", "library", "load_error"]

logger = logging.getLogger(__name__)

ABI_VERSION = 3
"""What ``gs_part_abi_version()`` must return: a stale build is refused."""

_NO_MEMORY, _TOO_MANY = -1, -2
_state: dict = {}
_P, _I32, _I64, _U32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, error = load_library(Path(__file__).resolve().parent, "_partition", "gs_part_abi_version", ABI_VERSION)
    if lib is None:
        return None, error
    lib.gs_part_choose.restype = ctypes.c_int
    lib.gs_part_choose.argtypes = [_I64, _P, _P, _P, _I32, _P, _I32, _P, _U32, _P, _I32, _P, _I32, _P, _I64,
                                   _P, _P, _P, _P, _P]
    lib.gs_part_contract.restype = _I64
    lib.gs_part_contract.argtypes = [_I64, _P, _P, _P, _I32, _P, _I64, _P, _P, _P]
    lib.gs_part_level_zero.restype = _I64
    lib.gs_part_level_zero.argtypes = [_I64, _P, _P, _P, _I64, _I64, _P, _P]
    lib.gs_part_csr.restype = _I64
    lib.gs_part_csr.argtypes = [_I64, _P, _P, _I64, _P, _I32, _I64, _I32, _P, _P, _P]
    return lib, None


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None when they are unavailable (see `load_error`); loads once."""
    if "lib" not in _state:
        _state["lib"], _state["error"] = _load()
        if _state["error"] is not None:
            logger.warning("compiled partitioner kernels unavailable, partitioning with numpy (slower): %s",
                           _state["error"])
    return _state["lib"]


def load_error() -> str | None:
    """Why `library` returned None, or None when the kernels are loaded."""
    library()
    return _state["error"]


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _c(a: np.ndarray | None, dtype) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(a, dtype=dtype)


def _data_f64(data: np.ndarray | None) -> int:
    if data is None:  # the input level: every entry weighs 1
        return 0
    if data.dtype not in (np.float32, np.float64):
        raise TypeError(f"edge weights must be float32 or float64, not {data.dtype}")
    return int(data.dtype == np.float64)


def choose(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, labels: np.ndarray, own: np.ndarray,
           salt: int, *, mask: np.ndarray | None = None, mask_want: bool = True,
           load: np.ndarray | None = None, cap: np.ndarray | int | None = None,
           row_weight: np.ndarray | None = None, row_flag: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`partition._aggregate` then `partition._choose` for the rows of a CSR piece (``indptr``
    from 0): ``(own_weight [rows] float64, best [rows] int64, best_weight [rows] float64)``.

    A label ``t`` is allowed for row ``r`` when each given test holds: ``mask[t] ==
    mask_want``; ``load[t] + row_weight[r] <= cap`` (``cap`` an int or [labels] int64);
    ``row_flag[r]``. ``labels`` and ``own`` int16 or int32 (the same), ``load`` int32 or int64;
    ``data`` None: every entry weighs 1 (the input level).
    """
    rows = indptr.shape[0] - 1
    if labels.dtype not in (np.int16, np.int32) or own.dtype != labels.dtype:
        raise TypeError(f"labels and own must both be int16 or int32, not {labels.dtype} and {own.dtype}")
    indptr, indices = _c(indptr, np.int32), _c(indices, np.int32)
    data = None if data is None else np.ascontiguousarray(data)
    own, labels = np.ascontiguousarray(own), np.ascontiguousarray(labels)
    mask = _c(mask, np.bool_)
    if load is not None:
        load = np.ascontiguousarray(load) if load.dtype in (np.int32, np.int64) else load.astype(np.int64)
        row_weight = _c(row_weight, np.int64)
    cap_array = _c(cap, np.int64) if isinstance(cap, np.ndarray) else None
    cap_scalar = 0 if cap is None or cap_array is not None else int(cap)
    row_flag = _c(row_flag, np.bool_)
    own_weight = np.empty(rows, dtype=np.float64)
    best = np.empty(rows, dtype=np.int64)
    best_weight = np.empty(rows, dtype=np.float64)
    code = library().gs_part_choose(
        rows, _ptr(indptr), _ptr(indices), _ptr(data), _data_f64(data), _ptr(labels), labels.itemsize, _ptr(own),
        salt & 0xFFFFFFFF, _ptr(mask), int(mask_want), _ptr(load), 0 if load is None else load.itemsize,
        _ptr(cap_array), cap_scalar, _ptr(row_weight), _ptr(row_flag), _ptr(own_weight), _ptr(best),
        _ptr(best_weight))
    if code == _NO_MEMORY:
        raise MemoryError(f"partitioner: no memory for the label table of {rows} rows")
    return own_weight, best, best_weight


def contract(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, cluster: np.ndarray, first: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coarser level's entries of rows ``[first, first + rows)`` of a CSR piece: ``(rows,
    targets, weights)`` as int32, int32, float64: per row, its cluster, each other
    neighbouring cluster and the summed weight toward it, in no particular order (``data``
    None: weights 1)."""
    rows = indptr.shape[0] - 1
    indptr, indices = _c(indptr, np.int32), _c(indices, np.int32)
    data = None if data is None else np.ascontiguousarray(data)
    cluster = _c(cluster, np.int32)
    bound = int(indptr[-1])  # at most one entry per input entry
    out_rows = np.empty(bound, dtype=np.int32)
    out_targets = np.empty(bound, dtype=np.int32)
    out_weights = np.empty(bound, dtype=np.float64)
    k = library().gs_part_contract(rows, _ptr(indptr), _ptr(indices), _ptr(data), _data_f64(data), _ptr(cluster),
                                   first, _ptr(out_rows), _ptr(out_targets), _ptr(out_weights))
    if k == _NO_MEMORY:
        raise MemoryError(f"partitioner: no memory for the cluster table of {rows} rows")
    return out_rows[:k], out_targets[:k], out_weights[:k]


def level_zero(src: np.ndarray, dst: np.ndarray, order: np.ndarray, rows_per_block: int, num_blocks: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """A chunk of staged edges (int64 ``src``, ``dst``) as input-level entries by row block:
    ``(counts [num_blocks] int64, pairs [k, 2] int32)``, each edge but self loops in both
    directions, in internal ids (``order`` [N] int32), as (column, row within its block),
    grouped by block (what `_LevelBuilder.write` takes)."""
    m = src.shape[0]
    src, dst, order = _c(src, np.int64), _c(dst, np.int64), _c(order, np.int32)
    counts = np.empty(num_blocks, dtype=np.int64)
    pairs = np.empty((2 * m, 2), dtype=np.int32)
    k = library().gs_part_level_zero(m, _ptr(src), _ptr(dst), _ptr(order), rows_per_block, num_blocks,
                                     _ptr(counts), _ptr(pairs))
    if k == _NO_MEMORY:
        raise MemoryError(f"partitioner: no memory for a chunk of {m} edges")
    return counts, pairs[:k]


def csr(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray | None, num_rows: int, dtype: np.dtype
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """A block's CSR ``(indptr int32, indices int32, data)`` from its entries.

    ``weights`` None (the input level): the entries grouped by row in arrival order,
    duplicates kept, and ``data`` None (each entry weighs 1). Otherwise equal entries are
    merged, their weights summed into ``data`` of ``dtype``, columns distinct within a row
    in first-arrival order (scipy's coo -> csr without its sort). None past 2**31 entries
    (the caller uses scipy). int32 ``rows`` and ``cols`` 8 bytes apart (the two columns of
    a block's [m, 2] scratch pairs) are read in place, not copied."""
    m = rows.shape[0]
    stride = 1
    if rows.dtype == cols.dtype == np.int32 and rows.strides == cols.strides == (8,):
        stride = 2
    else:
        rows, cols = _c(rows, np.int32), _c(cols, np.int32)
    if weights is not None:
        weights = np.ascontiguousarray(weights)
    out_dtype = np.dtype(dtype)
    indptr = np.empty(num_rows + 1, dtype=np.int32)
    indices = np.empty(m, dtype=np.int32)
    data = None if weights is None else np.empty(m, dtype=out_dtype)
    k = library().gs_part_csr(m, _ptr(rows), _ptr(cols), stride, _ptr(weights), _data_f64(weights), num_rows,
                              int(out_dtype == np.float64), _ptr(indptr), _ptr(indices), _ptr(data))
    if k == _TOO_MANY:
        return None
    if k == _NO_MEMORY:
        raise MemoryError(f"partitioner: no memory to group a block of {m} entries")
    if data is None:
        return indptr, indices, None
    return indptr, indices[:k].copy(), data[:k].copy()
