/* gptj eval (perplexity of a checkpoint), gptj generate (sampling with a KV cache) and
 * gptj info (metadata of a checkpoint or a token dataset). */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "train/evaluate.h"
#include "cli/gemmopts.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/checkpoint.h"
#include "io/blend.h"
#include "io/dataset.h"
#include "io/megatron.h"
#include "io/outfile.h"
#include "io/filekind.h"
#include "io/hf.h"
#include "io/tokenizer.h"
#include "model/generate.h"
#include "model/gptj.h"
#include "parallel/grid.h"

#define GJ_HF_HELP "a Hugging Face GPT-J directory (config.json + safetensors, single or sharded, F32/F16/BF16), read directly: each rank reads its TP slices (instead of --checkpoint)"

/* Tensor t of a Hugging Face directory, read in blocks of rows of at most 4 Mi floats, into
 * the bfloat16 store of a bf16-resident state (rounded as the bf16 path rounds weights). */
static int read_hf_rounded(gj_hf *h, gj_state *st, const gj_tensor *t, float *buf, int64_t rows) {
  for (int64_t r0 = 0; r0 < t->lrows; r0 += rows) {
    int64_t nr = GJ_MIN(rows, t->lrows - r0);
    size_t n = (size_t)nr * t->lcols;
    GJ_TRY(gj_hf_read_rows(h, t, r0, nr, buf));
    for (size_t k = 0; k < n; k++)
      if (!isfinite(buf[k])) return GJ_FAIL("%s: tensor '%s' has a non-finite value", h->dir, t->name);
    gj_bf16_round(st->w16 + t->offset + (size_t)r0 * t->lcols, buf, n);
  }
  return 0;
}

/* This rank's slices of every tensor of a Hugging Face directory into st: float32 into its
 * parameters, or, for a bf16-resident state, the GEMM weights and the embedding into its
 * bfloat16 store. */
static int read_hf_weights(gj_hf *h, gj_state *st) {
  GJ_TRY(gj_hf_check(h, &st->lay));
  int64_t rows = 1;
  for (int i = 0; i < st->lay.n; i++) rows = GJ_MAX(rows, st->lay.t[i].lcols);
  rows = GJ_MAX((int64_t)1, ((int64_t)1 << 22) / rows);
  float *buf = st->w16 ? malloc(((size_t)1 << 22) * sizeof(float) + 64) : NULL;
  int rc = st->w16 && !buf ? GJ_FAIL("out of memory") : 0;
  for (int i = 0; i < st->lay.n && !rc; i++) {
    const gj_tensor *t = &st->lay.t[i];
    if (st->w16 && gj_tensor_resident16(t)) {
      rc = read_hf_rounded(h, st, t, buf, rows);
    } else {
      float *p = st->params + t->offset;
      rc = gj_hf_read(h, t, p);
      for (size_t k = 0; !rc && k < t->numel; k++)
        if (!isfinite(p[k])) rc = GJ_FAIL("%s: tensor '%s' has a non-finite value", h->dir, t->name);
    }
    if (!rc && gj_stop_signal())
      rc = GJ_FAIL("stopped by %s while loading %s", gj_signal_name(gj_stop_signal()), h->dir);
  }
  free(buf);
  return rc;
}

/* Grid, config from the checkpoint (or Hugging Face directory hf), model with capacity [B, T],
 * weights loaded (each rank reads its own TP slices; in bf16 the GEMM weights and the embedding
 * rounded into bfloat16 as read, the only copy held); keep: what the network keeps of its
 * activations (GJ_FORWARD for eval, GJ_DECODE for generate's KV cache). The caller frees st,
 * m and g (zeroed before), whatever this returns. */
static int load_model(gj_state *st, gj_model *m, gj_grid *g, const char *ckpt, const char *hf, int64_t tp,
                      int64_t B, int64_t *T, int keep, const char *gemm, const char *prec, double mem_gb,
                      const char *hint) {
  gj_comm w = gj_comm_world();
  int rc = !ckpt == !hf ? GJ_FAIL("give one of --checkpoint or --hf") : 0;
  gj_config c;
  gj_hf h = {0};
  if (!rc) rc = gj_grid_init(g, (int)tp);
  if (!rc) gj_log_set_rank(g->rank);
  GJ_AGREE(w, rc);
  GJ_TRY(gj_cli_gemm_setup(gemm, prec, w));
  rc = ckpt ? gj_ckpt_read_config(ckpt, &c) : gj_hf_open(&h, hf, &c);
  if (!rc && *T == 0) *T = c.n_positions;
  if (!rc && *T > c.n_positions)
    rc = GJ_FAIL("--seq-len %lld exceeds the %s's n_positions %lld", (long long)*T, ckpt ? "checkpoint" : "model",
                 (long long)c.n_positions);
  /* refuse, before allocating, a model that does not fit (what the weights-only state and
   * gj_model_create allocate: no gradients or optimizer moments) */
  gj_mem_sizes ms;
  /* in bf16 the GEMM weights and the embedding are held in bfloat16 only */
  int lean16 = gj_gemm_precision() == GJ_PREC_BF16;
  size_t wbytes = 0;
  if (!rc) rc = gj_model_sizes(&ms, &c, g->tp_size, g->dp_size, 0, keep, 0, B, *T, omp_get_max_threads());
  if (!rc) rc = lean16 ? gj_state_weights16_bytes(&c, g->tp_size, &wbytes) : (wbytes = ms.params, 0);
  if ((rc = gj_agree(w, rc))) return gj_hf_close(&h), rc;
  char detail[256], held[64] = "";
  /* against --mem-per-rank-gb what the process holds already (libraries, MPI; MemAvailable
   * has it taken off already) */
  const double base = mem_gb > 0 ? gj_self_rss_bytes() : 0;
  if (base > 0) snprintf(held, sizeof held, ", this process so far %.2f", base / 1e9);
  snprintf(detail, sizeof detail, "weights%s %.2f, activations %.2f%s", lean16 ? " in bf16" : "", wbytes / 1e9,
           ms.acts / 1e9, held);
  rc = gj_mem_check(w, (double)wbytes + ms.acts + base, detail, hint, mem_gb, NULL);
  if (!rc) {
    rc = lean16 ? gj_state_create_weights16(st, &c, g) : gj_state_create_weights(st, &c, g);
    if (!rc) rc = gj_model_create(m, st, g, B, *T, keep, 0);
    rc = gj_agree(w, rc);
  }
  if (!rc && hf) rc = gj_agree(w, read_hf_weights(&h, st));
  gj_hf_close(&h);
  if (rc || hf) return rc;
  gj_ckpt_meta meta;
  return gj_ckpt_load(ckpt, st, g, &meta, 0);
}

int gj_cmd_eval(int argc, char **argv) {
  const char *ckpt = NULL, *hf = NULL, *data = NULL, *gemm = "auto", *prec = "fp32";
  int64_t tp = 1, T = 0, S = 0, B = 4, max_windows = 0;
  double mem_gb = 0;
  gj_opt opts[] = {
      {"checkpoint", GJ_OPT_STR, &ckpt, "checkpoint to evaluate (or --hf)", 1, 0},
      {"hf", GJ_OPT_STR, &hf, GJ_HF_HELP, 1, 0},
      {"data", GJ_OPT_STR, &data, "one token dataset (a file or a Megatron prefix), required", 1, 0},
      {"tp", GJ_OPT_I64, &tp, "tensor-parallel size (windows are spread over DP = ranks / TP)", 1, 4096},
      {"seq-len", GJ_OPT_I64, &T, "window length T (0: n_positions)", 0, 1 << 20},
      {"stride", GJ_OPT_I64, &S, "sliding-window stride S (0: T, non-overlapping windows)", 0, 1 << 20},
      {"micro-batch", GJ_OPT_I64, &B, "windows per forward", 1, 1 << 20},
      {"max-windows", GJ_OPT_I64, &max_windows, "evaluate only the first N windows (0: all; bits per byte is then not given: the bytes of a part are not known)", 0, 1e15},
      {"precision", GJ_OPT_STR, &prec, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &gemm, GJ_GEMM_HELP, 1, 0},
      {"mem-per-rank-gb", GJ_OPT_F64, &mem_gb, "memory a rank may use, GB (0: available memory / ranks on the node)", 0, 1e9},
      {NULL}};
  gj_cmdline cl = {"gptj eval --checkpoint FILE | --hf DIR --data FILE.h5 [options]",
                   "Perplexity of a checkpoint (or a Hugging Face model) on a token dataset. Every\n"
                   "token after the first is scored once; with --stride S < T each window re-reads\n"
                   "T-S tokens of context.\n"
                   "Prints the mean negative log-likelihood per token (nats), the perplexity\n"
                   "exp(NLL) and bits per byte = total NLL / ln 2 / the dataset's source bytes.",
                   opts, NULL, NULL, NULL, 0};
  gj_grid g = {0};
  gj_state st = {0};
  gj_model m = {0};
  gj_dataset ds = {0};
  int np, rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) {
    rc = rc > 0 ? 0 : rc;
    goto done;
  }
  if (!data) {
    rc = GJ_FAIL("--data: required");
    goto done;
  }
  /* train's --data takes blends, shard lists and directories; eval scores one dataset */
  struct stat sb;
  char prefix[GJ_PATH_BUF];
  int found = stat(data, &sb) == 0;
  if (found ? S_ISDIR(sb.st_mode)
            : strpbrk(data, ",+:") && !gj_megatron_is(data, prefix, sizeof prefix)) {
    rc = GJ_FAIL("--data %s: eval scores one dataset (a file or a Megatron prefix), not a %s; "
                 "evaluate each dataset on its own", data, found ? "directory" : "blend or list of shards");
    goto done;
  }
  rc = load_model(&st, &m, &g, ckpt, hf, tp, B, &T, GJ_FORWARD, gemm, prec, mem_gb,
                  "use more ranks with --tp, or a smaller --seq-len or --micro-batch");
  if (rc) goto done;
  if (S == 0) S = T;
  if (S > T) {
    rc = GJ_FAIL("--stride %lld exceeds --seq-len %lld", (long long)S, (long long)T);
    goto done;
  }
  rc = gj_dataset_open(&ds, data, m.c.vocab_size);
  if ((rc = gj_agree(gj_comm_world(), rc))) goto done;
  double t0 = gj_now(), nll;
  int64_t cnt;
  if ((rc = gj_evaluate(&m, &ds, T, S, B, max_windows, &nll, &cnt))) goto done;
  if (!isfinite(nll)) { /* every rank holds the same reduced sum */
    rc = GJ_FAIL("the loss summed over %lld tokens is %g: the model's logits are not finite (its weights or "
                 "activations overflowed)", (long long)cnt, nll);
    goto done;
  }
  double bpb = nll / log(2.0) / (double)ds.n_bytes;
  gj_info("eval %s on %s: %lld tokens scored, window %lld, stride %lld", ckpt ? ckpt : hf, data, (long long)cnt,
          (long long)T, (long long)S);
  /* bits per byte only over the whole dataset of known source bytes */
  char bb[96];
  if (max_windows) snprintf(bb, sizeof bb, "- (--max-windows: a part's bytes are not known)");
  else if (!ds.n_bytes) snprintf(bb, sizeof bb, "- (the dataset records no source bytes)");
  else snprintf(bb, sizeof bb, "%.6f", bpb);
  gj_info("nll %.6f | perplexity %.4f | bits per byte %s | %.1f s", nll / cnt, exp(nll / cnt), bb, gj_now() - t0);
done:
  gj_dataset_free(&ds);
  gj_model_free(&m);
  gj_state_free(&st);
  gj_grid_free(&g);
  return rc;
}

typedef struct { float v; int32_t i; } cand;
static int cand_desc(const void *a, const void *b) {
  float x = ((const cand *)a)->v, y = ((const cand *)b)->v;
  if (x != y) return x < y ? 1 : -1;
  return ((const cand *)a)->i - ((const cand *)b)->i;
}

/* Sample from full logits [V] (same result on every rank: same logits, same seed). */
static int32_t sample(const float *logits, int64_t V, double temp, int64_t topk, double topp,
                      uint64_t *rng, cand *work) {
  int64_t best = 0;
  for (int64_t j = 1; j < V; j++) if (logits[j] > logits[best]) best = j;
  if (temp <= 0) return (int32_t)best;
  for (int64_t j = 0; j < V; j++) work[j].v = logits[j], work[j].i = (int32_t)j;
  qsort(work, V, sizeof(cand), cand_desc);
  int64_t k = topk > 0 && topk < V ? topk : V;
  double mx = work[0].v, sum = 0;
  for (int64_t j = 0; j < k; j++) sum += exp((work[j].v - mx) / temp);
  if (topp < 1) { /* smallest prefix with probability >= topp (0: the most likely token alone) */
    double acc = 0;
    for (int64_t j = 0; j < k; j++) {
      acc += exp((work[j].v - mx) / temp) / sum;
      if (acc >= topp) { k = j + 1; break; }
    }
    sum = 0;
    for (int64_t j = 0; j < k; j++) sum += exp((work[j].v - mx) / temp);
  }
  double u = (gj_splitmix64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
  for (int64_t j = 0; j < k; j++) {
    acc += exp((work[j].v - mx) / temp);
    if (u < acc) return work[j].i;
  }
  return work[k - 1].i;
}

/* --prompt-ids: ids separated by spaces or commas, each in [0, 2^31). */
static int parse_ids(const char *s, gj_ids *ids) {
  char *p = (char *)s, *end;
  int rc = 0;
  while (!rc && *p) {
    while (*p == ' ' || *p == ',') p++;
    if (!*p) break;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || (*end && *end != ' ' && *end != ','))
      rc = GJ_FAIL("--prompt-ids: '%s' is not a list of integers", s);
    else if (errno == ERANGE || v < 0 || v > INT32_MAX) /* never truncated to 32 bits */
      rc = GJ_FAIL("--prompt-ids: id %.*s outside the vocabulary", (int)GJ_MIN(end - p, 40), p);
    else rc = gj_ids_push(ids, (int32_t)v), p = end;
  }
  return rc;
}

/* The prompt's ids, from its text or its ids; the tokenizer (*tok) too unless only ids are
 * read and printed. */
static int read_prompt(const char *prompt, const char *prompt_ids, int print_ids, const char *dir,
                       gj_tokenizer **tok, gj_ids *ids) {
  int rc = 0;
  if (prompt || !print_ids) rc = gj_tokenizer_load(tok, dir);
  if (!rc && prompt) rc = gj_tokenizer_encode(*tok, prompt, strlen(prompt), ids);
  if (!rc && prompt_ids) rc = parse_ids(prompt_ids, ids);
  if (!rc && ids->n == 0) rc = GJ_FAIL("%s: empty prompt", prompt ? "--prompt" : "--prompt-ids");
  return rc;
}

/* The prompt's ids are the model's and, with the new ones, fit the context of T (+1: the last
 * token is sampled, never fed); *max_new is cut to what fits. */
static int fit_prompt(const gj_ids *ids, const char *flag, int64_t V, int64_t T, int64_t *max_new) {
  for (size_t i = 0; i < ids->n; i++)
    if (ids->v[i] < 0 || ids->v[i] >= V)
      return GJ_FAIL("%s: id %d outside the model's vocabulary [0, %lld)", flag, ids->v[i], (long long)V);
  if ((int64_t)ids->n + *max_new > T + 1) {
    *max_new = T + 1 - (int64_t)ids->n;
    if (*max_new >= 1)
      gj_info("note: the context of %lld tokens holds the prompt's %zu and %lld new ones (not --max-new-tokens)",
              (long long)T, ids->n, (long long)*max_new);
  }
  if (*max_new < 1)
    return GJ_FAIL("%s: the prompt has %zu tokens, more than the context of %lld leaves room for (at most %lld, "
                   "with one new token): shorten it", flag, ids->n, (long long)T, (long long)T);
  return 0;
}

typedef struct {
  double temp, topp;
  int64_t topk;
  uint64_t rng; /* the same seed on every rank: the same tokens */
} sampler;

/* Appends up to max_new sampled tokens to ids, the prompt fed first through the KV cache;
 * stops after <|endoftext|>. Ids >= Vreal (the padding of the vocabulary)
 * are never sampled. full: [V], work: [V]. */
static int extend(gj_model *m, gj_ids *ids, int64_t max_new, int64_t Vreal, sampler *sm,
                  float *full, cand *work) {
  int64_t V = m->c.vocab_size, pos = 0, n = (int64_t)ids->n, s = 0;
  int rc = 0;
  double t0 = gj_now(), t_prompt = 0;
  for (; s < max_new && !rc; s++) {
    rc = gj_model_forward_cached(m, ids->v + pos, n, pos);
    if (!rc) rc = gj_tp_allgather_vocab(m->g, full, m->a.logits, V);
    if (rc) break;
    if (s == 0) t_prompt = gj_now() - t0;
    pos += n, n = 1;
    for (int64_t j = 0; j < Vreal && !rc; j++) /* every rank holds the same logits: agreed */
      if (!isfinite(full[j]))
        rc = GJ_FAIL("new token %lld: the model's logit of token %lld is %g (the weights or the activations "
                     "overflowed): nothing to sample from", (long long)s + 1, (long long)j, full[j]);
    if (rc) break;
    for (int64_t j = Vreal; j < V; j++) full[j] = -INFINITY; /* padding rows are not tokens */
    int32_t next = sample(full, V, sm->temp, sm->topk, sm->topp, &sm->rng, work);
    rc = gj_ids_push(ids, next);
    if (next == GJ_EOT_ID) {
      s++;
      break;
    }
  }
  /* on stderr: stdout holds the text (or the ids) */
  if (!rc && s > 0 && m->g->rank == 0)
    fprintf(stderr, "generate: prompt of %lld tokens in %.2f s, %lld new tokens at %.3f s each (KV cache)\n",
            (long long)(pos + 1 - s), t_prompt, (long long)s, s > 1 ? (gj_now() - t0 - t_prompt) / (s - 1) : 0.0);
  return rc;
}

/* Rank 0's output into f: every id, or the text: the prompt as given (--prompt) or decoded
 * (--prompt-ids), then the new ids' bytes, all of them (a NUL byte is a byte like another).
 * A write error is the caller's to see (ferror). */
static int print_generated(FILE *f, const gj_ids *ids, size_t n_prompt, int print_ids, const char *prompt,
                           gj_tokenizer *tok) {
  int rc = 0;
  if (print_ids) {
    for (size_t i = 0; i < ids->n; i++) fprintf(f, i ? " %d" : "%d", ids->v[i]);
    fputc('\n', f);
  } else {
    gj_bytes out = {0};
    if (prompt) rc = gj_bytes_append(&out, prompt, strlen(prompt));
    if (!rc) rc = gj_tokenizer_decode(tok, ids->v + (prompt ? n_prompt : 0), ids->n - (prompt ? n_prompt : 0), &out);
    if (!rc) fwrite(out.v, 1, out.n, f), fputc('\n', f);
    free(out.v);
  }
  fflush(f);
  return rc;
}

/* --out before any work: its directory exists, and it is none of the inputs (the checkpoint,
 * the Hugging Face files, the vocabulary files where they are read). Rank 0's check. */
static int plan_out(const char *out, const char *ckpt, const char *hf, const char *vocab_dir) {
  enum { MAXIN = GJ_HF_MAX_SHARDS + 4 };
  gj_file_ref ins[MAXIN];
  char enc[GJ_PATH_BUF], bpe[GJ_PATH_BUF];
  int n = 0;
  if (ckpt) ins[n++] = (gj_file_ref){"--checkpoint", ckpt};
  gj_hf h;
  int hf_open = 0;
  if (hf) {
    gj_config c;
    GJ_TRY(gj_hf_open(&h, hf, &c));
    hf_open = 1;
    n += gj_hf_inputs(&h, ins + n, MAXIN - 2 - n);
  }
  if (vocab_dir) {
    snprintf(enc, sizeof enc, "%s/encoder.json", vocab_dir);
    snprintf(bpe, sizeof bpe, "%s/vocab.bpe", vocab_dir);
    ins[n++] = (gj_file_ref){"--vocab-dir", enc}, ins[n++] = (gj_file_ref){"--vocab-dir", bpe};
  }
  int rc = gj_outfile_plan(&(gj_file_ref){"--out", out}, 1, ins, n);
  if (hf_open) gj_hf_close(&h);
  return rc;
}

/* --out: the output into a temporary beside the file, synced and renamed into place only when
 * every byte is written (gj_outfile). */
static int write_generated(const char *path, const gj_ids *ids, size_t n_prompt, int print_ids,
                           const char *prompt, gj_tokenizer *tok) {
  gj_outfile of;
  GJ_TRY(gj_outfile_begin(&of, path));
  FILE *f = fopen(of.tmp, "w");
  if (!f) {
    int e = errno;
    return gj_outfile_abort(&of), GJ_FAIL("--out %s: cannot create %s: %s", path, of.tmp, strerror(e));
  }
  errno = 0;
  int rc = print_generated(f, ids, n_prompt, print_ids, prompt, tok), e = errno;
  int bad = ferror(f);
  if (fclose(f) && !bad) bad = 1, e = errno;
  if (rc || bad) {
    gj_outfile_abort(&of);
    return rc ? rc : GJ_FAIL("--out %s: write error: %s", path, e ? strerror(e) : "a write failed");
  }
  return gj_outfile_commit(&of);
}

int gj_cmd_generate(int argc, char **argv) {
  const char *ckpt = NULL, *hf = NULL, *prompt = NULL, *prompt_ids = NULL, *dir = gj_tokenizer_default_dir();
  const char *gemm = "auto", *prec = "fp32", *out = NULL;
  int64_t tp = 1, max_new = 64, topk = 0, seed = 1234;
  double temp = 0.8, topp = 0.95, mem_gb = 0;
  int print_ids = 0;
  gj_opt opts[] = {
      {"checkpoint", GJ_OPT_STR, &ckpt, "checkpoint (or --hf)", 1, 0},
      {"hf", GJ_OPT_STR, &hf, GJ_HF_HELP, 1, 0},
      {"prompt", GJ_OPT_STR, &prompt, "prompt text", 1, 0},
      {"prompt-ids", GJ_OPT_STR, &prompt_ids, "prompt as space-separated token ids (instead of --prompt)", 1, 0},
      {"max-new-tokens", GJ_OPT_I64, &max_new, "tokens to generate at most", 1, 1 << 20},
      {"temperature", GJ_OPT_F64, &temp, "softmax temperature (0: greedy)", 0, 100},
      {"top-k", GJ_OPT_I64, &topk, "sample among the k most likely tokens (0: all)", 0, 1 << 20},
      {"top-p", GJ_OPT_F64, &topp, "nucleus sampling: smallest set with this probability (0: the most likely token; 1: off)", 0, 1},
      {"seed", GJ_OPT_I64, &seed, "sampling seed", 0, 9e18},
      {"tp", GJ_OPT_I64, &tp, "tensor-parallel size", 1, 4096},
      {"ids", GJ_OPT_FLAG, &print_ids, "print the token ids instead of text (with --prompt-ids the vocabulary "
       "files are not read: GPT-2's 50,257 ids are the tokens, 50256 ends the text)", 1, 0},
      {"vocab-dir", GJ_OPT_STR, &dir, "directory with encoder.json and vocab.bpe", 1, 0},
      {"out", GJ_OPT_STR, &out, "write the output to this file instead of stdout (under a temporary name, synced, "
       "renamed into place when complete): a write error such as a full disk is then an error, which stdout "
       "under mpirun or srun, forwarded by the launcher, cannot report; '-': stdout", 1, 0},
      {"precision", GJ_OPT_STR, &prec, GJ_PRECISION_HELP, 1, 0},
      {"gemm", GJ_OPT_STR, &gemm, GJ_GEMM_HELP, 1, 0},
      {"mem-per-rank-gb", GJ_OPT_F64, &mem_gb, "memory a rank may use, GB (0: available memory / ranks on the node)", 0, 1e9},
      {NULL}};
  gj_cmdline cl = {"gptj generate --checkpoint FILE | --hf DIR --prompt TEXT [options]",
                   "Continues a prompt with a KV cache: greedy (--temperature 0) or sampled with\n"
                   "temperature, top-k and top-p. Stops at <|endoftext|> or --max-new-tokens. Prints\n"
                   "the prompt's text and the new text (every byte), or with --ids every id.",
                   opts, NULL, NULL, NULL, 0};
  gj_tokenizer *tok = NULL;
  gj_ids ids = {0};
  gj_grid g = {0};
  gj_state st = {0};
  gj_model m = {0};
  float *full = NULL;
  cand *work = NULL;
  int64_t T = 0;
  gj_info_to_stderr(); /* stdout holds the text or the ids alone */
  int np, rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) {
    rc = rc > 0 ? 0 : rc;
    goto done;
  }
  if (out && !strcmp(out, "-")) out = NULL; /* stdout, as without --out */
  rc = !prompt == !prompt_ids ? GJ_FAIL("give one of --prompt or --prompt-ids")
                              : read_prompt(prompt, prompt_ids, print_ids, dir, &tok, &ids);
  if (!rc && out && gj_comm_rank(gj_comm_world()) == 0) /* before the work; rank 0 writes it */
    rc = plan_out(out, ckpt, hf, tok ? dir : NULL);
  if ((rc = gj_agree(gj_comm_world(), rc))) goto done;
  rc = load_model(&st, &m, &g, ckpt, hf, tp, 1, &T, GJ_DECODE, gemm, prec, mem_gb,
                  "use more ranks with --tp (generate holds the KV cache of the whole context)");
  if (rc || (rc = fit_prompt(&ids, prompt ? "--prompt" : "--prompt-ids", m.c.vocab_size, T, &max_new))) goto done;
  /* the tokens: the tokenizer's, GPT-2's 50,257 where it is not read (--prompt-ids with --ids);
   * the model's rows past them pad the vocabulary */
  int64_t V = m.c.vocab_size, Vreal = GJ_MIN(V, tok ? gj_tokenizer_vocab_size(tok) : GJ_EOT_ID + 1);
  full = malloc(V * sizeof(float));
  work = malloc(V * sizeof(cand));
  rc = full && work ? 0 : GJ_FAIL("out of memory for the logits of %lld tokens", (long long)V);
  if ((rc = gj_agree(gj_comm_world(), rc))) goto done;
  sampler sm = {temp, topp, topk, (uint64_t)seed};
  size_t n_prompt = ids.n;
  rc = extend(&m, &ids, max_new, Vreal, &sm, full, work);
  if (!rc && g.rank == 0)
    rc = out ? write_generated(out, &ids, n_prompt, print_ids, prompt, tok)
             : print_generated(stdout, &ids, n_prompt, print_ids, prompt, tok);
done:
  free(full), free(work), free(ids.v);
  gj_tokenizer_free(tok);
  gj_model_free(&m);
  gj_state_free(&st);
  gj_grid_free(&g);
  return rc;
}

int gj_cmd_info(int argc, char **argv) {
  gj_cmdline cl = {"gptj info FILE.h5|PREFIX|DATA", "Prints the metadata of a checkpoint or a token dataset (HDF5,\n"
                   "or Megatron's PREFIX.bin + PREFIX.idx), or the corpora of a train --data text (a\n"
                   "directory of datasets, shards joined by '+', a blend WEIGHT:DATA,WEIGHT:DATA,...).",
                   (gj_opt[]){{NULL}}, NULL, NULL, NULL, 1};
  char *pos[1];
  int np;
  int rc = gj_args_parse(&cl, argc, argv, pos, &np);
  if (rc) return rc > 0 ? 0 : rc;
  if (np != 1) return GJ_FAIL("expected one file (see --help)");
  struct stat sb;
  int found = stat(pos[0], &sb) == 0;
  if (found ? S_ISDIR(sb.st_mode) : strpbrk(pos[0], ",+:") != NULL) { /* a directory or a --data text */
    gj_data d;
    GJ_TRY(gj_data_open(&d, pos[0], "DATA", 0));
    gj_data_print(&d);
    gj_data_free(&d);
    return 0;
  }
  char prefix[GJ_PATH_BUF];
  if (gj_megatron_is(pos[0], prefix, sizeof prefix)) {
    gj_dataset d;
    GJ_TRY(gj_dataset_open(&d, pos[0], 0));
    printf("file: %s.bin, %s.idx\nformat: megatron (MMIDIDX version 1)\ndtype: %s\n"
           "vocabulary: not recorded (ids are checked against the model's)\n"
           "documents: %llu\nsequences: %llu\ntokens: %llu\n",
           prefix, prefix, d.dtype, (unsigned long long)d.n_docs, (unsigned long long)d.n_seqs,
           (unsigned long long)d.n_tokens);
    gj_dataset_free(&d);
    return 0;
  }
  gj_filekind kind;
  GJ_TRY(gj_filekind_of(pos[0], &kind));
  if (kind != GJ_FILE_TOKENS) return gj_ckpt_info(pos[0]);
  gj_dataset d;
  GJ_TRY(gj_dataset_open(&d, pos[0], 0));
  printf("file: %s\nformat: gptj-mpi-tokens\ntokenizer: gpt2 (vocab %lld, eot 50256)\n"
         "documents: %llu\ntokens: %llu\nsource bytes: %llu\nbytes per token: %.4f\n",
         pos[0], (long long)d.vocab_size, (unsigned long long)d.n_docs,
         (unsigned long long)d.n_tokens, (unsigned long long)d.n_bytes,
         d.n_tokens ? (double)d.n_bytes / d.n_tokens : 0.0);
  gj_dataset_free(&d);
  return 0;
}
