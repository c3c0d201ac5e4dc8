/* End-to-end resume and fault tests of training, each launching `gptj` (under mpirun where the
 * layout needs it): exact resume, resume on other layouts and of a corpus blend, damaged and
 * truncated checkpoints, kill -9 during a save and of one rank, a full disk during a save, and
 * the stop signal. (A suite of its own beside test_train so that make check runs both at once.) */
#include <check.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainutil.h"

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
  ck_assert_int_eq(same_datasets("ra", "rb", 10, "/model/lm_head.weight /model/transformer.h.1.mlp.fc_out.weight "
                                 "/optim/exp_avg_sq/transformer.h.0.attn.q_proj.weight"), 0);
}
END_TEST

/* One corpus: the checkpoint records its window count; a resume over another count (here
 * another --seq-len) is refused, saying why and what to do, and leaves the run as it was; a
 * checkpoint of before the count was recorded resumes exactly. */
START_TEST(test_resume_other_windows) {
  double a[64], b[64];
  char args[2048], log[1400], run[1300];
  run_layout("wa", 1, 1, "", a, 5);
  run_layout("wb", 1, 1, "", b, 3);
  snprintf(run, sizeof run, "%s/wb", OUT);
  snprintf(log, sizeof log, "%s/wb2.log", OUT);
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import h5py; print(h5py.File('%s/ckpt-00000003.h5')['loader'].attrs['windows'])\" "
                      "> %s/wb.windows && test \"$(cat %s/wb.windows)\" -gt 0", run, OUT, OUT), 0);
  sh("cd %s && md5sum ckpt-*.h5 latest metrics.jsonl > ../wb.md5", run);
  snprintf(args, sizeof args, "train %s --data %s --steps 5 --micro-batch 8 --seq-len 16 --run-dir %s --resume auto",
           COMMON, DATA, run);
  ck_assert_int_eq(gptj(0, args, log), 1);
  ck_assert_int_eq(sh("grep -q \"the checkpoint's data order is over $(cat %s/wb.windows) windows, this run's data has "
                      "[0-9]* (another dataset or --seq-len?): resume with the checkpoint's --data and --seq-len\" %s",
                      OUT, log), 0);
  ck_assert_msg(sh("cd %s && md5sum -c --quiet ../wb.md5", run) == 0, "the refused resume changed the run directory");
  /* without the attribute (an older checkpoint): checked by position only, resumed exactly */
  ck_assert_int_eq(sh("/usr/bin/python3 -c \"import h5py; del h5py.File('%s/ckpt-00000003.h5', 'r+')['loader'].attrs['windows']\"",
                      run), 0);
  snprintf(args, sizeof args, "train %s --data %s --steps 5 --micro-batch 8 --run-dir %s --resume auto", COMMON, DATA, run);
  ck_assert_int_eq(gptj(0, args, log), 0);
  ck_assert_int_eq(read_losses(run, b, 64, NULL), 5);
  for (int i = 0; i < 5; i++) ck_assert_msg(a[i] == b[i], "step %d: %.9g vs %.9g", i + 1, a[i], b[i]);
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

/* A vocabulary that TP does not divide (GPT-2's 50,257 ids = 29 x 1,733): at TP 2 the ranks hold
 * 25,129 and 25,128 rows, at TP 4 12,565 and 3 x 12,564. Training at TP 2 follows TP 1; its
 * checkpoint resumes at (1,4), (2,2) with ZeRO-1 and (1,1), its CRCs are zlib's of the data, and
 * eval and greedy generate read it at TP 2 as at TP 1. */
START_TEST(test_uneven_vocab) {
  double a[64], b[64];
  const char *V = "--vocab_size 50257";
  run_layout("va", 1, 1, V, a, 6);
  run_layout("vb", 1, 2, "--vocab_size 50257 --save-every 3", b, 3);
  expect_same(a, b, 3, "V 50257 at TP 2 against TP 1");
  struct { int dp, tp; const char *extra; } lays[] = {{1, 4, ""}, {2, 2, "--zero 1"}, {1, 1, ""}};
  char args[2048], log[1400], run[1300];
  for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
    snprintf(run, sizeof run, "%s/v%zu_%d%d", OUT, i, lays[i].dp, lays[i].tp);
    snprintf(log, sizeof log, "%s.log", run);
    sh("rm -rf %s && mkdir -p %s && cp %s/vb/ckpt-00000003.h5 %s/ && echo ckpt-00000003.h5 > %s/latest && "
       "cp %s/vb/metrics.jsonl %s/", run, run, OUT, run, run, OUT, run);
    int np = lays[i].dp * lays[i].tp;
    snprintf(args, sizeof args, "train %s --data %s --steps 6 --micro-batch %d --tp %d --run-dir %s --resume auto %s %s",
             COMMON, DATA, 8 / lays[i].dp, lays[i].tp, run, V, lays[i].extra);
    int rc = gptj(np == 1 ? 0 : np, args, log);
    if (rc) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(read_losses(run, b, 64, NULL), 6);
    expect_same(a, b, 6, run);
  }
  ck_assert_int_eq(sh("cd %s && /usr/bin/python3 %s/tests/ckpt-check.py vb/ckpt-00000003.h5 v*_*/ckpt-00000006.h5",
                      OUT, S_), 0);
  /* eval and greedy decoding of the TP 2 checkpoint at TP 1 and TP 2 */
  char out[2][1400];
  for (int tp = 1; tp <= 2; tp++) {
    snprintf(out[tp - 1], sizeof out[0], "%s/veval%d.txt", OUT, tp);
    snprintf(args, sizeof args, "eval --checkpoint %s/vb/ckpt-00000003.h5 --data %s --tp %d --seq-len 32 "
             "--max-windows 8", OUT, DATA, tp);
    ck_assert_int_eq(gptj(tp == 1 ? 0 : tp, args, out[tp - 1]), 0);
    snprintf(args, sizeof args, "generate --checkpoint %s/vb/ckpt-00000003.h5 --tp %d --prompt-ids '464 3290 318' "
             "--ids --temperature 0 --max-new-tokens 8", OUT, tp);
    snprintf(log, sizeof log, "%s/vgen%d.txt", OUT, tp);
    ck_assert_int_eq(gptj(tp == 1 ? 0 : tp, args, log), 0);
  }
  ck_assert_msg(sh("a=$(awk '/^nll /{print $2}' %s); b=$(awk '/^nll /{print $2}' %s); "
                   "test -n \"$a\" && awk -v a=$a -v b=$b 'BEGIN{d=a-b; exit !(d*d <= 1e-10*a*a)}'",
                   out[0], out[1]) == 0, "eval's NLL at TP 2 differs from TP 1's (by over 1e-5)");
  ck_assert_msg(sh("cmp -s <(grep -E '^[0-9 ]+$' %s/vgen1.txt) <(grep -E '^[0-9 ]+$' %s/vgen2.txt) && "
                   "grep -qE '^[0-9 ]+$' %s/vgen1.txt", OUT, OUT, OUT) == 0, "greedy ids at TP 2 differ from TP 1");
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
     * start would depend on the machine's load), so that later ones are being written: mpirun
     * and the ranks, each of which Open MPI puts in a process group of its own, by their
     * session (setsid) */
    sh("rm -f %s/latest; (setsid %s -np 2 %s/gptj %s --tp 2 --resume auto >>%s 2>&1 & echo $! > %s/pid) ; "
       "for i in $(seq 600); do test -f %s/latest && break; sleep 0.1; done; sleep %.2f; "
       "s=$(cat %s/pid); pkill -9 -s $s; for i in $(seq 200); do pgrep -s $s >/dev/null || break; sleep 0.05; done",
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
              "--run-dir %s >%s 2>&1 & p=$!; " WAIT_LOG("step 9/")
              "m=$(pgrep -P $p); kill -9 $(pgrep -P $m -x gptj | tail -1); "
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
  snprintf(log, sizeof log, "%s/full.log", OUT);
  /* a tiny-model checkpoint is 79 MB: the first fits in 120 MB, the second does not */
  if (small_fs(dir, sizeof dir, "smallfs", 120, "test_disk_full")) return;
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

/* The disk fills while training runs (metrics.jsonl cannot be written) and is freed again: one
 * warning naming the file and the cause, no record after it, and training goes on to its last
 * step and checkpoint. Needs a small tmpfs (root), as test_disk_full. */
START_TEST(test_metrics_full) {
  char dir[1300], log[1400];
  snprintf(log, sizeof log, "%s/mfull.log", OUT);
  if (small_fs(dir, sizeof dir, "smallfs2", 100, "test_metrics_full")) return;
  /* fill the disk after the third record, free it once the warning is out */
  int rc = sh("%s/gptj train %s --data %s --steps 1000 --micro-batch 1 --seq-len 16 --log-every 1 --save-every 0 "
              "--run-dir %s/run >%s 2>&1 & p=$!; m=%s/run/metrics.jsonl; "
              "for i in $(seq 1200); do [ -f $m ] && [ $(wc -l < $m) -ge 3 ] && break; sleep 0.05; done; "
              "[ -f $m ] && [ $(wc -l < $m) -ge 3 ] || { kill $p; echo 'no third record in 60 s' >&2; exit 97; }; "
              "head -c 200M /dev/zero > %s/fill 2>/dev/null; "
              WAIT_LOG("metrics.jsonl: write error")
              "wc -l < $m > %s/lines; rm -f %s/fill; wait $p",
              B_, COMMON, DATA, dir, log, dir, dir, log, OUT, dir);
  int warned = sh("test $(grep -c 'run/metrics.jsonl: write error (No space left on device): no more records this "
                  "run; training goes on' %s) -eq 1", log) == 0;
  int ended = sh("grep -q '^step 1000/1000 ' %s && test -f %s/run/ckpt-00001000.h5", log, dir) == 0;
  int same = sh("test $(wc -l < %s/run/metrics.jsonl) -eq $(cat %s/lines)", dir, OUT) == 0;
  sh("umount %s", dir);
  if (rc || !warned || !ended) sh("cat %s >&2", log);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(warned, "no single warning naming metrics.jsonl and the cause");
  ck_assert_msg(ended, "training did not reach its last step and checkpoint");
  ck_assert_msg(same, "records were written after the warning");
}
END_TEST

START_TEST(test_signal_stop) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/sig", OUT);
  snprintf(log, sizeof log, "%s/sig.log", OUT);
  sh("rm -rf %s", run);
  int rc = sh("%s -np 2 %s/gptj train %s --data %s --steps 100000 --micro-batch 4 --run-dir %s >%s 2>&1 & p=$!; "
              WAIT_LOG("step 3/") "kill -USR1 $p; wait $p",
              MPI_, B_, COMMON, DATA, run, log, log);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'signal: stopped at step' %s && test -f %s/latest", log, run), 0);
}
END_TEST

/* Two stop signals: SIGTERM while the checkpoint that SIGUSR1 asked for is being written (a
 * scheduler's checkpoint request, then its SIGTERM) lets the write finish and the run stop
 * with exit 0; SIGINT and SIGTERM together (the trainer stopped, both sent, then continued:
 * two threads may handle them at once, in either order) end the process at once, by the
 * second, leaving no temporary file. (set -m: a background job of a script without job
 * control would ignore SIGINT.) */
START_TEST(test_signal_pairs) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/sigpair0", OUT);
  snprintf(log, sizeof log, "%s.log", run);
  /* SIGTERM once the checkpoint's temporary file exists; the write takes a few tenths of a
   * second, which a poll on a loaded machine may miss (exit 98): then the scenario again */
  int rc = 98;
  for (int attempt = 0; attempt < 3 && rc == 98; attempt++) {
    sh("rm -rf %s", run);
    rc = sh("set -m; %s/gptj train %s --data %s --steps 100000 --micro-batch 4 --run-dir %s >%s 2>&1 & p=$!; "
            WAIT_LOG("step 3/") "kill -USR1 $p; seen=0; for i in $(seq 3000); do ls -a %s | grep -q tmp && seen=1 "
            "&& break; sleep 0.005; done; kill -TERM $p; [ $seen = 1 ] || { wait $p; exit 98; }; wait $p",
            B_, COMMON, DATA, run, log, log, run);
  }
  if (rc) sh("cat %s >&2", log);
  ck_assert_msg(rc != 98, "the checkpoint's temporary file was not seen");
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sh("grep -q 'signal: stopped at step' %s && test -f %s/latest", log, run), 0);
  ck_assert_int_eq(sh("! ls -a %s | grep -q tmp", run), 0);

  /* The second pair. The trainer is this process's own child, with SIGINT and SIGTERM at their
   * defaults, and its end is read by waitpid without WUNTRACED: bash's `wait` on a job that was
   * stopped may report the stop (exit 147) for the job's end, as it did under CI load. */
  snprintf(run, sizeof run, "%s/sigpair1", OUT);
  snprintf(log, sizeof log, "%s.log", run);
  sh("rm -rf %s", run);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "exec %s/gptj train %s --data %s --steps 100000 --micro-batch 4 --run-dir %s >%s 2>&1",
           B_, COMMON, DATA, run, log);
  fflush(NULL);
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL);
    execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  if (sh(WAIT_LOG("step 3/"), log)) kill(p, SIGKILL), waitpid(p, NULL, 0), ck_abort_msg("the trainer did not reach step 3");
  kill(p, SIGSTOP), kill(p, SIGINT), kill(p, SIGTERM), kill(p, SIGCONT);
  int st = 0;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  if (sig != SIGINT && sig != SIGTERM) sh("cat %s >&2", log);
  ck_assert_msg(sig == SIGINT || sig == SIGTERM, "SIGINT and SIGTERM: %s %d, not death by either",
                WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? sig : WEXITSTATUS(st));
  ck_assert_int_eq(sh("! ls -a %s | grep -q tmp", run), 0);
}
END_TEST

int main(void) {
  if (tu_gptj_setup(B_, S_, MPI_, OUT, DATA, sizeof MPI_, "resume")) return 1;
  Suite *s = suite_create("resume");
  /* "long": the many-layout and whole-process cases, whose code the others reach too */
  TU_ADD(s, test_resume_other_layouts, "long", 900);
  TU_ADD(s, test_blend_resume, "long", 900);
  TU_ADD(s, test_kill_one_rank, "long", 900);
  TU_ADD(s, test_kill_during_save, "long", 900);
  TU_ADD(s, test_signal_stop, "long", 900);
  TU_ADD(s, test_uneven_vocab, "long", 900); /* the sanitizer build splits V unevenly in test_golden */
  TU_ADD(s, test_resume_exact, NULL, 900);
  TU_ADD(s, test_resume_other_windows, NULL, 900);
  TU_ADD(s, test_damaged_checkpoints, NULL, 900);
  TU_ADD(s, test_disk_full, NULL, 900);
  TU_ADD(s, test_metrics_full, NULL, 900);
  TU_ADD(s, test_signal_pairs, NULL, 900);
  return tu_run(s);
}
