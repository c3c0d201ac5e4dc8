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

/* One pair (a, b) rotated by the angle of (c, si): every rotation here goes through it, with
 * its roundings spelled out (fmaf), so that no loop's vectorization or contraction of a * b + c
 * makes a bf16 copy differ from the float result rounded. */
static inline void rot2(float *o0, float *o1, float a, float b, float c, float si) {
  *o0 = fmaf(a, c, -(b * si));
  *o1 = fmaf(b, c, a * si);
}

GJ_HOT
void gj_rotary_row16(gj_bf16 *y16, const float *x, const float *c, const float *s, int64_t Hd,
                     int64_t R, float sign) {
  enum { CHUNK = 512 }; /* even: a pair never straddles two chunks */
  float buf[CHUNK];
  for (int64_t c0 = 0; c0 < Hd; c0 += CHUNK) {
    const int64_t n = Hd - c0 < CHUNK ? Hd - c0 : CHUNK, pe = R < c0 + n ? R : c0 + n;
    for (int64_t d = c0; d < pe; d += 2) {
      const int64_t i = d / 2;
      rot2(&buf[d - c0], &buf[d - c0 + 1], x[d], x[d + 1], c[i], sign * s[i]);
    }
    for (int64_t d = pe > c0 ? pe : c0; d < c0 + n; d++) buf[d - c0] = x[d];
    gj_bf16_round(y16 + c0, buf, (size_t)n);
  }
}

/* Rotate the pairs of x's rows in place (the rotated dims only are written). */
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
#pragma omp simd
      for (int64_t i = 0; i < h; i++) {
        float a = v[2 * i], b = v[2 * i + 1];
        rot2(&v[2 * i], &v[2 * i + 1], a, b, c[i], sign * s[i]);
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

void gj_rotary_heads16(gj_bf16 *dst, const float *src, const float *cos_t, const float *sin_t,
                       int64_t B, int64_t T, int64_t Hl, int64_t Hd, int64_t R, int64_t ld) {
  const int64_t h = R / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t b = bt / T, t = bt % T;
    for (int64_t hd = 0; hd < Hl; hd++)
      gj_rotary_row16(dst + ((b * Hl + hd) * T + t) * Hd, src + bt * ld + hd * Hd, cos_t + t * h,
                      sin_t + t * h, Hd, R, 1.0f);
  }
}
