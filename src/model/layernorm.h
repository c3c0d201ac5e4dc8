/* LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, biased var. */
#ifndef GJ_MODEL_LAYERNORM_H
#define GJ_MODEL_LAYERNORM_H
#include <stdint.h>

#include "model/gemm.h"

/* y [N, D] (or NULL) and/or its bf16 copy y16 [N, D] (or NULL: the same values rounded as
 * gj_bf16_round rounds, in the same pass); mean, rstd [N] saved for backward; x [N, D];
 * w, b [D]. */
void gj_layernorm_forward(float *y, gj_bf16 *y16, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int64_t N, int64_t D, float eps);
/* dx [N, D] += d/dx; dw, db [D] += (their column sums over the rows in a fixed order, the same
 * at any thread count: model/colsum.h). dy [N, D]; x [N, D]; mean, rstd [N]; w [D]. */
void gj_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int64_t N,
                           int64_t D);
#endif
