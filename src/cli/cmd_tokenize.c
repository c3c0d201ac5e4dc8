/* gptj tokenize: text / JSONL (plain, gzip or zstd), files and directories -> token
 * dataset(s) in HDF5, streamed, in bounded memory, in parallel.
 *
 * The inputs are cut into parts: whole files, and line-aligned byte ranges of the large
 * uncompressed ones (io/docstream.h). The parts go to the ranks (largest first, each to the
 * least loaded rank); each rank tokenizes its parts in turn into a spool of its own beside the
 * output (the tokens as uint16, and a (tokens, bytes) pair per document). An all-reduce of the
 * parts' counts gives every rank where each part's documents and tokens go; rank 0 creates the
 * output(s) with HDF5 (io/tokfile.h: contiguous /tokens and /doc_offsets, allocated, not
 * filled) and every rank copies its spool into its ranges of them. The documents keep the
 * order of the inputs whatever the partition, so the output is byte-identical whatever the
 * number of ranks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/crc32.h"
#include "io/docstream.h"
#include "io/outfile.h"
#include "io/tokenizer.h"
#include "io/tokfile.h"
#include "parallel/grid.h"

#define MAX_INPUTS 256
#define TOK_BUF ((size_t)1 << 20) /* tokens buffered before a write (2 MB) */
#define LEN_BUF ((size_t)1 << 15) /* documents' lengths buffered (512 kB) */
#define BUFFERS_MB 16             /* read buffers, write buffers and spools' buffers, rounded up */
#define TOKENIZER_MB 48           /* the BPE tables and their cache */

/* ---- the input files ---- */

typedef struct {
  char **v;
  size_t n, cap;
} strlist;

static int strlist_add(strlist *l, const char *s) {
  if (l->n == l->cap) {
    size_t nc = 2 * l->cap + 16;
    char **p = realloc(l->v, nc * sizeof *p);
    if (!p) return GJ_FAIL("out of memory listing the inputs");
    l->v = p, l->cap = nc;
  }
  if (!(l->v[l->n] = strdup(s))) return GJ_FAIL("out of memory listing the inputs");
  l->n++;
  return 0;
}

static void strlist_free(strlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The files a directory contributes: text, JSONL, optionally .gz / .zst. */
static int is_corpus_name(const char *name) {
  size_t n = strlen(name);
  if (n > 3 && !strcmp(name + n - 3, ".gz")) n -= 3;
  else if (n > 4 && !strcmp(name + n - 4, ".zst")) n -= 4;
  static const char *ext[] = {".txt", ".text", ".jsonl", ".json"};
  for (int i = 0; i < 4; i++) {
    size_t k = strlen(ext[i]);
    if (n > k && !strncmp(name + n - k, ext[i], k)) return 1;
  }
  return 0;
}

/* Append dir's corpus files, recursively, in byte order of the names (hidden ones skipped). */
static int expand_dir(strlist *files, const char *dir, int depth) {
  if (depth > 32) return GJ_FAIL("%s: directories nested too deep", dir);
  DIR *d = opendir(dir);
  if (!d) return GJ_FAIL("%s: %s", dir, strerror(errno));
  strlist names = {0};
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d)))
    if (e->d_name[0] != '.') rc = strlist_add(&names, e->d_name);
  closedir(d);
  if (!rc && names.n) qsort(names.v, names.n, sizeof *names.v, by_name);
  for (size_t i = 0; i < names.n && !rc; i++) {
    char p[GJ_PATH_BUF];
    struct stat st;
    if ((rc = gj_path_join(p, sizeof p, dir, names.v[i]))) break;
    if (stat(p, &st)) continue; /* a dangling link */
    if (S_ISDIR(st.st_mode)) rc = expand_dir(files, p, depth + 1);
    else if (S_ISREG(st.st_mode) && is_corpus_name(names.v[i])) rc = strlist_add(files, p);
  }
  strlist_free(&names);
  return rc;
}

static int expand_inputs(strlist *files, char **inputs, int nin) {
  for (int i = 0; i < nin; i++) {
    struct stat st;
    if (strcmp(inputs[i], "-") && !stat(inputs[i], &st) && S_ISDIR(st.st_mode)) {
      size_t before = files->n;
      GJ_TRY(expand_dir(files, inputs[i], 0));
      if (files->n == before)
        return GJ_FAIL("%s: no input files in the directory (*.txt, *.text, *.jsonl, *.json, each optionally .gz or .zst)",
                       inputs[i]);
    } else {
      GJ_TRY(gj_outfile_check_input(inputs[i], NULL, GJ_IN_STDIN));
      GJ_TRY(strlist_add(files, inputs[i]));
    }
  }
  return 0;
}

/* --out and --valid-out replace neither an input nor each other */
static int plan_outputs(const char *out, const char *valid_out, const char *dir, const strlist *files) {
  gj_file_ref outs[2] = {{"--out", out}, {"--valid-out", valid_out}};
  gj_file_ref *ins = malloc((files->n + 2) * sizeof *ins);
  char enc[GJ_PATH_BUF], bpe[GJ_PATH_BUF];
  int rc = ins ? 0 : GJ_FAIL("out of memory");
  if (!rc) rc = gj_path_join(enc, sizeof enc, dir, "encoder.json");
  if (!rc) rc = gj_path_join(bpe, sizeof bpe, dir, "vocab.bpe");
  if (!rc) {
    for (size_t i = 0; i < files->n; i++) ins[i] = (gj_file_ref){"input", files->v[i]};
    ins[files->n] = (gj_file_ref){"vocabulary file", enc}, ins[files->n + 1] = (gj_file_ref){"vocabulary file", bpe};
    rc = gj_outfile_plan(outs, valid_out ? 2 : 1, ins, (int)files->n + 2);
  }
  free(ins);
  return rc;
}

/* ---- the parts ---- */

typedef struct {
  size_t file;
  uint64_t lo, hi; /* bytes of the file; hi = UINT64_MAX: a whole (compressed) file */
  uint64_t size;   /* bytes read from the file for it (progress, balance) */
  double weight;   /* estimated text bytes */
  int rank;
} part;

typedef struct {
  double w;
  size_t i;
} ranked;

static int heavier_first(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->w != y->w) return x->w > y->w ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* Cut the files into parts of about part_bytes (uncompressed regular files only) and give
 * them to the ranks, largest first, each to the least loaded (ties: the lower rank). */
static int plan_parts(const strlist *files, uint64_t part_bytes, int size, part **out, size_t *nout, uint64_t *total) {
  size_t n = 0, cap = files->n + 16;
  part *p = malloc(cap * sizeof *p);
  if (!p) return GJ_FAIL("out of memory planning the parts");
  uint64_t *sz = calloc(files->n + 1, sizeof *sz);
  int *kind = calloc(files->n + 1, sizeof *kind);
  int rc = sz && kind ? 0 : GJ_FAIL("out of memory planning the parts");
  *total = 0;
  for (size_t i = 0; i < files->n && !rc; i++) {
    struct stat st;
    if ((rc = gj_docstream_kind(files->v[i], &kind[i]))) break;
    sz[i] = strcmp(files->v[i], "-") && !stat(files->v[i], &st) && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    *total += sz[i];
  }
  if (!rc && part_bytes == 0) /* automatic: about 4 parts a rank, no part under 16 MB */
    part_bytes = size == 1 ? UINT64_MAX : GJ_MAX((uint64_t)16 << 20, *total / (4 * (uint64_t)size) + 1);
  for (size_t i = 0; i < files->n && !rc; i++) {
    int splits = kind[i] == 0 && sz[i] > part_bytes && strcmp(files->v[i], "-");
    uint64_t k = splits ? (sz[i] + part_bytes - 1) / part_bytes : 1;
    for (uint64_t j = 0; j < k; j++) {
      if (n == cap) {
        part *q = realloc(p, (cap *= 2) * sizeof *p);
        if (!q) {
          rc = GJ_FAIL("out of memory planning the parts");
          break;
        }
        p = q;
      }
      uint64_t lo = splits ? sz[i] / k * j + (sz[i] % k) * j / k : 0;
      uint64_t hi = splits ? sz[i] / k * (j + 1) + (sz[i] % k) * (j + 1) / k : UINT64_MAX;
      p[n] = (part){i, lo, hi, splits ? hi - lo : sz[i], 0, 0};
      p[n].weight = (double)p[n].size * (kind[i] == 0 ? 1 : kind[i] == 1 ? 3.5 : 5);
      n++;
    }
  }
  /* largest first (equal weights: in order), each to the least loaded rank */
  double *load = calloc((size_t)size, sizeof *load);
  ranked *order = malloc((n + 1) * sizeof *order);
  if (!rc && (!load || !order)) rc = GJ_FAIL("out of memory planning the parts");
  for (size_t i = 0; i < n && !rc; i++) order[i] = (ranked){p[i].weight, i};
  if (!rc && n) qsort(order, n, sizeof *order, heavier_first);
  for (size_t i = 0; i < n && !rc; i++) {
    int best = 0;
    for (int r = 1; r < size; r++)
      if (load[r] < load[best]) best = r;
    p[order[i].i].rank = best;
    load[best] += p[order[i].i].weight + 1;
  }
  free(load), free(order), free(sz), free(kind);
  if (rc) free(p), p = NULL, n = 0;
  *out = p, *nout = n;
  return rc;
}

/* ---- tokenizing into the spool ---- */

/* A file written in order through a buffer. */
typedef struct {
  char path[GJ_PATH_BUF];
  int fd;
  char *buf;
  size_t n, cap;
  uint64_t written;
} spool;

static int spool_open(spool *s, const char *base, int rank, const char *what, size_t cap) {
  if (snprintf(s->path, sizeof s->path, "%s.%d.%s", base, rank, what) >= (int)sizeof s->path)
    return GJ_FAIL("%s: path too long for the spool", base);
  gj_tmp_register(s->path);
  s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (s->fd < 0) return GJ_FAIL("%s: cannot create: %s", s->path, strerror(errno));
  s->cap = cap, s->n = 0, s->written = 0;
  if (!(s->buf = malloc(cap))) return GJ_FAIL("out of memory for the spool");
  return 0;
}

static int spool_flush(spool *s) {
  GJ_TRY(gj_tokfile_pwrite(s->fd, s->path, s->buf, s->n, s->written));
  s->written += s->n, s->n = 0;
  return 0;
}

static int spool_put(spool *s, const void *v, size_t k) {
  if (s->n + k > s->cap) GJ_TRY(spool_flush(s));
  memcpy(s->buf + s->n, v, k);
  s->n += k;
  return 0;
}

static void spool_close(spool *s) {
  if (s->path[0]) {
    if (s->fd > 0) close(s->fd);
    unlink(s->path);
    gj_tmp_unregister(s->path);
  }
  free(s->buf);
  memset(s, 0, sizeof *s);
}

/* Per part: counts, filled by its rank (then all-reduced). */
enum { C_TOK, C_DOC, C_BYTES, NC };

typedef struct {
  gj_tokenizer *t;
  gj_ids ids;
  spool tok, len; /* uint16 tokens; (tokens, bytes) as two uint64 per document */
  uint64_t *cnt;  /* this part's NC counts */
  /* progress, this rank */
  volatile uint64_t raw;
  uint64_t raw_before, docs, tokens, text, share, total;
  double t0, last;
  int rank, size, shown; /* shown: a progress line was printed */
} work;

static void progress(work *w, int final) {
  double now = gj_now();
  if (w->rank != 0 || (!final && now - w->last < 3.0) || (final && !w->shown)) return;
  w->last = now, w->shown = 1;
  double el = now - w->t0, done = (double)(w->raw_before + w->raw), frac = w->share ? done / w->share : 1;
  if (frac > 1) frac = 1;
  double rate = el > 0 ? w->text / el : 0;
  fprintf(stderr,
          "tokenize: rank 0 at %.0f%% of its %.1f MB (%.1f MB in all, %d ranks): %.1f MB/s of text, %llu documents, "
          "%.2f M tokens, ETA %.0f s\n",
          100 * frac, w->share / 1e6, w->total / 1e6, w->size, rate / 1e6, (unsigned long long)w->docs,
          w->tokens / 1e6, frac > 0 ? el * (1 - frac) / frac : 0.0);
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* A token file holds uint16 ids and ends every document with <|endoftext|> as id 50256: a
 * vocabulary (--vocab-dir) with more ids, or with another token there, cannot be written. */
static int vocab_fits(const gj_tokenizer *t, const char *dir) {
  int32_t n = gj_tokenizer_vocab_size(t), eot = GJ_EOT_ID;
  if (n > 65536)
    return GJ_FAIL("--vocab-dir %s: %d ids, more than the 65,536 a token file's uint16 ids hold", dir, n);
  gj_bytes s = {0};
  int ok = n > GJ_EOT_ID && !gj_tokenizer_decode(t, &eot, 1, &s) && s.n == 13 && !memcmp(s.v, "<|endoftext|>", 13);
  free(s.v);
  return ok ? 0 : GJ_FAIL("--vocab-dir %s: id %d is not <|endoftext|>, which a token file ends every document with", dir,
                          GJ_EOT_ID);
}

static int on_doc(void *ctx, const char *text, size_t n) {
  work *w = ctx;
  w->ids.n = 0;
  GJ_TRY(gj_tokenizer_encode(w->t, text, n, &w->ids));
  GJ_TRY(gj_ids_push(&w->ids, GJ_EOT_ID));
  for (size_t k = 0; k < w->ids.n;) { /* narrowed to the file's uint16 (GPT-2's ids are below 2^16) */
    if (w->tok.n + 2 > w->tok.cap) GJ_TRY(spool_flush(&w->tok));
    uint16_t *o = (uint16_t *)(w->tok.buf + w->tok.n);
    size_t m = GJ_MIN(w->ids.n - k, (w->tok.cap - w->tok.n) / 2);
    for (size_t j = 0; j < m; j++) o[j] = (uint16_t)w->ids.v[k + j];
    w->tok.n += 2 * m, k += m;
  }
  uint64_t l[2] = {w->ids.n, n};
  GJ_TRY(spool_put(&w->len, l, sizeof l));
  w->cnt[C_TOK] += w->ids.n, w->cnt[C_DOC]++, w->cnt[C_BYTES] += n;
  w->docs++, w->tokens += w->ids.n, w->text += n;
  progress(w, 0);
  return 0;
}

/* ---- writing the outputs ---- */

/* The token and offset ranges of one output that a part fills, buffered. */
typedef struct {
  int fd;
  const char *path;
  uint64_t tok_at, off_at;  /* file offsets of /tokens[0], /doc_offsets[0] */
  uint64_t tok, doc;        /* next token, next document (its end offset goes to doc + 1) */
  uint16_t *tb;
  uint64_t *ob;
  size_t tn, on;
  uint64_t tb0, ob0;        /* token / offset index of tb[0] / ob[0] */
} sink;

static int sink_flush(sink *s) {
  GJ_TRY(gj_tokfile_pwrite(s->fd, s->path, s->tb, s->tn * 2, s->tok_at + 2 * s->tb0));
  GJ_TRY(gj_tokfile_pwrite(s->fd, s->path, s->ob, s->on * 8, s->off_at + 8 * s->ob0));
  s->tb0 += s->tn, s->ob0 += s->on, s->tn = s->on = 0;
  return 0;
}

/* Start the sink at token tok and document doc (after a flush). */
static void sink_seek(sink *s, uint64_t tok, uint64_t doc) {
  s->tok = s->tb0 = tok, s->doc = doc, s->ob0 = doc + 1;
}

static int sink_tokens(sink *s, const uint16_t *v, size_t k) {
  while (k > 0) {
    if (s->tn == TOK_BUF) GJ_TRY(sink_flush(s));
    size_t m = GJ_MIN(k, TOK_BUF - s->tn);
    memcpy(s->tb + s->tn, v, 2 * m);
    s->tn += m, s->tok += m, v += m, k -= m;
  }
  return 0;
}

static int sink_doc_end(sink *s) {
  if (s->on == LEN_BUF) GJ_TRY(sink_flush(s));
  s->ob[s->on++] = s->tok, s->doc++;
  return 0;
}

/* every 1/f-th document of the global order is a validation one: exactly round(n f) of them,
 * spread evenly (the rule of the in-memory tokenize, on the global document index) */
static int is_valid_doc(uint64_t i, double frac) {
  return frac > 0 && (uint64_t)((double)(i + 1) * frac) > (uint64_t)((double)i * frac);
}

/* Read spool bytes [at, at + n) into buf. */
static int spool_read(spool *s, void *buf, size_t n, uint64_t at) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = pread(s->fd, p, n, (off_t)at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return GJ_FAIL("%s: read error: %s", s->path, k < 0 ? strerror(errno) : "short file");
    p += k, n -= (size_t)k, at += (uint64_t)k;
  }
  return 0;
}

/* Count (scnt: per part, train tokens, train docs, train bytes, valid ...) or copy (sinks
 * given) the documents of the parts of this rank from the spools. tok0/len0: where each part
 * begins in the spools; docbase: each part's first global document. */
static int route(work *w, const part *p, size_t np, const uint64_t *tok0, const uint64_t *len0,
                 const uint64_t *docbase, const uint64_t *cnt, double frac, uint64_t *scnt, sink *sk,
                 const uint64_t *sbase) {
  uint16_t *tb = malloc(TOK_BUF * 2);
  uint64_t *lb = malloc(LEN_BUF * 16);
  int rc = tb && lb ? 0 : GJ_FAIL("out of memory");
  for (size_t q = 0; q < np && !rc; q++) {
    if (p[q].rank != w->rank) continue;
    uint64_t nd = cnt[q * NC + C_DOC], tat = tok0[q], tn = 0, tpos = 0;
    if (sk)
      for (int s = 0; s < 2; s++)
        if (sk[s].fd >= 0 && !(rc = sink_flush(&sk[s]))) sink_seek(&sk[s], sbase[(q * 2 + s) * 2], sbase[(q * 2 + s) * 2 + 1]);
    for (uint64_t d = 0; d < nd && !rc; d++) {
      size_t li = (size_t)(d % LEN_BUF);
      if (li == 0) rc = spool_read(&w->len, lb, (size_t)GJ_MIN((uint64_t)LEN_BUF, nd - d) * 16, len0[q] + d * 16);
      if (rc) break;
      uint64_t k = lb[2 * li], nb = lb[2 * li + 1];
      int side = is_valid_doc(docbase[q] + d, frac);
      if (scnt) {
        uint64_t *c = scnt + (q * 2 + side) * NC;
        c[C_TOK] += k, c[C_DOC]++, c[C_BYTES] += nb;
        continue;
      }
      while (k > 0 && !rc) { /* the document's tokens, through the token buffer */
        if (tpos == tn) {
          tn = GJ_MIN((uint64_t)TOK_BUF, cnt[q * NC + C_TOK] - (tat - tok0[q]) / 2);
          rc = spool_read(&w->tok, tb, tn * 2, tat);
          tat += tn * 2, tpos = 0;
          if (rc) break;
        }
        size_t m = (size_t)GJ_MIN(k, tn - tpos);
        rc = sink_tokens(&sk[side], tb + tpos, m);
        tpos += m, k -= m;
      }
      if (!rc) rc = sink_doc_end(&sk[side]);
    }
  }
  for (int s = 0; sk && s < 2 && !rc; s++)
    if (sk[s].fd >= 0) rc = sink_flush(&sk[s]);
  free(tb), free(lb);
  return rc;
}

/* The memory a rank needs at most: the tokenizer, the buffers, and for the longest document
 * its text, its line (JSONL: up to 4x, escapes), its parsed copy and its ids (4 bytes a token,
 * a token at least a byte, twice for the vector's growth). */
static double memory_bound(int64_t max_doc_mb) { return ((double)TOKENIZER_MB + BUFFERS_MB + 14.0 * max_doc_mb) * 1048576.0; }

/* Everything a tokenize run holds, freed in one place (tok_free). */
typedef struct {
  const char *out, *valid_out, *dir, *key;
  double frac;
  int64_t max_doc_mb, part_bytes;
  char *inputs[MAX_INPUTS];
  int nin, nout, rank, size;
  gj_comm w;
  gj_outfile o[2];
  strlist files;
  part *parts;
  size_t np;
  uint64_t total, ndocs;
  /* per part: counts (NC), train/valid counts (2 NC), where it begins in the spools, its
   * first global document, its first token and document in each output (4) */
  uint64_t *cnt, *scnt, *tok0, *len0, *docbase, *sbase;
  uint64_t tot[2][NC]; /* each output's totals */
  double t_tok, cpu[2], t_write;
  work wk;
  sink sk[2];
} tok_ctx;

static void tok_free(tok_ctx *x) {
  for (int s = 0; s < 2; s++) {
    if (x->sk[s].fd >= 0) close(x->sk[s].fd);
    free(x->sk[s].tb), free(x->sk[s].ob);
  }
  spool_close(&x->wk.tok), spool_close(&x->wk.len);
  free(x->wk.ids.v);
  gj_tokenizer_free(x->wk.t);
  free(x->cnt), free(x->scnt), free(x->tok0), free(x->len0), free(x->docbase), free(x->sbase), free(x->parts);
  strlist_free(&x->files);
  gj_outfile_abort(&x->o[0]), gj_outfile_abort(&x->o[1]); /* no-ops once committed */
}

/* The options and inputs; returns 1 after --help. */
static int tok_parse(tok_ctx *x, int argc, char **argv) {
  x->dir = gj_tokenizer_default_dir(), x->key = "text", x->max_doc_mb = 16;
  gj_opt opts[] = {
      {"out", GJ_OPT_STR, &x->out, "output dataset (HDF5), required", 1, 0},
      {"valid-out", GJ_OPT_STR, &x->valid_out, "second output holding the validation documents", 1, 0},
      {"valid-fraction", GJ_OPT_F64, &x->frac, "fraction of documents for --valid-out (every 1/f-th)", 0, 0.5},
      {"vocab-dir", GJ_OPT_STR, &x->dir, "directory with encoder.json and vocab.bpe", 1, 0},
      {"text-key", GJ_OPT_STR, &x->key, "JSONL: the field holding a document's text", 1, 0},
      {"max-doc-mb", GJ_OPT_I64, &x->max_doc_mb, "longest document (and JSONL line / 4) accepted, MB", 1, 4096},
      {"part-bytes", GJ_OPT_I64, &x->part_bytes, "cut uncompressed inputs in parts of this size (0: automatic)", 0, 1e18},
      {NULL}};
  gj_cmdline cl = {
      "gptj tokenize [options] --out FILE.h5 INPUT...",
      "Tokenizes documents with GPT-2 BPE into a token dataset: plain text (documents separated\n"
      "by blank lines) or JSONL with the text under --text-key (names ending in .jsonl/.json; a\n"
      "line without it is an error naming the file and line), each plain, gzip (.gz) or zstd\n"
      "(.zst). An INPUT may be a directory: its *.txt, *.text, *.jsonl, *.json files (each\n"
      "optionally .gz/.zst), recursively, in byte order of their names. Every document is\n"
      "followed by <|endoftext|> (50256). The inputs are streamed: a rank holds at most about\n"
      "64 MB + 14 x --max-doc-mb (288 MB by default), whatever the size of the corpus, and\n"
      "spools its tokens (2 bytes a token) beside the output until it writes them. A word (or\n"
      "number, or run of spaces) of over 1 MB without a break takes 28 bytes a byte more to\n"
      "encode, checked against the memory available when one comes.\n"
      "Runs under mpirun: the ranks share the files and byte ranges of the large uncompressed\n"
      "ones, and write one output; it is byte-identical whatever the number of ranks.",
      opts, NULL, NULL, NULL, MAX_INPUTS};
  int rc = gj_args_parse(&cl, argc, argv, x->inputs, &x->nin);
  if (rc) return rc;
  if (!x->out) return GJ_FAIL("--out: required");
  if (x->nin == 0) return GJ_FAIL("no input files (see --help)");
  if ((x->frac > 0) != (x->valid_out != NULL)) return GJ_FAIL("--valid-fraction and --valid-out go together");
  x->nout = x->valid_out ? 2 : 1;
  return 0;
}

/* Before any work (agreed): every input readable by every rank, and on rank 0 (the writer)
 * the outputs neither an input (the vocabulary files included) nor each other; the memory
 * bound; the parts, the same on every rank. */
static int tok_plan(tok_ctx *x) {
  int rc = expand_inputs(&x->files, x->inputs, x->nin);
  if (!rc && x->rank == 0) rc = plan_outputs(x->out, x->valid_out, x->dir, &x->files);
  if (!rc && x->rank == 0) rc = gj_outfile_begin(&x->o[0], x->out);
  if (!rc && x->rank == 0 && x->valid_out) rc = gj_outfile_begin(&x->o[1], x->valid_out);
  GJ_AGREE(x->w, rc);
  char detail[160];
  snprintf(detail, sizeof detail, "tokenize streams its inputs, holding at most %lld MB of documents",
           (long long)x->max_doc_mb);
  GJ_TRY(gj_mem_check(x->w, memory_bound(x->max_doc_mb), detail, "lower --max-doc-mb, or run fewer ranks per node", 0, NULL));
  GJ_AGREE(x->w, plan_parts(&x->files, (uint64_t)x->part_bytes, x->size, &x->parts, &x->np, &x->total));
  int same = 1; /* every rank listed the same files of the same sizes, or the parts would not tile */
  GJ_TRY(gj_same_int(x->w, (int)(x->np * 1000003u + x->total % 1000000007u), &same));
  if (!same)
    return gj_agree(x->w, GJ_FAIL("the ranks see different inputs (%zu files, %.1f MB here): put them on a file "
                                  "system every rank shares", x->files.n, x->total / 1e6));
  return 0;
}

/* Each rank tokenizes its parts into its spools; then every part's counts on every rank and
 * its first document in the global order. */
static int tok_parts(tok_ctx *x) {
  size_t np = x->np;
  work *wk = &x->wk;
  x->cnt = calloc(np * NC + 1, sizeof *x->cnt), x->scnt = calloc(np * 2 * NC + 1, sizeof *x->scnt);
  x->tok0 = calloc(np + 1, sizeof *x->tok0), x->len0 = calloc(np + 1, sizeof *x->len0);
  x->docbase = calloc(np + 1, sizeof *x->docbase), x->sbase = calloc(np * 4 + 1, sizeof *x->sbase);
  int rc = x->cnt && x->scnt && x->tok0 && x->len0 && x->docbase && x->sbase ? 0 : GJ_FAIL("out of memory for %zu parts", np);
  if (!rc) rc = gj_tokenizer_load(&wk->t, x->dir);
  if (!rc) rc = vocab_fits(wk->t, x->dir);
  /* the spools: beside the output, named after it and this rank (a rank's own pid); hidden
   * names of their own where the output's name leaves no room for the suffixes */
  char base[GJ_PATH_BUF];
  const char *slash = strrchr(x->out, '/');
  if (strlen(slash ? slash + 1 : x->out) + 48 <= NAME_MAX)
    snprintf(base, sizeof base, "%s.tmp.spool%ld", x->out, (long)getpid());
  else /* with a hash of the output's name: jobs of one pid (containers) writing others apart */
    snprintf(base, sizeof base, "%.*s.gptj-spool%ld.%08x", (int)(slash ? slash - x->out + 1 : 0), x->out,
             (long)getpid(), (unsigned)gj_crc32(0, x->out, strlen(x->out)));
  if (!rc) rc = spool_open(&wk->tok, base, x->rank, "tok", TOK_BUF * 2);
  if (!rc) rc = spool_open(&wk->len, base, x->rank, "len", LEN_BUF * 16);
  wk->rank = x->rank, wk->size = x->size, wk->total = x->total, wk->t0 = wk->last = gj_now();
  for (size_t q = 0; q < np; q++)
    if (x->parts[q].rank == x->rank) wk->share += x->parts[q].size;
  gj_docstream_opts dopt = {x->key, (size_t)x->max_doc_mb << 20};
  double cpu0 = cpu_now();
  for (size_t q = 0; q < np && !rc; q++) {
    if (x->parts[q].rank != x->rank) continue;
    x->tok0[q] = wk->tok.written + wk->tok.n, x->len0[q] = wk->len.written + wk->len.n;
    wk->cnt = x->cnt + q * NC;
    wk->raw_before += wk->raw, wk->raw = 0;
    rc = gj_docstream_read(x->files.v[x->parts[q].file], x->parts[q].lo, x->parts[q].hi, &dopt, on_doc, wk, &wk->raw);
  }
  if (!rc) rc = spool_flush(&wk->tok);
  if (!rc) rc = spool_flush(&wk->len);
  wk->raw_before += wk->raw, wk->raw = 0;
  x->t_tok = gj_now() - wk->t0, x->cpu[0] = x->cpu[1] = cpu_now() - cpu0;
  if (!rc) progress(wk, 1); /* the last line, if there were others */
  GJ_AGREE(x->w, rc);
  GJ_TRY(gj_allreduce_sum_u64(x->w, x->cnt, np * NC));
  GJ_TRY(gj_allreduce_max_f64(x->w, x->cpu, 1));
  GJ_TRY(gj_allreduce_sum_f64(x->w, x->cpu + 1, 1));
  for (size_t q = 0; q < np; q++) x->docbase[q] = x->ndocs, x->ndocs += x->cnt[q * NC + C_DOC];
  return x->ndocs ? 0 : GJ_FAIL("%s: no documents in the input", x->inputs[0]);
}

/* The train / validation counts of each part, then each part's first token and document in
 * each output (sbase[(q*2 + side)*2 + {0: token, 1: document}]) and the outputs' totals. */
static int tok_split(tok_ctx *x) {
  int rc = route(&x->wk, x->parts, x->np, x->tok0, x->len0, x->docbase, x->cnt, x->frac, x->scnt, NULL, NULL);
  GJ_AGREE(x->w, rc);
  GJ_TRY(gj_allreduce_sum_u64(x->w, x->scnt, x->np * 2 * NC));
  for (size_t q = 0; q < x->np; q++)
    for (int s = 0; s < 2; s++) {
      x->sbase[(q * 2 + s) * 2] = x->tot[s][C_TOK], x->sbase[(q * 2 + s) * 2 + 1] = x->tot[s][C_DOC];
      for (int c = 0; c < NC; c++) x->tot[s][c] += x->scnt[(q * 2 + s) * NC + c];
    }
  if (x->frac > 0 && (x->tot[0][C_DOC] == 0 || x->tot[1][C_DOC] == 0))
    return GJ_FAIL("--valid-fraction %g leaves an empty split of %llu documents", x->frac,
                   (unsigned long long)x->ndocs);
  return 0;
}

/* Rank 0 lays the outputs out; every rank learns their names and where the arrays begin, and
 * writes its documents there from its spools. */
static int tok_write(tok_ctx *x) {
  char source[2048] = ""; /* an attribute: a long list of inputs is cut */
  for (int i = 0; i < x->nin; i++) {
    const char *b = strrchr(x->inputs[i], '/');
    size_t l = strlen(source);
    snprintf(source + l, sizeof source - l, "%s%s", i ? "," : "", b ? b + 1 : x->inputs[i]);
  }
  struct {
    char tmp[2][GJ_PATH_BUF];
    uint64_t tok_at[2], off_at[2];
  } lay;
  memset(&lay, 0, sizeof lay);
  double t_w0 = gj_now();
  int rc = 0;
  for (int s = 0; s < x->nout && !rc && x->rank == 0; s++) {
    snprintf(lay.tmp[s], sizeof lay.tmp[s], "%s", x->o[s].tmp);
    rc = gj_tokfile_create(x->o[s].tmp, x->tot[s][C_TOK], x->tot[s][C_DOC], x->tot[s][C_BYTES], source,
                           gj_tokenizer_vocab_size(x->wk.t), &lay.tok_at[s], &lay.off_at[s]);
  }
  GJ_AGREE(x->w, rc);
  GJ_TRY(gj_bcast(x->w, &lay, sizeof lay, 0));
  sink *sk = x->sk;
  for (int s = 0; s < x->nout && !rc; s++) {
    sk[s].path = lay.tmp[s], sk[s].tok_at = lay.tok_at[s], sk[s].off_at = lay.off_at[s];
    sk[s].tb = malloc(TOK_BUF * 2), sk[s].ob = malloc(LEN_BUF * 8);
    if (!sk[s].tb || !sk[s].ob) rc = GJ_FAIL("out of memory");
    else if ((sk[s].fd = open(lay.tmp[s], O_WRONLY)) < 0) rc = GJ_FAIL("%s: cannot open: %s", lay.tmp[s], strerror(errno));
    uint64_t zero = 0;
    if (!rc && x->rank == 0) rc = gj_tokfile_pwrite(sk[s].fd, sk[s].path, &zero, 8, sk[s].off_at); /* doc_offsets[0] */
  }
  if (!rc) rc = route(&x->wk, x->parts, x->np, x->tok0, x->len0, x->docbase, x->cnt, x->frac, NULL, sk, x->sbase);
  for (int s = 0; s < x->nout && !rc; s++)
    if (fsync(sk[s].fd)) rc = GJ_FAIL("%s: cannot sync: %s", sk[s].path, strerror(errno));
  x->t_write = gj_now() - t_w0;
  return gj_agree(x->w, rc);
}

/* The summary, then both files renamed into place together. */
static int tok_finish(tok_ctx *x) {
  uint64_t (*tot)[NC] = x->tot;
  for (int s = 0; s < x->nout && x->rank == 0; s++)
    gj_info("%s: %llu documents, %llu tokens, %llu bytes (%.3f bytes/token)", x->o[s].path,
            (unsigned long long)tot[s][C_DOC], (unsigned long long)tot[s][C_TOK], (unsigned long long)tot[s][C_BYTES],
            tot[s][C_TOK] ? (double)tot[s][C_BYTES] / tot[s][C_TOK] : 0.0);
  uint64_t all_text = tot[0][C_BYTES] + tot[1][C_BYTES];
  gj_info("tokenize: %.1f MB of text in %zu parts on %d ranks: %.2f s tokenizing (%.1f MB/s; CPU %.2f s on the busiest "
          "rank, %.2f s in all: %.1f MB per CPU second), %.2f s writing",
          all_text / 1e6, x->np, x->size, x->t_tok, x->t_tok > 0 ? all_text / 1e6 / x->t_tok : 0.0, x->cpu[0],
          x->cpu[1], x->cpu[1] > 0 ? all_text / 1e6 / x->cpu[1] : 0.0, x->t_write);
  int rc = 0;
  gj_signals_hold(1); /* both outputs new, or both old */
  for (int i = 0; i < x->nout && !rc && x->rank == 0; i++) rc = gj_outfile_commit(&x->o[i]);
  gj_signals_hold(0);
  return gj_agree(x->w, rc);
}

int gj_cmd_tokenize(int argc, char **argv) {
  tok_ctx x;
  memset(&x, 0, sizeof x);
  x.sk[0].fd = x.sk[1].fd = -1;
  x.w = gj_comm_world(), x.rank = gj_comm_rank(x.w), x.size = gj_comm_size(x.w), x.nout = 1;
  int rc = tok_parse(&x, argc, argv);
  if (rc > 0) { /* --help */
    tok_free(&x);
    return 0;
  }
  rc = rc ? gj_agree(x.w, rc) : tok_plan(&x);
  if (!rc) rc = tok_parts(&x);
  if (!rc) rc = gj_agree(x.w, tok_split(&x));
  if (!rc) rc = tok_write(&x);
  if (!rc) rc = tok_finish(&x);
  tok_free(&x);
  return rc;
}
