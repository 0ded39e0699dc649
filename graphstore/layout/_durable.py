"""Making what the store writes survive a crash: fsync files and directories, atomic replace.

``os.replace`` makes a new file visible atomically, but after a power cut the rename can be
on disk while the file's data is not (ext4 and xfs order neither by default). So data is
fsynced before the rename that publishes it, and the directory after it, so the rename
itself is durable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "write_atomically"]


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
