"""Values users type and files record: byte sizes (``512MiB``) and JSON-safe conversions.

One home for what the command line, the trainers and the converter's manifest all need.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["jsonable", "parse_byte_size"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_byte_size(text: str | int) -> int:
    """``4194304``, ``4MiB``, ``512K``, ``1G``, ``1.5GiB`` -> bytes (binary units).

    Raises
    ------
    ValueError
        For anything else, or a size that is not positive; the message says which
        (argparse shows it when the function is an option's ``type``).

    >>> parse_byte_size("4MiB"), parse_byte_size("512k"), parse_byte_size(10)
    (4194304, 524288, 10)
    """
    t = str(text).strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"expected a size like 512MiB (got {text!r})") from None
    if not value > 0:
        raise ValueError(f"a size must be positive (got {text!r})")
    return int(value)


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and arrays, torch tensors and devices, paths, tuples and
    sets turned into JSON types, recursively (dict keys become strings)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    torch = sys.modules.get("torch")  # only if the caller uses torch: layout does not import it
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, torch.device):
            return str(value)
    return value
