/* kernels/native/backward.py's library: the FA2 backward's element-wise passes, each one pass per block.
   The ctypes signatures are read from these prototypes (cbuild.signatures). */
#ifndef FC_BWD_H
#define FC_BWD_H
#include <stdint.h>

int fc_bwd_has_fp16(void);
void fc_bwd_probs(float *s, float *pr, int64_t heads, int64_t rows, int64_t n, float sc, const float *lse,
                  int64_t lse_h, int causal, int64_t row0, int64_t c0, int64_t off, const void *mask, int mask_kind,
                  const int64_t *mst, int64_t hn, int64_t hbase, int p_fmt, void *vexp_ptr, int64_t mode,
                  void *local_ptr);
void fc_bwd_ds(float *dp, const float *p, int64_t heads, int64_t rows, int64_t n, const float *delta, int64_t delta_h,
               int p_fmt);
void fc_bwd_scale_add(float *dst, int64_t heads, int64_t rows, int64_t d, int64_t dst_h, const float *x, float s,
                      int add);

#endif
