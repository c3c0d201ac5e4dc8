/* GCC's jump threading splits gj_expf's clamps into paths (the clamped one is a constant) that
 * the vectoriser turns back into masked operations: gj_tanhf's division ran twice per vector.
 * Without it the GELU kernels take a quarter less time (model/fastmath.h). */
#pragma GCC optimize("no-thread-jumps")
#include "model/gelu.h"

#include <math.h>
#include <string.h>

#include "common.h"
#include "model/colsum.h"
#include "model/fastmath.h"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

GJ_HOT
void gj_gelu_forward(float *y, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + gj_tanhf(GELU_C * (v + 0.044715f * v * v * v)));
  }
}

static inline __attribute__((always_inline)) float gelu_grad(float v) {
  float t = gj_tanhf(GELU_C * (v + 0.044715f * v * v * v));
  float dt = GELU_C * (1.0f + 3.0f * 0.044715f * v * v) * (1.0f - t * t);
  return 0.5f * (1.0f + t) + 0.5f * v * dt;
}

GJ_HOT
void gj_gelu_backward(float *dx, float *db, const float *dy, const float *x, int64_t rows,
                      int64_t cols) {
  const int64_t n = rows * cols;
  if (!db) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad(x[i]);
    return;
  }
  if (rows <= 0) return;
  gj_colsum cs; /* the bias gradient: column sums of each row of dx as it is written */
  gj_colsum_begin(&cs, rows, cols);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < cs.groups; g++) {
    int64_t i0, i1;
    double *s = gj_colsum_group(&cs, g, &i0, &i1);
    for (int64_t i = i0 * cols; i < i1 * cols; i += cols)
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) {
        float d = dy[i + j] * gelu_grad(x[i + j]);
        dx[i + j] = d;
        s[j] += (double)d;
      }
  }
  gj_colsum_finish(&cs, db, 0, cols);
}

/* The bf16 kernels work in chunks of GELU_CHUNK elements, each rounded by gj_bf16_round from a
 * float buffer on the stack (so they round exactly as the GEMM door does). */
#define GELU_CHUNK 1024

GJ_HOT
void gj_gelu_forward16(gj_bf16 *y16, const gj_bf16 *x16, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += GELU_CHUNK) {
    float buf[GELU_CHUNK];
    size_t m = n - c < GELU_CHUNK ? n - c : GELU_CHUNK;
#pragma omp simd
    for (size_t i = 0; i < m; i++) {
      float v = gj_bf16_to_f32(x16[c + i]);
      buf[i] = 0.5f * v * (1.0f + gj_tanhf(GELU_C * (v + 0.044715f * v * v * v)));
    }
    gj_bf16_round(y16 + c, buf, m);
  }
}

GJ_HOT
void gj_gelu_backward16(float *dx, gj_bf16 *dx16, float *db, const float *dy, const gj_bf16 *x16,
                        int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t n = rows * cols;
  if (!db) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += GELU_CHUNK) {
      float buf[GELU_CHUNK];
      const int64_t m = n - c < GELU_CHUNK ? n - c : GELU_CHUNK;
#pragma omp simd
      for (int64_t i = 0; i < m; i++) buf[i] = dy[c + i] * gelu_grad(gj_bf16_to_f32(x16[c + i]));
      if (dx) memcpy(dx + c, buf, m * sizeof(float));
      gj_bf16_round(dx16 + c, buf, (size_t)m); /* while the chunk is in cache */
    }
    return;
  }
  gj_colsum cs; /* the bias gradient: column sums of the float d x, row by row */
  gj_colsum_begin(&cs, rows, cols);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < cs.groups; g++) {
    int64_t i0, i1;
    double *s = gj_colsum_group(&cs, g, &i0, &i1);
    float buf[GELU_CHUNK];
    for (int64_t i = i0 * cols; i < i1 * cols; i += cols)
      for (int64_t j0 = 0; j0 < cols; j0 += GELU_CHUNK) {
        const int64_t m = cols - j0 < GELU_CHUNK ? cols - j0 : GELU_CHUNK, c = i + j0;
#pragma omp simd
        for (int64_t k = 0; k < m; k++) {
          buf[k] = dy[c + k] * gelu_grad(gj_bf16_to_f32(x16[c + k]));
          s[j0 + k] += (double)buf[k];
        }
        if (dx) memcpy(dx + c, buf, m * sizeof(float));
        gj_bf16_round(dx16 + c, buf, (size_t)m);
      }
  }
  gj_colsum_finish(&cs, db, 0, cols);
}
