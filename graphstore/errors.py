"""The exceptions graphstore raises.

Every error a user can cause is one of these, and each also inherits the builtin a
Python programmer would catch for it, so ``except FileNotFoundError`` keeps working::

    GraphStoreError(Exception)
    ├── SourceError(ValueError)            bad conversion input: names file, line/array, problem
    │   └── SourceNotFoundError(FileNotFoundError)   a source file or directory is missing
    ├── StoreError(ValueError)             a store that cannot be opened as format v1
    │   ├── StoreNotFoundError(FileNotFoundError)    no store at the path
    │   ├── StoreExistsError(FileExistsError)        output exists and --overwrite not given
    │   ├── StoreVersionError                        unknown format_version
    │   ├── StoreLockedError(BlockingIOError)        a second writer, or replacing an open store
    │   ├── ReadOnlyStoreError(PermissionError)      a write to a store opened with mode "r"
    │   └── StoreWriteError(OSError)                 a write failed (disk full); nothing was lost
    ├── CorruptStoreError(ValueError)      a checksum or invariant failed on a read or in `verify`
    ├── ConfigError(ValueError)            an option value that cannot work (p > N, ...)
    └── BufferClosedError(RuntimeError)    a closed or already iterated buffer was used

    UnverifiedReadsWarning(UserWarning)    a store without segment checksums was opened

The command line prints ``str(error)`` on one line and exits 1 for any of these.
"""

from __future__ import annotations

__all__ = [
    "BufferClosedError",
    "ConfigError",
    "CorruptStoreError",
    "GraphStoreError",
    "ReadOnlyStoreError",
    "SourceError",
    "SourceNotFoundError",
    "StoreError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreVersionError",
    "StoreWriteError",
    "OutOfCoreWarning",
    "UnverifiedReadsWarning",
]


class GraphStoreError(Exception):
    """Base class of every error graphstore raises on purpose."""


class SourceError(GraphStoreError, ValueError):
    """Conversion input is malformed. The message names the file, the line or array, and
    the problem, e.g. ``"raw/edge.csv.gz line 17: expected 2 columns, got 3"``."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """A file the source format needs is missing; the message says where it looked."""


class StoreError(GraphStoreError, ValueError):
    """A path that is not a usable graphstore store (missing or mis-shaped array, ...)."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """Nothing (or no complete store) at the given path."""


class StoreExistsError(StoreError, FileExistsError):
    """The output path exists and overwriting was not asked for."""


class StoreVersionError(StoreError):
    """The store's ``format_version`` is not one this graphstore reads."""


class StoreLockedError(StoreError, BlockingIOError):
    """The store is locked against this opener: another process writes to it, or has it
    open while it would be replaced. The message names the path and, where the kernel
    says, the holder's pid. Locks die with their process: nothing stale to clean up."""


class ReadOnlyStoreError(StoreError, PermissionError):
    """A write (embeddings, checksums) to a store opened with mode ``"r"``."""


class StoreWriteError(StoreError, OSError):
    """Writing to a store failed (a full disk, most often). The message names the path and
    what was kept: a conversion leaves nothing behind, a failed embedding write-back keeps
    the partition in memory, marked dirty."""


class CorruptStoreError(GraphStoreError, ValueError):
    """A checksum or an invariant failed; the message names the array and chunk."""


class ConfigError(GraphStoreError, ValueError):
    """An option value that cannot work, e.g. more partitions than nodes."""


class BufferClosedError(GraphStoreError, RuntimeError):
    """The `BufferManager` was closed, or its single pass over the states was already taken."""


class UnverifiedReadsWarning(UserWarning):
    """A store written before segment checksums: its reads of single edge buckets and
    partitions are not verified until ``graphstore upgrade`` adds them (once per store)."""


class OutOfCoreWarning(UserWarning):
    """An out-of-core scheme will train worse than it could on this store: partitions
    that cut most edges, or a mega-batch without the store's hub group (static cache).
    The message says what to do; each is given once per process."""
