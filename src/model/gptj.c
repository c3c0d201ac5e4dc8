#include "model/gptj.h"

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
    double t0_ = m->profile ? gj_now() : 0;                                                  \
    stmt;                                                                                    \
    if (m->profile) m->prof[cat] += gj_now() - t0_;                                          \
  } while (0)

/* Allocate with huge pages advised and touch every page once, so the step loop never pays
 * first-touch faults (DESIGN.md §12). */
static void *arena_alloc(size_t bytes) {
  void *p = NULL;
  size_t align = (size_t)2 << 20;
  bytes = (bytes + align - 1) / align * align;
  if (posix_memalign(&p, align, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  memset(p, 0, bytes);
  return p;
}

/* Parameter and gradient blocks of np floats (padded so that ZeRO's DP ranges are equal)
 * and moment ranges of P floats. */
static void param_sizes(size_t numel, int dp, int zero, size_t *np, size_t *P) {
  *np = *P = numel;
  if (zero && dp > 1) {
    *P = (numel + dp - 1) / dp;
    *P = (*P + 15) / 16 * 16;
    *np = *P * dp;
  }
}

/* The activation arena's buffers, in order, with their sizes in floats. */
#define GJ_ACT_ITEMS 31
typedef struct { float **p; size_t n; } act_item;

static void act_list(gj_acts *a, act_item *fl, const gj_config *c, int tp, int recompute,
                     int64_t Bmax, int64_t Tmax, int nthreads) {
  int64_t L = c->n_layer, D = c->n_embd, N = Bmax * Tmax, R = c->rotary_dim;
  /* With recomputation only the residual stream is kept per layer; the rest of a layer's
   * activations live in one slot, recomputed during backward. */
  int64_t Ls = recompute ? 1 : L;
  int64_t Hl = c->n_head / tp, Dl = Hl * gj_config_head_dim(c), Fl = c->n_inner / tp;
  int64_t Vl = c->vocab_size / tp;
  act_item items[GJ_ACT_ITEMS] = {
      {&a->resid, (L + 1) * N * D}, {&a->ln_mean, Ls * N}, {&a->ln_rstd, Ls * N},
      {&a->h, Ls * N * D}, {&a->q, Ls * N * Dl}, {&a->k, Ls * N * Dl}, {&a->v, Ls * N * Dl},
      {&a->att, Ls * N * Dl}, {&a->lse, Ls * N * Hl}, {&a->pre, Ls * N * Fl},
      {&a->lnf_mean, N}, {&a->lnf_rstd, N}, {&a->xf, N * D},
      {&a->logits, N * Vl}, {&a->ce_mx, N}, {&a->ce_lse, N}, {&a->ce_stats, 2 * N},
      {&a->y, N * D}, {&a->dx, N * D}, {&a->dh, N * D}, {&a->dq, N * Dl},
      {&a->dk, N * Dl}, {&a->dv, N * Dl}, {&a->datt, N * Dl}, {&a->dact, N * Fl},
      {&a->ones, N}, {&a->attn_scratch, gj_attention_scratch_floats(nthreads, Tmax)},
      {&a->rot_cos, c->n_positions * (R / 2) + 1}, {&a->rot_sin, c->n_positions * (R / 2) + 1},
      {(float **)&a->ids, N}, {(float **)&a->targets, N},
  };
  memcpy(fl, items, sizeof items);
}

int gj_model_sizes(gj_mem_sizes *s, const gj_config *c, int tp, int dp, int zero,
                   int recompute, int64_t B, int64_t T, int nthreads) {
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, c, tp, 0));
  size_t np, P;
  param_sizes(l.numel, dp, zero, &np, &P);
  gj_layout_free(&l);
  s->params = s->grads = np * sizeof(float);
  s->moments = 2 * P * sizeof(float);
  gj_acts dummy;
  act_item fl[GJ_ACT_ITEMS];
  act_list(&dummy, fl, c, tp, recompute, B, T, nthreads);
  size_t total = 0;
  for (size_t i = 0; i < GJ_ACT_ITEMS; i++) total += (fl[i].n + 15) / 16 * 16;
  s->acts = total * sizeof(float);
  return 0;
}

int gj_model_create(gj_model *m, const gj_config *c, gj_grid *g, int64_t Bmax, int64_t Tmax,
                    int zero, int recompute) {
  memset(m, 0, sizeof *m);
  GJ_TRY(gj_config_validate(c));
  if (Tmax > c->n_positions)
    return GJ_FAIL("sequence length %lld exceeds n_positions %lld", (long long)Tmax,
                   (long long)c->n_positions);
  m->c = *c;
  m->g = g;
  m->recompute = recompute;
  GJ_TRY(gj_layout_build(&m->lay, c, g->tp_size, g->tp_rank));
  int tp = g->tp_size;
  m->Hl = c->n_head / tp;
  m->Dl = m->Hl * gj_config_head_dim(c);
  m->Fl = c->n_inner / tp;
  m->Vl = c->vocab_size / tp;
  m->v0 = m->Vl * g->tp_rank;
  m->Bmax = Bmax, m->Tmax = Tmax;
  m->nthreads = omp_get_max_threads();

  size_t np, P;
  m->zero = zero && g->dp_size > 1;
  param_sizes(m->lay.numel, g->dp_size, m->zero, &np, &P);
  m->numel_pad = np;
  m->zero_lo = m->zero ? P * g->dp_rank : 0;
  m->zero_n = P;
  m->arena_bytes = (2 * np + 2 * P) * sizeof(float);
  m->arena = arena_alloc(m->arena_bytes);
  if (!m->arena) return GJ_FAIL("out of memory: parameter arena of %zu bytes", m->arena_bytes);
  m->params = m->arena, m->grads = m->arena + np, m->m = m->arena + 2 * np, m->v = m->m + P;
  m->P.h = calloc(c->n_layer, sizeof(gj_block_ptrs));
  m->G.h = calloc(c->n_layer, sizeof(gj_block_ptrs));
  if (!m->P.h || !m->G.h) return GJ_FAIL("out of memory");
  gj_layout_ptrs(&m->lay, c, m->params, &m->P);
  gj_layout_ptrs(&m->lay, c, m->grads, &m->G);

  /* Activation arena: a size pass over the same list that assigns the pointers. */
  act_item fl[GJ_ACT_ITEMS];
  act_list(&m->a, fl, c, tp, recompute, Bmax, Tmax, m->nthreads);
  int64_t N = Bmax * Tmax, R = c->rotary_dim;
  size_t total = 0;
  for (size_t i = 0; i < GJ_ACT_ITEMS; i++) total += (fl[i].n + 15) / 16 * 16;
  m->act_bytes = total * sizeof(float);
  m->act_arena = arena_alloc(m->act_bytes);
  if (!m->act_arena) return GJ_FAIL("out of memory: activation arena of %zu bytes", m->act_bytes);
  size_t off = 0;
  for (size_t i = 0; i < GJ_ACT_ITEMS; i++) {
    *fl[i].p = m->act_arena + off;
    off += (fl[i].n + 15) / 16 * 16;
  }
  for (int64_t i = 0; i < N; i++) m->a.ones[i] = 1.0f;
  gj_rotary_table(m->a.rot_cos, m->a.rot_sin, c->n_positions, R);
  return 0;
}

void gj_model_free(gj_model *m) {
  free(m->arena);
  free(m->act_arena);
  free(m->P.h);
  free(m->G.h);
  gj_layout_free(&m->lay);
  memset(m, 0, sizeof *m);
}

void gj_model_zero_grads(gj_model *m) { memset(m->grads, 0, m->numel_pad * sizeof(float)); }

/* A layer's activation buffers: the residual input x of layer l, and the slot that holds its
 * other activations (slot l, or slot 0 with recomputation). */
typedef struct {
  float *x, *h, *q, *k, *v, *att, *lse, *pre, *mean, *rstd;
} layer_bufs;

static layer_bufs layer_at(gj_model *m, int64_t l) {
  gj_acts *a = &m->a;
  const int64_t NC = m->Bmax * m->Tmax, D = m->c.n_embd, s = m->recompute ? 0 : l;
  layer_bufs b = {a->resid + l * NC * D, a->h + s * NC * D, a->q + s * NC * m->Dl,
                  a->k + s * NC * m->Dl, a->v + s * NC * m->Dl, a->att + s * NC * m->Dl,
                  a->lse + s * NC * m->Hl, a->pre + s * NC * m->Fl,
                  a->ln_mean + s * NC, a->ln_rstd + s * NC};
  return b;
}

/* Layer l up to the inputs of its two output projections: ln_1, q/k/v with rotary, attention
 * and fc_in (gelu of it is recomputed where needed, into the dact work buffer, so that it is
 * never stored per layer). No communication: it can be recomputed in backward. */
static void layer_acts(gj_model *m, int64_t l, const layer_bufs *b, int64_t B, int64_t T) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const gj_block_ptrs *p = &m->P.h[l];
  const int64_t N = B * T, D = c->n_embd, Dl = m->Dl, Fl = m->Fl, Hl = m->Hl;
  const int64_t Hd = gj_config_head_dim(c);
  TIMED(GJ_PROF_ELEM, gj_layernorm_forward(b->h, b->mean, b->rstd, b->x, p->ln1_w, p->ln1_b, N, D,
                                           (float)c->layer_norm_epsilon));
  TIMED(GJ_PROF_GEMM, gj_linear_forward(b->q, b->h, p->wq, NULL, N, D, Dl, 0);
        gj_linear_forward(b->k, b->h, p->wk, NULL, N, D, Dl, 0);
        gj_linear_forward(b->v, b->h, p->wv, NULL, N, D, Dl, 0));
  TIMED(GJ_PROF_ELEM,
        gj_rotary_forward(b->q, a->rot_cos, a->rot_sin, B, T, Hl, Hd, c->rotary_dim, 0, Dl);
        gj_rotary_forward(b->k, a->rot_cos, a->rot_sin, B, T, Hl, Hd, c->rotary_dim, 0, Dl));
  TIMED(GJ_PROF_ATTN, gj_attention_forward(b->att, b->lse, b->q, b->k, b->v, a->attn_scratch, B,
                                           T, T, Hl, Hd, Dl, Dl, T * Dl, Dl, T * Dl));
  TIMED(GJ_PROF_GEMM, gj_linear_forward(b->pre, b->h, p->fc_in_w, p->fc_in_b, N, D, Fl, 0));
}

int gj_model_forward(gj_model *m, const int32_t *ids, const int32_t *targets, int64_t B,
                     int64_t T, float zloss, double *loss_sum, int64_t *n_valid) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  if (B > m->Bmax || T > m->Tmax)
    return GJ_FAIL("internal: batch [%lld, %lld] exceeds the arena's [%lld, %lld]", (long long)B,
                   (long long)T, (long long)m->Bmax, (long long)m->Tmax);
  m->B = B, m->T = T;
  const int64_t N = B * T, D = c->n_embd, Dl = m->Dl, Fl = m->Fl, Vl = m->Vl;
  const int64_t NC = m->Bmax * m->Tmax;
  const float eps = (float)c->layer_norm_epsilon;
  memcpy(a->ids, ids, N * sizeof(int32_t));
  memcpy(a->targets, targets, N * sizeof(int32_t));

  TIMED(GJ_PROF_VOCAB, gj_embedding_forward(a->resid, ids, m->P.wte, N, D, m->v0, Vl));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, a->resid, N * D)));

  for (int64_t l = 0; l < c->n_layer; l++) {
    const gj_block_ptrs *p = &m->P.h[l];
    layer_bufs lb = layer_at(m, l);
    float *x = lb.x, *xo = a->resid + (l + 1) * NC * D;
    layer_acts(m, l, &lb, B, T);
    TIMED(GJ_PROF_ELEM, gj_gelu_forward(a->dact, lb.pre, N * Fl));
    /* Parallel residual: attention and MLP partial outputs summed, then ONE all-reduce. */
    TIMED(GJ_PROF_GEMM, gj_linear_forward(a->y, lb.att, p->wo, NULL, N, Dl, D, 0);
          gj_linear_forward(a->y, a->dact, p->fc_out_w, m->g->tp_rank == 0 ? p->fc_out_b : NULL,
                            N, Fl, D, 1));
    TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, a->y, N * D)));
    double t0 = m->profile ? gj_now() : 0;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < N * D; i++) xo[i] = x[i] + a->y[i];
    if (m->profile) m->prof[GJ_PROF_ELEM] += gj_now() - t0;
  }

  float *xL = a->resid + c->n_layer * NC * D;
  TIMED(GJ_PROF_ELEM, gj_layernorm_forward(a->xf, a->lnf_mean, a->lnf_rstd, xL, m->P.lnf_w,
                                           m->P.lnf_b, N, D, eps));
  TIMED(GJ_PROF_VOCAB, gj_linear_forward(a->logits, a->xf, m->P.lm_w, m->P.lm_b, N, D, Vl, 0);
        gj_ce_rowmax(a->ce_mx, a->logits, N, Vl));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_max(m->g, a->ce_mx, N)));
  TIMED(GJ_PROF_VOCAB, gj_ce_stats(a->ce_stats, a->logits, a->ce_mx, targets, N, Vl, m->v0));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, a->ce_stats, 2 * N)));
  *loss_sum = gj_ce_loss(a->ce_lse, a->ce_mx, a->ce_stats, targets, N, zloss, n_valid);
  return 0;
}

int gj_model_backward(gj_model *m, float scale, float zloss) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const int64_t B = m->B, T = m->T, N = B * T, D = c->n_embd, Dl = m->Dl, Fl = m->Fl;
  const int64_t Vl = m->Vl, Hl = m->Hl, Hd = gj_config_head_dim(c), NC = m->Bmax * m->Tmax;

  /* d xf = dlogits W (partial over the vocab shards). */
  TIMED(GJ_PROF_VOCAB, gj_ce_backward(a->logits, a->ce_lse, a->targets, N, Vl, m->v0, scale, zloss);
        gj_linear_backward(a->dh, m->G.lm_w, m->G.lm_b, a->logits, a->xf, m->P.lm_w, a->ones, N,
                           D, Vl, 0));
  TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, a->dh, N * D)));
  TIMED(GJ_PROF_ELEM, memset(a->dx, 0, N * D * sizeof(float));
        gj_layernorm_backward(a->dx, m->G.lnf_w, m->G.lnf_b, a->dh, a->resid + c->n_layer * NC * D,
                              a->lnf_mean, a->lnf_rstd, m->P.lnf_w, N, D));
  if (m->grad_ready) GJ_TRY(m->grad_ready(m->grad_ready_ctx, m->lay.t[1 + 10 * c->n_layer].offset));

  for (int64_t l = c->n_layer - 1; l >= 0; l--) {
    const gj_block_ptrs *p = &m->P.h[l];
    gj_block_ptrs *gp = &m->G.h[l];
    layer_bufs lb = layer_at(m, l);
    if (m->recompute) layer_acts(m, l, &lb, B, T);
    float *x = lb.x, *h = lb.h, *q = lb.q, *k = lb.k, *v = lb.v, *att = lb.att, *lse = lb.lse;
    float *pre = lb.pre;
    /* dx is the gradient of the block output; both branches receive it unchanged. */
    /* fc_out: its input gelu(pre) is recomputed into dact for the weight gradient, which
     * then receives the input gradient. */
    TIMED(GJ_PROF_ELEM, gj_gelu_forward(a->dact, pre, N * Fl));
    TIMED(GJ_PROF_GEMM, gj_linear_backward(NULL, gp->fc_out_w, gp->fc_out_b, a->dx, a->dact,
                                           p->fc_out_w, a->ones, N, Fl, D, 0);
          gj_linear_backward_input(a->dact, a->dx, p->fc_out_w, N, Fl, D, 0));
    TIMED(GJ_PROF_ELEM, gj_gelu_backward(a->dact, a->dact, pre, N * Fl));
    TIMED(GJ_PROF_GEMM,
          gj_linear_backward(a->dh, gp->fc_in_w, gp->fc_in_b, a->dact, h, p->fc_in_w, a->ones, N,
                             D, Fl, 0);
          gj_linear_backward(a->datt, gp->wo, NULL, a->dx, att, p->wo, a->ones, N, Dl, D, 0));
    TIMED(GJ_PROF_ATTN, gj_attention_backward(a->dq, a->dk, a->dv, a->datt, att, lse, q, k, v,
                                              a->attn_scratch, B, T, Hl, Hd, Dl));
    TIMED(GJ_PROF_ELEM,
          gj_rotary_backward(a->dq, a->rot_cos, a->rot_sin, B, T, Hl, Hd, c->rotary_dim, 0, Dl);
          gj_rotary_backward(a->dk, a->rot_cos, a->rot_sin, B, T, Hl, Hd, c->rotary_dim, 0, Dl));
    TIMED(GJ_PROF_GEMM, gj_linear_backward(a->dh, gp->wq, NULL, a->dq, h, p->wq, a->ones, N, D, Dl, 1);
          gj_linear_backward(a->dh, gp->wk, NULL, a->dk, h, p->wk, a->ones, N, D, Dl, 1);
          gj_linear_backward(a->dh, gp->wv, NULL, a->dv, h, p->wv, a->ones, N, D, Dl, 1));
    /* ONE all-reduce per layer: the ln_1-output gradient of both branches together. */
    TIMED(GJ_PROF_COMM, GJ_TRY(gj_tp_allreduce_sum(m->g, a->dh, N * D)));
    TIMED(GJ_PROF_ELEM, gj_layernorm_backward(a->dx, gp->ln1_w, gp->ln1_b, a->dh, x, lb.mean,
                                              lb.rstd, p->ln1_w, N, D));
    if (m->grad_ready) GJ_TRY(m->grad_ready(m->grad_ready_ctx, m->lay.t[1 + 10 * l].offset));
  }
  TIMED(GJ_PROF_VOCAB, gj_embedding_backward(m->G.wte, a->dx, a->ids, N, D, m->v0, Vl));
  if (m->grad_ready) GJ_TRY(m->grad_ready(m->grad_ready_ctx, 0));
  return 0;
}
