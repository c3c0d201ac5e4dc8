/* End-to-end training tests, each launching `gptj` (under mpirun where the layout needs it):
 * layout equivalence for (DP, TP) and over TCP, refusal of bad layouts, exact resume, resume on
 * other layouts, damaged checkpoints, signals, non-finite steps, and eval/generate. */
#include <check.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static char B_[1024], S_[1024], MPI_[512], DATA[1200], OUT[1200];

#define sh tu_sh

/* The loss of each step (out[k - 1] for step k), the last record of a step winning (a resumed
 * run logs again the steps after its checkpoint). Returns the number of records; *last (if
 * not NULL) is the last step seen. */
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
static int gptj(int np, const char *args, const char *log) {
  if (np == 0) return sh("timeout -k 10 300 %s/gptj %s >%s 2>&1", B_, args, log);
  return sh("timeout -k 10 300 %s -np %d %s/gptj %s >%s 2>&1", MPI_, np, B_, args, log);
}

static const char *COMMON = "--preset tiny --seq-len 32 --lr 1e-3 --warmup 3 --decay-steps 20 --seed 7";

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

static void expect_same(const double *ref, const double *got, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    double rel = fabs(got[i] - ref[i]) / fabs(ref[i]);
    ck_assert_msg(rel <= (i == 0 ? 1e-5 : 1e-4), "%s: step %d loss %.8g vs %.8g (rel %.2e)", what,
                  i + 1, got[i], ref[i], rel);
  }
}

/* bf16 precision: bfloat16 GEMM operands, float32 everything else. Layouts agree, bf16 tracks
 * float32, and checkpoints (float32 weights, the precision recorded) resume across precisions
 * and layouts. Bound: 8u, u = 2^-9 bfloat16's unit roundoff (as for the goldens' gradients and
 * AdamW results, test_golden.c): a loss is a forward of the current weights, whose relative
 * error after a few AdamW steps is of that order. */
static void expect_close(const double *ref, const double *got, int from, int n, const char *what) {
  for (int i = from; i < n; i++) {
    double rel = fabs(got[i] - ref[i]) / fabs(ref[i]);
    ck_assert_msg(rel <= 8.0 / 512, "%s: step %d loss %.8g vs %.8g (rel %.2e)", what, i + 1, got[i],
                  ref[i], rel);
  }
}

START_TEST(test_bf16) {
  double f32[64], b11[64], got[64];
  char bz[256];
  snprintf(bz, sizeof bz, "%s --zero 1", tu_bf16());
  run_layout("bf_f32", 1, 1, "", f32, 8);
  run_layout("bf_11", 1, 1, tu_bf16(), b11, 8);
  expect_close(f32, b11, 0, 8, "bf16 vs fp32");
  run_layout("bf_22", 2, 2, bz, got, 8);
  expect_close(b11, got, 0, 8, "bf16 (2,2) vs (1,1)");
  ck_assert_int_eq(sh("grep -q '^precision = bf16$' %s/bf_22/config.conf", OUT), 0);
  ck_assert_int_eq(sh("%s/gptj info %s/bf_22/ckpt-00000008.h5 | grep -q 'precision bf16'", B_, OUT), 0);
  /* bf16 checkpoint of step 4 at (2,2) -> fp32 at (1,2); fp32 of step 4 at (1,1) -> bf16 at (2,1) */
  run_layout("bf_b4", 2, 2, tu_bf16(), got, 4);
  run_layout("bf_f4", 1, 1, "", got, 4);
  struct { const char *from, *prec; int dp, tp; const double *ref; } rs[] = {
      {"bf_b4", "fp32", 1, 2, f32}, {"bf_f4", "bf16", 2, 1, b11}};
  for (int i = 0; i < 2; i++) {
    char args[2048], log[1400], run[1300];
    snprintf(run, sizeof run, "%s/bf_r%d", OUT, i);
    snprintf(log, sizeof log, "%s.log", run);
    sh("rm -rf %s && mkdir -p %s && cp %s/%s/ckpt-00000004.h5 %s/ && echo ckpt-00000004.h5 > %s/latest && cp %s/%s/metrics.jsonl %s/",
       run, run, OUT, rs[i].from, run, run, OUT, rs[i].from, run);
    snprintf(args, sizeof args, "train %s --data %s --steps 8 --micro-batch %d --tp %d --run-dir %s --resume auto %s",
             COMMON, DATA, 8 / rs[i].dp, rs[i].tp, run, strcmp(rs[i].prec, "bf16") ? "--precision fp32" : tu_bf16());
    int np = rs[i].dp * rs[i].tp, rc = gptj(np == 1 ? 0 : np, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(read_losses(run, got, 64, NULL), 8);
    expect_close(rs[i].ref, got, 4, 8, run);
  }
}
END_TEST

START_TEST(test_layouts) {
  double ref[64], got[64];
  run_layout("l11", 1, 1, "", ref, 20);
  struct { int dp, tp; const char *extra; } lay[] = {
      {2, 1, ""}, {1, 2, ""}, {2, 2, ""}, {4, 1, ""}, {1, 4, ""},
      {2, 2, "--grad-accum 4 --micro-batch 1"}, /* 1 x 4 x DP 2 = the same global batch */
      {2, 2, "--zero 1"}, {4, 1, "--zero 1"},
  };
  for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "l%d%d_%zu", lay[i].dp, lay[i].tp, i);
    run_layout(name, lay[i].dp, lay[i].tp, lay[i].extra, got, 20);
    expect_same(ref, got, 20, name);
  }
}
END_TEST

START_TEST(test_tcp) {
  double ref[64], got[64];
  run_layout("t11", 1, 1, "", ref, 20);
  char saved[512];
  snprintf(saved, sizeof saved, "%s", MPI_);
  snprintf(MPI_, sizeof MPI_, "%s --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo", saved);
  run_layout("t22", 2, 2, "", got, 20);
  snprintf(MPI_, sizeof MPI_, "%s", saved);
  expect_same(ref, got, 20, "tcp (2,2)");
}
END_TEST

START_TEST(test_bad_layout) {
  char args[2048], log[1400], line[2048];
  snprintf(log, sizeof log, "%s/badtp.log", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --tp 3 --run-dir %s/badtp", COMMON, DATA, OUT);
  ck_assert_int_ne(gptj(4, args, log), 0);
  FILE *f = fopen(log, "r");
  int errors = 0, found = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "error:")) errors++;
    if (strstr(line, "--tp 3 does not divide the number of ranks 4")) found = 1;
  }
  fclose(f);
  ck_assert_msg(found && errors == 1, "expected one error line naming --tp 3 and 4 ranks");
  /* TP that does not divide n_head (4) on 3 ranks */
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --tp 3 --run-dir %s/badtp", COMMON, DATA, OUT);
  ck_assert_int_ne(gptj(3, args, log), 0);
  ck_assert_int_eq(sh("grep -q -- '--tp 3 does not divide n_head 4' %s", log), 0);
}
END_TEST

/* 10 uninterrupted steps vs 5 + resume + 5 at (2,2): identical losses and parameters. */
START_TEST(test_resume_exact) {
  double a[64], b[64];
  run_layout("ra", 2, 2, "", a, 10);
  run_layout("rb", 2, 2, "", b, 5);
  char args[2048], log[1400], run[1300];
  snprintf(run, sizeof run, "%s/rb", OUT);
  snprintf(log, sizeof log, "%s/rb2.log", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 10 --micro-batch 4 --tp 2 --run-dir %s --resume auto",
           COMMON, DATA, run);
  ck_assert_int_eq(gptj(4, args, log), 0);
  ck_assert_int_eq(read_losses(run, b, 64, NULL), 10);
  for (int i = 0; i < 10; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
  /* parameters and moments bit-identical (h5diff without a tolerance: exact equality) */
  ck_assert_int_eq(sh("cd %s && for d in /model/lm_head.weight /model/transformer.h.1.mlp.fc_out.weight "
                      "/optim/exp_avg_sq/transformer.h.0.attn.q_proj.weight; do "
                      "h5diff -q ra/ckpt-00000010.h5 rb/ckpt-00000010.h5 $d $d || exit 1; done", OUT), 0);
}
END_TEST

/* A blend of two corpora, the second a directory of two shards: 10 steps at (2,2) equal 5 + a
 * resume at (2,2) + 5 exactly, and a resume at (1,4) with ZeRO-1 within the layout tolerance;
 * the checkpoint records the blend (gptj info shows it); a resume with other weights, or
 * with one corpus, is refused naming the difference. */
START_TEST(test_blend_resume) {
  double a[64], b[64];
  char spec[4096], args[6000], log[1400], run[1300];
  ck_assert_int_eq(sh("rm -rf %s/bl && mkdir -p %s/bl && %s/gptj tokenize --out %s/bl/b.h5 %s/data/brown-test.txt "
                      ">/dev/null && cp %s %s/bl/c.h5", OUT, OUT, B_, OUT, S_, DATA, OUT), 0);
  snprintf(spec, sizeof spec, "0.25:%s,0.75:%s/bl", DATA, OUT);
  const char *runs[] = {"ba", "bb"};
  const int steps[] = {10, 5};
  for (int i = 0; i < 2; i++) {
    snprintf(run, sizeof run, "%s/%s", OUT, runs[i]);
    snprintf(log, sizeof log, "%s.log", run);
    sh("rm -rf %s", run);
    snprintf(args, sizeof args, "train %s --data %s --steps %d --micro-batch 4 --tp 2 --run-dir %s --save-every 5",
             COMMON, spec, steps[i], run);
    ck_assert_int_eq(gptj(4, args, log), 0);
  }
  snprintf(run, sizeof run, "%s/ba", OUT);
  ck_assert_int_eq(read_losses(run, a, 64, NULL), 10);
  ck_assert_int_eq(sh("grep -q 'corpus 1: share 0.75, 2 shard(s)' %s/ba.log", OUT), 0);
  ck_assert_int_eq(sh("%s/gptj info %s/bb/ckpt-00000005.h5 > %s/bb.info && grep -q '^corpora: 2 (a blend)' %s/bb.info && "
                      "grep -q '^corpus 0: share 0.25, ' %s/bb.info && grep -q '^data: 0.25:' %s/bb.info",
                      B_, OUT, OUT, OUT, OUT, OUT), 0);
  sh("rm -rf %s/bz && cp -r %s/bb %s/bz", OUT, OUT, OUT);
  snprintf(run, sizeof run, "%s/bb", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 10 --micro-batch 4 --tp 2 --run-dir %s --resume auto",
           COMMON, spec, run);
  ck_assert_int_eq(gptj(4, args, "/dev/null"), 0);
  ck_assert_int_eq(read_losses(run, b, 64, NULL), 10);
  for (int i = 0; i < 10; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
  snprintf(run, sizeof run, "%s/bz", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 10 --micro-batch 8 --tp 4 --zero 1 --run-dir %s --resume auto",
           COMMON, spec, run);
  ck_assert_int_eq(gptj(4, args, "/dev/null"), 0);
  ck_assert_int_eq(read_losses(run, b, 64, NULL), 10);
  expect_same(a, b, 10, "blend resumed at (1,4) with ZeRO-1");
  /* other weights, or one corpus: refused */
  snprintf(log, sizeof log, "%s/bw.log", OUT);
  snprintf(spec, sizeof spec, "0.3:%s,0.7:%s/bl", DATA, OUT);
  sh("rm -rf %s/bw && cp -r %s/bz %s/bw", OUT, OUT, OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 12 --micro-batch 8 --run-dir %s/bw --resume auto",
           COMMON, spec, OUT);
  ck_assert_int_ne(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'corpus 0 has share 0.25 in the checkpoint, 0.29999' %s", log), 0);
  snprintf(args, sizeof args, "train %s --data %s --steps 12 --micro-batch 8 --run-dir %s/bw --resume auto",
           COMMON, DATA, OUT);
  ck_assert_int_ne(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'data order is of 2 corpora, this run.s --data has 1' %s", log), 0);
  /* the same files written otherwise (the directory's shards by name): resumed, with a warning
     that the --data text differs (shards reordered would pass the loader's checks too) */
  snprintf(spec, sizeof spec, "0.25:%s,0.75:%s/bl/b.h5+%s/bl/c.h5", DATA, OUT, OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 12 --micro-batch 8 --run-dir %s/bw --resume auto",
           COMMON, spec, OUT);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'warning: --data .* differs from the checkpoint.s 0.25:' %s", log), 0);
}
END_TEST

/* A checkpoint written at (2,2) resumes at (1,4), (4,1) and (1,1), with and without ZeRO-1
 * and compression on either side. */
START_TEST(test_resume_other_layouts) {
  double a[64], b[64];
  run_layout("xa", 2, 2, "", a, 8);
  run_layout("xb", 2, 2, "", b, 4);
  run_layout("xz", 2, 2, "--zero 1", b, 4);
  run_layout("xc", 2, 2, "--zero 1 --ckpt-compress 1", b, 4);
  struct { int dp, tp; const char *from, *extra; } lays[] = {
      {1, 4, "xb", ""}, {4, 1, "xb", ""}, {1, 1, "xb", ""}, {4, 1, "xb", "--zero 1"},
      {1, 1, "xz", ""}, {2, 2, "xz", "--zero 1"}, {1, 4, "xz", ""},
      {1, 1, "xc", ""}, {4, 1, "xc", "--zero 1 --ckpt-compress 6"}};
  for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
    char args[2048], log[1400], run[1300];
    snprintf(run, sizeof run, "%s/x%zu_%d%d", OUT, i, lays[i].dp, lays[i].tp);
    snprintf(log, sizeof log, "%s.log", run);
    sh("rm -rf %s && mkdir -p %s && cp %s/%s/ckpt-00000004.h5 %s/ && echo ckpt-00000004.h5 > %s/latest && cp %s/%s/metrics.jsonl %s/",
       run, run, OUT, lays[i].from, run, run, OUT, lays[i].from, run);
    int np = lays[i].dp * lays[i].tp;
    snprintf(args, sizeof args, "train %s --data %s --steps 8 --micro-batch %d --tp %d --run-dir %s --resume auto %s",
             COMMON, DATA, 8 / lays[i].dp, lays[i].tp, run, lays[i].extra);
    int rc = gptj(np == 1 ? 0 : np, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(read_losses(run, b, 64, NULL), 8);
    expect_same(a, b, 8, run);
  }
  /* The CRCs written from every layout are zlib's CRC-32 of the data (h5py + Python's zlib);
   * compressed files are chunked with shuffle + deflate. */
  ck_assert_int_eq(sh("cd %s && /usr/bin/python3 %s/tests/ckpt-check.py xb/ckpt-00000004.h5 "
                      "xz/ckpt-00000004.h5 x[0-7]_*/ckpt-00000008.h5", OUT, S_), 0);
  ck_assert_int_eq(sh("cd %s && /usr/bin/python3 %s/tests/ckpt-check.py --compressed "
                      "xc/ckpt-00000004.h5 x8_41/ckpt-00000008.h5", OUT, S_), 0);
}
END_TEST

START_TEST(test_damaged_checkpoints) {
  double a[64];
  run_layout("da", 1, 1, "--save-every 2 --keep-checkpoints 5", a, 6);
  char args[2048], log[1400], run[1300];
  snprintf(run, sizeof run, "%s/da", OUT);
  snprintf(log, sizeof log, "%s/da2.log", OUT);
  /* corrupt a byte in the middle of the newest checkpoint (tensor data) */
  sh("cd %s && f=ckpt-00000006.h5 && s=$(stat -c %%s $f) && printf '\\x55\\xaa' | dd of=$f bs=1 seek=$((s/2)) conv=notrunc status=none", run);
  snprintf(args, sizeof args, "train %s --data %s --steps 8 --micro-batch 8 --run-dir %s --resume auto --keep-checkpoints 5",
           COMMON, DATA, run);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'cannot resume from .*ckpt-00000006.h5' %s && grep -q 'resumed from .*ckpt-00000004.h5' %s", log, log), 0);
  /* a truncated checkpoint is refused with a message naming it */
  sh("cd %s && head -c 100000 ckpt-00000008.h5 > trunc.h5", run);
  snprintf(args, sizeof args, "train %s --data %s --steps 9 --run-dir %s --resume %s/trunc.h5", COMMON, DATA, run, run);
  ck_assert_int_ne(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'trunc.h5' %s", log), 0);
  /* a checkpoint of another model shape is refused naming the key */
  snprintf(args, sizeof args, "train %s --n_embd 128 --data %s --steps 9 --run-dir %s/other --resume %s/ckpt-00000008.h5",
           COMMON, DATA, OUT, run);
  ck_assert_int_ne(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'n_embd = 64, this run has 128' %s", log), 0);
}
END_TEST

/* kill -9 while checkpoints are being written: the last complete one stays loadable. */
START_TEST(test_kill_during_save) {
  char run[1300], log[1400], args[2048];
  snprintf(run, sizeof run, "%s/kill", OUT);
  snprintf(log, sizeof log, "%s/kill.log", OUT);
  sh("rm -rf %s", run);
  snprintf(args, sizeof args, "train %s --data %s --steps 100000 --micro-batch 8 --run-dir %s --save-every 1 --keep-checkpoints 2",
           COMMON, DATA, run);
  for (int trial = 0; trial < 3; trial++) {
    /* killed a moment after the first checkpoint of this trial exists (a fixed delay from the
     * start would depend on the machine's load), so that later ones are being written */
    sh("rm -f %s/latest; (setsid %s -np 2 %s/gptj %s --tp 2 --resume auto >>%s 2>&1 & echo $! > %s/pid) ; "
       "for i in $(seq 600); do test -f %s/latest && break; sleep 0.1; done; sleep %.2f; "
       "kill -9 -$(cat %s/pid) 2>/dev/null; sleep 0.5",
       run, MPI_, B_, args, log, OUT, run, 0.5 + 0.37 * trial, OUT);
    /* resume must find a good checkpoint and go on */
    char a2[2048];
    snprintf(a2, sizeof a2, "train %s --data %s --steps 1 --micro-batch 8 --run-dir %s --resume auto --keep-checkpoints 2",
             COMMON, DATA, run);
    ck_assert_int_eq(sh("test -f %s/latest", run), 0);
    int rc = gptj(0, a2, log);
    /* --steps 1 is behind the checkpoint's step: the run ends at once, after loading */
    ck_assert_msg(rc == 0, "resume after kill -9 failed (trial %d)", trial);
    ck_assert_int_eq(sh("grep -q 'resumed from' %s", log), 0);
  }
}
END_TEST

/* kill -9 of one rank: the job ends (no hang); --resume auto continues from the last
 * checkpoint with the trajectory of an uninterrupted run. */
START_TEST(test_kill_one_rank) {
  double ref[64], got[64];
  run_layout("k_ref", 2, 1, "", ref, 16);
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/k_one", OUT);
  snprintf(log, sizeof log, "%s/k_one.log", OUT);
  sh("rm -rf %s", run);
  int rc = sh("timeout 120 %s -np 2 %s/gptj train %s --data %s --steps 100000 --micro-batch 4 --save-every 4 "
              "--run-dir %s >%s 2>&1 & p=$!; for i in $(seq 300); do grep -q 'step 9/' %s 2>/dev/null && break; "
              "sleep 0.05; done; m=$(pgrep -P $p); kill -9 $(pgrep -P $m -x gptj | tail -1); "
              "s=$SECONDS; wait $p; e=$?; echo \"ended $e after $((SECONDS - s)) s\" >> %s; [ $e -ne 0 ] && [ $((SECONDS - s)) -lt 30 ]",
              MPI_, B_, COMMON, DATA, run, log, log, log);
  ck_assert_msg(rc == 0, "the job did not end promptly with an error after kill -9 of a rank");
  char args[2048];
  snprintf(args, sizeof args, "train %s --data %s --steps 16 --micro-batch 4 --save-every 4 --run-dir %s --resume auto",
           COMMON, DATA, run);
  ck_assert_int_eq(gptj(2, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'resumed from' %s", log), 0);
  int last;
  read_losses(run, got, 64, &last);
  ck_assert_int_eq(last, 16);
  for (int i = 0; i < 16; i++) ck_assert_msg(got[i] == ref[i], "step %d: %.9g vs %.9g", i + 1, got[i], ref[i]);
}
END_TEST

/* A full disk during a checkpoint write: a clear error and a non-zero exit on every rank, no
 * hang, the previous checkpoint intact and still `latest`, nothing under the new final name.
 * Needs a small tmpfs (root); elsewhere the case says it cannot run. */
START_TEST(test_disk_full) {
  char dir[1300], log[1400], args[2048];
  snprintf(dir, sizeof dir, "%s/smallfs", OUT);
  snprintf(log, sizeof log, "%s/full.log", OUT);
  sh("umount %s 2>/dev/null; mkdir -p %s", dir, dir);
  /* a tiny-model checkpoint is 79 MB: the first fits in 120 MB, the second does not */
  if (sh("mount -t tmpfs -o size=120m tmpfs %s 2>/dev/null", dir)) {
    fprintf(stderr, "test_disk_full: cannot mount a tmpfs here (not root?): case not run\n");
    return;
  }
  snprintf(args, sizeof args, "train %s --data %s --steps 4 --save-every 2 --keep-checkpoints 5 --micro-batch 4 --run-dir %s/run",
           COMMON, DATA, dir);
  int rc = gptj(2, args, log);
  int ok = rc != 0 && rc < 124 &&
           !sh("grep -q 'error:.*MB free, the checkpoint needs .*(disk full?)' %s", log) &&
           !sh("test -f %s/run/ckpt-00000002.h5 && ! test -e %s/run/ckpt-00000004.h5 && ! test -e %s/run/ckpt-00000004.h5.tmp", dir, dir, dir) &&
           !sh("grep -qx ckpt-00000002.h5 %s/run/latest", dir);
  /* the previous checkpoint still loads */
  snprintf(args, sizeof args, "info %s/run/ckpt-00000002.h5", dir);
  int info = gptj(0, args, log);
  sh("cat %s/full.log >&2; umount %s", OUT, dir);
  ck_assert_msg(ok, "disk full: exit %d, or the files/latest are wrong", rc);
  ck_assert_int_eq(info, 0);
}
END_TEST

START_TEST(test_signal_stop) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/sig", OUT);
  snprintf(log, sizeof log, "%s/sig.log", OUT);
  sh("rm -rf %s", run);
  int rc = sh("%s -np 2 %s/gptj train %s --data %s --steps 100000 --micro-batch 4 --run-dir %s >%s 2>&1 & p=$!; "
              "for i in $(seq 100); do grep -q 'step 3/' %s 2>/dev/null && break; sleep 0.1; done; kill -USR1 $p; wait $p",
              MPI_, B_, COMMON, DATA, run, log, log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'signal: stopped at step' %s && test -f %s/latest", log, run), 0);
}
END_TEST

/* The optimizer in backward (--optimizer-in-backward 1, --clip 0) equals the ordinary step
 * without clipping bit for bit: at (1,1) with bf16 and two micro-batches a step, and at (2,2);
 * the parameters and both moments of the head, a layer and the embedding are identical. A NaN
 * injected into the gradients skips the step whole, as the ordinary step does. */
START_TEST(test_optimizer_in_backward) {
  struct { int dp, tp; const char *extra; } lay[] = {
      {1, 1, "--clip 0 --grad-accum 2 --micro-batch 4"}, /* with tu_bf16() */
      {2, 2, "--clip 0"},
      {1, 1, "--clip 0 --debug-nan-step 3"}};
  for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
    double a[64], b[64];
    char base[512], extra[600];
    snprintf(base, sizeof base, "%s%s%s", lay[i].extra, i == 0 ? " " : "", i == 0 ? tu_bf16() : "");
    run_layout("ob_a", lay[i].dp, lay[i].tp, base, a, 6);
    snprintf(extra, sizeof extra, "%s --optimizer-in-backward 1", base);
    run_layout("ob_b", lay[i].dp, lay[i].tp, extra, b, 6);
    for (int k = 0; k < 6; k++)
      ck_assert_msg(a[k] == b[k], "%s: step %d: %.9g vs %.9g", extra, k + 1, a[k], b[k]);
    ck_assert_int_eq(sh("cd %s && for d in /model/lm_head.weight /model/transformer.ln_f.bias "
                        "/model/transformer.h.1.mlp.fc_out.weight /model/transformer.wte.weight "
                        "/optim/exp_avg/transformer.wte.weight /optim/exp_avg_sq/transformer.h.0.attn.q_proj.weight "
                        "/optim/exp_avg_sq/lm_head.bias; do "
                        "h5diff -q ob_a/ckpt-00000006.h5 ob_b/ckpt-00000006.h5 $d $d || { echo $d differs >&2; exit 1; }; done", OUT), 0);
    if (strstr(lay[i].extra, "nan"))
      ck_assert_int_eq(sh("grep -q 'step 3: non-finite.*update skipped' %s/ob_b.log", OUT), 0);
  }
}
END_TEST

/* The optimizer in backward with a non-finite gradient below the head: the parts above it are
 * already applied, so the step cannot be skipped. Train stops with one error that says so,
 * saves nothing (the last checkpoint is the one before), and a resume from it continues as
 * the uninterrupted run does, bit for bit; at TP 2 the shards agree. The part is out of range:
 * refused. */
START_TEST(test_oib_partial_nan) {
  for (int tp = 1; tp <= 2; tp++) {
    double ref[64], got[64];
    char args[2048], run[1300], log[1400];
    run_layout("op_ref", 1, tp, "--clip 0 --optimizer-in-backward 1 --save-every 2", ref, 6);
    snprintf(run, sizeof run, "%s/op_nan", OUT);
    snprintf(log, sizeof log, "%s.log", run);
    for (int pass = 0; pass < 2; pass++) {
      if (pass == 0) sh("rm -rf %s", run);
      snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch 8 --tp %d --run-dir %s --clip 0 "
               "--optimizer-in-backward 1 --save-every 2 %s", COMMON, DATA, tp, run,
               pass ? "--resume auto" : "--debug-nan-step 3 --debug-nan-part 2"); /* block 0 of 2 */
      int rc = gptj(tp == 1 ? 0 : tp, args, log);
      if (pass == 1) {
        if (rc) sh("cat %s >&2", log);
        ck_assert_int_eq(rc, 0);
        break;
      }
      ck_assert_int_eq(rc, 1);
      ck_assert_int_eq(sh("grep -q 'error: step 3: non-finite .*after part of the update was applied.*resume from the last checkpoint' %s", log), 0);
      ck_assert_int_eq(sh("grep -qx ckpt-00000002.h5 %s/latest && ! ls %s/ckpt-00000003.h5 2>/dev/null", run, run), 0);
    }
    ck_assert_int_eq(read_losses(run, got, 64, NULL), 6);
    for (int k = 0; k < 6; k++) ck_assert_msg(got[k] == ref[k], "tp %d step %d: %.9g vs %.9g", tp, k + 1, got[k], ref[k]);
  }
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/op_bad.log", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --run-dir %s/op_bad --debug-nan-part 4", COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 1);
  ck_assert_int_eq(sh("grep -q 'debug-nan-part 4: the network has parts 0 (the head) to 3 (the embedding)' %s", log), 0);
}
END_TEST

START_TEST(test_nan_steps) {
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/nan.log", OUT);
  sh("rm -rf %s/nan %s/nan2", OUT, OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch 8 --run-dir %s/nan --debug-nan-step 3",
           COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'step 3: non-finite' %s", log), 0);
  snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch 8 --run-dir %s/nan2 --debug-nan-step 3 --max-bad-steps 1",
           COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 1);
  ck_assert_int_eq(sh("grep -q 'non-finite steps in a row' %s", log), 0);
}
END_TEST

/* gptj bench on 2 DP ranks: its figures are there and sane, the GEMM efficiency taken pair by
 * pair from each measured step and the step's products replayed alone right after it. */
START_TEST(test_bench) {
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/bench.log", OUT);
  snprintf(args, sizeof args, "bench --preset tiny --seq-len 32 --micro-batch 2 --steps 3 --json %s/bench.json", OUT);
  int rc = gptj(2, args, log);
  if (rc) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'GEMM efficiency .*replayed alone right after each step' %s", log), 0);
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, sys; d = json.load(open('%s/bench.json')); "
                      "sys.exit(not (d['dp'] == 2 and d['step_s'] > 0 and d['gemm_replay_s'] > 0 and "
                      "d['gemm_replay_s'] < 3 * d['step_s'] and d['gemm_eff'] > 0 and d['gemm_eff_best'] > 0 and "
                      "d['gemm_best_flops_per_s'] > 0 and d['peak_rss_bytes'] > 0))\"", OUT), 0);
}
END_TEST

/* gptj plan in each precision: the layout line names it, the activations are sized for it (the
 * GPT-J-6B-width layer's differ), and the head's gradient written late is shown; a layout with
 * --grad-accum 2 keeps it as it was. */
START_TEST(test_plan_precision) {
  char args[2048], log[2][1400];
  const char *prec[2] = {"--precision fp32", tu_bf16()};
  double acts[2];
  for (int p = 0; p < 2; p++) {
    snprintf(log[p], sizeof log[p], "%s/plan%d.log", OUT, p);
    snprintf(args, sizeof args, "plan --preset gptj-6b --n_layer 1 --micro-batch 8 --seq-len 256 --sgemm-gflops 100 "
             "--mem-gbps 10 %s", prec[p]);
    ck_assert_int_eq(gptj(0, args, log[p]), 0);
    ck_assert_int_eq(sh("grep -q 'recompute off; %s$' %s", p ? "bf16" : "fp32", log[p]), 0);
    ck_assert_int_eq(sh("grep -q '^  activations .* GB (and .* GB in the vocabulary head.s gradient, written after "
                        "backward)$' %s", log[p]), 0);
    FILE *f = fopen(log[p], "r");
    char line[512];
    acts[p] = -1;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "  activations %lf GB", &acts[p]) == 1) break;
    if (f) fclose(f);
    ck_assert(acts[p] > 0);
  }
  ck_assert(acts[0] != acts[1]);
  snprintf(args, sizeof args, "plan --preset gptj-6b --n_layer 1 --micro-batch 8 --seq-len 256 --grad-accum 2 "
           "--sgemm-gflops 100 --mem-gbps 10");
  ck_assert_int_eq(gptj(0, args, log[0]), 0);
  ck_assert_int_ne(sh("grep -q 'vocabulary head' %s", log[0]), 0);
}
END_TEST

int main(void) {
  if (tu_gptj_setup(B_, S_, MPI_, OUT, DATA, sizeof MPI_, "train")) return 1;
  Suite *s = suite_create("train");
  /* "long": the many-layout and whole-process cases, whose code the others reach too */
  TU_ADD(s, test_layouts, "long", 900);
  TU_ADD(s, test_tcp, "long", 900);
  TU_ADD(s, test_bf16, NULL, 900);
  TU_ADD(s, test_plan_precision, NULL, 300);
  TU_ADD(s, test_bad_layout, NULL, 900);
  TU_ADD(s, test_resume_exact, NULL, 900);
  TU_ADD(s, test_resume_other_layouts, "long", 900);
  TU_ADD(s, test_blend_resume, "long", 900);
  TU_ADD(s, test_damaged_checkpoints, NULL, 900);
  TU_ADD(s, test_kill_during_save, "long", 900);
  TU_ADD(s, test_signal_stop, "long", 900);
  TU_ADD(s, test_kill_one_rank, "long", 900);
  TU_ADD(s, test_disk_full, NULL, 900);
  TU_ADD(s, test_nan_steps, NULL, 900);
  TU_ADD(s, test_optimizer_in_backward, NULL, 900);
  TU_ADD(s, test_oib_partial_nan, NULL, 900);
  TU_ADD(s, test_bench, NULL, 900);
  return tu_run(s);
}
