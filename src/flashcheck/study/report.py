"""The study report, built from stored records only: the answer, verdicts, conclusion, figures, report.md/html and
summary.json, assembled from the registered question sets (study.registry: each set's verdicts and report part,
in the sets' order); the engine draws each question's figure and table where no set draws its own."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from flashcheck.core.fileio import folder_problem
from flashcheck.core.printable import printable
from flashcheck.reporting import Bullets, Figure, Heading, Page, Table, Text, write_report
from flashcheck.reporting.page import Sentences
from flashcheck.study import registry
from flashcheck.study.cases import Case, CaseRecord, expand, expand_sweep
from flashcheck.study.config import StudyConfig
from flashcheck.study.figures import METRIC, draw_figures
from flashcheck.study.part import NOT_YET, Part, Study, partial_line
from flashcheck.study.points import Point, ratio_text, sweep_points
from flashcheck.study.recordcheck import study_needs
from flashcheck.study.store import ResultStore, read_jsonl, read_study_json

__all__ = ["Point", "build_report", "case_label", "draw_figures", "sweep_points"]
MAX_LISTED = 100  # failed cases listed in summary.json and the reports (all are in records.jsonl)


# --- documents ------------------------------------------------------------------------------------


def _mean_text(p: Point) -> str:
    e = p.estimate()
    return f"{e.value:.3e}" if e.n < 2 else f"{e.value:.3e} [{e.low:.2e}, {e.high:.2e}]"


def _row(p: Point, question: str) -> list[str]:
    published = registry.published(question)  # a paper's value per method (QuestionSet.published)
    paper = f"{published[p.method]:.1e}" if p.method in published else ""
    ratio = "" if p.baseline is None else f"{ratio_text(p.ratio_estimate())} ÷ {p.baseline}"
    own = "" if p.baseline is None else ratio_text(p.own_ratio_estimate())
    return [p.method, str(p.seq_len), str(p.head_dim), p.label, str(p.n), _mean_text(p), ratio, own, paper]


def _tables(config: StudyConfig, records: dict[str, CaseRecord]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(question, header, rows): each point's mean and 95% interval over seeds, and its ratios in both views
    (columns empty in every row left out: e.g. a question whose methods are paired in its verdicts, not per point)."""
    out = []
    for sw in config.sweeps:
        points = sorted(
            sweep_points(sw, records), key=lambda p: (p.method, p.head_dim, p.seq_len, p.block, p.distribution)
        )
        header = [
            "method",
            "inputs",
            "L",
            "D",
            "tiles",
            "n",
            f"{METRIC[sw.metric]} vs FP64 of the original inputs, geometric mean [95%]",
            "ratio to baseline (paper's view) [95%]",
            "ratio on rel-L2 vs FP64 of the rounded inputs (kernel's own) [95%]",
            "paper",
        ]
        several = len({p.distribution for p in points}) > 1  # the inputs column only where they differ
        rows = [_row(p, sw.question) for p in points]
        rows = [[r[0], p.distribution if several else "", *r[1:]] for p, r in zip(points, rows, strict=True)]
        keep = [i for i in range(len(header)) if (i < 6 and i != 1) or any(r[i] for r in rows)]  # none empty
        out.append((sw.question, [header[i] for i in keep], [[r[i] for i in keep] for r in rows]))
    return out


def _load_config(folder: Path) -> StudyConfig:
    if why := folder_problem(folder):
        raise ValueError(f"{str(folder)!r} {why}; give the --out folder of `flashcheck study`")
    data = read_study_json(folder)
    if data is None:
        raise ValueError(f"{str(folder)!r} holds no study (no study.json); run `flashcheck study --out` first")
    return StudyConfig.from_dict(data, str(folder / "study.json"))


def _of_this_study(records: dict[str, CaseRecord], config: StudyConfig, folder: Path) -> dict[str, CaseRecord]:
    """The records of cases in the study's configuration (study.json); others (a line added by hand: the study
    never writes one) are left out of the report with a warning naming how many and one of them."""
    known = {c.case_id for c in expand(config)}
    extra = [r for k, r in records.items() if k not in known]
    if extra:
        warnings.warn(
            f"{folder / 'records.jsonl'}: {len(extra)} record(s) of cases this study does not have (study.json), "
            f"e.g. {case_label(extra[0].case)}: left out of the report",
            stacklevel=2,
        )
    return {k: r for k, r in records.items() if k in known}


def case_label(c: Case) -> str:
    """One line naming a case: method, sizes, tiles, inputs, seed."""
    tiles = f" tiles {c.block_q}x{c.block_k}" if c.block_q else ""
    return printable(f"{c.method} L={c.seq_len} D={c.head_dim}{tiles} {c.distribution} seed {c.seed}")


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _problems(records: dict[str, CaseRecord]) -> tuple[list[dict], list[dict]]:
    """Failed cases one by one, and skipped cases grouped by method and reason."""
    failures = [
        {"case_id": r.case_id, "method": r.case.method, "case": case_label(r.case), "error": (r.error or "")[:500]}
        for r in records.values()
        if r.status == "failed"
    ]
    groups: dict[tuple[str, str], int] = {}
    for r in records.values():
        if r.status == "skipped":
            key = (r.case.method, _first_line(r.error))
            groups[key] = groups.get(key, 0) + 1
    skipped = [{"method": m, "reason": why, "cases": n} for (m, why), n in groups.items()]
    return failures, skipped


def build_report(folder: str | Path) -> dict:
    """Rebuild figures, report.md, report.html and summary.json in `folder` from its stored records.
    Computes nothing and never changes the store (records.jsonl, runs.jsonl, study.json)."""
    if not str(folder).strip():
        raise ValueError(f"folder {str(folder)!r} is empty; give a study folder (the --out of `flashcheck study`)")
    folder = Path(folder)
    config = _load_config(folder)
    records = _of_this_study(ResultStore(folder, study_needs(config)).load(), config, folder)
    yet = _not_stored(config, records)
    ok = {k: r for k, r in records.items() if r.status == "ok"}
    failures, skipped = _problems(records)
    pts = {sw.question: sweep_points(sw, ok) for sw in config.sweeps}
    study = Study(folder=folder, config=config, records=records, ok=ok, points=pts)
    sets = registry.sets()
    judges = [s for s in sets if config.name in s.solo and s.findings] or sets  # a solo preset: its verdicts alone
    found = [f for s in judges if s.findings is not None for f in s.findings(study)]
    if yet:  # a verdict on no values while cases are missing is not inconclusive: it is not measured yet
        found = [_not_yet(f) for f in found]
    study = dataclasses.replace(study, found=found)
    parts, lead = report_parts(study)
    n_skipped = sum(s["cases"] for s in skipped)
    own = {q: f for p in parts for q, f in p.figures.items()}
    figures = draw_figures(config, ok, folder / "figures", skip=frozenset(own)) | own
    headline = next((p.headline for p in parts if p.headline is not None), None)
    if headline is not None:
        figures = {"headline": headline[0]} | figures
    env = next(iter(records.values())).env if records else {}
    failures += [f for p in parts for f in p.failures]  # a set's failed tasks (tried again on the next run)
    stored = {"cases": (len(records), len(expand(config)))} | {w: n for p in parts for w, n in p.stored.items()}
    partial = partial_line(stored)
    summary = {
        "study": config.name,
        "complete": partial is None,
        "partial": partial,  # the report's and the command's first line while the study is unfinished
        "stored": {what: list(n) for what, n in stored.items()},
        "answer": _answer(parts, lead),
        "conclusion": [{"text": t, "section": a} for t, a in _conclusion(parts, lead, len(failures), n_skipped)],
        "findings": found,
        "cases": len(records),
        "failed": len(failures),
        "skipped": skipped,
        "failures": failures[:MAX_LISTED],
        "runs": [run for _, run in read_jsonl(folder / "runs.jsonl", "runs")],
        "environment": env,
        "figures": {q: str(p.relative_to(folder)) for q, p in figures.items()},
    }
    for p in parts:
        summary |= p.summary
    replaced = {t[0] for p in parts for t in p.tables}
    tables = [t for t in _tables(config, ok) if t[0] not in replaced] + [t for p in parts for t in p.tables]
    inside = {q: p.relative_to(folder) for q, p in figures.items()}  # the page resolves them in `folder`
    caption = headline[1] if headline is not None else ""
    write_report(folder, _page(summary, tables, inside, parts, caption, yet), summary)
    return summary


def _not_stored(config: StudyConfig, records: dict[str, CaseRecord]) -> dict[str, int]:
    """Per question, how many of its sweep's cases have no stored record yet (a study stopped early or still
    running); the questions with all of them stored are left out."""
    out: dict[str, int] = {}
    for sw in config.sweeps:
        n = sum(1 for c in expand_sweep(sw) if c.case_id not in records)
        if n:
            out[sw.question] = out.get(sw.question, 0) + n
    return out


def _not_yet(f: dict) -> dict:
    """A finding judged on no values (n=0, "nan (n=0, no interval)") while the study is unfinished: "not
    measured yet"; others as they are (they rest on the cases stored so far; the report's first line says so)."""
    if f.get("status") != "inconclusive" or f.get("n"):
        return f
    return {**f, "status": NOT_YET, "holds": None, "measured": f"{NOT_YET} (its cases are still to run)",
            "reason": f"{NOT_YET}: no value stored"}  # fmt: skip


def report_parts(study: Study) -> tuple[list[Part], Part | None]:
    """Every registered set's part of the report, in order, and the one that leads the Answer (the first
    that answers), if any."""
    parts = [s.report(study) for s in registry.sets() if s.report is not None]
    return parts, next((p for p in parts if p.answer), None)


def _answer(parts: list[Part], lead: Part | None) -> list[str]:
    """The leading set's answer, then every other set's brief line; with no leader, the first fallback."""
    if lead is None:
        return next((p.fallback for p in parts if p.fallback), [])
    return lead.answer + [line for p in parts if p is not lead for line in p.brief]


def _conclusion(parts: list[Part], lead: Part | None, failed: int, skipped: int) -> list[tuple[str, str]]:
    """The sets' sentences (the leading set's first), the failed and skipped cases, or one line saying the
    study measured none of the questions."""
    ordered = ([lead] if lead is not None else []) + [p for p in parts if p is not lead]
    out = [s for p in ordered for s in p.sentences]
    if failed or skipped:
        out.append(
            (f"{failed} case(s) failed and {skipped} were skipped; they are listed with their reasons.", "problems")
        )
    if not out:
        out.append(("This study measured none of the questions the conclusion answers.", "verdicts"))
    return out


def _problem_rows(summary: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for the failed and the skipped cases, when there are any."""
    out = []
    if summary["failures"]:
        more = summary["failed"] - len(summary["failures"])
        title = f"Failed cases ({summary['failed']}{f', the first {MAX_LISTED} listed' if more > 0 else ''})"
        rows = [[f["case"], _first_line(f["error"])] for f in summary["failures"]]
        out.append((title, ["case", "error (the traceback is in records.jsonl)"], rows))
    if summary["skipped"]:
        rows = [[s["method"], str(s["cases"]), s["reason"]] for s in summary["skipped"]]
        out.append(("Skipped cases", ["method", "cases", "reason"], rows))
    return out


def measured_first(found: list[dict]) -> list[dict]:
    """The findings with the measured ones first (in their order), then those not measured."""
    return sorted(found, key=lambda f: f.get("status", "not measured") == "not measured")


def not_asked(found: list[dict]) -> list[str]:
    """The claims of the findings this study did not measure (its preset does not ask them), in their order."""
    return [f["claim"] for f in found if f.get("status", "not measured") == "not measured"]


def verdict_rows(found: list[dict], cells: dict[str, str] | None = None) -> tuple[list[str], list[list[str]]]:
    """The measured verdicts as a table: claim, ours (measured, with its 95% interval), the paper's value (a
    set's cell for that verdict where it has one: QuestionSet.cells), verdict; those not measured are left to
    one line (not_asked)."""
    cells = registry.cells() if cells is None else cells
    header = ["claim", "ours (95% interval)", "paper", "verdict"]
    rows = []
    for f in found:
        if f.get("status", "not measured") == "not measured":
            continue
        paper = cells.get(f["id"]) or f.get("paper") or "-"
        rows.append([f["claim"], f["measured"], paper, f.get("status", "not measured")])
    return header, rows


def _verdict_items(summary: dict) -> list[tuple[str, str, str]]:
    items = []
    for f in measured_first(summary["findings"]):
        if f.get("status", "not measured") == "not measured":
            continue  # one line at the end of the report (not_asked)
        paper = f" Paper: {f['paper']}." if f.get("paper") else ""
        rule = f" Rule: {f['rule']}; {f['reason']}." if f.get("rule") else ""
        items.append((f["id"], f.get("status", f["holds"]), f"{f['claim']}. Measured: {f['measured']}.{rule}{paper}"))
    return items


def _page(
    summary: dict, tables, figures: dict[str, Path], parts: list[Part], caption: str, yet: dict[str, int]
) -> Page:
    """The study report as a reporting.Page: the answer in plain sentences, the headline figure and the
    verdicts as a table first (then the sets' top blocks); the conclusion sentence by sentence, each verdict's
    rule (then the sets' middle blocks), skipped/failed cases, one section per question, the sets' end blocks."""
    page = Page(f"flashcheck study {summary['study']}: is Flash Attention stable?", banner=summary["partial"])
    page.add(Heading("Answer", anchor="answer"), *(Text(t) for t in summary["answer"]))
    if "headline" in figures:
        page.add(Figure(figures["headline"], caption))
    page.add(Heading("Verdicts", anchor="verdicts"), Table(*verdict_rows(summary["findings"])))
    page.add(*(b for p in parts for b in p.top))
    page.add(
        Heading("Conclusion", anchor="conclusion"),
        Sentences([(c["text"], c["section"]) for c in summary["conclusion"]]),
        Heading("Verdicts: rules and reasons", anchor="rules"),
        Bullets(_verdict_items(summary)),
    )
    page.add(
        Text(
            f"{summary['cases']} cases, {summary['failed']} failed. Two views of error: the paper's (the metric "
            "against FP64 of the original inputs, which includes rounding the inputs and the output) and the "
            "kernel's own (relative L2 against FP64 of the inputs as the method rounded them: the algorithm alone). "
            "Ratios divide by the method's baseline by the one rule (standard attention under the same policy for "
            "a simulator, eager PyTorch in the same dtype for a real backend) on the same inputs: geometric mean "
            "over the paired values with a 95% t interval on the log ratios; n is the number of paired values (seeds, "
            "times the lengths, head dims or tiles a row pools over, as the row says)."
        )
    )
    page.add(*(b for p in parts for b in p.middle))
    if not figures:
        page.add(Text("No figures: matplotlib is not installed (pip install 'flashcheck[plots]')."))
    problems = _problem_rows(summary)
    for n, (title, header, rows) in enumerate(problems):  # the conclusion links to the first
        page.add(Heading(title, anchor="" if n else "problems"), Table(header, rows))
    if not problems:
        done, planned = summary["stored"]["cases"]
        missing = planned - done
        none = f"None so far; {missing} case(s) {NOT_YET} (rerun the same command to finish)." if missing else "None."
        page.add(Heading("Skipped and failed cases", anchor="problems"), Text(none))
    notes, titles = registry.notes(), registry.titles()
    for question, header, rows in tables:
        page.add(Heading(titles.get(question, question), anchor=question))
        if question in yet:
            page.add(Text(f"{NOT_YET.capitalize()}: {yet[question]} case(s) of this question (rerun the same "
                          "command to finish); the rows below are those stored so far."))  # fmt: skip
        if question in notes:
            page.add(Text(notes[question]))
        if question in figures:
            page.add(Figure(figures[question], question))
        page.add(Table(header, rows))
    page.add(*(b for p in parts for b in p.end))
    missing = not_asked(summary["findings"])
    if missing:
        page.add(Heading("Not asked by this preset", anchor="not-asked"))
        page.add(Text(f"Not asked by this preset (not measured in this study): {'; '.join(missing)}."))
    env = summary.get("environment", {})
    return page.add(Heading("Environment"), Text(", ".join(f"{k} {v}" for k, v in env.items())))
