"""What a question set reads to report on a study (Study) and what it adds to the report (Part); the set itself
is a study.registry.QuestionSet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.study.cases import CaseRecord
from flashcheck.study.config import StudyConfig
from flashcheck.study.points import Point

Sentence = tuple[str, str]  # (text, anchor of the report section holding its evidence)
TableRows = tuple[str, list[str], list[list[str]]]  # (question or anchor, header, rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class Study:
    """What a set reads to report on a study folder (stored records only; it computes nothing).
    points: each sweep's points by question; found: every set's verdicts, in the report's order."""

    folder: Path
    config: StudyConfig
    records: dict[str, CaseRecord]
    ok: dict[str, CaseRecord]
    points: dict[str, list[Point]]
    found: list[dict] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """What a set adds to a study's report. answer: its plain sentences when it leads the Answer (the first
    set, in order, with some); brief: its lines when another set leads; fallback: the Answer when no set leads
    (the first set's that has one). sentences: the conclusion's (the leading set's first). headline: a figure
    and caption under the Answer. figures/tables: its questions' own (they replace the engine's per-question
    figure and table of that name). summary: its keys of summary.json. failures: its failed tasks.
    top/middle/end: page blocks after the verdicts table, after the verdicts' rules, after the questions.
    stored: what of the set's own work is stored, {what: (stored, planned)} (e.g. {"guide tasks": (0, 52)}):
    the report says "partial" first while any is short."""

    answer: list[str] = field(default_factory=list)
    brief: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)
    sentences: list[Sentence] = field(default_factory=list)
    headline: tuple[Path, str] | None = None
    figures: dict[str, Path] = field(default_factory=dict)
    tables: list[TableRows] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    top: list = field(default_factory=list)
    middle: list = field(default_factory=list)
    end: list = field(default_factory=list)
    stored: dict[str, tuple[int, int]] = field(default_factory=dict)


NOT_YET = "not measured yet"


def partial_line(stored: dict[str, tuple[int, int]]) -> str | None:
    """A report's first line while its study is unfinished, from {what: (stored, planned)}: "partial: 141 of 564
    cases, 0 of 52 guide tasks; rerun the same command to finish"; None when everything planned is stored."""
    if all(done >= planned for done, planned in stored.values()):
        return None
    items = ", ".join(f"{done} of {planned} {what}" for what, (done, planned) in stored.items() if planned)
    return f"partial: {items}; rerun the same command to finish"
