/* Kernel tests: each float forward against a naive double-precision loop, each backward
 * against central finite differences of that double forward, on small odd shapes. */
#include <cblas.h>
#undef I /* complex.h's, from cblas.h: the tests name a size I */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include <zlib.h>

#include "common.h"
#include "io/crc32.h"
#include "model/attention.h"
#include "model/crossentropy.h"
#include "model/embedding.h"
#include "model/fastmath.h"
#include "model/gemm.h"
#include "model/gelu.h"
#include "model/layernorm.h"
#include "model/linear.h"
#include "model/rotary.h"
#include "testutil.h"

#define FWD_TOL 1e-5 /* float32 forward vs double */
#define BWD_TOL 1e-4 /* float32 backward vs double finite differences */

/* ---- LayerNorm ---- */
typedef struct { int64_t N, D; double eps; const double *r; } ln_ctx;
static void ln_ref(double *y, const double *x, const double *w, const double *b, int64_t N,
                   int64_t D, double eps) {
  for (int64_t i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < D; j++) m += x[i * D + j];
    m /= D;
    for (int64_t j = 0; j < D; j++) v += (x[i * D + j] - m) * (x[i * D + j] - m);
    v /= D;
    for (int64_t j = 0; j < D; j++) y[i * D + j] = (x[i * D + j] - m) / sqrt(v + eps) * w[j] + b[j];
  }
}
static double ln_loss(void *vc, double *th) { /* th = [x | w | b] */
  ln_ctx *c = vc;
  double *y = tu_dalloc(c->N * c->D), s = 0;
  ln_ref(y, th, th + c->N * c->D, th + c->N * c->D + c->D, c->N, c->D, c->eps);
  for (int64_t i = 0; i < c->N * c->D; i++) s += y[i] * c->r[i];
  free(y);
  return s;
}

START_TEST(test_layernorm) {
  const int64_t N = 7, D = 13;
  size_t nt = N * D + 2 * D;
  float *th = tu_falloc(nt), *y = tu_falloc(N * D), *mean = tu_falloc(N), *rstd = tu_falloc(N);
  float *r = tu_falloc(N * D), *g = tu_falloc(nt);
  double *thd = tu_dalloc(nt), *yd = tu_dalloc(N * D), *rd = tu_dalloc(N * D), *gd = tu_dalloc(nt);
  tu_fill(th, thd, nt, 1.5);
  for (int64_t j = 0; j < D; j++) th[N * D + j] += 1.0f, thd[N * D + j] += 1.0; /* w near 1 */
  tu_fill(r, rd, N * D, 1.0);
  gj_layernorm_forward(y, NULL, mean, rstd, th, th + N * D, th + N * D + D, N, D, 1e-5f);
  ln_ref(yd, thd, thd + N * D, thd + N * D + D, N, D, 1e-5);
  ck_assert_double_le(tu_rel(y, yd, N * D), FWD_TOL);
  gj_layernorm_backward(g, g + N * D, g + N * D + D, r, th, mean, rstd, th + N * D, N, D);
  ln_ctx c = {N, D, 1e-5, rd};
  tu_fd(ln_loss, &c, thd, nt, gd);
  ck_assert_double_le(tu_rel(g, gd, N * D), BWD_TOL);
  ck_assert_double_le(tu_rel(g + N * D, gd + N * D, D), BWD_TOL);
  ck_assert_double_le(tu_rel(g + N * D + D, gd + N * D + D, D), BWD_TOL);
  /* rows of a variance near eps (1e-5): where eps goes (inside the square root) shows */
  for (int64_t i = 0; i < N * D; i++) th[i] *= 0.005f, thd[i] = th[i];
  gj_layernorm_forward(y, NULL, mean, rstd, th, th + N * D, th + N * D + D, N, D, 1e-5f);
  ln_ref(yd, thd, thd + N * D, thd + N * D + D, N, D, 1e-5);
  ck_assert_double_le(tu_rel(y, yd, N * D), FWD_TOL);
  free(th), free(y), free(mean), free(rstd), free(r), free(g), free(thd), free(yd), free(rd), free(gd);
}
END_TEST

/* ---- Linear ---- */
typedef struct { int64_t N, I, O; const double *r; } lin_ctx;
static double lin_loss(void *vc, double *th) { /* th = [x | W | b] */
  lin_ctx *c = vc;
  const double *x = th, *W = th + c->N * c->I, *b = W + c->O * c->I;
  double s = 0;
  for (int64_t i = 0; i < c->N; i++)
    for (int64_t o = 0; o < c->O; o++) {
      double y = b[o];
      for (int64_t k = 0; k < c->I; k++) y += x[i * c->I + k] * W[o * c->I + k];
      s += y * c->r[i * c->O + o];
    }
  return s;
}

START_TEST(test_linear) {
  const int64_t N = 9, I = 11, O = 5;
  size_t nt = N * I + O * I + O;
  float *th = tu_falloc(nt), *y = tu_falloc(N * O), *r = tu_falloc(N * O), *g = tu_falloc(nt);
  double *thd = tu_dalloc(nt), *yd = tu_dalloc(N * O), *rd = tu_dalloc(N * O), *gd = tu_dalloc(nt);
  tu_fill(th, thd, nt, 1.0);
  tu_fill(r, rd, N * O, 1.0);
  const float *x = th, *W = th + N * I, *b = W + O * I;
  gj_linear_forward(y, x, NULL, W, NULL, b, N, I, O, 0);
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < O; o++) {
      double s = thd[N * I + O * I + o];
      for (int64_t k = 0; k < I; k++) s += thd[i * I + k] * thd[N * I + o * I + k];
      yd[i * O + o] = s;
    }
  ck_assert_double_le(tu_rel(y, yd, N * O), FWD_TOL);
  /* accumulate = 1 adds to what is there */
  gj_linear_forward(y, x, NULL, W, NULL, NULL, N, I, O, 1);
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < O; o++) yd[i * O + o] = 2 * yd[i * O + o] - thd[N * I + O * I + o];
  ck_assert_double_le(tu_rel(y, yd, N * O), FWD_TOL);
  gj_linear_backward(g, g + N * I, g + N * I + O * I, r, NULL, x, NULL, W, NULL, N, I, O, 0);
  lin_ctx c = {N, I, O, rd};
  tu_fd(lin_loss, &c, thd, nt, gd);
  ck_assert_double_le(tu_rel(g, gd, N * I), BWD_TOL);
  ck_assert_double_le(tu_rel(g + N * I, gd + N * I, O * I), BWD_TOL);
  ck_assert_double_le(tu_rel(g + N * I + O * I, gd + N * I + O * I, O), BWD_TOL);
  free(th), free(y), free(r), free(g), free(thd), free(yd), free(rd), free(gd);
}
END_TEST

/* ---- gelu_new ---- */
static double gelu_d(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
typedef struct { size_t n; const double *r; } ew_ctx;
static double gelu_loss(void *vc, double *x) {
  ew_ctx *c = vc;
  double s = 0;
  for (size_t i = 0; i < c->n; i++) s += gelu_d(x[i]) * c->r[i];
  return s;
}

/* bfloat16 rounding: nearest, ties to even, NaN kept, overflow to infinity, and the vector
 * path (16 at a time) equal to the scalar one on every float of a sweep. */
START_TEST(test_bf16_round) {
  union { uint32_t u; float f; } x;
  x.u = 0x3f808000; /* exactly halfway between 0x3f80 and 0x3f81: to even */
  ck_assert_uint_eq(gj_f32_to_bf16(x.f), 0x3f80);
  x.u = 0x3f818000; /* halfway between 0x3f81 and 0x3f82: to even */
  ck_assert_uint_eq(gj_f32_to_bf16(x.f), 0x3f82);
  x.u = 0x3f808001;
  ck_assert_uint_eq(gj_f32_to_bf16(x.f), 0x3f81);
  x.u = 0x7f7fffff; /* largest float rounds up to infinity */
  ck_assert_uint_eq(gj_f32_to_bf16(x.f), 0x7f80);
  x.u = 0x7f800001; /* a signalling NaN stays a NaN */
  ck_assert(isnan(gj_bf16_to_f32(gj_f32_to_bf16(x.f))));
  ck_assert_uint_eq(gj_f32_to_bf16(-0.0f), 0x8000);
  x.u = 0x8000ffef; /* subnormals become signed zero, as VCVTNEPS2BF16 does */
  ck_assert_uint_eq(gj_f32_to_bf16(x.f), 0x8000);
  enum { n = 1 << 16 };
  float *src = tu_falloc(n);
  gj_bf16 *dst = calloc(n, sizeof(gj_bf16));
  for (uint32_t base = 0; base < 0xffffffffu - n * 65519u; base += n * 65519u) {
    for (int i = 0; i < n; i++) x.u = base + (uint32_t)i * 65519u, src[i] = x.f;
    gj_bf16_round(dst, src, n - 3); /* a tail the vector loop does not cover */
    for (int i = 0; i < n - 3; i++) {
      gj_bf16 want = gj_f32_to_bf16(src[i]);
      if (isnan(src[i])) ck_assert(isnan(gj_bf16_to_f32(dst[i])));
      else ck_assert_msg(dst[i] == want, "0x%08x: 0x%04x, want 0x%04x", base + i * 65519u, dst[i], want);
    }
  }
  free(src), free(dst);
}
END_TEST

/* Every backend and precision this CPU offers computes every kind of product (both
 * transpositions, alpha, beta, strided operands, degenerate sizes) to float32 accuracy of the
 * exact product of its (rounded) operands. */
START_TEST(test_gemm_backends) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  ck_assert_int_eq(gj_gemm_selftest(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  ck_assert_int_eq(gj_gemm_selftest(GJ_GEMM_ONEDNN, GJ_PREC_F32), 0);
  if (f.amx_bf16 || f.avx512_bf16) {
    ck_assert_int_eq(gj_gemm_selftest(GJ_GEMM_ONEDNN, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_selftest(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0); /* on the FMA units */
    ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_AUTO, GJ_PREC_BF16), 0);
    if (f.amx_bf16) ck_assert_int_eq(gj_gemm_backend_in_use(), GJ_GEMM_ONEDNN);
    fprintf(stderr, "test_gemm_backends: bf16 auto: %s\n", gj_gemm_describe());
    ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_backend_in_use(), GJ_GEMM_OPENBLAS);
    ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_ONEDNN, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_backend_in_use(), GJ_GEMM_ONEDNN);
  } else {
    /* no bf16 hardware: auto and oneDNN refuse, naming the way that runs (OpenBLAS on bf16
     * values), which works */
    ck_assert_int_ne(gj_gemm_setup(GJ_GEMM_AUTO, GJ_PREC_BF16), 0);
    ck_assert_msg(strstr(gj_errmsg(), "neither AMX-BF16 nor AVX512_BF16") && strstr(gj_errmsg(), "--gemm openblas"),
                  "%s", gj_errmsg());
    ck_assert_int_ne(gj_gemm_setup(GJ_GEMM_ONEDNN, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_selftest(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
    ck_assert_int_eq(gj_gemm_backend_in_use(), GJ_GEMM_OPENBLAS);
    fprintf(stderr, "test_gemm_backends: bf16 without bf16 hardware: %s\n", gj_gemm_describe());
  }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_ONEDNN, GJ_PREC_F32), 0);
  ck_assert_int_eq(gj_gemm_backend_in_use(), GJ_GEMM_ONEDNN);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  ck_assert_int_eq(gj_gemm_precision(), GJ_PREC_F32);
  gj_gemm_finalize();
}
END_TEST

/* gj_gemm_recorded_replay runs exactly the recorded products, each shape as many times as it
 * was recorded (a shape recorded inside a parallel region shared out over its threads), through
 * the same doors, without recording itself, on every backend and precision this CPU offers. */
START_TEST(test_gemm_replay) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  const int have16 = f.amx_bf16 || f.avx512_bf16;
  struct { gj_gemm_backend b; gj_precision p; } runs[] = {
      {GJ_GEMM_OPENBLAS, GJ_PREC_F32}, {GJ_GEMM_ONEDNN, GJ_PREC_F32}, {GJ_GEMM_OPENBLAS, GJ_PREC_BF16},
      {GJ_GEMM_ONEDNN, GJ_PREC_BF16}};
  float *A = calloc(64 * 64, sizeof(float)), *B = calloc(64 * 64, sizeof(float));
  float *bias = calloc(64, sizeof(float)), *C = calloc(2 * 64 * 64, sizeof(float));
  gj_bf16 *A16 = calloc(64 * 64, sizeof(gj_bf16)), *C16 = calloc(2 * 64 * 64, sizeof(gj_bf16));
  for (int r = 0; r < 4; r++) {
    if (runs[r].b == GJ_GEMM_ONEDNN && runs[r].p == GJ_PREC_BF16 && !have16) continue;
    ck_assert_int_eq(gj_gemm_setup(runs[r].b, runs[r].p), 0);
    const int bf = runs[r].p == GJ_PREC_BF16;
    gj_gemm_record_reset();
    gj_gemm_record(1);
    for (int k = 0; k < 3; k++) gj_gemm(0, 1, 32, 16, 8, 1.0f, A, bf ? A16 : NULL, 64, B, NULL, 64, 0.0f, C, 64);
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      for (int k = 0; k < 5; k++) {
        if (bf) gj_gemm_bias16(1, 0, 16, 24, 40, A, A16, 64, B, NULL, 64, bias, C16 + t * 64 * 64, 64);
        else gj_gemm_bias(1, 0, 16, 24, 40, A, NULL, 64, B, NULL, 64, bias, 0.0f, C + t * 64 * 64, 64);
      }
    }
    const double flops = gj_gemm_recorded_flops(), want = 3 * 2.0 * 32 * 16 * 8 + 10 * 2.0 * 16 * 24 * 40;
    ck_assert_int_eq(gj_gemm_recorded_shapes(), 2);
    ck_assert_double_eq(flops, want);
    const uint64_t before = gj_gemm_products();
    ck_assert(gj_gemm_recorded_replay() > 0); /* while recording is on: it records nothing */
    ck_assert_uint_eq(gj_gemm_products() - before, 13);
    ck_assert_int_eq(gj_gemm_recorded_shapes(), 2);
    ck_assert_double_eq(gj_gemm_recorded_flops(), want);
    gj_gemm_record(0);
    ck_assert(gj_gemm_recorded_replay() > 0);
    ck_assert_uint_eq(gj_gemm_products() - before, 26);
    gj_gemm_record_reset();
    ck_assert(gj_gemm_recorded_replay() == 0); /* nothing recorded: no figure */
  }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  free(A), free(B), free(bias), free(C), free(A16), free(C16);
}
END_TEST

/* ref [M, N] = sum over k of a[i*ar + k*ak] b[k*bk + j*bj], in double, of bf16 numbers. */
static void ref_product(double *ref, const gj_bf16 *a, int64_t ar, int64_t ak, const gj_bf16 *b,
                        int64_t bk, int64_t bj, int64_t M, int64_t N, int64_t K) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++)
        s += (double)gj_bf16_to_f32(a[i * ar + k * ak]) * gj_bf16_to_f32(b[k * bk + j * bj]);
      ref[i * N + j] = s;
    }
}

/* The linear layer in bf16: forward and both gradients equal the double-precision products
 * of the bf16-rounded operands to float32 accumulation accuracy, with and without the
 * caller's bf16 copies; inside a parallel region too (the attention tiles' case). */
START_TEST(test_linear_bf16) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  /* both backends; only OpenBLAS on bf16 values where the CPU has no bf16 hardware */
  for (int be = f.amx_bf16 || f.avx512_bf16 ? 0 : 1; be < 2; be++) {
  ck_assert_int_eq(gj_gemm_setup(be ? GJ_GEMM_OPENBLAS : GJ_GEMM_ONEDNN, GJ_PREC_BF16), 0);
  const int64_t N = 37, I = 70, O = 45;
  float *x = tu_falloc(N * I), *W = tu_falloc(O * I), *dy = tu_falloc(N * O);
  float *y = tu_falloc(N * O), *dx = tu_falloc(N * I), *dW = tu_falloc(O * I);
  double *d = tu_dalloc(N * I + O * I + N * O), *ref = tu_dalloc(N * I + O * I + N * O);
  tu_fill(x, d, N * I, 1.0), tu_fill(W, d, O * I, 1.0), tu_fill(dy, d, N * O, 1.0);
  gj_bf16 *x16 = calloc(N * I, 2), *W16 = calloc(O * I, 2), *dy16 = calloc(N * O, 2);
  gj_bf16_round(x16, x, N * I), gj_bf16_round(W16, W, O * I), gj_bf16_round(dy16, dy, N * O);
  for (int pass = 0; pass < 3; pass++) {
    memset(dW, 0, O * I * sizeof(float));
    if (pass < 2) {
      int c = pass; /* 0: the door rounds; 1: the caller's copies */
      gj_linear_forward(y, x, c ? x16 : NULL, W, c ? W16 : NULL, NULL, N, I, O, 0);
      gj_linear_backward(dx, dW, NULL, dy, c ? dy16 : NULL, x, c ? x16 : NULL, W, c ? W16 : NULL, N, I, O, 0);
    } else {
#pragma omp parallel num_threads(2)
      {
#pragma omp single
        {
          gj_linear_forward(y, x, NULL, W, NULL, NULL, N, I, O, 0);
          gj_linear_backward(dx, dW, NULL, dy, NULL, x, NULL, W, NULL, N, I, O, 0);
        }
      }
    }
    ref_product(ref, x16, I, 1, W16, 1, I, N, O, I); /* y = x W^T */
    ck_assert_double_le(tu_rel(y, ref, N * O), 1e-6);
    ref_product(ref, dy16, O, 1, W16, I, 1, N, I, O); /* dx = dy W */
    ck_assert_double_le(tu_rel(dx, ref, N * I), 1e-6);
    ref_product(ref, dy16, 1, O, x16, I, 1, O, I, N); /* dW = dy^T x */
    ck_assert_double_le(tu_rel(dW, ref, O * I), 1e-6);
  }
  free(x), free(W), free(dy), free(y), free(dx), free(dW), free(d), free(ref);
  free(x16), free(W16), free(dy16);
  }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
}
END_TEST

/* gj_bf16_rounded (the vectorized rounding of bf16 on the FMA units) gives the bits of
 * gj_f32_to_bf16 widened back, on every high half-word (signs, exponents: zero, subnormal,
 * normal, infinity, NaN) with low half-words at and around the ties, their extremes and a few
 * others; and as a vectorized loop, as it runs. */
START_TEST(test_bf16_rounded) {
  const uint32_t lows[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xbeef};
  const int nl = (int)(sizeof lows / sizeof *lows);
  const int64_t n = (int64_t)65536 * nl;
  float *x = tu_falloc(n), *y = tu_falloc(n);
  for (int64_t i = 0; i < n; i++) {
    union { uint32_t u; float f; } v = {((uint32_t)(i / nl) << 16) | lows[i % nl]};
    x[i] = v.f;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = gj_bf16_rounded(x[i]);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    float r = gj_bf16_to_f32(gj_f32_to_bf16(x[i])), one = gj_bf16_rounded(x[i]);
    if (memcmp(&r, &y[i], 4) || memcmp(&r, &one, 4)) bad++, first = first < 0 ? i : first;
  }
  ck_assert_msg(bad == 0, "%lld of %lld differ, the first at input bits %08x", (long long)bad, (long long)n,
                first < 0 ? 0u : ((unsigned)(first / nl) << 16) | lows[first % nl]);
  free(x), free(y);
}
END_TEST

/* bf16 on the FMA units, a few rows (decoding's one token) times a weight read as its rows
 * (C = A B^T, up to 8 rows): each row of B read once in its own type. Against the
 * double-precision products of the bf16 operands to float32 accumulation accuracy, over K
 * beyond one chunk (2048) and a short one, strided A, B and C, alpha and beta (beta 0 not
 * reading C: NaN there stays out); B as a bf16 copy and as the float it was rounded from give
 * the same bits; inside a parallel region (the attention tiles') too. */
START_TEST(test_gemm_bf16_rows) {
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
  const int64_t Ks[2] = {4100, 77}, N = 300, lda = 4200, ldb = 4111, ldc = 310;
  float *a = tu_falloc(8 * lda), *b = tu_falloc(N * ldb), *c = tu_falloc(8 * ldc), *c2 = tu_falloc(8 * ldc);
  double *d = tu_dalloc(N * ldb), *ref = tu_dalloc(8 * N);
  tu_fill(a, d, 8 * lda, 1.0), tu_fill(b, d, N * ldb, 1.0);
  gj_bf16 *a16 = calloc(8 * lda, 2), *b16 = calloc(N * ldb, 2);
  gj_bf16_round(a16, a, 8 * lda), gj_bf16_round(b16, b, N * ldb);
  for (int ki = 0; ki < 2; ki++)
    for (int64_t M = 1; M <= 8; M += 3 + (M == 1)) { /* 1, 5, 8 */
      const int64_t K = Ks[ki];
      for (int mode = 0; mode < 3; mode++) { /* alpha 1 beta 0 (C NaN), alpha 0.5 beta 1, in a parallel region */
        const float alpha = mode == 1 ? 0.5f : 1.0f, beta = mode == 1 ? 1.0f : 0.0f;
        for (int64_t i = 0; i < 8 * ldc; i++) c[i] = c2[i] = mode == 1 ? 2.0f : NAN;
        if (mode < 2) {
          gj_gemm(0, 1, M, N, K, alpha, a, NULL, lda, NULL, b16, ldb, beta, c, ldc);
          gj_gemm(0, 1, M, N, K, alpha, NULL, a16, lda, b, NULL, ldb, beta, c2, ldc);
        } else {
#pragma omp parallel num_threads(2)
          {
#pragma omp single
            gj_gemm(0, 1, M, N, K, alpha, a, NULL, lda, NULL, b16, ldb, beta, c, ldc);
#pragma omp single
            gj_gemm(0, 1, M, N, K, alpha, NULL, a16, lda, b, NULL, ldb, beta, c2, ldc);
          }
        }
        ref_product(ref, a16, lda, 1, b16, 1, ldb, M, N, K);
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            ck_assert_msg(!memcmp(&c[i * ldc + j], &c2[i * ldc + j], sizeof(float)), "K %lld M %lld mode %d: copy and "
                          "float differ at (%lld, %lld)", (long long)K, (long long)M, mode, (long long)i, (long long)j);
            ref[i * N + j] = alpha * ref[i * N + j] + beta * 2.0;
            c2[i * N + j] = c[i * ldc + j]; /* densely, for tu_rel (row i at i N <= i ldc: not yet read) */
          }
        ck_assert_msg(tu_rel(c2, ref, M * N) <= 1e-6, "K %lld M %lld mode %d: rel %g", (long long)K, (long long)M,
                      mode, tu_rel(c2, ref, M * N));
        ck_assert(mode == 1 ? c[N] == 2.0f : isnan(c[N])); /* the padding of row 0 untouched */
      }
    }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  free(a), free(b), free(c), free(c2), free(d), free(ref), free(a16), free(b16);
}
END_TEST

/* bf16 on the FMA units widens an operand a piece at a time (4M floats, K cut at 4096): products
 * whose operands exceed a piece, split along N (the vocabulary head's weight, with its bf16
 * copy), along M (a transposed activation without one) and along K (d x = d logits W), equal
 * the double-precision products of the bf16 operands to float32 accumulation accuracy, beta = 1
 * accumulating. */
START_TEST(test_gemm_bf16_pieces) {
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
  /* M 9: more rows than the few-rows kernel takes (test_gemm_bf16_rows) */
  const int64_t M = 9, N = 9000, K = 1000; /* K N = 9M: three pieces of B */
  float *a = tu_falloc(K * 9000), *b = tu_falloc(N * K), *c = tu_falloc(M * N);
  double *d = tu_dalloc(N * K), *ref = tu_dalloc(9000 * M);
  tu_fill(a, d, K * 9000, 1.0), tu_fill(b, d, N * K, 1.0);
  gj_bf16 *a16 = calloc(K * 9000, 2), *b16 = calloc(N * K, 2);
  gj_bf16_round(a16, a, K * 9000), gj_bf16_round(b16, b, N * K);
  /* C [9, 9000] = A [9, 1000] B^T, B [9000, 1000] given in bf16 */
  for (int64_t i = 0; i < M * N; i++) c[i] = 1.0f;
  gj_gemm(0, 1, M, N, K, 1.0f, a, NULL, K, NULL, b16, K, 1.0f, c, N);
  ref_product(ref, a16, K, 1, b16, 1, K, M, N, K);
  for (int64_t i = 0; i < M * N; i++) ref[i] += 1.0;
  ck_assert_double_le(tu_rel(c, ref, M * N), 1e-6);
  /* C [9000, 3] = A^T B, A [1000, 9000] float32 only (rounded by the door), B [1000, 3] */
  gj_gemm(1, 0, 9000, 3, K, 1.0f, a, NULL, 9000, b, NULL, 3, 0.0f, c, 3);
  ref_product(ref, a16, 1, 9000, b16, 3, 1, 9000, 3, K);
  ck_assert_double_le(tu_rel(c, ref, 9000 * 3), 1e-6);
  /* C [3, 1000] = A [3, 9000] B, B [9000, 1000] in bf16 (K 9000: three pieces), beta 1 */
  for (int64_t i = 0; i < 3 * K; i++) c[i] = 1.0f;
  gj_gemm(0, 0, 3, K, 9000, 1.0f, a, NULL, 9000, NULL, b16, K, 1.0f, c, K);
  ref_product(ref, a16, 9000, 1, b16, K, 1, 3, K, 9000);
  for (int64_t i = 0; i < 3 * K; i++) ref[i] += 1.0;
  ck_assert_double_le(tu_rel(c, ref, 3 * K), 1e-6);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  free(a), free(b), free(c), free(d), free(ref), free(a16), free(b16);
}
END_TEST

START_TEST(test_gelu) {
  const size_t n = 101;
  float *x = tu_falloc(n), *y = tu_falloc(n), *r = tu_falloc(n), *g = tu_falloc(n);
  double *xd = tu_dalloc(n), *yd = tu_dalloc(n), *rd = tu_dalloc(n), *gd = tu_dalloc(n);
  tu_fill(x, xd, n, 4.0);
  tu_fill(r, rd, n, 1.0);
  gj_gelu_forward(y, x, n);
  for (size_t i = 0; i < n; i++) yd[i] = gelu_d(xd[i]);
  ck_assert_double_le(tu_rel(y, yd, n), FWD_TOL);
  gj_gelu_backward(g, NULL, r, x, 1, (int64_t)n);
  ew_ctx c = {n, rd};
  tu_fd(gelu_loss, &c, xd, n, gd);
  ck_assert_double_le(tu_rel(g, gd, n), BWD_TOL);
  free(x), free(y), free(r), free(g), free(xd), free(yd), free(rd), free(gd);
}
END_TEST

/* The kernels that sum columns over rows as they write them (LayerNorm's parameter gradients,
 * the bias gradients fused into GELU's backward and into dx's rounding): the sums against
 * double-precision ones, the other outputs the same as the unfused kernels', bit for bit, and
 * every output the same bits at 1, 2 and 3 threads (the row groups depend on the row count
 * only). Row counts below, at and far above the group count (64), a partial last group, and
 * columns beyond one GELU chunk (1024). */
static void colsum_ref(double *ref, const float *d, int64_t N, int64_t D) {
  for (int64_t j = 0; j < D; j++) ref[j] = 0.5; /* what the sums are added to */
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < D; j++) ref[j] += d[i * D + j];
}

START_TEST(test_fused_colsums) {
  static const int64_t shapes[][2] = {{5, 3}, {64, 17}, {301, 40}, {130, 1100}};
  const int nth[3] = {1, 2, 3}, saved = omp_get_max_threads();
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
    const int64_t N = shapes[sh][0], D = shapes[sh][1], ND = N * D;
    float *x = tu_falloc(ND), *dy = tu_falloc(ND), *w = tu_falloc(D), *b = tu_falloc(D);
    float *mean = tu_falloc(N), *rstd = tu_falloc(N), *y = tu_falloc(ND), *d = tu_falloc(ND);
    float *out[3], *dxu = tu_falloc(ND);
    double *ref = tu_dalloc(D), *ref2 = tu_dalloc(D);
    gj_bf16 *y16 = calloc(ND, 2), *r16 = calloc(ND, 2), *o16[3];
    tu_fill(x, NULL, ND, 3.0), tu_fill(dy, NULL, ND, 1.0), tu_fill(w, NULL, D, 1.0), tu_fill(b, NULL, D, 1.0);
    for (int t = 0; t < 3; t++) out[t] = tu_falloc(ND + 2 * D + 1), o16[t] = calloc(ND, 2);
    /* LayerNorm: forward's bf16 output is its float output rounded; backward's sums */
    gj_layernorm_forward(y, NULL, mean, rstd, x, w, b, N, D, 1e-5f);
    gj_layernorm_forward(NULL, y16, mean, rstd, x, w, b, N, D, 1e-5f);
    gj_bf16_round(r16, y, (size_t)ND);
    ck_assert_int_eq(memcmp(y16, r16, ND * 2), 0);
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(nth[t]);
      float *dx = out[t], *dw = dx + ND, *db = dw + D;
      for (int64_t j = 0; j < D; j++) dw[j] = db[j] = 0.5f;
      gj_layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, N, D);
      ck_assert_int_eq(memcmp(dx, out[0], (ND + 2 * D) * sizeof(float)), 0);
    }
    for (int64_t j = 0; j < D; j++) ref[j] = ref2[j] = 0.5;
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < D; j++) {
        ref[j] += (double)dy[i * D + j] * ((double)x[i * D + j] - mean[i]) * rstd[i];
        ref2[j] += dy[i * D + j];
      }
    ck_assert_double_le(tu_rel(out[0] + ND, ref, D), 1e-6);
    ck_assert_double_le(tu_rel(out[0] + ND + D, ref2, D), 1e-6);
    /* the bias gradient, alone and with dy's rounding */
    colsum_ref(ref, dy, N, D);
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(nth[t]);
      float *db = out[t];
      for (int64_t j = 0; j < D; j++) db[j] = db[D + j] = 0.5f;
      gj_bias_grad(db, NULL, dy, N, D);
      gj_bias_grad(db + D, o16[t], dy, N, D);
      ck_assert_int_eq(memcmp(db, out[0], 2 * D * sizeof(float)), 0);
      ck_assert_int_eq(memcmp(db, db + D, D * sizeof(float)), 0);
    }
    gj_bf16_round(r16, dy, (size_t)ND);
    ck_assert_int_eq(memcmp(o16[0], r16, ND * 2), 0);
    ck_assert_double_le(tu_rel(out[0], ref, D), 1e-6);
    /* GELU's backward with fc_in's bias gradient: d as without it, its sums; the bf16 kernel
     * (float d not written) the same sums and the same rounding */
    gj_gelu_backward(dxu, NULL, dy, x, N, D);
    colsum_ref(ref, dxu, N, D);
    gj_bf16_round(r16, x, (size_t)ND);
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(nth[t]);
      float *db = out[t] + ND;
      for (int64_t j = 0; j < D; j++) db[j] = db[D + j] = 0.5f;
      gj_gelu_backward(d, db, dy, x, N, D);
      ck_assert_int_eq(memcmp(d, dxu, ND * sizeof(float)), 0);
      ck_assert_int_eq(memcmp(db, out[0] + ND, D * sizeof(float)), 0);
      gj_gelu_backward16(NULL, o16[t], db + D, dy, r16, N, D);
      ck_assert_int_eq(memcmp(o16[t], o16[0], ND * 2), 0);
      ck_assert_int_eq(memcmp(db + D, out[0] + ND + D, D * sizeof(float)), 0);
    }
    ck_assert_double_le(tu_rel(out[0] + ND, ref, D), 1e-6);
    /* ... whose values are those of the float kernel on the rounded input, rounded */
    float *xr = tu_falloc(ND);
    for (int64_t i = 0; i < ND; i++) xr[i] = gj_bf16_to_f32(r16[i]);
    gj_gelu_backward(d, NULL, dy, xr, N, D);
    gj_bf16_round(y16, d, (size_t)ND);
    ck_assert_int_eq(memcmp(o16[0], y16, ND * 2), 0);
    colsum_ref(ref, d, N, D);
    ck_assert_double_le(tu_rel(out[0] + ND + D, ref, D), 1e-6);
    omp_set_num_threads(saved);
    free(xr), free(x), free(dy), free(w), free(b), free(mean), free(rstd), free(y), free(d), free(dxu);
    free(ref), free(ref2), free(y16), free(r16);
    for (int t = 0; t < 3; t++) free(out[t]), free(o16[t]);
  }
}
END_TEST

/* The bf16 GELU kernels (bf16 training keeps the fc_in output in bfloat16 only) are the float
 * ones on the widened input, rounded as gj_bf16_round rounds, bit for bit; over several chunks,
 * a partial last one, and the backward in place (dx = dy). */
START_TEST(test_gelu_bf16) {
  const size_t n = 2 * 1024 + 77;
  float *x = tu_falloc(n), *y = tu_falloc(n), *r = tu_falloc(n), *g = tu_falloc(n), *dx = tu_falloc(n);
  double *xd = tu_dalloc(n), *rd = tu_dalloc(n);
  gj_bf16 *x16 = calloc(n, 2), *y16 = calloc(n, 2), *yr = calloc(n, 2), *g16 = calloc(n, 2), *gr = calloc(n, 2);
  tu_fill(x, xd, n, 6.0);
  tu_fill(r, rd, n, 1.0);
  gj_bf16_round(x16, x, n);
  for (size_t i = 0; i < n; i++) x[i] = gj_bf16_to_f32(x16[i]);
  gj_gelu_forward(y, x, n);
  gj_bf16_round(yr, y, n);
  gj_gelu_forward16(y16, x16, n);
  ck_assert_int_eq(memcmp(y16, yr, n * 2), 0);
  gj_gelu_backward(g, NULL, r, x, 1, (int64_t)n);
  gj_bf16_round(gr, g, n);
  memcpy(dx, r, n * sizeof(float));
  gj_gelu_backward16(dx, g16, NULL, dx, x16, 1, (int64_t)n);
  ck_assert_int_eq(memcmp(dx, g, n * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(g16, gr, n * 2), 0);
  free(x), free(y), free(r), free(g), free(dx), free(xd), free(rd);
  free(x16), free(y16), free(yr), free(g16), free(gr);
}
END_TEST

/* ---- rotary ---- */
typedef struct { int64_t B, T, Hl, Hd, R, pos0; const double *r; } rot_ctx;
static void rot_ref(double *y, const double *x, const rot_ctx *c) {
  int64_t ld = c->Hl * c->Hd;
  memcpy(y, x, c->B * c->T * ld * sizeof(double));
  for (int64_t row = 0; row < c->B * c->T; row++)
    for (int64_t h = 0; h < c->Hl; h++)
      for (int64_t i = 0; i < c->R / 2; i++) {
        double th = (c->pos0 + row % c->T) * pow(10000.0, -2.0 * i / c->R);
        const double *v = x + row * ld + h * c->Hd;
        double *o = y + row * ld + h * c->Hd;
        o[2 * i] = v[2 * i] * cos(th) - v[2 * i + 1] * sin(th);
        o[2 * i + 1] = v[2 * i + 1] * cos(th) + v[2 * i] * sin(th);
      }
}
static double rot_loss(void *vc, double *x) {
  rot_ctx *c = vc;
  size_t n = c->B * c->T * c->Hl * c->Hd;
  double *y = tu_dalloc(n), s = 0;
  rot_ref(y, x, c);
  for (size_t i = 0; i < n; i++) s += y[i] * c->r[i];
  free(y);
  return s;
}

START_TEST(test_rotary) {
  rot_ctx c = {2, 9, 3, 10, 6, 5, NULL}; /* partial rotary: 6 of 10 dims, start at position 5 */
  const int64_t P = 64;
  size_t n = c.B * c.T * c.Hl * c.Hd;
  float *x = tu_falloc(n), *r = tu_falloc(n), *cs = tu_falloc(P * c.R / 2), *sn = tu_falloc(P * c.R / 2);
  double *xd = tu_dalloc(n), *yd = tu_dalloc(n), *rd = tu_dalloc(n), *gd = tu_dalloc(n);
  tu_fill(x, xd, n, 1.0);
  tu_fill(r, rd, n, 1.0);
  c.r = rd;
  gj_rotary_table(cs, sn, P, c.R);
  gj_rotary_forward(x, cs, sn, c.B, c.T, c.Hl, c.Hd, c.R, c.pos0, c.Hl * c.Hd);
  rot_ref(yd, xd, &c);
  ck_assert_double_le(tu_rel(x, yd, n), FWD_TOL);
  gj_rotary_backward(r, cs, sn, c.B, c.T, c.Hl, c.Hd, c.R, c.pos0, c.Hl * c.Hd);
  tu_fd(rot_loss, &c, xd, n, gd);
  ck_assert_double_le(tu_rel(r, gd, n), BWD_TOL);
  free(x), free(r), free(cs), free(sn), free(xd), free(yd), free(rd), free(gd);
  /* into bf16 (bf16 training's copies of q, k and of d q, d k): the float rotation rounded, bit
   * for bit, the input untouched; heads wider than a chunk of 512, rotary dims across chunk
   * edges, partial rotary, row by row (gj_rotary_row16, both ways) and into the head-major
   * layout (gj_rotary_heads16, forward) */
  static const int64_t hr[][2] = {{10, 6}, {64, 64}, {64, 16}, {1100, 1030}, {1100, 4}};
  for (size_t k = 0; k < sizeof hr / sizeof hr[0]; k++) {
    const int64_t B = 2, T = 3, Hl = 2, Hd = hr[k][0], R = hr[k][1], ld = Hl * Hd + 3, m = B * T * ld;
    float *d = tu_falloc(m), *d0 = tu_falloc(m), *ct = tu_falloc(8 * R / 2), *st = tu_falloc(8 * R / 2);
    gj_bf16 *o16 = calloc(m, 2), *r16 = calloc(m, 2);
    tu_fill(d, NULL, m, 2.0);
    memcpy(d0, d, m * sizeof(float));
    gj_rotary_table(ct, st, 8, R);
    for (int sign = -1; sign <= 1; sign += 2) {
      for (int64_t row = 0; row < B * T; row++)
        for (int64_t h = 0; h < Hl; h++)
          gj_rotary_row16(o16 + row * ld + h * Hd, d + row * ld + h * Hd, ct + (2 + row % T) * R / 2,
                          st + (2 + row % T) * R / 2, Hd, R, (float)sign);
      ck_assert_int_eq(memcmp(d, d0, m * sizeof(float)), 0);
      float *e = tu_falloc(m);
      memcpy(e, d, m * sizeof(float));
      if (sign < 0) gj_rotary_backward(e, ct, st, B, T, Hl, Hd, R, 2, ld);
      else gj_rotary_forward(e, ct, st, B, T, Hl, Hd, R, 2, ld);
      for (int64_t row = 0; row < B * T; row++) gj_bf16_round(r16 + row * ld, e + row * ld, (size_t)(Hl * Hd));
      for (int64_t row = 0; row < B * T; row++)
        ck_assert_int_eq(memcmp(o16 + row * ld, r16 + row * ld, Hl * Hd * 2), 0);
      if (sign > 0) { /* head-major, positions from 0 */
        memcpy(e, d, m * sizeof(float));
        gj_rotary_forward(e, ct, st, B, T, Hl, Hd, R, 0, ld);
        gj_attention_heads16(r16, e, B, T, Hl, Hd, ld);
        gj_rotary_heads16(o16, d, ct, st, B, T, Hl, Hd, R, ld);
        ck_assert_int_eq(memcmp(d, d0, m * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(o16, r16, B * T * Hl * Hd * 2), 0);
      }
      free(e);
    }
    free(d), free(d0), free(ct), free(st), free(o16), free(r16);
  }
}
END_TEST

/* ---- attention ---- */
typedef struct { int64_t B, T, Hl, Hd; const double *r; } att_ctx;
static void att_ref(double *out, double *lse, const double *q, const double *k, const double *v,
                    const att_ctx *c) {
  int64_t ld = c->Hl * c->Hd, T = c->T;
  double *s = tu_dalloc(T);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->Hl; h++)
      for (int64_t i = 0; i < T; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          double d = 0;
          for (int64_t e = 0; e < c->Hd; e++)
            d += q[(b * T + i) * ld + h * c->Hd + e] * k[(b * T + j) * ld + h * c->Hd + e];
          s[j] = d / sqrt((double)c->Hd);
          mx = s[j] > mx ? s[j] : mx;
        }
        for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - mx);
        if (lse) lse[(b * c->Hl + h) * T + i] = mx + log(sum);
        for (int64_t e = 0; e < c->Hd; e++) {
          double o = 0;
          for (int64_t j = 0; j <= i; j++) o += exp(s[j] - mx) / sum * v[(b * T + j) * ld + h * c->Hd + e];
          out[(b * T + i) * ld + h * c->Hd + e] = o;
        }
      }
  free(s);
}
static double att_loss(void *vc, double *th) {
  att_ctx *c = vc;
  size_t n = c->B * c->T * c->Hl * c->Hd;
  double *o = tu_dalloc(n), s = 0;
  att_ref(o, NULL, th, th + n, th + 2 * n, c);
  for (size_t i = 0; i < n; i++) s += o[i] * c->r[i];
  free(o);
  return s;
}

/* Attention forward and backward against the double reference within ftol and btol (tu_rel),
 * under the backend and precision set up; the queries of the last positions alone (a KV cache's
 * case) against the full result's rows; in bf16 also the output's bf16 copy (what bf16 training
 * keeps), equal to the output rounded, and backward reading it instead of the float output. */
static void check_attention_tol(int64_t B, int64_t T, int64_t Hl, int64_t Hd, int fd, double ftol,
                                double btol) {
  att_ctx c = {B, T, Hl, Hd, NULL};
  size_t n = B * T * Hl * Hd, ld = Hl * Hd;
  float *th = tu_falloc(3 * n), *o = tu_falloc(n), *lse = tu_falloc(B * Hl * T);
  float *r = tu_falloc(n), *g = tu_falloc(3 * n), *delta = tu_falloc(B * Hl * T);
  float *scratch = tu_falloc(gj_attention_scratch_floats(omp_get_max_threads(), T, Hd));
  double *thd = tu_dalloc(3 * n), *od = tu_dalloc(n), *lsed = tu_dalloc(B * Hl * T);
  double *rd = tu_dalloc(n), *gd = tu_dalloc(3 * n);
  tu_fill(th, thd, 3 * n, 2.0);
  tu_fill(r, rd, n, 1.0);
  c.r = rd;
  gj_attention_forward(o, NULL, lse, th, th + n, th + 2 * n, NULL, T, scratch, B, T, T, Hl, Hd, ld, ld,
                       T * ld, ld, T * ld);
  att_ref(od, lsed, thd, thd + n, thd + 2 * n, &c);
  ck_assert_double_le(tu_rel(o, od, n), ftol);
  ck_assert_double_le(tu_rel(lse, lsed, B * Hl * T), ftol);
  /* Queries for the last Tq positions against all Tk keys (the KV-cache case) equal the last
   * rows of the full computation. */
  int64_t Tq = T / 3 + 1;
  float *oq = tu_falloc(B * Tq * ld);
  gj_attention_forward(oq, NULL, NULL, th + (T - Tq) * ld, th + n, th + 2 * n, NULL, T, scratch, B, Tq, T,
                       Hl, Hd, ld, ld, T * ld, ld, T * ld);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < Tq; t++)
      for (size_t e = 0; e < ld; e++)
        ck_assert_float_eq_tol(oq[(b * Tq + t) * ld + e], o[(b * T + T - Tq + t) * ld + e], ftol);
  if (fd) {
    gj_attention_backward_prep(delta, NULL, r, o, NULL, B, T, Hl, Hd, ld);
    gj_attention_backward(g, g + n, g + 2 * n, NULL, r, delta, lse, th, th + n, th + 2 * n, NULL,
                          scratch, B, T, Hl, Hd, ld);
    tu_fd(att_loss, &c, thd, 3 * n, gd);
    for (int j = 0; j < 3; j++) ck_assert_double_le(tu_rel(g + j * n, gd + j * n, n), btol);
  }
  if (fd && gj_gemm_precision() == GJ_PREC_BF16) {
    gj_bf16 *o16 = calloc(n, sizeof(gj_bf16)), *r16 = calloc(n, sizeof(gj_bf16));
    gj_attention_forward(o, o16, lse, th, th + n, th + 2 * n, NULL, T, scratch, B, T, T, Hl, Hd, ld, ld,
                         T * ld, ld, T * ld);
    gj_bf16_round(r16, o, n);
    ck_assert(!memcmp(o16, r16, n * sizeof(gj_bf16)));
    /* the bf16 copy alone (bf16 training's: no float output): the same bits */
    memset(r16, 0, n * sizeof(gj_bf16));
    gj_attention_forward(NULL, r16, lse, th, th + n, th + 2 * n, NULL, T, scratch, B, T, T, Hl, Hd, ld, ld,
                         T * ld, ld, T * ld);
    ck_assert(!memcmp(o16, r16, n * sizeof(gj_bf16)));
    /* the first pass reading the output's bf16 copy, writing d out's head-major copy */
    gj_bf16 *r16h = calloc(n, sizeof(gj_bf16)), *e16h = calloc(n, sizeof(gj_bf16));
    gj_attention_backward_prep(delta, r16h, r, NULL, o16, B, T, Hl, Hd, ld);
    gj_attention_heads16(e16h, r, B, T, Hl, Hd, ld);
    ck_assert_int_eq(memcmp(r16h, e16h, n * sizeof(gj_bf16)), 0);
    free(r16h), free(e16h);
    gj_attention_backward(g, g + n, g + 2 * n, NULL, r, delta, lse, th, th + n, th + 2 * n, NULL,
                          scratch, B, T, Hl, Hd, ld);
    for (int j = 0; j < 3; j++) ck_assert_double_le(tu_rel(g + j * n, gd + j * n, n), btol);
    /* the gradients straight into bf16 (bf16 training's), d q and d k rotated back: the float
     * ones rotated back and rounded, bit for bit, the float outputs not written */
    const int64_t R = Hd > 2 ? (Hd - 2) / 2 * 2 : Hd;
    float *cs = tu_falloc(T * R / 2), *sn = tu_falloc(T * R / 2), *g2 = tu_falloc(3 * n);
    gj_bf16 *d16 = calloc(3 * n, sizeof(gj_bf16)), *e16 = calloc(3 * n, sizeof(gj_bf16));
    gj_rotary_table(cs, sn, T, R);
    for (size_t i = 0; i < 3 * n; i++) g2[i] = -1.0f;
    gj_attn_grad16 out16 = {d16, d16 + n, d16 + 2 * n, cs, sn, R};
    gj_attention_backward(g2, g2 + n, g2 + 2 * n, &out16, r, delta, lse, th, th + n, th + 2 * n,
                          NULL, scratch, B, T, Hl, Hd, ld);
    for (size_t i = 0; i < 3 * n; i++) ck_assert_float_eq(g2[i], -1.0f);
    for (int j = 0; j < 2; j++) gj_rotary_backward(g + j * n, cs, sn, B, T, Hl, Hd, R, 0, ld);
    gj_bf16_round(e16, g, 3 * n);
    ck_assert_int_eq(memcmp(d16, e16, 3 * n * sizeof(gj_bf16)), 0);
    free(cs), free(sn), free(g2), free(d16), free(e16);
    free(o16), free(r16);
  }
  free(th), free(o), free(lse), free(r), free(g), free(scratch), free(thd), free(od), free(lsed);
  free(rd), free(gd), free(oq), free(delta);
}

static void check_attention(int64_t B, int64_t T, int64_t Hl, int64_t Hd, int fd) {
  check_attention_tol(B, T, Hl, Hd, fd, FWD_TOL, BWD_TOL);
}
START_TEST(test_attention_small) { check_attention(2, 13, 3, 6, 1); }
END_TEST
START_TEST(test_attention_blocks) { check_attention(1, 2 * GJ_ATTN_QBLOCK + 3, 2, 4, 1); }
END_TEST
START_TEST(test_attention_forward_long) { check_attention(2, 3 * GJ_ATTN_QBLOCK + 17, 3, 8, 0); }
END_TEST

/* The backward's first pass on wide heads (more columns than it widens at once) in padded
 * rows: the row sums of d out * out per head against double sums, from the float output and
 * from its bf16 copy (the sums of d out times the rounded values), and d out's head-major
 * copy equal to gj_attention_heads16's. */
START_TEST(test_attention_prep) {
  const int64_t B = 2, T = 5, Hl = 2, Hd = 300, ld = Hl * Hd + 4, n = B * T * ld;
  float *dout = tu_falloc(n), *out = tu_falloc(n), *delta = tu_falloc(B * Hl * T);
  gj_bf16 *out16 = calloc(n, sizeof(gj_bf16)), *d16 = calloc(B * Hl * T * Hd, sizeof(gj_bf16));
  gj_bf16 *e16 = calloc(B * Hl * T * Hd, sizeof(gj_bf16));
  tu_fill(dout, NULL, n, 1.0);
  tu_fill(out, NULL, n, 2.0);
  gj_bf16_round(out16, out, n);
  for (int w = 0; w < 2; w++) {
    gj_attention_backward_prep(delta, w ? d16 : NULL, dout, w ? NULL : out, w ? out16 : NULL, B, T,
                               Hl, Hd, ld);
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hl; h++) {
          double ref = 0, mag = 0;
          for (int64_t d = 0; d < Hd; d++) {
            const size_t o = (size_t)(b * T + t) * ld + h * Hd + d;
            const double ov = w ? gj_bf16_to_f32(out16[o]) : out[o];
            ref += dout[o] * ov, mag += fabs(dout[o] * ov);
          }
          ck_assert_double_le(fabs(delta[(b * Hl + h) * T + t] - ref), 1e-6 * mag);
        }
  }
  gj_attention_heads16(e16, dout, B, T, Hl, Hd, ld);
  ck_assert_int_eq(memcmp(d16, e16, B * Hl * T * Hd * sizeof(gj_bf16)), 0);
  free(dout), free(out), free(delta), free(out16), free(d16), free(e16);
}
END_TEST

/* ---- embedding ---- */
/* bf16: the attention of the last Tq queries over keys and values held in a KV cache of Tc > Tk
 * positions per head (rounded in by gj_attention_heads16_at, in two pieces) equals the same
 * with dense head-major copies of these keys: the same bfloat16 operands, the same products. */
/* The same checks with the products on oneDNN (its kernels and the door's dense staging of
 * the tiles' strided destinations) in float32, and in bf16 against the double reference within
 * bf16's rounding (8u, u = 2^-8, the goldens' bound for gradients): the probabilities and dS
 * then go to the products as the softmax loops' bf16 copies where oneDNN reads bf16. */
START_TEST(test_attention_onednn) {
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_ONEDNN, GJ_PREC_F32), 0);
  check_attention(1, 2 * GJ_ATTN_QBLOCK + 3, 2, 4, 1);
  check_attention(2, 3 * GJ_ATTN_QBLOCK + 17, 3, 8, 0);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
}
END_TEST

START_TEST(test_attention_bf16) {
  ck_assert_int_eq(gj_gemm_setup(tu_bf16_hw() ? GJ_GEMM_AUTO : GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
  const double u = 1.0 / 256;
  check_attention_tol(1, 2 * GJ_ATTN_QBLOCK + 3, 2, 4, 1, 4 * u, 8 * u);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
}
END_TEST

START_TEST(test_attention_cache16) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  ck_assert_int_eq(gj_gemm_setup(f.amx_bf16 || f.avx512_bf16 ? GJ_GEMM_AUTO : GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
  const int64_t T = 2 * GJ_ATTN_QBLOCK + 9, Tq = 5, Hl = 3, Hd = 16, ld = Hl * Hd, Tc = T + 40;
  const int64_t t1 = T - Tq - 3; /* the cache filled by a prefill of t1 rows, then the rest */
  size_t n = (size_t)T * ld;
  float *th = tu_falloc(3 * n), *o1 = tu_falloc(Tq * ld), *o2 = tu_falloc(Tq * ld);
  float *scratch = tu_falloc(gj_attention_scratch_floats(omp_get_max_threads(), T, Hd));
  tu_fill(th, NULL, 3 * n, 2.0);
  gj_bf16 *dense = calloc(3 * n, sizeof(gj_bf16)), *cache = calloc(2 * Hl * Tc * Hd, sizeof(gj_bf16));
  const float *q = th + (T - Tq) * ld;
  gj_attention_heads16(dense, q, 1, Tq, Hl, Hd, ld);
  for (int j = 1; j < 3; j++) {
    gj_attention_heads16(dense + j * n, th + j * n, 1, T, Hl, Hd, ld);
    gj_bf16 *c = cache + (j - 1) * Hl * Tc * Hd;
    gj_attention_heads16_at(c, Tc, 0, th + j * n, 1, t1, Hl, Hd, ld);
    gj_attention_heads16_at(c, Tc, t1, th + j * n + t1 * ld, 1, T - t1, Hl, Hd, ld);
  }
  const gj_bf16 *d3[3] = {dense, dense + n, dense + 2 * n};
  const gj_bf16 *c3[3] = {dense, cache, cache + Hl * Tc * Hd};
  gj_attention_forward(o1, NULL, NULL, q, th + n, th + 2 * n, d3, T, scratch, 1, Tq, T, Hl, Hd, ld, ld,
                       Tq * ld, ld, T * ld);
  gj_attention_forward(o2, NULL, NULL, q, th + n, th + 2 * n, c3, Tc, scratch, 1, Tq, T, Hl, Hd, ld, ld,
                       Tq * ld, ld, T * ld); /* k and v are not read: their copies are given */
  ck_assert(!memcmp(o1, o2, Tq * ld * sizeof(float)));
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  free(th), free(o1), free(o2), free(scratch), free(dense), free(cache);
}
END_TEST

START_TEST(test_embedding) {
  const int64_t V = 17, D = 5, N = 11, v0 = 6, Vl = 7; /* this shard holds rows 6..12 */
  int32_t ids[11] = {0, 6, 12, 13, 7, 7, 16, 9, 6, 12, 3};
  float *wte = tu_falloc(Vl * D), *out = tu_falloc(N * D), *dout = tu_falloc(N * D);
  float *dw = tu_falloc(Vl * D);
  tu_fill(wte, NULL, Vl * D, 1.0);
  tu_fill(dout, NULL, N * D, 1.0);
  gj_embedding_forward(out, ids, wte, N, D, v0, Vl);
  double *ref = tu_dalloc(Vl * D);
  for (int64_t i = 0; i < N; i++) {
    int in = ids[i] >= v0 && ids[i] < v0 + Vl;
    for (int64_t j = 0; j < D; j++) {
      ck_assert_float_eq(out[i * D + j], in ? wte[(ids[i] - v0) * D + j] : 0.0f);
      if (in) ref[(ids[i] - v0) * D + j] += dout[i * D + j];
    }
  }
  gj_embedding_backward(dw, dout, ids, N, D, v0, Vl, NULL);
  ck_assert_double_le(tu_rel(dw, ref, Vl * D), 1e-6);
  /* from a bfloat16 table: the rows widened exactly, zeros outside the shard */
  gj_bf16 *w16 = calloc(Vl * D, sizeof(gj_bf16));
  gj_bf16_round(w16, wte, Vl * D);
  gj_embedding_forward16(out, ids, w16, N, D, v0, Vl);
  for (int64_t i = 0; i < N; i++) {
    int in = ids[i] >= v0 && ids[i] < v0 + Vl;
    for (int64_t j = 0; j < D; j++)
      ck_assert_float_eq(out[i * D + j], in ? gj_bf16_to_f32(w16[(ids[i] - v0) * D + j]) : 0.0f);
  }
  (void)V;
  free(wte), free(out), free(dout), free(dw), free(ref), free(w16);
}
END_TEST

/* ---- cross-entropy over two vocab shards ---- */
typedef struct { int64_t N, V; const int32_t *tg; double z; } ce_ctx;
static double ce_loss_d(void *vc, double *l) {
  ce_ctx *c = vc;
  double s = 0;
  for (int64_t i = 0; i < c->N; i++) {
    if (c->tg[i] < 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c->V; j++) mx = l[i * c->V + j] > mx ? l[i * c->V + j] : mx;
    for (int64_t j = 0; j < c->V; j++) sum += exp(l[i * c->V + j] - mx);
    double lz = mx + log(sum);
    s += lz - l[i * c->V + c->tg[i]] + c->z * lz * lz;
  }
  return s;
}

/* The shards' partial statistics combined as the model's head does (max all-reduce, rescale,
 * sum all-reduce) */
static double ce_two_shards(float *lse, float *shard[2], const int32_t *tg, int64_t N, int64_t Vl,
                            double zloss, int64_t *nv) {
  float *mx[2], *st[2], *gmx = tu_falloc(N);
  for (int s = 0; s < 2; s++) {
    mx[s] = tu_falloc(N), st[s] = tu_falloc(2 * N);
    gj_ce_stats(mx[s], st[s], shard[s], tg, N, Vl, s * Vl);
  }
  for (int64_t i = 0; i < N; i++) gmx[i] = fmaxf(mx[0][i], mx[1][i]);
  for (int s = 0; s < 2; s++) gj_ce_rescale(st[s], mx[s], gmx, N);
  for (int64_t i = 0; i < 2 * N; i++) st[0][i] += st[1][i];
  double loss = gj_ce_loss(lse, gmx, st[0], tg, N, (float)zloss, nv, NULL);
  for (int s = 0; s < 2; s++) free(mx[s]), free(st[s]);
  free(gmx);
  return loss;
}

static void check_ce(double zloss) {
  const int64_t N = 6, V = 22, Vl = V / 2;
  int32_t tg[6] = {3, 21, -1, 11, 10, 0};
  float *shard[2], lse[6];
  double *ld = tu_dalloc(N * V), *gd = tu_dalloc(N * V);
  float *full = tu_falloc(N * V);
  tu_fill(full, ld, N * V, 5.0);
  for (int s = 0; s < 2; s++) {
    shard[s] = tu_falloc(N * Vl);
    for (int64_t i = 0; i < N; i++) memcpy(shard[s] + i * Vl, full + i * V + s * Vl, Vl * sizeof(float));
  }
  int64_t nv;
  double loss = ce_two_shards(lse, shard, tg, N, Vl, zloss, &nv);
  ce_ctx c = {N, V, tg, zloss};
  double ref = ce_loss_d(&c, ld);
  ck_assert_int_eq(nv, 5);
  ck_assert_double_le(fabs(loss - ref) / fabs(ref), FWD_TOL);
  float *g = tu_falloc(N * V);
  for (int s = 0; s < 2; s++) {
    gj_ce_backward(shard[s], NULL, NULL, NULL, shard[s], lse, tg, N, Vl, s * Vl, 1.0f, (float)zloss);
    for (int64_t i = 0; i < N; i++) memcpy(g + i * V + s * Vl, shard[s] + i * Vl, Vl * sizeof(float));
  }
  tu_fd(ce_loss_d, &c, ld, N * V, gd);
  ck_assert_double_le(tu_rel(g, gd, N * V), BWD_TOL);
  for (int s = 0; s < 2; s++) free(shard[s]);
  free(ld), free(gd), free(full), free(g);
}

/* Rows longer than the kernels' column blocks, whose max comes late (the online sums are
 * rescaled) or first, a row whose first block is all -inf, one that is -inf over the whole
 * first shard, and an ignored row holding NaN: the loss, the gradient, its bfloat16 copy and
 * the bias gradient, from one pass each, against double references. */
START_TEST(test_crossentropy_blocks) {
  const int64_t N = 7, Vl = 1337, V = 2 * Vl;
  int32_t tg[7] = {5, 1400, -1, 2673, 700, 900, 2000};
  const float scale = 0.25f, zloss = 1e-3f;
  double *ld = tu_dalloc(N * V);
  float *full = tu_falloc(N * V), lse[7];
  tu_fill(full, ld, N * V, 3.0);
  for (int64_t j = 0; j < V; j++) { /* row 1: rising (the max in the last block); row 4: falling */
    full[1 * V + j] = (float)(ld[1 * V + j] = 0.01 * (double)j - 20.0);
    full[4 * V + j] = (float)(ld[4 * V + j] = -0.02 * (double)j);
  }
  for (int64_t j = 0; j < 600; j++) full[5 * V + j] = (float)(ld[5 * V + j] = -INFINITY);
  for (int64_t j = 0; j < Vl; j++) full[6 * V + j] = (float)(ld[6 * V + j] = -INFINITY);
  full[2 * V + 7] = NAN; /* an ignored row's logits are not looked at */
  float *shard[2];
  for (int s = 0; s < 2; s++) {
    shard[s] = tu_falloc(N * Vl);
    for (int64_t i = 0; i < N; i++) memcpy(shard[s] + i * Vl, full + i * V + s * Vl, Vl * sizeof(float));
  }
  int64_t nv;
  double loss = ce_two_shards(lse, shard, tg, N, Vl, zloss, &nv);
  ck_assert_int_eq(nv, 6);
  /* double reference: loss, d logits and the bias gradient (column sums of d) */
  double ref = 0, *dd = tu_dalloc(N * V), *db = tu_dalloc(V);
  for (int64_t i = 0; i < N; i++) {
    if (tg[i] < 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, ld[i * V + j]);
    for (int64_t j = 0; j < V; j++) sum += exp(ld[i * V + j] - mx);
    double z = mx + log(sum);
    ref += z - ld[i * V + tg[i]] + zloss * z * z;
    for (int64_t j = 0; j < V; j++) {
      dd[i * V + j] = scale * (exp(ld[i * V + j] - z) * (1 + 2 * zloss * z) - (j == tg[i]));
      db[j] += dd[i * V + j];
    }
  }
  ck_assert_double_le(fabs(loss - ref) / fabs(ref), FWD_TOL);
  float *d = tu_falloc(N * Vl), *bias = tu_falloc(Vl), *bias2 = tu_falloc(Vl), *bias3 = tu_falloc(Vl);
  float *inplace = tu_falloc(N * Vl);
  float *acc = tu_falloc(gj_ce_backward_scratch(omp_get_max_threads(), Vl));
  gj_bf16 *d16 = calloc(N * Vl, sizeof(gj_bf16)), *r16 = calloc(N * Vl, sizeof(gj_bf16));
  for (int s = 0; s < 2; s++) {
    memset(bias, 0, Vl * sizeof(float));
    for (int64_t j = 0; j < Vl; j++) bias2[j] = 1.0f; /* accumulates */
    gj_ce_backward(d, NULL, bias, acc, shard[s], lse, tg, N, Vl, s * Vl, scale, zloss);
    gj_ce_backward(NULL, d16, bias2, acc, shard[s], lse, tg, N, Vl, s * Vl, scale, zloss);
    gj_bf16_round(r16, d, N * Vl);
    /* all three outputs at once, the float over the logits (as float32 training does) */
    memcpy(inplace, shard[s], N * Vl * sizeof(float));
    memset(bias3, 0, Vl * sizeof(float));
    gj_ce_backward(inplace, d16 + 0, bias3, acc, inplace, lse, tg, N, Vl, s * Vl, scale, zloss);
    ck_assert(!memcmp(inplace, d, N * Vl * sizeof(float)));
    ck_assert(!memcmp(bias3, bias, Vl * sizeof(float)));
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < Vl; j++) {
        double r = dd[i * V + s * Vl + j];
        ck_assert_msg(fabs(d[i * Vl + j] - r) <= 1e-6 * scale + 1e-5 * fabs(r), "d[%lld, %lld] %g vs %g",
                      (long long)i, (long long)(s * Vl + j), d[i * Vl + j], r);
        ck_assert_uint_eq(d16[i * Vl + j], r16[i * Vl + j]);
      }
    for (int64_t j = 0; j < Vl; j++) { /* the column sums of d as written, added to dbias */
      double cs = 0, ca = 0;
      for (int64_t i = 0; i < N; i++) cs += d[i * Vl + j], ca += fabs(d[i * Vl + j]);
      ck_assert_msg(fabs(bias[j] - cs) <= 1e-6 * ca && fabs(cs - db[s * Vl + j]) <= 1e-5 * ca + 1e-7,
                    "dbias[%lld] %g vs %g (double %g)", (long long)(s * Vl + j), bias[j], cs, db[s * Vl + j]);
      ck_assert_msg(fabs(bias2[j] - (1.0 + bias[j])) <= 1e-6, "dbias[%lld] accumulated %g", (long long)j, bias2[j]);
    }
  }
  for (int s = 0; s < 2; s++) free(shard[s]);
  free(ld), free(full), free(dd), free(db), free(d), free(bias), free(bias2), free(bias3), free(inplace);
  free(acc), free(d16), free(r16);
}
END_TEST

/* gj_crc32 against zlib: every length up to 600 and random ones up to 100 kB at every
 * alignment, chained calls, and one buffer over 4 GB (zlib's 32-bit length split). */
START_TEST(test_crc32) {
  size_t n = 200000;
  unsigned char *buf = malloc(n);
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(tu_rand() * 1000);
  for (size_t len = 0; len <= 600; len++)
    for (size_t off = 0; off < 16; off += 5)
      ck_assert_uint_eq(gj_crc32(0, buf + off, len), crc32(0L, buf + off, (uInt)len));
  for (int t = 0; t < 300; t++) {
    size_t off = (size_t)(fabs(tu_rand()) * 64), len = (size_t)(fabs(tu_rand()) * 100000);
    uint32_t c0 = t % 3 ? 0 : (uint32_t)(fabs(tu_rand()) * 4e9);
    ck_assert_uint_eq(gj_crc32(c0, buf + off, len), crc32(c0, buf + off, (uInt)len));
    size_t cut = len / 3;
    ck_assert_uint_eq(gj_crc32(gj_crc32(c0, buf + off, cut), buf + off + cut, len - cut),
                      crc32(c0, buf + off, (uInt)len));
  }
  free(buf);
  size_t big = ((size_t)1 << 32) + 777;
  unsigned char *huge = malloc(big);
  if (huge) { /* skipped only when 4 GB cannot be had */
    for (size_t i = 0; i < big; i += 4096) huge[i] = (unsigned char)i;
    memset(huge, 7, 1 << 20);
    for (size_t i = 1 << 20; i < big; i += 4096) huge[i] = (unsigned char)(i >> 12);
    uLong z = crc32(0L, huge, 1u << 31);
    z = crc32(z, huge + (1u << 31), 1u << 31);
    z = crc32(z, huge + ((size_t)1 << 32), 777);
    ck_assert_uint_eq(gj_crc32(0, huge, big), z);
    free(huge);
  }
}
END_TEST

/* A NaN logit of a row that counts makes its sum NaN, wherever it sits: in every lane of the
 * first column block (the block max passes over a NaN unless it is the last of its lane, and a
 * NaN max had left the first block out: a finite loss), in a later block, and in a first block
 * that is otherwise all -inf. */
/* gj_expf against libm's expf: relative error of a few ulp over [-87, 88.37], 0 below its
 * range, infinity from 88.3763 on (expf from 88.7228; no undefined shift for any argument),
 * NaN stays NaN */
START_TEST(test_expf) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.37f; x += 0.0137f) {
    double e = expf(x), rel = fabs(gj_expf(x) - e) / e;
    worst = rel > worst ? rel : worst;
  }
  ck_assert_msg(worst < 1e-6, "gj_expf's relative error %g", worst);
  const float big[] = {88.3763f, 88.5f, 88.8f, 100.0f, 1e6f, 3e9f, 1e30f, INFINITY};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
    ck_assert_msg(isinf(gj_expf(big[i])) && gj_expf(big[i]) > 0, "gj_expf(%g) = %g", big[i], gj_expf(big[i]));
  ck_assert(gj_expf(-100.0f) < 1e-37f && gj_expf(-INFINITY) >= 0 && gj_expf(-INFINITY) < 1e-37f);
  ck_assert(isnan(gj_expf(NAN)));
}
END_TEST

START_TEST(test_crossentropy_nan) {
  const int64_t Vl = 1100, cols[] = {0, 1, 15, 17, 500, 510, 511, 512, 1023, 1099};
  const int64_t N = (int64_t)(sizeof cols / sizeof cols[0]) + 1;
  float *lg = tu_falloc(N * Vl), *mx = tu_falloc(N), *st = tu_falloc(2 * N);
  double *ld = tu_dalloc(N * Vl);
  int32_t *tg = calloc((size_t)N, sizeof *tg);
  tu_fill(lg, ld, N * Vl, 3.0);
  for (int64_t i = 0; i + 1 < N; i++) lg[i * Vl + cols[i]] = NAN;
  for (int64_t j = 0; j < 512; j++) lg[(N - 1) * Vl + j] = -INFINITY;
  lg[(N - 1) * Vl + 300] = NAN;
  /* the row with its NaN at 1023 (last of its lane in the second block): that block's other
   * logits far above the first's max (no exp of a large positive argument then) */
  for (int64_t j = 512; j < 1023; j++) lg[8 * Vl + j] = 200.0f;
  gj_ce_stats(mx, st, lg, tg, N, Vl, 0);
  for (int64_t i = 0; i < N; i++) {
    if (!isnan(st[i])) fprintf(stderr, "row %lld: NaN at column %lld, sum %g\n", (long long)i,
                                 (long long)(i + 1 < N ? cols[i] : 300), st[i]);
    ck_assert(isnan(st[i]));
  }
  free(lg), free(mx), free(st), free(ld), free(tg);
}
END_TEST

/* The hardware peak that MFU divides by is a ceiling: no product may run faster. One thread's
 * FMA peak (gj_peak_flops) against OpenBLAS's sgemm on 1024^3 (about 30 ms a call, longer than a
 * scheduler's time slice, as the peak's 20 ms rounds are), the best of each over rounds that
 * alternate the two, so that the machine's other load lowers both or neither. Idle, sgemm runs at 75-85% of
 * the peak. Beside the other lane of make check one best-of can still land in a quieter moment
 * than the other (a first version, timing 1.4 ms calls, read sgemm 80.7 against a peak of 58.4),
 * hence a margin of 2: what this guards against is a peak wrong many times over, as when the
 * sanitizers' instrumentation slowed the loop to 4-6 GFLOP/s against sgemm's 60-70 (every step's
 * MFU then came out above 1). */
START_TEST(test_peak_ceiling) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  ck_assert_msg(f.avx2, "no AVX2: gptj's peak loop needs AVX2 FMA (every CPU it targets has it)");
  enum { n = 1024 };
  float *a = tu_falloc((size_t)n * n), *b = tu_falloc((size_t)n * n), *c = tu_falloc((size_t)n * n);
  tu_fill(a, NULL, (size_t)n * n, 1.0), tu_fill(b, NULL, (size_t)n * n, 1.0);
  openblas_set_num_threads(1);
  double peak = 0, gemm = 0;
  const char *how = NULL;
  for (int round = 0; round < 3; round++) {
    peak = GJ_MAX(peak, gj_peak_flops(GJ_PREC_F32, 1, &how));
    for (int rep = 0; rep < 3; rep++) {
      double t0 = gj_now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double dt = gj_now() - t0;
      if (dt > 0) gemm = GJ_MAX(gemm, 2.0 * n * n * n / dt);
    }
  }
  openblas_set_num_threads(omp_get_max_threads());
  fprintf(stderr, "peak ceiling: %s %.1f GFLOP/s, OpenBLAS %s sgemm %d^3 on 1 thread %.1f GFLOP/s (%.0f%% of the peak)\n",
          how, peak / 1e9, gj_blas_core(), n, gemm / 1e9, 100 * gemm / peak);
  ck_assert_msg(gemm <= 2 * peak, "sgemm ran at %.1f GFLOP/s, above the peak of %.1f (%s): the peak is measured wrong",
                gemm / 1e9, peak / 1e9, how);
  free(a), free(b), free(c);
}
END_TEST

START_TEST(test_crossentropy) { check_ce(0.0); }
END_TEST
START_TEST(test_crossentropy_zloss) { check_ce(1e-2); }
END_TEST

int main(void) {
  Suite *s = suite_create("kernels");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_layernorm);
  tcase_add_test(tc, test_linear);
  tcase_add_test(tc, test_bf16_round);
  tcase_add_test(tc, test_gelu_bf16);
  tcase_add_test(tc, test_fused_colsums);
  tcase_add_test(tc, test_gemm_backends);
  tcase_add_test(tc, test_linear_bf16);
  tcase_add_test(tc, test_gemm_bf16_pieces);
  tcase_add_test(tc, test_bf16_rounded);
  tcase_add_test(tc, test_gemm_bf16_rows);
  tcase_add_test(tc, test_gemm_replay);
  tcase_add_test(tc, test_peak_ceiling);
  tcase_add_test(tc, test_gelu);
  tcase_add_test(tc, test_rotary);
  tcase_add_test(tc, test_attention_small);
  tcase_add_test(tc, test_attention_blocks);
  tcase_add_test(tc, test_attention_forward_long);
  tcase_add_test(tc, test_attention_prep);
  tcase_add_test(tc, test_attention_cache16);
  tcase_add_test(tc, test_embedding);
  tcase_add_test(tc, test_crc32);
  tcase_add_test(tc, test_crossentropy);
  tcase_add_test(tc, test_crossentropy_zloss);
  tcase_add_test(tc, test_crossentropy_blocks);
  tcase_add_test(tc, test_expf);
  tcase_add_test(tc, test_crossentropy_nan);
  tcase_add_test(tc, test_attention_onednn);
  tcase_add_test(tc, test_attention_bf16);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
