"""The error model's tensor-core accumulator term (measure.mma_error) against kernels.tensorcore.mma on synthetic
products.

P: softmax numerators exp(s - max) x 2^8 (s ~ N(0, 2^2)) as the flash kernels cast them (e4m3 / e5m2), V ~ N(0, 1)
quantised per tensor to the same format (amax at the format's top; 2.25 for Ada's fp16 register, as SageAttention2
maps it). Measured: sum (mma_matmul - exact)^2 over sum exact^2; predicted: chain_moments' bias^2 + variance.

Budget on predicted / measured relative error: MODEL x (1 + 4 / sqrt(2 n)) either way. 4 / sqrt(2 n): four standard
deviations of the root of a mean of n squared Gaussian errors (n outputs). MODEL = 1.4: empirical, the largest
ratio seen on a fit set (R=8 rows, N=16 columns, seeds = the key count; 0.95 to 1.32 over hopper / ada / b200, e4m3
/ e5m2, one / two levels, 128 to 65,536 keys: the uniform-low-bits assumption over-counts the low bits of 4-bit x
4-bit products); this set uses other seeds and shapes."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.kernels.tensorcore.mma import MMA_MODELS, mma_matmul
from flashcheck.measure.mma_error import chain_moments, cut_moments

FORMATS = {"e4m3": (Format.FP8_E4M3, 448.0), "e5m2": (Format.FP8_E5M2, 57344.0)}
MODEL = 1.4
ROWS, COLS = 4, 16


def _operands(keys: int, fmt: str, seed: int, top: float | None = None):
    g = torch.Generator().manual_seed(1000 + seed)
    f, fmax = FORMATS[fmt]
    s = torch.randn(ROWS, keys, generator=g, dtype=torch.float64) * 2
    p = round_to(torch.exp(s - s.amax(-1, keepdim=True)) * 256, f)
    v = torch.randn(keys, COLS, generator=g, dtype=torch.float64)
    return p, round_to(v / v.abs().amax() * (top or fmax), f)


CASES = [  # (model, format, keys, promote_every, accumulator register)
    *[("hopper", "e4m3", n, None, "fp32") for n in (128, 1024, 8192, 65536)],
    *[("hopper", "e5m2", n, None, "fp32") for n in (128, 8192)],
    *[("hopper", "e4m3", n, 128, "fp32") for n in (1024, 65536)],
    ("hopper", "e5m2", 8192, 128, "fp32"),
    ("ada", "e4m3", 8192, 64, "fp16"),
    ("b200", "e4m3", 8192, None, "fp32"),
]


@pytest.mark.parametrize(("name", "fmt", "keys", "promote", "acc"), CASES)
def test_accumulator_term_predicts_the_hardware_model(name, fmt, keys, promote, acc):
    model = MMA_MODELS[name]
    p, v = _operands(keys, fmt, keys + (promote or 0), top=2.25 if acc == "fp16" else None)
    out = mma_matmul(p, v, model, fmt=fmt, promote_every=promote, acc=acc).double()
    exact = p @ v
    measured = math.sqrt(float((out - exact).square().sum() / exact.square().sum()))
    bias, var = chain_moments(p, v, model, fmt=(fmt, fmt), promote_every=promote, acc=acc)
    predicted = math.sqrt(float((bias.square() + var).sum() / exact.square().sum()))
    budget = MODEL * (1 + 4 / math.sqrt(2 * ROWS * COLS))
    assert measured > 0
    assert 1 / budget <= predicted / measured <= budget, (predicted, measured, budget)


def test_cut_moments_closed_form_matches_enumeration():
    """A value with k bits below the grid, each pattern equally likely: the mean and second moment of what a
    truncation toward zero loses, enumerated, equal (g - delta) / 2 and (g - delta)(2 g - delta) / 6."""
    for k in (1, 3, 6):
        delta, grid = 2.0**-k, 1.0
        losses = torch.arange(2**k, dtype=torch.float64) * delta
        m, s2 = cut_moments(torch.tensor([5.0]), torch.tensor([delta]), torch.tensor([grid]))
        assert float(m) == pytest.approx(float(losses.mean()), rel=1e-12)
        assert float(s2) == pytest.approx(float(losses.square().mean()), rel=1e-12)
    m, s2 = cut_moments(torch.tensor([0.25]), torch.tensor([2.0**-6]), torch.tensor([1.0]))  # lost whole
    assert (float(m), float(s2)) == (0.25, 0.0625)
    m, s2 = cut_moments(torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([1.0]))  # no bit below the grid
    assert (float(m), float(s2)) == (0.0, 0.0)


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_errormodel_heldout.py"
    spec = importlib.util.spec_from_file_location("bench_errormodel_heldout", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heldout_slice_within_2x():
    """A small slice of the held-out benchmark (a seed and shape the fit never saw): SageAttention2 on Hopper,
    32 queries against 256 keys, causal; the prediction with the tensor-core accumulator term within 2x."""
    r = _bench().one_case("sage2-hopper", "fp16", 32, 64, 1.0, 977, True, 256)
    assert 0.5 <= r["predicted"] / r["measured"] <= 2.0, r


def test_classic_predictions_ignore_the_tensor_core_term():
    """A policy without a P·V tensor-core model predicts as before, whatever f_acc a setting carries."""
    import dataclasses

    from flashcheck.measure.predict import parse_setting, predict

    for pol in ("bf16-mixed", "fp16-mixed", "fp32"):
        s = parse_setting("flash", pol, visible=4096, head_dim=64)
        assert predict(dataclasses.replace(s, f_acc=0.25)) == predict(s)


def test_study_records_carry_the_term_and_the_error_model_uses_it():
    """A modern study's case with a P·V tensor-core model records f_acc beside the range statistics; the error
    model's view of the record (questions.variants.errormodel.setting_of) carries it into the prediction."""
    import dataclasses

    from flashcheck.measure.case import References
    from flashcheck.measure.predict import accumulator_term
    from flashcheck.questions.variants.errormodel import setting_of
    from flashcheck.study.cases import Case, CaseRecord, case_range_stats

    c = Case(kernel="flash", policy="sage2-hopper@fp16", algorithm="", block_q=64, block_k=128, batch=1, heads=2,
             seq_len=128, head_dim=64, causal=False, distribution="normal", seed=3)  # fmt: skip
    refs = References(c.input_spec(), causal=False)
    st = case_range_stats(c, refs)
    assert st["f_acc"] > 0
    plain = dataclasses.replace(c, policy="fa3-fp8")
    assert "f_acc" not in case_range_stats(plain, refs)  # no tensor-core model: no term
    stats = st | {"visible": 128.0, "f_score": 5.0, "f_p": 1.0}
    rec = CaseRecord(c.case_id, c, "ok", {}, {"rel_l2": 0.01}, 0.0, "", {}, 0, stats)
    s = setting_of(rec)
    assert s.f_acc == st["f_acc"] and accumulator_term(s) == st["f_acc"]


def test_predict_names_the_tensor_core_term():
    """`flashcheck predict` for a preset with a P·V tensor-core model says where its accumulator term comes from
    (the model, inputs drawn for it), in the human output and in --json; a classic policy prints no such line."""
    import json

    from typer.testing import CliRunner

    from flashcheck.cli import app

    out = CliRunner().invoke(app, ["predict", "--preset", "sage2-hopper", "--seq-len", "128"])
    assert out.exit_code == 0, out.output
    assert "P·V tensor-core accumulator (hopper model" in out.output and "inputs drawn for it" in out.output
    js = CliRunner().invoke(app, ["predict", "--preset", "sage2-hopper", "--seq-len", "128", "--draw", "--json"])
    data = json.loads(js.output)
    assert "the drawn inputs" in data["accumulator"] and data["contributions"]["acc_trunc"] > 0
    plain = CliRunner().invoke(app, ["predict", "--numerics", "bf16-mixed", "--seq-len", "128"])
    assert plain.exit_code == 0 and "accumulator" not in plain.output


def test_the_term_predicts_the_accumulator_inside_the_flash_kernel():
    """fa3-fp8-fp22 (Hopper's chain into O, key blocks last to first, block-scaled e4m3, P x 2^8), fp32 output so
    that nothing rounds after the MMA: the kernel's output with its tensor-core P·V against the same kernel with
    an exact P·V, over the output's norm, against pv_mma_stats' f_acc (sampled rows, columns and heads: n = 2
    heads x 16 rows x 16 columns in the sampling allowance of the budget)."""
    from flashcheck.core.inputs import InputSpec, make_qkv
    from flashcheck.kernels.sim.flash import flash_attention
    from flashcheck.kernels.sim.presets import resolve
    from flashcheck.measure.mma_error import pv_mma_stats

    q, k, v = make_qkv(InputSpec(heads=2, seq_len=16, seq_len_k=512, head_dim=64, seed=5))
    kw = resolve("fa3-fp8-fp22", "fp8-e4m3", 16, 512, 64, False)
    pol = kw["policy"].replace(output=Format.FP32)
    exact = pol.replace(name=pol.name, pv_mma="", acc_bits=0)
    with torch.no_grad():
        o1 = flash_attention(q, k, v, **(kw | {"policy": pol})).double()
        o0 = flash_attention(q, k, v, **(kw | {"policy": exact})).double()
    measured = float((o1 - o0).norm() / o0.norm())
    predicted = pv_mma_stats(q, k, v, pol, block_k=kw["block_k"])["f_acc"] ** 0.5
    budget = MODEL * (1 + 4 / math.sqrt(2 * 2 * 16 * 16))
    assert 1 / budget <= predicted / measured <= budget, (predicted, measured)
