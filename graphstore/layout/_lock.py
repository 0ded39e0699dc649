"""One writer, many readers: advisory locks (``flock``) on a store.

Two locks, so that readers never wait for a writer and a writer never waits for readers::

    OUT.gs/          the store directory: every process that has the store open holds a
                     shared lock on it; `convert --overwrite` takes it exclusively, so it
                     cannot replace a store that someone has open
    OUT.gs/nodes/    a directory every store has: a writer (mode "r+", embedding
                     write-back, `graphstore upgrade`, `convert --overwrite`) holds it
                     exclusively. A directory, not a lock file, so the store holds
                     nothing zarr does not recognise (zarr warns about unknown files)

Every attempt is non-blocking: a lock that is held is refused at once with
`StoreLockedError`, naming the path and the holding process (from ``/proc/locks``, where
the kernel lists every flock with its pid). ``flock`` locks belong to the open file, so
the kernel drops them when their process exits, however it exits (kill -9 included):
nothing stale to clean up, and taking them writes nothing, so read-only media work. The
locks are advisory: they order graphstore's own processes, not arbitrary programs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from pathlib import Path

from graphstore.errors import StoreLockedError

__all__ = ["WRITER_LOCK_DIR", "StoreLock"]

WRITER_LOCK_DIR = "nodes"
"""The directory inside the store whose flock is the writer lock."""

_MODES = ("read", "write", "replace")


class StoreLock:
    """The locks one opener holds on the store at ``path`` until `release` (or exit).

    Parameters
    ----------
    path : str or PathLike
        The store directory (it must exist).
    mode : {"read", "write", "replace"}
        ``"read"``: the shared open lock. ``"write"``: that plus the writer lock.
        ``"replace"``: the open lock exclusively plus the writer lock (nobody else may
        have the store open).

    Raises
    ------
    StoreLockedError
        A lock this mode needs is held by another opener; the message names the holder's
        pid where it can be known.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); os.mkdir(os.path.join(d, "nodes"))
    >>> a = StoreLock(d, mode="write")
    >>> b = StoreLock(d, mode="read")          # readers do not wait for the writer
    >>> StoreLock(d, mode="write")             # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    graphstore.errors.StoreLockedError: ...: another process is writing to this store (pid ...)
    >>> a.release(); b.release(); StoreLock(d, mode="replace").release()
    """

    def __init__(self, path: str | os.PathLike, *, mode: str = "read") -> None:
        if mode not in _MODES:
            raise ValueError(f"lock mode must be one of {_MODES} (got {mode!r})")
        self.path = Path(path)
        self.mode = mode
        self._fds: list[int] = []
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        try:
            self._lock_directory(exclusive=mode == "replace")
            if mode != "read":
                self._lock_writer()
        except BaseException:
            self.release()
            raise

    def _open_directory(self, path: Path) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    def _lock_directory(self, *, exclusive: bool) -> None:
        fd = self._open_directory(self.path)
        if _try_flock(fd, exclusive=exclusive):
            return
        who = _who(_holder(fd))
        if exclusive:
            raise StoreLockedError(f"{self.path}: the store is open in another process{who}; "
                                   "close it before replacing the store")
        raise StoreLockedError(f"{self.path}: the store is being replaced by another process{who}")

    def _lock_writer(self) -> None:
        try:
            fd = self._open_directory(self.path / WRITER_LOCK_DIR)
        except FileNotFoundError:  # not a store (yet): the directory lock alone guards it
            return
        if not _try_flock(fd, exclusive=True):
            who = _who(_holder(fd))
            raise StoreLockedError(f"{self.path}: another process is writing to this store{who}; "
                                   "one writer at a time (open it with mode='r' to read)")

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def release(self) -> None:
        """Drop every lock (closing the files releases them). Idempotent."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"<StoreLock {self.mode} {self.path} {'held' if self.held else 'released'}>"


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


def _try_flock(fd: int, *, exclusive: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def _holder(fd: int) -> int | None:
    """The pid of a process holding a flock on ``fd``'s file, from ``/proc/locks``."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; waiters have a "->" field.
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key and "->" not in fields:
            pid = int(fields[4]) if fields[4].lstrip("-").isdigit() else -1
            if pid > 0:
                return pid
    return None


def _who(pid: int | None) -> str:
    if not pid:
        return ""
    return f" (pid {pid}, this process)" if pid == os.getpid() else f" (pid {pid})"


