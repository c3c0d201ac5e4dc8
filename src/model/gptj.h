/* GPT-J forward and backward over this rank's tensor-parallel shard.
 *
 * Parameters and gradients belong to the state (model/state.h), which the network borrows;
 * activations live in the network's arena, sized from (B, T, config) at creation. Neither
 * grows afterwards. */
#ifndef GJ_MODEL_GPTJ_H
#define GJ_MODEL_GPTJ_H

#include <stdint.h>

#include "model/config.h"
#include "model/gemm.h"
#include "model/params.h"
#include "model/state.h"
#include "parallel/grid.h"

typedef struct {
  /* Saved for backward; per layer slots of Bmax*Tmax rows. N = B*T rows in use. */
  float *resid;             /* [L+1, N, D]: resid[0] = embeddings, resid[l+1] = block l output */
  float *ln_mean, *ln_rstd; /* [L, N] */
  float *h;                 /* [L, N, D] ln_1 output */
  float *q, *k, *v;         /* [L, N, Dl] (q, k after rotary) */
  float *att;               /* [L, N, Dl] attention output before out_proj */
  float *lse;               /* [L, B, Hl, T] attention log-sum-exp */
  float *pre;               /* [L, N, Fl] fc_in output (gelu of it is recomputed); one slot
                             * in bf16 training, which keeps pre16 instead */
  float *lnf_mean, *lnf_rstd; /* [N] */
  float *xf;                /* [N, D] ln_f output */
  float *logits;            /* [N, Vl] (a training model: [GJ_HEAD_ROWS, Vl], one block);
                             * backward turns it into d loss / d logits */
  float *ce_mx, *ce_lse;    /* [N] */
  float *ce_stats;          /* [2N] */
  float *ce_acc;            /* [nthreads, Vl]: the bias gradient's partial sums (training) */
  int32_t *ids, *targets;   /* [N] copies of the inputs */
  /* Work buffers. */
  float *y;                 /* [N, D] block output partial sums */
  float *dx, *dh;           /* [N, D] */
  float *dq, *dk, *dv, *datt; /* [N, Dl] */
  float *dact;              /* [N, Fl] */
  float *attn_scratch;
  float *attn_delta; /* [B, Hl, T]: gj_attention_backward_prep's row sums (backward) */
  float *rot_cos, *rot_sin; /* [Tmax, R/2]: the positions a forward can reach */
  /* bf16 precision only (NULL in float32): bfloat16 copies of GEMM operands used twice or more */
  gj_bf16 *h16;             /* [N, D] the current layer's ln_1 output; [L, N, D] in bf16
                             * training, which keeps it instead of h (then one slot) */
  gj_bf16 *dx16;            /* [N, D] the current layer's output gradient */
  gj_bf16 *g16;             /* d act [N, Fl], d q, d k, d v [3, N, Dl] or a block of d logits */
  gj_bf16 *qkv16;           /* [4, N, Dl] the current layer's q, k, v (and d att in backward);
                             * [3, N, Dl] forward-only; [N, Dl] q alone when decoding */
  gj_bf16 *pre16;           /* bf16 training: [L, N, Fl] the fc_in outputs, in bfloat16 only
                             * (GELU then reads its input rounded, as under autocast) */
  gj_bf16 *att16;           /* bf16 training: [L, N, Dl] the attention outputs, in bfloat16 only
                             * (out_proj's operand; as under autocast, whose product writes it
                             * in bf16) */
  gj_bf16 *kv16;            /* decode in bf16: the KV cache [L, 2, Hl, Tmax, Hd] (each layer's
                             * keys, then values, head-major), the only copy of it: k and v
                             * then hold one layer's new rows [N, Dl] */
  gj_bf16 *xf16;            /* bf16 training: [N, D] the ln_f output's bf16 copy */
  gj_bf16 *dlg16;           /* bf16 with a late head gradient: [N, Vl] d loss / d logits, all
                             * rows (in float32 they stay in logits, then [N, Vl]) */
} gj_acts;

/* What a network keeps of its activations (gj_model_create's recompute). GJ_FORWARD: forward
 * only (eval): the residual stream in place, one slot of the rest, no gradient buffers, the
 * vocabulary head in blocks of GJ_HEAD_ROWS rows (gj_model_forward returns the loss only). */
enum { GJ_KEEP_ALL = 0, GJ_RECOMPUTE = 1, GJ_DECODE = 2, GJ_FORWARD = 3 };

/* gj_model_create's training: 0 (an inference network), GJ_TRAIN, or GJ_TRAIN_ONE: the same
 * for a trainer whose every step is one micro-batch (its gradients start from zero and the
 * optimizer reads them before the next forward), which lets the network write the vocabulary
 * head's weight gradient late (gj_model's late_head) where that makes the activations'
 * memory smaller, or, bf16 on oneDNN at DP 1, at most an eighth larger (faster there:
 * act_layout in gptj.c).
 * GJ_TRAIN_LATE: always late (tests). */
enum { GJ_TRAIN = 1, GJ_TRAIN_ONE = 2, GJ_TRAIN_LATE = 3 };
/* A trainer's mode: GJ_TRAIN_ONE with one micro-batch a step over a gradient block (no
 * optimizer in backward), else GJ_TRAIN. */
static inline int gj_train_mode(int oib, int64_t grad_accum) {
  return !oib && grad_accum == 1 ? GJ_TRAIN_ONE : GJ_TRAIN;
}

/* Rows per block of the vocabulary head in training: the logits of one block are all that is
 * stored of them. */
#define GJ_HEAD_ROWS 256

/* Time categories of a step (gptj bench). */
enum { GJ_PROF_GEMM, GJ_PROF_ATTN, GJ_PROF_ELEM, GJ_PROF_VOCAB, GJ_PROF_COMM, GJ_PROF_N };

/* Called during backward each time the gradients of a part, float offsets [lo, hi) of the
 * gradient block, are final, so that their DP reduction can start; g holds them: g[0] is
 * element lo (in the block, or in the state's gradient slot). The parts come from the top of
 * the block down (the head's hi is numel_pad) and together cover it, except that a network
 * with a late head gradient (gj_model's late_head) reports the head (part 0) last. */
typedef struct {
  int (*ready)(void *ctx, size_t lo, size_t hi, float *g);
  void *ctx;
} gj_grad_hook;

/* The network over one rank's shard: it borrows the parameters and gradients of a state
 * (model/state.h) and owns the activations and the bf16 weight copies. */
typedef struct {
  gj_config c;
  gj_grid *g;
  gj_state *st;               /* borrowed */
  const gj_layout *lay;       /* &st->lay */
  float *params, *grads;      /* st's blocks */
  double *prof;               /* NULL, or seconds accumulated per category [GJ_PROF_N] */
  int64_t Dl, Hl, Fl, Vl, v0; /* this rank's shard sizes; v0 = first vocab row */
  int recompute;              /* GJ_KEEP_ALL, GJ_RECOMPUTE (only the residual stream per layer) or GJ_DECODE */
  int training;               /* the vocabulary head runs in blocks, fused with its backward */
  /* The head's weight gradient is written late: in one product over all rows after the
   * embedding's backward (not block by block with the head), into its own memory, which until
   * then holds activations (the layers' and the head's work buffers: act_place), so that the
   * largest gradient of a wide model costs no memory of its own. The d logits of every row are
   * kept for it instead (bf16: dlg16). Its gradients are overwritten, not accumulated, and its
   * part is reported to the hook last. */
  int late_head;
  int head_done;              /* gj_model_forward_backward did the head's backward */
  double z_sum;               /* the last forward's z-loss part of *loss_sum (0 without z-loss) */
  gj_ptrs P, G;               /* G: every part into the state's gslot where it has one */
  int64_t Bmax, Tmax, B, T;   /* capacity and shape of the last forward */
  float *act_arena;
  size_t act_bytes;
  gj_acts a;
  int nthreads;
  /* bf16 precision on oneDNN: bfloat16 copies of the GEMM weights (every 2-D tensor but the
   * embedding), at the same offsets as in params; rounded again before the first forward after
   * gj_model_weights_changed (w16_scratch: at every head phase instead). NULL in float32 and on the FMA path. A training network copies
   * the vocabulary head's weight only (w16_head: then w16 is that tensor's copy, in the
   * activation arena: w16_scratch): the head's
   * weight is read by 2 N / GJ_HEAD_ROWS products a micro-batch, every other weight by two
   * (three with recomputation), which the door rounds as it goes at no measurable cost
   * (gptj-350m bf16 on AVX512_BF16: the same step time, 0.6 GB less). */
  gj_bf16 *w16;
  int w16_stale;
  const float *w16_head;
  int w16_scratch; /* training: w16 (the head's copy) lies in the work buffers dq .. dact, idle
                    * while the head runs, and is rounded as each head phase starts */
} gj_model;

/* The network over state st (made by gj_state_create for g's TP rank, or by
 * gj_state_create_weights for a network that never runs backward; it must outlive the model):
 * allocates and touches the activation arena. recompute = GJ_RECOMPUTE: activation
 * recomputation per layer (also what a forward-only network needs); GJ_DECODE: the KV-cache
 * path only (gj_model_forward_cached; k and v per layer, one slot of the rest, no gradient
 * buffers; in bf16 the cache is bfloat16); GJ_FORWARD: gj_model_forward only, for the loss (eval);
 * GJ_KEEP_ALL (0) keeps every layer's activations (the KV cache works too). training (GJ_TRAIN,
 * GJ_TRAIN_ONE, GJ_TRAIN_LATE): the vocabulary head runs in blocks of GJ_HEAD_ROWS rows, its
 * backward fused into gj_model_forward_backward, and the [N, Vl] logits are never stored
 * (gj_model_forward then returns the loss only); training = 0 keeps the whole logits (but
 * GJ_FORWARD's blocks, and decoding's last row). A late head gradient needs GJ_KEEP_ALL or
 * GJ_RECOMPUTE and a state with a gradient block (not a slot). */
int gj_model_create(gj_model *m, gj_state *st, gj_grid *g, int64_t Bmax, int64_t Tmax,
                    int recompute, int training);
void gj_model_free(gj_model *m);

/* Bytes a rank allocates for a layout, computed without allocating (the same arithmetic as
 * gj_state_create: bytes = params + grads + moments, and gj_model_create: act_bytes = acts;
 * training as gj_model_create's, GJ_TRAIN_ONE only for a state with a gradient block). */
typedef struct {
  size_t params, grads, moments, acts;
  size_t w16; /* bf16 precision: the bfloat16 copies of the GEMM weights (resident bytes) */
  int late_head;        /* the network writes the head's gradient late (gj_model) */
  size_t acts_in_grads; /* then: the activations' bytes that live in its memory, beside acts */
} gj_mem_sizes;
int gj_model_sizes(gj_mem_sizes *s, const gj_config *c, int tp, int dp, int zero,
                   int recompute, int training, int64_t B, int64_t T, int nthreads);

/* Forward over ids [B, T] with targets [B, T] (< 0: not scored). *loss_sum is the summed
 * cross-entropy (plus z-loss) over this DP rank's valid targets, *n_valid their number.
 * Leaves logits [B*T, Vl] in m->a.logits (not on a training model). */
int gj_model_forward(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                     int64_t T, float zloss, double *loss_sum, int64_t *n_valid);
/* Backward of the last forward; gradients ACCUMULATE into m->grads (the caller zeroes; over a
 * gradient slot, each part's gradients start from zero: one micro-batch a step),
 * each scaled by `scale` (1 / number of scored tokens in the global batch); hook (or NULL)
 * hears of the gradients as they become final. Not on a training model (use
 * gj_model_forward_backward). */
int gj_model_backward(gj_model *m, float scale, float zloss, const gj_grad_hook *hook);
/* Forward and backward of one micro-batch: the same results as gj_model_forward then
 * gj_model_backward, with the vocabulary head's backward done block by block as its forward
 * goes (so its logits are never stored whole on a training model). */
int gj_model_forward_backward(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                              int64_t T, float zloss, float scale, const gj_grad_hook *hook,
                              double *loss_sum, int64_t *n_valid);
/* The buffers of one GPT-J block over N = B*T new rows (rows in batch order, T per sequence);
 * NC = Bmax*Tmax rows of capacity. */
typedef struct {
  float *x, *xo;      /* [N, D] block input and output (xo may be x) */
  float *h;           /* [N, D] ln_1 output */
  float *mean, *rstd; /* [N] ln_1 statistics */
  float *q;           /* [N, Dl] queries after rotary (in bf16 training before it: there
                       * only the head-major bf16 copies qkv16 are rotated, and read) */
  float *k, *v;       /* [B, Tk, Dl], Tk = pos0 + T: keys (after rotary, as q) and values; the
                       * block writes rows pos0.. and attends over all Tk */
  float *att;         /* [N, Dl] attention output before out_proj */
  gj_bf16 *att16;     /* bf16 training: [N, Dl] its bf16 copy, the one kept (att is then forward's
                       * work buffer); NULL: none */
  float *lse;         /* [B, Hl, T] attention log-sum-exp (NULL: not kept) */
  float *pre;         /* [N, Fl] fc_in output (gelu of it goes to the dact work buffer) */
  gj_bf16 *pre16;     /* bf16 training: [N, Fl] its bf16 copy, the one kept (gelu of it goes to
                       * the g16 work buffer); NULL: none */
  gj_bf16 *h16;       /* bf16: [N, D] the ln_1 output's bf16 copy (in training the one kept of
                       * it); NULL: a->h16 */
  gj_bf16 *qkv16;     /* bf16: [3, NC, Dl] head-major copies of q, k, v (NULL: none; pos0 = 0),
                       * or with kv16 [NC, Dl] the copy of q */
  gj_bf16 *datt16;    /* bf16: [NC, Dl] head-major copy of d att (backward only) */
  gj_bf16 *kv16;      /* bf16 decode: the layer's KV cache [2, Hl, Tmax, Hd], the keys and values
                       * of positions < pos0 + T, the new ones rounded in (NULL: none; k and v
                       * then hold the new rows only, [N, Dl]) */
} gj_block_bufs;

/* GPT-J block l, x + attn(ln_1(x)) + mlp(ln_1(x)) into b->xo, with ONE TP all-reduce of the two
 * branches' partial sums, for T new tokens per sequence at positions pos0.. (pos0 > 0: one
 * sequence, B = 1, whose earlier keys and values are in b->k, b->v, or in b->kv16: the KV-cache
 * decode). The training forward, its recomputation in backward and the decode all run this
 * block; a->y and a->dact are its work buffers, a->h16 its bf16 ln_1 copy. */
int gj_model_block_forward(gj_model *m, int64_t l, const gj_block_bufs *b, int64_t B, int64_t T,
                           int64_t pos0);

/* out [n, D] = this rank's embedding rows of ids [n] (zero outside its vocab shard): from the
 * float32 table, or the bfloat16 one of a bf16-resident state. */
void gj_model_embed(gj_model *m, float *out, const int32_t *ids, int64_t n);

/* The parameters changed (optimizer step, load): bf16 weight copies are refreshed before the
 * next forward. Cheap; a no-op in float32. */
void gj_model_weights_changed(gj_model *m);
/* Refresh the bf16 copies now if they are stale (the forwards call it; w16_scratch: nothing,
 * the head phases round the head's copy). */
void gj_model_sync_w16(gj_model *m);
/* The bf16 copy of parameter tensor p (a pointer into m->params), or NULL: in float32, on the
 * FMA path, and in a training network for every tensor but the head's weight (the door then
 * rounds p itself). */
static inline const gj_bf16 *gj_model_w16(const gj_model *m, const float *p) {
  if (!m->w16) return NULL;
  if (m->w16_head) return p == m->w16_head ? m->w16 : NULL;
  return m->w16 + (p - m->params);
}

#endif
