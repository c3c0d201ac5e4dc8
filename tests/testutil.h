/* Helpers shared by the Check suites: deterministic random data, relative errors, finite
 * differences in double precision, and locating the source and build trees. */
#ifndef GJ_TESTUTIL_H
#define GJ_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t tu_state = 88172645463325252ULL;
static inline double tu_rand(void) { /* uniform in [-1, 1) */
  tu_state ^= tu_state << 13, tu_state ^= tu_state >> 7, tu_state ^= tu_state << 17;
  return (double)(tu_state >> 11) / 4503599627370496.0 - 1.0;
}
static inline void tu_fill(float *f, double *d, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)(scale * tu_rand());
    if (f) f[i] = v;
    if (d) d[i] = v;
  }
}
/* ||a - b|| / ||b|| with a float, b double. */
static inline double tu_rel(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* Central differences of f at x (modified in place and restored). */
typedef double (*tu_fn)(void *ctx, double *x);
static inline void tu_fd(tu_fn f, void *ctx, double *x, size_t n, double *grad) {
  for (size_t i = 0; i < n; i++) {
    double x0 = x[i], h = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
    x[i] = x0 + h;
    double fp = f(ctx, x);
    x[i] = x0 - h;
    double fm = f(ctx, x);
    x[i] = x0;
    grad[i] = (fp - fm) / (2 * h);
  }
}
static inline double *tu_dalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }
static inline float *tu_falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static inline const char *tu_env(const char *name, const char *def) {
  const char *v = getenv(name);
  return v && *v ? v : def;
}

/* Run a shell command line (bash, printf-style); its exit status, or 128 + signal. */
static int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int tu_sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The flags that ask gptj for bf16 precision on this CPU: "--precision bf16" where the CPU has
 * AMX-BF16 or AVX512_BF16 (the backend auto chooses is then tested), else with "--gemm openblas",
 * the bf16 numerics on the float32 FMA units, the only bf16 path such a CPU runs (auto refuses
 * it there: test_kernels checks the refusal). */
static int tu_bf16_hw(void) __attribute__((unused));
static int tu_bf16_hw(void) {
  static int hw = -1;
  if (hw < 0) hw = tu_sh("grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo") == 0;
  return hw;
}
static const char *tu_bf16(void) __attribute__((unused));
static const char *tu_bf16(void) { return tu_bf16_hw() ? "--precision bf16" : "--precision bf16 --gemm openblas"; }

/* For suites that run gptj: one thread per rank (up to 4 ranks share the machine), the build
 * and source trees and the MPI launcher from the environment (buffers of n bytes), the
 * output directory tests/out/SUB (created) and DATA = OUT/valid.h5, the Brown validation text
 * tokenized. Nonzero on failure. */
static int tu_gptj_setup(char *B, char *S, char *M, char *out, char *data, size_t n, const char *sub)
    __attribute__((unused));
static int tu_gptj_setup(char *B, char *S, char *M, char *out, char *data, size_t n, const char *sub) {
  setenv("OMP_NUM_THREADS", "1", 1);
  snprintf(B, n, "%s", tu_env("GJ_BUILDDIR", "."));
  snprintf(S, n, "%s", tu_env("GJ_SRCDIR", "."));
  snprintf(M, n, "%s", tu_env("GJ_MPIRUN", "mpirun"));
  snprintf(out, n, "%s/tests/out/%s", B, sub);
  snprintf(data, n, "%s/valid.h5", out);
  tu_sh("mkdir -p %s", out);
  return tu_sh("%s/gptj tokenize --out %s %s/data/brown-valid.txt >/dev/null", B, data, S);
}

#ifdef CHECK_H
/* Add test t to s as a case of its own, named as the test (CK_RUN_CASE=test_x runs only it),
 * with a timeout and tags ("long": left out of the sanitizer build's run, CK_EXCLUDE_TAGS). */
#define TU_ADD(s, t, tags, timeout) tu_add((s), (t), #t, (tags), (timeout))

/* A shell fragment for sh(): wait (up to 60 s: a trainer's start takes over 10 s when make
 * check's suites load both cores) until the log (the next %s) has a line matching pat; if it
 * never comes, kill $p (the process waited for, if the fragment's caller has set it), say so
 * and exit 96, rather than go on as if it had come. */
#define WAIT_LOG(pat)                                                                        \
  "w=%s; for i in $(seq 1200); do grep -q '" pat "' $w 2>/dev/null && break; sleep 0.05; done; " \
  "grep -q '" pat "' $w 2>/dev/null || { kill $p 2>/dev/null; echo \"gave up after 60 s waiting for '" pat "' in $w\" >&2; exit 96; }; "
static void tu_add(Suite *s, const TTest *t, const char *name, const char *tags, int timeout)
    __attribute__((unused));
static void tu_add(Suite *s, const TTest *t, const char *name, const char *tags, int timeout) {
  TCase *tc = tcase_create(name);
  if (tags) tcase_set_tags(tc, tags);
  tcase_set_timeout(tc, timeout);
  tcase_add_test(tc, t);
  suite_add_tcase(s, tc);
}

/* Run one suite; the process exit code (0 if every test passed). */
static int tu_run(Suite *s) __attribute__((unused));
static int tu_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr), ran = srunner_ntests_run(sr);
  srunner_free(sr);
  /* a CK_RUN_CASE that names no case of this program runs nothing: not a pass */
  const char *only = getenv("CK_RUN_CASE");
  if (only && *only && ran == 0) {
    fprintf(stderr, "CK_RUN_CASE=%s: this program has no case of that name, nothing ran\n", only);
    failed = 1;
  }
  return failed ? 1 : 0;
}
#endif
#endif
