/* gptj bench: full training steps (forward, backward, DP reduction, AdamW) of a preset or
 * config on synthetic tokens, with a time breakdown, the achieved FLOP/s against the
 * hardware's peak (MFU), and the GEMM efficiency: the step's own products replayed alone in the
 * same process at the same thread count right after each measured step, over the step's time
 * (pairs: a shared machine's speed drifts, and each pair sees one moment of it). */
#include <jansson.h>
#include <malloc.h>
#include <math.h>
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
#include "model/state.h"
#include "optim/adamw.h"
#include "parallel/dp.h"
#include "parallel/grid.h"
#include "train/step.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  int64_t B, T, steps, warmup, tp, zero, recompute, oib, shapes, dp_poll_us;
  const char *json, *gemm, *prec, *grad_reduce, *zero_reduce;
  int grad_bf16, zero_owner;
} bench_opts;

/* Everything a bench holds, freed in one place. */
typedef struct {
  bench_opts o;
  gj_modelopts mo;
  gj_config c;
  gj_grid g;
  gj_state st;
  gj_model m;
  gj_trainer tr;
  double *st_s;            /* [steps] step times */
  double *rp_s;            /* [steps] the step's products replayed alone right after it (max over ranks) */
  double *ratio;           /* [steps] scratch: rp_s / st_s */
  double prof[GJ_PROF_N + 2]; /* mean seconds per category, then DP wait and optimizer */
  double peak;
  const char *peak_how;
  double rss_probe; /* peak RSS before the GEMM timings, each followed by a reset of the mark (0: none) */
  char *config_json; /* --json: the config file's name as a JSON string, or null */
} bench_ctx;

static void bench_free(bench_ctx *x) {
  free(x->st_s), free(x->rp_s), free(x->ratio), free(x->config_json);
  gj_trainer_free(&x->tr);
  gj_model_free(&x->m);
  gj_state_free(&x->st);
  gj_grid_free(&x->g);
}

/* gj_batch_fn: the same synthetic tokens every step (the DP ranks' differ). */
static int synthetic_batch(void *ctx, int64_t a, int32_t *ids, int32_t *tg) {
  const bench_ctx *x = ctx;
  int64_t N = x->o.B * x->o.T;
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 2654435761u + x->g.dp_rank * 97) % 50257);
  for (int64_t i = 0; i < N; i++) tg[i] = ids[(i + 1) % N];
  return 0;
}

static int parse(bench_ctx *x, int argc, char **argv) {
  bench_opts *o = &x->o;
  *o = (bench_opts){.B = 8, .T = 0, .steps = 3, .warmup = 1, .tp = 1, .gemm = "auto", .prec = "fp32", .grad_reduce = "fp32", .zero_reduce = "allreduce", .dp_poll_us = GJ_DP_POLL_DEFAULT};
  gj_opt table[] = {
      {"micro-batch", GJ_OPT_I64, &o->B, "sequences per rank per step", 1, 1 << 20},
      {"seq-len", GJ_OPT_I64, &o->T, "tokens per sequence (0: 256, or n_positions where that is less)", 0,
       1 << 20},
      {"steps", GJ_OPT_I64, &o->steps, "measured steps (the median is reported)", 1, 1e6},
      {"warmup", GJ_OPT_I64, &o->warmup, "steps run before measuring", 0, 1e6},
      {"tp", GJ_OPT_I64, &o->tp, "tensor-parallel size (DP = ranks / TP)", 1, 4096},
      {"zero", GJ_OPT_I64, &o->zero, "1: ZeRO-1 (in bf16 the GEMM weights all-gathered as bf16)", 0, 1},
      {"zero-reduce", GJ_OPT_STR, &o->zero_reduce, GJ_ZERO_REDUCE_HELP, 1, 0},
      {"grad-reduce", GJ_OPT_STR, &o->grad_reduce, GJ_GRAD_REDUCE_HELP, 1, 0},
      {"dp-poll-us", GJ_OPT_I64, &o->dp_poll_us, GJ_DP_POLL_HELP, 0, 1000000},
      {"recompute", GJ_OPT_I64, &o->recompute, "1: activation recomputation", 0, 1},
      {"optimizer-in-backward", GJ_OPT_I64, &o->oib, "1: AdamW applied part by part during backward (as gptj "
       "train's; the bench then runs without gradient clipping, which otherwise is 1.0)", 0, 1},
      {"precision", GJ_OPT_STR, &o->prec, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &o->gemm, GJ_GEMM_HELP, 1, 0},
      {"json", GJ_OPT_STR, &o->json, "also write the results as one JSON object to this file", 1, 0},
      {"shapes", GJ_OPT_I64, &o->shapes, "1: also list the step's GEMM shapes, each with its count and its rate "
       "timed alone", 0, 1},
      {NULL}};
  int rc = gj_modelopts_parse(&x->mo, argc, argv, table, "gptj bench [--preset NAME] [options]",
                              "Times training steps on synthetic tokens. Reports MFU (model FLOP/s over the\n"
                              "hardware's peak for the precision, from a tight FMA / VDPBF16PS / AMX loop on\n"
                              "every thread) and the GEMM efficiency: the time of the step's own products,\n"
                              "replayed alone right after each measured step (same backend, shapes and thread\n"
                              "count, OMP_NUM_THREADS), over that step's time, the median of the pairs; and the\n"
                              "same against each product's best-of-repetitions rate.");
  if (rc) return rc;
  x->c = x->mo.config;
  if (o->T == 0) o->T = GJ_MIN(256, x->c.n_positions); /* the benchmark shape; tiny has 128 positions */
  if (o->T > x->c.n_positions)
    return GJ_FAIL("--seq-len %lld exceeds n_positions %lld", (long long)o->T, (long long)x->c.n_positions);
  if (o->json) { /* before the work */
    GJ_TRY(gj_outfile_plan(&(gj_file_ref){"--json", o->json}, 1, NULL, 0));
    json_t *cf = x->mo.config_file ? json_string(x->mo.config_file) : json_null();
    if (!cf) return GJ_FAIL("--config %s: the name is not UTF-8, and --json records it", x->mo.config_file);
    x->config_json = json_dumps(cf, JSON_ENCODE_ANY);
    json_decref(cf);
    if (!x->config_json) return GJ_FAIL("out of memory");
  }
  GJ_TRY(gj_grad_reduce_parse(o->grad_reduce, &o->grad_bf16));
  GJ_TRY(gj_zero_reduce_parse(o->zero_reduce, o->zero, &o->zero_owner));
  return gj_oib_check(o->oib, 0, o->zero);
}

/* The grid, the GEMM choice, the memory check, the state, the network and the trainer. */
static int setup(bench_ctx *x) {
  const bench_opts *o = &x->o;
  GJ_AGREE(gj_comm_world(), gj_grid_init(&x->g, (int)o->tp));
  gj_log_set_rank(x->g.rank);
  GJ_TRY(gj_cli_gemm_setup(o->gemm, o->prec, x->g.world));
  x->peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &x->peak_how);
  gj_mem_sizes ms;
  const int mode = gj_train_mode((int)o->oib, 1); /* the head's gradient may be late */
  GJ_TRY(gj_model_sizes(&ms, &x->c, x->g.tp_size, x->g.dp_size, (int)o->zero, (int)o->recompute, mode,
                        o->B, o->T, omp_get_max_threads()));
  const int64_t tokens = o->B * o->T * x->g.dp_size;
  GJ_TRY(gj_state_train_grad_bytes(&x->c, x->g.tp_size, (int)o->oib, 1, tokens, &ms.grads));
  GJ_TRY(gj_mem_check(x->g.world,
                      (double)ms.params + ms.grads + ms.moments + ms.acts + ms.w16,
                      "parameters, gradients, AdamW, activations and bf16 copies",
                      "use more ranks, --tp, --zero 1, --recompute 1 or a smaller --micro-batch", 0, NULL));
  int rc = o->oib ? gj_state_create_oib(&x->st, &x->c, &x->g, 1)
                  : gj_state_create_rows(&x->st, &x->c, &x->g, (int)o->zero, tokens);
  if (!rc) rc = gj_model_create(&x->m, &x->st, &x->g, o->B, o->T, (int)o->recompute, mode);
  GJ_AGREE(x->g.world, rc);
  gj_params_init(&x->st.lay, &x->c, x->st.params, 1);
  gj_adamw_hp hp;
  gj_adamw_defaults(&hp);
  if (o->oib) hp.grad_clip = 0;
  rc = gj_trainer_init(&x->tr, &x->st, &x->m, &x->g, &hp, 0.0f, o->grad_bf16, (int)o->dp_poll_us);
  if (!rc && o->zero_owner) rc = gj_trainer_reduce_to_owners(&x->tr);
  x->st_s = calloc(o->steps, sizeof(double)), x->rp_s = calloc(o->steps, sizeof(double));
  x->ratio = calloc(o->steps, sizeof(double));
  if (!rc && (!x->st_s || !x->rp_s || !x->ratio)) rc = GJ_FAIL("out of memory");
  return gj_agree(x->g.world, rc);
}

/* The kernel's peak-RSS mark set back to the current RSS (clear_refs 5). */
static int reset_hwm(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return -1;
  int ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* A timing of the step's products alone (a best-of-repetitions ceiling, or a replay): its
 * operands would raise the peak RSS, so the peak is noted before it and the mark reset after
 * it. Where the mark cannot be reset (the first reset tells), nothing is timed here: -1. */
static double probe(bench_ctx *x, int replay) {
  double before = gj_self_hwm_bytes();
  if (before <= 0 || reset_hwm()) return -1;
  double r = replay ? gj_gemm_recorded_replay() : gj_gemm_recorded_rate(0.3);
  malloc_trim(0); /* the probe's freed operands leave the heap before the mark is reset */
  reset_hwm();
  x->rss_probe = GJ_MAX(x->rss_probe, before);
  return r;
}

/* warmup + steps training steps; the measured ones' times and breakdown. */
static int run_steps(bench_ctx *x) {
  const bench_opts *o = &x->o;
  double prof[GJ_PROF_N];
  int rc = 0;
  x->rss_probe = 0;
  for (int64_t s = 0; s < o->warmup + o->steps && !rc; s++) {
    int measured = s >= o->warmup;
    memset(prof, 0, sizeof prof);
    x->m.prof = measured ? prof : NULL;
    rc = gj_barrier(x->g.world);
    double t0 = gj_now();
    gj_gemm_record(s == 0);
    gj_step_in in = {s + 1, s + 1, 1e-4, 1, o->B, o->T, (double)o->B * o->T * x->g.dp_size, synthetic_batch, x, 0};
    gj_step_out out;
    if (!rc) rc = gj_train_step(&x->tr, &in, &out);
    gj_gemm_record(0);
    double t2 = gj_now();
    /* a first best-of ceiling after the first step (figures() takes the better of it and a
     * second after the steps: the machine's speed drifts over minutes) */
    if (s == 0 && !rc) probe(x, 0);
    if (measured && !rc) {
      x->st_s[s - o->warmup] = t2 - t0;
      /* the same products alone, at once after the step, on every rank together: the step
       * and its replay see the same moment of a noisy machine */
      rc = gj_barrier(x->g.world);
      double rp = rc ? 0 : probe(x, 1);
      if (!rc) rc = gj_allreduce_max_f64(x->g.world, &rp, 1);
      x->rp_s[s - o->warmup] = rp;
      for (int k = 0; k < GJ_PROF_N; k++) x->prof[k] += prof[k] / o->steps;
      x->prof[GJ_PROF_N] += out.dp_wait_s / o->steps; /* exposed DP wait */
      x->prof[GJ_PROF_N + 1] += out.optim_s / o->steps; /* optimizer (norm, AdamW, ZeRO gather) */
    }
    if (rc) break;
    /* progress: a step of the GPT-J-6B width takes a quarter of a minute here */
    const double rp = measured ? x->rp_s[s - o->warmup] : 0;
    if (rp > 0)
      gj_info("step %lld/%lld: %.3f s, its products replayed alone %.3f s", (long long)(s + 1),
              (long long)(o->warmup + o->steps), t2 - t0, rp);
    else
      gj_info("step %lld/%lld%s: %.3f s", (long long)(s + 1), (long long)(o->warmup + o->steps),
              measured ? "" : " (warmup)", t2 - t0);
  }
  x->m.prof = NULL;
  return gj_agree(x->g.world, rc);
}

/* The figures of the measured steps, shared by the log and the JSON file. */
typedef struct {
  double step, tps, flops_rank, rss_max, gemm_flops, mfu, mean, other;
  double replay, geff;       /* the median replay (s; 0: none) and of replay / step, pair by pair */
  double best_rate, geff_best; /* the best-of-repetitions ceiling, and the median step against it */
} bench_figures;

static const char *const prof_names[] = {"gemm", "attention", "norms_elementwise", "embedding_lmhead_loss",
                                         "tp_collectives", "dp_wait_exposed", "optimizer"};

static double median(double *v, int64_t n) {
  qsort(v, n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int figures(bench_ctx *x, bench_figures *f) {
  const bench_opts *o = &x->o;
  /* the GEMM efficiency, step by step: its products' time alone over its own time */
  int paired = 1;
  for (int64_t k = 0; k < o->steps; k++) paired &= x->rp_s[k] > 0;
  double *ratio = x->ratio;
  for (int64_t k = 0; paired && k < o->steps; k++) ratio[k] = x->rp_s[k] / x->st_s[k];
  f->geff = paired ? median(ratio, o->steps) : 0;
  f->replay = paired ? median(x->rp_s, o->steps) : 0;
  f->step = median(x->st_s, o->steps); /* sorted: the min and max are at the ends */
  f->tps = (double)o->B * o->T * x->g.dp_size / f->step;
  f->flops_rank = gj_flops_per_token(&x->c, o->T) * f->tps / x->g.size;
  /* peak memory before the GEMM probe allocates its operands */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  f->rss_max = x->rss_probe > 0 ? GJ_MAX(x->rss_probe, gj_self_hwm_bytes()) : ru.ru_maxrss * 1024.0;
  GJ_TRY(gj_allreduce_max_f64(x->g.world, &f->rss_max, 1));
  f->gemm_flops = gj_gemm_recorded_flops(), f->best_rate = gj_gemm_recorded_rate(0.3);
  /* the peak again, after the steps: the higher of the two (a slow moment at start read
   * half the FMA rate once) */
  const char *how;
  double peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &how);
  if (peak > x->peak) x->peak = peak, x->peak_how = how;
  f->mfu = x->peak > 0 ? f->flops_rank / x->peak : 0;
  f->geff_best = f->best_rate > 0 ? f->gemm_flops / f->step / f->best_rate : 0;
  /* a ratio above 1 means its ceiling was measured low (another process had a core: OpenMP
   * threads waiting for a descheduled one read 20 GFLOP/s for 400): measured again, up to
   * three times, keeping the best */
  for (int k = 0; k < 3 && f->mfu > 1; k++) {
    peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), &how);
    if (peak > x->peak) x->peak = peak, x->peak_how = how;
    f->mfu = x->peak > 0 ? f->flops_rank / x->peak : 0;
  }
  for (int k = 0; k < 3 && f->geff_best > 1; k++) {
    const double rate = gj_gemm_recorded_rate(0.3); /* once: GJ_MAX evaluates its arguments twice */
    f->best_rate = GJ_MAX(f->best_rate, rate);
    f->geff_best = f->gemm_flops / f->step / f->best_rate;
  }
  if (f->replay <= 0) f->geff = f->geff_best; /* no replays: the peak RSS mark cannot be reset here */
  /* the breakdown is a mean over the measured steps: compare it with the mean step */
  f->mean = 0;
  for (int64_t k = 0; k < o->steps; k++) f->mean += x->st_s[k] / o->steps;
  f->other = f->mean;
  for (int k = 0; k < GJ_PROF_N + 2; k++) f->other -= x->prof[k];
  return 0;
}

/* What runs, before the steps (their progress lines follow it). */
static void print_header(const bench_ctx *x) {
  const bench_opts *o = &x->o;
  const gj_modelopts *mo = &x->mo;
  char dpw[512];
  gj_trainer_dp_words(&x->tr, o->grad_bf16, (int)o->dp_poll_us, dpw, sizeof dpw);
  gj_info("bench: %s%s, B %lld, T %lld, DP %d x TP %d, %d threads per rank, ZeRO %lld, recompute %lld%s%s",
          mo->config_file ? mo->config_file : mo->preset, mo->config_file ? "" : " (preset)", (long long)o->B,
          (long long)o->T, x->g.dp_size, x->g.tp_size, omp_get_max_threads(), (long long)o->zero,
          (long long)o->recompute, o->oib ? ", optimizer in backward (no clipping)" : "", dpw);
  const gj_config *c = &x->c; /* the preset or file with the flags' overrides (e.g. --n_layer 1) */
  gj_info("model: %lld parameters (%lld layers, D %lld, %lld heads, F %lld, V %lld)",
          (long long)gj_config_n_params(c), (long long)c->n_layer, (long long)c->n_embd, (long long)c->n_head,
          (long long)c->n_inner, (long long)c->vocab_size);
  gj_info("GEMM: %s", gj_gemm_describe());
}

static void print_figures(const bench_ctx *x, const bench_figures *f) {
  const bench_opts *o = &x->o;
  gj_info("step %.3f s (median of %lld; min %.3f, max %.3f) | %.1f tokens/s", f->step, (long long)o->steps,
          x->st_s[0], x->st_s[o->steps - 1], f->tps);
  gj_info("time per step (mean %.3f s):", f->mean);
  for (int k = 0; k < GJ_PROF_N + 2; k++)
    gj_info("  %-24s %8.3f s  %5.1f%%", prof_names[k], x->prof[k], 100 * x->prof[k] / f->mean);
  gj_info("  %-24s %8.3f s  %5.1f%%", "other", f->other, 100 * f->other / f->mean);
  gj_info("achieved %.2f GFLOP/s per rank (model FLOPs) | peak %.2f GFLOP/s (%s, %d threads) | MFU %.1f%%",
          f->flops_rank / 1e9, x->peak / 1e9, x->peak_how, omp_get_max_threads(), 100 * f->mfu);
  gj_info("GEMM: %.3f GFLOP per step on a rank at %.2f GFLOP/s of step time", f->gemm_flops / 1e9,
          f->gemm_flops / f->step / 1e9);
  if (f->replay > 0)
    gj_info("GEMM efficiency %.1f%%: the step's products replayed alone right after each step, %.3f s "
            "(%.2f GFLOP/s), over the step's time (the median of the pairs)",
            100 * f->geff, f->replay, f->gemm_flops / f->replay / 1e9);
  gj_info("GEMM efficiency against the best-of-repetitions rate of each product (%.2f GFLOP/s): %.1f%%%s",
          f->best_rate / 1e9, 100 * f->geff_best,
          f->replay > 0 ? "" : " (no replays: the peak RSS mark cannot be reset here, so this is the figure)");
  gj_info("peak RSS per rank: %.0f MB (max over ranks)", f->rss_max / 1e6);
}

/* Rank 0: --json, under a temporary name, synced, renamed. */
static int write_json(const bench_ctx *x, const bench_figures *f) {
  const bench_opts *o = &x->o;
  gj_outfile of;
  GJ_TRY(gj_outfile_begin(&of, o->json));
  FILE *fp = fopen(of.tmp, "w");
  if (!fp) return gj_outfile_abort(&of), GJ_FAIL("--json %s: cannot write", o->json);
  /* the model as run: "preset" is the base the flags changed, "config_file" (or null) the file */
  const gj_config *c = &x->c;
  fprintf(fp, "{\"preset\": \"%s\", \"config_file\": %s, \"n_params\": %lld, \"n_layer\": %lld, \"n_embd\": %lld, "
          "\"n_head\": %lld, \"n_inner\": %lld, \"vocab_size\": %lld, ",
          x->mo.preset, x->config_json, (long long)gj_config_n_params(c), (long long)c->n_layer, (long long)c->n_embd,
          (long long)c->n_head, (long long)c->n_inner, (long long)c->vocab_size);
  fprintf(fp, "\"micro_batch\": %lld, \"seq_len\": %lld, \"dp\": %d, \"tp\": %d, "
          "\"threads\": %d, \"zero\": %lld, \"zero_reduce\": \"%s\", \"grad_reduce\": \"%s\", \"dp_poll_us\": %lld, \"recompute\": %lld, \"optimizer_in_backward\": %lld, \"precision\": \"%s\", \"gemm\": \"%s\", "
          "\"blas_core\": \"%s\", \"step_s\": %.6f, \"tokens_per_s\": %.3f, ",
          (long long)o->B, (long long)o->T, x->g.dp_size, x->g.tp_size, omp_get_max_threads(),
          (long long)o->zero, x->tr.dp.owner_P ? "owner" : "allreduce", o->grad_bf16 ? "bf16" : "fp32", (long long)(x->tr.dp_polled ? o->dp_poll_us : 0), (long long)o->recompute, (long long)o->oib, gj_precision_name(gj_gemm_precision()),
          gj_gemm_describe(), gj_blas_core(), f->step, f->tps);
  fprintf(fp, "\"breakdown_s\": {");
  for (int k = 0; k < GJ_PROF_N + 2; k++) fprintf(fp, "\"%s\": %.6f, ", prof_names[k], x->prof[k]);
  fprintf(fp, "\"other\": %.6f}, \"flops_per_s_per_rank\": %.6g, \"peak_flops_per_s\": %.6g, "
          "\"peak_how\": \"%s\", \"mfu\": %.4f, \"gemm_flops_per_step\": %.6g, "
          "\"gemm_replay_s\": %.6f, \"gemm_eff\": %.4f, \"gemm_best_flops_per_s\": %.6g, "
          "\"gemm_eff_best\": %.4f, \"peak_rss_bytes\": %.0f}\n",
          f->other, f->flops_rank, x->peak, x->peak_how, f->mfu, f->gemm_flops, f->replay, f->geff,
          f->best_rate, f->geff_best, f->rss_max);
  if (fclose(fp)) return gj_outfile_abort(&of), GJ_FAIL("--json %s: write failed", o->json);
  return gj_outfile_commit(&of);
}

static int report(bench_ctx *x) {
  bench_figures f;
  GJ_TRY(figures(x, &f));
  print_figures(x, &f);
  if (x->o.shapes && x->g.rank == 0) gj_gemm_recorded_print();
  int rc = x->o.json && x->g.rank == 0 ? write_json(x, &f) : 0;
  return gj_agree(x->g.world, rc);
}

int gj_cmd_bench(int argc, char **argv) {
  bench_ctx x;
  memset(&x, 0, sizeof x);
  int rc = parse(&x, argc, argv);
  if (rc) return free(x.config_json), rc > 0 ? 0 : rc;
  rc = setup(&x);
  if (!rc) print_header(&x);
  if (!rc) rc = run_steps(&x);
  if (!rc) rc = report(&x);
  bench_free(&x);
  return rc;
}
