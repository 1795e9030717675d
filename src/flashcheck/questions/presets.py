"""The presets that ask several question sets at once: quick, full and tiny."""

from __future__ import annotations

import dataclasses

from flashcheck.questions.guide.presets import GUIDE_SETTINGS, errors_sweep, guide_tiny
from flashcheck.questions.modern.presets import FA3_FP8, modern_sweeps
from flashcheck.questions.paper.presets import backend_sweep, fa3_sweep, paper_sweeps
from flashcheck.questions.variants.presets import dims_sweeps
from flashcheck.study.config import StudyConfig, Sweep


def quick() -> StudyConfig:
    """A subset of paper, fa3, the attention variants and the production guide: minutes on 2 cores."""
    return StudyConfig(
        name="quick",
        sweeps=(
            # 3 seeds (a verdict needs n >= 3) at 2 heads each: 3/4 of the work of the 2 seeds x 4 heads before
            *paper_sweeps((512, 1024, 2048, 4096, 8192), 2048, (8, 16, 32, 64, 128), 2, (0, 1, 2)),
            backend_sweep((1024, 4096), 2, (0, 1, 2)),
            fa3_sweep((1024, 2048), (64, 128), 2, (0, 1, 2)),
            *dims_sweeps(small=True),
            errors_sweep((256, 512, 1024, 2048), 2, (0, 1, 2)),
            *_quick_modern(),
        ),
        settings={"guide": GUIDE_SETTINGS["quick"]},
    )


def _quick_modern() -> list[Sweep]:
    """quick's small part of the modern study (questions.modern), at L=1024 and 3 seeds, after the classic questions
    (which keep their numbers): FA4 bf16 against FA2 (and its two knobs alone), and FA4's FP8 and FP4 paths
    against FA3's FP8 path on Gaussian and outlier inputs (some 40 cases, seconds on 2 cores)."""
    out = []
    for sw in modern_sweeps((1024,), (0, 1, 2), 2, captured=False):
        if sw.question == "modern_fa4":
            out.append(sw)
        elif sw.question == "modern_lowp":
            out.append(dataclasses.replace(sw, methods=("flash:fa4-fp8", "flash:fa4-fp4", FA3_FP8)))
    return out


def full() -> StudyConfig:
    """Everything, lengths up to 16k, five seeds, the guide at guide-full's sizes (hours)."""
    return StudyConfig(
        name="full",
        sweeps=(
            *paper_sweeps((512, 1024, 2048, 4096, 8192, 16384), 8192, (8, 16, 32, 64, 128, 256), 8, (0, 1, 2, 3, 4)),
            backend_sweep((1024, 4096, 16384), 8, (0, 1, 2, 3, 4)),
            fa3_sweep((512, 1024, 2048, 4096, 8192, 16384), (64, 128, 256), 8, (0, 1, 2, 3, 4)),
            *dims_sweeps(small=False),
            errors_sweep((512, 1024, 2048, 4096, 8192, 16384), 2, (0, 1, 2, 3, 4)),
            *_modern_part(),
        ),
        settings={"guide": GUIDE_SETTINGS["guide-full"]},
    )


def _modern_part() -> list[Sweep]:
    """full's small part of the modern study (questions.modern): FA4 vs FA2 and the sink question at 1k and 4k, five
    seeds (quick has a smaller part: _quick_modern)."""
    return [
        sw for sw in modern_sweeps((1024, 4096), (0, 1, 2, 3, 4), 2) if sw.question in ("modern_fa4", "modern_sink")
    ]


def tiny() -> StudyConfig:
    """Seconds: every question at toy sizes (for tests and smoke checks)."""
    sweeps = paper_sweeps((64, 128), 128, (8, 32), 2, (0,))
    return StudyConfig(
        name="tiny",
        sweeps=(*sweeps, backend_sweep((64,), 2, (0,)), fa3_sweep((128,), (32,), 2, (0,)), *guide_tiny().sweeps),
        settings={"guide": GUIDE_SETTINGS["guide-tiny"]},
    )
