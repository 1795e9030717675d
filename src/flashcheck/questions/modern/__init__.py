"""The 2026 kernels: FlashAttention-4, FP8/FP4 attention, SageAttention and the P-cast with a sink: the modern
preset, verdicts, the Answer (or its one line after another set's), sentences and the published accuracy."""

from __future__ import annotations

from flashcheck.questions.modern.answer import modern_answer
from flashcheck.questions.modern.figures import draw_sink_question, draw_stage_question
from flashcheck.questions.modern.findings import (
    NOTES,
    THEIRS_VS_OURS,
    modern_findings,
    modern_sentences,
    sage_published_rows,
)
from flashcheck.questions.modern.presets import STAGE_PRESETS, modern
from flashcheck.reporting import Heading, Table, Text
from flashcheck.study.part import Part, Study
from flashcheck.study.registry import QuestionSet


def report_part(study: Study) -> Part:
    """Its answer (whole when it leads, one line after another set's), sentences, and SageAttention's
    published accuracy beside ours (summary key `published`, a table after the verdicts)."""
    header, rows = sage_published_rows(study.ok)
    published = [dict(zip(header, r, strict=True)) for r in rows]
    return Part(
        answer=modern_answer(study.found),
        brief=modern_answer(study.found, brief=True),
        sentences=modern_sentences(study.found),
        summary={"published": published} if rows else {},
        top=[
            Heading("SageAttention beside the published accuracy", anchor="published"),
            Table(header, rows),
            Text(THEIRS_VS_OURS),
        ]
        if rows
        else [],
    )


TITLES = {  # the report's headings (each question's id stays its anchor)
    "modern_fa4": "FlashAttention-4 (bf16) against FA2",
    "modern_lowp": "FP8 and FP4 kernels against FA3's FP8 path",
    "modern_sage": "SageAttention kernels",
    "modern_sink": "P collapse with a sink: one sink key and the paper's 4 sink tokens",
    "modern_stages": "Where the FP8/FP4 kernels' error comes from",
    "modern_sage_stages": "Where SageAttention's error comes from",
}


QUESTION_SET = QuestionSet(
    name="modern",
    order=40,
    presets={"modern": modern},
    findings=lambda study: modern_findings(study.points, study.ok),
    report=report_part,
    titles=TITLES,
    notes=NOTES,
    draw=dict.fromkeys(STAGE_PRESETS, draw_stage_question) | {"modern_sink": draw_sink_question},
)
