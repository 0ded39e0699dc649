"""Learnable node embeddings and their optimizer state, kept in the store by partition.

Link prediction on graphs without features (MariusGNN) learns one vector per node. The
vectors of all nodes do not fit in memory, so they live in the store next to the graph,
and the buffer holds the resident partitions' rows and writes them back when it evicts
them. The layout, inside the store directory::

    embeddings/params   [N, 2, d] float32   row v: (embedding of v, optimizer state of v)
                        one chunk = one partition's P rows (never split), crc32c checked

Value and optimizer state share a row so that one partition is one chunk file: a partition
write is a single ``os.replace`` of a fully written temporary file, which is atomic on
POSIX file systems, so a reader (another process, or `verify`) sees the old partition or
the new one, never half of each; the file is fsynced before the rename and the directory
after it, so a written-back partition survives a crash. Writing needs the store opened
with mode ``"r+"`` (which holds its writer lock: one writer at a time); opening the table
there removes the temporary files of writers killed mid-write. zarr 3.1 itself writes a
chunk in place, which a concurrent reader could catch half-written, so writes bypass zarr;
the bytes are exactly
what zarr would write (raw little-endian rows, zero-padded to P rows, then the crc32c of
those bytes as a little-endian uint32), so zarr and `graphstore verify` read them as usual.

The optimizer state is Adagrad's per-coordinate sum of squared gradients (MariusGNN's
choice for embeddings), initialised to zero; a trainer using another optimizer may store
any one per-coordinate tensor there.
"""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import numpy as np
import zarr

from graphstore.errors import ConfigError, CorruptStoreError, StoreError
from graphstore.layout._arrays import new_array
from graphstore.layout._durable import write_atomically
from graphstore.layout.store import Store

__all__ = ["EMBEDDINGS_ARRAY", "EmbeddingTable"]

EMBEDDINGS_ARRAY = "embeddings/params"
"""Path of the embeddings array inside a store."""

_ATTRS_KEY = "graphstore_embeddings"


class EmbeddingTable:
    """The ``embeddings/params`` array of a store: read and atomically write partitions.

    Create one with `EmbeddingTable.create` (once per store; it initialises every row),
    open an existing one with `EmbeddingTable.open`.

    Examples
    --------
    >>> import numpy as np
    >>> rows = np.ones((3, 2, 2), np.float32)      # 3 nodes, (value, state), d = 2
    >>> len(EmbeddingTable.chunk_bytes(rows, rows_per_chunk=4))  # 4 rows x 16 bytes + crc32c
    68
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.path = Path(store.path) / EMBEDDINGS_ARRAY
        try:
            group = zarr.open_group(str(store.path), mode="r", zarr_format=3)
            array = group[EMBEDDINGS_ARRAY]
        except KeyError:
            raise StoreError(f"{store.path}: no {EMBEDDINGS_ARRAY} (create it with EmbeddingTable.create)") from None
        P = store.partition_size
        if (len(array.shape) != 3 or array.shape[0] != store.num_nodes or array.shape[1] != 2
                or array.dtype != np.float32 or array.chunks[0] != P or array.chunks[1:] != array.shape[1:]):
            raise StoreError(f"{self.path}: expected float32 [{store.num_nodes}, 2, d] chunked by {P} rows "
                             f"(got {array.dtype} {list(array.shape)} chunks {list(array.chunks)})")
        if array.compressors and any(type(c).__name__ != "Crc32cCodec" for c in array.compressors):
            raise StoreError(f"{self.path}: compressed embeddings are not supported")
        self.dim = int(array.shape[2])
        self.attrs = dict(array.attrs.get(_ATTRS_KEY, {}))
        self._array = array
        if store.mode == "r+" and store.holds_writer_lock:  # not a rank writing under rank 0's lock
            self._remove_dead_writers_temporaries()

    def _remove_dead_writers_temporaries(self) -> None:
        """A writer killed mid-write leaves its temporary file (the partition itself is
        intact: the rename never happened). We hold the writer lock, so no other process
        writes: every temporary not of this process is such a leftover."""
        mine = f".{os.getpid()}.tmp"
        for tmp in (self.path / "c").glob("*/0/.*.tmp"):
            if not tmp.name.endswith(mine):
                tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ creation

    @classmethod
    def create(cls, store: Store, dim: int, *, scale: float = 1e-3, seed: int = 0,
               exist_ok: bool = False) -> EmbeddingTable:
        """Add ``embeddings/params`` to ``store``: values ~ scale * N(0, 1), state 0.

        Partition k's values come from a generator seeded with ``(seed, k)``, so creation
        streams one partition at a time (memory: one partition) and is reproducible.

        Raises
        ------
        ConfigError
            ``dim`` < 1 or ``scale`` < 0.
        ReadOnlyStoreError
            The store was opened with mode ``"r"``.
        StoreError
            The array exists already and ``exist_ok`` is false, or it exists with another
            shape.
        """
        if int(dim) < 1:
            raise ConfigError(f"embedding dim must be >= 1 (got {dim})")
        if not scale >= 0:
            raise ConfigError(f"embedding scale must be >= 0 (got {scale})")
        if not cls.exists(store):
            store.check_writable()
        group = zarr.open_group(str(store.path), mode="r+", zarr_format=3)
        if EMBEDDINGS_ARRAY in group:
            if not exist_ok:
                raise StoreError(f"{store.path}: {EMBEDDINGS_ARRAY} exists already")
            table = cls(store)
            if table.dim != dim:
                raise StoreError(f"{table.path}: exists with dim {table.dim}, asked for {dim}")
            return table
        P, N = store.partition_size, store.num_nodes
        array = new_array(group, EMBEDDINGS_ARRAY, shape=(N, 2, int(dim)), dtype="float32",
                          chunks=(P, 2, int(dim)))
        array.attrs[_ATTRS_KEY] = {"init": "normal", "scale": float(scale), "seed": int(seed),
                                   "optimizer_state": "adagrad_sum_sq"}
        table = cls(store)
        for k in range(store.num_partitions):
            start, stop = store.partition_range(k)
            rows = np.zeros((stop - start, 2, int(dim)), np.float32)
            rng = np.random.default_rng([int(seed), k])
            rows[:, 0] = rng.standard_normal((stop - start, int(dim)), dtype=np.float32) * np.float32(scale)
            table.write_partition(k, rows)
        return table

    @classmethod
    def open(cls, store: Store) -> EmbeddingTable:
        """The existing table of ``store`` (StoreError when there is none)."""
        return cls(store)

    @classmethod
    def exists(cls, store: Store) -> bool:
        return (Path(store.path) / EMBEDDINGS_ARRAY / "zarr.json").is_file()

    # ------------------------------------------------------------------ partitions

    def chunk_path(self, k: int) -> Path:
        """The file holding partition k (zarr v3 default chunk keys: ``c/k/0/0``)."""
        return self.path / "c" / str(k) / "0" / "0"

    @staticmethod
    def _key(k: int) -> str:
        return f"c/{k}/0/0"

    @property
    def row_bytes(self) -> int:
        return 2 * self.dim * 4

    @staticmethod
    def chunk_bytes(rows: np.ndarray, *, rows_per_chunk: int) -> bytes:
        """The encoded chunk of ``rows`` [m, 2, d] float32 (m <= rows_per_chunk): raw
        little-endian rows zero-padded to ``rows_per_chunk`` rows, then their crc32c."""
        m = rows.shape[0]
        if m < rows_per_chunk:
            rows = np.concatenate([rows, np.zeros((rows_per_chunk - m, *rows.shape[1:]), rows.dtype)])
        data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
        return data + np.uint32(crc32c.crc32c(data)).astype("<u4").tobytes()

    def read_partition(self, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """Partition k's rows [P_k, 2, d] float32 (into ``out`` when given), checksum verified.

        Raises
        ------
        CorruptStoreError
            The chunk file is missing, short, or fails its checksum.
        """
        start, stop = self.store.partition_range(k)
        m, P = stop - start, self.store.partition_size
        expected = P * self.row_bytes + 4
        path = self.chunk_path(k)
        try:
            with open(path, "rb", buffering=0) as f:
                data = bytearray(expected)
                got = f.readinto(data)
        except FileNotFoundError:
            raise CorruptStoreError(f"{self.path}: partition {k}, chunk file {self._key(k)}: "
                                    "chunk file is missing") from None
        if got != expected:
            raise CorruptStoreError(f"{self.path}: partition {k}, chunk file {self._key(k)}: "
                                    f"chunk file is {got} bytes, expected {expected}")
        view = memoryview(data)
        stored, computed = int.from_bytes(view[-4:], "little"), crc32c.crc32c(view[:-4])
        if computed != stored:
            raise CorruptStoreError(f"{self.path}: partition {k}, chunk file {self._key(k)}: checksum "
                                    f"mismatch (stored {stored:#010x}, computed {computed:#010x})")
        rows = np.frombuffer(data, "<f4", count=m * 2 * self.dim).reshape(m, 2, self.dim)
        if out is None:
            return rows.copy()
        if out.shape != rows.shape:
            raise ConfigError(f"out must have shape {list(rows.shape)} (got {list(out.shape)})")
        out[...] = rows
        return out

    def write_partition(self, k: int, rows: np.ndarray) -> int:
        """Replace partition k's rows [P_k, 2, d] atomically; returns the bytes written.

        The chunk is written to a temporary file beside the target, fsynced, and renamed
        over it (then the directory is fsynced), so readers see the old or the new
        partition, whole, and a returned write survives a crash.

        Raises
        ------
        ReadOnlyStoreError
            The store was opened with mode ``"r"`` (or is closed).
        OSError
            The write failed (a full disk: ENOSPC); the old partition is untouched.
        """
        self.store.check_writable()
        start, stop = self.store.partition_range(k)
        rows = np.asarray(rows)
        if rows.shape != (stop - start, 2, self.dim):
            raise ConfigError(f"partition {k} rows must have shape {[stop - start, 2, self.dim]} "
                              f"(got {list(rows.shape)})")
        payload = self.chunk_bytes(rows, rows_per_chunk=self.store.partition_size)
        target = self.chunk_path(k)
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_atomically(target, payload)

    def read_all(self) -> np.ndarray:
        """Every row [N, 2, d] (for tests and small stores: loads the whole table)."""
        out = np.empty((self.store.num_nodes, 2, self.dim), np.float32)
        for k in range(self.store.num_partitions):
            start, stop = self.store.partition_range(k)
            self.read_partition(k, out[start:stop])
        return out

    def read_values(self) -> np.ndarray:
        """Every row's value [N, d], contiguous, without the optimizer state: half of
        `read_all`'s bytes held, one partition's rows besides (what ranking against every
        node and the best-validation snapshot need)."""
        out = np.empty((self.store.num_nodes, self.dim), np.float32)
        for k in range(self.store.num_partitions):
            start, stop = self.store.partition_range(k)
            out[start:stop] = self.read_partition(k)[:, 0]
        return out

    def __repr__(self) -> str:
        return f"<EmbeddingTable {self.path} dim={self.dim}>"
