"""Creating checksummed Zarr arrays and filling them in chunk-aligned pieces.

zarr 3.1 rewrites a whole chunk for any partial write, so the converter never writes less
than a chunk except at the very end: `ChunkedAppender` buffers rows until a chunk is full.
"""

from __future__ import annotations

import math

import numpy as np
import zarr
import zarr.codecs

__all__ = ["ChunkedAppender", "chunk_rows_for", "new_array"]

MAX_CHUNK_BYTES = 8 << 20
"""Upper bound on one chunk (the store keeps chunks of 1-8 MiB, aligned to partitions:
large enough for sequential reads, small enough that a partition read wastes little;
`graphstore.layout.base` describes the format)."""
TARGET_CHUNK_BYTES = 4 << 20
"""What 1-D arrays aim for."""


def new_array(
    group: zarr.Group,
    name: str,
    *,
    shape: tuple[int, ...],
    dtype: str | np.dtype,
    chunks: tuple[int, ...],
    compress: bool = False,
) -> zarr.Array:
    """Create ``group/name`` with a crc32c checksum on every chunk (and zstd if asked)."""
    codecs: list = [zarr.codecs.ZstdCodec(level=3)] if compress else []
    codecs.append(zarr.codecs.Crc32cCodec())
    chunks = tuple(max(1, min(c, s)) if s else 1 for c, s in zip(chunks, shape, strict=True))
    kwargs = {} if np.dtype(dtype).kind in "OUT" else {"fill_value": 0}
    # Every chunk is written, even one equal to the fill value, so that a missing chunk
    # file always means damage (`verify` checks for them).
    return group.create_array(
        name, shape=shape, dtype=dtype, chunks=chunks, compressors=codecs,
        config={"write_empty_chunks": True}, **kwargs
    )


def chunk_rows_for(partition_size: int, row_bytes: int, num_rows: int) -> int:
    """Rows per chunk for a node array: whole partitions, or an equal slice of one.

    Chunks never straddle a partition boundary, so reading partition k touches only its own
    chunks. Several small partitions share a chunk only for 1-D arrays, where a partition's
    rows are far below a useful request size; then a chunk is a whole number of partitions.

    Returns
    -------
    int
        A divisor of ``partition_size`` (when a partition exceeds `MAX_CHUNK_BYTES`) or a
        multiple of it (otherwise), at least 1.
    """
    partition_bytes = max(1, partition_size * row_bytes)
    if partition_bytes > MAX_CHUNK_BYTES:
        pieces = math.ceil(partition_bytes / MAX_CHUNK_BYTES)
        # The smallest divisor count >= pieces keeps slices equal; prime P ends in 1-row
        # chunks, which is slow but correct (the converter avoids it by choosing P).
        while partition_size % pieces:
            pieces += 1
        return partition_size // pieces
    per_chunk = max(1, TARGET_CHUNK_BYTES // partition_bytes)
    return max(1, min(per_chunk * partition_size, num_rows))


class ChunkedAppender:
    """Writes consecutive rows into a Zarr array, one full chunk at a time.

    Parameters
    ----------
    array : zarr.Array
        Target; rows are written from index 0 on. Its first dimension may be an upper
        bound: `finish` shrinks it to the rows written.
    """

    def __init__(self, array: zarr.Array) -> None:
        self.array = array
        self.chunk_len = array.chunks[0]
        self.written = 0
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0

    def append(self, rows: np.ndarray) -> None:
        """Queue [m, ...] rows; full chunks go to disk now."""
        if len(rows) == 0:
            return
        self._pending.append(rows)
        self._pending_rows += len(rows)
        if self._pending_rows >= self.chunk_len:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        if not self._pending_rows:
            return
        block = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        full = len(block) if final else (len(block) // self.chunk_len) * self.chunk_len
        if full:
            self.array[self.written : self.written + full] = block[:full]
            self.written += full
        rest = block[full:]
        self._pending = [rest] if len(rest) else []
        self._pending_rows = len(rest)

    def finish(self) -> int:
        """Write what is left, trim the array to the rows written, return that count."""
        self._flush(final=True)
        if self.array.shape[0] != self.written:
            self.array.resize((self.written, *self.array.shape[1:]))
        return self.written
