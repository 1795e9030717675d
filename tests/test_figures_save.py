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
