"""Run a study: expand the grid, skip what the store holds, compute the rest, keep every record."""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

from flashcheck.fileio import write_atomic
from flashcheck.study.cases import CaseRecord, expand, group_by_inputs
from flashcheck.study.config import StudyConfig
from flashcheck.study.executors import EXECUTORS, run_local, run_ray
from flashcheck.study.store import ResultStore


def prepare_out(out: str | Path, config: StudyConfig) -> Path:
    """Create `out`, check that it is writable and holds no other study; save the config there."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {str(path)!r} is not writable: {exc.strerror or exc}") from None
    saved = path / "study.json"
    new = config.to_dict()
    if saved.exists():
        old = json.loads(saved.read_text())
        if old != json.loads(json.dumps(new)):
            raise ValueError(
                f"--out {str(path)!r} holds another study ({old.get('name')!r}); use a new --out "
                "folder or the same configuration to resume"
            )
    else:
        write_atomic(saved, json.dumps(new, indent=2))
    return path


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    quiet: bool = False,
) -> dict:
    """Compute every case of `config` missing from `out`'s store. Returns this run's statistics."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers {workers} must be a positive integer")
    path = prepare_out(out, config)
    store = ResultStore(path)
    done = store.load()
    cases = expand(config)
    todo = [c for c in cases if c.case_id not in done]
    groups = group_by_inputs(todo)
    start = time.perf_counter()
    progress = _progress(quiet)
    with progress or nullcontext():
        bar = (
            progress.add_task(f"study {config.name}", total=len(cases), completed=len(cases) - len(todo))
            if progress
            else None
        )

        def on_record(rec: CaseRecord) -> None:
            store.append(rec)
            if progress:
                progress.advance(bar)

        if not groups:
            refs = 0
        elif executor == "ray":
            refs = run_ray(groups, workers, on_record, ray_address, temp_dir=_ray_temp(path))
        else:
            refs = run_local(groups, workers, on_record)
    stats = {
        "cases_total": len(cases),
        "cases_computed": len(todo),
        "cases_reused": len(cases) - len(todo),
        "input_sets": len(groups),
        "reference_computations": refs,
        "workers": workers,
        "executor": executor,
        "seconds": round(time.perf_counter() - start, 3),
    }
    with (path / "runs.jsonl").open("a") as f:
        f.write(json.dumps(stats) + "\n")
    return stats


def _ray_temp(path: Path) -> Path:
    # Ray's socket paths must stay short: keep its session folder near the root of the work folder
    temp = Path(os.environ.get("FLASHCHECK_RAY_TMP", path / ".ray"))
    temp.mkdir(parents=True, exist_ok=True)
    return temp


def _progress(quiet: bool):
    if quiet:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("cases"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )
