"""A hunt's summary.json, report.md and report.html: the findings (minimal case, where, reproducer, when found)
and the semantics table beside flashcheck's convention; each finding also as its own JSON record."""

from __future__ import annotations

import json
import math
from pathlib import Path

from flashcheck.core.fileio import make_folder, safe_child, write_atomic
from flashcheck.hunt.semantics import CONVENTION, Probe
from flashcheck.hunt.store import HuntState
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
    "output": "the target returned no tensor, or one of another shape than [B, H, Lq, D]",
    "failed": "the target raised on every case: none could be judged",
}
CATEGORY_WORDS = {
    "kernel-bug": "the FP64 reference is finite and the same-format reference (plain attention in the dtype) is "
    "within the budget: the kernel's own doing",
    "simulated": "a kernel preset (flashcheck's simulation of an algorithm in its formats) leaves the budget: what "
    "the algorithm does at that precision, not a defect found in anyone's code",
    "format-overflow": "the logits exceed the format's range where the same-format reference, or the operator's "
    "specification, computes them in that format (cited)",
    "convention": "only rows with no visible key differ (fully masked rows, Lk = 0, causal with Lq > Lk)",
    "private-only": "reached through a private op users do not call",
    "crash / hang": "the process died / gave no answer",
    "target-error": "no tensor of the right shape, or an error on every case",
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


def finding_rows(findings: list[dict]) -> list[list[str]]:
    """The findings table's rows, from the findings' dicts (summary.json's)."""
    return [
        [
            f["kind"],
            f.get("category") or "",
            f["where"],
            ratio_text(f["kind"], f.get("margin", 0.0)),
            "" if f.get("max_logit") is None else f"{f['max_logit']:.3g}",
            f["describe"],
            f"{f['found_after_s']:.1f}",
            f"{f['shrunk_after_s']:.1f}",
        ]
        for f in findings
    ]


def finding_notes(f: dict) -> list[str]:
    """What a finding's row leaves out: the crash's words, the target's error, a private api, the known report."""
    notes = []
    if f["kind"] == "crash":
        notes.append(f"crash: {crash_text(f)}")
    elif f["kind"] in ("failed", "output"):
        notes.append(f"{f['kind']}: {f['message']}")
    elif f["kind"] == "budget" and f.get("message"):  # the row's ratio, with the numbers behind it
        notes.append(f"budget, {f['tensor']}: {f['message']}")
    if str(f.get("api", "public")).startswith("private"):
        notes.append(f"api: {f['api']}")
    if f.get("known"):
        notes.append(f"known: {f['known']}")
    return notes


def crash_text(f: dict) -> str:
    """'died of SIGABRT on Lk=64 ...; stderr: F... Check failed: ...' for a crash finding (a dict of to_dict)."""
    if f["tensor"] == "hang":  # hunt.isolate.HANG: killed after --case-timeout
        return f"hung on {f['describe']}: {f['message']}"
    return f"died of {f['tensor']} on {f['describe']}; stderr: {f['message']}"


FINDING_HEADER = [
    "kind",
    "category",
    "where",
    "error / bound",
    "max |logit|",
    "minimal case",
    "found (s)",
    "shrunk (s)",
]
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
        page.add(Table(FINDING_HEADER, finding_rows(s["findings"])))
        page.add(Bullets([(f["kind"], None, f"`{f['reproducer']}`") for f in s["findings"]], with_verdict=False))
        notes = [(f["kind"], None, n) for f in s["findings"] for n in finding_notes(f)]
        if notes:
            page.add(Bullets(notes, with_verdict=False))
        page.add(Bullets([(k, None, w) for k, w in KIND_WORDS.items()], with_verdict=False))
        page.add(Bullets([(k, None, w) for k, w in CATEGORY_WORDS.items()], with_verdict=False))
    else:
        page.add(Text("None: every case judged kept within the budget, without NaN or Inf."))
    page.add(Heading("Semantics where no key is visible"))
    page.add(Table(SEMANTICS_HEADER, semantics_rows(table)))
    write_report(out, page, s)
    return s
