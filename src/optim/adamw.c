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

/* sumsq() over x[0..n) of the embedding's dense gradient (x the tensor's element x0), read
 * from its rows: the same lanes in the same order, and the absent rows' zeros, which add
 * nothing, skipped. */
static double rows_sumsq(const gj_rowgrad *r, size_t x0, size_t n) {
  const size_t D = (size_t)r->D, body = n / GJ_SUMSQ_LANES * GJ_SUMSQ_LANES;
  double acc[GJ_SUMSQ_LANES] = {0}, s = 0;
  for (size_t row = x0 / D; row * D < x0 + n; row++) {
    if (r->slot[row] < 0) continue;
    const float *g = gj_rowgrad_row(r, (int64_t)row);
    size_t a = GJ_MAX(row * D, x0), b = GJ_MIN(row * D + D, x0 + body);
    for (size_t x = a; x < b; x++) acc[(x - x0) % GJ_SUMSQ_LANES] += (double)g[x - row * D] * g[x - row * D];
  }
  for (size_t x = x0 + body; x < x0 + n; x++) {
    float v = gj_rowgrad_row(r, (int64_t)(x / D))[x % D];
    s += (double)v * v;
  }
  for (int j = 0; j < GJ_SUMSQ_LANES; j++) s += acc[j];
  return s;
}

GJ_HOT
double gj_grad_sumsq(const gj_layout *l, const float *grads, const gj_rowgrad *rows, int tp_rank,
                     size_t lo, size_t n) {
  const size_t chunk = 1 << 16;
  double total = 0;
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *t = &l->t[i];
    size_t a, b;
    if ((t->shard == GJ_SHARD_NONE && tp_rank != 0) || !clip_range(t, lo, lo + n, &a, &b)) continue;
    const gj_rowgrad *r = i == 0 ? rows : NULL;
    const float *g = grads + (a - lo);
    const size_t m = b - a, nc = (m + chunk - 1) / chunk;
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t c = 0; c < nc; c++) {
      size_t k = GJ_MIN(chunk, m - c * chunk);
      s += r ? rows_sumsq(r, a - t->offset + c * chunk, k) : sumsq(g + c * chunk, k);
    }
    total += s;
  }
  return total;
}

int gj_grad_huge(const gj_layout *l, const float *grads, const gj_rowgrad *rows, size_t lo, size_t n,
                 double sumsq) {
  const float big = (float)GJ_GRAD_MAX; /* the bound as the elements compare with it */
  if (!(sumsq >= (double)big * big)) return 0; /* the usual case (and NaN: not huge) */
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *t = &l->t[i];
    size_t a, b;
    if (!clip_range(t, lo, lo + n, &a, &b)) continue;
    for (size_t x = a; x < b; x++) {
      float v = i == 0 && rows ? gj_rowgrad_row(rows, (int64_t)((x - t->offset) / (size_t)rows->D))[(x - t->offset) % (size_t)rows->D]
                               : grads[x - lo];
      if (fabsf(v) >= big) return 1;
    }
  }
  return 0;
}

double gj_clip_coef(double norm, double clip) {
  if (clip <= 0) return 1.0;
  double c = clip / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/* The moments' coefficients as torch.optim.AdamW has them: beta and 1 - beta each rounded to
 * float from double (1 - (float)0.999 would be 1.3e-5 off 0.001). */
typedef struct { float b1, ob1, b2, ob2; } betas;
static betas betas_of(double beta1, double beta2) {
  return (betas){(float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2)};
}

/* AdamW on n elements: p = p (1 - lr wd); p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps) */
static inline void adamw_span(float *p, const float *g, float *m, float *v, size_t n, float lr,
                              betas b, float eps, float decay, float bc1, float bc2_sqrt,
                              float clip_coef) {
  const float step = lr / bc1, keep = 1.0f - lr * decay;
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * clip_coef;
    float mi = b.b1 * m[i] + b.ob1 * gi;
    float vi = b.b2 * v[i] + b.ob2 * gi * gi;
    m[i] = mi, v[i] = vi;
    p[i] = p[i] * keep - step * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

#define GJ_ADAMW_SPAN 4096
GJ_HOT
void gj_adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     double beta1, double beta2, float eps, float decay, float bc1, float bc2_sqrt,
                     float clip_coef) {
  const size_t ns = (n + GJ_ADAMW_SPAN - 1) / GJ_ADAMW_SPAN;
  const betas b = betas_of(beta1, beta2);
#pragma omp parallel for schedule(static)
  for (size_t s = 0; s < ns; s++) {
    size_t i = s * GJ_ADAMW_SPAN, k = GJ_MIN((size_t)GJ_ADAMW_SPAN, n - i);
    adamw_span(p + i, g + i, m + i, v + i, k, lr, b, eps, decay, bc1, bc2_sqrt, clip_coef);
  }
}

/* The same over the embedding's elements [a, b) (the tensor's own indices), the gradients read
 * from its rows; p, m, v point at element a. */
GJ_HOT
static void adamw_rows(const gj_rowgrad *r, size_t a, size_t b, float *p, float *m, float *v,
                       float lr, double beta1, double beta2, float eps, float decay, float bc1,
                       float bc2_sqrt, float clip_coef) {
  const size_t D = (size_t)r->D, r0 = a / D, r1 = (b + D - 1) / D;
  const betas bs = betas_of(beta1, beta2);
#pragma omp parallel for schedule(static)
  for (size_t row = r0; row < r1; row++) {
    size_t x = GJ_MAX(row * D, a), y = GJ_MIN(row * D + D, b);
    adamw_span(p + (x - a), gj_rowgrad_row(r, (int64_t)row) + (x - row * D), m + (x - a), v + (x - a),
               y - x, lr, bs, eps, decay, bc1, bc2_sqrt, clip_coef);
  }
}

void gj_adamw_update(const gj_layout *l, float *p, const float *g, const gj_rowgrad *rows,
                     float *m, float *v, size_t lo, size_t n, const gj_adamw_hp *hp, int64_t t,
                     double lr, double clip_coef) {
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2s = (float)sqrt(1.0 - pow(hp->beta2, (double)t));
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *ti = &l->t[i];
    size_t a, b;
    if (!clip_range(ti, lo, lo + n, &a, &b)) continue;
    float decay = ti->decay ? (float)hp->weight_decay : 0.0f;
    if (i == 0 && rows)
      adamw_rows(rows, a - ti->offset, b - ti->offset, p + a, m + (a - lo), v + (a - lo), (float)lr,
                 hp->beta1, hp->beta2, (float)hp->eps, decay, bc1, bc2s, (float)clip_coef);
    else
      gj_adamw_kernel(p + a, g + (a - lo), m + (a - lo), v + (a - lo), b - a, (float)lr, hp->beta1,
                      hp->beta2, (float)hp->eps, decay, bc1, bc2s, (float)clip_coef);
  }
}
