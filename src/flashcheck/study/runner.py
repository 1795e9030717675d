"""Run a study: expand the grid, skip what the store holds, compute the rest, keep every record."""

from __future__ import annotations

import json
import os
import secrets
import time
import warnings
from pathlib import Path

from flashcheck.core.fileio import DiskFull, full_error, is_full, read_plain, write_atomic
from flashcheck.core.progress import progress
from flashcheck.study.cases import Case, CaseRecord, check_sweeps_can_run, environment, expand, group_by_inputs
from flashcheck.study.config import StudyConfig
from flashcheck.study.executors import EXECUTORS, check_ray_address, run_local, run_ray
from flashcheck.study.memory import MEMORY_SKIP, available_bytes, too_big
from flashcheck.study.recordcheck import study_needs
from flashcheck.study.registry import sets, solo_set
from flashcheck.study.store import (
    DamagedFile,
    ResultStore,
    append_line,
    check_store_files,
    folder_lock,
    read_study_json,
)

MAX_WORKERS = 256
PROGRESS_EVERY_S = 5.0  # plain progress lines off a terminal, at most this often
RECORD_BYTES = 2048  # a record line's size when the store holds none to measure (tiny's average 1.2 kB)
REPORT_BYTES = 16 * 2**20  # room for report.html, report.md and figures/ (tiny's take 3 MB)


def prepare_out(out: str | Path) -> Path:
    """Create `out` and check that it is a writable folder."""
    if not str(out).strip():
        raise ValueError(f"--out {str(out)!r} is empty; give a folder for the study")
    path = Path(out)
    probe = path / f".write-test.{secrets.token_hex(6)}"  # a fresh name: never a link someone left there
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.write(fd, b"ok")
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        if is_full(exc):
            probe.unlink(missing_ok=True)
            raise full_error(exc, probe, REPORT_BYTES) from exc
        raise ValueError(f"--out {str(path)!r} is not writable: {exc.strerror or exc}") from None
    return path


def save_config(path: Path, config: StudyConfig) -> None:
    """Write study.json, or check that the one there is this configuration (to resume)."""
    new = config.to_dict()
    try:
        old = read_study_json(path)
    except DamagedFile as exc:
        warnings.warn(f"{exc}; rewriting it from this run's configuration", stacklevel=2)
        old = None
    missing = [k for k in config.settings if old is not None and k not in old]
    upgrade = bool(missing) and solo_set(config.name) is not None
    if upgrade:  # a solo preset's folder from before study.json held its set's settings (e.g. the guide's)
        old = old | {k: new[k] for k in missing}
    if old is None:
        write_atomic(path / "study.json", json.dumps(new, indent=2))
        return
    try:
        same = StudyConfig.from_dict(old, str(path / "study.json")).to_dict() == new
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"--out {str(path)!r} holds a study this version cannot read ({exc}); use another --out"
        ) from None
    if not same:
        raise ValueError(
            f"--out {str(path)!r} holds another study ({old.get('name')!r}); use a new --out "
            "folder or the same configuration to resume"
        )
    if upgrade:
        write_atomic(path / "study.json", json.dumps(new, indent=2))


def check_workers(workers: int | None) -> int:
    """`workers`, or the core count when None; ValueError unless 1 <= workers <= MAX_WORKERS."""
    if workers is None:
        return max(1, min(os.cpu_count() or 1, MAX_WORKERS))
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers {workers} is not allowed; give an integer from 1 to {MAX_WORKERS}")
    return workers


def check_device(device: str, executor: str = "local") -> None:
    """ValueError unless `device` is cpu, or cuda with a CUDA device here and the local executor."""
    from flashcheck.backends.base import DEVICES, cuda_unavailable_reason

    if device not in DEVICES:
        raise ValueError(f"--device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    if device == "cuda" and (why := cuda_unavailable_reason()):
        raise ValueError(f"--device cuda: there is no CUDA device here ({why}); use --device cpu")
    if device == "cuda" and executor != "local":
        raise ValueError("--device cuda runs on the local executor; leave out --executor ray")


def _done(rec: CaseRecord | None) -> bool:
    """A case is done when ok or skipped for good; failed and memory-skipped cases are tried again."""
    if rec is None or rec.status == "failed":
        return False
    return rec.status == "ok" or not (rec.error or "").startswith(MEMORY_SKIP)


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    quiet: bool = False,
    device: str = "cpu",
) -> dict:
    """Compute every case of `config` not yet done in `out`'s store (failed cases again), then, when the
    config has a question set's settings, that set's own tasks not yet done (study.registry.QuestionSet.tasks).
    Holds the folder's lock while it runs (FolderLocked when another study has it). Returns this run's
    statistics."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}")
    workers = check_workers(workers)
    check_device(device, executor)
    check_sweeps_can_run(config)
    if ray_address is not None:
        if not ray_address.strip():
            raise ValueError(f"--ray-address {ray_address!r} is empty; give HOST:PORT, or leave it out for a local Ray")
        check_ray_address(ray_address)
    path = prepare_out(out)
    try:
        return _run_in(config, path, workers, executor, ray_address, quiet, device)
    except KeyboardInterrupt:  # Ctrl-C: every line written stays whole; the lock is released (folder_lock)
        raise StudyInterrupted(interrupted_line(config, path)) from None


def interrupted_line(config: StudyConfig, path: Path, *, in_report: bool = False) -> str:
    """The line a Ctrl-C prints: the cases stored in `path`, whether a set's own tasks (the guide's timings) and
    the report were finished, and how to finish them. `in_report`: stopped while the report was being written."""
    cases = expand(config)
    stored = ResultStore(path, study_needs(config)).load() if (path / "records.jsonl").is_file() else {}
    n = sum(_done(stored.get(c.case_id)) for c in cases)
    tasks = [
        qs.settings[0]
        for qs in sets()
        if qs.tasks is not None and qs.settings is not None and config.settings.get(qs.settings[0]) is not None
    ]
    head = f"interrupted: {n} of {len(cases)} cases stored in {path}"
    if in_report:
        done = f" and the {', '.join(tasks)} tasks done" if tasks else ""
        return (
            f"{head}{done}; the report was not finished: run `flashcheck report {path}` "
            "(or the same command again) to finish it"
        )
    left = f", the {', '.join(tasks)} tasks not finished" if tasks else ""
    return f"{head}{left}; run the same command again to resume (the report was not written)"


class StudyInterrupted(KeyboardInterrupt):
    """Ctrl-C during a study; its message says how many cases are stored and how to resume."""


def _run_in(
    config: StudyConfig, path: Path, workers: int, executor: str, ray_address: str | None, quiet: bool, device: str
) -> dict:
    with folder_lock(path):
        check_store_files(path)
        save_config(path, config)
        stats = _run_locked(config, path, workers, executor, ray_address, quiet, device)
        for qs in sets():  # a set's own tasks (e.g. the guide's timings), one after another here, after the cases
            if qs.tasks is None or qs.settings is None or config.settings.get(qs.settings[0]) is None:
                continue
            key = qs.settings[0]
            done = qs.tasks(path, config.settings[key], quiet)
            stats = stats | {f"{key}_{k}": v for k, v in done.items()} | {"seconds": stats["seconds"] + done["seconds"]}
    return stats


def _run_locked(
    config: StudyConfig, path: Path, workers: int, executor: str, ray_address: str | None, quiet: bool, device: str
) -> dict:
    store = ResultStore(path, study_needs(config))
    store.repair()
    current = store.load()
    cases = expand(config)
    todo = [c for c in cases if not _done(current.get(c.case_id))]
    runnable, skips = _fit_memory(todo, current)
    groups = group_by_inputs(runnable)
    start = time.perf_counter()
    written = {"ok": 0, "skipped": 0, "failed": 0}

    def on_record(rec: CaseRecord) -> None:
        prev = current.get(rec.case_id)
        if rec.status != "ok" and prev is not None and prev.status == "ok":
            return  # an ok record is final
        store.append(rec)
        current[rec.case_id] = rec
        written[rec.status] += 1
        advance(note=f"{written['failed']} failed" if written["failed"] else "")

    done = len(cases) - len(runnable) - len(skips)  # all but what this run will record
    try:
        with progress(len(cases), "cases", done=done, interval=PROGRESS_EVERY_S, quiet=quiet, opening=True) as advance:
            for rec in skips:
                on_record(rec)
            if not groups:
                refs = 0
            elif executor == "ray":
                refs = run_ray(groups, workers, on_record, ray_address, temp_dir=_ray_temp(path))
            else:
                refs = run_local(groups, workers, on_record, device=device)
    except DiskFull as exc:
        left = sum(not _done(current.get(c.case_id)) for c in cases)
        raise full_error(exc, exc.path, left * _record_bytes(store) + REPORT_BYTES) from exc
    stats = {
        "cases_total": len(cases),
        "cases_computed": len(runnable),
        "cases_reused": len(cases) - len(todo),
        "cases_failed": written["failed"],
        "cases_too_big": len(todo) - len(runnable),
        "input_sets": len(groups),
        "reference_computations": refs,
        "workers": workers,
        "executor": executor,
        "seconds": round(time.perf_counter() - start, 3),
    }
    if sum(written.values()):  # a run that changed nothing leaves no trace
        append_line(path / "runs.jsonl", json.dumps(stats))
    return stats


def _record_bytes(store: ResultStore) -> int:
    """The mean size of a record line in the store (RECORD_BYTES when it holds none)."""
    try:
        data = read_plain(store.path, "the study's records file")  # never through a link
    except (OSError, ValueError):
        return RECORD_BYTES
    lines = data.count(b"\n")
    return -(-len(data) // lines) if lines else RECORD_BYTES


def _fit_memory(todo: list[Case], current: dict[str, CaseRecord]) -> tuple[list[Case], list[CaseRecord]]:
    """Split `todo` into cases that fit in memory alone and skip records for those that do not (none for
    a case already recorded as too big, so that a rerun writes nothing); the local executor then runs
    only as many at once as fit."""
    avail = available_bytes()
    if not avail:
        return todo, []
    fits, skips, env = [], [], None
    for c in todo:
        why = too_big(c, avail, 1)
        if why is None:
            fits.append(c)
            continue
        prev = current.get(c.case_id)
        if prev is None or not (prev.error or "").startswith(MEMORY_SKIP):
            env = env or environment()
            skips.append(CaseRecord(c.case_id, c, "skipped", {}, {}, 0.0, why, env))
    return fits, skips


def _ray_temp(path: Path) -> Path:
    # Ray's socket paths must stay short: keep its session folder near the root of the work folder
    temp = Path(os.environ.get("FLASHCHECK_RAY_TMP", path / ".ray"))
    temp.mkdir(parents=True, exist_ok=True)
    return temp
