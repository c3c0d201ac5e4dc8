/* LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, biased var. */
#ifndef GJ_MODEL_LAYERNORM_H
#define GJ_MODEL_LAYERNORM_H
#include <stdint.h>

/* y [N, D]; mean, rstd [N] saved for backward; x [N, D]; w, b [D]. */
void gj_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t N, int64_t D, float eps);
/* dx [N, D] += d/dx; dw, db [D] +=. dy [N, D]; x [N, D]; mean, rstd [N]; w [D]. */
void gj_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int64_t N,
                           int64_t D);
#endif
