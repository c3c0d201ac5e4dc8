/* Runs tests/golden-run on the golden file(s) (plain, and under mpirun with --tp 2 and 4) and
 * compares every output with the float64 reference: rel = ||cand - ref|| / ||ref|| at most 1e-5
 * for logits, loss and hidden states, 1e-4 for gradients and AdamW results; greedy ids exact.
 * In bf16 precision (bfloat16 GEMM operands, everything else float32) the bounds follow from
 * bfloat16's unit roundoff u = 2^-9: a product of two rounded operands errs by up to 2u, and
 * with independent rounding errors a sum of K such terms errs by about u relative to its norm,
 * whatever K. The forward passes through a few such products per layer (errors add, partly
 * cancel): 4u for logits, loss and hidden states; the gradients go through twice as many and
 * AdamW carries their relative error into the update: 8u for gradients and AdamW results.
 * (Measured on the tiny golden: 1.9u forward, 4.3u gradients, 3.4u after 3 AdamW steps.)
 * Greedy ids are not compared in bf16: a near-tie between two tokens may fall either way.
 * Also checks that bad inputs give one clear line and a non-zero exit. */
#include <check.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "io/h5util.h"
#include "model/params.h"
#include "testutil.h"

static char golden[1024], builddir[1024], mpirun[512];

static double *read_all_f64(hid_t f, const char *path, size_t *n) {
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  if (d < 0) return NULL;
  hid_t sp = H5Dget_space(d);
  *n = (size_t)H5Sget_simple_extent_npoints(sp);
  double *buf = tu_dalloc(*n);
  H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  H5Sclose(sp), H5Dclose(d);
  return buf;
}

/* rel error of one dataset, or -1 if missing / shapes differ. */
static double rel_of(hid_t cand, hid_t ref, const char *path) {
  size_t nc = 0, nr = 0;
  double *c = read_all_f64(cand, path, &nc), *r = read_all_f64(ref, path, &nr);
  double out = -1;
  if (c && r && nc == nr) {
    double num = 0, den = 0;
    for (size_t i = 0; i < nc; i++) num += (c[i] - r[i]) * (c[i] - r[i]), den += r[i] * r[i];
    out = den > 0 ? sqrt(num / den) : sqrt(num);
  }
  if (out < 0) fprintf(stderr, "missing or mis-shaped: %s\n", path);
  free(c), free(r);
  return out;
}

static int run_cmd(const char *cmd) {
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void check_golden_late(const char *ref_path, int tp, int recompute, int bf16, int late) {
  char out[1200], cmd[4096];
  const char *rc_flag = recompute ? (late ? "--recompute --late-head" : "--recompute") : late ? "--late-head" : "";
  const char *prec = bf16 ? tu_bf16() : "";
  const double U = 1.0 / 512, fwd_tol = bf16 ? 4 * U : 1e-5, bwd_tol = bf16 ? 8 * U : 1e-4;
  snprintf(out, sizeof out, "%s/tests/golden-out-tp%d%s%s%s.h5", builddir, tp, recompute ? "-rc" : "",
           bf16 ? "-bf16" : "", late ? "-late" : "");
  if (tp == 1)
    snprintf(cmd, sizeof cmd, "%s/tests/golden-run %s %s %s %s", builddir, rc_flag, prec, ref_path, out);
  else
    snprintf(cmd, sizeof cmd, "timeout -k 10 300 %s -np %d %s/tests/golden-run --tp %d %s %s %s %s", mpirun,
             tp, builddir, tp, rc_flag, prec, ref_path, out);
  ck_assert_int_eq(run_cmd(cmd), 0);

  gj_h5_quiet();
  hid_t r = H5Fopen(ref_path, H5F_ACC_RDONLY, H5P_DEFAULT), c = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert(r >= 0 && c >= 0);
  gj_config cfg;
  int64_t steps = 0;
  gj_h5_attr_i64(r, ref_path, "vocab_size", &cfg.vocab_size);
  gj_h5_attr_i64(r, ref_path, "n_embd", &cfg.n_embd);
  gj_h5_attr_i64(r, ref_path, "n_layer", &cfg.n_layer);
  gj_h5_attr_i64(r, ref_path, "n_head", &cfg.n_head);
  gj_h5_attr_i64(r, ref_path, "n_inner", &cfg.n_inner);
  hid_t ga = H5Gopen2(r, "adamw", H5P_DEFAULT);
  gj_h5_attr_i64(ga, ref_path, "steps", &steps);
  H5Gclose(ga);
  gj_layout lay;
  ck_assert_int_eq(gj_layout_build(&lay, &cfg, 1, 0), 0);

  double worst[6] = {0}; /* logits+loss, hidden, grads, step losses/norms, after_step */
  const char *group[6] = {"logits/loss", "hidden", "grads", "step loss/grad_norm", "after_step"};
  double rel;
  char path[256];
#define CHECK(g, p, tol)                                                                     \
  do {                                                                                       \
    rel = rel_of(c, r, p);                                                                   \
    ck_assert_msg(rel >= 0 && rel <= tol, "%s: rel %.3g > %g (tp %d)", p, rel, tol, tp);     \
    if (rel > worst[g]) worst[g] = rel;                                                      \
  } while (0)
  CHECK(0, "/outputs/logits", fwd_tol);
  CHECK(0, "/outputs/loss", fwd_tol);
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    snprintf(path, sizeof path, "/outputs/hidden_after_layer_%lld", (long long)l);
    CHECK(1, path, fwd_tol);
  }
  for (int i = 0; i < lay.n; i++) {
    snprintf(path, sizeof path, "/grads/%s", lay.t[i].name);
    CHECK(2, path, bwd_tol);
  }
  for (int64_t k = 1; k <= steps; k++) {
    snprintf(path, sizeof path, "/adamw/step_%lld/loss", (long long)k);
    CHECK(3, path, bwd_tol);
    snprintf(path, sizeof path, "/adamw/step_%lld/grad_norm", (long long)k);
    CHECK(3, path, bwd_tol);
  }
  for (int i = 0; i < lay.n; i++) {
    snprintf(path, sizeof path, "/adamw/after_step_%lld/%s", (long long)steps, lay.t[i].name);
    CHECK(4, path, bwd_tol);
  }
  size_t nc, nr;
  double *gc = read_all_f64(c, "/generate/greedy_ids", &nc), *gr = read_all_f64(r, "/generate/greedy_ids", &nr);
  ck_assert_ptr_nonnull(gc);
  ck_assert_int_eq(nc, nr);
  size_t same = 0;
  for (size_t i = 0; i < nc; i++) {
    if (!bf16) ck_assert_int_eq((int)gc[i], (int)gr[i]);
    same += gc[i] == gr[i];
  }
  printf("golden %s tp %d%s%s%s: max rel", ref_path, tp, recompute ? " recompute" : "", bf16 ? " bf16" : "",
         late ? " late head" : "");
  for (int g = 0; g < 5; g++) printf(" %s %.2e;", group[g], worst[g]);
  if (bf16) printf(" (%.1fu, %.1fu, %.1fu, %.1fu, %.1fu); greedy ids %zu/%zu equal\n", worst[0] / U,
                   worst[1] / U, worst[2] / U, worst[3] / U, worst[4] / U, same, nc);
  else printf(" greedy ids exact\n");
  free(gc), free(gr);
  gj_layout_free(&lay);
  H5Fclose(r), H5Fclose(c);
}

static void check_golden_prec(const char *ref_path, int tp, int recompute, int bf16) {
  check_golden_late(ref_path, tp, recompute, bf16, 0);
}

static void check_golden(const char *ref_path, int tp, int recompute) {
  check_golden_prec(ref_path, tp, recompute, 0);
}

START_TEST(test_golden_tp1) { check_golden(golden, 1, 0); }
END_TEST
START_TEST(test_golden_tp2) { check_golden(golden, 2, 0); }
END_TEST
START_TEST(test_golden_tp4) { check_golden(golden, 4, 0); }
END_TEST
START_TEST(test_golden_recompute) {
  check_golden(golden, 1, 1);
  check_golden(golden, 2, 1);
}
END_TEST

/* bf16 with the backend auto chooses; on a CPU without bf16 hardware on OpenBLAS (tu_bf16). */
START_TEST(test_golden_bf16) {
  check_golden_prec(golden, 1, 0, 1);
  check_golden_prec(golden, 2, 0, 1);
  check_golden_prec(golden, 1, 1, 1);
}
END_TEST

/* The AdamW steps with the head's weight gradient written late, at the same bounds. */
START_TEST(test_golden_late_head) {
  check_golden_late(golden, 1, 0, 0, 1);
  check_golden_late(golden, 2, 1, 0, 1);
  check_golden_late(golden, 1, 0, 1, 1);
}
END_TEST

/* Copy the golden file, then damage the copy with fn. */
static void make_bad(const char *dst, void (*fn)(hid_t)) {
  char cmd[3000];
  snprintf(cmd, sizeof cmd, "cp -f %s %s && chmod u+w %s", golden, dst, dst);
  ck_assert_int_eq(run_cmd(cmd), 0);
  hid_t f = H5Fopen(dst, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert(f >= 0);
  fn(f);
  H5Fclose(f);
}
static void drop_dataset(hid_t f) { H5Ldelete(f, "/weights/transformer.h.1.mlp.fc_in.weight", H5P_DEFAULT); }
static void wrong_shape(hid_t f) {
  H5Ldelete(f, "/weights/lm_head.bias", H5P_DEFAULT);
  hsize_t d = 7;
  hid_t sp = H5Screate_simple(1, &d, NULL);
  hid_t ds = H5Dcreate2(f, "/weights/lm_head.bias", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(ds), H5Sclose(sp);
}
static void bad_attr(hid_t f) {
  /* n_head that does not divide n_embd */
  int64_t v = 5;
  hid_t a = H5Aopen(f, "n_head", H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
}

/* Run golden-run on a bad input: non-zero exit, exactly one line on stderr containing want. */
static void expect_error(const char *in, const char *want) {
  char cmd[4096], errf[1200];
  snprintf(errf, sizeof errf, "%s/tests/golden-bad.err", builddir);
  snprintf(cmd, sizeof cmd, "%s/tests/golden-run %s %s/tests/golden-bad-out.h5 2>%s", builddir, in,
           builddir, errf);
  ck_assert_int_eq(run_cmd(cmd), 1);
  FILE *f = fopen(errf, "r");
  ck_assert_ptr_nonnull(f);
  char line[2048] = {0}, extra[2048];
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  ck_assert_msg(strstr(line, want) != NULL, "error '%s' does not mention '%s'", line, want);
  ck_assert_msg(fgets(extra, sizeof extra, f) == NULL, "more than one line of error output");
  fclose(f);
}

START_TEST(test_bad_inputs) {
  char p[1200];
  snprintf(p, sizeof p, "%s/tests/no-such-file.h5", builddir);
  expect_error(p, "no-such-file.h5: No such file");
  snprintf(p, sizeof p, "%s/tests", builddir);
  expect_error(p, "is a directory");
  snprintf(p, sizeof p, "%s/tests/not-hdf5.h5", builddir);
  FILE *f = fopen(p, "w");
  fputs("plain text\n", f);
  fclose(f);
  expect_error(p, "not an HDF5 file");
  snprintf(p, sizeof p, "%s/tests/golden-missing.h5", builddir);
  make_bad(p, drop_dataset);
  expect_error(p, "missing dataset '/weights/transformer.h.1.mlp.fc_in.weight'");
  snprintf(p, sizeof p, "%s/tests/golden-shape.h5", builddir);
  make_bad(p, wrong_shape);
  expect_error(p, "'/weights/lm_head.bias' should have shape");
  snprintf(p, sizeof p, "%s/tests/golden-attr.h5", builddir);
  make_bad(p, bad_attr);
  expect_error(p, "not divisible by n_head 5");
  /* a truncated file */
  char cmd[3000];
  snprintf(p, sizeof p, "%s/tests/golden-trunc.h5", builddir);
  snprintf(cmd, sizeof cmd, "head -c 100000 %s > %s", golden, p);
  ck_assert_int_eq(run_cmd(cmd), 0);
  expect_error(p, "golden-trunc.h5");
}
END_TEST

int main(void) {
  setenv("OMP_NUM_THREADS", "1", 1); /* up to 4 ranks share the cores */
  snprintf(builddir, sizeof builddir, "%s", tu_env("GJ_BUILDDIR", "."));
  snprintf(mpirun, sizeof mpirun, "%s", tu_env("GJ_MPIRUN", "mpirun"));
  const char *src = tu_env("GJ_SRCDIR", ".");
  snprintf(golden, sizeof golden, "%s/tests/golden/gptj-tiny.h5", src);
  if (getenv("GJ_GOLDEN")) snprintf(golden, sizeof golden, "%s", getenv("GJ_GOLDEN"));
  Suite *s = suite_create("golden");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_golden_tp1);
  tcase_add_test(tc, test_golden_tp2);
  tcase_add_test(tc, test_golden_tp4);
  tcase_add_test(tc, test_golden_recompute);
  tcase_add_test(tc, test_golden_bf16);
  tcase_add_test(tc, test_golden_late_head);
  tcase_add_test(tc, test_bad_inputs);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
