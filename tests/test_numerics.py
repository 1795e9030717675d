"""Formats and rounding against independent oracles (bit arithmetic, exhaustive fp8 tables, numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashcheck.core import numerics
from flashcheck.core.numerics import (
    Format,
    Policy,
    amax_scale,
    info,
    parse_format,
    parse_policy,
    quantize_scaled,
    round_to,
    spacing,
)


def fp8_table(exp_bits: int, man_bits: int, bias: int, e4m3fn: bool) -> torch.Tensor:
    """All finite values of an fp8 format, decoded from the bit patterns by formula (ascending)."""
    vals = []
    for e in range(2**exp_bits):
        for m in range(2**man_bits):
            if e4m3fn and e == 2**exp_bits - 1 and m == 2**man_bits - 1:
                continue  # NaN
            if not e4m3fn and e == 2**exp_bits - 1:
                continue  # inf / NaN (e5m2 is IEEE-like)
            val = (m / 2**man_bits) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2**man_bits) * 2.0 ** (e - bias)
            vals += [val, -val]
    return torch.tensor(sorted(set(vals)), dtype=torch.float64)


def nearest_even(x: torch.Tensor, table: torch.Tensor, man_bits: int) -> torch.Tensor:
    """Round to nearest in `table`, ties to the value with an even mantissa (brute force)."""
    d = (x.unsqueeze(-1) - table).abs()
    best = d.min(dim=-1, keepdim=True).values
    cands = d == best
    out = torch.empty_like(x)
    for i in range(x.numel()):
        opts = table[cands[i]]
        if len(opts) == 1:
            out[i] = opts[0]
            continue
        mant = [round(abs(float(o)) / float(spacing(o.reshape(1), _fmt(man_bits))[0])) for o in opts]
        out[i] = opts[next(j for j, mm in enumerate(mant) if mm % 2 == 0)]
    return out


def _fmt(man_bits: int) -> Format:
    return Format.FP8_E4M3 if man_bits == 3 else Format.FP8_E5M2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "fmt,exp_bits,man_bits,bias,fn", [(Format.FP8_E4M3, 4, 3, 7, True), (Format.FP8_E5M2, 5, 2, 15, False)]
)
def test_fp8_rounding_matches_exhaustive_table(fmt, exp_bits, man_bits, bias, fn, dtype, gen):
    table = fp8_table(exp_bits, man_bits, bias, fn)
    assert float(table.max()) == info(fmt).max
    inrange = table[table.abs() <= info(fmt).max]
    mids = (inrange[1:] + inrange[:-1]) / 2  # exact ties
    x = torch.cat(
        [
            torch.randn(400, generator=gen, dtype=torch.float64) * 30,
            mids,
            inrange,
            torch.rand(200, generator=gen, dtype=torch.float64) * 0.02,
        ]
    )
    x = x[x.abs() <= info(fmt).max].to(dtype).double()
    assert torch.equal(round_to(x.to(dtype), fmt).double(), nearest_even(x, table, man_bits))


@pytest.mark.parametrize("fmt", [Format.FP8_E4M3, Format.FP8_E5M2])
def test_fp8_saturates_and_keeps_nan(fmt):
    big = torch.tensor([1e9, -1e9, float("inf"), float("nan")], dtype=torch.float64)
    out = round_to(big, fmt)
    mx = info(fmt).max
    assert out[:3].tolist() == [mx, -mx, mx] and torch.isnan(out[3])


def test_bf16_rounding_matches_bit_arithmetic(gen):
    x = torch.randn(100_000, generator=gen, dtype=torch.float32) * 100
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    oracle = torch.tensor(rounded.to(torch.int64).numpy().astype(np.uint32).view(np.float32))
    assert torch.equal(round_to(x, "bf16"), oracle)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fp16_rounding_matches_numpy(dtype, gen):
    x = torch.randn(100_000, generator=gen, dtype=torch.float64) * 1000
    x = torch.cat([x, torch.tensor([830.2500066952994, 1e-7, 3e-6, 7e4, -7e4, 65519.9, 65520.0])]).to(dtype)
    with np.errstate(over="ignore"):  # numpy rounds float64 to float16 once: an independent oracle
        oracle = torch.from_numpy(x.numpy().astype(np.float16).astype(np.float64))
    assert torch.equal(round_to(x, "fp16").double(), oracle)


def test_bf16_from_float64_rounds_once(gen):
    lo = round_to(torch.randn(100_000, generator=gen, dtype=torch.float32), "bf16").double()
    step = spacing(lo, "bf16") * torch.sign(lo)
    # just past the midpoint away from zero: float32 would make it an exact tie and round to even
    nudged = lo + step / 2 + step * 2.0**-20
    assert torch.equal(round_to(nudged, "bf16"), lo + step)


def test_rounding_gradient_follows_the_cast():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (round_to(x, "bf16") * torch.tensor([1.0 + 2**-12, 3.0], dtype=torch.float64)).sum().backward()
    assert x.grad.tolist() == [1.0, 3.0]  # gradient rounded to bf16 like the value
    y = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (round_to(y, "fp8-e4m3") * (1 + 2**-12)).sum().backward()
    assert y.grad.tolist() == [1 + 2**-12]  # fp8: straight through


@pytest.mark.parametrize("fmt", list(Format))
def test_spacing_is_machine_epsilon_at_one(fmt):
    eps = {Format.FP8_E4M3: 2.0**-3, Format.FP8_E5M2: 2.0**-2}.get(fmt)
    emulated = {Format.FP6_E2M3: 2.0**-3, Format.FP6_E3M2: 2.0**-2, Format.FP4_E2M1: 0.5, Format.INT8: 1.0}
    eps = {**emulated, Format.INT4: 1.0}.get(fmt, eps)
    eps = eps if eps is not None else torch.finfo(info(fmt).dtype).eps
    assert float(spacing(torch.tensor([1.0, 1.5]), fmt)[0]) == eps


def test_spacing_in_subnormal_range():
    tiny = torch.finfo(torch.float16).tiny  # smallest normal 2^-14
    assert float(spacing(torch.tensor([tiny / 8]), "fp16")[0]) == 2.0**-24


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8-e4m3"])
def test_stochastic_rounding_is_unbiased_and_picks_neighbours(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.full((200_000,), 1.0 + 0.3 * float(spacing(torch.tensor([1.0]), fmt)[0]), dtype=torch.float64)
    out = round_to(x, fmt, stochastic=True, generator=g)
    lo, hi = 1.0, 1.0 + float(spacing(torch.tensor([1.0]), fmt)[0])
    assert set(out.unique().tolist()) <= {lo, hi}
    frac_up = float((out == hi).double().mean())
    assert abs(frac_up - 0.3) < 5 * (0.3 * 0.7 / x.numel()) ** 0.5  # 5 sigma of a binomial
    exact = torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64)
    assert torch.equal(round_to(exact, fmt, stochastic=True, generator=g), exact)


def test_per_block_scaling_uses_range():
    x = torch.tensor([[1e-3, 2e-3], [400.0, -100.0]], dtype=torch.float64)
    scale = amax_scale(x, "fp8-e4m3", dims=(-1,))
    q = quantize_scaled(x, "fp8-e4m3", scale)
    assert (q - x).abs().div(x.abs()).max() < 2**-4  # relative error at most half an ulp of e4m3


def test_parse_format_errors_name_allowed_values():
    assert parse_format("bfloat16") is Format.BF16
    with pytest.raises(ValueError, match="fp8-e4m3"):
        parse_format("fp4")


def test_policy_names_and_overrides():
    u = parse_policy("bf16")
    assert {u.input, u.score, u.stats, u.p, u.accum, u.output} == {Format.BF16}
    assert u.matmul is Format.FP32 and u.work_dtype == torch.float32
    m = parse_policy("fp16-mixed")
    assert (m.input, m.p, m.output, m.score, m.stats, m.accum) == (Format.FP16,) * 3 + (Format.FP32,) * 3
    assert m.grad_p is Format.FP16 and m.delta is Format.FP16 and m.grad_accum is Format.FP32
    c = parse_policy("bf16-mixed,p=fp32,delta=fp32")
    assert c.p is Format.FP32 and c.delta is Format.FP32 and c.grad_p is Format.FP32
    assert c.input is Format.BF16
    k = parse_policy("input=bf16,score=fp32")
    assert k.stats is Format.FP64 and k.work_dtype == torch.float64
    assert parse_policy("fa3-fp8").hadamard and parse_policy("fa3-fp8").fp8_scaling == "block"
    assert parse_policy("fp64").work_dtype == torch.float64


@pytest.mark.parametrize(
    "spec,match",
    [
        ("bogus", "unknown numerics policy"),
        ("bf16,foo=fp32", "bad policy"),
        ("bf16,p=fp4", "unknown number format"),
        ("", "empty"),
        ("bf16,fp8_scaling=row", "fp8_scaling"),
    ],
)
def test_policy_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_policy(spec)


def test_policy_rejects_low_precision_matmul():
    with pytest.raises(ValueError, match="matmul"):
        Policy(matmul="bf16")


_EMULATED_NAMES = ("fp4-e2m1", "fp6-e2m3", "fp6-e3m2", "int8", "int4")


@pytest.mark.parametrize(  # float32 values reach _round_exact only for the emulated formats
    "fmt,dtype",
    [(f, torch.float32) for f in _EMULATED_NAMES]
    + [(f, torch.float64) for f in (*_EMULATED_NAMES, "fp8-e4m3", "fp16", "bf16")],
)
def test_round_exact_by_bits_matches_the_frexp_spacing(fmt, dtype):
    """_round_exact's ulp from the exponent bits gives spacing()'s rounding bit for bit: random bit patterns
    (subnormals, zeros, inf, NaN), ties and values around every format's limits, clamped and not, contiguous
    and as strided views (transposed, every other element)."""
    fmt = numerics.parse_format(fmt)
    g = torch.Generator().manual_seed(5)
    patterns = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    edges = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, 2.5, 0.25, 0.75, 1.75, 5.0, 7.0, 127.5, 448, 65520]
    x = torch.cat([patterns.view(torch.float32).to(dtype), torch.randn(20000, generator=g, dtype=dtype) * 4,
                   torch.tensor(edges, dtype=dtype)])  # fmt: skip
    fi = numerics.info(fmt)
    itype = torch.int32 if dtype == torch.float32 else torch.int64
    for xs in (x, torch.clamp(x, -fi.max, fi.max)):
        ulp = numerics.spacing(xs, fmt).to(dtype)
        want = torch.round(xs / ulp) * ulp
        want = torch.where(want.abs() > fi.max, torch.sign(want) * math.inf, want)
        want = torch.where(torch.isfinite(xs), want, xs)
        got = numerics._round_exact(xs, fmt)
        same = (got.view(itype) == want.view(itype)) | (got.isnan() & want.isnan())
        assert bool(same.all()), xs[~same][:5]
        n = xs.numel() // 12 * 12
        for view, w in ((xs[:n].view(12, -1).t(), want[:n].view(12, -1).t()), (xs[::2], want[::2])):
            got = numerics._round_exact(view, fmt)
            assert bool(((got.view(itype) == w.view(itype)) | (got.isnan() & w.isnan())).all())


@pytest.mark.parametrize("fmt", [Format.FP8_E4M3, Format.FP8_E5M2])
def test_fp8_from_float64_rounds_once_like_round_exact(fmt):
    """round_to's float64 -> fp8 path (round-to-odd at 24 bits, then torch's cast) gives _round_exact's bits:
    values a hair off each tie (where a cast through float32 rounds twice), random float64 bit patterns (NaN,
    subnormals), signed zeros and values below float32's normal range, clamped to the format as round_to does."""
    fi = info(fmt)
    vals = numerics._fp8_table(fi.dtype, torch.float64)
    grid = vals[torch.isfinite(vals)].sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    off = torch.tensor([2.0**-30, -(2.0**-30), 2.0**-45, -(2.0**-45), 2.0**-52, -(2.0**-52)], dtype=torch.float64)
    near = (mids[:, None] * (1 + off)).reshape(-1)
    g = torch.Generator().manual_seed(9)
    patterns = torch.randint(-(2**62), 2**62, (20000,), generator=g, dtype=torch.int64).view(torch.float64)
    tiny = torch.tensor([0.0, -0.0, math.nan, 1e-300, -1e-300, 1e-45, -3e-39, 2.0**-10, 2.0**-17], dtype=torch.float64)
    x = torch.clamp(torch.cat([near, -near, mids, patterns, tiny]), -fi.max, fi.max)
    twice = near.clamp(-fi.max, fi.max)
    assert not torch.equal(twice.to(torch.float32).to(fi.dtype).double(), numerics._round_exact(twice, fmt))  # trap
    got = round_to(x, fmt)
    assert torch.equal(got.view(torch.int64), numerics._round_exact(x, fmt).view(torch.int64))
