"""Figures read at a glance (issue 34, item 10): reporting.figures.figure_problems reports tick labels drawn over
one another; the modern study's stage figures draw one panel per preset with a row per variant (were ~45 and ~30
rotated x labels piled on one axis); every preset's figures pass figure_problems (the tiny and quick presets'
real figures are audited by their session and module fixtures, tests/conftest.py and test_report_first.py; the
others here from synthetic records, one figure per distinct sweep layout)."""

from __future__ import annotations

import zlib

import pytest
from tests.helpers import audited_figures

from flashcheck.questions.modern.presets import STAGE_PRESETS, modern_sweeps
from flashcheck.study.cases import CaseRecord, expand
from flashcheck.study.config import preset
from flashcheck.study.registry import presets

pytest.importorskip("matplotlib")
KEYS = ("max_abs", "mean_abs", "std", "rmse", "rel_l2")


def _axes(width: float = 7.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 4))
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    return fig, ax


def test_figure_problems_catches_tick_labels_drawn_over_one_another():
    """45 rotated policy names on a 7-inch axis (the old modern_stages.png), 2x10^-3 .. 6x10^-3 labelled on a
    log axis within one decade, 30 y labels on a 4-inch axis: each reported; the same labels with room are not."""
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import figure_problems

    names = [f"fa4-fp8,{s}=fp64" for s in range(45)]
    fig, ax = _axes()
    ax.plot(range(45), [1.0] * 45, "o", label="flash")
    ax.set_xticks(range(45), names, rotation=30, ha="right")
    ax.legend()
    (problem,) = figure_problems(fig)
    assert "pairs of x tick labels overlap" in problem and "'fa4-fp8,0=fp64' and 'fa4-fp8,1=fp64'" in problem
    plt.close(fig)
    fig, ax = _axes()
    ax.plot(range(4), [1.0] * 4, "o", label="flash")
    ax.set_xticks(range(4), names[:4], rotation=30, ha="right")
    ax.legend()
    assert figure_problems(fig) == []
    plt.close(fig)
    fig, ax = _axes(3.0)
    ax.plot([1.1e-3, 6.5e-3], [1, 2], "o", label="flash")
    ax.set_xscale("log")
    ax.legend()
    assert any("x tick labels overlap" in p for p in figure_problems(fig))
    plt.close(fig)
    fig, ax = _axes()
    ax.plot([1.0] * 30, range(30), "o", label="flash")
    ax.set_yticks(range(30), [f"variant {i}" for i in range(30)], fontsize=12)
    ax.legend()
    assert any("y tick labels overlap" in p for p in figure_problems(fig))
    plt.close(fig)


def _records(config) -> dict[str, CaseRecord]:
    """A record for every case of `config` with made-up errors (1e-3 to 3e-3, fixed by the case's id): the
    figures' layout depends on the sweeps, not on the numbers."""
    out = {}
    for c in expand(config):
        h = zlib.crc32(c.case_id.encode())
        errs = {k: 1e-3 * (1 + (h % 97) / 50) for k in KEYS}
        out[c.case_id] = CaseRecord(c.case_id, c, "ok", errs, dict(errs), 0.0, None, {})
    return out


def test_the_stage_figures_draw_one_panel_per_preset_with_a_row_per_variant(tmp_path):
    from flashcheck.study.config import StudyConfig
    from flashcheck.study.figures import draw_figures

    sweeps = tuple(sw for sw in modern_sweeps((1024,), (0, 1, 2), 2) if sw.question in STAGE_PRESETS)
    cfg = StudyConfig(name="modern", sweeps=sweeps)
    with audited_figures(save=False) as seen:
        draw_figures(cfg, _records(cfg), tmp_path)
    assert sorted(name for name, _, _ in seen) == ["modern_sage_stages.png", "modern_stages.png"]
    for name, problems, ylabels in seen:
        assert problems == [], (name, problems)
        question = name.split(".")[0]
        assert len([y for y in ylabels if y]) == len(STAGE_PRESETS[question]), (name, ylabels)


def test_stage_panels_name_each_variant_in_words():
    from flashcheck.questions.modern.figures import stage_panels
    from flashcheck.study.points import Point

    def pt(policy: str, v: float) -> Point:
        return Point(f"flash:{policy}", 1024, 32, (128, 64), "normal", (0, 1), (v, v * 1.1), (v, v), (), (), None)

    pts = [pt("sage1", 2e-3), pt("sage1,input=fp64", 1e-3), pt("sage1,exact_inputs=qk", 1.5e-3)]
    (panel,) = stage_panels("modern_sage_stages", pts)
    assert panel.title == "sage1" and [label for label, _ in panel.rows] == [
        "as is",
        "input raised to FP64",
        "input:qk removed",
    ]
    assert panel.reference == pytest.approx(pts[0].estimate().value)


def _layouts() -> dict[tuple, tuple[str, object]]:
    """One (preset, sweep) per distinct figure layout of the presets no session fixture runs (tiny: conftest's
    tiny_study_run; quick: test_report_first's quick_report): sweeps that differ only in their lengths or seeds
    draw the same categories (the lengths are numbers on a log axis), so the first preset's stands for them."""
    out: dict[tuple, tuple[str, object]] = {}
    for name in presets():
        if name in ("tiny", "quick"):
            continue
        for sw in preset(name).sweeps:
            key = (sw.question, sw.methods, sw.distributions, sw.blocks, sw.head_dims)  # lengths: ticks of one kind
            out.setdefault(key, (name, sw))
    return out


def test_every_presets_figures_pass_figure_problems(tmp_path):
    """As build_report draws them: the dims questions' and the error model's figures (tables_dims), then one
    per other question (study.figures)."""
    from flashcheck.questions.variants.tables import dims_sections
    from flashcheck.study.config import StudyConfig
    from flashcheck.study.figures import draw_figures

    problems, drawn = [], 0
    for i, (name, sw) in enumerate(_layouts().values()):
        cfg, folder = StudyConfig(name=name, sweeps=(sw,)), tmp_path / str(i)
        records = _records(cfg)
        with audited_figures(save=False) as seen:
            _, dims, _ = dims_sections(cfg, records, folder)
            draw_figures(cfg, records, folder / "figures", skip=frozenset(dims))
        problems += [(name, sw.question, fig, p) for fig, found, _ in seen for p in found]
        drawn += len(seen)
    assert drawn >= len(_layouts())
    assert not problems, "\n".join(map(str, problems))


def test_a_log_axis_within_one_decade_labels_no_minor_tick():
    """The guide's error_vs_time figure over less than a decade labelled 3x10^-4 and 4x10^-4 on top of one another
    (found by figure_problems in the tiny study); reporting.figures.log10_axis labels 1, 2, 5 x 10^k only."""
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import figure_problems, log10_axis

    fig, ax = _axes(4.0)
    ax.plot([1.5e-4, 9.0e-4], [1e-3, 2e-3], "o-", label="sdpa")
    ax.set_xscale("log")
    ax.legend()
    assert any("x tick labels overlap" in p for p in figure_problems(fig))
    log10_axis(ax, "x")
    assert figure_problems(fig) == []
    plt.close(fig)


def test_figure_problems_reads_a_shaded_band_in_the_legend():
    """A legend entry that is a patch (axhspan: one face colour, not one per item) is read, not a crash."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import figure_problems

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 2, 4], "o-", label="measured")
    ax.axhspan(3, 10, color="0.85", label="the paper's 3-10x")
    ax.set_xlabel("score")
    ax.set_ylabel("gain [x]")
    ax.legend()
    assert figure_problems(fig) == []
    plt.close(fig)


def test_a_log_axis_narrower_than_two_ticks_is_widened_not_labelled_linearly():
    """Timings 1.26-1.29 ms: matplotlib's fallback labelled 1.25x10^-3 beside 1.3x10^-3 (overlapping, CPU-speed
    dependent); log10_axis widens the span out to the 1-2-5 ticks around it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import figure_problems, log10_axis

    fig, ax = plt.subplots(figsize=(3, 2.5))
    ax.plot([1.26e-3, 1.29e-3], [0.0100, 0.0102], "o-", label="a")
    ax.plot([1.27e-3, 1.28e-3], [0.0110, 0.0105], "s-", label="b")
    log10_axis(ax, "x")
    log10_axis(ax, "y")
    ax.set_xlabel("time [s]")
    ax.set_ylabel("error")
    ax.legend()
    fig.canvas.draw()
    assert ax.get_xlim() == (1e-3, 2e-3) and figure_problems(fig) == []
    plt.close(fig)


def test_figure_problems_catches_a_legend_over_data_or_text():
    """A legend inside the axes over points, over a line between points, over bars, or below the axes over
    the rotated tick labels (boundary.png, explain.png, modern_fa4.png): each reported; legend_below, placed
    once the figure is laid out, covers nothing."""
    import matplotlib.pyplot as plt

    from flashcheck.reporting.figures import _place_below, figure_problems, legend_below

    def legend_problems(draw, place=None) -> list[str]:
        fig, ax = _axes()
        draw(ax)
        if place is None:
            legend_below(ax)
            fig.tight_layout()
            _place_below(fig)
        else:
            ax.legend(**place)
        try:
            return [p for p in figure_problems(fig) if "legend covers" in p]
        finally:
            plt.close(fig)

    def points(ax):  # in the lower right corner only
        ax.plot([8.6, 9], [0.2, 0.35], "o", label="a")
        ax.plot([8.8, 9.2], [0.3, 0.25], "s", label="b")
        ax.set_xlim(0, 9.5)
        ax.set_ylim(0, 5)

    def line(ax):  # its points at the ends; the middle of the line passes under the legend
        ax.plot([0, 10], [0, 10], label="a")
        ax.plot([0, 10], [1, 11], label="b")
        ax.set_xlim(0, 10)

    def bars(ax):
        ax.bar([0, 1, 2], [5, 5, 5], label="a")
        ax.bar([0.4, 1.4, 2.4], [5, 5, 5], width=0.4, label="b")

    def rotated(ax):
        ax.plot(range(4), [1, 2, 3, 4], "o", label="a")
        ax.plot(range(4), [2, 3, 4, 5], "s", label="b")
        ax.set_xticks(range(4), ["a long policy name"] * 3 + ["bf16-mixed,rescale_threshold=8"], rotation=30)

    assert legend_problems(points, {"loc": "upper left"}) == []  # nothing drawn there
    assert "drawn point(s) or bar(s) under its box" in legend_problems(points, {"loc": "lower right"})[0]
    assert legend_problems(line, {"loc": "center"})  # no point of the line's, the line itself
    assert legend_problems(bars, {"loc": "upper right"})
    assert "covers text" in legend_problems(rotated, {"loc": "upper left", "bbox_to_anchor": (0, -0.1)})[0]
    for draw in (points, line, bars, rotated):
        assert legend_problems(draw) == []


@pytest.mark.parametrize("args", [["--preset", "sage2"], ["--preset", "fa4-fp4"], ["--numerics", "fp64"]])
def test_explains_figure_passes_figure_problems(args, tmp_path):
    """explain.png: its legend covered the raised bars, its symlog axis printed 0 on 10^-5; an exact policy drew
    a legend of nothing."""
    from typer.testing import CliRunner

    from flashcheck.cli import app

    with audited_figures(save=False) as seen:
        res = CliRunner().invoke(app, ["explain", *args, "--seq-len", "64", "--heads", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert len(seen) == 1 and seen[0][1] == [], seen


@pytest.mark.parametrize("span", [(1.2e-4, 4.4e-3), (3.1e-4, 4.2e-4), (2e-3, 9e-1)])
def test_a_plain_log_axis_of_measured_values_never_piles_its_labels(tmp_path, span):
    # reporting.figures.figure() gives every base-10 log axis on matplotlib's default ticks spanning under three
    # decades the 1, 2, 5 x 10^k labels of log10_axis: the minor labels 3x10^-4 and 4x10^-4 piled up on measured
    # times (the guide's cost figure, CI 2026-12-07), and any figure of times or losses may meet such a span
    from matplotlib.ticker import FuncFormatter

    from flashcheck.reporting.figures import figure, label_axes

    with audited_figures(save=False) as seen, figure(tmp_path / "f.png", ncols=2, size=(7.0, 3.0)) as (_, axes):
        ax, custom = axes
        for a in (ax, custom):
            a.plot([64, 128, 256], [span[0], (span[0] * span[1]) ** 0.5, span[1]], marker="o", label="t")
            a.set_yscale("log")
            label_axes(a, x="sequence length", y="time", x_unit="tokens", y_unit="s")
        custom.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))  # a figure's own choice is kept
    assert [problems for _, problems, _ in seen] == [[]], seen
    assert type(custom.yaxis.get_minor_formatter()) is FuncFormatter
    assert ax.get_ylim()[0] <= span[0] and ax.get_ylim()[1] >= span[1]
