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
  tcase_add_test(tc, test_schedule);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
