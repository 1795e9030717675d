/* kernels.tensorcore.mma's block-FMA chain, one output row at a time (its rules and why each step is exact are in
   kernels/tensorcore/mma.py's docstring; this file only says how the loops are laid out).

   Rows go in groups of RG; each group walks b's k in chunks of whole blocks small enough to stay in L1 (b used in
   place where its rows are contiguous and N a whole number of vectors), every row of the group per chunk; each
   output's blocks keep their order. Per output row and up to 64 outputs at once, per block of nfma k: pass 1 takes
   the largest product exponent E (sums of the operands' clamped exponents on int8 lanes, 64 outputs per vector,
   or int16 lanes; a zero operand's exponent Z8 / Z16 keeps its products out), pass 2 sums the truncated terms
   trunc(a_i b_j 2^(frac - E)) as integers (int32 partial sums of `sub` k, so no partial sum can overflow), then
   the block's result is formed per output and truncated to frac_out bits. The inner loops run over the N outputs
   (contiguous in b), so they vectorise, without branches on the data (a zero a_i's terms are zeros).

   - f32: a, b float32 holding narrow-format values (every product exact in float32, a nonzero product's
     clamped exponent sum >= -28, frac <= 25; kernels/native/mma.py's SIG_BITS: codes, or e2m1 x e4m3 values):
     2^(frac - E) is a normal float32, each scaled product is exact (or below 1 and truncated to 0), the
     accumulator is float32. Early c with frac <= 13 keeps the block in one int32 sum (exact as a float32), else
     the partial sums meet in float64. A block without a nonzero product takes the float64 rule (E from c alone,
     at least min_exp). With AVX-512, late c with nf <= 2 sub (B200) runs tile_late (the block's two int32 halves
     finalised on float32 bits, float64 only where their int32 sum overflows) and the early-c int32 route
     tile_early (mask registers, no per-lane NONE blends).
   - f64: a, b float64 (any values kernels.tensorcore.mma's float64 path takes): products rounded to float64 as torch
     does, the accumulator float64 holding fp32 values. A group whose operands are float32 values short enough
     that every product is exact and normal in float32, with no overflow possible (fits_f32: dequantised narrow
     codes times their scales), runs the f32 tile on float32 copies instead (int16 exponents): the same bits. */
#include "mma.h"

/* The 64-byte vectors below cross only static always-inline functions, never the library's ABI: GCC's note that
   their calling convention differs without AVX-512 does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define NOPROD   (-20000) /* a block's E at or below it: no nonzero product (NONE) */
#define NONE     (-(1 << 30))
#define Z8       (-64)    /* the f32 variant's int8 exponent of a zero operand (other exponents in [-14, 16]) */
#define NOPROD8  (-40)    /* an int8 exponent sum below it has a zero operand (no overflow: -128 at least) */
#define Z16      (-12000) /* the f64 variant's int16 exponent of a zero operand (others in [-126, 1023]) */
#define NOPROD16 (-5000)

static inline float pow2f(int e) {
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline double pow2d(int e) {
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static inline double mask_out(double d, int frac_out) {
    uint64_t u;
    memcpy(&u, &d, 8);
    u &= ~((UINT64_C(1) << (52 - frac_out)) - 1);
    memcpy(&d, &u, 8);
    return d;
}

/* d truncated toward zero to frac_out fraction bits of its exponent, at least fp32's -126 */
static inline double trunc_out(double d, int frac_out) {
    if (fabs(d) < 0x1p-126) return trunc(d * pow2d(126 + frac_out)) * pow2d(-126 - frac_out);
    return mask_out(d, frac_out);
}

/* x rounded to the nearest fp16 (ties to even, overflow to inf), as a float */
static inline float round_half(float x) {
    float ax = fabsf(x);
    if (!(ax < 65520.0f)) return ax != ax ? x : copysignf(INFINITY, x);
    if (ax < 0x1p-14f) return copysignf(nearbyintf(ax * 0x1p24f) * 0x1p-24f, x);
    int e;
    frexpf(ax, &e);
    e -= 1;
    return copysignf(nearbyintf(ax * pow2f(10 - e)) * pow2f(e - 10), x);
}

/* the f32 variant's operand exponents as int8 (their sums fit): narrow formats' exponents lie in [-14, 15], e2m1s's
   (e2m1 x e4m3 values) in [-10, 11] (kept within [emin, 16]); a zero operand's Z8 keeps every sum with it below
   NOPROD8 */
static void exps_f32(const float *x, int8_t *e, int64_t n, int emin) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512i lo = _mm512_set1_epi32(emin + 127), hi = _mm512_set1_epi32(16 + 127);
    const __m512i z = _mm512_set1_epi32(Z8 + 127), ff = _mm512_set1_epi32(0xFF), bias = _mm512_set1_epi32(127);
    for (; i + 16 <= n; i += 16) { /* the biased exponent clamped to [emin, 16] + 127 (or Z8 + 127), less 127 */
        const __m512i u = _mm512_loadu_si512((const void *)(x + i));
        const __m512i f = _mm512_and_si512(_mm512_srli_epi32(u, 23), ff);
        const __mmask16 nz = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7FFFFFFF));
        const __m512i r =
            _mm512_mask_sub_epi32(_mm512_sub_epi32(z, bias), nz, _mm512_min_epi32(_mm512_max_epi32(f, lo), hi), bias);
        _mm_storeu_si128((__m128i *)(e + i), _mm512_cvtepi32_epi8(r));
    }
#endif
    for (; i < n; i++) { /* no branch: vectorised (a float32 subnormal's -127 is clamped to emin) */
        uint32_t u;
        memcpy(&u, x + i, 4);
        const int t = (int)((u >> 23) & 0xFF) - 127;
        e[i] = (u & 0x7FFFFFFFu) ? (int8_t)(t < emin ? emin : t > 16 ? 16 : t) : (int8_t)Z8;
    }
}

/* the f64 variant's operand exponents as int16: within [emin, 1023] (emin >= -126), a zero operand's Z16 keeps
   every sum with it below NOPROD16 */
static void exps_f64(const double *x, int16_t *e, int64_t n, int emin) {
    for (int64_t i = 0; i < n; i++) { /* no branch: vectorised (a float64 subnormal's -1023 is clamped to emin) */
        uint64_t u;
        memcpy(&u, x + i, 8);
        const int t = (int)((u >> 52) & 0x7FF) - 1023;
        e[i] = (u << 1) ? (int16_t)(t < emin ? emin : t) : (int16_t)Z16;
    }
}

/* efloor: at most every nonzero product's exponent, and 2^(frac - efloor) a normal float32 (the f32 tile) */
typedef struct {
    int nf, frac, frac_out, min_exp, late_c, fp16, sub, efloor;
} model_t;

/* GCC / clang vector extensions: one zmm register where the CPU has AVX-512, split by the compiler elsewhere */
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef double vd __attribute__((vector_size(64)));
typedef int64_t vl __attribute__((vector_size(64)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef float vf8 __attribute__((vector_size(32)));
typedef int8_t vb __attribute__((vector_size(64)));
typedef int8_t vb16 __attribute__((vector_size(16)));
typedef int16_t vh __attribute__((vector_size(64)));
typedef int16_t vh8 __attribute__((vector_size(16)));
typedef int16_t vh16 __attribute__((vector_size(32)));
#define VF         16 /* float lanes per vector */
#define VD         8  /* double lanes per vector */
#define TV         4  /* vectors per tile of outputs */
#define INLINE     static inline __attribute__((always_inline))
#define LO8(x)     __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7)
#define HI8(x)     __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15)
#define JOIN(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

#if defined(__AVX512F__)
INLINE vi vmax(vi a, vi b) { return (vi)_mm512_max_epi32((__m512i)a, (__m512i)b); }
INLINE vi8 vmax8(vi8 a, vi8 b) { return (vi8)_mm256_max_epi32((__m256i)a, (__m256i)b); }
#if defined(__AVX512BW__)
INLINE vb vmaxb(vb a, vb b) { return (vb)_mm512_max_epi8((__m512i)a, (__m512i)b); }
INLINE vh vmaxh(vh a, vh b) { return (vh)_mm512_max_epi16((__m512i)a, (__m512i)b); }
#else
INLINE vb vmaxb(vb a, vb b) {
    vb g = a > b;
    return (a & g) | (b & ~g);
}
INLINE vh vmaxh(vh a, vh b) {
    vh g = a > b;
    return (a & g) | (b & ~g);
}
#endif
#else
INLINE vb vmaxb(vb a, vb b) {
    vb g = a > b;
    return (a & g) | (b & ~g);
}
INLINE vh vmaxh(vh a, vh b) {
    vh g = a > b;
    return (a & g) | (b & ~g);
}
INLINE vi vmax(vi a, vi b) {
    vi g = a > b;
    return (a & g) | (b & ~g);
}
INLINE vi8 vmax8(vi8 a, vi8 b) {
    vi8 g = a > b;
    return (a & g) | (b & ~g);
}
#endif
/* 16 int8 values widened to int32 lanes */
#if defined(__AVX512F__)
INLINE vi widen8(const int8_t *x) { return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x)); }
INLINE vi widen16(const int16_t *x) { return (vi)_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x)); }
#else
INLINE vi widen8(const int8_t *x) {
    vb16 v;
    memcpy(&v, x, 16);
    return __builtin_convertvector(v, vi);
}
INLINE vi widen16(const int16_t *x) {
    vh16 v;
    memcpy(&v, x, 32);
    return __builtin_convertvector(v, vi);
}
#endif
/* the low and high 8 int32 lanes as float64, and two float64 vectors rounded into one float32 vector */
#if defined(__AVX512F__)
INLINE vd lo_pd(vi x) { return (vd)_mm512_cvtepi32_pd(_mm512_castsi512_si256((__m512i)x)); }
INLINE vd hi_pd(vi x) { return (vd)_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64((__m512i)x, 1)); }
INLINE vf join_ps(vd lo, vd hi) {
    const __m256 l = _mm512_cvtpd_ps((__m512d)lo), h = _mm512_cvtpd_ps((__m512d)hi);
    const __m512d w = _mm512_castps_pd(_mm512_castps256_ps512(l));
    return (vf)_mm512_castpd_ps(_mm512_insertf64x4(w, _mm256_castps_pd(h), 1));
}
#else
INLINE vd lo_pd(vi x) { return __builtin_convertvector(LO8(x), vd); }
INLINE vd hi_pd(vi x) { return __builtin_convertvector(HI8(x), vd); }
INLINE vf join_ps(vd lo, vd hi) { return JOIN(__builtin_convertvector(lo, vf8), __builtin_convertvector(hi, vf8)); }
#endif
INLINE vd pow2v(vi8 e) { return (vd)((__builtin_convertvector(e, vl) + 1023) << 52); } /* e in [-1022, 1023] */
#if defined(__AVX512F__)
INLINE int any(vi m) { return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0; }
INLINE int any8(vl m) { return _mm512_test_epi64_mask((__m512i)m, (__m512i)m) != 0; }
#else
INLINE int any(vi m) {
    int r = 0;
    for (int k = 0; k < VF; k++) r |= m[k];
    return r;
}
INLINE int any8(vl m) {
    long r = 0;
    for (int k = 0; k < VD; k++) r |= m[k];
    return r != 0;
}
#endif

/* round_half on 16 lanes: with AVX-512, vcvtps2ph's IEEE conversion to fp16 (round to nearest even, overflow
   to inf, subnormals kept) and back; else |x| + 1.5 2^(e + 13) has fp16's grid 2^(e - 10) as its ulp (e >= -14:
   subnormals' 2^-24), so float32's own round-to-nearest-even rounds it; subtracting the constant again is exact */
#if defined(__AVX512F__)
INLINE vf vround_half(vf x) {
    return (vf)_mm512_cvtph_ps(_mm512_cvtps_ph((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else
INLINE vf vround_half(vf x) {
    const vi u = (vi)x, sign = u & (int32_t)0x80000000u;
    const vf ax = (vf)(u & 0x7FFFFFFF);
    vi e = vmax(((u >> 23) & 0xFF) - 127, (vi){} - 14);
    e = e - ((e - 16) & (e > 16)); /* at most 16: larger values overflow below */
    const vf big = (vf)((e + 140) << 23) * 1.5f;
    const vi r = (vi)((ax + big) - big), over = ax >= 65520.0f;
    return (vf)(((r & ~over) | (0x7F800000 & over)) | sign);
}
#endif

/* a block without a nonzero product: c alone (early c), aligned to max(its exponent, min_exp) */
static double lone_c(double c, const model_t *m) {
    if (m->late_c) return (double)(0.0f + (float)c);
    if (c == 0.0) return 0.0;
    int e;
    frexp(c, &e);
    e -= 1;
    if (e < m->min_exp) e = m->min_exp;
    double q = pow2d(e - m->frac);
    return trunc_out(trunc(c / q) * q, m->frac_out) + 0.0;
}

/* s[0 .. nt) += the truncated terms trunc(a_i b_j sc) of k in [k0, k0 + n): with n a constant (a whole block)
   the compiler unrolls the loop fully */
#define TERMS(s, k0, n)                                                                                                \
    for (int64_t i = (k0); i < (k0) + (n); i++) {                                                                      \
        const float ai = ar[i];                                                                                        \
        for (int t = 0; t < nt; t++) {                                                                                 \
            vf b;                                                                                                      \
            memcpy(&b, bm + i * ldb + t * VF, 64);                                                                     \
            s[t] += __builtin_convertvector((ai * b) * sc[t], vi); /* exact, then truncated to int */                  \
        }                                                                                                              \
    }

/* one block's sums of truncated terms over k0..k1, 16 outputs per vector, from float32 operands: sd (two
   float64 halves per vector) starts from c's term; int32 partial sums of m->sub k cannot overflow */
INLINE void terms_f32(const float *ar, const float *bm, int64_t ldb, int64_t k0, int64_t k1, const vf *sc, vd *sd,
                      const int nt, const model_t *m) {
    for (int64_t s0 = k0; s0 < k1; s0 += m->sub) {
        const int64_t s1 = s0 + m->sub < k1 ? s0 + m->sub : k1;
        vi s[TV];
        for (int t = 0; t < nt; t++) s[t] = (vi){};
        TERMS(s, s0, s1 - s0)
        for (int t = 0; t < nt; t++) {
            sd[2 * t] += lo_pd(s[t]);
            sd[2 * t + 1] += hi_pd(s[t]);
        }
    }
}

/* pass 1 of a block k0..k1: ep[t], the largest sum of the operands' exponents per output of the nt vectors
   (below NOPROD16 / NOPROD8 where every product has a zero operand); wide: int16 exponents, else int8 */
INLINE void block_exps(const void *eav, const void *ebv, int64_t lde, int64_t k0, int64_t k1, const int nt,
                       const int wide, vi *ep) {
    if (wide) { /* 32 outputs per int16 vector */
        const int16_t *ea = eav, *eb = ebv;
        vh lo = (vh){} + (int16_t)-32768, hi = lo;
        for (int64_t i = k0; i < k1; i++) {
            vh x;
            memcpy(&x, eb + i * lde, 64);
            lo = vmaxh(lo, x + ea[i]);
            if (nt > 2) {
                memcpy(&x, eb + i * lde + 32, 64);
                hi = vmaxh(hi, x + ea[i]);
            }
        }
        int16_t e16[TV * VF];
        memcpy(e16, &lo, 64);
        memcpy(e16 + 32, &hi, 64);
        for (int t = 0; t < nt; t++) { ep[t] = widen16(e16 + t * VF); }
    } else { /* all TV VF outputs at once (int8) */
        const int8_t *ea = eav, *eb = ebv;
        vb ep8 = (vb){} + (int8_t)-128, e1 = ep8, e2 = ep8, e3 = ep8; /* four chains of maxima, then one */
        int64_t i = k0;
        for (; i + 4 <= k1; i += 4) {
            vb x0, x1, x2, x3;
            memcpy(&x0, eb + i * lde, 64);
            memcpy(&x1, eb + (i + 1) * lde, 64);
            memcpy(&x2, eb + (i + 2) * lde, 64);
            memcpy(&x3, eb + (i + 3) * lde, 64);
            ep8 = vmaxb(ep8, x0 + ea[i]);
            e1 = vmaxb(e1, x1 + ea[i + 1]);
            e2 = vmaxb(e2, x2 + ea[i + 2]);
            e3 = vmaxb(e3, x3 + ea[i + 3]);
        }
        for (; i < k1; i++) {
            vb x;
            memcpy(&x, eb + i * lde, 64);
            ep8 = vmaxb(ep8, x + ea[i]);
        }
        ep8 = vmaxb(vmaxb(ep8, e1), vmaxb(e2, e3));
        int8_t e8[TV * VF];
        memcpy(e8, &ep8, sizeof e8);
        for (int t = 0; t < nt; t++) { ep[t] = widen8(e8 + t * VF); }
    }
}

#if defined(__AVX512F__)
/* tile_f32 for late c without an fp16 register where nf <= 2 sub (B200): the block in two int32 partial sums s1,
   s2 (its halves, at most sub k each; whole blocks of 32 k in loops of constant length). S = s1 + s2 is formed
   on float32 bits where it does not overflow int32 and ef = E - frac lies in [-126, 127] (2^ef a normal float32):
   vcvtdq2ps rounding toward zero keeps S's 24 leading significant bits, as trunc_out's mask on float64 keeps
   frac_out = 23 fraction bits (keep32 then keeps frac_out); |S| >= 1 times 2^ef is at least 2^-126, where
   trunc_out only masks, and exact, or an overflow to inf as cvtpd_ps rounds the float64 product. Other vectors
   (an int32 overflow: 32 terms near 2^27 of one sign) take the float64 route. ef = max(E, efloor) - frac: E
   where a product is nonzero (efloor's promise); where none is, S = 0 and the result +0 + c = lone_c's. */
INLINE void tile_late(const float *ar, const void *eav, const float *bm, int64_t ldb, const void *ebv, int64_t lde,
                      float *acc, const int nt, int64_t kb, int64_t K, const model_t *m, const int wide) {
    const uint64_t keep = ~((UINT64_C(1) << (52 - m->frac_out)) - 1);
    const int32_t keep32 = (int32_t)~((UINT32_C(1) << (23 - m->frac_out)) - 1);
    const __m512i top = _mm512_set1_epi32(254 << 23), span = _mm512_set1_epi32(253);
    for (int64_t k0 = kb; k0 < K; k0 += m->nf) {
        const int64_t k1 = k0 + m->nf < K ? k0 + m->nf : K;
        vi ep[TV], s[TV], s2[TV], sb[TV];
        vf sc[TV];
        block_exps(eav, ebv, lde, k0, k1, nt, wide, ep);
        for (int t = 0; t < nt; t++) {
            const vi f = m->frac + 127 - vmax(ep[t], (vi){} + m->efloor); /* 2^(frac - E)'s biased exponent */
            sb[t] = f;
            sc[t] = (vf)(f << 23);
            s[t] = s2[t] = (vi){};
        }
        if (k1 - k0 == 32 && m->nf == 32) {
            TERMS(s, k0, 16)
            TERMS(s2, k0 + 16, 16)
        } else {
            const int64_t mid = k0 + m->nf / 2 < k1 ? k0 + m->nf / 2 : k1;
            TERMS(s, k0, mid - k0)
            TERMS(s2, mid, k1 - mid)
        }
        for (int t = 0; t < nt; t++) {
            vf c, r;
            memcpy(&c, acc + t * VF, 64);
            const __m512i S = _mm512_add_epi32((__m512i)s[t], (__m512i)s2[t]); /* wraps on overflow */
            /* (S ^ s1) & (S ^ s2) < 0: the int32 sum overflowed; ef + 127 = 254 - f outside [1, 254] */
            const __m512i x = _mm512_ternarylogic_epi32(S, (__m512i)s[t], (__m512i)s2[t], 0x18);
            const __mmask16 odd = _mm512_movepi32_mask(x) | _mm512_cmpgt_epu32_mask((__m512i)sb[t], span);
            if (!odd) {
                const vf q = (vf)_mm512_cvt_roundepi32_ps(S, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                r = q * (vf)_mm512_sub_epi32(top, (__m512i)sc[t]); /* 2^ef: bits (254 << 23) - 2^(-ef)'s */
                if (m->frac_out < 23) r = (vf)((vi)r & keep32);
            } else { /* the float64 route */
                const vi ef = 127 - sb[t];
                const vd dl = (vd)((vl)((lo_pd(s[t]) + lo_pd(s2[t])) * pow2v(LO8(ef))) & ((vl){} + (int64_t)keep));
                const vd dh = (vd)((vl)((hi_pd(s[t]) + hi_pd(s2[t])) * pow2v(HI8(ef))) & ((vl){} + (int64_t)keep));
                r = join_ps(dl, dh);
            }
            r = r + c; /* c + the block's result: one fp32 addition */
            memcpy(acc + t * VF, &r, 64);
        }
    }
}

/* tile_f32's i32 route (early c, frac <= 13, the block in one int32 sum) with AVX-512 mask registers: where a
   product is nonzero, E >= efloor exceeds any zero or subnormal c's exponent read from its bits (-127) and any
   exponent sum with a zero operand, so neither needs replacing by NONE; the lanes without a product (a block's
   exponent sum below NOPROD) take lone_c below, as in tile_f32. */
INLINE void tile_early(const float *ar, const void *eav, const float *bm, int64_t ldb, const void *ebv, int64_t lde,
                       float *acc, const int nt, int64_t kb, int64_t K, const model_t *m, const int wide) {
    const __m512i keep32 = _mm512_set1_epi32((int32_t)~((UINT32_C(1) << (23 - m->frac_out)) - 1));
    const __m512i top = _mm512_set1_epi32(254 << 23), expo = _mm512_set1_epi32(0x7F800000);
    const int noprod = wide ? NOPROD16 : NOPROD8;
    for (int64_t k0 = kb; k0 < K; k0 += m->nf) {
        const int64_t k1 = k0 + m->nf < K ? k0 + m->nf : K;
        vi ep[TV], s[TV];
        vf c[TV], sc[TV];
        __mmask16 fin[TV], odd = 0;
        block_exps(eav, ebv, lde, k0, k1, nt, wide, ep);
        for (int t = 0; t < nt; t++) {
            memcpy(&c[t], acc + t * VF, 64);
            const vi u = (vi)c[t], ec = ((u >> 23) & 0xFF) - 127;
            fin[t] = _mm512_cmpneq_epi32_mask(_mm512_and_si512((__m512i)u, expo), expo);
            odd |= _mm512_cmplt_epi32_mask((__m512i)ep[t], _mm512_set1_epi32(noprod));
            const vi E = vmax(vmax(vmax(ep[t], ec), (vi){} + m->min_exp), (vi){} + m->efloor);
            sc[t] = (vf)((m->frac + 127 - E) << 23);                              /* 2^(frac - E) */
            s[t] = (vi)_mm512_maskz_cvttps_epi32(fin[t], (__m512)(c[t] * sc[t])); /* c's term */
        }
        if (k1 - k0 == 32 && m->nf == 32)
            TERMS(s, k0, 32)
        else if (k1 - k0 == 16 && m->nf == 16)
            TERMS(s, k0, 16)
        else
            TERMS(s, k0, k1 - k0)
        for (int t = 0; t < nt; t++) {
            /* the sum below 2^24, exact as a float32, times 2^(E - frac) (bits (254 << 23) - 2^(frac - E)'s) */
            const __m512 d =
                _mm512_mul_ps(_mm512_cvtepi32_ps((__m512i)s[t]), (__m512)_mm512_sub_epi32(top, (__m512i)sc[t]));
            vf r = (vf)_mm512_mask_and_epi32((__m512i)c[t], fin[t], (__m512i)d, keep32); /* an infinite c stays */
            if (m->fp16) r = vround_half(r);
            memcpy(acc + t * VF, &r, 64);
        }
        if (!odd) continue;
        for (int t = 0; t < nt; t++)
            for (int k = 0; k < VF; k++) {
                if (ep[t][k] >= noprod) continue;
                const float x = !((fin[t] >> k) & 1) ? c[t][k] : (float)lone_c((double)c[t][k], m);
                acc[t * VF + k] = m->fp16 ? round_half(x) : x;
            }
    }
}
#endif

/* nt vectors of outputs acc[0 .. nt VF) over the blocks from kb (a whole number of blocks) to K, float32
   operands: b's row i at bm + i ldb, its exponents at eb + i lde.
   i32 (early c, frac <= 13, the block in one partial sum): each term is below 2^15 and c's below 2^14, so the
   block's sum (nf <= 256) stays an int32 below 2^24, exact as a float32, and the result (a nonzero one at least
   2^(efloor - frac)) is formed and truncated on float32 bits, as the float64 route would (an overflow is inf).
   wide: the operands' exponents are int16 (tile_f64's, for float64 operands that fc_mma_chain_f64 found exact
   as float32 values whose products are normal float32 values, see fits_f32), else int8. */
INLINE void tile_f32(const float *ar, const void *eav, const float *bm, int64_t ldb, const void *ebv, int64_t lde,
                     float *acc, const int nt, int64_t kb, int64_t K, const model_t *m, const int wide) {
    const uint64_t keep = ~((UINT64_C(1) << (52 - m->frac_out)) - 1);
    const int32_t keep32 = (int32_t)~((UINT32_C(1) << (23 - m->frac_out)) - 1);
    const int i32 = !m->late_c && m->frac <= 13 && m->sub >= m->nf && m->nf <= 256;
#if defined(__AVX512F__)
    if (m->late_c && !m->fp16 && m->nf <= 2 * m->sub) {
        tile_late(ar, eav, bm, ldb, ebv, lde, acc, nt, kb, K, m, wide);
        return;
    }
    if (i32) {
        tile_early(ar, eav, bm, ldb, ebv, lde, acc, nt, kb, K, m, wide);
        return;
    }
#endif
    for (int64_t k0 = kb; k0 < K; k0 += m->nf) {
        const int64_t k1 = k0 + m->nf < K ? k0 + m->nf : K;
        vi ep[TV], E[TV], s[TV];
        vf c[TV], sc[TV];
        vd sd[2 * TV];
        block_exps(eav, ebv, lde, k0, k1, nt, wide, ep);
        for (int t = 0; t < nt; t++) {
            const vi none = ep[t] < (wide ? NOPROD16 : NOPROD8);
            ep[t] = (ep[t] & ~none) | (NONE & none);
        }
        for (int t = 0; t < nt; t++) {
            memcpy(&c[t], acc + t * VF, 64);
            const vi u = (vi)c[t], zero = c[t] == 0.0f, fin = (u & 0x7F800000) != 0x7F800000;
            /* c's exponent (a subnormal's reads -127: below any product's E; alone it takes lone_c) */
            const vi ec = m->late_c ? (vi){} + NONE : ((((u >> 23) & 0xFF) - 127) & ~zero) | (NONE & zero);
            E[t] = vmax(vmax(ep[t], ec), (vi){} + m->min_exp);
            sc[t] = (vf)((m->frac - vmax(E[t], (vi){} + m->efloor) + 127) << 23); /* no product: any finite scale */
            const vi ct = m->late_c ? (vi){} : __builtin_convertvector((vf)(u & fin) * sc[t], vi);
            if (i32) {
                s[t] = ct;
            } else {
                sd[2 * t] = lo_pd(ct);
                sd[2 * t + 1] = hi_pd(ct);
            }
        }
        if (i32) {
            if (k1 - k0 == 32 && m->nf == 32)
                TERMS(s, k0, 32)
            else if (k1 - k0 == 16 && m->nf == 16)
                TERMS(s, k0, 16)
            else
                TERMS(s, k0, k1 - k0)
        } else {
            terms_f32(ar, bm, ldb, k0, k1, sc, sd, nt, m);
        }
        for (int t = 0; t < nt; t++) {
            const vi ef = E[t] - m->frac;
            vf r;
            if (i32) { /* ef in [efloor - frac, 114] where a product is nonzero (other lanes are replaced below) */
                r = (vf)((vi)(__builtin_convertvector(s[t], vf) * (vf)((ef + 127) << 23)) & keep32);
            } else {
                const vd dl = (vd)((vl)(sd[2 * t] * pow2v(LO8(ef))) & ((vl){} + (int64_t)keep));
                const vd dh = (vd)((vl)(sd[2 * t + 1] * pow2v(HI8(ef))) & ((vl){} + (int64_t)keep));
                r = join_ps(dl, dh);
            }
            const vi fin = ((vi)c[t] & 0x7F800000) != 0x7F800000;
            if (m->late_c)
                r = r + c[t];
            else
                r = (vf)(((vi)r & fin) | ((vi)c[t] & ~fin)); /* an infinite c (an fp16 overflow) stays */
            if (m->fp16) r = vround_half(r);
            memcpy(acc + t * VF, &r, 64);
            const vi odd = ep[t] <= NOPROD; /* no product: c alone */
            if (!any(odd)) continue;
            for (int k = 0; k < VF; k++) {
                if (!odd[k]) continue;
                float x = !m->late_c && !fin[k] ? c[t][k] : (float)lone_c((double)c[t][k], m);
                acc[t * VF + k] = m->fp16 ? round_half(x) : x;
            }
        }
    }
}

/* the float64 rule for one output (any c, any result): the special lanes of tile_f64 */
static double out_f64(int64_t s, int32_t e, double c, const model_t *m) {
    double d = trunc_out((double)s * pow2d(e - m->frac), m->frac_out);
    if (!m->late_c && !isfinite(c)) d = c;
    d = m->late_c ? (double)((float)d + (float)c) : d + 0.0;
    return m->fp16 ? (double)round_half((float)d) : d;
}

/* nt vectors of outputs acc[0 .. nt VD) over the blocks from kb to K, float64 operands (laid out as tile_f32's) */
INLINE void tile_f64(const double *ar, const int16_t *ea, const double *bm, int64_t ldb, const int16_t *eb, int64_t lde,
                     double *acc, const int nt, int64_t kb, int64_t K, const model_t *m) {
    const int64_t keep = (int64_t)~((UINT64_C(1) << (52 - m->frac_out)) - 1);
    for (int64_t k0 = kb; k0 < K; k0 += m->nf) {
        const int64_t k1 = k0 + m->nf < K ? k0 + m->nf : K;
        vi8 ep[TV], E[TV];
        vd c[TV], sc[TV];
        vl s[TV];
        vh ep16 = (vh){} + (int16_t)-32768; /* the products' largest exponent, all TV VD outputs at once (int16) */
        for (int64_t i = k0; i < k1; i++) {
            vh x;
            memcpy(&x, eb + i * lde, 64);
            ep16 = vmaxh(ep16, x + ea[i]);
        }
        int16_t e16[TV * VD];
        memcpy(e16, &ep16, sizeof e16);
        for (int t = 0; t < nt; t++) {
            vh8 x;
            memcpy(&x, e16 + t * VD, 16);
            const vi8 w = __builtin_convertvector(x, vi8), none = w < NOPROD16;
            ep[t] = (w & ~none) | (NONE & none);
        }
        for (int t = 0; t < nt; t++) {
            memcpy(&c[t], acc + t * VD, 64);
            const vl u = (vl)c[t], zero = c[t] == 0.0;
            const vl fin = (u & 0x7FF0000000000000) != 0x7FF0000000000000;
            const vl ec = m->late_c ? (vl){} + NONE : ((((u >> 52) & 0x7FF) - 1023) & ~zero) | (NONE & zero);
            E[t] = vmax8(vmax8(ep[t], __builtin_convertvector(ec, vi8)), (vi8){} + m->min_exp);
            sc[t] = pow2v(m->frac - E[t]);
            s[t] = m->late_c ? (vl){} : __builtin_convertvector((vd)(u & fin) * sc[t], vl);
        }
        for (int64_t i = k0; i < k1; i++) {
            const double ai = ar[i];
            for (int t = 0; t < nt; t++) {
                vd b;
                memcpy(&b, bm + i * ldb + t * VD, 64);
                s[t] += __builtin_convertvector((ai * b) * sc[t], vl);
            }
        }
        for (int t = 0; t < nt; t++) {
            const vd d = __builtin_convertvector(s[t], vd) * pow2v(E[t] - m->frac);
            const vl fin = ((vl)c[t] & 0x7FF0000000000000) != 0x7FF0000000000000;
            const vl tiny = (d != 0.0) & (d < 0x1p-126) & (d > -0x1p-126);          /* trunc_out's fixed grid: scalar */
            const vl odd = tiny | (m->late_c ? (vl){} : ~fin) | ((vl){} - m->fp16); /* fp16: every lane scalar */
            vd r = (vd)((vl)d & keep) + 0.0;
            if (m->late_c) { /* c + the block's result: one fp32 addition */
                const vf8 sum = __builtin_convertvector(r, vf8) + __builtin_convertvector(c[t], vf8);
                r = __builtin_convertvector(sum, vd);
            }
            memcpy(acc + t * VD, &r, 64);
            if (!any8(odd)) continue;
            for (int k = 0; k < VD; k++)
                if (odd[k]) acc[t * VD + k] = out_f64(s[t][k], E[t][k], c[t][k], m);
        }
    }
}

/* one output row's np outputs (np a multiple of 16) in tiles of TV vectors, over the blocks of k0..k1 */
#define ROW(NAME, T, ET, TILE, VL, ...)                                                                                \
    static void NAME(const T *ar, const ET *ea, const T *bm, int64_t ldb, const ET *eb, int64_t np, T *acc,            \
                     int64_t k0, int64_t k1, const model_t *m) {                                                       \
        for (int64_t n0 = 0; n0 < np; n0 += TV * VL) {                                                                 \
            const int64_t left = (np - n0) / VL;                                                                       \
            const T *b = bm + n0;                                                                                      \
            const ET *e = eb + n0;                                                                                     \
            T *c = acc + n0;                                                                                           \
            if (left >= 4)                                                                                             \
                TILE(ar, ea, b, ldb, e, np, c, 4, k0, k1, m __VA_ARGS__);                                              \
            else if (left == 3)                                                                                        \
                TILE(ar, ea, b, ldb, e, np, c, 3, k0, k1, m __VA_ARGS__);                                              \
            else if (left == 2)                                                                                        \
                TILE(ar, ea, b, ldb, e, np, c, 2, k0, k1, m __VA_ARGS__);                                              \
            else                                                                                                       \
                TILE(ar, ea, b, ldb, e, np, c, 1, k0, k1, m __VA_ARGS__);                                              \
        }                                                                                                              \
    }
ROW(row_f32, float, int8_t, tile_f32, VF, , 0)
ROW(row_f32w, float, int16_t, tile_f32, VF, , 1)
ROW(row_f64, double, int16_t, tile_f64, VD)

#define RG 64 /* output rows per group: each group walks b's k in chunks, every row per chunk */

/* float64 operands through the f32 tile (fits_f32): float32 copies of b's matrix, of a group's rows and of their
   accumulators; b's scan (significand bits, smallest and largest exponent of its nonzero values) per batch */
typedef struct {
    float *b, *a, *c;
    int64_t have, scanned;
    int bsig, bmin, bmax;
} w32_t;

/* the largest significand width (bits; 0: all zero) and the smallest and largest exponent of the nonzero values
   among x[0 .. n), folded into *sig, *lo, *hi (a float64 subnormal reads -1023, an inf or nan 1024) */
static void scan_f64(const double *x, int64_t n, int *sig, int *lo, int *hi) {
    uint64_t o = 0;
    int64_t l = 4096, h = -4096, i = 0;
#if defined(__AVX512F__)
    __m512i vo = _mm512_setzero_si512(), vl_ = _mm512_set1_epi64(4096), vh_ = _mm512_set1_epi64(-4096);
    const __m512i abs = _mm512_set1_epi64(0x7FFFFFFFFFFFFFFF), lead = _mm512_set1_epi64(INT64_C(1) << 52);
    const __m512i field = _mm512_set1_epi64(0x7FF), bias = _mm512_set1_epi64(1023);
    for (; i + 8 <= n; i += 8) {
        const __m512i u = _mm512_loadu_si512((const void *)(x + i));
        const __mmask8 nz = _mm512_test_epi64_mask(u, abs);
        const __m512i e = _mm512_sub_epi64(_mm512_and_si512(_mm512_srli_epi64(u, 52), field), bias);
        vo = _mm512_mask_or_epi64(vo, nz, vo, _mm512_or_si512(u, lead));
        vl_ = _mm512_mask_min_epi64(vl_, nz, vl_, e);
        vh_ = _mm512_mask_max_epi64(vh_, nz, vh_, e);
    }
    o = (uint64_t)_mm512_reduce_or_epi64(vo);
    l = _mm512_reduce_min_epi64(vl_);
    h = _mm512_reduce_max_epi64(vh_);
#endif
    for (; i < n; i++) {
        uint64_t u;
        memcpy(&u, x + i, 8);
        const int64_t e = (int64_t)((u >> 52) & 0x7FF) - 1023;
        const uint64_t nz = (u << 1) ? ~UINT64_C(0) : 0;
        o |= (u | (UINT64_C(1) << 52)) & nz;
        const int64_t el = nz ? e : 4096, eh = nz ? e : -4096;
        l = el < l ? el : l;
        h = eh > h ? eh : h;
    }
    o &= (UINT64_C(1) << 53) - 1;
    const int w = o ? 53 - __builtin_ctzll(o) : 0;
    if (w > *sig) *sig = w;
    if (l < *lo) *lo = (int)l;
    if (h > *hi) *hi = (int)h;
}

/* whether the f32 tile computes the float64 rule's bits for a group (a's rows ar [nr, kk], c's cr [nr, np]) over
   b (scanned in w): every nonzero operand a normal float32 with significands of sa + sb <= 24 bits, so every
   product is exact in float32 and at least 2^(frac - 126) (then 2^(frac - E) is a normal float32 and every
   nonzero result at least 2^-126: trunc_out's mask); every accumulator below 2^127 however the chain runs (c
   below 2^126, K products each below 2^(emax_a + emax_b + 2) summing below 2^126), so no float32 overflow;
   frac <= 25 (int32 partial sums of 2^(31 - frac - 2) terms), no fp16 register. Its efloor: the smallest sum of
   the operands' clamped exponents, or 0 where it does not fit */
static int fits_f32(const double *ar, int64_t kk, int64_t K, const double *cr, int64_t np, int64_t N, int64_t nr,
                    const w32_t *w, const model_t *m, int emin_a, int emin_b, int *efloor) {
    if (m->fp16 || m->frac > 25 || w->bsig == 0) return 0;
    int sa = 0, la = 4096, ha = -4096, sc_ = 0, lc = 4096, hc = -4096, lg = 0;
    for (int64_t j = 0; j < nr; j++) scan_f64(ar + j * kk, K, &sa, &la, &ha);
    for (int64_t j = 0; j < nr; j++) scan_f64(cr + j * np, N, &sc_, &lc, &hc);
    while ((INT64_C(1) << lg) < K) lg++;
    if (sa == 0 || sa + w->bsig > 24 || la < -126 || w->bmin < -126 || la + w->bmin < m->frac - 126) return 0;
    if (ha + w->bmax + 2 + lg > 125 || hc > 125) return 0;
    *efloor = (la > emin_a ? la : emin_a) + (w->bmin > emin_b ? w->bmin : emin_b);
    return 1;
}

/* the group through the f32 tile where fits_f32: 1 (cr updated), 0 (not taken: the float64 tile runs), -1 (out of
   memory). bm [K, ldb] is batch bt's b matrix (np columns, the padding zeros) */
static int try_w32(const void *arv, const int16_t *ea, int64_t kk, const void *bmv, int64_t ldb, const int16_t *eb,
                   int64_t np, int64_t N, int64_t K, void *crv, int64_t nr, int64_t kc, const model_t *m, w32_t *w,
                   int64_t bt, int emin_a, int emin_b) {
    const double *ar = arv, *bm = bmv;
    double *cr = crv;
    if (w->scanned != bt) {
        w->bsig = 0;
        w->bmin = 4096;
        w->bmax = -4096;
        for (int64_t k = 0; k < K; k++) scan_f64(bm + k * ldb, N, &w->bsig, &w->bmin, &w->bmax);
        w->scanned = bt;
    }
    int efloor = 0;
    if (!fits_f32(ar, kk, K, cr, np, N, nr, w, m, emin_a, emin_b, &efloor)) return 0;
    if (!w->b && !(w->b = malloc(sizeof(float) * kk * np))) return -1;
    if (!w->a && !(w->a = malloc(sizeof(float) * kk * RG))) return -1;
    if (!w->c && !(w->c = malloc(sizeof(float) * np * RG))) return -1;
    if (w->have != bt) {
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < np; n++) w->b[k * np + n] = (float)bm[k * ldb + n];
        w->have = bt;
    }
    for (int64_t i = 0; i < nr * kk; i++) w->a[i] = (float)ar[i];
    for (int64_t i = 0; i < nr * np; i++) w->c[i] = (float)cr[i];
    model_t m32 = *m;
    m32.efloor = efloor;
    /* terms are integers below 2^(frac + 2); c's term joins them only on the int32 route (i32: frac <= 13) */
    m32.sub = (int)((INT64_C(1) << 31) >> (m->frac + 2));
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t k1 = k0 + kc < K ? k0 + kc : K;
        for (int64_t j = 0; j < nr; j++)
            row_f32w(w->a + j * kk, ea + j * kk, w->b, np, eb, np, w->c + j * np, k0, k1, &m32);
    }
    for (int64_t i = 0; i < nr * np; i++) cr[i] = (double)w->c[i];
    return 1;
}

/* fc_mma_chain_f32's hook in place of try_w32: never taken */
static int no_w32(const void *arv, const void *ea, int64_t kk, const void *bmv, int64_t ldb, const void *eb, int64_t np,
                  int64_t N, int64_t K, void *crv, int64_t nr, int64_t kc, const model_t *m, w32_t *w, int64_t bt,
                  int emin_a, int emin_b) {
    (void)arv;
    (void)ea;
    (void)kk;
    (void)bmv;
    (void)ldb;
    (void)eb;
    (void)np;
    (void)N;
    (void)K;
    (void)crv;
    (void)nr;
    (void)kc;
    (void)m;
    (void)w;
    (void)bt;
    (void)emin_a;
    (void)emin_b;
    return 0;
}

#define CHUNK (24 << 10) /* bytes of b and its exponents per chunk of k (held in L1 while the group's rows use it) */

/* rows r0..r1 (of Bt M) of acc [Bt, M, N] continued over a [Bt, M, K] and b [Bt, K, N], each given by its three
   strides (in elements). b's matrix is used in place where its rows are contiguous and N a whole number of
   vectors, else copied with N padded by zero columns (their outputs are dropped); the rows of a and acc are
   copied into buffers, RG at a time, and each group runs the chain a chunk of whole blocks of k at a time (the
   order of each output's blocks is unchanged). 0, or -1 when out of memory */
#define CHAIN(NAME, T, ET, EXPS, ROW, HOOK, INPLACE)                                                                   \
    int NAME(const T *a, int64_t a0, int64_t a1, int64_t a2, const T *b, int64_t b0, int64_t b1, int64_t b2, T *acc,   \
             int64_t c0, int64_t c1, int64_t c2, int64_t r0, int64_t r1, int64_t M, int64_t N, int64_t K, int emin_a,  \
             int emin_b, int nf, int frac, int frac_out, int min_exp, int late_c, int fp16, int sub) {                 \
        const model_t m = {nf, frac, frac_out, min_exp, late_c, fp16, sub, -28};                                       \
        const int64_t np = (N + 15) / 16 * 16, kk = K > 0 ? K : 1;                                                     \
        const int direct = b2 == 1 && np == N;                                                                         \
        int64_t kc = CHUNK / (np * (int64_t)(sizeof(T) + sizeof(ET))) / nf * nf;                                       \
        if (kc < nf) kc = nf;                                                                                          \
        T *ar = malloc(sizeof(T) * kk * RG), *cr = calloc(np * RG, sizeof(T));                                         \
        T *bs = direct ? NULL : calloc((size_t)(kk * np), sizeof(T));                                                  \
        /* eb + 64: whole vectors; zeroed, so the lanes a tile reads past np (computed, never used) hold exponents */  \
        /* whose sums stay in range (garbage there overflowed the int8 / int16 lanes: UBSan) */                        \
        ET *ea = malloc(sizeof(ET) * kk * RG), *eb = calloc(1, sizeof(ET) * kk * np + 64);                             \
        int64_t have = -1, rc = 0, ldb = np;                                                                           \
        w32_t w = {NULL, NULL, NULL, -1, -1, 0, 0, 0};                                                                 \
        const T *bm = bs;                                                                                              \
        if (!ar || !cr || (!direct && !bs) || !ea || !eb) rc = -1;                                                     \
        for (int64_t g0 = r0; g0 < r1 && !rc;) {                                                                       \
            const int64_t bt = g0 / M;                                                                                 \
            int64_t g1 = (bt + 1) * M < r1 ? (bt + 1) * M : r1;                                                        \
            if (g1 > g0 + RG) g1 = g0 + RG;                                                                            \
            if (bt != have) {                                                                                          \
                if (direct) {                                                                                          \
                    bm = b + bt * b0;                                                                                  \
                    ldb = b1;                                                                                          \
                    for (int64_t k = 0; k < K; k++) EXPS(bm + k * b1, eb + k * np, N, emin_b);                         \
                } else {                                                                                               \
                    for (int64_t k = 0; k < K; k++)                                                                    \
                        for (int64_t n = 0; n < N; n++) bs[k * np + n] = b[bt * b0 + k * b1 + n * b2];                 \
                    EXPS(bs, eb, K * np, emin_b);                                                                      \
                }                                                                                                      \
                have = bt;                                                                                             \
            }                                                                                                          \
            /* INPLACE: a's rows where contiguous, acc's where contiguous and N a whole number of vectors */           \
            const int ain = INPLACE && a2 == 1, cin = INPLACE && c2 == 1 && np == N;                                   \
            const T *ag = ain ? a + bt * a0 + g0 % M * a1 : ar;                                                        \
            T *cg = cin ? acc + bt * c0 + g0 % M * c1 : cr;                                                            \
            const int64_t lda = ain ? a1 : kk, ldc = cin ? c1 : np;                                                    \
            for (int64_t r = g0; r < g1; r++) {                                                                        \
                const int64_t i = r % M, j = r - g0;                                                                   \
                if (ain) {                                                                                             \
                } else if (a2 == 1)                                                                                    \
                    memcpy(ar + j * kk, a + bt * a0 + i * a1, sizeof(T) * K);                                          \
                else                                                                                                   \
                    for (int64_t k = 0; k < K; k++) ar[j * kk + k] = a[bt * a0 + i * a1 + k * a2];                     \
                EXPS(ag + j * lda, ea + j * kk, K, emin_a);                                                            \
                if (cin) {                                                                                             \
                } else if (c2 == 1)                                                                                    \
                    memcpy(cr + j * np, acc + bt * c0 + i * c1, sizeof(T) * N);                                        \
                else                                                                                                   \
                    for (int64_t n = 0; n < N; n++) cr[j * np + n] = acc[bt * c0 + i * c1 + n * c2];                   \
            }                                                                                                          \
            const int took = HOOK(ar, ea, kk, bm, ldb, eb, np, N, K, cr, g1 - g0, kc, &m, &w, bt, emin_a, emin_b);     \
            if (took < 0) {                                                                                            \
                rc = -1;                                                                                               \
                break;                                                                                                 \
            }                                                                                                          \
            for (int64_t k0 = 0; k0 < K && !took; k0 += kc) {                                                          \
                const int64_t k1 = k0 + kc < K ? k0 + kc : K;                                                          \
                for (int64_t j = 0; j < g1 - g0; j++)                                                                  \
                    ROW(ag + j * lda, ea + j * kk, bm, ldb, eb, np, cg + j * ldc, k0, k1, &m);                         \
            }                                                                                                          \
            for (int64_t r = g0; r < g1 && !cin; r++) {                                                                \
                const int64_t i = r % M, j = r - g0;                                                                   \
                if (c2 == 1)                                                                                           \
                    memcpy(acc + bt * c0 + i * c1, cr + j * np, sizeof(T) * N);                                        \
                else                                                                                                   \
                    for (int64_t n = 0; n < N; n++) acc[bt * c0 + i * c1 + n * c2] = cr[j * np + n];                   \
            }                                                                                                          \
            g0 = g1;                                                                                                   \
        }                                                                                                              \
        free(ar);                                                                                                      \
        free(bs);                                                                                                      \
        free(cr);                                                                                                      \
        free(ea);                                                                                                      \
        free(eb);                                                                                                      \
        free(w.a);                                                                                                     \
        free(w.b);                                                                                                     \
        free(w.c);                                                                                                     \
        return (int)rc;                                                                                                \
    }

CHAIN(fc_mma_chain_f32, float, int8_t, exps_f32, row_f32, no_w32, 1)
CHAIN(fc_mma_chain_f64, double, int16_t, exps_f64, row_f64, try_w32, 0)
