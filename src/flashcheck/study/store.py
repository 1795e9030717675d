"""The durable store of a study folder: records.jsonl, runs.jsonl, study.json, and the folder's lock.

Reading never changes a file: a damaged line is dropped with a warning naming the file and line.
Writing appends whole lines with fsync (or replaces a file atomically), so a kill loses at most the
line being written, and a full disk none (the file is cut back to its last whole line: DiskFull).
A study run removes lines that are not JSON with a warning, keeping their text in records.jsonl.dropped (created
with records.jsonl's own mode, so a private file stays private). A store file that is a symbolic link is refused
(fileio.LinkRefused): nothing is read or written through it.
For each case an `ok` record is final; otherwise the last record wins.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from flashcheck.core.fileio import full_error, open_plain, read_plain, refuse_link, write_atomic
from flashcheck.core.jsonguard import loads_bounded
from flashcheck.core.lock import LOCK_NAME, FolderLocked, folder_lock  # noqa: F401  (the study folder's lock)
from flashcheck.core.printable import printable
from flashcheck.study.cases import CaseRecord
from flashcheck.study.recordcheck import record_problem

DROPPED_SUFFIX = ".dropped"  # records.jsonl.dropped: the text of the lines repair() removed


ENGINE_FILES = ("records.jsonl", "records.jsonl.dropped", "runs.jsonl", "study.json")


def store_files() -> tuple[str, ...]:
    """The files of a study's store: the engine's and those the registered question sets keep (their tasks')."""
    from flashcheck.study.registry import store_files as sets_files

    return ENGINE_FILES + sets_files()


def check_store_files(folder: str | Path) -> None:
    """LinkRefused (one line) when a store file of `folder` is a symbolic link: checked before a study computes
    anything, so it is refused at once, not after its cases."""
    for name in store_files():
        refuse_link(Path(folder) / name, "a file of the study's store")


class DamagedFile(ValueError):
    """A store file that exists but cannot be parsed."""


def _check_file(path: Path, what: str) -> bool:
    """True when `path` is a file to read; False when absent; ValueError when it is a directory."""
    if path.is_dir() and not path.is_symlink():
        raise ValueError(f"{str(path)!r} is a directory; expected the study's {what} file")
    return path.exists() or path.is_symlink()


MAX_STUDY_JSON = 4 * 2**20  # bytes: the largest preset's study.json holds 9 kB; a study of 400x as many sweeps fits


def _read_bytes(path: Path, what: str, limit: int | None = None) -> bytes | None:
    if not _check_file(path, what):
        return None
    try:
        return read_plain(path, f"the study's {what} file", limit)
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def parse_record_line(line: bytes, where: str, needs: frozenset[str] = frozenset()) -> tuple[dict | None, str | None]:
    """(the record's object, None) for a line that holds a record, else (None, why): not JSON, nested too deep,
    or the first field that breaks the schema (study.recordcheck; `needs`: the metrics its study reports)."""
    try:
        d = loads_bounded(line, where, constants=True)
    except ValueError as exc:
        return None, "not JSON" if "not JSON" in str(exc) else str(exc).removeprefix(where + " ")
    why = record_problem(d, needs)
    return (None, why) if why is not None else (d, None)


def _numbers(rec: CaseRecord) -> str:
    return json.dumps([rec.errors, rec.errors_rounded, rec.stats], sort_keys=True)


def _label(rec: CaseRecord) -> str:
    c = rec.case
    return printable(f"{c.method} L={c.seq_len} seed {c.seed}, case {rec.case_id}")


def warn_dropped(path: Path, bad: list[tuple[int, str]], consequence: str) -> None:
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
            obj = loads_bounded(line, f"line {n}", constants=True)
        except ValueError as exc:  # not JSON, or brackets nested too deep for the recursive parser
            bad.append((n, "not JSON" if "not JSON" in str(exc) else str(exc).removeprefix(f"line {n} ")))
            continue
        if isinstance(obj, dict):
            out.append((n, obj))
        else:
            bad.append((n, f"a JSON {type(obj).__name__}, not an object"))
    if bad:
        warn_dropped(path, bad, "the rest is kept")
    return out


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync; a previous half-written line (no newline) is closed first."""
    append_bytes(path, line.encode() + b"\n")


def append_bytes(path: str | Path, data: bytes, mode: int = 0o666) -> None:
    """Append `data` (whole lines) and fsync, whole or not at all: on a failed write (a full disk: DiskFull)
    the file is cut back to its size before. A previous half-written line (no newline) is closed first. A new
    file gets `mode` less the umask; a symbolic link is refused (LinkRefused), its target untouched."""
    path = Path(path)
    fd = open_plain(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)
    with os.fdopen(fd, "ab+", buffering=0) as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(-1, os.SEEK_END)
            data = data if f.read(1) == b"\n" else b"\n" + data
        try:
            _write_all(f, data)
            os.fsync(f.fileno())
        except OSError as exc:
            os.ftruncate(f.fileno(), size)  # shrinking needs no space
            os.fsync(f.fileno())
            raise full_error(exc, path, len(data)) from exc


def _write_all(f, data: bytes) -> None:
    """Write every byte of `data` to the unbuffered file `f` (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


class ResultStore:
    """records.jsonl in a study folder: one JSON line per finished case. `needs`: the metrics the study that reads
    it reports (study.recordcheck.study_needs): an ok record without one is dropped like a damaged line."""

    def __init__(self, folder: str | Path, needs: frozenset[str] = frozenset()) -> None:
        self.path = Path(folder) / "records.jsonl"
        self.needs = needs
        self.dropped = 0

    def load(self) -> dict[str, CaseRecord]:
        """Records by case_id (ok is final, else the last wins). Read-only: damaged lines and lines that break
        the record schema (study.recordcheck) are dropped with a warning naming each, and left in the file; the
        same case twice with different numbers is a warning naming the lines and the one kept."""
        records: dict[str, CaseRecord] = {}
        lines: dict[str, int] = {}
        bad: list[tuple[int, str]] = []
        clashes: list[str] = []
        data = _read_bytes(self.path, "records")
        for n, line in enumerate((data or b"").split(b"\n"), 1):
            if not line.strip():
                continue
            d, why = parse_record_line(line, f"line {n}", self.needs)
            if why is not None:
                bad.append((n, why))
                continue
            rec = CaseRecord.from_dict(d)
            prev = records.get(rec.case_id)
            if prev is not None and prev.status == "ok" and rec.status == "ok" and _numbers(prev) != _numbers(rec):
                clashes.append(f"lines {lines[rec.case_id]} and {n} ({_label(rec)}): line {lines[rec.case_id]} kept")
            if prev is None or prev.status != "ok":
                records[rec.case_id], lines[rec.case_id] = rec, n
        self.dropped = len(bad)
        if bad:
            warn_dropped(self.path, bad, "those cases will be recomputed")
        if clashes:
            more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
            warnings.warn(
                f"{self.path}: {len(clashes)} case(s) recorded twice as ok with different numbers: "
                f"{'; '.join(clashes[:5])}{more} (the first ok record is final)",
                stacklevel=2,
            )
        return records

    @property
    def dropped_path(self) -> Path:
        """records.jsonl.dropped: the text of every line repair() removed, one per line, oldest first."""
        return self.path.with_name(self.path.name + DROPPED_SUFFIX)

    def repair(self) -> int:
        """Remove lines that are not JSON (half-written by a kill) or break the record schema (forged or
        mistyped) atomically, with a warning naming the file, lines and why; their text is appended to
        `dropped_path` first (with records.jsonl's own mode), so nothing is lost. Only a study run holding the
        folder's lock calls this. Returns lines removed."""
        data = _read_bytes(self.path, "records")
        if not data:
            return 0
        keep, bad, removed = [], [], []
        for n, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            _, why = parse_record_line(line, f"line {n}", self.needs)
            if why is not None:
                bad.append((n, why))
                removed.append(line + b"\n")
                continue
            keep.append(line + b"\n")
        if removed:  # kept aside with the source's own permissions (a private records.jsonl stays private)
            append_bytes(self.dropped_path, b"".join(removed), mode=os.stat(self.path).st_mode & 0o777)
        if removed or not data.endswith(b"\n"):  # rewritten with its own mode (write_atomic): private stays private
            write_atomic(self.path, b"".join(keep))
        if bad:
            warn_dropped(self.path, bad, f"their text is kept in {self.dropped_path}; those cases will be recomputed")
        return len(removed)

    def append(self, record: CaseRecord) -> None:
        append_line(self.path, record.to_json())


def read_study_json(folder: str | Path) -> dict | None:
    """study.json's object; None when absent. ValueError naming the file when it cannot be read."""
    path = Path(folder) / "study.json"
    data = _read_bytes(path, "configuration (study.json)", MAX_STUDY_JSON)  # bounded before it is parsed
    if data is None:
        return None
    try:
        obj = loads_bounded(data, f"{str(path)!r}")
    except ValueError as exc:
        raise DamagedFile(f"{str(path)!r} is damaged ({str(exc).removeprefix(repr(str(path)) + ' ')})") from None
    if not isinstance(obj, dict):
        raise DamagedFile(f"{str(path)!r} is damaged: a JSON {type(obj).__name__}, not an object")
    return obj
