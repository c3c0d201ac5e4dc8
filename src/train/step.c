#include "train/step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int gj_trainer_init(gj_trainer *t, gj_state *st, gj_model *m, gj_grid *g, const gj_adamw_hp *hp,
                    float zloss) {
  memset(t, 0, sizeof *t);
  t->st = st, t->m = m, t->g = g, t->hp = *hp, t->zloss = zloss;
  size_t N = (size_t)m->Bmax * m->Tmax;
  t->ids = malloc(N * sizeof(int32_t));
  t->tg = malloc(N * sizeof(int32_t));
  int rc = t->ids && t->tg ? 0 : GJ_FAIL("out of memory for a micro-batch of %zu tokens", N);
  if (!rc) rc = gj_dp_init(&t->dp, g, st->grads, st->numel_pad, 0);
  if (rc) gj_trainer_free(t);
  return rc;
}

void gj_trainer_free(gj_trainer *t) {
  gj_dp_free(&t->dp);
  free(t->ids), free(t->tg);
  t->ids = t->tg = NULL;
}

/* Forward and backward of every micro-batch, and the DP reduction; *loss_sum is the summed
 * loss of this rank's micro-batches. */
static int batch_grads(gj_trainer *t, const gj_step_in *in, double *loss_sum) {
  gj_state *st = t->st;
  gj_state_zero_grads(st);
  gj_dp_begin(&t->dp);
  /* the last micro-batch's backward starts the DP reduction; under ZeRO-1 it is one
   * reduce-scatter after backward */
  gj_grad_hook hook = {gj_dp_ready, &t->dp};
  float scale = (float)(1.0 / in->n_targets);
  *loss_sum = 0;
  for (int64_t a = 0; a < in->A; a++) {
    GJ_TRY(in->batch(in->batch_ctx, a, t->ids, t->tg));
    double ls;
    int64_t nv;
    GJ_TRY(gj_model_forward_backward(t->m, t->ids, t->tg, in->B, in->T, t->zloss, scale,
                                     a == in->A - 1 && !st->zero ? &hook : NULL, &ls, &nv));
    *loss_sum += ls;
  }
  return st->zero ? gj_dp_reduce_scatter(&t->dp, st->n) : gj_dp_finish(&t->dp);
}

/* The global mean loss and the squared gradient norm: this rank's reduced range, then over
 * the TP shards (and, under ZeRO-1, over the DP ranges). */
static int loss_and_norm(gj_trainer *t, double loss_sum, double red[2]) {
  gj_state *st = t->st;
  gj_grid *g = t->g;
  red[0] = loss_sum;
  red[1] = gj_grad_sumsq(&st->lay, st->grads, g->tp_rank, st->lo, st->n);
  if (st->zero) { /* every rank holds a distinct range: sum both over the world */
    GJ_TRY(gj_allreduce_sum_f64(g->world, red, 2));
    red[0] /= g->tp_size; /* each DP rank's loss was counted once per TP rank */
    return 0;
  }
  /* gradients are replicated over DP: the norm sums over TP only */
  GJ_TRY(gj_allreduce_sum_f64(g->dp, red, 1));
  return gj_allreduce_sum_f64(g->tp, red + 1, 1);
}

int gj_train_step(gj_trainer *t, const gj_step_in *in, gj_step_out *out) {
  gj_state *st = t->st;
  memset(out, 0, sizeof *out);
  double loss_sum;
  GJ_TRY(batch_grads(t, in, &loss_sum));
  out->dp_wait_s = t->dp.wait_s;
  double t0 = gj_now();
  if (in->inject_nan) st->grads[st->lo] = NAN;
  double red[2];
  GJ_TRY(loss_and_norm(t, loss_sum, red));
  out->loss = red[0] / in->n_targets;
  out->grad_norm = sqrt(red[1]);
  out->finite = isfinite(out->loss) && isfinite(out->grad_norm);
  if (out->finite) {
    gj_adamw_update(&st->lay, st->params, st->grads, st->m, st->v, st->lo, st->n, &t->hp, in->step,
                    in->lr, gj_clip_coef(out->grad_norm, t->hp.grad_clip));
    if (st->zero) GJ_TRY(gj_dp_allgather(&t->dp, st->params, st->n));
    gj_model_weights_changed(t->m);
  }
  out->optim_s = gj_now() - t0;
  return 0;
}
