/* kernels/native/step.py's library: the FA2 forward step's element-wise work, and a whole tile's forward.
   The ctypes signatures are read from these prototypes (cbuild.signatures). */
#ifndef FC_STEP_H
#define FC_STEP_H
#include <stdint.h>

int fc_has_fp16(void);
void fc_softmax_step(float *s, int64_t rows, int64_t n, const float *m, const float *l, float *m_new, float *l_new,
                     float *alpha, int w, int p_fmt, void *vexp_ptr, int64_t mode, void *local_ptr);
void fc_acc_update(float *o, int64_t bh, int64_t rows, int64_t dv, int64_t ob, const float *alpha, const float *pv);
void fc_tile_forward(const float *q, const float *k, const float *v, int64_t heads, int64_t hn, int64_t groups,
                     int64_t qsh, int64_t ksb, int64_t ksh, int64_t kr, int64_t vsb, int64_t vsh, int64_t vr,
                     int64_t rows, int64_t d, int64_t dv, const int64_t *steps, int64_t nsteps, float sc, int causal,
                     int64_t row0, int64_t off, const void *mask, int mask_kind, const int64_t *mst, float *o, float *m,
                     float *l, float *s, float *pv, float *tmp, int w, int p_fmt, void *vexp_ptr, int64_t mode,
                     void *local_ptr, void *sgemm_ptr);

#endif
