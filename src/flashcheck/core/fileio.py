"""Atomic file writes shared by every command that writes results.

A file is written to a temporary name in the same folder, flushed to disk and renamed over the target,
so a reader never sees half a file. The temporary file is created with mode 0o666 less the umask (the
mode a plain `open(path, "w")` gives, 0644 under the usual umask 022), not `tempfile.mkstemp`'s 0600.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to path atomically, with the mode an ordinary new file gets."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path (same folder and suffix) to write by name, e.g. `torch.save` or
    `fig.savefig`; on normal exit it replaces `path` atomically, on an exception it is removed."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_temp(path: Path) -> tuple[int, Path]:
    # os.open applies the umask to 0o666 as open() does; mkstemp would force 0o600
    for _ in range(100):
        tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}.tmp{path.suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path}")
