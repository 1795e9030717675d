"""The quantised presets' per-step element-wise work in single C passes (built by kernels.native.cbuild), the same bits
as
the torch steps they replace: P's FP8 rounding (kernels.sim.quantized.quantize_p), SageAttention3's P quantisation
(kernels.formats.sage3.sage3_p) and the float64 descales around the tensor-core products (kernels.sim.mma_ops:
qk_scores'
descaled scores, pv_accumulate's O in MMA units and back), and once per forward the FP4 inputs' quantisers
(SageAttention3's 1x16 FP4, core.quant.nvfp4_parts' pieces) and kernels.sim.mma_ops' "e2m1s" operand check. Each
torch step reads and writes a whole score block [B, H, rows, Bc] (sage3_p alone is about twenty passes; each
descale three, with a float64 copy).

Every step is one IEEE operation the torch path also does (float32 products and quotients, float64 products and
quotients of float32 values, float64 -> float32 conversions, all correctly rounded; no FMA contraction, see
kernels.native.cbuild) or exact (the clamp, rint at a format's spacing, scalings by powers of two, maxima). NaN: the
P passes report it and the caller runs its torch steps (NaN bits as torch makes them). The library self-tests at
load against the torch steps (ties, subnormal codes, zeros, ragged blocks, strided views); any difference,
FLASHCHECK_NATIVE=0 or a missing compiler keeps the torch path."""

from __future__ import annotations

import ctypes
import functools
import math

import torch

import flashcheck.kernels.native.cbuild as cbuild
from flashcheck.core.numerics import Format, info
from flashcheck.kernels.formats.fastmath import POLY_EX2_3, ex2_emulation
from flashcheck.kernels.native.fp8 import ROUND_SOURCE

SOURCE = (
    ROUND_SOURCE
    + r"""
/* fp8_round's steps in float32 for a float32 y (mbits <= 3, emin >= -14, maxv an exact float): the clamp, and
   scalings by powers of two that neither overflow nor underflow (a * 2^(mbits - e) lies below 2^(mbits + 1), the
   result is a multiple of 2^(emin - mbits)), so every step is exact and the value is fp8_round's; branch-free
   and twice as wide as the double form, so it vectorises */
static inline float fp8_round_f(float y, int mbits, int emin, float maxv) {
    y = y < -maxv ? -maxv : (y > maxv ? maxv : y);
    const float a = fabsf(y);
    uint32_t u; memcpy(&u, &a, 4);
    int e = (int)(u >> 23) - 127;  /* a float32 subnormal or 0 reads -127: below every emin */
    e = e < emin ? emin : e;
    uint32_t up = (uint32_t)(127 + mbits - e) << 23, dn = (uint32_t)(127 + e - mbits) << 23;
    float fu, fd; memcpy(&fu, &up, 4); memcpy(&fd, &dn, 4);
    return copysignf(rintf(a * fu) * fd, y);
}

/* e2m1: clamp at 6, nearest even, spacing 0.5 below 1 */
static inline float fp4_round(float y) { return fp8_round_f(y, 1, 0, 6.0f); }

/* quantize_p's FP8 case on float32 P [n], contiguous: out = fp8(p * ps) (scale: the float32 product, as torch's
   float32 tensor times a scalar), the clamp at +-maxv, round to nearest even (exact in double: a float32 value
   rounded once), back to float32 (exact). 0 when a product is NaN (out then partly written), else 1. */
int fc_p_fp8(const float *p, float *out, int64_t n, float ps, int scale, int mbits, int emin, double maxv) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float y = scale ? p[i] * ps : p[i];
        bad |= y != y;
        out[i] = fp8_round_f(y, mbits, emin, (float)maxv);
    }
    return !bad;
}

/* sage3_p on float32 P [rows, w], contiguous, in blocks of 16 along w (a ragged last one padded with zeros):
   pt = p * ps (float32), a = max(block) / 6 (float32), e = e2m1(pt / a) (float32 quotient, clamp at 6, nearest
   even), out = e * e4m3(a) (exact in float32), 0 where a <= 0. 0 when a value is NaN, else 1. */
static int sage3_p_scalar(const float *p, float *out, int64_t rows, int64_t w, float ps) {
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *pr = p + r * w;
        float *orow = out + r * w;
        for (int64_t b0 = 0; b0 < w; b0 += 16) {
            const int64_t b1 = b0 + 16 < w ? b0 + 16 : w;
            float m = b1 - b0 < 16 ? 0.0f : -INFINITY;  /* padding zeros take part in the maximum */
            for (int64_t i = b0; i < b1; i++) {
                const float y = pr[i] * ps;
                bad |= y != y;
                m = y > m ? y : m;
            }
            const float a = m / 6.0f;
            if (!(a > 0.0f)) {
                for (int64_t i = b0; i < b1; i++) orow[i] = 0.0f;
                continue;
            }
            const float s = (float)fp8_round((double)a, 3, -6, 448.0);
            for (int64_t i = b0; i < b1; i++) {
                const float y = (pr[i] * ps) / a;
                orow[i] = fp4_round(y) * s;
            }
        }
    }
    return !bad;
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* a 16-element block's 1x16 FP4 scale from its max |x| bits ma (see nvfp4_scale; *bad set where ma is NaN) */
static inline float fp4x16_scale(uint32_t ma, int *bad) {
    *bad |= ma > 0x7F800000u;
    return (float)fp8_round((double)(u2f(ma) / 6.0f), 3, -6, 448.0);
}

/* one element, written as float64 or float32 (f32): e2m1(x inv) * s is exact in either (a 2-bit by 4-bit
   significand product, 2^-10 .. 2688, a normal float32), so the float32 product is the float64 one */
static inline void fp4x16_put(float x, float inv, float s, void *out, int64_t j, int f32) {
    const float e = fp4_round(x * inv);
    if (f32) ((float *)out)[j] = e * s;
    else ((double *)out)[j] = (double)e * (double)s;
}

/* ma[c] (c < w) = the bits of max |x[i nc + c]| over rows b0 <= i < b1: for non-negative floats the integer order is
   the float order, and a NaN's bits lie above inf's */
static inline void cols_absmax(const float *x, int64_t b0, int64_t b1, int64_t nc, int64_t w, uint32_t *ma) {
    for (int64_t c = 0; c < w; c++) ma[c] = 0;
    for (int64_t i = b0; i < b1; i++)
        for (int64_t c = 0; c < w; c++) {
            const uint32_t u = f2u(x[i * nc + c]) & 0x7FFFFFFFu;
            ma[c] = u > ma[c] ? u : ma[c];
        }
}

/* sage3.quantize_fp4x16 on float32 x [na, n, nc] (contiguous), in blocks of 16 along n (a ragged last one as if
   zero padded): s = e4m3(max |x| / 6) (float32), inv = 1 / s (float32; 0 where s = 0), out = e2m1(x inv) * s,
   float64 or (f32) float32 [na, n, nc]. 0 when a value is NaN, else 1. Blocks along a strided dim (nc > 1) run CH
   columns at a time, each column its own block (unit-stride loops). */
int fc_fp4x16(const float *x, void *out, int64_t na, int64_t n, int64_t nc, int f32) {
    int bad = 0;
    if (nc == 1) {  /* blocks along the contiguous dim */
        for (int64_t r = 0; r < na; r++)
        for (int64_t b0 = r * n; b0 < r * n + n; b0 += 16) {
            const int64_t b1 = b0 + 16 < r * n + n ? b0 + 16 : r * n + n;
            uint32_t ma = 0;
            for (int64_t i = b0; i < b1; i++) {
                const uint32_t u = f2u(x[i]) & 0x7FFFFFFFu;
                ma = u > ma ? u : ma;
            }
            const float s = fp4x16_scale(ma, &bad), inv = s > 0.0f ? 1.0f / s : 0.0f;
            if (f32) for (int64_t i = b0; i < b1; i++) fp4x16_put(x[i], inv, s, out, i, 1);
            else for (int64_t i = b0; i < b1; i++) fp4x16_put(x[i], inv, s, out, i, 0);
        }
        return !bad;
    }
    enum { CH = 256 };
    uint32_t ma[CH];
    float sc[CH], iv[CH];
    for (int64_t a = 0; a < na; a++)
    for (int64_t b0 = 0; b0 < n; b0 += 16) {
        const int64_t b1 = b0 + 16 < n ? b0 + 16 : n;
        for (int64_t c0 = 0; c0 < nc; c0 += CH) {
            const int64_t w = nc - c0 < CH ? nc - c0 : CH, o = a * n * nc + c0;
            cols_absmax(x + o, b0, b1, nc, w, ma);
            for (int64_t c = 0; c < w; c++) {
                sc[c] = fp4x16_scale(ma[c], &bad);
                iv[c] = sc[c] > 0.0f ? 1.0f / sc[c] : 0.0f;
            }
            for (int64_t i = b0; i < b1; i++)
                for (int64_t c = 0; c < w; c++) fp4x16_put(x[o + i * nc + c], iv[c], sc[c], out, o + i * nc + c, f32);
        }
    }
    return !bad;
}

/* a block's e4m3 scale s from its max |x| bits ma (a maximum of |x| taken on the bits: for non-negative floats the
   integer order is the float order, and a NaN's bits lie above inf's); 0 and *bad set where ma is NaN or the raw
   scale is not finite */
static inline float nvfp4_scale(uint32_t ma, float s_enc, int floor_, int *bad) {
    float raw = (u2f(ma) / 6.0f) * s_enc;
    *bad |= ma > 0x7F800000u || !(fabsf(raw) <= 3.4028234663852886e38f);
    raw = floor_ && raw < 0x1p-6f ? 0x1p-6f : raw;
    return fp8_round_f(raw, 3, -6, 448.0f);
}

/* one element: code = e2m1(x / dec) where live (dec > 0; dec replaced by 1 elsewhere, as torch's where), else 0 */
static inline void nvfp4_put(float x, float dec, float s, float *values, float *scaled) {
    const int live = dec > 0.0f;
    const float code = live ? fp4_round(x / (live ? dec : 1.0f)) : 0.0f;
    *values = live ? code * dec : 0.0f;
    *scaled = code * s;
}

/* core.quant.nvfp4_parts (tensor_amax None) on float32 x [na, n, nc] (contiguous), in blocks of 16 along n (a
   ragged last one as if zero padded), s_enc the tensor's float32 encode scale: raw = (max |x| / 6) * s_enc
   (float32, left to right as torch), s = e4m3(floor ? max(raw, 2^-6) : raw), dec = s / s_enc (float32), live =
   dec > 0, code = live ? e2m1(x / dec) : 0 (float32 quotient, clamp at 6, nearest even), values = live ? code * dec
   : 0 (float32), scaled = code * s (float32: exact, 2 by 4 significant bits). Every step is the IEEE operation
   torch's float32 tensors do, or exact. 0 (outputs partly written) when an x is NaN or a raw scale is not finite
   (the caller then runs the torch steps, whose NaN bits this does not reproduce), else 1. */
int fc_nvfp4(const float *x, float *values, float *scaled, int64_t na, int64_t n, int64_t nc, float s_enc,
             int floor_) {
    int bad = 0;
    if (nc == 1) {  /* blocks along the contiguous dim */
        for (int64_t a = 0; a < na; a++)
        for (int64_t b0 = 0; b0 < n; b0 += 16) {
            const int64_t b1 = b0 + 16 < n ? b0 + 16 : n, o = a * n;
            uint32_t ma = 0;
            for (int64_t i = b0; i < b1; i++) {
                const uint32_t u = f2u(x[o + i]) & 0x7FFFFFFFu;
                ma = u > ma ? u : ma;
            }
            const float s = nvfp4_scale(ma, s_enc, floor_, &bad), dec = s / s_enc;
            for (int64_t i = b0; i < b1; i++) nvfp4_put(x[o + i], dec, s, values + o + i, scaled + o + i);
        }
        return !bad;
    }
    enum { CH = 256 };  /* blocks along a strided dim: CH columns at a time, each with its own scale */
    uint32_t ma[CH];
    float sc[CH], dc[CH];
    for (int64_t a = 0; a < na; a++)
    for (int64_t b0 = 0; b0 < n; b0 += 16) {
        const int64_t b1 = b0 + 16 < n ? b0 + 16 : n;
        for (int64_t c0 = 0; c0 < nc; c0 += CH) {
            const int64_t w = nc - c0 < CH ? nc - c0 : CH, o = a * n * nc + c0;
            cols_absmax(x + o, b0, b1, nc, w, ma);
            for (int64_t c = 0; c < w; c++) {
                sc[c] = nvfp4_scale(ma[c], s_enc, floor_, &bad);
                dc[c] = sc[c] / s_enc;
            }
            for (int64_t i = b0; i < b1; i++)
                for (int64_t c = 0; c < w; c++) {
                    const int64_t j = o + i * nc + c;
                    nvfp4_put(x[j], dc[c], sc[c], values + j, scaled + j);
                }
        }
    }
    return !bad;
}

/* kernels.formats.e2m1s.fits_e2m1s on float32 bits of x [rows, cols] (row stride rs, unit column stride):
   every x 0 or
   |x| in [2^-10, 2^12) with a significand of at most 1.875 and at most 5 fraction bits (NaN and inf fail). 1 when
   all fit, else 0. */
int fc_e2m1s_f32(const float *x, int64_t rows, int64_t cols, int64_t rs) {
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++) {
            uint32_t u; memcpy(&u, x + r * rs + i, 4);
            const uint32_t a = u & 0x7FFFFFFFu, mant = a & 0x7FFFFFu;
            const int e = (int)(a >> 23) - 127;
            bad |= (a != 0) & ((e < -10) | (e > 11) | (mant > 0x700000u) | ((mant & 0x3FFFFu) != 0));
        }
    return !bad;
}

/* the same for float64 x [rows, cols] (row stride rs, unit column stride), written as float32 into out (contiguous):
   1 when every x is exact in float32 (NaN is not) and fits, else 0 (out then partly written) */
int fc_e2m1s_f64(const double *x, int64_t rows, int64_t cols, int64_t rs, float *out) {
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) {
            const double v = x[r * rs + i];
            const float f = (float)v;
            bad |= (double)f != v;
            out[r * cols + i] = f;
        }
        if (bad) return 0;
    }
    return fc_e2m1s_f32(out, rows, cols, cols);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
/* 8 float32 lanes of p: p = (float)((double)p * f + c), the product exact in double, then the sum rounded once
   to double and once to float (no FMA) */
static inline __m256 horner8(__m256 p, __m256 f, double c) {
    const __m512d t = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtps_pd(p), _mm512_cvtps_pd(f)), _mm512_set1_pd(c));
    return _mm512_cvtpd_ps(t);  /* round to nearest (the default MXCSR mode, as the C casts) */
}

/* fc_ex2_cols for FA4's cubic (np 4) on idx ascending in a span of at most 1024 columns: the span's every column
   computed 16 at a time, stored only where idx names it (masked stores). 0 where it does not apply. */
static int ex2_span16(const float *x, float *out, int64_t rows, int64_t w, const int64_t *idx, int64_t ni,
                      const double *poly, int *bad) {
    if (ni < 1 || idx[ni - 1] - idx[0] >= 1024) return 0;
    for (int64_t j = 1; j < ni; j++) if (idx[j] <= idx[j - 1]) return 0;
    const int64_t lo = idx[0], span = idx[ni - 1] + 1 - lo, nv = (span + 15) / 16;
    __mmask16 sel[64] = {0};
    for (int64_t j = 0; j < ni; j++) sel[(idx[j] - lo) / 16] |= (__mmask16)(1u << ((idx[j] - lo) % 16));
    const __m512 top = _mm512_set1_ps((float)poly[3]), lim = _mm512_set1_ps(127.0f), low = _mm512_set1_ps(-127.0f);
    __mmask16 worse = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w + lo;
        float *orow = out + r * w + lo;
        for (int64_t k = 0; k < nv; k++) {
            const int64_t left = span - 16 * k;
            const __mmask16 in = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1), m = sel[k];
            const __m512 v = _mm512_maskz_loadu_ps(in, xr + 16 * k);
            worse |= m & ~_mm512_cmp_ps_mask(v, lim, _CMP_LE_OQ);  /* NaN or above 127 */
            const __m512 xc = _mm512_max_ps(v, low);  /* v < -127 ? -127 : v (a NaN is reported above) */
            const __m512 fl = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            const __m512 f = _mm512_sub_ps(xc, fl);
            __m256 halves[2];
            for (int h = 0; h < 2; h++) {
                const __m256 fh = h ? _mm512_extractf32x8_ps(f, 1) : _mm512_castps512_ps256(f);
                __m256 p = _mm512_castps512_ps256(top);
                p = horner8(p, fh, poly[2]);
                p = horner8(p, fh, poly[1]);
                halves[h] = horner8(p, fh, poly[0]);
            }
            const __m512 p = _mm512_insertf32x8(_mm512_castps256_ps512(halves[0]), halves[1], 1);
            const __m512i e = _mm512_slli_epi32(_mm512_cvttps_epi32(fl), 23);
            const __m512i u = _mm512_add_epi32(_mm512_castps_si512(p), e);
            _mm512_mask_storeu_ps(orow + 16 * k, m, _mm512_castsi512_ps(u));
        }
    }
    *bad |= worse != 0;
    return 1;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* fp4_round on 16 lanes: the clamp at 6, then e = max(exponent, 0) and a = |y| scaled by 2^(1 - e), rounded to an
   integer (nearest even) and scaled back by 2^(e - 1), the sign put back: the scalar steps lane by lane (every
   step exact, as there); a NaN lane is the caller's to report */
static inline __m512 fp4_round16(__m512 y) {
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-6.0f)), _mm512_set1_ps(6.0f));
    const __m512i u = _mm512_castps_si512(y), sign = _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u));
    const __m512i a = _mm512_andnot_si512(sign, u);
    const __m512i e = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(127)),
                                       _mm512_setzero_si512());
    const __m512 fu = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(128), e), 23));
    const __m512 fd = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_set1_epi32(126), e), 23));
    const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(a), fu),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(r, fd)), sign));
}

/* sage3_p_scalar for w a multiple of 16, one block per vector: the same products, maximum, quotients and
   roundings (the block's maximum of non-NaN values is exact in any order; a zero maximum, of either sign, writes
   zeros as there) */
static int sage3_p16(const float *p, float *out, int64_t rows, int64_t w, float ps) {
    __mmask16 nan = 0;
    const __m512 vps = _mm512_set1_ps(ps);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b0 = 0; b0 < w; b0 += 16) {
            const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(p + r * w + b0), vps);
            nan |= _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
            const float a = _mm512_reduce_max_ps(y) / 6.0f;
            if (!(a > 0.0f)) {
                _mm512_storeu_ps(out + r * w + b0, _mm512_setzero_ps());
                continue;
            }
            const float s = (float)fp8_round((double)a, 3, -6, 448.0);
            const __m512 e = fp4_round16(_mm512_div_ps(y, _mm512_set1_ps(a)));
            _mm512_storeu_ps(out + r * w + b0, _mm512_mul_ps(e, _mm512_set1_ps(s)));
        }
    return !nan;
}
#endif

/* sage3_p_scalar, by vectors where it applies */
int fc_sage3_p(const float *p, float *out, int64_t rows, int64_t w, float ps) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (w % 16 == 0) return sage3_p16(p, out, rows, w, ps);
#endif
    return sage3_p_scalar(p, out, rows, w, ps);
}

/* fastmath.ex2_emulation on the columns idx[ni] of x [rows, w] (float32, contiguous), written into out (the same
   layout): xc = max(x, -127), fl = floor(xc), f = xc - fl (exact), p = poly[np - 1] then p = (float)((double)p * f
   + poly[j]) for j = np - 2 .. 0 (the product exact in double), and fl added into p's exponent bits (an integer
   add, two's complement). 0 when an x is NaN or above 127 (out then partly written), else 1. */
int fc_ex2_cols(const float *x, float *out, int64_t rows, int64_t w, const int64_t *idx, int64_t ni,
                const double *poly, int np) {
    int bad = 0;
    const float top = (float)poly[np - 1];
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (np == 4 && ex2_span16(x, out, rows, w, idx, ni, poly, &bad)) return !bad;
#endif
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w;
        float *orow = out + r * w;
        for (int64_t j = 0; j < ni; j++) {
            const float v = xr[idx[j]];
            bad |= !(v <= 127.0f);
            const float xc = v < -127.0f ? -127.0f : v, fl = floorf(xc), f = xc - fl;
            float p = top;
            for (int c = np - 2; c >= 0; c--) p = (float)((double)p * (double)f + poly[c]);
            uint32_t u; memcpy(&u, &p, 4);
            u += (uint32_t)(int32_t)fl << 23;
            memcpy(orow + idx[j], &u, 4);
        }
    }
    return !bad;
}

/* over a [n0, n1, n2] index space of rows of n[3] elements, every tensor by its strides (elements; 0 where
   broadcast): R(t, s) is t's row, E(t, s) its element i3 (the unit stride apart, so the common case vectorises) */
#define LOOP3(n) for (int64_t i0 = 0; i0 < n[0]; i0++) for (int64_t i1 = 0; i1 < n[1]; i1++)                     \
                 for (int64_t i2 = 0; i2 < n[2]; i2++)
#define R(t, s) (t + i0 * s[0] + i1 * s[1] + i2 * s[2])

/* qk_scores' descale: out = (float)((double)acc * ((qs * factor) * ks)) */
void fc_descale(const float *acc, const int64_t *as, const double *qs, const int64_t *qss, const double *ks,
                const int64_t *kss, double factor, float *out, const int64_t *os, const int64_t *n) {
    const int64_t w = n[3], sa = as[3], sk = kss[3], so = os[3];
    LOOP3(n) {
        const float *a = R(acc, as);
        const double *k = R(ks, kss), qf = *R(qs, qss) * factor;  /* qs is constant along the row (its stride 0) */
        float *o = R(out, os);
        if (sa == 1 && sk == 0 && so == 1) {  /* one scale for the row (per-tensor K): qf * k[i] is one value */
            const double f = qf * k[0];
            if (a == o) for (int64_t i = 0; i < w; i++) o[i] = (float)((double)o[i] * f);
            else for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * f);
        } else if (sa == 1 && sk == 1 && so == 1 && a == o)  /* in place (acc is out) */
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)o[i] * (qf * k[i]));
        else if (sa == 1 && sk == 1 && so == 1)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * (qf * k[i]));
        else
            for (int64_t i = 0; i < w; i++) o[i * so] = (float)((double)a[i * sa] * (qf * k[i * sk]));
    }
}

/* pv_accumulate's unit conversions: out = (float)((double)x / u) (mode 0) or (float)((double)x * u) (1); mode 2:
   out += (float)((double)x * u) in float32 */
void fc_units(const float *x, const int64_t *xs, const double *u, const int64_t *us, float *out, const int64_t *os,
              const int64_t *n, int mode) {
    const int64_t w = n[3], sx = xs[3], su = us[3], so = os[3];
    const int unit = sx == 1 && su == 1 && so == 1;
    LOOP3(n) {
        const float *a = R(x, xs);
        const double *b = R(u, us);
        float *o = R(out, os);
        const double b0 = *b;  /* a unit constant along the row (stride 0): the loops below vectorise */
        if (sx == 1 && su == 0 && so == 1 && mode == 0)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] / b0);
        else if (sx == 1 && su == 0 && so == 1 && mode == 1)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * b0);
        else if (sx == 1 && su == 0 && so == 1)
            for (int64_t i = 0; i < w; i++) o[i] = o[i] + (float)((double)a[i] * b0);
        else if (unit && mode == 0) for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] / b[i]);
        else if (unit && mode == 1) for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * b[i]);
        else if (unit) for (int64_t i = 0; i < w; i++) o[i] = o[i] + (float)((double)a[i] * b[i]);
        else if (mode == 0) for (int64_t i = 0; i < w; i++) o[i * so] = (float)((double)a[i * sx] / b[i * su]);
        else if (mode == 1) for (int64_t i = 0; i < w; i++) o[i * so] = (float)((double)a[i * sx] * b[i * su]);
        else for (int64_t i = 0; i < w; i++) o[i * so] = o[i * so] + (float)((double)a[i * sx] * b[i * su]);
    }
}

/* O's rescale by the step's alpha (one per row; al NULL: none) folded into the pass after it: mode 0, O held in
   the MMA's units, o = o * al + 0 (the float32 product, then kernels.tensorcore.mma's start, which makes a zero +0);
   mode 1,
   the two-level accumulator's promotion, o = o * al + (float)((double)x * u) (the float32 product, the float64
   product rounded to float32, their float32 sum: torch's mul_ then fc_units' UNIT_ADD, step for step) */
void fc_rescale(float *o, const int64_t *os, const float *al, const int64_t *als, const float *x, const int64_t *xs,
                const double *u, const int64_t *us, const int64_t *n, int mode) {
    const int64_t w = n[3], so = os[3], sx = xs[3], su = us[3];
    LOOP3(n) {
        float *c = R(o, os);
        const float f = al ? *R(al, als) : 1.0f;
        if (mode == 0 && al && so == 1) for (int64_t i = 0; i < w; i++) c[i] = c[i] * f + 0.0f;
        else if (mode == 0 && so == 1) for (int64_t i = 0; i < w; i++) c[i] = c[i] + 0.0f;
        else if (mode == 0) for (int64_t i = 0; i < w; i++) c[i * so] = (al ? c[i * so] * f : c[i * so]) + 0.0f;
        else {
            const float *a = R(x, xs);
            const double *b = R(u, us), b0 = *b;
            if (so == 1 && sx == 1 && su == 0)
                for (int64_t i = 0; i < w; i++) {
                    const float t = (float)((double)a[i] * b0);
                    c[i] = (al ? c[i] * f : c[i]) + t;
                }
            else
                for (int64_t i = 0; i < w; i++) {
                    const float t = (float)((double)a[i * sx] * b[i * su]);
                    c[i * so] = (al ? c[i * so] * f : c[i * so]) + t;
                }
        }
    }
}

/* the P·V MMA's first accumulator from O: out = (float)((double)(o * alpha) / u) + 0 (o * alpha the float32
   product of the step's rescale, alpha one per row; + 0 as kernels.tensorcore.mma's start makes a zero c +0); o, out
   float32
   [n], contiguous rows of n[3] */
void fc_pv_start(const float *o, const int64_t *os, const float *al, const int64_t *als, const double *u,
                 const int64_t *us, float *out, const int64_t *outs, const int64_t *n) {
    const int64_t w = n[3], sx = os[3], su = us[3], so = outs[3];
    LOOP3(n) {
        const float *a = R(o, os), f = *R(al, als);
        const double *b = R(u, us);
        float *c = R(out, outs);
        const double b0 = *b;
        if (sx == 1 && su == 0 && so == 1)
            for (int64_t i = 0; i < w; i++) c[i] = (float)((double)(a[i] * f) / b0) + 0.0f;
        else if (sx == 1 && su == 1 && so == 1)
            for (int64_t i = 0; i < w; i++) c[i] = (float)((double)(a[i] * f) / b[i]) + 0.0f;
        else for (int64_t i = 0; i < w; i++) c[i * so] = (float)((double)(a[i * sx] * f) / b[i * su]) + 0.0f;
    }
}
"""
)

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_DIMS = 4
UNIT_DIV, UNIT_MUL, UNIT_ADD = 0, 1, 2


def _plain(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    return (
        t.dtype == dtype
        and t.device.type == "cpu"
        and t.dim() <= _DIMS
        and not (torch.is_grad_enabled() and t.requires_grad)
    )


_DIMS4 = ctypes.c_int64 * _DIMS  # strides and shapes go to C as ctypes arrays (a tensor each cost more than the pass)


def _strides(t: torch.Tensor, shape: torch.Size):
    """t's strides broadcast to `shape` (<= 4 dims, t broadcasting to it), int64 [4] with leading zeros: 0 along
    a dim of size 1 (expand's strides there, without its view)."""
    st = tuple(0 if n == 1 else d for n, d in zip(t.shape, t.stride(), strict=True))
    return _DIMS4(*((0,) * (_DIMS - len(st)) + st))


def _shape(shape: torch.Size):
    return _DIMS4(*((1,) * (_DIMS - len(shape)) + tuple(shape)))


def _broadcasts(small: torch.Tensor, shape: torch.Size) -> bool:
    return small.dim() <= len(shape) and all(
        d in (1, n) for d, n in zip(reversed(small.shape), reversed(shape), strict=False)
    )


def p_fp8(p: torch.Tensor, p_scale: float, fmt: Format, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """round_to(p * p_scale if p_scale != 1 else p, fmt) for float32 P (contiguous, CPU) and an FP8 fmt, a new
    float32 tensor (or `out`, float32 contiguous of p's shape, not p); None where the pass does not apply or meets
    a NaN (the caller's torch steps then run)."""
    lib = library()
    if lib is None or fmt not in _FP8 or not _plain(p) or not p.is_contiguous():
        return None
    if out is not None and not (_plain(out) and out.is_contiguous() and out.shape == p.shape):
        out = None
    return _p_fp8(lib, p, p_scale, fmt, out)


_FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)


def _p_fp8(lib, p: torch.Tensor, p_scale: float, fmt: Format, out: torch.Tensor | None = None) -> torch.Tensor | None:
    fi = info(fmt)
    out = torch.empty_like(p, memory_format=torch.contiguous_format) if out is None else out
    ok = lib.fc_p_fp8(p.data_ptr(), out.data_ptr(), p.numel(), p_scale, int(p_scale != 1.0), fi.precision - 1,
                      fi.min_exp - 1, float(fi.max))  # fmt: skip
    return out if ok else None


def sage3_p(p: torch.Tensor, p_scale: float, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """kernels.formats.sage3.sage3_p(p, p_scale) for float32 P [..., Bc] (contiguous, CPU), a new float32 tensor (or
    `out`,
    float32 contiguous of p's shape, not p: a reused buffer, no fresh pages per step); None where the pass does not
    apply or meets a NaN."""
    lib = library()
    if lib is None or not _plain(p) or not p.is_contiguous() or p.dim() < 1:
        return None
    if out is not None and not (_plain(out) and out.is_contiguous() and out.shape == p.shape):
        out = None
    return _sage3_p(lib, p, p_scale, out)


def _sage3_p(lib, p: torch.Tensor, p_scale: float, out: torch.Tensor | None = None) -> torch.Tensor | None:
    out = torch.empty_like(p, memory_format=torch.contiguous_format) if out is None else out
    w = p.shape[-1]
    rows = p.numel() // w if w else 0
    ok = lib.fc_sage3_p(p.data_ptr(), out.data_ptr(), rows, w, p_scale)
    return out if ok else None


def fp4x16(x: torch.Tensor, dim: int, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    """kernels.formats.sage3.quantize_fp4x16(x, dim=dim) for a float32 x (contiguous, CPU), [x's shape, contiguous] in
    dtype (float64, or float32: the same values, each exact in float32); None where the pass does not apply or
    meets a NaN."""
    lib = library()
    if lib is None or not _plain(x) or not x.is_contiguous() or x.dim() < 1 or x.numel() == 0:
        return None
    return _fp4x16(lib, x, dim, dtype) if dtype in (torch.float64, torch.float32) else None


def _fp4x16(lib, x: torch.Tensor, dim: int, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    dim = dim % x.dim()
    n = x.shape[dim]
    na, nc = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1 :])
    out = torch.empty(x.shape, dtype=dtype)
    return out if lib.fc_fp4x16(x.data_ptr(), out.data_ptr(), na, n, nc, int(dtype == torch.float32)) else None


def nvfp4(x: torch.Tensor, dim: int, s_enc: float, floor: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """core.quant.nvfp4_parts' values and scaled pieces (float32, x's shape, contiguous) of a float32 x
    (contiguous, CPU) in blocks of 16 along `dim`, s_enc its float32 tensor encode scale (tensor_amax None),
    `floor` its scale_floor; None where the pass does not apply or meets a NaN or a non-finite block scale."""
    lib = library()
    if lib is None or not _plain(x) or not x.is_contiguous() or x.dim() < 1 or x.numel() == 0:
        return None
    return _nvfp4(lib, x, dim, s_enc, floor)


def _nvfp4(lib, x: torch.Tensor, dim: int, s_enc: float, floor: bool):
    dim = dim % x.dim()
    n = x.shape[dim]
    na, nc = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1 :])
    values, scaled = torch.empty(x.shape), torch.empty(x.shape)
    ok = lib.fc_nvfp4(x.data_ptr(), values.data_ptr(), scaled.data_ptr(), na, n, nc, s_enc, int(floor))
    return (values, scaled) if ok else None


def e2m1s(x: torch.Tensor) -> tuple[bool, torch.Tensor] | None:
    """(whether x holds only kernels.tensorcore.mma's "e2m1s" values (formats.e2m1s), x as float32) in one C pass for
    a float32 x (x itself) or a float64 x (a float32 copy, contiguous, complete where it fits) whose rows [..., D]
    are evenly strided; None where the pass does not apply."""
    lib = library()
    if lib is None or not _plain(x, x.dtype) or x.dim() < 1 or x.numel() == 0 or x.stride(-1) != 1:
        return None
    return _e2m1s(lib, x)


def _e2m1s(lib, x: torch.Tensor) -> tuple[bool, torch.Tensor] | None:
    rs = _row_stride(x)
    if rs is None:
        return None
    cols = x.shape[-1]
    if x.dtype == torch.float32:
        return bool(lib.fc_e2m1s_f32(x.data_ptr(), x.numel() // cols, cols, rs)), x
    if x.dtype != torch.float64:
        return None
    out = torch.empty(x.shape)
    return bool(lib.fc_e2m1s_f64(x.data_ptr(), x.numel() // cols, cols, rs, out.data_ptr())), out


def _row_stride(x: torch.Tensor) -> int | None:
    """The stride between x's consecutive rows [..., D] where every row lies one stride after the last, else None."""
    if x.dim() == 1:
        return x.shape[0]
    rs = x.stride(-2)
    for i in range(x.dim() - 2):
        if x.shape[i] > 1 and x.stride(i) != rs * math.prod(x.shape[i + 1 : -1]):
            return None
    return rs


def ex2_columns(x: torch.Tensor, idx: torch.Tensor, poly: tuple[float, ...], out: torch.Tensor) -> bool:
    """out[..., idx] = kernels.formats.fastmath.ex2_emulation(x[..., idx], poly) in one C pass (x, out float32 [..., W],
    contiguous, CPU; idx int64 [n] column indices): True when done, False where it does not apply or meets a NaN
    or an x above 127 (the caller's torch steps then write every column of idx)."""
    lib = library()
    ok = lib is not None and _plain(x) and _plain(out) and x.is_contiguous() and out.is_contiguous()
    if not (ok and out.shape == x.shape and x.dim() >= 1 and idx.dtype == torch.int64 and idx.is_contiguous()):
        return False
    return _ex2_columns(lib, x, idx, poly, out)


def _ex2_columns(lib, x, idx, poly, out) -> bool:
    w = x.shape[-1]
    rows = x.numel() // w if w else 0
    coef = (ctypes.c_double * len(poly))(*poly)
    return bool(lib.fc_ex2_cols(x.data_ptr(), out.data_ptr(), rows, w, idx.data_ptr(), idx.numel(), coef, len(poly)))


def descale(acc: torch.Tensor, q_scale: torch.Tensor, k_scale_t: torch.Tensor, factor: float, out: torch.Tensor):
    """out[...] = (acc in float64 * ((q_scale * factor) * k_scale_t)) rounded to float32 (acc float32
    [..., M, N]; q_scale float64 [..., M or 1, 1], k_scale_t float64 [..., 1, N or 1], broadcasting; out float32
    of acc's shape, any strides); returns out, or None (nothing written) where the pass does not apply."""
    lib = library()
    shape = acc.shape
    ok = lib is not None and _plain(acc) and _plain(out) and out.shape == shape
    ok = ok and all(_plain(s, torch.float64) and _broadcasts(s, shape) for s in (q_scale, k_scale_t))
    if not (ok and (q_scale.dim() == 0 or q_scale.shape[-1] == 1)):  # the C pass reads q_scale once per row
        return None
    _descale(lib, acc, q_scale, k_scale_t, factor, out)
    return out


def _descale(lib, acc, q_scale, k_scale_t, factor: float, out) -> None:
    shape = acc.shape
    st = [_strides(t, shape) for t in (acc, q_scale, k_scale_t, out)]
    n = _shape(shape)
    lib.fc_descale(acc.data_ptr(), st[0], q_scale.data_ptr(), st[1], k_scale_t.data_ptr(), st[2], factor,
                   out.data_ptr(), st[3], n)  # fmt: skip


def units(x: torch.Tensor, unit: torch.Tensor, out: torch.Tensor, mode: int) -> torch.Tensor | None:
    """In float64, rounded to float32 into out (float32, x's shape, any strides; returned): x / unit (UNIT_DIV),
    x * unit (UNIT_MUL), or out + that product in float32 (UNIT_ADD). x float32, unit float64 broadcasting to x.
    None (nothing written) where the pass does not apply."""
    lib = library()
    ok = lib is not None and _plain(x) and _plain(out) and out.shape == x.shape
    if not (ok and _plain(unit, torch.float64) and _broadcasts(unit, x.shape)):
        return None
    _units(lib, x, unit, out, mode)
    return out


def _units(lib, x, unit, out, mode: int) -> None:
    shape = x.shape
    st = [_strides(t, shape) for t in (x, unit, out)]
    lib.fc_units(x.data_ptr(), st[0], unit.data_ptr(), st[1], out.data_ptr(), st[2], _shape(shape), mode)


def rescale(
    o: torch.Tensor, alpha: torch.Tensor | None, x: torch.Tensor | None = None, unit: torch.Tensor | None = None
) -> torch.Tensor | None:
    """O's rescale folded into one pass, in place (o float32 [..., M, Dv], any strides; alpha float32 [..., M, 1]
    or None): o = o * alpha + 0 (x None: the held accumulator's MMA start), or o = o * alpha + x * unit (x float32
    of o's shape, unit float64 broadcasting to it: the product in float64 rounded to float32, UNIT_ADD's).
    Returns o, or None (nothing written) where the pass does not apply."""
    lib = library()
    shape = o.shape
    ok = lib is not None and _plain(o) and o.dim() >= 1
    ok = ok and (alpha is None or (_plain(alpha) and _broadcasts(alpha, shape) and alpha.shape[-1:] == (1,)))
    if ok and x is not None:
        ok = _plain(x) and x.shape == shape and unit is not None and _plain(unit, torch.float64)
        ok = ok and _broadcasts(unit, shape)
    if not ok:
        return None
    _rescale(lib, o, alpha, x, unit)
    return o


def _rescale(lib, o, alpha, x, unit) -> None:
    shape = o.shape
    st = _strides(o, shape)
    ast = _strides(alpha, shape) if alpha is not None else st
    xst, ust = (_strides(x, shape), _strides(unit, shape)) if x is not None else (st, st)
    lib.fc_rescale(o.data_ptr(), st, None if alpha is None else alpha.data_ptr(), ast,
                   None if x is None else x.data_ptr(), xst, None if unit is None else unit.data_ptr(), ust,
                   _shape(shape), int(x is not None))  # fmt: skip


def pv_start(o: torch.Tensor, alpha: torch.Tensor, unit: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
    """The P·V MMA's first accumulator in one pass: (o * alpha in float32, divided by unit in float64) rounded to
    float32, + 0 (kernels.tensorcore.mma's start: a zero is +0), written into out (float32, o's shape; returned). o
    float32
    [..., M, Dv] (unchanged), alpha float32 [..., M, 1], unit float64 broadcasting to o. None (nothing written)
    where the pass does not apply."""
    lib = library()
    shape = o.shape
    ok = lib is not None and _plain(o) and _plain(out) and out.shape == shape and _plain(alpha)
    ok = ok and _broadcasts(alpha, shape) and alpha.dim() >= 1 and alpha.shape[-1] == 1
    if not (ok and _plain(unit, torch.float64) and _broadcasts(unit, shape)):
        return None
    _pv_start(lib, o, alpha, unit, out)
    return out


def _pv_start(lib, o, alpha, unit, out) -> None:
    shape = o.shape
    st = [_strides(t, shape) for t in (o, alpha, unit, out)]
    lib.fc_pv_start(o.data_ptr(), st[0], alpha.data_ptr(), st[1], unit.data_ptr(), st[2], out.data_ptr(), st[3],
                    _shape(shape))  # fmt: skip


def _selftest(lib) -> str:
    """The first pass that differs from its torch steps (words), or "" when every one matches bit for bit."""
    from flashcheck.core.numerics import round_to
    from flashcheck.kernels.formats.sage3 import sage3_p as torch_sage3_p

    g = torch.Generator().manual_seed(0)
    # P-like values over many binades, with exact zeros, ones, fp8 / e2m1 ties after the scale and subnormals
    p = torch.rand(6, 7, 40, generator=g) * torch.exp2(torch.randint(-40, 1, (6, 7, 40), generator=g).float())
    p[0, 0, :4] = torch.tensor([0.0, 1.0, 2.0**-149, 0.5])
    p[1, :, :16] = 0.0  # an all-zero block
    ties = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ties = ((ties[1:127] + ties[2:128]) / 2)[:40] / 256.0  # midpoints of e4m3 codes, after the x256
    p[2, 0] = ties[:40]
    for scale in (1.0, 256.0, 2.0**8.807):
        for fmt in _FP8:
            want = round_to(p * scale if scale != 1.0 else p, fmt)
            got = _p_fp8(lib, p, scale, fmt)
            if got is None or not torch.equal(want.view(torch.int32), got.view(torch.int32)):
                return f"P's FP8 rounding ({fmt.value}, x{scale:g})"
    for w in (40, 32, 7):  # ragged and whole blocks
        pw = p[..., :w].contiguous()
        want, got = torch_sage3_p(pw, 448.0 * 6.0), _sage3_p(lib, pw, 448.0 * 6.0)
        if got is None or not torch.equal(want.view(torch.int32), got.view(torch.int32)):
            return f"SageAttention3's P quantisation (width {w})"
    from flashcheck.kernels.formats.sage3 import quantize_fp4x16

    x = torch.randn(2, 3, 37, 40, generator=g) * torch.exp2(torch.randint(-14, 8, (2, 3, 37, 40), generator=g))
    x[0, 0, :, :16] = 0.0
    x[0, 1, :16, :] = 2.0**-13  # a block whose scale rounds to an e4m3 subnormal or 0
    x = x.to(torch.bfloat16).float()  # the half-precision values SageAttention3 quantises
    for dim in (-1, -2):
        got = _fp4x16(lib, x, dim)
        want, got32 = quantize_fp4x16(x, dim=dim), _fp4x16(lib, x, dim, torch.float32)
        if got is None or got32 is None or not torch.equal(want.view(torch.int64), got.view(torch.int64)):
            return f"SageAttention3's FP4 input quantisation (dim {dim})"
        if not torch.equal(want.float().view(torch.int32), got32.view(torch.int32)):
            return f"SageAttention3's FP4 input quantisation in float32 (dim {dim})"
    return _selftest_nvfp4(lib, g) or _selftest_steps(lib, g)


def _selftest_nvfp4(lib, g: torch.Generator) -> str:
    """_selftest's NVFP4 part: the input quantiser's pieces, and the "e2m1s" check of kernels.sim.mma_ops."""
    from flashcheck.core.quant import nvfp4_parts
    from flashcheck.kernels.formats.e2m1s import fits_e2m1s

    x = torch.randn(2, 3, 37, 40, generator=g) * torch.exp2(torch.randint(-30, 8, (2, 3, 37, 40), generator=g))
    x[0, 0, :, :16] = 0.0
    x[0, 1, :16, :] = 2.0**-13  # blocks whose scale is an e4m3 subnormal or 0, or floored
    x[1, 2, 3, :3] = torch.tensor([-0.0, 2.0**-140, -(2.0**-149)])
    for floor in (False, True):
        for dim in (-1, -2):
            want = nvfp4_parts(x, dim=dim, scale_floor=floor)
            amax = x.abs().amax()
            s_enc = float((448.0 * 6.0) / amax)
            got = _nvfp4(lib, x, dim, s_enc, floor)
            same = got is not None and all(
                torch.equal(w.view(torch.int32), h.view(torch.int32)) for w, h in zip(want[:2], got, strict=True)
            )
            if not same:
                return f"NVFP4's input quantisation (dim {dim}, floor {floor})"
    scaled = nvfp4_parts(x, dim=-1).scaled.contiguous()
    bad = scaled.clone()
    bad[1, 1, 1, 1] = 0.8125  # 6 significant bits: no e2m1 x e4m3 value
    for t in (
        scaled,
        bad,
        scaled * 2.0**-20,
        scaled.double(),
        torch.cat([scaled.double(), bad.double()], -1)[..., :40],
        torch.cat([bad, scaled], -1)[..., 40:],
        torch.cat([bad, scaled], -1)[..., :40],
    ):
        got = _e2m1s(lib, t)
        if got is None or got[0] != fits_e2m1s(t, t.to(torch.float32)):
            return "the e2m1s operand check"
        if got[0] and not torch.equal(got[1], t.to(torch.float32)):
            return "the e2m1s operand's float32 copy"
    return ""


def _selftest_steps(lib, g: torch.Generator) -> str:
    """_selftest's second half: FA4's emulated exp2 columns, the Q K^T descale, the P·V unit conversions."""
    s = torch.randn(3, 5, 70, generator=g) * 20
    s[0, 0, :8] = torch.tensor([-200.0, -127.0, -126.5, -0.0, 0.0, 126.0, -float("inf"), 127.0])
    idx = torch.tensor([0, 1, 2, 5, 6, 7, 8, 40, 69], dtype=torch.int64)
    out = torch.exp2(s)
    want = out.clone()
    want[..., idx] = ex2_emulation(s[..., idx])
    if not (_ex2_columns(lib, s, idx, POLY_EX2_3, out) and torch.equal(want.view(torch.int32), out.view(torch.int32))):
        return "FA4's emulated exp2"
    acc = torch.randn(2, 3, 5, 9, generator=g) * 1e3
    qs = torch.rand(2, 3, 5, 1, generator=g, dtype=torch.float64) / 3
    ks = torch.rand(2, 3, 9, 1, generator=g, dtype=torch.float64) / 7
    one = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    for a, b in ((qs, ks), (one, ks), (qs, one), (one * 0.1, one * 0.3)):
        want = acc.to(torch.float64).mul_((a * 0.125) * b.transpose(-1, -2)).to(torch.float32)
        out = torch.empty_like(acc)
        _descale(lib, acc, a, b.transpose(-1, -2), 0.125, out)
        if not torch.equal(want.view(torch.int32), out.view(torch.int32)):
            return "the Q K^T descale"
        inplace = acc.clone()  # acc in out (the MMA's accumulator descaled where it lies)
        _descale(lib, inplace, a, b.transpose(-1, -2), 0.125, inplace)
        if not torch.equal(want.view(torch.int32), inplace.view(torch.int32)):
            return "the Q K^T descale in place"
    o = torch.randn(2, 3, 8, 9, generator=g)[:, :, 3:]  # strided rows
    for u in (torch.rand(2, 3, 1, 9, generator=g, dtype=torch.float64) / 3, one / 3):
        want_div = o.to(torch.float64, copy=True).div_(u).to(torch.float32)
        want_mul = acc.to(torch.float64).mul_(u)
        want_add = o.clone().add_(acc.to(torch.float64).mul_(u).to(torch.float32))
        got_div = torch.empty_like(o, memory_format=torch.contiguous_format)
        _units(lib, o, u, got_div, UNIT_DIV)
        got_mul = torch.empty(2, 3, 8, 9)[:, :, 3:]
        _units(lib, acc, u, got_mul, UNIT_MUL)
        got_add = o.clone()
        _units(lib, acc, u, got_add, UNIT_ADD)
        for w_, g_ in ((want_div, got_div), (want_mul.to(torch.float32), got_mul), (want_add, got_add)):
            if not torch.equal(w_.view(torch.int32), g_.contiguous().view(torch.int32)):
                return "the P·V unit conversions"
        alpha = torch.rand(2, 3, 5, 1, generator=g)
        alpha[0, 0] = 0.0
        oz = o.clone()
        oz[0, 1, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])  # zeros and an underflow: +0 as the start makes
        want = oz.mul(alpha).to(torch.float64).div_(u).to(torch.float32) + 0.0
        got = torch.empty(2, 3, 8, 9)[:, :, 3:]
        _pv_start(lib, oz, alpha, u, got)
        if not torch.equal(want.view(torch.int32), got.contiguous().view(torch.int32)):
            return "the P·V MMA's start"
        return _selftest_rescale(lib, o, alpha, u, acc)
    return ""


def _selftest_rescale(lib, o, alpha, u, acc) -> str:
    """_selftest_steps' O rescales (fc_rescale) against torch's mul_ and add_ (strided o, zeros and an underflow)."""
    for al in (alpha, None):
        oz = o.clone()
        oz[0, 1, 0, :3] = torch.tensor([0.0, -0.0, -(2.0**-140)])
        want, got = oz.clone(), oz.clone()
        (want.mul_(al) if al is not None else want).add_(0.0)
        _rescale(lib, got, al, None, None)
        want2, got2 = oz.clone(), oz.clone()
        (want2.mul_(al) if al is not None else want2).add_(acc.to(torch.float64).mul_(u).to(torch.float32))
        _rescale(lib, got2, al, acc, u)
        for w_, g_ in ((want, got), (want2, got2)):
            if not torch.equal(w_.contiguous().view(torch.int32), g_.contiguous().view(torch.int32)):
                return "the O rescales"
    return ""


@functools.cache
def _native() -> tuple[object | None, str]:
    lib, why = cbuild.load("preset", SOURCE, "the quantised presets' step passes run in torch")
    if lib is None:
        return None, why
    lib.fc_p_fp8.argtypes = [_P, _P, _I64, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double]
    lib.fc_sage3_p.argtypes = [_P, _P, _I64, _I64, ctypes.c_float]
    lib.fc_fp4x16.argtypes = [_P, _P, _I64, _I64, _I64, ctypes.c_int]
    lib.fc_ex2_cols.argtypes = [_P, _P, _I64, _I64, _P, _I64, _P, ctypes.c_int]
    lib.fc_ex2_cols.restype = ctypes.c_int
    lib.fc_nvfp4.argtypes = [_P, _P, _P, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int]
    lib.fc_e2m1s_f32.argtypes = [_P, _I64, _I64, _I64]
    lib.fc_e2m1s_f64.argtypes = [_P, _I64, _I64, _I64, _P]
    lib.fc_nvfp4.restype = lib.fc_e2m1s_f32.restype = lib.fc_e2m1s_f64.restype = ctypes.c_int
    lib.fc_p_fp8.restype = lib.fc_sage3_p.restype = lib.fc_fp4x16.restype = ctypes.c_int
    lib.fc_descale.argtypes, lib.fc_descale.restype = [_P] * 6 + [ctypes.c_double] + [_P] * 3, None
    lib.fc_units.argtypes, lib.fc_units.restype = [_P] * 7 + [ctypes.c_int], None
    lib.fc_pv_start.argtypes, lib.fc_pv_start.restype = [_P] * 9, None
    lib.fc_rescale.argtypes, lib.fc_rescale.restype = [_P] * 9 + [ctypes.c_int], None
    failed = _selftest(lib)
    if failed:
        return None, f"the C pass differs from the torch steps ({failed}): torch runs it"
    return lib, ""


def library():
    """The self-tested library, or None (callers keep their torch steps)."""
    return _native()[0]


def native_status() -> dict:
    """{"available": bool, "reason": str} for `flashcheck doctor`."""
    lib, why = _native()
    return {"available": lib is not None, "reason": why}
