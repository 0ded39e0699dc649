"""ctypes binding of the compiled block reader (``rowsets.c`` beside this file).

Built by ``setup.py`` as ``graphstore.layout._native._rowsets``, a plain C library loaded
with ctypes like the package's other kernels (`graphstore._native_lib`). It reads a group
of runs of feature blocks and checks each block's crc32c with the GIL released, so the
reader threads of `graphstore.layout._rowsets` keep several requests in flight. When it is
missing, `library` returns None, `load_error` says why, and `_rowsets` does the same work in
Python (the same bytes and checks, fewer requests per second).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from graphstore._native_lib import load_library

__all__ = ["ABI_VERSION", "GroupError", "crc32c", "library", "load_error", "read_runs"]

logger = logging.getLogger(__name__)

ABI_VERSION = 1
"""What ``gs_rowsets_abi_version()`` must return: a stale build is refused."""

_OK, _SHORT, _IO_ERROR, _BAD_CRC = range(4)
_state: dict = {}
_P = ctypes.c_void_p


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, error = load_library(Path(__file__).resolve().parent, "_rowsets", "gs_rowsets_abi_version", ABI_VERSION)
    if lib is None:
        return None, error
    lib.gs_read_runs.restype = ctypes.c_int
    lib.gs_read_runs.argtypes = [_P, _P, _P, _P, ctypes.c_int64, _P, _P, _P, _P, ctypes.c_int64, _P, _P, _P]
    lib.gs_crc32c.restype = ctypes.c_uint32
    lib.gs_crc32c.argtypes = [_P, ctypes.c_int64]
    return lib, None


def library() -> ctypes.CDLL | None:
    """The loaded reader, or None when it is unavailable (see `load_error`); loads once."""
    if "lib" not in _state:
        _state["lib"], _state["error"] = _load()
        if _state["error"] is not None:
            logger.warning("compiled block reader unavailable, reading scattered rows in Python (slower): %s",
                           _state["error"])
    return _state["lib"]


def load_error() -> str | None:
    """Why `library` returned None, or None when the reader is loaded."""
    library()
    return _state["error"]


class GroupError(Exception):
    """What went wrong in a group: ``kind`` is ``"short"``, ``"io"`` (``index`` = the run,
    ``errno``) or ``"crc"`` (``index`` = the block, ``got`` = the computed checksum)."""

    def __init__(self, kind: str, index: int, *, errno: int = 0, got: int = 0) -> None:
        super().__init__(kind, index)
        self.kind, self.index, self.errno, self.got = kind, index, errno, got


def crc32c(data: bytes | np.ndarray) -> int:
    """The kernel's crc32c of ``data`` (for tests: it must equal the ``crc32c`` package's)."""
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else np.ascontiguousarray(data).view(np.uint8)
    return int(library().gs_crc32c(buf.ctypes.data, buf.size))


def read_runs(fds: np.ndarray, file_off: np.ndarray, length: np.ndarray, dest_off: np.ndarray, scratch: np.ndarray,
              block_off: np.ndarray, block_len: np.ndarray, crcs: np.ndarray) -> None:
    """Read run r (``length[r]`` bytes of ``fds[r]`` at ``file_off[r]``) into the bytes of
    ``scratch`` from ``dest_off[r]``, then check block b (``block_len[b]`` bytes of
    ``scratch`` from ``block_off[b]``) against ``crcs[b]``. int64 arrays but ``fds`` (int32)
    and ``crcs`` (uint32). Raises `GroupError`."""
    lib = library()
    args = [np.ascontiguousarray(a, dtype=t) for a, t in ((fds, np.int32), (file_off, np.int64), (length, np.int64),
                                                         (dest_off, np.int64), (block_off, np.int64),
                                                         (block_len, np.int64), (crcs, np.uint32))]
    fds, file_off, length, dest_off, block_off, block_len, crcs = args
    bad, got, err = ctypes.c_int64(-1), ctypes.c_uint32(0), ctypes.c_int32(0)
    code = lib.gs_read_runs(fds.ctypes.data, file_off.ctypes.data, length.ctypes.data, dest_off.ctypes.data,
                            fds.size, scratch.ctypes.data, block_off.ctypes.data, block_len.ctypes.data,
                            crcs.ctypes.data, block_off.size, ctypes.byref(bad), ctypes.byref(got), ctypes.byref(err))
    if code == _SHORT:
        raise GroupError("short", bad.value)
    if code == _IO_ERROR:
        raise GroupError("io", bad.value, errno=err.value)
    if code == _BAD_CRC:
        raise GroupError("crc", bad.value, got=got.value)
