/* The FA2 backward's element-wise passes (kernels/native/backward.py says how each matches torch's bits). */
#include "bwd.h"

#include <stdint.h>
#include <string.h>

typedef void (*vexp_fn)(const int64_t *n, const float *a, float *r, const int64_t *mode);

static inline float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* x rounded to p_fmt (0: float32, kept; 1: bf16; 2: fp16), to nearest even; x is never NaN (the caller's rule) */
static inline float round_p(float x, int p_fmt) {
    if (p_fmt == 1) return round_bf16(x);
#ifdef __FLT16_MAX__
    if (p_fmt == 2) return (float)(_Float16)x;
#endif
    return x;
}

int fc_bwd_has_fp16(void) {
#ifdef __FLT16_MAX__
    return 1;
#else
    return 0;
#endif
}

/* The user mask's bias of entry j of a row (the row's mask entries at mr, mst[3] apart): kind 1, bool bytes: 0
   where kept, else -inf; kind 2: its float32 value. */
static inline float mask_bias(const void *mr, int kind, int64_t j, int64_t step) {
    if (kind == 1) return ((const uint8_t *)mr)[j * step] ? 0.0f : -__builtin_inff();
    return ((const float *)mr)[j * step];
}

/* P of a backward step from the raw scores s [heads, rows, n] (contiguous, in place), as kernels.sim.flash._backward
   forms it with torch's ops: x = s * sc, plus the causal bias where the block (rows row0.., keys c0..) has a masked
   entry (row i sees key j iff j <= i + off: + 0 or -inf for every entry, as torch's add of the bias), or, with a
   user mask (mask_kind 1: bool bytes, 2: float32), x + b, b that mask's bias (mask_bias) with the causal bias summed
   into it first where the block has a masked entry (kernels.sim.masks.tile_bias's sum), minus the row's LSE
   (lse[h * lse_h + r], -inf there already replaced by +inf), then exp (torch's exp: MKL's vmsExp, with `mode`).
   The mask: element (b, g, r, j) of the block at mask + b * mst[0] + g * mst[1] + r * mst[2] + j * mst[3]
   (elements; 0 where it broadcasts), block head h being (b, g) = divmod(hbase + h, hn). pr (NULL: none): P rounded
   to p_fmt, a second [heads, rows, n] block. */
void fc_bwd_probs(float *s, float *pr, int64_t heads, int64_t rows, int64_t n, float sc, const float *lse,
                  int64_t lse_h, int causal, int64_t row0, int64_t c0, int64_t off, const void *mask, int mask_kind,
                  const int64_t *mst, int64_t hn, int64_t hbase, int p_fmt, void *vexp_ptr, int64_t mode,
                  void *local_ptr) {
    vexp_fn vexp = (vexp_fn)vexp_ptr;
    int (*set_local)(int) = (int (*)(int))local_ptr;
    int prev = set_local ? set_local(1) : 0;
    const int masked = causal && c0 + n - 1 > row0 + off;
    int64_t group = 8192 / n; /* rows per exp call: about 32 KiB, still in cache */
    if (group < 1) group = 1;
    for (int64_t h = 0; h < heads; h++) {
        for (int64_t g0 = 0; g0 < rows; g0 += group) {
            const int64_t g1 = g0 + group < rows ? g0 + group : rows;
            for (int64_t r = g0; r < g1; r++) {
                float *row = s + (h * rows + r) * n;
                const float m = lse[h * lse_h + r];
                const int64_t last = row0 + r + off - c0; /* the last column row r sees (causal) */
                if (mask_kind) {
                    const int64_t g = hbase + h, esz = mask_kind == 1 ? 1 : 4;
                    const char *mr = (const char *)mask + esz * ((g / hn) * mst[0] + (g % hn) * mst[1] + r * mst[2]);
                    for (int64_t j = 0; j < n; j++) {
                        const float x = row[j] * sc;
                        float b = mask_bias(mr, mask_kind, j, mst[3]);
                        if (masked) b = (j <= last ? 0.0f : -__builtin_inff()) + b;
                        row[j] = (x + b) - m;
                    }
                } else if (masked) {
                    for (int64_t j = 0; j < n; j++) {
                        const float x = row[j] * sc;
                        row[j] = (j <= last ? x + 0.0f : -__builtin_inff()) - m;
                    }
                } else {
                    for (int64_t j = 0; j < n; j++) row[j] = row[j] * sc - m;
                }
            }
            int64_t cnt = (g1 - g0) * n;
            float *blk = s + (h * rows + g0) * n;
            vexp(&cnt, blk, blk, &mode);
            if (pr) {
                float *out = pr + (h * rows + g0) * n;
                for (int64_t i = 0; i < cnt; i++) out[i] = round_p(blk[i], p_fmt);
            }
        }
    }
    if (set_local) set_local(prev);
}

/* dS = rnd_p(P * (dP - delta)) in place in dp [heads, rows, n] (P alike, both contiguous; delta[h * delta_h + r]
   the row's delta): torch's sub, then mul, then the rounding to p_fmt. */
void fc_bwd_ds(float *dp, const float *p, int64_t heads, int64_t rows, int64_t n, const float *delta, int64_t delta_h,
               int p_fmt) {
    for (int64_t h = 0; h < heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            float *row = dp + (h * rows + r) * n;
            const float *prow = p + (h * rows + r) * n;
            const float dl = delta[h * delta_h + r];
            for (int64_t j = 0; j < n; j++) {
                const float t = row[j] - dl;
                row[j] = round_p(prow[j] * t, p_fmt);
            }
        }
}

/* dst = dst + x * s (add) or x * s, each product and sum rounded to float32 as torch's ops round them: x [heads,
   rows, d] contiguous, head h of dst at dst + h * dst_h (its rows contiguous). */
void fc_bwd_scale_add(float *dst, int64_t heads, int64_t rows, int64_t d, int64_t dst_h, const float *x, float s,
                      int add) {
    for (int64_t h = 0; h < heads; h++) {
        float *o = dst + h * dst_h;
        const float *xi = x + h * rows * d;
        if (add)
            for (int64_t i = 0; i < rows * d; i++) {
                const float t = xi[i] * s;
                o[i] = o[i] + t;
            }
        else
            for (int64_t i = 0; i < rows * d; i++) o[i] = xi[i] * s;
    }
}
