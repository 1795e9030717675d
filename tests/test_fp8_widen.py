"""core.numerics.widen_fp8: the table-driven float8 -> float32/64 conversion is the cast, bit for bit."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.numerics import FP8_WIDEN_MIN, round_to, widen_fp8


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


@pytest.mark.parametrize("src", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dst", [torch.float32, torch.float64])
def test_every_code_widens_as_the_cast_does(src, dst):
    codes = torch.arange(256, dtype=torch.uint8).repeat(FP8_WIDEN_MIN // 256 + 3).view(src)  # NaN codes too
    assert torch.equal(_bits(widen_fp8(codes, dst)), _bits(codes.to(dst)))
    strided = codes.view(-1, 4)[:, 1:3]  # a non-contiguous view keeps its shape and values
    assert widen_fp8(strided, dst).shape == strided.shape
    assert torch.equal(_bits(widen_fp8(strided, dst)), _bits(strided.to(dst)))
    small = codes[:10]  # under the threshold: the cast itself
    assert torch.equal(_bits(widen_fp8(small, dst)), _bits(small.to(dst)))


@pytest.mark.parametrize("fmt, dtype", [("fp8-e4m3", torch.float8_e4m3fn), ("fp8-e5m2", torch.float8_e5m2)])
def test_round_to_fp8_is_clamp_then_two_casts(fmt, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5000, generator=g) * torch.logspace(-12, 6, 5000)
    specials = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40])
    x[0, : specials.numel()] = specials
    big = torch.finfo(dtype).max
    want = x.clamp(-big, big).to(dtype).to(torch.float32)
    assert torch.equal(_bits(round_to(x, fmt)), _bits(want))
