/* The training state of one rank: its tensor table and the arena of parameters, gradients and
 * AdamW moments, with the shard ranges. The network (gj_model) borrows the parameters and
 * gradients; the optimizer, the DP reduction and the checkpoint read and write the state, and
 * need nothing of the network.
 *
 * Arena: params | grads | exp_avg | exp_avg_sq. The parameter and gradient blocks hold
 * numel_pad floats each, laid out by the table (padded so that ZeRO's DP ranges are equal);
 * the moments hold the flat range [lo, lo + n) of the block: all of it, or under ZeRO-1 this
 * DP rank's share. */
#ifndef GJ_MODEL_STATE_H
#define GJ_MODEL_STATE_H

#include <stddef.h>

#include "model/config.h"
#include "model/gemm.h"
#include "model/params.h"
#include "model/rowgrad.h"
#include "parallel/grid.h"

typedef struct {
  gj_config c;
  gj_layout lay;          /* this TP rank's tensor table */
  float *arena;
  float *params, *grads;  /* numel_pad floats each (grads NULL with a gradient slot) */
  float *m, *v;           /* AdamW moments of [lo, lo + n) */
  size_t numel_pad, lo, n;
  int zero;               /* ZeRO-1: the moments are this DP rank's share */
  int params16;           /* set by the first ZeRO-1 all-gather in bf16 (gj_dp_gather16): outside
                           * [lo, lo + n) the GEMM weights may hold their bf16 values, so the
                           * checkpoint writes each range's parameters from its owner */
  size_t bytes;           /* of the arena (resident bytes for a bf16-resident state) */
  /* bf16-resident weights (inference in bf16): the GEMM weights and the embedding in bfloat16
   * only, at the table's offsets; NULL otherwise */
  gj_bf16 *w16;
  size_t w16_bytes;       /* the mapping's size */
  size_t arena_map;       /* the float block's mapping size (0: gj_arena_alloc'ed) */
  int oib;                /* gj_state_create_oib: for the optimizer in backward */
  float *gslot;           /* with one micro-batch a step: the gradients of one part at a time */
  size_t gslot_n;         /* its floats */
  /* gj_state_embedding_rows: the embedding's gradients as rows; the pages of the gradient
   * block under them [hole, hole + hole_len) are given back and any access to them faults */
  gj_rowgrad *erows;
  void *hole;
  size_t hole_len;
} gj_state;

/* Block and moment sizes of a table at DP size dp: np floats per block, P floats of each
 * moment (np = P = numel without ZeRO; with it P = ceil(numel/dp) rounded to 16, np = P dp). */
void gj_state_sizes(size_t numel, int dp, int zero, size_t *np, size_t *P);

/* Build the table for (c, g's TP rank) and allocate and touch the arena; parameters, gradients
 * and moments are zero. zero = 1: ZeRO-1 (a no-op on one DP rank). */
int gj_state_create(gj_state *s, const gj_config *c, const gj_grid *g, int zero);
/* The same without ZeRO, for the optimizer in backward (train/step.h), which updates each part
 * of the network (the vocabulary head with ln_f, each layer, the embedding) as soon as backward
 * has its gradients. slot = 1 (one micro-batch a step): no gradient block; one buffer, gslot,
 * of the largest part's size holds the gradients of the part backward is in, and every part's
 * gradient pointers of a network over the state point into it (gj_model_create): the
 * gradients of one part are resident instead of all, and the same pages serve every part
 * (giving pages back and faulting them in again each step costs a tenth of the step on these
 * machines). slot = 0 (gradients accumulated over micro-batches): the whole block. */
int gj_state_create_oib(gj_state *s, const gj_config *c, const gj_grid *g, int slot);
/* The bytes of the gradient slot (the largest part backward reports final: the head, a layer
 * or the embedding). */
int gj_state_oib_grad_bytes(const gj_config *c, int tp, size_t *bytes);
/* The parameters alone, for inference (eval, generate): grads, m and v are NULL, n = 0. */
int gj_state_create_weights(gj_state *s, const gj_config *c, const gj_grid *g);
/* The same with the GEMM weights and the embedding (gj_tensor_resident16) in bfloat16 only,
 * in s->w16: about 2 bytes a parameter. The float32 block keeps the table's offsets for the
 * other tensors (LayerNorms, biases); its pages under the bf16 tensors are address space only,
 * never written, so never resident (and never read). The caller fills both (the bf16 tensors
 * rounded into w16). bytes counts what becomes resident. */
int gj_state_create_weights16(gj_state *s, const gj_config *c, const gj_grid *g);
/* Resident bytes of a bf16-resident state for (c, tp): the float32 tensors and the bf16
 * copies. */
int gj_state_weights16_bytes(const gj_config *c, int tp, size_t *bytes);
/* A training state's embedding gradient as rows (model/rowgrad.h) from now on: room for the
 * rows `tokens` tokens touch (min(Vl, tokens): a step's tokens on all DP ranks, every
 * micro-batch, since the DP reduction holds their union), and the block's memory under the
 * dense tensor given back. Backward, the DP reduction, the norm and AdamW then read the rows,
 * with the same results bit for bit (up to the order in which MPI adds more than two DP ranks).
 * Not with the optimizer in backward. Nothing changes (erows stays NULL) where the rows would
 * not be smaller than the dense tensor (the tokens reach nearly every row of the shard). */
int gj_state_embedding_rows(gj_state *s, int64_t tokens);
/* The gradient bytes of a trainer's state, from *grads, the dense block's (gj_model_sizes):
 * with the optimizer in backward and one micro-batch a step the slot's
 * (gj_state_oib_grad_bytes), without it the block with the embedding as rows for a step of
 * `tokens` tokens on all DP ranks (gj_state_embedding_rows). */
int gj_state_train_grad_bytes(const gj_config *c, int tp, int oib, int64_t grad_accum,
                              int64_t tokens, size_t *grads);
/* gj_state_create, then gj_state_embedding_rows(tokens), without ever touching the pages the
 * rows give back (the peak RSS of a start is then that of the state). */
int gj_state_create_rows(gj_state *s, const gj_config *c, const gj_grid *g, int zero,
                         int64_t tokens);
void gj_state_free(gj_state *s);
void gj_state_zero_grads(gj_state *s);

/* bytes (rounded up to 2 MiB) aligned to 2 MiB, huge pages advised and every page touched
 * once, so the step loop never pays first-touch faults (DESIGN.md §12). NULL: out of memory. */
void *gj_arena_alloc(size_t bytes);

#endif
