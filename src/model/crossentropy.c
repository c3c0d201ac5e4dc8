#include "model/crossentropy.h"

#include "common.h"
#include "model/fastmath.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* Columns of a row handled at once: read from memory once, then again from L1. */
enum { CE_BLOCK = 512 };

GJ_HOT
void gj_ce_stats(float *mx, float *stats, const float *logits, const int32_t *targets, int64_t N,
                 int64_t Vl, int64_t v0) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float *l = logits + i * Vl;
    /* online: a block's max first, then its exps against the running max; the partial sums
     * (16 float lanes: terms in (0, 1]) are rescaled when the max grows */
    float part[16] = {0}, m = -INFINITY;
    for (int64_t j0 = 0; j0 < Vl; j0 += CE_BLOCK) {
      const int64_t n = Vl - j0 < CE_BLOCK ? Vl - j0 : CE_BLOCK;
      const float *b = l + j0;
      const float bm = gj_row_max(b, n);
      if (!(bm <= m)) { /* bm > m, or a NaN max: the sums NaN, no exp of a positive argument */
        float f = m == -INFINITY ? 0.0f : gj_expf(m - bm);
        for (int k = 0; k < 16; k++) part[k] *= f;
        m = bm;
      }
      if (m == -INFINITY) { /* all -inf so far: nothing to add (exp(-inf - -inf) is NaN) ... */
        for (int64_t j = 0; j < n && m == -INFINITY; j++)
          if (isnan(b[j])) m = NAN; /* ... unless a NaN, which the max passes over: the sum NaN */
        if (m == -INFINITY) continue;
      }
      int64_t j = 0;
      for (; j + 16 <= n; j += 16)
#pragma omp simd
        for (int k = 0; k < 16; k++) part[k] += gj_expf(b[j + k] - m);
      for (; j < n; j++) part[0] += gj_expf(b[j] - m);
    }
    double s = 0;
    for (int k = 0; k < 16; k++) s += part[k];
    mx[i] = m;
    stats[i] = (float)s;
    int64_t t = (int64_t)targets[i] - v0;
    stats[N + i] = (targets[i] >= 0 && t >= 0 && t < Vl) ? l[t] : 0.0f;
  }
}

void gj_ce_rescale(float *stats, const float *mx, const float *gmx, int64_t N) {
  for (int64_t i = 0; i < N; i++)
    stats[i] = mx[i] == -INFINITY ? 0.0f : stats[i] * gj_expf(mx[i] - gmx[i]);
}

double gj_ce_loss(float *lse, const float *mx, const float *stats, const int32_t *targets,
                  int64_t N, float zloss, int64_t *n_valid, double *z_sum) {
  double loss = 0, zs = 0;
  int64_t nv = 0;
  for (int64_t i = 0; i < N; i++) {
    double z = (double)mx[i] + log((double)stats[i]);
    lse[i] = (float)z;
    if (targets[i] < 0) continue;
    const double zt = zloss * z * z;
    loss += z - stats[N + i] + zt, zs += zt;
    nv++;
  }
  *n_valid = nv;
  if (z_sum) *z_sum = zs;
  return loss;
}

size_t gj_ce_backward_scratch(int nthreads, int64_t Vl) { return (size_t)nthreads * (size_t)Vl; }

GJ_HOT
void gj_ce_backward(float *dlogits, gj_bf16 *d16, float *dbias, float *acc, const float *logits,
                    const float *lse, const int32_t *targets, int64_t N, int64_t Vl, int64_t v0,
                    float scale, float zloss) {
#pragma omp parallel
  {
    float *a = dbias ? acc + (size_t)omp_get_thread_num() * Vl : NULL;
    if (a) memset(a, 0, Vl * sizeof(float));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; i++) {
      const float *l = logits + i * Vl;
      const int valid = targets[i] >= 0;
      const float z = lse[i], f = scale * (1.0f + 2.0f * zloss * z);
      const int64_t t = (int64_t)targets[i] - v0;
      float d[CE_BLOCK];
      for (int64_t j0 = 0; j0 < Vl; j0 += CE_BLOCK) {
        const int64_t n = Vl - j0 < CE_BLOCK ? Vl - j0 : CE_BLOCK;
        if (valid) {
#pragma omp simd
          for (int64_t j = 0; j < n; j++) d[j] = f * gj_expf(l[j0 + j] - z);
          if (t >= j0 && t < j0 + n) d[t - j0] -= scale;
        } else {
          memset(d, 0, n * sizeof(float)); /* whatever the row's logits hold */
        }
        if (dlogits) memcpy(dlogits + i * Vl + j0, d, n * sizeof(float));
        if (d16) gj_bf16_round(d16 + i * Vl + j0, d, (size_t)n);
        if (a)
#pragma omp simd
          for (int64_t j = 0; j < n; j++) a[j0 + j] += d[j];
      }
    }
    if (dbias) {
      /* column ranges: each thread sums its columns over the threads' accumulators */
#pragma omp for schedule(static)
      for (int64_t j = 0; j < Vl; j++) {
        float s = 0;
        for (int th = 0; th < omp_get_num_threads(); th++) s += acc[(size_t)th * Vl + j];
        dbias[j] += s;
      }
    }
  }
}
