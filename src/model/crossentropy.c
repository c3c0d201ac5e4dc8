#include "model/crossentropy.h"

#include "model/fastmath.h"

#include <math.h>
#include <string.h>

void gj_ce_rowmax(float *mx, const float *logits, int64_t N, int64_t Vl) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *l = logits + i * Vl;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < Vl; j++) m = gj_maxf(m, l[j]);
    mx[i] = m;
  }
}

void gj_ce_stats(float *stats, const float *logits, const float *mx, const int32_t *targets,
                 int64_t N, int64_t Vl, int64_t v0) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *l = logits + i * Vl;
    /* float partial sums in 16 lanes: vectorised, and accurate enough (terms are in (0, 1]) */
    float part[16] = {0};
    float m = mx[i];
    int64_t j = 0;
    for (; j + 16 <= Vl; j += 16)
#pragma omp simd
      for (int k = 0; k < 16; k++) part[k] += gj_expf(l[j + k] - m);
    double s = 0;
    for (; j < Vl; j++) s += gj_expf(l[j] - m);
    for (int k = 0; k < 16; k++) s += part[k];
    stats[i] = (float)s;
    int64_t t = (int64_t)targets[i] - v0;
    stats[N + i] = (targets[i] >= 0 && t >= 0 && t < Vl) ? l[t] : 0.0f;
  }
}

double gj_ce_loss(float *lse, const float *mx, const float *stats, const int32_t *targets,
                  int64_t N, float zloss, int64_t *n_valid) {
  double loss = 0;
  int64_t nv = 0;
  for (int64_t i = 0; i < N; i++) {
    double z = (double)mx[i] + log((double)stats[i]);
    lse[i] = (float)z;
    if (targets[i] < 0) continue;
    loss += z - stats[N + i] + zloss * z * z;
    nv++;
  }
  *n_valid = nv;
  return loss;
}

void gj_ce_backward(float *dlogits, const float *lse, const int32_t *targets, int64_t N,
                    int64_t Vl, int64_t v0, float scale, float zloss) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    float *d = dlogits + i * Vl;
    if (targets[i] < 0) {
      memset(d, 0, Vl * sizeof(float));
      continue;
    }
    float z = lse[i], f = scale * (1.0f + 2.0f * zloss * z);
#pragma omp simd
    for (int64_t j = 0; j < Vl; j++) d[j] = f * gj_expf(d[j] - z);
    int64_t t = (int64_t)targets[i] - v0;
    if (t >= 0 && t < Vl) d[t] -= scale;
  }
}
