"""The modern study's own figures: the stage questions (modern_stages, modern_sage_stages), one panel per preset,
one row per variant (the preset as it is, each stage raised to FP64 alone, each sub-stage removed alone), so the
~45 variants no longer pile up as rotated labels on one axis (issue 34); and the sink question (modern_sink), each
fix's MSE gain against the sink score at both sink settings beside 2606.06521's 3-10x."""

from __future__ import annotations

import math
from pathlib import Path

from flashcheck.core.inputs import sink_delta, sink_tokens
from flashcheck.questions.modern.presets import P_FP8, RAISED, STAGE_PRESETS, sub_raised
from flashcheck.questions.modern.sink import SINK_FIXES, mse_ratio
from flashcheck.reporting.panels import Panel, draw_panels
from flashcheck.reporting.verdicts import Estimate
from flashcheck.study.points import Point

SETTING_WORDS = {1: "one sink key", 4: "4 sink tokens (the paper's)"}


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


def sink_gains(points: list[Point]) -> list[tuple[str, list[tuple[float, Estimate]]]]:
    """Per sink setting, fix (and length, where the sweep has several): [(sink score, MSE of forward order, S = 1 /
    MSE with the fix, paired on the same inputs)], labelled in words."""
    lengths = sorted({p.seq_len for p in points})
    series = []
    for n_sinks, words in SETTING_WORDS.items():
        for length in lengths:
            mine = [p for p in points if sink_tokens(p.distribution) == n_sinks and p.seq_len == length]
            for _, method, what in SINK_FIXES:
                rows = []
                for delta in sorted({d for p in mine if (d := sink_delta(p.distribution)) is not None}):
                    est = mse_ratio([p for p in mine if sink_delta(p.distribution) == delta], P_FP8, method)
                    if est is not None and est.n:
                        rows.append((delta, est))
                at = f", L={length}" if len(lengths) > 1 else ""
                if rows:
                    series.append((f"{what}, {words}{at}", rows))
    return series


def draw_sink_question(sw, points: list[Point], path: Path, title: str) -> None:
    """The sink figure of sweep `sw` into `path`: each fix's MSE gain (95% interval) against the sink score, one
    series per setting and fix, the paper's 3-10x shaded (study.registry's draw for modern_sink)."""
    from flashcheck.reporting import Styler, figure
    from flashcheck.reporting.figures import legend_below

    with figure(path, size=(7.5, 5.2)) as (fig, ax):
        ax.axhspan(3.0, 10.0, color="0.88")  # named by a text, not the legend (figure_problems reads lines only)
        ax.text(0.01, 5.5, "2606.06521: 3-10x at moderate sinks", transform=ax.get_yaxis_transform(), fontsize=8)
        style = Styler()
        for label, rows in sink_gains(points):
            xs, ys = [d for d, _ in rows], [e.value for _, e in rows]
            lo = [e.value - e.low if math.isfinite(e.low) else 0.0 for _, e in rows]
            hi = [e.high - e.value if math.isfinite(e.high) else 0.0 for _, e in rows]
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, **style(label))
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("sink score Delta")
        ax.set_ylabel("MSE forward order, S = 1 / MSE with the fix")
        legend_below(ax, ncol=1, fontsize=8)  # inside, it covered the gains at small sink scores
        fig.suptitle(title, fontsize=10)
