"""Feature dtypes: what a store may hold in ``nodes/features``, and how its bytes are numbers.

``float32`` and ``float16`` are stored as themselves. numpy has no ``bfloat16`` (the
``ml_dtypes`` package adds one; it is not a dependency), so a ``bfloat16`` store holds each
value's 16 bits as ``uint16``: the upper half of the value's float32 bits, rounded to
nearest even. The manifest says ``"bfloat16"``; the Zarr array, its chunks and their
checksums are ``uint16``, exactly the stored bytes. Readers keep the rows as stored and
turn them into numbers only where they compute: torch views the same bytes as
``torch.bfloat16`` (`graphstore.buffer.slots.rows_as_tensor`), numpy code widens them with
`decode` (float32, exact).

Examples
--------
>>> import numpy as np
>>> bits = encode(np.array([[1.0, -2.5, 0.1]], dtype=np.float32), "bfloat16")
>>> bits.dtype.name, decode(bits, "bfloat16").tolist()
('uint16', [[1.0, -2.5, 0.10009765625]])
>>> decode(encode(np.array([[0.1]]), "float16"), "float16").dtype.name
'float32'
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEATURE_DTYPES", "FLOAT16_MAX", "decode", "encode", "first_overflow", "storage_dtype"]

FEATURE_DTYPES = ("float32", "float16", "bfloat16")
"""The dtypes ``nodes/features`` may have, by the manifest's name for them."""

FLOAT16_MAX = 65504.0
"""The largest finite float16; |x| >= 65520 rounds to inf."""

_BF16_EXPONENT = np.uint16(0x7F80)


def storage_dtype(name: str | None) -> np.dtype:
    """The numpy dtype of the stored array for a manifest's ``feature_dtype`` (bfloat16:
    uint16 bit patterns); float32 for None (no features: only row-size arithmetic asks)."""
    if name is None:
        return np.dtype(np.float32)
    if name == "bfloat16":
        return np.dtype(np.uint16)
    if name not in FEATURE_DTYPES:
        raise ValueError(f"feature dtype must be one of {', '.join(FEATURE_DTYPES)} (got {name!r})")
    return np.dtype(name)


def encode(chunk: np.ndarray, name: str) -> np.ndarray:
    """Finite float rows as stored under ``name`` (a new array, or ``chunk`` when it already
    is). Rounds to nearest even; values out of the dtype's range become inf, which
    `first_overflow` finds: the converter refuses them rather than store them."""
    chunk = np.asarray(chunk)
    if name != "bfloat16":
        with np.errstate(over="ignore"):
            return chunk.astype(storage_dtype(name), copy=False)
    bits = np.ascontiguousarray(chunk, dtype=np.float32).view(np.uint32)
    # Round to nearest even on the 16 bits dropped: add 0x7FFF plus the kept part's lowest
    # bit, then truncate. A finite value past bfloat16's range carries into the exponent
    # and comes out inf. (NaN is never stored: the converter checks finiteness first.)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def decode(rows: np.ndarray, name: str | None) -> np.ndarray:
    """Stored rows as float32 numbers (exact for every stored dtype); for numpy code that
    computes on them (verification, the normalisation rule, exact inference's input)."""
    rows = np.asarray(rows)
    if name == "bfloat16":
        return (rows.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return rows.astype(np.float32, copy=False)


def first_overflow(stored: np.ndarray, name: str) -> tuple[int, int] | None:
    """(row, column) of the first infinite value of rows `encode` returned, or None.

    The source rows were checked finite before, so an inf here is a value beyond the
    dtype's range (float16: |x| >= 65520; bfloat16: about 3.39e38)."""
    if name == "float16":
        bad = np.isinf(stored)
    elif name == "bfloat16":
        bad = (stored & np.uint16(0x7FFF)) == _BF16_EXPONENT
    else:
        return None
    if not bad.any():
        return None
    row, col = np.argwhere(bad)[0]
    return int(row), int(col)
