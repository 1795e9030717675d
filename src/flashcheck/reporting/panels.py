"""Figures of labelled intervals, one panel per group and one row per category (horizontal error bars): for
questions with tens of categories, whose names piled up as rotated x tick labels on one axis (issue 34)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from flashcheck.reporting.figures import COLOURS, figure, log10_axis
from flashcheck.reporting.verdicts import Estimate

ROW_INCHES = 0.3  # height of one row: tick labels at 9 pt stay apart


@dataclass(frozen=True, slots=True)
class Panel:
    """One group: its title, rows of (label, estimate) from top to bottom, and the reference value drawn as a
    dashed line with its legend label (NaN: none)."""

    title: str
    rows: tuple[tuple[str, Estimate], ...]
    reference: float = math.nan
    reference_label: str = ""


def draw_panels(panels: list[Panel], path: str | Path, *, x_label: str, title: str, ncols: int = 2) -> None:
    """Every panel as points with their 95% intervals on a log x axis, `ncols` panels a row, into `path`."""
    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    tallest = max(len(p.rows) for p in panels)
    size = (6.2, 1.0 + ROW_INCHES * tallest)
    with figure(path, ncols=ncols, nrows=nrows, size=size) as (fig, axes):
        axes = axes if isinstance(axes, list) else [axes]
        for ax, panel in zip(axes, panels, strict=False):
            _draw_panel(ax, panel, x_label)
        for ax in axes[len(panels) :]:
            ax.set_axis_off()
        fig.suptitle(title, fontsize=10)


def _draw_panel(ax, panel: Panel, x_label: str) -> None:
    ys = list(range(len(panel.rows)))[::-1]  # the first row on top
    values = [est.value for _, est in panel.rows]
    lows = [max(est.value - est.low, 0.0) if math.isfinite(est.low) else 0.0 for _, est in panel.rows]
    highs = [max(est.high - est.value, 0.0) if math.isfinite(est.high) else 0.0 for _, est in panel.rows]
    ax.errorbar(values, ys, xerr=[lows, highs], fmt="o", color=COLOURS[0], capsize=3, label="mean, 95% interval")
    if math.isfinite(panel.reference):
        ax.axvline(panel.reference, color=COLOURS[1], ls="--", lw=1, label=panel.reference_label)
    ax.set_yticks(ys, [label for label, _ in panel.rows], fontsize=9)
    ax.set_ylim(-0.7, len(ys) - 0.3)
    if all(v > 0 for v in values if math.isfinite(v)):
        log10_axis(ax, "x")  # labelled minor ticks piled up within one decade
    ax.set_xlabel(x_label)
    ax.set_ylabel("policy variant")
    ax.set_title(panel.title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(ys)), ncol=2)
