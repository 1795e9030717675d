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


TITLES = {  # the report's headings (each question's id stays its anchor)
    "causal": "Causal mask",
    "gqa": "Grouped-query attention",
    "padding": "Padded batches",
    "padding_dead_rows": "Rows that see no key",
    "decoding": "Decoding against a KV cache",
    "head_dim": "Head dimension",
    "backward": "Backward: dQ, dK, dV",
    "captured": "Captured activations of all-MiniLM-L6-v2",
    "error_model": "Error model: predicted against measured",
    "error_model_kinds": "Error model by kind of kernel",
    "production_prefill": "Production: prefill",
    "production_decoding": "Production: decoding",
    "production_backward": "Production: backward",
    "production_captured": "Production: captured activations",
}


QUESTION_SET = QuestionSet(
    name="variants",
    order=20,
    presets={"production": production},
    solo=frozenset({"production"}),  # production's verdicts are the first lines of its report
    findings=lambda study: dims_findings(study.config, study.ok),
    report=report_part,
    titles=TITLES,
    notes=NOTES,
)
