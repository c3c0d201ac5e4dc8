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
  x = x > 89.0f ? 89.0f : x;    /* past the overflow: the scale below is then 2^128, infinity */
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
  /* n is in [-126, 0] for the arguments the kernels pass (x <= 0); a NaN argument gives a NaN
   * p, and its scale must come from a defined conversion (the select maps NaN to -127: scale 0,
   * p * 0 NaN); n is at most 128 (x <= 89), whose scale is infinity: from x = 88.3763 (n = 128)
   * on the result is infinity, where expf overflows from 88.7228 (the kernels pass x <= 0) */
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

/* A row's maximum, sum and dot product in GJ_LANES float lanes (one AVX-512 vector, two AVX2
 * ones), the lanes combined by halves at the end: one order of operations on every CPU, and
 * none of `omp simd reduction`'s epilogue (a chain of dependent scalar operations per row,
 * which took most of the time of a short row, such as a softmax row of the attention). Always
 * inlined: out of line GCC builds one x86-64-v3 copy that every clone of a caller calls. */
#define GJ_LANES 16
static inline __attribute__((always_inline)) float gj_row_max(const float *x, int64_t n) {
  float acc[GJ_LANES];
  for (int l = 0; l < GJ_LANES; l++) acc[l] = -INFINITY;
  int64_t j = 0;
  for (; j + GJ_LANES <= n; j += GJ_LANES)
    for (int l = 0; l < GJ_LANES; l++) acc[l] = gj_maxf(acc[l], x[j + l]);
  for (int l = 0; j < n; j++, l++) acc[l] = gj_maxf(acc[l], x[j]);
  for (int l = 0; l < 8; l++) acc[l] = gj_maxf(acc[l], acc[l + 8]);
  for (int l = 0; l < 4; l++) acc[l] = gj_maxf(acc[l], acc[l + 4]);
  for (int l = 0; l < 2; l++) acc[l] = gj_maxf(acc[l], acc[l + 2]);
  return gj_maxf(acc[0], acc[1]);
}
static inline __attribute__((always_inline)) float gj_lanes_sum(float *acc) {
  for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; l++) acc[l] += acc[l + 2];
  return acc[0] + acc[1];
}
static inline __attribute__((always_inline)) float gj_row_sum(const float *x, int64_t n) {
  float acc[GJ_LANES] = {0};
  int64_t j = 0;
  for (; j + GJ_LANES <= n; j += GJ_LANES)
    for (int l = 0; l < GJ_LANES; l++) acc[l] += x[j + l];
  for (int l = 0; j < n; j++, l++) acc[l] += x[j];
  return gj_lanes_sum(acc);
}
static inline __attribute__((always_inline)) float gj_row_dot(const float *x, const float *y, int64_t n) {
  float acc[GJ_LANES] = {0};
  int64_t j = 0;
  for (; j + GJ_LANES <= n; j += GJ_LANES)
    for (int l = 0; l < GJ_LANES; l++) acc[l] += x[j + l] * y[j + l];
  for (int l = 0; j < n; j++, l++) acc[l] += x[j] * y[j];
  return gj_lanes_sum(acc);
}

#endif
