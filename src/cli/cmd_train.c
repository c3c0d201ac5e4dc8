/* gptj train: the training loop. Data parallel over DP, tensor parallel over TP, gradient
 * accumulation, AdamW with GPT-J's schedule, validation, checkpoints and resume, signals. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/evaluate.h"
#include "cli/gemmopts.h"
#include "cli/memcheck.h"
#include "cli/modelopts.h"
#include "common.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/rundir.h"
#include "model/flops.h"
#include "model/gemm.h"
#include "model/gptj.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/dp.h"
#include "parallel/grid.h"

typedef struct {
  const char *data, *valid_data, *run_dir, *resume, *gemm, *precision;
  int overwrite;
  int64_t tp, micro_batch, grad_accum, seq_len, steps, warmup, decay_steps, seed, log_every;
  int64_t eval_every, eval_batches, save_every, keep, max_bad, compress, inject_nan, zero, recompute;
  double lr, floor, beta1, beta2, eps, wd, clip, zloss, max_time, mem_gb;
} train_opts;

static gj_opt *train_table(train_opts *o) {
  static gj_opt t[64];
  gj_opt src[] = {
      {"data", GJ_OPT_STR, &o->data, "training token dataset (from gptj tokenize), required", 1, 0},
      {"valid-data", GJ_OPT_STR, &o->valid_data, "validation token dataset", 1, 0},
      {"run-dir", GJ_OPT_STR, &o->run_dir, "directory for config, metrics.jsonl and checkpoints", 1, 0},
      {"resume", GJ_OPT_STR, &o->resume, "'auto' (latest checkpoint of --run-dir, if any), a checkpoint path, or 'none'", 1, 0},
      {"overwrite", GJ_OPT_FLAG, &o->overwrite, "start over in a --run-dir that holds checkpoints (deletes them; with --resume PATH: those past its step)", 1, 0},
      {"tp", GJ_OPT_I64, &o->tp, "tensor-parallel size (DP = ranks / TP)", 1, 4096},
      {"precision", GJ_OPT_STR, &o->precision, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &o->gemm, GJ_GEMM_HELP, 1, 0},
      {"zero", GJ_OPT_I64, &o->zero, "1: ZeRO-1, AdamW moments sharded over the DP ranks", 0, 1},
      {"recompute", GJ_OPT_I64, &o->recompute, "1: recompute each layer's activations in backward (less memory)", 0, 1},
      {"micro-batch", GJ_OPT_I64, &o->micro_batch, "sequences per rank per forward", 1, 1 << 20},
      {"grad-accum", GJ_OPT_I64, &o->grad_accum, "micro-batches per step (global batch = micro-batch x grad-accum x DP)", 1, 1 << 20},
      {"seq-len", GJ_OPT_I64, &o->seq_len, "tokens per sequence (0: n_positions)", 0, 1 << 20},
      {"steps", GJ_OPT_I64, &o->steps, "optimizer steps in total", 1, 1e12},
      {"lr", GJ_OPT_F64, &o->lr, "peak learning rate", 0, 10},
      {"warmup", GJ_OPT_I64, &o->warmup, "linear warmup steps", 0, 1e12},
      {"decay-steps", GJ_OPT_I64, &o->decay_steps, "step where the cosine decay reaches the floor (0: --steps)", 0, 1e12},
      {"lr-floor", GJ_OPT_F64, &o->floor, "final learning rate as a fraction of the peak", 0, 1},
      {"beta1", GJ_OPT_F64, &o->beta1, "AdamW beta1", 0, 0.999999},
      {"beta2", GJ_OPT_F64, &o->beta2, "AdamW beta2", 0, 0.999999},
      {"eps", GJ_OPT_F64, &o->eps, "AdamW epsilon", 0, 1},
      {"weight-decay", GJ_OPT_F64, &o->wd, "decoupled weight decay (2-D tensors only)", 0, 10},
      {"clip", GJ_OPT_F64, &o->clip, "global gradient-norm clip (0: off)", 0, 1e9},
      {"zloss", GJ_OPT_F64, &o->zloss, "z-loss coefficient on log(Z)^2 (GPT-J used 1e-4)", 0, 1},
      {"seed", GJ_OPT_I64, &o->seed, "seed of the initialisation and the data order", 0, 9e18},
      {"log-every", GJ_OPT_I64, &o->log_every, "steps between log lines", 1, 1e12},
      {"eval-every", GJ_OPT_I64, &o->eval_every, "steps between validation runs (0: off)", 0, 1e12},
      {"eval-batches", GJ_OPT_I64, &o->eval_batches, "micro-batches per rank per validation (0: whole set)", 0, 1e12},
      {"save-every", GJ_OPT_I64, &o->save_every, "steps between checkpoints (0: only at the end)", 0, 1e12},
      {"keep-checkpoints", GJ_OPT_I64, &o->keep, "checkpoints kept in --run-dir (0: all)", 0, 1e6},
      {"ckpt-compress", GJ_OPT_I64, &o->compress, "deflate level of checkpoints (0: off)", 0, 9},
      {"max-time", GJ_OPT_F64, &o->max_time, "wall-clock seconds after which to checkpoint and stop (0: none)", 0, 1e9},
      {"mem-per-rank-gb", GJ_OPT_F64, &o->mem_gb, "memory a rank may use, GB (0: available memory / ranks on the node)", 0, 1e9},
      {"max-bad-steps", GJ_OPT_I64, &o->max_bad, "consecutive non-finite steps before stopping", 1, 1e9},
      {"debug-nan-step", GJ_OPT_I64, &o->inject_nan, "debug: inject a NaN into the gradients at this step", 0, 1e12},
      {NULL}};
  memcpy(t, src, sizeof src);
  return t;
}

static double peak_rss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024.0;
}

static void fmt_time(char *out, size_t n, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

/* config.conf of the run: written under a temporary name, synced and renamed. */
static int write_config(const char *path, const gj_config *c, const gj_opt *t) {
  char tmp[GJ_PATH_BUF + 32];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  gj_tmp_register(tmp);
  FILE *f = fopen(tmp, "w");
  if (!f) return gj_tmp_unregister(tmp), GJ_FAIL("%s: %s", tmp, strerror(errno));
  fprintf(f, "# effective configuration of this run (gptj train --config %s)\n", path);
  fprintf(f, "vocab_size = %lld\nn_positions = %lld\nn_embd = %lld\nn_layer = %lld\nn_head = %lld\n"
          "rotary_dim = %lld\nn_inner = %lld\nlayer_norm_epsilon = %.17g\n",
          (long long)c->vocab_size, (long long)c->n_positions, (long long)c->n_embd,
          (long long)c->n_layer, (long long)c->n_head, (long long)c->rotary_dim,
          (long long)c->n_inner, c->layer_norm_epsilon);
  for (const gj_opt *o = t; o->name; o++) {
    if (!strcmp(o->name, "resume")) continue;
    switch (o->type) {
    case GJ_OPT_I64: fprintf(f, "%s = %lld\n", o->name, (long long)*(int64_t *)o->dst); break;
    case GJ_OPT_F64: fprintf(f, "%s = %.17g\n", o->name, *(double *)o->dst); break;
    case GJ_OPT_STR:
      if (*(const char **)o->dst) fprintf(f, "%s = %s\n", o->name, *(const char **)o->dst);
      break;
    default: break;
    }
  }
  int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    unlink(tmp), gj_tmp_unregister(tmp);
    return GJ_FAIL("%s: write failed (disk full?)", path);
  }
  gj_tmp_unregister(tmp);
  return 0;
}

/* A stop point of the start-up: a stop signal on any rank ends the run here, cleanly, before
 * it has written anything (main exits 0 with this message). */
static int stop_point(const char *run_dir, const char *phase) {
  int sig = gj_stop_signal();
  if (MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS || !sig) return 0;
  int64_t l = gj_rundir_latest(run_dir);
  char latest[64] = "no checkpoint yet";
  if (l >= 0) snprintf(latest, sizeof latest, "latest is still ckpt-%08lld.h5", (long long)l);
  GJ_FAIL("stopped by %s while %s, before the first step: %s left as it was (%s)", gj_signal_name(sig),
          phase, run_dir, latest);
  return GJ_STOPPED;
}

/* Try the checkpoints of `resume` newest first; a damaged one is reported and skipped. */
static int do_resume(gj_model *m, const char *resume, const char *run_dir, gj_ckpt_meta *meta,
                     int *resumed) {
  *resumed = 0;
  if (!resume || !strcmp(resume, "none")) return 0;
  double t0 = gj_now();
  if (strcmp(resume, "auto")) {
    GJ_TRY(gj_ckpt_load(resume, m, meta, 1));
    gj_info("resumed from %s at step %lld (loaded in %.2f s)", resume, (long long)meta->step, gj_now() - t0);
    *resumed = 1;
    return 0;
  }
  /* rank 0's view of the directory decides */
  int64_t *steps = NULL;
  int n = 0, rc = m->g->rank == 0 ? gj_ckpt_candidates(run_dir, &steps, &n) : 0;
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (m->g->rank != 0) steps = malloc((n ? n : 1) * sizeof(int64_t));
  if (!steps && n) return GJ_FAIL("out of memory");
  if (n) MPI_Bcast(steps, n, MPI_INT64_T, 0, MPI_COMM_WORLD);
  char path[GJ_PATH_BUF];
  for (int i = 0; i < n; i++) {
    rc = gj_ckpt_path(path, sizeof path, run_dir, steps[i]);
    if (!rc) rc = gj_ckpt_load(path, m, meta, 1);
    if (!rc) {
      gj_info("resumed from %s at step %lld (loaded in %.2f s)", path, (long long)meta->step, gj_now() - t0);
      *resumed = 1;
      break;
    }
    if (rc == GJ_STOPPED) break;
    if (m->g->rank == 0) gj_warn("cannot resume from %s: %s; trying an older checkpoint", path, gj_errmsg());
  }
  free(steps);
  if (rc == GJ_STOPPED) return rc;
  if (n > 0 && !*resumed)
    return GJ_FAIL("%s: no usable checkpoint (all %d damaged); refusing to start over in a run "
                   "directory that has checkpoints", run_dir, n);
  if (n == 0) gj_info("no checkpoint in %s: starting from scratch", run_dir);
  return 0;
}

static int save(gj_model *m, const train_opts *o, gj_ckpt_meta *meta) {
  char path[GJ_PATH_BUF];
  GJ_TRY(gj_ckpt_path(path, sizeof path, o->run_dir, meta->step));
  double t0 = gj_now();
  GJ_TRY(gj_ckpt_save(path, m, meta, (int)o->compress));
  double secs = gj_now() - t0; /* written, synced and renamed: complete */
  int rc = 0;
  if (m->g->rank == 0) {
    rc = gj_ckpt_set_latest(o->run_dir, path);
    if (!rc) rc = gj_ckpt_rotate(o->run_dir, (int)o->keep, meta->step);
  }
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  gj_info("saved %s (%.2f s)", path, secs);
  return 0;
}

/* A resumed run trains with this command's hyperparameters: say which differ from the
 * checkpoint's (a forgotten flag changes the schedule), and that the data order continues
 * with the checkpoint's seed. */
static void warn_changed(const gj_ckpt_meta *ck, const gj_adamw_hp *hp, const gj_schedule *s, uint64_t seed) {
  char buf[512] = "";
  size_t n = 0;
#define DIFF(name, a, b)                                                                     \
  if ((double)(a) != (double)(b) && n < sizeof buf)                                          \
    n += snprintf(buf + n, sizeof buf - n, "%s --" name " %g (checkpoint %g)", n ? "," : "", (double)(b), (double)(a));
  DIFF("lr", ck->hp.lr, hp->lr)
  DIFF("beta1", ck->hp.beta1, hp->beta1)
  DIFF("beta2", ck->hp.beta2, hp->beta2)
  DIFF("eps", ck->hp.eps, hp->eps)
  DIFF("weight-decay", ck->hp.weight_decay, hp->weight_decay)
  DIFF("clip", ck->hp.grad_clip, hp->grad_clip)
  DIFF("warmup", ck->sched.warmup, s->warmup)
  DIFF("decay-steps", ck->sched.decay_steps, s->decay_steps)
  DIFF("lr-floor", ck->sched.floor, s->floor)
#undef DIFF
  if (n) gj_warn("resuming with other hyperparameters than the checkpoint's:%s", buf);
  if (ck->loader.seed != seed)
    gj_warn("--seed %llu differs from the checkpoint's %llu: the data order continues with the "
            "checkpoint's (the resume is exact)", (unsigned long long)seed, (unsigned long long)ck->loader.seed);
}

/* Rank 0: create and lock the run directory, and refuse a fresh start in one that holds a
 * run unless --overwrite says so (agreed). */
static int claim_run_dir(const train_opts *o, int rank) {
  int rc = 0;
  if (rank == 0) {
    rc = gj_rundir_create(o->run_dir);
    if (!rc) rc = gj_rundir_lock(o->run_dir);
    if (!rc) rc = gj_rundir_check(o->run_dir); /* with the lock: no other trainer changes it */
    int removed = 0;
    if (!rc) rc = gj_rundir_clean_tmp(o->run_dir, &removed);
    if (removed) gj_info("%s: removed %d temporary file(s) of an interrupted run", o->run_dir, removed);
    if (!rc && !strcmp(o->resume, "none") && !o->overwrite) {
      int64_t *steps = NULL;
      int n = 0;
      rc = gj_rundir_steps(o->run_dir, &steps, &n);
      int64_t l = gj_rundir_latest(o->run_dir);
      if (!rc && (n > 0 || l >= 0))
        rc = GJ_FAIL("--run-dir %s holds a run (checkpoints up to step %lld): continue it with --resume "
                     "auto, or start over with --overwrite (which deletes its checkpoints)",
                     o->run_dir, (long long)(n > 0 ? steps[0] : l));
      free(steps);
    }
  }
  return gj_agree(MPI_COMM_WORLD, rc);
}

/* Rank 0, after the resume: checkpoints past the step resumed from belong to an abandoned
 * future of the run (a restart from an older checkpoint): refuse unless --overwrite; and a
 * checkpoint must fit on the disk. */
static int check_run_dir(const train_opts *o, int resumed, int64_t step, double n_params) {
  int64_t *steps = NULL;
  int n = 0;
  GJ_TRY(gj_rundir_steps(o->run_dir, &steps, &n));
  int explicit = resumed && strcmp(o->resume, "auto");
  int64_t newest = n > 0 ? steps[0] : -1;
  free(steps);
  if (explicit && newest > step && !o->overwrite)
    return GJ_FAIL("--run-dir %s has checkpoints past step %lld of --resume %s (up to step %lld): "
                   "--overwrite deletes them, or use another --run-dir", o->run_dir, (long long)step,
                   o->resume, (long long)newest);
  struct statvfs vfs;
  double ckpt = 3.0 * n_params * sizeof(float) + (4 << 20);
  if (!statvfs(o->run_dir, &vfs) && (double)vfs.f_bavail * vfs.f_frsize < ckpt)
    return GJ_FAIL("--run-dir %s: %.0f MB free, a checkpoint of this model needs %.0f MB", o->run_dir,
                   (double)vfs.f_bavail * vfs.f_frsize / 1e6, ckpt / 1e6);
  return 0;
}

/* Rank 0, the last step of the start-up: the --overwrite deletions, config.conf, and
 * metrics.jsonl (a resumed run continues it from the step resumed, without duplicates). */
static int open_run_files(const train_opts *o, const gj_config *c, const gj_opt *table, int resumed,
                          int64_t step, FILE **metrics) {
  char path[GJ_PATH_BUF];
  if (o->overwrite && strcmp(o->resume, "auto")) {
    int deleted = 0;
    GJ_TRY(gj_rundir_drop_after(o->run_dir, resumed ? step : -1, &deleted));
    if (deleted) gj_info("--overwrite: deleted %d checkpoint(s) of %s past step %lld", deleted, o->run_dir,
                         (long long)(resumed ? step : 0));
  }
  GJ_TRY(gj_path_join(path, sizeof path, o->run_dir, "config.conf"));
  GJ_TRY(write_config(path, c, table));
  GJ_TRY(gj_path_join(path, sizeof path, o->run_dir, "metrics.jsonl"));
  if (resumed) GJ_TRY(gj_rundir_trim_metrics(path, step));
  *metrics = fopen(path, resumed ? "a" : "w");
  if (!*metrics) return GJ_FAIL("%s: %s", path, strerror(errno));
  return 0;
}

int gj_cmd_train(int argc, char **argv) {
  train_opts o = {.run_dir = "run", .resume = "none", .gemm = "auto", .precision = "fp32", .tp = 1, .micro_batch = 8,
                  .grad_accum = 1, .seq_len = 0, .steps = 1000, .warmup = 100,
                  .decay_steps = 0, .seed = 1234, .log_every = 1, .eval_batches = 0,
                  .keep = 3, .max_bad = 5, .lr = 6e-4, .floor = 0.1, .beta1 = 0.9,
                  .beta2 = 0.999, .eps = 1e-8, .wd = 0.1, .clip = 1.0};
  gj_opt *table = train_table(&o);
  gj_modelopts mo;
  int rc = gj_modelopts_parse(&mo, argc, argv, table,
                              "gptj train --data FILE.h5 [options]",
                              "Trains a GPT-J on a token dataset, data parallel over DP = ranks / TP and\n"
                              "tensor parallel over --tp ranks. Run it under mpirun/srun or as one process.");
  if (rc) return rc > 0 ? 0 : rc;
  gj_config c = mo.config;
  if (!o.data) return GJ_FAIL("--data: required (a token dataset from gptj tokenize)");
  if (o.seq_len == 0) o.seq_len = c.n_positions;
  if (o.seq_len > c.n_positions)
    return GJ_FAIL("--seq-len %lld exceeds n_positions %lld", (long long)o.seq_len, (long long)c.n_positions);
  if (o.decay_steps == 0) o.decay_steps = o.steps;

  gj_grid g;
  rc = gj_grid_init(&g, (int)o.tp);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  gj_log_set_rank(g.rank);
  GJ_TRY(gj_cli_gemm_setup(o.gemm, o.precision, g.world));
  GJ_TRY(stop_point(o.run_dir, "setting up"));
  GJ_TRY(claim_run_dir(&o, g.rank));
  GJ_TRY(stop_point(o.run_dir, "setting up"));

  gj_dataset train = {0}, valid = {0};
  rc = gj_dataset_read(&train, o.data, c.vocab_size);
  if (!rc && o.valid_data) rc = gj_dataset_read(&valid, o.valid_data, c.vocab_size);
  if (!rc && o.valid_data && valid.n_tokens < (uint64_t)o.seq_len + 1)
    rc = GJ_FAIL("--valid-data %s: %llu tokens, fewer than one window of seq_len + 1 = %lld", o.valid_data,
                 (unsigned long long)valid.n_tokens, (long long)o.seq_len + 1);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc == GJ_STOPPED ? stop_point(o.run_dir, "reading the data") : rc;
  if (o.eval_every > 0 && !o.valid_data)
    gj_info("note: --eval-every %lld without --valid-data: no validation runs", (long long)o.eval_every);
  gj_loader loader;
  GJ_TRY(gj_loader_init(&loader, &train, o.seq_len, (uint64_t)o.seed, 1));
  const int64_t B = o.micro_batch, A = o.grad_accum, T = o.seq_len, G = B * A * g.dp_size;
  if ((uint64_t)G > loader.n_windows)
    return GJ_FAIL("%s: global batch of %lld sequences exceeds the dataset's %llu windows of %lld tokens",
                   o.data, (long long)G, (unsigned long long)loader.n_windows, (long long)T + 1);
  GJ_TRY(stop_point(o.run_dir, "reading the data"));

  /* Refuse, before allocating, a layout that will not fit (the arithmetic of gptj plan). */
  gj_mem_sizes ms;
  GJ_TRY(gj_model_sizes(&ms, &c, g.tp_size, g.dp_size, (int)o.zero, (int)o.recompute, 1, B, T,
                        omp_get_max_threads()));
  double need = (double)ms.params + ms.grads + ms.moments + ms.acts + ms.w16;
  char detail[256];
  snprintf(detail, sizeof detail, "parameters %.2f, gradients %.2f, AdamW %.2f, activations %.2f, bf16 weight copies %.2f",
           ms.params / 1e9, ms.grads / 1e9, ms.moments / 1e9, ms.acts / 1e9, ms.w16 / 1e9);
  int local = 1;
  GJ_TRY(gj_mem_check(MPI_COMM_WORLD, need, detail,
                      "use more ranks, --tp, --zero 1, --recompute 1 or a smaller --micro-batch (see gptj plan)",
                      o.mem_gb, &local));
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (g.rank == 0 && cores > 0 && (long)local * omp_get_max_threads() > cores)
    gj_warn("%d ranks x %d threads on %ld cores of this node: oversubscribed, which is slow; "
            "set OMP_NUM_THREADS (threads per rank)", local, omp_get_max_threads(), cores);
  gj_model m;
  rc = gj_model_create(&m, &c, &g, B, T, (int)o.zero, (int)o.recompute, 1);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  gj_params_init(&m.lay, &c, m.params, (uint64_t)o.seed);
  GJ_TRY(stop_point(o.run_dir, "allocating the model"));

  /* the seed of the data order, also for a checkpoint that holds weights only */
  gj_ckpt_meta meta = {.loader = {(uint64_t)o.seed, 0, 0}};
  int resumed;
  rc = do_resume(&m, o.resume, o.run_dir, &meta, &resumed);
  if (rc == GJ_STOPPED) return stop_point(o.run_dir, "resuming");
  if (rc) return rc;
  if (resumed) GJ_TRY(gj_loader_restore(&loader, meta.loader));
  GJ_TRY(stop_point(o.run_dir, "resuming"));
  if (resumed && meta.step >= o.steps) { /* a finished run resumed again (a requeue): say so */
    gj_info("the run is already at step %lld, %s --steps %lld: nothing to train (give a larger --steps "
            "to continue it); %s is unchanged", (long long)meta.step, meta.step == o.steps ? "=" : "past",
            (long long)o.steps, o.run_dir);
    gj_model_free(&m), gj_loader_free(&loader), gj_dataset_free(&train), gj_dataset_free(&valid);
    gj_grid_free(&g);
    return 0;
  }
  gj_adamw_hp hp = {o.lr, o.beta1, o.beta2, o.eps, o.wd, o.clip};
  gj_schedule sched = {o.lr, o.warmup, o.decay_steps, o.floor};
  if (meta.has_optim && g.rank == 0) warn_changed(&meta, &hp, &sched, (uint64_t)o.seed);
  meta.hp = hp, meta.sched = sched;
  rc = g.rank == 0 ? check_run_dir(&o, resumed, meta.step, (double)m.lay.n_global) : 0;
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;

  gj_dp_sync dp;
  GJ_TRY(gj_dp_init(&dp, &g, m.grads, m.numel_pad, 0));
  double flops_tok = gj_flops_per_token(&c, T);
  /* MFU against the hardware's peak for the precision (a tight loop on every thread); the
   * GEMM efficiency against the backend's rate on exactly the products of step 1, timed alone
   * after it (once). */
  const char *peak_how;
  double peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &peak_how), gemm_rate = 0;
  double gemm_flops = 0;
  gj_info("peak: %.1f GFLOP/s per rank (%s on %d threads); GEMM: %s", peak / 1e9, peak_how,
          omp_get_max_threads(), gj_gemm_describe());
  gj_info("model: %lld parameters (%lld layers, D %lld, %lld heads, F %lld, V %lld); layout DP %d x TP %d",
          (long long)gj_config_n_params(&c), (long long)c.n_layer, (long long)c.n_embd,
          (long long)c.n_head, (long long)c.n_inner, (long long)c.vocab_size, g.dp_size, g.tp_size);
  gj_info("memory per rank: parameters+gradients+AdamW %.1f MB, activations %.1f MB, bf16 weight copies %.1f MB",
          m.arena_bytes / 1e6, m.act_bytes / 1e6, ms.w16 / 1e6);
  gj_info("data: %s, %llu tokens, %llu windows of %lld; global batch %lld sequences = %lld tokens",
          o.data, (unsigned long long)train.n_tokens, (unsigned long long)loader.n_windows,
          (long long)T + 1, (long long)G, (long long)(G * T));

  GJ_TRY(stop_point(o.run_dir, "measuring the peak"));
  /* the run directory changes from here on: a stop signal is handled after the first step */
  FILE *metrics = NULL;
  rc = g.rank == 0 ? open_run_files(&o, &c, table, resumed, meta.step, &metrics) : 0;
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  int32_t *ids = malloc(B * T * sizeof(int32_t)), *tg = malloc(B * T * sizeof(int32_t));
  uint64_t *win = malloc(G * sizeof(uint64_t));
  rc = ids && tg && win ? 0 : GJ_FAIL("out of memory for a batch of %lld sequences", (long long)G);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  double t_start = gj_now(), t_last = t_start, step_time_ema = 0;
  int64_t first = meta.step, bad = 0, tokens_at_last = meta.tokens_seen;
  int stop = 0;
  rc = 0;
  while (meta.step < o.steps && !rc) {
    double t0 = gj_now();
    int64_t step = meta.step + 1;
    rc = gj_loader_next(&loader, G, win);
    if (rc) break;
    gj_model_zero_grads(&m);
    gj_dp_begin(&dp);
    if (step == first + 1) gj_gemm_record_reset(), gj_gemm_record(1);
    double loss_sum = 0;
    float scale = (float)(1.0 / ((double)G * T));
    for (int64_t a = 0; a < A && !rc; a++) {
      for (int64_t b = 0; b < B; b++)
        gj_loader_window(&loader, win[(g.dp_rank * A + a) * B + b], ids + b * T, tg + b * T);
      double ls;
      int64_t nv;
      m.grad_ready = a == A - 1 && !m.zero ? gj_dp_ready : NULL;
      m.grad_ready_ctx = &dp;
      rc = gj_model_forward_backward(&m, ids, tg, B, T, (float)o.zloss, scale, &ls, &nv);
      loss_sum += ls;
    }
    m.grad_ready = NULL;
    gj_gemm_record(0);
    if (!rc) rc = m.zero ? gj_dp_reduce_scatter(&dp, m.zero_n) : gj_dp_finish(&dp);
    if (rc) break;
    if (o.inject_nan == step) m.grads[m.zero_lo] = NAN;
    /* Loss summed over DP; squared gradient norm over this rank's reduced range, then over
     * the TP shards (and, under ZeRO, over the DP ranges). */
    double red[2] = {loss_sum, gj_grad_sumsq(&m.lay, m.grads, g.tp_rank, m.zero_lo, m.zero_n)};
    if (m.zero) { /* every rank holds a distinct range: sum both over the world */
      rc = gj_allreduce_sum_f64(g.world, red, 2);
      red[0] /= g.tp_size; /* each DP rank's loss was counted once per TP rank */
    } else {      /* gradients are replicated over DP: the norm sums over TP only */
      rc = gj_allreduce_sum_f64(g.dp, red, 1);
      if (!rc) rc = gj_allreduce_sum_f64(g.tp, red + 1, 1);
    }
    if (rc) break;
    double loss = red[0] / ((double)G * T), norm = sqrt(red[1]);
    double lr = gj_schedule_lr(&sched, step);
    int finite = isfinite(loss) && isfinite(norm);
    if (finite) {
      gj_adamw_update(&m.lay, m.params, m.grads, m.m, m.v, m.zero_lo, m.zero_n, &hp, step, lr,
                      gj_clip_coef(norm, o.clip));
      if (m.zero) rc = gj_dp_allgather(&dp, m.params, m.zero_n);
      if (rc) break;
      gj_model_weights_changed(&m);
      bad = 0;
    } else {
      bad++;
      gj_warn("step %lld: non-finite loss %g or gradient norm %g: update skipped (%lld in a row)",
              (long long)step, loss, norm, (long long)bad);
    }
    meta.step = step;
    meta.tokens_seen += G * T;
    meta.loader = loader.st;
    double now = gj_now(), dt = now - t0;
    /* The ceilings again after 10, 100, 1000... steps, keeping the best: another job on the
     * same cores can only make a measurement low, which would inflate MFU and efficiency. */
    int64_t done = step - first;
    while (done % 10 == 0 && done > 1) done /= 10;
    if (done == 1) {
      if (step == first + 1) gemm_flops = gj_gemm_recorded_flops();
      gemm_rate = GJ_MAX(gemm_rate, gj_gemm_recorded_rate(0.05));
      if (step > first + 1) peak = GJ_MAX(peak, gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), NULL));
      double probe = gj_now() - now; /* not training time */
      t_start += probe, t_last += probe, now += probe;
    }
    step_time_ema = step_time_ema == 0 ? dt : 0.9 * step_time_ema + 0.1 * dt;
    if (g.rank == 0 && (step % o.log_every == 0 || step == o.steps)) {
      double elapsed = now - t_start, span = now - t_last;
      double tps = (meta.tokens_seen - tokens_at_last) / (span > 0 ? span : 1e-9);
      double mfu = peak > 0 ? tps * flops_tok / g.size / peak : 0;
      /* this rank's GEMM FLOPs per step over the step time, against their standalone rate */
      double geff = gemm_rate > 0 ? gemm_flops / step_time_ema / gemm_rate : 0;
      double eta = (o.steps - step) * step_time_ema;
      if (o.max_time > 0 && o.max_time - elapsed < eta) eta = GJ_MAX(0.0, o.max_time - elapsed);
      char el[32], et[32];
      fmt_time(el, sizeof el, elapsed), fmt_time(et, sizeof et, eta);
      gj_info("step %lld/%lld | loss %.4f | lr %.3e | grad %.3f | %.0f tok/s | MFU %.1f%% | GEMM eff %.0f%% | %s | ETA %s | %.0f MB",
              (long long)step, (long long)o.steps, loss, lr, norm, tps, 100 * mfu, 100 * geff, el, et,
              peak_rss_bytes() / 1e6);
      fprintf(metrics, "{\"step\": %lld, \"loss\": %.8g, \"lr\": %.8g, \"grad_norm\": %.8g, "
              "\"tokens\": %lld, \"tokens_per_s\": %.6g, \"mfu\": %.5g, \"gemm_eff\": %.5g, \"elapsed_s\": %.3f, "
              "\"eta_s\": %.1f, \"step_s\": %.4f, \"dp_wait_s\": %.5f, \"rss_bytes\": %.0f, \"skipped\": %d}\n",
              (long long)step, loss, lr, norm, (long long)meta.tokens_seen, tps, mfu, geff, elapsed, eta,
              dt, dp.wait_s, peak_rss_bytes(), !finite);
      fflush(metrics);
      t_last = now, tokens_at_last = meta.tokens_seen;
    }
    if (bad >= o.max_bad) {
      rc = GJ_FAIL("%lld non-finite steps in a row at step %lld: stopping (the last checkpoint "
                   "is kept)", (long long)bad, (long long)step);
      break;
    }
    if (o.valid_data && o.eval_every > 0 && (step % o.eval_every == 0 || step == o.steps)) {
      double nll;
      int64_t cnt;
      rc = gj_evaluate(&m, &valid, T, T, B, o.eval_batches * B * g.dp_size, &nll, &cnt);
      if (rc) break;
      gj_info("step %lld | validation loss %.4f | perplexity %.2f | %lld tokens", (long long)step,
              nll / cnt, exp(nll / cnt), (long long)cnt);
      if (metrics)
        fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.8g, \"val_ppl\": %.8g, \"val_tokens\": %lld}\n",
                (long long)step, nll / cnt, exp(nll / cnt), (long long)cnt), fflush(metrics);
    }
    /* Stop requests: a signal on any rank, or the wall-clock budget (rank 0's clock). */
    int want[3] = {gj_stop_signal() != 0, 0, gj_rundir_lock_lost()};
    if (g.rank == 0 && o.max_time > 0 && now - t_start + 2 * step_time_ema > o.max_time) want[1] = 1;
    MPI_Allreduce(MPI_IN_PLACE, want, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (want[2]) {
      rc = GJ_FAIL("%s: another process has taken the run directory's lock: stopping at step %lld "
                   "without saving", o.run_dir, (long long)step);
      break;
    }
    int last = step == o.steps || want[0] || want[1];
    if (last || (o.save_every > 0 && step % o.save_every == 0)) rc = save(&m, &o, &meta);
    if (!rc && (want[0] || want[1]) && step < o.steps) {
      gj_info("%s: stopped at step %lld after a checkpoint", want[0] ? "signal" : "--max-time",
              (long long)step);
      stop = 1;
      break;
    }
  }
  (void)first, (void)stop;
  if (metrics) fclose(metrics);
  free(ids), free(tg), free(win);
  gj_dp_free(&dp);
  gj_loader_free(&loader);
  gj_dataset_free(&train);
  gj_dataset_free(&valid);
  gj_model_free(&m);
  rc = gj_agree(MPI_COMM_WORLD, rc);
  gj_grid_free(&g);
  gj_rundir_unlock(); /* now, not at exit: mpirun may end the ranks soon after they finish */
  return rc;
}
