/* What the end-to-end training suites (test_train, test_resume) share: the paths of the build,
 * the sources, the launcher and the data; gptj launched with or without mpirun; a run of the
 * tiny model on a layout; and its losses read back from metrics.jsonl and compared. */
#ifndef GJ_TRAINUTIL_H
#define GJ_TRAINUTIL_H
#include <check.h>
#include <math.h>

#include "testutil.h"

static char B_[1024], S_[1024], MPI_[512], DATA[1200], OUT[1200];

#define sh tu_sh

/* The loss of each step (out[k - 1] for step k), the last record of a step winning (a resumed
 * run logs again the steps after its checkpoint). Returns the number of records; *last (if
 * not NULL) is the last step seen. */
static int read_losses(const char *run, double *out, int max, int *last) __attribute__((unused));
static int read_losses(const char *run, double *out, int max, int *last) {
  char p[1300];
  snprintf(p, sizeof p, "%s/metrics.jsonl", run);
  if (last) *last = 0;
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    char *st = strstr(line, "\"step\": "), *l = strstr(line, "\"loss\": ");
    if (!st || !l) continue;
    int k = atoi(st + 8);
    n++;
    if (k >= 1 && k <= max) out[k - 1] = atof(l + 8);
    if (last && k > *last) *last = k;
  }
  fclose(f);
  return n;
}

/* Launch gptj with np ranks (np 0: plain process). */
static int gptj(int np, const char *args, const char *log) __attribute__((unused));
static int gptj(int np, const char *args, const char *log) {
  if (np == 0) return sh("timeout -k 10 300 %s/gptj %s >%s 2>&1", B_, args, log);
  return sh("timeout -k 10 300 %s -np %d %s/gptj %s >%s 2>&1", MPI_, np, B_, args, log);
}

/* The datasets (space-separated) of two checkpoints of step `step` (run directories a, b under
 * OUT) hold the same bits (h5diff without a tolerance: exact equality); 0 if so, else the first
 * that differs is named on stderr. */
static int same_datasets(const char *a, const char *b, int step, const char *datasets) __attribute__((unused));
static int same_datasets(const char *a, const char *b, int step, const char *datasets) {
  return sh("cd %s && for d in %s; do h5diff -q %s/ckpt-%08d.h5 %s/ckpt-%08d.h5 $d $d || "
            "{ echo \"%s, %s: $d differs\" >&2; exit 1; }; done", OUT, datasets, a, step, b, step, a, b);
}

static const char *COMMON __attribute__((unused)) = "--preset tiny --seq-len 32 --lr 1e-3 --warmup 3 --decay-steps 20 --seed 7";

static void run_layout(const char *name, int dp, int tp, const char *extra, double *loss, int steps) __attribute__((unused));
static void run_layout(const char *name, int dp, int tp, const char *extra, double *loss, int steps) {
  char args[2048], run[1300], log[1400];
  snprintf(run, sizeof run, "%s/%s", OUT, name);
  snprintf(log, sizeof log, "%s/%s.log", OUT, name);
  sh("rm -rf %s", run);
  snprintf(args, sizeof args, "train %s --data %s --steps %d --micro-batch %d --tp %d --run-dir %s %s",
           COMMON, DATA, steps, 8 / dp, tp, run, extra);
  int rc = gptj(dp * tp == 1 ? 0 : dp * tp, args, log);
  if (rc) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(read_losses(run, loss, 64, NULL), steps);
}

/* A fresh tmpfs of mb MB at OUT/sub (its path into dir): 0, or 1 where none can be mounted
 * (not root), which the case then says, naming itself, and does not run. */
static int small_fs(char *dir, size_t n, const char *sub, int mb, const char *test) __attribute__((unused));
static int small_fs(char *dir, size_t n, const char *sub, int mb, const char *test) {
  snprintf(dir, n, "%s/%s", OUT, sub);
  sh("umount %s 2>/dev/null; mkdir -p %s", dir, dir);
  if (!sh("mount -t tmpfs -o size=%dm tmpfs %s 2>/dev/null", mb, dir)) return 0;
  fprintf(stderr, "%s: cannot mount a tmpfs here (not root?): case not run\n", test);
  return 1;
}

static void expect_same(const double *ref, const double *got, int n, const char *what) __attribute__((unused));
static void expect_same(const double *ref, const double *got, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    double rel = fabs(got[i] - ref[i]) / fabs(ref[i]);
    ck_assert_msg(rel <= (i == 0 ? 1e-5 : 1e-4), "%s: step %d loss %.8g vs %.8g (rel %.2e)", what,
                  i + 1, got[i], ref[i], rel);
  }
}

#endif
