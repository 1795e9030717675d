/* kernels/native/fp8.py's library: FP8 / integer input quantisation, |x| maxima, the Hadamard rotation.
   Index spaces are [n0, n1, n2, n3, n4] with strides in elements. The ctypes signatures are read from these
   prototypes (cbuild.signatures). */
#ifndef FC_FP8_H
#define FC_FP8_H
#include <stdint.h>

void fc_fp8_scaled(const double *x, const int64_t *xs, const double *s, const int64_t *ss, double *out,
                   const int64_t *n, int mbits, int emin, double maxv, int mul);
void fc_fp8_scaled_df(const double *x, const int64_t *xs, const double *s, const int64_t *ss, float *out,
                      const int64_t *n, int mbits, int emin, double maxv, int mul);
void fc_fp8_scaled_ff(const float *x, const int64_t *xs, const double *s, const int64_t *ss, float *out,
                      const int64_t *n, int mbits, int emin, double maxv, int mul);
void fc_absmax_f64(const double *x, const int64_t *xs, const int64_t *n, double *out);
void fc_absmax_f32(const float *x, const int64_t *xs, const int64_t *n, float *out);
void fc_absmaxc_f64(const double *x, const int64_t *xs, const int64_t *n, double *out);
void fc_absmaxc_f32(const float *x, const int64_t *xs, const int64_t *n, float *out);
void fc_int_scaled(const double *x, const int64_t *xs, const float *s, const int64_t *ss, double *out, const int64_t *n,
                   float qmax);
int fc_fp8_split(const double *x, const int64_t *xs, const double *s, const int64_t *ss, float *codes, const int64_t *n,
                 int mbits, int emin, double maxv, double tol);
int fc_fp8_split_f32(const float *x, const int64_t *xs, const double *s, const int64_t *ss, float *codes,
                     const int64_t *n, int mbits, int emin, double maxv, double tol);
int fc_hadamard_rows(const float *x, int64_t rows, int64_t d, int ld, const double *signs, double post, double *out);

#endif
