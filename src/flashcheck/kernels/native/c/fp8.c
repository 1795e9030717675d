/* Input quantisation in single passes: FP8 x / scale rounded, integer quantisation, |x| maxima, the
   Hadamard rotation (kernels/native/fp8.py says how each matches the torch steps). */
#include "round.h"
#include "fp8.h"

/* out[i] = fp8_round(x[i dx] / s[i ds]) (* s when mul) for i < n, in double (x's values exact in it), stored
   as TO (a float out: the double result's rounding, as torch's .to); the contiguous cases apart, so they
   vectorise. Over a [n0, n1, n2, n3, n4] index space, x and s by their strides (in elements), out contiguous. */
#define SCALED(NAME, TI, TO)                                                                                           \
    static void row_##NAME(const TI *x, int64_t dx, const double *s, int64_t ds, TO *out, int64_t n, int mbits,        \
                           int emin, double maxv, int mul) {                                                           \
        if (dx == 1 && ds == 0) {                                                                                      \
            const double sc = s[0];                                                                                    \
            if (mul)                                                                                                   \
                for (int64_t i = 0; i < n; i++) out[i] = (TO)(fp8_round((double)x[i] / sc, mbits, emin, maxv) * sc);   \
            else                                                                                                       \
                for (int64_t i = 0; i < n; i++) out[i] = (TO)fp8_round((double)x[i] / sc, mbits, emin, maxv);          \
        } else if (dx == 1 && ds == 1) {                                                                               \
            if (mul)                                                                                                   \
                for (int64_t i = 0; i < n; i++)                                                                        \
                    out[i] = (TO)(fp8_round((double)x[i] / s[i], mbits, emin, maxv) * s[i]);                           \
            else                                                                                                       \
                for (int64_t i = 0; i < n; i++) out[i] = (TO)fp8_round((double)x[i] / s[i], mbits, emin, maxv);        \
        } else {                                                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                const double sc = s[i * ds], r = fp8_round((double)x[i * dx] / sc, mbits, emin, maxv);                 \
                out[i] = (TO)(mul ? r * sc : r);                                                                       \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
                                                                                                                       \
    void NAME(const TI *x, const int64_t *xs, const double *s, const int64_t *ss, TO *out, const int64_t *n,           \
              int mbits, int emin, double maxv, int mul) {                                                             \
        int64_t o = 0;                                                                                                 \
        for (int64_t i0 = 0; i0 < n[0]; i0++)                                                                          \
            for (int64_t i1 = 0; i1 < n[1]; i1++)                                                                      \
                for (int64_t i2 = 0; i2 < n[2]; i2++)                                                                  \
                    for (int64_t i3 = 0; i3 < n[3]; i3++, o += n[4]) {                                                 \
                        const TI *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];                          \
                        const double *sr = s + i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3];                      \
                        row_##NAME(xr, xs[4], sr, ss[4], out + o, n[4], mbits, emin, maxv, mul);                       \
                    }                                                                                                  \
    }
SCALED(fc_fp8_scaled, double, double)
SCALED(fc_fp8_scaled_df, double, float)
SCALED(fc_fp8_scaled_ff, float, float)

/* out[i0, i1, i2, i3] = max |x[i0, i1, i2, i3, :]| (NaN when any is NaN), the last dim contiguous */
#define ABSMAX(NAME, T)                                                                                                \
    void NAME(const T *x, const int64_t *xs, const int64_t *n, T *out) {                                               \
        int64_t o = 0;                                                                                                 \
        for (int64_t i0 = 0; i0 < n[0]; i0++)                                                                          \
            for (int64_t i1 = 0; i1 < n[1]; i1++)                                                                      \
                for (int64_t i2 = 0; i2 < n[2]; i2++)                                                                  \
                    for (int64_t i3 = 0; i3 < n[3]; i3++, o++) {                                                       \
                        const T *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];                           \
                        T m = 0, bad = 0;                                                                              \
                        for (int64_t i = 0; i < n[4]; i++) {                                                           \
                            const T a = xr[i] < 0 ? -xr[i] : xr[i];                                                    \
                            m = a > m ? a : m;                                                                         \
                            bad += a != a ? 1 : 0;                                                                     \
                        }                                                                                              \
                        out[o] = bad ? (T)NAN : m;                                                                     \
                    }                                                                                                  \
    }
ABSMAX(fc_absmax_f64, double)
ABSMAX(fc_absmax_f32, float)

/* out[i0, i1, i2, :] = max over i3 of |x[i0, i1, i2, i3, :]| (NaN where any is NaN), the last dim contiguous:
   the columns' maximum, the rows read in order (vectorised over the columns) */
#define ABSMAXC(NAME, T)                                                                                               \
    void NAME(const T *x, const int64_t *xs, const int64_t *n, T *out) {                                               \
        const int64_t d = n[4];                                                                                        \
        int64_t o = 0;                                                                                                 \
        for (int64_t i0 = 0; i0 < n[0]; i0++)                                                                          \
            for (int64_t i1 = 0; i1 < n[1]; i1++)                                                                      \
                for (int64_t i2 = 0; i2 < n[2]; i2++, o += d) {                                                        \
                    T *m = out + o;                                                                                    \
                    int64_t bad = 0;                                                                                   \
                    for (int64_t j = 0; j < d; j++) m[j] = 0;                                                          \
                    for (int64_t i3 = 0; i3 < n[3]; i3++) {                                                            \
                        const T *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];                           \
                        for (int64_t j = 0; j < d; j++) {                                                              \
                            const T a = xr[j] < 0 ? -xr[j] : xr[j];                                                    \
                            m[j] = a > m[j] ? a : m[j];                                                                \
                            bad += a != a ? 1 : 0;                                                                     \
                        }                                                                                              \
                    }                                                                                                  \
                    if (bad)                                                                                           \
                        for (int64_t i3 = 0; i3 < n[3]; i3++) {                                                        \
                            const T *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];                       \
                            for (int64_t j = 0; j < d; j++)                                                            \
                                if (xr[j] != xr[j]) m[j] = (T)NAN;                                                     \
                        }                                                                                              \
                }                                                                                                      \
    }
ABSMAXC(fc_absmaxc_f64, double)
ABSMAXC(fc_absmaxc_f32, float)

/* core.quant.quantize_int's last steps in one pass, in float32 as it computes them: y = (float)x / s,
   q = trunc(y + 0.5 sign(y)) clamped to +-qmax (NaN stays), out = (double)(q s); sign as torch's (+-0 -> +0) */
void fc_int_scaled(const double *x, const int64_t *xs, const float *s, const int64_t *ss, double *out, const int64_t *n,
                   float qmax) {
    int64_t o = 0;
    for (int64_t i0 = 0; i0 < n[0]; i0++)
        for (int64_t i1 = 0; i1 < n[1]; i1++)
            for (int64_t i2 = 0; i2 < n[2]; i2++)
                for (int64_t i3 = 0; i3 < n[3]; i3++) {
                    const double *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];
                    const float *sr = s + i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3];
                    const int64_t dx = xs[4], ds = ss[4];
                    for (int64_t i4 = 0; i4 < n[4]; i4++, o++) {
                        const float sc = sr[i4 * ds], y = (float)xr[i4 * dx] / sc;
                        const float sg = (float)((0.0f < y) - (y < 0.0f));
                        float q = truncf(y + 0.5f * sg);
                        q = q < -qmax ? -qmax : (q > qmax ? qmax : q);
                        out[o] = (double)(q * sc);
                    }
                }
}

/* kernels.sim.mma_ops.split's exact case in one pass: codes = fp8_round(x / s) as float32 (exact), and 1 when every
   |codes s - x| <= |x| tol (the same float64 operations as split's torch steps on x in float64), else 0 (codes
   then unused); x float64 or float32 (each value exact in float64) */
#define SPLIT(NAME, T)                                                                                                 \
    static int row_##NAME(const T *x, int64_t dx, const double *s, int64_t ds, float *codes, int64_t n, int mbits,     \
                          int emin, double maxv, double tol) {                                                         \
        int bad = 0;                                                                                                   \
        if (dx == 1 && (ds == 0 || ds == 1)) {                                                                         \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                const double sc = s[i * ds], xv = (double)x[i], r = fp8_round(xv / sc, mbits, emin, maxv);             \
                bad |= !(fabs(r * sc - xv) <= fabs(xv) * tol);                                                         \
                codes[i] = (float)r;                                                                                   \
            }                                                                                                          \
        } else {                                                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                const double sc = s[i * ds], xv = (double)x[i * dx], r = fp8_round(xv / sc, mbits, emin, maxv);        \
                bad |= !(fabs(r * sc - xv) <= fabs(xv) * tol);                                                         \
                codes[i] = (float)r;                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
        return bad;                                                                                                    \
    }                                                                                                                  \
                                                                                                                       \
    int fc_fp8_##NAME(const T *x, const int64_t *xs, const double *s, const int64_t *ss, float *codes,                 \
                      const int64_t *n, int mbits, int emin, double maxv, double tol) {                                \
        int64_t o = 0;                                                                                                 \
        int bad = 0;                                                                                                   \
        for (int64_t i0 = 0; i0 < n[0]; i0++)                                                                          \
            for (int64_t i1 = 0; i1 < n[1]; i1++)                                                                      \
                for (int64_t i2 = 0; i2 < n[2]; i2++)                                                                  \
                    for (int64_t i3 = 0; i3 < n[3]; i3++, o += n[4]) {                                                 \
                        const T *xr = x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3];                           \
                        const double *sr = s + i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3];                      \
                        bad |= row_##NAME(xr, xs[4], sr, ss[4], codes + o, n[4], mbits, emin, maxv, tol);              \
                    }                                                                                                  \
        return !bad;                                                                                                   \
    }
SPLIT(split, double)
SPLIT(split_f32, float)

/* kernels.sim.fp8's Hadamard rotation x @ M of float32 rows x [rows, d] (d a power of two, 2^ld), M = diag(signs) H
   post (H Sylvester's, post a power of two), into float64 out [rows, d], by butterflies: 1 when every row's sum
   is exact in float64 in any order (each product x_i m_ij is exact; the terms are multiples of 2^(lsb - k) below
   2^(emax + 1 + ld - k) in sum, so with emax + 1 + ld - lsb <= 53 no partial sum rounds: a BLAS's x @ M gives
   the same bits, whatever its order; a zero result is +0 there too, as some term is not 0), else 0 (a row of
   zeros, an Inf or NaN, or too wide a range of exponents; out then partly written). */
int fc_hadamard_rows(const float *x, int64_t rows, int64_t d, int ld, const double *signs, double post, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        double *o = out + r * d;
        int emax = -1000, lmin = 1000, any = 0, bad = 0;
        for (int64_t i = 0; i < d; i++) {
            uint32_t u;
            memcpy(&u, xr + i, 4);
            const int e = (int)((u >> 23) & 0xff), m = (int)(u & 0x7fffff);
            bad |= e == 255;
            if (e || m) {
                const int ex = e ? e - 127 : -126, lsb = e ? ex - 23 : -149;
                any = 1;
                emax = ex > emax ? ex : emax;
                lmin = lsb < lmin ? lsb : lmin;
            }
            o[i] = (double)xr[i] * signs[i];
        }
        if (bad || !any || emax + 1 + ld - lmin > 53) return 0;
        for (int64_t h = 1; h < d; h *= 2)
            for (int64_t i = 0; i < d; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const double a = o[j], b = o[j + h];
                    o[j] = a + b;
                    o[j + h] = a - b;
                }
        for (int64_t i = 0; i < d; i++) o[i] *= post;
    }
    return 1;
}
