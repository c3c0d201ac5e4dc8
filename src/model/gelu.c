#include "model/gelu.h"

#include <math.h>

#include "common.h"
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

GJ_HOT
void gj_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float t = gj_tanhf(GELU_C * (v + 0.044715f * v * v * v));
    float dt = GELU_C * (1.0f + 3.0f * 0.044715f * v * v) * (1.0f - t * t);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
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
void gj_gelu_backward16(float *dx, gj_bf16 *dx16, const float *dy, const gj_bf16 *x16, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += GELU_CHUNK) {
    size_t m = n - c < GELU_CHUNK ? n - c : GELU_CHUNK;
#pragma omp simd
    for (size_t i = c; i < c + m; i++) {
      float v = gj_bf16_to_f32(x16[i]);
      float t = gj_tanhf(GELU_C * (v + 0.044715f * v * v * v));
      float dt = GELU_C * (1.0f + 3.0f * 0.044715f * v * v) * (1.0f - t * t);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
    gj_bf16_round(dx16 + c, dx + c, m); /* while the chunk is in cache */
  }
}
