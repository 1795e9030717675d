"""kernels/native/c/mma.c's block finalisation on float32 bits (tile_late: B200's late c, two int32 partial sums;
tile_early:
the early-c int32 sum) against kernels.tensorcore.mma's float64 torch chain, the oracle, on crafted cases: the int32
sum of
the two halves overflowing (32 terms near 2^27 of one sign), results near fp32's normal floor and its largest
values, zeros, negative sums, ragged K and N, 1 and 2 threads."""

from __future__ import annotations

import pytest
import torch

from flashcheck.kernels.native import cbuild
from flashcheck.kernels.native.mma import operands
from flashcheck.kernels.tensorcore import mma
from flashcheck.kernels.tensorcore.mma import ADA, B200, HOPPER, _matmul
from helpers import torch_threads


@pytest.fixture(scope="module")
def lib():
    if cbuild.compiler() is None or cbuild.disabled():
        pytest.skip("no C compiler here (or FLASHCHECK_NATIVE=0): the torch chain runs")
    lib = mma.native_library()
    assert lib is not None, mma.native_status()["reason"]
    return lib


def _oracle(a, b, model, c, fmts) -> torch.Tensor:
    """kernels.tensorcore.mma's float64 torch chain (_chain, not _chain_fast: a c below 2^-100 selects it)."""
    c = c.clone()
    c.view(-1)[-1] = 2.0**-120
    return _matmul(a, b, model, c, None, fmts, False, None), c


def _check(lib, monkeypatch, a, b, model, c, fmts, threads: int) -> torch.Tensor:
    from flashcheck.kernels.native import mma as mma_native

    want, c = _oracle(a, b, model, c, fmts)
    monkeypatch.setattr(mma_native, "MIN_ROWS_PER_THREAD", 1)
    with torch_threads(threads):
        got = _matmul(a, b, model, c, None, fmts, False, lib)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    return want


def _big_terms(rows: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 operands whose block terms sit near 2^27 (1.875 x 1.875 2^25 = 1.18e8): row 0 all positive, row 1 all
    negative (the int32 sum of 32 such terms overflows both ways), row 2 alternating (no overflow), the rest
    random; b's column 3 zero (no products: c alone)."""
    a = operands("e4m3", (rows, k), 1)
    b = operands("e4m3", (k, n), 2)
    a[:3] = 1.875 * 2.0**3
    a[1] = -a[1]
    a[2, 1::2] = -a[2, 1::2]
    b[:, :8] = 1.875 * 2.0**-2
    b[:, 3] = 0.0
    return a, b


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [32, 64, 45, 77])
def test_late_c_int32_overflow_takes_the_float64_route(lib, monkeypatch, threads, k):
    """32 terms of one sign near 2^27: s1 + s2 overflows int32 (those vectors take the float64 route); ragged K
    (a last block of 13 k: halves 6 + 7), N = 40 (ragged: a copied b)."""
    a, b = _big_terms(7, k, 40)
    term = 1.875 * 1.875 * 2.0**25  # each product's term: E is its own exponent, 2^(frac - E) = 2^25 / 2^E
    assert 32 * term > 2.0**31  # the crafted rows overflow int32 in a whole block
    c = operands("fp32", (7, 40), 3).to(torch.float32)
    want = _check(lib, monkeypatch, a, b, B200, c, ("e4m3", "e4m3"), threads)
    assert bool((want[0, :3] > 0).all()) and bool((want[1, :3] < 0).all())


def _values(shape: tuple[int, ...], seed: int, lo: int, hi: int) -> torch.Tensor:
    """float64 values of 4 significant bits with exponents lo..hi (both present), both signs, 10% zeros."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(8, 16, shape, generator=g).double()
    e = torch.randint(lo, hi + 1, shape, generator=g)
    e.view(-1)[:2] = torch.tensor([lo, hi])
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    x = sign * m * torch.exp2((e - 3).double())
    return torch.where(torch.rand(shape, generator=g) < 0.1, 0.0, x)


@pytest.mark.parametrize("threads", [1, 2])
def test_late_c_results_at_fp32_extremes(lib, monkeypatch, threads):
    """c at fp32's largest values, zero, subnormal and tiny; negative sums; and float64 ("fp32") operands at the
    bounds of the f32 tile (products down to 2^(frac - 126), results near 2^-100; products up to 2^118, results
    near 2^124) and just across them (the float64 tile)."""
    a, b = _big_terms(6, 64, 32)
    c = torch.zeros(6, 32, dtype=torch.float32)
    big = torch.finfo(torch.float32).max
    c[0, :8] = big
    c[1, :8] = -big
    c[2, :4] = torch.tensor([2.0**-149, -(2.0**-126), 1e-30, -3.0])
    want = _check(lib, monkeypatch, a, b, B200, c, ("e4m3", "e4m3"), threads)
    assert bool((want[0, :3] == big).all()) and bool((want[1, :3] == -big).all())
    fp32 = ("fp32", "fp32")
    for (la, ha), (lb, hb) in (((-51, -45), (-50, -45)), ((-51, -45), (-51, -45))):  # la + lb = frac - 126, - 127
        x, y = _values((5, 64), 7, la, ha), _values((64, 32), 8, lb, hb)
        want = _check(lib, monkeypatch, x, y, B200, torch.zeros(5, 32, dtype=torch.float32), fp32, threads)
        assert 0 < float(want[want != 0].abs().min()) < 2.0**-80
    for hi in (55, 58):  # 55 + 55 + 2 + log2(64) <= 125: the f32 tile; 58: the float64 tile
        x, y = _values((5, 64), 9, 40, hi), _values((64, 32), 10, 40, hi)
        c = (operands("e4m3", (5, 32), 11) * 2.0**100).to(torch.float32)
        want = _check(lib, monkeypatch, x, y, B200, c, fp32, threads)
        assert float(want.abs().max()) > 2.0**110


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("model", [ADA, HOPPER], ids=lambda m: m.name)
def test_early_c_zero_subnormal_and_huge_c(lib, monkeypatch, threads, model):
    """tile_early: c zero, subnormal, huge (its exponent E, every product's term 0) and negative, rows and
    columns without products, ragged K and N."""
    a = operands("e4m3", (2, 9, 77), 11)
    b = operands("e4m3", (2, 77, 48), 12)
    a[0, 3] = 0.0
    b[1, :, 7] = 0.0
    c = (operands("fp32", (2, 9, 48), 13) * 1e3).to(torch.float32)
    c[0, 0, :6] = torch.tensor([0.0, 2.0**-149, -(2.0**-130), 1e30, -1e30, -3.0])
    c[0, 3] = 0.0  # no products and c = 0
    _check(lib, monkeypatch, a, b, model, c, ("e4m3", "e4m3"), threads)
