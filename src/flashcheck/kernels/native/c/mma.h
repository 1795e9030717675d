/* kernels/native/mma.py's library: kernels.tensorcore.mma's block-FMA chain over rows r0..r1 of acc [Bt, M, N],
   a [Bt, M, K] and b [Bt, K, N] each given by three strides (in elements); f32: narrow values in float32,
   f64: any values in float64. 0, or -1 when out of memory. The ctypes signatures are read from these
   prototypes (cbuild.signatures). */
#ifndef FC_MMA_H
#define FC_MMA_H
#include <stdint.h>

int fc_mma_chain_f32(const float *a, int64_t a0, int64_t a1, int64_t a2, const float *b, int64_t b0, int64_t b1,
                     int64_t b2, float *acc, int64_t c0, int64_t c1, int64_t c2, int64_t r0, int64_t r1, int64_t M,
                     int64_t N, int64_t K, int emin_a, int emin_b, int nf, int frac, int frac_out, int min_exp,
                     int late_c, int fp16, int sub);
int fc_mma_chain_f64(const double *a, int64_t a0, int64_t a1, int64_t a2, const double *b, int64_t b0, int64_t b1,
                     int64_t b2, double *acc, int64_t c0, int64_t c1, int64_t c2, int64_t r0, int64_t r1, int64_t M,
                     int64_t N, int64_t K, int emin_a, int emin_b, int nf, int frac, int frac_out, int min_exp,
                     int late_c, int fp16, int sub);

#endif
