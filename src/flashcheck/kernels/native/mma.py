"""kernels.tensorcore.mma's block-FMA chain in C (c/mma.c, c/mma.h): the same rules, the same bits, without
materialising the [..., M, N, K] products (torch's chain forms every product and every truncated term as a
tensor: fa4-fp8 and fa4-fp4 then cost 170 and 195 times the plain simulator at L=2048). Built on first use by
kernels.native.cbuild; output rows are split between torch's intra-op threads (ctypes releases the GIL; each
row's arithmetic is exact and independent of the split, so the bits do not depend on it).

kernels.tensorcore.mma self-tests the library at load against its torch chain (mma._selftest_cases: zeros,
subnormals, late c, an fp16 register and its overflow, tiny and subnormal c, float64 operands) through
cbuild.proven, which also requires both entry points to be exercised; any difference disables it with the reason,
and kernels.tensorcore.mma keeps its torch chain. kernels.tensorcore.mma.native_status() is what `flashcheck
doctor` reports."""

from __future__ import annotations

import ctypes
import functools
import math
from concurrent.futures import ThreadPoolExecutor

import torch

import flashcheck.kernels.native.cbuild as cbuild

# significand bits (mantissa + 1) of the narrow operand formats: their products are exact in float32. "e2m1s"
# (kernels.tensorcore.mma.EMIN): e2m1 x e4m3 values, 2 + 4 bits; exponents in [-10, 11], within the f32 variant's int8
# range
# (kept in [emin, 16]; a nonzero product's exponent sum >= 2 emin >= -28, the tile's efloor)
SIG_BITS = {"e4m3": 4, "e5m2": 3, "e2m1": 2, "e2m3": 4, "e3m2": 3, "e2m1s": 6}
# the largest significand of a format's values where below (2 - 2^(1 - SIG_BITS)): e2m1 x e4m3's is 1.875 (1 x
# 1.875, 1.5 x 1.25; a product of 2 or more halves), as e4m3's
SIG_MAX = {"e2m1s": 1.875}
MIN_ROWS_PER_THREAD = 1 << 21  # products per thread below which one thread does the call (a decoding step)


@functools.cache
def _sub(model, fa: str, fb: str) -> int:
    """k per int32 partial sum: each truncated term is below (2 - 2^(1-s_a)) (2 - 2^(1-s_b)) 2^frac (SIG_MAX's
    significands where given), c's below 2^(frac + 1); the partial sums stay below 2^31."""
    sig = [SIG_MAX.get(f, 2.0 - 2.0 ** (1 - SIG_BITS[f])) for f in (fa, fb)]
    term = sig[0] * sig[1] * 2.0**model.frac
    return max(1, min(model.nfma, int((2.0**31 - 2.0 ** (model.frac + 1)) // term)))


@functools.cache
def variant(model, fa: str, fb: str) -> str:
    """ "f32" where the narrow products and their scaled terms are exact in float32, else "f64"."""
    narrow = fa in SIG_BITS and fb in SIG_BITS and SIG_BITS[fa] + SIG_BITS[fb] <= 24
    return "f32" if narrow and model.frac <= 25 and _sub(model, fa, fb) >= 1 else "f64"


def load() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library, "") or (None, why not); kernels.tensorcore.mma self-tests it before use."""
    return cbuild.load("mma", "kernels.tensorcore.mma runs its torch chain")


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept for the process (a call's rows are split between its workers)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="flashcheck-mma")


def _threads(work: int, rows: int) -> int:
    return max(1, min(torch.get_num_threads(), rows, work // MIN_ROWS_PER_THREAD))


def _run(lib, a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor, model, fmts, emins, fp16: bool) -> None:
    """acc [Bt, M, N] (updated in place) continued over a [Bt, M, K] and b [Bt, K, N], any strides, all of
    the variant's dtype (float32 for "f32", float64 for "f64")."""
    bt, m, k = a.shape
    n = b.shape[-1]
    f32 = a.dtype == torch.float32
    fn = lib.fc_mma_chain_f32 if f32 else lib.fc_mma_chain_f64
    sub = _sub(model, *fmts) if f32 else model.nfma
    params = (*emins, model.nfma, model.frac, model.frac_out, model.min_exp, model.late_c, fp16, sub)
    views = tuple(x for t in (a, b, acc) for x in (t.data_ptr(), *t.stride()))
    rows = bt * m
    threads = _threads(rows * n * k, rows)

    def part(r0: int, r1: int) -> int:
        return fn(*views, r0, r1, m, n, k, *params)

    if threads == 1:
        codes = [part(0, rows)]
    else:
        step = math.ceil(rows / threads)
        codes = list(_pool(threads).map(lambda r0: part(r0, min(rows, r0 + step)), range(0, rows, step)))
    if any(codes):
        raise MemoryError("kernels.native.mma: out of memory for the chain's row buffers")


def work_dtype(model, fmts: tuple[str, str]) -> torch.dtype:
    """The dtype of the chain's operands and accumulator in C: float32 for the "f32" variant, else float64."""
    return torch.float32 if variant(model, *fmts) == "f32" else torch.float64


def chain(lib, a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor, model, fmts: tuple[str, str], emins, fp16: bool):
    """acc [..., M, N] (work_dtype's, updated in place and returned) continued over a [..., M, K] @ b [..., K, N]
    (batch dims broadcast against acc's) by the library `lib` (load's), as kernels.tensorcore.mma's torch chain computes
    it. fmts: the operand formats, emins: their clamping exponents."""
    dtype = acc.dtype
    batch = acc.shape[:-2]
    a3, b3 = (_batched(x.to(dtype), batch) for x in (a, b))
    _run(lib, a3, b3, acc.view(-1, *acc.shape[-2:]), model, fmts, emins, fp16)
    return acc


def _batched(x: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """x [..., R, C] broadcast to [*batch, R, C] and flattened to [prod(batch), R, C] (a view where it can be)."""
    if x.dim() == 3 and len(batch) == 1 and x.shape[0] == batch[0]:
        return x
    return x.expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:])


# (mantissa bits, emin, emax) of the operand formats, for the self-test's operands
_GRID = {"e4m3": (3, -6, 8), "e5m2": (2, -14, 15), "e2m1": (1, 0, 2), "e2m3": (3, 0, 2), "e3m2": (2, -2, 4)}


def operands(fmt: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random float64 values exact in `fmt` [shape]: every exponent, subnormals, both signs, 15% zeros, ties of
    equal magnitudes; "fp32": float32 values from 2^-149 to 2^20 (subnormals included); "e2m1s": e2m1 values
    times e4m3 ones (subnormal scales included)."""
    if fmt == "e2m1s":
        return operands("e2m1", shape, seed) * operands("e4m3", shape, seed + 7919).abs()
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    zero = torch.rand(shape, generator=g) < 0.15
    if fmt == "fp32":
        x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(
            torch.randint(-150, 20, shape, generator=g).double()
        )
        return torch.where(zero, 0.0, x.to(torch.float32).double())
    mb, emin, emax = _GRID[fmt]
    e = torch.randint(emin - 1, emax + 1, shape, generator=g)  # emin - 1: a subnormal
    j = torch.randint(0, 2**mb, shape, generator=g).double() / 2**mb
    x = torch.where(e < emin, j * 2.0**emin, (1 + j) * torch.exp2(e.double()))
    return torch.where(zero, 0.0, sign * x)
