"""The `modern` study preset (questions.modern): its sweeps, verdicts and conclusion from points, the sink inputs, and
quick left as it was."""

from __future__ import annotations

import math

import torch

from flashcheck.core.inputs import SINK_DELTA, InputSpec, make_qkv
from flashcheck.kernels import flash_attention
from flashcheck.questions.modern.findings import modern_findings, modern_sentences
from flashcheck.questions.modern.presets import FA2, FA3_FP8, FA4, P_FP8, QUESTIONS, RAISED, SINK_METHODS, modern_sweeps
from flashcheck.study.cases import check_sweeps_can_run
from flashcheck.study.config import StudyConfig, preset
from flashcheck.study.points import Point


def _pt(method: str, values: list[float], dist: str = "normal") -> Point:
    seeds = tuple(range(len(values)))
    nan = (math.nan,) * len(values)
    return Point(method, 1024, 64, (128, 128), dist, seeds, tuple(values), tuple(values), nan, nan, None)


def test_modern_preset_sweeps_and_where_it_runs():
    cfg = preset("modern")
    assert [sw.question for sw in cfg.sweeps] == list(QUESTIONS)
    quick = {sw.question: sw for sw in preset("quick").sweeps if sw.question.startswith("modern")}  # a small part
    assert set(quick) == {"modern_fa4", "modern_lowp"} and quick["modern_lowp"].seq_lens == (1024,)
    assert "flash:fa3-fp8" in quick["modern_lowp"].methods and len(quick["modern_lowp"].methods) == 3
    assert {sw.question for sw in preset("full").sweeps} >= {"modern_fa4", "modern_sink"}
    tiny = StudyConfig(name="t", sweeps=tuple(modern_sweeps((64,), (0,), 1, captured=False)))
    check_sweeps_can_run(tiny)  # every method runs (the kernel presets as study methods)


def test_modern_findings_and_conclusion_from_points():
    pts = {
        "modern_fa4": [_pt(FA2, [1.0, 2.0, 3.0]), _pt(FA4, [1.01, 2.0, 3.02])],
        "modern_lowp": [_pt(FA3_FP8, [1.0, 1.0, 1.0]), _pt("flash:fa4-fp4", [3.0, 3.3, 2.9])],
        "modern_sage": [_pt("flash:sage2-hopper", [0.5, 0.6, 0.55])],
        "modern_sink": [_pt(P_FP8, [2.0, 2.2, 1.9], "sink"), _pt(SINK_METHODS[2], [0.2, 0.21, 0.2], "sink")],
    }
    by = {f["id"]: f for f in modern_findings(pts)}
    assert by["modern_fa4_bf16"]["status"] == "holds"
    assert by["modern_fa4-fp4_vs_fa3_fp8"]["status"] == "does not hold"
    assert by["modern_sage2-hopper_vs_fa3_fp8"]["status"] == "holds"
    assert math.isclose(by["modern_sink_static_scale_d8"]["estimate"], 100.0, rel_tol=0.05)  # MSE: squared ratio
    assert by["modern_sink_reverse_d8"]["status"] == "not measured"
    assert by["modern_sage2-hopper_dominant_stage"]["status"] == "not measured"
    hopper = "flash:sage2-hopper"  # SageAttention2 named by its GPU (alias sage2)
    stages = [_pt(hopper, [1.0, 1.1, 0.9])]
    stages += [_pt(f"{hopper},{s}=fp64", [x * (0.3 if s == "p" else 0.99) for x in (1.0, 1.1, 0.9)]) for s in RAISED]
    found = {f["id"]: f for f in modern_findings(pts | {"modern_sage_stages": stages})}
    f = found["modern_sage2-hopper_dominant_stage"]
    assert f["measured"].startswith("dominant stage p") and f["status"] == "holds"
    said = modern_sentences(list(by.values()))
    assert said[0][1] == "modern_fa4" and "2606.06521" in said[-1][0]
    assert modern_findings({"seq_len": []}) == [] and modern_sentences([]) == []


def test_sink_inputs_score_the_sink_exactly():
    q, k, _ = make_qkv(InputSpec(heads=2, seq_len=64, head_dim=16, distribution="sink", seed=1))
    s = q @ k.transpose(-1, -2) / 4
    assert torch.equal(s[..., 0], torch.full_like(s[..., 0], SINK_DELTA))
    assert 0.7 < float(s[..., 1:].std()) < 1.3


def test_policy_kv_order_is_the_kernels_key_order():
    q, k, v = (torch.randn(1, 1, 40, 8, dtype=torch.float64) for _ in range(3))
    a = flash_attention(q, k, v, policy="bf16-mixed,kv_order=reverse", block_k=16)
    b = flash_attention(q, k, v, policy="bf16-mixed", block_k=16, key_order="reverse")
    c = flash_attention(q, k, v, policy="bf16-mixed", block_k=16)
    assert torch.equal(a, b) and not torch.equal(a, c)
