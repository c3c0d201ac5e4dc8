/* gelu_new (tanh approximation): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#ifndef GJ_MODEL_GELU_H
#define GJ_MODEL_GELU_H
#include <stddef.h>

#include "model/gemm.h"

/* y [n] = gelu(x [n]) */
void gj_gelu_forward(float *y, const float *x, size_t n);
/* dx [rows, cols] = dy * gelu'(x) (overwrites; dx may alias dy); with db, also db [cols] +=
 * the column sums of dx (the bias gradient of the layer before, in a fixed order:
 * model/colsum.h), in the same pass. */
void gj_gelu_backward(float *dx, float *db, const float *dy, const float *x, int64_t rows,
                      int64_t cols);
/* bf16 training, where the fc_in output is kept in bfloat16 only: y16 [n] = bf16(gelu(x16 [n]))
 * (the operand of fc_out, forward and weight gradient) ... */
void gj_gelu_forward16(gj_bf16 *y16, const gj_bf16 *x16, size_t n);
/* ... and d = dy [rows, cols] * gelu'(x16) in one pass: its bf16 copy dx16 (fc_in's products),
 * the float dx (unless NULL; dx may alias dy) and, with db, db [cols] += its column sums
 * (fc_in's bias gradient, as gj_gelu_backward's). */
void gj_gelu_backward16(float *dx, gj_bf16 *dx16, float *db, const float *dy, const gj_bf16 *x16,
                        int64_t rows, int64_t cols);
#endif
