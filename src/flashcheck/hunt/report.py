"""A hunt's summary.json, report.md and report.html: the findings (minimal case, where, reproducer, when found)
and the semantics table beside flashcheck's convention; each finding also as its own JSON record."""

from __future__ import annotations

import json
import math
from pathlib import Path

from flashcheck.core.fileio import make_folder, safe_child, write_atomic
from flashcheck.hunt.semantics import CONVENTION, Probe
from flashcheck.hunt.store import Finding, HuntState
from flashcheck.hunt.target import Target
from flashcheck.reporting.page import Bullets, Heading, Page, Table, Text, write_report

KIND_WORDS = {
    "nan": "NaN where the FP64 reference is finite",
    "inf": "Inf where the FP64 reference is finite",
    "overflow": "non-finite, as the same-precision baseline is too",
    "budget": "error over the budget of the same-precision baseline",
    "semantics": "differs from the convention (zeros) only on rows with no visible key",
    "crash": "the target's process died (the signal; the line of its stderr that says why), or hung: no answer "
    "within --case-timeout, and was killed",
}


def summary(target: Target, state: HuntState, table: list[Probe], budget_s: float, rule: str) -> dict:
    """The machine-readable result (summary.json)."""
    disagree = [p for p in table if p.agrees is False]
    return {
        "target": target.name,
        "kind": target.kind,
        "device": target.device,
        "dtypes": list(target.dtypes),
        "rule": rule,
        "budget_s": budget_s,
        "elapsed_s": round(state.elapsed_s, 2),
        "examples": state.examples,
        "refusals": state.refusals,
        "refusal_examples": state.refusal_examples,
        "crashes": state.crashes,
        "rounds": state.rounds,
        "findings": [f.to_dict(target) for f in state.findings],
        "semantics": [p.to_dict() for p in table],
        "semantics_disagreements": [p.name for p in disagree],
        "passed": not state.findings and not disagree,
    }


def headline(s: dict) -> str:
    """One line: how many findings and disagreements in how many cases and seconds."""
    n, d = len(s["findings"]), len(s["semantics_disagreements"])
    what = f"{n} finding{'s' * (n != 1)}" + (f", {d} semantics disagreement{'s' * (d != 1)}" if d else "")
    return f"hunt {s['target']}: {what} in {s['examples']} cases, {s['elapsed_s']:.0f} s ({s['rule']} rule)"


def semantics_rows(table: list[Probe]) -> list[list[str]]:
    word = {True: "agrees", False: "DISAGREES", None: "not measured"}
    return [[p.name, p.returned, CONVENTION, word[p.agrees]] for p in table]


def ratio_text(kind: str, margin: float | None) -> str:
    """'3.2x' (error / bound) for a budget finding; '' for the others (NaN, Inf: no finite ratio)."""
    return f"{margin:.3g}x" if kind == "budget" and margin and math.isfinite(margin) else ""


def finding_rows(findings: list[Finding]) -> list[list[str]]:
    return [
        [
            f.kind,
            f.where,
            ratio_text(f.kind, f.margin),
            f.case.describe(),
            f"{f.found_after_s:.1f}",
            f"{f.shrunk_after_s:.1f}",
        ]
        for f in findings
    ]


def crash_text(f: dict) -> str:
    """'died of SIGABRT on Lk=64 ...; stderr: F... Check failed: ...' for a crash finding (a dict of to_dict)."""
    if f["tensor"] == "hang":  # hunt.isolate.HANG: killed after --case-timeout
        return f"hung on {f['describe']}: {f['message']}"
    return f"died of {f['tensor']} on {f['describe']}; stderr: {f['message']}"


FINDING_HEADER = ["kind", "where", "error / bound", "minimal case", "found (s)", "shrunk (s)"]
SEMANTICS_HEADER = ["probe", "returned", "convention", "verdict"]


def write(out: Path, target: Target, state: HuntState, table: list[Probe], budget_s: float, rule: str) -> dict:
    """Write summary.json, report.md, report.html and findings/NN-KIND-TENSOR.json; returns the summary."""
    s = summary(target, state, table, budget_s, rule)
    folder = make_folder(out / "findings", "findings in --out")
    for i, f in enumerate(state.findings, 1):
        name = safe_child(folder, f"{i:02d}-{f.kind}-{f.tensor}.json", "a finding's file name")  # stored text
        write_atomic(name, json.dumps(f.to_dict(target), indent=1) + "\n")
    page = Page(f"flashcheck hunt: {target.name}")
    page.add(Text(headline(s) + "."))
    notes = [f"dtypes {', '.join(target.dtypes)} on {target.device}", *target.notes]
    if state.crashes:
        notes.append(f"{state.crashes} cases killed the target's process (each a fresh worker after it)")
    if state.refusals:
        notes.append(f"{state.refusals} cases refused by the target (not judged), e.g. {state.refusal_examples[0]}")
    page.add(Bullets([("", None, n) for n in notes], with_verdict=False))
    page.add(Heading("Findings"))
    if state.findings:
        page.add(Table(FINDING_HEADER, finding_rows(state.findings)))
        page.add(Bullets([(f.kind, None, f"`{f.reproducer(target)}`") for f in state.findings], with_verdict=False))
        crashes = [(f.kind, None, crash_text(f.to_dict())) for f in state.findings if f.kind == "crash"]
        if crashes:
            page.add(Bullets(crashes, with_verdict=False))
        page.add(Bullets([(k, None, w) for k, w in KIND_WORDS.items()], with_verdict=False))
    else:
        page.add(Text("None: every case judged kept within the budget, without NaN or Inf."))
    page.add(Heading("Semantics where no key is visible"))
    page.add(Table(SEMANTICS_HEADER, semantics_rows(table)))
    write_report(out, page, s)
    return s
