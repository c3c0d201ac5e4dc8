/* gptj tokenize: text / JSONL (optionally gzip) -> token dataset(s) in HDF5.
 * Under mpirun the documents are split in contiguous blocks over the ranks, tokenized in
 * parallel and gathered in order onto rank 0, which writes the file: the output is
 * byte-identical whatever the number of ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/dataset.h"
#include "io/docs.h"
#include "io/outfile.h"
#include "io/tokenizer.h"
#include "parallel/grid.h"

#define MAX_INPUTS 256

/* --out and --valid-out replace neither an input nor each other */
static int plan_outputs(const char *out, const char *valid_out, const char *dir, char **inputs, int nin) {
  gj_file_ref outs[2] = {{"--out", out}, {"--valid-out", valid_out}}, ins[MAX_INPUTS + 2];
  char enc[GJ_PATH_BUF], bpe[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(enc, sizeof enc, dir, "encoder.json"));
  GJ_TRY(gj_path_join(bpe, sizeof bpe, dir, "vocab.bpe"));
  for (int i = 0; i < nin; i++) ins[i] = (gj_file_ref){"input", inputs[i]};
  ins[nin] = (gj_file_ref){"vocabulary file", enc}, ins[nin + 1] = (gj_file_ref){"vocabulary file", bpe};
  return gj_outfile_plan(outs, valid_out ? 2 : 1, ins, nin + 2);
}

/* Encode the documents idx[lo..hi) into ids, their lengths (EOT included) into lens[hi - lo];
 * rank 0 reports progress on out. */
static int encode_range(gj_tokenizer *t, const gj_docs *docs, const uint64_t *idx, size_t lo, size_t hi,
                        gj_ids *ids, uint64_t *lens, const char *out, int rank, size_t total_bytes) {
  int rc = 0;
  double t0 = gj_now(), last = t0;
  size_t done = 0, mine = 0;
  for (size_t i = lo; i < hi; i++) mine += docs->off[idx[i] + 1] - docs->off[idx[i]];
  for (size_t i = lo; i < hi && !rc; i++) {
    size_t before = ids->n, nb = docs->off[idx[i] + 1] - docs->off[idx[i]];
    rc = gj_tokenizer_encode(t, docs->pool + docs->off[idx[i]], nb, ids);
    if (!rc) rc = gj_ids_push(ids, GJ_EOT_ID);
    lens[i - lo] = ids->n - before;
    done += nb;
    double now = gj_now();
    if (rank == 0 && now - last > 2.0 && mine > 0) {
      double rate = done / (now - t0), frac = (double)done / mine;
      fprintf(stderr, "tokenize %s: %.1f / %.1f MB (%.0f%%), %.1f MB/s per rank, ETA %.0f s\n", out,
              frac * total_bytes / 1e6, total_bytes / 1e6, 100 * frac, rate / 1e6,
              (mine - done) / (rate > 0 ? rate : 1));
      last = now;
    }
  }
  return rc;
}

/* Tokenize the documents idx[lo..hi), gather (tokens, per-document lengths) onto rank 0 and
 * write them to the temporary of o (rank 0; the caller renames the outputs together). The
 * ids are narrowed to the file's uint16 before the gather (GPT-2's ids are below 2^16). */
static int tokenize_set(gj_tokenizer *t, const gj_docs *docs, const uint64_t *idx, size_t nidx,
                        gj_outfile *o, const char *source, int rank, int size, size_t total_bytes) {
  gj_comm w = gj_comm_world();
  size_t lo = nidx * rank / size, hi = nidx * (rank + 1) / size;
  gj_ids ids = {0};
  uint16_t *mine = NULL;
  uint64_t *lens = malloc((hi - lo + 1) * sizeof(uint64_t)), *offs = NULL, ntok = 0, ndoc = 0;
  void *tok = NULL, *all_lens = NULL;
  int rc = lens ? 0 : GJ_FAIL("out of memory");
  if (!rc) rc = encode_range(t, docs, idx, lo, hi, &ids, lens, o->path, rank, total_bytes);
  if (!rc && !(mine = malloc((ids.n ? ids.n : 1) * sizeof(uint16_t))))
    rc = GJ_FAIL("out of memory for %zu tokens", ids.n);
  for (size_t k = 0; !rc && k < ids.n; k++) mine[k] = (uint16_t)ids.v[k];
  free(ids.v), ids.v = NULL; /* ids.n stays the count */
  if ((rc = gj_agree(w, rc))) goto done;
  /* in rank order: the tokens, then the documents' lengths, made offsets on rank 0 */
  if ((rc = gj_gather_ordered(w, &tok, &ntok, mine, ids.n, sizeof *mine))) goto done;
  if ((rc = gj_gather_ordered(w, &all_lens, &ndoc, lens, hi - lo, sizeof *lens))) goto done;
  if (rank == 0 && ndoc != nidx) rc = GJ_FAIL("internal: gathered %llu of %zu documents", (unsigned long long)ndoc, nidx);
  if (!rc && rank == 0 && !(offs = malloc((nidx + 1) * sizeof(uint64_t))))
    rc = GJ_FAIL("out of memory gathering %llu tokens", (unsigned long long)ntok);
  if (!rc && rank == 0) {
    offs[0] = 0;
    for (size_t k = 0; k < nidx; k++) offs[k + 1] = offs[k] + ((const uint64_t *)all_lens)[k];
    uint64_t nbytes = 0;
    for (size_t i = 0; i < nidx; i++) nbytes += docs->off[idx[i] + 1] - docs->off[idx[i]];
    rc = gj_dataset_write_tmp(o, tok, ntok, offs, nidx, nbytes, source);
    if (!rc)
      gj_info("%s: %zu documents, %llu tokens, %llu bytes (%.3f bytes/token)", o->path, nidx,
              (unsigned long long)ntok, (unsigned long long)nbytes, ntok ? (double)nbytes / ntok : 0.0);
  }
done:
  free(tok), free(all_lens), free(offs), free(mine), free(ids.v), free(lens);
  return gj_agree(w, rc);
}

/* Every rank holds the whole text and its ids (int32) and rank 0 the gathered tokens: about
 * 4 bytes per byte of text (GPT-2 BPE makes ~4 bytes a token); compressed inputs count 4x
 * their size. Refused before reading when that does not fit. */
static int check_memory(char **inputs, int nin) {
  double text = 0;
  for (int i = 0; i < nin; i++) {
    struct stat st;
    if (stat(inputs[i], &st) || !S_ISREG(st.st_mode)) continue; /* stdin, FIFOs: unknown */
    size_t l = strlen(inputs[i]);
    int packed = (l > 3 && !strcmp(inputs[i] + l - 3, ".gz")) || (l > 4 && !strcmp(inputs[i] + l - 4, ".zst"));
    text += (double)st.st_size * (packed ? 4 : 1);
  }
  char detail[128];
  snprintf(detail, sizeof detail, "tokenize holds its %.0f MB of text and their tokens in memory", text / 1e6);
  return gj_mem_check(gj_comm_world(), 4 * text, detail, "tokenize the inputs in several parts, or run fewer ranks per node", 0, NULL);
}

/* The training documents into tr, every 1/frac-th into va (none when frac is 0). */
static int split_docs(size_t ndocs, double frac, uint64_t **tr, size_t *ntr, uint64_t **va, size_t *nva) {
  *tr = malloc((ndocs ? ndocs : 1) * sizeof(uint64_t)), *va = malloc((ndocs ? ndocs : 1) * sizeof(uint64_t));
  *ntr = *nva = 0;
  if (!*tr || !*va) return GJ_FAIL("out of memory for %zu documents", ndocs);
  for (size_t i = 0; i < ndocs; i++) {
    /* every 1/f-th document: exactly round(n f) of them, spread evenly */
    int is_valid = frac > 0 && (uint64_t)((i + 1) * frac) > (uint64_t)(i * frac);
    if (is_valid) (*va)[(*nva)++] = i;
    else (*tr)[(*ntr)++] = i;
  }
  if (frac > 0 && (*nva == 0 || *ntr == 0))
    return GJ_FAIL("--valid-fraction %g leaves an empty split of %zu documents", frac, ndocs);
  return 0;
}

int gj_cmd_tokenize(int argc, char **argv) {
  const char *out = NULL, *valid_out = NULL, *dir = gj_tokenizer_default_dir();
  double frac = 0;
  gj_opt opts[] = {
      {"out", GJ_OPT_STR, &out, "output dataset (HDF5), required", 1, 0},
      {"valid-out", GJ_OPT_STR, &valid_out, "second output holding the validation documents", 1, 0},
      {"valid-fraction", GJ_OPT_F64, &frac, "fraction of documents for --valid-out (every 1/f-th)", 0, 0.5},
      {"vocab-dir", GJ_OPT_STR, &dir, "directory with encoder.json and vocab.bpe", 1, 0},
      {NULL}};
  gj_cmdline cl = {
      "gptj tokenize [options] --out FILE.h5 INPUT...",
      "Tokenizes documents with GPT-2 BPE into a token dataset: plain text (documents separated\n"
      "by blank lines) or JSONL with a \"text\" field (names ending in .jsonl/.json), either\n"
      "possibly gzip-compressed. Every document is followed by <|endoftext|> (50256).\n"
      "Runs under mpirun: the output is the same whatever the number of ranks.",
      opts, NULL, NULL, NULL, MAX_INPUTS};
  char *inputs[MAX_INPUTS];
  gj_comm w = gj_comm_world();
  int nin = 0, rank = gj_comm_rank(w), size = gj_comm_size(w);
  gj_outfile o[2];
  memset(o, 0, sizeof o);
  gj_tokenizer *t = NULL;
  gj_docs docs = {0};
  uint64_t *tr = NULL, *va = NULL;
  size_t ntr = 0, nva = 0;
  int rc = gj_args_parse(&cl, argc, argv, inputs, &nin);
  if (rc > 0) {
    rc = 0;
    goto done;
  }
  if (!rc && !out) rc = GJ_FAIL("--out: required");
  if (!rc && nin == 0) rc = GJ_FAIL("no input files (see --help)");
  if (!rc && (frac > 0) != (valid_out != NULL))
    rc = GJ_FAIL("--valid-fraction and --valid-out go together");
  /* Before any work: every input readable by every rank, and on rank 0 (the writer) the
   * outputs neither an input (the vocabulary files included) nor each other. */
  for (int i = 0; i < nin && !rc; i++) rc = gj_outfile_check_input(inputs[i], NULL, GJ_IN_STDIN);
  if (!rc && rank == 0) rc = plan_outputs(out, valid_out, dir, inputs, nin);
  if (!rc && rank == 0) rc = gj_outfile_begin(&o[0], out);
  if (!rc && rank == 0 && valid_out) rc = gj_outfile_begin(&o[1], valid_out);
  if ((rc = gj_agree(w, rc)) || (rc = check_memory(inputs, nin))) goto done;
  rc = gj_tokenizer_load(&t, dir);
  for (int i = 0; i < nin && !rc; i++) rc = gj_docs_read(&docs, inputs[i]);
  if (!rc && docs.ndocs == 0) rc = GJ_FAIL("%s: no documents in the input", inputs[0]);
  if ((rc = gj_agree(w, rc))) goto done;
  char source[2048] = ""; /* an attribute: a long list of inputs is cut */
  for (int i = 0; i < nin; i++) {
    const char *b = strrchr(inputs[i], '/');
    size_t l = strlen(source);
    snprintf(source + l, sizeof source - l, "%s%s", i ? "," : "", b ? b + 1 : inputs[i]);
  }
  if ((rc = gj_agree(w, split_docs(docs.ndocs, frac, &tr, &ntr, &va, &nva)))) goto done;
  size_t total = 0;
  for (size_t i = 0; i < docs.ndocs; i++) total += docs.off[i + 1] - docs.off[i];
  rc = tokenize_set(t, &docs, tr, ntr, &o[0], source, rank, size, total);
  if (!rc && nva) rc = tokenize_set(t, &docs, va, nva, &o[1], source, rank, size, total);
  /* both files complete: rename them into place together */
  gj_signals_hold(1); /* both outputs new, or both old */
  for (int i = 0; i < (valid_out ? 2 : 1) && !rc && rank == 0; i++) rc = gj_outfile_commit(&o[i]);
  gj_signals_hold(0);
  rc = gj_agree(w, rc);
done:
  free(tr), free(va);
  gj_tokenizer_free(t);
  gj_docs_free(&docs);
  gj_outfile_abort(&o[0]), gj_outfile_abort(&o[1]); /* no-ops once committed */
  return rc;
}
