"""kernels.native.presets (P's FP8 and SageAttention3 quantisation, the MMA descales, the FP4 input quantisers, the
e2m1s operand check and O's rescales in C) against the torch steps it replaces: the same bits on score-block-sized
random P, ragged blocks, strided O views and broadcast scales; None (the torch steps) on NaN and where the library
is off."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.kernels.formats.sage3 import sage3_p
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import presets as preset_native
from flashcheck.kernels.native.presets import UNIT_ADD, UNIT_DIV, UNIT_MUL


@pytest.fixture(scope="module")
def lib():
    if cbuild.compiler() is None or cbuild.disabled():
        pytest.skip("no C compiler here (or FLASHCHECK_NATIVE=0): torch runs the step passes")
    preset_native._native.cache_clear()
    lib = preset_native.library()
    assert lib is not None, preset_native.native_status()["reason"]
    return lib


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def _p(seed: int, shape=(2, 4, 33, 136)) -> torch.Tensor:
    """exp(s - m)-like float32 P: values in (0, 1] over many binades, zeros and ones."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g) * 6
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p[..., :3, :20] = 0.0
    return p


@pytest.mark.parametrize("scale", [1.0, 256.0, 2.0**8.807])
@pytest.mark.parametrize("fmt", [Format.FP8_E4M3, Format.FP8_E5M2])
def test_p_fp8_matches_round_to(lib, fmt, scale):
    p = _p(1)
    want = round_to(p * scale if scale != 1.0 else p, fmt)
    assert torch.equal(_bits(preset_native.p_fp8(p, scale, fmt)), _bits(want))


@pytest.mark.parametrize("width", [136, 128, 64, 5])
def test_sage3_p_matches_torch(lib, width):
    p = _p(2)[..., :width].contiguous()
    assert torch.equal(_bits(preset_native.sage3_p(p, 448.0 * 6.0)), _bits(sage3_p(p, 448.0 * 6.0)))


def test_nan_and_other_dtypes_take_torch(lib):
    p = _p(3)
    p[0, 0, 5, 7] = float("nan")
    assert preset_native.p_fp8(p, 256.0, Format.FP8_E4M3) is None
    assert preset_native.sage3_p(p, 2688.0) is None
    assert preset_native.p_fp8(p.double(), 256.0, Format.FP8_E4M3) is None
    assert preset_native.p_fp8(p, 256.0, Format.BF16) is None


def test_descale_and_units_match_torch(lib):
    g = torch.Generator().manual_seed(4)
    acc = torch.randn(1, 8, 40, 72, generator=g) * 300
    qs = torch.rand(1, 8, 40, 1, generator=g, dtype=torch.float64) / 3
    ks = torch.rand(1, 8, 72, 1, generator=g, dtype=torch.float64) / 5
    for a, b in ((qs, ks), (torch.ones(1, 1, 1, 1, dtype=torch.float64), ks)):
        want = acc.to(torch.float64).mul_((a * 0.18) * b.transpose(-1, -2)).to(torch.float32)
        out = torch.empty(1, 8, 50, 72)[:, :, 10:]
        assert preset_native.descale(acc, a, b.transpose(-1, -2), 0.18, out) is out
        assert torch.equal(_bits(out), _bits(want))
    o = torch.randn(1, 8, 60, 72, generator=g)[:, :, 20:]  # a causal step's rows: strided
    unit = torch.rand(1, 8, 1, 72, generator=g, dtype=torch.float64) / 448
    c = preset_native.units(o, unit, torch.empty(o.shape), UNIT_DIV)
    assert torch.equal(_bits(c), _bits(o.to(torch.float64, copy=True).div_(unit).to(torch.float32)))
    want = o.clone().copy_(acc.to(torch.float64).mul_(unit))
    got = o.clone()
    preset_native.units(acc, unit, got, UNIT_MUL)
    assert torch.equal(_bits(got), _bits(want))
    want = o.clone().add_(acc.to(torch.float64).mul_(unit).to(torch.float32))
    got = o.clone()
    preset_native.units(acc, unit, got, UNIT_ADD)
    assert torch.equal(_bits(got), _bits(want))
    assert preset_native.units(acc.double(), unit, got, UNIT_ADD) is None


def test_library_off_gives_none(monkeypatch):
    monkeypatch.setattr(preset_native, "library", lambda: None)
    p = _p(5)
    assert preset_native.p_fp8(p, 256.0, Format.FP8_E4M3) is None
    assert preset_native.sage3_p(p, 2688.0) is None


def test_descale_in_place_and_one_scale_match_torch(lib):
    g = torch.Generator().manual_seed(6)
    acc = torch.randn(1, 4, 30, 72, generator=g) * 300
    one = torch.full((1, 1, 1, 1), 0.37, dtype=torch.float64)
    for a, b in ((one, one * 0.2), (torch.rand(1, 4, 30, 1, generator=g, dtype=torch.float64), one)):
        want = acc.to(torch.float64).mul_((a * 0.18) * b).to(torch.float32)
        got = acc.clone()
        assert preset_native.descale(got, a, b, 0.18, got) is got  # the MMA's accumulator descaled where it lies
        assert torch.equal(_bits(got), _bits(want))


def _held_o(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A held accumulator o (strided rows; +0, -0 and a subnormal in a row) and its rescale alpha (a head at 0)."""
    o = torch.randn(1, 8, 60, 72, generator=g)[:, :, 20:]
    o[0, 0, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])
    alpha = torch.rand(1, 8, 40, 1, generator=g)
    alpha[0, 1] = 0.0
    return o, alpha


def test_pv_start_matches_rescale_then_division(lib):
    g = torch.Generator().manual_seed(7)
    o, alpha = _held_o(g)
    for unit in (torch.rand(1, 8, 1, 72, generator=g, dtype=torch.float64) / 448, torch.full((1, 1, 1, 1), 0.3 / 256)):
        unit = unit.to(torch.float64)
        want = o.mul(alpha).to(torch.float64).div_(unit).to(torch.float32) + 0.0  # mma's start: a zero c is +0
        out = torch.empty(o.shape)
        assert preset_native.pv_start(o, alpha, unit, out) is out
        assert torch.equal(_bits(out), _bits(want))
    assert preset_native.pv_start(o, alpha.expand(1, 8, 40, 72), unit, out) is None  # alpha one per row only


@pytest.mark.parametrize("width", [128, 70, 16])
def test_ex2_columns_span_matches_emulation(lib, width):
    from flashcheck.kernels.formats.fastmath import POLY_EX2_3, column_mask, ex2_emulation

    g = torch.Generator().manual_seed(width)
    x = (torch.randn(3, 37, width, generator=g) * 40 - 20).clamp(max=127.0)
    x[0, 0, :6] = torch.tensor([-200.0, -127.0, -126.5, -0.0, 127.0, -float("inf")])
    idx = column_mask(max(width, 128), 10, 4, 1)[:width].nonzero().squeeze(1)
    idx = idx if idx.numel() else torch.tensor([0, 3, 4, 15], dtype=torch.int64)
    out = torch.exp2(x)
    want = out.clone()
    want[..., idx] = ex2_emulation(x[..., idx])
    assert preset_native.ex2_columns(x, idx, POLY_EX2_3, out)
    assert torch.equal(_bits(out), _bits(want))
    x[1, 2, idx[0]] = 128.0  # above 127: reported (the caller runs the torch steps)
    assert not preset_native.ex2_columns(x, idx, POLY_EX2_3, out)


@pytest.mark.parametrize("floor", [False, True])
@pytest.mark.parametrize("dim", [-1, -2])
def test_nvfp4_matches_nvfp4_parts(lib, dim, floor):
    from flashcheck.core.quant import nvfp4_parts
    from flashcheck.kernels.sim.quantized import _nvfp4_parts

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 70, 40, generator=g) * torch.exp2(torch.randint(-30, 10, (2, 3, 70, 40), generator=g))
    x[0, 0, :, :16] = 0.0
    x[1, 1, :16, :] = 2.0**-20  # scales that round to an e4m3 subnormal or 0 (floored with floor)
    want = nvfp4_parts(x, dim=dim, scale_floor=floor)
    for src in (x, x.double()):  # kernels.sim.quantized takes float64 inputs too
        got = _nvfp4_parts(src, dim, floor)
        for w, h in zip(want, got, strict=True):
            assert torch.equal(_bits(w.to(h.dtype)), _bits(h))
    x[0, 2, 3, 4] = float("nan")  # the C pass declines, the torch steps run
    amax = float(x.abs().nan_to_num(0).amax())
    assert preset_native.nvfp4(x, dim, 2688.0 / amax, floor) is None


def test_e2m1s_check_matches_torch(lib):
    from flashcheck.core.quant import nvfp4_parts
    from flashcheck.kernels.formats.e2m1s import fits_e2m1s

    g = torch.Generator().manual_seed(12)
    ok = nvfp4_parts(torch.randn(2, 3, 40, 64, generator=g)).scaled.contiguous()
    bad = ok.clone()
    bad[1, 2, 3, 4] = 0.8125  # 6 significant bits
    wide = torch.cat([ok, bad], -1)
    for t in (ok, bad, ok * 2.0**-30, ok.double(), wide[..., :64], wide[..., 64:], wide.double()[..., :64]):
        fits, x32 = preset_native.e2m1s(t)
        assert fits == fits_e2m1s(t, t.to(torch.float32))
        if fits:
            assert torch.equal(_bits(x32), _bits(t.to(torch.float32)))


def test_fp4x16_float32_matches_quantize_fp4x16(lib):
    from flashcheck.kernels.formats.sage3 import quantize_fp4x16

    g = torch.Generator().manual_seed(13)
    x = (torch.randn(2, 3, 37, 70, generator=g) * 4).to(torch.bfloat16).float()
    for dim in (-1, -2):
        want = quantize_fp4x16(x, dim=dim)
        assert torch.equal(_bits(preset_native.fp4x16(x, dim)), _bits(want))
        assert torch.equal(_bits(preset_native.fp4x16(x, dim, torch.float32)), _bits(want.float()))


def test_rescale_matches_mul_then_add(lib):
    g = torch.Generator().manual_seed(14)
    o, alpha = _held_o(g)
    part = torch.randn(1, 8, 40, 72, generator=g) * 100
    for a in (alpha, None):
        want, got = o.clone(), o.clone()
        (want.mul_(a) if a is not None else want).add_(0.0)  # the held accumulator's MMA start: +0 for a zero
        assert preset_native.rescale(got, a) is got
        assert torch.equal(_bits(got), _bits(want))
        for unit in (torch.rand(1, 8, 1, 72, generator=g, dtype=torch.float64), torch.full((1, 1, 1, 1), 0.3).double()):
            want, got = o.clone(), o.clone()
            (want.mul_(a) if a is not None else want).add_(part.to(torch.float64).mul_(unit).to(torch.float32))
            assert preset_native.rescale(got, a, part, unit) is got
            assert torch.equal(_bits(got), _bits(want))


def test_sage3_float32_inputs_match_float64(lib):
    from flashcheck.kernels.sim.fp8 import round_inputs
    from flashcheck.kernels.sim.presets import default_format, resolve

    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, 2, 300, 64, generator=g) for _ in range(3))
    for name in ("sage3-fp4", "fa4-fp4"):
        pol = resolve(name, default_format(name), 300, 300, 64, False)["policy"]
        p32, p64 = {}, {}
        got = round_inputs(q, k, v, pol, block_q=128, block_k=128, parts=p32)
        want = round_inputs(q.double(), k.double(), v.double(), pol, block_q=128, block_k=128, parts=p64)
        for w, h in zip(want[:3], got[:3], strict=True):
            assert h.dtype == torch.float32 and torch.equal(_bits(w.float()), _bits(h))
        assert p32.keys() == p64.keys()
