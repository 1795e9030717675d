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
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def label_axes(ax, *, x: str, y: str, x_unit: str = "", y_unit: str = "") -> None:
    """Axis labels with units in brackets ("sequence length [tokens]")."""
    ax.set_xlabel(f"{x} [{x_unit}]" if x_unit else x)
    ax.set_ylabel(f"{y} [{y_unit}]" if y_unit else y)
