"""The guide's claims and their report, from a study folder's stored records only: a guide-only study's whole
report (the claims table first: claim, measured with interval, verdict, conditions; then one section per
question with its figure; report.md/html, summary.json), and the part quick's and full's reports hold."""

from __future__ import annotations

import math
import re
from pathlib import Path

import flashcheck.questions.guide.claims as gc
from flashcheck.core.fileio import folder_problem
from flashcheck.questions.guide.measure import OCTAVE_STEPS, twin
from flashcheck.questions.guide.presets import GUIDE_QUESTION, GuideSettings, guide_sweep
from flashcheck.questions.guide.tasks import load_results, read_settings
from flashcheck.reporting import Figure, Heading, Page, Table, Text, write_report
from flashcheck.reporting.figures import Styler, figure, label_axes, legend_below, log10_axis, matplotlib_available
from flashcheck.reporting.page import Sentences, cell
from flashcheck.reporting.verdicts import median_interval
from flashcheck.study.cases import expand_sweep
from flashcheck.study.config import StudyConfig
from flashcheck.study.recordcheck import study_needs
from flashcheck.study.store import ResultStore, read_jsonl, read_study_json


def _load(folder: Path) -> tuple[StudyConfig, GuideSettings, list, dict[str, dict]]:
    if why := folder_problem(folder):
        raise ValueError(f"{str(folder)!r} {why}; give the --out folder of `flashcheck study --preset guide`")
    data = read_study_json(folder)
    if data is None:
        raise ValueError(f"{str(folder)!r} holds no study (no study.json); run `flashcheck study --preset guide`")
    config = StudyConfig.from_dict(data, str(folder / "study.json"))
    records = list(ResultStore(folder, study_needs(config)).load().values())
    return config, read_settings(folder), records, load_results(folder)


def is_guide_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a guide-only study (--preset guide, guide-full, guide-tiny: its guide.json, and no
    sweep but the guide's errors); a quick or full study's guide part is in its study report."""
    from flashcheck.questions.guide.tasks import SETTINGS_FILE

    if not (Path(folder) / SETTINGS_FILE).is_file():
        return False
    try:
        data = read_study_json(Path(folder))
    except ValueError:
        return True  # a damaged study.json: the guide's report says so
    sweeps = (data or {}).get("sweeps")
    return not isinstance(sweeps, list) or all(
        isinstance(s, dict) and s.get("question") == GUIDE_QUESTION for s in sweeps
    )


def guide_part(folder: Path, config: StudyConfig, records: list, s: GuideSettings) -> tuple[dict, list]:
    """The guide's claims from a study folder's stored records (computes no measurement): its summary part
    (findings, answer, conclusion, task failures, skipped tasks, settings, figures) and its report blocks.
    records: the study's records (those of the sweep GUIDE_QUESTION are the guide's errors)."""
    sweep = guide_sweep(config)
    ids = {c.case_id for c in expand_sweep(sweep)} if sweep is not None else set()
    records = [r for r in records if r.case_id in ids]
    methods = sweep.methods if sweep is not None else ()
    results = load_results(folder)
    explains = {r["params"]["seq_len"]: r["result"] for r in results.values() if _ok(r, "explain")}
    claims = [
        *gc.cost_claims(results, s),
        gc.latency_claim(results, s),
        *gc.boundary_claims(results, s),
        *gc.error_claims(records, methods),
        *gc.slope_claims(records, explains, methods),
        *gc.gpu_claims(results),
    ]
    figures = _figures(folder / "figures", records, results, s, methods) if matplotlib_available() else {}
    drawn = {DRAWN: folder} if matplotlib_available() else {}  # figures drawn: a missing one was not measured
    answer = gc.answer(records, results)
    missing = _missing(folder, s, ids, {r.case_id for r in records}, results)
    claims = [_unmeasured(c, missing) for c in claims]
    claims = [{**c, "shown": shown_status(c)} for c in claims]  # summary.json says what the table says
    part = {
        "findings": claims,
        "stored": {
            "cases": [len(ids) - len(missing["cases"]), len(ids)],
            "tasks": [len(missing["planned"]) - len(missing["tasks"]), len(missing["planned"])],
        },
        "answer": answer,
        "conclusion": conclusion(claims, answer),
        "failures": [
            {"case": r["id"], "error": r.get("reason") or ""} for r in results.values() if r["status"] == "failed"
        ],
        "skipped": [{"task": r["id"], "reason": r.get("reason")} for r in results.values() if r["status"] == "skipped"],
        "settings": s.to_dict(),
        "figures": {k: str(p.relative_to(folder)) for k, p in figures.items()},
    }
    part = _strict(part)
    rel = {**drawn, **{k: p.relative_to(folder) for k, p in figures.items()}}
    return part, [*claims_blocks(part), *_evidence(part, results, s, explains, rel, missing["tasks"])]


def build_guide_report(folder: str | Path) -> dict:
    """Rebuild a guide-only study's figures, report.md, report.html and summary.json from its records (computes
    no measurement, changes no record): the claims table first."""
    folder = Path(folder)
    config, s, records, _ = _load(folder)
    part, blocks = guide_part(folder, config, records, s)
    failures = part["failures"] + [
        {"case": f"{r.case.method} L={r.case.seq_len} seed {r.case.seed}", "error": r.error or ""}
        for r in records
        if r.status == "failed"
    ]
    from flashcheck.study.part import partial_line

    partial = partial_line({what: tuple(n) for what, n in part["stored"].items()})
    summary = {
        "study": config.name,
        "complete": partial is None,
        "partial": partial,
        "stored": part["stored"],
        "findings": part["findings"],
        "cases": len(records) + len(load_results(folder)),
        "failed": len(failures),
        "failures": failures,
        "skipped": part["skipped"],
        "runs": [run for _, run in read_jsonl(folder / "runs.jsonl", "runs")],
        "answer": part["answer"],
        "conclusion": part["conclusion"],
        "settings": part["settings"],
        "figures": part["figures"],
    }
    page = Page(f"flashcheck study {summary['study']}: the production guide's claims, measured", banner=partial)
    page.add(*blocks[:2], Heading("Conclusion", anchor="conclusion"))
    page.add(Sentences([(c["text"], c["section"]) for c in summary["conclusion"]]))
    if summary["failures"]:
        rows = [[f["case"], f["error"][:200]] for f in summary["failures"]]
        page.add(Heading("Failed"), Table(["task", "error"], rows))
    page.add(*blocks[2:])
    write_report(folder, page, summary)
    return summary


NOT_YET = "not measured yet"


def _missing(folder: Path, s: GuideSettings, ids: set[str], stored: set[str], results: dict) -> dict[str, list]:
    """What the study has not stored yet: its guide sweep's case ids and its tasks' ids (a study stopped early,
    or read while it runs), and every task id planned."""
    from flashcheck.questions.guide.tasks import tasks

    planned = [tid for tid, _ in tasks(s)]
    return {"cases": sorted(ids - stored), "tasks": [t for t in planned if t not in results], "planned": planned}


def _task_prefixes(cid: str) -> tuple[str, ...]:
    """The task ids a claim rests on, as prefixes: time/M/P and memory/M/P on cost/M/P/, the speedups on every
    cost task, the latency on latency/, fp16/M on the scale and sum searches, the error slope on explain/."""
    head, _, rest = cid.partition("/")
    return {
        "time": (f"cost/{rest}/",),
        "memory": (f"cost/{rest}/",),
        "speedup": ("cost/",),
        "speedup_grows": ("cost/",),
        "latency_variance": ("latency/",),
        "fp16": ("scale/", "sum/"),
        "slope": ("explain/",),
    }.get(head, ())


def _unmeasured(c: dict, missing: dict[str, list]) -> dict:
    """A claim whose tasks or error cases are not all stored yet, as "not measured yet" (its measured text and
    conditions read "n=0 points", "L = ," on no data); others as they are."""
    head = c["id"].split("/")[0]
    tasks = [t for t in missing["tasks"] if t.startswith(_task_prefixes(c["id"]))] if _task_prefixes(c["id"]) else []
    cases = missing["cases"] if head in ("error_range", "slope") else []
    if not tasks and not cases:
        return c
    what = ", ".join(x for x in (f"{len(tasks)} task(s)" * bool(tasks), f"{len(cases)} case(s)" * bool(cases)) if x)
    measured = f"{NOT_YET}: {what} to run (rerun the same command to finish)"
    return {**c, "status": "inconclusive", "holds": None, "pending": True, "measured": measured, "conditions": NOT_YET}


SECTIONS = {  # a finding's id prefix -> the report section (Heading anchor) holding its evidence
    "time": "cost",
    "memory": "cost",
    "speedup": "cost",
    "speedup_grows": "cost",
    "latency_variance": "latency",
    "fp16": "fp16",
    "error_range": "error",
    "slope": "error",
}


def conclusion(findings: list[dict], answer: str) -> list[dict]:
    """summary.json's conclusion: sentences ({"text", "section"}), each naming the section (a Heading anchor
    of the report) that holds its evidence: per section, how many claims hold / do not / are inconclusive."""
    by: dict[str, list[dict]] = {}
    for f in findings:
        by.setdefault(SECTIONS.get(f["id"].split("/")[0], "gpu"), []).append(f)
    names = {
        "cost": "Cost against length",
        "latency": "Latency variance",
        "fp16": "fp16 overflow",
        "error": "Error against length",
        "gpu": "Claims needing a CUDA GPU",
    }
    out = [{"text": answer, "section": "cost"}]
    for sec, fs in by.items():
        shown = [table_status(f) for f in fs]  # as the claims table shows them
        kinds = ("holds", "does not hold", "inconclusive", "structural", NOT_MEASURED, NOT_YET)
        counts = {st: shown.count(st) for st in kinds}
        parts = ", ".join(f"{n} {st}" for st, n in counts.items() if n)
        out.append({"text": f"{names[sec]}: of {len(fs)} claim{'s' * (len(fs) != 1)}, {parts}.", "section": sec})
    return out


def guide_sentences(part: dict) -> list[tuple[str, str]]:
    """A study report's conclusion sentences for its guide part (text, section anchor): the verdicts counted,
    and the answer to "is the deviation worth it?"."""
    fs = part["findings"]
    words = {"holds": "hold", "does not hold": "do not hold", "structural": "structural (fixed by the format)"}
    words |= {"inconclusive": "inconclusive", NOT_MEASURED: "not measured here (need a CUDA GPU)", NOT_YET: NOT_YET}
    shown = [table_status(f) for f in fs]
    parts = ", ".join(f"{n} {w}" for st, w in words.items() if (n := shown.count(st)))
    return [(f"The production guide's claims: of {len(fs)}, {parts}.", "guide"), (part["answer"], "cost")]


NOT_MEASURED = "not measured here"


def table_status(f: dict) -> str:
    """The verdict as the claims table shows (and the conclusion counts) it: a GPU claim not measured on this
    machine is not counted as inconclusive."""
    if f.get("pending"):
        return NOT_YET
    gpu = f["id"].startswith("gpu_") and "needs a GPU" in f["measured"]
    return NOT_MEASURED if gpu and f["status"] == "inconclusive" else f["status"]


def shown_status(f: dict) -> str:
    """The claims table's verdict cell: table_status, and for a band missed, which side ("does not hold: below
    the stated range: fp16 is more accurate than the guide says"), so a smaller error never reads as a failure;
    for an inconclusive one, why (busy_reason, else its rule's reason: "interval [0.9, 1.3] contains 1")."""
    st = table_status(f)
    if st == "inconclusive":  # why: a busy machine, or the rule's reason (too few values, an interval across it)
        why = busy_reason(f) or (f.get("verdict") or {}).get("reason", "")
        return f"{st}: {why}" if why else st
    return f"{st}: {f['side']}" if f.get("side") and st == "does not hold" else st


def busy_reason(f: dict) -> str:
    """For a timing verdict made inconclusive by a busy machine (guide_claims.unless_busy): "the machine was busy
    (4 of 4 timings at load average 4.32 on 2 core(s))", so the cell says why; else ""."""
    reason = (f.get("verdict") or {}).get("reason", "")
    # the task id before ": load average" may hold colons itself (cost/sdpa-math:bf16/fwd/L=1024)
    m = re.match(r"(\d+ of \d+) timings ran on a busy machine \(.*?: (load average [\d.]+ on \d+ core\(s\))", reason)
    return f"the machine was busy ({m.group(1)} timings ran under a {m.group(2)}; rerun when idle)" if m else ""


def _strict(obj):
    """The summary as strict JSON: NaN and infinities (an estimate over no values) become null."""
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _ok(r: dict, kind: str) -> bool:
    return r["status"] == "ok" and r["params"]["kind"] == kind


def claims_blocks(part: dict) -> list:
    """The claims table under its heading (anchor "guide"): claim, measured with its interval, verdict, conditions."""
    rows = [[c["claim"], c["measured"], shown_status(c), c["conditions"]] for c in part["findings"]]
    return [
        Heading("The production guide's claims", anchor="guide"),
        Table(["claim", "measured (95% interval)", "verdict", "conditions"], rows),
        Text(
            "Rules (reporting.verdicts): exponents are Theil-Sen slopes of log value vs log L over every repeat, "
            "judged against the nearest-integer band (2: [1.5, 2.5], 1: [0.5, 1.5]); ratios are geometric means of "
            "paired values with a t interval on logs; 'structural' is fixed by the number format, found by a search "
            "and pinned by a unit test. Timings are medians of repeated calls on a shared CPU."
        ),
    ]


def _yet(missing: list[str], prefix: str | tuple[str, ...]) -> list:
    """A line under a section whose tasks (ids starting with `prefix`) are not all stored yet."""
    n = sum(t.startswith(prefix) for t in missing)
    if not n:
        return []
    return [Text(f"{NOT_YET.capitalize()}: {n} task(s) of this section to run (rerun the same command to finish).")]


def _evidence(part: dict, results, s: GuideSettings, explains, rel: dict[str, Path], missing: list[str]) -> list:
    """The blocks after the claims table: the rules, skipped tasks, one section per question with its figure
    (and under each, how many of its tasks are not measured yet)."""
    out = []
    if part["skipped"]:
        out += [
            Heading("Skipped guide tasks"),
            Table(["task", "reason"], [[k["task"], k["reason"]] for k in part["skipped"]]),
        ]
    out += [
        Heading("Guide: cost against length", anchor="cost"),
        *_yet(missing, "cost/"),
        *_figure(rel, "cost", "time and memory vs L"),
    ]
    out.append(Table(["method", "pass", "L", "median time [s] (interval)", "peak memory [MiB]"], _cost_rows(results)))
    out += [
        Figure(rel[f"error_vs_time_{f}"], f"error vs time, {f}")
        for f in ("sdpa", "simulator")
        if f"error_vs_time_{f}" in rel
    ]
    out += [
        Heading("Guide: latency variance", anchor="latency"),
        *_yet(missing, "latency/"),
        Table(["method", "L", "CV over blocks (geometric mean)", "median", "calls"], gc.latency_rows(results, s)),
        Heading("Guide: fp16 overflow boundaries", anchor="fp16"),
        *_yet(missing, ("scale/", "sum/")),
        *_figure(rel, "boundary", "input scale x length, finite or not, per policy"),
        Table(["method", "L", "first non-finite sigma", "tried", "monotone"], _boundary_rows(results)),
        Table(["method", "first bad Lk (keys at the max)", "outcome", "Lk tried"], _sum_rows(results)),
        Heading("Guide: error against length and its reason", anchor="error"),
        *_yet(missing, "explain/"),
        *_figure(rel, "slope", "relative error vs L"),
        Table(["L", "stage", "alone (others FP64)", "raised to FP64 (others as policy)"], _explain_rows(explains)),
        Heading("Guide: not measured here", anchor="gpu"),
        Text(f"Claims needing a CUDA GPU; to measure them: {gc.GPU_COMMAND}"),
    ]
    return out


def _figure(rel: dict[str, Path], key: str, caption: str) -> list:
    """The figure, or where the figures were drawn but this one had nothing to draw, a line saying so."""
    if key in rel:
        return [Figure(rel[key], caption)]
    return [Text(f"No figure of {caption}: not measured yet.")] if rel.get(DRAWN) is not None else []


def _cost_rows(results: dict[str, dict]) -> list[list[str]]:
    rows = []
    for r in sorted(results.values(), key=lambda r: (r["id"].rsplit("=", 1)[0], r["params"].get("seq_len", 0))):
        if _ok(r, "cost"):
            p, res = r["params"], r["result"]
            med = median_interval(res["times"])
            rows.append(
                [
                    p["method"],
                    "fwd+bwd" if p["backward"] else "fwd",
                    str(p["seq_len"]),
                    med.text(".3g"),
                    f"{res['peak_bytes'] / 2**20:.3g}",
                ]
            )
    return rows


def _boundary_rows(results: dict[str, dict]) -> list[list[str]]:
    rows = []
    for r in sorted(results.values(), key=lambda r: r["id"]):
        if _ok(r, "scale"):
            res, p = r["result"], r["params"]
            i = res["boundary_i"]
            sig = "none up to 2^16" if i is None else f"2^{i / OCTAVE_STEPS:.4g} = {2 ** (i / OCTAVE_STEPS):.4g}"
            rows.append([p["method"], str(p["seq_len"]), sig, str(len(res["points"])), cell(res["monotone"])])
    return rows


def _sum_rows(results: dict[str, dict]) -> list[list[str]]:
    rows = []
    for r in sorted(results.values(), key=lambda r: r["id"]):
        if _ok(r, "sum") or _ok(r, "sum_points"):
            res = r["result"]
            n = res["boundary_keys"]
            tried = ", ".join(res["points"]) + (" (searched)" if res.get("searched", True) else " (fixed list)")
            outcome = "-" if res["outcome"] is None else str(res["outcome"])
            rows.append([r["params"]["method"], "none" if n is None else str(n), outcome, tried])
    return rows


def _explain_rows(explains: dict[int, dict]) -> list[list[str]]:
    return [
        [str(n), st, f"{a['alone'][st]:.3g}", f"{a['raised'][st]:.3g}"]
        for n, a in sorted(explains.items())
        for st in a["alone"]
    ]


DRAWN = "_drawn"  # a key of _evidence's figures: present where matplotlib drew them


def _figures(out: Path, records, results, s: GuideSettings, methods) -> dict[str, Path]:
    """The figures drawn; one with nothing to draw yet (a study still writing, issue fixa2-1) is left out."""
    figs = {}
    for key, ok in (
        ("cost", lambda p: _draw_cost(p, results, s)),
        ("boundary", lambda p: _draw_boundary(p, results, s)),
        ("slope", lambda p: _draw_slope(p, records, methods)),
    ):
        if ok(out / f"{key}.png"):
            figs[key] = out / f"{key}.png"
    for fam, members in (("sdpa", ("sdpa-math:bf16", "sdpa-flash:bf16")), ("simulator", ("flash:bf16-mixed",))):
        path = out / f"error_vs_time_{fam}.png"
        if _draw_error_vs_time(path, records, results, [m for m in members if m in s.cost_methods]):
            figs[f"error_vs_time_{fam}"] = path
    return figs


def _positive(xs, ys) -> bool:
    """Whether a series has a point a log-log axis can draw (matplotlib refuses an axis of values <= 0)."""
    return any(x > 0 and y > 0 for x, y in zip(xs, ys, strict=True))


def _draw_cost(path: Path, results, s: GuideSettings) -> bool:
    series = {
        (m, bwd, what): gc.cost_series(results, m, bwd, what)
        for m in s.cost_methods
        for bwd in (False, True)
        for what in ("time", "memory")
    }
    if not all(any(_positive(*v) for k, v in series.items() if k[2] == w) for w in ("time", "memory")):
        return False
    with figure(path, ncols=2) as (_, (ax_t, ax_m)):
        style = Styler()
        for (m, bwd, what), (xs, ys) in series.items():
            if _positive(xs, ys):
                ax = ax_t if what == "time" else ax_m
                ls = sorted(set(xs))
                med = [median_interval([y for x, y in zip(xs, ys, strict=True) if x == n]).value for n in ls]
                ax.plot(ls, med, linestyle="--" if bwd else "-", **style(f"{m} {'fwd+bwd' if bwd else 'fwd'}"))
        for ax, what, unit in ((ax_t, "median time", "s"), (ax_m, "peak tensor memory", "bytes")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")  # figure() labels a span under three decades at 1, 2, 5 x 10^k only
            label_axes(ax, x="sequence length", y=what, x_unit="tokens", y_unit=unit)
            legend_below(ax, ncol=1, fontsize=6)  # inside, measured times moved it over the data (CI, 2026-12-07)
    return True


BOUNDARY_STYLE = {  # (finite?, the fp16 method or its bf16 twin): colour, marker, filled
    (True, False): ("#2ca02c", "o", True),
    (False, False): ("#d62728", "X", True),
    (True, True): ("#2ca02c", "s", False),
    (False, True): ("#d62728", "D", False),
}


def _draw_boundary(path: Path, results, s: GuideSettings) -> bool:
    """Per fp16 method: each input scale tried at each length, finite (green) or not (red), the fp16 method
    filled and its bf16 twin hollow beside it, with a legend for the four kinds of marker. False (nothing
    drawn) before any search is stored."""
    n = len(s.boundary_methods)
    if not n or not any(_ok(r, "scale") and r["result"]["points"] for r in results.values()):
        return False
    with figure(path, ncols=n, size=(3.6, 3.4)) as (_, axes):
        axes = axes if n > 1 else [axes]
        for ax, m in zip(axes, s.boundary_methods, strict=True):
            for name, shift, is_twin in ((m, 0.93, False), (twin(m), 1.07, True)):
                pts: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
                for r in results.values():
                    if _ok(r, "scale") and r["params"]["method"] == name:
                        for i, fin in r["result"]["points"].items():
                            pts[bool(fin)].append((r["params"]["seq_len"] * shift, 2 ** (int(i) / OCTAVE_STEPS)))
                for fin, xy in pts.items():
                    if not xy:
                        continue
                    colour, marker, filled = BOUNDARY_STYLE[(fin, is_twin)]
                    ax.scatter(
                        [x for x, _ in xy],
                        [y for _, y in xy],
                        s=18,
                        marker=marker,
                        edgecolors=colour,
                        facecolors=colour if filled else "none",
                        label=f"{name.split(':')[1]}: {'finite' if fin else 'Inf/NaN'}",
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_title(f"{m} (filled) beside {twin(m).split(':')[1]} (hollow)", fontsize=8)
            label_axes(ax, x="L", y="input scale sigma", x_unit="tokens")
            if ax.collections:
                legend_below(ax, ncol=1, fontsize=6)  # inside, it hid the points at the smallest sigma
    return True


def _draw_slope(path: Path, records, methods) -> bool:
    series = {m: gc.error_series(records, m) for m in methods}
    series = {m: v for m, v in series.items() if _positive(*v)}
    if not series:
        return False
    with figure(path) as (_, ax):
        style = Styler()
        for m, (xs, ys) in series.items():
            ls = sorted(set(xs))
            ax.plot(ls, [gc.log_mean([y for x, y in zip(xs, ys, strict=True) if x == n]).value for n in ls], **style(m))
        ax.axhspan(1e-3, 1e-2, color="#dddddd", alpha=0.5)  # no legend entry: a band, not a measured series
        ax.set_title("grey band: the guide's 1e-3 .. 1e-2", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label_axes(ax, x="sequence length", y="relative L2 error vs FP64", x_unit="tokens")
        ax.legend(fontsize=7)
    return True


def _draw_error_vs_time(path: Path, records, results, members: list[str]) -> bool:
    """Error (geometric mean over seeds) against median forward time at each length both were measured."""
    pts = {}
    for m in members:
        xs, ys = gc.error_series(records, m)
        tx, ty = gc.cost_series(results, m, False, "time")
        for n in sorted(set(xs) & set(tx)):
            t = median_interval([y for x, y in zip(tx, ty, strict=True) if x == n]).value
            e = gc.log_mean([y for x, y in zip(xs, ys, strict=True) if x == n]).value
            pts.setdefault(m, []).append((t, e, n))
    if not pts:
        return False
    with figure(path) as (_, ax):
        style = Styler()
        for m, p in pts.items():
            ax.plot([t for t, _, _ in p], [e for _, e, _ in p], **style(m))
            for t, e, n in p:
                ax.annotate(f"L={n}", (t, e), fontsize=6)
        log10_axis(ax, "x")  # a span under a decade labelled every minor tick, piled up (issue 34)
        log10_axis(ax, "y")
        label_axes(ax, x="median forward time", y="relative L2 error vs FP64", x_unit="s")
        legend_below(ax, ncol=1)  # its points move with the measured times: inside, the legend can land on them
    return True
