"""The attention users run (causal, GQA, padding, decoding, head dims, the backward pass, captured activations)
and the error model's check: presets (production), verdicts, tables and figures."""

from __future__ import annotations

from flashcheck.questions.variants.findings import dims_findings
from flashcheck.questions.variants.presets import production
from flashcheck.questions.variants.tables import NOTES, dims_sections
from flashcheck.study.part import Part, Study
from flashcheck.study.registry import QuestionSet


def report_part(study: Study) -> Part:
    """Its questions' tables and figures (they replace the engine's) and the error model's summary."""
    tables, figures, extra = dims_sections(study.config, study.ok, study.folder)
    return Part(tables=tables, figures=figures, summary=extra)


QUESTION_SET = QuestionSet(
    name="variants",
    order=20,
    presets={"production": production},
    solo=frozenset({"production"}),  # production's verdicts are the first lines of its report
    findings=lambda study: dims_findings(study.config, study.ok),
    report=report_part,
    notes=NOTES,
)
