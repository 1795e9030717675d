/* The quantised presets' per-step element-wise passes (kernels/native/presets.py says how each matches
   the torch steps). */
#include "round.h"
#include "presets.h"

/* fp8_round's steps in float32 for a float32 y (mbits <= 3, emin >= -14, maxv an exact float): the clamp, and
   scalings by powers of two that neither overflow nor underflow (a * 2^(mbits - e) lies below 2^(mbits + 1), the
   result is a multiple of 2^(emin - mbits)), so every step is exact and the value is fp8_round's; branch-free
   and twice as wide as the double form, so it vectorises */
static inline float fp8_round_f(float y, int mbits, int emin, float maxv) {
    y = y < -maxv ? -maxv : (y > maxv ? maxv : y);
    const float a = fabsf(y);
    uint32_t u;
    memcpy(&u, &a, 4);
    int e = (int)(u >> 23) - 127; /* a float32 subnormal or 0 reads -127: below every emin */
    e = e < emin ? emin : e;
    uint32_t up = (uint32_t)(127 + mbits - e) << 23, dn = (uint32_t)(127 + e - mbits) << 23;
    float fu, fd;
    memcpy(&fu, &up, 4);
    memcpy(&fd, &dn, 4);
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
            float m = b1 - b0 < 16 ? 0.0f : -INFINITY; /* padding zeros take part in the maximum */
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

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* a 16-element block's 1x16 FP4 scale from its max |x| bits ma (see nvfp4_scale; *bad set where ma is NaN) */
static inline float fp4x16_scale(uint32_t ma, int *bad) {
    *bad |= ma > 0x7F800000u;
    return (float)fp8_round((double)(u2f(ma) / 6.0f), 3, -6, 448.0);
}

/* one element, written as float64 or float32 (f32): e2m1(x inv) * s is exact in either (a 2-bit by 4-bit
   significand product, 2^-10 .. 2688, a normal float32), so the float32 product is the float64 one */
static inline void fp4x16_put(float x, float inv, float s, void *out, int64_t j, int f32) {
    const float e = fp4_round(x * inv);
    if (f32)
        ((float *)out)[j] = e * s;
    else
        ((double *)out)[j] = (double)e * (double)s;
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
    if (nc == 1) { /* blocks along the contiguous dim */
        for (int64_t r = 0; r < na; r++)
            for (int64_t b0 = r * n; b0 < r * n + n; b0 += 16) {
                const int64_t b1 = b0 + 16 < r * n + n ? b0 + 16 : r * n + n;
                uint32_t ma = 0;
                for (int64_t i = b0; i < b1; i++) {
                    const uint32_t u = f2u(x[i]) & 0x7FFFFFFFu;
                    ma = u > ma ? u : ma;
                }
                const float s = fp4x16_scale(ma, &bad), inv = s > 0.0f ? 1.0f / s : 0.0f;
                if (f32)
                    for (int64_t i = b0; i < b1; i++) fp4x16_put(x[i], inv, s, out, i, 1);
                else
                    for (int64_t i = b0; i < b1; i++) fp4x16_put(x[i], inv, s, out, i, 0);
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
                    for (int64_t c = 0; c < w; c++)
                        fp4x16_put(x[o + i * nc + c], iv[c], sc[c], out, o + i * nc + c, f32);
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
int fc_nvfp4(const float *x, float *values, float *scaled, int64_t na, int64_t n, int64_t nc, float s_enc, int floor_) {
    int bad = 0;
    if (nc == 1) { /* blocks along the contiguous dim */
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
    enum { CH = 256 }; /* blocks along a strided dim: CH columns at a time, each with its own scale */
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
            uint32_t u;
            memcpy(&u, x + r * rs + i, 4);
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
    return _mm512_cvtpd_ps(t); /* round to nearest (the default MXCSR mode, as the C casts) */
}

/* fc_ex2_cols for FA4's cubic (np 4) on idx ascending in a span of at most 1024 columns: the span's every column
   computed 16 at a time, stored only where idx names it (masked stores). 0 where it does not apply. */
static int ex2_span16(const float *x, float *out, int64_t rows, int64_t w, const int64_t *idx, int64_t ni,
                      const double *poly, int *bad) {
    if (ni < 1 || idx[ni - 1] - idx[0] >= 1024) return 0;
    for (int64_t j = 1; j < ni; j++)
        if (idx[j] <= idx[j - 1]) return 0;
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
            worse |= m & ~_mm512_cmp_ps_mask(v, lim, _CMP_LE_OQ); /* NaN or above 127 */
            const __m512 xc = _mm512_max_ps(v, low);              /* v < -127 ? -127 : v (a NaN is reported above) */
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
   step exact, as there); a NaN lane stays that NaN, as in the scalar rounding (max_ps would turn it into -6: a
   block holding inf has the quotient inf / inf) */
static inline __m512 fp4_round16(__m512 y0) {
    const __mmask16 nan = _mm512_cmp_ps_mask(y0, y0, _CMP_UNORD_Q);
    const __m512 y = _mm512_min_ps(_mm512_max_ps(y0, _mm512_set1_ps(-6.0f)), _mm512_set1_ps(6.0f));
    const __m512i u = _mm512_castps_si512(y), sign = _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u));
    const __m512i a = _mm512_andnot_si512(sign, u);
    const __m512i e =
        _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(127)), _mm512_setzero_si512());
    const __m512 fu = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(128), e), 23));
    const __m512 fd = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_set1_epi32(126), e), 23));
    const __m512 r =
        _mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(a), fu), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 out = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(r, fd)), sign));
    return _mm512_mask_blend_ps(nan, out, y0);
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
int fc_ex2_cols(const float *x, float *out, int64_t rows, int64_t w, const int64_t *idx, int64_t ni, const double *poly,
                int np) {
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
            uint32_t u;
            memcpy(&u, &p, 4);
            u += (uint32_t)(int32_t)fl << 23;
            memcpy(orow + idx[j], &u, 4);
        }
    }
    return !bad;
}

/* over a [n0, n1, n2] index space of rows of n[3] elements, every tensor by its strides (elements; 0 where
   broadcast): R(t, s) is t's row, E(t, s) its element i3 (the unit stride apart, so the common case vectorises) */
#define LOOP3(n)                                                                                                       \
    for (int64_t i0 = 0; i0 < n[0]; i0++)                                                                              \
        for (int64_t i1 = 0; i1 < n[1]; i1++)                                                                          \
            for (int64_t i2 = 0; i2 < n[2]; i2++)
#define R(t, s) (t + i0 * s[0] + i1 * s[1] + i2 * s[2])

/* qk_scores' descale: out = (float)((double)acc * ((qs * factor) * ks)) */
void fc_descale(const float *acc, const int64_t *as, const double *qs, const int64_t *qss, const double *ks,
                const int64_t *kss, double factor, float *out, const int64_t *os, const int64_t *n) {
    const int64_t w = n[3], sa = as[3], sk = kss[3], so = os[3];
    LOOP3(n) {
        const float *a = R(acc, as);
        const double *k = R(ks, kss), qf = *R(qs, qss) * factor; /* qs is constant along the row (its stride 0) */
        float *o = R(out, os);
        if (sa == 1 && sk == 0 && so == 1) { /* one scale for the row (per-tensor K): qf * k[i] is one value */
            const double f = qf * k[0];
            if (a == o)
                for (int64_t i = 0; i < w; i++) o[i] = (float)((double)o[i] * f);
            else
                for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * f);
        } else if (sa == 1 && sk == 1 && so == 1 && a == o) /* in place (acc is out) */
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
        const double b0 = *b; /* a unit constant along the row (stride 0): the loops below vectorise */
        if (sx == 1 && su == 0 && so == 1 && mode == 0)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] / b0);
        else if (sx == 1 && su == 0 && so == 1 && mode == 1)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * b0);
        else if (sx == 1 && su == 0 && so == 1)
            for (int64_t i = 0; i < w; i++) o[i] = o[i] + (float)((double)a[i] * b0);
        else if (unit && mode == 0)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] / b[i]);
        else if (unit && mode == 1)
            for (int64_t i = 0; i < w; i++) o[i] = (float)((double)a[i] * b[i]);
        else if (unit)
            for (int64_t i = 0; i < w; i++) o[i] = o[i] + (float)((double)a[i] * b[i]);
        else if (mode == 0)
            for (int64_t i = 0; i < w; i++) o[i * so] = (float)((double)a[i * sx] / b[i * su]);
        else if (mode == 1)
            for (int64_t i = 0; i < w; i++) o[i * so] = (float)((double)a[i * sx] * b[i * su]);
        else
            for (int64_t i = 0; i < w; i++) o[i * so] = o[i * so] + (float)((double)a[i * sx] * b[i * su]);
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
        if (mode == 0 && al && so == 1)
            for (int64_t i = 0; i < w; i++) c[i] = c[i] * f + 0.0f;
        else if (mode == 0 && so == 1)
            for (int64_t i = 0; i < w; i++) c[i] = c[i] + 0.0f;
        else if (mode == 0)
            for (int64_t i = 0; i < w; i++) c[i * so] = (al ? c[i * so] * f : c[i * so]) + 0.0f;
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
        else
            for (int64_t i = 0; i < w; i++) c[i * so] = (float)((double)(a[i * sx] * f) / b[i * su]) + 0.0f;
    }
}
