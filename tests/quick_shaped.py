"""A quick-shaped study folder without running a kernel: study.json of the quick preset and one synthetic record
per case (errors with a known structure: all-bf16 Flash above its baseline and growing with L, bf16-mixed
Flash 0.95x of it), plus guide.jsonl results of quick's guide settings, so that `build_report` draws every
figure the quick preset draws, in seconds."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from flashcheck.questions.guide.measure import FP16_SUM_OVERFLOW
from flashcheck.questions.guide.tasks import GUIDE_FILE, SETTINGS_FILE, tasks
from flashcheck.questions.presets import quick
from flashcheck.study.cases import CaseRecord, expand
from flashcheck.study.config import StudyConfig

METRICS = ("max_abs", "mean_abs", "rmse", "rel_l2", "std")


def _error(c) -> float:
    """Baseline 1e-3 x (L/512)^-0.2 with +-3% noise per seed; all-bf16 flash 2 x (L/512)^0.5 x (Bc/16)^-0.5
    of it, bf16-mixed flash 0.95x, fp16 a quarter, fp8 thirty times."""
    e = 1e-3 * (max(c.seq_len, 16) / 512) ** -0.2 * (1 + 0.03 * math.sin(7 * c.seed + c.seq_len + len(c.method)))
    fmt = c.policy
    e *= 0.25 if "fp16" in fmt else 30 if "fp8" in fmt else 1
    if c.kernel == "flash" and fmt == "bf16":
        e *= 2 * (max(c.seq_len, 16) / 512) ** 0.5 * ((c.block_k or 128) / 16) ** -0.5
    elif c.kernel in ("flash", "splitkv"):
        e *= 0.95 * (1 + 0.01 * math.cos(3 * c.seed + c.seq_len))
    return e


def _record(c) -> CaseRecord:
    e = _error(c)
    errors = {m: e * (1 + i / 10) for i, m in enumerate(METRICS)}
    rounded = {m: v / 2 for m, v in errors.items()}
    if c.backward:
        rounded |= {f"{g}_rel_l2": e * k for g, k in (("dq", 3), ("dk", 2), ("dv", 1.5))}
    stats = {"visible": float(c.lk), "f_score": 1.0, "f_p": 1.0}
    d = {
        "case_id": c.case_id,
        "case": dataclasses.asdict(c),
        "status": "ok",
        "errors": errors,
        "errors_rounded": rounded,
        "seconds": 0.1,
        "dead_rows": ("nan" if c.kernel == "sdpa-flash" else "zeros") if c.padding != "none" else None,
        "stats": stats,
        "env": {"torch": "synthetic"},
    }
    return CaseRecord.from_dict(d)


def _guide_result(params: dict) -> dict:
    kind = params["kind"]
    if kind == "scale":
        fp16 = "fp16" in params["method"]
        i = 72 if fp16 and "mixed" not in params["method"] else None
        points = {str(j): i is None or j < i for j in range(0, 129, 32)} | ({str(i): False} if i else {})
        return {"boundary_i": i, "inputs_overflow_i": 112, "points": points, "monotone": True}
    if kind == "sum_points":
        fp16 = "fp16" in params["method"] and "mixed" not in params["method"]
        n = FP16_SUM_OVERFLOW
        pts = {str(n - 1): "ok", str(n): "non-finite" if fp16 else "ok"}
        return {"boundary_keys": n if fp16 else None, "outcome": "non-finite" if fp16 else None, "points": pts,
                "monotone": True, "searched": False}  # fmt: skip
    if kind == "latency":
        blocks = [[1e-3 * (1 + 0.01 * ((i * j) % 5)) for i in range(40)] for j in range(5)]
        return {"blocks": {"sdpa-flash:bf16": blocks, "sdpa-math:bf16": [[2 * t for t in b] for b in blocks]}}
    if kind == "explain":
        stages = ("input", "p", "accum", "stats", "output")
        alone = {st: 1e-4 * (i + 1) for i, st in enumerate(stages)}
        raised = {st: 2e-3 - v for st, v in alone.items()}
        return {"full": 2e-3, "alone": alone, "raised": raised, "output_share": 0.25, "dominant_stage": "output"}
    if kind == "cost":
        n, slow = params["seq_len"], 2.0 if "math" in params["method"] else 1.0
        times = [slow * 1e-9 * n**2 * (1 + 0.01 * r) * (3 if params["backward"] else 1) for r in range(5)]
        return {"times": times, "peak_bytes": int(64 * n * (n if "math" in params["method"] else 128))}
    raise ValueError(kind)


def write_quick_shaped(folder: Path, config: StudyConfig | None = None) -> dict[str, CaseRecord]:
    """study.json, records.jsonl and (with the preset's guide settings) guide.json and guide.jsonl."""
    config = config or quick()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps(config.to_dict()))
    records = {c.case_id: _record(c) for c in expand(config)}
    (folder / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records.values()))
    if config.settings.get("guide") is not None:
        s = config.settings.get("guide")
        (folder / SETTINGS_FILE).write_text(json.dumps(s.to_dict()))
        lines = []
        for tid, params in tasks(s):
            if params["kind"] in ("gpu_same", "gpu_deterministic"):
                continue
            rec = {"id": tid, "params": params, "status": "ok", "result": _guide_result(params), "seconds": 0.1}
            lines.append(json.dumps(rec) + "\n")
        (folder / GUIDE_FILE).write_text("".join(lines))
    return records
