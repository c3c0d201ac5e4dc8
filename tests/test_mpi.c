/* MPI tests, run as the MPI program itself (tests/mpi-wrapper.sh starts it under mpirun with
 * the rank count in its name). Rank 0 reports; failures are agreed across ranks.
 * - Tensor parallelism does ONE all-reduce per layer in forward and ONE in backward.
 * - gj_evaluate equals an independent per-token loop, in both window modes, and does not
 *   depend on DP x TP.
 * - The training path (vocabulary head in blocks, fused with its backward) equals the
 *   whole-logits forward + backward, in loss and every gradient, at TP 1 and TP = ranks.
 * - The training step (src/train/step.c) gives the same losses over TP, DP and ZeRO-1, and
 *   every rank skips a step whose huge gradient element is on one TP shard alone.
 * - The collectives of src/parallel/ (broadcast, reductions, agreement, node size, ordered
 *   gather, vocab all-gather, TP argmax) against what they must compute. */
#include <check.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include "train/evaluate.h"
#include "model/generate.h"
#include "model/gptj.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "train/step.h"
#include "testutil.h"

static int world_rank, world_size;

/* A state and a network over it. */
static int model_new(gj_state *st, gj_model *m, const gj_config *c, gj_grid *g, int64_t B, int64_t T,
                     int zero, int recompute, int training) {
  int rc = gj_state_create(st, c, g, zero);
  return rc ? rc : gj_model_create(m, st, g, B, T, recompute, training);
}

static void model_del(gj_state *st, gj_model *m) {
  gj_model_free(m);
  gj_state_free(st);
}

static void tiny(gj_config *c, int layers) {
  gj_config_preset(c, "tiny");
  c->vocab_size = 96, c->n_layer = layers, c->n_positions = 64;
}

START_TEST(test_allreduce_count) {
  long fwd[2], bwd[2];
  for (int k = 0; k < 2; k++) {
    gj_config c;
    tiny(&c, 2 + k);
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, world_size), 0);
    gj_state st;
    gj_model m;
    ck_assert_int_eq(model_new(&st, &m, &c, &g, 2, 16, 0, 0, 0), 0);
    gj_params_init(m.lay, &c, m.params, 3);
    int32_t ids[32], tg[32];
    for (int i = 0; i < 32; i++) ids[i] = (i * 7) % 96, tg[i] = (i * 5 + 1) % 96;
    double ls;
    int64_t nv;
    g.n_tp_allreduce = 0;
    ck_assert_int_eq(gj_model_forward(&m, ids, tg, 2, 16, 0.0f, &ls, &nv), 0);
    fwd[k] = g.n_tp_allreduce;
    g.n_tp_allreduce = 0;
    gj_state_zero_grads(&st);
    ck_assert_int_eq(gj_model_backward(&m, 1.0f / 32, 0.0f, NULL), 0);
    bwd[k] = g.n_tp_allreduce;
    model_del(&st, &m);
    gj_grid_free(&g);
  }
  /* one more layer costs exactly one all-reduce each way; the rest is the embedding and the
   * cross-entropy (forward) and the lm_head input gradient (backward) */
  ck_assert_int_eq(fwd[1] - fwd[0], 1);
  ck_assert_int_eq(bwd[1] - bwd[0], 1);
  ck_assert_int_eq(fwd[0], 2 + 2);
  ck_assert_int_eq(bwd[0], 2 + 1);
}
END_TEST

/* NLL of target index t with context x[b..t-1], from gathered logits, in double. */
static double token_nll(gj_model *m, gj_grid *g, const int32_t *x, int64_t b, int64_t t) {
  int32_t tg[64];
  for (int i = 0; i < 64; i++) tg[i] = -1;
  double ls;
  int64_t nv;
  ck_assert_int_eq(gj_model_forward(m, x + b, tg, 1, t - b, 0.0f, &ls, &nv), 0);
  int64_t V = m->c.vocab_size;
  float *full = malloc(V * sizeof(float));
  ck_assert_int_eq(gj_tp_allgather_vocab(g, full, m->a.logits + (t - b - 1) * m->Vl, V), 0);
  double mx = -INFINITY, s = 0;
  for (int64_t j = 0; j < V; j++) mx = full[j] > mx ? full[j] : mx;
  for (int64_t j = 0; j < V; j++) s += exp(full[j] - mx);
  double nll = mx + log(s) - full[x[t]];
  free(full);
  return nll;
}

START_TEST(test_eval_matches_loop) {
  const int64_t n = 157, T = 24;
  gj_config c;
  tiny(&c, 2);
  gj_dataset ds;
  uint16_t *tokens = malloc(n * sizeof(uint16_t));
  int32_t *x = malloc(n * sizeof(int32_t));
  for (int64_t i = 0; i < n; i++) tokens[i] = (uint16_t)((i * 31 + i / 7) % 96), x[i] = tokens[i];
  gj_dataset_wrap(&ds, tokens, (uint64_t)n, c.vocab_size, "synthetic");
  int64_t strides[2] = {T, 10};
  double results[2][2];
  for (int lay = 0; lay < 2; lay++) { /* (DP, TP) = (size, 1), then (1, size) */
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, lay == 0 ? 1 : world_size), 0);
    gj_state st;
    gj_model m;
    ck_assert_int_eq(model_new(&st, &m, &c, &g, 3, T, 0, 0, 0), 0);
    gj_params_init(m.lay, &c, m.params, 11);
    for (int si = 0; si < 2; si++) {
      int64_t S = strides[si], cnt;
      double nll;
      ck_assert_int_eq(gj_evaluate(&m, &ds, T, S, 3, 0, &nll, &cnt), 0);
      ck_assert_int_eq(cnt, n - 1);
      /* the independent loop: target t's context starts at the window that scores it */
      double ref = 0;
      for (int64_t t = 1; t < n; t++) {
        int64_t b = t <= T ? 0 : ((t - T + S - 1) / S) * S;
        ref += token_nll(&m, &g, x, b, t);
      }
      ck_assert_msg(fabs(nll - ref) / ref <= 1e-5, "stride %lld: %.10g vs loop %.10g", (long long)S, nll, ref);
      results[lay][si] = nll;
    }
    model_del(&st, &m);
    gj_grid_free(&g);
  }
  for (int si = 0; si < 2; si++)
    ck_assert_double_le(fabs(results[0][si] - results[1][si]) / results[0][si], 1e-5);
  /* overlapping windows give more context, so a lower or equal loss is not guaranteed on a
   * random model; but they must differ from the non-overlapping ones */
  ck_assert(results[0][0] != results[0][1]);
  free(tokens), free(x);
}
END_TEST

/* More rows than one head block (and a partial last block), with z-loss and ignored targets. */
START_TEST(test_blocked_head) {
  gj_config c;
  tiny(&c, 2);
  c.vocab_size = 96 * 8;
  const int64_t B = 5, T = 61, N = B * T; /* 305 rows: a block of 256 and one of 49 */
  int32_t *ids = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t));
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 5) % c.vocab_size), tg[i] = i % 17 == 3 ? -1 : (int32_t)((i * 11 + 2) % c.vocab_size);
  for (int tpi = 0; tpi < 2; tpi++) {
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tpi ? world_size : 1), 0);
    gj_state sref, strn;
    gj_model ref, trn;
    ck_assert_int_eq(model_new(&sref, &ref, &c, &g, B, T, 0, 0, 0), 0);
    ck_assert_int_eq(model_new(&strn, &trn, &c, &g, B, T, 0, 0, 1), 0);
    ck_assert_uint_lt(trn.act_bytes, ref.act_bytes);
    gj_params_init(ref.lay, &c, ref.params, 5);
    gj_params_init(trn.lay, &c, trn.params, 5);
    double l1, l2, l3;
    int64_t n1, n2, n3;
    const float scale = 1.0f / 300, zl = 1e-3f;
    gj_state_zero_grads(&sref), gj_state_zero_grads(&strn);
    ck_assert_int_eq(gj_model_forward(&ref, ids, tg, B, T, zl, &l1, &n1), 0);
    ck_assert_int_eq(gj_model_backward(&ref, scale, zl, NULL), 0);
    ck_assert_int_eq(gj_model_forward_backward(&trn, ids, tg, B, T, zl, scale, NULL, &l2, &n2), 0);
    ck_assert_int_eq(n1, n2);
    ck_assert_double_le(fabs(l1 - l2) / l1, 1e-6);
    /* the loss alone (validation during training) from a training model */
    ck_assert_int_eq(gj_model_forward(&trn, ids, tg, B, T, zl, &l3, &n3), 0);
    ck_assert_int_eq(n1, n3);
    ck_assert_double_le(fabs(l1 - l3) / l1, 1e-6);
    /* a training model refuses the separate backward (it kept no logits) */
    ck_assert_int_ne(gj_model_backward(&trn, scale, zl, NULL), 0);
    /* eval's forward-only network (the residual stream in place, the head in blocks) over the
     * weights alone: the same loss; it refuses backward and the KV cache */
    {
      gj_state sf;
      gj_model fw;
      double l4;
      int64_t n4;
      ck_assert_int_eq(gj_state_create_weights(&sf, &c, &g), 0);
      ck_assert_int_eq(gj_model_create(&fw, &sf, &g, B, T, GJ_FORWARD, 0), 0);
      gj_params_init(fw.lay, &c, fw.params, 5);
      ck_assert_int_eq(gj_model_forward(&fw, ids, tg, B, T, zl, &l4, &n4), 0);
      ck_assert_int_eq(n1, n4);
      ck_assert_double_le(fabs(l1 - l4) / l1, 1e-6);
      ck_assert_uint_lt(fw.act_bytes, trn.act_bytes);
      ck_assert_int_ne(gj_model_backward(&fw, scale, zl, NULL), 0);
      ck_assert_int_ne(gj_model_forward_cached(&fw, ids, 4, 0), 0);
      model_del(&sf, &fw);
    }
    for (int t = 0; t < ref.lay->n; t++) {
      const gj_tensor *ts = &ref.lay->t[t];
      double num = 0, den = 0;
      for (size_t i = 0; i < ts->numel; i++) {
        double a = ref.grads[ts->offset + i], b = trn.grads[ts->offset + i];
        num += (a - b) * (a - b), den += a * a;
      }
      ck_assert_msg(sqrt(num) <= 1e-5 * sqrt(den) + 1e-12, "tp %d: %s gradient differs: %g of %g",
                    g.tp_size, ts->name, sqrt(num), sqrt(den));
    }
    model_del(&sref, &ref), model_del(&strn, &trn);
    gj_grid_free(&g);
  }
  free(ids), free(tg);
}
END_TEST

/* The training step as a library: a global batch of 4 sequences stepped 3 times gives the
 * same losses and gradient norms on one replica with TP = ranks and 2 micro-batches of 2, on
 * DP = ranks with one micro-batch each, and with ZeRO-1 (the order of the sums differs:
 * float tolerances). */
typedef struct {
  int64_t A, B, T;
  int dp_rank;
  int vocab; /* the ids' range */
} step_batch;

static int step_fill(void *ctx, int64_t a, int32_t *ids, int32_t *tg) {
  const step_batch *sb = ctx;
  const int64_t V = sb->vocab;
  for (int64_t b = 0; b < sb->B; b++) {
    int64_t seq = (sb->dp_rank * sb->A + a) * sb->B + b; /* the loader's order */
    for (int64_t t = 0; t < sb->T; t++) {
      ids[b * sb->T + t] = (int32_t)((seq * 131 + t * 17 + 3) % V);
      tg[b * sb->T + t] = (int32_t)((seq * 131 + (t + 1) * 17 + 3) % V);
    }
  }
  return 0;
}

/* 3 training steps of a 2-layer tiny model of `vocab` tokens (ids over all of it) on TP tp, the
 * rest DP, A micro-batches of B; rows: the embedding's gradient as rows; clip: > 0 replaces
 * the default clip. ln: each step's loss and gradient norm; *params (or NULL): a copy of this
 * rank's weights after them (*n floats). */
static int steps_mode = GJ_TRAIN; /* run_steps' gj_model_create */

static void run_steps(int tp, int zero, int64_t A, int64_t B, int vocab, int rows, double clip,
                      double ln[6], float **params, size_t *n) {
  gj_config c;
  tiny(&c, 2);
  c.vocab_size = vocab;
  const int64_t T = 16;
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, tp), 0);
  ck_assert_int_eq(A * B * g.dp_size, 4);
  gj_state st;
  gj_model m;
  ck_assert_int_eq(gj_state_create(&st, &c, &g, zero), 0);
  if (rows) {
    ck_assert_int_eq(gj_state_embedding_rows(&st, A * B * T * g.dp_size), 0);
    ck_assert_ptr_nonnull(st.erows);
    ck_assert_int_eq(st.erows->cap, A * B * T * g.dp_size);
  }
  ck_assert_int_eq(gj_model_create(&m, &st, &g, B, T, 0, steps_mode), 0);
  ck_assert_int_eq(m.late_head, steps_mode == GJ_TRAIN_LATE);
  gj_params_init(m.lay, &c, m.params, 7);
  gj_adamw_hp hp;
  gj_adamw_defaults(&hp);
  if (clip > 0) hp.grad_clip = clip;
  gj_trainer tr;
  ck_assert_int_eq(gj_trainer_init(&tr, &st, &m, &g, &hp, 1e-4f, 0, GJ_DP_POLL_DEFAULT), 0);
  step_batch sb = {A, B, T, g.dp_rank, vocab};
  for (int s = 0; s < 3; s++) {
    gj_step_in in = {s + 1, s + 1, 1e-3, A, B, T, 4.0 * T, step_fill, &sb, 0};
    gj_step_out out;
    ck_assert_int_eq(gj_train_step(&tr, &in, &out), 0);
    ck_assert(out.finite);
    ln[2 * s] = out.loss, ln[2 * s + 1] = out.grad_norm;
  }
  if (rows) ck_assert(st.erows->n > 0 && st.erows->n < st.erows->V);
  if (params) {
    *n = st.lay.numel;
    *params = malloc(*n * sizeof(float));
    memcpy(*params, st.params, *n * sizeof(float));
  }
  gj_trainer_free(&tr);
  model_del(&st, &m);
  gj_grid_free(&g);
}

START_TEST(test_train_step_layouts) {
  double ln0[6], ln[6];
  run_steps(world_size, 0, 2, 2, 96, 0, 0, ln0, NULL, NULL);
  /* DP = the world with and without ZeRO-1, and on 4 ranks ZeRO-1 at TP 2 x DP 2 */
  for (int zero = 0; zero < 2 + (world_size == 4); zero++) {
    if (zero < 2) run_steps(1, zero, 1, 4 / world_size, 96, 0, 0, ln, NULL, NULL);
    else run_steps(2, 1, 1, 2, 96, 0, 0, ln, NULL, NULL);
    for (int s = 0; s < 3; s++) {
      double l = ln[2 * s], l0 = ln0[2 * s], n = ln[2 * s + 1], n0 = ln0[2 * s + 1];
      ck_assert_msg(fabs(l - l0) <= 1e-5 * l0, "zero %d step %d: loss %.9g vs %.9g", zero, s + 1, l, l0);
      ck_assert_msg(fabs(n - n0) <= 1e-4 * n0, "zero %d step %d: norm %.9g vs %.9g", zero, s + 1, n, n0);
    }
  }
  /* the steps changed the model: the loss moved */
  ck_assert(ln0[4] != ln0[0]);
}
END_TEST

/* Without clipping, a step whose gradient holds an element of 1e19 or more is skipped, and every
 * rank agrees on it though the element is on one TP shard alone: layer 0's attention value
 * weight [Dl][0] (TP rank 1's first value row) made 1e28 and out_proj's column that reads it made 0
 * leave the forward as it was and give out_proj's column a gradient near 1e28 on that rank
 * only (no other gradient sees it: the zero column stops it). The test checks that the local
 * flags differ (rank 1 alone holds the element) and that every rank skipped the update: a
 * flag not summed over TP would let the other shards apply theirs. At TP = ranks, and on 4
 * ranks at TP 2 x DP 2 with ZeRO-1 (the flag summed over the world). */
START_TEST(test_huge_gradient_tp) {
  for (int lay = 0; lay < 1 + (world_size == 4); lay++) {
    const int tp = lay ? 2 : world_size, zero = lay;
    gj_config c;
    tiny(&c, 2);
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tp), 0);
    gj_state st;
    gj_model m;
    const int64_t B = 4 / g.dp_size, T = 16;
    ck_assert_int_eq(model_new(&st, &m, &c, &g, B, T, zero, 0, GJ_TRAIN), 0);
    gj_params_init(m.lay, &c, m.params, 7);
    const gj_tensor *wv = gj_layout_block(m.lay, 0, GJ_BLK_WV), *wo = gj_layout_block(m.lay, 0, GJ_BLK_WO);
    if (g.tp_rank == 1) {
      m.params[wv->offset] = 1e28f; /* local row 0, column 0 (a LayerNorm's outputs sum to 0 over a row) */
      for (int64_t r = 0; r < wo->lrows; r++) m.params[wo->offset + (size_t)r * wo->lcols] = 0; /* local column 0 */
    }
    float *before = malloc(st.lay.numel * sizeof(float));
    memcpy(before, st.params, st.lay.numel * sizeof(float));
    gj_adamw_hp hp;
    gj_adamw_defaults(&hp);
    hp.grad_clip = 0;
    gj_trainer tr;
    ck_assert_int_eq(gj_trainer_init(&tr, &st, &m, &g, &hp, 0.0f, 0, GJ_DP_POLL_DEFAULT), 0);
    step_batch sb = {1, B, T, g.dp_rank, (int)c.vocab_size};
    gj_step_in in = {1, 1, 1e-3, 1, B, T, 4.0 * T, step_fill, &sb, 0};
    gj_step_out out;
    ck_assert_int_eq(gj_train_step(&tr, &in, &out), 0);
    /* the loss is finite; out_proj's column holds the huge element on TP rank 1 alone (where
     * this rank holds it: under ZeRO-1 the reduced range is a share) */
    ck_assert(isfinite(out.loss));
    if (!zero) {
      int local = 0;
      for (int64_t r = 0; r < wo->lrows; r++) local |= fabsf(st.grads[wo->offset + (size_t)r * wo->lcols]) >= 1e19f;
      int held = gj_grad_huge(&st.lay, st.grads, NULL, 0, st.lay.numel,
                              gj_grad_sumsq(&st.lay, st.grads, NULL, g.tp_rank, 0, st.lay.numel));
      ck_assert_int_eq(local, g.tp_rank == 1);
      ck_assert_int_eq(held, g.tp_rank == 1);
    }
    ck_assert_msg(out.huge && !out.finite, "layout %d rank %d: huge %d finite %d", lay, world_rank, out.huge,
                  out.finite);
    ck_assert_msg(!memcmp(before, st.params, st.lay.numel * sizeof(float)), "layout %d rank %d: the update was applied",
                  lay, world_rank);
    free(before);
    gj_trainer_free(&tr);
    model_del(&st, &m);
    gj_grid_free(&g);
  }
}
END_TEST

/* The embedding's gradient as rows (gj_state_embedding_rows) trains as the dense gradient does:
 * 3 steps on TP = ranks with 2 micro-batches (each TP shard's rows, grown by the second
 * micro-batch), on DP = ranks (the union of the ranks' rows) and with ZeRO-1 (each rank's share
 * of AdamW over them): the same losses, norms and weights,
 * bit for bit where the sums meet in the same order (up to 2 DP ranks; with 4, Open MPI's
 * all-reduce of the rows may add in another order than the block's). 64 tokens a step of a
 * 512-token vocabulary (ids over all of it, so over every TP shard): most rows are absent,
 * and their weights still decay. */
START_TEST(test_embedding_rows) {
  const struct { int tp, zero; int64_t A, B; } cfg[] = {
      {world_size, 0, 2, 2}, {1, 0, 1, 4 / world_size}, {1, 1, 1, 4 / world_size}};
  for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
    double d[6], r[6];
    float *pd, *pr;
    size_t nd, nr;
    /* clip 0.05: the norm scales every step, so it must agree too */
    run_steps(cfg[k].tp, cfg[k].zero, cfg[k].A, cfg[k].B, 512, 0, 0.05, d, &pd, &nd);
    run_steps(cfg[k].tp, cfg[k].zero, cfg[k].A, cfg[k].B, 512, 1, 0.05, r, &pr, &nr);
    ck_assert_uint_eq(nd, nr);
    int exact = cfg[k].tp == world_size || world_size <= 2;
    for (int i = 0; i < 6; i++)
      ck_assert_msg(exact ? r[i] == d[i] : fabs(r[i] - d[i]) <= 1e-6 * fabs(d[i]),
                    "layout %zu: %s %d: rows %.17g, dense %.17g", k, i % 2 ? "norm" : "loss", i / 2 + 1, r[i], d[i]);
    for (size_t i = 0; i < nd; i++)
      ck_assert_msg(exact ? memcmp(&pr[i], &pd[i], sizeof(float)) == 0 : fabsf(pr[i] - pd[i]) <= 1e-6f,
                    "layout %zu: weight %zu: rows %.9g, dense %.9g", k, i, pr[i], pd[i]);
    free(pd), free(pr);
  }
}
END_TEST

/* The rows give the dense tensor's memory back: gptj-125m's 154 MB of embedding gradient become
 * the rows of 2,048 tokens, and gptj plan's arithmetic says so. */
START_TEST(test_embedding_rows_memory) {
  gj_config c;
  gj_config_preset(&c, "gptj-125m");
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, world_size), 0);
  gj_state st;
  ck_assert_int_eq(gj_state_create(&st, &c, &g, 0), 0);
  size_t dense = st.bytes, grads = st.numel_pad * sizeof(float), E = st.lay.t[0].numel * sizeof(float);
  ck_assert_int_eq(gj_state_embedding_rows(&st, 2048), 0);
  ck_assert_uint_ge(st.hole_len, E - 2 * 4096);
  ck_assert_uint_eq(st.bytes, dense - st.hole_len + st.erows->bytes);
  ck_assert_int_eq(gj_state_train_grad_bytes(&c, world_size, 0, 1, 2048, &grads), 0);
  size_t plan = dense - st.numel_pad * sizeof(float) + grads;
  ck_assert_msg(plan <= st.bytes && st.bytes <= plan + 2 * 4096, /* the hole's partial pages */
                "plan %zu, state %zu bytes", plan, st.bytes);
  ck_assert_uint_lt(st.bytes, dense - E + 2048 * 768 * 4 + ((size_t)4 << 20));
  gj_state_zero_grads(&st); /* skips the hole */
  gj_state_free(&st);
  /* tokens that reach every row: the dense tensor, which is as small */
  ck_assert_int_eq(gj_state_create(&st, &c, &g, 0), 0);
  ck_assert_int_eq(gj_state_embedding_rows(&st, c.vocab_size / world_size), 0);
  ck_assert_ptr_null(st.erows);
  ck_assert_uint_eq(st.bytes, dense);
  gj_state_free(&st);
  gj_grid_free(&g);
}
END_TEST

/* The bf16 backend a test runs: auto's choice, or on a CPU without bf16 hardware OpenBLAS on
 * bf16 values (the only one such a CPU runs; tu_bf16 in testutil.h). */
static gj_gemm_backend bf16_backend(void) { return tu_bf16_hw() ? GJ_GEMM_AUTO : GJ_GEMM_OPENBLAS; }

/* The bytes of a bf16-resident state of GPT-J c at TP tp, from the architecture: the 2-D
 * tensors (embedding, q/k/v/out, fc_in/out, lm_head) in bfloat16, the 1-D ones in float32;
 * the embedding, lm_head, q/k/v, out_proj, fc_in/out and their biases but fc_out's split by
 * TP, the LayerNorms and fc_out's bias replicated. */
static size_t weights16_bytes(const gj_config *c, int tp) {
  size_t V = (size_t)c->vocab_size, D = (size_t)c->n_embd, F = (size_t)c->n_inner, L = (size_t)c->n_layer;
  size_t two = (2 * V * D + L * (4 * D * D + 2 * D * F)) / tp;
  size_t one = L * 3 * D + 2 * D + (L * F + V) / tp;
  return 2 * two + 4 * one;
}

/* gptj plan's arithmetic equals what the arenas really allocate (mode: gj_model_create's
 * training); returns the activations' bytes. */
static size_t check_sizes_mode(const char *preset, int tp, int zero, int recompute, int64_t B, int64_t T,
                               int mode) {
  gj_config c;
  gj_config_preset(&c, preset);
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, tp), 0);
  gj_mem_sizes s;
  ck_assert_int_eq(gj_model_sizes(&s, &c, tp, g.dp_size, zero, recompute, mode, B, T, omp_get_max_threads()), 0);
  gj_state st;
  gj_model m;
  ck_assert_int_eq(model_new(&st, &m, &c, &g, B, T, zero, recompute, mode), 0);
  ck_assert_uint_eq(st.bytes, s.params + s.grads + s.moments);
  ck_assert_uint_eq(st.numel_pad * sizeof(float), s.params);
  ck_assert_uint_eq(2 * st.n * sizeof(float), s.moments);
  ck_assert_uint_eq(m.act_bytes, s.acts);
  ck_assert_int_eq(m.late_head, s.late_head);
  if (mode != GJ_TRAIN_ONE) ck_assert_int_eq(s.late_head, mode == GJ_TRAIN_LATE);
  if (!s.late_head) ck_assert_uint_eq(s.acts_in_grads, 0);
  /* the activations placed in the head's gradient fit in it */
  ck_assert_uint_le(s.acts_in_grads, gj_layout_tail(m.lay, 0)[GJ_TAIL_LM_W].numel * sizeof(float));
  model_del(&st, &m);
  gj_grid_free(&g);
  return s.acts;
}

static void check_sizes(const char *preset, int tp, int zero, int recompute, int64_t B, int64_t T) {
  size_t train = check_sizes_mode(preset, tp, zero, recompute, B, T, GJ_TRAIN);
  /* one micro-batch a step: a late head gradient only where it makes the arena smaller, or
   * (bf16 on oneDNN, at DP 1) at most an eighth larger */
  size_t one = check_sizes_mode(preset, tp, zero, recompute, B, T, GJ_TRAIN_ONE);
  const int speed = world_size / tp == 1 && gj_gemm_reads_bf16(); /* DP 1, bf16 on oneDNN */
  ck_assert_uint_le(one, speed ? train + train / 4 / 8 * 4 : train);
  check_sizes_mode(preset, tp, zero, recompute, B, T, GJ_TRAIN_LATE);
}

/* The choice of a late head gradient (gj_model_sizes, which gj_model_create's arena equals,
 * check_sizes_mode): in floats of arena, late where that is smaller than blocked, or where the
 * products read bf16 (oneDNN) at DP 1, where it is at most an eighth larger; at DP 2 only where
 * smaller. */
static void check_late_choice(const char *preset, int prec, int64_t B, int64_t T, int want_dp1) {
  gj_config c;
  gj_config_preset(&c, preset);
  ck_assert_int_eq(gj_gemm_setup(prec ? bf16_backend() : GJ_GEMM_OPENBLAS, prec ? GJ_PREC_BF16 : GJ_PREC_F32), 0);
  for (int dp = 1; dp <= 2; dp++) {
    gj_mem_sizes blk, one, late;
    ck_assert_int_eq(gj_model_sizes(&blk, &c, 1, dp, 0, 0, GJ_TRAIN, B, T, 2), 0);
    ck_assert_int_eq(gj_model_sizes(&one, &c, 1, dp, 0, 0, GJ_TRAIN_ONE, B, T, 2), 0);
    ck_assert_int_eq(gj_model_sizes(&late, &c, 1, dp, 0, 0, GJ_TRAIN_LATE, B, T, 2), 0);
    const size_t b = blk.acts / 4, l = late.acts / 4; /* floats */
    const int want = l < b || (dp == 1 && gj_gemm_reads_bf16() && l - b <= b / 8);
    ck_assert_int_eq(one.late_head, want);
    ck_assert_uint_eq(one.acts, want ? late.acts : blk.acts);
    if (dp == 1 && want_dp1 >= 0) ck_assert_int_eq(one.late_head, want_dp1);
  }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
}

START_TEST(test_plan_sizes) {
  for (int zero = 0; zero < 2; zero++)
    for (int rc = 0; rc < 2; rc++) {
      check_sizes("tiny", 1, zero, rc, 4, 64);
      check_sizes("tiny", world_size, zero, rc, 2, 128);
    }
  check_sizes("gptj-125m", world_size, 1, 1, 1, 128);
  /* gptj-125m bf16 at B 8, T 256: late is 38 MB more, chosen at DP 1 for speed where the
   * products read bf16, not at DP 2; gptj-350m float32 (late 12% more): not, being float32 */
  check_late_choice("gptj-125m", 1, 8, 256, tu_bf16_hw() ? 1 : -1);
  check_late_choice("gptj-125m", 0, 8, 256, 0);
  check_late_choice("gptj-350m", 0, 8, 256, 0);
  check_late_choice("gptj-350m", 1, 4, 512, -1);
  check_late_choice("tiny", 0, 3, 100, -1);
  /* a wide head and 256 rows (one head block: the late head keeps no more d logits than the
   * blocked one): the head's gradient hosts activations, and the arena shrinks */
  ck_assert_uint_lt(check_sizes_mode("tiny", 1, 0, 0, 4, 64, GJ_TRAIN_ONE),
                    check_sizes_mode("tiny", 1, 0, 0, 4, 64, GJ_TRAIN));
  /* the forward-only layouts of eval and generate: what they allocate, and less than keeping
   * every layer */
  gj_config t;
  gj_config_preset(&t, "gptj-125m");
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, world_size), 0);
  size_t acts[2][4];
  for (int bf = 0; bf < 2; bf++) {
    ck_assert_int_eq(gj_gemm_setup(bf ? bf16_backend() : GJ_GEMM_OPENBLAS, bf ? GJ_PREC_BF16 : GJ_PREC_F32), 0);
    for (int keep = 0; keep < 4; keep++) {
      gj_mem_sizes s;
      ck_assert_int_eq(gj_model_sizes(&s, &t, world_size, g.dp_size, 0, keep, 0, 1, 512, omp_get_max_threads()), 0);
      gj_state st;
      gj_model m;
      ck_assert_int_eq(bf ? gj_state_create_weights16(&st, &t, &g) : gj_state_create_weights(&st, &t, &g), 0);
      ck_assert_int_eq(gj_model_create(&m, &st, &g, 1, 512, keep, 0), 0);
      ck_assert_uint_eq(m.act_bytes, s.acts);
      ck_assert_uint_eq(st.bytes, bf ? weights16_bytes(&t, world_size) : s.params);
      acts[bf][keep] = s.acts;
      model_del(&st, &m);
    }
    ck_assert_uint_lt(acts[bf][GJ_RECOMPUTE], acts[bf][GJ_KEEP_ALL]);
    ck_assert_uint_lt(acts[bf][GJ_DECODE], acts[bf][GJ_KEEP_ALL]);
    ck_assert_uint_lt(acts[bf][GJ_FORWARD], acts[bf][GJ_RECOMPUTE]);
  }
  /* bf16 decoding holds its KV cache in bfloat16 only: less than float32's */
  ck_assert_uint_lt(acts[1][GJ_DECODE], acts[0][GJ_DECODE]);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  gj_grid_free(&g);
  gj_config c;
  gj_config_preset(&c, "gptj-6b");
  ck_assert_int_eq(gj_config_n_params(&c), 6050882784LL);
}
END_TEST

/* What the hook heard: each call's range. */
typedef struct {
  size_t lo[64], hi[64];
  int n;
} hook_log;

static int log_ready(void *ctx, size_t lo, size_t hi, float *g) {
  hook_log *h = ctx;
  (void)g;
  if (h->n < 64) h->lo[h->n] = lo, h->hi[h->n] = hi;
  h->n++;
  return 0;
}

/* Every part reported once, from the top down, the head last if late. */
static void check_hook(const hook_log *h, const gj_state *st, int late) {
  const int parts = gj_layout_parts(&st->lay);
  ck_assert_int_eq(h->n, parts);
  for (int i = 0; i < parts; i++) {
    int k = late ? (i + 1) % parts : i;
    ck_assert_uint_eq(h->lo[i], gj_layout_part_lo(&st->lay, k));
    ck_assert_uint_eq(h->hi[i], k == 0 ? st->numel_pad : gj_layout_part_lo(&st->lay, k - 1));
  }
}

/* A late head gradient (gj_model's late_head): its activations live in the head's gradient
 * memory until backward is done with them; then the head's weight gradient comes in one product
 * over every row. The same loss and gradients as the head's gradient accumulated block by
 * block, in float32 and bf16, at TP 1 and TP = ranks, over a head block and a partial one: bit
 * for bit but the head's weight gradient (its sums in another order: to 1e-6). The hook hears
 * every part once, the head last. Twice, so that the second step runs over the memory the
 * first one's gradient left. */
START_TEST(test_late_head) {
  gj_config c;
  tiny(&c, 2);
  /* the head's gradient (V D floats) larger than the d logits (N V): room for every buffer, so
   * that one placed there by mistake would be overwritten */
  c.vocab_size = 96 * 8, c.n_embd = 384;
  const int64_t B = 5, T = 61, N = B * T; /* 305 rows: a block of 256 and one of 49 */
  int32_t *ids = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t));
  for (int64_t i = 0; i < N; i++)
    ids[i] = (int32_t)((i * 37 + 5) % c.vocab_size), tg[i] = i % 17 == 3 ? -1 : (int32_t)((i * 11 + 2) % c.vocab_size);
  for (int bf = 0; bf < 2; bf++) {
    ck_assert_int_eq(gj_gemm_setup(bf ? bf16_backend() : GJ_GEMM_OPENBLAS, bf ? GJ_PREC_BF16 : GJ_PREC_F32), 0);
    for (int tpi = 0; tpi < 2; tpi++) {
      gj_grid g;
      ck_assert_int_eq(gj_grid_init(&g, tpi ? world_size : 1), 0);
      gj_state s1, s2;
      gj_model m1, m2;
      ck_assert_int_eq(model_new(&s1, &m1, &c, &g, B, T, 0, 0, GJ_TRAIN), 0);
      ck_assert_int_eq(model_new(&s2, &m2, &c, &g, B, T, 0, 0, GJ_TRAIN_LATE), 0);
      ck_assert(!m1.late_head && m2.late_head);
      ck_assert(bf ? m2.a.dlg16 != NULL : m2.a.dlg16 == NULL);
      gj_params_init(m1.lay, &c, m1.params, 5);
      gj_params_init(m2.lay, &c, m2.params, 5);
      const gj_tensor *lm = &gj_layout_tail(m1.lay, 0)[GJ_TAIL_LM_W];
      for (int rep = 0; rep < 2; rep++) {
        double l1, l2;
        int64_t n1, n2;
        hook_log h1 = {{0}, {0}, 0}, h2 = {{0}, {0}, 0};
        gj_grad_hook k1 = {log_ready, &h1}, k2 = {log_ready, &h2};
        gj_state_zero_grads(&s1), gj_state_zero_grads(&s2);
        ck_assert_int_eq(gj_model_forward_backward(&m1, ids, tg, B, T, 1e-3f, 1.0f / 300, &k1, &l1, &n1), 0);
        ck_assert_int_eq(gj_model_forward_backward(&m2, ids, tg, B, T, 1e-3f, 1.0f / 300, &k2, &l2, &n2), 0);
        ck_assert_int_eq(n1, n2);
        ck_assert(l1 == l2);
        check_hook(&h1, &s1, 0), check_hook(&h2, &s2, 1);
        for (int t = 0; t < m1.lay->n; t++) {
          const gj_tensor *ts = &m1.lay->t[t];
          const float *a = m1.grads + ts->offset, *b = m2.grads + ts->offset;
          if (ts != lm) {
            ck_assert_msg(!memcmp(a, b, ts->numel * sizeof(float)), "bf16 %d tp %d: %s gradient differs",
                          bf, g.tp_size, ts->name);
            continue;
          }
          double num = 0, den = 0;
          for (size_t i = 0; i < ts->numel; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += (double)a[i] * a[i];
          ck_assert_msg(den > 0 && sqrt(num) <= 1e-6 * sqrt(den), "bf16 %d tp %d: head gradient %g of %g", bf,
                        g.tp_size, sqrt(num), sqrt(den));
        }
      }
      model_del(&s1, &m1), model_del(&s2, &m2);
      gj_grid_free(&g);
    }
  }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
  free(ids), free(tg);
}
END_TEST

/* The trainer over a late head gradient: the same losses, norms and weights after 3 steps as
 * without it, on TP = ranks and on DP = ranks (its part then reduced last, alone), with ZeRO-1
 * and with the embedding's gradient as rows: bit for bit up to 2 ranks (with 4, Open MPI may
 * add the separately posted range in another order). */
START_TEST(test_late_head_steps) {
  for (int tpi = 0; tpi < 2; tpi++)
    for (int zero = 0; zero < 2; zero++)
      for (int rows = 0; rows < 2; rows++) {
        int tp = tpi ? world_size : 1;
        int64_t B = 4 / (world_size / tp);
        double ln0[6], ln[6];
        float *p0, *p;
        size_t n0, n;
        steps_mode = GJ_TRAIN;
        run_steps(tp, zero, 1, B, 512, rows, 0, ln0, &p0, &n0);
        steps_mode = GJ_TRAIN_LATE;
        run_steps(tp, zero, 1, B, 512, rows, 0, ln, &p, &n);
        steps_mode = GJ_TRAIN;
        ck_assert_uint_eq(n, n0);
        double tol = world_size <= 2 || tp == world_size ? 0 : 1e-6, num = 0, den = 0;
        for (int s = 0; s < 6; s++)
          ck_assert_msg(fabs(ln[s] - ln0[s]) <= tol * fabs(ln0[s]), "tp %d zero %d rows %d: %.9g vs %.9g", tp,
                        zero, rows, ln[s], ln0[s]);
        for (size_t i = 0; i < n; i++) num += ((double)p[i] - p0[i]) * ((double)p[i] - p0[i]), den += (double)p0[i] * p0[i];
        ck_assert_msg(sqrt(num) <= tol * sqrt(den), "tp %d zero %d rows %d: weights differ by %g of %g", tp, zero,
                      rows, sqrt(num), sqrt(den));
        free(p0), free(p);
      }
}
END_TEST

/* bf16 training under ZeRO-1 gathers the GEMM weights in bfloat16 (gj_dp_gather16): the same
 * losses and gradient norms as with the float32 all-gather, bit for bit; each rank's own range
 * of the weights the same bits; outside it the GEMM weights are the bf16 values of the
 * float32 ones and every other tensor (embedding, LayerNorms, biases) the same bits. With the
 * embedding's gradient as dense and as rows, and with a late head gradient. */
START_TEST(test_zero_gather16) {
  ck_assert_int_eq(gj_gemm_setup(bf16_backend(), GJ_PREC_BF16), 0);
  gj_config c;
  tiny(&c, 2);
  c.vocab_size = 512;
  gj_layout l;
  ck_assert_int_eq(gj_layout_build(&l, &c, 1, 0), 0);
  size_t np, P;
  gj_state_sizes(l.numel, world_size, 1, &np, &P);
  const size_t lo = P * (size_t)world_rank, hi = lo + P; /* DP = the world */
  for (int k = 0; k < 3; k++) {
    const int rows = k == 1; /* k 2: a late head gradient, whose memory holds activations */
    steps_mode = k == 2 ? GJ_TRAIN_LATE : GJ_TRAIN;
    double ln0[6], ln[6];
    float *p0, *p;
    size_t n0, n;
    gj_dp_test_gather_f32(1);
    run_steps(1, 1, 1, 4 / world_size, 512, rows, 0, ln0, &p0, &n0);
    gj_dp_test_gather_f32(0);
    run_steps(1, 1, 1, 4 / world_size, 512, rows, 0, ln, &p, &n);
    ck_assert_uint_eq(n, n0);
    for (int s = 0; s < 6; s++) ck_assert_msg(ln[s] == ln0[s], "rows %d: %.9g vs %.9g", rows, ln[s], ln0[s]);
    size_t n16 = 0, inexact = 0;
    for (int i = 0; i < l.n; i++) {
      const gj_tensor *t = &l.t[i];
      for (size_t e = t->offset; e < t->offset + t->numel; e++) {
        const int mine = e >= lo && e < hi, h = gj_tensor_has_w16(t) && !mine;
        gj_bf16 r16;
        gj_bf16_round(&r16, &p0[e], 1);
        const float want = h ? gj_bf16_to_f32(r16) : p0[e];
        ck_assert_msg(!memcmp(&p[e], &want, sizeof(float)), "rows %d: %s element %zu: %.9g, want %.9g (rank %d, own [%zu, %zu))",
                      rows, t->name, e - t->offset, p[e], want, world_rank, lo, hi);
        n16 += h, inexact += h && p0[e] != want;
      }
    }
    /* the others' GEMM weights are there, and most of their float32 values are not bf16 ones */
    ck_assert(n16 > 0 && inexact > n16 / 2);
    free(p0), free(p);
  }
  steps_mode = GJ_TRAIN;
  gj_layout_free(&l);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
}
END_TEST

/* bf16 decoding: a decode network holds its KV cache in bfloat16 only (the keys and values
 * rounded once as they enter it); the same bfloat16 operands as a network that keeps float32
 * keys and values and lets the GEMM door round them, so the same greedy ids and the same
 * logits, bit for bit, at TP = ranks. */
START_TEST(test_decode_cache16) {
  ck_assert_int_eq(gj_gemm_setup(bf16_backend(), GJ_PREC_BF16), 0);
  gj_config c;
  tiny(&c, 3);
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, world_size), 0);
  gj_state st;
  gj_model ref, dec;
  ck_assert_int_eq(gj_state_create_weights(&st, &c, &g), 0);
  gj_params_init(&st.lay, &c, st.params, 21);
  ck_assert_int_eq(gj_model_create(&ref, &st, &g, 1, 64, GJ_KEEP_ALL, 0), 0);
  ck_assert_int_eq(gj_model_create(&dec, &st, &g, 1, 64, GJ_DECODE, 0), 0);
  ck_assert_ptr_null(ref.a.kv16);
  ck_assert_ptr_nonnull(dec.a.kv16);
  int32_t a[64], b[64];
  for (int i = 0; i < 9; i++) a[i] = b[i] = (i * 13 + 4) % 96;
  ck_assert_int_eq(gj_generate_greedy(&ref, a, 9, 40), 0);
  ck_assert_int_eq(gj_generate_greedy(&dec, b, 9, 40), 0);
  for (int i = 0; i < 49; i++) ck_assert_int_eq(a[i], b[i]);
  ck_assert(!memcmp(ref.a.logits, dec.a.logits, ref.Vl * sizeof(float)));
  gj_model_free(&ref), gj_model_free(&dec);
  gj_state_free(&st);
  gj_grid_free(&g);
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  gj_gemm_finalize();
}
END_TEST

/* One pass of the copies test: a training network of mode `mode` at TP tp (B 5, T 61: a head
 * block of 256 rows and one of 49) through forward + backward twice, the weights changed in
 * between (as an optimizer step changes them), the loss and every gradient kept; then the loss
 * of a forward-only network and of the training network's own forward (validation); then 20
 * greedy tokens of a decode network over float32 weights, changed after the first 10 (its bf16
 * copies must follow). */
typedef struct {
  double loss[4];
  float *grads;
  size_t n;
  int32_t ids[64];
  float logits[96 * 8];
} copies_run;

static void copies_pass(int tp, int mode, copies_run *r) {
  memset(r, 0, sizeof *r);
  gj_config c;
  tiny(&c, 2);
  c.vocab_size = 96 * 8;
  const int64_t B = 5, T = 61, N = B * T;
  int32_t *ids = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t));
  for (int64_t i = 0; i < N; i++)
    ids[i] = (int32_t)((i * 37 + 5) % c.vocab_size), tg[i] = i % 17 == 3 ? -1 : (int32_t)((i * 11 + 2) % c.vocab_size);
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, tp), 0);
  gj_state st;
  gj_model m;
  ck_assert_int_eq(model_new(&st, &m, &c, &g, B, T, 0, 0, mode), 0);
  gj_params_init(m.lay, &c, m.params, 5);
  int64_t nv;
  for (int rep = 0; rep < 2; rep++) {
    if (rep) { /* an update of every weight */
      for (size_t i = 0; i < m.lay->numel; i++) m.params[i] -= 1e-3f * m.grads[i] + 1e-4f * (float)((i * 7) % 5);
      gj_model_weights_changed(&m);
    }
    gj_state_zero_grads(&st);
    ck_assert_int_eq(gj_model_forward_backward(&m, ids, tg, B, T, 1e-3f, 1.0f / 300, NULL, &r->loss[rep], &nv), 0);
  }
  r->n = m.lay->numel;
  r->grads = malloc(r->n * sizeof(float));
  memcpy(r->grads, m.grads, r->n * sizeof(float));
  ck_assert_int_eq(gj_model_forward(&m, ids, tg, B, T, 1e-3f, &r->loss[2], &nv), 0);
  gj_state sf;
  gj_model fw;
  ck_assert_int_eq(gj_state_create_weights(&sf, &c, &g), 0);
  ck_assert_int_eq(gj_model_create(&fw, &sf, &g, B, T, GJ_FORWARD, 0), 0);
  memcpy(fw.params, m.params, m.lay->numel * sizeof(float));
  ck_assert_int_eq(gj_model_forward(&fw, ids, tg, B, T, 1e-3f, &r->loss[3], &nv), 0);
  model_del(&sf, &fw);
  gj_model dec;
  ck_assert_int_eq(gj_state_create_weights(&sf, &c, &g), 0);
  gj_params_init(&sf.lay, &c, sf.params, 21);
  ck_assert_int_eq(gj_model_create(&dec, &sf, &g, 1, 64, GJ_DECODE, 0), 0);
  for (int i = 0; i < 9; i++) r->ids[i] = (i * 13 + 4) % c.vocab_size;
  ck_assert_int_eq(gj_generate_greedy(&dec, r->ids, 9, 10), 0);
  for (size_t i = 0; i < sf.lay.numel; i++) sf.params[i] *= 1.0f + 0.01f * (float)((i * 3) % 7);
  gj_model_weights_changed(&dec);
  ck_assert_int_eq(gj_generate_greedy(&dec, r->ids, 19, 10), 0);
  memcpy(r->logits, dec.a.logits, dec.Vl * sizeof(float));
  gj_model_free(&dec);
  gj_state_free(&sf);
  model_del(&st, &m);
  gj_grid_free(&g);
  free(ids), free(tg);
}

/* The paths written for a backend that reads bfloat16 (oneDNN's, with AMX or AVX512_BF16: the
 * head's bf16 copy in the work buffers, rounded as each head phase starts; fc_in's output written
 * as bf16 by its product; bf16 attention probabilities; a decode network's weight copies,
 * refreshed when the weights change) against the plain bf16 path: both on OpenBLAS, where the
 * door widens a copy to the very floats it would otherwise round to
 * (gj_gemm_test_bf16_copies), so the same losses, gradients, ids and logits, bit for bit, in
 * both training modes (the head's gradient block by block, and late), at TP 1 and TP = ranks.
 * It runs on every CPU: one without bf16 hardware runs oneDNN's paths nowhere else. */
START_TEST(test_bf16_copies) {
  for (int tpi = 0; tpi < 2; tpi++)
    for (int late = 0; late < 2; late++) {
      copies_run r[2];
      for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_BF16), 0);
        ck_assert(!gj_gemm_reads_bf16());
        gj_gemm_test_bf16_copies(k);
        ck_assert_int_eq(gj_gemm_reads_bf16(), k);
        copies_pass(tpi ? world_size : 1, late ? GJ_TRAIN_LATE : GJ_TRAIN, &r[k]);
      }
      const char *what[4] = {"first step", "second step", "validation", "forward-only"};
      for (int i = 0; i < 4; i++)
        ck_assert_msg(r[0].loss[i] == r[1].loss[i], "tp %d late %d: %s loss %.17g vs %.17g", tpi ? world_size : 1,
                      late, what[i], r[0].loss[i], r[1].loss[i]);
      ck_assert(r[0].loss[1] != r[0].loss[0]); /* the update changed the model */
      ck_assert_uint_eq(r[0].n, r[1].n);
      ck_assert_msg(!memcmp(r[0].grads, r[1].grads, r[0].n * sizeof(float)), "tp %d late %d: gradients differ",
                    tpi ? world_size : 1, late);
      ck_assert(!memcmp(r[0].ids, r[1].ids, sizeof r[0].ids));
      ck_assert(!memcmp(r[0].logits, r[1].logits, sizeof r[0].logits));
      free(r[0].grads), free(r[1].grads);
    }
  ck_assert_int_eq(gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32), 0);
  ck_assert(!gj_gemm_reads_bf16());
  gj_gemm_finalize();
}
END_TEST

/* --- the primitives of src/parallel/ (comm.c, grid.c). Checks are made after the last
 * collective of a test, so that a failure on one rank cannot leave the others waiting. */

/* More than GJ_CHUNK bytes (two whole pieces and a partial one) from the last rank. */
START_TEST(test_bcast_large) {
  const size_t n = 2 * GJ_CHUNK + 12345;
  const int root = world_size - 1;
  unsigned char *b = malloc(n);
  ck_assert_ptr_nonnull(b);
  for (size_t i = 0; i < n; i++) b[i] = world_rank == root ? (unsigned char)(i * 7 + i / 4099) : 0;
  int rc = gj_bcast(gj_comm_world(), b, n, root);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += b[i] != (unsigned char)(i * 7 + i / 4099);
  free(b);
  ck_assert_int_eq(rc, 0);
  ck_assert_uint_eq(bad, 0);
}
END_TEST

/* Sums in 64-bit integers (exact beyond 2^53), maxima, the barrier, one value or not. */
START_TEST(test_reductions) {
  gj_comm w = gj_comm_world();
  uint64_t u[3] = {((uint64_t)1 << 58) + (uint64_t)world_rank, 1, (uint64_t)world_rank << 40};
  int mi[2] = {-world_rank, world_rank * 3};
  double mf[2] = {-0.5 * world_rank, 1.0 / (world_rank + 1)}, sf[2] = {0.25, (double)world_rank};
  int rc[7], same_all, same_rank, same_min, same_min0;
  rc[0] = gj_allreduce_sum_u64(w, u, 3);
  rc[1] = gj_allreduce_max_int(w, mi, 2);
  rc[2] = gj_allreduce_max_f64(w, mf, 2);
  rc[3] = gj_allreduce_sum_f64(w, sf, 2);
  rc[4] = gj_same_int(w, 42, &same_all) || gj_same_int(w, world_rank, &same_rank);
  rc[5] = gj_barrier(w);
  rc[6] = gj_same_int(w, INT_MIN, &same_min) || gj_same_int(w, world_rank ? INT_MIN : 0, &same_min0);
  uint64_t S = (uint64_t)world_size, R = S * (S - 1) / 2; /* sum of the ranks */
  for (int i = 0; i < 7; i++) ck_assert_int_eq(rc[i], 0);
  ck_assert_int_eq(same_min, 1);
  ck_assert_int_eq(same_min0, world_size == 1); /* INT_MIN beside 0: not the same */
  ck_assert(u[0] == ((uint64_t)world_size << 58) + R);
  ck_assert(u[1] == S);
  ck_assert(u[2] == R << 40);
  ck_assert_int_eq(mi[0], 0);
  ck_assert_int_eq(mi[1], 3 * (world_size - 1));
  ck_assert(mf[0] == 0 && mf[1] == 1.0);
  ck_assert(sf[0] == 0.25 * world_size && sf[1] == (double)R);
  ck_assert_int_eq(same_all, 1);
  ck_assert_int_eq(same_rank, world_size == 1);
  ck_assert_int_eq(gj_comm_rank(w), world_rank);
  ck_assert_int_eq(gj_comm_size(w), world_size);
  /* the TP reductions of the vocabulary head (the softmax's max and sums) at TP = the world: a
   * max taken as a sum would still give the loss while the logits are small */
  gj_grid g;
  ck_assert_int_eq(gj_grid_init(&g, world_size), 0);
  float mx[3] = {(float)world_rank + 1, -(float)world_rank - 1, world_rank == world_size - 1 ? 100.0f : -3.0f};
  float sm[2] = {1.0f, (float)world_rank};
  ck_assert_int_eq(gj_tp_allreduce_max(&g, mx, 3), 0);
  ck_assert_int_eq(gj_tp_allreduce_sum(&g, sm, 2), 0);
  ck_assert(mx[0] == (float)world_size && mx[1] == -1.0f && mx[2] == 100.0f);
  ck_assert(sm[0] == (float)world_size && sm[1] == (float)R);
  gj_grid_free(&g);
}
END_TEST

/* Ranks on this node, against the ranks that share this host name. */
START_TEST(test_node_size) {
  int n = 0, rc = gj_comm_node_size(gj_comm_world(), &n);
  char host[MPI_MAX_PROCESSOR_NAME] = "", *all = calloc(world_size, sizeof host);
  int len;
  MPI_Get_processor_name(host, &len);
  MPI_Allgather(host, sizeof host, MPI_CHAR, all, sizeof host, MPI_CHAR, MPI_COMM_WORLD);
  int same = 0;
  for (int r = 0; r < world_size; r++) same += !strcmp(all + r * sizeof host, host);
  free(all);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(n, same);
}
END_TEST

static int agree_twice(int rc) {
  GJ_AGREE(gj_comm_world(), rc);
  return 7;
}

/* The lowest failing rank's code and message reach every rank (itself included), named by its
 * rank once however often it is agreed; all well: 0 everywhere. */
START_TEST(test_agree) {
  gj_comm w = gj_comm_world();
  const int bad = world_size - 1;
  gj_log_set_rank(world_rank);
  int ok = gj_agree(w, 0), ok2 = agree_twice(0);
  int rc = world_rank >= bad ? GJ_FAIL("boom on %d", world_rank) : 0;
  if (rc) rc = -3;
  int got = gj_agree(w, rc), got2 = agree_twice(rc);
  char msg[GJ_ERRMSG_MAX], want[64];
  snprintf(msg, sizeof msg, "%s", gj_errmsg());
  gj_log_set_rank(0);
  ck_assert_int_eq(ok, 0);
  ck_assert_int_eq(ok2, 7);
  ck_assert_int_eq(got, -3);
  ck_assert_int_eq(got2, -3);
  if (bad == 0) snprintf(want, sizeof want, "boom on %d", bad);
  else snprintf(want, sizeof want, "[rank %d] boom on %d", bad, bad);
  ck_assert_str_eq(msg, want);
  ck_assert_int_eq(gj_mpi_fail(MPI_ERR_COUNT, "MPI_Send(x)"), -1);
  ck_assert_msg(!strncmp(gj_errmsg(), "MPI error in MPI_Send(x): ", 26), "%s", gj_errmsg());
}
END_TEST

/* Uneven lengths in rank order, rank 1 with none; elements of 3 bytes; more than GJ_CHUNK
 * bytes from every rank; and the copy on a communicator of one rank. */
START_TEST(test_gather_ordered) {
  gj_comm w = gj_comm_world();
  const int rounds = 2;
  int rcs[2 * rounds + 1], bad = 0;
  for (int k = 0; k < rounds; k++) {
    size_t esize = k ? 2 : 3;
    uint64_t n = k ? GJ_CHUNK / 2 + 1000 + world_rank : world_rank == 1 ? 0 : (uint64_t)(5 * world_rank + 2);
    unsigned char *mine = malloc(n * esize + 1);
    for (uint64_t i = 0; i < n * esize; i++) mine[i] = (unsigned char)(world_rank * 31 + i);
    void *out;
    uint64_t total;
    rcs[2 * k] = gj_gather_ordered(w, &out, &total, mine, n, esize);
    rcs[2 * k + 1] = 0;
    if (world_rank == 0) {
      uint64_t want = 0;
      unsigned char *p = out;
      for (int r = 0; r < world_size; r++) {
        uint64_t nr = k ? GJ_CHUNK / 2 + 1000 + r : r == 1 ? 0 : (uint64_t)(5 * r + 2);
        for (uint64_t i = 0; i < nr * esize && p; i++) bad += p[want * esize + i] != (unsigned char)(r * 31 + i);
        want += nr;
      }
      rcs[2 * k + 1] = !out || total != want;
    } else {
      rcs[2 * k + 1] = out != NULL || total != 0;
    }
    free(out), free(mine);
  }
  gj_grid g; /* TP 1: its TP group is this rank alone */
  ck_assert_int_eq(gj_grid_init(&g, 1), 0);
  int32_t one[3] = {4, -5, 6};
  void *out;
  uint64_t total;
  rcs[2 * rounds] = gj_gather_ordered(g.tp, &out, &total, one, 3, sizeof one[0]);
  ck_assert_ptr_nonnull(out);
  ck_assert(total == 3 && !memcmp(out, one, sizeof one));
  free(out);
  rcs[2 * rounds] |= gj_gather_ordered(g.tp, &out, &total, NULL, 0, 8);
  ck_assert_ptr_nonnull(out);
  ck_assert(total == 0);
  free(out);
  gj_grid_free(&g);
  for (int i = 0; i < 2 * rounds + 1; i++) ck_assert_int_eq(rcs[i], 0);
  ck_assert_int_eq(bad, 0);
}
END_TEST

/* A DP case's outcome on every rank, asserted by rank 0: no call failed (rcs: this rank's
 * failed calls), no float wrong (bad: this rank's wrong floats). */
static void dp_verdict(int rcs, int bad, int tp, const char *what) {
  int fails[2] = {rcs != 0, bad};
  MPI_Allreduce(MPI_IN_PLACE, fails, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  ck_assert_int_eq(fails[0], 0);
  ck_assert_msg(fails[1] == 0, "tp %d: %d floats %s", tp, fails[1], what);
}

/* ZeRO-1's all-gather of the updated parameters: every float holds its owner's value, whatever
 * the pieces (a bucket of 7 floats, ranges of 23: pieces cut at the ranges' ends), at DP = the
 * world and, on 4 ranks, at DP 2 twice at once (TP 2); twice in a row. */
START_TEST(test_dp_gather) {
  int tps[2] = {1, world_size == 4 ? 2 : 0};
  for (int ti = 0; ti < 2; ti++) {
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    const size_t P = 23, n = P * (size_t)g.dp_size;
    float *buf = malloc(n * sizeof(float)), *grads = calloc(n, sizeof(float));
    gj_dp_sync s;
    ck_assert_int_eq(gj_dp_init(&s, &g, grads, n, NULL, 0, 7, 0), 0);
    int bad = 0, rcs = 0;
    for (int round = 0; round < 2; round++) {
      const float tag = (float)(1000 * (round + 1) + 100 * g.tp_rank);
      for (size_t i = 0; i < n; i++) buf[i] = i / P == (size_t)g.dp_rank ? tag + (float)i : -1.0f;
      rcs |= gj_dp_allgather(&s, buf, P);
      for (size_t i = 0; i < n; i++) bad += buf[i] != tag + (float)i;
    }
    gj_dp_free(&s);
    free(buf), free(grads);
    gj_grid_free(&g);
    dp_verdict(rcs, bad, tps[ti], "not their owner's after the all-gather");
  }
}
END_TEST

/* ZeRO-1's all-gather with the GEMM weights in bf16 (gj_dp_gather16) in pieces of at most 7
 * floats, cut at the ranges' ends and at the tensors' (a model of 1 layer, D 16), at DP = the
 * world and, on 4 ranks, TP 2: each rank's own range untouched, every other float its owner's,
 * the GEMM weights' as their bf16 values; twice in a row (the staging is the gradient block). */
START_TEST(test_dp_gather16) {
  int tps[2] = {1, world_size == 4 ? 2 : 0};
  gj_config c;
  gj_config_preset(&c, "tiny");
  c.vocab_size = 10, c.n_layer = 1, c.n_embd = 16, c.n_head = 2, c.rotary_dim = 4, c.n_inner = 32;
  for (int ti = 0; ti < 2; ti++) {
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    gj_layout l;
    ck_assert_int_eq(gj_layout_build(&l, &c, g.tp_size, g.tp_rank), 0);
    size_t n, P;
    gj_state_sizes(l.numel, g.dp_size, 1, &n, &P);
    unsigned char *w16 = calloc(n, 1);
    for (int i = 0; i < l.n; i++)
      if (gj_tensor_has_w16(&l.t[i])) memset(w16 + l.t[i].offset, 1, l.t[i].numel);
    float *buf = malloc(n * sizeof(float)), *grads = calloc(n, sizeof(float));
    gj_dp_sync s;
    ck_assert_int_eq(gj_dp_init(&s, &g, grads, n, NULL, 0, 7, 0), 0);
    ck_assert_int_eq(gj_dp_gather16(&s, &l), 0);
    ck_assert_uint_gt(s.g16n, 0);
    int bad = 0, rcs = 0, h = 0;
    for (int round = 0; round < 2; round++) {
      const float tag = (float)(1000 * (round + 1) + 100 * g.tp_rank);
      /* values no bfloat16 holds: the rounding shows */
      for (size_t i = 0; i < n; i++) buf[i] = i / P == (size_t)g.dp_rank ? tag + (float)i + 1.0f / 3 : -1.0f;
      rcs |= gj_dp_allgather(&s, buf, P);
      for (size_t i = 0; i < n; i++) {
        const float v = tag + (float)i + 1.0f / 3;
        gj_bf16 r;
        gj_bf16_round(&r, &v, 1);
        const int other16 = w16[i] && i / P != (size_t)g.dp_rank;
        bad += buf[i] != (other16 ? gj_bf16_to_f32(r) : v), h += other16;
      }
    }
    ck_assert(h > 0);
    gj_dp_free(&s);
    free(buf), free(grads), free(w16);
    gj_layout_free(&l);
    gj_grid_free(&g);
    dp_verdict(rcs, bad, tps[ti], "not their owner's (or its bf16 value) after the bf16 all-gather");
  }
}
END_TEST

/* The parts a DP test's backward reports (1 to 40 floats), top down, then the finish: one
 * step of the bucketed sum over DP_N floats (ZeRO-1's ranges at DP 2 and 4: 36 and 18). */
enum { DP_N = 72 };
static const size_t dp_bound[] = {0, 1, 4, 9, 22, 62, 63, DP_N};
enum { DP_PARTS = sizeof dp_bound / sizeof *dp_bound - 1 };

static int dp_step(gj_dp_sync *s, float *grads) {
  static int steps; /* with the thread: every other step's parts 50 us apart */
  const int paced = steps++ % 2;
  int rc = 0;
  gj_dp_begin(s);
  for (int k = DP_PARTS - 1; k >= 0; k--) {
    rc |= gj_dp_ready(s, dp_bound[k], dp_bound[k + 1], grads + dp_bound[k]);
    if (s->th_made && paced) usleep(50); /* a part's backward: the thread tests meanwhile */
  }
  return rc | gj_dp_finish(s);
}

/* The DP gradient sum (gj_dp_ready as backward reports its parts, top down, then
 * gj_dp_finish): every float is the exact sum over the DP ranks (integer values), on every rank,
 * whatever the pieces: buckets of 7 floats and parts of 1 to 40 floats, so that pieces shorter
 * than the ranks (which libnbc's Rabenseifner algorithm, gj_comm_before_init, hands to its ring)
 * and pieces joined across parts are summed too. At DP = the world and, on 4 ranks, at DP 2
 * twice at once (TP 2); two steps in a row (libnbc may reuse a schedule). Then again with the
 * progress thread testing the buckets (a microsecond's sleep between tests), 200 steps, parts
 * reported at once or 50 us apart: its races with the posts and the finish would show as a
 * wrong sum, a hang or a crash. It must have tested, and at least once on some rank found
 * every request posted so far complete (MPI_Testall's flag: requests it completed itself). */
START_TEST(test_dp_sum) {
  int tps[2] = {1, world_size == 4 ? 2 : 0};
  const size_t n = DP_N;
  int provided;
  MPI_Query_thread(&provided);
  ck_assert_int_eq(provided, MPI_THREAD_MULTIPLE);
  for (int run = 0; run < 4; run++) {
    const int ti = run % 2, polled = run / 2;
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    float *grads = malloc(n * sizeof(float));
    gj_dp_sync s;
    ck_assert_int_eq(gj_dp_init(&s, &g, grads, n, NULL, 0, 7, 0), 0);
    int on = -1;
    const int rcs_init = gj_dp_progress(&s, polled, &on);
    const double rsum = g.dp_size * (g.dp_size + 1) / 2.0; /* sum of (dp_rank + 1) */
    int bad = 0, rcs = 0;
    for (int step = 0; step < (polled ? 200 : 2); step++) {
      const float base = (float)(100 * step + 1000 * g.tp_rank);
      for (size_t i = 0; i < n; i++) grads[i] = (base + (float)i) * (float)(g.dp_rank + 1);
      rcs |= dp_step(&s, grads);
      for (size_t i = 0; i < n; i++) bad += grads[i] != (float)((base + (double)i) * rsum);
    }
    gj_dp_free(&s); /* the thread stopped before any assertion can leave the test */
    long counts[2] = {s.polls, s.polled_done};
    free(grads);
    gj_grid_free(&g);
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    ck_assert_int_eq(rcs_init, 0);
    ck_assert_int_eq(on, polled);
    if (polled) ck_assert_msg(counts[0] > 0 && counts[1] > 0, "the thread tested %ld times, completed %ld", counts[0], counts[1]);
    dp_verdict(rcs, bad, tps[ti], polled ? "not the DP sum (progress thread)" : "not the DP sum");
  }
}
END_TEST

/* A gradient value of rank r for element i at a step: sign, 24 mantissa bits and an exponent
 * in [-12, 11] from a hash, so that the values are (but for a 2^-16 chance) not bfloat16 and
 * the sums carry and cancel. */
static float dp_val(size_t i, int r, int step) {
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 1) * 2246822519u ^ (uint32_t)step * 3266489917u;
  h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
  float m = 1.0f + (float)(h & 0xffffff) / 16777216.0f;
  return ldexpf(h >> 31 ? -m : m, (int)((h >> 24) % 24) - 12);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* got is the bf16 DP reduction's sum of dp_val(i, r, vstep) over the p ranks r (f32: the
 * float32 sum of the unrounded values, as the embedding's): a bfloat16 value unless f32; at
 * DP 2 the two rounded terms' float32 sum, rounded, exactly (the reduction's definition,
 * whichever rank adds); at any DP within (p - 1) u of the sum of the terms' magnitudes (one
 * rounding per addition, u = 2^-8 for bfloat16's 8 significant bits, 2^-24 in float32). */
static int dp_sum16_ok(float got, size_t i, int p, int vstep, int f32) {
  float t[4] = {0};
  double exact = 0, mag = 0;
  for (int r = 0; r < p; r++) {
    const float v = dp_val(i, r, vstep);
    t[r & 3] = f32 ? v : gj_bf16_rounded(v);
    exact += t[r & 3], mag += fabs(t[r & 3]);
  }
  if (!f32 && (f32_bits(got) & 0xffffu) != 0) return 0;
  if (p == 2) return f32_bits(got) == f32_bits(f32 ? t[0] + t[1] : gj_bf16_rounded(t[0] + t[1]));
  return fabs(got - exact) <= 1.001 * (p - 1) * mag / (f32 ? 16777216.0 : 256.0);
}

/* --grad-reduce bf16: the DP sum travels in bfloat16 (each rank's gradient rounded to it,
 * every partial sum rounded to it), through both doors (gj_dp_ready/gj_dp_finish as backward
 * reports its parts, and gj_dp_sum, the optimizer in backward's), on buckets of 7 floats and the
 * parts of test_dp_sum. Every result is a bfloat16 value, the same bits on every rank, and:
 * at DP 2, bf16(bf16(a) + bf16(b)) exactly (the sum of the two in float32, rounded: the
 * reduction's definition, whichever rank adds); at any DP within (DP - 1) u of the sum of the
 * rounded terms' magnitudes (one rounding per addition, u = 2^-8 for bfloat16's 8 significant
 * bits). A NaN on one rank is NaN everywhere, an infinity stays infinite, x and -x cancel to 0.
 * With the embedding's range given (its first 10 floats, not a whole number of buckets, held
 * whole as under the optimizer in backward), that range is summed in float32 (at DP 2 a + b
 * exactly, else within (DP - 1) 2^-24 of the magnitudes) and the rest in bf16. With the
 * embedding's range the progress thread tests the buckets (a microsecond's sleep between tests). */
START_TEST(test_dp_sum_bf16) {
  int tps[2] = {1, world_size == 4 ? 2 : 0};
  const size_t n = DP_N;
  enum { NAN_AT = 5, INF_AT = 6, ZERO_AT = 7, CANCEL_AT = 8 };
  for (int run = 0; run < 4; run++) {
    const int ti = run / 2;
    const size_t emb = run % 2 ? 10 : 0;
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    const int p = g.dp_size;
    float *grads = malloc(n * sizeof(float));
    uint32_t *lo = malloc(n * sizeof(uint32_t)), *hi = malloc(n * sizeof(uint32_t));
    gj_dp_sync s;
    ck_assert_int_eq(gj_dp_init(&s, &g, grads, n, NULL, emb, 7, 1), 0);
    int on;
    int bad = 0, rcs = gj_dp_progress(&s, emb ? 1 : 0, &on);
    bad += on != (emb != 0); /* checked after the free, with the sums */
    for (int step = 0; step < 4; step++) {
      const int blocking = step >= 2;
      for (size_t i = 0; i < n; i++) grads[i] = dp_val(i, g.dp_rank, step + 10 * g.tp_rank);
      if (g.dp_rank == 0) grads[NAN_AT] = NAN, grads[INF_AT] = INFINITY;
      grads[ZERO_AT] = 0;
      grads[CANCEL_AT] = g.dp_rank % 2 ? -dp_val(CANCEL_AT, 0, step) : dp_val(CANCEL_AT, 0, step);
      if (blocking) {
        rcs |= gj_dp_sum(&s, grads, 0, 3); /* pieces: one within the embedding, one across it */
        rcs |= gj_dp_sum(&s, grads + 3, 3, n - 3);
      } else {
        rcs |= dp_step(&s, grads);
      }
      for (size_t i = 0; i < n; i++) {
        const int f32 = i < emb;
        const float got = grads[i];
        int ok;
        if (i == NAN_AT) ok = isnan(got);
        else if (i == INF_AT) ok = isinf(got) && got > 0;
        else if (i == ZERO_AT || (i == CANCEL_AT && p % 2 == 0)) ok = got == 0;
        else if (i == CANCEL_AT) ok = (f32 || (f32_bits(got) & 0xffffu) == 0) && isfinite(got);
        else ok = dp_sum16_ok(got, i, p, step + 10 * g.tp_rank, f32);
        bad += !ok;
        lo[i] = hi[i] = f32_bits(got);
      }
      /* the same bits on every rank of the DP group */
      MPI_Allreduce(MPI_IN_PLACE, lo, (int)n, MPI_UINT32_T, MPI_MIN, g.dp);
      MPI_Allreduce(MPI_IN_PLACE, hi, (int)n, MPI_UINT32_T, MPI_MAX, g.dp);
      for (size_t i = 0; i < n; i++) bad += lo[i] != hi[i];
    }
    gj_dp_free(&s);
    free(grads), free(lo), free(hi);
    gj_grid_free(&g);
    dp_verdict(rcs, bad, tps[ti], emb ? "not the DP sum (float32 below 10, bf16 above)" : "not the bf16 DP sum");
  }
}
END_TEST

/* --zero-reduce owner (gj_dp_reduce_to_owners): with ZeRO-1's ranges of P = DP_N / DP floats,
 * each rank ends with the DP sum of its own range, as backward reports its parts (buckets of 7
 * floats, parts of 1 to 40: the ranges' ends, 18, 36 and 54, fall inside buckets and parts):
 * in float32 the exact sum (integer values); in bf16 (--grad-reduce bf16, the first 10 floats
 * the embedding's, summed in float32) at DP 2 bf16(bf16(a) + bf16(b)) exactly (a + b below 10),
 * at DP 4 within test_dp_sum_bf16's bound. In float32 every float outside the range is this
 * rank's own gradient still: the sums went to their owners only (an all-reduce would have
 * summed them). At DP = the world and, on 4 ranks, TP 2 (DP 2 twice at once); with and without
 * the progress thread (20 steps, parts at once or 50 us apart; else 2 steps). */
START_TEST(test_dp_reduce_owner) {
  int tps[2] = {1, world_size == 4 ? 2 : 0};
  const size_t n = DP_N;
  for (int run = 0; run < 8; run++) {
    const int ti = run % 2, polled = run / 2 % 2, bf16 = run / 4;
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    const int p = g.dp_size;
    const size_t P = n / (size_t)p, emb = bf16 ? 10 : 0, lo = (size_t)g.dp_rank * P, hi = lo + P;
    ck_assert_uint_eq(P * (size_t)p, n);
    float *grads = malloc(n * sizeof(float));
    gj_dp_sync s;
    ck_assert_int_eq(gj_dp_init(&s, &g, grads, n, NULL, emb, 7, bf16), 0);
    int rcs = gj_dp_reduce_to_owners(&s, P), on = -1;
    rcs |= gj_dp_progress(&s, polled, &on);
    int bad = on != polled, theirs = 0;
    const double rsum = p * (p + 1) / 2.0;
    for (int step = 0; step < (polled ? 20 : 2); step++) {
      const float base = (float)(100 * step + 1000 * g.tp_rank);
      for (size_t i = 0; i < n; i++)
        grads[i] = bf16 ? dp_val(i, g.dp_rank, step + 10 * g.tp_rank) : (base + (float)i) * (float)(g.dp_rank + 1);
      rcs |= dp_step(&s, grads);
      for (size_t i = 0; i < n; i++) {
        const float got = grads[i];
        if (i < lo || i >= hi) { /* not this rank's range */
          if (!bf16) bad += got != (base + (float)i) * (float)(g.dp_rank + 1), theirs++;
          continue;
        }
        if (!bf16) {
          bad += got != (float)((base + (double)i) * rsum);
          continue;
        }
        bad += !dp_sum16_ok(got, i, p, step + 10 * g.tp_rank, i < emb);
      }
    }
    gj_dp_free(&s);
    free(grads);
    gj_grid_free(&g);
    ck_assert(bf16 || theirs > 0);
    dp_verdict(rcs, bad, tps[ti], bf16 ? "not the bf16 DP sum in the owner's range (or not the rank's own outside it)"
                                        : "not the DP sum in the owner's range (or not the rank's own outside it)");
  }
}
END_TEST

/* The vocab all-gather equals the column gather onto tp rank 0 and the known row, at TP = the
 * world and, on 4 ranks, at TP 2 (two groups gathering at once); at TP 1 it is a copy. V is
 * 37 tp + tp - 1: TP does not divide it, the first tp - 1 ranks hold 38 entries, the last 37. */
START_TEST(test_allgather_vocab) {
  int tps[3] = {world_size, world_size % 2 == 0 && world_size > 2 ? 2 : 0, 1};
  for (int ti = 0; ti < 3; ti++) {
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    const int64_t V = 37 * g.tp_size + g.tp_size - 1;
    int64_t v0, Vl = gj_split(V, g.tp_size, g.tp_rank, &v0);
    ck_assert_int_eq(Vl, 37 + (g.tp_rank < g.tp_size - 1));
    float *local = malloc(Vl * sizeof(float)), *full = malloc(V * sizeof(float)), *ref = malloc(V * sizeof(float));
    for (int64_t j = 0; j < Vl; j++) local[j] = 0.5f * (float)(v0 + j) + 1000.0f * g.dp_rank;
    int rc = gj_tp_allgather_vocab(&g, full, local, V);
    int rc2 = gj_tp_gather_cols(&g, ref, local, 1, V);
    int bad = 0;
    for (int64_t j = 0; j < V; j++) {
      bad += full[j] != 0.5f * (float)j + 1000.0f * g.dp_rank;
      if (g.tp_rank == 0) bad += full[j] != ref[j];
    }
    free(local), free(full), free(ref);
    gj_grid_free(&g);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(rc2, 0);
    ck_assert_int_eq(bad, 0);
  }
}
END_TEST

/* The largest value wins; equal largest values: the smallest index, whichever rank holds it. */
START_TEST(test_tp_argmax) {
  int tps[2] = {world_size, world_size % 2 == 0 && world_size > 2 ? 2 : 0};
  for (int ti = 0; ti < 2; ti++) {
    if (!tps[ti]) continue;
    gj_grid g;
    ck_assert_int_eq(gj_grid_init(&g, tps[ti]), 0);
    /* a tie over the group; the smallest index is on its last rank */
    float v = 1.0f + g.dp_rank;
    int64_t idx = 100 + 10 * (g.tp_size - 1 - g.tp_rank) + g.dp_rank;
    int rc = gj_tp_argmax(&g, &v, &idx);
    /* tp rank 0 holds the smallest index but not the largest value */
    float v2 = g.tp_rank == 0 ? 0.5f : 2.0f;
    int64_t idx2 = g.tp_rank == 0 ? 5 : 50 + g.tp_rank;
    int rc2 = gj_tp_argmax(&g, &v2, &idx2);
    gj_grid_free(&g);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(rc2, 0);
    ck_assert(v == 1.0f + g.dp_rank);
    ck_assert_int_eq(idx, 100 + g.dp_rank);
    if (g.tp_size > 1) {
      ck_assert(v2 == 2.0f);
      ck_assert_int_eq(idx2, 51);
    }
  }
}
END_TEST

/* Before each test: float32 on OpenBLAS, whatever a test that failed half-way left set (the
 * tests run in one process: CK_NOFORK). */
static void gemm_default(void) {
  if (gj_gemm_setup(GJ_GEMM_OPENBLAS, GJ_PREC_F32)) ck_abort_msg("gj_gemm_setup: %s", gj_errmsg());
  gj_dp_test_gather_f32(0); /* whatever a failed test left */
  steps_mode = GJ_TRAIN;
}

int main(int argc, char **argv) {
  gj_comm_before_init(); /* the MPI settings gptj runs with */
  int provided; /* as gptj's main: the DP progress thread's */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  Suite *s = suite_create("mpi");
  TCase *tc = tcase_create("mpi");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, gemm_default, NULL);
  tcase_add_test(tc, test_allreduce_count);
  tcase_add_test(tc, test_eval_matches_loop);
  tcase_add_test(tc, test_plan_sizes);
  tcase_add_test(tc, test_decode_cache16);
  tcase_add_test(tc, test_bf16_copies);
  tcase_add_test(tc, test_blocked_head);
  tcase_add_test(tc, test_late_head);
  tcase_add_test(tc, test_late_head_steps);
  tcase_add_test(tc, test_zero_gather16);
  tcase_add_test(tc, test_train_step_layouts);
  tcase_add_test(tc, test_huge_gradient_tp);
  tcase_add_test(tc, test_embedding_rows);
  tcase_add_test(tc, test_embedding_rows_memory);
  tcase_add_test(tc, test_bcast_large);
  tcase_add_test(tc, test_reductions);
  tcase_add_test(tc, test_node_size);
  tcase_add_test(tc, test_agree);
  tcase_add_test(tc, test_gather_ordered);
  tcase_add_test(tc, test_allgather_vocab);
  tcase_add_test(tc, test_dp_gather);
  tcase_add_test(tc, test_dp_gather16);
  tcase_add_test(tc, test_dp_sum);
  tcase_add_test(tc, test_dp_sum_bf16);
  tcase_add_test(tc, test_dp_reduce_owner);
  tcase_add_test(tc, test_tp_argmax);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  if (world_rank != 0) srunner_set_log(sr, "/dev/null");
  srunner_run_all(sr, world_rank == 0 ? CK_NORMAL : CK_SILENT);
  int failed = srunner_ntests_failed(sr), any = 0, ran = srunner_ntests_run(sr);
  srunner_free(sr);
  const char *only = getenv("CK_RUN_CASE"); /* its one case is "mpi": another name runs nothing */
  if (only && *only && ran == 0) {
    if (world_rank == 0) fprintf(stderr, "CK_RUN_CASE=%s: this program has no case of that name, nothing ran\n", only);
    failed = 1;
  }
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
