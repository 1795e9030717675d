"""The figures of the modern study's stage questions (modern_stages, modern_sage_stages): one panel per preset,
one row per variant (the preset as it is, each stage raised to FP64 alone, each sub-stage removed alone), so the
~45 variants no longer pile up as rotated labels on one axis (issue 34)."""

from __future__ import annotations

from pathlib import Path

from flashcheck.questions.modern.presets import RAISED, STAGE_PRESETS, sub_raised
from flashcheck.reporting.panels import Panel, draw_panels
from flashcheck.study.points import Point


def stage_panels(question: str, points: list[Point]) -> list[Panel]:
    """The presets of `question` with points, each as a panel of its variants in a fixed order (missing ones
    left out), the preset as it is drawn as the reference line."""
    by_policy = {p.method.partition(":")[2]: p for p in points}
    panels = []
    for name in STAGE_PRESETS[question]:
        variants = [(name, "as is"), *((f"{name},{s}=fp64", f"{s} raised to FP64") for s in RAISED)]
        variants += [(f"{name},{terms}", f"{sub} removed") for sub, terms in sub_raised(name).items()]
        rows = tuple((label, by_policy[pol].estimate()) for pol, label in variants if pol in by_policy)
        if not rows:
            continue
        base = by_policy.get(name)
        ref = base.estimate().value if base is not None else float("nan")
        panels.append(Panel(name, rows, ref, f"{name} as is"))
    return panels


def draw_stage_question(sw, points: list[Point], path: Path, title: str) -> None:
    """The stage figure of sweep `sw` into `path` (study.registry's draw: registered for both stage questions)."""
    panels = stage_panels(sw.question, points)
    x_label = f"{'rel-L2' if sw.metric == 'rel_l2' else sw.metric} vs FP64 (original inputs)"
    draw_panels(panels, path, x_label=x_label, title=title)
