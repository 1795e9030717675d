"""Figure helpers shared by every report: one colour/marker scheme, axes labelled with units, no colour
reused within one axes, matplotlib imported lazily (reports work without it, minus figures)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from pathlib import Path

from flashcheck.core.fileio import atomic_target, make_folder

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
DPI = 110  # of the saved figures
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
def figure(
    path: str | Path, *, ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (7.0, 4.0)
) -> Iterator[tuple]:
    """(fig, axes) to draw on, each panel `size` inches; saved to `path` (folders made) and closed on exit.
    axes is one Axes for one panel, else a list (row by row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # drawn at the saved DPI: the layout, the tight box and the image share one renderer and its text caches
    figsize = (size[0] * ncols, size[1] * nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, dpi=DPI)
    flat = [ax for row in axes for ax in row]
    try:
        yield fig, flat[0] if len(flat) == 1 else flat
        for ax in fig.axes:
            if not mark_empty(ax):
                _readable_log_ticks(ax)
        fig.tight_layout()
        _place_below(fig)
        box = _tight_box(fig)
        make_folder(Path(path).parent, "a report's figures folder")
        with atomic_target(path) as tmp:  # never written through a link at `path` (LinkRefused)
            # legends placed outside the axes stay in; PNG level 3 costs 1% in size, a third of the encoding
            png = {"pil_kwargs": {"compress_level": 3}} if Path(path).suffix.lower() == ".png" else {}
            fig.set_layout_engine(
                None
            )  # laid out: tight_layout left a placeholder engine, for which savefig draws again
            fig.savefig(tmp, dpi=DPI, bbox_inches=box, **png)
    finally:
        plt.close(fig)


NOT_MEASURED = "not measured yet"
_BELOW = "_flashcheck_below"  # a legend's mark: figure() moves it under its axes' lowest text once laid out


def legend_below(ax, ncol: int = 2, fontsize: float = 7) -> None:
    """The legend under the axes, never over the data: placed once the figure is laid out (figure()) just under
    the axes' lowest text (rotated tick labels, the x label), whatever their height."""
    legend = ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(0, -0.2), ncol=ncol)
    setattr(legend, _BELOW, True)


def _tight_box(fig):
    """The box savefig(bbox_inches="tight") would save, in inches, padded as it pads, from the layout at hand
    (tight_layout's, and _place_below's draw where a legend goes under its axes): savefig, given it, does not
    draw the figure once more to find it (same PNG bytes, tests/test_figures_save.py)."""
    import matplotlib

    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(matplotlib.rcParams["savefig.pad_inches"])


def _place_below(fig) -> None:
    """Move each legend_below legend to just under its axes' x tick labels and x label (after tight_layout, so
    the axes no longer move)."""
    legends = [(ax, ax.get_legend()) for ax in fig.axes if getattr(ax.get_legend(), _BELOW, False)]
    if not legends:
        return
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax, legend in legends:
        texts = [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True), ax.xaxis.label]
        bottoms = [t.get_window_extent(renderer).y0 for t in texts if t.get_visible() and t.get_text()]
        low = min([*bottoms, ax.get_window_extent(renderer).y0])
        y = ax.transAxes.inverted().transform((0, low - 4))[1]  # 4 pixels under the lowest text
        legend.set_bbox_to_anchor((0, y), transform=ax.transAxes)


def mark_empty(ax) -> bool:
    """A panel with no point to draw (a study still writing: no record of it yet) says NOT_MEASURED on linear
    axes: matplotlib refuses to lay out a log axis without a positive value. True where it was empty."""
    lim = ax.dataLim
    bounds = (lim.x0, lim.x1, lim.y0, lim.y1)
    empty = not all(math.isfinite(v) for v in bounds)
    empty = empty or (ax.get_xscale() == "log" and lim.x1 <= 0) or (ax.get_yscale() == "log" and lim.y1 <= 0)
    if not empty or not ax.axison:
        return False
    if ax.get_legend() is not None:  # entries for series that draw nothing
        ax.get_legend().remove()
    ax.set_xscale("linear")
    ax.set_yscale("linear")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, NOT_MEASURED, transform=ax.transAxes, ha="center", va="center", color="#666666")
    return True


def log10_axis(ax, which: str = "x") -> None:
    """A base-10 log axis labelled at 1, 2 and 5 times each power of ten only: matplotlib labels the minor ticks
    of an axis spanning less than a decade, and 3x10^-4 beside 4x10^-4 pile up (figure_problems reports it)."""
    from matplotlib.ticker import LogLocator, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_minor_formatter(NullFormatter())
    if ax.has_data():  # drawn already: widen a span narrower than two of those ticks out to them (else matplotlib
        ax.autoscale_view()  # falls back to linear ticks, 1.25x10^-3 beside 1.3x10^-3, piled up)
        get, put = (ax.get_xlim, ax.set_xlim) if which == "x" else (ax.get_ylim, ax.set_ylim)
        lo, hi = sorted(get())
        if lo > 0 and math.isfinite(hi):
            put(_tick125(lo, down=True), _tick125(hi, down=False))


def _readable_log_ticks(ax) -> None:
    """log10_axis on each base-10 log axis of `ax` still on matplotlib's default ticks that spans under three
    decades: there matplotlib labels minor ticks, and measured data (times, losses) put 3x10^-4 over 4x10^-4
    on one run and not the next (the tiny study's cost figure, CI 2026-12-07). Then every log axis's default
    labels as plain text (_plain_log_labels)."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator

    for which, axis, lim in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim())):
        lo, hi = sorted(lim)
        if axis.get_scale() != "log" or getattr(axis.get_transform(), "base", 10) != 10 or not lo > 0:
            continue
        loc = axis.get_major_locator()
        subs = getattr(loc, "_subs", None)  # LogLocator's own default: majors at 10^k only
        default = type(loc) is LogLocator and not isinstance(subs, str) and [float(v) for v in subs] == [1.0]
        default = default and type(axis.get_minor_formatter()) is LogFormatterSciNotation
        if default and math.isfinite(hi) and math.log10(hi / lo) < 3:
            log10_axis(ax, which)
    for axis in (ax.xaxis, ax.yaxis):
        _plain_log_labels(axis)


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def plain_log_label(label: str) -> str:
    """One of matplotlib's log tick labels, "$\\mathdefault{2\\times10^{-4}}$", as the plain text it draws,
    "2\u00d710\u207b\u2074" (a leading minus as U+2212, as mathtext draws it); a label it cannot read, as it was."""
    import re

    m = re.fullmatch(r"\$\\mathdefault\{(.*)\}\$", label)
    if m is None:
        return label
    body = re.sub(r"\^\{(-?\d+)\}", lambda e: e[1].translate(_SUPERSCRIPT), m[1].replace(r"\times", "\u00d7"))
    return label if re.search(r"[\\{}^$]", body) else body.replace("-", "\u2212")


@functools.cache
def _plain_formatter_class() -> type:
    """matplotlib's LogFormatterSciNotation, its labels as plain_log_label writes them."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLogFormatter(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_log_label(super().__call__(x, pos))

    return PlainLogFormatter


def _plain_log_labels(axis) -> None:
    """`axis`'s default log tick labels (major and minor) drawn as plain text (plain_log_label), not mathtext:
    the same glyphs in the same font, without mathtext's parse (~20 ms a label, a new parser per figure: a fifth
    of a figure's CPU, benchmarks/bench_figures.py)."""
    from matplotlib.ticker import LogFormatterSciNotation

    for minor in (False, True):
        fmt = axis.get_minor_formatter() if minor else axis.get_major_formatter()
        if type(fmt) is LogFormatterSciNotation:  # the scale's own formatter, its state (base, sublabels) kept
            plain = _plain_formatter_class().__new__(_plain_formatter_class())
            plain.__dict__.update(fmt.__dict__)
            (axis.set_minor_formatter if minor else axis.set_major_formatter)(plain)


def _tick125(v: float, down: bool) -> float:
    """The nearest of 1, 2, 5 x 10^k at or below (down) / above `v` (> 0)."""
    k = math.floor(math.log10(v))
    ticks = [m * 10.0**e for e in (k - 1, k, k + 1) for m in (1, 2, 5)]
    return max(t for t in ticks if t <= v) if down else min(t for t in ticks if t >= v)


def label_axes(ax, *, x: str, y: str, x_unit: str = "", y_unit: str = "") -> None:
    """Axis labels with units in brackets ("sequence length [tokens]")."""
    ax.set_xlabel(f"{x} [{x_unit}]" if x_unit else x)
    ax.set_ylabel(f"{y} [{y_unit}]" if y_unit else y)


def _handle_data(handle) -> tuple[tuple, list[float], list[float]]:
    """(rgba colour, x values, y values) of a legend handle: a line, an error-bar or bar container, a scatter."""
    from matplotlib.colors import to_rgba

    if hasattr(handle, "patches"):  # bars
        rects = list(handle.patches)
        colour = to_rgba(rects[0].get_facecolor()) if rects else (0, 0, 0, 0)
        return colour, [r.get_x() for r in rects], [r.get_height() for r in rects]
    line = handle.lines[0] if hasattr(handle, "lines") and isinstance(handle.lines, tuple) else handle
    if hasattr(line, "get_ydata"):
        return to_rgba(line.get_color()), list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))
    if _is_scatter(handle):  # its points; its colour the face's, else the edge's (a hollow marker)
        faces, edges = handle.get_facecolor(), handle.get_edgecolor()
        colour = to_rgba(faces[0]) if len(faces) else to_rgba(edges[0]) if len(edges) else (0, 0, 0, 0)
        pts = [tuple(map(float, o)) for o in handle.get_offsets()]
        return colour, [x for x, _ in pts], [y for _, y in pts]
    if hasattr(handle, "get_height") and hasattr(handle, "get_y"):  # a shaded band (axhspan): its y extent
        return to_rgba(handle.get_facecolor()), [], [handle.get_y(), handle.get_y() + handle.get_height()]
    return to_rgba(handle.get_facecolor()[0]), [], []


def _style(handle) -> tuple:
    """What tells a series apart: (rgb, marker, filled) of its line or scatter."""
    data_line = handle.lines[0] if hasattr(handle, "lines") and isinstance(handle.lines, tuple) else handle
    colour = tuple(round(c, 3) for c in _handle_data(handle)[0][:3])
    if hasattr(data_line, "get_marker"):
        marker, face = str(data_line.get_marker()), data_line.get_markerfacecolor()
        return colour, marker, str(face) != "none", data_line.get_linestyle()
    if _is_scatter(handle):
        paths = handle.get_paths()
        shape = tuple(map(tuple, paths[0].vertices.round(3))) if len(paths) else ()
        return colour, shape, len(handle.get_facecolor()) > 0, ""
    return colour, "", True, ""


def _is_scatter(artist) -> bool:
    from matplotlib.collections import PathCollection

    return isinstance(artist, PathCollection)


def _has_markers(artist) -> bool:
    if _is_scatter(artist):
        return len(artist.get_offsets()) > 0 and len(artist.get_paths()) > 0
    if not hasattr(artist, "get_xdata"):
        return False  # a filled area, a bar: no markers
    marker = artist.get_marker() if hasattr(artist, "get_marker") else None
    return marker not in (None, "None", "none", "", " ") and len(artist.get_xdata()) > 0


def _drawn(xs: list[float], ys: list[float], ax) -> bool:
    """Whether some point is visible: finite, and positive on a log axis."""
    import math

    def ok(v: float, scale: str) -> bool:
        return math.isfinite(v) and (scale != "log" or v > 0)

    if not xs:
        return any(ok(y, ax.get_yscale()) for y in ys)
    return any(ok(x, ax.get_xscale()) and ok(y, ax.get_yscale()) for x, y in zip(xs, ys, strict=False))


MAX_AT_ONE_X = 8  # series whose points share one x value that a reader can still tell apart


def figure_problems(fig) -> list[str]:
    """What would make a figure misleading, one line per problem ([] when none), for every axes that draws
    labelled series: a missing axis label, repeated tick labels, legend entries that differ from the series
    drawn (a series that draws nothing must not be in the legend), two series with the same colour, marker,
    fill and line style, more than MAX_AT_ONE_X series with a point at one x, markers in several styles with
    no legend entry, a linear axis over more than two decades, tick labels drawn over one another, a legend
    drawn over data (a point, a line or a bar of the axes under its box). Call it before saving (tests wrap
    Figure.savefig)."""
    fig.draw_without_rendering()  # the layout (text extents) without rasterising every artist
    renderer = fig.canvas.get_renderer()
    out = []
    for i, ax in enumerate(fig.axes):
        handles, labels = ax.get_legend_handles_labels()
        if not ax.axison or not (handles or ax.patches or ax.lines or any(map(_is_scatter, ax.collections))):
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
        styles = [_style(h) for h in handles]
        twins = sorted({lab for lab, st in zip(labels, styles, strict=True) if styles.count(st) > 1})
        if twins:
            out.append(f"{where}: one colour and marker for more than one series ({twins})")
        out += _crowded_x(ax, labels, data, where) + _unlegended_markers(ax, handles, where)
        out += _decade_problem(ax, data, where) + _overlapping_ticks(ax, renderer, where)
        out += _legend_over_data(ax, renderer, where)
    return out


def _data_points(ax):
    """The display coordinates of what an axes draws from data: its lines' points and points along their
    segments (every ~4 pixels), scatter points, error-bar segments and bars' corners and centres; reference
    lines and bands drawn in axes coordinates (axhline, axhspan) are not data."""
    import itertools

    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Rectangle

    data = ax.transData
    out = []

    def along(xy):
        for a, b in itertools.pairwise(xy):
            steps = int(min(200, max(1, np.hypot(*(b - a)) // 4)))
            out.extend(a + (b - a) * t for t in np.linspace(0, 1, steps + 1))
        if len(xy) == 1:
            out.append(xy[0])

    for line in ax.lines:
        if line.get_visible() and line.get_transform() == data:
            xy = data.transform(np.asarray(line.get_xydata(), dtype=float))
            xy = xy[np.isfinite(xy).all(axis=1)]
            if line.get_linestyle() in ("None", "none", "", " "):
                out.extend(xy)
            else:
                along(xy)
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if _is_scatter(coll) and coll.get_offset_transform() == data:
            out.extend(data.transform(np.asarray(coll.get_offsets(), dtype=float)))
        elif isinstance(coll, LineCollection) and coll.get_transform() == data:
            for seg in coll.get_segments():
                along(data.transform(np.asarray(seg, dtype=float)))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_data_transform() == data:
            x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
            out.extend(data.transform([(x, y + h), (x + w, y + h), (x + w / 2, y + h), (x + w / 2, y + h / 2)]))
    pts = np.asarray(out, dtype=float).reshape(-1, 2)
    return pts[np.isfinite(pts).all(axis=1)]


def _legend_over_data(ax, renderer, where: str) -> list[str]:
    """A legend whose box covers drawn data (a point, a line, a bar of the axes under it) or any text of the
    figure (tick labels, axis labels, titles): a reader cannot see what lies under it."""
    from matplotlib.patches import Rectangle

    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return []
    box = legend.get_window_extent(renderer)
    frame = ax.get_window_extent(renderer)
    pts = _data_points(ax)
    inside = pts[(pts[:, 0] >= frame.x0) & (pts[:, 0] <= frame.x1) & (pts[:, 1] >= frame.y0) & (pts[:, 1] <= frame.y1)]
    under = int(((inside[:, 0] > box.x0) & (inside[:, 0] < box.x1) & (inside[:, 1] > box.y0)
                 & (inside[:, 1] < box.y1)).sum())  # fmt: skip
    from matplotlib.transforms import Bbox

    for p in ax.patches:  # a bar: the part of it inside the axes
        if isinstance(p, Rectangle) and p.get_visible() and p.get_data_transform() == ax.transData:
            under += _meet(Bbox.intersection(p.get_window_extent(renderer), frame), box)
    out = [f"{where}: the legend covers data ({under} drawn point(s) or bar(s) under its box)"] if under else []
    texts = [t for a in legend.figure.axes for t in _texts(a)] + list(legend.figure.texts)
    hidden = [t.get_text() for t in texts if t.get_visible() and t.get_text().strip()
              and _meet(t.get_window_extent(renderer), box)]  # fmt: skip
    if hidden:
        more = f" and {len(hidden) - 1} more" if len(hidden) > 1 else ""
        out.append(f"{where}: the legend covers text {hidden[0]!r}{more}")
    return out


def _texts(ax) -> list:
    """An axes's tick labels, axis labels and titles."""
    ticks = [*ax.get_xticklabels(), *ax.get_yticklabels(), *ax.get_xticklabels(minor=True),
             *ax.get_yticklabels(minor=True)]  # fmt: skip
    return [*ticks, ax.xaxis.label, ax.yaxis.label, ax.title, ax._left_title, ax._right_title]


def _meet(a, b) -> bool:
    """Whether two display boxes overlap by more than a pixel each way (None: no box)."""
    return (
        a is not None
        and b is not None
        and min(a.x1, b.x1) - max(a.x0, b.x0) > 1
        and min(a.y1, b.y1) - max(a.y0, b.y0) > 1
    )


def _overlapping_ticks(ax, renderer, where: str) -> list[str]:
    """Tick labels of one axis whose text boxes overlap (e.g. 45 rotated policy names on a 7-inch axis)."""
    out = []
    for at, (name, axis, limits) in enumerate((("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim()))):
        lo, hi = sorted(limits)
        labels = [*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)]  # a log axis labels minor ticks too
        shown = [t for t in labels if t.get_visible() and t.get_text() and lo <= t.get_position()[at] <= hi]
        boxes = [_text_box(t, renderer) for t in shown]
        hits = [(a, b) for i, a in enumerate(shown) for j, b in enumerate(shown[i + 1 :], i + 1)
                if _boxes_overlap(boxes[i], boxes[j])]  # fmt: skip
        if hits:
            first = hits[0]
            out.append(f"{where}: {len(hits)} pairs of {name} tick labels overlap "
                       f"(first {first[0].get_text()!r} and {first[1].get_text()!r})")  # fmt: skip
    return out


def _text_box(text, renderer) -> tuple[float, float, float, float, float]:
    """(centre x, centre y, width, height, angle in radians) of a text's rotated box, in pixels: the centre of
    its drawn (axis-aligned) extent, the size of the same text unrotated."""
    import math

    drawn = text.get_window_extent(renderer)
    angle = text.get_rotation()
    text.set_rotation(0)
    try:
        flat = text.get_window_extent(renderer)
    finally:
        text.set_rotation(angle)
    cx, cy = (drawn.x0 + drawn.x1) / 2, (drawn.y0 + drawn.y1) / 2
    return cx, cy, flat.width, flat.height, math.radians(angle)


def _boxes_overlap(a: tuple, b: tuple, gap: float = 0.3) -> bool:
    """Whether two boxes of one angle (the tick labels of one axis) overlap or come closer than `gap` times
    the text's height (labels closer than that read as one): their centres' offset, turned into the boxes' own
    frame, is under half their summed sizes plus the gap in both directions."""
    import math

    dx, dy = b[0] - a[0], b[1] - a[1]
    cos, sin = math.cos(a[4]), math.sin(a[4])
    along, across = dx * cos + dy * sin, -dx * sin + dy * cos
    room = gap * min(a[3], b[3])
    return abs(along) < (a[2] + b[2]) / 2 + room and abs(across) < (a[3] + b[3]) / 2 + room


def _crowded_x(ax, labels: list[str], data, where: str) -> list[str]:
    """More than MAX_AT_ONE_X series with a visible point at one x value (bars excluded)."""
    at: dict[float, set[str]] = {}
    for lab, (_, xs, ys) in zip(labels, data, strict=True):
        for x, y in zip(xs, ys, strict=False):
            if _drawn([x], [y], ax):
                at.setdefault(round(float(x), 9), set()).add(lab)
    worst = max(at.items(), key=lambda kv: len(kv[1]), default=(0.0, set()))
    if len(worst[1]) > MAX_AT_ONE_X:
        return [f"{where}: {len(worst[1])} series at x = {worst[0]:g} (at most {MAX_AT_ONE_X} can be told apart)"]
    return []


def _unlegended_markers(ax, handles, where: str) -> list[str]:
    """Markers in more than one style, some of them in no legend entry (a reader cannot tell what they mean)."""
    legended = set()
    for h in handles:
        legended |= {id(a) for a in (h.get_children() if hasattr(h, "get_children") and hasattr(h, "lines") else [])}
        legended.add(id(h))
    marked = [a for a in [*ax.lines, *ax.collections] if _has_markers(a)]
    bare = [a for a in marked if id(a) not in legended]
    if bare and len({_style(a) for a in marked}) > 1:
        return [f"{where}: {len(bare)} marker series with no legend entry"]
    return []


def _decade_problem(ax, data, where: str) -> list[str]:
    """Values over more than two decades on a linear axis: the y axis's, or the x axis's where the categories
    are on y (horizontal error bars: fixed y ticks, free x ticks)."""
    import math

    from matplotlib.ticker import FixedLocator

    across = isinstance(ax.yaxis.get_major_locator(), FixedLocator) and not isinstance(
        ax.xaxis.get_major_locator(), FixedLocator
    )
    name, scale = ("x", ax.get_xscale()) if across else ("y", ax.get_yscale())
    vals = [v for _, xv, yv in data for v in (xv if across else yv) if math.isfinite(v) and v > 0]
    if vals and max(vals) / min(vals) > 100 and scale not in ("log", "symlog"):
        return [f"{where}: values span {max(vals) / min(vals):.0f}x on a linear {name} axis"]
    return []
