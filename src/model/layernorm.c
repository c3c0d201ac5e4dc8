#include "model/layernorm.h"

#include <math.h>

#include "common.h"
#include "model/colsum.h"

enum { LN_CHUNK = 1024 }; /* columns rounded at once into the bf16 output */

GJ_HOT
void gj_layernorm_forward(float *y, gj_bf16 *y16, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int64_t N, int64_t D, float eps) {
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
    if (y) {
      float *yi = y + i * D;
      for (int64_t j = 0; j < D; j++) yi[j] = (xi[j] - mf) * r * w[j] + b[j];
    }
    if (y16) { /* the same values, rounded a chunk at a time while it is in L1 */
      float buf[LN_CHUNK];
      for (int64_t j0 = 0; j0 < D; j0 += LN_CHUNK) {
        const int64_t n = D - j0 < LN_CHUNK ? D - j0 : LN_CHUNK;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) buf[j] = (xi[j0 + j] - mf) * r * w[j0 + j] + b[j0 + j];
        gj_bf16_round(y16 + i * D + j0, buf, (size_t)n);
      }
    }
    mean[i] = mf;
    rstd[i] = r;
  }
}

GJ_HOT
void gj_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int64_t N,
                           int64_t D) {
  if (N <= 0) return;
  /* one pass over the rows: d x, and the parameter gradients' column sums of the rows while
   * they are in L1 (partials [d w | d b] per row group) */
  gj_colsum cs;
  gj_colsum_begin(&cs, N, 2 * D);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < cs.groups; g++) {
    int64_t i0, i1;
    double *sw = gj_colsum_group(&cs, g, &i0, &i1), *sb = sw + D;
    for (int64_t i = i0; i < i1; i++) {
      const float *xi = x + i * D, *dyi = dy + i * D;
      float m = mean[i], r = rstd[i];
      double a = 0, bsum = 0; /* mean(dxhat), mean(dxhat * xhat) */
#pragma omp simd reduction(+ : a, bsum)
      for (int64_t j = 0; j < D; j++) {
        float gj = dyi[j] * w[j];
        a += gj;
        bsum += gj * (xi[j] - m) * r;
      }
      float ma = (float)(a / D), mb = (float)(bsum / D);
      float *dxi = dx + i * D;
#pragma omp simd
      for (int64_t j = 0; j < D; j++) {
        float xh = (xi[j] - m) * r;
        dxi[j] += r * (dyi[j] * w[j] - ma - xh * mb);
        sw[j] += (double)(dyi[j] * xh);
        sb[j] += (double)dyi[j];
      }
    }
  }
  gj_colsum_finish(&cs, dw, 0, D);
  gj_colsum_finish(&cs, db, D, D);
}
