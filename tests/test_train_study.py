"""train-study's statistics on synthetic curves where the answer is known: growth-phase fits, ratio intervals
over seeds, verdicts against 1 and the paper's band, the figures' metadata; tied-max's statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashcheck.training.experiments import train_preset
from flashcheck.training.ratios import GROWTH_END, describe_slope, findings, growth_fit, ratio_by_step, ratios
from flashcheck.training.tied_max import sign_consistency
from helpers import audited_figures

STEPS = list(range(0, 130, 10))


def _curve(w1: list[float], layers: int = 2) -> dict:
    return {
        "runs": ["a", "b"],
        "steps": STEPS,
        "wasserstein": w1,
        "max_abs": [10 * w for w in w1],
        "per_layer": {f"blocks.{i}": [w * (i + 1) for w in w1] for i in range(layers)},
        "per_tensor": {},
        "fit": growth_fit(STEPS, w1),
    }


def _saturating(rate: float, end: int = 60) -> list[float]:
    """Linear growth at `rate` per step until step `end`, then flat."""
    return [rate * min(s, end) for s in STEPS]


def _pairs(flash_rate: list[float], lowp_rate: float = 1e-5) -> dict:
    """Synthetic pairs: per seed, Flash grows at flash_rate[seed], bf16 and fp16 at lowp_rate (x seed noise)."""
    pairs = {
        p: {"factor": "x", "seeds": {}} for p in ("flash_vs_baseline", "seed_vs_seed", "bf16_vs_fp32", "fp16_vs_fp32")
    }
    for s, fr in enumerate(flash_rate):
        noise = 1 + 0.05 * s
        pairs["flash_vs_baseline"]["seeds"][str(s)] = _curve(_saturating(fr))
        pairs["bf16_vs_fp32"]["seeds"][str(s)] = _curve(_saturating(lowp_rate * noise))
        pairs["fp16_vs_fp32"]["seeds"][str(s)] = _curve(_saturating(lowp_rate / noise))
        pairs["seed_vs_seed"]["seeds"][str(s)] = _curve([1e-2 - 2e-5 * st for st in STEPS])  # falls
    return pairs


def test_growth_fit_stops_where_the_curve_saturates():
    fit = growth_fit(STEPS, _saturating(2e-5, end=60))
    assert fit["window"] == [0, 60] and fit["growing"]  # 90% of the plateau is first reached at step 60
    assert fit["slope"] == pytest.approx(2e-5 * (1 - 0.0), rel=0.15)  # least squares over 0..60 of a line
    assert _saturating(2e-5)[6] >= GROWTH_END * max(_saturating(2e-5))
    straight = growth_fit(STEPS, [3e-6 * s for s in STEPS])
    assert straight["slope"] == pytest.approx(3e-6) and straight["window"][1] >= 110


def test_a_falling_curve_has_no_growth_phase_and_says_so():
    fit = growth_fit(STEPS, [1e-2 - 2e-5 * s for s in STEPS])
    assert not fit["growing"] and fit["slope"] < 0
    text = describe_slope("seed_vs_seed", fit)
    assert "no growth phase" in text and "no slope ratio" in text and "ratio -" not in text


@pytest.mark.parametrize(
    ("rates", "below", "paper"),
    [
        ([3e-6, 3.2e-6, 2.9e-6], "holds", "holds"),  # 0.3x: below 1 and inside 0.2-0.5
        ([6e-6, 6.3e-6, 6.1e-6], "holds", "does not hold"),  # 0.64x: below 1, above the band
        ([1e-5, 1.01e-5, 0.99e-5], "inconclusive", "does not hold"),  # 1x: neither side of 1
        ([2e-5, 2.2e-5, 2.1e-5], "does not hold", "does not hold"),  # 2x: above 1
        ([3e-6], "inconclusive", "inconclusive"),  # n = 1 < 3
    ],
)
def test_ratio_verdicts_against_one_and_the_paper_band(rates, below, paper):
    r = ratios(_pairs(rates))
    by_id = {f["id"]: f for f in findings(r)}
    assert by_id["flash_below_fp16"]["status"] == below, by_id["flash_below_fp16"]
    assert by_id["paper_band_fp16"]["status"] == paper, by_id["paper_band_fp16"]
    # the curves have one shape (linear, then flat from step 60): their means' ratio is the slopes' ratio
    assert by_id["flash_curve_below_fp16"]["status"] == below and by_id["paper_band_curve_fp16"]["status"] == paper
    assert r["mean_w1_flash_over_fp16"]["value"] == pytest.approx(r["slope_flash_over_fp16"]["value"], rel=1e-9)
    if below == "inconclusive" and len(rates) > 1:  # a power statement sizes the study that would decide
        assert "needs" in by_id["flash_below_fp16"]["power"]["text"]
    est = r["slope_flash_over_fp16"]
    assert est["n"] == len(rates)
    expected = math.exp(np.mean(np.log(np.array(rates) / (1e-5 / (1 + 0.05 * np.arange(len(rates)))))))
    assert est["value"] == pytest.approx(expected, rel=1e-9)


def test_a_seed_whose_slope_is_not_positive_is_left_out_and_named():
    pairs = _pairs([3e-6, 3.1e-6, 2.9e-6, 3.05e-6])
    pairs["fp16_vs_fp32"]["seeds"]["2"] = _curve([1e-3 - 1e-6 * s for s in STEPS])  # falls: no growth
    r = ratios(pairs)["slope_flash_over_fp16"]
    assert r["n"] == 3 and len(r["notes"]) == 1 and r["notes"][0].startswith("seed 2")


def test_ratio_by_step_has_an_interval_per_saved_step():
    by_step = ratio_by_step(_pairs([3e-6, 3.1e-6, 2.9e-6]))
    assert set(by_step) == {"flash_over_bf16", "flash_over_fp16", "flash_over_seed"}
    rows = by_step["flash_over_bf16"]
    assert [row["step"] for row in rows] == STEPS[1:]
    assert all(row["n"] == 3 and row["low"] <= row["value"] <= row["high"] for row in rows)


def test_train_study_figures_pass_the_metadata_check(tmp_path):
    """The report's figures on a synthetic 3-seed study (quick's shape: 4 pairs, 3 seeds, 13 saved steps)."""
    pytest.importorskip("matplotlib")
    from flashcheck.training.ratios import conclusion
    from flashcheck.training.train_report import write_train_report

    pairs = _pairs([3e-6, 3.1e-6, 2.9e-6])
    r = ratios(pairs)
    summary = {
        "study": "synthetic",
        "conditions": {
            "model": {"layers": 2, "dim": 64, "heads": 4, "seq_len": 64, "vocab": 64},
            "batch": 8,
            "steps": 120,
            "save_every": 10,
            "lr": 3e-3,
            "attention_policy": "bf16-mixed",
            "seeds": 3,
            "overrides": {},
        },
        "verdicts": True,
        "note": "",
        "ratios": r,
        "ratio_by_step": ratio_by_step(pairs),
        "findings": findings(r),
        "slopes": {p: {s: describe_slope(p, c["fit"]) for s, c in e["seeds"].items()} for p, e in pairs.items()},
        "pairs": pairs,
        "final_loss": {"base-s0": 2.0},
    }
    summary["conclusion"] = conclusion(summary)
    losses = {f"{k}-s0": [3.0, 2.5, 2.0] for k in ("base", "flash", "reseed", "bf16", "fp16")}
    with audited_figures(save=False) as seen:  # the metadata, laid out; no pixel of the PNGs is read
        write_train_report(summary, losses, tmp_path)
    assert len(seen) == 6 and all(problems == [] for _, problems, _ in seen), seen
    ylabels = {name: labels for name, _, labels in seen}
    assert "W1 ratio (Flash vs base) / (other pair)" in ylabels["ratio.png"]
    assert ylabels["w1_by_layer.png"] == ["W1(variant, base)"] * 3  # the whole model and each of the 2 layers
    assert ylabels["wasserstein.png"] == ["Wasserstein-1(W_variant, W_base) [weight units]"]
    assert ylabels["max_abs.png"] == ["max |W_variant - W_base| [weight units]"]
    report = (tmp_path / "report.md").read_text()
    assert report.index("Conclusion") < report.index("Verdicts")
    assert "grows slower than fp16-vs-fp32 drift" in report and "0.2-0.5 band: holds" in report


def test_presets_have_five_seed_groups_and_tiny_none_of_the_verdicts():
    for name in ("quick", "paper"):
        study = train_preset(name)
        seeds = range(5)
        assert study.verdicts and {p[4] for p in study.pairs} == set(seeds)
        assert len(study.runs) == 40 and len({r.name for r in study.runs}) == 40
        eight = {r.name: r for r in study.runs if r.name.startswith("sage8")}
        assert sorted(eight) == [f"{n}-s{s}" for n in ("sage8", "sage8ft") for s in seeds]
        base = study.runs[0]
        assert base.data == "lookback" and base.schedule == "cosine" and 0 < base.warmup < base.steps // 4
        for s in seeds:  # same seed, batches and model as base-sS; only the attention differs
            pre, ft = eight[f"sage8-s{s}"], eight[f"sage8ft-s{s}"]
            assert pre.attention == "sagebwd" and (pre.seed, pre.data_seed, pre.steps) == (s, s, base.steps)
            assert ft.attention == base.attention and ft.then_attention == "sagebwd"
            assert ft.then_from == base.steps // 2 and ft.seed == s
        free = [r for r in study.runs if r.name.startswith("noattn")]
        assert [r.attention for r in free] == ["none"] * 5 and [r.seed for r in free] == list(seeds)
        assert not any(name.startswith(("sage8", "noattn")) for p in study.pairs for name in p[1:3])
    tiny = train_preset("tiny")
    assert not tiny.verdicts
    shorter = train_preset("paper", steps=24)
    assert shorter.runs[0].steps == 24 and shorter.runs[0].save_every == 3 and shorter.overrides == {"steps": 24}
    assert shorter.runs[0].warmup == train_preset("paper").runs[0].warmup * 24 // train_preset("paper").runs[0].steps
    for bad in ({"steps": 0}, {"seeds": -1}, {"lr": 2.0}, {"policy": "nope"}):
        with pytest.raises(ValueError):
            train_preset("quick", **bad)


def test_sign_consistency_is_per_row_over_steps():
    steps, rows = 40, 64
    one_sign_per_row = torch.ones(steps, rows) * torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0)
    assert sign_consistency(one_sign_per_row) == 1.0  # every row keeps its sign (the row mean is 0 at each step)
    g = torch.Generator().manual_seed(0)
    random = torch.randn(steps, 4096, generator=g)
    expected = math.sqrt(2 / (math.pi * steps))  # E|mean of T random signs|, large T
    assert sign_consistency(random) == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "0"], "--seeds 0 is not allowed"),
        (["--steps", "-3"], "--steps -3 is not allowed"),
        (["--lr", "2"], "--lr 2.0 is not allowed"),
        (["--policy", "nope"], "unknown numerics policy 'nope'"),
        (["--preset", "tied-max", "--policy", "bf16"], "--policy not allowed with --preset tied-max"),
    ],
)
def test_bad_train_study_flags_exit_2_with_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    res = CliRunner().invoke(app, ["train-study", "--out", str(tmp_path), *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
