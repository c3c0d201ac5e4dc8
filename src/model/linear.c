#include "model/linear.h"

#include "common.h"
#include "model/colsum.h"

void gj_linear_forward(float *y, const float *x, const gj_bf16 *x16, const float *W,
                       const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout,
                       int accumulate) {
  gj_gemm_bias(0, 1, N, Dout, Din, x, x16, Din, W, W16, Din, b, accumulate ? 1.0f : 0.0f, y, Dout);
}

void gj_linear_forward16(gj_bf16 *y16, const float *x, const gj_bf16 *x16, const float *W,
                         const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout) {
  gj_gemm_bias16(0, 1, N, Dout, Din, x, x16, Din, W, W16, Din, b, y16, Dout);
}

/* db [Dout] += the column sums of dy [N, Dout] (in row groups: model/colsum.h), and dy16 =
 * dy rounded to bfloat16 (if dy16) in the same pass. */
GJ_HOT
void gj_bias_grad(float *db, gj_bf16 *dy16, const float *dy, int64_t N, int64_t Dout) {
  if (N <= 0) return;
  gj_colsum cs;
  gj_colsum_begin(&cs, N, Dout);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < cs.groups; g++) {
    int64_t i0, i1;
    double *s = gj_colsum_group(&cs, g, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
      const float *r = dy + i * Dout;
#pragma omp simd
      for (int64_t o = 0; o < Dout; o++) s[o] += (double)r[o];
      if (dy16) gj_bf16_round(dy16 + i * Dout, r, (size_t)Dout);
    }
  }
  gj_colsum_finish(&cs, db, 0, Dout);
}

void gj_linear_backward(float *dx, float *dW, float *db, const float *dy, const gj_bf16 *dy16,
                        const float *x, const gj_bf16 *x16, const float *W, const gj_bf16 *W16,
                        int64_t N, int64_t Din, int64_t Dout, int accumulate_dx) {
  if (dx) gj_linear_backward_input(dx, dy, dy16, W, W16, N, Din, Dout, accumulate_dx);
  gj_gemm(1, 0, Dout, Din, N, 1.0f, dy, dy16, Dout, x, x16, Din, 1.0f, dW, Din);
  if (db) gj_bias_grad(db, NULL, dy, N, Dout);
}

void gj_linear_backward_input(float *dx, const float *dy, const gj_bf16 *dy16, const float *W,
                              const gj_bf16 *W16, int64_t N, int64_t Din, int64_t Dout,
                              int accumulate) {
  gj_gemm(0, 0, N, Din, Dout, 1.0f, dy, dy16, Dout, W, W16, Din, accumulate ? 1.0f : 0.0f, dx, Din);
}
