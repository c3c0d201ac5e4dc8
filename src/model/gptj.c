#include "model/gptj.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <omp.h>

#include "common.h"
#include "model/attention.h"
#include "model/crossentropy.h"
#include "model/embedding.h"
#include "model/gelu.h"
#include "model/layernorm.h"
#include "model/linear.h"
#include "model/rotary.h"

/* Accumulate the time of stmt into category cat when profiling. */
#define TIMED(cat, stmt)                                                                     \
  do {                                                                                       \
    double t0_ = m->prof ? gj_now() : 0;                                                     \
    stmt;                                                                                    \
    if (m->prof) m->prof[cat] += gj_now() - t0_;                                             \
  } while (0)

/* The bf16 copy of weight p (NULL in float32). */
#define W16(p) gj_model_w16(m, (p))

/* In bf16 precision round n floats of src into dst and return dst; in float32 return NULL
 * (the products then use src itself). */
static const gj_bf16 *round16(gj_bf16 *dst, const float *src, int64_t n) {
  if (!dst) return NULL;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 8192) gj_bf16_round(dst + i, src + i, (size_t)GJ_MIN(8192, n - i));
  return dst;
}

/* The activation arena's buffers, in order, with their sizes in floats. pin: never in the
 * head gradient's memory (a late head gradient, act_place): read by the late product or kept
 * across steps; glue: right after the previous buffer (dq .. dact hold the head's bf16 copy). */
#define GJ_ACT_ITEMS 41
enum { DQ = 6 }; /* the index of dq, the first of the run dq .. dact */
typedef struct {
  float **p;
  size_t n;
  unsigned char pin, glue;
} act_item;

/* Saturating size arithmetic for the activation sizes: a product that overflows becomes
 * SIZE_MAX, far above GJ_ACT_MAX_FLOATS, so act_total refuses it and no wrapped size ever
 * reaches an allocation. */
static size_t smul(size_t a, size_t b) {
  size_t n;
  return gj_mul_size(&n, a, b) ? SIZE_MAX : n;
}
static size_t smul3(size_t a, size_t b, size_t c) { return smul(smul(a, b), c); }
static size_t sadd(size_t a, size_t b) {
  size_t n;
  return gj_add_size(&n, a, b) ? SIZE_MAX : n;
}
static size_t shalf(size_t a) { return a / 2 + (a & 1); } /* ceil(a / 2) without overflow */

/* Largest activation arena (2^60 bytes): no machine has it, and below it every int64 product
 * of the kernels' sizes (rows * columns of any buffer) is exact. */
#define GJ_ACT_MAX_FLOATS ((size_t)1 << 58)

static void act_list(gj_acts *a, act_item *fl, const gj_config *c, int tp, int recompute,
                     int training, int late, int64_t Bmax, int64_t Tmax, int nthreads) {
  /* the config is valid (each factor bounded), Bmax, Tmax >= 1 and Tmax <= n_positions
   * (check_shape): only products with the batch can overflow, and those saturate */
  size_t L = (size_t)c->n_layer, D = (size_t)c->n_embd, N = smul((size_t)Bmax, (size_t)Tmax);
  size_t R = (size_t)c->rotary_dim;
  /* With recomputation only the residual stream is kept per layer; the rest of a layer's
   * activations live in one slot, recomputed during backward. */
  size_t Ls = recompute ? 1 : L;
  /* decode (GJ_DECODE): forward through the KV cache only: k and v per layer, one slot of the
   * rest, the residual stream in place, the logits of one row, no gradient buffers; forward
   * only (GJ_FORWARD): the same without the cache, the logits of one block of rows */
  int dec = recompute == GJ_DECODE, fwd = recompute == GJ_FORWARD, nograd = dec || fwd;
  size_t Hl = (size_t)(c->n_head / tp), Dl = Hl * (size_t)gj_config_head_dim(c);
  /* the largest vocabulary shard: TP rank 0's (gj_split) */
  size_t Fl = (size_t)(c->n_inner / tp), Vl = (size_t)gj_split(c->vocab_size, tp, 0, NULL);
  int bf = gj_gemm_precision() == GJ_PREC_BF16;
  /* a training model keeps the logits of one block of rows of the vocabulary head only; with
   * a late head gradient (gj_model's late_head) in float32 the d logits of every row, which
   * the late product reads (in bf16 their bf16 copies: dlg16) */
  size_t Nlg = dec ? 1 : (training || fwd) && !(late && !bf) ? GJ_MIN(N, (size_t)GJ_HEAD_ROWS) : N;
  /* bf16 copies (in floats: two per float): the ln_1 output, the block-output gradient, and
   * the gradient operands of one product group (d act, d q, d k and d v together, or a block
   * of d logits) */
  size_t g16 = GJ_MAX(smul(N, GJ_MAX(Fl, 3 * Dl)), late ? 0 : smul(GJ_MIN(N, (size_t)GJ_HEAD_ROWS), Vl));
  /* bf16 training: q, k, v and the fc_in output per layer as bf16 copies only, the ln_1
   * output not at all (see lean_qkv); bf16 decode: the KV cache in bfloat16 only, the float k, v one layer's new rows */
  int lean = bf && training, kv16 = bf && dec;
  /* lean: the float q, k, v, attention output and fc_in output are forward's work buffers only
   * (backward reads their bf16 copies), so they share the gradient buffers dq, dk, dv, datt and
   * dact (lean_alias) */
  size_t qf = lean ? 0 : 1;
  size_t Lq = lean ? 1 : Ls, Lq16 = lean ? Ls : 1, Lkv = dec && !kv16 ? L : Lq;
  size_t ND = smul(N, D), NDl = smul(N, Dl), gD = nograd ? 0 : ND, gDl = nograd ? 0 : NDl;
  /* a bf16 training network on oneDNN keeps the vocabulary head's bf16 weight copy in the
   * work buffers dq .. dact (contiguous below), idle while the head runs (head_w16): dact grows
   * to make room where they are smaller than the copy */
  size_t nact = smul(N, Fl), pad16 = (NDl + 15) / 16 * 16;
  if (lean && !nograd && gj_gemm_reads_bf16()) {
    size_t head16 = shalf(smul(Vl, D)), rest = smul(4, pad16);
    if (head16 > sadd(rest, nact)) nact = head16 - rest;
  }
  /* head-major bf16 copies: q, k, v per kept slot and d att; q, k, v forward only; q alone
   * beside a bf16 KV cache */
  size_t q16 = kv16 ? NDl : fwd ? smul(3, NDl) : smul(3 * Lq16 + 1, NDl);
  /* rotary tables for the positions a forward can reach: [Tmax, R/2] */
  size_t rot = sadd(smul((size_t)Tmax, R / 2), 1);
  /* bf16 training: the ln_f output's bf16 copy, read by every product of the head */
  int xf16 = bf && training && !nograd;
  /* first the buffers a late head gradient keeps out of its memory (so that one not kept out
   * would go there, tests/test_mpi.c's test_late_head), then the largest run that may go there */
  act_item items[GJ_ACT_ITEMS] = {
      {&a->rot_cos, rot, 1, 0}, {&a->rot_sin, rot, 1, 0},
      {(float **)&a->xf16, xf16 ? shalf(ND) : 0, 1, 0},
      {(float **)&a->dlg16, bf && late ? shalf(smul(N, Vl)) : 0, 1, 0},
      {&a->xf, ND, !xf16, 0}, {&a->logits, smul(Nlg, Vl), !bf, 0},
      {&a->dq, gDl, 0, 0}, {&a->dk, gDl, 0, 1}, {&a->dv, gDl, 0, 1}, {&a->datt, gDl, 0, 1},
      {&a->dact, nact, 0, 1},
      {&a->resid, smul(nograd ? 1 : L + 1, ND), 0, 0}, {&a->ln_mean, smul(Ls, N), 0, 0},
      {&a->ln_rstd, smul(Ls, N), 0, 0}, {&a->h, smul(Lq, ND), 0, 0},
      {&a->q, qf * smul(Lq, NDl), 0, 0}, {&a->k, qf * smul(Lkv, NDl), 0, 0},
      {&a->v, qf * smul(Lkv, NDl), 0, 0}, {&a->att, qf * smul(Ls, NDl), 0, 0},
      {&a->lse, smul3(Ls, N, Hl), 0, 0}, {&a->pre, qf * smul3(Lq, N, Fl), 0, 0},
      {&a->lnf_mean, N, 0, 0}, {&a->lnf_rstd, N, 0, 0}, {&a->ce_mx, N, 0, 0}, {&a->ce_lse, N, 0, 0},
      {&a->ce_stats, smul(2, N), 0, 0},
      {&a->ce_acc, nograd ? 0 : gj_ce_backward_scratch(nthreads, Vl), 0, 0},
      {&a->y, ND, 0, 0}, {&a->dx, gD, 0, 0}, {&a->dh, gD, 0, 0},
      {&a->attn_scratch, gj_attention_scratch_floats(nthreads, Tmax, gj_config_head_dim(c)), 0, 0},
      {&a->attn_delta, nograd ? 0 : smul(N, Hl), 0, 0},
      {(float **)&a->ids, N, 0, 0}, {(float **)&a->targets, N, 0, 0},
      {(float **)&a->h16, bf ? shalf(ND) : 0, 0, 0},
      {(float **)&a->dx16, bf && !nograd ? shalf(ND) : 0, 0, 0},
      {(float **)&a->g16, bf && !nograd ? shalf(g16) : 0, 0, 0},
      {(float **)&a->qkv16, bf ? sadd(q16 / 2, 1) : 0, 0, 0},
      {(float **)&a->kv16, kv16 ? smul3(L, 2, NDl) / 2 : 0, 0, 0}, /* 2 L NDl: even, or saturated */
      {(float **)&a->pre16, lean ? shalf(smul3(Ls, N, Fl)) : 0, 0, 0},
      {(float **)&a->att16, lean ? shalf(smul(Ls, NDl)) : 0, 0, 0},
  };
  memcpy(fl, items, sizeof items);
}

static int lean_qkv(const gj_model *m);

/* bf16 training (act_list's lean): q, k, v and the fc_in output in float are written by a
 * layer's forward (or its recomputation) and read only there, before its backward writes the
 * gradients: they live in dq, dk, dv and dact (the same sizes, [N, Dl] and [N, Fl]). */
static void lean_alias(gj_acts *a) {
  a->q = a->dq, a->k = a->dk, a->v = a->dv, a->att = a->datt, a->pre = a->dact;
}

/* The capacity [Bmax, Tmax] and thread count act_list may rely on. */
static int check_shape(const gj_config *c, int64_t Bmax, int64_t Tmax, int nthreads) {
  if (Bmax < 1 || Tmax < 1)
    return GJ_FAIL("internal: batch capacity [%lld, %lld]", (long long)Bmax, (long long)Tmax);
  if (Tmax > c->n_positions)
    return GJ_FAIL("sequence length %lld exceeds n_positions %lld", (long long)Tmax,
                   (long long)c->n_positions);
  if (nthreads < 1 || nthreads > 65536) return GJ_FAIL("internal: %d threads", nthreads);
  return 0;
}

/* Where each buffer lives: offsets in floats (each buffer padded to 64 bytes) into the arena
 * or, with a late head gradient, into the head gradient's memory. */
typedef struct {
  size_t off[GJ_ACT_ITEMS];
  unsigned char slot[GJ_ACT_ITEMS]; /* in the head gradient's memory */
  size_t arena, in_slot;            /* floats of each */
} act_plan;

static size_t pad16f(size_t n) { return (n + 15) / 16 * 16; }

/* The buffers' places: with cap > 0 floats of the head gradient's memory the unpinned ones go
 * there while they fit, in list order (a glued run as one), the others into the arena. Refuses
 * a batch whose arena would exceed GJ_ACT_MAX_FLOATS (or overflow). */
static int act_place(act_plan *pl, const act_item *fl, size_t cap, const gj_config *c, int64_t B,
                     int64_t T) {
  memset(pl, 0, sizeof *pl);
  for (size_t i = 0, j; i < GJ_ACT_ITEMS; i = j) {
    size_t u = 0; /* a run's floats: at most GJ_ACT_ITEMS 2^58, no overflow */
    int pin = 0, big = 0;
    for (j = i; j < GJ_ACT_ITEMS && (j == i || fl[j].glue); j++)
      big |= fl[j].n > GJ_ACT_MAX_FLOATS, u += big ? 0 : pad16f(fl[j].n), pin |= fl[j].pin;
    int s = !big && !pin && u <= cap - pl->in_slot;
    size_t *at = s ? &pl->in_slot : &pl->arena;
    for (size_t k = i; k < j && !big; k++)
      pl->slot[k] = (unsigned char)s, pl->off[k] = *at, *at += pad16f(fl[k].n);
    if (big || pl->arena > GJ_ACT_MAX_FLOATS)
      return GJ_FAIL("activations of a micro-batch of %lld x %lld tokens exceed %.3g bytes "
                     "(n_layer %lld, n_embd %lld, n_inner %lld, vocab_size %lld): use a smaller "
                     "--micro-batch or --seq-len", (long long)B, (long long)T,
                     (double)GJ_ACT_MAX_FLOATS * sizeof(float), (long long)c->n_layer,
                     (long long)c->n_embd, (long long)c->n_inner, (long long)c->vocab_size);
  }
  return 0;
}

/* The elements of this rank's vocabulary-head weight: a training network's one bf16 copy. */
static size_t head_numel(const gj_layout *l) { return gj_layout_tail(l, 0)[GJ_TAIL_LM_W].numel; }

/* The activations' list and places for gj_model_create's arguments; *late: the head's weight
 * gradient is written late (gj_model's late_head), where training asks for it (GJ_TRAIN_LATE)
 * or allows it (GJ_TRAIN_ONE) and it makes the arena smaller, or, with the products reading
 * bf16 (oneDNN) at DP 1, makes it at most an eighth larger. Its memory (from its first 64-byte
 * boundary) then holds the buffers act_place puts there.
 * Why the second case: late, the head's weight gradient is one product over every row; in
 * blocks it is N / GJ_HEAD_ROWS products that each read and write the whole [Vl, D] float
 * gradient (gptj-125m: 310 MB of traffic for each block's 19.8 GFLOP). At bf16's rate that
 * traffic shows (AVX512_BF16: 525 GFLOP/s in blocks of 256 rows against 700 over 2048 rows at
 * once), and a gptj-125m bf16 step at B 8, T 256 runs 3-5% faster late, for 38 MB more; in
 * float32 it does not (gptj-350m: the head's time the same, 300 MB more). At DP > 1 the late
 * head's gradients join the DP sums last, after backward, not overlapped with it: there only
 * memory decides. */
static int act_layout(gj_acts *a, act_item *fl, act_plan *pl, int *late, const gj_config *c,
                      const gj_layout *l, int tp, int dp, int recompute, int training,
                      int64_t B, int64_t T, int nthreads) {
  act_list(a, fl, c, tp, recompute, training != 0, 0, B, T, nthreads);
  GJ_TRY(act_place(pl, fl, 0, c, B, T));
  *late = 0;
  if ((training != GJ_TRAIN_ONE && training != GJ_TRAIN_LATE) ||
      (recompute != GJ_KEEP_ALL && recompute != GJ_RECOMPUTE))
    return 0;
  act_item f2[GJ_ACT_ITEMS];
  act_plan p2;
  size_t cap = head_numel(l) > 16 ? (head_numel(l) - 16) / 16 * 16 : 0;
  act_list(a, f2, c, tp, recompute, 1, 1, B, T, nthreads);
  GJ_TRY(act_place(&p2, f2, cap, c, B, T));
  if (training == GJ_TRAIN_LATE || p2.arena < pl->arena ||
      (dp == 1 && gj_gemm_reads_bf16() && p2.arena - pl->arena <= pl->arena / 8))
    memcpy(fl, f2, sizeof f2), *pl = p2, *late = 1;
  return 0;
}

int gj_model_sizes(gj_mem_sizes *s, const gj_config *c, int tp, int dp, int zero,
                   int recompute, int training, int64_t B, int64_t T, int nthreads) {
  if (dp < 1) return GJ_FAIL("internal: DP size %d", dp);
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, c, tp, 0));
  GJ_TRY(check_shape(c, B, T, nthreads));
  size_t np, P;
  gj_state_sizes(l.numel, dp, zero, &np, &P);
  /* a training network's head copy is in its activations (act_list), but a forward-only one's */
  s->w16 = 0;
  if (gj_gemm_reads_bf16() && training && (recompute == GJ_DECODE || recompute == GJ_FORWARD))
    s->w16 = head_numel(&l) * sizeof(gj_bf16);
  else if (gj_gemm_reads_bf16() && !training)
    for (int i = 0; i < l.n; i++)
      if (gj_tensor_has_w16(&l.t[i])) s->w16 += l.t[i].numel * sizeof(gj_bf16);
  /* np, P <= numel + 16 dp, numel <= 2 GJ_MAX_PARAMS: these byte counts are far from overflowing */
  s->params = s->grads = np * sizeof(float);
  s->moments = 2 * P * sizeof(float);
  gj_acts dummy;
  act_item fl[GJ_ACT_ITEMS];
  act_plan pl;
  int rc = act_layout(&dummy, fl, &pl, &s->late_head, c, &l, tp, dp, recompute, training, B, T,
                      nthreads);
  gj_layout_free(&l);
  if (rc) return rc;
  s->acts = pl.arena * sizeof(float);
  s->acts_in_grads = pl.in_slot * sizeof(float);
  return 0;
}

int gj_model_create(gj_model *m, gj_state *st, gj_grid *g, int64_t Bmax, int64_t Tmax,
                    int recompute, int training) {
  memset(m, 0, sizeof *m);
  const gj_config *c = &st->c;
  GJ_TRY(check_shape(c, Bmax, Tmax, omp_get_max_threads()));
  m->c = *c;
  m->g = g;
  m->st = st, m->lay = &st->lay, m->params = st->params, m->grads = st->grads ? st->grads : st->gslot;
  m->recompute = recompute;
  m->training = training != 0;
  /* a late head gradient needs the state's whole gradient block */
  if (training && (!st->grads || st->gslot)) training = GJ_TRAIN;
  int tp = g->tp_size;
  m->Hl = c->n_head / tp;
  m->Dl = m->Hl * gj_config_head_dim(c);
  m->Fl = c->n_inner / tp;
  m->Vl = gj_split(c->vocab_size, tp, g->tp_rank, &m->v0);
  m->Bmax = Bmax, m->Tmax = Tmax;
  m->nthreads = omp_get_max_threads();
  size_t np = st->numel_pad;
  m->P.h = calloc(c->n_layer, sizeof(gj_block_ptrs));
  m->G.h = calloc(c->n_layer, sizeof(gj_block_ptrs));
  if (!m->P.h || !m->G.h) return gj_model_free(m), GJ_FAIL("out of memory");
  gj_layout_ptrs(m->lay, c, m->params, &m->P);
  if (st->gslot) gj_layout_ptrs_parts(m->lay, c, st->gslot, &m->G);
  else if (m->grads) gj_layout_ptrs(m->lay, c, m->grads, &m->G); /* none: an inference network */

  /* Activation arena: a size pass over the same list that assigns the pointers. */
  act_item fl[GJ_ACT_ITEMS];
  act_plan pl;
  int late;
  GJ_TRY(act_layout(&m->a, fl, &pl, &late, c, m->lay, tp, g->dp_size, recompute, training, Bmax,
                    Tmax, m->nthreads));
  int64_t R = c->rotary_dim;
  m->act_bytes = pl.arena * sizeof(float);
  m->act_arena = gj_arena_alloc(m->act_bytes);
  if (!m->act_arena)
    return gj_model_free(m), GJ_FAIL("out of memory: activation arena of %zu bytes", m->act_bytes);
  m->late_head = late;
  float *slot = late ? (float *)(((uintptr_t)m->G.lm_w + 63) / 64 * 64) : NULL;
  for (size_t i = 0; i < GJ_ACT_ITEMS; i++) /* the bf16 copies are NULL in float32 */
    *fl[i].p = fl[i].n ? (pl.slot[i] ? slot : m->act_arena) + pl.off[i] : NULL;
  int fwd_only = recompute == GJ_DECODE || recompute == GJ_FORWARD;
  if (st->w16) { /* bf16-resident weights: the state's copies are the weights */
    m->w16 = st->w16;
  } else if (gj_gemm_reads_bf16() && training && !fwd_only) {
    /* the head's copy in the work buffers dq .. dact (act_list made room), rounded as each head
     * phase starts (head_w16): while the head runs they are idle, and the layers overwrite
     * them before and after */
    m->w16 = (gj_bf16 *)m->a.dq, m->w16_head = m->P.lm_w, m->w16_scratch = 1;
    size_t room = (size_t)((char *)(m->a.dact + pad16f(fl[DQ + 4].n)) - (char *)m->a.dq);
    if (fl[DQ].p != &m->a.dq || fl[DQ + 4].p != &m->a.dact || room < head_numel(m->lay) * sizeof(gj_bf16))
      return gj_model_free(m), GJ_FAIL("internal: no room for the head's bf16 copy");
  } else if (gj_gemm_reads_bf16()) {
    /* an inference network: only the GEMM weights' pages are ever touched (by the first
     * refresh); a forward-only training network: the head's weight only. On the FMA units the
     * products round the float32 weights themselves. */
    size_t n16 = training ? head_numel(m->lay) : np;
    if (posix_memalign((void **)&m->w16, (size_t)2 << 20, n16 * sizeof(gj_bf16)))
      return m->w16 = NULL, gj_model_free(m),
             GJ_FAIL("out of memory: bf16 weight copies of %zu bytes", n16 * sizeof(gj_bf16));
#ifdef MADV_HUGEPAGE
    madvise(m->w16, n16 * sizeof(gj_bf16), MADV_HUGEPAGE);
#endif
    m->w16_stale = 1;
    if (training) m->w16_head = m->P.lm_w;
  }
  if (lean_qkv(m)) lean_alias(&m->a);
  gj_rotary_table(m->a.rot_cos, m->a.rot_sin, Tmax, R); /* positions < Tmax only */
  return 0;
}

void gj_model_embed(gj_model *m, float *out, const int32_t *ids, int64_t n) {
  const int64_t D = m->c.n_embd;
  if (m->st->w16) /* bf16-resident: the table is held in bfloat16 only */
    gj_embedding_forward16(out, ids, m->st->w16 + m->lay->t[GJ_LAYOUT_WTE].offset, n, D, m->v0, m->Vl);
  else
    gj_embedding_forward(out, ids, m->P.wte, n, D, m->v0, m->Vl);
}

void gj_model_weights_changed(gj_model *m) { m->w16_stale = m->w16 != NULL && !m->st->w16; }

void gj_model_sync_w16(gj_model *m) {
  if (!m->w16 || !m->w16_stale || m->w16_scratch) return;
  if (m->w16_head) {
    round16(m->w16, m->w16_head, (int64_t)head_numel(m->lay));
  } else {
    for (int i = 0; i < m->lay->n; i++) {
      const gj_tensor *t = &m->lay->t[i];
      if (gj_tensor_has_w16(t)) round16(m->w16 + t->offset, m->params + t->offset, (int64_t)t->numel);
    }
  }
  m->w16_stale = 0;
}

void gj_model_free(gj_model *m) {
  if ((!m->st || m->w16 != m->st->w16) && !m->w16_scratch) free(m->w16);
  free(m->act_arena);
  free(m->P.h);
  free(m->G.h);
  memset(m, 0, sizeof *m);
}


/* bf16 training keeps q, k, v per layer only as their head-major bf16 copies (all that the
 * attention backward reads) and the fc_in output as its bf16 copy (GELU's input), each in one
 * float slot otherwise (the gradient buffers: lean_alias); the ln_1 output (the bf16 copy all
 * its four products read) is computed again in backward from the block input, a cheap
 * LayerNorm, into one slot. */
static int lean_qkv(const gj_model *m) { return m->a.qkv16 && m->training; }

/* A layer's buffers in training: the residual input x of layer l and its output (slot l + 1),
 * and the slot that holds its other activations (slot l, or slot 0 with recomputation). */
static gj_block_bufs layer_at(gj_model *m, int64_t l) {
  gj_acts *a = &m->a;
  const int64_t NC = m->Bmax * m->Tmax, D = m->c.n_embd, Dl = m->Dl, s = m->recompute ? 0 : l;
  const int64_t sq = lean_qkv(m) ? 0 : s, s16 = lean_qkv(m) ? s : 0;
  const int64_t n16 = lean_qkv(m) ? (m->recompute ? 1 : m->c.n_layer) : 1;
  const int fwd = m->recompute == GJ_FORWARD; /* the residual stream in place, no backward */
  gj_block_bufs b = {a->resid + (fwd ? 0 : l) * NC * D, a->resid + (fwd ? 0 : l + 1) * NC * D,
                     a->h + sq * NC * D, a->ln_mean + s * NC, a->ln_rstd + s * NC,
                     a->q + sq * NC * Dl, a->k + sq * NC * Dl, a->v + sq * NC * Dl,
                     a->att + sq * NC * Dl, a->att16 ? a->att16 + s * NC * Dl : NULL,
                     a->lse + s * NC * m->Hl, a->pre + sq * NC * m->Fl,
                     a->pre16 ? a->pre16 + s * NC * m->Fl : NULL,
                     a->h16, /* one slot: rounded again where it is read */
                     a->qkv16 ? a->qkv16 + s16 * 3 * NC * Dl : NULL,
                     a->qkv16 && !fwd ? a->qkv16 + n16 * 3 * NC * Dl : NULL, NULL};
  return b;
}

/* Layer l up to the inputs of its two output projections: ln_1, q/k/v with rotary, attention
 * and fc_in (gelu of it is recomputed where needed, into the dact work buffer, so that it is
 * never stored per layer). No communication: it can be recomputed in backward. In bf16 the
 * ln_1 output is rounded once into its bf16 copy for its four products. The new k, v rows go to rows
 * pos0.. of b->k, b->v (one sequence when pos0 > 0), and the queries attend over all
 * pos0 + T keys. */
static void layer_acts(gj_model *m, int64_t l, const gj_block_bufs *b, int64_t B, int64_t T,
                       int64_t pos0) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const gj_block_ptrs *p = &m->P.h[l];
  const int64_t N = B * T, D = c->n_embd, Dl = m->Dl, Fl = m->Fl, Hl = m->Hl;
  const int64_t Hd = gj_config_head_dim(c), R = c->rotary_dim, Tk = pos0 + T;
  /* the head-major copies of q, k, v cover the new rows only, so they need every key to be
   * new; a bf16 KV cache holds the earlier ones */
  assert(pos0 == 0 || (B == 1 && (!b->qkv16 || b->kv16)));
  /* [N, Dl] the new rows: after the earlier ones in a float cache */
  float *kn = b->kv16 ? b->k : b->k + pos0 * Dl, *vn = b->kv16 ? b->v : b->v + pos0 * Dl;
  gj_bf16 *h16 = b->h16 ? b->h16 : a->h16;
  /* in bf16 only the bf16 copy is written: every product reads that, never the float */
  TIMED(GJ_PROF_ELEM, gj_layernorm_forward(h16 ? NULL : b->h, h16, b->mean, b->rstd, b->x, p->ln1_w,
                                           p->ln1_b, N, D, (float)c->layer_norm_epsilon));
  TIMED(GJ_PROF_GEMM, gj_linear_forward(b->q, b->h, h16, p->wq, W16(p->wq), NULL, N, D, Dl, 0);
        gj_linear_forward(kn, b->h, h16, p->wk, W16(p->wk), NULL, N, D, Dl, 0);
        gj_linear_forward(vn, b->h, h16, p->wv, W16(p->wv), NULL, N, D, Dl, 0));
  /* bf16 training rotates q and k on their way into their bf16 copies (below): the float ones,
   * work buffers only there, are not read again */
  const int lean = lean_qkv(m);
  if (!lean)
    TIMED(GJ_PROF_ELEM, gj_rotary_forward(b->q, a->rot_cos, a->rot_sin, B, T, Hl, Hd, R, pos0, Dl);
          gj_rotary_forward(kn, a->rot_cos, a->rot_sin, B, T, Hl, Hd, R, pos0, Dl));
  const gj_bf16 *qkv16[3] = {NULL, NULL, NULL};
  int64_t Tkc = Tk; /* rows per head of the k, v copies */
  if (b->kv16) { /* q's copy; the new keys and values rounded into the cache at pos0 */
    const int64_t Tc = m->Tmax;
    gj_bf16 *kc = b->kv16, *vc = b->kv16 + Hl * Tc * Hd;
    TIMED(GJ_PROF_ELEM, gj_attention_heads16(b->qkv16, b->q, 1, T, Hl, Hd, Dl);
          gj_attention_heads16_at(kc, Tc, pos0, kn, 1, T, Hl, Hd, Dl);
          gj_attention_heads16_at(vc, Tc, pos0, vn, 1, T, Hl, Hd, Dl));
    qkv16[0] = b->qkv16, qkv16[1] = kc, qkv16[2] = vc, Tkc = Tc;
  } else if (b->qkv16) {
    const float *src[3] = {b->q, b->k, b->v};
    const int64_t NC = m->Bmax * m->Tmax;
    assert(!lean || pos0 == 0);
    for (int j = 0; j < 3; j++)
      TIMED(GJ_PROF_ELEM, if (lean && j < 2) gj_rotary_heads16(b->qkv16 + j * NC * Dl, src[j], a->rot_cos,
                                                               a->rot_sin, B, T, Hl, Hd, R, Dl);
            else gj_attention_heads16(b->qkv16 + j * NC * Dl, src[j], B, T, Hl, Hd, Dl);
            qkv16[j] = b->qkv16 + j * NC * Dl);
  }
  /* with a bf16 cache the float k, v (the new rows only) are not read: their copies are; with
   * the output's bf16 copy (lean) the float output is not written: the copy is all that is read */
  TIMED(GJ_PROF_ATTN, gj_attention_forward(b->att16 ? NULL : b->att, b->att16, b->lse, b->q, b->k, b->v, qkv16, Tkc,
                                           a->attn_scratch, B, T, Tk, Hl, Hd, Dl, Dl, T * Dl, Dl,
                                           Tk * Dl));
  /* bf16 training reads fc_in's output only through its bf16 copy: where the products read
   * bf16 (oneDNN) the product writes that; elsewhere (a float scratch of N x Fl then) it is
   * rounded from the float, which the lean arena's dact holds */
  if (b->pre16 && gj_gemm_reads_bf16()) {
    TIMED(GJ_PROF_GEMM, gj_linear_forward16(b->pre16, b->h, h16, p->fc_in_w, W16(p->fc_in_w),
                                            p->fc_in_b, N, D, Fl));
  } else {
    TIMED(GJ_PROF_GEMM, gj_linear_forward(b->pre, b->h, h16, p->fc_in_w, W16(p->fc_in_w),
                                          p->fc_in_b, N, D, Fl, 0));
    if (b->pre16) TIMED(GJ_PROF_ELEM, round16(b->pre16, b->pre, N * Fl));
  }
}

int gj_model_block_forward(gj_model *m, int64_t l, const gj_block_bufs *b, int64_t B, int64_t T,
                           int64_t pos0) {
  gj_acts *a = &m->a;
  const gj_block_ptrs *p = &m->P.h[l];
  const int64_t N = B * T, D = m->c.n_embd, Dl = m->Dl, Fl = m->Fl;
  float *x = b->x, *xo = b->xo;
  layer_acts(m, l, b, B, T, pos0);
  /* gelu of the bf16 copy goes straight to bf16 (fc_out's operand), else to dact */
  const gj_bf16 *act16 = b->pre16 ? a->g16 : NULL;
  if (act16) TIMED(GJ_PROF_ELEM, gj_gelu_forward16(a->g16, b->pre16, N * Fl));
  else TIMED(GJ_PROF_ELEM, gj_gelu_forward(a->dact, b->pre, N * Fl));
  /* Parallel residual: attention and MLP partial outputs summed, then ONE all-reduce; fc_out's
   * (replicated) bias is added by tp_rank 0 only, so that the sum holds it once. */
  TIMED(GJ_PROF_GEMM, gj_linear_forward(a->y, b->att, b->att16, p->wo, W16(p->wo), NULL, N, Dl, D, 0);
        gj_linear_forward(a->y, a->dact, act16, p->fc_out_w, W16(p->fc_out_w),
                          m->g->tp_rank == 0 ? p->fc_out_b : NULL, N, Fl, D, 1));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_reduce_from_region(m->g, a->y, N * D)));
  double t0 = m->prof ? gj_now() : 0;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N * D; i++) xo[i] = x[i] + a->y[i]; /* xo may be x */
  if (m->prof) m->prof[GJ_PROF_ELEM] += gj_now() - t0;
  return 0;
}

/* Over a gradient slot: part k (gj_layout_part_lo) is about to be computed; its gradients start
 * at zero. */
static void slot_part(gj_model *m, int k) {
  if (!m->st->gslot) return;
  float *g = m->st->gslot;
  const size_t lo = gj_layout_part_lo(m->lay, k), hi = gj_layout_part_hi(m->lay, k);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < hi - lo; i += 65536) memset(g + i, 0, GJ_MIN(65536, hi - lo - i) * sizeof(float));
}

/* Embedding, the blocks and ln_f: leaves the ln_f output in a->xf. */
static int forward_body(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                        int64_t T) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  if (m->recompute == GJ_DECODE)
    return GJ_FAIL("internal: a decode network runs gj_model_forward_cached only");
  if (B > m->Bmax || T > m->Tmax)
    return GJ_FAIL("internal: batch [%lld, %lld] exceeds the arena's [%lld, %lld]", (long long)B,
                   (long long)T, (long long)m->Bmax, (long long)m->Tmax);
  m->B = B, m->T = T;
  const int64_t N = B * T, D = c->n_embd;
  const int64_t NC = m->Bmax * m->Tmax;
  const float eps = (float)c->layer_norm_epsilon;
  gj_model_sync_w16(m);
  memcpy(a->ids, ids, N * sizeof(int32_t));
  memcpy(a->targets, targets, N * sizeof(int32_t));

  TIMED(GJ_PROF_VOCAB, gj_model_embed(m, a->resid, ids, N));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_reduce_from_region(m->g, a->resid, N * D)));
  for (int64_t l = 0; l < c->n_layer; l++) {
    gj_block_bufs lb = layer_at(m, l);
    GJ_TRY(gj_model_block_forward(m, l, &lb, B, T, 0));
  }

  float *xL = a->resid + (m->recompute == GJ_FORWARD ? 0 : c->n_layer) * NC * D;
  /* bf16 training: the head's products read the bf16 copy only */
  TIMED(GJ_PROF_ELEM, gj_layernorm_forward(a->xf16 ? NULL : a->xf, a->xf16, a->lnf_mean, a->lnf_rstd,
                                           xL, m->P.lnf_w, m->P.lnf_b, N, D, eps));
  return 0;
}

/* The vocabulary head over rows [r0, r0 + R): logits into lg [R, Vl], the vocab-parallel
 * cross-entropy (two small TP all-reduces) and the loss of those rows; ce_lse[r0..] keeps
 * log Z for backward. With scale != 0 also its backward, at once: d loss / d logits (into lg,
 * or into g16 only in bf16: with a late head gradient into dlg16's rows r0..), dh[r0..] (this
 * shard's partial d xf) and the lm_head gradients accumulate (the weight's not with a late
 * head gradient: late_head_grad). */
static int head_rows(gj_model *m, float *lg, int64_t r0, int64_t R, float zloss, float scale,
                     double *loss_sum, int64_t *n_valid) {
  gj_acts *a = &m->a;
  const int64_t D = m->c.n_embd, Vl = m->Vl;
  const int32_t *tg = a->targets + r0;
  float *mx = a->ce_mx + r0, *st = a->ce_stats + 2 * r0, *lse = a->ce_lse + r0;
  const float *xf = a->xf + r0 * D;
  const gj_bf16 *xf16 = a->xf16 ? a->xf16 + r0 * D : NULL;
  TIMED(GJ_PROF_VOCAB, gj_linear_forward(lg, xf, xf16, m->P.lm_w, W16(m->P.lm_w), m->P.lm_b, R, D, Vl, 0);
        gj_ce_stats(mx, st, lg, tg, R, Vl, m->v0));
  /* each shard's sums are relative to its own max (lse keeps it until gj_ce_loss): rescaled to
   * the global max, then summed (with one shard the max is its own and the factor exactly 1) */
  memcpy(lse, mx, R * sizeof(float));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_max(m->g, mx, R)));
  gj_ce_rescale(st, lse, mx, R);
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, st, 2 * R)));
  int64_t nv;
  double zs;
  *loss_sum += gj_ce_loss(lse, mx, st, tg, R, zloss, &nv, &zs);
  *n_valid += nv, m->z_sum += zs;
  if (scale == 0.0f) return 0;
  /* one pass: d logits and the bias gradient; in bf16 only the bf16 copy of d logits, which
   * the products read (lg keeps the logits: no float d is passed on) */
  gj_bf16 *g16 = gj_gemm_precision() != GJ_PREC_BF16 ? NULL : a->dlg16 ? a->dlg16 + r0 * Vl : a->g16;
  TIMED(GJ_PROF_VOCAB, gj_ce_backward(g16 ? NULL : lg, g16, m->G.lm_b, a->ce_acc, lg, lse, tg, R, Vl,
                                      m->v0, scale, zloss);
        if (m->late_head) gj_linear_backward_input(a->dh + r0 * D, g16 ? NULL : lg, g16, m->P.lm_w,
                                                   W16(m->P.lm_w), R, D, Vl, 0);
        else gj_linear_backward(a->dh + r0 * D, m->G.lm_w, NULL, g16 ? NULL : lg, g16, xf, xf16,
                                m->P.lm_w, W16(m->P.lm_w), R, D, Vl, 0));
  return 0;
}

/* A late head gradient (late_head): d W = d logits^T xf over all N rows at once, written over
 * the activations that held its memory until now. */
static void late_head_grad(gj_model *m, int64_t N) {
  gj_acts *a = &m->a;
  const int64_t D = m->c.n_embd, Vl = m->Vl;
  TIMED(GJ_PROF_VOCAB, gj_gemm(1, 0, Vl, D, N, 1.0f, a->dlg16 ? NULL : a->logits, a->dlg16, Vl,
                               a->xf, a->xf16, D, 0.0f, m->G.lm_w, D));
}

/* The start of a head phase: the head's bf16 copy where it lives in the work buffers. */
static void head_w16(gj_model *m) {
  if (m->w16_scratch) TIMED(GJ_PROF_VOCAB, round16(m->w16, m->w16_head, (int64_t)head_numel(m->lay)));
}

int gj_model_forward(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                     int64_t T, float zloss, double *loss_sum, int64_t *n_valid) {
  GJ_TRY(forward_body(m, ids, targets, B, T));
  head_w16(m);
  const int64_t N = B * T;
  *loss_sum = 0, *n_valid = 0, m->z_sum = 0;
  m->head_done = 0;
  if (m->training || m->recompute == GJ_FORWARD) { /* blocks of rows; the logits are not kept */
    for (int64_t r0 = 0; r0 < N; r0 += GJ_HEAD_ROWS)
      GJ_TRY(head_rows(m, m->a.logits, r0, GJ_MIN(GJ_HEAD_ROWS, N - r0), zloss, 0.0f, loss_sum, n_valid));
    return 0;
  }
  return head_rows(m, m->a.logits, 0, N, zloss, 0.0f, loss_sum, n_valid);
}

int gj_model_forward_backward(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                              int64_t T, float zloss, float scale, const gj_grad_hook *hook,
                              double *loss_sum, int64_t *n_valid) {
  if (!m->grads || m->recompute == GJ_FORWARD)
    return GJ_FAIL("internal: backward on a network whose state has no gradients, or a forward-only one");
  GJ_TRY(forward_body(m, ids, targets, B, T));
  const int64_t N = B * T;
  *loss_sum = 0, *n_valid = 0, m->z_sum = 0;
  const int64_t R = GJ_HEAD_ROWS;
  head_w16(m);
  TIMED(GJ_PROF_ELEM, slot_part(m, 0));
  /* a late head gradient in float32 keeps the d logits of every row in logits */
  const int64_t lg_rows = m->late_head && !m->a.dlg16 ? R : 0;
  for (int64_t r0 = 0; r0 < N; r0 += R)
    GJ_TRY(head_rows(m, m->a.logits + r0 / R * lg_rows * m->Vl, r0, GJ_MIN(R, N - r0), zloss,
                     scale, loss_sum, n_valid));
  m->head_done = 1;
  return gj_model_backward(m, scale, zloss, hook);
}

/* Backward of block l (gj_model_block_forward's): a->dx, the gradient of the block's output,
 * becomes that of its input, and the block's parameter gradients accumulate. With
 * recomputation its activations are recomputed first (layer_acts, no communication). */
static int block_backward(gj_model *m, int64_t l, int64_t B, int64_t T) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const int64_t N = B * T, D = c->n_embd, Dl = m->Dl, Fl = m->Fl;
  const int64_t Hl = m->Hl, Hd = gj_config_head_dim(c), NC = m->Bmax * m->Tmax;
  const gj_block_ptrs *p = &m->P.h[l];
  gj_block_ptrs *gp = &m->G.h[l];
  gj_block_bufs lb = layer_at(m, l);
  if (m->recompute) layer_acts(m, l, &lb, B, T, 0);
  else if (lb.h16) /* bf16: the ln_1 output's bf16 copy again, from the block input (one slot;
                     * forward writes no float copy) */
    TIMED(GJ_PROF_ELEM, gj_layernorm_forward(NULL, lb.h16, lb.mean, lb.rstd, lb.x, p->ln1_w, p->ln1_b,
                                             N, D, (float)c->layer_norm_epsilon));
  float *x = lb.x, *h = lb.h, *q = lb.q, *k = lb.k, *v = lb.v, *att = lb.att, *lse = lb.lse;
  float *pre = lb.pre;
  const gj_bf16 *h16 = lb.h16, *dx16, *act16 = lb.pre16 ? a->g16 : NULL;
  /* dx is the gradient of the block output; both branches receive it unchanged. */
  /* fc_out: its input gelu(pre) is recomputed into dact (into g16 from pre's bf16 copy) for
   * the weight gradient; dact then receives the input gradient. */
  /* fc_out's bias gradient and dx's bf16 copy in one pass over dx */
  TIMED(GJ_PROF_ELEM, if (act16) gj_gelu_forward16(a->g16, lb.pre16, N * Fl);
        else gj_gelu_forward(a->dact, pre, N * Fl);
        gj_bias_grad(gp->fc_out_b, a->dx16, a->dx, N, D); dx16 = a->dx16);
  TIMED(GJ_PROF_GEMM, gj_linear_backward(NULL, gp->fc_out_w, NULL, a->dx, dx16, a->dact,
                                         act16, p->fc_out_w, W16(p->fc_out_w), N, Fl, D, 0);
        gj_linear_backward_input(a->dact, a->dx, dx16, p->fc_out_w, W16(p->fc_out_w), N, Fl, D, 0));
  const gj_bf16 *g16;
  /* d pre with fc_in's bias gradient in the same pass; in bf16 only its bf16 copy, which is
   * all that fc_in's products read */
  TIMED(GJ_PROF_ELEM,
        if (act16) gj_gelu_backward16(NULL, a->g16, gp->fc_in_b, a->dact, lb.pre16, N, Fl);
        else gj_gelu_backward(a->dact, gp->fc_in_b, a->dact, pre, N, Fl);
        g16 = act16 ? act16 : round16(a->g16, a->dact, N * Fl));
  TIMED(GJ_PROF_GEMM,
        gj_linear_backward(a->dh, gp->fc_in_w, NULL, act16 ? NULL : a->dact, g16, h, h16, p->fc_in_w,
                           W16(p->fc_in_w), N, D, Fl, 0);
        /* lean: att is the float work buffer datt itself, not read: its bf16 copy is */
        gj_linear_backward(a->datt, gp->wo, NULL, a->dx, dx16, lb.att16 ? NULL : att, lb.att16,
                           p->wo, W16(p->wo), N, Dl, D, 0));
  /* bf16: head-major copies of q, k, v (kept from forward when lean, else rounded again
   * from the float ones) and of d att (rounded in the attention's first pass) */
  const gj_bf16 *qkvd16[4] = {NULL, NULL, NULL, NULL};
  if (lb.qkv16) {
    const float *qkv[3] = {q, k, v};
    for (int j = 0; j < 3; j++) {
      gj_bf16 *dst = lb.qkv16 + j * NC * Dl;
      if (!lean_qkv(m)) TIMED(GJ_PROF_ELEM, gj_attention_heads16(dst, qkv[j], B, T, Hl, Hd, Dl));
      qkvd16[j] = dst;
    }
    qkvd16[3] = lb.datt16;
  }
  /* bf16: d q, d k (inverse-rotated) and d v go straight from the attention's sums into their
   * bf16 copies, three [N, Dl] in g16 (idle since fc_in's products), which their products read;
   * float32: into dq, dk, dv, then d q and d k rotated back in place */
  const float *cs = a->rot_cos, *sn = a->rot_sin;
  const int64_t R = c->rotary_dim;
  gj_attn_grad16 d16 = {NULL, NULL, NULL, cs, sn, R};
  if (a->g16) d16.dq = a->g16, d16.dk = a->g16 + N * Dl, d16.dv = a->g16 + 2 * N * Dl;
  TIMED(GJ_PROF_ATTN, gj_attention_backward_prep(a->attn_delta, lb.datt16, a->datt, lb.att16 ? NULL : att,
                                                 lb.att16, B, T, Hl, Hd, Dl);
        gj_attention_backward(a->dq, a->dk, a->dv, a->g16 ? &d16 : NULL, a->datt, a->attn_delta, lse,
                              q, k, v, qkvd16, a->attn_scratch, B, T, Hl, Hd, Dl));
  if (!a->g16)
    TIMED(GJ_PROF_ELEM, gj_rotary_backward(a->dq, cs, sn, B, T, Hl, Hd, R, 0, Dl);
          gj_rotary_backward(a->dk, cs, sn, B, T, Hl, Hd, R, 0, Dl));
  float *dqkv[3] = {a->dq, a->dk, a->dv}, *wqkv[3] = {p->wq, p->wk, p->wv};
  float *gqkv[3] = {gp->wq, gp->wk, gp->wv};
  const gj_bf16 *dqkv16[3] = {d16.dq, d16.dk, d16.dv};
  for (int j = 0; j < 3; j++)
    TIMED(GJ_PROF_GEMM, gj_linear_backward(a->dh, gqkv[j], NULL, a->g16 ? NULL : dqkv[j],
                                           a->g16 ? dqkv16[j] : NULL, h, h16, wqkv[j], W16(wqkv[j]),
                                           N, D, Dl, 1));
  /* ONE all-reduce per layer: the ln_1-output gradient of both branches together. */
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_copy_to_region_backward(m->g, a->dh, N * D)));
  TIMED(GJ_PROF_ELEM, gj_layernorm_backward(a->dx, gp->ln1_w, gp->ln1_b, a->dh, x, lb.mean,
                                            lb.rstd, p->ln1_w, N, D));
  return 0;
}

/* part k is final: tell the hook where its gradients are */
static int part_done(gj_model *m, const gj_grad_hook *hook, int k) {
  if (!hook) return 0;
  const size_t lo = gj_layout_part_lo(m->lay, k);
  const size_t hi = k == 0 ? m->st->numel_pad : gj_layout_part_lo(m->lay, k - 1);
  return hook->ready(hook->ctx, lo, hi, m->st->gslot ? m->st->gslot : m->grads + lo);
}

int gj_model_backward(gj_model *m, float scale, float zloss, const gj_grad_hook *hook) {
  if (!m->grads || m->recompute == GJ_DECODE || m->recompute == GJ_FORWARD)
    return GJ_FAIL("internal: backward on a network whose state has no gradients, or a forward-only one");
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const int64_t B = m->B, T = m->T, N = B * T, D = c->n_embd, Vl = m->Vl;
  const int64_t NC = m->Bmax * m->Tmax;

  if (!m->head_done) {
    if (m->training)
      return GJ_FAIL("internal: a training model's backward runs through gj_model_forward_backward");
    slot_part(m, 0);
    /* d xf = dlogits W (partial over the vocab shards), from the whole stored logits */
    TIMED(GJ_PROF_VOCAB, gj_ce_backward(a->logits, NULL, m->G.lm_b, a->ce_acc, a->logits, a->ce_lse,
                                        a->targets, N, Vl, m->v0, scale, zloss);
          gj_linear_backward(a->dh, m->G.lm_w, NULL, a->logits, NULL, a->xf, NULL, m->P.lm_w,
                             W16(m->P.lm_w), N, D, Vl, 0));
  }
  m->head_done = 0;
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_copy_to_region_backward(m->g, a->dh, N * D)));
  TIMED(GJ_PROF_ELEM, memset(a->dx, 0, N * D * sizeof(float));
        gj_layernorm_backward(a->dx, m->G.lnf_w, m->G.lnf_b, a->dh, a->resid + c->n_layer * NC * D,
                              a->lnf_mean, a->lnf_rstd, m->P.lnf_w, N, D));
  if (!m->late_head) GJ_TRY(part_done(m, hook, 0));

  /* the parts in order: the head (0), block n_layer - k (k = 1 .. n_layer), the embedding */
  for (int k = 1; k <= c->n_layer; k++) {
    TIMED(GJ_PROF_ELEM, slot_part(m, k));
    GJ_TRY(block_backward(m, c->n_layer - k, B, T));
    GJ_TRY(part_done(m, hook, k));
  }
  const int emb = gj_layout_parts(m->lay) - 1;
  TIMED(GJ_PROF_ELEM, slot_part(m, emb));
  if (m->st->erows) /* the rows the tokens touch (gj_state_embedding_rows) */
    TIMED(GJ_PROF_VOCAB, GJ_TRY(gj_rowgrad_add(m->st->erows, a->dx, a->ids, N, m->v0)));
  else
    TIMED(GJ_PROF_VOCAB, gj_embedding_backward(m->G.wte, a->dx, a->ids, N, D, m->v0, Vl, NULL));
  GJ_TRY(part_done(m, hook, emb));
  if (!m->late_head) return 0;
  late_head_grad(m, N);
  return part_done(m, hook, 0);
}
