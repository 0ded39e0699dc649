"""Finding and loading the package's compiled C libraries (plain C, loaded with ctypes).

`graphstore.sample._native` (the DENSE kernel) and `graphstore.buffer._native` (the CSC
builder) each ship one library built by ``setup.py`` beside their ``__init__.py``. Both are
optional: a missing or stale build returns an error message instead of a library, and the
caller falls back to its numpy/torch code.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from pathlib import Path

__all__ = ["load_library"]


def load_library(directory: Path, stem: str, abi_symbol: str, abi_version: int
                 ) -> tuple[ctypes.CDLL | None, str | None]:
    """``(library, None)``, or ``(None, why)`` when ``directory/<stem><suffix>`` is missing
    (under every extension suffix of this Python), will not load, or reports through
    ``abi_symbol()`` another ABI than ``abi_version`` (a build from an older source)."""
    path = next((directory / f"{stem}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if (directory / f"{stem}{suffix}").is_file()), None)
    package = directory.relative_to(directory.parents[1]).as_posix()  # e.g. sample/_native
    if path is None:
        return None, (f"graphstore/{package}/{stem}*.so was not built (no C compiler at install time?); "
                      "reinstall with `pip install -e .` where a C compiler is available")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"cannot load {path.name}: {e}"
    abi = getattr(lib, abi_symbol)
    abi.restype, abi.argtypes = ctypes.c_int32, []
    if abi() != abi_version:
        return None, (f"{path.name} has ABI {abi()}, expected {abi_version}: a stale build; "
                      "reinstall with `pip install -e .`")
    return lib, None
