/* libFuzzer harness: the streaming JSONL and plain-text document readers (io/docstream.c).
 * Every document has bytes; reading the file in two byte ranges split anywhere gives exactly
 * the documents of reading it whole, in order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/docstream.h"

typedef struct {
  char *buf;  /* the documents, each followed by a NUL */
  size_t n, cap;
} docs;

static int add(void *ctx, const char *text, size_t n) {
  docs *d = ctx;
  if (!text || n == 0) abort();
  if (d->n + n + 1 > d->cap) {
    d->cap = 2 * (d->n + n + 1);
    d->buf = realloc(d->buf, d->cap);
    if (!d->buf) abort();
  }
  memcpy(d->buf + d->n, text, n);
  d->buf[d->n + n] = 0;
  d->n += n + 1;
  return 0;
}

static void check(const char *path, uint64_t size, uint64_t cut) {
  gj_docstream_opts o = {"text", 1 << 20};
  docs whole = {0}, parts = {0};
  int rw = gj_docstream_read(path, 0, UINT64_MAX, &o, add, &whole, NULL);
  int r1 = gj_docstream_read(path, 0, cut, &o, add, &parts, NULL);
  int r2 = r1 ? r1 : gj_docstream_read(path, cut, size, &o, add, &parts, NULL);
  /* a file read whole without error reads in parts without error, to the same documents */
  if (!rw && (r2 || parts.n != whole.n || (whole.n && memcmp(parts.buf, whole.buf, whole.n)))) abort();
  free(whole.buf), free(parts.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *ext[2] = {".jsonl", ".txt"};
  for (int k = 0; k < 2; k++) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/gj-fuzz-docs-XXXXXX%s", ext[k]);
    int fd = mkstemps(path, (int)strlen(ext[k]));
    if (fd < 0) return 0;
    int ok = write(fd, data, size) == (ssize_t)size;
    close(fd);
    if (ok) check(path, size, size ? data[0] * (uint64_t)size / 256 : 0);
    unlink(path);
  }
  return 0;
}
