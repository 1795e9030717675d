"""`flashcheck study --preset guide`: the production guide's claims measured. The errors against FP64 are the
preset's sweep (run by study.runner into records.jsonl); cost, latency, the fp16 overflow boundaries and the
stage attribution are tasks of their own, each stored as one line of guide.jsonl when it finishes, so that
a rerun computes only the missing ones."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from flashcheck.core.fileio import write_atomic
from flashcheck.core.progress import progress
from flashcheck.study import guide_measure as gm
from flashcheck.study.config import StudyConfig
from flashcheck.study.store import append_line, folder_lock, read_jsonl

GUIDE_FILE = "guide.jsonl"
SETTINGS_FILE = "guide.json"
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GuideSettings:
    """What the guide's own tasks measure (the errors are the preset's sweep). Methods are 'kernel:policy'
    simulators or 'backend:FORMAT'; a trailing '@fa1' runs the simulator's FlashAttention-1 algorithm."""

    cost_methods: tuple[str, ...] = ("sdpa-math:bf16", "sdpa-flash:bf16", "flash:bf16-mixed")
    cost_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    cost_heads: int = 1
    repeats: int = 7  # 7 repeats: the median's order-statistic interval [min, max] covers 98%
    latency_methods: tuple[str, ...] = ("sdpa-math:bf16", "sdpa-flash:bf16")
    latency_lengths: tuple[int, ...] = (128, 512)
    latency_heads: int = 2
    latency_calls: int = 200
    latency_blocks: int = 5
    boundary_methods: tuple[str, ...] = ("flash:fp16", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16")
    boundary_lengths: tuple[int, ...] = (256, 1024, 4096)
    sum_methods: tuple[str, ...] = ("flash:fp16", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16")
    sum_keys: tuple[int, int] = (2**15, 2**17)
    search_twins: bool = False  # the sum's bf16 twins searched too (else tried at both ends and at 65520 keys)
    explain_lengths: tuple[int, ...] = (512, 2048)
    head_dim: int = 64
    threads: int = 1  # torch threads while timing (the machine is shared; one thread varies least)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# guide: 6.5 min on this shared 2-core machine under a load average of 14 (72 error cases 102 s, 66 tasks 250 s);
# guide-full adds 8k..32k to the cost (sdpa-math past memory is skipped with the reason): about an hour.
GUIDE_PRESETS = {
    "guide": GuideSettings(),
    "guide-full": GuideSettings(
        cost_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
        latency_lengths=(128, 512, 2048),
        boundary_lengths=(256, 1024, 4096, 16384),
        explain_lengths=(512, 4096, 16384),
        sum_methods=("flash:fp16", "flash:fp16@fa1", "flash:fp16-mixed", "sdpa-math:fp16", "sdpa-flash:fp16"),
        search_twins=True,
        repeats=9,
    ),
    # seconds: every task kind at toy sizes (a smoke test, like the study's tiny; its verdicts mean nothing)
    "guide-tiny": GuideSettings(
        cost_lengths=(64, 128, 256),
        repeats=3,
        latency_lengths=(64, 128),
        latency_calls=12,
        latency_blocks=3,
        boundary_methods=("flash:fp16",),
        boundary_lengths=(64, 128),
        sum_methods=("sdpa-math:fp16",),
        sum_keys=(64, 256),
        explain_lengths=(64, 128),
    ),
}


def is_guide(config: StudyConfig) -> bool:
    return config.name in GUIDE_PRESETS


def tasks(s: GuideSettings) -> list[tuple[str, dict]]:
    """(task id, its parameters) for every guide task, cheapest kinds first."""
    out: list[tuple[str, dict]] = []
    for m in s.boundary_methods:
        for name in (m, gm.twin(m)):
            for n in s.boundary_lengths:
                out.append((f"scale/{name}/L={n}", {"kind": "scale", "method": name, "seq_len": n}))
    for m in s.sum_methods:
        out.append((f"sum/{m}", {"kind": "sum", "method": m}))
        kind = "sum" if s.search_twins else "sum_points"
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
        return gm.sum_points(params["method"], sorted({lo, gm.FP16_SUM_OVERFLOW, hi}), head_dim=d)
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
    """Finished tasks by id (the last line of an id wins; damaged lines dropped with a warning)."""
    out = {}
    for _, obj in read_jsonl(Path(folder) / GUIDE_FILE, "guide results"):
        if isinstance(obj.get("id"), str) and obj.get("status") in ("ok", "skipped", "failed"):
            out[obj["id"]] = obj
    return out


def read_settings(folder: str | Path) -> GuideSettings:
    """The settings a guide folder was measured with (guide.json); ValueError when absent or damaged."""
    path = Path(folder) / SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
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
    from flashcheck.kernels.memory import available_bytes

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


def _run_one(tid: str, params: dict, s: GuideSettings) -> dict:
    start = time.perf_counter()
    why = _too_big(params, s)
    if why:
        return {"id": tid, "params": params, "status": "skipped", "reason": why, "seconds": 0.0}
    try:
        result = run_task(params, s)
    except Exception as exc:  # a failed task is recorded and the guide goes on; tried again next run
        return {"id": tid, "params": params, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    secs = round(time.perf_counter() - start, 3)
    return {"id": tid, "params": params, "status": "ok", "result": result, "seconds": secs}


def run_guide_tasks(folder: str | Path, settings: GuideSettings, *, quiet: bool = False) -> dict:
    """Compute every guide task not yet finished in `folder` (failed ones again), one after another with
    `settings.threads` torch threads; append each to guide.jsonl as it finishes. Returns the statistics."""
    folder = Path(folder)
    with folder_lock(folder):
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
            with progress(
                total, "guide tasks", done=total - len(todo), interval=PROGRESS_EVERY_S, quiet=quiet
            ) as advance:
                for tid, params in todo:
                    rec = _run_one(tid, params, settings)
                    failed += rec["status"] == "failed"
                    append_line(folder / GUIDE_FILE, json.dumps(rec))
                    advance(note=tid)
        finally:
            torch.set_num_threads(threads)
    return {"tasks_computed": len(todo), "tasks_failed": failed, "seconds": round(time.perf_counter() - start, 3)}


def run_guide(config: StudyConfig, out: str | Path, *, workers: int | None = None, quiet: bool = False) -> dict:
    """The guide preset: its error sweep through the study runner (records.jsonl), then the guide's own
    tasks (guide.jsonl). Returns the runner's statistics with the guide tasks' beside them."""
    from flashcheck.study.runner import run_study

    stats = run_study(config, out, workers=workers, quiet=quiet)
    guide = run_guide_tasks(out, GUIDE_PRESETS[config.name], quiet=quiet)
    return stats | {"guide_" + k: v for k, v in guide.items()} | {"seconds": stats["seconds"] + guide["seconds"]}
