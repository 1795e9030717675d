"""Rounding float32 tensors to bf16 / fp16 in place in one pass: a small C routine, compiled on first use.

The simulators round each step's P to the p stage's format (kernels.sim.ops.rnd_). Through torch that is two
casts, float32 -> bf16 into a scratch buffer and back: two passes over the score block, about 13% of the
plain simulator's time. The C routine rounds in place in one pass (bf16: round to nearest even on the bit
pattern, as c10::BFloat16 does; fp16: the compiler's _Float16 conversion, IEEE round to nearest even),
about 3.5 times faster (measured on the 2-core Xeon: 57 us against 200 us for a [8, 512, 128] block).

Bits: rounding to nearest even is unique, so every finite or infinite value rounds as the casts round it;
NaN is left as it is and reported, and the caller then applies torch's casts as well (rounding is
idempotent, so the already rounded values stay, and NaN gets torch's own bits). At load a self-test compares
the routine with torch's casts on ties, subnormals, overflow and random values; any difference disables it.

Built and cached by kernels.native.cbuild (as kernels.native.mma's chain is). Where there is no compiler, the build
fails, the cache is not writable or FLASHCHECK_NATIVE=0, `status()` says why and the callers keep torch's
casts (same bits, slower). `flashcheck doctor` reports the status."""

from __future__ import annotations

import ctypes
import functools

import torch

import flashcheck.kernels.native.cbuild as cbuild


def _probe(dtype: torch.dtype) -> torch.Tensor:
    """Values that exercise the rounding: ties either way, subnormals of both formats, overflow, signs."""
    fi = torch.finfo(dtype)
    ulp1 = 2.0 ** -(fi.bits - (8 if dtype == torch.bfloat16 else 5) - 1)  # the narrow format's ulp at 1
    special = [0.0, -0.0, 1.0, 1 + ulp1 / 2, 1 + 1.5 * ulp1, 1 + ulp1 / 4, fi.max, fi.max * 1.002, fi.tiny / 3]
    special += [fi.tiny * 0.75, 2.0**-149, -(2.0**-140), 3e38, float("inf"), -float("inf")]
    g = torch.Generator().manual_seed(0)
    rand = torch.randn(4099, generator=g) * torch.exp2(torch.randint(-30, 30, (4099,), generator=g).float())
    bits = torch.randint(0, 2**31 - 1, (4099,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor(special, dtype=torch.float32), rand, bits])
    return x[~torch.isnan(x)].contiguous()


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") once it built and every entry point matched torch (_self_test), else (None, why
    not)."""
    what = "P is rounded by two torch casts"
    lib, why = cbuild.load("rounding", what)
    if lib is None:
        return None, why
    why = cbuild.proven("rounding", lib, _self_test, what)
    return (None, why) if why else (lib, "")


def _self_test(lib) -> str:
    """ "" when every entry point gives torch's bits on _probe's values (ties, subnormals, overflow, +-0, +-inf,
    NaN, both signs), else which one differs."""
    for dtype in (torch.bfloat16, torch.float16):
        if dtype == torch.float16 and not lib.fc_has_fp16():
            continue
        x = _probe(dtype)
        want = x.to(dtype).to(torch.float32)
        _round(lib, x, dtype)
        if not _same(x, want):
            return f"the C rounding to {dtype} differs from torch's cast here"
    x = _probe(torch.bfloat16)
    if not _same(_rounded(lib, x, torch.bfloat16), x.to(torch.bfloat16).to(torch.float32)):
        return "fc_round_bf16_copy differs from torch's cast to bf16 here"
    for t in (x, x[torch.isfinite(x)], torch.zeros(5), torch.cat([x, torch.tensor([float("nan")])])):
        got, want = torch.tensor(_abs_stats(lib, t)), torch.tensor(_torch_abs_stats(t))
        if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            return "fc_abs_stats differs from torch's min / max of |x| here"
    return _self_test_max_sub(lib)


def _self_test_max_sub(lib) -> str:
    """fc_max_sub against torch's amax, maximum, where and sub on rows of 1 to 37 values: a row of -inf, a row
    of +-0, subnormals, +inf, both signs, with running maxima below, at and above each row's."""
    g = torch.Generator().manual_seed(1)
    for n in (1, 15, 16, 17, 37):
        s = torch.randn(6, n, generator=g) * 3
        s[0] = -float("inf")
        s[1] = torch.tensor([0.0, -0.0] * n)[:n]
        s[2, 0], s[3, -1], s[4, n // 2] = 2.0**-140, float("inf"), -(2.0**-149)
        m = torch.tensor([-float("inf"), -0.0, 1.0, 0.5, -3.0, 100.0]).view(6, 1)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        ms = torch.where(m_new == -float("inf"), 0.0, m_new)
        want, got = s - ms, s.clone()
        out = _max_sub(lib, got, m)
        if out is None or not (torch.equal(out[0], m_new) and torch.equal(out[1], ms) and _values(got, want)):
            return f"fc_max_sub differs from torch's max step here (rows of {n})"
    return ""


def _values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (the sign of a zero aside: exp takes either to 1)."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _same(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _torch_abs_stats(x: torch.Tensor) -> tuple[float, float, float]:
    """abs_stats' values in torch: (least |x| but NaN, NaN where x has a NaN else the greatest |x|, the least
    nonzero |x| but NaN, inf where none)."""
    a = x.abs()
    nan = a.isnan()
    a = a[~nan]
    nz = a[a != 0]
    hi = float("nan") if bool(nan.any()) else float(a.max())
    return float(a.min()), hi, float(nz.min()) if nz.numel() else float("inf")


def _call(lib: ctypes.CDLL, dtype: torch.dtype, x: torch.Tensor) -> int:
    fn = lib.fc_round_bf16 if dtype == torch.bfloat16 else lib.fc_round_fp16
    return fn(x.data_ptr(), x.numel())


def status() -> dict:
    """{"available": bool, "formats": [...], "reason": str} for `flashcheck doctor`."""
    lib, why = _library()
    formats = [] if lib is None else ["bf16", *(["fp16"] if lib.fc_has_fp16() else [])]
    return {"available": lib is not None, "formats": formats, "reason": why}


def round_(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Round the float32 CPU tensor x [any shape, contiguous] to `dtype` (bf16 or fp16) in place, as
    x.copy_(x.to(dtype)) does, bit for bit. False (x untouched) where the routine is unavailable or does not
    apply; the caller then casts."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous() or x.requires_grad:
        return False
    lib = _library()[0]
    if lib is None or dtype not in (torch.bfloat16, torch.float16) or x.numel() == 0:
        return False
    if dtype == torch.float16 and not lib.fc_has_fp16():
        return False
    _round(lib, x, dtype)
    return True


def _round(lib, x: torch.Tensor, dtype: torch.dtype) -> None:
    if _call(lib, dtype, x):  # a NaN: torch's casts give it their own bits (the rounded values stay)
        x.copy_(x.to(dtype))


def max_sub_(s: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The online softmax's max step for NaN-free float32 CPU tensors s [..., R, N] (contiguous) and m [..., R, 1]:
    returns (m_new, ms) with m_new = max(m, s.amax(-1)), ms = m_new with -inf as 0, and s -= ms in place, in
    one pass (each row while in cache). The values torch's amax, maximum, where and sub_ give, up to the sign of a
    zero maximum (exp takes either to 1). None (s untouched) where the routine is unavailable or does not apply."""
    ok = s.dtype == m.dtype == torch.float32 and s.device.type == m.device.type == "cpu"
    if not (ok and s.is_contiguous() and m.is_contiguous() and s.shape[:-1] == m.shape[:-1] and s.shape[-1] > 0):
        return None
    lib = _library()[0]
    if lib is None or s.requires_grad:
        return None
    return _max_sub(lib, s, m)


def _max_sub(lib, s: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m_new, ms = torch.empty_like(m), torch.empty_like(m)
    lib.fc_max_sub(s.data_ptr(), m.numel(), s.shape[-1], m.data_ptr(), m_new.data_ptr(), ms.data_ptr())
    return m_new, ms


def rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A fresh float32 tensor holding x (float32 CPU, contiguous, no grad) rounded to bf16 in one pass, as
    x.to(dtype).to(torch.float32) gives it, bit for bit; None where the routine does not apply (then cast)."""
    if dtype != torch.bfloat16 or x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        return None
    lib = _library()[0]
    if lib is None or x.requires_grad or x.numel() == 0:
        return None
    return _rounded(lib, x, dtype)


def _rounded(lib, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if lib.fc_round_bf16_copy(x.data_ptr(), out.data_ptr(), x.numel()):  # a NaN: torch's cast gives its bits
        out.copy_(out.to(dtype))
    return out


def abs_stats(x: torch.Tensor) -> tuple[float, float, float] | None:
    """(min |x|, max |x| (NaN where x has a NaN), the least nonzero |x| (inf where none)) of a float32 CPU
    tensor in one pass, or None where the routine does not apply. Exact: no arithmetic but |.|."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous() or x.numel() == 0:
        return None
    lib = _library()[0]
    return None if lib is None else _abs_stats(lib, x)


def _abs_stats(lib, x: torch.Tensor) -> tuple[float, float, float]:
    out = (ctypes.c_float * 3)()
    lib.fc_abs_stats(x.data_ptr(), x.numel(), out)
    return out[0], out[1], out[2]
