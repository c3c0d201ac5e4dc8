/* Fault tests of a training run (issue 15): the run directory's lock, fresh starts into a run,
 * rotation and `latest`, metrics.jsonl across a resume, stop signals at any moment of the
 * start-up, paths up to PATH_MAX, memory limits (cgroups), errors seen on one rank only, and
 * what is checked at start. Each launches `gptj` as a user would. */
#include <check.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "testutil.h"

static char B_[1024], S_[1024], MPI_[512], DATA[1200], OUT[1200];
#define sh tu_sh

static const char *COMMON = "--preset tiny --seq-len 32 --micro-batch 4 --lr 1e-3 --warmup 3 --seed 7";

/* Launch gptj with np ranks (np 0: plain process), output to log. */
static int gptj(int np, const char *log, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int gptj(int np, const char *log, const char *fmt, ...) {
  char args[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  if (np == 0) return sh("timeout -k 10 300 %s/gptj %s >%s 2>&1", B_, args, log);
  return sh("timeout -k 10 300 %s -np %d %s/gptj %s >%s 2>&1", MPI_, np, B_, args, log);
}

static int grep(const char *log, const char *pattern) { return sh("grep -q -- '%s' %s", pattern, log) == 0; }

/* Two trainers on one run directory: the second is refused naming the first; the first goes
 * on. A lock left by a killed trainer, or by a process on another host that has not touched
 * it for GJ_LOCK_STALE_S or whose Slurm job has ended, is taken over; a fresh one of another
 * host is respected. */
START_TEST(test_lock) {
  char run[1300], log[1400], log2[1400];
  snprintf(run, sizeof run, "%s/lock", OUT);
  snprintf(log, sizeof log, "%s/lock.log", OUT);
  snprintf(log2, sizeof log2, "%s/lock2.log", OUT);
  sh("rm -rf %s", run);
  int rc = sh("%s/gptj train %s --data %s --steps 100000 --run-dir %s >%s 2>&1 & p=$!; echo $p > %s.pid; "
              WAIT_LOG("step 2/")
              "%s/gptj train %s --data %s --steps 10 --run-dir %s --resume auto >%s 2>&1; e=$?; "
              "kill -USR1 $p; wait $p; f=$?; [ $e -eq 1 ] && [ $f -eq 0 ]",
              B_, COMMON, DATA, run, log, run, log, B_, COMMON, DATA, run, log2);
  ck_assert_msg(rc == 0, "a second trainer on the same --run-dir was not refused, or the first failed");
  ck_assert(sh("grep -q \"is in use by gptj train: pid $(cat %s.pid) host $(hostname)\" %s", run, log2) == 0);
  ck_assert(grep(log, "signal: stopped at step"));
  ck_assert(sh("test ! -e %s/lock", run) == 0); /* released at exit */
  /* kill -9 leaves the lock; the next trainer on this host sees its process is gone */
  unlink(log); /* the previous part's: WAIT_LOG must not read it */
  rc = sh("%s/gptj train %s --data %s --steps 100000 --run-dir %s --resume auto >%s 2>&1 & p=$!; "
          WAIT_LOG("step .*/100000")
          "kill -9 $p; wait $p; test -e %s/lock", B_, COMMON, DATA, run, log, log, run);
  ck_assert_msg(rc == 0, "kill -9 did not leave a lock behind");
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s --resume auto", COMMON, DATA, run), 0);
  ck_assert(grep(log, "removed a stale lock"));
  /* a lock of another host: respected while fresh, taken over once stale */
  sh("printf 'gptj train: pid 1 host elsewhere job 77 since 2026-01-01T00:00:00Z token x\\n' > %s/lock", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s --resume auto", COMMON, DATA, run), 1);
  ck_assert(grep(log, "in use by gptj train: pid 1 host elsewhere job 77"));
  sh("touch -d '10 minutes ago' %s/lock", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s --resume auto", COMMON, DATA, run), 0);
  ck_assert(grep(log, "removed a stale lock.*not touched"));
  /* another host's lock under Slurm (fresh): this job's own earlier run (a lower restart
   * count) is taken over; a job that squeue (a stand-in here) reports ended is taken over, a
   * running one respected, and another cluster's job or an unreadable answer leaves the age
   * rule in charge */
  sh("mkdir -p %s/fakebin && printf '#!/bin/sh\\necho \"$FAKE_SQUEUE\"\\n' > %s/fakebin/squeue && chmod +x %s/fakebin/squeue",
     OUT, OUT, OUT);
  struct { const char *lock_job, *lock_cl, *restart, *answer; int taken; } sl[] = {
      {"77 restart 0", "c", "1", "RUNNING", 1}, {"77 restart 1", "c", "1", "RUNNING", 0},
      {"78 restart 0", "c", "0", "NODE_FAIL", 1}, {"78 restart 0", "c", "0", "slurm_load_jobs error: Invalid job id specified", 1},
      {"78 restart 0", "c", "0", "RUNNING", 0}, {"78 restart 0", "c", "0", "COMPLETING", 0},
      {"78 restart 0", "d", "0", "COMPLETED", 0}, {"78 restart 0", "c", "0", "", 0},
      {"78 restart 0", "c", "0", "Unable to contact slurm controller", 0}};
  for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++) {
    sh("printf 'gptj train: pid 1 host elsewhere job %s cluster %s since 2026-01-01T00:00:00Z start 5 token x\\n' > %s/lock",
       sl[i].lock_job, sl[i].lock_cl, run);
    rc = sh("PATH=%s/fakebin:$PATH FAKE_SQUEUE='%s' SLURM_JOB_ID=77 SLURM_RESTART_COUNT=%s SLURM_CLUSTER_NAME=c "
            "%s/gptj train %s --data %s --steps 1 --run-dir %s --resume auto >%s 2>&1",
            OUT, sl[i].answer, sl[i].restart, B_, COMMON, DATA, run, log);
    ck_assert_msg(rc == (sl[i].taken ? 0 : 1), "lock of job %s, cluster %s, restart %s, squeue '%s': exit %d",
                  sl[i].lock_job, sl[i].lock_cl, sl[i].restart, sl[i].answer, rc);
    ck_assert(grep(log, sl[i].taken ? "removed a stale lock.*its Slurm job has ended" : "in use by gptj train: pid 1 host elsewhere"));
  }
  sh("rm -f %s/lock", run); /* the last one was respected */
  /* a short GJ_LOCK_STALE_S: the holder's heartbeat keeps its lock fresh. The holder runs on
   * "another host" (a UTS namespace), whose lock only its age can clear: a live holder of this
   * host is never stale, whatever its heartbeat does. */
  unlink(log); /* the previous part's: WAIT_LOG must not read it */
  rc = sh("unshare --uts sh -c 'hostname gj-elsewhere; exec env GJ_LOCK_STALE_S=1 %s/gptj train %s --data %s "
          "--steps 100000 --run-dir %s --resume auto' >%s 2>&1 & p=$!; "
          WAIT_LOG("step .*/100000") "sleep 2.5; "
          "GJ_LOCK_STALE_S=1 %s/gptj train %s --data %s --steps 10 --run-dir %s --resume auto >%s 2>&1; e=$?; "
          "kill -USR1 $p; wait $p; [ $e -eq 1 ]", B_, COMMON, DATA, run, log, log, B_, COMMON, DATA, run, log2);
  ck_assert_msg(rc == 0, "a live holder's lock expired");
  ck_assert(grep(log2, "in use by gptj train: pid [0-9]* host gj-elsewhere"));
  /* the holder creates its lock again when it is removed under it, and stops without saving
   * when another holder's text is in it (GJ_LOCK_STALE_S 5: the heartbeat looks every 1 s and
   * takes the lock again if its last touch was under 2.5 s before; at 1 s that was 0.5 s, which
   * a heartbeat delayed by a loaded machine can miss) */
  sh("rm -rf %s", run);
  unlink(log);
  rc = sh("GJ_LOCK_STALE_S=5 %s/gptj train %s --data %s --steps 100000 --run-dir %s >%s 2>&1 & p=$!; echo $p > %s.pid; "
          WAIT_LOG("step .*/100000")
          "rm %s/lock; " WAIT_LOG("taken again")
          "grep -q \"pid $p host\" %s/lock || { kill $p; exit 9; }; "
          "printf 'gptj train: pid 1 host elsewhere job - since 2026-01-01T00:00:00Z token y\\n' > %s/lock.new; "
          "mv %s/lock.new %s/lock; wait $p",
          B_, COMMON, DATA, run, log, run, log, run, log, run, run, run, run);
  ck_assert_msg(rc == 1, "a trainer whose lock was taken did not stop with exit 1 (%d)", rc);
  ck_assert(grep(log, "the lock was removed while this run held it: taken again"));
  ck_assert(grep(log, "another process has taken the run directory.s lock: stopping at step [0-9]* without saving"));
  ck_assert(sh("grep -q 'host elsewhere' %s/lock && ! ls %s/ckpt-* >/dev/null 2>&1", run, run) == 0);
  sh("rm -f %s/lock", run);
  /* a holder of another host (a UTS namespace here) stopped past GJ_LOCK_STALE_S: a second
   * trainer takes the stale lock over, finishes and releases it; the first, continued, must not
   * take the directory back: it stops without saving, and the second's checkpoint stays */
  sh("rm -rf %s", run);
  unlink(log);
  sh("rm -f %s.pid", run);
  rc = sh("(unshare --uts sh -c 'hostname gj-elsewhere; exec env GJ_LOCK_STALE_S=2 %s/gptj train %s --data %s --steps 100000 "
          "--run-dir %s' >%s 2>&1 & echo $! >%s.pid; wait) & "
          WAIT_LOG("step 3/") "p=$(cat %s.pid); "
          "kill -STOP $p && sleep 2.5 && GJ_LOCK_STALE_S=2 %s/gptj train %s --data %s --steps 3 --run-dir %s >%s 2>&1; e=$?; "
          "kill -CONT $p; wait; exit $e",
          B_, COMMON, DATA, run, log, run, log, run, B_, COMMON, DATA, run, log2);
  ck_assert_msg(rc == 0, "the second trainer did not take the stale lock over (exit %d)", rc);
  ck_assert(grep(log2, "removed a stale lock.*not touched"));
  ck_assert(grep(log, "lock is gone after this run had not refreshed it .*: stopping at step [0-9]* without saving"));
  ck_assert(sh("test \"$(cat %s/latest)\" = ckpt-00000003.h5 && ls %s/ckpt-* | wc -l | grep -qx 1 && test ! -e %s/lock",
               run, run, run) == 0);
}
END_TEST

/* A fresh start into a run directory with checkpoints is refused and changes nothing;
 * --overwrite starts over; a restart from an older checkpoint of the same directory needs
 * --overwrite for the later ones; rotation never deletes what `latest` names. */
START_TEST(test_fresh_start_and_rotation) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/fresh", OUT);
  snprintf(log, sizeof log, "%s/fresh.log", OUT);
  sh("rm -rf %s", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 6 --save-every 2 --keep-checkpoints 5 --run-dir %s",
                        COMMON, DATA, run), 0);
  sh("cd %s && md5sum ckpt-*.h5 latest metrics.jsonl config.conf > ../fresh.md5", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 6 --run-dir %s", COMMON, DATA, run), 1);
  ck_assert(grep(log, "holds a run (checkpoints up to step 6): continue it with --resume auto, or start over with --overwrite"));
  ck_assert_msg(sh("cd %s && md5sum -c --quiet ../fresh.md5", run) == 0, "the refused start changed the run directory");
  /* intact checkpoints of another model: refused, saying why, not that they are damaged */
  ck_assert_int_eq(gptj(0, log, "train %s --n_layer 7 --data %s --steps 8 --run-dir %s --resume auto", COMMON, DATA, run), 1);
  ck_assert(grep(log, "none of its 3 checkpoints loads (the newest: .*ckpt-00000006.h5: checkpoint has n_layer = 2, "
                      "this run has 7); refusing to start over"));
  ck_assert_msg(sh("cd %s && md5sum -c --quiet ../fresh.md5", run) == 0, "the refused resume changed the run directory");
  /* a restart from step 2 in the same directory */
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 4 --run-dir %s --resume %s/ckpt-00000002.h5",
                        COMMON, DATA, run, run), 1);
  ck_assert(grep(log, "has checkpoints past step 2 of --resume"));
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 3 --keep-checkpoints 1 --run-dir %s --resume %s/ckpt-00000002.h5 --overwrite",
                        COMMON, DATA, run, run), 0);
  ck_assert(sh("cd %s && test \"$(cat latest)\" = ckpt-00000003.h5 && test -f ckpt-00000003.h5 && "
               "test ! -e ckpt-00000004.h5 && test ! -e ckpt-00000006.h5", run) == 0);
  /* latest naming an older checkpoint than others (those later ones damaged): resuming from it
   * with --keep-checkpoints 1 keeps the new checkpoint and what latest names */
  sh("rm -rf %s && mkdir -p %s", run, run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 6 --save-every 2 --keep-checkpoints 5 --run-dir %s",
                        COMMON, DATA, run), 0);
  sh("cd %s && echo ckpt-00000002.h5 > latest && head -c 5000 ckpt-00000006.h5 > t && mv t ckpt-00000006.h5 && rm ckpt-00000004.h5", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 3 --keep-checkpoints 1 --run-dir %s --resume auto",
                        COMMON, DATA, run), 0);
  ck_assert_msg(sh("cd %s && test -f \"$(cat latest)\" && test \"$(cat latest)\" = ckpt-00000003.h5", run) == 0,
                "latest names a deleted checkpoint after rotation");
  /* --overwrite of a fresh start deletes the old run first */
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s --overwrite", COMMON, DATA, run), 0);
  ck_assert(sh("cd %s && ls ckpt-*.h5 | tr '\\n' ' ' | grep -qx 'ckpt-00000001.h5 ' && test \"$(cat latest)\" = ckpt-00000001.h5", run) == 0);
}
END_TEST

/* --max-time: the run stops with a checkpoint of the step it reached (latest names it) and exit
 * 0, validations due on the way run (short ones here: 2 micro-batches; the look-ahead counts a
 * validation, the first one estimated from the step time, and leaves out one that would not
 * fit: the budget of 20 s leaves room for one at step 3 up to steps of about 2.8 s, four
 * times the sanitizer build's 0.7 s on loaded cores, where 4 s did not); resumed, it goes on
 * from there. */
START_TEST(test_max_time) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/maxtime", OUT);
  snprintf(log, sizeof log, "%s/maxtime.log", OUT);
  sh("rm -rf %s", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --valid-data %s --eval-every 3 --eval-batches 2 --steps 1000000 "
                        "--max-time 20 --run-dir %s", COMMON, DATA, DATA, run), 0);
  ck_assert(grep(log, "^--max-time: stopped at step [0-9]* after a checkpoint$"));
  ck_assert(grep(log, "val_loss\\|validation"));
  ck_assert_int_eq(sh("n=$(sed -n 's/^--max-time: stopped at step \\([0-9]*\\) .*/\\1/p' %s) && "
                      "test \"$(cat %s/latest)\" = \"$(printf 'ckpt-%%08d.h5' $n)\"", log, run), 0);
  /* temporaries of an interrupted run go at the start, a user's files of similar names stay */
  sh("cd %s && touch ckpt-00000099.h5.tmp latest.tmp.123 lock.stale.77 ckpt-notes.tmp.txt latest.tmpl lock.stale.x", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1000000 --max-time 1 --run-dir %s --resume auto", COMMON, DATA, run), 0);
  ck_assert(grep(log, "resumed from"));
  ck_assert(grep(log, "removed 3 temporary file(s) of an interrupted run"));
  ck_assert_int_eq(sh("cd %s && ! ls ckpt-00000099.h5.tmp latest.tmp.123 lock.stale.77 2>/dev/null && "
                      "ls ckpt-notes.tmp.txt latest.tmpl lock.stale.x >/dev/null", run), 0);
}
END_TEST

/* A run that crashed after its last checkpoint logged steps it will train again: resumed, its
 * metrics.jsonl has every step once. */
START_TEST(test_metrics_resume) {
  char run[1300], log[1400];
  snprintf(run, sizeof run, "%s/metrics", OUT);
  snprintf(log, sizeof log, "%s/metrics.log", OUT);
  sh("rm -rf %s", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 6 --save-every 4 --keep-checkpoints 5 --eval-every 2 "
                        "--valid-data %s --eval-batches 1 --run-dir %s", COMMON, DATA, DATA, run), 0);
  /* as if the run had died after step 6, before its final checkpoint */
  sh("cd %s && rm ckpt-00000006.h5 && echo ckpt-00000004.h5 > latest && printf '{\"step\": 7, \"lo' >> metrics.jsonl", run);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 8 --eval-every 2 --valid-data %s --eval-batches 1 "
                        "--run-dir %s --resume auto", COMMON, DATA, DATA, run), 0);
  ck_assert_msg(sh("cd %s && test \"$(grep -c '\"loss\"' metrics.jsonl)\" = 8 && "
                   "test \"$(grep -o '\"step\": [0-9]*, \"loss\"' metrics.jsonl | sort -u | wc -l)\" = 8 && "
                   "test \"$(grep -c val_loss metrics.jsonl)\" = 4 && ! grep -qv '}$' metrics.jsonl", run) == 0,
                "metrics.jsonl has duplicate, missing or broken records after the resume");
}
END_TEST

/* A stop signal at any moment of the start-up (MPI set-up, the kernel check and re-exec, data,
 * allocation, resume, the peak probe) ends the run with exit 0; before the first step it
 * leaves the run directory as it was. */
START_TEST(test_signal_startup) {
  char run[1300], log[1400], base[1300];
  snprintf(run, sizeof run, "%s/sigup", OUT);
  snprintf(base, sizeof base, "%s/sigup-base", OUT);
  snprintf(log, sizeof log, "%s/sigup.log", OUT);
  sh("rm -rf %s %s", run, base);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 2 --run-dir %s", COMMON, DATA, base), 0);
  int before = 0, after = 0;
  /* (not SIGINT: a background job of a script ignores it, and gptj keeps an ignored signal ignored) */
  const char *sigs[] = {"USR1", "TERM", "HUP", "TERM"};
  /* Each delay counts from gptj's first act, installing its handlers: a signal before a
   * program's first instruction (the loader, the sanitizer runtime, library constructors) takes
   * the default action in any program. ready PID N waits until N gptj processes (the process
   * itself when N is 1, else its children: the ranks of mpirun) catch the signal or hold it
   * blocked (across the OpenBLAS re-exec), by /proc/PID/status. */
  const char *ready =
      "ready() { i=0; while [ $i -lt 3000 ] && kill -0 $1 2>/dev/null; do "
      "if [ $2 -eq 1 ]; then ps=$1; else ps=$(pgrep -P $1); fi; n=0; "
      "for q in $ps; do [ \"$(cat /proc/$q/comm 2>/dev/null)\" = gptj ] || continue; "
      "c=$(sed -n 's/^SigCgt:[[:space:]]*//p' /proc/$q/status 2>/dev/null); "
      "b=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/$q/status 2>/dev/null); "
      "[ -n \"$c\" ] && [ -n \"$b\" ] && [ $(( (0x$c | 0x$b) >> ($3 - 1) & 1 )) -eq 1 ] && n=$((n + 1)); done; "
      "[ $n -ge $2 ] && return 0; sleep 0.01; i=$((i + 1)); done; }; ";
  for (int trial = 0; trial < 12; trial++) {
    int np = trial % 3 == 2 ? 2 : 0;
    /* over the whole start-up (about 3 s here: kernel check, MPI, data, model, GEMM check) */
    double delay = np ? 0.15 * trial : 0.3 * trial;
    const char *sig = np ? "USR1" : sigs[trial % 4];
    int signo = !strcmp(sig, "USR1") ? SIGUSR1 : !strcmp(sig, "TERM") ? SIGTERM : SIGHUP;
    sh("rm -rf %s && cp -a %s %s && rm -f %s/lock", run, base, run, run);
    char launch[1500];
    if (np) snprintf(launch, sizeof launch, "%s -np 2 %s/gptj", MPI_, B_);
    else snprintf(launch, sizeof launch, "%s/gptj", B_);
    int rc = sh("%s%s train %s --data %s --steps 100000 --run-dir %s --resume auto >%s 2>&1 & p=$!; "
                "ready $p %d %d; sleep %.2f; kill -%s $p; wait $p", ready, launch, COMMON, DATA, run, log,
                np ? np : 1, signo, delay, sig);
    if (rc) sh("cat %s >&2", log);
    ck_assert_msg(rc == 0, "SIG%s %.2f s after the handlers (np %d): exit %d", sig, delay, np, rc);
    if (grep(log, "before the first step")) {
      before++;
      ck_assert_msg(sh("cd %s && test \"$(cat latest)\" = ckpt-00000002.h5 && test \"$(ls ckpt-*.h5)\" = ckpt-00000002.h5 && "
                       "cmp -s metrics.jsonl %s/metrics.jsonl && test ! -e lock", run, base) == 0,
                    "stopped before the first step but the run directory changed (SIG%s at %.2f s)", sig, delay);
    } else {
      after++;
      ck_assert_msg(grep(log, "signal: stopped at step"), "SIG%s at %.2f s: neither stopped before nor after a step", sig, delay);
    }
  }
  fprintf(stderr, "start-up signals: %d stopped before the first step, %d after a step\n", before, after);
  ck_assert_msg(before >= 3, "only %d of 12 signals arrived during the start-up", before);
}
END_TEST

/* A run directory near PATH_MAX: train, save, resume, eval, generate, info. */
START_TEST(test_long_paths) {
  char run[GJ_PATH_BUF], log[1400], seg[201];
  memset(seg, 'p', 200), seg[200] = 0;
  int n = snprintf(run, sizeof run, "%s/long", OUT);
  while (n + 210 < 3900) n += snprintf(run + n, sizeof run - n, "/%s", seg);
  snprintf(log, sizeof log, "%s/long.log", OUT);
  sh("rm -rf %s/long", OUT);
  ck_assert_int_eq(gptj(2, log, "train %s --data %s --steps 2 --save-every 1 --run-dir %s", COMMON, DATA, run), 0);
  ck_assert_int_eq(gptj(2, log, "train %s --data %s --steps 3 --run-dir %s --resume auto", COMMON, DATA, run), 0);
  ck_assert(grep(log, "resumed from"));
  ck_assert_int_eq(gptj(2, log, "eval --checkpoint %s/ckpt-00000003.h5 --data %s --seq-len 32 --max-windows 4", run, DATA), 0);
  ck_assert_int_eq(gptj(0, log, "generate --checkpoint %s/ckpt-00000003.h5 --prompt-ids 1,2 --ids --max-new-tokens 2", run), 0);
  ck_assert_int_eq(gptj(0, log, "info %s/ckpt-00000003.h5", run), 0);
  /* longer than PATH_MAX: refused with a clear line, no crash */
  char longer[2 * GJ_PATH_BUF];
  snprintf(longer, sizeof longer, "%s/%s/%s", run, seg, seg);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s", COMMON, DATA, longer), 1);
  ck_assert(grep(log, "characters, at most 4048"));
  sh("rm -rf %s/long", OUT);
}
END_TEST

/* The memory check uses the cgroup limit (what Slurm's --mem sets): a real v1 or v2 memory
 * cgroup below this process's own, 100 MiB: train, eval and generate are refused before they
 * allocate, naming the limit (eval and generate hold the weights only: a model of 169 MB of
 * weights); generate of the tiny model (26 MB of weights, no gradients or moments) runs
 * within it; encode refuses a 5 MB word, whose BPE workspace would not fit. */
START_TEST(test_memory_cgroup) {
  char ck[1400], big[1400], log[1400];
  snprintf(ck, sizeof ck, "%s/cg-run/ckpt-00000001.h5", OUT);
  snprintf(big, sizeof big, "%s/cg-big/ckpt-00000001.h5", OUT);
  snprintf(log, sizeof log, "%s/cg.log", OUT);
  sh("rm -rf %s/cg-run %s/cg-big", OUT, OUT);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s/cg-run", COMMON, DATA, OUT), 0);
  ck_assert_int_eq(gptj(0, log, "train %s --n_embd 384 --data %s --steps 1 --run-dir %s/cg-big", COMMON, DATA, OUT), 0);
  /* our own memory cgroup: v1's memory controller, else v2's unified hierarchy */
  const char *mk =
      "p=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3); "
      "if [ -n \"$p\" ] && [ -d /sys/fs/cgroup/memory$p ]; then cg=/sys/fs/cgroup/memory$p/gjtest$$; lim=memory.limit_in_bytes; "
      "else p=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); cg=/sys/fs/cgroup$p/gjtest$$; lim=memory.max; fi; "
      "mkdir $cg && echo 100M > $cg/$lim || { rmdir $cg 2>/dev/null; exit 99; }; ";
  /* a word of 5 MB without a break: its BPE workspace (28 bytes a byte) is refused cleanly */
  char word[1400];
  snprintf(word, sizeof word, "%s/cg-word.txt", OUT);
  sh("head -c 5000000 /dev/zero | tr '\\0' a > %s", word);
  for (int i = 0; i < 5; i++) {
    char args[2048];
    if (i == 0) snprintf(args, sizeof args, "train %s --data %s --steps 1 --run-dir %s/cg-run2", COMMON, DATA, OUT);
    if (i == 1) snprintf(args, sizeof args, "eval --checkpoint %s --data %s --seq-len 128 --micro-batch 4", big, DATA);
    if (i == 2) snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids 1,2 --ids", big);
    if (i == 3) snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids 1,2 --ids --max-new-tokens 4", ck);
    if (i == 4) snprintf(args, sizeof args, "encode <%s", word);
    int rc = sh("%s (echo $BASHPID > $cg/cgroup.procs && exec %s/gptj %s) >%s 2>&1; e=$?; "
                "for i in $(seq 50); do rmdir $cg 2>/dev/null && break; sleep 0.1; done; exit $e",
                mk, B_, args, log);
    ck_assert_msg(rc != 99, "cannot make a memory cgroup here (root is needed)");
    if (rc != (i != 3)) sh("cat %s >&2", log);
    ck_assert_int_eq(rc, i != 3);
    if (i < 3) ck_assert(grep(log, "under the cgroup memory limit of 0.10 GB"));
    if (i == 4) ck_assert(grep(log, "gptj encode: error: tokenizer: a piece of 5000000 bytes without a break .* needs 0.14 GB"));
  }
  sh("rm -f %s", word);
}
END_TEST

/* The cgroup reader on made-up trees: v2 (the tightest of the ancestors, reclaimable page
 * cache not counted as used) and v1, as /proc/self/cgroup lists them. */
START_TEST(test_cgroup_trees) {
  char root[1300];
  snprintf(root, sizeof root, "%s/cgtree", OUT);
  sh("rm -rf %s && mkdir -p %s/unified/slurm/job_5/step_0 %s/memory/a/b && cd %s && touch unified/cgroup.controllers && "
     "echo 8000000000 > unified/slurm/memory.max && echo max > unified/slurm/job_5/step_0/memory.max && "
     "echo 1000000000 > unified/slurm/job_5/memory.max && echo 300000000 > unified/slurm/job_5/memory.current && "
     "echo 'anon 1\ninactive_file 100000000' > unified/slurm/job_5/memory.stat && echo 0 > unified/slurm/memory.current && "
     "echo 9223372036854771712 > memory/a/memory.limit_in_bytes && echo 500000000 > memory/a/b/memory.limit_in_bytes && "
     "echo 200000000 > memory/a/b/memory.usage_in_bytes && "
     "echo '0::/slurm/job_5/step_0' > v2.txt && printf '5:cpu:/x\\n4:memory:/a/b\\n' > v1.txt && echo '0::/' > none.txt",
     root, root, root, root);
  gj_cgroup_mem m;
  char p[1400];
  snprintf(p, sizeof p, "%s/v2.txt", root);
  ck_assert_int_eq(gj_cgroup_memory(p, root, &m), 0);
  ck_assert(m.limit == 1e9 && m.available == 8e8);
  ck_assert(strstr(m.path, "unified/slurm/job_5"));
  snprintf(p, sizeof p, "%s/v1.txt", root);
  ck_assert_int_eq(gj_cgroup_memory(p, root, &m), 0);
  ck_assert(m.limit == 5e8 && m.available == 3e8);
  snprintf(p, sizeof p, "%s/none.txt", root);
  ck_assert_int_eq(gj_cgroup_memory(p, root, &m), -1);
}
END_TEST

/* An error seen on one rank only is printed with its reason and the rank: rank 1 looks for
 * the vocabulary in a directory that does not exist (another environment, as on a node with
 * other mounts). Ranks given different command lines are refused, naming the first. */
START_TEST(test_error_other_rank) {
  char log[1400], ck[1400];
  snprintf(log, sizeof log, "%s/rank1.log", OUT);
  snprintf(ck, sizeof ck, "%s/r1a/ckpt-00000001.h5", OUT);
  sh("rm -rf %s/r1a", OUT);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s/r1a", COMMON, DATA, OUT), 0);
  int rc = sh("timeout 120 %s -np 1 %s/gptj generate --checkpoint %s --prompt hello : -np 1 env GJ_DATA_DIR=%s/nowhere "
              "%s/gptj generate --checkpoint %s --prompt hello >%s 2>&1", MPI_, B_, ck, OUT, B_, ck, log);
  ck_assert_int_eq(rc, 1);
  ck_assert(grep(log, "gptj generate: error: \\[rank 1\\] .*nowhere/gpt2: tokenizer directory not found"));
  rc = sh("timeout 120 %s -np 1 %s/gptj train %s --data %s --run-dir %s/r1b : -np 1 %s/gptj train %s "
          "--data %s --run-dir %s/r1b --n_layer 3 >%s 2>&1", MPI_, B_, COMMON, DATA, OUT, B_, COMMON, DATA, OUT, log);
  ck_assert_int_eq(rc, 1);
  ck_assert(grep(log, "gptj train: error: \\[rank 1\\] its command line differs from rank 0"));
}
END_TEST

/* Checked at start rather than hours later: a validation set shorter than one window; the
 * data order of a weights-only checkpoint follows --seed. */
START_TEST(test_start_checks) {
  char log[1400], ck[1400];
  snprintf(log, sizeof log, "%s/start.log", OUT);
  sh("rm -rf %s/sc %s/sc-hf %s/sc-w %s/sc-a %s/sc-b && head -c 60 %s/data/brown-valid.txt > %s/short.txt",
     OUT, OUT, OUT, OUT, OUT, S_, OUT);
  ck_assert_int_eq(gptj(0, log, "tokenize --out %s/short.h5 %s/short.txt", OUT, OUT), 0);
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --valid-data %s/short.h5 --eval-every 100 --steps 200 --run-dir %s/sc",
                        COMMON, DATA, OUT, OUT), 1);
  ck_assert(grep(log, "--valid-data .*short.h5: [0-9]* tokens, fewer than one window of seq_len + 1 = 33"));
  ck_assert(sh("test ! -e %s/sc/metrics.jsonl", OUT) == 0);
  /* a weights-only checkpoint: HF round trip of a trained one */
  ck_assert_int_eq(gptj(0, log, "train %s --data %s --steps 1 --run-dir %s/sc", COMMON, DATA, OUT), 0);
  ck_assert_int_eq(gptj(0, log, "convert --to-hf %s/sc-hf --checkpoint %s/sc/ckpt-00000001.h5", OUT, OUT), 0);
  snprintf(ck, sizeof ck, "%s/sc-w.h5", OUT);
  ck_assert_int_eq(gptj(0, log, "convert --from-hf %s/sc-hf --out %s", OUT, ck), 0);
  double loss[2];
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(gptj(0, log, "train --preset tiny --seq-len 32 --micro-batch 4 --data %s --steps 1 --seed %d "
                          "--run-dir %s/sc-%c --resume %s", DATA, 11 + s, OUT, 'a' + s, ck), 0);
    char p[1400];
    snprintf(p, sizeof p, "%s/sc-%c/metrics.jsonl", OUT, 'a' + s);
    FILE *f = fopen(p, "r");
    ck_assert(f != NULL);
    char line[4096] = "";
    ck_assert(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    char *l = strstr(line, "\"loss\": ");
    ck_assert(l != NULL);
    loss[s] = atof(l + 8);
  }
  ck_assert_msg(loss[0] != loss[1], "--seed did not change the data order of a weights-only checkpoint (%.9g)", loss[0]);
}
END_TEST

int main(void) {
  /* The signals these cases send take their default action in the processes they start (gptj
   * keeps an ignored signal ignored, as a program under nohup should): a harness run under
   * nohup ignores SIGHUP, and a stop signal would then never arrive. */
  const int stops[] = {SIGHUP, SIGTERM, SIGUSR1, SIGINT};
  for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) signal(stops[i], SIG_DFL);
  if (tu_gptj_setup(B_, S_, MPI_, OUT, DATA, sizeof MPI_, "faults")) return 1;
  Suite *s = suite_create("faults");
  /* "long": whole-process behaviour (locks between processes, signals at start-up, a memory
   * cgroup), left out of the sanitizer build's run */
  TU_ADD(s, test_lock, "long", 900);
  TU_ADD(s, test_fresh_start_and_rotation, NULL, 900);
  TU_ADD(s, test_metrics_resume, NULL, 900);
  TU_ADD(s, test_signal_startup, "long", 900);
  TU_ADD(s, test_long_paths, NULL, 900);
  TU_ADD(s, test_memory_cgroup, "long", 900);
  TU_ADD(s, test_cgroup_trees, NULL, 900);
  TU_ADD(s, test_error_other_rank, NULL, 900);
  TU_ADD(s, test_start_checks, NULL, 900);
  TU_ADD(s, test_max_time, NULL, 900);
  return tu_run(s);
}
