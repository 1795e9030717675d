/* P rounded to bf16 / fp16 in place in one pass, and the FA2 step's max-subtract (kernels/native/rounding.py
   says why each is torch's bits). */
#include "rounding.h"

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
int fc_round_fp16(float *x, int64_t n) {
    (void)x;
    (void)n;
    return -1;
}
int fc_has_fp16(void) { return 0; }
#endif
