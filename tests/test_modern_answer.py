"""The modern study's Answer in words (questions.modern.answer), SageAttention beside its published accuracy, and the
sink swept over its score with the closed form of arXiv 2606.06521 checked against a tiny real sweep."""

from __future__ import annotations

import math

import torch

from flashcheck.core.inputs import InputSpec, make_qkv, sink_delta
from flashcheck.core.metrics import cos_sim, rel_l1
from flashcheck.questions.modern.answer import modern_answer
from flashcheck.questions.modern.findings import (
    SAGE_PUBLISHED,
    closed_form,
    modern_findings,
    published_finding,
    sage_published_rows,
    sink_findings,
)
from flashcheck.questions.modern.presets import FA2, FA3_FP8, FA4, FA4_EMU, SINK_METHODS
from flashcheck.study.cases import Case, CaseRecord, evaluate_group, expand_sweep, group_by_inputs
from flashcheck.study.config import Sweep
from flashcheck.study.points import Point, sweep_points
from flashcheck.study.report import not_asked, verdict_rows


def _pt(method: str, values: list[float], dist: str = "normal") -> Point:
    nan = (math.nan,) * len(values)
    return Point(method, 1024, 32, (128, 128), dist, tuple(range(len(values))), tuple(values), tuple(values), nan,
                 nan, None)  # fmt: skip


def _answer(fa4: float, fp4: float) -> list[str]:
    pts = {
        "modern_fa4": [
            _pt(FA2, [1.0, 2.0, 3.0]),
            _pt(FA4, [fa4, 2.0 * fa4 * 1.01, 3.0 * fa4]),
            _pt(FA4_EMU, [1.0, 2.01, 2.99]),
        ],
        "modern_lowp": [_pt(FA3_FP8, [1.0, 1.1, 0.9]), _pt("flash:fa4-fp4", [fp4, fp4 * 1.1 * 1.02, fp4 * 0.9])],
    }
    return modern_answer(modern_findings(pts))


def test_the_answer_is_words_from_the_verdicts_and_flips_with_them():
    good = _answer(fa4=1.01, fp4=3.0)
    assert good[0].startswith("In short: FA4's bf16 kernel is as stable as FA2 (within the 10% the verdict allows);")
    assert "fa4-fp4 deviates more" in good[0]
    assert good[1].startswith("FA4's bf16 kernel is as accurate as FA2 (error ratio FA4 / FA2 1.01x [")
    assert "its emulated exp2 changes nothing measurable (1x [" in good[1]
    assert "FA4's FP4 path (fa4-fp4) deviates 3x more (fa4-fp4 3" in good[2]
    bad = _answer(fa4=1.5, fp4=0.5)
    assert bad[0].startswith("In short: FA4's bf16 kernel is less stable than FA2 (over 10% more error);")
    assert "fa4-fp4 deviates less" in bad[0]
    assert bad[1].startswith("FA4's bf16 kernel deviates more than FA2 allows") and "1.5x [" in bad[1]
    assert "FA4's FP4 path (fa4-fp4) deviates less, 0.5x of its error" in bad[2]
    assert modern_answer([]) == []


def _sage_record(method: str, dist: str, seed: int, cos: float, l1: float) -> CaseRecord:
    kernel, _, policy = method.partition(":")
    case = Case(kernel, policy, "fa2", 128, 64, 1, 2, 1024, 32, False, dist, seed)
    errors = {"rel_l2": l1, "rmse": l1, "cos_sim": cos, "rel_l1": l1}
    return CaseRecord(case.case_id, case, "ok", errors, {}, 0.1, None, {})


def test_sage_rows_put_ours_beside_the_published_figure_and_the_verdict_follows_ours():
    cos_pub, l1_pub, _ = SAGE_PUBLISHED["flash:sage2-4b"]
    recs = [_sage_record("flash:sage2-4b", "captured:minilm", s, 0.998, l1_pub * f) for s, f in enumerate((0.5, 0.55,
            0.52))] + [_sage_record("flash:sage1", "normal", s, 0.99999, 0.01) for s in range(3)]  # fmt: skip
    header, rows = sage_published_rows({r.case_id: r for r in recs})
    assert header[2:4] == ["ours: cos-sim [95%]", "ours: relative L1 [95%]"]
    assert [r[:2] for r in rows] == [["flash:sage1", "normal"], ["flash:sage2-4b", "captured:minilm"]]
    assert rows[1][2].startswith("99.8000% [") and f"{cos_pub:.2%}" in rows[1][4] and "2411.10958" in rows[1][4]
    assert "2410.02367" in rows[0][4] and "not found" in rows[0][4]  # no figure invented where none was found
    (f,) = published_finding({r.case_id: r for r in recs})
    assert f["status"] == "holds" and math.isclose(f["estimate"], 0.523, rel_tol=0.02)
    worse = [_sage_record("flash:sage2-4b", "captured:minilm", s, 0.99, l1_pub * x) for s, x in enumerate((2, 2.2, 2))]
    assert published_finding({r.case_id: r for r in worse})[0]["status"] == "does not hold"
    assert sage_published_rows({}) == (header, [])
    fa3 = [_sage_record(FA3_FP8, "outliers", s, 0.999, 9.1e-3 * x) for s, x in enumerate((0.5, 0.52, 0.55))]
    (g,) = published_finding({r.case_id: r for r in fa3})
    assert g["id"] == "modern_fa3-fp8_published" and g["status"] == "holds" and "2407.08608" in g["paper"]


def test_not_measured_claims_leave_the_table_for_one_line():
    found = modern_findings({"modern_fa4": [_pt(FA2, [1.0, 2.0, 3.0]), _pt(FA4, [1.01, 2.0, 3.02])]})
    _, rows = verdict_rows(found)
    assert rows and all(r[-1] != "not measured" for r in rows)
    missing = not_asked(found)
    assert missing and all(f["claim"] in missing for f in found if f["status"] == "not measured")


def test_sink_scores_parse_and_draw_the_sink_at_that_score():
    assert sink_delta("sink") == 8.0 and sink_delta("sink:5.5") == 5.5
    assert sink_delta("sink:0") is None and sink_delta("sink:x") is None and sink_delta("normal") is None
    q, k, _ = make_qkv(InputSpec(heads=1, seq_len=32, head_dim=16, distribution="sink:5", seed=0))
    assert torch.allclose((q @ k.transpose(-1, -2))[..., 0] / 4, torch.full((1, 1, 32), 5.0, dtype=torch.float64))


def test_cos_sim_and_rel_l1_against_hand_values():
    ref = torch.tensor([3.0, -4.0])
    assert math.isclose(rel_l1(torch.tensor([3.0, -3.0]), ref), 1 / 7)
    assert math.isclose(cos_sim(torch.tensor([4.0, 3.0]), ref), 0.0, abs_tol=1e-15)
    assert cos_sim(2 * ref, ref) == 1.0


def test_sink_sweep_judges_moderate_scores_and_the_closed_form_predicts_the_measured_collapse():
    """A tiny real sweep: sink scores 6 and 7 (the closed form collapses 18% and 53% of P: both moderate),
    three seeds; the collapsed fraction each input set records against Phi(Delta - 6.93), an independent oracle."""
    sw = Sweep(question="modern_sink", methods=SINK_METHODS, distributions=("sink:6", "sink:7"), seq_lens=(256,),
               heads=2, seeds=(0, 1, 2), algorithm="fa2", baseline=False, metric="rel_l2")  # fmt: skip
    records: dict[str, CaseRecord] = {}
    for group in group_by_inputs(expand_sweep(sw)):
        evaluate_group(group, lambda r: records.__setitem__(r.case_id, r))
    assert all("p_collapse" in r.stats for r in records.values())
    found = {f["id"]: f for f in sink_findings(sweep_points(sw, records), records)}
    for delta in (6, 7):
        coll = found[f"modern_sink_collapse_d{delta}"]
        assert coll["status"] == "holds", coll
        assert abs(coll["estimate"] - 1) < 0.1 and closed_form(delta) > 0.1
        assert found[f"modern_sink_reverse_d{delta}"]["claim"].startswith("with a moderate sink")
    assert found["modern_sink_reverse_d7"]["estimate"] > found["modern_sink_reverse_d6"]["estimate"] > 1
    assert found["modern_sink_static_scale_d7"]["estimate"] > 10  # no collapse left at S = 2^8
