/* Runs tests/golden-run on the golden file(s) (plain, and under mpirun with --tp 2 and 4) and
 * compares every output with the float64 reference: rel = ||cand - ref|| / ||ref|| at most 1e-5
 * for logits, loss and hidden states, 1e-4 for gradients and AdamW results; greedy ids exact.
 * In bf16 precision (bfloat16 GEMM operands, everything else float32) the bounds follow from
 * bfloat16's unit roundoff u = 2^-8 (8 significant bits): a rounded operand errs by at most u
 * relative, u/sqrt(3) in RMS, so a product of two rounded operands errs by about 0.8u, and with
 * independent rounding errors a sum of K such terms errs by about that relative to its norm,
 * whatever K. The forward passes through a few such products per layer (errors add, partly
 * cancel): 2u for logits, loss and hidden states; the gradients go through twice as many and
 * AdamW carries their relative error into the update: 4u for gradients and AdamW results.
 * (Measured on the tiny golden: 0.9u forward, 2.2u gradients, 1.8u after 3 AdamW steps.)
 * Except the q and k projections: their gradients pass through the softmax's backward,
 * dS = P (dP - r) with r = rowsum(P dP), which cancels. dP's rounding errors are relative to
 * P (|dP| + |r|), so relative to dS they grow by kappa = ||P (|dP| + |r|)|| / ||dS|| (>= 1; each
 * layer's kappa comes from the float64 reference, tests/golden/make-golden.py --kappa): dS errs
 * by about u (kappa + 1), and the two products after it (d q or d k, then the weight's
 * gradient) add u each, so their bound is u (kappa + 3) where that exceeds 4u. (Measured: on
 * a 3-layer, 2-head shape, kappa 4.5 and 4.45u, u kappa, against 7.5u; on the tiny golden kappa
 * is 2.1 and 2.6, and the bound stays 4u.)
 * Greedy ids are not compared in bf16: a near-tie between two tokens may fall either way.
 * Also checks that bad inputs give one clear line and a non-zero exit. */
#include <check.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common.h"
#include "io/h5util.h"
#include "model/params.h"
#include "testutil.h"

static char golden[1024], builddir[1024], srcdir[1024], mpirun[512];

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

/* Each layer's softmax-backward cancellation kappa of the golden file (make-golden.py --kappa),
 * into k[0 .. n_layer-1]. */
static void read_kappa(const char *ref_path, double *k, int64_t n_layer) {
  char cmd[4096], line[8192];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/golden/make-golden.py --kappa %s", srcdir, ref_path);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(strncmp(line, "kappa:", 6) == 0, "make-golden.py --kappa printed '%s'", line);
  char *s = line + 6, *e;
  for (int64_t l = 0; l < n_layer; l++, s = e) {
    k[l] = strtod(s, &e);
    ck_assert_msg(e != s && k[l] >= 1, "make-golden.py --kappa: layer %lld missing or below 1", (long long)l);
  }
}

/* The bf16 bound of a gradient or an AdamW result: 4u, and for the q and k projections of layer
 * l u (kappa_l + 3) where that is larger (see the top of the file). */
static double bf16_bound(const char *name, const double *kappa, int64_t n_layer, double U) {
  int l, end = 0;
  char which;
  if (sscanf(name, "transformer.h.%d.attn.%c_proj.weight%n", &l, &which, &end) == 2 && name[end] == 0 &&
      (which == 'q' || which == 'k') && l >= 0 && l < n_layer)
    return fmax(4 * U, U * (kappa[l] + 3));
  return 4 * U;
}

/* The sizes of the golden file's model that the parameter layout reads. */
static void read_cfg(const char *ref_path, gj_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  gj_h5_quiet();
  hid_t r = H5Fopen(ref_path, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert_msg(r >= 0, "cannot open %s", ref_path);
  ck_assert(gj_h5_attr_i64(r, ref_path, "vocab_size", &cfg->vocab_size) == 0 &&
            gj_h5_attr_i64(r, ref_path, "n_embd", &cfg->n_embd) == 0 &&
            gj_h5_attr_i64(r, ref_path, "n_layer", &cfg->n_layer) == 0 &&
            gj_h5_attr_i64(r, ref_path, "n_head", &cfg->n_head) == 0 &&
            gj_h5_attr_i64(r, ref_path, "n_inner", &cfg->n_inner) == 0);
  H5Fclose(r);
}

/* Whether TP tp splits the file's model, by gptj's own rule (gj_layout_build). A golden file given
 * by GJ_GOLDEN may have, say, 2 heads: TP 4 is then not a layout of that model (gptj refuses it
 * with one line, as bad-input.sh checks), and with report the test says so instead of failing. */
static int tp_splits(const char *ref_path, int tp, int report) {
  gj_config cfg;
  read_cfg(ref_path, &cfg);
  gj_layout lay;
  if (gj_layout_build(&lay, &cfg, tp, 0) == 0) {
    gj_layout_free(&lay);
    return 1;
  }
  if (report) printf("golden %s tp %d: not run: %s\n", ref_path, tp, gj_errmsg());
  gj_err_clear();
  return 0;
}
static int tp_fits(const char *ref_path, int tp) { return tp_splits(ref_path, tp, 1); }

static int run_cmd(const char *cmd) {
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void check_golden_late(const char *ref_path, int tp, int recompute, int bf16, int late) {
  char out[1200], cmd[4096];
  const char *rc_flag = recompute ? (late ? "--recompute --late-head" : "--recompute") : late ? "--late-head" : "";
  const char *prec = bf16 ? tu_bf16() : "";
  const double U = 1.0 / 256, fwd_tol = bf16 ? 2 * U : 1e-5, bwd_tol = bf16 ? 4 * U : 1e-4;
  /* named after the reference too: the shapes' cases do not write over the main file's outputs */
  const char *base = strrchr(ref_path, '/') ? strrchr(ref_path, '/') + 1 : ref_path;
  snprintf(out, sizeof out, "%s/tests/golden-out-%.*s-tp%d%s%s%s.h5", builddir, (int)strcspn(base, "."), base, tp,
           recompute ? "-rc" : "",
           bf16 ? "-bf16" : "", late ? "-late" : "");
  if (tp == 1)
    snprintf(cmd, sizeof cmd, "%s/tests/golden-run %s %s %s %s", builddir, rc_flag, prec, ref_path, out);
  else
    snprintf(cmd, sizeof cmd, "timeout -k 10 300 %s -np %d %s/tests/golden-run --tp %d %s %s %s %s", mpirun,
             tp, builddir, tp, rc_flag, prec, ref_path, out);
  ck_assert_int_eq(run_cmd(cmd), 0);

  gj_config cfg;
  read_cfg(ref_path, &cfg);
  hid_t r = H5Fopen(ref_path, H5F_ACC_RDONLY, H5P_DEFAULT), c = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert(r >= 0 && c >= 0);
  int64_t steps = 0;
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
  double *kappa = calloc((size_t)cfg.n_layer, sizeof(double));
  if (bf16) read_kappa(ref_path, kappa, cfg.n_layer);
#define TENSOR_TOL(name) (bf16 ? bf16_bound(name, kappa, cfg.n_layer, U) : bwd_tol)
  for (int i = 0; i < lay.n; i++) {
    snprintf(path, sizeof path, "/grads/%s", lay.t[i].name);
    CHECK(2, path, TENSOR_TOL(lay.t[i].name));
  }
  for (int64_t k = 1; k <= steps; k++) {
    snprintf(path, sizeof path, "/adamw/step_%lld/loss", (long long)k);
    CHECK(3, path, bwd_tol);
    snprintf(path, sizeof path, "/adamw/step_%lld/grad_norm", (long long)k);
    CHECK(3, path, bwd_tol);
  }
  for (int i = 0; i < lay.n; i++) {
    snprintf(path, sizeof path, "/adamw/after_step_%lld/%s", (long long)steps, lay.t[i].name);
    CHECK(4, path, TENSOR_TOL(lay.t[i].name));
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
  if (bf16) {
    printf(" (%.1fu, %.1fu, %.1fu, %.1fu, %.1fu); greedy ids %zu/%zu equal; kappa", worst[0] / U,
           worst[1] / U, worst[2] / U, worst[3] / U, worst[4] / U, same, nc);
    for (int64_t l = 0; l < cfg.n_layer; l++) printf(" %.2f", kappa[l]);
    printf("\n");
  }
  else printf(" greedy ids exact\n");
  free(gc), free(gr), free(kappa);
#undef TENSOR_TOL
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
START_TEST(test_golden_tp2) {
  if (tp_fits(golden, 2)) check_golden(golden, 2, 0);
}
END_TEST
START_TEST(test_golden_tp4) {
  if (tp_fits(golden, 4)) check_golden(golden, 4, 0);
}
END_TEST
START_TEST(test_golden_recompute) {
  check_golden(golden, 1, 1);
  if (tp_fits(golden, 2)) check_golden(golden, 2, 1);
}
END_TEST

/* tests/golden/make-golden.py, the float64 NumPy reference behind the other shapes below, must
 * first reproduce the golden file itself (to 1e-12, greedy ids equal). */
START_TEST(test_reference_check) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/golden/make-golden.py --check %s", srcdir, golden);
  ck_assert_int_eq(run_cmd(cmd), 0);
}
END_TEST

/* Golden files of other shapes, written by make-golden.py: rotary over the whole head and none at
 * all, odd T and B, 2 and 8 heads, an odd head dimension, n_inner not 4 D, vocabularies that are
 * not powers of two and two that TP does not divide (259 = 65 + 3 x 64 at TP 4, 97 = 49 + 48 at
 * TP 2), one and three layers, and T 70 with a vocabulary of 1100 (past the
 * attention's 64-query blocks and the cross-entropy's 512-column blocks, on one rank and split).
 * Each at TP 1 in fp32 and bf16, and at the largest TP of 2 and 4 that splits it, recomputing. */
START_TEST(test_golden_shapes) {
  static const struct {
    const char *name, *args;
  } shapes[] = {
      {"fullrot", "--V 256 --D 64 --layers 2 --heads 4 --rotary 16 --F 256 --B 2 --T 16 --seed 11"},
      {"oddT", "--V 259 --D 64 --layers 2 --heads 4 --rotary 8 --F 192 --B 3 --T 13 --seed 18"},
      {"h8", "--V 300 --D 64 --layers 2 --heads 8 --rotary 8 --F 160 --B 2 --T 11 --seed 13"},
      {"norot", "--V 97 --D 96 --layers 3 --heads 2 --rotary 0 --F 128 --B 2 --T 7 --seed 14"},
      {"hd15", "--V 128 --D 60 --layers 2 --heads 4 --rotary 6 --F 120 --B 2 --T 9 --seed 15"},
      {"long", "--V 1100 --D 32 --layers 1 --heads 2 --rotary 16 --F 64 --B 1 --T 70 --seed 16"},
  };
  char path[1200], cmd[4096];
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    snprintf(path, sizeof path, "%s/tests/golden-shape-%s.h5", builddir, shapes[i].name);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/golden/make-golden.py --out %s %s", srcdir, path,
             shapes[i].args);
    ck_assert_int_eq(run_cmd(cmd), 0);
    check_golden(path, 1, 0);
    check_golden_prec(path, 1, 0, 1);
    int tp = tp_splits(path, 4, 0) ? 4 : 2;
    ck_assert_msg(tp_fits(path, tp), "%s: choose a shape that TP 2 splits", shapes[i].name);
    check_golden(path, tp, 1);
  }
}
END_TEST

/* bf16 with the backend auto chooses; on a CPU without bf16 hardware on OpenBLAS (tu_bf16). */
START_TEST(test_golden_bf16) {
  check_golden_prec(golden, 1, 0, 1);
  if (tp_fits(golden, 2)) check_golden_prec(golden, 2, 0, 1);
  check_golden_prec(golden, 1, 1, 1);
}
END_TEST

/* The AdamW steps with the head's weight gradient written late, at the same bounds. */
START_TEST(test_golden_late_head) {
  check_golden_late(golden, 1, 0, 0, 1);
  if (tp_fits(golden, 2)) check_golden_late(golden, 2, 1, 0, 1);
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
/* The damage fits any golden file (GJ_GOLDEN may name one of another shape): block 0 exists in
 * every model, a bias of V + 1 entries is wrong for every V, and n_head = n_embd + 1 divides no
 * n_embd. */
static void drop_dataset(hid_t f) { H5Ldelete(f, "/weights/transformer.h.0.mlp.fc_in.weight", H5P_DEFAULT); }
static void wrong_shape(hid_t f) {
  int64_t V = 0;
  ck_assert_int_eq(gj_h5_attr_i64(f, "golden", "vocab_size", &V), 0);
  H5Ldelete(f, "/weights/lm_head.bias", H5P_DEFAULT);
  hsize_t d = (hsize_t)V + 1;
  hid_t sp = H5Screate_simple(1, &d, NULL);
  hid_t ds = H5Dcreate2(f, "/weights/lm_head.bias", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(ds), H5Sclose(sp);
}
static int64_t bad_heads; /* n_embd + 1 of the file bad_attr damaged */
static void bad_attr(hid_t f) {
  ck_assert_int_eq(gj_h5_attr_i64(f, "golden", "n_embd", &bad_heads), 0);
  bad_heads += 1;
  hid_t a = H5Aopen(f, "n_head", H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &bad_heads);
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
  expect_error(p, "missing dataset '/weights/transformer.h.0.mlp.fc_in.weight'");
  snprintf(p, sizeof p, "%s/tests/golden-shape.h5", builddir);
  make_bad(p, wrong_shape);
  expect_error(p, "'/weights/lm_head.bias' should have shape");
  snprintf(p, sizeof p, "%s/tests/golden-attr.h5", builddir);
  make_bad(p, bad_attr);
  char want[64];
  snprintf(want, sizeof want, "not divisible by n_head %lld", (long long)bad_heads);
  expect_error(p, want);
  /* a truncated file: its first half */
  char cmd[3000];
  struct stat st;
  ck_assert_int_eq(stat(golden, &st), 0);
  snprintf(p, sizeof p, "%s/tests/golden-trunc.h5", builddir);
  snprintf(cmd, sizeof cmd, "head -c %lld %s > %s", (long long)st.st_size / 2, golden, p);
  ck_assert_int_eq(run_cmd(cmd), 0);
  expect_error(p, "golden-trunc.h5");
}
END_TEST

int main(void) {
  setenv("OMP_NUM_THREADS", "1", 1); /* up to 4 ranks share the cores */
  snprintf(builddir, sizeof builddir, "%s", tu_env("GJ_BUILDDIR", "."));
  snprintf(mpirun, sizeof mpirun, "%s", tu_env("GJ_MPIRUN", "mpirun"));
  snprintf(srcdir, sizeof srcdir, "%s", tu_env("GJ_SRCDIR", "."));
  snprintf(golden, sizeof golden, "%s/tests/golden/gptj-tiny.h5", srcdir);
  if (getenv("GJ_GOLDEN") && *getenv("GJ_GOLDEN")) snprintf(golden, sizeof golden, "%s", getenv("GJ_GOLDEN"));
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
  tcase_add_test(tc, test_reference_check);
  tcase_add_test(tc, test_golden_shapes);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
