/* gelu_new (tanh approximation): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#ifndef GJ_MODEL_GELU_H
#define GJ_MODEL_GELU_H
#include <stddef.h>

#include "model/gemm.h"

/* y [n] = gelu(x [n]) */
void gj_gelu_forward(float *y, const float *x, size_t n);
/* dx [n] = dy [n] * gelu'(x [n]) (overwrites; dx may alias dy) */
void gj_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
/* bf16 training, where the fc_in output is kept in bfloat16 only: y16 [n] = bf16(gelu(x16 [n]))
 * (the operand of fc_out, forward and weight gradient) ... */
void gj_gelu_forward16(gj_bf16 *y16, const gj_bf16 *x16, size_t n);
/* ... and dx [n] = dy [n] * gelu'(x16 [n]) with its bf16 copy dx16 (for fc_in's products; dx
 * for its bias gradient), in one pass; dx may alias dy */
void gj_gelu_backward16(float *dx, gj_bf16 *dx16, const float *dy, const gj_bf16 *x16, size_t n);
#endif
