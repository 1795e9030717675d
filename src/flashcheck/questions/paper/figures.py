"""The paper set's own figure of FA3's Table 3: our RMSE beside the paper's, and RMSE against the length."""

from __future__ import annotations

import math
from pathlib import Path

from flashcheck.questions.paper.presets import FA3_PAPER_RMSE
from flashcheck.reporting import Styler, figure
from flashcheck.study.config import Sweep
from flashcheck.study.figures import legend_below, set_x, yerr
from flashcheck.study.points import Point


def draw_fa3(sw: Sweep, points: list[Point], path: Path, title: str) -> None:
    """The fa3 question's figure into `path`: the table's bars, then one panel per head dim."""
    with figure(path, ncols=1 + len(sw.head_dims), size=(5.5, 5.6)) as (fig, axes):
        _draw(axes, points, sw)
        fig.suptitle(title)


def _draw(axes, points: list[Point], sw: Sweep) -> None:
    """FA3's Table 3: our RMSE (geometric mean over lengths, head dims, seeds) beside the paper's; then RMSE vs
    the length, one panel per head dim."""
    methods = list(sw.methods)
    ours = []
    for m in methods:
        vals = [v for p in points if p.method == m for v in p.values if v > 0]
        ours.append(math.exp(sum(map(math.log, vals)) / len(vals)) if vals else math.nan)
    idx = range(len(methods))
    style = Styler()
    axes[0].bar([i - 0.2 for i in idx], ours, width=0.4, color=style("flashcheck")["color"], label="flashcheck")
    paper = [FA3_PAPER_RMSE.get(m, math.nan) for m in methods]
    axes[0].bar([i + 0.2 for i in idx], paper, width=0.4, color=style("FA3 paper")["color"], label="FA3 paper, Table 3")
    axes[0].set_yscale("log")
    axes[0].set_xticks(list(idx), methods, rotation=30, ha="right", fontsize=7)
    axes[0].set_xlabel("method (geometric mean over L, D and seeds)")
    axes[0].set_ylabel("RMSE vs FP64 of the original inputs")
    top = max((v for v in [*ours, *paper] if math.isfinite(v)), default=1.0)
    axes[0].set_ylim(top=top * 20)  # headroom: the legend sits above the bars
    axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    for ax, d in zip(axes[1:], sw.head_dims, strict=True):
        style = Styler()
        for m in methods:
            ps = sorted((p for p in points if p.method == m and p.head_dim == d), key=lambda p: p.seq_len)
            if not ps:  # every case of it failed (or is not stored yet): no legend entry for a line not drawn
                continue
            ys, err = yerr([p.estimate() for p in ps])
            ax.errorbar([p.seq_len for p in ps], ys, yerr=err, capsize=3, **style(m))
        set_x(ax, [p for p in points if p.head_dim == d], "seq_len")
        ax.set_yscale("log")
        ax.set_ylabel("RMSE vs FP64 of the original inputs")
        ax.set_title(f"head dim D={d}", fontsize=9)
        legend_below(ax, "seq_len")
