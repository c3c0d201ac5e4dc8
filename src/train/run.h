/* The training run around the step: resume from a run directory's checkpoints, then the loop
 * (draw the global batch, step, log a line and a metrics.jsonl record, validate, checkpoint on
 * its cadence, and stop when every rank agrees: the last step, a signal on any rank, the
 * wall-clock budget, a lost run-directory lock, or too many non-finite steps). */
#ifndef GJ_TRAIN_RUN_H
#define GJ_TRAIN_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "optim/schedule.h"
#include "train/step.h"

typedef struct {
  const char *run_dir;
  int64_t steps;         /* the run ends at this step */
  int64_t log_every, eval_every, eval_batches, save_every, keep, max_bad, compress;
  int64_t inject_nan;    /* debug: the step whose gradients get a NaN (0: none) */
  int64_t nan_part;      /* debug: the part of the network whose gradients get it (0: the head) */
  double max_time;       /* wall-clock seconds (0: none) */
  gj_schedule sched;
} gj_run_opts;

typedef struct {
  gj_run_opts o;
  gj_trainer *tr;
  gj_loader *loader;       /* the training data: every rank draws the same global batch */
  const gj_dataset *valid; /* NULL: no validation */
  gj_ckpt_meta *meta;      /* step, tokens, loader state, hyperparameters: updated each step */
  FILE *metrics;           /* rank 0: metrics.jsonl (NULL elsewhere) */
  int metrics_lost;        /* a write to it failed (warned; no more records) */
  int64_t B, A, T;         /* micro-batch, micro-batches per step, sequence length */
  double peak;             /* the hardware's FLOP/s per rank for the precision (for MFU) */
  double mem_budget;       /* bytes a rank may use (--mem-per-rank-gb; 0: the node's available share) */
} gj_run;

/* --resume: "none" (nothing), "auto" (the newest loadable checkpoint of run_dir, newest first,
 * a damaged one reported and skipped; none at all: a fresh start) or a checkpoint path.
 * Collective. *resumed = 1 when a checkpoint was loaded into st and meta. */
int gj_run_resume(gj_state *st, gj_grid *g, const char *resume, const char *run_dir,
                  gj_ckpt_meta *meta, int *resumed);
/* Save the checkpoint of meta->step into run_dir, point `latest` at it and rotate. */
int gj_run_save(gj_state *st, gj_grid *g, const gj_run_opts *o, const gj_ckpt_meta *meta);
/* Train from meta->step to o.steps (or a stop). Collective; returns once every rank agrees. */
int gj_run_loop(gj_run *r);

#endif
