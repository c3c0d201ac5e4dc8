#include "io/megatron.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "io/outfile.h"

#define HEADER 34 /* magic 9 + version 8 + dtype 1 + S 8 + D 8 */

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a > b && !strcmp(s + a - b, suf);
}

int gj_megatron_is(const char *path, char *prefix, size_t n) {
  size_t len = strlen(path);
  if (len + 5 > n) return 0;
  if (ends_with(path, ".bin") || ends_with(path, ".idx")) {
    snprintf(prefix, n, "%.*s", (int)(len - 4), path);
    return 1;
  }
  char idx[GJ_PATH_BUF];
  snprintf(idx, sizeof idx, "%s.idx", path);
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) return 0; /* a file of that name: HDF5 */
  if (stat(idx, &sb) != 0) return 0;
  snprintf(prefix, n, "%s", path);
  return 1;
}

/* A .bin or .idx that exists must be a regular file: open() of a FIFO blocks until a writer
 * comes (a hang), and a directory's size is no token count. A missing one is left to open(),
 * whose message says what a Megatron dataset is. */
static int check_regular(const char *path) {
  struct stat sb;
  return stat(path, &sb) ? 0 : gj_outfile_check_input(path, NULL, GJ_IN_SEEK);
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Read exactly n bytes at off of fd. */
static int read_at(int fd, const char *path, uint64_t off, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return GJ_FAIL("%s: %s", path, strerror(errno));
    if (r == 0) return GJ_FAIL("%s: truncated (ends before byte %llu)", path, (unsigned long long)(off + n));
    got += (size_t)r;
  }
  return 0;
}

/* The index checked in slices (nothing of the size of the corpus is kept): lengths >= 0,
 * pointers[i] = the sum of the bytes of the sequences before i, the last sequence ending at
 * bin_size; docs non-decreasing from 0 to S. *n_tokens = the sum of the lengths. */
static int check_index(int fd, const char *idx, const char *bin, uint64_t S, uint64_t D, int w, uint64_t bin_size,
                       uint64_t *n_tokens) {
  enum { PIECE = 1 << 15 };
  unsigned char *buf = malloc((size_t)PIECE * 12);
  if (!buf) return GJ_FAIL("%s: out of memory reading the index", idx);
  int rc = 0;
  uint64_t at = 0; /* bytes of the sequences so far */
  const uint64_t len_off = HEADER, ptr_off = HEADER + 4 * S, doc_off = HEADER + 12 * S;
  for (uint64_t s0 = 0; s0 < S && !rc; s0 += PIECE) {
    size_t k = (size_t)GJ_MIN((uint64_t)PIECE, S - s0);
    rc = read_at(fd, idx, len_off + 4 * s0, buf, 4 * k);
    if (!rc) rc = read_at(fd, idx, ptr_off + 8 * s0, buf + 4 * (size_t)PIECE, 8 * k);
    for (size_t i = 0; i < k && !rc; i++) {
      const unsigned char *l = buf + 4 * i;
      int32_t len = (int32_t)((uint32_t)l[0] | (uint32_t)l[1] << 8 | (uint32_t)l[2] << 16 | (uint32_t)l[3] << 24);
      uint64_t ptr = le64(buf + 4 * (size_t)PIECE + 8 * i);
      if (len < 0)
        rc = GJ_FAIL("%s: sequence %llu has length %d", idx, (unsigned long long)(s0 + i), len);
      else if (ptr != at)
        rc = GJ_FAIL("%s: sequence %llu starts at byte %lld of %s, expected %llu (the index does not match the .bin)",
                     idx, (unsigned long long)(s0 + i), (long long)ptr, bin, (unsigned long long)at);
      else if ((uint64_t)len * (uint64_t)w > bin_size - at)
        rc = GJ_FAIL("%s: sequence %llu ends beyond the %llu bytes of %s (the index does not match the .bin)", idx,
                     (unsigned long long)(s0 + i), (unsigned long long)bin_size, bin);
      else
        at += (uint64_t)len * (uint64_t)w;
    }
  }
  if (!rc && at != bin_size)
    rc = GJ_FAIL("%s: its sequences hold %llu bytes, %s has %llu (the index does not match the .bin)", idx,
                 (unsigned long long)at, bin, (unsigned long long)bin_size);
  uint64_t prev = 0;
  for (uint64_t d0 = 0; d0 < D && !rc; d0 += PIECE) {
    size_t k = (size_t)GJ_MIN((uint64_t)PIECE, D - d0);
    rc = read_at(fd, idx, doc_off + 8 * d0, buf, 8 * k);
    for (size_t i = 0; i < k && !rc; i++) {
      uint64_t v = le64(buf + 8 * i), j = d0 + i;
      if (j == 0 && v != 0)
        rc = GJ_FAIL("%s: document index 0 is %lld, expected 0", idx, (long long)v);
      else if (v < prev || v > S)
        rc = GJ_FAIL("%s: document index %llu is %lld, not between %llu and the sequence count %llu", idx,
                     (unsigned long long)j, (long long)v, (unsigned long long)prev, (unsigned long long)S);
      prev = v;
    }
  }
  if (!rc && prev != S)
    rc = GJ_FAIL("%s: the document indices end at %llu, expected the sequence count %llu", idx,
                 (unsigned long long)prev, (unsigned long long)S);
  free(buf);
  *n_tokens = at / (uint64_t)w;
  return rc;
}

/* Size of the dtype's ids in bytes and whether they are signed; 0 if not readable. */
static int dtype_of(int code, int *is_signed, const char **name) {
  static const char *names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  *name = code >= 1 && code <= 8 ? names[code] : "unknown";
  *is_signed = code == 3 || code == 4 || code == 5;
  switch (code) {
  case 1: return 1;
  case 3: case 8: return 2;
  case 4: return 4;
  case 5: return 8;
  default: return 0;
  }
}

static int open_index(gj_dataset *d, const char *idx, const char *bin, uint64_t bin_size) {
  GJ_TRY(check_regular(idx));
  int fd = open(idx, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GJ_FAIL("%s: %s", idx, strerror(errno));
  struct stat sb;
  unsigned char h[HEADER];
  int rc = fstat(fd, &sb) < 0 ? GJ_FAIL("%s: %s", idx, strerror(errno)) : 0;
  uint64_t size = rc ? 0 : (uint64_t)sb.st_size;
  if (!rc && size < HEADER)
    rc = GJ_FAIL("%s: %llu bytes, shorter than the 34-byte MMIDIDX header (truncated?)", idx, (unsigned long long)size);
  if (!rc) rc = read_at(fd, idx, 0, h, HEADER);
  if (!rc && memcmp(h, "MMIDIDX\0\0", 9))
    rc = GJ_FAIL("%s: not a Megatron index (the magic is not MMIDIDX)", idx);
  uint64_t ver = le64(h + 9), S = le64(h + 18), D = le64(h + 26);
  const char *tn = "";
  int sgn = 0, w = rc ? 0 : dtype_of(h[17], &sgn, &tn);
  if (!rc && ver != 1)
    rc = GJ_FAIL("%s: MMIDIDX version %llu, only version 1 is read", idx, (unsigned long long)ver);
  if (!rc && !w)
    rc = GJ_FAIL("%s: dtype code %d (%s) cannot hold token ids (read: uint8, int16, uint16, int32, int64)", idx,
                 h[17], tn);
  /* the counts bounded by the file's size before any product is formed */
  if (!rc && (S > size / 12 || D > size / 8))
    rc = GJ_FAIL("%s: %llu bytes, too few for its %llu sequences and %llu document indices (truncated or corrupted)",
                 idx, (unsigned long long)size, (unsigned long long)S, (unsigned long long)D);
  else if (!rc && HEADER + 12 * S + 8 * D != size)
    rc = GJ_FAIL("%s: %llu bytes, but its %llu sequences and %llu document indices take %llu (truncated or corrupted)",
                 idx, (unsigned long long)size, (unsigned long long)S, (unsigned long long)D,
                 (unsigned long long)(HEADER + 12 * S + 8 * D));
  if (!rc && D == 0) rc = GJ_FAIL("%s: no document indices (at least the 0 that starts the first)", idx);
  if (!rc && bin_size % (uint64_t)w)
    rc = GJ_FAIL("%s: %llu bytes, not a whole number of %s ids (the index does not match the .bin)", bin,
                 (unsigned long long)bin_size, tn);
  uint64_t nt = 0;
  if (!rc) rc = check_index(fd, idx, bin, S, D, w, bin_size, &nt);
  close(fd);
  if (!rc) {
    d->n_tokens = nt, d->n_docs = D - 1, d->n_seqs = S, d->width = w, d->is_signed = sgn;
    snprintf(d->dtype, sizeof d->dtype, "%s", tn);
  }
  return rc;
}

int gj_megatron_open(gj_dataset *d, const char *prefix, int64_t max_vocab) {
  memset(d, 0, sizeof *d);
  d->file = d->tokens = -1;
  char idx[GJ_PATH_BUF];
  snprintf(idx, sizeof idx, "%s.idx", prefix);
  snprintf(d->path, sizeof d->path, "%s.bin", prefix);
  snprintf(d->format, sizeof d->format, "megatron-mmidx");
  GJ_TRY(check_regular(d->path));
  int fd = open(d->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GJ_FAIL("%s: %s (a Megatron dataset is PREFIX.bin and PREFIX.idx)", d->path, strerror(errno));
  struct stat sb;
  int rc = fstat(fd, &sb) < 0 ? GJ_FAIL("%s: %s", d->path, strerror(errno)) : 0;
  if (!rc) rc = open_index(d, idx, d->path, (uint64_t)sb.st_size);
  if (!rc) {
    d->max_id = max_vocab > 0 ? max_vocab : INT32_MAX; /* the files record no vocabulary */
    d->vocab_size = 0;
  }
  if (!rc && d->n_tokens > 0) {
    size_t len = (size_t)(d->n_tokens * (uint64_t)d->width);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      rc = GJ_FAIL("%s: cannot map %llu bytes: %s", d->path, (unsigned long long)len, strerror(errno));
    } else {
      d->map_base = m, d->map_len = len, d->map_off = 0, d->map = m;
      madvise(m, len, MADV_RANDOM); /* windows are read in a shuffled order */
    }
  }
  close(fd);
  if (rc) gj_dataset_free(d);
  return rc;
}
