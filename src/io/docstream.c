#include "io/docstream.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "common.h"
#include "io/jsonscan.h"

#define IN_BYTES ((size_t)1 << 20)   /* compressed input read at a time */
#define LINE_BYTES ((size_t)4 << 20) /* the line buffer's first size */

enum { PLAIN = 0, GZIP = 1, ZSTD = 2 };

static int ends_with(const char *s, size_t n, const char *suf) {
  size_t k = strlen(suf);
  return n >= k && !strncmp(s + n - k, suf, k);
}

int gj_docstream_is_jsonl(const char *path) {
  size_t n = strlen(path);
  if (ends_with(path, n, ".gz")) n -= 3;
  else if (ends_with(path, n, ".zst")) n -= 4;
  return (n > 6 && ends_with(path, n, ".jsonl")) || (n > 5 && ends_with(path, n, ".json"));
}

static int kind_of(const char *path, const unsigned char *m, size_t n, int *kind) {
  size_t l = strlen(path);
  int gz = n >= 2 && m[0] == 0x1f && m[1] == 0x8b;
  /* a zstd frame, or a skippable frame (magic 0x184D2A50-5F, little-endian), as pzstd's output
   * starts with */
  int zs = n >= 4 && ((m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) ||
                      ((m[0] & 0xf0) == 0x50 && m[1] == 0x2a && m[2] == 0x4d && m[3] == 0x18));
  if (ends_with(path, l, ".gz") && !gz) return GJ_FAIL("%s: not gzip data (corrupt .gz file)", path);
  if (ends_with(path, l, ".zst") && !zs) return GJ_FAIL("%s: not zstd data (corrupt .zst file)", path);
  *kind = gz ? GZIP : zs ? ZSTD : PLAIN;
  return 0;
}

int gj_docstream_kind(const char *path, int *kind) {
  *kind = PLAIN;
  struct stat st;
  /* stdin, a FIFO, a device: read once, as a stream; the reader looks at the magic then */
  if (!strcmp(path, "-") || (!stat(path, &st) && !S_ISREG(st.st_mode))) return 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return GJ_FAIL("%s: %s", path, strerror(errno));
  unsigned char m[4];
  ssize_t k = pread(fd, m, 4, 0);
  int e = errno;
  close(fd);
  if (k < 0) return GJ_FAIL("%s: read error: %s", path, strerror(e));
  return kind_of(path, m, (size_t)k, kind);
}

/* The decompressed byte stream of a file. */
typedef struct {
  const char *path;
  int fd, kind, eof, z_on, member_done, zero_pad;
  unsigned char *in;
  size_t in_n, in_pos;
  z_stream z;
  ZSTD_DStream *zs;
  size_t zret; /* zstd: 0 when the last frame is complete */
  volatile uint64_t *raw;
} src;

static int fill(src *s) {
  if (s->in_pos < s->in_n || s->eof) return 0;
  ssize_t k;
  do k = read(s->fd, s->in, IN_BYTES);
  while (k < 0 && errno == EINTR);
  if (k < 0) return GJ_FAIL("%s: read error: %s", s->path, strerror(errno));
  s->in_n = (size_t)k, s->in_pos = 0, s->eof = k == 0;
  if (s->raw) *s->raw += (uint64_t)k;
  return 0;
}

/* Up to cap decompressed bytes into out; *got = 0 at the end. */
static int src_read(src *s, char *out, size_t cap, size_t *got) {
  *got = 0;
  for (;;) {
    GJ_TRY(fill(s));
    if (s->kind == PLAIN) {
      size_t k = GJ_MIN(cap, s->in_n - s->in_pos);
      memcpy(out, s->in + s->in_pos, k);
      s->in_pos += k, *got = k;
      return 0;
    }
    if (s->in_pos == s->in_n) { /* the end of the file */
      if (s->kind == GZIP && !s->member_done) return GJ_FAIL("%s: truncated gzip data (corrupt .gz file)", s->path);
      if (s->kind == ZSTD && s->zret != 0) return GJ_FAIL("%s: truncated zstd data (corrupt .zst file)", s->path);
      return 0;
    }
    if (s->kind == GZIP && s->member_done && (s->zero_pad || s->in[s->in_pos] == 0)) {
      /* zeros after the last member (a block device's or tape's padding): gzip ignores them */
      while (s->in_pos < s->in_n && s->in[s->in_pos] == 0) s->in_pos++;
      if (s->in_pos < s->in_n)
        return GJ_FAIL("%s: corrupt gzip data: data after the zero padding that follows it", s->path);
      s->zero_pad = 1;
      continue;
    }
    if (s->kind == GZIP) {
      s->z.next_in = s->in + s->in_pos, s->z.avail_in = (uInt)(s->in_n - s->in_pos);
      s->z.next_out = (Bytef *)out, s->z.avail_out = (uInt)GJ_MIN(cap, (size_t)1 << 30);
      if (s->member_done) { /* another gzip member follows (as gzip -c a b > c makes) */
        if (inflateReset(&s->z) != Z_OK) return GJ_FAIL("%s: zlib: cannot reset", s->path);
        s->member_done = 0;
      }
      int r = inflate(&s->z, Z_NO_FLUSH);
      s->in_pos = s->in_n - s->z.avail_in;
      *got = (size_t)((char *)s->z.next_out - out);
      if (r == Z_STREAM_END) s->member_done = 1;
      else if (r != Z_OK && r != Z_BUF_ERROR)
        return GJ_FAIL("%s: corrupt gzip data: %s", s->path, s->z.msg ? s->z.msg : zError(r));
    } else {
      ZSTD_inBuffer ib = {s->in, s->in_n, s->in_pos};
      ZSTD_outBuffer ob = {out, cap, 0};
      size_t r = ZSTD_decompressStream(s->zs, &ob, &ib);
      if (ZSTD_isError(r)) return GJ_FAIL("%s: corrupt zstd data: %s", s->path, ZSTD_getErrorName(r));
      s->in_pos = ib.pos, s->zret = r, *got = ob.pos;
    }
    if (*got) return 0;
  }
}

/* Lines of the stream, each with the offset of its first byte. */
typedef struct {
  src s;
  char *buf;
  size_t cap, max_cap, p, n;
  uint64_t base; /* stream offset of buf[0] */
  int eof;
  uint64_t lineno, line0; /* lines returned; line number of the first one - 1 (0: unknown yet) */
  uint64_t start0;        /* where the reading started */
} lines;

static uint64_t line_number(lines *l);

static int next_line(lines *l, const char **line, size_t *len, uint64_t *start, int *got) {
  for (;;) {
    char *nl = l->p < l->n ? memchr(l->buf + l->p, '\n', l->n - l->p) : NULL;
    if (nl || (l->eof && l->p < l->n)) {
      size_t e = nl ? (size_t)(nl - l->buf) : l->n;
      *line = l->buf + l->p, *len = e - l->p, *start = l->base + l->p;
      l->p = nl ? e + 1 : e;
      l->lineno++;
      *got = 1;
      return 0;
    }
    if (l->eof) return *got = 0, 0;
    if (l->p > 0) {
      memmove(l->buf, l->buf + l->p, l->n - l->p);
      l->base += l->p, l->n -= l->p, l->p = 0;
    }
    if (l->n == l->cap) {
      if (l->cap >= l->max_cap)
        return GJ_FAIL("%s:%llu: a line longer than %zu MB (raise --max-doc-mb)", l->s.path,
                       (unsigned long long)line_number(l) + 1, l->max_cap >> 20);
      size_t nc = GJ_MIN(2 * l->cap, l->max_cap);
      char *b = realloc(l->buf, nc);
      if (!b) return GJ_FAIL("%s: out of memory for a line of %zu MB", l->s.path, nc >> 20);
      l->buf = b, l->cap = nc;
    }
    size_t k;
    GJ_TRY(src_read(&l->s, l->buf + l->n, l->cap - l->n, &k));
    if (k == 0) l->eof = 1;
    l->n += k;
  }
}

/* The line number of the last line returned: counts the newlines before the start of the
 * reading when it began inside the file (error messages only). */
static uint64_t line_number(lines *l) {
  if (l->start0 == 0) return l->lineno;
  int fd = open(l->s.path, O_RDONLY);
  uint64_t nl = 0, off = 0;
  char b[1 << 16];
  while (fd >= 0 && off < l->start0) {
    ssize_t k = pread(fd, b, (size_t)GJ_MIN((uint64_t)sizeof b, l->start0 - off), (off_t)off);
    if (k <= 0) break;
    for (ssize_t i = 0; i < k; i++) nl += b[i] == '\n';
    off += (uint64_t)k;
  }
  if (fd >= 0) close(fd);
  /* the reading began at start0 = lo - 1, inside a line whose rest it skipped (not counted) */
  return nl + 1 + l->lineno;
}

static int blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
  return 1;
}

static int too_long(lines *l, size_t max_doc) {
  return GJ_FAIL("%s:%llu: a document longer than %zu MB (raise --max-doc-mb)", l->s.path,
                 (unsigned long long)line_number(l), max_doc >> 20);
}

static int jsonl_doc(lines *l, const char *line, size_t len, const gj_docstream_opts *o, gj_doc_fn fn, void *ctx) {
  /* the one-pass scan answers for the usual line, decoding its text in place (the line is in
   * l->buf, read no further); jansson parses the others, and names the errors */
  const char *text;
  size_t tn;
  if (gj_jsonscan_text(line, len, o->text_key, l->buf + (line - l->buf), &text, &tn) == 1) {
    if (tn > o->max_doc) return too_long(l, o->max_doc);
    return tn > 0 ? fn(ctx, text, tn) : 0;
  }
  json_error_t err;
  json_t *obj = json_loadb(line, len, JSON_ALLOW_NUL, &err);
  json_t *t = obj ? json_object_get(obj, o->text_key) : NULL;
  int rc = 0;
  if (!obj) rc = GJ_FAIL("%s:%llu: not valid JSON: %s", l->s.path, (unsigned long long)line_number(l), err.text);
  else if (!json_is_object(obj)) rc = GJ_FAIL("%s:%llu: expected a JSON object", l->s.path, (unsigned long long)line_number(l));
  else if (!json_is_string(t))
    rc = GJ_FAIL("%s:%llu: no \"%s\" string field", l->s.path, (unsigned long long)line_number(l), o->text_key);
  else if (json_string_length(t) > o->max_doc) rc = too_long(l, o->max_doc);
  else if (json_string_length(t) > 0)
    rc = fn(ctx, json_string_value(t), json_string_length(t));
  json_decref(obj);
  return rc;
}

static int doc_add(lines *l, char **doc, size_t *n, size_t *cap, const char *s, size_t k, size_t max_doc) {
  if (*n + k > max_doc) return too_long(l, max_doc);
  if (*n + k > *cap) {
    size_t nc = GJ_MIN(GJ_MAX(2 * *cap, *n + k + 4096), max_doc);
    char *d = realloc(*doc, nc);
    if (!d) return GJ_FAIL("%s: out of memory for a document of %zu MB", l->s.path, nc >> 20);
    *doc = d, *cap = nc;
  }
  memcpy(*doc + *n, s, k);
  *n += k;
  return 0;
}

static int read_lines(lines *l, uint64_t lo, uint64_t hi, int jsonl, const gj_docstream_opts *o, gj_doc_fn fn, void *ctx) {
  const char *line;
  size_t len, dn = 0, dcap = 0;
  uint64_t start;
  int got = 1, rc = 0, in_doc = 0;
  char *doc = NULL;
  if (lo > 0) { /* the rest of the line that holds byte lo - 1 belongs to the part before */
    GJ_TRY(next_line(l, &line, &len, &start, &got));
    l->lineno = 0;
    /* text: so do the lines up to the next blank one (the previous part reads on to it) */
    while (!jsonl && got) {
      GJ_TRY(next_line(l, &line, &len, &start, &got));
      if (got && blank(line, len)) break;
    }
    /* a cut at or past hi: the part before reads on to it, this part is empty */
    if (!jsonl && got && start >= hi) return 0;
  }
  while (got && !rc) {
    if ((rc = next_line(l, &line, &len, &start, &got)) || !got) break;
    if (jsonl) {
      if (start >= hi) break;
      if (!blank(line, len)) rc = jsonl_doc(l, line, len, o, fn, ctx);
    } else if (blank(line, len)) {
      if (start >= hi) break;
      if (in_doc) rc = fn(ctx, doc, dn), in_doc = 0, dn = 0;
    } else {
      if (line[len - 1] == '\r') len--; /* CRLF text: its lines are joined with \n alone */
      if (in_doc) rc = doc_add(l, &doc, &dn, &dcap, "\n", 1, o->max_doc);
      if (!rc) rc = doc_add(l, &doc, &dn, &dcap, line, len, o->max_doc);
      in_doc = 1;
    }
  }
  if (!rc && in_doc) rc = fn(ctx, doc, dn);
  free(doc);
  return rc;
}

int gj_docstream_read(const char *path, uint64_t lo, uint64_t hi, const gj_docstream_opts *o,
                      gj_doc_fn fn, void *ctx, volatile uint64_t *raw) {
  /* an empty range holds no document (a cut at 0 is the file's start, not moved forward) */
  if (hi <= lo) return 0;
  lines l;
  memset(&l, 0, sizeof l);
  src *s = &l.s;
  s->path = path, s->raw = raw;
  int stdin_ = !strcmp(path, "-");
  s->fd = stdin_ ? dup(0) : open(path, O_RDONLY);
  if (s->fd < 0) return GJ_FAIL("%s: %s", path, strerror(errno));
  posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  int rc = 0;
  s->in = malloc(IN_BYTES);
  l.cap = LINE_BYTES;
  l.max_cap = gj_docstream_is_jsonl(path) ? 4 * o->max_doc + (64 << 10) : o->max_doc + 1;
  l.cap = GJ_MIN(l.cap, l.max_cap);
  l.buf = malloc(l.cap);
  if (!s->in || !l.buf) rc = GJ_FAIL("%s: out of memory for the read buffers", path);
  if (!rc && lo > 0) {
    l.base = l.start0 = lo - 1;
    if (lseek(s->fd, (off_t)(lo - 1), SEEK_SET) < 0) rc = GJ_FAIL("%s: cannot seek: %s", path, strerror(errno));
  } else if (!rc) { /* the compression, from the first bytes */
    rc = fill(s);
    if (!rc) rc = kind_of(path, s->in, s->in_n, &s->kind);
  }
  if (!rc && s->kind == GZIP) {
    if (inflateInit2(&s->z, 15 + 16) != Z_OK) rc = GJ_FAIL("%s: zlib: cannot start", path);
    else s->z_on = 1;
  }
  if (!rc && s->kind == ZSTD) {
    s->zs = ZSTD_createDStream();
    if (!s->zs || ZSTD_isError(ZSTD_initDStream(s->zs))) rc = GJ_FAIL("%s: zstd: cannot start", path);
  }
  if (!rc) rc = read_lines(&l, lo, hi, gj_docstream_is_jsonl(path), o, fn, ctx);
  if (s->z_on) inflateEnd(&s->z);
  if (s->zs) ZSTD_freeDStream(s->zs);
  free(s->in), free(l.buf);
  close(s->fd);
  return rc;
}
