"""The production guide's own tasks: cost, latency, the fp16 overflow boundaries and the stage attribution,
each stored as one line of guide.jsonl when it finishes, so that a rerun computes only the missing ones. They
run after the cases of a study whose configuration has `guide` settings (the guide presets, and quick, full
and tiny); the guide's errors against FP64 are that study's sweep GUIDE_QUESTION (records.jsonl)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

import flashcheck.questions.guide.measure as gm
from flashcheck.core.fileio import write_atomic
from flashcheck.core.jsonguard import read_json
from flashcheck.core.load import load_average, load_record
from flashcheck.core.printable import printable
from flashcheck.core.progress import progress
from flashcheck.questions.guide.presets import GUIDE_SETTINGS, GuideSettings
from flashcheck.questions.guide.resultcheck import result_problem
from flashcheck.study.config import StudyConfig
from flashcheck.study.store import append_line, folder_lock, read_jsonl, warn_dropped

GUIDE_FILE = "guide.jsonl"
SETTINGS_FILE = "guide.json"
PROGRESS_EVERY_S = 5.0


# the guide-only presets (`--preset guide`, guide-full, guide-tiny): a report of the guide's claims alone
GUIDE_PRESETS = {k: v for k, v in GUIDE_SETTINGS.items() if k.startswith("guide")}


def is_guide(config: StudyConfig) -> bool:
    """Whether `config` is a guide-only preset (its report is the guide's claims alone)."""
    return config.name in GUIDE_PRESETS


def tasks(s: GuideSettings) -> list[tuple[str, dict]]:
    """(task id, its parameters) for every guide task, cheapest kinds first."""
    out: list[tuple[str, dict]] = []
    for m in s.boundary_methods:
        for name in (m, gm.twin(m)):
            for n in s.boundary_lengths:
                out.append((f"scale/{name}/L={n}", {"kind": "scale", "method": name, "seq_len": n}))
    for m in s.sum_methods:
        out.append((f"sum/{m}", {"kind": "sum" if s.sum_search else "sum_points", "method": m}))
        kind = "sum" if s.sum_search and s.search_twins else "sum_points"
        out.append((f"sum/{gm.twin(m)}", {"kind": kind, "method": gm.twin(m)}))
    for n in s.latency_lengths:
        out.append((f"latency/L={n}", {"kind": "latency", "seq_len": n}))
    for n in s.explain_lengths:
        out.append((f"explain/L={n}", {"kind": "explain", "seq_len": n}))
    if torch.cuda.is_available():  # the claims only a GPU can test, measured where there is one
        out += [("gpu/same", {"kind": "gpu_same"}), ("gpu/deterministic", {"kind": "gpu_deterministic"})]
    for m in s.cost_methods:
        for backward in (False, True):
            for n in s.cost_lengths:
                p = "fwd+bwd" if backward else "fwd"
                out.append((f"cost/{m}/{p}/L={n}", {"kind": "cost", "method": m, "seq_len": n, "backward": backward}))
    return out


def run_task(params: dict, s: GuideSettings) -> dict:
    """One task's measurement (a JSON-able dict)."""
    kind, d = params["kind"], s.head_dim
    if kind == "scale":
        return gm.scale_boundary(params["method"], params["seq_len"], head_dim=d)
    if kind == "sum":
        return gm.sum_boundary(params["method"], *s.sum_keys, head_dim=d)
    if kind == "sum_points":
        lo, hi = s.sum_keys
        edge = {gm.FP16_SUM_OVERFLOW - 1, gm.FP16_SUM_OVERFLOW}  # one key each side of fp16's sum overflow
        keys = {lo, hi} | {n for n in edge if lo <= n <= hi}
        return gm.sum_points(params["method"], sorted(keys), head_dim=d)
    if kind == "latency":
        return gm.latency(
            s.latency_methods,
            params["seq_len"],
            heads=s.latency_heads,
            head_dim=d,
            calls=s.latency_calls,
            blocks=s.latency_blocks,
        )
    if kind == "gpu_same":
        return gm.gpu_same(head_dim=d)
    if kind == "gpu_deterministic":
        return gm.gpu_deterministic(head_dim=d)
    if kind == "explain":
        return gm.explain(params["seq_len"], heads=s.cost_heads * 2, head_dim=d)
    if kind == "cost":
        return gm.cost(
            params["method"],
            params["seq_len"],
            backward=params["backward"],
            heads=s.cost_heads,
            head_dim=d,
            repeats=s.repeats,
        )
    raise ValueError(f"unknown guide task kind {kind!r}")


def load_results(folder: str | Path) -> dict[str, dict]:
    """Finished tasks by id, in the order of their ids (not of finishing, which a pool of workers varies: sums
    over them then round alike in every run): the last line of an id wins, except that a failure never
    supersedes an ok result (damaged lines dropped with a warning)."""
    out: dict[str, dict] = {}
    path, bad = Path(folder) / GUIDE_FILE, []
    for n, obj in read_jsonl(path, "guide results"):
        if isinstance(obj.get("id"), str) and obj.get("status") in ("ok", "skipped", "failed"):
            if (why := result_problem(obj)) is not None:  # forged or mistyped: never reaches a claim
                bad.append((n, why))
                continue
            obj |= {k: printable(obj[k]) for k in ("id", "reason", "error") if isinstance(obj.get(k), str)}
            prev = out.get(obj["id"])
            if obj["status"] == "failed" and prev is not None and prev["status"] == "ok":
                continue
            out[obj["id"]] = obj
    if bad:
        warn_dropped(path, bad, "those tasks will be measured again")
    return dict(sorted(out.items()))


def read_settings(folder: str | Path) -> GuideSettings:
    """The settings a guide folder was measured with (guide.json); ValueError when absent or damaged."""
    path = Path(folder) / SETTINGS_FILE
    try:
        data = read_json(path, "the guide's settings", follow=False)
        fields = {f.name for f in dataclasses.fields(GuideSettings)}
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        return GuideSettings(**data)
    except FileNotFoundError:
        raise ValueError(f"{str(folder)!r} holds no guide measurements ({SETTINGS_FILE} is missing)") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is damaged ({exc}); run the guide again into a new --out") from None


def _too_big(params: dict, s: GuideSettings) -> str | None:
    """Why a cost task cannot fit in memory here (sdpa-math keeps L x L scores; the simulators' score
    blocks and the backward graph are a few L x 128 arrays), None when it fits."""
    from flashcheck.kernels.sim.memory import available_bytes

    if params["kind"] != "cost":
        return None
    n, h = params["seq_len"], s.cost_heads
    square = "math" in params["method"] or "standard" in params["method"]
    need = (4 * 4 * h * n * n) if square else (64 * h * n * 128 * 8)
    need *= 3 if params["backward"] else 1
    avail = available_bytes()
    if avail and need > 0.5 * avail:
        return f"too big for memory: about {need / 2**30:.1f} GiB needed, {avail / 2**30:.1f} GiB available"
    return None


TIMED_KINDS = ("cost", "latency", "gpu_deterministic")  # tasks whose result is a timing (core.load beside it)


def _run_one(tid: str, params: dict, s: GuideSettings) -> dict:
    start = time.perf_counter()
    why = _too_big(params, s)
    if why:
        return {"id": tid, "params": params, "status": "skipped", "reason": why, "seconds": 0.0}
    before = load_average()
    try:
        result = run_task(params, s)
    except Exception as exc:  # a failed task is recorded and the guide goes on; tried again next run
        return {"id": tid, "params": params, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    secs = round(time.perf_counter() - start, 3)
    rec = {"id": tid, "params": params, "status": "ok", "result": result, "seconds": secs}
    if params["kind"] in TIMED_KINDS:  # how busy the machine was (timing verdicts are inconclusive when busy)
        rec["load"] = load_record(before, s.threads)
    return rec


def run_guide_tasks(folder: str | Path, settings: GuideSettings, *, quiet: bool = False) -> dict:
    """Compute every guide task not yet finished in `folder` (failed ones again), holding the folder's lock;
    see run_tasks_locked. Returns the statistics."""
    with folder_lock(folder):
        return run_tasks_locked(folder, settings, quiet=quiet)


def run_tasks_locked(folder: str | Path, settings: GuideSettings, *, quiet: bool = False) -> dict:
    """Compute every guide task not yet finished in `folder` (failed ones again), one after another with
    `settings.threads` torch threads; append each to guide.jsonl as it finishes (a killed run loses only the
    task it was on). The caller holds the folder's lock. Returns the statistics."""
    folder = Path(folder)
    path = folder / SETTINGS_FILE
    if path.exists() and read_settings(folder) != settings:
        raise ValueError(f"--out {str(folder)!r} holds guide measurements with other settings; use a new --out")
    write_atomic(path, json.dumps(settings.to_dict(), indent=2))
    done = {k for k, r in load_results(folder).items() if r["status"] != "failed"}
    todo = [(t, p) for t, p in tasks(settings) if t not in done]
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    start, failed = time.perf_counter(), 0
    try:
        total = len(tasks(settings))
        with progress(total, "guide tasks", done=total - len(todo), interval=PROGRESS_EVERY_S, quiet=quiet) as advance:
            for tid, params in todo:
                rec = _run_one(tid, params, settings)
                failed += rec["status"] == "failed"
                append_line(folder / GUIDE_FILE, json.dumps(rec))
                advance(note=tid)
    finally:
        torch.set_num_threads(threads)
    return {"tasks_computed": len(todo), "tasks_failed": failed, "seconds": round(time.perf_counter() - start, 3)}
