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

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* x[i] rounded to bf16 (nearest, ties to even) in place; NaN left as it is. Returns 1 if it saw a NaN. */
int fc_round_bf16(float *x, int64_t n) {
    uint32_t *u = (uint32_t *)x;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = u[i];
        int is_nan = (v & 0x7FFFFFFFu) > 0x7F800000u;
        nan |= is_nan;
        u[i] = is_nan ? v : ((v + 0x7FFFu + ((v >> 16) & 1u)) & 0xFFFF0000u);
    }
    return nan;
}

/* Per row r of s [rows, n]: m_new[r] = max(m_old[r], max_j s[r, j]), ms[r] = m_new[r] (0 where -inf), and
   s[r, :] -= ms[r], the row still in cache. For NaN-free s and m_old only (the caller's guarantee). */
void fc_max_sub(float *s, int64_t rows, int64_t n, const float *m_old, float *m_new, float *ms) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * n;
        int64_t j = 0;
        float mx = -__builtin_inff();
#ifdef __AVX512F__
        __m512 vm = _mm512_set1_ps(-__builtin_inff());
        for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(row + j));
        mx = _mm512_reduce_max_ps(vm);
#endif
        for (; j < n; j++) mx = row[j] > mx ? row[j] : mx;
        float mn = m_old[r] > mx ? m_old[r] : mx;
        float sub = mn == -__builtin_inff() ? 0.0f : mn;
        m_new[r] = mn;
        ms[r] = sub;
        for (int64_t j = 0; j < n; j++) row[j] = row[j] - sub;
    }
}

/* dst[i] = src[i] rounded to bf16 (as fc_round_bf16), one pass; returns 1 if it saw a NaN (left as it is). */
int fc_round_bf16_copy(const float *src, float *dst, int64_t n) {
    const uint32_t *s = (const uint32_t *)src;
    uint32_t *u = (uint32_t *)dst;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = s[i];
        int is_nan = (v & 0x7FFFFFFFu) > 0x7F800000u;
        nan |= is_nan;
        u[i] = is_nan ? v : ((v + 0x7FFFu + ((v >> 16) & 1u)) & 0xFFFF0000u);
    }
    return nan;
}

/* |x|'s least, greatest and least nonzero value (inf where every entry is 0) over x[0:n], in out[0..2];
   returns 1 (out[1] then NaN) if some entry is NaN. */
int fc_abs_stats(const float *x, int64_t n, float *out) {
    float lo = __builtin_inff(), hi = 0.0f, nz = __builtin_inff();
    int nan = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_setzero_ps(), vnz = vlo, inf = vlo, zero = vhi;
    __mmask16 vnan = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        vnan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        vlo = _mm512_min_ps(a, vlo);
        vhi = _mm512_max_ps(a, vhi);
        vnz = _mm512_min_ps(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ), inf, a), vnz);
    }
    nan = vnan != 0;
    lo = _mm512_reduce_min_ps(vlo);
    hi = _mm512_reduce_max_ps(vhi);
    nz = _mm512_reduce_min_ps(vnz);
#endif
    for (; i < n; i++) {
        float a = __builtin_fabsf(x[i]);
        nan |= a != a;
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
        nz = (a < nz && a > 0.0f) ? a : nz;
    }
    out[0] = lo;
    out[1] = nan ? __builtin_nanf("") : hi;
    out[2] = nz;
    return nan;
}

#ifdef __FLT16_MAX__
/* x[i] rounded to fp16 (IEEE binary16, nearest even, overflow to inf) in place; NaN left as it is. */
int fc_round_fp16(float *x, int64_t n) {
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        int is_nan = v != v;
        nan |= is_nan;
        x[i] = is_nan ? v : (float)(_Float16)v;
    }
    return nan;
}
int fc_has_fp16(void) { return 1; }
#else
int fc_round_fp16(float *x, int64_t n) { (void)x; (void)n; return -1; }
int fc_has_fp16(void) { return 0; }
#endif
"""
_ARGS = (ctypes.c_void_p, ctypes.c_int64)


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
    """(the loaded library, "") or (None, why not)."""
    lib, why = cbuild.load("round", SOURCE, "P is rounded by two torch casts")
    if lib is None:
        return None, why
    for name in ("fc_round_bf16", "fc_round_fp16"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _ARGS, ctypes.c_int
    lib.fc_max_sub.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, *(ctypes.c_void_p,) * 3)
    lib.fc_max_sub.restype = None
    lib.fc_round_bf16_copy.argtypes, lib.fc_round_bf16_copy.restype = (*_ARGS[:1], *_ARGS), ctypes.c_int
    lib.fc_abs_stats.argtypes, lib.fc_abs_stats.restype = (*_ARGS, ctypes.c_void_p), ctypes.c_int
    for dtype in (torch.bfloat16, torch.float16):
        if dtype == torch.float16 and not lib.fc_has_fp16():
            continue
        x = _probe(dtype)
        want = x.to(dtype).to(torch.float32)
        _call(lib, dtype, x)
        if not torch.equal(x.view(torch.int32), want.view(torch.int32)):
            return None, f"the C rounding to {dtype} differs from torch's cast here: P is rounded by torch's casts"
    return lib, ""


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
    if _call(lib, dtype, x):  # a NaN: torch's casts give it their own bits (the rounded values stay)
        x.copy_(x.to(dtype))
    return True


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
    if lib is None:
        return None
    out = (ctypes.c_float * 3)()
    lib.fc_abs_stats(x.data_ptr(), x.numel(), out)
    return out[0], out[1], out[2]
