#include "io/docs.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"
#include "io/outfile.h"

static int pool_add(gj_docs *d, const char *s, size_t n) {
  if (d->n + n > d->cap) {
    /* tokenize holds the text, its ids and their copies (about 4 bytes a byte of text): a
     * compressed input that expands past what this rank may hold is refused, not OOM-killed */
    double share = gj_mem_share_bytes();
    if (share > 0 && 4.0 * (double)(d->n + n) > share)
      return GJ_FAIL("the inputs' text passes %.2f GB, more than tokenize can hold in the %.2f GB available per "
                     "rank: tokenize them in parts", (double)(d->n + n) / 1e9, share / 1e9);
    size_t nc = 2 * (d->n + n) + 4096;
    char *p = realloc(d->pool, nc);
    if (!p) return GJ_FAIL("out of memory reading documents");
    d->pool = p, d->cap = nc;
  }
  memcpy(d->pool + d->n, s, n);
  d->n += n;
  return 0;
}

static int doc_end(gj_docs *d) {
  if (d->ndocs + 2 > d->offcap) {
    size_t nc = 2 * d->offcap + 1024;
    uint64_t *p = realloc(d->off, nc * sizeof(uint64_t));
    if (!p) return GJ_FAIL("out of memory reading documents");
    d->off = p, d->offcap = nc;
    if (d->ndocs == 0) d->off[0] = 0;
  }
  d->off[++d->ndocs] = d->n;
  return 0;
}

static int read_all(const char *path, char **buf, size_t *len) {
  /* Every rank reads its inputs itself: under mpirun they must be regular files. One rank
   * also reads a FIFO, a device or stdin ("-"), as a stream. */
  GJ_TRY(gj_outfile_check_input(path, NULL, GJ_IN_STDIN));
  int in = !strcmp(path, "-") ? dup(0) : -1;
  if (!strcmp(path, "-") && in < 0) return GJ_FAIL("-: stdin: %s", strerror(errno));
  errno = 0;
  gzFile g = in >= 0 ? gzdopen(in, "rb") : gzopen(path, "rb"); /* reads plain files as they are */
  if (!g) {
    int e = errno ? errno : EIO;
    if (in >= 0) close(in);
    return GJ_FAIL("%s: %s", path, strerror(e));
  }
  gzbuffer(g, 1 << 17);
  size_t cap = 1 << 20, n = 0;
  char *b = malloc(cap);
  int k;
  while (b && (k = gzread(g, b + n, (unsigned)(cap - n))) > 0) {
    n += k;
    if (n == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  }
  int err = 0;
  const char *msg = b ? gzerror(g, &err) : "out of memory";
  if (!b || err < 0) {
    char m[256];
    snprintf(m, sizeof m, "%s", msg);
    gzclose(g);
    free(b);
    return GJ_FAIL("%s: read error: %s", path, m);
  }
  gzclose(g);
  *buf = b, *len = n;
  return 0;
}

static int is_jsonl(const char *path) {
  size_t n = strlen(path);
  if (n > 3 && !strcmp(path + n - 3, ".gz")) n -= 3;
  return (n > 6 && !strncmp(path + n - 6, ".jsonl", 6)) || (n > 5 && !strncmp(path + n - 5, ".json", 5));
}

static int blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
  return 1;
}

int gj_docs_read(gj_docs *d, const char *path) {
  char *buf = NULL;
  size_t len = 0;
  GJ_TRY(read_all(path, &buf, &len));
  int rc = 0, jsonl = is_jsonl(path), in_doc = 0;
  size_t lineno = 0;
  for (size_t pos = 0; pos < len && !rc;) {
    char *nl = memchr(buf + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - buf) : len;
    const char *line = buf + pos;
    size_t ll = end - pos;
    lineno++;
    if (jsonl) {
      if (!blank(line, ll)) {
        json_error_t err;
        json_t *o = json_loadb(line, ll, JSON_ALLOW_NUL, &err);
        json_t *t = o ? json_object_get(o, "text") : NULL;
        if (!o) rc = GJ_FAIL("%s:%zu: not valid JSON: %s", path, lineno, err.text);
        else if (!json_is_object(o)) rc = GJ_FAIL("%s:%zu: expected a JSON object", path, lineno);
        else if (!json_is_string(t)) rc = GJ_FAIL("%s:%zu: no \"text\" string field", path, lineno);
        else if (json_string_length(t) > 0) {
          rc = pool_add(d, json_string_value(t), json_string_length(t));
          if (!rc) rc = doc_end(d);
        }
        json_decref(o);
      }
    } else if (blank(line, ll)) {
      if (in_doc) rc = doc_end(d), in_doc = 0;
    } else {
      if (in_doc) rc = pool_add(d, "\n", 1);
      if (!rc) rc = pool_add(d, line, ll);
      in_doc = 1;
    }
    pos = end + 1;
  }
  if (!rc && in_doc) rc = doc_end(d);
  free(buf);
  return rc;
}

void gj_docs_free(gj_docs *d) {
  free(d->pool), free(d->off);
  memset(d, 0, sizeof *d);
}
