#include "train/run.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common.h"
#include "io/rundir.h"
#include "model/flops.h"
#include "model/gemm.h"
#include "train/evaluate.h"

int gj_run_resume(gj_state *st, gj_grid *g, const char *resume, const char *run_dir,
                  gj_ckpt_meta *meta, int *resumed) {
  *resumed = 0;
  if (!resume || !strcmp(resume, "none")) return 0;
  double t0 = gj_now();
  if (strcmp(resume, "auto")) {
    GJ_TRY(gj_ckpt_load(resume, st, g, meta, 1));
    gj_info("resumed from %s at step %lld (loaded in %.2f s)", resume, (long long)meta->step, gj_now() - t0);
    *resumed = 1;
    return 0;
  }
  /* rank 0's view of the directory decides */
  int64_t *steps = NULL;
  int n = 0, rc = g->rank == 0 ? gj_ckpt_candidates(run_dir, &steps, &n) : 0;
  GJ_AGREE(g->world, rc);
  GJ_TRY(gj_bcast(g->world, &n, sizeof n, 0));
  if (g->rank != 0) steps = malloc((n ? n : 1) * sizeof(int64_t));
  rc = steps || !n ? 0 : GJ_FAIL("out of memory");
  if (!rc) rc = gj_bcast(g->world, steps, n * sizeof(int64_t), 0);
  if (rc) return free(steps), gj_agree(g->world, rc);
  char path[GJ_PATH_BUF], first[GJ_ERRMSG_MAX] = "";
  for (int i = 0; i < n; i++) {
    rc = gj_ckpt_path(path, sizeof path, run_dir, steps[i]);
    if (!rc) rc = gj_ckpt_load(path, st, g, meta, 1);
    if (!rc) {
      gj_info("resumed from %s at step %lld (loaded in %.2f s)", path, (long long)meta->step, gj_now() - t0);
      *resumed = 1;
      break;
    }
    if (rc == GJ_STOPPED) break;
    if (!i) snprintf(first, sizeof first, "%s", gj_errmsg());
    if (g->rank == 0) gj_warn("cannot resume from %s: %s; trying an older checkpoint", path, gj_errmsg());
  }
  free(steps);
  if (rc == GJ_STOPPED) return rc;
  if (n > 0 && !*resumed)
    return GJ_FAIL("%s: none of its %d checkpoints loads (the newest: %s); refusing to start over in "
                   "a run directory that has checkpoints", run_dir, n, first);
  if (n == 0) gj_info("no checkpoint in %s: starting from scratch", run_dir);
  return 0;
}

int gj_run_save(gj_state *st, gj_grid *g, const gj_run_opts *o, const gj_ckpt_meta *meta) {
  char path[GJ_PATH_BUF];
  GJ_TRY(gj_ckpt_path(path, sizeof path, o->run_dir, meta->step));
  double t0 = gj_now();
  GJ_TRY(gj_ckpt_save(path, st, g, meta, (int)o->compress));
  double secs = gj_now() - t0; /* written, synced and renamed: complete */
  int rc = 0;
  if (g->rank == 0) {
    rc = gj_ckpt_set_latest(o->run_dir, path);
    if (!rc) rc = gj_ckpt_rotate(o->run_dir, (int)o->keep, meta->step);
  }
  GJ_AGREE(g->world, rc);
  gj_info("saved %s (%.2f s)", path, secs);
  return 0;
}

/* What the loop keeps from step to step. */
typedef struct {
  gj_run *r;
  uint64_t *win;            /* [G] the global batch's windows */
  int64_t G, first, bad, tokens_at_last;
  double t_start, ema; /* wall clock at the start; the step time's moving average */
  double eval_s, save_s; /* the last validation's and checkpoint's time (--max-time looks ahead) */
  double steps_time;   /* the summed time of the steps since the last log line */
  double peak, gemm_rate, gemm_flops, flops_tok;
  int no_probe; /* the GEMM-rate probe would not fit in memory: no GEMM efficiency */
  int over;     /* this rank's peak RSS went above --mem-per-rank-gb (warned) */
} loop_state;

static double peak_rss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024.0;
}

static void fmt_time(char *out, size_t n, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

/* gj_batch_fn: micro-batch a of this DP rank, from the global batch's windows, read from the
 * dataset now. A bad id or a read error can happen on some ranks only, and the step's
 * collectives follow: so before the first micro-batch every rank reads all of its windows of
 * this step (into ids and tg, overwritten below; the same pages are read again at once) and
 * the ranks agree on the outcome. */
static int fill_batch(void *ctx, int64_t a, int32_t *ids, int32_t *tg) {
  loop_state *s = ctx;
  gj_run *r = s->r;
  int64_t B = r->B, T = r->T, base = (r->tr->g->dp_rank * r->A + a) * B;
  int rc = 0;
  if (a == 0) {
    for (int64_t k = 0; k < r->A * B && !rc; k++) rc = gj_loader_window(r->loader, s->win[base + k], ids, tg);
    GJ_TRY(gj_agree(r->tr->g->world, rc));
  }
  for (int64_t b = 0; b < B && !rc; b++) rc = gj_loader_window(r->loader, s->win[base + b], ids + b * T, tg + b * T);
  return rc;
}

/* One measurement of a ceiling, kept if it is the best so far; its time is not training time
 * (t_start and *now move on by it). */
static void probe_gemm(loop_state *s, double *now) {
  if (s->no_probe) return;
  /* its operands (the largest product's, about the vocabulary head's weight and a block of its
   * logits) beside the run: left out, with GEMM efficiency, where they would not fit in what
   * --mem-per-rank-gb leaves, or in this rank's share of the node's available memory */
  const double need = (double)gj_gemm_probe_bytes(), budget = s->r->mem_budget;
  const double share = budget > 0 ? 0 : gj_mem_share_bytes(); /* 0: unknown */
  const double room = budget > 0 ? budget - gj_self_rss_bytes() : share;
  if ((budget > 0 || share > 0) && need > room) {
    s->no_probe = 1;
    if (s->r->tr->g->rank == 0)
      gj_info("note: GEMM efficiency is not measured: the GEMM-rate probe needs %.2f GB beside the run, "
              "%.2f GB are left (%s)", need / 1e9, GJ_MAX(room, 0.0) / 1e9,
              budget > 0 ? "--mem-per-rank-gb" : "this rank's share of the node's available memory");
    return;
  }
  const double trained = *now - s->t_start, shapes = GJ_MAX(1, gj_gemm_recorded_shapes());
  /* (each measurement once: GJ_MAX evaluates its arguments twice) */
  const double rate = gj_gemm_recorded_rate(GJ_MIN(0.05, GJ_MAX(0.002, 0.05 * trained / shapes)));
  s->gemm_rate = GJ_MAX(s->gemm_rate, rate);
  double probe = gj_now() - *now;
  s->t_start += probe, *now += probe;
}
static void probe_peak(loop_state *s, double *now) {
  const double peak = gj_peak_flops(gj_gemm_precision(), omp_get_max_threads(), NULL);
  s->peak = GJ_MAX(s->peak, peak);
  double probe = gj_now() - *now;
  s->t_start += probe, *now += probe;
}

/* The ceilings again after 10, 100, 1000... steps, keeping the best: another job on the same
 * cores can only make a measurement low, which would inflate MFU and efficiency. The probe's
 * time is not training time; each GEMM probe takes about 5% of the training time so far
 * (between 2 and 50 ms a shape, at least two timed runs of each), so that a short run is not mostly
 * probes and a long one gets the full measurement from step 10 or 100 on. */
static void probe_ceilings(loop_state *s, int64_t step, double *now) {
  int64_t done = step - s->first;
  while (done % 10 == 0 && done > 1) done /= 10;
  if (done != 1) return;
  if (step == s->first + 1) s->gemm_flops = gj_gemm_recorded_flops();
  probe_gemm(s, now);
  if (step > s->first + 1) probe_peak(s, now);
}

/* The step's GEMM efficiency and MFU over their ceilings so far. */
static double gemm_eff(const loop_state *s) { return s->gemm_rate > 0 ? s->gemm_flops / s->ema / s->gemm_rate : 0; }
static double mfu(const loop_state *s, double tps) {
  return s->peak > 0 ? tps * s->flops_tok / s->r->tr->g->size / s->peak : 0;
}

/* A number for metrics.jsonl: JSON has no NaN or Inf (a skipped step's loss or norm), so null. */
static const char *jnum(char *buf, size_t n, double v) {
  if (!isfinite(v)) return "null";
  snprintf(buf, n, "%.8g", v);
  return buf;
}

/* After a metrics.jsonl record: a write that failed (a full disk) costs the records, not the
 * run, which goes on. Said once, with the cause; no record is written after it (one written
 * later could follow a record cut short; a resume drops a cut record). */
static void metrics_flushed(gj_run *r) {
  if (fflush(r->metrics) == 0 && !ferror(r->metrics)) return;
  gj_warn("%s/metrics.jsonl: write error (%s): no more records this run; training goes on",
          r->o.run_dir, errno ? strerror(errno) : "a write failed");
  r->metrics_lost = 1;
}

/* Rank 0: the log line and the metrics.jsonl record of a step. */
static void log_step(loop_state *s, int64_t step, const gj_step_out *out, double lr, double *now, double dt) {
  gj_run *r = s->r;
  const gj_ckpt_meta *meta = r->meta;
  const gj_run_opts *o = &r->o;
  /* tokens/s and MFU over the steps' own time, as the GEMM efficiency: evaluation, checkpoints
   * and the ceilings' probes between two log lines are not in it (elapsed is wall time) */
  double span = s->steps_time;
  double tps = (meta->tokens_seen - s->tokens_at_last) / (span > 0 ? span : 1e-9);
  /* A ratio above 1 means a ceiling was measured low (another process had the cores while it
   * ran, and OpenMP threads that wait for a descheduled one are slowed many times over): the
   * ceiling is measured again, up to three times. */
  for (int k = 0; k < 3 && mfu(s, tps) > 1; k++) probe_peak(s, now);
  for (int k = 0; k < 3 && gemm_eff(s) > 1; k++) probe_gemm(s, now);
  double elapsed = *now - s->t_start;
  /* this rank's GEMM FLOPs per step over the step time, against their standalone rate */
  double mf = mfu(s, tps), geff = s->gemm_rate > 0 ? gemm_eff(s) : NAN; /* NaN: not measured */
  double eta = (o->steps - step) * s->ema;
  if (o->max_time > 0 && o->max_time - elapsed < eta) eta = GJ_MAX(0.0, o->max_time - elapsed);
  char el[32], et[32], zl[48] = "", ge[16] = "-";
  if (isfinite(geff)) snprintf(ge, sizeof ge, "%.0f%%", 100 * geff);
  fmt_time(el, sizeof el, elapsed), fmt_time(et, sizeof et, eta);
  if (out->z_loss != 0) snprintf(zl, sizeof zl, " | z-loss %.4f", out->z_loss);
  gj_info("step %lld/%lld | loss %.4f%s | lr %.3e | grad %.3f | %.0f tok/s | MFU %.1f%% | GEMM eff %s | %s | ETA %s | %.0f MB",
          (long long)step, (long long)o->steps, out->loss, zl, lr, out->grad_norm, tps, 100 * mf, ge,
          el, et, peak_rss_bytes() / 1e6);
  char lb[32], gb[32], zb[32], eb[32];
  if (!r->metrics_lost) {
    fprintf(r->metrics, "{\"step\": %lld, \"loss\": %s, \"z_loss\": %s, \"lr\": %.8g, \"grad_norm\": %s, "
            "\"tokens\": %lld, \"tokens_per_s\": %.6g, \"mfu\": %.5g, \"gemm_eff\": %s, \"elapsed_s\": %.3f, "
            "\"eta_s\": %.1f, \"step_s\": %.4f, \"dp_wait_s\": %.5f, \"rss_bytes\": %.0f, \"skipped\": %d}\n",
            (long long)step, jnum(lb, sizeof lb, out->loss), jnum(zb, sizeof zb, out->z_loss), lr,
            jnum(gb, sizeof gb, out->grad_norm),
            (long long)meta->tokens_seen, tps, mf, jnum(eb, sizeof eb, geff), elapsed, eta, dt, out->dp_wait_s, peak_rss_bytes(),
            !out->finite);
    metrics_flushed(r);
  }
  s->steps_time = 0, s->tokens_at_last = meta->tokens_seen;
}

static int validate(gj_run *r, int64_t step) {
  double nll;
  int64_t cnt;
  gj_grid *g = r->tr->g;
  GJ_TRY(gj_evaluate(r->tr->m, r->valid, r->T, r->T, r->B, r->o.eval_batches * r->B * g->dp_size, &nll, &cnt));
  gj_info("step %lld | validation loss %.4f | perplexity %.2f | %lld tokens", (long long)step,
          nll / cnt, exp(nll / cnt), (long long)cnt);
  char lb[32], pb[32];
  if (r->metrics && !r->metrics_lost)
    fprintf(r->metrics, "{\"step\": %lld, \"val_loss\": %s, \"val_ppl\": %s, \"val_tokens\": %lld}\n",
            (long long)step, jnum(lb, sizeof lb, nll / cnt), jnum(pb, sizeof pb, exp(nll / cnt)), (long long)cnt),
        metrics_flushed(r);
  return 0;
}

/* The time of a validation for --max-time: the last one's; before the first, the step time
 * scaled by the tokens it scores over a step's: a forward alone takes no longer a token than
 * a training step (measured on the tiny model, whose vocabulary head dominates, about as long:
 * a 10 s validation after 20 ms steps of 128 tokens over 63,880 tokens). */
static double eval_guess(const loop_state *s) {
  if (s->eval_s > 0) return s->eval_s;
  const gj_run *r = s->r;
  double tokens = (double)r->valid->n_tokens, step_tokens = (double)s->G * r->T;
  if (r->o.eval_batches > 0)
    tokens = GJ_MIN(tokens, (double)r->o.eval_batches * r->B * r->tr->g->dp_size * r->T);
  return s->ema * tokens / step_tokens;
}

/* One step of the loop: the batch, the update, the bookkeeping; *stop = 1 ends the loop
 * after a clean stop (signal, --max-time: a checkpoint was saved). */
static int loop_step(loop_state *s, int *stop) {
  gj_run *r = s->r;
  gj_ckpt_meta *meta = r->meta;
  const gj_run_opts *o = &r->o;
  gj_grid *g = r->tr->g;
  double t0 = gj_now();
  int64_t step = meta->step + 1;
  GJ_TRY(gj_loader_next(r->loader, s->G, s->win));
  if (step == s->first + 1) gj_gemm_record_reset(), gj_gemm_record(1);
  double lr = gj_schedule_lr(&o->sched, step);
  gj_step_in in = {step, meta->updates + 1, lr, r->A, r->B, r->T, (double)s->G * r->T, fill_batch, s,
                   o->inject_nan == step ? (int)o->nan_part + 1 : 0};
  gj_step_out out;
  int rc = gj_train_step(r->tr, &in, &out);
  gj_gemm_record(0);
  if (rc) return rc;
  if (out.finite) s->bad = 0, meta->updates++;
  else s->bad++;
  if (!out.finite && g->rank == 0) { /* every rank skips it (the norm is global); rank 0 says so */
    if (out.huge)
      gj_warn("step %lld: a gradient element of %g or more (gradient norm %g; its square would overflow "
              "AdamW's float32 second moment): update skipped (%lld in a row)", (long long)step, GJ_GRAD_MAX,
              out.grad_norm, (long long)s->bad);
    else
      gj_warn("step %lld: non-finite loss %g or gradient norm %g: update skipped (%lld in a row)",
              (long long)step, out.loss, out.grad_norm, (long long)s->bad);
  }
  meta->step = step;
  meta->tokens_seen += s->G * r->T;
  meta->loader = r->loader->st;
  double now = gj_now(), dt = now - t0;
  probe_ceilings(s, step, &now);
  /* The memory check counts what gptj allocates and what the process held before; the
   * libraries' per-thread buffers come later (the BLAS's and oneDNN's work space, a malloc
   * arena a thread: about 25 MB a thread past the first here). Measured, and said once. */
  const double peak = peak_rss_bytes();
  if (r->mem_budget > 0 && !s->over && peak > r->mem_budget) {
    s->over = 1;
    gj_warn("step %lld: peak resident memory %.3f GB is above --mem-per-rank-gb %.3f: the memory check "
            "does not count the libraries' per-thread buffers (BLAS, oneDNN, malloc arenas); leave room for them",
            (long long)step, peak / 1e9, r->mem_budget / 1e9);
  }
  s->steps_time += dt;
  /* the first step (cold: primitives created, pages first touched, products recorded) only
   * until the second replaces it */
  s->ema = s->ema == 0 || step == s->first + 2 ? dt : 0.9 * s->ema + 0.1 * dt;
  /* a skipped step is always logged, whatever --log-every */
  if (g->rank == 0 && (step % o->log_every == 0 || step == o->steps || !out.finite))
    log_step(s, step, &out, lr, &now, dt);
  if (s->bad >= o->max_bad)
    return GJ_FAIL("%lld skipped steps in a row (non-finite, or a huge gradient element) at step %lld: "
                   "stopping (the last checkpoint is kept)", (long long)s->bad, (long long)step);
  int eval_due = r->valid && o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps);
  /* Stop requests: a signal on any rank, the wall-clock budget (rank 0's clock: the next step,
   * a checkpoint and a validation due now, each as long as its last one), a lost lock. */
  int want[3] = {gj_stop_signal() != 0, 0, gj_rundir_lock_lost()};
  double ahead = 2 * s->ema + s->save_s + (eval_due ? eval_guess(s) : 0);
  if (g->rank == 0 && o->max_time > 0 && now - s->t_start + ahead > o->max_time) want[1] = 1;
  GJ_TRY(gj_allreduce_max_int(g->world, want, 3));
  if (want[2])
    return GJ_FAIL("%s: %s: stopping at step %lld without saving", o->run_dir,
                   want[2] == 1   ? "another process has taken the run directory's lock"
                   : want[2] == 2 ? "the run directory's lock could not be refreshed for GJ_LOCK_STALE_S / 2 (another "
                                    "process may take it)"
                                  : "the run directory's lock is gone after this run had not refreshed it for "
                                    "GJ_LOCK_STALE_S / 2 (stopped or stalled: another process may have taken it over since)",
                   (long long)step);
  /* a stop (a signal, or a budget without room for it) leaves a validation out, not the last step's */
  if (eval_due && (!(want[0] || want[1]) || step == o->steps)) {
    double t0v = gj_now();
    GJ_TRY(validate(r, step));
    s->eval_s = gj_now() - t0v;
  }
  int last = step == o->steps || want[0] || want[1];
  if (last || (o->save_every > 0 && step % o->save_every == 0)) {
    double t0s = gj_now();
    GJ_TRY(gj_run_save(r->tr->st, g, o, meta));
    s->save_s = gj_now() - t0s;
  }
  if ((want[0] || want[1]) && step < o->steps) {
    gj_info("%s: stopped at step %lld after a checkpoint", want[0] ? "signal" : "--max-time", (long long)step);
    *stop = 1;
  }
  return 0;
}

int gj_run_loop(gj_run *r) {
  gj_grid *g = r->tr->g;
  loop_state s = {.r = r, .G = r->B * r->A * g->dp_size, .first = r->meta->step,
                  .tokens_at_last = r->meta->tokens_seen, .peak = r->peak,
                  .flops_tok = gj_flops_per_token(&r->tr->st->c, r->T)};
  s.win = malloc(s.G * sizeof(uint64_t));
  int rc = s.win ? 0 : GJ_FAIL("out of memory for a batch of %lld sequences", (long long)s.G);
  GJ_AGREE(g->world, rc);
  gj_loader_set_share(r->loader, (int64_t)g->dp_rank * r->A * r->B, r->A * r->B); /* fill_batch's part */
  s.t_start = gj_now();
  int stop = 0;
  while (r->meta->step < r->o.steps && !rc && !stop) rc = loop_step(&s, &stop);
  free(s.win);
  return gj_agree(g->world, rc);
}
