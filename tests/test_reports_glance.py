"""Reports read at a glance (issue 34, items 11-13): one claim, one number (the Answer's pooled ratio names the
verdict row's own number and why the two differ); "no measurable difference" only within the equivalence
margin; the CLI's not-measured verdicts in one line; explain's shares in one
measure; compare says why its "vs rounded inputs" column equals the candidate's."""

from __future__ import annotations

import math

from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.reporting.verdicts import Estimate, difference_words

runner = CliRunner()


def test_no_measurable_difference_only_where_the_interval_lies_within_the_margin():
    """FA4 FP8 against FA3's FP8 path, [0.967, 1.57], is inconclusive in words; [0.95, 1.04] is no difference."""
    wide, narrow = Estimate(1.23, 0.967, 1.57, 6, "g"), Estimate(1.0, 0.95, 1.04, 6, "g")
    assert difference_words(wide) == "inconclusive: between 3% less and 57% more"
    assert difference_words(narrow) == "no measurable difference (within 10% either way)"
    assert difference_words(Estimate(1.3, 1.2, 1.5, 6, "g")) == "30% more"
    assert difference_words(Estimate(0.7, 0.5, 0.8, 6, "g")) == "30% less"
    assert difference_words(Estimate(1.0, math.nan, math.nan, 1, "g")) == "too few values to say"


def _modern_finding(name: str, est: float, iv: tuple[float, float], status: str) -> dict:
    return {"id": f"modern_{name}_vs_fa3_fp8", "status": status, "estimate": est, "interval": list(iv), "n": 6,
            "measured": f"flash:{name} / flash:fa3-fp8: {est:.3g}x [{iv[0]:.3g}, {iv[1]:.3g}] (n=6)"}  # fmt: skip


def test_the_modern_answer_calls_a_wide_interval_inconclusive_with_its_range():
    from flashcheck.questions.modern.answer import _in_short, _versus

    by = {f["id"]: f for f in (_modern_finding("fa4-fp8", 1.23, (0.967, 1.57), "inconclusive"),
                               _modern_finding("sage2-hopper", 1.0, (0.95, 1.04), "inconclusive"))}  # fmt: skip
    short = _in_short(by)
    assert "fa4-fp8 against FA3's FP8 path is inconclusive: between 3% less and 57% more" in short
    assert "sage2-hopper shows no measurable difference from FA3's FP8 path (within 10%)" in short
    assert "fa4-fp8 shows no measurable difference" not in short
    clauses = _versus(by, ("flash:fa4-fp8", "flash:sage2-hopper"))
    assert any(c.startswith("FA4's FP8 path (fa4-fp8) is inconclusive: between 3% less and 57% more") for c in clauses)
    assert any(
        "on Hopper (H100, sm90: FP22 accumulator) (sage2-hopper) shows no measurable difference (within 10% "
        "either way)" in c
        for c in clauses
    )  # the report says the GPU


def _mixed_points(ratios_by_length: dict[int, list[float]]):
    from flashcheck.questions.paper.findings import MIXED
    from flashcheck.study.points import Point

    out = []
    for length, ratios in ratios_by_length.items():
        base = tuple(1e-3 for _ in ratios)
        vals = tuple(r * 1e-3 for r in ratios)
        out.append(Point(MIXED, length, 64, (16, 16), "normal", tuple(range(len(ratios))), vals, vals, base, base,
                         "standard:bf16-mixed"))  # fmt: skip
    return out


def test_the_answer_names_the_verdict_rows_number_and_why_it_differs_from_the_pooled_one():
    """quick's case: pooled over 512-8192 (n=15) against the row at L=8192 (n=3); both numbers in the sentence,
    the row's as the row prints it, and 'inconclusive: between' where the pooled interval is wider than 10%."""
    from flashcheck.questions.paper.answer import _real
    from flashcheck.study.points import ratio_text

    pts = _mixed_points({512: [0.8, 0.9, 1.1], 2048: [0.85, 1.0, 1.2], 8192: [0.95, 1.05, 1.15]})
    said = _real(pts, {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}})
    row = ratio_text(pts[-1].ratio_estimate())
    assert said.startswith("Inconclusive for real kernels") and "pooled over lengths 512-8192" in said
    assert "(n=9)" in said and f"L=8192 (its 3 values, not the 9 pooled): {row}, inconclusive" in said
    assert "between" in said and "less and" in said
    tight = _mixed_points({512: [0.99, 1.0, 1.01, 1.0], 8192: [1.0, 1.01, 0.99, 1.0]})
    said = _real(tight, {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}})
    assert said.startswith("No measurable difference for real kernels") and "within 10% either way" in said
    one = _mixed_points({1024: [0.9, 1.0, 1.1]})  # one length: the pooled number is the row's, said once
    assert "verdict row" not in _real(one, {"flash_vs_baseline_bf16_mixed": {"status": "inconclusive"}})


def test_the_cli_lists_the_questions_not_measured_in_one_line(capsys):
    from flashcheck.cli.study import _print_findings

    gone = [{"id": f"modern_sage{i}_vs_fa3_fp8", "measured": "not measured in this study", "status": "not measured",
             "holds": None} for i in range(3)]  # fmt: skip
    summary = {
        "findings": [{"id": "br_no_effect", "measured": "2 of 2 pairs", "status": "structural", "holds": True}, *gone],
        "skipped": [],
        "failed": 0,
    }
    _print_findings(summary, None, "out")
    lines = capsys.readouterr().out.splitlines()
    assert "br_no_effect: structural — 2 of 2 pairs" in lines
    assert not any(": not measured —" in line for line in lines)
    listed = [line for line in lines if line.startswith("not measured by this study")]
    assert listed == ["not measured by this study (3): modern_sage0_vs_fa3_fp8, modern_sage1_vs_fa3_fp8, "
                      "modern_sage2_vs_fa3_fp8"]  # fmt: skip


def test_explain_names_the_dominant_stage_with_its_own_share_first(tmp_path):
    """bf16-mixed: input dominates (raising it removes the most); the line gives input's share alone before
    output's, in the same measure (was "output rounding alone explains 45%" first, then input as dominant)."""
    res = runner.invoke(app, ["explain", "--seq-len", "64", "--heads", "1", "--head-dim", "16", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "dominant stage" in x)
    assert "explains" not in line
    dom = line.split("removes the most): ", 1)[1].split(",", 1)[0]
    assert f"{dom}, which alone (the other stages FP64) gives " in line
    if dom != "output":
        assert line.index("which alone") < line.index("output rounding alone gives")


def test_compare_says_why_the_rounded_inputs_column_equals_the_candidate(tmp_path):
    res = runner.invoke(app, ["compare", "--preset", "fa4-fp8", "--seq-len", "128", "--heads", "1"])
    assert res.exit_code in (0, 1), res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("vs FP64 of rounded inputs equals the candidate")]
    assert "quantises its fp8-e4m3 inputs inside the kernel" in line
    res = runner.invoke(app, ["compare", "--numerics", "bf16-mixed", "--seq-len", "128", "--heads", "1"])
    assert res.exit_code in (0, 1), res.output
    assert "rounded inputs equals" not in res.output  # bf16 inputs: the column differs, nothing to explain


def test_the_conclusion_names_only_the_kernels_it_measured():
    """quick measures fa4-fp8 and fa4-fp4 of the FP8/FP4 question: its sentence ends with them, not with
    'sage3-fp4 not measured' and 'The stage that causes it ...: not measured'."""
    from flashcheck.questions.modern.findings import modern_sentences

    def f(fid: str, status: str, measured: str = "not measured in this study") -> dict:
        return {"id": fid, "status": status, "measured": measured, "claim": fid}

    found = [
        f("modern_fa4-fp8_vs_fa3_fp8", "inconclusive", "flash:fa4-fp8 / flash:fa3-fp8: 1.23x"),
        f("modern_fa4-fp4_vs_fa3_fp8", "does not hold", "flash:fa4-fp4 / flash:fa3-fp8: 3.67x"),
        f("modern_sage3-fp4_vs_fa3_fp8", "not measured"),
        f("modern_fa4-fp8_dominant_stage", "not measured"),
    ]
    (text,) = [t for t, section in modern_sentences(found) if section == "modern_lowp"]
    assert text.endswith("fa4-fp4 flash:fa4-fp4 / flash:fa3-fp8: 3.67x (does not hold).")
    assert "not measured" not in text
