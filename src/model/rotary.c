#include "model/rotary.h"

#include <math.h>
#include <string.h>

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

/* Rotate the pairs of x's rows in place, or (x16) into x16 [same layout], rounded to bfloat16
 * as gj_bf16_round rounds, x untouched. */
GJ_HOT
static void rotate(float *x, gj_bf16 *x16, const float *cos_t, const float *sin_t, int64_t B,
                   int64_t T, int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld,
                   float sign) {
  enum { CHUNK = 512 }; /* even: a pair never straddles two chunks */
  int64_t h = R / 2;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; row++) {
    int64_t p = pos0 + row % T;
    const float *c = cos_t + p * h, *s = sin_t + p * h;
    for (int64_t hd = 0; hd < Hl; hd++) {
      float *v = x + row * ld + hd * Hd;
      /* one loop for both outputs (the same operations, so the bf16 copy is the float result
       * rounded, bit for bit), a chunk of the head at a time */
      float buf[CHUNK];
      for (int64_t c0 = 0; c0 < (x16 ? Hd : R); c0 += CHUNK) {
        const int64_t n = Hd - c0 < CHUNK ? Hd - c0 : CHUNK, pe = R < c0 + n ? R : c0 + n;
        for (int64_t d = c0; d < pe; d += 2) {
          const int64_t i = d / 2;
          float a = v[d], b = v[d + 1], si = sign * s[i];
          buf[d - c0] = a * c[i] - b * si;
          buf[d - c0 + 1] = b * c[i] + a * si;
        }
        if (!x16) { /* in place: the rotated dims only */
          memcpy(v + c0, buf, (size_t)(pe - c0) * sizeof(float));
          continue;
        }
        for (int64_t d = pe > c0 ? pe : c0; d < c0 + n; d++) buf[d - c0] = v[d];
        gj_bf16_round(x16 + row * ld + hd * Hd + c0, buf, (size_t)n);
      }
    }
  }
}

void gj_rotary_forward(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                       int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld) {
  rotate(x, NULL, cos_t, sin_t, B, T, Hl, Hd, R, pos0, ld, 1.0f);
}

void gj_rotary_backward(float *dx, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                        int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld) {
  rotate(dx, NULL, cos_t, sin_t, B, T, Hl, Hd, R, pos0, ld, -1.0f);
}

const gj_bf16 *gj_rotary_backward16(gj_bf16 *dx16, const float *dy, const float *cos_t,
                                    const float *sin_t, int64_t B, int64_t T, int64_t Hl,
                                    int64_t Hd, int64_t R, int64_t pos0, int64_t ld) {
  rotate((float *)dy, dx16, cos_t, sin_t, B, T, Hl, Hd, R, pos0, ld, -1.0f);
  return dx16;
}
