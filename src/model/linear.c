#include "model/linear.h"

#include "common.h"

void gj_linear_forward(float *y, const float *x, const gj_bf16 *x16, const float *W,
                       const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout,
                       int accumulate) {
  gj_gemm_bias(0, 1, N, Dout, Din, x, x16, Din, W, W16, Din, b, accumulate ? 1.0f : 0.0f, y, Dout);
}

void gj_linear_forward16(gj_bf16 *y16, const float *x, const gj_bf16 *x16, const float *W,
                         const gj_bf16 *W16, const float *b, int64_t N, int64_t Din, int64_t Dout) {
  gj_gemm_bias16(0, 1, N, Dout, Din, x, x16, Din, W, W16, Din, b, y16, Dout);
}

/* db [Dout] += sum over rows of dy [N, Dout], by column blocks so that each thread reads its
 * columns of every row once. */
GJ_HOT
static void bias_grad(float *db, const float *dy, int64_t N, int64_t Dout) {
  enum { CB = 256 };
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < Dout; o0 += CB) {
    int64_t n = Dout - o0 < CB ? Dout - o0 : CB;
    float acc[CB] = {0};
    for (int64_t i = 0; i < N; i++) {
      const float *r = dy + i * Dout + o0;
#pragma omp simd
      for (int64_t o = 0; o < n; o++) acc[o] += r[o];
    }
    for (int64_t o = 0; o < n; o++) db[o0 + o] += acc[o];
  }
}

void gj_linear_backward(float *dx, float *dW, float *db, const float *dy, const gj_bf16 *dy16,
                        const float *x, const gj_bf16 *x16, const float *W, const gj_bf16 *W16,
                        int64_t N, int64_t Din, int64_t Dout, int accumulate_dx) {
  if (dx) gj_linear_backward_input(dx, dy, dy16, W, W16, N, Din, Dout, accumulate_dx);
  gj_gemm(1, 0, Dout, Din, N, 1.0f, dy, dy16, Dout, x, x16, Din, 1.0f, dW, Din);
  if (db) bias_grad(db, dy, N, Dout);
}

void gj_linear_backward_input(float *dx, const float *dy, const gj_bf16 *dy16, const float *W,
                              const gj_bf16 *W16, int64_t N, int64_t Din, int64_t Dout,
                              int accumulate) {
  gj_gemm(0, 0, N, Din, Dout, 1.0f, dy, dy16, Dout, W, W16, Din, accumulate ? 1.0f : 0.0f, dx, Din);
}
