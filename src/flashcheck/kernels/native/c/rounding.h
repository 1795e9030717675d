/* kernels/native/rounding.py's library: P rounded to bf16 / fp16 in place, the FA2 step's max-subtract, a
   rounded copy and |x| statistics. The ctypes signatures are read from these prototypes (cbuild.signatures). */
#ifndef FC_ROUNDING_H
#define FC_ROUNDING_H
#include <stdint.h>

int fc_round_bf16(float *x, int64_t n);
int fc_round_fp16(float *x, int64_t n);
int fc_has_fp16(void);
int fc_round_bf16_copy(const float *src, float *dst, int64_t n);
void fc_max_sub(float *s, int64_t rows, int64_t n, const float *m_old, float *m_new, float *ms);
int fc_abs_stats(const float *x, int64_t n, float *out);

#endif
