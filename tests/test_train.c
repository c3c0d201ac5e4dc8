/* End-to-end training tests, each launching `gptj` (under mpirun where the layout needs it):
 * layout equivalence for (DP, TP) and over TCP, bf16 beside float32 and across precisions,
 * refusal of bad layouts, the optimizer in backward, non-finite steps, bench and plan. Resume
 * and the faults of a run are test_resume's. */
#include <check.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trainutil.h"

/* bf16 precision: bfloat16 GEMM operands, float32 everything else. Layouts agree, bf16 tracks
 * float32, and checkpoints (float32 weights, the precision recorded) resume across precisions
 * and layouts. Bound: 4u, u = 2^-8 bfloat16's unit roundoff (as for the goldens' gradients and
 * AdamW results, test_golden.c): a loss is a forward of the current weights, whose relative
 * error after a few AdamW steps is of that order. */
static void expect_close(const double *ref, const double *got, int from, int n, const char *what) {
  for (int i = from; i < n; i++) {
    double rel = fabs(got[i] - ref[i]) / fabs(ref[i]);
    ck_assert_msg(rel <= 4.0 / 256, "%s: step %d loss %.8g vs %.8g (rel %.2e)", what, i + 1, got[i],
                  ref[i], rel);
  }
}

/* Two runs of `steps` steps (run directories under OUT) are the same bits: every loss, and the
 * final checkpoint's parameters and moments of the head, a layer and the embedding. 0 if so. */
static int same_ckpt(const char *a, const char *b, int steps) {
  double la[64], lb[64];
  char run[1300];
  snprintf(run, sizeof run, "%s/%s", OUT, a);
  if (read_losses(run, la, 64, NULL) != steps) return -1;
  snprintf(run, sizeof run, "%s/%s", OUT, b);
  if (read_losses(run, lb, 64, NULL) != steps) return -1;
  for (int k = 0; k < steps; k++)
    if (la[k] != lb[k]) return fprintf(stderr, "%s, %s: step %d: %.9g vs %.9g\n", a, b, k + 1, la[k], lb[k]), -1;
  return same_datasets(a, b, steps, "/model/lm_head.weight /model/transformer.h.1.mlp.fc_out.weight "
                       "/model/transformer.wte.weight /optim/exp_avg_sq/transformer.h.0.attn.q_proj.weight");
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
  ck_assert_int_eq(sh("grep -q 'ZeRO-1 gathers the GEMM weights in bf16' %s/bf_22.log", OUT), 0);
  /* with the sums reduced to their owners (at DP 2 one addition either way): the same bits */
  {
    char bo[300];
    snprintf(bo, sizeof bo, "%s --zero-reduce owner", bz);
    run_layout("bf_22o", 2, 2, bo, got, 8);
    ck_assert_int_eq(same_ckpt("bf_22", "bf_22o", 8), 0);
  }
  /* ZeRO-1 in bf16 gathers the GEMM weights in bf16, so a rank holds their exact float32
   * values only in its own range: the checkpoint has them exact, from each owner (4 steps,
   * then a resume to 8 at (2,2) is the uninterrupted run, bit for bit) */
  run_layout("bf_z4", 2, 2, bz, got, 4);
  {
    char args[2048], run[1300];
    snprintf(run, sizeof run, "%s/bf_zr", OUT);
    sh("rm -rf %s && mkdir -p %s && cp %s/bf_z4/ckpt-00000004.h5 %s/ && echo ckpt-00000004.h5 > %s/latest && "
       "cp %s/bf_z4/metrics.jsonl %s/", run, run, OUT, run, run, OUT, run);
    snprintf(args, sizeof args, "train %s --data %s --steps 8 --micro-batch 4 --tp 2 --run-dir %s --resume auto %s",
             COMMON, DATA, run, bz);
    ck_assert_int_eq(gptj(4, args, "/dev/null"), 0);
    ck_assert_int_eq(same_ckpt("bf_22", "bf_zr", 8), 0);
    /* the CRCs of the parameters written by their owners are zlib's of the data */
    ck_assert_int_eq(sh("cd %s && /usr/bin/python3 %s/tests/ckpt-check.py bf_22/ckpt-00000008.h5 "
                        "bf_zr/ckpt-00000008.h5", OUT, S_), 0);
  }
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
      {4, 1, "--dp-poll-us 0"}, /* no DP progress thread: the same sums */
      {4, 1, "--zero 1 --zero-reduce owner"}, {2, 2, "--zero 1 --zero-reduce owner"},
  };
  for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "l%d%d_%zu", lay[i].dp, lay[i].tp, i);
    run_layout(name, lay[i].dp, lay[i].tp, lay[i].extra, got, 20);
    expect_same(ref, got, 20, name);
  }
  /* the progress thread changes no bit: (4,1) with it (l41_3) and without (l41_8) */
  ck_assert_int_eq(same_ckpt("l41_3", "l41_8", 20), 0);
  /* the thread runs by default at DP > 1 (the log says so, config.conf has the interval) and
   * not with --dp-poll-us 0 */
  ck_assert_int_eq(sh("grep -q '^dp-poll-us = 1000$' %s/l21_0/config.conf && grep -q 'DP sums tested by a thread, 1000 us between tests' %s/l21_0.log",
                      OUT, OUT), 0);
  ck_assert_int_eq(sh("grep -q '^dp-poll-us = 0$' %s/l41_8/config.conf && grep -q 'no DP progress thread (--dp-poll-us 0)' %s/l41_8.log",
                      OUT, OUT), 0);
  /* ZeRO-1's sums reduced to their owners: at DP 2 each sum is one addition either way, so the
   * same bits as the all-reduces (l22_6); recorded, and said in the log */
  ck_assert_int_eq(same_ckpt("l22_6", "l22_10", 20), 0);
  ck_assert_int_eq(sh("grep -q '^zero-reduce = owner$' %s/l41_9/config.conf && grep -q '^zero-reduce = allreduce$' %s/l22_6/config.conf && "
                      "grep -q \"ZeRO-1's gradient sums reduced to each range's owner\" %s/l41_9.log", OUT, OUT, OUT), 0);
  /* --grad-reduce bf16 (the DP sums in bfloat16): within bf16's bound of the float32 run (as
   * bf16 precision, test_bf16), and not the same run: the option takes effect, and is recorded */
  struct { int dp, tp; const char *extra; } bl[] = {
      {4, 1, "--grad-reduce bf16"}, {2, 2, "--grad-reduce bf16 --zero 1"},
      {2, 2, "--grad-reduce bf16 --zero 1 --zero-reduce owner"}};
  for (size_t i = 0; i < sizeof bl / sizeof bl[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "lb%d%d_%zu", bl[i].dp, bl[i].tp, i);
    run_layout(name, bl[i].dp, bl[i].tp, bl[i].extra, got, 20);
    expect_close(ref, got, 0, 20, name);
    int same = 1;
    for (int k = 1; k < 20; k++) same &= got[k] == ref[k];
    ck_assert_msg(!same, "%s: the losses of the float32 sums", name);
    ck_assert_int_eq(sh("grep -q '^grad-reduce = bf16$' %s/%s/config.conf && grep -q 'gradients summed over DP in bf16' %s/%s.log",
                        OUT, name, OUT, name), 0);
  }
  /* the bf16 sums reduced to their owners: at DP 2 the same bits as all-reduced */
  ck_assert_int_eq(same_ckpt("lb22_1", "lb22_2", 20), 0);
}
END_TEST

START_TEST(test_tcp) {
  double ref[64], got[64];
  run_layout("t11", 1, 1, "", ref, 20);
  char saved[512];
  snprintf(saved, sizeof saved, "%s", MPI_);
  snprintf(MPI_, sizeof MPI_, "%s --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo", saved);
  run_layout("t22", 2, 2, "", got, 20);
  expect_same(ref, got, 20, "tcp (2,2)");
  /* over the sockets, where the DP progress thread moves the sums on: the same bits without it
   * and with a microsecond's sleep between its tests */
  run_layout("t22n", 2, 2, "--dp-poll-us 0", got, 20);
  run_layout("t22p", 2, 2, "--dp-poll-us 1", got, 20);
  ck_assert_int_eq(same_ckpt("t22", "t22n", 20), 0);
  ck_assert_int_eq(same_ckpt("t22", "t22p", 20), 0);
  run_layout("t22b", 2, 2, "--grad-reduce bf16", got, 20); /* the bfloat16 MPI reduction over TCP */
  expect_close(ref, got, 0, 20, "tcp (2,2) --grad-reduce bf16");
  run_layout("t41z", 4, 1, "--zero 1 --zero-reduce owner", got, 20); /* reduces to the owners, the thread's */
  snprintf(MPI_, sizeof MPI_, "%s", saved);
  expect_same(ref, got, 20, "tcp (4,1) --zero 1 --zero-reduce owner");
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

/* With --zloss the logged loss is still the cross-entropy (as validation's): step 1's loss
 * (the same weights and batch) is the run without z-loss's, and the z term is logged apart as
 * z_loss: zloss x the mean of (log Z)^2, about zloss x loss^2 at initialisation (where the
 * target's logit is near 0, log Z is the row's loss), also at TP 2. */
START_TEST(test_zloss_logged) {
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/zl.log", OUT);
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "train %s --data %s --steps 1 --micro-batch 8 --run-dir %s/zl%d %s", COMMON, DATA, OUT, i,
             i == 0 ? "" : i == 1 ? "--zloss 0.1" : "--zloss 0.1 --tp 2");
    sh("rm -rf %s/zl%d", OUT, i);
    int rc = gptj(i == 2 ? 2 : 0, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
  }
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, math\n"
                      "r = [json.loads(open('%s/zl%%d/metrics.jsonl' %% i).readline()) for i in range(3)]\n"
                      "assert r[0]['z_loss'] == 0, r[0]\n"
                      "for x in r[1:]:\n"
                      "  assert abs(x['loss'] - r[0]['loss']) < 1e-6 * r[0]['loss'], (x, r[0])\n"
                      "  assert abs(x['z_loss'] / (0.1 * x['loss'] ** 2) - 1) < 0.05, x\n\"", OUT), 0);
}
END_TEST

/* The GEMM-rate probe (train's GEMM efficiency) allocates the largest product's operands for a
 * moment: under a --mem-per-rank-gb that the run fits but the probe does not, it is left out
 * (a note, "GEMM eff -", gemm_eff null) and the peak RSS stays under the budget; without a
 * budget it runs. */
START_TEST(test_probe_memory) {
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/pm.log", OUT);
  sh("rm -rf %s/pm", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --micro-batch 8 --run-dir %s/pm --mem-per-rank-gb 0.001",
           COMMON, DATA, OUT);
  ck_assert_int_ne(gptj(0, args, log), 0);
  FILE *f = fopen(log, "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  double need = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "the model needs ")) need = atof(strstr(line, "the model needs ") + 16);
  fclose(f);
  ck_assert_msg(need > 0.05 && need < 1, "need %g", need);
  /* the run's own need and a little (the probe of this model is about 60 MB) */
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --micro-batch 8 --run-dir %s/pm --mem-per-rank-gb %.3f",
           COMMON, DATA, OUT, need + 0.03);
  sh("rm -rf %s/pm", OUT);
  int rc = gptj(0, args, log);
  if (rc) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'note: GEMM efficiency is not measured: the GEMM-rate probe needs' %s", log), 0);
  ck_assert_int_eq(sh("grep -q 'step 2/2 .*| GEMM eff - |' %s", log), 0);
  ck_assert_int_ne(sh("grep -q 'is above --mem-per-rank-gb' %s", log), 0); /* its peak is below (next) */
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json\n"
                      "r = [json.loads(l) for l in open('%s/pm/metrics.jsonl')]\n"
                      "assert all(x['gemm_eff'] is None for x in r if 'loss' in x), r\n"
                      "assert max(x['rss_bytes'] for x in r if 'loss' in x) < %.0f, r\n\"",
                      OUT, (need + 0.03) * 1e9), 0);
  /* At 2 threads the libraries' per-thread buffers, which the check does not count, come on
   * top: a peak above the budget is warned, once, and only then. */
  sh("rm -rf %s/pm", OUT);
  ck_assert_int_ne(sh("env OMP_NUM_THREADS=2 %s/gptj train %s --data %s --steps 2 --micro-batch 8 --run-dir %s/pm "
                      "--mem-per-rank-gb 0.001 >%s 2>&1", B_, COMMON, DATA, OUT, log), 0);
  f = fopen(log, "r");
  ck_assert_ptr_nonnull(f);
  need = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "the model needs ")) need = atof(strstr(line, "the model needs ") + 16);
  fclose(f);
  ck_assert_msg(need > 0.05 && need < 1, "need %g", need);
  int rc2 = sh("env OMP_NUM_THREADS=2 %s/gptj train %s --data %s --steps 2 --micro-batch 8 --run-dir %s/pm "
               "--mem-per-rank-gb %.3f >%s 2>&1", B_, COMMON, DATA, OUT, need + 0.01, log);
  if (rc2) sh("cat %s >&2", log);
  ck_assert_int_eq(rc2, 0);
  int warned = sh("test $(grep -c 'is above --mem-per-rank-gb %.3f: the memory check does not count the libraries' %s) -eq 1",
                  need + 0.01, log) == 0;
  int above = sh("/usr/bin/python3 -c \"import json, sys\n"
                 "r = [json.loads(l) for l in open('%s/pm/metrics.jsonl')]\n"
                 "sys.exit(0 if max(x['rss_bytes'] for x in r if 'loss' in x) > %.0f else 1)\n\"",
                 OUT, (need + 0.01) * 1e9) == 0;
  ck_assert_msg(warned == above, "peak above the budget: %d, warned: %d", above, warned);
  /* no budget: measured */
  sh("rm -rf %s/pm", OUT);
  snprintf(args, sizeof args, "train %s --data %s --steps 2 --micro-batch 8 --run-dir %s/pm --overwrite", COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_ne(sh("grep -q 'GEMM efficiency is not measured' %s", log), 0);
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json\n"
                      "r = [json.loads(l) for l in open('%s/pm/metrics.jsonl')]\n"
                      "assert all(x['gemm_eff'] > 0 for x in r if 'loss' in x), r\n\"", OUT), 0);
}
END_TEST

/* The optimizer in backward (--optimizer-in-backward 1, --clip 0) equals the ordinary step
 * without clipping bit for bit: at (1,1) with bf16 and two micro-batches a step, and at (2,2),
 * also with the DP sums in bf16 (at DP 2 each element's sum is one rounded addition, whichever
 * door and algorithm adds);
 * the parameters and both moments of the head, a layer and the embedding are identical. A NaN
 * injected into the gradients skips the step whole, as the ordinary step does. */
START_TEST(test_optimizer_in_backward) {
  struct { int dp, tp; const char *extra; } lay[] = {
      {1, 1, "--clip 0 --grad-accum 2 --micro-batch 4"}, /* with tu_bf16() */
      {2, 2, "--clip 0"},
      {2, 2, "--clip 0 --grad-reduce bf16"},
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
    ck_assert_int_eq(same_datasets("ob_a", "ob_b", 6, "/model/lm_head.weight /model/transformer.ln_f.bias "
                                   "/model/transformer.h.1.mlp.fc_out.weight /model/transformer.wte.weight "
                                   "/optim/exp_avg/transformer.wte.weight /optim/exp_avg_sq/transformer.h.0.attn.q_proj.weight "
                                   "/optim/exp_avg_sq/lm_head.bias"), 0);
    if (strstr(lay[i].extra, "nan"))
      ck_assert_int_eq(sh("grep -q 'step 3: non-finite.*update skipped' %s/ob_b.log", OUT), 0);
    if (lay[i].dp > 1) /* its sums are blocking, part by part: no progress thread, and it says so */
      ck_assert_int_eq(sh("grep -q 'no DP progress thread (the optimizer in backward sums each part at once)' %s/ob_b.log && "
                          "grep -q 'DP sums tested by a thread, 1000 us between tests' %s/ob_a.log", OUT, OUT), 0);
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
      ck_assert_int_eq(sh("grep -q 'error: step 3: a non-finite loss or gradient after part of the update was applied.*resume from the last checkpoint without --optimizer-in-backward' %s", log), 0);
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
  snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch 8 --run-dir %s/nan --debug-nan-step 3 "
           "--log-every 4", COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q 'step 3: non-finite' %s", log), 0);
  /* metrics.jsonl stays JSON (null for the non-finite norm) and records the skipped step
   * although --log-every 4 does not log step 3 */
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, sys; r = [json.loads(l) for l in open('%s/nan/metrics.jsonl')]; "
                      "s = [x for x in r if x.get('step') == 3 and 'loss' in x]; "
                      "sys.exit(not (len(s) == 1 and s[0]['skipped'] == 1 and s[0]['grad_norm'] is None and "
                      "sum(x.get('skipped', 0) for x in r) == 1))\"", OUT), 0);
  snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch 8 --run-dir %s/nan2 --debug-nan-step 3 --max-bad-steps 1",
           COMMON, DATA, OUT);
  ck_assert_int_eq(gptj(0, args, log), 1);
  ck_assert_int_eq(sh("grep -q '1 skipped steps in a row (non-finite, or a huge gradient element) at step 3' %s", log), 0);
}
END_TEST

/* A skipped step is not counted in AdamW's step count t. With step 1 skipped, step 2 is AdamW's
 * first update: its bias-corrected m / (sqrt(v) + eps) is g / (|g| + eps), g the clipped
 * gradient (m / (1 - beta1)), so each bias (no weight decay) moves by step 2's learning rate
 * times |g| / (|g| + eps) (counted as t = 2 it would move by about 0.74 of that).
 * The checkpoints record updates 0 at step 1 and 1 at step 2, gptj info shows it (and updates =
 * step for a file without the attribute, written before it existed), and a resume
 * after the skipped step continues as the uninterrupted run does, bit for bit (at DP 2 x TP 2
 * with ZeRO-1 as at one rank). */
START_TEST(test_skipped_step) {
  for (int lay = 0; lay < 2; lay++) {
    double ref[64], got[64];
    const char *extra = lay ? "--tp 2 --zero 1" : "";
    int dp = lay ? 2 : 1, np = lay ? 4 : 0;
    char base[600], args[2048], log[1400], run[1300];
    snprintf(base, sizeof base, "--debug-nan-step 1 %s", extra);
    run_layout(lay ? "sk_ref2" : "sk_ref1", dp, 1 + lay, lay ? "--debug-nan-step 1 --zero 1" : "--debug-nan-step 1", ref, 6);
    snprintf(run, sizeof run, "%s/sk%d", OUT, lay);
    snprintf(log, sizeof log, "%s.log", run);
    sh("rm -rf %s", run);
    snprintf(args, sizeof args, "train %s --data %s --steps 2 --micro-batch %d --run-dir %s --save-every 1 %s",
             COMMON, DATA, 8 / dp, run, base);
    int rc = gptj(np, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    /* one warning for the skipped step, from rank 0, whatever the ranks */
    ck_assert_int_eq(sh("test $(grep -c 'step 1: non-finite.*update skipped' %s) -eq 1", log), 0);
    ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, sys, h5py, numpy as np\n"
                        "r = [json.loads(l) for l in open('%s/metrics.jsonl')]\n"
                        "lr = [x['lr'] for x in r if x.get('step') == 2 and 'lr' in x][0]\n"
                        "a, b = h5py.File('%s/ckpt-00000001.h5'), h5py.File('%s/ckpt-00000002.h5')\n"
                        "assert (a.attrs['step'], a.attrs['updates'], b.attrs['step'], b.attrs['updates']) == (1, 0, 2, 1)\n"
                        "o = b['optim'].attrs\n"
                        "for n in ['lm_head.bias', 'transformer.ln_f.bias', 'transformer.h.0.ln_1.bias', 'transformer.h.1.mlp.fc_in.bias']:\n"
                        "  d = (b['model/' + n][...].astype(float) - a['model/' + n][...]) / lr\n"
                        "  g = abs(b['optim/exp_avg/' + n][...].astype(float)) / (1 - o['beta1'])\n"
                        "  e = abs(abs(d) - g / (g + o['eps'])).max()\n"
                        "  assert e < 1e-4, (n, e)\n\"", run, run, run), 0);
    ck_assert_int_eq(sh("%s/gptj info %s/ckpt-00000002.h5 | grep -qx 'updates: 1'", B_, run), 0);
    /* a file written before updates were recorded had no step skipped: updates = step */
    ck_assert_int_eq(sh("cp %s/ckpt-00000002.h5 %s/old.h5 && /usr/bin/python3 -c \"import h5py; "
                        "del h5py.File('%s/old.h5', 'r+').attrs['updates']\" && "
                        "%s/gptj info %s/old.h5 | grep -qx 'updates: 2'", run, OUT, OUT, B_, OUT), 0);
    snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch %d --run-dir %s --resume auto %s",
             COMMON, DATA, 8 / dp, run, extra);
    rc = gptj(np, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(read_losses(run, got, 64, NULL), 6);
    for (int k = 2; k < 6; k++)
      ck_assert_msg(got[k] == ref[k], "%s: step %d: %.9g vs %.9g", extra, k + 1, got[k], ref[k]);
  }
}
END_TEST

/* A copy dst of checkpoint src (dst may be src) whose /model tensors (a comma-separated list)
 * are changed by the Python statement stmt on their array a, their CRCs made right again. */
static int edit_ckpt(const char *src, const char *dst, const char *tensors, const char *stmt) {
  return sh("/usr/bin/python3 -c \"import h5py, zlib, shutil, numpy as np\n"
            "src, dst = '%s', '%s'\n"
            "if src != dst: shutil.copy(src, dst)\n"
            "h = h5py.File(dst, 'r+')\n"
            "for t in '%s'.split(','):\n"
            "  d = h['model/' + t]; a = d[...]; %s; d[...] = a\n"
            "  d.attrs['crc32'] = np.uint32(zlib.crc32(a.astype(np.float32).tobytes()))\"",
            src, dst, tensors, stmt);
}

/* A finite gradient whose square overflows float (weights of 1e25 in a checkpoint, resumed with
 * --clip 0, plain and with the optimizer in backward): the update is skipped with a warning
 * that says why, instead of writing an infinite AdamW moment into every later checkpoint (which
 * no resume loads): the run's last checkpoint resumes. */
START_TEST(test_huge_gradient) {
  for (int oib = 0; oib < 2; oib++) {
    double ref[64];
    char args[2048], log[1400], run[1300];
    run_layout("hg", 1, 1, "", ref, 2);
    snprintf(run, sizeof run, "%s/hg", OUT);
    snprintf(log, sizeof log, "%s.log", run);
    char ck[1400];
    snprintf(ck, sizeof ck, "%s/ckpt-00000002.h5", run);
    ck_assert_int_eq(edit_ckpt(ck, ck, "transformer.ln_f.weight", "a.fill(1e25)"), 0);
    for (int steps = 4; steps <= 5; steps++) {
      snprintf(args, sizeof args, "train %s --data %s --steps %d --micro-batch 8 --run-dir %s --resume auto --clip 0%s",
               COMMON, DATA, steps, run, oib ? " --optimizer-in-backward 1" : "");
      int rc = gptj(0, args, log);
      if (rc) sh("cat %s >&2", log);
      ck_assert_int_eq(rc, 0);
      ck_assert_int_eq(sh("/usr/bin/python3 -c \"import h5py, numpy as np, sys\n"
                          "f = h5py.File('%s/ckpt-%08d.h5')\n"
                          "bad = []; f.visititems(lambda n, o: bad.append(n) if isinstance(o, h5py.Dataset) and not np.isfinite(o[...]).all() else None)\n"
                          "print(*bad); sys.exit(1 if bad else 0)\"", run, steps), 0);
    }
    ck_assert_int_eq(sh("grep -q 'step 5: a gradient element of 1e+19 or more (gradient norm .*; its square would "
                        "overflow AdamW.s float32 second moment): update skipped' %s", log), 0);
  }
}
END_TEST

/* generate's tokens are the vocabulary's, not its padding, and <|endoftext|> ends the text,
 * whatever form the prompt has (--prompt-ids with --ids reads no vocabulary files): a
 * checkpoint whose head favours padding id 50300 never gives it, greedy or sampled, and one
 * that favours 50256 stops there. --top-p 0 keeps the most likely token alone (greedy's ids);
 * notes go to stderr (stdout holds the ids alone); a full stdout fails the command; eval of a
 * model whose logits overflow fails with one line instead of printing NaN. */
START_TEST(test_generate_tokens) {
  double loss[64];
  char ck[1300], log[1400], args[2048];
  run_layout("gen", 1, 1, "", loss, 1);
  snprintf(ck, sizeof ck, "%s/gen/ckpt-00000001.h5", OUT);
  snprintf(log, sizeof log, "%s/gen.out", OUT);
  char dst[1400];
  snprintf(dst, sizeof dst, "%s/pad.h5", OUT);
  ck_assert_int_eq(edit_ckpt(ck, dst, "lm_head.bias", "a[50300] = 30"), 0);
  snprintf(dst, sizeof dst, "%s/eot.h5", OUT);
  ck_assert_int_eq(edit_ckpt(ck, dst, "lm_head.bias", "a[50256] = 30"), 0);
  snprintf(dst, sizeof dst, "%s/huge.h5", OUT);
  ck_assert_int_eq(edit_ckpt(ck, dst, "lm_head.weight,transformer.ln_f.bias", "a.fill(1e30)"), 0);
  snprintf(dst, sizeof dst, "%s/nul.h5", OUT); /* id 188 is the byte 0 */
  ck_assert_int_eq(edit_ckpt(ck, dst, "lm_head.bias", "a[188] = 30"), 0);
  /* the text is every byte: the prompt's (given or decoded from its ids) and the new ones, NULs
   * included (printf's %s cut it at the first) */
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s/nul.h5 --prompt-ids 64 --temperature 0 --max-new-tokens 3 2>/dev/null "
                      "| od -An -c | tr -s ' ' | grep -qx ' a \\\\0 \\\\0 \\\\0 \\\\n'", B_, OUT), 0);
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s/nul.h5 --prompt 'a b' --temperature 0 --max-new-tokens 2 2>/dev/null "
                      "| od -An -c | tr -s ' ' | grep -qx ' a b \\\\0 \\\\0 \\\\n'", B_, OUT), 0);
  for (int seed = 0; seed < 4; seed++) {
    snprintf(args, sizeof args, "generate --checkpoint %s/pad.h5 --prompt-ids 464,9002 --ids --max-new-tokens 6 %s%d",
             OUT, seed ? "--temperature 1 --top-p 1 --seed " : "--temperature 0 --seed ", seed);
    ck_assert_int_eq(sh("%s/gptj %s > %s 2>/dev/null && test $(wc -w < %s) -eq 8 && "
                        "! tr ' ' '\\n' < %s | awk '$1 >= 50257 {bad = 1} END {exit !bad}'", B_, args, log, log, log), 0);
  }
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s/eot.h5 --prompt-ids 464 --ids --temperature 0 --max-new-tokens 5 "
                      "2>/dev/null | grep -qx '464 50256'", B_, OUT), 0);
  ck_assert_int_eq(sh("a=$(%s/gptj generate --checkpoint %s --prompt-ids 464,9002 --ids --temperature 0 --max-new-tokens 6 2>/dev/null) && "
                      "b=$(%s/gptj generate --checkpoint %s --prompt-ids 464,9002 --ids --temperature 1.5 --top-p 0 --seed 3 "
                      "--max-new-tokens 6 2>/dev/null) && test -n \"$a\" && test \"$a\" = \"$b\"", B_, ck, B_, ck), 0);
  /* the note that the context is full goes to stderr */
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s --prompt-ids 464 --ids --max-new-tokens 500 2>%s.err > %s && "
                      "grep -q 'note: the context' %s.err && ! grep -q '[a-z]' %s", B_, ck, log, log, log, log), 0);
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s --prompt-ids 464 --ids --max-new-tokens 2 > /dev/full 2>%s.err; "
                      "test $? -eq 1 && grep -q 'gptj generate: error: stdout: write error' %s.err", B_, ck, log, log), 0);
  /* --out: the same bytes as stdout ('-': stdout), under a temporary name until complete; a device, a
   * directory or the checkpoint itself refused before any work; a full disk an error naming the
   * file, with no file and no temporary left, under mpirun too (whose forwarded stdout cannot
   * report one) */
  ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s/nul.h5 --prompt 'a b' --temperature 0 --max-new-tokens 4 "
                      ">%s.a 2>/dev/null && %s/gptj generate --checkpoint %s/nul.h5 --prompt 'a b' --temperature 0 "
                      "--max-new-tokens 4 --out %s.b 2>/dev/null && cmp %s.a %s.b && ! ls %s.b.tmp* 2>/dev/null && "
                      "%s/gptj generate --checkpoint %s/nul.h5 --prompt 'a b' --temperature 0 --max-new-tokens 4 --out - "
                      "2>/dev/null | cmp %s.a - && ! test -e ./-",
                      B_, OUT, log, B_, OUT, log, log, log, log, B_, OUT, log), 0);
  struct { const char *out, *msg; } bad[] = {{"/dev/full", "--out /dev/full: exists and is not a regular file"},
                                             {OUT, "is a directory, expected a file name"},
                                             {ck, "refusing to overwrite an input"}};
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(sh("%s/gptj generate --checkpoint %s --prompt-ids 464 --ids --max-new-tokens 2 --out %s "
                        ">/dev/null 2>%s.err; test $? -eq 1 && test $(wc -l < %s.err) -eq 1 && grep -q -- '%s' %s.err",
                        B_, ck, bad[i].out, log, log, bad[i].msg, log), 0);
  ck_assert_int_eq(sh("rm -rf %s/voc && cp -r %s/data/gpt2 %s/voc && %s/gptj generate --checkpoint %s --prompt 'a b' "
                      "--vocab-dir %s/voc --max-new-tokens 2 --out %s/voc/vocab.bpe >/dev/null 2>%s.err; test $? -eq 1 && "
                      "grep -q 'the same file as --vocab-dir .*voc/vocab.bpe' %s.err && cmp %s/data/gpt2/vocab.bpe %s/voc/vocab.bpe",
                      OUT, S_, OUT, B_, ck, OUT, OUT, log, log, S_, OUT), 0);
  char fs[1300];
  if (!small_fs(fs, sizeof fs, "genfs", 1, "test_generate_tokens (--out on a full disk)")) {
    int full = sh("head -c 2M /dev/zero > %s/fill 2>/dev/null; %s/gptj generate --checkpoint %s --prompt-ids 464 --ids "
                  "--max-new-tokens 2 --out %s/g.txt >/dev/null 2>%s.err; test $? -eq 1 && "
                  "grep -q 'error: --out %s/g.txt: write error: No space left on device' %s.err && test \"$(ls %s)\" = fill",
                  fs, B_, ck, fs, log, fs, log, fs);
    snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids 464 --ids --max-new-tokens 2 --tp 2 --out %s/g.txt",
             ck, fs);
    int rc = gptj(2, args, log);
    int mpi = rc != 0 && rc < 124 && !sh("grep -q 'error: --out %s/g.txt: write error: No space left on device' %s && "
                                          "test \"$(ls %s)\" = fill", fs, log, fs);
    sh("umount %s", fs);
    ck_assert_msg(!full, "--out on a full disk: no error, or a file left");
    ck_assert_msg(mpi, "--out on a full disk under mpirun: exit %d, no error, or a file left", rc);
  }
  ck_assert_int_eq(sh("%s/gptj eval --checkpoint %s/huge.h5 --data %s --max-windows 4 >%s 2>%s.err; test $? -eq 1 && "
                      "test $(wc -l < %s.err) -eq 1 && grep -q \"logits are not finite\" %s.err", B_, OUT, DATA, log, log, log, log), 0);
}
END_TEST

/* config.conf gives the run back: --data and --run-dir with a space, '#' and a trailing space are
 * written quoted and read back as they were; seq-len and decay-steps left to their defaults are
 * written as 0, so the file used again with more --steps resumes the run (the same directory)
 * with the decay following the new --steps; a flag can be set in a config file. */
START_TEST(test_config_conf_roundtrip) {
  char dir[1300], log[1400];
  snprintf(dir, sizeof dir, "%s/cc #1 ", OUT);
  snprintf(log, sizeof log, "%s/cc.log", OUT);
  ck_assert_int_eq(sh("rm -rf '%s' && mkdir -p '%s/da ta #2' && cp %s '%s/da ta #2/v #.h5'", dir, dir, DATA, dir), 0);
  ck_assert_int_eq(sh("cd '%s' && %s/gptj train --preset tiny --warmup 1 --micro-batch 4 --steps 2 --data 'da ta #2/v #.h5' "
                      "--run-dir 'ru n #3 ' > %s 2>&1", dir, B_, log), 0);
  ck_assert_int_eq(sh("cd '%s' && grep -qx 'data = \"da ta #2/v #.h5\"' 'ru n #3 /config.conf' && "
                      "grep -qx 'run-dir = \"ru n #3 \"' 'ru n #3 /config.conf' && "
                      "grep -q '^decay-steps = 0  # --steps: 2 in this run$' 'ru n #3 /config.conf' && "
                      "grep -q '^seq-len = 0  # n_positions: 128 in this run$' 'ru n #3 /config.conf'", dir), 0);
  ck_assert_int_eq(sh("cd '%s' && %s/gptj train --config 'ru n #3 /config.conf' --steps 4 --resume auto > %s 2>&1 && "
                      "grep -q 'resumed from ru n #3 /ckpt-00000002.h5 at step 2' %s && "
                      "test -f 'ru n #3 /ckpt-00000004.h5' && grep -q '^decay-steps = 0  # --steps: 4 in this run$' "
                      "'ru n #3 /config.conf'", dir, B_, log, log), 0);
  /* a flag in a config file: overwrite = 1 starts the run over */
  ck_assert_int_eq(sh("cd '%s' && printf 'overwrite = 1\\n' > ow.conf && %s/gptj train --config 'ru n #3 /config.conf' "
                      "--config ow.conf --steps 1 > %s 2>&1 && test -f 'ru n #3 /ckpt-00000001.h5' && "
                      "! test -e 'ru n #3 /ckpt-00000004.h5'", dir, B_, log), 0);
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
  /* a progress line a step, once (rank 0's), the warmup's named */
  ck_assert_int_eq(sh("test $(grep -c '^step [1-4]/4\\( (warmup)\\)\\?: [0-9.]* s' %s) -eq 4 && "
                      "grep -q '^step 1/4 (warmup): ' %s", log, log), 0);
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, sys; d = json.load(open('%s/bench.json')); "
                      "sys.exit(not (d['dp'] == 2 and d['step_s'] > 0 and d['gemm_replay_s'] > 0 and "
                      "d['gemm_replay_s'] < 3 * d['step_s'] and d['gemm_eff'] > 0 and d['gemm_eff_best'] > 0 and "
                      "d['gemm_best_flops_per_s'] > 0 and d['peak_rss_bytes'] > 0 and d['preset'] == 'tiny' and "
                      "d['config_file'] is None and d['n_layer'] == 2 and d['vocab_size'] == 50400))\"", OUT), 0);
  /* with no shape given it runs: T is 256, or the model's n_positions where that is less; the
   * model as run (a file's and a flag's changes to the preset) in the log and the JSON */
  snprintf(log, sizeof log, "%s/bench-default.log", OUT);
  sh("printf 'n_layer = 3\\n' > '%s/b \"1.conf'", OUT);
  snprintf(args, sizeof args, "bench --micro-batch 1 --steps 1 --warmup 0 --config '%s/b \"1.conf' --n_embd 128 "
           "--json %s/bench1.json", OUT, OUT);
  rc = gptj(0, args, log);
  if (rc) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q '^bench: %s/b \"1.conf, B 1, T 128,' %s && "
                      "grep -q '^model: [0-9]* parameters (3 layers, D 128, 4 heads, F 256, V 50400)$' %s",
                      OUT, log, log), 0);
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import json, sys; d = json.load(open('%s/bench1.json')); "
                      "sys.exit(not (d['config_file'] == '%s/b \\\"1.conf' and d['n_layer'] == 3 and d['n_embd'] == 128))\"",
                      OUT, OUT), 0);
}
END_TEST

/* gptj plan in each precision: the layout line names it, the activations are sized for it (the
 * GPT-J-6B-width layer's differ) and, in bf16, for the backend; the head's gradient written
 * late is shown; a layout with --grad-accum 2 keeps it as it was. */
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
  /* bf16 sized for each backend: oneDNN's keeps the head's bf16 copy in the work buffers, which
   * at this width grows them. Every CPU plans for oneDNN with the rate given: one without bf16
   * hardware (a login node) says it sized for a machine that has it, and without the rate it
   * refuses, naming --sgemm-gflops. */
  double bf[2];
  for (int b = 0; b < 2; b++) {
    snprintf(args, sizeof args, "plan --preset gptj-6b --n_layer 1 --micro-batch 8 --seq-len 256 --sgemm-gflops 100 "
             "--mem-gbps 10 --precision bf16 --gemm %s", b ? "onednn" : "openblas");
    ck_assert_int_eq(gptj(0, args, log[0]), 0);
    ck_assert_int_eq(sh("grep -q '^note: this CPU has no bf16 hardware.*sized for oneDNN' %s", log[0]),
                     b && !tu_bf16_hw() ? 0 : 1);
    FILE *f = fopen(log[0], "r");
    char line[512];
    bf[b] = -1;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "  activations %lf GB", &bf[b]) == 1) break;
    if (f) fclose(f);
  }
  ck_assert_msg(bf[0] > 0 && bf[1] > bf[0], "bf16 activations: openblas %g, onednn %g GB", bf[0], bf[1]);
  if (!tu_bf16_hw()) {
    ck_assert_int_ne(gptj(0, "plan --preset gptj-6b --n_layer 1 --precision bf16 --mem-gbps 10", log[0]), 0);
    ck_assert_int_eq(sh("grep -q 'error: --precision bf16: this CPU has neither.*--sgemm-gflops$' %s", log[0]), 0);
  }
  snprintf(args, sizeof args, "plan --preset gptj-6b --n_layer 1 --micro-batch 8 --seq-len 256 --grad-accum 2 "
           "--sgemm-gflops 100 --mem-gbps 10");
  ck_assert_int_eq(gptj(0, args, log[0]), 0);
  ck_assert_int_ne(sh("grep -q 'vocabulary head' %s", log[0]), 0);
}
END_TEST

/* A number of gptj plan's output: the first double after `key` on a line that has it. */
static double plan_value(const char *log, const char *key) {
  FILE *f = fopen(log, "r");
  char line[1024];
  double v = -1;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, key)) {
      v = atof(strstr(line, key) + strlen(key));
      break;
    }
  if (f) fclose(f);
  return v;
}

/* gptj plan's step time: recomputation adds the forward up to the two output projections (q, k,
 * v, fc_in and the attention: 2 (3 D^2 + D F) + 4 D T FLOPs per layer and token), ZeRO-1's
 * all-gather after the update is exposed, and a TP
 * group wider than a node is priced at the network's bandwidth, with a warning. */
START_TEST(test_plan_times) {
  char args[2048], log[1400];
  snprintf(log, sizeof log, "%s/plant.log", OUT);
  const char *shape = "plan --preset tiny --n_layer 2 --n_embd 64 --n_head 4 --rotary_dim 16 --n_inner 256 "
                      "--seq-len 32 --micro-batch 2 --sgemm-gflops 0.001 --mem-gbps 10";
  double comp[2];
  for (int r = 0; r < 2; r++) {
    snprintf(args, sizeof args, "%s --recompute %d", shape, r);
    ck_assert_int_eq(gptj(0, args, log), 0);
    comp[r] = plan_value(log, "  compute ");
  }
  const double extra = (2 * 2.0 * (3 * 64.0 * 64 + 64.0 * 256) + 4 * 2.0 * 64 * 32) * 64 / 1e6; /* s at 1 MFLOP/s */
  ck_assert_msg(fabs(comp[1] - comp[0] - extra) < 2e-3, "recompute adds %.3f s, expected %.3f", comp[1] - comp[0], extra);
  /* ZeRO-1 at DP 4: the gradients' all-reduce as without it (backward hides all but its last
   * bucket and the head's gradient written late), and the all-gather of the updated parameters
   * after the update, exposed whole: it adds as much to the DP time as to the exposed time */
  double t[2], e[2];
  for (int z = 0; z < 2; z++) {
    snprintf(args, sizeof args, "%s --n_embd 512 --n_inner 2048 --n_layer 4 --dp 4 --net-gbps 0.01 --zero %d", shape, z);
    ck_assert_int_eq(gptj(0, args, log), 0);
    t[z] = plan_value(log, "  DP communication "), e[z] = plan_value(log, " GB/s, ");
    ck_assert_msg(t[z] > 0.1 && e[z] < t[z], "zero %d: DP %.3f s, exposed %.3f s", z, t[z], e[z]);
  }
  ck_assert_msg(e[0] < 0.8 * t[0], "DP %.3f s, exposed %.3f s", t[0], e[0]);
  ck_assert_msg(t[1] > t[0] + 1 && fabs((t[1] - t[0]) - (e[1] - e[0])) < 2e-3,
                "ZeRO-1 adds %.3f s of DP time, %.3f s exposed", t[1] - t[0], e[1] - e[0]);
  ck_assert_int_eq(sh("grep -q \"the gradients' all-reduce overlaps backward; ZeRO-1's all-gather after the "
                      "update does not\" %s", log), 0);
  /* --zero-reduce owner: the gradients' sums reduced to their owners send half the all-reduce's
   * bytes ((p - 1) / p of them against 2 (p - 1) / p; the embedding's rows, a few tokens' worth
   * here, are all-reduced either way) */
  snprintf(args, sizeof args, "%s --n_embd 512 --n_inner 2048 --n_layer 4 --dp 4 --net-gbps 0.01 --zero 1 "
           "--zero-reduce owner", shape);
  ck_assert_int_eq(gptj(0, args, log), 0);
  const double to = plan_value(log, "  DP communication "), eo = plan_value(log, " GB/s, ");
  ck_assert_msg(fabs(to - (t[1] - t[0] / 2)) < 2e-3 * t[0] && eo <= e[1],
                "owner: DP %.3f s (exposed %.3f), all-reduce %.3f s of which the gradients' %.3f s", to, eo, t[1], t[0]);
  ck_assert_int_eq(sh("grep -q 'ZeRO-1 on (gradient sums to their owners)' %s && grep -q 'gradients reduced to their owners' %s",
                      log, log), 0);
  /* with as many tokens a step as the vocabulary (here 51200) the embedding's gradient is dense
   * and reduced to its owners too: all the gradients' bytes halved */
  {
    double td[3];
    for (int k = 0; k < 3; k++) {
      snprintf(args, sizeof args, "%s --n_embd 512 --n_inner 2048 --n_layer 4 --dp 4 --net-gbps 0.01 --grad-accum 200 %s",
               shape, k == 0 ? "--zero 0" : k == 1 ? "--zero 1" : "--zero 1 --zero-reduce owner");
      ck_assert_int_eq(gptj(0, args, log), 0);
      td[k] = plan_value(log, "  DP communication ");
    }
    ck_assert_msg(fabs(td[2] - (td[1] - td[0] / 2)) < 1e-3 + 1e-6 * td[0],
                  "dense embedding, owner: DP %.4f s, all-reduce %.4f s of which the gradients' %.4f s", td[2], td[1], td[0]);
  }
  /* in bf16 the all-gather sends the GEMM weights in 2 bytes (gj_dp_gather16): ZeRO-1 adds
   * (4 n - 2 n16) / (4 n) of float32's time, n16 of the n parameters being GEMM weights */
  double tb[2];
  for (int z = 0; z < 2; z++) {
    snprintf(args, sizeof args, "%s --n_embd 512 --n_inner 2048 --n_layer 4 --dp 4 --net-gbps 0.01 --zero %d "
             "--precision bf16 --gemm openblas", shape, z);
    ck_assert_int_eq(gptj(0, args, log), 0);
    tb[z] = plan_value(log, "  DP communication ");
  }
  ck_assert_int_eq(sh("grep -q 'and the updated parameters. all-gather, the GEMM weights in bf16' %s", log), 0);
  const double V = 50400, D = 512, F = 2048, L = 4;
  const double n16 = L * (4 * D * D + 2 * D * F) + V * D;
  const double n = n16 + V * D + V + L * (3 * D + F) + 2 * D; /* the embedding, biases, LayerNorms */
  const double want = (4 * n - 2 * n16) / (4 * n);
  ck_assert_msg(fabs((tb[1] - tb[0]) / (t[1] - t[0]) - want) < 0.01, "bf16: ZeRO-1 adds %.3f s against %.3f s in fp32, "
                "expected %.3f of it", tb[1] - tb[0], t[1] - t[0], want);
  /* TP 4 on nodes of 2 ranks: the network's 0.5 GB/s, not the node's 50 */
  snprintf(args, sizeof args, "%s --tp 4 --ranks-per-node 2 --net-gbps 0.5", shape);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q '^  TP communication .* s at 0.5 GB/s (the TP group spans nodes' %s", log), 0);
  snprintf(args, sizeof args, "%s --tp 2 --ranks-per-node 2 --net-gbps 0.5", shape);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q '^  TP communication .* s at 50.0 GB/s$' %s", log), 0);
  /* the memory: the GEMM-rate probe is listed; the process counts against --mem-per-rank-gb
   * only (MemAvailable has it taken off already) */
  ck_assert(plan_value(log, "  GEMM-rate probe ") > 0);
  ck_assert_int_ne(sh("grep -q '^  process ' %s", log), 0);
  snprintf(args, sizeof args, "%s --mem-per-rank-gb 1", shape);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(sh("grep -q '^  process .* GB (libraries and MPI' %s", log), 0);
}
END_TEST

/* OpenBLAS's kernel is gptj's choice for the CPU, not the environment's: whatever
 * OPENBLAS_CORETYPE says (unset, OpenBLAS picks by itself), the same kernel runs and training
 * gives the same losses, bit for bit. Ranks that run different kernels (set here with
 * GJ_OPENBLAS_CORETYPE, as CPUs of different kinds would) are told so. */
START_TEST(test_blas_kernel) {
  static const char *envs[] = {"-u OPENBLAS_CORETYPE", "OPENBLAS_CORETYPE=Prescott", "OPENBLAS_CORETYPE=Haswell",
                               "OPENBLAS_CORETYPE=Zen", "OPENBLAS_CORETYPE=Cooperlake", "OPENBLAS_CORETYPE=SkylakeX"};
  char args[2048], log[1400], run[1400], kernel[64] = "";
  double ref[16], got[16];
  snprintf(log, sizeof log, "%s/kernel.log", OUT);
  for (int i = 0; i < (int)(sizeof envs / sizeof *envs); i++) {
    snprintf(run, sizeof run, "%s/kernel%d", OUT, i);
    sh("rm -rf %s", run);
    int rc = sh("env %s GJ_OPENBLAS_CORETYPE= timeout -k 10 300 %s/gptj train %s --data %s --steps 3 "
                "--micro-batch 4 --precision fp32 --gemm openblas --run-dir %s --log-every 1 >%s 2>&1",
                envs[i], B_, COMMON, DATA, run, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    char k[64] = "";
    FILE *f = fopen(log, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
      const char *p = strstr(line, "GEMM: OpenBLAS ");
      if (p && sscanf(p, "GEMM: OpenBLAS %63s kernel", k) == 1) break;
    }
    if (f) fclose(f);
    ck_assert_msg(*k, "%s: no kernel named in the log", envs[i]);
    ck_assert_int_eq(read_losses(run, i ? got : ref, 16, NULL), 3);
    if (i == 0) {
      snprintf(kernel, sizeof kernel, "%s", k);
      continue;
    }
    ck_assert_msg(!strcmp(k, kernel), "%s: kernel %s, unset: %s", envs[i], k, kernel);
    for (int s = 0; s < 3; s++)
      ck_assert_msg(got[s] == ref[s], "%s: step %d loss %.9g vs %.9g", envs[i], s + 1, got[s], ref[s]);
  }
  /* two ranks, two kernels (both run on any x86-64 CPU with AVX2) */
  snprintf(run, sizeof run, "%s/kernel_mixed", OUT);
  sh("rm -rf %s", run);
  snprintf(args, sizeof args, "train %s --data %s --steps 1 --micro-batch 4 --precision fp32 --gemm openblas "
           "--run-dir %s", COMMON, DATA, run);
  int rc = sh("timeout -k 10 300 %s -np 1 -x GJ_OPENBLAS_CORETYPE=Haswell %s/gptj %s : -np 1 -x "
              "GJ_OPENBLAS_CORETYPE=Prescott %s/gptj %s >%s 2>&1", MPI_, B_, args, B_, args, log);
  if (rc) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'warning: ranks run different OpenBLAS kernels (this rank: Haswell' %s", log), 0);
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
  TU_ADD(s, test_plan_times, NULL, 300);
  TU_ADD(s, test_probe_memory, NULL, 300);
  TU_ADD(s, test_bad_layout, NULL, 900);
  TU_ADD(s, test_nan_steps, NULL, 900);
  TU_ADD(s, test_skipped_step, NULL, 900);
  TU_ADD(s, test_huge_gradient, NULL, 900);
  TU_ADD(s, test_generate_tokens, NULL, 900);
  TU_ADD(s, test_config_conf_roundtrip, NULL, 900);
  TU_ADD(s, test_optimizer_in_backward, NULL, 900);
  TU_ADD(s, test_zloss_logged, NULL, 600);
  TU_ADD(s, test_oib_partial_nan, NULL, 900);
  TU_ADD(s, test_bench, NULL, 900);
  TU_ADD(s, test_blas_kernel, NULL, 900);
  return tu_run(s);
}
