/* Vectorisable single-precision exp and tanh for the elementwise kernels (softmax,
 * cross-entropy, gelu). exp: Cody-Waite range reduction and Cephes' degree-6 polynomial,
 * within 2 ulp on [-87, 0]; inputs below -87.3 give about 1e-38 instead of 0; NaN gives NaN.
 * Only arguments <= 0 (or NaN) are allowed (softmax and cross-entropy subtract the row
 * maximum; tanh uses exp(-2|x|)). With -fno-trapping-math (Makefile.am) GCC if-converts the one clamp and
 * vectorises loops that call these. */
#ifndef GJ_MODEL_FASTMATH_H
#define GJ_MODEL_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) float gj_expf(float x) {
  x = x < -87.3f ? -87.3f : x; /* a select once built with -fno-trapping-math */
  /* round to nearest by adding and removing 1.5 * 2^23 (vectorises, unlike rintf) */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = fmaf(n, -0.693359375f, x);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r) + 1.0f;
  /* n is in [-126, 0] for the arguments allowed; a NaN argument gives a NaN p, and its scale
   * must come from a defined conversion (the select maps NaN to -127: scale 0, p * 0 NaN) */
  int32_t bits = ((int32_t)(n > -127.0f ? n : -127.0f) + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

static inline __attribute__((always_inline)) float gj_tanhf(float x) {
  float e = gj_expf(-2.0f * fabsf(x)); /* in (0, 1] */
  return copysignf((1.0f - e) / (1.0f + e), x);
}


/* max without NaN handling (compiles to maxss/maxps) */
static inline float gj_maxf(float a, float b) { return a > b ? a : b; }

#endif
