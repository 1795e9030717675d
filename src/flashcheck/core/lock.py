"""The lock of an output folder: one flashcheck study or train-study writes into a folder at a time."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flashcheck.core.fileio import open_plain

LOCK_NAME = ".flashcheck.lock"


class FolderLocked(ValueError):
    """Another process holds the folder's lock."""


@contextmanager
def folder_lock(folder: str | Path, command: str = "study") -> Iterator[None]:
    """Hold an advisory lock (flock) on `folder` for the duration; FolderLocked naming the holder's
    command and PID when another process has it. The kernel releases it when the holder dies, even by
    SIGKILL. `command` (study, train-study) is what this holder is called in the lock file. A lock file that is a
    symbolic link is refused (LinkRefused): its target is never truncated."""
    path = Path(folder) / LOCK_NAME
    fd = _take(path, folder)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{command}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):  # removed while still held: no lock file is left behind (fixa2-2)
            if _same_file(fd, path):
                os.unlink(path)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _take(path: Path, folder: str | Path) -> int:
    """The lock file's descriptor, flocked; a file its holder removed before we locked it is opened again."""
    while True:
        fd = open_plain(path, os.O_RDWR | os.O_CREAT, 0o644, what="the folder's lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            pid, _, other = os.pread(fd, 64, 0).decode(errors="replace").partition("\n")
            os.close(fd)
            raise FolderLocked(
                f"--out {str(folder)!r} is in use by another flashcheck {other.strip() or 'study'} "
                f"(PID {pid.strip() or 'unknown'}); wait for it to finish or use another --out folder"
            ) from None
        if _same_file(fd, path):
            return fd
        os.close(fd)


def lock_holder(folder: str | Path) -> str | None:
    """The holder, "flashcheck COMMAND (PID n)", when another process holds `folder`'s lock now (a study still
    writing it), else None (no lock file, a free one, or one that is not a plain file: no link is followed)."""
    try:
        fd = open_plain(Path(folder) / LOCK_NAME, os.O_RDONLY, what="the folder's lock")
    except (OSError, ValueError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            pid, _, other = os.pread(fd, 64, 0).decode(errors="replace").partition("\n")
            return f"flashcheck {other.strip() or 'study'} (PID {pid.strip() or 'unknown'})"
        return None
    finally:
        os.close(fd)
