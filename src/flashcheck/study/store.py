"""The durable results store: one JSON line per finished case, appended and fsynced as it arrives."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from flashcheck.fileio import write_atomic
from flashcheck.study.cases import CaseRecord


class ResultStore:
    """records.jsonl in a study folder. A half-written or corrupt line (a kill mid-write) is dropped
    on load, with a warning, and cut from the file before the next append."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / "records.jsonl"
        self.dropped = 0

    def load(self) -> dict[str, CaseRecord]:
        """Records by case_id (the last one wins)."""
        if not self.path.exists():
            return {}
        good_lines, records, dropped = [], {}, 0
        for line in self.path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = CaseRecord.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError):
                dropped += 1
                continue
            records[rec.case_id] = rec
            good_lines.append(line)
        self.dropped = dropped
        if dropped:
            warnings.warn(
                f"{self.path}: dropped {dropped} unreadable line(s) (an interrupted write); "
                "those cases will be recomputed",
                stacklevel=2,
            )
            write_atomic(self.path, "".join(ln.decode() + "\n" for ln in good_lines))
        elif self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
            with self.path.open("a") as f:
                f.write("\n")
        return records

    def append(self, record: CaseRecord) -> None:
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
