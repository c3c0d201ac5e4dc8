#include "model/generate.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "model/attention.h"
#include "model/embedding.h"
#include "model/gelu.h"
#include "model/layernorm.h"
#include "model/linear.h"
#include "model/rotary.h"

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
 * (rows 0..pos0+n). Leaves the logits of the LAST new token in row 0 of m->a.logits. */
int gj_model_forward_cached(gj_model *m, const int32_t *ids, int64_t n, int64_t pos0) {
  const gj_config *c = &m->c;
  gj_acts *a = &m->a;
  const int64_t D = c->n_embd, Dl = m->Dl, Fl = m->Fl, Hl = m->Hl, Hd = gj_config_head_dim(c);
  const int64_t NC = m->Bmax * m->Tmax, Tk = pos0 + n;
  const float eps = (float)c->layer_norm_epsilon;
  if (m->recompute) return GJ_FAIL("internal: the KV cache needs a model without recomputation");
  gj_model_sync_w16(m);
  if (Tk > m->Tmax || n > NC)
    return GJ_FAIL("sequence of %lld tokens exceeds the context %lld", (long long)Tk, (long long)m->Tmax);
  /* Scratch: resid slot 0 as x, slot 1 as the next x; layer-0 slots of h/q/att/pre/act. */
  float *x = a->resid, *h = a->h, *q = a->q, *att = a->att, *pre = a->pre, *act = a->dact;
  gj_embedding_forward(x, ids, m->P.wte, n, D, m->v0, m->Vl);
  GJ_TRY(gj_tp_reduce_from_region(m->g, x, n * D));
  for (int64_t l = 0; l < c->n_layer; l++) {
    const gj_block_ptrs *p = &m->P.h[l];
    float *kc = a->k + l * NC * Dl, *vc = a->v + l * NC * Dl;
    gj_layernorm_forward(h, a->ln_mean, a->ln_rstd, x, p->ln1_w, p->ln1_b, n, D, eps);
    gj_linear_forward(q, h, NULL, p->wq, gj_model_w16(m, p->wq), NULL, n, D, Dl, 0);
    gj_linear_forward(kc + pos0 * Dl, h, NULL, p->wk, gj_model_w16(m, p->wk), NULL, n, D, Dl, 0);
    gj_linear_forward(vc + pos0 * Dl, h, NULL, p->wv, gj_model_w16(m, p->wv), NULL, n, D, Dl, 0);
    gj_rotary_forward(q, a->rot_cos, a->rot_sin, 1, n, Hl, Hd, c->rotary_dim, pos0, Dl);
    gj_rotary_forward(kc + pos0 * Dl, a->rot_cos, a->rot_sin, 1, n, Hl, Hd, c->rotary_dim, pos0, Dl);
    gj_attention_forward(att, NULL, q, kc, vc, NULL, a->attn_scratch, 1, n, Tk, Hl, Hd, Dl, Dl, n * Dl,
                         Dl, Tk * Dl);
    gj_linear_forward(a->y, att, NULL, p->wo, gj_model_w16(m, p->wo), NULL, n, Dl, D, 0);
    gj_linear_forward(pre, h, NULL, p->fc_in_w, gj_model_w16(m, p->fc_in_w), p->fc_in_b, n, D, Fl, 0);
    gj_gelu_forward(act, pre, n * Fl);
    gj_linear_forward(a->y, act, NULL, p->fc_out_w, gj_model_w16(m, p->fc_out_w), m->g->tp_rank == 0 ? p->fc_out_b : NULL, n, Fl, D, 1);
    GJ_TRY(gj_tp_reduce_from_region(m->g, a->y, n * D));
    for (int64_t i = 0; i < n * D; i++) x[i] += a->y[i];
  }
  const float *last = x + (n - 1) * D;
  gj_layernorm_forward(a->xf, a->lnf_mean, a->lnf_rstd, last, m->P.lnf_w, m->P.lnf_b, 1, D, eps);
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
