"""kernels.native.mma (the block-FMA chain in C) against kernels.tensorcore.mma's torch chain: the same bits on every
rule,
shape, stride and thread count; the fallback and its reason where there is no C library."""

from __future__ import annotations

import pytest
import torch

from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native.mma import operands
from flashcheck.kernels.tensorcore import mma
from flashcheck.kernels.tensorcore.mma import ADA, B200, HOPPER, MMAModel, _matmul, mma_matmul
from helpers import torch_threads


@pytest.fixture(scope="module")
def lib():
    if cbuild.compiler() is None or cbuild.disabled():
        pytest.skip("no C compiler here (or FLASHCHECK_NATIVE=0): the torch chain runs")
    lib = mma.native_library()
    assert lib is not None, mma.native_status()["reason"]  # a compiler is here: the C chain must build and pass
    return lib


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


CASES = [  # model, formats, promote_every, fp16, c scale
    (HOPPER, ("e4m3", "e4m3"), None, False, 1e3),
    (ADA, ("e4m3", "e5m2"), 64, False, 1.0),
    (ADA, ("e2m1", "e2m3"), 32, True, 10.0),
    (B200, ("e4m3", "e4m3"), None, False, 1e4),
    (B200, ("fp32", "e4m3"), None, False, 1.0),
    (HOPPER, ("fp32", "fp32"), 96, False, 0.0),
    (MMAModel(name="wide", nfma=8, frac=30, frac_out=20), ("e4m3", "e4m3"), None, False, 1.0),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_c_chain_bit_equal_to_torch_chain(lib, case):
    """Random format values (subnormals, zeros, both signs), ragged K and N (not whole blocks or vectors)."""
    model, fmts, promote, fp16, c_scale = CASES[case]
    a = operands(fmts[0], (3, 7, 150), 10 + case)
    b = operands(fmts[1], (3, 150, 21), 20 + case)
    b[1, :, 3] = 0.0  # a column of no products: c alone in every block
    c = (operands("fp32", (3, 7, 21), 30 + case) * c_scale).to(torch.float32)
    want = _matmul(a, b, model, c, promote, fmts, fp16, None)
    got = _matmul(a, b, model, c, promote, fmts, fp16, lib)
    assert _same(got, want)


def test_strides_broadcast_and_threads(lib, monkeypatch):
    """A transposed b, a batch dim broadcast, and rows split between threads give the bits of one thread."""
    from flashcheck.kernels.native import mma as mma_native

    a = operands("e4m3", (2, 1, 40, 64), 1)
    bt = operands("e4m3", (1, 3, 48, 64), 2)  # [.., N, K]: b is its transpose (strided, not contiguous)
    fmts = ("e4m3", "e4m3")
    want = _matmul(a, bt.transpose(-1, -2), HOPPER, None, None, fmts, False, None)
    threads = torch.get_num_threads()
    monkeypatch.setattr(mma_native, "MIN_ROWS_PER_THREAD", 1)
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert _same(_matmul(a, bt.transpose(-1, -2), HOPPER, None, None, fmts, False, lib), want)
    finally:
        torch.set_num_threads(threads)


def test_public_entry_runs_c_and_keeps_fp32_results(lib):
    p = operands("e4m3", (8, 96), 5).abs()
    v = operands("e4m3", (96, 16), 6)
    out = mma_matmul(p, v, HOPPER)
    assert out.dtype == torch.float32 and out.shape == (8, 16)
    assert _same(out, _matmul(p, v, HOPPER, None, None, ("e4m3", "e4m3"), False, None))


def test_fallback_reason_where_disabled(monkeypatch):
    monkeypatch.setenv("FLASHCHECK_NATIVE", "0")
    loaded, why = cbuild.load("mma", "kernels.tensorcore.mma runs its torch chain")
    assert loaded is None and "FLASHCHECK_NATIVE=0" in why
    monkeypatch.setenv("FLASHCHECK_NATIVE", "1")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    loaded, why = cbuild.load("mma", "kernels.tensorcore.mma runs its torch chain")
    assert loaded is None and "$CC=no-such-compiler-here: not found" in why


def test_doctor_reports_the_c_chain():
    from flashcheck.doctor import _native_mma

    got = _native_mma()
    assert set(got) == {"available", "reason"} and got["available"] == (mma.native_library() is not None)


FAST_CASES = [  # model, formats, fp16, (Bt, M, K, N), b transposed: the tiles' int32 (early c, frac <= 13) and
    # float64 (late c, frac 25) block sums, b in place (contiguous, N a multiple of 16) or copied, row groups of
    # 64 across batches, several L1 chunks of k, ragged K and N
    (HOPPER, ("e4m3", "e4m3"), False, (2, 70, 150, 128), False),
    (HOPPER, ("e5m2", "e4m3"), False, (3, 9, 77, 40), True),
    (ADA, ("e4m3", "e4m3"), True, (2, 33, 130, 64), False),  # an fp16 register: overflows to inf and stays
    (ADA, ("e2m1", "e2m3"), False, (2, 17, 100, 32), False),  # int-like codes
    (B200, ("e4m3", "e4m3"), False, (2, 70, 150, 128), False),
    (B200, ("e5m2", "e5m2"), True, (2, 9, 45, 70), True),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(FAST_CASES)))
def test_c_tiles_bit_equal_to_torch_chain_at_1_and_2_threads(lib, monkeypatch, case, threads):
    """The C chain's tiles against the torch chain (kernels.tensorcore.mma's torch segments) on random format values
    with
    zeros, subnormals, zero columns and c with tiny, subnormal, zero and huge values."""
    from flashcheck.kernels.native import mma as mma_native

    model, fmts, fp16, (bt, m, k, n), transposed = FAST_CASES[case]
    a = operands(fmts[0], (bt, m, k), 40 + case)
    b = operands(fmts[1], (bt, n, k) if transposed else (bt, k, n), 50 + case)
    b = b.transpose(-1, -2) if transposed else b
    b[0, :, 5] = 0.0  # no products: c alone
    a[1, 2] = 0.0
    c = (operands("fp32", (bt, m, n), 60 + case) * 1e3).to(torch.float32)
    c[0, 0, :5] = torch.tensor([2.0**-60, -(2.0**-140), 0.0, -3.0, 1e30])
    want = _matmul(a, b, model, c, None, fmts, fp16, None)
    monkeypatch.setattr(mma_native, "MIN_ROWS_PER_THREAD", 1)
    with torch_threads(threads):
        got = _matmul(a, b, model, c, None, fmts, fp16, lib)
    assert _same(got, want)
    if fp16 and model is ADA:
        assert bool(torch.isinf(want).any())  # the overflow case is exercised


def _values(shape: tuple[int, ...], seed: int, bits: int, lo: int, hi: int) -> torch.Tensor:
    """float64 values of exactly `bits` significant bits with exponents lo..hi (both present), both signs, 15%
    zeros: "fp32" operands in and out of the range where fc_mma_chain_f64 runs them in float32."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(2 ** (bits - 1), 2**bits, shape, generator=g) | 1
    e = torch.randint(lo, hi + 1, shape, generator=g)
    e.view(-1)[:2] = torch.tensor([lo, hi])
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    x = sign * m.double() * torch.exp2((e - bits + 1).double())
    return torch.where(torch.rand(shape, generator=g) < 0.15, 0.0, x)


WIDE_CASES = [  # model, (bits, lo, hi) of a and of b, c's largest exponent (None: c = 0); K = 150: log2 K <= 8.
    # The float32 tile takes: bits_a + bits_b <= 24, lo_a + lo_b >= frac - 126, hi_a + hi_b + 2 + 8 <= 125, c's
    # exponent <= 125; the rest runs the float64 tile (each case's neighbour across a bound)
    (B200, (6, -10, 3), (6, -8, 2), 10),
    (HOPPER, (12, -6, 6), (12, -6, 6), 20),
    (HOPPER, (12, -6, 6), (13, -6, 6), 20),
    (HOPPER, (4, -57, -50), (4, -56, -50), None),
    (HOPPER, (4, -57, -50), (4, -57, -50), None),
    (B200, (4, -51, -40), (4, -50, -40), 0),
    (B200, (4, 0, 58), (4, 0, 57), 100),
    (B200, (4, 0, 58), (4, 0, 58), 100),
    (HOPPER, (4, -5, 5), (4, -5, 5), 125),
    (HOPPER, (4, -5, 5), (4, -5, 5), 126),
    (ADA, (4, -3, 3), (2, 0, 2), None),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(WIDE_CASES)))
def test_fp32_operands_bit_equal_to_torch_chain_on_both_tiles(lib, monkeypatch, case, threads):
    """Dequantised ("fp32") operands, in and out of the range where the C chain runs them in float32, give the
    torch chain's bits (ragged K and N, zeros, a column of no products, b copied and in place)."""
    from flashcheck.kernels.native import mma as mma_native

    model, (ba, la, ha), (bb, lb, hb), ce = WIDE_CASES[case]
    fmts = ("fp32", "fp32")
    a = _values((2, 9, 150), 70 + case, ba, la, ha)
    b = _values((2, 40, 150), 80 + case, bb, lb, hb).transpose(-1, -2)  # copied (strided, N ragged)
    b[0, :, 5] = 0.0
    b2 = _values((2, 150, 64), 90 + case, bb, lb, hb)  # in place
    c = torch.zeros(2, 9, 64) if ce is None else operands("e4m3", (2, 9, 64), 60 + case).to(torch.float32)
    if ce is not None:
        c[0, 0, 0] = 2.0**ce
    monkeypatch.setattr(mma_native, "MIN_ROWS_PER_THREAD", 1)
    for bm, cm in ((b, c[..., :40]), (b2, c)):
        want = _matmul(a, bm, model, cm, None, fmts, False, None)
        with torch_threads(threads):
            got = _matmul(a, bm, model, cm, None, fmts, False, lib)
        assert _same(got, want)


def test_mma_into_continues_acc_as_mma_matmul(lib):
    a = operands("e4m3", (2, 5, 70), 1).float()
    b = operands("e4m3", (2, 70, 12), 2).float()
    c = operands("fp32", (2, 5, 12), 3).float() + 0.0  # the start holds no -0
    for model in (HOPPER, B200):
        want = mma_matmul(a, b, model, c=c, fmt="e4m3")
        acc = c.clone()
        assert mma.mma_into(a, b, model, acc, fmt="e4m3")
        assert _same(acc, want)
    acc = c.clone()
    assert not mma.mma_into(a.double(), b.double(), HOPPER, acc, fmt="fp32")  # the float64 variant: not in place
    assert not mma.mma_into(a, b, HOPPER, acc.double(), fmt="e4m3")
    assert _same(acc, c)


def test_pv_accumulate_rescale_fold_equals_rescale_first(lib):
    from flashcheck.core.numerics import parse_policy
    from flashcheck.kernels.sim.mma_ops import Operand, pv_accumulate

    pol = parse_policy("fa3-fp8")
    g = torch.Generator().manual_seed(5)
    p = Operand(operands("e4m3", (1, 2, 9, 64), 7).float(), torch.ones(1, 1, 1, 1, dtype=torch.float64), "e4m3")
    for scale in (torch.full((1, 1, 1, 1), 0.37 / 448, dtype=torch.float64), torch.rand(1, 2, 1, 16, generator=g)):
        v = Operand(operands("e4m3", (1, 2, 64, 16), 8).float(), scale.to(torch.float64), "e4m3")
        o = torch.randn(1, 2, 9, 16, generator=g)
        alpha = torch.rand(1, 2, 9, 1, generator=g)
        want = o.clone().mul_(alpha)
        pv_accumulate(p, v, want, 256.0, pol, HOPPER)
        got = o.clone()
        pv_accumulate(p, v, got, 256.0, pol, HOPPER, alpha=alpha, buf=torch.empty(o.shape))
        assert _same(got, want)


E2M1S_CASES = [  # model, formats (the "e2m1s" side's float64 twin is "fp32"), promote_every, fp16, c scale
    (B200, ("e2m1s", "e2m1s"), None, False, 1e3),  # fa4-fp4's and sage3-fp4's Q K^T, sage3-fp4's P V
    (B200, ("e4m3", "e2m1s"), None, False, 1.0),  # fa4-fp4's P V (P e4m3 codes)
    (HOPPER, ("e2m1s", "e2m1s"), None, False, 2.0**-20),
    (ADA, ("e2m1s", "e4m3"), 32, True, 10.0),
    (ADA, ("e2m1s", "e2m1s"), 64, False, 0.0),
]


@pytest.mark.parametrize("case", range(len(E2M1S_CASES)))
def test_e2m1s_operands_bit_equal_to_fp32_operands(lib, case):
    """Block-scaled FP4 values e2m1 x e4m3 as float32 "e2m1s" operands (c/mma.c's f32 variant) give the
    bits
    of the same values as float64 "fp32" operands (the f64 variant, and the torch chain of each): random values
    with zeros and e4m3-subnormal scales, the extremes 2^-10 and 2688, ragged K and N, a column of no products."""
    model, fmts, promote, fp16, c_scale = E2M1S_CASES[case]
    a = operands(fmts[0], (3, 7, 150), 110 + case)
    b = operands(fmts[1], (3, 150, 21), 120 + case)
    if fmts[0] == "e2m1s":
        a[0, 0, :3] = torch.tensor([2.0**-10, -2688.0, 0.5 * 2.0**-7])  # e2m1's 0.5 times e4m3's extremes
        a[1, 2] = operands("e2m1", (150,), 140 + case) * 2.0**-9  # a row of e4m3's smallest scale: no clamping
        a[2, 3] = 240.0  # with b's column below, every term the largest one (significands 1.875): int32 sums
    b[2, :, 5] = -1.875 if fmts[1] == "e2m1s" else -448.0
    b[1, :, 3] = 0.0
    c = (operands("fp32", (3, 7, 21), 130 + case) * c_scale).to(torch.float32)
    twin = tuple("fp32" if f == "e2m1s" else f for f in fmts)
    a64, b64 = (x if f == "e2m1s" else x.to(torch.float32) for x, f in ((a, fmts[0]), (b, fmts[1])))
    want = _matmul(a64, b64, model, c, promote, twin, fp16, lib)
    assert _same(_matmul(a64, b64, model, c, promote, twin, fp16, None), want)
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    for chain in (lib, None):
        assert _same(_matmul(a32, b32, model, c, promote, fmts, fp16, chain), want)


def test_fp4_operands_enter_as_e2m1s_and_others_fall_back():
    """The quantisers' block-scaled values (NVFP4's with subnormal block scales, SageAttention3's Q K V and P)
    become "e2m1s" operands; a value "e2m1s" cannot hold (too small, too large, too many bits, a significand
    above 1.875, not a float32) keeps the whole operand "fp32" (the float64 path)."""
    from flashcheck.core.quant import nvfp4_parts
    from flashcheck.kernels.formats.sage3 import quantize_fp4x16, sage3_p
    from flashcheck.kernels.sim.mma_ops import _fp4_scaled, block_scaled

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 64, 48, generator=g) * torch.exp2(torch.randint(-12, 6, (2, 3, 64, 1), generator=g))
    x[0, 0, 0] = 1e-30  # a block whose e4m3 scale is subnormal or 0 against the tensor's amax
    for op in (
        block_scaled(nvfp4_parts(x)),
        _fp4_scaled(quantize_fp4x16(x)),
        _fp4_scaled(quantize_fp4x16(x, dim=-2)),
        _fp4_scaled(sage3_p(torch.rand(2, 3, 64, 48, generator=g) ** 8)),
    ):
        assert op.fmt == "e2m1s" and op.codes.dtype == torch.float32
    good = quantize_fp4x16(x)
    for bad in (2.0**-11, 4096.0, 1.0 + 2.0**-6, 1.9375, 1.0 + 2.0**-30):
        y = good.clone()
        y[1, 2, 3, 4] = bad
        op = _fp4_scaled(y)
        assert op.fmt == "fp32" and op.codes.dtype == torch.float64 and torch.equal(op.codes, y)
