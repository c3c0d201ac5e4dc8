#include "io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "io/outfile.h"

/* ---- a hash map from byte strings to a pair of ints, keys kept in a pool ---- */
typedef struct {
  uint64_t hash;
  uint32_t off, len; /* key in pool; len == UINT32_MAX marks an empty slot */
  int32_t a, b;
} bentry;

typedef struct {
  bentry *e;
  size_t cap, n;
  char *pool;
  size_t pool_n, pool_cap;
} bmap;

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h ^ (h >> 29);
}

static int bmap_init(bmap *m, size_t cap) {
  memset(m, 0, sizeof *m);
  m->cap = cap;
  m->e = malloc(cap * sizeof(bentry));
  if (!m->e) return -1;
  for (size_t i = 0; i < cap; i++) m->e[i].len = UINT32_MAX;
  return 0;
}

static void bmap_free(bmap *m) {
  free(m->e);
  free(m->pool);
  memset(m, 0, sizeof *m);
}

static void bmap_clear(bmap *m) {
  for (size_t i = 0; i < m->cap; i++) m->e[i].len = UINT32_MAX;
  m->n = 0, m->pool_n = 0;
}

static bentry *bmap_find(const bmap *m, const char *s, size_t n, uint64_t h) {
  for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    bentry *e = &m->e[i];
    if (e->len == UINT32_MAX) return NULL;
    if (e->hash == h && e->len == n && !memcmp(m->pool + e->off, s, n)) return e;
  }
}

/* Insert (no check for an existing key); returns the entry or NULL when out of memory. */
static bentry *bmap_put(bmap *m, const char *s, size_t n, uint64_t h, int32_t a, int32_t b) {
  if (2 * (m->n + 1) > m->cap) {
    bmap old = *m;
    if (bmap_init(m, old.cap * 2)) return *m = old, NULL;
    m->pool = old.pool, m->pool_n = old.pool_n, m->pool_cap = old.pool_cap;
    for (size_t i = 0; i < old.cap; i++)
      if (old.e[i].len != UINT32_MAX) {
        size_t j = old.e[i].hash & (m->cap - 1);
        while (m->e[j].len != UINT32_MAX) j = (j + 1) & (m->cap - 1);
        m->e[j] = old.e[i];
        m->n++;
      }
    free(old.e);
  }
  if (m->pool_n + n > m->pool_cap) {
    size_t nc = (m->pool_cap + n) * 2;
    char *p = realloc(m->pool, nc);
    if (!p) return NULL;
    m->pool = p, m->pool_cap = nc;
  }
  memcpy(m->pool + m->pool_n, s, n);
  size_t i = h & (m->cap - 1);
  while (m->e[i].len != UINT32_MAX) i = (i + 1) & (m->cap - 1);
  bentry *e = &m->e[i];
  e->hash = h, e->off = (uint32_t)m->pool_n, e->len = (uint32_t)n, e->a = a, e->b = b;
  m->pool_n += n;
  m->n++;
  return e;
}

#define WIN_FIRST 256 /* bytes: the first window of gj_tokenizer_encode's matching */

/* ---- a hash map from id pairs to (rank, merged id) ---- */
typedef struct {
  uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
  int32_t rank, id;
} pentry;

struct gj_tokenizer {
  int32_t n_vocab;
  uint32_t *tok_off, *tok_len; /* bytes of each id in tok_pool */
  char *tok_pool;
  int32_t byte_id[256];
  pentry *pairs;
  size_t pair_cap;
  pcre2_code *re;
  pcre2_match_data *md;
  bmap cache;   /* piece bytes -> (offset, count) in cache_ids */
  gj_ids cache_ids;
  /* BPE work space */
  int32_t *sym, *prev, *next;
  struct heap_item { int32_t rank, pos; } *heap;
  size_t work_cap;
  size_t win_first; /* the first window of the pattern's matching (WIN_FIRST) */
};

static const pentry *pair_find(const gj_tokenizer *t, int32_t a, int32_t b) {
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint64_t h = key * 0x9e3779b97f4a7c15ULL;
  for (size_t i = (h >> 20) & (t->pair_cap - 1);; i = (i + 1) & (t->pair_cap - 1)) {
    if (t->pairs[i].key == key) return &t->pairs[i];
    if (t->pairs[i].key == 0) return NULL;
  }
}

static void pair_put(gj_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint64_t h = key * 0x9e3779b97f4a7c15ULL;
  size_t i = (h >> 20) & (t->pair_cap - 1);
  while (t->pairs[i].key != 0 && t->pairs[i].key != key) i = (i + 1) & (t->pair_cap - 1);
  if (t->pairs[i].key == key && t->pairs[i].rank <= rank) return; /* keep the first rank */
  t->pairs[i].key = key, t->pairs[i].rank = rank, t->pairs[i].id = id;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n. */
static void byte_unicode_table(int cp[256]) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp[b] = printable ? b : 256 + n++;
  }
}

/* Decode a token string of encoder.json / vocab.bpe (UTF-8 of byte-unicode code points) into
 * raw bytes; -1 if a code point is not one of the 256. */
static int unicode_to_bytes(const int inv[512], const char *s, size_t n, char *out, size_t *outn) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    unsigned c = (unsigned char)s[i];
    int cp, len;
    if (c < 0x80) cp = c, len = 1;
    else if ((c & 0xE0) == 0xC0 && i + 1 < n) cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F), len = 2;
    else return -1;
    if (cp >= 512 || inv[cp] < 0) return -1;
    out[k++] = (char)inv[cp];
    i += len;
  }
  *outn = k;
  return 0;
}

static const char *WS = "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}"
                        "\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

static int compile_pattern(gj_tokenizer *t) {
  /* The GPT-2 pattern with \s spelled out as the Unicode White_Space property (PCRE2's \s
   * under UCP lacks U+0085). */
  char pat[1024];
  snprintf(pat, sizeof pat,
           "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^%s\\p{L}\\p{N}]+|[%s]+(?![^%s])|[%s]+",
           WS, WS, WS, WS);
  int err;
  PCRE2_SIZE erroff;
  t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return GJ_FAIL("tokenizer pattern: %s at %zu", (char *)msg, (size_t)erroff);
  }
  pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if absent */
  t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
  return t->md ? 0 : GJ_FAIL("out of memory");
}

static int load_encoder(gj_tokenizer *t, const char *path, const int inv[512], bmap *str2id) {
  json_error_t jerr;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    if (jerr.line < 1) return GJ_FAIL("%s: %s", path, jerr.text);
    return GJ_FAIL("%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
  }
  if (!json_is_object(root)) {
    json_decref(root);
    return GJ_FAIL("%s: expected a JSON object of token -> id", path);
  }
  size_t n = json_object_size(root);
  if (n < 256 || n > (1u << 24)) {
    json_decref(root);
    return GJ_FAIL("%s: %zu entries is not a GPT-2 vocabulary", path, n);
  }
  t->n_vocab = (int32_t)n;
  t->tok_off = calloc(n, sizeof(uint32_t));
  t->tok_len = calloc(n, sizeof(uint32_t));
  char *seen = calloc(n, 1);
  size_t pool_cap = 16 * n, pool_n = 0;
  t->tok_pool = malloc(pool_cap);
  int rc = 0;
  if (!t->tok_off || !t->tok_len || !seen || !t->tok_pool) rc = GJ_FAIL("out of memory");
  const char *key;
  json_t *val;
  char buf[1024];
  json_object_foreach(root, key, val) {
    if (rc) break;
    size_t kl = strlen(key), bl;
    if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (json_int_t)n) {
      rc = GJ_FAIL("%s: token \"%.40s\" has an id that is not an integer in [0, %zu)", path, key, n);
      break;
    }
    int32_t id = (int32_t)json_integer_value(val);
    if (seen[id]) {
      rc = GJ_FAIL("%s: id %d appears twice", path, id);
      break;
    }
    seen[id] = 1;
    if (kl > sizeof buf || unicode_to_bytes(inv, key, kl, buf, &bl)) {
      /* <|endoftext|> and other added tokens are plain ASCII and map to themselves. */
      if (kl > sizeof buf) {
        rc = GJ_FAIL("%s: token of %zu bytes is too long", path, kl);
        break;
      }
      memcpy(buf, key, kl), bl = kl;
    }
    if (pool_n + bl > pool_cap) {
      pool_cap = 2 * (pool_cap + bl);
      char *p = realloc(t->tok_pool, pool_cap);
      if (!p) { rc = GJ_FAIL("out of memory"); break; }
      t->tok_pool = p;
    }
    memcpy(t->tok_pool + pool_n, buf, bl);
    t->tok_off[id] = (uint32_t)pool_n, t->tok_len[id] = (uint32_t)bl;
    pool_n += bl;
    if (id != GJ_EOT_ID && !bmap_put(str2id, buf, bl, hash_bytes(buf, bl), id, 0))
      rc = GJ_FAIL("out of memory");
  }
  for (size_t i = 0; !rc && i < n; i++)
    if (!seen[i]) rc = GJ_FAIL("%s: id %zu is missing", path, i);
  for (int b = 0; !rc && b < 256; b++) {
    char c = (char)b;
    bentry *e = bmap_find(str2id, &c, 1, hash_bytes(&c, 1));
    if (!e) rc = GJ_FAIL("%s: no token for byte %d", path, b);
    else t->byte_id[b] = e->a;
  }
  free(seen);
  json_decref(root);
  return rc;
}

static int load_merges(gj_tokenizer *t, const char *path, const int inv[512], const bmap *str2id) {
  FILE *f = fopen(path, "rb");
  if (!f) return GJ_FAIL("%s: %s", path, strerror(errno));
  t->pair_cap = 1 << 18;
  t->pairs = calloc(t->pair_cap, sizeof(pentry));
  if (!t->pairs) return fclose(f), GJ_FAIL("out of memory");
  char line[2048], a[1024], b[1024], ab[2048];
  int lineno = 0, rank = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strlen(line);
    if (len && line[len - 1] == '\n') line[--len] = 0;
    if (lineno == 1 && !strncmp(line, "#version", 8)) continue;
    if (len == 0) continue;
    char *sp = strchr(line, ' ');
    size_t al, bl;
    if (!sp || strchr(sp + 1, ' ') || sp == line || !sp[1] ||
        unicode_to_bytes(inv, line, sp - line, a, &al) ||
        unicode_to_bytes(inv, sp + 1, strlen(sp + 1), b, &bl)) {
      rc = GJ_FAIL("%s:%d: expected a merge 'A B' of byte-level tokens", path, lineno);
      break;
    }
    memcpy(ab, a, al), memcpy(ab + al, b, bl);
    bentry *ea = bmap_find(str2id, a, al, hash_bytes(a, al));
    bentry *eb = bmap_find(str2id, b, bl, hash_bytes(b, bl));
    bentry *eab = bmap_find(str2id, ab, al + bl, hash_bytes(ab, al + bl));
    if (!ea || !eb || !eab) {
      rc = GJ_FAIL("%s:%d: merge of tokens that are not in encoder.json", path, lineno);
      break;
    }
    if (2 * (size_t)(rank + 1) > t->pair_cap) {
      rc = GJ_FAIL("%s: too many merges", path);
      break;
    }
    pair_put(t, ea->a, eb->a, rank++, eab->a);
  }
  if (!rc && ferror(f)) rc = GJ_FAIL("%s: read error", path);
  if (!rc && rank == 0) rc = GJ_FAIL("%s: no merges", path);
  fclose(f);
  return rc;
}

int gj_tokenizer_load(gj_tokenizer **out, const char *dir) {
  *out = NULL;
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode))
    return GJ_FAIL("%s: tokenizer directory not found (it holds encoder.json and vocab.bpe)", dir);
  gj_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return GJ_FAIL("out of memory");
  t->win_first = WIN_FIRST;
  int cp[256], inv[512];
  byte_unicode_table(cp);
  for (int i = 0; i < 512; i++) inv[i] = -1;
  for (int b = 0; b < 256; b++) inv[cp[b]] = b;
  char enc[GJ_PATH_BUF], bpe[GJ_PATH_BUF];
  /* every rank reads these files itself (io/outfile.h: regular files under mpirun) */
  int rc = gj_path_join(enc, sizeof enc, dir, "encoder.json");
  if (!rc) rc = gj_path_join(bpe, sizeof bpe, dir, "vocab.bpe");
  if (!rc) rc = gj_outfile_check_input(enc, NULL, 0);
  if (!rc) rc = gj_outfile_check_input(bpe, NULL, 0);
  if (rc) {
    free(t);
    return rc;
  }
  bmap str2id;
  rc = bmap_init(&str2id, 1 << 17) ? GJ_FAIL("out of memory") : 0;
  if (!rc) rc = load_encoder(t, enc, inv, &str2id);
  if (!rc) rc = load_merges(t, bpe, inv, &str2id);
  bmap_free(&str2id);
  if (!rc) rc = compile_pattern(t);
  if (!rc && bmap_init(&t->cache, 1 << 16)) rc = GJ_FAIL("out of memory");
  if (rc) {
    gj_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void gj_tokenizer_free(gj_tokenizer *t) {
  if (!t) return;
  free(t->tok_off), free(t->tok_len), free(t->tok_pool), free(t->pairs);
  if (t->md) pcre2_match_data_free(t->md);
  if (t->re) pcre2_code_free(t->re);
  bmap_free(&t->cache);
  free(t->cache_ids.v);
  free(t->sym), free(t->prev), free(t->next), free(t->heap);
  free(t);
}

int32_t gj_tokenizer_vocab_size(const gj_tokenizer *t) { return t->n_vocab; }

int gj_ids_push(gj_ids *v, int32_t id) {
  if (v->n == v->cap) {
    size_t nc = v->cap ? 2 * v->cap : 1024;
    int32_t *p = realloc(v->v, nc * sizeof(int32_t));
    if (!p) return GJ_FAIL("out of memory");
    v->v = p, v->cap = nc;
  }
  v->v[v->n++] = id;
  return 0;
}

int gj_bytes_append(gj_bytes *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = 2 * (b->n + n + 1);
    char *p = realloc(b->v, nc);
    if (!p) return GJ_FAIL("out of memory");
    b->v = p, b->cap = nc;
  }
  memcpy(b->v + b->n, s, n);
  b->n += n;
  b->v[b->n] = 0;
  return 0;
}

/* Min-heap on (rank, pos): the lowest rank first, the leftmost among equals, which is the
 * order in which encoder.py's rounds merge (each round merges every occurrence of the best
 * pair from left to right; a merged pair's rank is above the ranks that made its parts). */
static int heap_less(struct heap_item a, struct heap_item b) {
  return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item x) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(x, h[p])) break;
    h[i] = h[p], i = p;
  }
  h[i] = x;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n) {
  struct heap_item top = h[0], x = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
    if (!heap_less(h[c], x)) break;
    h[i] = h[c], i = c;
  }
  h[i] = x;
  return top;
}

/* The BPE workspace of a piece of n bytes: symbols, links and the heap, 28 bytes a byte (see
 * work_reserve); a piece of over 1 MB (a word, number or run of one class without a break) is
 * checked against the memory available first. */
#define WORK_BYTES_PER_BYTE 28.0
static int work_reserve(gj_tokenizer *t, size_t n) {
  if (n <= t->work_cap) return 0;
  double share = n > ((size_t)1 << 20) ? gj_mem_share_bytes() : 0;
  if (share > 0 && WORK_BYTES_PER_BYTE * (double)n > share)
    return GJ_FAIL("tokenizer: a piece of %zu bytes without a break (a word, number or run of spaces) needs "
                   "%.2f GB to encode, more than the %.2f GB available", n, WORK_BYTES_PER_BYTE * (double)n / 1e9,
                   share / 1e9);
  size_t c = n < ((size_t)1 << 16) ? 2 * n : n; /* room to grow for short pieces, exact for long ones */
  int32_t *a = realloc(t->sym, c * sizeof(int32_t));
  if (a) t->sym = a;
  int32_t *b = realloc(t->prev, c * sizeof(int32_t));
  if (b) t->prev = b;
  int32_t *d = realloc(t->next, c * sizeof(int32_t));
  if (d) t->next = d;
  /* n - 1 pairs at first; each merge pops one and pushes at most two, and there are at most
   * n - 1 merges: the heap never holds more than 2n entries */
  struct heap_item *h = realloc(t->heap, 2 * c * sizeof *h);
  if (h) t->heap = h;
  if (!a || !b || !d || !h) return GJ_FAIL("out of memory");
  t->work_cap = c;
  return 0;
}

static int bpe_piece(gj_tokenizer *t, const unsigned char *s, size_t n, gj_ids *out) {
  /* positions are int32 (a piece is one word, number or run of spaces: a longer one is a
   * document of one word over 2 GiB, possible only with --max-doc-mb above 2047) */
  if (n > INT32_MAX)
    return GJ_FAIL("tokenizer: a piece of %zu bytes without a break (a word, number or run of spaces) is "
                   "longer than the 2 GiB it can encode", n);
  GJ_TRY(work_reserve(t, n));
  int32_t *sym = t->sym, *prev = t->prev, *next = t->next;
  size_t hn = 0;
  for (size_t i = 0; i < n; i++) {
    sym[i] = t->byte_id[s[i]];
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    const pentry *p = pair_find(t, sym[i], sym[i + 1]);
    if (p) heap_push(t->heap, &hn, (struct heap_item){p->rank, (int32_t)i});
  }
  while (hn) {
    struct heap_item it = heap_pop(t->heap, &hn);
    int32_t i = it.pos, j = next[i];
    if (sym[i] < 0 || j < 0) continue; /* stale */
    const pentry *p = pair_find(t, sym[i], sym[j]);
    if (!p || p->rank != it.rank) continue; /* stale: the pair changed */
    sym[i] = p->id;
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) {
      const pentry *q = pair_find(t, sym[prev[i]], sym[i]);
      if (q) heap_push(t->heap, &hn, (struct heap_item){q->rank, prev[i]});
    }
    if (next[i] >= 0) {
      const pentry *q = pair_find(t, sym[i], sym[next[i]]);
      if (q) heap_push(t->heap, &hn, (struct heap_item){q->rank, i});
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) GJ_TRY(gj_ids_push(out, sym[i]));
  return 0;
}

/* The cache of pieces' ids: pieces of up to 64 bytes, emptied when it holds 2^17 of them or
 * 4 MB of their bytes and ids: its table (2^18 entries of 24 bytes) and its two growing
 * arrays (at most twice what they hold) stay under 24 MB, within tokenize's memory bound
 * whatever the text (a hostile one of 64-byte pieces of single-byte ids took 427 MB with
 * 2^20 pieces). English text has fewer distinct pieces than that (Brown: about 60,000). */
#define CACHE_MAX_PIECE 64
#define CACHE_MAX_ENTRIES (1u << 17)
#define CACHE_MAX_BYTES ((size_t)4 << 20)

static int encode_piece(gj_tokenizer *t, const char *s, size_t n, gj_ids *out) {
  if (n == 0) return 0;
  if (n > CACHE_MAX_PIECE) return bpe_piece(t, (const unsigned char *)s, n, out);
  uint64_t h = hash_bytes(s, n);
  bentry *e = bmap_find(&t->cache, s, n, h);
  if (e) {
    for (int32_t k = 0; k < e->b; k++) GJ_TRY(gj_ids_push(out, t->cache_ids.v[e->a + k]));
    return 0;
  }
  size_t before = out->n;
  GJ_TRY(bpe_piece(t, (const unsigned char *)s, n, out));
  if (t->cache.n >= CACHE_MAX_ENTRIES || t->cache.pool_n + 4 * t->cache_ids.n >= CACHE_MAX_BYTES)
    bmap_clear(&t->cache), t->cache_ids.n = 0;
  int32_t off = (int32_t)t->cache_ids.n;
  for (size_t k = before; k < out->n; k++) GJ_TRY(gj_ids_push(&t->cache_ids, out->v[k]));
  if (!bmap_put(&t->cache, s, n, h, off, (int32_t)(out->n - before))) return GJ_FAIL("out of memory");
  return 0;
}

/* The pattern runs on a window of the text from pos, not on the whole rest: PCRE2's
 * interpreter (used when its JIT cannot run, as on hosts that refuse writable executable
 * memory) checks the UTF-8 of the whole subject on every call, which made encoding quadratic
 * in a document's length. A match depends on the bytes up to its end, the character after it
 * and, for a run of white space that gives back its last character, one more (at most 8 bytes
 * past its end); the leftmost start is where the first complete valid character is. So a
 * result whose end is more than WIN_MARGIN bytes before the window's end (or a window that
 * reaches the text's end) is the whole text's; otherwise the window doubles and the match runs
 * again (a long word costs twice its length). */
#define WIN_MARGIN 16
void gj_tokenizer_set_window(gj_tokenizer *t, size_t bytes) { t->win_first = bytes > 0 ? bytes : WIN_FIRST; }

int gj_tokenizer_encode(gj_tokenizer *t, const char *text, size_t n, gj_ids *out) {
  size_t pos = 0, win = t->win_first;
  while (pos < n) {
    size_t len = n - pos < win ? n - pos : win;
    int whole = len == n - pos;
    int rc = pcre2_match(t->re, (PCRE2_SPTR)(text + pos), len, 0, 0, t->md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return GJ_FAIL("tokenizer: %s at byte %zu", (char *)msg, pos);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    if (!whole && (rc == PCRE2_ERROR_NOMATCH || ov[1] + WIN_MARGIN > len)) {
      win *= 2;
      continue;
    }
    win = t->win_first;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (ov[0] > 0) GJ_TRY(encode_piece(t, text + pos, ov[0], out)); /* invalid UTF-8 */
    GJ_TRY(encode_piece(t, text + pos + ov[0], ov[1] - ov[0], out));
    pos += ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  if (pos < n) GJ_TRY(encode_piece(t, text + pos, n - pos, out));
  return 0;
}

int gj_tokenizer_decode(const gj_tokenizer *t, const int32_t *ids, size_t n, gj_bytes *out) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n_vocab)
      return GJ_FAIL("token id %d is outside the vocabulary [0, %d)", ids[i], t->n_vocab);
    GJ_TRY(gj_bytes_append(out, t->tok_pool + t->tok_off[ids[i]], t->tok_len[ids[i]]));
  }
  if (!out->v) GJ_TRY(gj_bytes_append(out, "", 0));
  return 0;
}

const char *gj_tokenizer_default_dir(void) {
  static char buf[GJ_PATH_BUF], *big = NULL;
  const char *env = getenv("GJ_DATA_DIR");
  struct stat st;
  if (env && *env) {
    /* any length: a path too long is refused where it is used, not truncated here */
    size_t n = strlen(env) + sizeof "/gpt2";
    if (n <= sizeof buf) return snprintf(buf, sizeof buf, "%s/gpt2", env), buf;
    free(big);
    if (!(big = malloc(n))) return env;
    snprintf(big, n, "%s/gpt2", env);
    return big;
  }
  snprintf(buf, sizeof buf, "%s/gpt2", GJ_PKGDATADIR);
  if (!stat(buf, &st)) return buf;
  snprintf(buf, sizeof buf, "%s/gpt2", GJ_SRCDATADIR);
  return buf;
}
