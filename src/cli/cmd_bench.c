/* gptj bench: full training steps (forward, backward, DP reduction, AdamW) of a preset or
 * config on synthetic tokens, with a time breakdown, the achieved FLOP/s against the
 * hardware's peak (MFU), and the step's GEMM FLOP/s against the GEMM backend's own rate on
 * exactly the step's products, timed alone in the same process at the same thread count. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/gemmopts.h"
#include "cli/modelopts.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/outfile.h"
#include "model/flops.h"
#include "model/gemm.h"
#include "model/gptj.h"
#include "optim/adamw.h"
#include "parallel/dp.h"
#include "parallel/grid.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int gj_cmd_bench(int argc, char **argv) {
  int64_t B = 8, T = 256, steps = 3, warmup = 1, tp = 1, zero = 0, recompute = 0;
  const char *json = NULL, *gemm = "auto", *prec = "fp32";
  gj_opt table[] = {
      {"micro-batch", GJ_OPT_I64, &B, "sequences per rank per step", 1, 1 << 20},
      {"seq-len", GJ_OPT_I64, &T, "tokens per sequence", 1, 1 << 20},
      {"steps", GJ_OPT_I64, &steps, "measured steps (the median is reported)", 1, 1e6},
      {"warmup", GJ_OPT_I64, &warmup, "steps run before measuring", 0, 1e6},
      {"tp", GJ_OPT_I64, &tp, "tensor-parallel size (DP = ranks / TP)", 1, 4096},
      {"zero", GJ_OPT_I64, &zero, "1: ZeRO-1", 0, 1},
      {"recompute", GJ_OPT_I64, &recompute, "1: activation recomputation", 0, 1},
      {"precision", GJ_OPT_STR, &prec, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &gemm, GJ_GEMM_HELP, 1, 0},
      {"json", GJ_OPT_STR, &json, "also write the results as one JSON object to this file", 1, 0},
      {NULL}};
  gj_modelopts mo;
  int rc = gj_modelopts_parse(&mo, argc, argv, table, "gptj bench [--preset NAME] [options]",
                              "Times training steps on synthetic tokens. Reports MFU (model FLOP/s over the\n"
                              "hardware's peak for the precision, from a tight FMA / AMX loop on every thread)\n"
                              "and the GEMM efficiency (the step's GEMM FLOPs per second of step over the\n"
                              "backend's rate on exactly the step's products, each timed alone here at the\n"
                              "same thread count, OMP_NUM_THREADS).");
  if (rc) return rc > 0 ? 0 : rc;
  gj_config c = mo.config;
  if (T > c.n_positions) return GJ_FAIL("--seq-len %lld exceeds n_positions %lld", (long long)T, (long long)c.n_positions);
  if (json) GJ_TRY(gj_outfile_plan(&(gj_file_ref){"--json", json}, 1, NULL, 0)); /* before the work */
  gj_grid g;
  rc = gj_grid_init(&g, (int)tp);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  gj_log_set_rank(g.rank);
  GJ_TRY(gj_cli_gemm_setup(gemm, prec, g.world));
  const char *peak_how;
  double peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &peak_how);
  gj_mem_sizes ms;
  GJ_TRY(gj_model_sizes(&ms, &c, g.tp_size, g.dp_size, (int)zero, (int)recompute, 1, B, T, omp_get_max_threads()));
  GJ_TRY(gj_mem_check(MPI_COMM_WORLD, (double)ms.params + ms.grads + ms.moments + ms.acts + ms.w16,
                      "parameters, gradients, AdamW, activations and bf16 copies",
                      "use more ranks, --tp, --zero 1, --recompute 1 or a smaller --micro-batch", 0, NULL));
  gj_model m;
  rc = gj_model_create(&m, &c, &g, B, T, (int)zero, (int)recompute, 1);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  gj_params_init(&m.lay, &c, m.params, 1);
  gj_dp_sync dp;
  GJ_TRY(gj_dp_init(&dp, &g, m.grads, m.numel_pad, 0));
  int64_t N = B * T;
  int32_t *ids = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t));
  rc = ids && tg ? 0 : GJ_FAIL("out of memory for %lld token ids", (long long)N);
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  for (int64_t i = 0; i < N; i++)
    ids[i] = (int32_t)((i * 2654435761u + g.dp_rank * 97) % 50257), tg[i] = ids[(i + 1) % N];
  gj_adamw_hp hp;
  gj_adamw_defaults(&hp);
  double *st = calloc(steps, sizeof(double)), prof[GJ_PROF_N + 3] = {0};
  if (!st) return GJ_FAIL("out of memory"); /* a few doubles: never in practice */
  float scale = (float)(1.0 / ((double)N * g.dp_size));
  for (int64_t s = 0; s < warmup + steps && !rc; s++) {
    int measured = s >= warmup;
    memset(m.prof, 0, sizeof m.prof);
    m.profile = measured;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = gj_now(), ls;
    int64_t nv;
    gj_model_zero_grads(&m);
    gj_dp_begin(&dp);
    gj_gemm_record(s == 0);
    m.grad_ready = m.zero ? NULL : gj_dp_ready, m.grad_ready_ctx = &dp;
    rc = gj_model_forward_backward(&m, ids, tg, B, T, 0.0f, scale, &ls, &nv);
    m.grad_ready = NULL;
    gj_gemm_record(0);
    if (!rc) rc = m.zero ? gj_dp_reduce_scatter(&dp, m.zero_n) : gj_dp_finish(&dp);
    double t1 = gj_now();
    double sq = gj_grad_sumsq(&m.lay, m.grads, g.tp_rank, m.zero_lo, m.zero_n);
    if (!rc) rc = gj_allreduce_sum_f64(m.zero ? g.world : g.tp, &sq, 1);
    if (!rc) gj_adamw_update(&m.lay, m.params, m.grads, m.m, m.v, m.zero_lo, m.zero_n, &hp, s + 1,
                             1e-4, gj_clip_coef(sqrt(sq), 1.0));
    if (!rc && m.zero) rc = gj_dp_allgather(&dp, m.params, m.zero_n);
    gj_model_weights_changed(&m);
    double t2 = gj_now();
    if (measured) {
      st[s - warmup] = t2 - t0;
      for (int k = 0; k < GJ_PROF_N; k++) prof[k] += m.prof[k] / steps;
      prof[GJ_PROF_N] += dp.wait_s / steps;   /* exposed DP wait */
      prof[GJ_PROF_N + 1] += (t2 - t1) / steps; /* optimizer (norm, AdamW, ZeRO gather) */
    }
  }
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  qsort(st, steps, sizeof(double), cmp_double);
  double step = st[steps / 2];
  double tokens = (double)N * g.dp_size, tps = tokens / step;
  double flops_rank = gj_flops_per_token(&c, T) * tps / g.size;
  /* peak memory before the GEMM probe allocates its operands */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double rss = ru.ru_maxrss * 1024.0, rss_max = rss;
  MPI_Allreduce(MPI_IN_PLACE, &rss_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double gemm_flops = gj_gemm_recorded_flops(), gemm_rate = gj_gemm_recorded_rate(0.3);
  double mfu = peak > 0 ? flops_rank / peak : 0;
  double geff = gemm_rate > 0 ? gemm_flops / step / gemm_rate : 0;
  /* the breakdown is a mean over the measured steps: compare it with the mean step */
  double mean = 0;
  for (int64_t k = 0; k < steps; k++) mean += st[k] / steps;
  double other = mean;
  for (int k = 0; k < GJ_PROF_N + 2; k++) other -= prof[k];
  const char *names[] = {"gemm", "attention", "norms_elementwise", "embedding_lmhead_loss",
                         "tp_collectives", "dp_wait_exposed", "optimizer"};
  gj_info("bench: %s%s, B %lld, T %lld, DP %d x TP %d, %d threads per rank, ZeRO %lld, recompute %lld",
          mo.config_file ? mo.config_file : mo.preset, mo.config_file ? "" : " (preset)", (long long)B,
          (long long)T, g.dp_size, g.tp_size, omp_get_max_threads(), (long long)zero, (long long)recompute);
  gj_info("GEMM: %s", gj_gemm_describe());
  gj_info("step %.3f s (median of %lld; min %.3f, max %.3f) | %.1f tokens/s", step, (long long)steps,
          st[0], st[steps - 1], tps);
  gj_info("time per step (mean %.3f s):", mean);
  for (int k = 0; k < GJ_PROF_N + 2; k++)
    gj_info("  %-24s %8.3f s  %5.1f%%", names[k], prof[k], 100 * prof[k] / mean);
  gj_info("  %-24s %8.3f s  %5.1f%%", "other", other, 100 * other / mean);
  gj_info("achieved %.2f GFLOP/s per rank (model FLOPs) | peak %.2f GFLOP/s (%s, %d threads) | MFU %.1f%%",
          flops_rank / 1e9, peak / 1e9, peak_how, omp_get_max_threads(), 100 * mfu);
  gj_info("GEMM: %.3f GFLOP per step at %.2f GFLOP/s of step time | the backend on the step's products alone %.2f GFLOP/s | GEMM efficiency %.1f%%",
          gemm_flops / 1e9, gemm_flops / step / 1e9, gemm_rate / 1e9, 100 * geff);
  gj_info("peak RSS per rank: %.0f MB (max over ranks)", rss_max / 1e6);
  rc = 0;
  if (json && g.rank == 0) { /* under a temporary name, synced, renamed */
    gj_outfile of;
    GJ_TRY(gj_outfile_begin(&of, json));
    FILE *f = fopen(of.tmp, "w");
    if (!f) return gj_outfile_abort(&of), GJ_FAIL("--json %s: cannot write", json);
    fprintf(f, "{\"preset\": \"%s\", \"micro_batch\": %lld, \"seq_len\": %lld, \"dp\": %d, \"tp\": %d, "
            "\"threads\": %d, \"zero\": %lld, \"recompute\": %lld, \"precision\": \"%s\", \"gemm\": \"%s\", "
            "\"blas_core\": \"%s\", \"step_s\": %.6f, \"tokens_per_s\": %.3f, ",
            mo.preset, (long long)B, (long long)T, g.dp_size, g.tp_size, omp_get_max_threads(),
            (long long)zero, (long long)recompute, gj_precision_name(gj_gemm_precision()),
            gj_gemm_describe(), gj_blas_core(), step, tps);
    fprintf(f, "\"breakdown_s\": {");
    for (int k = 0; k < GJ_PROF_N + 2; k++) fprintf(f, "\"%s\": %.6f, ", names[k], prof[k]);
    fprintf(f, "\"other\": %.6f}, \"flops_per_s_per_rank\": %.6g, \"peak_flops_per_s\": %.6g, "
            "\"peak_how\": \"%s\", \"mfu\": %.4f, \"gemm_flops_per_step\": %.6g, "
            "\"gemm_backend_flops_per_s\": %.6g, \"gemm_eff\": %.4f, \"peak_rss_bytes\": %.0f}\n",
            other, flops_rank, peak, peak_how, mfu, gemm_flops, gemm_rate, geff, rss_max);
    if (fclose(f)) rc = GJ_FAIL("--json %s: write failed", json), gj_outfile_abort(&of);
    else rc = gj_outfile_commit(&of);
  }
  if ((rc = gj_agree(MPI_COMM_WORLD, rc))) return rc;
  free(ids), free(tg), free(st);
  gj_dp_free(&dp);
  gj_model_free(&m);
  gj_grid_free(&g);
  return 0;
}
