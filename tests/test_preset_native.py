"""kernels.preset_native (P's FP8 and SageAttention3 quantisation, the MMA descales in C) against the torch steps
it replaces: the same bits on score-block-sized random P, ragged blocks, strided O views and broadcast scales; None
(the torch steps) on NaN and where the library is off."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.numerics import Format, round_to
from flashcheck.kernels import cbuild, preset_native
from flashcheck.kernels.preset_native import UNIT_ADD, UNIT_DIV, UNIT_MUL
from flashcheck.kernels.sage3 import sage3_p


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


def test_pv_start_matches_rescale_then_division(lib):
    g = torch.Generator().manual_seed(7)
    o = torch.randn(1, 8, 60, 72, generator=g)[:, :, 20:]
    o[0, 0, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])
    alpha = torch.rand(1, 8, 40, 1, generator=g)
    alpha[0, 1] = 0.0
    for unit in (torch.rand(1, 8, 1, 72, generator=g, dtype=torch.float64) / 448, torch.full((1, 1, 1, 1), 0.3 / 256)):
        unit = unit.to(torch.float64)
        want = o.mul(alpha).to(torch.float64).div_(unit).to(torch.float32) + 0.0  # mma's start: a zero c is +0
        out = torch.empty(o.shape)
        assert preset_native.pv_start(o, alpha, unit, out) is out
        assert torch.equal(_bits(out), _bits(want))
    assert preset_native.pv_start(o, alpha.expand(1, 8, 40, 72), unit, out) is None  # alpha one per row only


@pytest.mark.parametrize("width", [128, 70, 16])
def test_ex2_columns_span_matches_emulation(lib, width):
    from flashcheck.kernels.fastmath import POLY_EX2_3, column_mask, ex2_emulation

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
