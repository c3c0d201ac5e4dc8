#include "model/flops.h"

#include <stdlib.h>

#include "common.h"
#include "model/gemm.h"
#include "model/gptj.h"

double gj_flops_per_token(const gj_config *c, int64_t T) {
  double N = (double)gj_config_n_params(c) - (double)c->vocab_size * c->n_embd;
  return 6.0 * N + 12.0 * c->n_layer * c->n_embd * (double)T;
}

double gj_sgemm_rate(int64_t M, int64_t N, int64_t K, double min_seconds) {
  float *a = gj_alloc(M * K * sizeof(float)), *b = gj_alloc(N * K * sizeof(float));
  float *c = gj_alloc(M * N * sizeof(float));
  if (!a || !b || !c) return free(a), free(b), free(c), 0.0;
  for (int64_t i = 0; i < M * K; i++) a[i] = (float)((i % 7) - 3) * 0.01f;
  for (int64_t i = 0; i < N * K; i++) b[i] = (float)((i % 5) - 2) * 0.01f;
  double best = 0, spent = 0;
  for (int rep = 0; rep < 50 && (rep < 3 || spent < min_seconds); rep++) {
    double t0 = gj_now();
    gj_gemm(0, 1, M, N, K, 1.0f, a, NULL, K, b, NULL, K, 0.0f, c, N);
    double dt = gj_now() - t0;
    spent += dt;
    double r = 2.0 * M * N * K / dt;
    if (rep > 0 && r > best) best = r; /* the first call warms up */
  }
  free(a), free(b), free(c);
  return best;
}

double gj_sgemm_model_rate(const gj_config *c, int64_t N, int tp, double sec) {
  int64_t D = c->n_embd, Dl = D / tp, Fl = c->n_inner / tp;
  int64_t Vl = gj_split(c->vocab_size, tp, 0, NULL); /* the largest vocabulary shard, rank 0's */
  struct { int64_t M, Nn, K; double count; } sh[] = {
      {N, Dl, D, 3.0 * c->n_layer}, {N, D, Dl, (double)c->n_layer}, {N, Fl, D, (double)c->n_layer},
      {N, D, Fl, (double)c->n_layer}, {N, Vl, D, 1.0}};
  double flops = 0, time = 0;
  for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
    double f = 2.0 * sh[i].M * sh[i].Nn * sh[i].K * sh[i].count;
    double r = gj_sgemm_rate(sh[i].M, sh[i].Nn, sh[i].K, sec);
    if (r <= 0) return 0;
    flops += f, time += f / r;
  }
  return flops / time;
}

/* A linear of n rows from in to out features: its three products (forward, the input's and the
 * weight's gradients) each read and write n in + in out + n out floats. */
static double lin(double n, double in, double out) { return n * in + in * out + n * out; }

double gj_probe_bytes_estimate(const gj_config *c, int tp, int64_t N, int late_head, int bf16) {
  const double D = (double)c->n_embd, Dl = (double)(c->n_head / tp) * gj_config_head_dim(c);
  const double Fl = (double)(c->n_inner / tp), Vl = (double)gj_split(c->vocab_size, tp, 0, NULL);
  const double n = (double)N, R = (double)GJ_MIN(N, GJ_HEAD_ROWS);
  double f = GJ_MAX(GJ_MAX(lin(n, D, Dl), lin(n, Dl, D)), GJ_MAX(lin(n, D, Fl), lin(n, Fl, D)));
  f = GJ_MAX(f, lin(R, D, Vl) + Vl); /* the head's blocks, with the bias row */
  if (late_head) f = GJ_MAX(f, lin(n, D, Vl));
  /* in bf16 the inputs' copies too: at most the floats' count */
  return f * (sizeof(float) + (bf16 ? sizeof(gj_bf16) : 0));
}
