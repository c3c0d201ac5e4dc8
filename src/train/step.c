#include "train/step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int gj_trainer_init(gj_trainer *t, gj_state *st, gj_model *m, gj_grid *g, const gj_adamw_hp *hp,
                    float zloss, int grad_bf16, int dp_poll_us) {
  memset(t, 0, sizeof *t);
  t->st = st, t->m = m, t->g = g, t->hp = *hp, t->zloss = zloss;
  t->oib = st->oib;
  if (t->oib && (hp->grad_clip > 0 || st->zero))
    return GJ_FAIL("internal: the optimizer in backward with gradient clipping or ZeRO-1");
  size_t N = (size_t)m->Bmax * m->Tmax;
  t->ids = malloc(N * sizeof(int32_t));
  t->tg = malloc(N * sizeof(int32_t));
  int rc = t->ids && t->tg ? 0 : GJ_FAIL("out of memory for a micro-batch of %zu tokens", N);
  if (!rc) rc = gj_dp_init(&t->dp, g, st->grads, st->numel_pad, st->erows, st->lay.t[0].numel, 0,
                            grad_bf16);
  /* bf16 training: ZeRO-1's all-gather sends the GEMM weights in bf16, which is all the
   * products read of them (the same bits as after a float32 all-gather) */
  if (!rc && st->zero && gj_gemm_precision() == GJ_PREC_BF16) rc = gj_dp_gather16(&t->dp, &st->lay);
  /* the optimizer in backward sums each part at once (gj_dp_sum): nothing in flight to test */
  if (!rc) rc = gj_dp_progress(&t->dp, t->oib ? 0 : dp_poll_us, &t->dp_polled);
  if (rc) gj_trainer_free(t);
  return rc;
}

int gj_trainer_reduce_to_owners(gj_trainer *t) {
  return t->st->zero ? gj_dp_reduce_to_owners(&t->dp, t->st->n) : 0;
}

void gj_trainer_free(gj_trainer *t) {
  gj_dp_free(&t->dp);
  free(t->ids), free(t->tg);
  t->ids = t->tg = NULL;
}

void gj_trainer_dp_words(const gj_trainer *t, int grad_bf16, int dp_poll_us, char *buf, size_t n) {
  if (t->g->dp_size == 1) {
    snprintf(buf, n, "%s", "");
    return;
  }
  char poll[160];
  if (t->dp_polled) snprintf(poll, sizeof poll, "; DP sums tested by a thread, %d us between tests (--dp-poll-us)", dp_poll_us);
  else if (dp_poll_us == 0) snprintf(poll, sizeof poll, "; no DP progress thread (--dp-poll-us 0)");
  else if (t->oib) snprintf(poll, sizeof poll, "; no DP progress thread (the optimizer in backward sums each part at once)");
  else snprintf(poll, sizeof poll, "; no DP progress thread: the MPI library gives no MPI_THREAD_MULTIPLE");
  snprintf(buf, n, "%s%s%s%s", grad_bf16 ? "; gradients summed over DP in bf16 (--grad-reduce)" : "",
           t->dp.owner_P ? "; ZeRO-1's gradient sums reduced to each range's owner (--zero-reduce owner)" : "",
           t->dp.g16n ? "; ZeRO-1 gathers the GEMM weights in bf16 (all the products read)" : "", poll);
}

int gj_grad_reduce_parse(const char *s, int *bf16) {
  if (!strcmp(s, "fp32")) *bf16 = 0;
  else if (!strcmp(s, "bf16")) *bf16 = 1;
  else return GJ_FAIL("--grad-reduce %s: expected fp32 or bf16", s);
  return 0;
}

int gj_zero_reduce_parse(const char *s, int64_t zero, int *owner) {
  if (!strcmp(s, "allreduce")) *owner = 0;
  else if (!strcmp(s, "owner")) *owner = 1;
  else return GJ_FAIL("--zero-reduce %s: expected allreduce or owner", s);
  if (*owner && !zero)
    return GJ_FAIL("--zero-reduce owner needs --zero 1: without ZeRO-1 every rank updates all the "
                   "parameters, so every rank needs every gradient sum");
  return 0;
}

int gj_oib_check(int64_t oib, double clip, int64_t zero) {
  if (!oib) return 0;
  if (clip > 0)
    return GJ_FAIL("--optimizer-in-backward 1 needs --clip 0: the global gradient norm a clip "
                   "scales by is known only after the last part of the network is updated");
  if (zero)
    return GJ_FAIL("--optimizer-in-backward 1 and --zero 1 exclude each other: ZeRO-1 updates "
                   "each rank's share once the gradients of the whole network are summed");
  return 0;
}

/* The optimizer in backward: the last micro-batch's backward reports its gradients final from
 * the top of the flat block down (the vocabulary head, each layer, the embedding); each range
 * is reduced over DP, counted in the norm and applied before backward goes on (over a gradient
 * slot, the next part's gradients then take its place). */
typedef struct {
  gj_trainer *t;
  const gj_step_in *in;
  size_t hi;      /* [hi, numel_pad) is done */
  double sumsq;   /* this rank's part of the squared norm (TP shards not yet summed) */
  int bad;        /* a range was not finite, or held an element of GJ_GRAD_MAX or more (huge): it
                   * and every range below it are not applied */
  int huge;
  int applied;    /* some range was applied */
  double dp_s, opt_s;
} oib_run;

static int oib_ready(void *ctx, size_t lo, size_t hi, float *gr) {
  oib_run *r = ctx;
  gj_trainer *t = r->t;
  gj_state *st = t->st;
  gj_grid *g = t->g;
  if (hi != r->hi) /* a gradient slot's network has no late head gradient */
    return GJ_FAIL("internal: backward reported [%zu, %zu) after %zu", lo, hi, r->hi);
  if (lo >= hi) return 0;
  double t0 = gj_now();
  if (g->dp_size > 1)
    GJ_TRY(gj_dp_sum(&t->dp, gr, lo, hi - lo));
  double t1 = gj_now();
  if (r->in->inject_nan && lo == gj_layout_part_lo(&st->lay, r->in->inject_nan - 1)) gr[0] = NAN;
  double s = gj_grad_sumsq(&st->lay, gr, NULL, g->tp_rank, lo, hi - lo);
  r->sumsq += s;
  /* the TP shards of a range agree on applying it (DP ranks hold the same gradients) */
  int bad[2] = {r->bad || !isfinite(s), r->huge || gj_grad_huge(&st->lay, gr, NULL, lo, hi - lo, s)};
  if (g->tp_size > 1) GJ_TRY(gj_allreduce_max_int(g->tp, bad, 2));
  r->huge = bad[1], r->bad = bad[0] || bad[1];
  if (!r->bad) {
    gj_adamw_update(&st->lay, st->params, gr, NULL, st->m + lo, st->v + lo, lo, hi - lo, &t->hp,
                    r->in->t, r->in->lr, 1.0);
    r->applied = 1;
  }
  r->hi = lo;
  r->dp_s += t1 - t0, r->opt_s += gj_now() - t1;
  return 0;
}

/* Forward and backward of every micro-batch, and the DP reduction (the optimizer in backward:
 * the reduction and the update, through oib); *loss_sum is the summed objective of this rank's
 * micro-batches, *z_sum its z-loss part. */
static int batch_grads(gj_trainer *t, const gj_step_in *in, oib_run *oib, double *loss_sum, double *z_sum) {
  gj_state *st = t->st;
  if ((st->gslot || t->m->late_head) && in->A != 1)
    return GJ_FAIL("internal: a gradient slot or a late head gradient holds one micro-batch's "
                   "gradients, not %lld", (long long)in->A);
  gj_state_zero_grads(st);
  gj_dp_begin(&t->dp);
  /* the last micro-batch's backward starts the DP reduction (ZeRO-1's too; its all-gather of
   * the updated weights follows AdamW: gj_dp_allgather) */
  gj_grad_hook hook = {gj_dp_ready, &t->dp};
  if (t->oib) hook = (gj_grad_hook){oib_ready, oib};
  float scale = (float)(1.0 / in->n_targets);
  *loss_sum = 0, *z_sum = 0;
  for (int64_t a = 0; a < in->A; a++) {
    GJ_TRY(in->batch(in->batch_ctx, a, t->ids, t->tg));
    double ls;
    int64_t nv;
    GJ_TRY(gj_model_forward_backward(t->m, t->ids, t->tg, in->B, in->T, t->zloss, scale,
                                     a == in->A - 1 ? &hook : NULL, &ls, &nv));
    *loss_sum += ls, *z_sum += t->m->z_sum;
  }
  if (t->oib) return oib->hi == 0 ? 0 : GJ_FAIL("internal: backward left gradients unreported");
  return gj_dp_finish(&t->dp);
}

/* The global summed objective and its z-loss part, the squared gradient norm and (without
 * clipping; with it every element is bounded by the clip) the count of ranks with a huge
 * element (gj_grad_huge): this rank's reduced range, then over the TP shards (and, under
 * ZeRO-1, over the DP ranges). */
static int loss_and_norm(gj_trainer *t, double loss_sum, double z_sum, const oib_run *oib, double red[4]) {
  gj_state *st = t->st;
  gj_grid *g = t->g;
  red[0] = loss_sum, red[1] = z_sum;
  red[2] = t->oib ? oib->sumsq
                  : gj_grad_sumsq(&st->lay, st->grads + st->lo, st->erows, g->tp_rank, st->lo, st->n);
  red[3] = !t->oib && t->hp.grad_clip <= 0 && gj_grad_huge(&st->lay, st->grads + st->lo, st->erows, st->lo, st->n, red[2]);
  if (st->zero) { /* every rank holds a distinct range: sum all over the world */
    GJ_TRY(gj_allreduce_sum_f64(g->world, red, 4));
    red[0] /= g->tp_size, red[1] /= g->tp_size; /* each DP rank's loss was counted once per TP rank */
    return 0;
  }
  /* gradients are replicated over DP: the norm and the count sum over TP only */
  GJ_TRY(gj_allreduce_sum_f64(g->dp, red, 2));
  return gj_allreduce_sum_f64(g->tp, red + 2, 2);
}

int gj_train_step(gj_trainer *t, const gj_step_in *in, gj_step_out *out) {
  gj_state *st = t->st;
  memset(out, 0, sizeof *out);
  double loss_sum = 0, z_sum = 0;
  oib_run oib = {t, in, st->numel_pad, 0, 0, 0, 0, 0, 0};
  GJ_TRY(batch_grads(t, in, &oib, &loss_sum, &z_sum));
  out->dp_wait_s = t->oib ? oib.dp_s : t->dp.wait_s;
  double t0 = gj_now();
  if (in->inject_nan && !t->oib) { /* where this rank holds the reduced gradients (ZeRO-1: its share) */
    size_t at = gj_layout_part_lo(&st->lay, in->inject_nan - 1);
    gj_rowgrad *r = st->erows;
    if (r && at < st->lay.t[0].numel) { /* the embedding's: in its first row held, if any */
      if (r->n && (size_t)r->row[0] * r->D >= st->lo && (size_t)r->row[0] * r->D < st->lo + st->n)
        r->g[0] = NAN;
    } else if (at >= st->lo && at < st->lo + st->n) {
      st->grads[at] = NAN;
    }
  }
  double red[4];
  GJ_TRY(loss_and_norm(t, loss_sum, z_sum, &oib, red));
  out->loss = (red[0] - red[1]) / in->n_targets; /* the cross-entropy, as validation's */
  out->z_loss = red[1] / in->n_targets;
  out->grad_norm = sqrt(red[2]);
  out->huge = t->oib ? oib.huge : red[3] > 0;
  out->finite = isfinite(red[0]) && isfinite(out->loss) && isfinite(out->grad_norm) && !out->huge;
  if (t->oib) {
    out->optim_s = oib.opt_s + gj_now() - t0;
    if (!oib.applied) return 0; /* not finite from the first range on: skipped whole */
    gj_model_weights_changed(t->m);
    if (!out->finite)
      return GJ_FAIL("step %lld: %s after part of the update was applied (--optimizer-in-backward "
                     "cannot skip a step): the parameters in memory are damaged; resume from the "
                     "last checkpoint without --optimizer-in-backward, which skips such a step",
                     (long long)in->step, out->huge ? "a gradient element of 1e19 or more" : "a non-finite loss or gradient");
    return 0;
  }
  if (out->finite) {
    gj_adamw_update(&st->lay, st->params, st->grads + st->lo, st->erows, st->m, st->v, st->lo, st->n, &t->hp, in->t,
                    in->lr, gj_clip_coef(out->grad_norm, t->hp.grad_clip));
    if (st->zero) GJ_TRY(gj_dp_allgather(&t->dp, st->params, st->n));
    if (t->dp.g16n) st->params16 = 1; /* from now on, whatever trainer runs on the state next */
    gj_model_weights_changed(t->m);
  }
  out->optim_s = gj_now() - t0;
  return 0;
}
