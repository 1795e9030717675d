"""The seed paper's questions (arXiv 2405.02803: formats, length, tiles), the real CPU backends beside the
simulator and FlashAttention-3's Table 3: presets, verdicts, the Answer's first sentences, the conclusion,
the headline figure and FA3's figure."""

from __future__ import annotations

from flashcheck.questions.paper.answer import PAPER_CELL, draw_headline
from flashcheck.questions.paper.answer import answer as paper_answer  # aliased: the package keeps its modules' names
from flashcheck.questions.paper.conclusion import conclusion as paper_conclusion
from flashcheck.questions.paper.figures import draw_fa3
from flashcheck.questions.paper.findings import findings as paper_findings
from flashcheck.questions.paper.presets import FA3_PAPER_RMSE, FA3_TABLE3_SOURCE, FA3_TABLE3_UNSTATED, fa3, paper
from flashcheck.study.part import Part, Study
from flashcheck.study.registry import QuestionSet

HEADLINE = "Flash / standard attention against the length, both policies"
NOTES = {
    "seq_len": "The ratio's growth with L can come from Flash's error growing or from the Baseline's own error "
    "falling (outputs shrink as L grows): the left panel shows both, and grows_with_seq_len gives both slopes.",
    "block_area": "In an exact tiled emulation only the key-block size Bc changes a row's arithmetic; Br is "
    "structural (br_no_effect). The block-area effect is therefore an effect of Bc.",
    "swapped": "Swapping Br x Bc changes Bc: the comparison is between two key-block sizes (Br has no effect).",
    "square": "At equal area the tiles differ in Bc; a square tile sits where its Bc puts it.",
    "backends": "Metric rel-L2. A real backend's baseline is eager PyTorch in the same dtype; the simulator's "
    "is standard attention under the same policy.",
    "fa3": "Metric RMSE with outlier inputs; the comparisons are the verdicts fa3_fp16 and fa3_fp8. The paper column "
    f"is Table 3 ({FA3_TABLE3_SOURCE}), which states its inputs, metric and baselines but not its "
    f"{', '.join(FA3_TABLE3_UNSTATED)}: an absolute RMSE beside ours is at unlike conditions (no verdict); the "
    "verdicts judge the ratios Baseline / FA2 FP16 and Baseline FP8 / FA3 FP8.",
}


def report_part(study: Study) -> Part:
    """The Answer from the seq_len question (it leads when measured; else its sentence saying so is the
    fallback), the conclusion's sentences and the headline figure."""
    seq = study.points.get("seq_len", [])
    headline = draw_headline(seq, study.folder / "figures" / "headline.png")
    said = paper_answer(study.found, seq, study.config)
    return Part(
        answer=said if seq else [],
        fallback=[] if seq else said,
        sentences=paper_conclusion(study.found, study.points),
        headline=None if headline is None else (headline, HEADLINE),
    )


TITLES = {  # the report's headings (each question's id stays its anchor)
    "formats": "Number formats",
    "seq_len": "Sequence length at fixed tiles",
    "block_area": "Block area",
    "swapped": "Swapped block dimensions",
    "square": "Square vs rectangular tiles",
    "fa3": "FlashAttention-3 Table 3: fp16 and fp8 with outlier inputs",
    "backends": "Real CPU backends on the same inputs",
}


QUESTION_SET = QuestionSet(
    name="paper",
    order=10,
    presets={"paper": paper, "fa3": fa3},
    findings=lambda study: paper_findings(study.config, study.ok),
    report=report_part,
    titles=TITLES,
    notes=NOTES,
    cells={"flash_vs_baseline_bf16": PAPER_CELL},
    published={"fa3": FA3_PAPER_RMSE},
    draw={"fa3": draw_fa3},
)
