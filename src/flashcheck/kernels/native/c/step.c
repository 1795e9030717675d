/* The FA2 forward step's element-wise work in one pass per row block, and a tile's whole forward
   (kernels/native/step.py says how each matches torch's bits). */
#include "step.h"

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
    if (w == 16)
        row_sum(x, nv, 16, part);
    else
        row_sum(x, nv, 8, part);
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
    (void)x;
    (void)n;
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
void fc_softmax_step(float *s, int64_t rows, int64_t n, const float *m, const float *l, float *m_new, float *l_new,
                     float *alpha, int w, int p_fmt, void *vexp_ptr, int64_t mode, void *local_ptr) {
    vexp_fn vexp = (vexp_fn)vexp_ptr;
    /* MKL's threads for this thread's calls: 1 (the caller runs single-threaded; a tile worker's VML call would
       otherwise start MKL's own team beside the other workers). Restored at the end. */
    int (*set_local)(int) = (int (*)(int))local_ptr;
    int prev = set_local ? set_local(1) : 0;
    int64_t group = 8192 / n; /* rows per exp call: about 32 KiB of scores, still in cache */
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
            if (p_fmt == 1)
                round_bf16(row, n);
            else if (p_fmt == 2)
                round_fp16(row, n);
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
void fc_acc_update(float *o, int64_t bh, int64_t rows, int64_t dv, int64_t ob, const float *alpha, const float *pv) {
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

/* The user mask's bias added to a step's scores sh [nr, n] (tile rows i0.., key columns c0..), as
   kernels.sim.masks.tile_bias and flash._tile_scores add it with torch's ops: per entry the mask's bias b (kind 1,
   bool as bytes: 0 where kept, -inf where not; kind 2: its float32 value), plus, where the block has a causally
   masked entry (cmask), the causal bias first (c + b, c = 0 where key j <= last + r, else -inf: torch's sum of
   the two biases), then s + b, rounded as torch's add_. mst: the mask's element strides (batch, head, row, column;
   0 where it broadcasts), `mask` at the tile's first row. */
static void add_mask(float *sh, int64_t nr, int64_t n, const void *mask, int kind, const int64_t *mst, int64_t b,
                     int64_t hh, int64_t i0, int64_t c0, int cmask, int64_t last) {
    const int64_t base = b * mst[0] + hh * mst[1] + c0 * mst[3], sc = mst[3];
    const float ninf = -__builtin_inff();
    for (int64_t r = 0; r < nr; r++) {
        float *row = sh + r * n;
        const int64_t at = base + (i0 + r) * mst[2];
        const int64_t lr = last + r; /* the last column row r sees (causal) */
        if (kind == 1) {
            const uint8_t *mr = (const uint8_t *)mask + at;
            for (int64_t j = 0; j < n; j++) {
                float bias = mr[j * sc] ? 0.0f : ninf;
                if (cmask) bias = (j <= lr ? 0.0f : ninf) + bias;
                row[j] = row[j] + bias;
            }
        } else {
            const float *mr = (const float *)mask + at;
            for (int64_t j = 0; j < n; j++) {
                float bias = mr[j * sc];
                if (cmask) bias = (j <= lr ? 0.0f : ninf) + bias;
                row[j] = row[j] + bias;
            }
        }
    }
}

/* A whole query tile of the FA2 forward (plain or causal), head by head, each head's rows through every key block
   in the given order (a row's steps in the same order as the step-by-step loop; the head's scores, P, P.V and O stay
   in cache). Step t covers key columns c0..c1 and the tile's rows i0..rows (steps[3 t ..]: c0, c1, i0), as
   kernels.sim.flash._query_tile runs it with torch's ops: S = Q_i K_j^T (torch's own MKL sgemm, on the very pointers
   and leading dimensions bmm hands it: head h's S and P.V blocks at the offsets of a [heads, rows - i0, n] block),
   times sc unless sc is 1 (one float rounding), plus the causal bias where the step's block has a masked entry
   (causal: tile row r sees key j iff j <= row0 + r + off; every entry then gets + 0 or -inf, as torch's add_ of
   the bias), or, with a user mask (mask_kind 1: bool bytes, 2: float32; strides mst, see add_mask), that mask's
   bias on every block (and the causal one summed into it first where the block has a masked entry), the softmax
   of fc_softmax_step, PV = P V_j, then O = O * alpha + PV (fc_acc_update). q [heads,
   rows, d] (rows contiguous, head h at q + h * qsh); head h = (b, g) (b = h / hn) reads K / V head g / groups:
   k + b * ksb + (g / groups) * ksh (rows of kr / vr floats apart, columns contiguous); o [heads, rows, dv], m, l
   [heads * rows] contiguous (O = 0, m = -inf, l = 0 at the start); s: rows * (widest span) + 16 floats, pv:
   rows * dv + 16 floats (both 64-byte aligned), tmp: 2 * rows floats. */
void fc_tile_forward(const float *q, const float *k, const float *v, int64_t heads, int64_t hn, int64_t groups,
                     int64_t qsh, int64_t ksb, int64_t ksh, int64_t kr, int64_t vsb, int64_t vsh, int64_t vr,
                     int64_t rows, int64_t d, int64_t dv, const int64_t *steps, int64_t nsteps, float sc, int causal,
                     int64_t row0, int64_t off, const void *mask, int mask_kind, const int64_t *mst, float *o, float *m,
                     float *l, float *s, float *pv, float *tmp, int w, int p_fmt, void *vexp_ptr, int64_t mode,
                     void *local_ptr, void *sgemm_ptr) {
    sgemm_fn sgemm = (sgemm_fn)sgemm_ptr;
    int (*set_local)(int) = (int (*)(int))local_ptr;
    int prev = set_local ? set_local(1) : 0;
    const float one = 1.0f, zero = 0.0f;
    const int id = (int)d, idv = (int)dv, ikr = (int)kr, ivr = (int)vr;
    float *l_new = tmp, *alpha = tmp + rows;
    for (int64_t h = 0; h < heads; h++) {
        const int64_t kvh = (h % hn) / groups, b = h / hn;
        const float *qh = q + h * qsh;
        const float *kh = k + b * ksb + kvh * ksh, *vh = v + b * vsb + kvh * vsh;
        float *oh = o + h * rows * dv, *mh = m + h * rows, *lh = l + h * rows;
        for (int64_t t = 0; t < nsteps; t++) {
            const int64_t c0 = steps[3 * t], n = steps[3 * t + 1] - c0, i0 = steps[3 * t + 2], nr = rows - i0;
            const int in = (int)n, inr = (int)nr;
            /* bmm's head h blocks sit at h * nr * n and h * nr * dv floats: here at the same offsets modulo 16
               floats (64 bytes, the allocators' alignment), in one block reused by every head (it stays in cache) */
            float *sh = s + ((h * nr * n) & 15), *pvh = pv + ((h * nr * dv) & 15);
            sgemm("T", "N", &in, &inr, &id, &one, kh + c0 * kr, &ikr, qh + i0 * d, &id, &zero, sh, &in);
            if (sc != 1.0f)
                for (int64_t x = 0; x < nr * n; x++) sh[x] = sh[x] * sc;
            const int cmask = causal && c0 + n - 1 > row0 + i0 + off; /* the block has a causally masked entry */
            if (mask_kind)
                add_mask(sh, nr, n, mask, mask_kind, mst, b, h % hn, i0, c0, cmask, row0 + i0 + off - c0);
            else if (cmask) /* the causal bias is added */
                for (int64_t r = 0; r < nr; r++) {
                    float *row = sh + r * n;
                    const int64_t last = row0 + i0 + r + off - c0; /* the last column row r sees */
                    for (int64_t j = 0; j < n; j++) row[j] = j <= last ? row[j] + 0.0f : -__builtin_inff();
                }
            fc_softmax_step(sh, nr, n, mh + i0, lh + i0, mh + i0, l_new, alpha, w, p_fmt, vexp_ptr, mode, 0);
            memcpy(lh + i0, l_new, sizeof(float) * (size_t)nr);
            sgemm("N", "N", &idv, &inr, &in, &one, vh + c0 * vr, &ivr, sh, &in, &zero, pvh, &idv);
            fc_acc_update(oh + i0 * dv, 1, nr, dv, nr * dv, alpha, pvh);
        }
    }
    if (set_local) set_local(prev);
}
