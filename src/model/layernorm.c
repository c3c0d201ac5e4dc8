#include "model/layernorm.h"

#include <math.h>

#include "common.h"

GJ_HOT
void gj_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t N, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *xi = x + i * D;
    /* Two passes in double: the mean, then the centred variance (no cancellation); each sum
     * in vector lanes (a dependent chain of double additions took most of this kernel) */
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < D; j++) s += xi[j];
    double m = s / D, v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < D; j++) v += (xi[j] - m) * (xi[j] - m);
    float r = (float)(1.0 / sqrt(v / D + eps));
    float mf = (float)m;
    float *yi = y + i * D;
    for (int64_t j = 0; j < D; j++) yi[j] = (xi[j] - mf) * r * w[j] + b[j];
    mean[i] = mf;
    rstd[i] = r;
  }
}

GJ_HOT
void gj_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int64_t N,
                           int64_t D) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *xi = x + i * D, *dyi = dy + i * D;
    float m = mean[i], r = rstd[i];
    double a = 0, bsum = 0; /* mean(dxhat), mean(dxhat * xhat) */
#pragma omp simd reduction(+ : a, bsum)
    for (int64_t j = 0; j < D; j++) {
      float g = dyi[j] * w[j];
      a += g;
      bsum += g * (xi[j] - m) * r;
    }
    float ma = (float)(a / D), mb = (float)(bsum / D);
    float *dxi = dx + i * D;
    for (int64_t j = 0; j < D; j++) {
      float xh = (xi[j] - m) * r;
      dxi[j] += r * (dyi[j] * w[j] - ma - xh * mb);
    }
  }
  /* Parameter gradients: parallel over column blocks, each thread walks all rows. */
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < D; c0 += 16) {
    int64_t c1 = c0 + 16 < D ? c0 + 16 : D;
    double sw[16] = {0}, sb[16] = {0};
    for (int64_t i = 0; i < N; i++) {
      const float *xi = x + i * D, *dyi = dy + i * D;
      for (int64_t c = c0; c < c1; c++) {
        sw[c - c0] += dyi[c] * (xi[c] - mean[i]) * rstd[i];
        sb[c - c0] += dyi[c];
      }
    }
    for (int64_t c = c0; c < c1; c++) dw[c] += (float)sw[c - c0], db[c] += (float)sb[c - c0];
  }
}
