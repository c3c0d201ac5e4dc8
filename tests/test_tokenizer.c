/* GPT-2 BPE: every golden case gives exactly its ids and decodes back to its text; the
 * whitespace-divergence cases follow Unicode White_Space; any byte string round-trips; the
 * Brown splits have the token counts of ../shared/data/README.md. gptj tokenize: the same
 * bytes out over 1-4 ranks, byte-range parts and encodings (plain, gzip, zstd; text and
 * JSONL), and a peak RSS under its stated bound on an input several times larger and on one of
 * 400,000 distinct pieces. */
#include <check.h>
#include <hdf5.h>
#include <jansson.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <zlib.h>
#include <zstd.h>

#include "common.h"
#include "io/jsonscan.h"
#include "io/tokenizer.h"
#include "testutil.h"

static gj_tokenizer *tok;
static char srcdir[1024], B_[1024], S_[1024], MPI_[1024], OUT[1200], DATA[1300];

static void check_jsonl(const char *name, const char *ids_key) {
  char path[1200];
  snprintf(path, sizeof path, "%s/tests/golden/%s", srcdir, name);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *line = NULL;
  size_t cap = 0;
  int n = 0;
  while (getline(&line, &cap, f) > 0) {
    json_error_t err;
    json_t *o = json_loads(line, JSON_ALLOW_NUL, &err);
    ck_assert_ptr_nonnull(o);
    json_t *text = json_object_get(o, "text"), *ids = json_object_get(o, ids_key);
    ck_assert(json_is_string(text) && json_is_array(ids));
    gj_ids got = {0};
    ck_assert_int_eq(gj_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &got), 0);
    ck_assert_msg(got.n == json_array_size(ids), "%s line %d: %zu ids, expected %zu", name, n + 1,
                  got.n, json_array_size(ids));
    for (size_t i = 0; i < got.n; i++)
      ck_assert_msg(got.v[i] == json_integer_value(json_array_get(ids, i)), "%s line %d id %zu",
                    name, n + 1, i);
    gj_bytes back = {0};
    ck_assert_int_eq(gj_tokenizer_decode(tok, got.v, got.n, &back), 0);
    ck_assert_int_eq(back.n, json_string_length(text));
    ck_assert(!memcmp(back.v, json_string_value(text), back.n));
    free(got.v), free(back.v);
    json_decref(o);
    n++;
  }
  ck_assert_int_gt(n, 0);
  free(line);
  fclose(f);
}

START_TEST(test_golden_cases) { check_jsonl("tokenizer.jsonl", "ids"); }
END_TEST
START_TEST(test_white_space) { check_jsonl("tokenizer-ws-divergence.jsonl", "ids_unicode_white_space"); }
END_TEST

/* The pattern runs on windows of the text (256 bytes, doubled while a match ends near the
 * window's end): the ids are those of one match on the whole rest (a window larger than the
 * text), with windows of 17, 64 and 256 bytes, on runs of every class of the pattern (letters,
 * digits, punctuation, white space of 1-3 bytes, invalid bytes) of 1-300 bytes, each followed by
 * each kind of character, so that every class meets a window's end at every offset. */
START_TEST(test_window_offsets) {
  static const char *unit[] = {"a", "\xc3\xa9", "\xe4\xb8\xad", "1", "!", " ", "\xe3\x80\x80", "\t", "\n",
                               "\xc2\xa0", "\xf0\x9f\x98\x80", "\xff", "'s"};
  static const char *next[] = {"", "x", " ", "\xe3\x80\x80", "\xc3\xa9", "\xff", "\n", "7", "?", " y"};
  const size_t nu = sizeof unit / sizeof unit[0], nn = sizeof next / sizeof next[0], wins[] = {17, 64, 256};
  char *buf = malloc(4096);
  for (size_t u = 0; u < nu; u++)
    for (size_t x = 0; x < nn; x++)
      for (size_t len = 1; len <= 300; len += (len < 280 && len > 20 ? 7 : 1)) {
        size_t n = 0;
        while (n < len) n += (size_t)sprintf(buf + n, "%s", unit[u]);
        n += (size_t)sprintf(buf + n, "%s tail", next[x]);
        gj_ids whole = {0};
        gj_tokenizer_set_window(tok, 1 << 20);
        ck_assert_int_eq(gj_tokenizer_encode(tok, buf, n, &whole), 0);
        for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++) {
          gj_ids got = {0};
          gj_tokenizer_set_window(tok, wins[w]);
          ck_assert_int_eq(gj_tokenizer_encode(tok, buf, n, &got), 0);
          ck_assert_msg(got.n == whole.n && !memcmp(got.v, whole.v, got.n * sizeof(int32_t)),
                        "run of %zu bytes of unit %zu then %zu: window %zu gives other ids", len, u, x, wins[w]);
          free(got.v);
        }
        free(whole.v);
      }
  gj_tokenizer_set_window(tok, 0);
  free(buf);
}
END_TEST

START_TEST(test_endoftext_is_text) {
  gj_ids got = {0};
  const char *s = "<|endoftext|>";
  ck_assert_int_eq(gj_tokenizer_encode(tok, s, strlen(s), &got), 0);
  int want[] = {27, 91, 437, 1659, 5239, 91, 29};
  ck_assert_int_eq(got.n, 7);
  for (int i = 0; i < 7; i++) ck_assert_int_eq(got.v[i], want[i]);
  free(got.v);
}
END_TEST

START_TEST(test_any_bytes_round_trip) {
  /* Random bytes (invalid UTF-8, NULs), and mixtures with text and long runs. */
  char buf[4096];
  for (int trial = 0; trial < 300; trial++) {
    size_t n = 1 + (size_t)((tu_rand() + 1) * 2000) % 4000;
    for (size_t i = 0; i < n; i++) {
      double r = tu_rand();
      static const char pool[] = "ab cd\xc3\xa9 12,!\n";
      buf[i] = r < -0.3 ? (char)(int)((tu_rand() + 1) * 128)
                        : (r < 0.5 ? pool[(int)((tu_rand() + 1) * 0.5 * (sizeof pool - 1))] : 'a');
    }
    gj_ids ids = {0};
    gj_bytes back = {0};
    ck_assert_int_eq(gj_tokenizer_encode(tok, buf, n, &ids), 0);
    ck_assert_int_eq(gj_tokenizer_decode(tok, ids.v, ids.n, &back), 0);
    ck_assert_int_eq(back.n, n);
    ck_assert(!memcmp(back.v, buf, n));
    free(ids.v), free(back.v);
  }
  /* A long piece with no break (a single 200 kB word) stays fast and exact. */
  size_t n = 200000;
  char *w = malloc(n);
  for (size_t i = 0; i < n; i++) w[i] = "abcab"[i % 5];
  gj_ids ids = {0};
  gj_bytes back = {0};
  ck_assert_int_eq(gj_tokenizer_encode(tok, w, n, &ids), 0);
  ck_assert_int_eq(gj_tokenizer_decode(tok, ids.v, ids.n, &back), 0);
  ck_assert(back.n == n && !memcmp(back.v, w, n));
  free(w), free(ids.v), free(back.v);
}
END_TEST

START_TEST(test_decode_bad_id) {
  int32_t ids[2] = {15496, 50257};
  gj_bytes b = {0};
  ck_assert_int_eq(gj_tokenizer_decode(tok, ids, 2, &b), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "50257"));
  free(b.v);
}
END_TEST

/* gptj decode's input: ids of decimal digits (leading zeros too) separated by any white space
 * (\v and \f too); a sign or other characters are refused with the token's number. */
START_TEST(test_decode_command) {
  struct { const char *in; int rc; const char *out; } c[] = {
      {"15496 995", 0, "Hello world"},       {"15496\\v995\\n", 0, "Hello world"},
      {"\\f15496\\t995", 0, "Hello world"}, {"000000000000015496 0000000000", 0, "Hello!"},
      {"+15496", 1, "token 1 is not an id (decimal digits)"}, {"15496 -0", 1, "token 2 is not an id"},
      {"15496x", 1, "token 1 is not an id"}, {"1 99999999999999", 1, "token 2: id 99999999999999 is outside"}};
  char log[1400];
  snprintf(log, sizeof log, "%s/decode.log", OUT);
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    int rc = tu_sh("printf '%s' | %s/gptj decode >%s 2>&1", c[i].in, B_, log);
    ck_assert_msg(rc == c[i].rc, "decode of '%s': exit %d", c[i].in, rc);
    ck_assert_msg(tu_sh("grep -q -- '%s' %s", c[i].out, log) == 0, "decode of '%s': no '%s'", c[i].in, c[i].out);
  }
}
END_TEST

static size_t count_file(const char *name) {
  char path[1200];
  snprintf(path, sizeof path, "%s/data/%s", srcdir, name);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  gj_bytes b = {0};
  char buf[65536];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) gj_bytes_append(&b, buf, k);
  fclose(f);
  gj_ids ids = {0};
  ck_assert_int_eq(gj_tokenizer_encode(tok, b.v, b.n, &ids), 0);
  size_t n = ids.n;
  free(b.v), free(ids.v);
  return n;
}

START_TEST(test_brown_counts) {
  ck_assert_int_eq(count_file("brown-train.txt"), 1093677);
  ck_assert_int_eq(count_file("brown-valid.txt"), 63904);
  ck_assert_int_eq(count_file("brown-test.txt"), 64042);
}
END_TEST

START_TEST(test_bad_vocab_dir) {
  gj_tokenizer *t = NULL;
  ck_assert_int_eq(gj_tokenizer_load(&t, "/nonexistent/gpt2"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "/nonexistent/gpt2"));
}
END_TEST


/* ---- gptj tokenize ---- */

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s", path);
  fseek(f, 0, SEEK_END);
  long k = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)k + 1);
  ck_assert(fread(b, 1, (size_t)k, f) == (size_t)k);
  fclose(f);
  *n = (size_t)k;
  return b;
}

static void spit(const char *path, const char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s", path);
  ck_assert(fwrite(b, 1, n, f) == n);
  fclose(f);
}

static void spit_gz(const char *path, const char *b, size_t n) {
  gzFile g = gzopen(path, "wb6");
  ck_assert_ptr_nonnull(g);
  ck_assert_int_eq(gzwrite(g, b, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(g), Z_OK);
}

/* times copies of b as one zstd stream (several frames: the reader must follow them), after a
 * skippable frame, as pzstd writes first */
static void spit_zst(const char *path, const char *b, size_t n, int times) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  static const unsigned char skip[12] = {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 'g', 'p', 't', 'j'};
  ck_assert(fwrite(skip, 1, sizeof skip, f) == sizeof skip);
  ZSTD_CCtx *c = ZSTD_createCCtx();
  size_t cap = ZSTD_CStreamOutSize();
  char *o = malloc(cap);
  for (int t = 0; t < times; t++) {
    ZSTD_inBuffer in = {b, n, 0};
    ZSTD_EndDirective end = t % 50 == 49 || t == times - 1 ? ZSTD_e_end : ZSTD_e_continue;
    size_t left;
    do {
      ZSTD_outBuffer ob = {o, cap, 0};
      left = ZSTD_compressStream2(c, &ob, &in, end);
      ck_assert(!ZSTD_isError(left));
      ck_assert(fwrite(o, 1, ob.pos, f) == ob.pos);
    } while (end == ZSTD_e_end ? left != 0 : in.pos < in.size);
  }
  ZSTD_freeCCtx(c), free(o);
  fclose(f);
}

/* Brown-valid's text as it is, and brown-test's lines as JSONL (with blank lines, an
 * empty text, another key, CRLF), in DIR/corpus/{a.txt,b.jsonl}, each as plain, .gz and .zst
 * in dirs plain/, gz/, zst/. */
static void make_corpora(const char *dir) {
  char p[1600], *a, *t;
  size_t na, nt;
  snprintf(p, sizeof p, "%s/data/brown-valid.txt", srcdir);
  a = slurp(p, &na);
  snprintf(p, sizeof p, "%s/data/brown-test.txt", srcdir);
  t = slurp(p, &nt);
  gj_bytes j = {0};
  size_t line = 0;
  for (size_t i = 0; i < nt;) {
    char *nl = memchr(t + i, '\n', nt - i);
    size_t e = nl ? (size_t)(nl - t) : nt;
    json_t *o = json_pack("{s:s%,s:i}", "text", t + i, e - i, "id", (int)line);
    char *js = json_dumps(o, JSON_COMPACT);
    gj_bytes_append(&j, js, strlen(js));
    gj_bytes_append(&j, line % 5 == 0 ? "\r\n" : "\n", line % 5 == 0 ? 2 : 1);
    if (line % 9 == 0) gj_bytes_append(&j, "\n{\"text\": \"\"}\n", 14);
    free(js), json_decref(o);
    i = e + 1, line++;
  }
  const char *enc[] = {"plain", "gz", "zst"};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(tu_sh("mkdir -p %s/%s/corpus", dir, enc[k]), 0);
    const char *sfx = k == 0 ? "" : k == 1 ? ".gz" : ".zst";
    for (int f = 0; f < 2; f++) {
      snprintf(p, sizeof p, "%s/%s/corpus/%s%s", dir, enc[k], f ? "b.jsonl" : "a.txt", sfx);
      const char *b = f ? j.v : a;
      size_t n = f ? j.n : na;
      if (k == 0) spit(p, b, n);
      else if (k == 1) spit_gz(p, b, n);
      else spit_zst(p, b, n, 1);
    }
  }
  free(a), free(t), free(j.v);
}

static int64_t attr_i64(const char *path, const char *name) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  int64_t v = -1;
  ck_assert_int_ge(H5Aread(a, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(a), H5Fclose(f);
  return v;
}

/* jansson's answer for a JSONL line: 1 and the text when it is an object whose "text" member
 * is a string (json_loadb with JSON_ALLOW_NUL, as io/docstream.c), else 0. */
static int jansson_text(const char *line, size_t len, char *out, size_t *n) {
  json_error_t err;
  json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &err);
  json_t *t = o && json_is_object(o) ? json_object_get(o, "text") : NULL;
  int ok = t && json_is_string(t);
  if (ok) *n = json_string_length(t), memcpy(out, json_string_value(t), *n);
  json_decref(o);
  return ok;
}

/* The one-pass JSONL scan (io/jsonscan.h) against jansson: on every line it answers for, the
 * same text byte for byte (decoded in place, as docstream does); it answers for the usual
 * lines (escapes of every kind, surrogate pairs, UTF-8 of 2-4 bytes, nested values, numbers,
 * the key repeated, other keys); it leaves to jansson every line jansson refuses or that it is
 * not sure of (exponents, long numbers, an escaped key, deep nesting), and every line without
 * the key as a string. */
START_TEST(test_jsonscan) {
  struct { const char *line; int fast; } cases[] = {
      {"{\"text\": \"hello\"}", 1},
      {"  {\"id\": 3, \"text\":\"a\\nb\\t\\\"q\\\" \\\\ \\/ \\b\\f\\r\", \"x\": [1, -2.5, true, false, null, {}, []]}  ", 1},
      {"{\"text\": \"\\u00e9\\u4e2d\\ud83d\\ude00 \xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\"}", 1},
      {"{\"text\": \"nul\\u0000inside\"}", 1},
      {"{\"text\": \"first\", \"meta\": {\"a\": {\"text\": 5}}, \"text\": \"second\"}", 1},
      {"{\"meta\": {\"pile_set_name\": \"Pile-CC\"}, \"text\": \"\"}", 1},
      {"{\"text\": \"0123456789abcdef0123456789abcdef plain run of more than eight bytes\"}", 1},
      {"{\"n\": 0, \"m\": -0.5, \"k\": 123456789012345, \"text\": \"t\"}", 1},
      {"{\"text\": \"x\", \"text\": 3}", 0},          /* the last one wins: not a string */
      {"{\"n\": 1e5, \"text\": \"t\"}", 0},            /* exponents: jansson decides */
      {"{\"n\": 1234567890123456789012, \"text\": \"t\"}", 0}, /* jansson: too big an integer */
      {"{\"te\\u0078t\": \"t\"}", 0},                /* an escaped key */
      {"{\"text\": \"bad \xc3\"}", 0}, {"{\"text\": \"overlong \xc0\xaf\"}", 0},
      {"{\"text\": \"surrogate \xed\xa0\x80\"}", 0}, {"{\"text\": \"lone \\ud800 x\"}", 0},
      {"{\"text\": \"lone \\udc00\"}", 0}, {"{\"text\": \"ctrl \x01\"}", 0}, {"{\"text\": \"bad \\x\"}", 0},
      {"{\"text\": \"t\"} trailing", 0}, {"{\"text\": \"t\",}", 0}, {"[\"text\"]", 0}, {"\"text\"", 0},
      {"{\"text\": \"unterminated}", 0}, {"{\"text\" \"t\"}", 0}, {"{\"a\": 01, \"text\": \"t\"}", 0},
      {"{\"a\": tru, \"text\": \"t\"}", 0}, {"{\"a\": -, \"text\": \"t\"}", 0}, {"{\"a\": 1., \"text\": \"t\"}", 0},
      {"{\"title\": \"no text\"}", 0}, {"{}", 0}, {"", 0}, {"\xef\xbb\xbf{\"text\": \"bom\"}", 0}};
  char want[512], line[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len = strlen(cases[i].line), wn = 0, gn = 0;
    memcpy(line, cases[i].line, len);
    const char *out;
    int fast = gj_jsonscan_text(line, len, "text", line, &out, &gn);
    int ok = jansson_text(cases[i].line, len, want, &wn);
    ck_assert_msg(fast == (cases[i].fast ? 1 : -1), "case %zu: scan %d", i, fast);
    if (fast == 1) {
      ck_assert_msg(ok && gn == wn && !memcmp(out, want, wn), "case %zu: the scan's text differs from jansson's", i);
    } else {
      ck_assert_msg(!memcmp(line, cases[i].line, len), "case %zu: a refused line was changed", i);
    }
  }
  /* nesting: 64 levels are scanned, 65 left to jansson (which reads both) */
  for (int depth = 64; depth <= 65; depth++) {
    size_t k = 0;
    k += (size_t)sprintf(line + k, "{\"a\": ");
    for (int d = 0; d < depth - 1; d++) line[k++] = '[';
    for (int d = 0; d < depth - 1; d++) line[k++] = ']';
    k += (size_t)sprintf(line + k, ", \"text\": \"deep\"}");
    const char *out;
    size_t gn;
    ck_assert_int_eq(gj_jsonscan_text(line, k, "text", line, &out, &gn), depth <= 64 ? 1 : -1);
  }
}
END_TEST

START_TEST(test_tokenize_identical) {
  char d[1300], cmd[4096];
  snprintf(d, sizeof d, "%s/ident", OUT);
  ck_assert_int_eq(tu_sh("rm -rf %s && mkdir -p %s", d, d), 0);
  make_corpora(d);
  const char *split = "--valid-fraction 0.1";
  /* the reference: one process, no parts */
  ck_assert_int_eq(tu_sh("%s/gptj tokenize --out %s/ref.h5 --valid-out %s/refv.h5 %s %s/plain/corpus >%s/ref.log 2>&1",
                         B_, d, d, split, d, d), 0);
  /* brown-valid alone: the counts of the in-memory tokenize (25 documents, 63880 tokens) */
  ck_assert_int_eq(tu_sh("%s/gptj tokenize --out %s/a.h5 %s/plain/corpus/a.txt >/dev/null 2>&1", B_, d, d), 0);
  snprintf(cmd, sizeof cmd, "%s/a.h5", d);
  ck_assert_int_eq(attr_i64(cmd, "n_docs"), 25);
  ck_assert_int_eq(attr_i64(cmd, "n_tokens"), 63880);
  /* an output name of 248 characters (its temporaries get names of their own): the same file */
  ck_assert_int_eq(tu_sh("n=%s/$(printf 'n%%.0s' $(seq 245)).h5 && %s/gptj tokenize --out $n %s/plain/corpus/a.txt >/dev/null 2>&1 "
                         "&& h5diff %s/a.h5 $n /tokens /tokens && rm $n && test -z \"$(ls -A %s | grep -i spool)\"",
                         d, B_, d, d, d), 0);
  /* gzip followed by zero padding (as a block device or tape leaves it; gzip ignores it): the
   * same tokens */
  ck_assert_int_eq(tu_sh("(cat %s/gz/corpus/a.txt.gz; head -c 3000000 /dev/zero) > %s/pad.txt.gz && %s/gptj tokenize "
                         "--out %s/pad.h5 %s/pad.txt.gz >/dev/null 2>&1 && h5diff %s/a.h5 %s/pad.h5 /tokens /tokens",
                         d, d, B_, d, d, d, d), 0);
  /* the same text with CRLF line ends: the same tokens (no '\r' kept at the lines' ends) */
  ck_assert_int_eq(tu_sh("sed 's/$/\r/' %s/plain/corpus/a.txt > %s/crlf.txt && %s/gptj tokenize --out %s/crlf.h5 %s/crlf.txt "
                         ">/dev/null 2>&1 && h5diff %s/a.h5 %s/crlf.h5 /tokens /tokens && h5diff %s/a.h5 %s/crlf.h5 "
                         "/doc_offsets /doc_offsets", d, d, B_, d, d, d, d, d, d), 0);
  snprintf(cmd, sizeof cmd, "%s/ref.h5", d);
  int64_t ndocs = attr_i64(cmd, "n_docs");
  ck_assert_int_gt(ndocs, 700); /* the JSONL lines are documents */
  struct {
    int np;
    const char *enc;
    long part;
  } runs[] = {{1, "plain", 3000}, {2, "plain", 0}, {2, "plain", 20000}, {3, "plain", 7777}, {4, "plain", 1000},
              {1, "gz", 0},       {2, "gz", 0},    {1, "zst", 0},       {3, "zst", 0},      {4, "gz", 50000}};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    int r = tu_sh("%s -np %d --oversubscribe %s/gptj tokenize --part-bytes %ld --out %s/o%zu.h5 --valid-out %s/o%zuv.h5 "
                  "%s %s/%s/corpus >%s/o%zu.log 2>&1",
                  MPI_, runs[i].np, B_, runs[i].part, d, i, d, i, split, d, runs[i].enc, d, i);
    ck_assert_msg(r == 0, "run %zu (%d ranks, %s): exit %d, see %s/o%zu.log", i, runs[i].np, runs[i].enc, r, d, i);
    ck_assert_msg(tu_sh("cmp %s/ref.h5 %s/o%zu.h5 && cmp %s/refv.h5 %s/o%zuv.h5", d, d, i, d, d, i) == 0,
                  "run %zu (%d ranks, %s, parts of %ld bytes) differs from one rank's", i, runs[i].np, runs[i].enc,
                  runs[i].part);
  }
}
END_TEST

/* Peak RSS (kB) of a command run as a child of its own (bash execs it). */
static long peak_rss_kb(const char *cmd, int *status) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  struct rusage ru;
  ck_assert_int_eq(wait4(pid, status, 0, &ru), pid);
  return ru.ru_maxrss;
}

START_TEST(test_tokenize_memory_bound) {
  /* The bound --help states: 64 MB + 14 x --max-doc-mb; with --max-doc-mb 1, 78 MB. The input:
   * 900 copies of brown-valid (273 MB of text, 3.5 x the bound; the in-memory tokenize held
   * about 4 bytes a byte of it), as zstd. */
  char d[1300], p[1400], cmd[4096];
  snprintf(d, sizeof d, "%s/membound", OUT);
  ck_assert_int_eq(tu_sh("rm -rf %s && mkdir -p %s", d, d), 0);
  snprintf(p, sizeof p, "%s/data/brown-valid.txt", srcdir);
  size_t n;
  char *a = slurp(p, &n);
  a = realloc(a, n + 2);
  a[n++] = '\n'; /* a blank line: each copy's last document ends there */
  snprintf(p, sizeof p, "%s/big.txt.zst", d);
  int copies = 900;
  spit_zst(p, a, n, copies);
  free(a);
  double bound_kb = (64 + 14 * 1) * 1024.0, text_kb = (double)n * copies / 1024;
  ck_assert(text_kb > 3 * bound_kb);
  snprintf(cmd, sizeof cmd, "exec %s/gptj tokenize --max-doc-mb 1 --out %s/big.h5 %s >%s/big.log 2>&1", B_, d, p, d);
  int st = 0;
  long kb = peak_rss_kb(cmd, &st);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tokenize failed: see %s/big.log", d);
  snprintf(p, sizeof p, "%s/big.h5", d);
  ck_assert_int_eq(attr_i64(p, "n_docs"), 25 * copies);
  ck_assert_int_eq(attr_i64(p, "n_tokens"), 63880LL * copies);
#ifdef __SANITIZE_ADDRESS__
  /* an AddressSanitizer build's resident set holds ASan's shadow memory and quarantine, not
   * only the program's: the bound is asserted by the plain build; here the run must be right
   * and clean under ASan */
  fprintf(stderr, "test_tokenize_memory_bound: AddressSanitizer build: peak RSS %ld kB not compared with the "
          "bound of %.0f kB (the plain build asserts it)\n", kb, bound_kb);
#else
  ck_assert_msg(kb < bound_kb, "peak RSS %ld kB, over the stated bound of %.0f kB (input %.0f kB of text)", kb, bound_kb, text_kb);
#endif
  tu_sh("rm -f %s/big.h5 %s/big.txt.zst", d, d);
  /* 400,000 distinct pieces of 64 bytes that are not UTF-8 (one id a byte), in documents of
   * 1,000: the BPE cache must not grow past the bound (it held 197 MB of them) */
  snprintf(p, sizeof p, "%s/distinct.txt", d);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  static const unsigned char bad[] = {0xc0, 0xc1, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff};
  for (int i = 0; i < 400000; i++) {
    unsigned char piece[66];
    for (int j = 0; j < 64; j++) piece[j] = bad[(int)((tu_rand() + 1) * 0.5 * sizeof bad) % (int)sizeof bad];
    int m = (i + 1) % 1000 ? (piece[64] = 'a', 65) : (piece[64] = piece[65] = '\n', 66);
    ck_assert_int_eq(fwrite(piece, 1, (size_t)m, f), (size_t)m);
  }
  ck_assert_int_eq(fclose(f), 0);
  snprintf(cmd, sizeof cmd, "exec %s/gptj tokenize --max-doc-mb 1 --out %s/distinct.h5 %s >%s/distinct.log 2>&1", B_, d, p, d);
  kb = peak_rss_kb(cmd, &st);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tokenize failed: see %s/distinct.log", d);
  snprintf(p, sizeof p, "%s/distinct.h5", d);
  ck_assert_int_eq(attr_i64(p, "n_docs"), 400);
#ifndef __SANITIZE_ADDRESS__
  ck_assert_msg(kb < bound_kb, "peak RSS %ld kB on distinct pieces, over the stated bound of %.0f kB", kb, bound_kb);
#endif
  tu_sh("rm -f %s/distinct.h5 %s/distinct.txt", d, d);
}
END_TEST

int main(void) {
  snprintf(srcdir, sizeof srcdir, "%s", tu_env("GJ_SRCDIR", "."));
  if (tu_gptj_setup(B_, S_, MPI_, OUT, DATA, sizeof MPI_, "tokenize")) return 1;
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/data/gpt2", srcdir);
  if (gj_tokenizer_load(&tok, dir)) {
    fprintf(stderr, "%s\n", gj_errmsg());
    return 1;
  }
  Suite *s = suite_create("tokenizer");
  TCase *tc = tcase_create("tokenizer");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_golden_cases);
  tcase_add_test(tc, test_white_space);
  tcase_add_test(tc, test_window_offsets);
  tcase_add_test(tc, test_endoftext_is_text);
  tcase_add_test(tc, test_any_bytes_round_trip);
  tcase_add_test(tc, test_decode_bad_id);
  tcase_add_test(tc, test_jsonscan);
  tcase_add_test(tc, test_brown_counts);
  tcase_add_test(tc, test_bad_vocab_dir);
  TCase *tt = tcase_create("tokenize");
  tcase_set_timeout(tt, 600);
  tcase_add_test(tt, test_tokenize_identical);
  tcase_add_test(tt, test_decode_command);
  tcase_add_test(tt, test_tokenize_memory_bound);
  suite_add_tcase(s, tt);
  suite_add_tcase(s, tc);
  int failed = tu_run(s);
  gj_tokenizer_free(tok);
  return failed;
}
