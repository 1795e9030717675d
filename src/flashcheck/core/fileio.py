"""Atomic file writes shared by every command that writes results.

A file is written to a temporary name in the same folder, flushed to disk and renamed over the target,
so a reader never sees half a file. The temporary file is created with mode 0o666 less the umask (the
mode a plain `open(path, "w")` gives, 0644 under the usual umask 022), not `tempfile.mkstemp`'s 0600; a file
that replaces one keeps the replaced file's permissions (a private store repaired stays private).
A full disk (ENOSPC, EDQUOT; or any error of a writer such as torch.save while under LOW_ROOM bytes are
free) raises DiskFull naming the file, with nothing half-written left behind.

Nothing is written, truncated, appended to or deleted through a link the tool did not make: every file the tool
writes or keeps (locks, store files, reports, atomic targets) is opened with O_NOFOLLOW as a regular file
(`open_plain`), an atomic write refuses a target that is a link, and a folder it writes into (a run folder,
figures/) is refused when it is a link (`make_folder`): LinkRefused, a ValueError of one line. Every read of a file
the tool wrote before (a store, a resume point, a cache, a figure) goes through the same rule (`open_own`,
`read_plain`): nothing it trusts or copies is read through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """No space left (ENOSPC, or the quota: EDQUOT) while writing `path`; the writer left no partial file or
    line behind. `needed`: bytes still to write when the writer knows them (None otherwise)."""

    def __init__(self, path: str | Path, needed: int | None = None, code: int = errno.ENOSPC) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.path, self.needed = Path(path), needed

    def __reduce__(self) -> tuple:  # from a pool worker to its parent intact
        return DiskFull, (str(self.path), self.needed, self.errno)


class LinkRefused(ValueError):
    """A path the tool writes or keeps is a symbolic link (or not a regular file / folder): refused, one line."""


def _refusal(path: str | Path, what: str, why: str) -> LinkRefused:
    return LinkRefused(
        f"{str(path)!r} ({what}) is {why}; flashcheck writes and reads its own files only as plain files it made, "
        "never through a link: remove it, or use another --out folder"
    )


def refuse_link(path: str | Path, what: str = "a file flashcheck writes") -> None:
    """LinkRefused when `path` itself (its last component, not followed) is a symbolic link; absent is fine."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent (or under a file: the caller says so)
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, what, "a symbolic link")


def open_plain(path: str | Path, flags: int, mode: int = 0o666, what: str = "a file flashcheck writes") -> int:
    """os.open(path, flags, mode) that never follows a link at `path` (O_NOFOLLOW) and gives only a regular file
    (a FIFO or device is refused, opened without blocking): LinkRefused otherwise. `mode` applies when the file
    is created (less the umask, as open() does)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(path, what, "a symbolic link") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a folder
            raise _refusal(path, what, "not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refusal(path, what, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_own(path: str | Path, what: str = "a file flashcheck reads back") -> BinaryIO:
    """The regular file `path` open for reading (binary), never through a link at `path` (LinkRefused). The one
    way to read back a file the tool wrote before (a store, a resume point, a cache, a figure): a link planted in
    its place would make the tool trust, or copy into a report, whatever file it names."""
    return os.fdopen(open_plain(path, os.O_RDONLY, what=what), "rb")


def read_plain(path: str | Path, what: str = "a file flashcheck reads back", limit: int | None = None) -> bytes:
    """The bytes of the regular file `path` (open_own: not through a link); with `limit`, ValueError naming the
    file when it holds more than `limit` bytes (checked before reading: nothing is parsed or held)."""
    with open_own(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise ValueError(
                f"{str(path)!r} ({what}) holds {size} bytes, more than the {limit} bytes such a file can hold"
            )
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:  # grew while read
        raise ValueError(f"{str(path)!r} ({what}) holds more than the {limit} bytes such a file can hold")
    return data


def make_folder(path: str | Path, what: str = "a folder flashcheck writes into") -> Path:
    """mkdir -p `path`; LinkRefused when `path` itself is a symbolic link (its parents are the user's to choose) or
    not a folder."""
    path = Path(path)
    refuse_link(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file (or a FIFO, a socket) where the folder goes
        raise _refusal(path, what, "not a folder") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refusal(path, what, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder")
    return path


def remove_plain(path: str | Path) -> None:
    """Delete `path` when it is a regular file (a temporary file of a killed write); a link or anything else is
    left alone (it is not the tool's)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def load_refusal(exc: BaseException) -> str:
    """One short line for a failed `torch.load(..., weights_only=True)`: the global it refused (torch's own message
    around it advises weights_only=False, which is exactly what must not happen with a file the tool did not
    write), else the exception's first line."""
    import re

    text = str(exc)
    m = re.search(r"GLOBAL (\S+)", text)
    if m:
        return f"it holds the object {m.group(1)}, a pickled object other than tensors: refused, nothing in it was run"
    if "Weights only load failed" in text:
        return "it holds pickled objects other than tensors: refused, nothing in it was run"
    return f"{type(exc).__name__}: {(text.strip().splitlines() or [''])[0][:160]}"


def is_full(exc: BaseException) -> bool:
    """True for an OSError that means the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def full_error(exc: OSError, path: str | Path, needed: int | None = None) -> OSError:
    """`exc` as a DiskFull naming `path` when it means a full disk (a DiskFull already raised keeps its
    path and takes the larger `needed`), else `exc` unchanged: for `raise full_error(exc, path) from exc`."""
    if isinstance(exc, DiskFull):
        known = [n for n in (exc.needed, needed) if n is not None]
        return DiskFull(exc.path, max(known) if known else None, exc.errno)
    return DiskFull(path, needed, exc.errno) if is_full(exc) else exc


def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None) -> None:
    """Write text (UTF-8) or bytes to path atomically: a new file with the mode an ordinary new file gets, a file it
    replaces with that file's own mode (a private file rewritten or repaired stays private), or `mode` when given;
    LinkRefused when `path` is a symbolic link."""
    path = Path(path)
    refuse_link(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = _create_temp(path)
    try:
        _keep_mode(fd, path, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if is_full(exc):
            raise full_error(exc, path, len(payload)) from exc
        raise


@contextlib.contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path (same folder and suffix) to write by name, e.g. `torch.save` or
    `fig.savefig`; on normal exit it replaces `path` atomically, on an exception it is removed. LinkRefused
    when `path` is a symbolic link."""
    path = Path(path)
    refuse_link(path)
    fd, tmp = _create_temp(path)
    try:
        _keep_mode(fd, path, None)
    finally:
        os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        full = is_full(exc) or (isinstance(exc, Exception) and _no_room(path.parent))
        tmp.unlink(missing_ok=True)
        if full:
            raise DiskFull(path, None, exc.errno if is_full(exc) else errno.ENOSPC) from exc
        raise


def _keep_mode(fd: int, path: Path, mode: int | None) -> None:
    """Give the temporary file `fd` `mode`, else the permissions of the regular file at `path` it will replace."""
    if mode is None:
        try:
            st = os.lstat(path)
        except OSError:  # a new file: the umask's mode, as open() gives
            return
        if not stat.S_ISREG(st.st_mode):
            return
        mode = st.st_mode
    os.fchmod(fd, stat.S_IMODE(mode) & 0o777)


LOW_ROOM = 1 << 20  # bytes: a writer that fails with less free space than this has run out of it


def _no_room(folder: Path) -> bool:
    """Whether `folder`'s disk is (nearly) full: writers such as torch.save report ENOSPC as a RuntimeError."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_ROOM


def _create_temp(path: Path) -> tuple[int, Path]:
    # os.open applies the umask to 0o666 as open() does; mkstemp would force 0o600. O_EXCL already refuses a planted
    # link at the temporary name (EEXIST); O_NOFOLLOW says so where it is read
    for _ in range(100):
        tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}.tmp{path.suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:  # no inode left, or the quota
            raise full_error(exc, path) from exc
    raise FileExistsError(f"no free temporary name next to {path}")


def folder_problem(path: str | Path) -> str | None:
    """Why `path` (links followed) is no folder to read: "does not exist", "is a file" (or another kind), or None
    for a folder. The words after the quoted path in a one-line error ("'/x' does not exist; give ...")."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        if os.path.islink(path):  # a dangling link: say so, not "does not exist" of a name the user sees
            return f"is a symbolic link to {os.readlink(path)!r}, which does not exist"
        return "does not exist"
    except (OSError, ValueError) as exc:  # a loop of links, a component that is a file, a NUL in the name
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISDIR(mode):
        return None
    return f"is {'a file' if stat.S_ISREG(mode) else _kind(mode)}, not a folder"


class UnsafeFile(ValueError):
    """A file the tool was about to read is not a regular file, or lies (links followed) outside its folder."""


def regular_file(path: str | Path, folder: str | Path | None = None) -> Path:
    """`path` when it is a regular file (links followed: not a FIFO, which would block the reader, nor a device or
    a folder) and, with `folder`, when it lies inside `folder` once links are resolved; UnsafeFile otherwise.
    The one rule for every file found inside a folder the user named (a shard, a series step, a model's weights,
    a distributed checkpoint's data file): a link elsewhere would make the tool read whatever file it names. A
    file the user names directly is only required to be regular. See `inside_folder` for the one exception."""
    path = Path(path)
    if folder is not None:
        inside_folder(path, folder)
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError) as exc:
        raise UnsafeFile(f"{str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UnsafeFile(f"{str(path)!r} is {_kind(mode)}, not a regular file; refused")
    return path


def inside_folder(path: str | Path, folder: str | Path) -> Path:
    """`path` when, links followed, it lies inside `folder` (links followed too); UnsafeFile naming the target
    otherwise. The one exception is the layout of the Hugging Face cache, whose snapshots/<revision>/ entries
    link into the model's blobs/ folder."""
    path, folder = Path(path), Path(folder)
    try:
        real, home = path.resolve(), folder.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a loop of links, a NUL in a name taken from a file
        raise UnsafeFile(f"{str(path)!r} cannot be resolved: {exc}") from None
    allowed = [home]
    if home.parent.name == "snapshots":
        allowed.append(home.parent.parent / "blobs")
    if not any(real == a or real.is_relative_to(a) for a in allowed):
        link = path.is_symlink()
        hint = " (name the target itself, or copy it into the folder, to read it)" if link else ""
        raise UnsafeFile(
            f"{str(path)!r} {'is a link to' if link else 'leads to'} {str(real)!r}, outside its folder "
            f"{str(home)!r}; refused{hint}"
        )
    return path


def safe_child(folder: str | Path, name: str, what: str = "a file name read from a stored file") -> Path:
    """folder / name when `name` (text read from a file, which anyone may have edited) is one plain path component:
    not empty, not '.' or '..', no '/', '\\', NUL or control character, at most 255 bytes. UnsafeFile otherwise, so
    that no path built from stored text leaves its folder ('../../victim' is refused, never written)."""
    text = name if isinstance(name, str) else repr(name)
    bad = (
        not text
        or text in (".", "..")
        or any(c in text for c in "/\\")
        or any(ord(c) < 32 or ord(c) == 127 for c in text)
        or len(text.encode("utf-8", "replace")) > 255
    )
    if bad or not isinstance(name, str):
        raise UnsafeFile(
            f"{what} {text[:80]!r} is not a plain file name inside {str(folder)!r} (one component: no '/', '..' or "
            "control characters); refused"
        )
    return Path(folder) / text


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"
