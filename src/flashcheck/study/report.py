"""The study report, built from stored records only: conclusion, verdicts, figures, report.md/html,
summary.json. The statistics are in study.findings, the sentences in study.conclusion, the figures in
study.figures."""

from __future__ import annotations

import warnings
from pathlib import Path

from flashcheck.reporting import Bullets, Figure, Heading, Page, Table, Text, write_report
from flashcheck.reporting.page import Sentences
from flashcheck.study.answer import answer, draw_headline, measured_first, not_asked, verdict_rows
from flashcheck.study.cases import Case, CaseRecord, expand
from flashcheck.study.conclusion import conclusion
from flashcheck.study.config import FA3_PAPER_RMSE, StudyConfig
from flashcheck.study.figures import METRIC, draw_figures
from flashcheck.study.findings import findings, ratio_text
from flashcheck.study.findings_dims import merge_findings
from flashcheck.study.guide_report import guide_part, guide_sentences
from flashcheck.study.modern import NOTES as MODERN_NOTES
from flashcheck.study.modern import THEIRS_VS_OURS, modern_findings, modern_sentences, sage_published_rows
from flashcheck.study.modern_answer import modern_answer
from flashcheck.study.points import Point, sweep_points
from flashcheck.study.store import ResultStore, read_jsonl, read_study_json
from flashcheck.study.tables_dims import NOTES as DIMS_NOTES
from flashcheck.study.tables_dims import dims_sections
from flashcheck.study.titles import title as question_title

__all__ = ["Point", "build_report", "case_label", "draw_figures", "findings", "sweep_points"]
MAX_LISTED = 100  # failed cases listed in summary.json and the reports (all are in records.jsonl)


# --- documents ------------------------------------------------------------------------------------


def _mean_text(p: Point) -> str:
    e = p.estimate()
    return f"{e.value:.3e}" if e.n < 2 else f"{e.value:.3e} [{e.low:.2e}, {e.high:.2e}]"


def _row(p: Point, question: str) -> list[str]:
    paper = f"{FA3_PAPER_RMSE[p.method]:.1e}" if question == "fa3" and p.method in FA3_PAPER_RMSE else ""
    ratio = "" if p.baseline is None else f"{ratio_text(p.ratio_estimate())} ÷ {p.baseline}"
    own = "" if p.baseline is None else ratio_text(p.own_ratio_estimate())
    return [p.method, str(p.seq_len), str(p.head_dim), p.label, str(p.n), _mean_text(p), ratio, own, paper]


def _tables(config: StudyConfig, records: dict[str, CaseRecord]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(question, header, rows): each point's mean and 95% interval over seeds, and its ratios in both views
    (columns empty in every row left out: fa3's methods are paired in its verdicts, not per point)."""
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
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder; give the --out folder of `flashcheck study`")
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
    return f"{c.method} L={c.seq_len} D={c.head_dim}{tiles} {c.distribution} seed {c.seed}"


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
    records = _of_this_study(ResultStore(folder).load(), config, folder)
    ok = {k: r for k, r in records.items() if r.status == "ok"}
    failures, skipped = _problems(records)
    pts = {sw.question: sweep_points(sw, ok) for sw in config.sweeps}
    found = merge_findings(config, ok, findings(config, ok))  # causal, GQA, ..., error model (findings_dims)
    found += modern_findings(pts, ok)  # FA4, FP8/FP4, SageAttention, P-cast with a sink (study.modern)
    n_skipped = sum(s["cases"] for s in skipped)
    dims_tables, dims_figures, dims_extra = dims_sections(config, ok, folder)
    figures = draw_figures(config, ok, folder / "figures", skip=frozenset(dims_figures)) | dims_figures
    env = next(iter(records.values())).env if records else {}
    guide, guide_blocks = _guide(folder, config, records)
    failures += guide.get("failures", [])  # the guide's failed tasks (tried again on the next run)
    said = conclusion(found, pts, (len(failures), n_skipped), guide_sentences(guide) if guide else [])
    headline = draw_headline(pts.get("seq_len", []), folder / "figures" / "headline.png")
    if headline is not None:
        figures = {"headline": headline} | figures
    first = modern_sentences(found)  # the modern questions open the conclusion of a modern study
    if first and pts.get("seq_len"):  # a study of the classic questions too (quick, full): those first
        said = said + first
    elif first:
        said = first + [s for s in said if s[1] != "verdicts"]  # drop "measured none of the questions"
    summary = {
        "study": config.name,
        "answer": _answer(found, pts, config),
        "conclusion": [{"text": t, "section": a} for t, a in said],
        "findings": found,
        "cases": len(records),
        "failed": len(failures),
        "skipped": skipped,
        "failures": failures[:MAX_LISTED],
        "runs": [run for _, run in read_jsonl(folder / "runs.jsonl", "runs")],
        "environment": env,
        "figures": {q: str(p.relative_to(folder)) for q, p in figures.items()},
    }
    summary |= dims_extra | ({"guide": guide} if guide else {})
    header, rows = sage_published_rows(ok)  # SageAttention's published accuracy beside ours (modern studies only)
    if rows:
        summary["published"] = [dict(zip(header, r, strict=True)) for r in rows]
    tables = [t for t in _tables(config, ok) if t[0] not in {d[0] for d in dims_tables}] + dims_tables
    inside = {q: p.relative_to(folder) for q, p in figures.items()}  # the page resolves them in `folder`
    write_report(folder, _page(summary, tables, inside, guide_blocks), summary)
    return summary


def _answer(found: list[dict], pts: dict[str, list[Point]], config: StudyConfig | None) -> list[str]:
    """The seq_len answer ("is Flash Attention stable?" for real kernels and the paper's policy) first, then one
    line over the modern kernels when the study measured them too (quick, full); a study of the modern questions
    alone opens with their whole answer (not with a sentence saying the seq_len question was not measured)."""
    rest = answer(found, pts.get("seq_len", []), config)
    if not pts.get("seq_len"):
        return modern_answer(found) or rest
    return rest + modern_answer(found, brief=True)  # one line: the modern rows and the conclusion have the rest


def _guide(folder: Path, config: StudyConfig, records: dict[str, CaseRecord]) -> tuple[dict, list]:
    """The production guide's part (study.guide_report) when the study has one: its summary and page blocks."""
    if config.guide is None:
        return {}, []
    return guide_part(folder, config, list(records.values()), config.guide)


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


NOTES = {
    "seq_len": "The ratio's growth with L can come from Flash's error growing or from the Baseline's own error "
    "falling (outputs shrink as L grows): the left panel shows both, and grows_with_seq_len gives both slopes.",
    "block_area": "In an exact tiled emulation only the key-block size Bc changes a row's arithmetic; Br is "
    "structural (br_no_effect). The block-area effect is therefore an effect of Bc.",
    "swapped": "Swapping Br x Bc changes Bc: the comparison is between two key-block sizes (Br has no effect).",
    "square": "At equal area the tiles differ in Bc; a square tile sits where its Bc puts it.",
    "backends": "Metric rel-L2. A real backend's baseline is eager PyTorch in the same dtype; the simulator's "
    "is standard attention under the same policy.",
    "fa3": "Metric RMSE with outlier inputs; the comparisons are the verdicts fa3_fp16 and fa3_fp8.",
    "guide_errors": "The production guide's error range and slope (no baseline: its claims judge each method's "
    "relative L2 error against FP64 directly; see the production guide's claims).",
}


NOTES |= DIMS_NOTES  # the attention-variant questions and the error model (study.tables_dims)
NOTES |= MODERN_NOTES


def _verdict_items(summary: dict) -> list[tuple[str, str, str]]:
    items = []
    for f in measured_first(summary["findings"]):
        if f.get("status", "not measured") == "not measured":
            continue  # one line at the end of the report (not_asked)
        paper = f" Paper: {f['paper']}." if f.get("paper") else ""
        rule = f" Rule: {f['rule']}; {f['reason']}." if f.get("rule") else ""
        items.append((f["id"], f.get("status", f["holds"]), f"{f['claim']}. Measured: {f['measured']}.{rule}{paper}"))
    return items


def _page(summary: dict, tables, figures: dict[str, Path], guide: list) -> Page:
    """The study report as a reporting.Page: the answer in plain sentences, the headline figure and the
    verdicts as a table first; then the conclusion sentence by sentence, each verdict's rule, the guide's
    claims (when measured), skipped/failed cases, one section per question, the guide's evidence."""
    page = Page(f"flashcheck study {summary['study']}: is Flash Attention stable?")
    page.add(Heading("Answer", anchor="answer"), *(Text(t) for t in summary["answer"]))
    if "headline" in figures:
        page.add(Figure(figures["headline"], "Flash / standard attention against the length, both policies"))
    page.add(Heading("Verdicts", anchor="verdicts"), Table(*verdict_rows(summary["findings"])))
    if summary.get("published"):
        header = list(summary["published"][0])
        rows = [[r[h] for h in header] for r in summary["published"]]
        page.add(Heading("SageAttention beside the published accuracy", anchor="published"), Table(header, rows))
        page.add(Text(THEIRS_VS_OURS))
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
    page.add(*guide[:3])  # the guide's claims table and its rules (study.guide_report.claims_blocks)
    if not figures:
        page.add(Text("No figures: matplotlib is not installed (pip install 'flashcheck[plots]')."))
    problems = _problem_rows(summary)
    for n, (title, header, rows) in enumerate(problems):  # the conclusion links to the first
        page.add(Heading(title, anchor="" if n else "problems"), Table(header, rows))
    if not problems:
        page.add(Heading("Skipped and failed cases", anchor="problems"), Text("None."))
    for question, header, rows in tables:
        page.add(Heading(question_title(question), anchor=question))
        if question in NOTES:
            page.add(Text(NOTES[question]))
        if question in figures:
            page.add(Figure(figures[question], question_title(question)))
        page.add(Table(header, rows))
    page.add(*guide[3:])
    missing = not_asked(summary["findings"])
    if missing:
        page.add(Heading("Not asked by this preset", anchor="not-asked"))
        page.add(Text(f"Not asked by this preset (not measured in this study): {'; '.join(missing)}."))
    env = summary.get("environment", {})
    return page.add(Heading("Environment"), Text(", ".join(f"{k} {v}" for k, v in env.items())))
