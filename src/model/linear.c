#include "model/linear.h"

#include <cblas.h>

void gj_linear_forward(float *y, const float *x, const float *W, const float *b, int64_t N,
                       int64_t Din, int64_t Dout, int accumulate) {
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
      for (int64_t o = 0; o < Dout; o++) y[i * Dout + o] = (accumulate ? y[i * Dout + o] : 0.0f) + b[o];
    accumulate = 1;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)Dout, (int)Din, 1.0f, x, (int)Din,
              W, (int)Din, accumulate ? 1.0f : 0.0f, y, (int)Dout);
}

void gj_linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x,
                        const float *W, const float *ones, int64_t N, int64_t Din, int64_t Dout,
                        int accumulate_dx) {
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)Din, (int)Dout, 1.0f, dy,
                (int)Dout, W, (int)Din, accumulate_dx ? 1.0f : 0.0f, dx, (int)Din);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Dout, (int)Din, (int)N, 1.0f, dy, (int)Dout,
              x, (int)Din, 1.0f, dW, (int)Din);
  if (db) cblas_sgemv(CblasRowMajor, CblasTrans, (int)N, (int)Dout, 1.0f, dy, (int)Dout, ones, 1, 1.0f, db, 1);
}

void gj_linear_backward_input(float *dx, const float *dy, const float *W, int64_t N, int64_t Din,
                              int64_t Dout, int accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)Din, (int)Dout, 1.0f, dy,
              (int)Dout, W, (int)Din, accumulate ? 1.0f : 0.0f, dx, (int)Din);
}
