/* AdamW against a double-precision transcription of torch.optim.AdamW + clip_grad_norm_, and
 * the learning-rate schedule. */
#include <check.h>

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
    gj_adamw_kernel(p, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                    (float)(1 - pow(b1, t)), (float)sqrt(1 - pow(b2, t)), (float)coef);
  }
  ck_assert_double_le(tu_rel(p, pd, n), 1e-6);
  ck_assert_double_le(tu_rel(m, md, n), 1e-6);
  ck_assert_double_le(tu_rel(v, vd, n), 1e-6);
  free(p), free(g), free(m), free(v), free(pd), free(gd), free(md), free(vd);
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
  free(g);
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
  tcase_add_test(tc, test_clip);
  tcase_add_test(tc, test_grad_sumsq);
  tcase_add_test(tc, test_schedule);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
