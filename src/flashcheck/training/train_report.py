"""The train-study report: conclusion, verdicts with intervals, ratio and fit-window tables, figures (weight
deviation over steps with the growth-phase fits, the ratio by step, a layer x step heat map, losses)."""

from __future__ import annotations

import math
from pathlib import Path

from flashcheck.reporting import (
    Bullets,
    Figure,
    Heading,
    Page,
    Styler,
    Table,
    Text,
    figure,
    label_axes,
    matplotlib_available,
    write_report,
)
from flashcheck.reporting.figures import legend_below
from flashcheck.training.ratios import PAPER_BAND

BASE = "base run (standard attention, fp32)"
WHAT = {"wasserstein": "Wasserstein-1(W_variant, W_base)", "max_abs": "max |W_variant - W_base|"}


def _mean(rows: list[list[float]]) -> list[float]:
    """Mean over seeds at each step (the seeds of a study share their saved steps)."""
    return [sum(col) / len(col) for col in zip(*rows, strict=True)]


def _positive(ys: list[float]) -> list[float]:
    """Zeros (step 0 of a one-factor pair: identical weights) left out of a log axis."""
    return [y if y > 0 else math.nan for y in ys]


def _deviation_figure(pairs: dict, metric: str, path: Path) -> None:
    """Mean over seeds per pair (one colour each; seeds thin), the growth-phase fit of seed 0 dashed."""
    with figure(path, size=(7.5, 4.2)) as (_, ax):
        style = Styler()
        for pname, entry in pairs.items():
            seeds = list(entry["seeds"].values())
            steps = seeds[0]["steps"]
            fit = seeds[0]["fit"]
            label = pname if metric != "wasserstein" else f"{pname} (fit steps {fit['window'][0]}-{fit['window'][1]})"
            st = style(label)
            for c in seeds:
                ax.plot(c["steps"], _positive(c[metric]), color=st["color"], lw=0.6, alpha=0.35, label="_seed")
            ax.plot(steps, _positive(_mean([c[metric] for c in seeds])), ms=3, **st)
            if metric == "wasserstein":
                _draw_fit(ax, seeds[0], st["color"])
        ax.set_yscale("log")
        n = len(next(iter(pairs.values()))["seeds"])
        label_axes(ax, x="training step", y=WHAT[metric], x_unit="steps", y_unit="weight units")
        title = f"variant vs {BASE}; mean of {n} seed(s), seeds thin"
        title += "; seed 0's growth-phase fit dashed" if metric == "wasserstein" else ""
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)


def _draw_fit(ax, c: dict, colour: str) -> None:
    lo, hi = c["fit"]["window"]
    xs = [s for s in c["steps"] if lo <= s <= hi]
    ys = [c["wasserstein"][c["steps"].index(s)] for s in xs]
    if len(xs) < 2 or not math.isfinite(c["fit"]["slope"]):
        return
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    line = [my + c["fit"]["slope"] * (x - mx) for x in xs]
    ax.plot(xs, [y if y > 0 else math.nan for y in line], ls="--", lw=1.6, color=colour, label="_fit")


def _ratio_figure(by_step: dict, path: Path) -> None:
    """W1 ratio Flash / low precision at every saved step with its 95% interval; 1 and the paper's band."""
    with figure(path, size=(7.5, 4.0)) as (_, ax):
        style = Styler()
        for name, rows in by_step.items():
            rows = [r for r in rows if r["n"] and r["value"] > 0]
            if not rows:
                continue
            other = name.rsplit("_", 1)[1]
            st = style(f"W1(Flash, base) / W1({'re-seeded' if other == 'seed' else other}, base)")
            xs = [r["step"] for r in rows]
            ax.plot(xs, [r["value"] for r in rows], ms=3, **st)
            lo = [r["low"] if math.isfinite(r["low"]) else r["value"] for r in rows]
            hi = [r["high"] if math.isfinite(r["high"]) else r["value"] for r in rows]
            ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.15, lw=0)
        ax.axhline(1.0, color="black", lw=0.8, label="_one")
        ax.axhspan(*PAPER_BAND, color="#999999", alpha=0.2, lw=0, label="_band")
        ax.set_yscale("log")
        label_axes(ax, x="training step", y="W1 ratio (Flash vs base) / (other pair)", x_unit="steps")
        ax.set_title("95% interval over seeds shaded; grey band: paper's 0.2-0.5; black: 1", fontsize=9)
        ax.legend(fontsize=7)


def _layers_figure(pairs: dict, path: Path) -> None:
    """The paper's picture: W1 over training steps of every pair (mean over seeds, log axis), one panel for the
    whole model and one per layer; the whole model's panel marks each pair's growth-phase window (seed 0)."""
    first = next(iter(pairs.values()))["seeds"]
    layers = list(next(iter(first.values()))["per_layer"])
    panels = ["whole model", *layers]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    with figure(path, ncols=cols, nrows=rows, size=(3.6, 2.9)) as (fig, axes):
        axes = axes if isinstance(axes, list) else [axes]
        for ax, panel in zip(axes, panels, strict=False):
            style = Styler()
            for pname, entry in pairs.items():
                seeds = list(entry["seeds"].values())
                ys = [c["wasserstein"] if panel == "whole model" else c["per_layer"][panel] for c in seeds]
                ax.plot(seeds[0]["steps"], _positive(_mean(ys)), ms=2, **style(pname))
                if panel == "whole model":
                    ax.axvline(
                        seeds[0]["fit"]["window"][1], color=style(pname)["color"], lw=0.7, ls=":", label="_window"
                    )
            ax.set_yscale("log")
            label_axes(ax, x="training step", y="W1(variant, base)", x_unit="steps")
            ax.set_title(panel + (" (dotted: growth-phase ends)" if panel == "whole model" else ""), fontsize=8)
            ax.legend(fontsize=5)
        for ax in axes[len(panels) :]:
            ax.set_axis_off()
        fig.suptitle(f"W1 of the weights over training, mean of {len(first)} seed(s), per layer", fontsize=9)


def _heatmap_figure(pairs: dict, path: Path) -> None:
    """Per pair, log10 of the per-layer W1 (mean over seeds) at every saved step: layers x steps, one colour
    scale for every panel; grey cells are exactly 0 (identical weights)."""
    import matplotlib
    import numpy as np

    grids = {}
    for pname, entry in pairs.items():
        seeds = list(entry["seeds"].values())
        layers = list(seeds[0]["per_layer"])
        grid = np.array([_mean([c["per_layer"][name] for c in seeds]) for name in layers], dtype=float)
        with np.errstate(divide="ignore"):
            grids[pname] = (
                layers,
                seeds[0]["steps"],
                np.where(grid > 0, np.log10(np.where(grid > 0, grid, 1)), np.nan),
            )
    vals = np.concatenate([g[~np.isnan(g)] for _, _, g in grids.values()])
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    with figure(path, ncols=len(grids), size=(3.8, 3.6)) as (fig, axes):
        axes = axes if isinstance(axes, list) else [axes]
        for ax, (pname, (layers, steps, grid)) in zip(axes, grids.items(), strict=True):
            img = ax.imshow(grid, aspect="auto", origin="lower", cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
            ax.set_yticks(range(len(layers)), layers, fontsize=7)
            idx = list(range(0, len(steps), max(1, len(steps) // 6)))
            ax.set_xticks(idx, [str(steps[i]) for i in idx], fontsize=7)
            label_axes(ax, x="training step", y="layer", x_unit="steps")
            ax.set_title(pname, fontsize=9)
        fig.colorbar(img, ax=axes[-1]).set_label("log10 W1(variant, base) per layer, mean over seeds", fontsize=8)


def _loss_figure(losses: dict, path: Path) -> None:
    with figure(path) as (_, ax):
        style = Styler()
        for name, ls in losses.items():
            if name.endswith("-s0"):
                ax.plot(range(1, len(ls) + 1), ls, lw=1, color=style(name)["color"], label=name)
        label_axes(ax, x="training step", y="training loss (seed 0's runs)", x_unit="steps", y_unit="nats/token")
        legend_below(ax, ncol=4, fontsize=7)  # the loss curves fill the axes: a legend inside covers them


def figures(summary: dict, losses: dict, folder: Path) -> list[str]:
    """Every figure of the report ([] without matplotlib); paths relative to the report's folder."""
    if not matplotlib_available():
        return []
    pairs = summary["pairs"]
    _deviation_figure(pairs, "wasserstein", folder / "wasserstein.png")
    _deviation_figure(pairs, "max_abs", folder / "max_abs.png")
    _layers_figure(pairs, folder / "w1_by_layer.png")
    _heatmap_figure(pairs, folder / "layers.png")
    _loss_figure(losses, folder / "loss.png")
    names = ["w1_by_layer", "wasserstein", "max_abs", "layers", "loss"]
    if any(r["n"] for rows in summary["ratio_by_step"].values() for r in rows):
        _ratio_figure(summary["ratio_by_step"], folder / "ratio.png")
        names.insert(2, "ratio")
    return [f"figures/{n}.png" for n in names]


def _ratio_rows(ratios: dict) -> list[list[str]]:
    rows = []
    for name, r in ratios.items():
        iv = f"[{r['low']:.3g}, {r['high']:.3g}]" if r["n"] >= 2 and math.isfinite(r["low"]) else "no interval"
        per_seed = ", ".join(
            f"{a / b:.3g}" if a > 0 and b > 0 else "—" for a, b in zip(r["numerator"], r["denominator"], strict=True)
        )
        rows.append([name, f"{r['value']:.3g}", iv, str(r["n"]), per_seed, "; ".join(r["notes"])])
    return rows


def _pair_rows(pairs: dict) -> list[list[str]]:
    rows = []
    for pname, entry in pairs.items():
        for seed, c in entry["seeds"].items():
            fit = c["fit"]
            kind = "growth" if fit["growing"] and fit["slope"] > 0 else "no growth phase"
            rows.append(
                [
                    pname,
                    seed,
                    " vs ".join(c["runs"]),
                    f"{c['wasserstein'][-1]:.3e}",
                    f"{c['max_abs'][-1]:.3e}",
                    f"{fit['slope']:+.3e}",
                    f"{fit['window'][0]}-{fit['window'][1]} ({fit['points']} pts)",
                    kind,
                ]
            )
    return rows


def verdict_bullets(findings: list[dict]) -> Bullets:
    """The findings of a training report (train-study, tied-max) as verdict bullets: id, holds / does not hold
    (or the status word when inconclusive), the claim, what was measured, the paper's figure and the rule."""
    return Bullets(
        [
            (
                f["id"],
                {"holds": True, "does not hold": False}.get(f["status"], f["status"]),
                f"{f['claim']}. Measured: {f['measured']} (paper: {f['paper']}). Rule: {f['verdict']['rule']}; "
                f"{f['verdict']['reason']}." + (f" Power: {f['power']['text']}." if _wants_power(f) else ""),
            )
            for f in findings
        ]
    )


def _wants_power(f: dict) -> bool:
    """An inconclusive verdict says how many seeds would decide it (tied-max's findings have no power)."""
    return f["status"] == "inconclusive" and "power" in f


def _method_text(c: dict) -> str:
    m = c["model"]
    return (
        "Slopes are least-squares fits of W1 over the growth phase of each curve: from step 0 to the first saved "
        "step where it reaches 90% of its largest value (at least 3 points); the window is in the table and "
        f"dashed in the figure. Runs: model {m['layers']} layers, dim {m['dim']}, {m['heads']} heads, "
        f"{m['seq_len']} tokens, vocabulary {m['vocab']}; batch {c['batch']}, {c['steps']} steps saved every "
        f"{c['save_every']}, lr {c['lr']:g}, attention policy {c['attention_policy']}, {c['seeds']} seed(s); "
        f"overrides of the preset: {c['overrides'] or 'none'}."
    )


def _loss_gap_section(page: Page, gap: dict, c: dict) -> None:
    """The 8-bit attention runs' loss gap to the base runs, their verdicts and the paper's claim."""
    from flashcheck.training.lossgap import MIN_SEEDS, TAIL

    claim = gap["claim"]
    page.add(Heading("8-bit attention (SageBwd-like): lossless fine-tuning, slower pretraining?"))
    page.add(
        Bullets([("sagebwd_claim", {"holds": True, "does not hold": False}.get(claim["status"], claim["status"]),
                  f"{claim['claim']} ({claim['source']}). Measured: {claim['text']}.")])
    )  # fmt: skip
    num = lambda x, sign=True: "n/a" if x is None else (f"{x:+.3g}" if sign else f"{x:.5g}")  # noqa: E731
    rows = [
        [name, e["label"], ", ".join(num(g) for g in e["gaps"]), num(e["gap"]), num(gap["spread"], False),
         e["verdict"], e["reason"]]
        for name, e in gap["variants"].items()
    ]  # fmt: skip
    header = ["run", "what", "gap per seed (nats)", "mean gap", "seed spread", "verdict", "why"]
    page.add(Table(header, rows))
    base = ", ".join(num(x, False) for x in gap["base_level"])
    page.add(
        Text(
            f"Loss level: the mean training loss over the last {gap['tail_steps']} steps ({TAIL:.0%}); gap: the 8-bit "
            f"run's level minus the base run's of the same seed (same initialisation and batches); seed spread: "
            f"the standard deviation over seeds of the base runs' levels ({base}); lossless: mean gap at most the "
            f"spread; slower: above it; inconclusive with fewer than {MIN_SEEDS} seeds or while the base runs stay "
            f"above {gap['plateau']:.4f} nats, the loss of predicting from the current token alone. The 8-bit "
            "attention is kernels.sim.sagebwd: INT8 Q, K (K smoothed), P and V in the forward; INT8 S, dV, dQ and dK "
            "products in the backward with dP = dO V^T in fp16 (six of the seven products 8-bit, as arXiv "
            "2603.02170 describes SageBwd). sage8 uses it from step 1, sage8ft from step "
            f"{c['steps'] // 2 + 1} (the base run's attention before). arXiv 2603.02170 finds the pretraining gap "
            f"closes at fewer tokens per step; these runs take {c['batch'] * c['model']['seq_len']} per step."
        )
    )


def write_train_report(summary: dict, losses: dict, out: Path) -> None:
    """report.md and report.html: conclusion first, verdicts, ratio table, pair table, slopes, figures."""
    c = summary["conditions"]
    page = Page(f"flashcheck train-study {summary['study']}: does attention numerics move the weights?")
    page.add(Heading("Conclusion"), Bullets([("", None, s) for s in summary["conclusion"]], with_verdict=False))
    if summary["verdicts"]:
        page.add(Heading("Verdicts"), verdict_bullets(summary["findings"]))
    else:
        page.add(Heading("No verdicts"), Text(summary["note"] + "."))
    if summary.get("loss_gap"):
        _loss_gap_section(page, summary["loss_gap"], c)
    page.add(Heading("Ratios (geometric mean over seeds, 95% t interval on log ratios)"))
    page.add(Table(["ratio", "value", "95% interval", "n", "per seed", "left out"], _ratio_rows(summary["ratios"])))
    page.add(Text(_method_text(c)))
    header = ["pair", "seed", "runs", "final W1", "final max abs", "W1 slope / step", "fit window (steps)", "phase"]
    page.add(Heading("Pairs"), Table(header, _pair_rows(summary["pairs"])))
    notes = [
        (f"{p} seed {seed}", None, text) for p, by_seed in summary["slopes"].items() for seed, text in by_seed.items()
    ]
    page.add(Heading("What the slopes mean"), Bullets(notes, with_verdict=False))
    page.add(Text("Final losses: " + ", ".join(f"{k} {v:.4f}" for k, v in summary["final_loss"].items())))
    cpu = summary.get("cpu")
    if cpu and cpu["runs_timed"]:
        page.add(Text(
            f"Training CPU time: {cpu['seconds']:.0f} s over {cpu['runs_timed']} of {cpu['runs']} runs (each run's "
            "process CPU time per step it trained, times its steps): on an idle machine the training takes about "
            "that divided by the number of workers, whatever the load when it was measured."
        ))  # fmt: skip
    names = figures(summary, losses, out / "figures")
    page.add(*(Figure(out / f, Path(f).stem) for f in names))
    write_report(out, page)
