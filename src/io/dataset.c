#include "io/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "io/h5util.h"
#include "io/megatron.h"
#include "io/outfile.h"
#include "io/tokenizer.h"

#define TOKENS_CHUNK ((hsize_t)1 << 20)
#define GJ_IDS ((size_t)-1) /* open_ids: uint16 or uint32 */

int gj_dataset_write(const char *path, const uint16_t *tokens, uint64_t n_tokens,
                     const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                     const char *source) {
  gj_outfile o;
  GJ_TRY(gj_outfile_begin(&o, path));
  int rc = gj_dataset_write_tmp(&o, tokens, n_tokens, doc_offsets, n_docs, n_bytes, source);
  if (rc) gj_outfile_abort(&o);
  else rc = gj_outfile_commit(&o);
  return rc;
}

int gj_dataset_write_attrs(int64_t file, const char *path, uint64_t n_docs, uint64_t n_tokens,
                           uint64_t n_bytes, const char *source, int64_t vocab_size) {
  hid_t f = (hid_t)file;
  int rc = 0;
  rc |= gj_h5_write_attr_str(f, "format", "gptj-mpi-tokens");
  rc |= gj_h5_write_attr_i64(f, "format_version", 1);
  rc |= gj_h5_write_attr_str(f, "tokenizer", "gpt2");
  rc |= gj_h5_write_attr_i64(f, "vocab_size", vocab_size);
  rc |= gj_h5_write_attr_i64(f, "eot_id", GJ_EOT_ID);
  rc |= gj_h5_write_attr_str(f, "source", source);
  rc |= gj_h5_write_attr_i64(f, "n_docs", (int64_t)n_docs);
  rc |= gj_h5_write_attr_i64(f, "n_tokens", (int64_t)n_tokens);
  rc |= gj_h5_write_attr_i64(f, "n_bytes", (int64_t)n_bytes);
  return rc ? GJ_H5_FAIL("%s: cannot write attributes", path) : 0;
}

int gj_dataset_write_tmp(gj_outfile *o, const uint16_t *tokens, uint64_t n_tokens,
                         const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                         const char *source) {
  const char *tmp = o->tmp;
  gj_h5_quiet();
  /* No timestamps in object headers: the same input gives the same bytes. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  H5Pset_obj_track_times(fcpl, 0);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl);
  H5Pclose(fcpl), H5Pclose(fapl);
  if (f < 0) return GJ_H5_FAIL("%s: cannot create (directory missing or not writable?)", tmp);
  int rc = 0;
  hsize_t n = n_tokens, chunk = n < TOKENS_CHUNK ? (n ? n : 1) : TOKENS_CHUNK;
  hid_t sp = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  H5Pset_deflate(dcpl, 4);
  H5Pset_obj_track_times(dcpl, 0);
  hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0)
    rc = GJ_H5_FAIL("%s: cannot write /tokens (disk full?)", tmp);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  hsize_t no = n_docs + 1;
  sp = H5Screate_simple(1, &no, NULL);
  hid_t dcpl2 = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl2, 0);
  d = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, sp, H5P_DEFAULT, dcpl2, H5P_DEFAULT);
  if (!rc && (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_offsets) < 0))
    rc = GJ_H5_FAIL("%s: cannot write /doc_offsets", tmp);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp), H5Pclose(dcpl), H5Pclose(dcpl2);
  if (!rc) rc = gj_dataset_write_attrs(f, tmp, n_docs, n_tokens, n_bytes, source, GJ_EOT_ID + 1);
  if (H5Fclose(f) < 0 && !rc) rc = GJ_H5_FAIL("%s: cannot close (disk full?)", tmp);
  return rc;
}

/* Whether every element of 1-D dataset d (n > 0 elements) has storage in the file: all its
 * chunks (a compressed dataset's storage is smaller than its data, so H5Dget_space_status
 * cannot tell), or its whole contiguous block. */
static int fully_stored(hid_t d, int64_t n) {
  hid_t dcpl = H5Dget_create_plist(d), t = H5Dget_type(d);
  H5D_layout_t lay = dcpl < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(dcpl);
  size_t esz = t < 0 ? 0 : H5Tget_size(t);
  int ok = 0;
  if (lay == H5D_COMPACT) {
    ok = 1;
  } else if (lay == H5D_CONTIGUOUS) {
    ok = esz > 0 && H5Dget_storage_size(d) >= (hsize_t)n * esz;
  } else if (lay == H5D_CHUNKED) {
    hsize_t ch = 0, nc = 0;
    hid_t sp = H5Dget_space(d);
    ok = H5Pget_chunk(dcpl, 1, &ch) == 1 && ch > 0 && sp >= 0 &&
         H5Dget_num_chunks(d, sp, &nc) >= 0 && nc == ((hsize_t)n + ch - 1) / ch;
    if (sp >= 0) H5Sclose(sp);
  }
  if (t >= 0) H5Tclose(t);
  if (dcpl >= 0) H5Pclose(dcpl);
  return ok;
}

/* Open 1-D dataset `name` of n elements whose type is an unsigned integer of `bytes` bytes
 * (0: of at most 8; GJ_IDS: of 2 or 4), fully written (a file that only declares a huge dataset is refused
 * before anything is allocated for it). */
static int open_ids(hid_t f, const char *path, const char *name, int64_t n, size_t bytes,
                    const char *want, const char *count, hid_t *ds) {
  int nd;
  int64_t dims[4];
  GJ_TRY(gj_h5_shape(f, path, name, &nd, dims));
  if (nd != 1 || dims[0] != n) return GJ_FAIL("%s: %s does not hold %s = %lld entries", path, name, count, (long long)n);
  *ds = H5Dopen2(f, name, H5P_DEFAULT);
  if (*ds < 0) return GJ_H5_FAIL("%s: cannot open %s", path, name);
  hid_t t = H5Dget_type(*ds);
  char tn[64] = "unreadable";
  if (t >= 0) gj_h5_type_name(t, tn, sizeof tn);
  int ok = t >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE &&
           (bytes == GJ_IDS ? H5Tget_size(t) == 2 || H5Tget_size(t) == 4
            : bytes ? H5Tget_size(t) == bytes : H5Tget_size(t) <= 8);
  if (t >= 0) H5Tclose(t);
  int rc = 0;
  if (!ok) rc = GJ_FAIL("%s: %s is %s, expected %s", path, name, tn, want);
  else if (n > 0 && !fully_stored(*ds, n))
    rc = GJ_FAIL("%s: %s is not fully written (truncated or corrupted)", path, name);
  if (rc) H5Dclose(*ds), *ds = -1;
  return rc;
}

/* /doc_offsets checked in slices of 64 Ki entries (nothing of the size of the corpus is kept):
 * 0 = o[0] <= o[1] <= ... <= o[n_docs] = n_tokens. */
static int check_offsets(hid_t of, const char *path, uint64_t nd, uint64_t nt) {
  enum { PIECE = 1 << 16 };
  uint64_t *buf = malloc(PIECE * sizeof(uint64_t)), prev = 0;
  hid_t fs = H5Dget_space(of);
  int rc = !buf ? GJ_FAIL("%s: out of memory reading /doc_offsets", path)
           : fs < 0 ? GJ_H5_FAIL("%s: cannot read /doc_offsets (truncated or corrupted)", path) : 0;
  for (uint64_t off = 0; off <= nd && !rc; off += PIECE) {
    hsize_t start = off, count = GJ_MIN((uint64_t)PIECE, nd + 1 - off);
    hid_t ms = H5Screate_simple(1, &count, NULL);
    if (ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
        H5Dread(of, H5T_NATIVE_UINT64, ms, fs, H5P_DEFAULT, buf) < 0)
      rc = GJ_H5_FAIL("%s: cannot read /doc_offsets (truncated or corrupted)", path);
    if (ms >= 0) H5Sclose(ms);
    if (!rc && off == 0 && buf[0] != 0)
      rc = GJ_FAIL("%s: /doc_offsets[0] = %llu, expected 0", path, (unsigned long long)buf[0]);
    for (uint64_t k = 0; !rc && k < count; k++) {
      uint64_t i = off + k;
      if (i > 0 && buf[k] < prev)
        rc = GJ_FAIL("%s: /doc_offsets decreases at entry %llu (%llu after %llu)", path, (unsigned long long)i,
                     (unsigned long long)buf[k], (unsigned long long)prev);
      prev = buf[k];
    }
  }
  if (!rc && prev != nt)
    rc = GJ_FAIL("%s: /doc_offsets ends at %llu, expected n_tokens = %llu", path, (unsigned long long)prev,
                 (unsigned long long)nt);
  if (fs >= 0) H5Sclose(fs);
  free(buf);
  return rc;
}

/* Map /tokens if it is one contiguous little-endian block inside the file (0 and d->map NULL
 * if it is not: then it is read by hyperslab). */
static int map_tokens(gj_dataset *d, hid_t tk) {
  hid_t dcpl = H5Dget_create_plist(tk), t = H5Dget_type(tk);
  int contiguous = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_external_count(dcpl) == 0;
  int le = t >= 0 && H5Tget_order(t) == H5T_ORDER_LE;
  if (t >= 0) H5Tclose(t);
  if (dcpl >= 0) H5Pclose(dcpl);
  const uint16_t probe = 1;
  if (!contiguous || !le || *(const unsigned char *)&probe != 1 || d->n_tokens == 0) return 0;
  haddr_t at = H5Dget_offset(tk);
  if (at == HADDR_UNDEF) return 0;
  uint64_t bytes = d->n_tokens * (uint64_t)d->width;
  int fd = open(d->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return GJ_FAIL("%s: %s", d->path, strerror(errno));
  struct stat sb;
  int rc = 0;
  if (fstat(fd, &sb) < 0) rc = GJ_FAIL("%s: %s", d->path, strerror(errno));
  else if ((uint64_t)sb.st_size < at || (uint64_t)sb.st_size - at < bytes)
    rc = GJ_FAIL("%s: /tokens is not fully written (truncated: the file has %llu bytes, its ids end at %llu)",
                 d->path, (unsigned long long)sb.st_size, (unsigned long long)(at + bytes));
  if (!rc) {
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), base = at / page * page;
    size_t len = (size_t)(at - base + bytes);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)base);
    if (m == MAP_FAILED) {
      rc = GJ_FAIL("%s: cannot map /tokens (%llu bytes): %s", d->path, (unsigned long long)bytes, strerror(errno));
    } else {
      d->map_base = m, d->map_len = len, d->map_off = base;
      d->map = (const unsigned char *)m + (at - base);
      madvise(m, len, MADV_RANDOM); /* windows are read in a shuffled order */
    }
  }
  close(fd);
  return rc;
}

int gj_dataset_open(gj_dataset *d, const char *path, int64_t max_vocab) {
  char prefix[GJ_PATH_BUF];
  if (gj_megatron_is(path, prefix, sizeof prefix)) return gj_megatron_open(d, prefix, max_vocab);
  memset(d, 0, sizeof *d);
  d->file = d->tokens = -1;
  snprintf(d->path, sizeof d->path, "%s", path);
  snprintf(d->format, sizeof d->format, "gptj-mpi-tokens");
  hid_t f;
  GJ_TRY(gj_h5_open_read(path, &f));
  /* every count read from the file is bounded (2^62) before it sizes anything */
  const int64_t big = (int64_t)1 << 62;
  int64_t nt, nd, nb, vs;
  /* the format first, where recorded (files made by other tools may lack it): a checkpoint
   * given as data is named as such, not as a dataset without n_tokens */
  char fmt[64] = "";
  int64_t ver = 1, eot = 0;
  int rc = H5Aexists(f, "format") > 0 ? gj_h5_attr_str(f, path, "format", fmt, sizeof fmt) : 0;
  if (!rc && *fmt && strcmp(fmt, "gptj-mpi-tokens"))
    rc = GJ_FAIL("%s: attribute 'format' is '%s', not a gptj token dataset (gptj-mpi-tokens)", path, fmt);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "n_tokens", 0, big, &nt);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "n_docs", 0, big, &nd);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "n_bytes", 0, big, &nb);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "vocab_size", 1, (int64_t)1 << 32, &vs);
  if (!rc && H5Aexists(f, "format_version") > 0) rc = gj_h5_attr_i64_in(f, path, "format_version", 1, 1, &ver);
  if (!rc && H5Aexists(f, "eot_id") > 0) rc = gj_h5_attr_i64_in(f, path, "eot_id", 0, INT32_MAX, &eot);
  /* every document has text before its EOT: tokens beyond the EOTs came from bytes */
  if (!rc && nt > nd && nb == 0)
    rc = GJ_FAIL("%s: attribute 'n_bytes' = 0 for %lld tokens of %lld documents", path, (long long)nt, (long long)nd);
  hid_t tk = -1, of = -1;
  if (!rc) rc = open_ids(f, path, "/tokens", nt, GJ_IDS, "uint16 token ids (or uint32)", "n_tokens", &tk);
  if (!rc) rc = open_ids(f, path, "/doc_offsets", nd + 1, 0, "unsigned integer (uint64) offsets", "n_docs + 1", &of);
  if (!rc) {
    hid_t t = H5Dget_type(tk);
    d->width = t < 0 ? 0 : (int)H5Tget_size(t);
    if (t >= 0) H5Tclose(t);
    if (d->width == 2 && vs > 65536)
      rc = GJ_FAIL("%s: attribute 'vocab_size' = %lld does not fit uint16 /tokens (at most 65536)", path, (long long)vs);
  }
  if (!rc) {
    d->n_tokens = nt, d->n_docs = nd, d->n_bytes = nb, d->vocab_size = vs;
    d->max_id = max_vocab > 0 ? max_vocab : vs;
    rc = check_offsets(of, path, (uint64_t)nd, (uint64_t)nt);
  }
  if (of >= 0) H5Dclose(of);
  if (!rc) rc = map_tokens(d, tk);
  if (tk >= 0) H5Dclose(tk), tk = -1;
  if (!rc && !d->map && nt > 0) { /* hyperslab reads: keep the file open, with a chunk cache */
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    /* w0 0.75 (HDF5's default), not 1: with 1, HDF5 1.10.8 holds every chunk a partial read
     * touched until the dataset is closed (measured: 1.5 MB more per window read) */
    H5Pset_chunk_cache(dapl, 521, GJ_DATASET_CHUNK_CACHE, 0.75);
    tk = H5Dopen2(f, "/tokens", dapl);
    H5Pclose(dapl);
    if (tk < 0) rc = GJ_H5_FAIL("%s: cannot open /tokens", path);
    else d->file = f, d->tokens = tk;
  }
  if (d->file < 0) H5Fclose(f);
  if (rc) gj_dataset_free(d);
  return rc;
}

void gj_dataset_wrap(gj_dataset *d, const uint16_t *tokens, uint64_t n, int64_t max_id, const char *name) {
  memset(d, 0, sizeof *d);
  d->file = d->tokens = -1;
  d->n_tokens = n, d->n_docs = 1, d->vocab_size = d->max_id = max_id, d->width = 2;
  snprintf(d->format, sizeof d->format, "gptj-mpi-tokens");
  d->map = (const unsigned char *)tokens;
  snprintf(d->path, sizeof d->path, "%s", name);
}

/* Drop this process's mapping of the pages around [p, p + len) of the map: the kernel maps a
 * whole page-cache folio (up to 2 MiB, aligned in the file) on a fault, which would otherwise
 * stay counted in the resident set. The pages stay in the page cache. */
static void unmap_span(const gj_dataset *d, const unsigned char *p, size_t len) {
  const uint64_t F = (uint64_t)2 << 20;
  const unsigned char *base = d->map_base;
  uint64_t o0 = d->map_off + (uint64_t)(p - base), o1 = o0 + len;
  uint64_t a = GJ_MAX(o0 / F * F, d->map_off), e = GJ_MIN((o1 + F - 1) / F * F, d->map_off + d->map_len);
  if (e > a) madvise((void *)(base + (a - d->map_off)), e - a, MADV_DONTNEED);
}

/* The Megatron dtypes other than uint16/uint32 (mapped, little-endian): each id read as an
 * int64, checked against [0, max_id), stored as int32. */
static int get_any(const gj_dataset *d, uint64_t start, uint64_t n, int32_t *out) {
  const int w = d->width;
  const unsigned char *p = d->map + start * (uint64_t)w;
  const int64_t lim = GJ_MIN(d->max_id, (int64_t)INT32_MAX);
  int rc = 0;
  for (uint64_t i = 0; i < n && !rc; i++, p += w) {
    uint64_t u = 0;
    for (int b = w - 1; b >= 0; b--) u = u << 8 | p[b];
    int64_t v = (int64_t)u;
    if (d->is_signed && w < 8 && (u >> (8 * w - 1)) & 1) v = (int64_t)(u | ~(uint64_t)0 << (8 * w));
    if (v < 0 || v >= lim)
      rc = v < 0 ? GJ_FAIL("%s: token %llu has the negative id %lld", d->path, (unsigned long long)(start + i),
                           (long long)v)
                 : GJ_FAIL("%s: token %llu has id %lld, not below the vocabulary size %lld", d->path,
                           (unsigned long long)(start + i), (long long)v, (long long)d->max_id);
    else
      out[i] = (int32_t)v;
  }
  unmap_span(d, d->map + start * (uint64_t)w, (size_t)(n * (uint64_t)w));
  return rc;
}

int gj_dataset_get(const gj_dataset *d, uint64_t start, uint64_t n, int32_t *out) {
  if (start > d->n_tokens || n > d->n_tokens - start)
    return GJ_FAIL("%s: tokens [%llu, %llu) are beyond its %llu tokens", d->path, (unsigned long long)start,
                   (unsigned long long)(start + n), (unsigned long long)d->n_tokens);
  if (n == 0) return 0;
  /* a Megatron .bin is little-endian whatever the host (HDF5 maps only on little-endian hosts) */
  const uint16_t probe = 1;
  int le_host = *(const unsigned char *)&probe == 1;
  if (d->is_signed || d->width == 1 || d->width == 8 || (!le_host && !strcmp(d->format, "megatron-mmidx")))
    return get_any(d, start, n, out);
  uint32_t *u = (uint32_t *)out; /* ids are read as uint32, then checked, then stored as int32 */
  if (d->map && d->width == 2) {
    const unsigned char *p = d->map + start * 2; /* HDF5 does not promise an aligned offset */
    for (uint64_t i = 0; i < n; i++) {
      uint16_t v;
      memcpy(&v, p + 2 * i, 2);
      u[i] = v;
    }
  } else if (d->map) {
    memcpy(u, d->map + start * 4, n * 4);
  }
  if (d->map_base) {
    unmap_span(d, d->map + start * d->width, n * d->width);
  } else if (!d->map) {
    hid_t fs = H5Dget_space((hid_t)d->tokens);
    hsize_t s0 = start, cnt = n;
    hid_t ms = H5Screate_simple(1, &cnt, NULL);
    int bad = fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &s0, NULL, &cnt, NULL) < 0 ||
              H5Dread((hid_t)d->tokens, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, u) < 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (bad)
      return GJ_H5_FAIL("%s: cannot read /tokens [%llu, %llu) (truncated or corrupted)", d->path,
                        (unsigned long long)start, (unsigned long long)(start + n));
  }
  const uint32_t lim = (uint32_t)GJ_MIN(d->max_id, (int64_t)INT32_MAX);
  for (uint64_t i = 0; i < n; i++) {
    if (u[i] >= lim)
      return GJ_FAIL("%s: token %llu has id %u, not below the vocabulary size %lld", d->path,
                     (unsigned long long)(start + i), u[i], (long long)d->max_id);
    out[i] = (int32_t)u[i];
  }
  return 0;
}

void gj_dataset_advise(const gj_dataset *d, uint64_t start, uint64_t n) {
  if (!d->map_base || start >= d->n_tokens) return;
  n = GJ_MIN(n, d->n_tokens - start);
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)(d->map + start * d->width), e = a + n * d->width;
  a = a / page * page;
  madvise((void *)a, e - a, MADV_WILLNEED);
}

void gj_dataset_free(gj_dataset *d) {
  if (d->map_base) munmap(d->map_base, d->map_len);
  if (d->tokens > 0) H5Dclose((hid_t)d->tokens);
  if (d->file > 0) H5Fclose((hid_t)d->file);
  d->map = NULL, d->map_base = NULL, d->map_len = 0;
  d->tokens = d->file = -1;
}
