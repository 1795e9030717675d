/* kernels/native/presets.py's library: the quantised presets' per-step passes (P in FP8 / FP4, NVFP4 and
   SageAttention3 blocks, FA4's ex2 columns, descaling and rescaling of the accumulator). Strided index spaces
   are [n0, n1, n2, n3] with strides in elements. The ctypes signatures are read from these prototypes
   (cbuild.signatures). */
#ifndef FC_PRESETS_H
#define FC_PRESETS_H
#include <stdint.h>

int fc_p_fp8(const float *p, float *out, int64_t n, float ps, int scale, int mbits, int emin, double maxv);
int fc_sage3_p(const float *p, float *out, int64_t rows, int64_t w, float ps);
int fc_fp4x16(const float *x, void *out, int64_t na, int64_t n, int64_t nc, int f32);
int fc_nvfp4(const float *x, float *values, float *scaled, int64_t na, int64_t n, int64_t nc, float s_enc, int floor_);
int fc_e2m1s_f32(const float *x, int64_t rows, int64_t cols, int64_t rs);
int fc_e2m1s_f64(const double *x, int64_t rows, int64_t cols, int64_t rs, float *out);
int fc_ex2_cols(const float *x, float *out, int64_t rows, int64_t w, const int64_t *idx, int64_t ni, const double *poly,
                int np);
void fc_descale(const float *acc, const int64_t *as, const double *qs, const int64_t *qss, const double *ks,
                const int64_t *kss, double factor, float *out, const int64_t *os, const int64_t *n);
void fc_units(const float *x, const int64_t *xs, const double *u, const int64_t *us, float *out, const int64_t *os,
              const int64_t *n, int mode);
void fc_rescale(float *o, const int64_t *os, const float *al, const int64_t *als, const float *x, const int64_t *xs,
                const double *u, const int64_t *us, const int64_t *n, int mode);
void fc_pv_start(const float *o, const int64_t *os, const float *al, const int64_t *als, const double *u,
                 const int64_t *us, float *out, const int64_t *outs, const int64_t *n);

#endif
