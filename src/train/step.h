/* One training step: zero the gradients, forward and backward over the micro-batches (the last
 * one's backward starts the DP reduction bucket by bucket), finish the reduction, the loss and the global gradient norm, clip, AdamW, and under ZeRO-1 the
 * all-gather of the updated parameters. `gptj train`, `gptj bench` and the tests call it. */
#ifndef GJ_TRAIN_STEP_H
#define GJ_TRAIN_STEP_H

#include <stdint.h>

#include "model/gptj.h"
#include "model/state.h"
#include "optim/adamw.h"
#include "parallel/dp.h"
#include "parallel/grid.h"

typedef struct {
  gj_state *st;
  gj_model *m;   /* over st */
  gj_grid *g;
  gj_dp_sync dp;
  gj_adamw_hp hp;
  float zloss;   /* z-loss coefficient */
  int32_t *ids, *tg; /* one micro-batch [Bmax, Tmax] of the model */
  int oib;       /* the optimizer in backward: st is made by gj_state_create_oib */
  int dp_polled; /* the DP progress thread runs (gj_dp_progress) */
} gj_trainer;

/* Fills micro-batch a (0 <= a < A) of this DP rank: ids and targets [B, T]. */
typedef int (*gj_batch_fn)(void *ctx, int64_t a, int32_t *ids, int32_t *targets);

typedef struct {
  int64_t step;          /* the step's number (messages, --debug-nan-step) */
  int64_t t;             /* AdamW's update count t >= 1 (its bias correction): the updates
                          * applied before this one, plus one (a skipped step is not counted) */
  double lr;             /* this step's learning rate */
  int64_t A, B, T;       /* micro-batches of [B, T] per DP rank */
  double n_targets;      /* scored targets in the global batch: gradients are scaled by its inverse */
  gj_batch_fn batch;
  void *batch_ctx;
  int inject_nan;        /* debug: 1 + k puts a NaN into the reduced gradients of part k of
                          * the network (gj_layout_part_lo: 0 the head, n_layer + 1 the
                          * embedding); 0: none */
} gj_step_in;

typedef struct {
  double loss;           /* mean cross-entropy over the global batch (the z-loss not in it) */
  double z_loss;         /* the z-loss term's mean (0 without --zloss); the objective is the sum */
  double grad_norm;      /* before clipping */
  int finite;            /* loss and norm finite, no huge element: the update was applied (else
                          * skipped) */
  int huge;              /* a gradient element of GJ_GRAD_MAX or more (without clipping) */
  double dp_wait_s;      /* exposed DP wait */
  double optim_s;        /* norm, AdamW and the ZeRO all-gather */
} gj_step_out;

/* hp: AdamW's hyperparameters (hp->grad_clip 0: no clipping; hp->lr is not used: each step
 * brings its learning rate, gj_step_in.lr). Allocates the DP buckets and one micro-batch.
 * A state made by gj_state_create_oib makes the trainer apply the optimizer in backward: during
 * the last micro-batch's backward, each part of the network (the vocabulary head, each layer,
 * the embedding) is reduced over DP and updated as soon as its gradients are final; over the
 * state's gradient slot (one micro-batch a step) the next part's gradients then take the same
 * memory, so that one part's gradients are resident instead of all. The result equals the ordinary step's without clipping, bit for bit; it needs
 * grad_clip 0 (the global norm is known only after the last update) and no ZeRO-1. A step
 * whose first part is not finite (or has a huge element) is skipped whole; one that turns so after a part was
 * applied cannot be skipped: gj_train_step then fails. grad_bf16: the DP sums of the gradients
 * travel in bfloat16 (parallel/dp.h), else in float32. dp_poll_us: the DP progress thread's
 * interval (gj_dp_progress; 0: none). */
int gj_trainer_init(gj_trainer *t, gj_state *st, gj_model *m, gj_grid *g, const gj_adamw_hp *hp,
                    float zloss, int grad_bf16, int dp_poll_us);
/* --zero-reduce owner: under ZeRO-1 (at DP > 1) each range's gradient sums go to its owner
 * only (gj_dp_reduce_to_owners); nothing without ZeRO-1. */
int gj_trainer_reduce_to_owners(gj_trainer *t);
/* The log's words on the DP sums (empty at DP 1): "; gradients summed over DP in bf16" and
 * whether the progress thread runs, each beginning "; ". */
void gj_trainer_dp_words(const gj_trainer *t, int grad_bf16, int dp_poll_us, char *buf, size_t n);
void gj_trainer_free(gj_trainer *t);
/* --grad-reduce: "fp32" (0) or "bf16" (1), shared by train and bench. */
#define GJ_GRAD_REDUCE_HELP                                                                   \
  "precision of the gradients' DP sum on the network: fp32, or bf16 (half the bytes; each "      \
  "rank's gradients but the embedding's, and every partial sum, rounded to bfloat16, as "        \
  "Megatron-LM's --grad-reduce-in-bf16; for DP over a slow network)"
int gj_grad_reduce_parse(const char *s, int *bf16);
/* --zero-reduce: "allreduce" (0) or "owner" (1, which needs --zero 1), shared by train, bench
 * and plan. */
#define GJ_ZERO_REDUCE_HELP                                                                        \
  "ZeRO-1's gradient sums: allreduce (every rank receives all of them), or owner (each range's "  \
  "sums reduced to the rank that updates it only, half the bytes sent; for a slow network: "     \
  "measured across two nodes over 1 Gbit/s: 23-29% faster a step at DP 2, 5-7% at DP 4; about " \
  "10% slower over a fast link)"
int gj_zero_reduce_parse(const char *s, int64_t zero, int *owner);
/* --dp-poll-us, shared by train and bench. */
#define GJ_DP_POLL_DEFAULT 1000
#define GJ_DP_POLL_HELP                                                                           \
  "microseconds a thread of each rank sleeps between its tests of the DP gradient sums in "       \
  "flight while backward runs (Open MPI moves them on only inside MPI calls: over TCP they "       \
  "otherwise wait for the end of backward; no thread at DP 1 or with --optimizer-in-backward 1); " \
  "it needs MPI_THREAD_MULTIPLE; 0 on the command line: no thread, and MPI started without "      \
  "thread support (for an MPI whose fast transport refuses it, e.g. UCX built without threads)"
/* The options' check for the optimizer in backward (oib 1): it needs clip 0 and no ZeRO-1. */
int gj_oib_check(int64_t oib, double clip, int64_t zero);
/* Collective over the world. A non-finite loss or norm, or without clipping a gradient element
 * of GJ_GRAD_MAX or more, skips the update (out->finite = 0). */
int gj_train_step(gj_trainer *t, const gj_step_in *in, gj_step_out *out);

#endif
