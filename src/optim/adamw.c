#include "optim/adamw.h"

#include <math.h>

#include "common.h"

void gj_adamw_defaults(gj_adamw_hp *hp) {
  hp->lr = 6e-4, hp->beta1 = 0.9, hp->beta2 = 0.999, hp->eps = 1e-8;
  hp->weight_decay = 0.1, hp->grad_clip = 1.0;
}

/* The part [a, b) of tensor t that falls in the flat range [lo, hi); returns 0 if empty. */
static int clip_range(const gj_tensor *t, size_t lo, size_t hi, size_t *a, size_t *b) {
  *a = GJ_MAX(t->offset, lo);
  *b = GJ_MIN(t->offset + t->numel, hi);
  return *a < *b;
}

/* The sum of squares of x[0..n) in double, in 16 independent partial sums: vectorised, where
 * one running sum would wait on each addition's latency (a quarter of the optimizer's time at
 * gptj-125m), and in a fixed order. */
#define GJ_SUMSQ_LANES 16
static double sumsq(const float *x, size_t n) {
  double acc[GJ_SUMSQ_LANES] = {0};
  size_t i = 0;
  for (; i + GJ_SUMSQ_LANES <= n; i += GJ_SUMSQ_LANES) {
#pragma omp simd
    for (int j = 0; j < GJ_SUMSQ_LANES; j++) acc[j] += (double)x[i + j] * x[i + j];
  }
  double s = 0;
  for (; i < n; i++) s += (double)x[i] * x[i];
  for (int j = 0; j < GJ_SUMSQ_LANES; j++) s += acc[j];
  return s;
}

GJ_HOT
double gj_grad_sumsq(const gj_layout *l, const float *grads, int tp_rank, size_t lo, size_t n) {
  const size_t chunk = 1 << 16;
  double total = 0;
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *t = &l->t[i];
    size_t a, b;
    if ((t->shard == GJ_SHARD_NONE && tp_rank != 0) || !clip_range(t, lo, lo + n, &a, &b)) continue;
    const float *g = grads + (a - lo);
    const size_t m = b - a, nc = (m + chunk - 1) / chunk;
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t c = 0; c < nc; c++) s += sumsq(g + c * chunk, GJ_MIN(chunk, m - c * chunk));
    total += s;
  }
  return total;
}

double gj_clip_coef(double norm, double clip) {
  if (clip <= 0) return 1.0;
  double c = clip / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

GJ_HOT
void gj_adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float decay, float bc1, float bc2_sqrt,
                     float clip_coef) {
  /* p = p (1 - lr wd); p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps) */
  const float step = lr / bc1, keep = 1.0f - lr * decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * clip_coef;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi, v[i] = vi;
    p[i] = p[i] * keep - step * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

void gj_adamw_update(const gj_layout *l, float *p, const float *g, float *m, float *v,
                     size_t lo, size_t n, const gj_adamw_hp *hp, int64_t t, double lr,
                     double clip_coef) {
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2s = (float)sqrt(1.0 - pow(hp->beta2, (double)t));
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *ti = &l->t[i];
    size_t a, b;
    if (!clip_range(ti, lo, lo + n, &a, &b)) continue;
    gj_adamw_kernel(p + a, g + (a - lo), m + (a - lo), v + (a - lo), b - a, (float)lr, (float)hp->beta1,
                    (float)hp->beta2, (float)hp->eps, ti->decay ? (float)hp->weight_decay : 0.0f,
                    bc1, bc2s, (float)clip_coef);
  }
}
