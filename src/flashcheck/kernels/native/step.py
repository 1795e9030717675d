"""The FA2 forward step's element-wise work in C, one pass per row block: torch's very bits, fewer passes.

A step of kernels.sim.flash._fa2_step runs, through torch, about ten passes over its score block s [R, N]: amax,
maximum, sub_, exp, sum, the rounding of P, and o * alpha + pv over the accumulator. `softmax_step` does the
first six for each row while it is in cache; `acc_update` does the last two in one pass.

Bits: each operation is the one torch runs, in torch's order.
- exp: torch's float32 exp on the CPU is MKL's vmsExp in its high-accuracy mode (aten's vml.h), whose value
  of an element depends on that element alone (measured: any chunking gives the same bits). The routine
  calls the very function, resolved from torch's own loaded library (VMSEXP_64_), with torch's mode.
- the row sum: torch.sum over the inner dimension (aten's SumKernel.cpp, cascade_sum): vectors of the CPU
  kernel's width summed in four interleaved accumulators (with a cascade of levels for long rows), the scalar
  tail, then the vector's lanes, all from 0. Its vector width is 8 floats under the capabilities of
  torch.backends.cpu.get_cpu_capability() it knows (AVX512 runs sum's AVX2 kernel, see _WIDTHS); rows narrower
  than a vector take its scalar form. Used only where torch's sum would run on one thread (torch.get_num_threads()).
- max and the subtraction as kernels.native.rounding.max_sub_ (NaN-free scores only, the caller's guarantee); P rounded
  to bf16 / fp16 as kernels.native.rounding rounds it; alpha * l + sum and o * alpha + pv rounded twice each (the C is
  built without FMA contraction).
At load a self-test compares both routines with torch on ties, -inf rows, subnormal results and ragged widths;
any difference, a missing function or an unknown capability disables them and the steps keep torch's ops
(same bits, slower). `status()` says which is on and why (`flashcheck doctor`).

`tile_forward` runs a whole plain query tile in one call: both products through torch's own MKL sgemm_ (the
routine and operands bmm hands its matrices to: measured bit for bit, and self-tested at load), the two routines
above between them, head by head, so a head's score block stays in the core's cache and the tile's thread holds
no GIL (step by step, two tile workers ran 1.69 times as fast as one; a tile's CPU time at L=2048 is about 10%
less in one call; both measured on the 2-core EPYC)."""

from __future__ import annotations

import ctypes
import functools
import math
import os

import torch

import flashcheck.kernels.native.cbuild as cbuild

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef void (*vexp_fn)(const int64_t *n, const float *a, float *r, const int64_t *mode);
#define MAXW 16

static void round_bf16(float *x, int64_t n);
#ifdef __AVX2__
#include <immintrin.h>
#endif

static int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    return 64 - __builtin_clzll((uint64_t)(x - 1));
}

/* aten's multi_row_sum with 4 rows: element (i, k) is the lanes-wide group at x + (4 i + k) lanes. */
static inline __attribute__((always_inline)) void multi_row_sum(const float *x, int64_t size, const int lanes,
                                                                 float out[4][MAXW]) {
    float acc[4][4][MAXW];
    memset(acc, 0, sizeof acc);
    int64_t lp = ceil_log2(size) / 4;
    if (lp < 4) lp = 4;
    const int64_t step = (int64_t)1 << lp, mask = step - 1;
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; ++j, ++i)
            for (int k = 0; k < 4; ++k)
                for (int c = 0; c < lanes; ++c) acc[0][k][c] += x[(i * 4 + k) * lanes + c];
        for (int j = 1; j < 4; ++j) {
            for (int k = 0; k < 4; ++k)
                for (int c = 0; c < lanes; ++c) {
                    acc[j][k][c] += acc[j - 1][k][c];
                    acc[j - 1][k][c] = 0.0f;
                }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; ++k)
            for (int c = 0; c < lanes; ++c) acc[0][k][c] += x[(i * 4 + k) * lanes + c];
    for (int j = 1; j < 4; ++j)
        for (int k = 0; k < 4; ++k)
            for (int c = 0; c < lanes; ++c) acc[0][k][c] += acc[j][k][c];
    memcpy(out, acc[0], sizeof(float) * 4 * MAXW);
}

/* aten's row_sum over `size` lanes-wide groups; the lanes of the result in part[0..lanes). */
static inline __attribute__((always_inline)) void row_sum(const float *x, int64_t size, const int lanes,
                                                          float part[MAXW]) {
    float p[4][MAXW];
    const int64_t ilp = size / 4;
    multi_row_sum(x, ilp, lanes, p);
    for (int64_t i = ilp * 4; i < size; ++i)
        for (int c = 0; c < lanes; ++c) p[0][c] += x[i * lanes + c];
    for (int k = 1; k < 4; ++k)
        for (int c = 0; c < lanes; ++c) p[0][c] += p[k][c];
    memcpy(part, p[0], sizeof(float) * MAXW);
}

/* torch.sum(x[0:n]) as cascade_sum sums an inner row at vector width w (16 or 8). */
static float torch_row_sum(const float *x, int64_t n, int w) {
    float part[MAXW];
    if (n < w) {
        row_sum(x, n, 1, part);
        return 0.0f + part[0];
    }
    const int64_t nv = n / w;
    if (w == 16) row_sum(x, nv, 16, part);
    else row_sum(x, nv, 8, part);
    float f = 0.0f;
    for (int64_t k = nv * w; k < n; ++k) f += x[k];
    for (int c = 0; c < w; ++c) f += part[c];
    return 0.0f + f;
}

#ifdef __AVX2__
static inline __m256 round_bf16_8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* torch_row_sum at width 8 for 8 <= n < 512 (no cascade level is reached), and the row rounded to bf16 after
   it is read (p_bf16) in the same pass: the sum is of the values before rounding. */
static float sum8_round(float *x, int64_t n, int p_bf16) {
    const int64_t nv = n / 8, ilp = nv / 4;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < ilp; i++) {
        float *b = x + i * 32;
        __m256 v0 = _mm256_loadu_ps(b), v1 = _mm256_loadu_ps(b + 8);
        __m256 v2 = _mm256_loadu_ps(b + 16), v3 = _mm256_loadu_ps(b + 24);
        a0 = _mm256_add_ps(a0, v0);
        a1 = _mm256_add_ps(a1, v1);
        a2 = _mm256_add_ps(a2, v2);
        a3 = _mm256_add_ps(a3, v3);
        if (p_bf16) {
            _mm256_storeu_ps(b, round_bf16_8(v0));
            _mm256_storeu_ps(b + 8, round_bf16_8(v1));
            _mm256_storeu_ps(b + 16, round_bf16_8(v2));
            _mm256_storeu_ps(b + 24, round_bf16_8(v3));
        }
    }
    for (int64_t i = ilp * 4; i < nv; i++) {
        __m256 v = _mm256_loadu_ps(x + i * 8);
        a0 = _mm256_add_ps(a0, v);
        if (p_bf16) _mm256_storeu_ps(x + i * 8, round_bf16_8(v));
    }
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), a2), a3);
    float f = 0.0f;
    for (int64_t k = nv * 8; k < n; ++k) f += x[k];
    if (p_bf16) round_bf16(x + nv * 8, n - nv * 8);
    float lanes[8];
    _mm256_storeu_ps(lanes, a0);
    for (int c = 0; c < 8; ++c) f += lanes[c];
    return 0.0f + f;
}
#endif

static float row_max(const float *row, int64_t n) {
    int64_t j = 0;
    float mx = -__builtin_inff();
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(-__builtin_inff());
    for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(row + j));
    mx = _mm512_reduce_max_ps(vm);
#endif
    for (; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    return mx;
}

static void round_bf16(float *x, int64_t n) {
    uint32_t *u = (uint32_t *)x;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = u[i];
        u[i] = (v + 0x7FFFu + ((v >> 16) & 1u)) & 0xFFFF0000u;
    }
}

static void round_fp16(float *x, int64_t n) {
#ifdef __FLT16_MAX__
    for (int64_t i = 0; i < n; i++) x[i] = (float)(_Float16)x[i];
#else
    (void)x; (void)n;
#endif
}

int fc_has_fp16(void) {
#ifdef __FLT16_MAX__
    return 1;
#else
    return 0;
#endif
}

/* One FA2 step's softmax for NaN-free s [rows, n]: per row, m_new = max(m, max_j s), ms = m_new (0 where -inf),
   s = exp(s - ms) (P, rounded to p_fmt: 0 none, 1 bf16, 2 fp16), sum = torch.sum(P before rounding); then
   alpha = exp(m - ms) and l_new = alpha * l + sum. vexp: torch's exp (MKL's vmsExp), called with `mode`. */
void fc_softmax_step(float *s, int64_t rows, int64_t n, const float *m, const float *l, float *m_new,
                     float *l_new, float *alpha, int w, int p_fmt, void *vexp_ptr, int64_t mode, void *local_ptr) {
    vexp_fn vexp = (vexp_fn)vexp_ptr;
    /* MKL's threads for this thread's calls: 1 (the caller runs single-threaded; a tile worker's VML call would
       otherwise start MKL's own team beside the other workers). Restored at the end. */
    int (*set_local)(int) = (int (*)(int))local_ptr;
    int prev = set_local ? set_local(1) : 0;
    int64_t group = 8192 / n;  /* rows per exp call: about 32 KiB of scores, still in cache */
    if (group < 1) group = 1;
    for (int64_t g0 = 0; g0 < rows; g0 += group) {
        int64_t g1 = g0 + group < rows ? g0 + group : rows;
        for (int64_t r = g0; r < g1; r++) {
            float *row = s + r * n;
            float mx = row_max(row, n);
            float mn = m[r] > mx ? m[r] : mx;
            float sub = mn == -__builtin_inff() ? 0.0f : mn;
            for (int64_t j = 0; j < n; j++) row[j] = row[j] - sub;
            alpha[r] = m[r] - sub;
            m_new[r] = mn;
        }
        int64_t cnt = (g1 - g0) * n;
        vexp(&cnt, s + g0 * n, s + g0 * n, &mode);
        for (int64_t r = g0; r < g1; r++) {
            float *row = s + r * n;
#ifdef __AVX2__
            if (w == 8 && n >= 8 && n < 512 && p_fmt != 2) {
                l_new[r] = sum8_round(row, n, p_fmt == 1);
                continue;
            }
#endif
            l_new[r] = torch_row_sum(row, n, w);
            if (p_fmt == 1) round_bf16(row, n);
            else if (p_fmt == 2) round_fp16(row, n);
        }
    }
    vexp(&rows, alpha, alpha, &mode);
    for (int64_t r = 0; r < rows; r++) {
        float al = alpha[r] * l[r];
        l_new[r] = al + l_new[r];
    }
    if (set_local) set_local(prev);
}

/* o = o * alpha + pv, rounded twice as torch's mul_ and add_: o [bh, rows, dv] with batch stride ob (rows
   contiguous), alpha [bh * rows], pv [bh, rows, dv] contiguous. */
void fc_acc_update(float *o, int64_t bh, int64_t rows, int64_t dv, int64_t ob, const float *alpha,
                   const float *pv) {
    for (int64_t b = 0; b < bh; b++)
        for (int64_t r = 0; r < rows; r++) {
            float a = alpha[b * rows + r];
            float *orow = o + b * ob + r * dv;
            const float *prow = pv + (b * rows + r) * dv;
            for (int64_t j = 0; j < dv; j++) {
                float t = orow[j] * a;
                orow[j] = t + prow[j];
            }
        }
}

typedef void (*sgemm_fn)(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
                         const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
                         const int *ldc);

/* A whole query tile of the plain FA2 forward, head by head, each head's rows through every key block in the
   given order (a row's steps in the same order as the step-by-step loop; the head's scores, P, P.V and O stay in
   cache). Per step, as torch's step runs it: S = Q K_j^T (torch's own MKL sgemm, on the very pointers and leading
   dimensions bmm hands it: head h's S and P.V blocks at the offsets of a [heads, rows, n] block), the softmax of
   fc_softmax_step, PV = P V_j, then O = O * alpha + PV (fc_acc_update). q [heads, rows, d] contiguous; head h of
   k / v at k + (h / hn) * ksb + (h % hn) * ksh (rows of kr / vr floats apart, columns contiguous); spans: nsteps
   (c0, c1) pairs; o [heads, rows, dv], m, l [heads * rows] contiguous (O = 0, m = -inf, l = 0 at the start);
   s: rows * (widest span) + 16 floats, pv: rows * dv + 16 floats (both 64-byte aligned), tmp: 2 * rows floats. */
void fc_tile_forward(const float *q, const float *k, const float *v, int64_t heads, int64_t hn, int64_t ksb,
                     int64_t ksh, int64_t kr, int64_t vsb, int64_t vsh, int64_t vr, int64_t rows, int64_t d,
                     int64_t dv, const int64_t *spans, int64_t nsteps, float *o, float *m, float *l, float *s,
                     float *pv, float *tmp, int w, int p_fmt, void *vexp_ptr, int64_t mode, void *local_ptr,
                     void *sgemm_ptr) {
    sgemm_fn sgemm = (sgemm_fn)sgemm_ptr;
    int (*set_local)(int) = (int (*)(int))local_ptr;
    int prev = set_local ? set_local(1) : 0;
    const float one = 1.0f, zero = 0.0f;
    const int ir = (int)rows, id = (int)d, idv = (int)dv, ikr = (int)kr, ivr = (int)vr;
    float *l_new = tmp, *alpha = tmp + rows;
    for (int64_t h = 0; h < heads; h++) {
        const float *qh = q + h * rows * d;
        const float *kh = k + (h / hn) * ksb + (h % hn) * ksh, *vh = v + (h / hn) * vsb + (h % hn) * vsh;
        float *oh = o + h * rows * dv, *mh = m + h * rows, *lh = l + h * rows;
        for (int64_t t = 0; t < nsteps; t++) {
            const int64_t c0 = spans[2 * t], n = spans[2 * t + 1] - c0;
            const int in = (int)n;
            /* bmm's head h blocks sit at h * rows * n and h * rows * dv floats: here at the same offsets modulo 16
               floats (64 bytes, the allocators' alignment), in one block reused by every head (it stays in cache) */
            float *sh = s + ((h * rows * n) & 15), *pvh = pv + ((h * rows * dv) & 15);
            sgemm("T", "N", &in, &ir, &id, &one, kh + c0 * kr, &ikr, qh, &id, &zero, sh, &in);
            fc_softmax_step(sh, rows, n, mh, lh, mh, l_new, alpha, w, p_fmt, vexp_ptr, mode, 0);
            memcpy(lh, l_new, sizeof(float) * rows);
            sgemm("N", "N", &idv, &ir, &in, &one, vh + c0 * vr, &ivr, sh, &in, &zero, pvh, &idv);
            fc_acc_update(oh, 1, rows, dv, rows * dv, alpha, pvh);
        }
    }
    if (set_local) set_local(prev);
}
"""
VML_MODE = 0x2 | 0x140000 | 0x100  # VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE: aten's vml.h mode
_P_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# the sum's vector width: 8 under each (sum_stub is registered without ALSO_REGISTER_AVX512_DISPATCH, so its
# AVX512 slot runs the AVX2 kernel; DEFAULT's Vectorized<float> is 32 bytes wide too)
_WIDTHS = {"AVX512": 8, "AVX2": 8, "DEFAULT": 8}


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, int, int, str]:
    """(the loaded library, vmsExp's address, the sum's vector width, "") or (None, 0, 0, why not)."""
    what = "the forward steps run torch's ops"
    width = _WIDTHS.get(torch.backends.cpu.get_cpu_capability())
    if width is None:
        cap = torch.backends.cpu.get_cpu_capability()
        return None, 0, 0, f"CPU capability {cap}: torch's sum order there is not modelled; {what}"
    vexp = _torch_vexp()
    if not vexp:
        return None, 0, 0, f"torch's library exports no MKL vmsExp (VMSEXP_64_) to call: {what}"
    lib, why = cbuild.load("step", SOURCE, what)
    if lib is None:
        return None, 0, 0, why
    ptr = ctypes.c_void_p
    lib.fc_softmax_step.argtypes = (ptr, ctypes.c_int64, ctypes.c_int64, *(ptr,) * 5, ctypes.c_int, ctypes.c_int)
    lib.fc_softmax_step.argtypes += (ptr, ctypes.c_int64, ptr)
    lib.fc_softmax_step.restype = None
    lib.fc_acc_update.argtypes = (ptr, *(ctypes.c_int64,) * 4, ptr, ptr)
    lib.fc_acc_update.restype = None
    lib.fc_tile_forward.argtypes = (ptr, ptr, ptr, *(ctypes.c_int64,) * 11, ptr, ctypes.c_int64, *(ptr,) * 6)
    lib.fc_tile_forward.argtypes += (ctypes.c_int, ctypes.c_int, ptr, ctypes.c_int64, ptr, ptr)
    lib.fc_tile_forward.restype = None
    bad = _self_test(lib, vexp, width)
    if bad:
        return None, 0, 0, f"the fused step differs from torch here ({bad}): {what}"
    return lib, vexp, width, ""


def _torch_vexp() -> int:
    """The address of MKL's vmsExp (Fortran form, 64-bit sizes) in torch's own loaded libtorch_cpu (0: none)."""
    return _torch_symbol("VMSEXP_64_")


def _torch_symbol(name: str) -> int:
    """The address of `name` in torch's own loaded libtorch_cpu (the MKL it links; 0: none)."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = getattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL), name)
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


@functools.cache
def _sgemm() -> int:
    """The address of MKL's sgemm_ (Fortran form, 32-bit sizes: the one torch's CPU BLAS calls) in torch's loaded
    libtorch_cpu (0: none)."""
    return _torch_symbol("sgemm_")


@functools.cache
def _tile_ok() -> str:
    """'' when fc_tile_forward gives the torch step loop's bits here (its self-test), else why not."""
    lib, vexp, width, why = _library()
    if lib is None:
        return why
    if not _sgemm():
        return "torch's library exports no MKL sgemm_ to call: the query tiles run step by step"
    with _threads(1):
        for shape, spans in _TILE_CASES:
            for p_dtype in (torch.float32, torch.bfloat16):
                q, k, v = _tile_case(shape)
                want = _torch_tile(q, k, v, spans, p_dtype)
                got = _tile_run(lib, vexp, width, q, k, v, spans, p_dtype)
                if not all(_same(a, b) for a, b in zip(want, got, strict=True)):
                    return f"the tile loop differs from torch's steps ({shape}, P in {p_dtype}): step by step"
    return ""


@functools.cache
def _mkl_local() -> int | None:
    """MKL_Set_Num_Threads_Local (by value) in torch's loaded library (None: absent; MKL then keeps its own setting)."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL).MKL_Set_Num_Threads_Local  # the C form
    except (OSError, AttributeError):
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def status() -> dict:
    """{"available": bool, "vector_width": int, "reason": str, "tile_loop": bool, "tile_reason": str} for
    `flashcheck doctor` (tile_loop: whole query tiles run in one C call, see tile_forward)."""
    lib, _, width, why = _library()
    cap = torch.backends.cpu.get_cpu_capability()
    tile_why = _tile_ok() if lib is not None else why
    return {
        "available": lib is not None, "capability": cap, "vector_width": width, "reason": why,
        "tile_loop": lib is not None and not tile_why, "tile_reason": tile_why,
    }  # fmt: skip


def _usable(s: torch.Tensor) -> bool:
    ok = s.dtype == torch.float32 and s.device.type == "cpu" and s.is_contiguous() and not s.requires_grad
    return ok and torch.get_num_threads() == 1


def softmax_step(
    s: torch.Tensor, m: torch.Tensor, l: torch.Tensor, p_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """For NaN-free float32 s [..., R, N] (contiguous) and m, l [..., R, 1]: (m_new, l_new, alpha) [..., R, 1]
    with s holding P = exp(s - ms) rounded to p_dtype (float32: not rounded), as _fa2_step computes them with
    torch's ops (amax, maximum, where, sub_, exp, sum, the cast, exp(m - ms), alpha * l + sum), bit for bit.
    None (s untouched) where the routine is unavailable or does not apply (then run torch's ops)."""
    if not _usable(s) or s.shape[-1] == 0 or p_dtype not in _P_FORMATS or s.shape[:-1] != m.shape[:-1]:
        return None
    lib, vexp, width, _ = _library()
    if lib is None or (p_dtype == torch.float16 and not lib.fc_has_fp16()):
        return None
    m, l = (t.contiguous() for t in (m, l))
    if m.dtype != torch.float32 or l.dtype != torch.float32 or l.shape != m.shape:
        return None
    m_new, l_new, alpha = (torch.empty_like(m) for _ in range(3))
    rows, n = m.numel(), s.shape[-1]
    ptrs = (s.data_ptr(), rows, n, m.data_ptr(), l.data_ptr(), m_new.data_ptr(), l_new.data_ptr(), alpha.data_ptr())
    lib.fc_softmax_step(*ptrs, width, _P_FORMATS[p_dtype], vexp, VML_MODE, _mkl_local())
    return m_new, l_new, alpha


def acc_update(o: torch.Tensor, alpha: torch.Tensor, pv: torch.Tensor) -> bool:
    """o = o * alpha + pv in place, as o.mul_(alpha).add_(pv) rounds it, for float32 o [B, H, R, Dv] (each head's
    rows contiguous), alpha [B, H, R, 1] and pv [B, H, R, Dv] contiguous. False (o untouched) where it does not
    apply."""
    lib = _library()[0]
    if lib is None or not (_usable(pv) and alpha.is_contiguous() and alpha.dtype == o.dtype == torch.float32):
        return False
    if o.dim() != 4 or o.shape != pv.shape or alpha.shape != (*o.shape[:-1], 1) or o.device.type != "cpu":
        return False
    b, h, r, dv = o.shape
    if o.stride(3) != 1 or o.stride(2) != dv or (b > 1 and o.stride(0) != h * o.stride(1)):
        return False
    lib.fc_acc_update(o.data_ptr(), b * h, r, dv, o.stride(1), alpha.data_ptr(), pv.data_ptr())
    return True


def tile_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: list[tuple[int, int]],
    o: torch.Tensor,
    m: torch.Tensor,
    l: torch.Tensor,
    p_dtype: torch.dtype,
) -> bool:
    """A whole query tile of the plain FA2 forward in one C call (the GIL released throughout): for q [B, H, R, D]
    contiguous (the tile's rows, scale folded in), k [B, H, Lk, D], v [B, H, Lk, Dv] (columns contiguous) and
    each key block (c0, c1) of `spans` in turn, the step kernels.sim.flash._fused_step runs with torch's bmm, on every
    row at once: scores S = Q K_j^T, the softmax of softmax_step (P rounded to p_dtype), P V_j and acc_update,
    into o [B, H, R, Dv], m, l [B, H, R, 1] (contiguous; zeros, -inf, zeros at the start). Bit for bit the step
    loop's: rows are independent, the products are MKL's sgemm on the very operands and leading dimensions of
    bmm's, its outputs at the same alignment (see fc_tile_forward), checked at load (_tile_ok). False (nothing
    touched) where it does not apply: a product torch's bmm forms otherwise (under _BMM_SMALL multiply-adds per
    matrix: its own loops; a single key column: measured to differ from sgemm's)."""
    if not spans or p_dtype not in _P_FORMATS or not _usable(q) or _tile_ok():
        return False
    if torch.get_float32_matmul_precision() != "highest":  # bmm may then run oneDNN's reduced-precision product
        return False
    lib, vexp, width, _ = _library()
    b, h, rows, d = q.shape
    dv, width_k = v.shape[-1], max(c1 - c0 for c0, c1 in spans)
    if p_dtype == torch.float16 and not lib.fc_has_fp16():
        return False
    tensors = (k, v, o, m, l)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.requires_grad for t in tensors):
        return False
    if k.dim() != 4 or v.dim() != 4 or k.shape[:2] != (b, h) or v.shape[:2] != (b, h) or k.shape[-1] != d:
        return False
    if k.stride(-1) != 1 or v.stride(-1) != 1 or not all(t.is_contiguous() for t in (o, m, l)):
        return False
    if o.shape != (b, h, rows, dv) or m.shape != (b, h, rows, 1) or l.shape != m.shape:
        return False
    if max(rows, d, dv, width_k, k.stride(-2), v.stride(-2), b * h * rows * max(width_k, dv)) >= 2**31:
        return False  # sgemm_'s 32-bit sizes
    if not all(c1 - c0 >= 2 and min(d, dv) * rows * (c1 - c0) >= _BMM_SMALL for c0, c1 in spans):
        return False  # products torch's bmm does not hand to sgemm (a step's bits would move)
    _tile_call(lib, vexp, width, (q, k, v), spans, (o, m, l), p_dtype)
    return True


def _tile_call(lib, vexp: int, width: int, qkv, spans, oml, p_dtype: torch.dtype) -> None:
    (q, k, v), (o, m, l) = qkv, oml
    b, h, rows, d = q.shape
    width_k = max(c1 - c0 for c0, c1 in spans)
    bufs = [torch.empty(rows * n + 16, dtype=torch.float32) for n in (width_k, v.shape[-1])]  # 64-byte aligned
    flat = torch.tensor([c for span in spans for c in span], dtype=torch.int64)
    tmp = torch.empty(2 * rows, dtype=torch.float32)
    lib.fc_tile_forward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), b * h, h, k.stride(0), k.stride(1), k.stride(2), v.stride(0),
        v.stride(1), v.stride(2), rows, d, v.shape[-1], flat.data_ptr(), len(spans), o.data_ptr(), m.data_ptr(),
        l.data_ptr(), bufs[0].data_ptr(), bufs[1].data_ptr(), tmp.data_ptr(), width, _P_FORMATS[p_dtype], vexp,
        VML_MODE, _mkl_local(), _sgemm(),
    )  # fmt: skip


_BMM_SMALL = 400  # aten's bmm forms a product of fewer multiply-adds (contraction * rows * columns) in plain loops
_TILE_CASES = [
    ((1, 2, 37, 300, 64, 64), [(0, 128), (128, 256), (256, 300)]),
    ((2, 3, 64, 200, 32, 48), [(100, 200), (0, 100)]),
    ((1, 4, 160, 256, 64, 64), [(0, 128), (128, 256)]),
    ((1, 2, 9, 70, 16, 16), [(0, 33), (33, 66), (66, 70)]),
    ((1, 3, 13, 90, 24, 40), [(45, 90), (0, 45)]),
    ((1, 2, 8, 6, 64, 32), [(0, 2), (2, 4), (4, 6)]),
]  # fmt: skip


def _tile_case(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, h, rows, lk, d, dv = shape
    g = torch.Generator().manual_seed(rows * 31 + lk)
    q = torch.randn(b, h, rows, d, generator=g) * 0.25
    k = torch.randn(b, h, lk, d, generator=g) * 2
    v = torch.randn(b, h, lk, dv, generator=g)
    return q, k, v


def _torch_tile(q, k, v, spans, p_dtype):
    """The step loop with torch's ops (bmm into flat buffers as kernels.sim.flash lays them out): (o, m, l)."""
    b, h, rows, _ = q.shape
    dv = v.shape[-1]
    o = torch.zeros(b, h, rows, dv)
    m, l = torch.full((b, h, rows, 1), -math.inf), torch.zeros(b, h, rows, 1)
    width = max(c1 - c0 for c0, c1 in spans)
    s_buf, pv_buf = torch.empty(b * h * rows * width), torch.empty(b * h * rows * dv)
    for c0, c1 in spans:
        s = s_buf[: b * h * rows * (c1 - c0)].view(b, h, rows, c1 - c0)
        torch.matmul(q, k[..., c0:c1, :].transpose(-1, -2), out=s)
        p, m, l, alpha = _torch_step(s, m, l, p_dtype)
        pv = pv_buf[: b * h * rows * dv].view(b, h, rows, dv)
        torch.matmul(p, v[..., c0:c1, :], out=pv)
        o.mul_(alpha).add_(pv)
    return o, m, l


def _tile_run(lib, vexp, width, q, k, v, spans, p_dtype):
    b, h, rows, _ = q.shape
    dv = v.shape[-1]
    o = torch.zeros(b, h, rows, dv)
    m, l = torch.full((b, h, rows, 1), -math.inf), torch.zeros(b, h, rows, 1)
    _tile_call(lib, vexp, width, (q, k, v), spans, (o, m, l), p_dtype)
    return o, m, l


def _self_test(lib: ctypes.CDLL, vexp: int, width: int) -> str:
    """'' when both routines give torch's bits on the probe cases, else which case differs."""
    with _threads(1):
        for n, rows, how in _CASES:
            s, m, l = _case(n, rows, how)
            for p_dtype in (torch.float32, torch.bfloat16, *((torch.float16,) if lib.fc_has_fp16() else ())):
                want = _torch_step(s.clone(), m, l, p_dtype)
                got_s = s.clone()
                m_new, l_new, alpha = (torch.empty_like(m) for _ in range(3))
                lib.fc_softmax_step(
                    got_s.data_ptr(), m.numel(), n, m.data_ptr(), l.data_ptr(), m_new.data_ptr(), l_new.data_ptr(),
                    alpha.data_ptr(), width, _P_FORMATS[p_dtype], vexp, VML_MODE, _mkl_local(),
                )  # fmt: skip
                if not all(_same(a, b) for a, b in zip(want, (got_s, m_new, l_new, alpha), strict=True)):
                    return f"softmax, width {n}, {how} rows, P in {p_dtype}"
            o = torch.randn(*m.shape[:-1], 24, generator=torch.Generator().manual_seed(n))
            pv = torch.randn_like(o)
            want = o * alpha
            want += pv
            lib.fc_acc_update(o.data_ptr(), m.shape[0], m.shape[1], 24, o.stride(0), alpha.data_ptr(), pv.data_ptr())
            if not _same(o, want):
                return f"accumulator update, {n} rows"
    return ""


_CASES = [(n, rows, how) for n in (1, 3, 8, 15, 16, 17, 37, 64, 128, 129, 200, 1000, 4103) for rows, how in
          ((5, "random"), (3, "tied"), (2, "masked"))]  # fmt: skip


def _case(n: int, rows: int, how: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores [2, rows, n] and the running m, l [2, rows, 1]: random (wide range, so P has subnormals and
    zeros), tied maxima, or rows partly / wholly -inf (masked) with m = -inf."""
    g = torch.Generator().manual_seed(n * 7 + rows)
    s = torch.randn(2, rows, n, generator=g) * torch.exp2(torch.randint(-3, 7, (2, rows, 1), generator=g).float())
    m = s.amax(-1, keepdim=True) + torch.randn(2, rows, 1, generator=g) * 4
    l = torch.rand(2, rows, 1, generator=g) * 50
    if how == "tied":
        s = s.round()
        s[..., : max(1, n // 2)] = s.amax(-1, keepdim=True)
    elif how == "masked":
        s[..., : (n + 1) // 2] = -math.inf
        s[0, 0], m[0], l[0] = -math.inf, -math.inf, 0.0
    return s.contiguous(), m.contiguous(), l.contiguous()


def _torch_step(s, m, l, p_dtype):
    """_fa2_step's torch ops (stats and the working dtype float32): (P, m_new, l_new, alpha)."""
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    ms = torch.where(torch.isneginf(m_new), 0.0, m_new)
    s.sub_(ms)
    alpha = torch.exp(m - ms)
    p = torch.exp(s, out=s)
    l_new = alpha * l + p.sum(dim=-1, keepdim=True)
    if p_dtype != torch.float32:
        p.copy_(p.to(p_dtype))
    return p, m_new, l_new, alpha


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, but a zero's sign (exp takes either to 1; max_sub_ allows the same)."""
    return a.shape == b.shape and torch.equal((a + 0.0).view(torch.int32), (b + 0.0).view(torch.int32))


class _threads:
    def __init__(self, n: int) -> None:
        self.n, self.old = n, 0

    def __enter__(self) -> None:
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.old)
