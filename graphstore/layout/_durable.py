"""Making what the store writes survive a crash: fsync files and directories, atomic replace.

``os.replace`` makes a new file visible atomically, but after a power cut the rename can be
on disk while the file's data is not (ext4 and xfs order neither by default). So data is
fsynced before the rename that publishes it, and the directory after it, so the rename
itself is durable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

__all__ = ["exchange", "fsync_dir", "fsync_tree", "write_atomically"]

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``): at every moment each path names one of the two, so replacing a
    directory never passes through a moment where neither is there. Returns False where
    the kernel, the C library or the filesystem cannot (the caller falls back to renames).
    """
    libc_name = ctypes.util.find_library("c")
    try:
        renameat2 = ctypes.CDLL(libc_name, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory: its entries (renames, new files) reach the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> int:
    """fsync every file under ``root``, then every directory, deepest first; returns the
    number of files. (A directory is synced after its files, so its entries are too.)"""
    files = 0
    for dirpath, _, names in os.walk(root, topdown=False):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            files += 1
        fsync_dir(dirpath)
    return files


def write_atomically(target: str | os.PathLike, payload: bytes | memoryview) -> int:
    """Replace ``target`` with ``payload``: readers see the old file or the new one, whole,
    and once this returns the new one survives a crash. Returns the bytes written.

    The temporary file sits beside the target (same filesystem, so the rename is atomic) and
    is removed if anything fails, a full disk included.
    """
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(payload).cast("B")
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return len(payload)
