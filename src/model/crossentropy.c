#include "model/crossentropy.h"

#include <math.h>
#include <string.h>

void gj_ce_rowmax(float *mx, const float *logits, int64_t N, int64_t Vl) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *l = logits + i * Vl;
    float m = -INFINITY;
    for (int64_t j = 0; j < Vl; j++) m = l[j] > m ? l[j] : m;
    mx[i] = m;
  }
}

void gj_ce_stats(float *stats, const float *logits, const float *mx, const int32_t *targets,
                 int64_t N, int64_t Vl, int64_t v0) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *l = logits + i * Vl;
    double s = 0;
    for (int64_t j = 0; j < Vl; j++) s += expf(l[j] - mx[i]);
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
    for (int64_t j = 0; j < Vl; j++) d[j] = f * expf(d[j] - z);
    int64_t t = (int64_t)targets[i] - v0;
    if (t >= 0 && t < Vl) d[t] -= scale;
  }
}
