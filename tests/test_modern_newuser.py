"""What a new user of `flashcheck study --preset modern` found, from synthetic points (no study run): figures
draw only panels with data and name the sink knobs that differ, tables show the inputs, the Answer answers the
modern questions first, not-measured verdicts come last, each row cites what applies to it, help lists modern."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from flashcheck.questions.modern.findings import PUBLISHED, modern_findings
from flashcheck.questions.modern.presets import FA2, FA3_FP8, FA4, SINK_METHODS, modern_sweeps
from flashcheck.questions.paper.findings import _br_finding
from flashcheck.study.config import StudyConfig
from flashcheck.study.report import verdict_rows

SINK_LABELS = ["forward", "reverse", "S=2^8", "reverse, S=2^8"]


def _pt(method: str, values: list[float], dist: str = "normal"):
    from flashcheck.study.points import Point

    nan = (math.nan,) * len(values)
    return Point(method, 1024, 32, (128, 128), dist, tuple(range(len(values))), tuple(values), tuple(values), nan,
                 nan, None)  # fmt: skip


def _sweep(question: str):
    return next(sw for sw in modern_sweeps((1024,), (0, 1, 2), 2) if sw.question == question)


def _points() -> dict:
    lowp = [_pt(m, [v * k, v * k * 1.1, v * k * 0.9], d) for m, v in ((FA3_FP8, 1.0), ("flash:fa4-fp8", 1.2),
            ("flash:fa4-fp4", 3.0)) for d, k in (("normal", 1.0), ("outliers", 2.0))]  # fmt: skip
    return {
        "modern_fa4": [_pt(FA2, [1.0, 2.0, 3.0]), _pt(FA4, [1.01, 2.0, 3.02])],
        "modern_lowp": lowp,
        "modern_sink": [
            _pt(m, [v, v * 1.1, v * 0.95], "sink:6")
            for m, v in zip(SINK_METHODS, (1.0, 0.35, 0.05, 0.045), strict=True)
        ],
    }


@pytest.fixture
def drawn(monkeypatch):
    """Every matplotlib figure saved while the test runs, with reporting.figures.figure_problems on it."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from flashcheck.reporting.figures import figure_problems

    seen, save = [], Figure.savefig

    def savefig(self, *a, **k):
        seen.append((self, figure_problems(self)))
        return save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def test_a_sweep_without_baseline_draws_one_panel_with_knob_labels_and_every_distribution(tmp_path, drawn):
    from flashcheck.study.figures import draw_question

    pts = _points()
    draw_question(_sweep("modern_sink"), pts["modern_sink"], tmp_path / "sink.png", "modern")
    draw_question(_sweep("modern_lowp"), pts["modern_lowp"], tmp_path / "lowp.png", "modern")
    (sink, sink_problems), (lowp, lowp_problems) = drawn
    assert sink_problems == [] and lowp_problems == []
    assert len(sink.axes) == 1 and len(lowp.axes) == 1  # no bare 0-1 ratio axes
    # the sink question draws its own figure (questions.modern.figures): each fix's MSE gain per sink score
    assert sink.axes[0].get_legend_handles_labels()[1] == ["reverse KV order, one sink key", "S = 2^8, one sink key"]
    assert sink.axes[0].get_xlabel() == "sink score Delta"
    assert "normal, outlier inputs" in lowp._suptitle.get_text()  # not "outliers inputs"
    assert sorted(lowp.axes[0].get_legend_handles_labels()[1]) == ["flash (normal inputs)", "flash (outlier inputs)"]


def test_policy_labels_keep_short_policies_and_shorten_knob_lists():
    from flashcheck.study.figures import policy_labels

    assert policy_labels([m.partition(":")[2] for m in SINK_METHODS]) == SINK_LABELS
    short = ["bf16-mixed", "fa4-bf16", "bf16-mixed,exp2_emu=10"]
    assert policy_labels(short) == short


def test_tables_show_the_inputs_only_where_a_sweep_has_several(monkeypatch):
    from flashcheck.study import report

    pts = _points()
    cfg = StudyConfig(name="modern", sweeps=(_sweep("modern_lowp"), _sweep("modern_fa4")))
    monkeypatch.setattr(report, "sweep_points", lambda sw, records: pts[sw.question])
    (_, lowp_head, lowp_rows), (_, fa4_head, _) = report._tables(cfg, {})
    assert lowp_head[:2] == ["method", "inputs"] and "inputs" not in fa4_head
    assert [r[1] for r in lowp_rows[:2]] == ["normal", "outliers"] and lowp_rows[0][0] == lowp_rows[1][0]


def test_the_answer_opens_with_the_modern_questions_and_not_measured_rows_come_last(tmp_path):
    from flashcheck.study.part import Study
    from flashcheck.study.report import _answer, report_parts

    pts = _points()
    found = [_br_finding({"modern_fa4": pts["modern_fa4"]}), *modern_findings(pts)]
    br = found[0]
    assert br["status"] == "not measured" and br["measured"].startswith("not measured by this sweep")
    study = Study(folder=tmp_path, config=StudyConfig(name="modern"), records={}, ok={}, points=pts, found=found)
    said = _answer(*report_parts(study))
    assert said[0].startswith("In short: FA4's bf16 kernel is as stable as FA2")
    assert said[1].startswith("FA4's bf16 kernel is as accurate") and not any("did not measure" in s for s in said)
    assert any(s.startswith("Against FA3's FP8 path") for s in said) and any("attention sink" in s for s in said)
    _, rows = verdict_rows(found)
    assert rows and "not measured" not in [r[-1] for r in rows]  # those are one line at the end (not_asked)


def test_each_row_cites_its_paper_and_the_sink_is_judged_against_the_band():
    by = {f["id"]: f for f in modern_findings(_points())}
    assert by["modern_fa4_bf16"]["paper"] == PUBLISHED["fa4"]
    for fid in ("modern_fa4-fp8_vs_fa3_fp8", "modern_fa4-fp4_vs_fa3_fp8"):
        assert by[fid]["paper"] == PUBLISHED["fp8"] and "FA3" in by[fid]["paper"]
    reverse, scale = by["modern_sink_reverse_d6"], by["modern_sink_static_scale_d6"]  # MSE ratios ~8x and ~400x
    assert 6 < reverse["estimate"] < 10 and reverse["status"] == "holds"
    assert scale["estimate"] > 100 and scale["status"] == "does not hold"
    assert scale["claim"].startswith("with a moderate sink (score 6") and "3-10x" in scale["claim"]


def test_study_help_lists_the_modern_preset():
    from flashcheck.cli import app

    res = CliRunner().invoke(app, ["study", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "modern" in res.output
