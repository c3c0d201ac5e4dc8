/* gptj plan: memory per rank, FLOPs and bytes sent per step, and a step-time estimate for a
 * config and layout, before anything is allocated. gptj train uses the same arithmetic
 * (gj_model_sizes) to refuse a layout that does not fit. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/gemmopts.h"
#include "cli/modelopts.h"
#include "common.h"
#include "model/flops.h"
#include "model/gptj.h"
#include "model/state.h"
#include "parallel/dp.h"
#include "train/step.h"

/* Bytes one rank sends per step in ring all-reduces (2 (p-1)/p of the data). */
static double ring(double bytes, int p) { return p > 1 ? 2.0 * (p - 1) / p * bytes : 0.0; }

/* Memory bandwidth of one rank on `threads` threads, bytes/s: the best of a few passes of
 * a[i] += s b[i] (2 reads, 1 write per float) over 2 x 64 MB, touched first. */
static double mem_rate(int threads) {
  size_t n = (size_t)16 << 20;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  double best = 0;
  if (a && b) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = b[i] = 1.0f;
    for (int pass = 0; pass < 5; pass++) {
      double t0 = gj_now();
#pragma omp parallel for num_threads(threads) schedule(static)
      for (size_t i = 0; i < n; i++) a[i] += 1e-7f * b[i];
      double dt = gj_now() - t0;
      if (dt > 0 && 3.0 * n * sizeof *a / dt > best) best = 3.0 * n * sizeof *a / dt;
    }
    if (a[n / 2] < 0) best = 0; /* keeps the loop */
  }
  free(a);
  free(b);
  return best;
}

int gj_cmd_plan(int argc, char **argv) {
  int64_t B = 1, T = 0, A = 1, dp = 1, tp = 1, zero = 0, recompute = 0, oib = 0, rpn = 0, threads = 0;
  double sgemm_g = 0, net = 10, tpnet = 50, mem_gb = 0, mem_g = 0;
  const char *prec = "fp32", *gemm = "auto", *grad_reduce = "fp32", *zero_reduce = "allreduce";
  gj_opt table[] = {
      {"precision", GJ_OPT_STR, &prec, GJ_PRECISION_HELP "; the activations are sized and the GEMM rate measured for it", 1, 0},
      {"gemm", GJ_OPT_STR, &gemm, GJ_GEMM_HELP, 1, 0},
      {"micro-batch", GJ_OPT_I64, &B, "sequences per rank per micro-batch", 1, 1 << 20},
      {"seq-len", GJ_OPT_I64, &T, "tokens per sequence (0: n_positions)", 0, 1 << 20},
      {"grad-accum", GJ_OPT_I64, &A, "micro-batches per step", 1, 1 << 20},
      {"dp", GJ_OPT_I64, &dp, "data-parallel size", 1, 1 << 24},
      {"tp", GJ_OPT_I64, &tp, "tensor-parallel size", 1, 4096},
      {"zero", GJ_OPT_I64, &zero, "1: ZeRO-1 (AdamW moments over DP; the updated parameters all-gathered after "
       "the update, not overlapped; in bf16 the GEMM weights as bf16)", 0, 1},
      {"zero-reduce", GJ_OPT_STR, &zero_reduce, GJ_ZERO_REDUCE_HELP, 1, 0},
      {"grad-reduce", GJ_OPT_STR, &grad_reduce, GJ_GRAD_REDUCE_HELP, 1, 0},
      {"recompute", GJ_OPT_I64, &recompute, "1: activation recomputation", 0, 1},
      {"optimizer-in-backward", GJ_OPT_I64, &oib, "1: AdamW part by part in backward (one part's gradients "
       "resident with --grad-accum 1; the DP reduction is then not overlapped)", 0, 1},
      {"threads", GJ_OPT_I64, &threads, "threads per rank (0: OMP_NUM_THREADS)", 0, 4096},
      {"sgemm-gflops", GJ_OPT_F64, &sgemm_g, "GEMM GFLOP/s of one rank (0: measure here on the model's shapes, in --precision on --gemm; "
       "given, bf16 on a CPU without bf16 hardware is planned for oneDNN on one that has it)", 0, 1e9},
      {"net-gbps", GJ_OPT_F64, &net, "network bandwidth per rank between nodes, GB/s (DP)", 1e-3, 1e6},
      {"tp-gbps", GJ_OPT_F64, &tpnet, "bandwidth per rank within a node, GB/s (TP)", 1e-3, 1e6},
      {"mem-gbps", GJ_OPT_F64, &mem_g, "memory bandwidth of one rank, GB/s, for the optimizer (0: measure here)", 0, 1e6},
      {"mem-per-rank-gb", GJ_OPT_F64, &mem_gb, "memory per rank, GB (0: this machine's available memory, as "
       "train's check takes it (MemAvailable, or the cgroup limit), / --ranks-per-node)", 0, 1e9},
      {"ranks-per-node", GJ_OPT_I64, &rpn, "ranks per node: the memory per rank is the node's over them, and a "
       "wider TP group spans nodes, its traffic at --net-gbps (0: one rank, TP within a node)", 0, 4096},
      {NULL}};
  gj_modelopts mo;
  int rc = gj_modelopts_parse(&mo, argc, argv, table, "gptj plan [--preset NAME] [options]",
                              "Memory per rank, FLOPs and bytes sent per step, and a step-time estimate\n"
                              "for a model and a DP x TP layout, computed without allocating the model.");
  if (rc) return rc > 0 ? 0 : rc;
  gj_config c = mo.config;
  gj_gemm_backend gb;
  gj_precision gp;
  GJ_TRY(gj_cli_gemm_parse(gemm, prec, &gb, &gp));
  /* the activations' sizes and the rate depend on both */
  int assumed = 0;
  if (gj_gemm_setup(gb, gp)) {
    /* bf16 on a CPU without bf16 hardware (a login node, say): with the rate given nothing runs
     * here, so the plan is sized for the backend of a machine that has it (auto's: oneDNN) */
    if (gp != GJ_PREC_BF16 || gb == GJ_GEMM_OPENBLAS) return -1;
    if (!(sgemm_g > 0)) {
      char why[512];
      snprintf(why, sizeof why, "%s", gj_errmsg());
      return GJ_FAIL("%s; or, to plan for a machine that has them, give its rate: --sgemm-gflops", why);
    }
    gj_gemm_assume(GJ_GEMM_ONEDNN, gp);
    assumed = 1;
  }
  if (T == 0) T = c.n_positions;
  if (T > c.n_positions) return GJ_FAIL("--seq-len %lld exceeds n_positions %lld", (long long)T, (long long)c.n_positions);
  if (threads == 0) threads = omp_get_max_threads();
  /* B T <= 2^40 by the flags' ranges; the step's tokens (up to 2^84) are counted in double and
   * refused beyond what training's int64 token counters hold */
  double tokens = (double)B * (double)T * (double)A * (double)dp;
  if (tokens > 4611686018427387904.0)
    return GJ_FAIL("--micro-batch %lld x --seq-len %lld x --grad-accum %lld x --dp %lld = %.3g tokens "
                   "per step, more than 2^62", (long long)B, (long long)T, (long long)A, (long long)dp, tokens);
  GJ_TRY(gj_oib_check(oib, 0, zero));
  int grad_bf16;
  GJ_TRY(gj_grad_reduce_parse(grad_reduce, &grad_bf16));
  int owner;
  GJ_TRY(gj_zero_reduce_parse(zero_reduce, zero, &owner));
  owner = owner && dp > 1;
  gj_mem_sizes ms;
  const int mode = gj_train_mode((int)oib, A); /* as train's */
  GJ_TRY(gj_model_sizes(&ms, &c, (int)tp, (int)dp, (int)zero, (int)recompute, mode, B, T, (int)threads));
  GJ_TRY(gj_state_train_grad_bytes(&c, (int)tp, (int)oib, A, (int64_t)tokens, &ms.grads));
  /* what train's memory check counts: against --mem-per-rank-gb, the process itself too
   * (libraries, MPI: this one's stands in for train's; MemAvailable has it taken off already) */
  const double base = mem_gb > 0 ? gj_self_rss_bytes() : 0;
  double total = (double)ms.params + ms.grads + ms.moments + ms.acts + ms.w16 + base;
  double avail = mem_gb > 0 ? mem_gb * 1e9 : gj_mem_available_bytes() / GJ_MAX(rpn, 1);
  int64_t N = B * T;
  double fpt = gj_flops_per_token(&c, T);
  double flops_step = fpt * tokens, flops_rank = flops_step / (dp * tp);
  /* recomputation runs each layer's forward again up to its two output projections: q, k, v and
   * fc_in (2 FLOPs per weight) and the attention */
  double recomputed = (double)c.n_layer * (3.0 * c.n_embd * c.n_embd + (double)c.n_embd * c.n_inner);
  double extra = recompute ? (2.0 * recomputed + 4.0 * c.n_layer * c.n_embd * T) * tokens / (dp * tp) : 0;
  double tp_bytes = A * ring(((2.0 * c.n_layer + 2) * N * c.n_embd + 3.0 * N) * 4, (int)tp);
  /* a TP group larger than a node's ranks sends over the network */
  const int tp_spans = rpn > 0 && tp > rpn;
  const double tp_rate = tp_spans ? GJ_MIN(tpnet, net) : tpnet;
  const double probe = gj_probe_bytes_estimate(&c, (int)tp, N, ms.late_head, gp == GJ_PREC_BF16);
  /* without the optimizer in backward the embedding's gradient goes as the union of the ranks'
   * rows (at most the step's tokens) and a byte a row of the shard's vocabulary; ZeRO-1 sums
   * the gradients as much, then all-gathers the updated parameters ((p - 1) / p of them); Vl: the
   * largest vocabulary shard */
  double Vl = (double)gj_split(c.vocab_size, (int)tp, 0, NULL), emb = Vl * c.n_embd * 4;
  const int emb_dense = oib || tokens >= Vl;
  double rows = emb_dense ? emb : tokens * c.n_embd * 4 + Vl;
  /* --grad-reduce bf16: 2 bytes an element but for the embedding's gradient */
  const double gsize = grad_bf16 ? 0.5 : 1;
  /* --zero-reduce owner: each piece reduced to its owner, (p - 1) / p of it sent, half the ring
   * all-reduce's bytes; the embedding's gradient too where it is dense (as rows it is still
   * all-reduced) */
  const double rfrac = owner ? 0.5 : 1;
  double red_bytes = ring(((double)ms.params - emb) * gsize, (int)dp) * rfrac + ring(rows, (int)dp) * (emb_dense ? rfrac : 1);
  /* ZeRO-1 in bf16 gathers the GEMM weights in bf16 (gj_dp_gather16): 2 bytes an element */
  double ag16 = 0;
  if (zero && dp > 1 && gp == GJ_PREC_BF16) {
    gj_layout l;
    GJ_TRY(gj_layout_build(&l, &c, (int)tp, 0));
    ag16 = 2.0 * (double)gj_layout_w16_numel(&l);
    gj_layout_free(&l);
  }
  double ag_bytes = zero ? ring((double)ms.params - ag16, (int)dp) / 2 : 0, dp_bytes = red_bytes + ag_bytes;
  if (sgemm_g > 0 && sgemm_g < 1e-3) return GJ_FAIL("--sgemm-gflops: %g is out of range [0.001, 1e9] (0: measure)", sgemm_g);
  omp_set_num_threads((int)threads); /* the GEMM rate on --threads threads, as the bandwidth */
  double rate = sgemm_g > 0 ? sgemm_g * 1e9 : gj_sgemm_model_rate(&c, GJ_MIN(N, 1024), (int)tp, 0.2);
  if (!(rate > 0)) return GJ_FAIL("cannot measure the sgemm rate on the model's shapes (out of memory?): give --sgemm-gflops");
  if (mem_g > 0 && mem_g < 1e-3) return GJ_FAIL("--mem-gbps: %g is out of range [0.001, 1e6] (0: measure)", mem_g);
  double mrate = mem_g > 0 ? mem_g * 1e9 : mem_rate((int)threads);
  if (!(mrate > 0)) return GJ_FAIL("cannot measure the memory bandwidth here (out of memory?): give --mem-gbps");
  double t_comp = (flops_rank + extra) / rate, t_tp = tp_bytes / (tp_rate * 1e9), t_dp = dp_bytes / (net * 1e9);
  double t_red = red_bytes / (net * 1e9), t_ag = ag_bytes / (net * 1e9);
  /* The optimizer streams memory, it does not compute: AdamW reads parameters, gradients and
   * both moments and writes three of them (28 B per parameter of the rank's share, 1/DP of
   * it with ZeRO-1), and the gradient norm and the zeroing pass over the gradients (8 B). */
  double p_floats = (double)ms.params / 4, share = zero ? p_floats / dp : p_floats;
  double opt_bytes = 28.0 * share + 8.0 * p_floats, t_opt = opt_bytes / mrate;
  /* DP buckets are reduced while the last micro-batch's backward (about 2/3 of its compute)
   * runs; what is left, and at least the last bucket, is exposed. */
  double bucket_bytes = GJ_MIN((double)((size_t)1 << 22) * 4, (double)ms.params) * gsize;
  double t_last = ring(bucket_bytes, (int)dp) * rfrac / (net * 1e9);
  double t_dp_exposed = dp > 1 ? GJ_MAX(t_red - 2.0 / 3.0 * t_comp / (double)A, t_last) : 0;
  /* each part's reduction waited for before its update */
  if (oib && dp > 1) t_dp_exposed = t_red;
  /* a late head gradient is final after the rest of backward: its reduction is exposed */
  if (ms.late_head && dp > 1)
    t_dp_exposed = GJ_MAX(t_dp_exposed, ring(Vl * c.n_embd * 4 * gsize, (int)dp) * rfrac / (net * 1e9));
  t_dp_exposed = GJ_MIN(t_dp_exposed, t_red); /* a bucket or the head can be more than what is sent */
  t_dp_exposed += t_ag;                       /* ZeRO-1's all-gather, after the update */
  double t_step = t_comp + t_opt + t_tp + t_dp_exposed;
  printf("plan: %s, %lld parameters; DP %lld x TP %lld = %lld ranks; micro-batch %lld x seq %lld, "
         "grad-accum %lld: %.0f tokens per step; ZeRO-1 %s, recompute %s%s; %s\n",
         mo.config_file ? mo.config_file : mo.preset, (long long)gj_config_n_params(&c),
         (long long)dp, (long long)tp, (long long)(dp * tp), (long long)B, (long long)T,
         (long long)A, tokens, !zero ? "off" : owner ? "on (gradient sums to their owners)" : "on", recompute ? "on" : "off",
         oib ? ", optimizer in backward" : "", gp == GJ_PREC_BF16 ? "bf16" : "fp32");
  if (assumed)
    printf("note: this CPU has no bf16 hardware (AMX-BF16, AVX512_BF16): sized for oneDNN's bf16 "
           "products on a machine that has it, at the --sgemm-gflops given\n");
  printf("memory per rank:\n");
  printf("  parameters        %12.3f GB\n", ms.params / 1e9);
  printf("  gradients         %12.3f GB\n", ms.grads / 1e9);
  printf("  AdamW moments     %12.3f GB\n", ms.moments / 1e9);
  printf("  activations       %12.3f GB", ms.acts / 1e9);
  if (ms.late_head) /* gj_model's late_head */
    printf(" (and %.3f GB in the vocabulary head's gradient, written after backward)", ms.acts_in_grads / 1e9);
  printf("\n");
  if (ms.w16) printf("  bf16 weight copies%12.3f GB\n", ms.w16 / 1e9);
  if (base > 0) printf("  process           %12.3f GB (libraries and MPI: this process's own)\n", base / 1e9);
  printf("  total             %12.3f GB   of %.3f GB available per rank (%s): %s\n", total / 1e9,
         avail / 1e9, mem_gb > 0 ? "--mem-per-rank-gb" : "this machine's, over --ranks-per-node",
         total <= avail ? "fits" : "DOES NOT FIT");
  printf("  GEMM-rate probe   %12.3f GB more for a moment at steps 1, 10, 100, ... (train's GEMM efficiency; "
         "left out where it does not fit)\n", probe / 1e9);
  printf("per step:\n");
  printf("  FLOPs             %12.4g in all, %.4g per rank (%.4g per token)%s\n", flops_step, flops_rank, fpt,
         recompute ? ", plus the recomputed forward" : "");
  printf("  sent per rank     %12.4g B TP (ring all-reduce of activations), %.4g B DP (gradients%s%s%s)\n",
         tp_bytes, dp_bytes, owner ? " reduced to their owners" : "",
         !grad_bf16 ? "" : owner ? ", in bf16 but the embedding's" : " in bf16 but the embedding's",
         !zero ? "" : ag16 > 0 ? ", and the updated parameters' all-gather, the GEMM weights in bf16"
                               : ", and the updated parameters' all-gather");
  printf("time per step (estimate):\n");
  printf("  compute           %12.3f s at %.1f GFLOP/s per rank (%s%s)\n", t_comp, rate / 1e9,
         sgemm_g > 0 ? "given" : "measured here on the model's shapes: ", sgemm_g > 0 ? "" : gj_gemm_describe());
  printf("  TP communication  %12.3f s at %.1f GB/s%s\n", t_tp, tp_rate,
         tp_spans ? " (the TP group spans nodes: --tp above --ranks-per-node; keep TP within a node)" : "");
  printf("  optimizer         %12.3f s: %.4g B of memory traffic at %.1f GB/s (%s)\n", t_opt, opt_bytes, mrate / 1e9,
         mem_g > 0 ? "given" : "measured here");
  printf("  DP communication  %12.3f s at %.3g GB/s, %.3f s of it exposed (%s)\n", t_dp, net, t_dp_exposed,
         dp == 1 ? "none: DP 1"
         : zero ? (owner ? "the gradients' reduce to their owners overlaps backward; ZeRO-1's all-gather after the update does not"
                         : "the gradients' all-reduce overlaps backward; ZeRO-1's all-gather after the update does not")
         : oib  ? "the optimizer in backward waits for each part's reduction"
                : "the rest overlaps backward");
  printf("  step              %12.3f s, %.0f tokens/s (compute + optimizer + TP + exposed DP)\n", t_step,
         tokens / t_step);
  return 0;
}
