"""reporting.figures.figure() saves the PNG matplotlib's savefig(bbox_inches="tight") saves, byte for byte, from one
layout (savefig no longer draws the figure again to find the tight box: benchmarks/bench_figures.py, ~13% of a
figure's CPU time)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")


def _draw(axes, below: bool, log: bool) -> None:
    from flashcheck.reporting.figures import Styler, label_axes, legend_below

    for ax in axes:
        style = Styler()
        for s in range(4):
            ax.plot([64, 128, 256, 512], [1e-4 * (s + 1) * n for n in (1, 1.5, 2.5, 4)], **style(f"series {s}"))
        if log:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        label_axes(ax, x="sequence length", y="max |error|", x_unit="tokens")
        legend_below(ax) if below else ax.legend(fontsize=7)


@pytest.mark.parametrize("below, log", [(True, True), (False, True), (False, False)])
def test_figure_saves_the_bytes_of_a_tight_savefig(tmp_path, below, log):
    import matplotlib.pyplot as plt

    from flashcheck.reporting import figures as figs

    with figs.figure(tmp_path / "ours.png", ncols=2) as (_, axes):
        _draw(axes, below, log)
    fig, axes = plt.subplots(1, 2, figsize=(14.0, 4.0), squeeze=False, dpi=figs.DPI)
    _draw(list(axes[0]), below, log)
    for ax in fig.axes:
        figs._readable_log_ticks(ax)
    fig.tight_layout()
    figs._place_below(fig)
    fig.savefig(tmp_path / "plain.png", dpi=figs.DPI, bbox_inches="tight", pil_kwargs={"compress_level": 3})
    plt.close(fig)
    assert (tmp_path / "ours.png").read_bytes() == (tmp_path / "plain.png").read_bytes()
    assert fig.get_layout_engine() is not None  # matplotlib's own path kept tight_layout's placeholder engine


def _value(label: str) -> float:
    """The number a plain log tick label writes ("2×10⁻⁴", "−10¹", "1.25×2⁻³"), read back."""
    import re

    digits = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
    m = re.fullmatch(r"(−?)(?:([\d.]+)×)?(\d+)([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]*)", label)
    assert m, label
    power = int(m[4].translate(digits)) if m[4] else 1
    value = float(m[3]) ** power * (float(m[2]) if m[2] else 1.0)
    return -value if m[1] else value


@pytest.mark.parametrize("base", [10, 2])
def test_log_tick_labels_are_plain_text_for_the_same_numbers(base):
    """Every log tick label figure() draws is plain text (no mathtext parse, a fifth of a figure's CPU) naming the
    number matplotlib's own mathtext label names, for decades, 2x and 5x ticks, negative exponents and signs."""
    from matplotlib.ticker import LogFormatterSciNotation

    from flashcheck.reporting.figures import plain_log_label

    fmt = LogFormatterSciNotation(base=base, labelOnlyBase=False)
    fmt.create_dummy_axis()
    values = [sign * m * float(base) ** e for sign in (1, -1) for m in (1, 2, 5) for e in range(-12, 13)]
    for v in values:
        math_label = fmt(v)
        plain = plain_log_label(math_label)
        assert "$" not in plain and "\\" not in plain, (v, math_label, plain)
        assert _value(plain) == pytest.approx(v, rel=1e-6), (v, math_label, plain)  # %g: 6 digits
    assert plain_log_label(r"$\mathdefault{10^{-2.50}}$") == r"$\mathdefault{10^{-2.50}}$"  # unread: kept as it was


def test_a_figures_log_axes_draw_no_mathtext(tmp_path):
    import matplotlib.pyplot as plt

    from flashcheck.reporting import figures as figs

    with figs.figure(tmp_path / "f.png", ncols=2) as (fig, axes):
        _draw(axes, below=False, log=True)
    labels = [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels()]
    assert any("⁻" in t for t in labels) and any("²" in t or "⁹" in t for t in labels), labels
    assert not [t for t in labels if "$" in t], labels
    plt.close("all")
