"""The error model's input statistics sample rows across the causal profile and know one-hot rows; `predict`
draws inputs with a given head layout, seed and scale; `compare` names the error `predict` predicts."""

from __future__ import annotations

import math

import torch
from typer.testing import CliRunner

from flashcheck.cli import app
from flashcheck.core.inputs import InputSpec, make_qkv
from flashcheck.core.numerics import parse_policy, round_to
from flashcheck.kernels.sim.flash import flash_attention
from flashcheck.kernels.sim.reference import reference_attention
from flashcheck.measure.inputstats import input_stats, sampled_rows
from flashcheck.measure.predict import Setting, exact_rows, features, predict

runner = CliRunner()


def test_sampled_rows_span_the_queries():
    rows, w = sampled_rows(4096)
    assert torch.equal(rows[:32], torch.arange(32)) and int(rows[-1]) == 4095 and len(rows) == 128
    gaps = rows[32:].diff()
    assert int(gaps.max()) - int(gaps.min()) <= 1  # evenly spread after the first rows
    assert float(w.sum()) == 4096.0 and torch.all(w[:32] == 1)  # each row stands for its share of the queries
    assert torch.equal(sampled_rows(50)[0], torch.arange(50))


def test_causal_statistics_match_every_row():
    """The sampled f_p and f_score of a causal case against the same sums over every row: within 15% (the
    old slices of 8 rows from row 0 weighed the first rows, which see a few keys, far above their number)."""
    q, k, v = make_qkv(InputSpec(heads=2, seq_len=1024, head_dim=32, seed=4))
    got = input_stats(q, k, v, causal=True)
    s = (q @ k.transpose(-1, -2) / 32**0.5).masked_fill(torch.ones(1024, 1024, dtype=torch.bool).triu(1), -math.inf)
    p = torch.softmax(s, -1)
    o = p @ v
    dv2 = (v.unsqueeze(-3) - o.unsqueeze(-2)).square().sum(-1)  # [B, H, Lq, Lk]
    f_p = float((p.square() * dv2).sum() / o.square().sum())
    assert abs(got["f_p"] / f_p - 1) < 0.15, (got["f_p"], f_p)


def test_one_hot_rows_get_no_output_rounding():
    q, k, v = make_qkv(InputSpec(heads=2, seq_len=1, head_dim=32, seed=1))
    st = input_stats(q, k, v)
    assert st["f_out"] == 0.0  # one key: every row's output is that key's V row
    pol = parse_policy("bf16-mixed")
    assert exact_rows(pol) and not exact_rows(parse_policy("fa3-fp8"))
    s = Setting(kernel="flash", policy=pol, visible=1, head_dim=32, f_score=st["f_score"], f_p=st["f_p"],
                f_out=st["f_out"])  # fmt: skip
    assert features(s)["output"] == 0.0 and predict(s) < 1e-6
    out = flash_attention(q, k, v, policy=pol)
    ref = reference_attention(*(round_to(t, "bf16") for t in (q, k, v)))  # FP64 of the rounded inputs
    assert float((out.double() - ref).abs().max()) == 0.0  # measured: exactly 0
    causal = input_stats(*make_qkv(InputSpec(heads=2, seq_len=256, head_dim=32, seed=1)), causal=True)
    assert 0.0 < causal["f_out"] < 1.0  # row 0 is one-hot under a causal mask


def test_predict_draws_with_heads_kv_heads_seed_and_scale():
    args = ["predict", "--seq-len", "256", "--head-dim", "32", "--causal", "--heads", "4", "--kv-heads", "2",
            "--seed", "3", "--scale", "0.5"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "inputs drawn now (seed 3, 4 heads, 2 KV heads, inputs x 0.5)" in res.output
    other = runner.invoke(app, [*args[:-2], "--scale", "3"])
    assert other.exit_code == 0 and other.output.splitlines()[0] != res.output.splitlines()[0]
    for bad, what in ((["--kv-heads", "3"], "--kv-heads"), (["--scale", "0"], "--scale"), (["--seed", "-1"], "--seed")):
        r = runner.invoke(app, ["predict", "--seq-len", "64", "--heads", "4", *bad])
        assert r.exit_code == 2 and what in r.output and "Traceback" not in r.output, r.output


def test_compare_names_the_error_predict_predicts():
    res = runner.invoke(app, ["compare", "--seq-len", "64", "--heads", "1", "--head-dim", "16"])
    assert res.exit_code in (0, 1), res.output
    assert "flashcheck predict predicts the rel_l2 of the column 'vs FP64 of rounded inputs'" in res.output


def test_compare_of_an_fp8_preset_says_predict_leaves_out_the_kernels_own_quantisation():
    """fa3-fp8-fp22 quantises its inputs inside: both columns hold that step, predict's figure does not."""
    res = runner.invoke(app, ["compare", "--preset", "fa3-fp8-fp22", "--seq-len", "64", "--heads", "1"])
    assert res.exit_code in (0, 1), res.output
    assert "predicts the error after the kernel's own input quantisation" in res.output
    assert "predicts the rel_l2 of the column" not in res.output


def test_compare_of_a_preset_quantising_16_bit_inputs_inside_says_so():
    """fa4-fp4 takes bf16 inputs and quantises them to NVFP4 inside: the 'rounded inputs' column still holds that
    step (a new user read predict's 0.023 against the column's 0.17), so the line names it."""
    res = runner.invoke(app, ["compare", "--preset", "fa4-fp4", "--seq-len", "64", "--heads", "1"])
    assert res.exit_code in (0, 1), res.output
    assert "quantises its inputs inside the kernel (Q/K quantisation (NVFP4, 1x16 blocks" in res.output
    assert "predicts the rel_l2 of the column" not in res.output


def test_the_split_table_names_its_own_columns():
    res = runner.invoke(app, ["compare", "--splits", "1,2", "--seq-len", "256", "--heads", "1", "--head-dim", "16"])
    assert res.exit_code in (0, 1), res.output
    assert "the max_abs and rel_l2 columns add the rounding" in res.output and "'candidate' column" not in res.output
