"""kernels.mma_native (the block-FMA chain in C) against kernels.mma's torch chain: the same bits on every rule,
shape, stride and thread count; the fallback and its reason where there is no C library."""

from __future__ import annotations

import pytest
import torch

from flashcheck.kernels import cbuild, mma
from flashcheck.kernels.mma import ADA, B200, HOPPER, MMAModel, _matmul, mma_matmul
from flashcheck.kernels.mma_native import operands


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
    from flashcheck.kernels import mma_native

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
    loaded, why = cbuild.load("mma", "int x;", "kernels.mma runs its torch chain")
    assert loaded is None and "FLASHCHECK_NATIVE=0" in why
    monkeypatch.setenv("FLASHCHECK_NATIVE", "1")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    loaded, why = cbuild.load("mma", "int x;", "kernels.mma runs its torch chain")
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
    """The C chain's tiles against the torch chain (kernels.mma's torch segments) on random format values with
    zeros, subnormals, zero columns and c with tiny, subnormal, zero and huge values."""
    from flashcheck.kernels import mma_native

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
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = _matmul(a, b, model, c, None, fmts, fp16, lib)
    finally:
        torch.set_num_threads(before)
    assert _same(got, want)
    if fp16 and model is ADA:
        assert bool(torch.isinf(want).any())  # the overflow case is exercised
