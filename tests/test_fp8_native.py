"""kernels.native.fp8 (FP8 and integer quantisation, split's codes and max |x| in C) against the torch steps it
replaces: the same bits on random values, ties, subnormals, zeros of both signs, limits, odd strides and ragged
blocks; the torch path where the library is off."""

from __future__ import annotations

import pytest
import torch

from flashcheck.core.numerics import Format, amax_scale, quantize_scaled, round_to
from flashcheck.core.quant import quantize_int
from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native import fp8 as fp8_native
from flashcheck.kernels.sim.fp8 import quantize_blocks
from flashcheck.kernels.sim.mma_ops import SPLIT_TOLERANCE, split

FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)


@pytest.fixture(scope="module")
def lib():
    if cbuild.compiler() is None or cbuild.disabled():
        pytest.skip("no C compiler here (or FLASHCHECK_NATIVE=0): torch runs the quantisation")
    fp8_native._native.cache_clear()  # a test that switched FLASHCHECK_NATIVE off may have cached "off"
    lib = fp8_native.library()
    assert lib is not None, fp8_native.native_status()["reason"]
    return lib


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {torch.float64: torch.int64, torch.float32: torch.int32}[a.dtype]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def _inputs(seed: int, shape=(2, 3, 50, 24)) -> torch.Tensor:
    """float64 values over many binades, with zeros of both signs and exact FP8 ties after scaling."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-12, 12, shape, generator=g))
    x.view(-1)[:6] = torch.tensor([0.0, -0.0, 1.0625, -1.0625, 2.0**-10, -(2.0**-9) * 1.5], dtype=torch.float64)
    return x


@pytest.mark.parametrize("fmt", FP8)
def test_scaled_and_codes_equal_torch(lib, fmt):
    x = _inputs(1)
    for scale in (amax_scale(x, fmt), amax_scale(x, fmt, dims=(-2,)), torch.rand(2, 3, 50, 1, dtype=torch.float64)):
        assert _same(fp8_native.scaled(x, fmt, scale), quantize_scaled(x, fmt, scale))
        assert _same(fp8_native.codes(x, fmt, scale), round_to(x / scale, fmt))
        assert _same(fp8_native.amax_scale(x, fmt, -2), amax_scale(x, fmt, dims=(-2,)))
    assert _same(fp8_native.amax_scale(x, fmt), amax_scale(x, fmt))


@pytest.mark.parametrize("n", [50, 64, 7])
def test_quantize_blocks_without_padding_equals_padded(lib, n):
    """Ragged last blocks: per-row scales over the unpadded rows give the padded computation's bits."""
    x = _inputs(2, (1, 2, n, 16))
    b, h, _, d = x.shape
    for block in (16, 64):
        blk = max(1, min(block, n))
        pad = (-n) % blk
        xb = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(b, h, -1, blk, d)
        want = quantize_scaled(xb, Format.FP8_E4M3, amax_scale(xb, Format.FP8_E4M3, dims=(-2, -1)))
        assert _same(quantize_blocks(x, Format.FP8_E4M3, block), want.reshape(b, h, -1, d)[:, :, :n])


@pytest.mark.parametrize("groups", ["tensor", "rows", "columns"])
def test_split_fast_path_equals_torch_steps(lib, groups, monkeypatch):
    x = quantize_blocks(_inputs(3), Format.FP8_E4M3, 16).to(torch.float32)  # codes times block scales, held in fp32
    got = split(x, Format.FP8_E4M3, groups, rows=16)
    monkeypatch.setattr(fp8_native, "library", lambda: None)
    want = split(x, Format.FP8_E4M3, groups, rows=16)
    assert got.fmt == want.fmt and _same(got.scale, want.scale)
    assert _same(got.codes.to(torch.float64), want.codes.to(torch.float64))


def test_split_codes_rejects_what_is_not_a_code(lib):
    x = torch.tensor([[1.0, 1.0 + 2.0**-10]], dtype=torch.float64)
    ok, codes = fp8_native.split_codes(x, Format.FP8_E4M3, torch.ones(1, 1, dtype=torch.float64), SPLIT_TOLERANCE)
    assert not ok and codes is None


@pytest.mark.parametrize("fmt", [Format.INT8, Format.INT4])
@pytest.mark.parametrize("gran", ["thread", "block", "channel", "token", "tensor"])
def test_int_quantized_equals_quantize_int(lib, fmt, gran):
    x = _inputs(4, (1, 2, 70, 32))
    x.view(-1)[10:14] = torch.tensor([0.5, -0.5, 2.5, -3.5], dtype=torch.float64) * 1e-9  # ties near zero
    want = quantize_int(x, fmt, gran, block=16, warp=32, threads=4)
    got = fp8_native.int_quantized(x, fmt, gran, block=16, warp=32, threads=4)
    assert _same(got, want)


def test_abs_max_rows_and_columns_equal_amax_of_abs(lib):
    x = _inputs(5)[..., ::2]  # strided rows
    x[0, 0, 0, 0] = float("nan")
    for t in (x, x.float()):
        for dim in (-1, -2):
            want, got = t.abs().amax(dim, keepdim=True), fp8_native.abs_max(t, dim)
            assert torch.equal(want.isnan(), got.isnan()) and torch.equal(want.nan_to_num(), got.nan_to_num())


def test_torch_path_where_the_library_is_off(monkeypatch):
    monkeypatch.setattr(fp8_native, "library", lambda: None)
    x = _inputs(6)
    scale = amax_scale(x, Format.FP8_E4M3)
    assert _same(fp8_native.scaled(x, Format.FP8_E4M3, scale), quantize_scaled(x, Format.FP8_E4M3, scale))
    assert fp8_native.codes(x, Format.FP8_E4M3, scale) is None
    assert fp8_native.int_quantized(x, Format.INT8, "thread", block=16, warp=32, threads=4) is None


@pytest.mark.parametrize("fmt", [Format.FP8_E4M3, Format.FP8_E5M2])
def test_scaled_to_float32_equals_float64_result_rounded(lib, fmt):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 50, 16, generator=g) * torch.exp2(torch.randint(-20, 20, (2, 3, 50, 1), generator=g))
    for scale in (torch.full((1, 1, 1, 1), 0.013, dtype=torch.float64), torch.rand(2, 3, 50, 1, dtype=torch.float64)):
        want = quantize_scaled(x.double(), fmt, scale).to(torch.float32)
        for xin in (x, x.double()):
            got = fp8_native.scaled(xin, fmt, scale, torch.float32)
            assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), want.view(torch.int32))
    want = quantize_blocks(x.double(), fmt, 16).to(torch.float32)
    assert torch.equal(quantize_blocks(x, fmt, 16, torch.float32).view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("d", [16, 64, 256])
def test_hadamard_butterflies_equal_the_float64_product(lib, d):
    from flashcheck.kernels.sim.fp8 import incoherence_matrix

    g = torch.Generator().manual_seed(d)
    rot = incoherence_matrix(d, 3)
    x = torch.randn(2, 3, 100, d, generator=g).clamp(-4, 4)
    x[x.abs() < 2.0**-12] = 0.0  # a range the float64 sums hold exactly
    x[0, 0, 0] = 0.0
    x[0, 0, 0, 5] = 2.0**-140  # a float32 subnormal beside zeros
    got = fp8_native.hadamard(x, rot)
    assert got is not None and torch.equal(got.view(torch.int64), (x.double() @ rot).view(torch.int64))
    x[1, 2, 50, 0] = 2.0**-30  # beyond the exact range: the caller multiplies
    assert fp8_native.hadamard(x, rot) is None
    assert fp8_native.hadamard(x[..., :32], incoherence_matrix(32, 3)) is None  # 1 / sqrt(32): not a power of two
