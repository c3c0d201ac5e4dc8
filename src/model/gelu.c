#include "model/gelu.h"

#include <math.h>

#include "model/fastmath.h"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

void gj_gelu_forward(float *y, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + gj_tanhf(GELU_C * (v + 0.044715f * v * v * v)));
  }
}

void gj_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float t = gj_tanhf(GELU_C * (v + 0.044715f * v * v * v));
    float dt = GELU_C * (1.0f + 3.0f * 0.044715f * v * v) * (1.0f - t * t);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
}
