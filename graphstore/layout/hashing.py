"""Counter-based hashing: a 64-bit mix and a seeded permutation of ``[0, n)`` in O(chunk)
memory, for the ``random`` partitioner and ``tools/make_synthetic.py``.

Both are pure functions of their inputs, so any chunk of ids can be mapped on its own,
in any order, with no [n] table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["FeistelPermutation", "mix64"]

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on [k] uint64, wrapping arithmetic: a bijective, well-mixing
    64-bit hash (a new array; ``x`` is left alone).

    >>> mix64(np.array([0, 1], dtype=np.uint64)).tolist()
    [0, 6238072747940578789]
    """
    x = x ^ (x >> np.uint64(30))
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


class FeistelPermutation:
    """A pseudo-random bijection of ``[0, n)`` given by its round keys, evaluated on any
    chunk of ids.

    A balanced Feistel network on ``2h``-bit integers (the smallest ``h`` with
    ``4**h >= n``, so the domain is less than ``4 n``) is a bijection of ``[0, 4**h)``;
    cycle walking (apply it again while the value is ``>= n``) restricts it to one of
    ``[0, n)``. One round per key.

    Parameters
    ----------
    n : int
        Size of the permuted range.
    keys : sequence of uint64
        Round keys, one per round (the caller derives them from its seed).
    round_bits : {"low", "high"}
        Which ``h`` bits of ``mix64(half ^ key)`` a round uses. The top bits are the
        better mixed; the ``random`` partitioner uses the low ones because its stores'
        labels were made with them, and the two give different permutations.

    Examples
    --------
    >>> perm = FeistelPermutation(10, np.arange(1, 5, dtype=np.uint64), round_bits="high")
    >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
    True
    >>> perm.inverse(perm(np.arange(10))).tolist() == list(range(10))
    True
    """

    def __init__(self, n: int, keys: Sequence[np.uint64] | np.ndarray, *,
                 round_bits: Literal["low", "high"]) -> None:
        if round_bits not in ("low", "high"):
            raise ValueError(f"round_bits must be 'low' or 'high' (got {round_bits!r})")
        self.n = int(n)
        bits = max(1, max(self.n - 1, 1).bit_length())
        half = (bits + 1) // 2
        self._half = np.uint64(half)
        self._mask = np.uint64((1 << half) - 1)
        self._shift = np.uint64(64 - half) if round_bits == "high" else None
        self.keys = [np.uint64(k) for k in keys]

    def _round(self, x: np.ndarray, key: np.uint64) -> np.ndarray:
        mixed = mix64(x ^ key)
        return mixed >> self._shift if self._shift is not None else mixed & self._mask

    def _forward_once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self._half) | right

    def _inverse_once(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> self._half, y & self._mask
        for key in reversed(self.keys):
            left, right = right ^ self._round(left, key), left
        return (left << self._half) | right

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        out = step(np.asarray(x).astype(np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.n))
        while outside.size:
            again = step(out[outside])
            out[outside] = again
            outside = outside[again >= np.uint64(self.n)]
        return out.astype(np.int64)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """int64 images of the ids in ``[0, n)``, same shape."""
        return self._walk(ids, self._forward_once)

    forward = __call__

    def inverse(self, images: np.ndarray) -> np.ndarray:
        """int64 ids whose images are ``images``, same shape."""
        return self._walk(images, self._inverse_once)
