/* AdamW against a double-precision transcription of torch.optim.AdamW + clip_grad_norm_, and
 * the learning-rate schedule. */
#include <check.h>

#include <string.h>

#include "model/embedding.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "testutil.h"

START_TEST(test_adamw_kernel) {
  const size_t n = 37;
  float *p = tu_falloc(n), *g = tu_falloc(n), *m = tu_falloc(n), *v = tu_falloc(n);
  double *pd = tu_dalloc(n), *gd = tu_dalloc(n), *md = tu_dalloc(n), *vd = tu_dalloc(n);
  tu_fill(p, pd, n, 1.0);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 5; t++) {
    tu_fill(g, gd, n, 3.0);
    double coef = 0.7;
    for (size_t i = 0; i < n; i++) {
      double gi = gd[i] * coef;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] *= 1 - lr * wd;
      pd[i] -= lr / (1 - pow(b1, t)) * md[i] / (sqrt(vd[i]) / sqrt(1 - pow(b2, t)) + eps);
    }
    gj_adamw_kernel(p, g, m, v, n, (float)lr, b1, b2, (float)eps, (float)wd,
                    (float)(1 - pow(b1, t)), (float)sqrt(1 - pow(b2, t)), (float)coef);
  }
  ck_assert_double_le(tu_rel(p, pd, n), 1e-6);
  ck_assert_double_le(tu_rel(m, md, n), 1e-6);
  ck_assert_double_le(tu_rel(v, vd, n), 1e-6);
  free(p), free(g), free(m), free(v), free(pd), free(gd), free(md), free(vd);
}
END_TEST

/* gj_adamw_update over a layout against the same transcription: its own bias corrections from
 * the step count t (1, 2, 3), weight decay on the tensors that have it only (2-D weights, not
 * biases or LayerNorms), padding between tensors untouched, and a range that starts and ends
 * inside tensors (a ZeRO-1 share: m and v hold the range only). */
START_TEST(test_adamw_update) {
  gj_tensor t[3] = {{.offset = 0, .numel = 37, .decay = 1},
                    {.offset = 48, .numel = 13, .decay = 0},
                    {.offset = 64, .numel = 29, .decay = 1}};
  gj_layout l = {.t = t, .n = 3, .numel = 96};
  gj_adamw_hp hp;
  gj_adamw_defaults(&hp);
  const size_t ranges[2][2] = {{0, 96}, {10, 60}};
  for (int r = 0; r < 2; r++) {
    const size_t lo = ranges[r][0], n = ranges[r][1];
    float *p = tu_falloc(96), *g = tu_falloc(n), *m = tu_falloc(n), *v = tu_falloc(n);
    double *pd = tu_dalloc(96), *gd = tu_dalloc(n), *md = tu_dalloc(n), *vd = tu_dalloc(n);
    tu_fill(p, pd, 96, 1.0);
    for (int step = 1; step <= 3; step++) {
      const double lr = 1e-3 * step, coef = step == 2 ? 0.5 : 1.0;
      tu_fill(g, gd, n, 2.0);
      for (size_t i = 0; i < n; i++) {
        const size_t x = lo + i;
        int k = -1;
        for (int j = 0; j < 3; j++)
          if (x >= t[j].offset && x < t[j].offset + t[j].numel) k = j;
        if (k < 0) continue; /* padding */
        double gi = gd[i] * coef;
        md[i] = hp.beta1 * md[i] + (1 - hp.beta1) * gi;
        vd[i] = hp.beta2 * vd[i] + (1 - hp.beta2) * gi * gi;
        if (t[k].decay) pd[x] *= 1 - lr * hp.weight_decay;
        pd[x] -= lr / (1 - pow(hp.beta1, step)) * md[i] / (sqrt(vd[i]) / sqrt(1 - pow(hp.beta2, step)) + hp.eps);
      }
      gj_adamw_update(&l, p, g, NULL, m, v, lo, n, &hp, step, lr, coef);
    }
    ck_assert_double_le(tu_rel(p, pd, 96), 1e-6);
    ck_assert_double_le(tu_rel(m, md, n), 1e-6);
    ck_assert_double_le(tu_rel(v, vd, n), 1e-6);
    free(p), free(g), free(m), free(v), free(pd), free(gd), free(md), free(vd);
  }
}
END_TEST

START_TEST(test_clip) {
  ck_assert_double_eq_tol(gj_clip_coef(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  ck_assert_double_eq(gj_clip_coef(0.5, 1.0), 1.0);
  ck_assert_double_eq(gj_clip_coef(100.0, 0.0), 1.0); /* clipping off */
}
END_TEST

/* The squared gradient norm over a range of the block: every tensor's elements in the range,
 * a replicated tensor on TP rank 0 only, against a long-double sum; sizes not multiples of
 * the kernel's lanes or chunks, a range that cuts tensors. */
START_TEST(test_grad_sumsq) {
  gj_tensor t[3] = {{.shard = GJ_SHARD_ROWS, .offset = 0, .numel = 200003},
                    {.shard = GJ_SHARD_NONE, .offset = 200016, .numel = 37},
                    {.shard = GJ_SHARD_COLS, .offset = 200064, .numel = 70001}};
  gj_layout l = {.t = t, .n = 3, .numel = 270080};
  float *g = tu_falloc(l.numel);
  for (size_t i = 0; i < l.numel; i++) g[i] = (float)(((i * 2654435761u) % 20001) / 10000.0 - 1.0);
  const size_t ranges[][2] = {{0, l.numel}, {5, 200030}, {200020, 70000}, {199999, 1}};
  for (int tp_rank = 0; tp_rank < 2; tp_rank++)
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
      const size_t lo = ranges[r][0], n = ranges[r][1];
      long double want = 0;
      for (int k = 0; k < 3; k++) {
        if (t[k].shard == GJ_SHARD_NONE && tp_rank) continue;
        for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++)
          if (i >= lo && i < lo + n) want += (long double)g[i] * g[i];
      }
      double got = gj_grad_sumsq(&l, g + lo, NULL, tp_rank, lo, n);
      ck_assert_double_eq_tol(got, (double)want, 1e-12 * (double)want + 1e-300);
    }
  /* gj_grad_huge: elements of 9e18 (a sum of squares past 1e38, no element of 1e19) are not
   * huge; one of -1e19 is, in the ranges that hold it only */
  for (size_t i = 1000; i < 3000; i++) g[i] = 9e18f;
  g[200070] = -1e19f;
  for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
    const size_t lo = ranges[r][0], n = ranges[r][1];
    int want = lo <= 200070 && 200070 < lo + n;
    ck_assert_int_eq(gj_grad_huge(&l, g + lo, NULL, lo, n, gj_grad_sumsq(&l, g + lo, NULL, 0, lo, n)), want);
  }
  ck_assert_int_eq(gj_grad_huge(&l, g, NULL, 0, 200000, gj_grad_sumsq(&l, g, NULL, 0, 0, 200000)), 0);
  ck_assert(gj_grad_sumsq(&l, g, NULL, 0, 0, 200000) > 1e38);
  free(g);
}
END_TEST

/* The embedding's gradient as rows (model/rowgrad.h) gives the dense tensor's sum of squares
 * and AdamW update bit for bit, over ranges that start and end mid-row (a ZeRO-1 share), cross
 * the norm's 65,536-element chunks and run on into the next tensor: 1,000 rows of 203 floats,
 * 300 of them held (added in two micro-batches, the second growing the set). */
START_TEST(test_rows_as_dense) {
  enum { V = 1000, D = 203, N = 150 };
  gj_tensor t[2] = {{.shard = GJ_SHARD_ROWS, .offset = 0, .numel = V * D, .decay = 1},
                    {.shard = GJ_SHARD_NONE, .offset = V * D, .numel = 4001}};
  gj_layout l = {.t = t, .n = 2, .numel = V * D + 4001};
  gj_rowgrad r;
  ck_assert_int_eq(gj_rowgrad_create(&r, V, D, 2 * N), 0);
  float *g = tu_falloc(l.numel), *dout = tu_falloc(N * D);
  int32_t ids[N];
  for (size_t i = V * D; i < l.numel; i++) g[i] = (float)(((i * 40503u) % 2001) / 1000.0 - 1.0);
  for (int mb = 0; mb < 2; mb++) {
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + mb * 500 + (i % 3) * 11) % V) + 5; /* v0 5 */
    for (size_t i = 0; i < N * D; i++) dout[i] = (float)((((i + mb) * 2654435761u) % 20001) / 10000.0 - 1.0);
    ck_assert_int_eq(gj_rowgrad_add(&r, dout, ids, N, 5), 0);
    gj_embedding_backward(g, dout, ids, N, D, 5, V, NULL);
  }
  ck_assert(r.n > N && r.n <= 2 * N);
  for (int64_t i = 1; i < r.n; i++) ck_assert_int_lt(r.row[i - 1], r.row[i]);
  /* a huge element in a held row (element 7 of the 11th), as rows and dense */
  r.g[10 * D + 7] *= 3e19f;
  g[(size_t)r.row[10] * D + 7] *= 3e19f;
  const size_t ranges[][2] = {{0, l.numel}, {5, 150007}, {70000, 100}, {130001, 76000}, {V * D - 1, 2}};
  gj_adamw_hp hp;
  gj_adamw_defaults(&hp);
  for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
    const size_t lo = ranges[k][0], n = ranges[k][1];
    double dense = gj_grad_sumsq(&l, g + lo, NULL, 0, lo, n), rows = gj_grad_sumsq(&l, g + lo, &r, 0, lo, n);
    ck_assert_msg(memcmp(&dense, &rows, sizeof dense) == 0, "range %zu: sumsq %.17g rows, %.17g dense", k, rows, dense);
    ck_assert_int_eq(gj_grad_huge(&l, g + lo, &r, lo, n, 1e40), gj_grad_huge(&l, g + lo, NULL, lo, n, 1e40));
    float *p[2], *m[2], *v[2];
    for (int j = 0; j < 2; j++) {
      p[j] = tu_falloc(l.numel), m[j] = tu_falloc(n), v[j] = tu_falloc(n);
      for (size_t i = 0; i < l.numel; i++) p[j][i] = (float)((i % 97) / 97.0 - 0.5);
      for (size_t i = 0; i < n; i++) m[j][i] = (float)((i % 13) / 130.0), v[j][i] = (float)((i % 7) / 700.0);
      gj_adamw_update(&l, p[j], g + lo, j ? &r : NULL, m[j], v[j], lo, n, &hp, 3, 1e-3, 0.5);
    }
    ck_assert_msg(memcmp(p[0], p[1], l.numel * sizeof(float)) == 0, "range %zu: weights", k);
    ck_assert_msg(memcmp(m[0], m[1], n * sizeof(float)) == 0 && memcmp(v[0], v[1], n * sizeof(float)) == 0,
                  "range %zu: moments", k);
    for (int j = 0; j < 2; j++) free(p[j]), free(m[j]), free(v[j]);
  }
  gj_rowgrad_clear(&r);
  ck_assert_int_eq(r.n, 0);
  for (int i = 0; i < V; i++) ck_assert_int_eq(r.slot[i], -1);
  gj_rowgrad_free(&r);
  free(g), free(dout);
}
END_TEST

START_TEST(test_schedule) {
  gj_schedule s = {1e-3, 10, 110, 0.1};
  ck_assert_double_eq_tol(gj_schedule_lr(&s, 1), 1e-4, 1e-15);
  ck_assert_double_eq_tol(gj_schedule_lr(&s, 10), 1e-3, 1e-15);
  ck_assert_double_eq_tol(gj_schedule_lr(&s, 60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-12);
  ck_assert_double_eq_tol(gj_schedule_lr(&s, 110), 1e-4, 1e-15);
  ck_assert_double_eq_tol(gj_schedule_lr(&s, 5000), 1e-4, 1e-15);
  for (int t = 11; t < 110; t++) ck_assert(gj_schedule_lr(&s, t + 1) <= gj_schedule_lr(&s, t));
  gj_schedule flat = {2e-4, 0, 0, 0.0};
  ck_assert_double_eq(gj_schedule_lr(&flat, 1), 2e-4);
  ck_assert_double_eq(gj_schedule_lr(&flat, 99999), 2e-4);
}
END_TEST

int main(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("optim");
  tcase_add_test(tc, test_adamw_kernel);
  tcase_add_test(tc, test_adamw_update);
  tcase_add_test(tc, test_clip);
  tcase_add_test(tc, test_grad_sumsq);
  tcase_add_test(tc, test_rows_as_dense);
  tcase_add_test(tc, test_schedule);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
