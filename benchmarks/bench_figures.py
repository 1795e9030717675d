"""reporting.figures.figure() against matplotlib's plain save (tight_layout, then savefig(bbox_inches="tight")),
paired in one process: the same figures, the same PNG bytes, CPU seconds per figure.

figure() lays a figure out once (tight_layout; a draw without rendering where a legend goes under its axes), takes
the tight box from that layout and hands it to savefig with no layout engine left, so savefig renders once; the peer
lets savefig draw the figure again to find the box (matplotlib does so whenever a layout engine, even tight_layout's
placeholder, is set). Each report (study, validate, train-study, guide) saves its figures through figure().
    python benchmarks/bench_figures.py                # 3 kinds of figure x 8 pairs
    python benchmarks/bench_figures.py --pairs 20
Prints, per kind, both medians (CPU ms per figure, time.process_time), their ratio (figure() / plain) and whether
the two PNGs are byte-identical; the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from flashcheck.reporting import figures as figs

KINDS = ("log-log, 2 panels, legends below", "log-log, 2 panels", "linear, 1 panel, legend inside")


def _draw(kind: str, axes) -> None:
    """Six series per panel, as a study's error-vs-length figure draws them."""
    axes = axes if isinstance(axes, list) else [axes]
    for ax in axes:
        style = figs.Styler()
        xs = [64, 128, 256, 512, 1024, 2048]
        for s in range(6):
            ax.plot(xs, [1e-4 * (s + 1) * (x / 64) ** 0.5 for x in xs], **style(f"flash:bf16-mixed, seed {s}"))
        if kind.startswith("log"):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        figs.label_axes(ax, x="sequence length", y="max |error|", x_unit="tokens")
        if "below" in kind:
            figs.legend_below(ax)
        elif "inside" in kind:
            ax.legend(fontsize=7)


def _ours(kind: str, path: Path) -> float:
    t = time.process_time()
    with figs.figure(path, ncols=1 if "1 panel" in kind else 2) as (_, axes):
        _draw(kind, axes)
    return time.process_time() - t


def _plain(kind: str, path: Path) -> float:
    """The same figure saved as matplotlib does by default: savefig finds the tight box by drawing again."""
    import matplotlib.pyplot as plt

    t = time.process_time()
    n = 1 if "1 panel" in kind else 2
    fig, axes = plt.subplots(1, n, figsize=(7.0 * n, 4.0), squeeze=False, dpi=figs.DPI)
    flat = [ax for row in axes for ax in row]
    _draw(kind, flat[0] if n == 1 else flat)
    for ax in fig.axes:
        if not figs.mark_empty(ax):
            figs._readable_log_ticks(ax)
    fig.tight_layout()
    figs._place_below(fig)
    fig.savefig(path, dpi=figs.DPI, bbox_inches="tight", pil_kwargs={"compress_level": 3})
    plt.close(fig)
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8, help="figure() / plain pairs per kind (default 8)")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error(f"--pairs {args.pairs}: give 1 or more")
    print(f"load {os.getloadavg()[0]:.2f}; CPU ms per figure, medians of {args.pairs} pairs (figure() / plain)")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            a, b = Path(tmp) / "a.png", Path(tmp) / "b.png"
            _ours(kind, a), _plain(kind, b)  # warm-up: fonts, mathtext, the text caches
            ours, plain = [], []
            for _ in range(args.pairs):
                ours.append(_ours(kind, a))
                plain.append(_plain(kind, b))
            same = a.read_bytes() == b.read_bytes()
            mo, mp = statistics.median(ours), statistics.median(plain)
            print(f"{kind:34s} figure() {mo * 1e3:6.1f}  plain {mp * 1e3:6.1f}  ratio {mo / mp:.2f}  same PNG: {same}")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
