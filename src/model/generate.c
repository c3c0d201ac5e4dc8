#include "model/generate.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "model/layernorm.h"
#include "model/linear.h"

int gj_logits_argmax(gj_model *m, int64_t row, int32_t *out) {
  const float *l = m->a.logits + row * m->Vl;
  float best = -INFINITY;
  int64_t at = m->v0;
  for (int64_t j = 0; j < m->Vl; j++)
    if (l[j] > best) best = l[j], at = m->v0 + j;
  GJ_TRY(gj_tp_argmax(m->g, &best, &at));
  *out = (int32_t)at;
  return 0;
}

int gj_generate_greedy_recompute(gj_model *m, int32_t *ids, int64_t n_prompt, int64_t n_new) {
  if (n_prompt + n_new - 1 > m->Tmax)
    return GJ_FAIL("prompt plus new tokens (%lld) exceed the model's context %lld",
                   (long long)(n_prompt + n_new), (long long)m->Tmax);
  int32_t *tg = malloc((n_prompt + n_new) * sizeof(int32_t));
  if (!tg) return GJ_FAIL("out of memory");
  for (int64_t i = 0; i < n_prompt + n_new; i++) tg[i] = -1;
  int rc = 0;
  for (int64_t s = 0; s < n_new && !rc; s++) {
    int64_t T = n_prompt + s;
    double loss;
    int64_t nv;
    rc = gj_model_forward(m, ids, tg, 1, T, 0.0f, &loss, &nv);
    if (!rc) rc = gj_logits_argmax(m, T - 1, &ids[T]);
  }
  free(tg);
  return rc;
}

/* One incremental forward with the KV cache of a single sequence: tokens ids[0..n) at
 * positions pos0.. are appended; the cache is layer l's slot of the saved k and v activations
 * (rows 0..pos0+n), or, for a decode network in bf16, layer l's bfloat16 cache (a->kv16).
 * Leaves the logits of the LAST new token in row 0 of m->a.logits. */
int gj_model_forward_cached(gj_model *m, const int32_t *ids, int64_t n, int64_t pos0) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const int64_t D = c->n_embd, Dl = m->Dl, NC = m->Bmax * m->Tmax, Tk = pos0 + n;
  /* the cache is the k, v slots of every layer: a model that keeps them per layer */
  if (m->recompute == GJ_RECOMPUTE || m->recompute == GJ_FORWARD || m->training)
    return GJ_FAIL("internal: the KV cache needs a model without recomputation, not a training model");
  gj_model_sync_w16(m);
  if (Tk > m->Tmax || n > NC)
    return GJ_FAIL("sequence of %lld tokens exceeds the context %lld", (long long)Tk, (long long)m->Tmax);
  /* resid slot 0 is x, updated in place; the layer-0 slots of h/q/att/pre are scratch */
  gj_block_bufs b = {.x = a->resid, .xo = a->resid, .h = a->h, .mean = a->ln_mean,
                     .rstd = a->ln_rstd, .q = a->q, .att = a->att, .pre = a->pre};
  gj_model_embed(m, b.x, ids, n);
  GJ_TRY(gj_tp_reduce_from_region(m->g, b.x, n * D));
  for (int64_t l = 0; l < c->n_layer; l++) {
    if (a->kv16) /* the new rows in the k, v slot, the cache in bf16 (and q's copy) */
      b.k = a->k, b.v = a->v, b.kv16 = a->kv16 + l * 2 * NC * Dl, b.qkv16 = a->qkv16;
    else
      b.k = a->k + l * NC * Dl, b.v = a->v + l * NC * Dl;
    GJ_TRY(gj_model_block_forward(m, l, &b, 1, n, pos0));
  }
  const float *last = b.x + (n - 1) * D;
  gj_layernorm_forward(a->xf, NULL, a->lnf_mean, a->lnf_rstd, last, m->P.lnf_w, m->P.lnf_b, 1, D,
                       (float)c->layer_norm_epsilon);
  gj_linear_forward(a->logits, a->xf, NULL, m->P.lm_w, gj_model_w16(m, m->P.lm_w), m->P.lm_b, 1, D, m->Vl, 0);
  return 0;
}

int gj_generate_greedy(gj_model *m, int32_t *ids, int64_t n_prompt, int64_t n_new) {
  if (n_prompt + n_new > m->Tmax + 1 || n_prompt < 1)
    return GJ_FAIL("prompt plus new tokens (%lld) exceed the model's context %lld",
                   (long long)(n_prompt + n_new), (long long)m->Tmax);
  int64_t pos = 0, n = n_prompt;
  for (int64_t s = 0; s < n_new; s++) {
    GJ_TRY(gj_model_forward_cached(m, ids + pos, n, pos));
    pos += n, n = 1;
    GJ_TRY(gj_logits_argmax(m, 0, &ids[pos]));
  }
  return 0;
}
