"""The durable store of a study folder: records.jsonl, runs.jsonl, study.json, and the folder's lock.

Reading never changes a file: a damaged line is dropped with a warning naming the file and line.
Writing appends whole lines with fsync (or replaces a file atomically), so a kill loses at most the
line being written. For each case an `ok` record is final; otherwise the last record wins.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flashcheck.core.fileio import write_atomic
from flashcheck.study.cases import CaseRecord

LOCK_NAME = ".flashcheck.lock"


class FolderLocked(ValueError):
    """Another process holds the study folder's lock."""


class DamagedFile(ValueError):
    """A store file that exists but cannot be parsed."""


def _check_file(path: Path, what: str) -> bool:
    """True when `path` is a file to read; False when absent; ValueError when it is a directory."""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory; expected the study's {what} file")
    return path.exists()


def _read_bytes(path: Path, what: str) -> bytes | None:
    if not _check_file(path, what):
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def _warn_dropped(path: Path, bad: list[tuple[int, str]], consequence: str) -> None:
    where = ", ".join(f"line {n} ({why})" for n, why in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    warnings.warn(f"{path}: dropped {len(bad)} unreadable line(s): {where}; {consequence}", stacklevel=3)


def read_jsonl(path: str | Path, what: str = "log") -> list[tuple[int, dict]]:
    """(line number, object) for every line of a JSON-lines file that holds a JSON object; other
    non-empty lines are dropped with one warning naming the file and lines. [] when absent."""
    path = Path(path)
    data = _read_bytes(path, what)
    if data is None:
        return []
    out, bad = [], []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            bad.append((n, f"not JSON: {type(exc).__name__}"))
            continue
        if isinstance(obj, dict):
            out.append((n, obj))
        else:
            bad.append((n, f"a JSON {type(obj).__name__}, not an object"))
    if bad:
        _warn_dropped(path, bad, "the rest is kept")
    return out


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync; a previous half-written line (no newline) is closed first."""
    path = Path(path)
    with path.open("ab+") as f:
        f.seek(0, os.SEEK_END)
        prefix = b""
        if f.tell():
            f.seek(-1, os.SEEK_END)
            prefix = b"" if f.read(1) == b"\n" else b"\n"
        f.write(prefix + line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


class ResultStore:
    """records.jsonl in a study folder: one JSON line per finished case."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / "records.jsonl"
        self.dropped = 0

    def load(self) -> dict[str, CaseRecord]:
        """Records by case_id (ok is final, else the last wins). Read-only: damaged lines and lines
        this version cannot interpret are dropped with a warning, and left in the file."""
        records: dict[str, CaseRecord] = {}
        bad: list[tuple[int, str]] = []
        data = _read_bytes(self.path, "records")
        for n, line in enumerate((data or b"").split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                rec = CaseRecord.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                bad.append((n, type(exc).__name__))
                continue
            prev = records.get(rec.case_id)
            if prev is None or prev.status != "ok":
                records[rec.case_id] = rec
        self.dropped = len(bad)
        if bad:
            _warn_dropped(self.path, bad, "those cases will be recomputed")
        return records

    def repair(self) -> int:
        """Remove lines that are not JSON (half-written by a kill) atomically; keep every JSON line,
        understood or not. Only a study run holding the folder's lock calls this. Returns lines removed."""
        data = _read_bytes(self.path, "records")
        if not data:
            return 0
        keep, removed = [], 0
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                removed += 1
                continue
            keep.append(line + b"\n")
        if removed or not data.endswith(b"\n"):
            write_atomic(self.path, b"".join(keep))
        return removed

    def append(self, record: CaseRecord) -> None:
        append_line(self.path, record.to_json())


def read_study_json(folder: str | Path) -> dict | None:
    """study.json's object; None when absent. ValueError naming the file when it cannot be read."""
    path = Path(folder) / "study.json"
    data = _read_bytes(path, "configuration (study.json)")
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise DamagedFile(f"{str(path)!r} is damaged ({exc})") from None
    if not isinstance(obj, dict):
        raise DamagedFile(f"{str(path)!r} is damaged: a JSON {type(obj).__name__}, not an object")
    return obj


@contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold an advisory lock (flock) on `folder` for the duration; FolderLocked naming the holder's
    PID when another process has it. The kernel releases it when the holder dies, even by SIGKILL."""
    path = Path(folder) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise FolderLocked(
                f"--out {str(folder)!r} is in use by another flashcheck study (PID {holder}); "
                "wait for it to finish or use another --out folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
