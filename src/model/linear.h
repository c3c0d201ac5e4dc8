/* Linear layer in PyTorch layout: y = x W^T + b, W [Dout, Din]. The products go through the
 * GEMM door (model/gemm.h). In bf16 precision each float operand may come with its bfloat16
 * copy (x16, dy16, W16, same layout); a NULL copy is rounded by the door. In float32 the
 * copies are ignored (pass NULL). */
#ifndef GJ_MODEL_LINEAR_H
#define GJ_MODEL_LINEAR_H

#include <stdint.h>

#include "model/gemm.h"

/* y [N, Dout] = x [N, Din] W[Dout, Din]^T (+ b [Dout] if b) (+ y if accumulate). */
void gj_linear_forward(float *y, const float *x, const gj_bf16 *x16, const float *W,
                       const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout,
                       int accumulate);
/* y16 [N, Dout] = x W^T (+ b) rounded to bfloat16, the float y never written (bf16 precision:
 * an output read only through its bf16 copy). */
void gj_linear_forward16(gj_bf16 *y16, const float *x, const gj_bf16 *x16, const float *W,
                         const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout);
/* dx [N, Din] = dy W (+= if accumulate_dx; skipped if dx is NULL); dW [Dout, Din] += dy^T x;
 * db [Dout] += column sums of dy (if db; as gj_bias_grad). */
void gj_linear_backward(float *dx, float *dW, float *db, const float *dy, const gj_bf16 *dy16,
                        const float *x, const gj_bf16 *x16, const float *W, const gj_bf16 *W16,
                        int64_t N, int64_t Din, int64_t Dout, int accumulate_dx);
/* db [Dout] += the column sums of dy [N, Dout] (in a fixed order: model/colsum.h); with dy16,
 * also dy16 = dy rounded to bfloat16 (as gj_bf16_round rounds), in the same pass. */
void gj_bias_grad(float *db, gj_bf16 *dy16, const float *dy, int64_t N, int64_t Dout);
/* dx [N, Din] = dy [N, Dout] W [Dout, Din] (+= if accumulate). */
void gj_linear_backward_input(float *dx, const float *dy, const gj_bf16 *dy16, const float *W,
                              const gj_bf16 *W16, int64_t N, int64_t Din, int64_t Dout,
                              int accumulate);

#endif
