/* Linear layer in PyTorch layout: y = x W^T + b, W [Dout, Din]. All products via cblas_sgemm. */
#ifndef GJ_MODEL_LINEAR_H
#define GJ_MODEL_LINEAR_H
#include <stdint.h>

/* y [N, Dout] = x [N, Din] W[Dout, Din]^T (+ b [Dout] if b) (+ y if accumulate). */
void gj_linear_forward(float *y, const float *x, const float *W, const float *b, int64_t N,
                       int64_t Din, int64_t Dout, int accumulate);
/* dx [N, Din] = dy W (+= if accumulate_dx; skipped if dx is NULL); dW [Dout, Din] += dy^T x;
 * db [Dout] += column sums of dy (if db). ones [N] is a vector of 1s. */
void gj_linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x,
                        const float *W, const float *ones, int64_t N, int64_t Din, int64_t Dout,
                        int accumulate_dx);
/* dx [N, Din] = dy [N, Dout] W [Dout, Din] (+= if accumulate). */
void gj_linear_backward_input(float *dx, const float *dy, const float *W, int64_t N, int64_t Din,
                              int64_t Dout, int accumulate);
#endif
