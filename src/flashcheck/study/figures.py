"""The study's figures, one PNG per question, drawn from points only: the error in the paper's view, and the
ratio to the baseline in the paper's view (metric vs FP64 of the original inputs) and the kernel's own view
(relative L2 vs FP64 of the rounded inputs), each with its 95% interval. Every axes names its metric and
baseline; tiles are labelled Br x Bc; series get distinct colours (reporting.Styler)."""

from __future__ import annotations

import math
from pathlib import Path

from flashcheck.core.fileio import make_folder
from flashcheck.core.inputs import as_adjective
from flashcheck.reporting import Styler, figure, matplotlib_available
from flashcheck.reporting.verdicts import Estimate, mean_interval
from flashcheck.study.cases import CaseRecord
from flashcheck.study.config import StudyConfig, Sweep
from flashcheck.study.points import Point, sweep_points
from flashcheck.study.registry import drawer

METRIC = {"max_abs": "max-abs", "mean_abs": "mean-abs", "std": "std", "rmse": "RMSE", "rel_l2": "rel-L2"}
OWN = "rel-L2 vs FP64 of the rounded inputs"


def draw_figures(
    config: StudyConfig, records: dict[str, CaseRecord], folder: Path, skip: frozenset[str] = frozenset()
) -> dict[str, Path]:
    """One PNG per question with points, except the questions in `skip` (drawn elsewhere); {} when matplotlib
    is not installed."""
    if not matplotlib_available():
        return {}
    make_folder(folder, "the study's figures folder")
    paths = {}
    for sw in config.sweeps:
        points = sweep_points(sw, records) if sw.question not in skip else []
        if not points:
            continue
        path = folder / f"{sw.question}.png"
        draw_question(sw, points, path, config.name)  # atomic, never over a link (reporting.figure)
        paths[sw.question] = path
    return paths


def draw_question(sw: Sweep, points: list[Point], path: Path, study: str = "") -> None:
    """The figure of one question into `path`."""
    seeds = len(sw.seeds)
    dists = dict.fromkeys(p.distribution for p in points) or sw.distributions[:1]
    inputs = ", ".join(map(as_adjective, dists))
    title = f"{sw.question} ({study} study): {inputs} inputs, {seeds} seed(s); mean and 95% interval"
    own = drawer(sw.question)
    if own is not None:  # a question set's own figure of this question (study.registry.QuestionSet.draw)
        own(sw, points, path, title)
        return
    if not any(p.baseline for p in points):  # no baseline (e.g. the modern sweeps): no ratio panels to draw
        _draw_without_baseline(sw, points, path, title)
        return
    with figure(path, ncols=3, size=(5.4, 5.6)) as (fig, axes):
        x = x_axis(sw)
        _draw_errors(axes[0], points, sw, x)
        _draw_ratios(axes[1], points, x, own=False, metric=sw.metric)
        _draw_ratios(axes[2], points, x, own=True, metric=sw.metric)
        fig.suptitle(title)


def _draw_without_baseline(sw: Sweep, points: list[Point], path: Path, title: str) -> None:
    """The error panel alone; one panel per input distribution where one panel would hold more series than a
    reader can tell apart (full's sink question: 4 methods x 5 sink scores at each length)."""
    from flashcheck.reporting.figures import MAX_AT_ONE_X

    x = x_axis(sw)
    dists = list(dict.fromkeys(p.distribution for p in points))
    if len(_series(points, x)) <= MAX_AT_ONE_X or len(dists) == 1:
        with figure(path, ncols=1, size=(7.0, 5.6)) as (fig, ax):
            _draw_errors(ax, points, sw, x)
            fig.suptitle(title, fontsize=10)
        return
    ncols = min(3, len(dists))
    with figure(path, ncols=ncols, nrows=-(-len(dists) // ncols), size=(5.0, 5.0)) as (fig, axes):
        for ax, dist in zip(axes, dists, strict=False):
            _draw_errors(ax, [p for p in points if p.distribution == dist], sw, x)
            ax.set_title(f"{as_adjective(dist)} inputs", fontsize=9)
        for ax in axes[len(dists) :]:
            ax.set_axis_off()
        fig.suptitle(title, fontsize=10)


def x_axis(sw: Sweep) -> str:
    if len(sw.seq_lens) > 1:
        return "seq_len"
    if len(sw.blocks) > 1:
        return "tile"
    if len(sw.head_dims) > 1:
        return "head_dim"
    return "policy"


X_LABEL = {
    "seq_len": "sequence length L [tokens]",
    "head_dim": "head dim D",
    "tile": "tile Br x Bc (Bc = keys per block)",
    "policy": "policy (-mixed: fp32 statistics and accumulator)",
}


def _categories(points: list[Point], x: str) -> list:
    if x == "tile":
        return sorted({p.block for p in points if p.block != (0, 0)}, key=lambda b: (b[0] * b[1], b[1], b[0]))
    return list(dict.fromkeys(p.method.partition(":")[2] for p in points))


def policy_labels(policies: list[str]) -> list[str]:
    """Tick labels for policies: as they are, unless they are long knob lists ("input=fp32,...,p=fp8-e4m3"),
    then only the knobs that differ between them ("forward", "reverse", "S=2^8", "reverse, S=2^8")."""
    if all(len(q) <= 30 for q in policies):
        return policies
    parts = [q.split(",") for q in policies]
    common = set.intersection(*(set(p) for p in parts))
    short = [[_knob(k) for k in p if k not in common] for p in parts]
    out = [", ".join(k) or ("forward" if any("kv_order" in q for q in policies) else "as given") for k in short]
    return out if len(set(out)) == len(out) else policies


def _knob(knob: str) -> str:
    """One policy knob in a few characters: kv_order=reverse as "reverse", p_scale=256 as "S=2^8"."""
    key, _, value = knob.partition("=")
    if key == "kv_order":
        return value
    if key == "p_scale" and value.isdigit() and int(value) > 0 and int(value) & (int(value) - 1) == 0:
        return f"S=2^{int(value).bit_length() - 1}"
    if key == "p_scale":
        return f"S={value}"
    return knob


def _xpos(p: Point, x: str, cats: list) -> float:
    if x == "seq_len":
        return p.seq_len
    if x == "head_dim":
        return p.head_dim
    return cats.index(p.block if x == "tile" else p.method.partition(":")[2])


def set_x(ax, points: list[Point], x: str) -> None:
    cats = _categories(points, x)
    if x in ("seq_len", "head_dim"):
        ax.set_xscale("log", base=2)
        vals = sorted({_xpos(p, x, cats) for p in points})
        ax.set_xticks(vals, [str(int(v)) for v in vals])
        ax.minorticks_off()
    else:
        names = [f"{b[0]}x{b[1]}" for b in cats] if x == "tile" else policy_labels(cats)
        ax.set_xticks(range(len(cats)), names, rotation=30, ha="right")
    ax.set_xlabel(X_LABEL[x])


def yerr(ests: list[Estimate | None]) -> tuple[list[float], list[list[float]]]:
    """Values and asymmetric 95% error bars (0 where there is no interval)."""
    ys, lo, hi = [], [], []
    for e in ests:
        v = math.nan if e is None or e.n == 0 else e.value
        ys.append(v)
        ok = e is not None and e.n >= 2 and math.isfinite(e.low)
        lo.append(v - e.low if ok else 0.0)
        hi.append(e.high - v if ok else 0.0)
    return ys, [lo, hi]


def _series(points: list[Point], x: str) -> dict[str, list[Point]]:
    """Points per drawn series: per method, or per kernel when the x axis is the policy."""
    out: dict[str, list[Point]] = {}
    several = len({p.distribution for p in points}) > 1  # one series per input distribution as well
    for p in points:
        name = p.method.partition(":")[0] if x == "policy" else p.method
        out.setdefault(f"{name} ({as_adjective(p.distribution)} inputs)" if several else name, []).append(p)
    return out


def _draw_errors(ax, points: list[Point], sw: Sweep, x: str) -> None:
    """The metric vs FP64 of the original inputs for every method, baselines included (their own trend)."""
    style, cats = Styler(), _categories(points, x)
    for name, ps in _series(points, x).items():
        ys, err = yerr([p.estimate() for p in ps])
        if x == "tile" and ps[0].block == (0, 0):  # a baseline has no tiles: one line across
            st = style(f"{name} (no tiles)")
            ax.axhline(ys[0], color=st["color"], ls="--", lw=1.2, label=st["label"])
            continue
        ps = sorted(ps, key=lambda p: _xpos(p, x, cats))
        ys, err = yerr([p.estimate() for p in ps])
        xs = [_xpos(p, x, cats) for p in ps]
        ax.errorbar(xs, ys, yerr=err, capsize=3, ls="none" if x == "policy" else "-", **style(name))
    set_x(ax, points, x)
    _log_if_decades(ax, [v for p in points for v in p.values])
    ax.set_ylabel(f"{METRIC[sw.metric]} vs FP64 (original inputs)")
    ax.set_title("error, paper's view: vs FP64 of the original inputs", fontsize=9)
    legend_below(ax, x)


def legend_below(ax, x: str, ncol: int = 2) -> None:
    """The legend under the axes (never over the data), below rotated tick labels where there are some
    (reporting.figures.legend_below places it once the figure is laid out)."""
    from flashcheck.reporting.figures import legend_below as below

    below(ax, ncol=ncol)


def _log_if_decades(ax, values: list[float]) -> None:
    """A log y axis where the drawn values span more than a decade."""
    pos = [v for v in values if math.isfinite(v) and v > 0]
    if pos and max(pos) / min(pos) > 10:
        ax.set_yscale("log")


def _baseline_words(points: list[Point]) -> str:
    bases = {p.baseline.partition(":")[0] for p in points if p.baseline}
    if bases == {"standard"}:
        return "standard (same policy)"
    if bases == {"eager"}:
        return "eager (same dtype)"
    return "baseline (legend)"


def _draw_ratios(ax, points: list[Point], x: str, *, own: bool, metric: str) -> None:
    """Per-method ratio to its baseline with 95% intervals; a grey line at 1 (no difference)."""
    style, cats = Styler(), _categories(points, x)
    drawn = []
    for name, ps in _series([p for p in points if p.baseline], x).items():
        ps = sorted(ps, key=lambda p: _xpos(p, x, cats))
        ests = [p.own_ratio_estimate() if own else p.ratio_estimate() for p in ps]
        ys, err = yerr(ests)
        base = ps[0].baseline.partition(":")[0] if x == "policy" else ps[0].baseline
        ls = "none" if x == "policy" else "-"
        ax.errorbar([_xpos(p, x, cats) for p in ps], ys, yerr=err, capsize=3, ls=ls, **style(f"{name} ÷ {base}"))
        drawn += [y for y in ys if math.isfinite(y) and y > 0]
    ax.axhline(1.0, color="0.6", lw=0.8)
    set_x(ax, points, x)
    _log_if_decades(ax, drawn)
    name = OWN if own else f"{METRIC[metric]} vs FP64 of the original inputs"
    ax.set_ylabel(f"{name},\nratio ÷ {_baseline_words(points)}")
    title = (
        "kernel's own view: rel-L2 vs FP64 of the rounded inputs"
        if own
        else "paper's view: vs FP64 of the original inputs"
    )
    ax.set_title(f"ratio, {title}", fontsize=9)
    if drawn:
        legend_below(ax, x, ncol=1)


def draw_groups(
    groups: dict[tuple[str, int], list[float]], path: Path, *, x: str, y: str, log_x: bool, cases: str = "case"
) -> None:
    """One series per variant of {(variant, x): values, one per seed}: the mean over seeds at each x with its
    95% t interval (reporting.verdicts.mean_interval; a point without bars where n < 2), distinct colours and
    markers (Styler), the legend beside the axes, a log y axis over more than a decade. Where more than
    MAX_AT_ONE_X variants would share one x (padding: 5 methods x 2 paddings x 2 masks at one length), one
    series per method instead, over categories named by the rest of the variant (`cases`) and x, side by side."""
    from flashcheck.reporting.figures import MAX_AT_ONE_X

    series: dict[str, list[tuple[int, Estimate]]] = {}
    for (variant, xv), vals in sorted(groups.items()):
        series.setdefault(variant, []).append((xv, mean_interval(vals)))
    per_x: dict[int, int] = {}
    for _, xv in groups:
        per_x[xv] = per_x.get(xv, 0) + 1
    if max(per_x.values()) > MAX_AT_ONE_X:
        _draw_categories(series, path, x=x, y=y, cases=cases)
        return
    style = Styler()
    with figure(path, size=(7.0, 4.2)) as (_, ax):
        for variant, pts in series.items():
            ys, err = yerr([e for _, e in pts])
            ax.errorbar([xv for xv, _ in pts], ys, yerr=err, capsize=3, **style(variant))
        if log_x:
            ax.set_xscale("log", base=2)
        xs = sorted({xv for _, xv in groups})
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.minorticks_off()
        _log_if_decades(ax, [e.value for pts in series.values() for _, e in pts])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        _n_title(ax, series)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _n_title(ax, series: dict[str, list[tuple[int, Estimate]]]) -> None:
    ns = sorted({e.n for pts in series.values() for _, e in pts})
    n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    ax.set_title(f"mean over seeds (n={n}) and its 95% interval", fontsize=9)


MAX_CATEGORIES = 12  # categories a 7-inch x axis holds with their names at 20 degrees (figure_problems checks)


def _draw_categories(series: dict[str, list[tuple[int, Estimate]]], path: Path, *, x: str, y: str, cases: str) -> None:
    """One series per method (the variant's first word) over categories (the rest of the variant, and x where
    there are several), the methods side by side within a category."""
    xs = sorted({xv for pts in series.values() for xv, _ in pts})
    by: dict[str, dict[tuple[str, int], Estimate]] = {}
    for variant, pts in series.items():
        method, _, rest = variant.partition(" ")
        for xv, e in pts:
            by.setdefault(method, {})[(rest or "-", xv)] = e
    cats = sorted({c for cells in by.values() for c in cells}, key=lambda c: (c[1], c[0]))
    names = [c[0] if len(xs) == 1 else f"{c[0]}, {c[1]}" for c in cats]
    style, width = Styler(), 0.8 / len(by)
    across = len(cats) > MAX_CATEGORIES  # many categories: one row each (their names read across, never piled)
    size = (7.0, 1.2 + 0.28 * len(cats)) if across else (7.0, 4.6)
    with figure(path, size=size) as (_, ax):
        for j, (method, cells) in enumerate(by.items()):
            here = [c for c in cats if c in cells]
            vals, err = yerr([cells[c] for c in here])
            pos = [cats.index(c) + (j - (len(by) - 1) / 2) * width for c in here]
            if across:
                ax.errorbar(vals, pos, xerr=err, capsize=3, ls="none", **style(method))
            else:
                ax.errorbar(pos, vals, yerr=err, capsize=3, ls="none", **style(method))
        where = f"{cases} (at {x}: {xs[0]})" if len(xs) == 1 else f"{cases}, {x}"
        values = [e.value for cells in by.values() for e in cells.values()]
        if across:
            ax.set_yticks(range(len(cats)), names, fontsize=8)
            ax.invert_yaxis()  # the first category on top
            pos = [v for v in values if math.isfinite(v) and v > 0]
            if pos and max(pos) / min(pos) > 10:
                ax.set_xscale("log")
            else:
                from matplotlib.ticker import MaxNLocator

                ax.xaxis.set_major_locator(MaxNLocator(4))  # the axis is narrow beside the long names
            ax.set_xlabel(y)
            ax.set_ylabel(where)
        else:
            ax.set_xticks(range(len(cats)), names, rotation=20, ha="right", fontsize=8)
            _log_if_decades(ax, values)
            ax.set_xlabel(where)
            ax.set_ylabel(y)
        _n_title(ax, series)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
