/* gptj train: the options, and the start-up of a run (the run directory and its lock, the
 * data, the memory check, the state and the network, the resume) before the run loop of
 * src/train/run.c takes over. Each start-up phase ends at a stop point. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/gemmopts.h"
#include "cli/memcheck.h"
#include "cli/modelopts.h"
#include "common.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/kvconf.h"
#include "io/outfile.h"
#include "io/rundir.h"
#include "model/gemm.h"
#include "model/gptj.h"
#include "model/state.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/dp.h"
#include "parallel/grid.h"
#include "train/run.h"
#include "train/step.h"

typedef struct {
  const char *data, *valid_data, *run_dir, *resume, *gemm, *precision, *grad_reduce, *zero_reduce;
  int overwrite, grad_bf16, zero_owner;
  int64_t tp, micro_batch, grad_accum, seq_len, steps, warmup, decay_steps, seed, log_every, dp_poll_us;
  int64_t eval_every, eval_batches, save_every, keep, max_bad, compress, inject_nan, nan_part, zero, recompute, oib;
  int64_t seq_len_given, decay_given; /* as given (0: follow n_positions, --steps), for config.conf */
  double lr, floor, beta1, beta2, eps, wd, clip, zloss, max_time, mem_gb;
} train_opts;

static gj_opt *train_table(train_opts *o) {
  static gj_opt t[64];
  gj_opt src[] = {
      {"data", GJ_OPT_STR, &o->data, "training data, required: a token dataset (gptj tokenize, or Megatron PREFIX), a "
       "directory of them, shards joined by '+', or a blend WEIGHT:DATA,WEIGHT:DATA,...", 1, 0},
      {"valid-data", GJ_OPT_STR, &o->valid_data, "validation token dataset", 1, 0},
      {"run-dir", GJ_OPT_STR, &o->run_dir, "directory for config, metrics.jsonl and checkpoints", 1, 0},
      {"resume", GJ_OPT_STR, &o->resume, "'auto' (latest checkpoint of --run-dir, if any), a checkpoint path, or 'none'", 1, 0},
      {"overwrite", GJ_OPT_FLAG, &o->overwrite, "start over in a --run-dir that holds checkpoints (deletes them; with --resume PATH: those past its step)", 1, 0},
      {"tp", GJ_OPT_I64, &o->tp, "tensor-parallel size (DP = ranks / TP)", 1, 4096},
      {"precision", GJ_OPT_STR, &o->precision, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &o->gemm, GJ_GEMM_HELP, 1, 0},
      {"zero", GJ_OPT_I64, &o->zero, "1: ZeRO-1, AdamW moments sharded over the DP ranks (the updated parameters "
       "all-gathered after the update; in bf16 the GEMM weights as bf16, half their bytes, the same training bit for bit)", 0, 1},
      {"zero-reduce", GJ_OPT_STR, &o->zero_reduce, GJ_ZERO_REDUCE_HELP, 1, 0},
      {"grad-reduce", GJ_OPT_STR, &o->grad_reduce, GJ_GRAD_REDUCE_HELP, 1, 0},
      {"dp-poll-us", GJ_OPT_I64, &o->dp_poll_us, GJ_DP_POLL_HELP, 0, 1000000},
      {"recompute", GJ_OPT_I64, &o->recompute, "1: recompute each layer's activations in backward (less memory)", 0, 1},
      {"optimizer-in-backward", GJ_OPT_I64, &o->oib, "1: update each part of the network as backward finishes its gradients, "
       "holding about one part's gradients instead of all (needs --clip 0, not with --zero 1; same result)", 0, 1},
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
      {"eps", GJ_OPT_F64, &o->eps, "AdamW epsilon (> 0: a zero gradient would give 0 / 0)", 1e-30, 1},
      {"weight-decay", GJ_OPT_F64, &o->wd, "decoupled weight decay (2-D tensors only; --lr x this below 1)", 0, 10},
      {"clip", GJ_OPT_F64, &o->clip, "global gradient-norm clip (0: off)", 0, 1e9},
      {"zloss", GJ_OPT_F64, &o->zloss, "z-loss coefficient on log(Z)^2 (GPT-J used 1e-4; logged apart: the loss shown is the cross-entropy)", 0, 1},
      {"seed", GJ_OPT_I64, &o->seed, "seed of the initialisation and the data order", 0, 9e18},
      {"log-every", GJ_OPT_I64, &o->log_every, "steps between log lines", 1, 1e12},
      {"eval-every", GJ_OPT_I64, &o->eval_every, "steps between validation runs (0: off)", 0, 1e12},
      {"eval-batches", GJ_OPT_I64, &o->eval_batches, "micro-batches per rank per validation (0: whole set)", 0, 1e12},
      {"save-every", GJ_OPT_I64, &o->save_every, "steps between checkpoints (0: only at the end)", 0, 1e12},
      {"keep-checkpoints", GJ_OPT_I64, &o->keep, "checkpoints kept in --run-dir (0: all)", 0, 1e6},
      {"ckpt-compress", GJ_OPT_I64, &o->compress, "deflate level of checkpoints (0: off)", 0, 9},
      {"max-time", GJ_OPT_F64, &o->max_time, "wall-clock seconds of training (from its first step, after the start-up) after which to checkpoint and stop (0: none)", 0, 1e9},
      {"mem-per-rank-gb", GJ_OPT_F64, &o->mem_gb, "memory a rank may use, GB (0: available memory / ranks on the node)", 0, 1e9},
      {"max-bad-steps", GJ_OPT_I64, &o->max_bad, "consecutive skipped steps (non-finite, or a gradient element of 1e19 or more) before stopping", 1, 1e9},
      {"debug-nan-step", GJ_OPT_I64, &o->inject_nan, "debug: inject a NaN into the gradients at this step", 0, 1e12},
      {"debug-nan-part", GJ_OPT_I64, &o->nan_part, "debug: the part of the network whose gradients get that NaN, "
       "in backward's order (0: the head, n_layer + 1: the embedding)", 0, 1e6},
      {NULL}};
  memcpy(t, src, sizeof src);
  return t;
}

/* config.conf of the run: written under a temporary name, synced and renamed. Options left to
 * follow another (seq-len 0, decay-steps 0) are written as given, their value in this run in a
 * comment, so that the file used again with another --steps still follows it. */
static int write_config(const char *path, const gj_config *c, const gj_opt *t, const train_opts *to) {
  gj_outfile of;
  GJ_TRY(gj_outfile_begin(&of, path));
  FILE *f = fopen(of.tmp, "w");
  if (!f) return gj_outfile_abort(&of), GJ_FAIL("%s: %s", of.tmp, strerror(errno));
  fprintf(f, "# effective configuration of this run (gptj train --config %s)\n", path);
  fprintf(f, "vocab_size = %lld\nn_positions = %lld\nn_embd = %lld\nn_layer = %lld\nn_head = %lld\n"
          "rotary_dim = %lld\nn_inner = %lld\nlayer_norm_epsilon = %.17g\n",
          (long long)c->vocab_size, (long long)c->n_positions, (long long)c->n_embd,
          (long long)c->n_layer, (long long)c->n_head, (long long)c->rotary_dim,
          (long long)c->n_inner, c->layer_norm_epsilon);
  for (const gj_opt *o = t; o->name; o++) {
    if (!strcmp(o->name, "resume") || !strcmp(o->name, "overwrite")) continue;
    if (!strcmp(o->name, "seq-len") && !to->seq_len_given) {
      fprintf(f, "seq-len = 0  # n_positions: %lld in this run\n", (long long)to->seq_len);
      continue;
    }
    if (!strcmp(o->name, "decay-steps") && !to->decay_given) {
      fprintf(f, "decay-steps = 0  # --steps: %lld in this run\n", (long long)to->decay_steps);
      continue;
    }
    switch (o->type) {
    case GJ_OPT_I64: fprintf(f, "%s = %lld\n", o->name, (long long)*(int64_t *)o->dst); break;
    case GJ_OPT_F64: fprintf(f, "%s = %.17g\n", o->name, *(double *)o->dst); break;
    case GJ_OPT_STR:
      if (*(const char **)o->dst) gj_kvconf_write(f, o->name, *(const char **)o->dst);
      break;
    default: break;
    }
  }
  if ((fflush(f) != 0) | (fclose(f) != 0))
    return gj_outfile_abort(&of), GJ_FAIL("%s: write failed (disk full?)", path);
  return gj_outfile_commit(&of);
}

/* A stop point of the start-up: a stop signal on any rank ends the run here, cleanly, before
 * it has written anything (main exits 0 with this message). */
static int stop_point(const char *run_dir, const char *phase) {
  int sig = gj_stop_signal();
  if (gj_allreduce_max_int(gj_comm_world(), &sig, 1) || !sig) return 0;
  int64_t l = gj_rundir_latest(run_dir);
  char latest[64] = "no checkpoint yet";
  if (l >= 0) snprintf(latest, sizeof latest, "latest is still ckpt-%08lld.h5", (long long)l);
  GJ_FAIL("stopped by %s while %s, before the first step: %s left as it was (%s)", gj_signal_name(sig),
          phase, run_dir, latest);
  return GJ_STOPPED;
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
  return gj_agree(gj_comm_world(), rc);
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
  GJ_TRY(write_config(path, c, table, o));
  GJ_TRY(gj_path_join(path, sizeof path, o->run_dir, "metrics.jsonl"));
  if (resumed) GJ_TRY(gj_rundir_trim_metrics(path, step));
  *metrics = fopen(path, resumed ? "a" : "w");
  if (!*metrics) return GJ_FAIL("%s: %s", path, strerror(errno));
  return 0;
}

/* Everything a run holds, freed in one place (train_free) on every path. */
typedef struct {
  train_opts o;
  gj_opt *table;
  gj_config c;
  gj_grid g;
  gj_data train;
  gj_dataset valid;
  gj_loader loader;
  gj_state st;
  gj_model m;
  gj_trainer tr;
  gj_mem_sizes ms;
  gj_ckpt_meta meta;
  int resumed;
  FILE *metrics;
} train_ctx;

static void train_free(train_ctx *x) {
  if (x->metrics) fclose(x->metrics);
  gj_trainer_free(&x->tr);
  gj_model_free(&x->m);
  gj_state_free(&x->st);
  gj_loader_free(&x->loader);
  gj_data_free(&x->train);
  gj_dataset_free(&x->valid);
  gj_grid_free(&x->g);
}

/* The options; returns 1 after --help. */
static int parse(train_ctx *x, int argc, char **argv) {
  train_opts *o = &x->o;
  *o = (train_opts){.run_dir = "run", .resume = "none", .gemm = "auto", .precision = "fp32", .grad_reduce = "fp32", .zero_reduce = "allreduce", .dp_poll_us = GJ_DP_POLL_DEFAULT, .tp = 1,
                    .micro_batch = 8, .grad_accum = 1, .seq_len = 0, .steps = 1000, .warmup = 100,
                    .decay_steps = 0, .seed = 1234, .log_every = 1, .eval_batches = 0, .keep = 3,
                    .max_bad = 5, .lr = 6e-4, .floor = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                    .wd = 0.1, .clip = 1.0};
  x->table = train_table(o);
  gj_modelopts mo;
  int rc = gj_modelopts_parse(&mo, argc, argv, x->table, "gptj train --data FILE.h5 [options]",
                              "Trains a GPT-J on a token dataset, data parallel over DP = ranks / TP and\n"
                              "tensor parallel over --tp ranks. Run it under mpirun/srun or as one process.");
  if (rc) return rc;
  x->c = mo.config;
  if (!o->data) return GJ_FAIL("--data: required (a token dataset from gptj tokenize)");
  o->seq_len_given = o->seq_len, o->decay_given = o->decay_steps;
  if (o->overwrite && !strcmp(o->resume, "auto"))
    gj_info("note: --overwrite does nothing with --resume auto: the run continues from its latest checkpoint "
            "(start over with --resume none --overwrite)");
  if (o->decay_steps && o->decay_steps < o->warmup)
    return GJ_FAIL("--decay-steps %lld is below --warmup %lld: the cosine decay runs from the warmup's end to "
                   "--decay-steps", (long long)o->decay_steps, (long long)o->warmup);
  if (o->lr * o->wd >= 1) /* AdamW multiplies every weight by 1 - lr x wd at each step */
    return GJ_FAIL("--lr %g x --weight-decay %g = %g: the decoupled decay multiplies the weights by 1 - lr x wd "
                   "each step, which must stay above 0", o->lr, o->wd, o->lr * o->wd);
  if (o->seq_len == 0) o->seq_len = x->c.n_positions;
  if (o->seq_len > x->c.n_positions)
    return GJ_FAIL("--seq-len %lld exceeds n_positions %lld", (long long)o->seq_len, (long long)x->c.n_positions);
  if (o->decay_steps == 0) o->decay_steps = o->steps;
  if (o->nan_part > x->c.n_layer + 1)
    return GJ_FAIL("--debug-nan-part %lld: the network has parts 0 (the head) to %lld (the embedding)",
                   (long long)o->nan_part, (long long)x->c.n_layer + 1);
  GJ_TRY(gj_grad_reduce_parse(o->grad_reduce, &o->grad_bf16));
  GJ_TRY(gj_zero_reduce_parse(o->zero_reduce, o->zero, &o->zero_owner));
  return gj_oib_check(o->oib, o->clip, o->zero);
}

/* The training and validation sets and the loader (agreed). */
static int setup_data(train_ctx *x) {
  const train_opts *o = &x->o;
  int rc = gj_data_open(&x->train, o->data, "--data", x->c.vocab_size);
  if (!rc && o->valid_data) rc = gj_dataset_open(&x->valid, o->valid_data, x->c.vocab_size);
  if (!rc && o->valid_data && x->valid.n_tokens < (uint64_t)o->seq_len + 1)
    rc = GJ_FAIL("--valid-data %s: %llu tokens, fewer than one window of seq_len + 1 = %lld", o->valid_data,
                 (unsigned long long)x->valid.n_tokens, (long long)o->seq_len + 1);
  if ((rc = gj_agree(x->g.world, rc))) return rc == GJ_STOPPED ? stop_point(o->run_dir, "reading the data") : rc;
  if (o->eval_every > 0 && !o->valid_data)
    gj_info("note: --eval-every %lld without --valid-data: no validation runs", (long long)o->eval_every);
  GJ_TRY(gj_loader_init_data(&x->loader, &x->train, o->seq_len, (uint64_t)o->seed, o->data));
  const int64_t G = o->micro_batch * o->grad_accum * x->g.dp_size;
  if (x->train.n_corpora == 1 && (uint64_t)G > x->loader.n_windows)
    return GJ_FAIL("%s: global batch of %lld sequences exceeds the dataset's %llu windows of %lld tokens",
                   o->data, (long long)G, (unsigned long long)x->loader.n_windows, (long long)o->seq_len + 1);
  return 0;
}

/* Refuse, before allocating, a layout that will not fit (the arithmetic of gptj plan); then the
 * state, initialised from --seed, and the network over it. */
static int setup_model(train_ctx *x) {
  const train_opts *o = &x->o;
  gj_mem_sizes *ms = &x->ms;
  const int mode = gj_train_mode((int)o->oib, o->grad_accum); /* the head's gradient may be late */
  GJ_TRY(gj_model_sizes(ms, &x->c, x->g.tp_size, x->g.dp_size, (int)o->zero, (int)o->recompute, mode,
                        o->micro_batch, o->seq_len, omp_get_max_threads()));
  /* a step's tokens on all DP ranks, saturated (the flags' product can exceed int64) */
  double tk = (double)o->micro_batch * (double)o->seq_len * (double)o->grad_accum * x->g.dp_size;
  const int64_t tokens = tk < 4e18 ? (int64_t)tk : (int64_t)4e18;
  GJ_TRY(gj_state_train_grad_bytes(&x->c, x->g.tp_size, (int)o->oib, o->grad_accum, tokens, &ms->grads));
  /* and against --mem-per-rank-gb what the process holds already (libraries, MPI, the data's
   * index; MemAvailable has it taken off already) */
  const double base = o->mem_gb > 0 ? gj_self_rss_bytes() : 0;
  double need = (double)ms->params + ms->grads + ms->moments + ms->acts + ms->w16 + base;
  char detail[320], held[64] = "";
  if (base > 0) snprintf(held, sizeof held, ", this process so far %.2f", base / 1e9);
  snprintf(detail, sizeof detail, "parameters %.2f, gradients %.2f, AdamW %.2f, activations %.2f, bf16 weight copies %.2f%s",
           ms->params / 1e9, ms->grads / 1e9, ms->moments / 1e9, ms->acts / 1e9, ms->w16 / 1e9, held);
  int local = 1;
  GJ_TRY(gj_mem_check(x->g.world, need, detail,
                      "use more ranks, --tp, --zero 1, --recompute 1 or a smaller --micro-batch (see gptj plan)",
                      o->mem_gb, &local));
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (x->g.rank == 0 && cores > 0 && (long)local * omp_get_max_threads() > cores)
    gj_warn("%d ranks x %d threads on %ld cores of this node: oversubscribed, which is slow; "
            "set OMP_NUM_THREADS (threads per rank)", local, omp_get_max_threads(), cores);
  int rc = o->oib ? gj_state_create_oib(&x->st, &x->c, &x->g, o->grad_accum == 1)
                  : gj_state_create_rows(&x->st, &x->c, &x->g, (int)o->zero, tokens);
  if (!rc) rc = gj_model_create(&x->m, &x->st, &x->g, o->micro_batch, o->seq_len, (int)o->recompute, mode);
  GJ_AGREE(x->g.world, rc);
  gj_params_init(&x->st.lay, &x->c, x->st.params, (uint64_t)o->seed);
  return 0;
}

/* The resume, and what it implies: a finished run (returns 1), changed hyperparameters, newer
 * checkpoints than the one resumed, the disk space. */
static int setup_resume(train_ctx *x) {
  const train_opts *o = &x->o;
  /* the seed of the data order, also for a checkpoint that holds weights only */
  x->meta = (gj_ckpt_meta){.loader = {.seed = (uint64_t)o->seed}};
  int rc = gj_run_resume(&x->st, &x->g, o->resume, o->run_dir, &x->meta, &x->resumed);
  if (rc == GJ_STOPPED) return stop_point(o->run_dir, "resuming");
  if (rc) return rc;
  if (x->resumed) GJ_TRY(gj_loader_restore(&x->loader, &x->meta.loader));
  GJ_TRY(stop_point(o->run_dir, "resuming"));
  if (x->resumed && x->meta.step >= o->steps) { /* a finished run resumed again (a requeue): say so */
    gj_info("the run is already at step %lld, %s --steps %lld: nothing to train (give a larger --steps "
            "to continue it); %s is unchanged", (long long)x->meta.step, x->meta.step == o->steps ? "=" : "past",
            (long long)o->steps, o->run_dir);
    return 1;
  }
  gj_adamw_hp hp = {o->lr, o->beta1, o->beta2, o->eps, o->wd, o->clip};
  gj_schedule sched = {o->lr, o->warmup, o->decay_steps, o->floor};
  if (x->meta.has_optim && x->g.rank == 0) warn_changed(&x->meta, &hp, &sched, (uint64_t)o->seed);
  /* the loader's checks see counts and shares, not files: shards reordered or swapped for
     others of as many windows pass them, yet give other windows. A warning, not a refusal:
     the same files under another path resume exactly. */
  if (x->resumed && x->g.rank == 0 && x->meta.loader.data[0] && strcmp(x->meta.loader.data, x->loader.st.data))
    gj_warn("--data %s differs from the checkpoint's %s: the data order continues by position, so it "
            "is the same windows only if the corpora and their shards are the same files in the same order",
            x->loader.st.data, x->meta.loader.data);
  x->meta.hp = hp, x->meta.sched = sched;
  rc = x->g.rank == 0 ? check_run_dir(o, x->resumed, x->meta.step, (double)x->st.lay.n_global) : 0;
  return gj_agree(x->g.world, rc);
}

/* Where the ranks run: "placement: HOST ranks a,b,...; HOST ranks ..." (hosts in order of their
 * first rank), and a warning when a TP group spans hosts (its all-reduces then cross the
 * network twice per layer). */
static void print_placement(const gj_grid *g) {
  enum { H = 64 };
  char me[H] = "?";
  gethostname(me, H - 1);
  me[H - 1] = 0;
  void *out = NULL; /* every rank's name, in rank order, on rank 0 */
  uint64_t total = 0;
  int rc = gj_gather_ordered(g->world, &out, &total, me, H, 1);
  char *all = out;
  if (rc || g->rank != 0 || total != (uint64_t)g->size * H) { /* the placement is only printed */
    free(all);
    return;
  }
  size_t cap = (size_t)g->size * (H + 16) + 64, n = 0;
  char *line = malloc(cap);
  for (int r = 0; line && r < g->size; r++) {
    int first = 1;
    for (int q = 0; q < r && first; q++) first = strcmp(all + (size_t)q * H, all + (size_t)r * H) != 0;
    if (!first) continue;
    n += snprintf(line + n, cap - n, "%s%s ranks ", n ? "; " : "", all + (size_t)r * H);
    for (int q = r, k = 0; q < g->size; q++)
      if (!strcmp(all + (size_t)q * H, all + (size_t)r * H)) n += snprintf(line + n, cap - n, k++ ? ",%d" : "%d", q);
  }
  if (line) gj_info("placement: %s (TP groups: ranks %d at a time)", line, g->tp_size);
  int spans = 0, t0 = -1, q0 = -1;
  for (int t = 0; t < g->size; t += g->tp_size)
    for (int q = t + 1; q < t + g->tp_size; q++)
      if (strcmp(all + (size_t)q * H, all + (size_t)t * H)) {
        if (!spans++) t0 = t, q0 = q;
        break;
      }
  if (spans)
    gj_warn("%d of %d TP groups span hosts (ranks %d-%d: %s and %s): keep TP within a node", spans,
            g->size / g->tp_size, t0, t0 + g->tp_size - 1, all + (size_t)t0 * H, all + (size_t)q0 * H);
  free(line);
  free(all);
}

/* The start-up summary; returns the hardware's peak FLOP/s per rank. */
static double print_summary(const train_ctx *x) {
  const gj_config *c = &x->c;
  const char *peak_how;
  print_placement(&x->g);
  double peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &peak_how);
  gj_info("peak: %.1f GFLOP/s per rank (%s on %d threads); GEMM: %s", peak / 1e9, peak_how,
          omp_get_max_threads(), gj_gemm_describe());
  char dpw[512];
  gj_trainer_dp_words(&x->tr, x->o.grad_bf16, (int)x->o.dp_poll_us, dpw, sizeof dpw);
  gj_info("model: %lld parameters (%lld layers, D %lld, %lld heads, F %lld, V %lld); layout DP %d x TP %d%s",
          (long long)gj_config_n_params(c), (long long)c->n_layer, (long long)c->n_embd,
          (long long)c->n_head, (long long)c->n_inner, (long long)c->vocab_size, x->g.dp_size, x->g.tp_size, dpw);
  char late_note[128];
  snprintf(late_note, sizeof late_note, " (and %.1f MB in the vocabulary head's gradient, written "
           "after backward)", x->ms.acts_in_grads / 1e6);
  if (x->st.gslot) /* the optimizer in backward, one micro-batch a step */
    gj_info("memory per rank: parameters+AdamW %.1f MB, gradients %.1f MB (one part at a time: the "
            "optimizer in backward), activations %.1f MB, bf16 weight copies %.1f MB",
            (x->st.bytes - x->st.gslot_n * sizeof(float)) / 1e6, x->st.gslot_n * sizeof(float) / 1e6,
            x->m.act_bytes / 1e6, x->ms.w16 / 1e6);
  else
    gj_info("memory per rank: parameters+gradients+AdamW %.1f MB, activations %.1f MB%s, bf16 weight "
            "copies %.1f MB", x->st.bytes / 1e6, x->m.act_bytes / 1e6, x->m.late_head ? late_note : "",
            x->ms.w16 / 1e6);
  int64_t G = x->o.micro_batch * x->o.grad_accum * x->g.dp_size, T = x->o.seq_len;
  gj_info("data: %s, %llu tokens, %llu windows of %lld; global batch %lld sequences = %lld tokens",
          x->o.data, (unsigned long long)x->train.n_tokens, (unsigned long long)x->loader.n_windows,
          (long long)T + 1, (long long)G, (long long)(G * T));
  const gj_data *d = &x->train;
  for (int k = 0; d->n_corpora > 1 && k < d->n_corpora; k++)
    gj_info("  corpus %d: share %.4g, %d shard(s), %llu tokens, %llu windows: %s", k, d->weight[k],
            d->first[k + 1] - d->first[k], (unsigned long long)gj_data_corpus_tokens(d, k),
            (unsigned long long)x->loader.st.windows[k], d->name[k]);
  return peak;
}

/* The run: everything up to the loop, which then owns it. */
static int train(train_ctx *x) {
  const train_opts *o = &x->o;
  GJ_AGREE(gj_comm_world(), gj_grid_init(&x->g, (int)o->tp));
  gj_log_set_rank(x->g.rank);
  GJ_TRY(gj_cli_gemm_setup(o->gemm, o->precision, x->g.world));
  GJ_TRY(stop_point(o->run_dir, "setting up"));
  GJ_TRY(claim_run_dir(o, x->g.rank));
  GJ_TRY(stop_point(o->run_dir, "setting up"));
  GJ_TRY(setup_data(x));
  GJ_TRY(stop_point(o->run_dir, "reading the data"));
  GJ_TRY(setup_model(x));
  GJ_TRY(stop_point(o->run_dir, "allocating the model"));
  int rc = setup_resume(x);
  if (rc) return rc > 0 ? 0 : rc;
  gj_adamw_hp hp = x->meta.hp;
  GJ_AGREE(x->g.world, gj_trainer_init(&x->tr, &x->st, &x->m, &x->g, &hp, (float)o->zloss, o->grad_bf16,
                                          (int)o->dp_poll_us));
  if (o->zero_owner) GJ_AGREE(x->g.world, gj_trainer_reduce_to_owners(&x->tr));
  gj_run r = {.o = {o->run_dir, o->steps, o->log_every, o->eval_every, o->eval_batches, o->save_every,
                    o->keep, o->max_bad, o->compress, o->inject_nan, o->nan_part, o->max_time, x->meta.sched},
              .tr = &x->tr, .loader = &x->loader, .valid = o->valid_data ? &x->valid : NULL,
              .meta = &x->meta, .B = o->micro_batch, .A = o->grad_accum, .T = o->seq_len,
              .mem_budget = o->mem_gb * 1e9};
  r.peak = print_summary(x);
  GJ_TRY(stop_point(o->run_dir, "measuring the peak"));
  /* the run directory changes from here on: a stop signal is handled after the first step */
  rc = x->g.rank == 0 ? open_run_files(o, &x->c, x->table, x->resumed, x->meta.step, &x->metrics) : 0;
  GJ_AGREE(x->g.world, rc);
  r.metrics = x->metrics;
  return gj_run_loop(&r);
}

int gj_cmd_train(int argc, char **argv) {
  train_ctx x;
  memset(&x, 0, sizeof x);
  int rc = parse(&x, argc, argv);
  if (rc) return rc > 0 ? 0 : rc;
  rc = train(&x);
  train_free(&x);
  gj_rundir_unlock(); /* now, not at exit: mpirun may end the ranks soon after they finish */
  return rc;
}
