#include "model/rotary.h"

#include <math.h>

#include "common.h"

void gj_rotary_table(float *cos_t, float *sin_t, int64_t P, int64_t R) {
  int64_t h = R / 2;
  for (int64_t p = 0; p < P; p++)
    for (int64_t i = 0; i < h; i++) {
      double theta = (double)p * pow(10000.0, -2.0 * (double)i / (double)R);
      cos_t[p * h + i] = (float)cos(theta);
      sin_t[p * h + i] = (float)sin(theta);
    }
}

GJ_HOT
static void rotate(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                   int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld, float sign) {
  int64_t h = R / 2;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; row++) {
    int64_t p = pos0 + row % T;
    const float *c = cos_t + p * h, *s = sin_t + p * h;
    for (int64_t hd = 0; hd < Hl; hd++) {
      float *v = x + row * ld + hd * Hd;
      for (int64_t i = 0; i < h; i++) {
        float a = v[2 * i], b = v[2 * i + 1], si = sign * s[i];
        v[2 * i] = a * c[i] - b * si;
        v[2 * i + 1] = b * c[i] + a * si;
      }
    }
  }
}

void gj_rotary_forward(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                       int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld) {
  rotate(x, cos_t, sin_t, B, T, Hl, Hd, R, pos0, ld, 1.0f);
}

void gj_rotary_backward(float *dx, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                        int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld) {
  rotate(dx, cos_t, sin_t, B, T, Hl, Hd, R, pos0, ld, -1.0f);
}
