"""Numpy arrays out of pickles from dataset files, rebuilt from checked state.

Planetoid's ``ind.*`` files and OGB's split ``.pt`` files pickle numpy arrays. Unpickled
the usual way, numpy's own ``ndarray.__setstate__`` and ``dtype.__setstate__`` (C code)
receive whatever state the file holds, and given damaged state they can crash the
process (a segmentation fault), fail without setting an exception (``SystemError``), or
release a buffer still in use. No ``except`` catches a crash, so a damaged file must
never reach them.

Here the globals a pickle names for an array are mapped to stand-ins: ``_reconstruct``
returns an `_ArrayState` that accepts only ``(version, shape, dtype, fortran, bytes)``
of a plain number type whose size matches, ``numpy.dtype`` a `_DtypeState` that accepts
only plain number types, and the array itself is built with `numpy.frombuffer` from the
checked bytes. `materialize` then swaps the stand-ins for their arrays. Object arrays,
structured or string dtypes cannot be built at all.

Used by `planetoid` (with its own `pickle` unpickler) and `ogb` (through
``torch.serialization.safe_globals`` and torch's weights-only unpickler).
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import scipy.sparse as sp

__all__ = ["NUMPY_GLOBALS", "TORCH_SAFE_GLOBALS", "materialize"]

_PLAIN_DTYPE = re.compile(r"^[biuf][1-8]$")


class _NdarrayName:
    """What a pickle's ``numpy.ndarray`` stands for: only an argument of `_reconstruct`
    (the class itself would let a pickle allocate arrays of any size)."""


_NDARRAY = _NdarrayName()


class _DtypeState:
    """A pickled ``numpy.dtype(spec, align, copy)`` of a plain number type, and its byte order."""

    def __init__(self, spec, align=False, copy=True) -> None:
        if isinstance(spec, bytes):
            spec = spec.decode("latin1")
        if not isinstance(spec, str) or not _PLAIN_DTYPE.match(spec):
            raise pickle.UnpicklingError(f"dtype {spec!r} is not a plain number type")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state) -> None:
        # (version, byteorder, subarray, names, fields, elsize, alignment, flags[, metadata])
        if not isinstance(state, tuple) or len(state) not in (8, 9) or any(v is not None for v in state[2:5]):
            raise pickle.UnpicklingError("malformed dtype state")
        order = state[1].decode("latin1") if isinstance(state[1], bytes) else state[1]
        if order not in ("<", ">", "|", "="):
            raise pickle.UnpicklingError(f"malformed dtype byte order {order!r}")
        if order in "<>":
            self.dtype = self.dtype.newbyteorder(order)


def _array_from(data, dtype, shape, fortran: bool) -> np.ndarray:
    """A fresh array from pickled raw bytes, after checking they fill ``shape`` exactly."""
    if isinstance(data, str):  # a Python 2 str, decoded as latin1 by the unpickler
        data = data.encode("latin1")
    if isinstance(data, pickle.PickleBuffer):
        data = data.raw()
    if not isinstance(dtype, _DtypeState) or not isinstance(data, (bytes, bytearray, memoryview)):
        raise pickle.UnpicklingError("array state is not raw bytes of a plain number type")
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise pickle.UnpicklingError(f"array shape {shape!r} is not a tuple of sizes")
    if int(np.prod(shape, dtype=object)) * dtype.dtype.itemsize != len(data):
        raise pickle.UnpicklingError(f"array data has {len(data)} bytes, shape {shape} needs another size")
    flat = np.frombuffer(bytes(data), dtype=dtype.dtype)
    return flat.reshape(shape, order="F" if fortran else "C").copy()


class _ArrayState:
    """A pickled ``ndarray`` until its state arrives; `materialize` swaps in the array."""

    array: np.ndarray | None = None

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple) and len(state) == 4:  # pickles from before the version field
            state = (1, *state)
        if not isinstance(state, tuple) or len(state) != 5 or state[0] != 1:
            raise pickle.UnpicklingError("malformed array state")
        _, shape, dtype, fortran, data = state
        self.array = _array_from(data, dtype, shape, bool(fortran))


def _reconstruct(cls, shape, typecode) -> _ArrayState:
    """``numpy.core.multiarray._reconstruct``, which only ever starts an empty array."""
    if cls is not _NDARRAY:
        raise pickle.UnpicklingError("_reconstruct of something other than numpy.ndarray")
    return _ArrayState()


def _frombuffer(data, dtype, shape, order) -> np.ndarray:
    """``numpy._core.numeric._frombuffer``: pickle protocol 5's form of an array."""
    if order not in ("C", "F"):
        raise pickle.UnpicklingError(f"array order {order!r}")
    return _array_from(data, dtype, shape, order == "F")


NUMPY_GLOBALS: dict[str, object] = {
    # numpy 1 pickles name numpy.core, numpy 2 pickles numpy._core.
    "numpy.core.multiarray._reconstruct": _reconstruct,
    "numpy._core.multiarray._reconstruct": _reconstruct,
    "numpy.core.numeric._frombuffer": _frombuffer,
    "numpy._core.numeric._frombuffer": _frombuffer,
    "numpy.ndarray": _NDARRAY,
    "numpy.dtype": _DtypeState,
}
"""Global names a pickled numpy array uses -> their checked stand-ins."""

TORCH_SAFE_GLOBALS: list = [(obj, name) for name, obj in NUMPY_GLOBALS.items()] + [_ArrayState]
"""`NUMPY_GLOBALS` for ``torch.serialization.safe_globals``; `_ArrayState` is listed as
well because torch's unpickler only runs ``__setstate__`` of allow-listed types."""


def materialize(value):
    """``value`` with every array stand-in replaced by its array.

    Looks where dataset pickles keep arrays: at the top, among the values of a dict
    (OGB splits) and the attributes of a sparse matrix (Planetoid). A stand-in left
    anywhere else is not an array and fails the reader's type checks.

    Raises
    ------
    pickle.UnpicklingError
        An array whose state never arrived.
    """
    if isinstance(value, _ArrayState):
        if value.array is None:
            raise pickle.UnpicklingError("an array without its state")
        return value.array
    if isinstance(value, dict):
        for key, item in list(value.items()):
            if isinstance(item, _ArrayState):
                value[key] = materialize(item)
    elif sp.issparse(value):
        for key, item in list(vars(value).items()):
            if isinstance(item, _ArrayState):
                setattr(value, key, materialize(item))
    return value
