"""Figure helpers shared by every report: one colour/marker scheme, axes labelled with units, no colour
reused within one axes, matplotlib imported lazily (reports work without it, minus figures)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
    "#393b79",
    "#ad494a",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


class Styler:
    """Hands out a distinct (colour, marker) per label within one axes; the same label keeps its style."""

    def __init__(self) -> None:
        self._styles: dict[str, dict] = {}

    def __call__(self, label: str) -> dict:
        if label not in self._styles:
            i = len(self._styles)
            if i >= len(COLOURS) * len(MARKERS):
                raise ValueError(f"more than {len(COLOURS) * len(MARKERS)} series on one axes")
            self._styles[label] = {
                "color": COLOURS[i % len(COLOURS)],
                "marker": MARKERS[(i // len(COLOURS) + i) % len(MARKERS)],
                "label": label,
            }
        return self._styles[label]


@contextlib.contextmanager
def figure(path: str | Path, *, ncols: int = 1, size: tuple[float, float] = (7.0, 4.0)) -> Iterator[tuple]:
    """(fig, axes) to draw on; saved to `path` (folders made) and closed on exit. axes is one Axes for
    ncols=1, else a list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(size[0] * ncols, size[1]), squeeze=False)
    flat = list(axes[0])
    try:
        yield fig, flat[0] if ncols == 1 else flat
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")  # legends placed outside the axes stay in
    finally:
        plt.close(fig)


def label_axes(ax, *, x: str, y: str, x_unit: str = "", y_unit: str = "") -> None:
    """Axis labels with units in brackets ("sequence length [tokens]")."""
    ax.set_xlabel(f"{x} [{x_unit}]" if x_unit else x)
    ax.set_ylabel(f"{y} [{y_unit}]" if y_unit else y)


def _handle_data(handle) -> tuple[tuple, list[float], list[float]]:
    """(rgba colour, x values, y values) of a legend handle: a line, an error-bar or bar container."""
    from matplotlib.colors import to_rgba

    if hasattr(handle, "patches"):  # bars
        rects = list(handle.patches)
        colour = to_rgba(rects[0].get_facecolor()) if rects else (0, 0, 0, 0)
        return colour, [r.get_x() for r in rects], [r.get_height() for r in rects]
    line = handle.lines[0] if hasattr(handle, "lines") and isinstance(handle.lines, tuple) else handle
    if hasattr(line, "get_ydata"):
        return to_rgba(line.get_color()), list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))
    return to_rgba(handle.get_facecolor()[0]), [], []


def _drawn(xs: list[float], ys: list[float], ax) -> bool:
    """Whether some point is visible: finite, and positive on a log axis."""
    import math

    def ok(v: float, scale: str) -> bool:
        return math.isfinite(v) and (scale != "log" or v > 0)

    if not xs:
        return any(ok(y, ax.get_yscale()) for y in ys)
    return any(ok(x, ax.get_xscale()) and ok(y, ax.get_yscale()) for x, y in zip(xs, ys, strict=False))


def figure_problems(fig) -> list[str]:
    """What would make a figure misleading, one line per problem ([] when none), for every axes that draws
    labelled series: a missing axis label, repeated tick labels, legend entries that differ from the series
    drawn (a series that draws nothing must not be in the legend), a colour used twice, a linear axis over
    more than two decades. Call it before saving (tests wrap Figure.savefig)."""
    fig.canvas.draw()
    out = []
    for i, ax in enumerate(fig.axes):
        handles, labels = ax.get_legend_handles_labels()
        if not ax.axison or not (handles or ax.patches or ax.lines):
            continue
        where = f"axes {i} ({ax.get_ylabel() or ax.get_title() or 'unlabelled'})"
        out += [f"{where}: no {n} label" for n, t in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())) if not t]
        lo, hi = sorted(ax.get_xlim())
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
        if len(ticks) != len(set(ticks)):
            out.append(f"{where}: repeated x tick labels {ticks}")
        data = [_handle_data(h) for h in handles]
        drawn = [lab for lab, (_, xs, ys) in zip(labels, data, strict=True) if _drawn(xs, ys, ax)]
        legend = ax.get_legend()
        entries = [t.get_text() for t in legend.get_texts()] if legend else []
        if legend is None and len(drawn) > 1:
            out.append(f"{where}: {len(drawn)} series and no legend")
        elif legend is not None and sorted(entries) != sorted(drawn):
            out.append(f"{where}: legend {entries} but drawn {drawn}")
        colours = [tuple(round(c, 3) for c in col[:3]) for col, _, _ in data]
        if len(colours) != len(set(colours)):
            out.append(f"{where}: a colour is used by more than one series ({labels})")
        out += _decade_problem(ax, data, where)
    return out


def _decade_problem(ax, data, where: str) -> list[str]:
    import math

    ys = [y for _, _, yv in data for y in yv if math.isfinite(y) and y > 0]
    if ys and max(ys) / min(ys) > 100 and ax.get_yscale() != "log":
        return [f"{where}: values span {max(ys) / min(ys):.0f}x on a linear y axis"]
    return []
