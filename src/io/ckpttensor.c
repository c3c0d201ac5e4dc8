#include "io/ckpttensor.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "io/ckptshare.h"
#include "io/crc32.h"
#include "io/h5util.h"

/* Start the disk on the rows just written (a contiguous dataset), so that the final fsync
 * finds little left to do: writeback overlaps the CRCs and copies of the next tensors. */
static void start_writeback(int fd, hid_t d, const gj_tensor *t, int64_t a, int64_t b) {
#ifdef SYNC_FILE_RANGE_WRITE
  haddr_t off = H5Dget_offset(d);
  off_t row = (off_t)t->cols * (off_t)sizeof(float);
  if (fd >= 0 && off != HADDR_UNDEF && b > a)
    sync_file_range(fd, (off_t)off + (t->row0 + a) * row, (b - a) * row, SYNC_FILE_RANGE_WRITE);
#endif
}

/* Create a tensor's dataset (its global shape; chunked, shuffled and deflated when compress
 * is 1..9). *chunk_rows: rows per chunk (1 when contiguous). The set-up depends on the global
 * shape only, so every rank fails it alike or not at all. */
static hid_t create_dataset(hid_t f, const char *path, const gj_tensor *t, int compress,
                            int64_t *chunk_rows) {
  hsize_t dims[2] = {(hsize_t)t->rows, (hsize_t)t->cols}, ch[2] = {1, 1};
  if (compress) {
    /* Large chunks (about 4 MB) of whole rows: few chunks keep collective filtered writes
     * fast and safe. Byte shuffle first: it groups the floats' exponent bytes, which
     * compress well, and makes deflate both faster and tighter on weights and moments. */
    ch[1] = t->ndim == 2 ? dims[1] : 1;
    ch[0] = (hsize_t)GJ_MAX(1, GJ_MIN((int64_t)dims[0], ((int64_t)1 << 20) / (int64_t)ch[1]));
  }
  *chunk_rows = (int64_t)ch[0];
  hid_t d = -1, sp = H5Screate_simple(t->ndim, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  int ok = sp >= 0 && dcpl >= 0 && H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
  if (ok && compress)
    ok = H5Pset_chunk(dcpl, t->ndim, ch) >= 0 && H5Pset_shuffle(dcpl) >= 0 && H5Pset_deflate(dcpl, (unsigned)compress) >= 0;
  if (!ok) GJ_H5_FAIL("cannot set up dataset %s", path);
  hid_t lcpl = ok ? gj_h5_lcpl_parents() : -1;
  if (lcpl >= 0) {
    d = H5Dcreate2(f, path, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
    if (d < 0) GJ_H5_FAIL("cannot create dataset %s", path);
    H5Pclose(lcpl);
  }
  if (dcpl >= 0) H5Pclose(dcpl);
  if (sp >= 0) H5Sclose(sp);
  return d;
}

int gj_ckpttensor_write_crc(hid_t d, const char *path, uint32_t crc) {
  return gj_h5_write_attr_u32(d, "crc32", crc) ? gj_err_prefix(path) : 0;
}

/* The collective write of n elements from buf to the selection fs of dataset d (closes d and
 * fs), then its crc32 attribute. Rows [a, b) of the local slice: where writeback starts. */
static int write_selection(hid_t d, hid_t fs, int fd, const char *path, const gj_tensor *t,
                           const float *buf, hsize_t n, int64_t a, int64_t b, uint32_t crc,
                           hid_t dxpl) {
  hid_t ms = H5Screate_simple(1, &n, NULL);
  int rc = ms < 0 || (!n && (H5Sselect_none(fs) < 0 || H5Sselect_none(ms) < 0))
               ? GJ_H5_FAIL("cannot select what to write of %s", path) : 0;
  if (!rc && H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf) < 0) rc = GJ_H5_FAIL("cannot write %s (disk full?)", path);
  if (!rc) start_writeback(fd, d, t, a, b);
  if (ms >= 0) H5Sclose(ms);
  H5Sclose(fs);
  if (!rc) rc = gj_ckpttensor_write_crc(d, path, crc);
  H5Dclose(d);
  return rc;
}

/* d's dataspace with the block [row0, row0 + nr) x [col0, col0 + nc) combined into it by op. */
static int select_block(hid_t fs, H5S_seloper_t op, int64_t row0, int64_t col0, int64_t nr, int64_t nc) {
  hsize_t start[2] = {(hsize_t)row0, (hsize_t)col0}, count[2] = {(hsize_t)nr, (hsize_t)nc};
  return H5Sselect_hyperslab(fs, op, start, NULL, count, NULL) < 0 ? -1 : 0;
}

int gj_ckpttensor_write(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t,
                        const float *local, int compress, hid_t dxpl) {
  uint32_t crc;
  GJ_TRY(gj_ckptshare_crc(g, t, local, &crc));
  int64_t unit, a, b;
  hid_t d = create_dataset(f, path, t, compress, &unit);
  if (d < 0) return -1;
  /* One copy of each element is written: the replicas of a slice write a share of its rows
   * each (whole chunks when compressed, so that each chunk is compressed by one rank).
   * Everyone takes part in the collective call. */
  gj_ckptshare_rows(g, t, unit, &a, &b);
  hid_t fs = H5Dget_space(d);
  if (fs < 0 || (b > a && select_block(fs, H5S_SELECT_SET, t->row0 + a, t->col0, b - a, t->lcols))) {
    int rc = GJ_H5_FAIL("cannot select rows of %s", path);
    if (fs >= 0) H5Sclose(fs);
    return H5Dclose(d), rc;
  }
  return write_selection(d, fs, fd, path, t, local + a * t->lcols, (hsize_t)((b - a) * t->lcols),
                         a, b, crc, dxpl);
}

/* Under ZeRO-1 each DP rank writes the moments it owns: elements [lo, hi) of the tensor's
 * local slice, a union of at most three blocks of the dataset (a partial row, whole rows, a
 * partial row). Replicated tensors are written by the DP group of TP rank 0. */
int gj_ckpttensor_write_owned(hid_t f, int fd, const char *path, gj_state *st, gj_grid *g,
                              const gj_tensor *t, const float *moments, int compress, hid_t dxpl) {
  int64_t lo, hi, unit;
  gj_ckptshare_owned(st, t, g->dp_rank, &lo, &hi);
  const float *mine = moments + (t->offset + lo) - st->lo;
  uint32_t crc = 0;
  GJ_TRY(gj_ckptshare_owned_crc(st, g, t, mine, &crc));
  if (t->shard == GJ_SHARD_NONE && g->tp_rank != 0) hi = lo;
  hid_t d = create_dataset(f, path, t, compress, &unit);
  if (d < 0) return -1;
  hid_t fs = H5Dget_space(d);
  int bad = fs < 0;
  H5S_seloper_t op = H5S_SELECT_SET;
  for (int64_t e = lo, L = t->lcols; e < hi && !bad; op = H5S_SELECT_OR) {
    int64_t i = e / L, j = e % L, nr = 1, nc = GJ_MIN(L - j, hi - e);
    if (j == 0 && hi - e >= L) nr = (hi - e) / L, nc = L;
    bad = select_block(fs, op, t->row0 + i, t->col0 + j, nr, nc);
    e += nr * nc;
  }
  if (bad) {
    int rc = GJ_H5_FAIL("cannot select the owned part of %s", path);
    if (fs >= 0) H5Sclose(fs);
    return H5Dclose(d), rc;
  }
  return write_selection(d, fs, fd, path, t, mine, (hsize_t)(hi - lo), lo / t->lcols,
                         hi > lo ? (hi - 1) / t->lcols + 1 : lo / t->lcols, crc, dxpl);
}

/* Element e of a rank's slice of t as the element of the global tensor (row-major), for
 * messages that name it. */
static size_t global_elem(const gj_tensor *t, size_t e) {
  size_t lc = (size_t)t->lcols;
  return ((size_t)t->row0 + e / lc) * (size_t)t->cols + (size_t)t->col0 + e % lc;
}

int gj_ckpttensor_read_crc(hid_t d, uint32_t *want) {
  hid_t at = H5Aexists(d, "crc32") > 0 ? H5Aopen(d, "crc32", H5P_DEFAULT) : -1;
  if (at < 0) return -1;
  /* one integer element (an array would be read whole into *want), of at most 8 bytes, whose
   * value fits 32 bits */
  hid_t sp = H5Aget_space(at), ty = H5Aget_type(at);
  unsigned long long v = 0;
  int r = sp >= 0 && ty >= 0 && H5Sget_simple_extent_npoints(sp) == 1 && H5Tget_class(ty) == H5T_INTEGER &&
                  H5Tget_size(ty) <= 8 && H5Aread(at, H5T_NATIVE_ULLONG, &v) >= 0 && v <= UINT32_MAX
              ? 0
              : -1;
  if (!r) *want = (uint32_t)v;
  if (ty >= 0) H5Tclose(ty);
  if (sp >= 0) H5Sclose(sp);
  H5Aclose(at);
  return r;
}

/* Read this rank's share of its slice of a tensor (the replicas of a slice read a share of
 * its rows each, whole chunks of a compressed dataset; no collectives) and the stored CRC.
 * *unit: the row granularity of the shares, for gj_ckptshare_gather_rows. */
static int read_share(hid_t f, const char *fname, const char *path, gj_grid *g, const gj_tensor *t,
                      float *local, uint32_t *want, int64_t *unit) {
  *unit = 1;
  int r = -1;
  GJ_TRY(gj_h5_plain_dataset(f, fname, path)); /* before anything follows a link */
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  if (d >= 0) {
    hid_t dcpl = H5Dget_create_plist(d);
    hsize_t ch[2] = {1, 1};
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, ch) >= 1)
      *unit = (int64_t)GJ_MAX(ch[0], 1);
    if (dcpl >= 0) H5Pclose(dcpl);
    r = gj_ckpttensor_read_crc(d, want);
    H5Dclose(d);
  }
  int64_t a, b;
  gj_ckptshare_rows(g, t, *unit, &a, &b);
  /* the read names a missing or misshapen dataset; the CRC check comes after */
  GJ_TRY(gj_h5_read_block_f32(f, fname, path, t->rows, t->cols, t->ndim, t->row0 + a, t->col0,
                              b - a, t->lcols, local + a * t->lcols));
  if (r < 0) return GJ_FAIL("%s: %s has no crc32 attribute, or not one unsigned 32-bit integer", fname, path);
  return 0;
}

void gj_ckpttensor_prefetch(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t) {
  if (fd < 0) return;
  if (gj_h5_plain_dataset(f, "", path)) return; /* the read reports what is wrong */
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  if (d < 0) return; /* the read reports it */
  haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  if (off == HADDR_UNDEF) return; /* chunked */
  int64_t a, b;
  gj_ckptshare_rows(g, t, 1, &a, &b);
  off_t row = (off_t)t->cols * (off_t)sizeof(float);
  if (b > a) posix_fadvise(fd, (off_t)off + (t->row0 + a) * row, (b - a) * row, POSIX_FADV_WILLNEED);
}

hid_t gj_ckpttensor_transfer(int compress) {
  /* uncompressed, each rank's share is one contiguous run of the file: it writes it itself
   * (no two-phase aggregation through one rank); filtered writes stay fully collective */
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  if (dxpl >= 0 && H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0 &&
      (compress || H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO) >= 0))
    return dxpl;
  GJ_H5_FAIL("cannot set up collective writes");
  if (dxpl >= 0) H5Pclose(dxpl);
  return -1;
}

int gj_ckpttensor_load(hid_t f, const char *fname, const char *path, gj_grid *g, const gj_tensor *t,
                       float *local) {
  uint32_t want = 0, got = 0;
  int64_t unit = 1;
  int rc = 0;
  if (gj_stop_signal()) /* a stop request (gptj train) ends a long load early */
    rc = (GJ_FAIL("stopped by %s while loading %s", gj_signal_name(gj_stop_signal()), fname), GJ_STOPPED);
  if (!rc) rc = read_share(f, fname, path, g, t, local, &want, &unit);
  GJ_AGREE(g->world, rc);
  rc = gj_ckptshare_gather_rows(g, t, local, unit);
  if (!rc) rc = gj_ckptshare_crc(g, t, local, &got);
  if (!rc && got != want) rc = GJ_FAIL("%s: %s is corrupted (CRC32 %08x, expected %08x)", fname, path, got, want);
  /* a checkpoint of a run that diverged (or was edited) trains and evaluates to NaN */
  size_t bad = SIZE_MAX;
  if (!rc) {
#pragma omp parallel for reduction(min : bad) schedule(static)
    for (size_t e = 0; e < t->numel; e++)
      if (!isfinite(local[e]) && e < bad) bad = e;
  }
  if (!rc && bad != SIZE_MAX)
    rc = GJ_FAIL("%s: %s holds a non-finite value (%g at element %zu)", fname, path, local[bad], global_elem(t, bad));
  return gj_agree(g->world, rc);
}

/* A block of rows of a slice read: its CRCs (running over the slice, or one per row when the
 * global rows interleave the TP slices), the first non-finite value. */
typedef struct {
  uint32_t crc, *rows; /* rows: this rank's per-row CRCs, or NULL */
  size_t bad;          /* element index of the first non-finite value, or SIZE_MAX */
  float bad_v;
} rows_check;

static void check_rows(rows_check *k, const gj_tensor *t, int64_t r0, int64_t nr, const float *v) {
  size_t n = (size_t)nr * t->lcols, seg = (size_t)t->lcols * sizeof(float), bad = SIZE_MAX;
  if (k->rows) {
#pragma omp parallel for schedule(static) if (nr > 64)
    for (int64_t i = 0; i < nr; i++) k->rows[r0 + i] = gj_crc32(0, v + i * t->lcols, seg);
  } else {
    k->crc = gj_crc32(k->crc, v, n * sizeof(float));
  }
#pragma omp parallel for reduction(min : bad) schedule(static)
  for (size_t e = 0; e < n; e++)
    if (!isfinite(v[e]) && e < bad) bad = e;
  if (bad != SIZE_MAX && k->bad == SIZE_MAX) k->bad = (size_t)r0 * t->lcols + bad, k->bad_v = v[bad];
}

/* Every block of this rank's slice through the sink, checked; the stored CRC into *want. */
static int read_blocks(hid_t f, const char *fname, const char *path, const gj_tensor *t, float *buf,
                       size_t buf_floats, const gj_ckpttensor_sink *sink, rows_check *k, uint32_t *want) {
  GJ_TRY(gj_h5_plain_dataset(f, fname, path)); /* before anything follows a link */
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  int r = d >= 0 ? gj_ckpttensor_read_crc(d, want) : -1;
  if (d >= 0) H5Dclose(d);
  int64_t rows = GJ_MAX((int64_t)1, (int64_t)(buf_floats / (size_t)t->lcols));
  for (int64_t r0 = 0; r0 < t->lrows; r0 += rows) {
    int64_t nr = GJ_MIN(rows, t->lrows - r0);
    /* the read names a missing or misshapen dataset; the CRC check comes after */
    GJ_TRY(gj_h5_read_block_f32(f, fname, path, t->rows, t->cols, t->ndim, t->row0 + r0, t->col0,
                                nr, t->lcols, buf));
    check_rows(k, t, r0, nr, buf);
    GJ_TRY(sink->rows(sink->ctx, t, r0, nr, buf));
    /* after the first block's read, as gj_ckpttensor_load reports it */
    if (r < 0) return GJ_FAIL("%s: %s has no crc32 attribute, or not one unsigned 32-bit integer", fname, path);
  }
  return 0;
}

int gj_ckpttensor_load_rows(hid_t f, const char *fname, const char *path, gj_grid *g,
                            const gj_tensor *t, float *buf, size_t buf_floats,
                            const gj_ckpttensor_sink *sink) {
  uint32_t want = 0, got = 0;
  int64_t units = gj_ckptshare_slice_units(g, t);
  uint32_t *slice = calloc((size_t)units * gj_ckptshare_slice_parts(g, t), sizeof(uint32_t));
  uint32_t *own = slice ? slice + gj_ckptshare_slice_at(g, t) : NULL;
  rows_check k = {0, units > 1 ? own : NULL, SIZE_MAX, 0.0f};
  int rc = slice ? 0 : GJ_FAIL("out of memory");
  if (!rc && gj_stop_signal()) /* a stop request ends a long load early */
    rc = (GJ_FAIL("stopped by %s while loading %s", gj_signal_name(gj_stop_signal()), fname), GJ_STOPPED);
  if (!rc && buf_floats < (size_t)t->lcols) rc = GJ_FAIL("internal: a block of %zu floats", buf_floats);
  if (!rc) rc = read_blocks(f, fname, path, t, buf, buf_floats, sink, &k, &want);
  if (!rc && units == 1) own[0] = k.crc;
  rc = gj_agree(g->world, rc);
  if (!rc) rc = gj_ckptshare_slices_crc(g, t, slice, &got);
  if (!rc && got != want) rc = GJ_FAIL("%s: %s is corrupted (CRC32 %08x, expected %08x)", fname, path, got, want);
  /* a checkpoint of a run that diverged (or was edited) trains and evaluates to NaN */
  if (!rc && k.bad != SIZE_MAX)
    rc = GJ_FAIL("%s: %s holds a non-finite value (%g at element %zu)", fname, path, k.bad_v, global_elem(t, k.bad));
  free(slice);
  return gj_agree(g->world, rc);
}

static int round_rows(void *ctx, const gj_tensor *t, int64_t r0, int64_t nr, const float *v) {
  gj_bf16_round((gj_bf16 *)ctx + (size_t)r0 * t->lcols, v, (size_t)nr * t->lcols);
  return 0;
}

int gj_ckpttensor_load_bf16(hid_t f, const char *fname, const char *path, gj_grid *g,
                            const gj_tensor *t, gj_bf16 *dst) {
  /* blocks of 4 Mi floats (16 MB), or one row if longer */
  size_t n = GJ_MAX((size_t)1 << 22, (size_t)t->lcols);
  float *buf = malloc(n * sizeof(float));
  int rc = gj_agree(g->world, buf ? 0 : GJ_FAIL("out of memory: %zu bytes", n * sizeof(float)));
  gj_ckpttensor_sink sink = {round_rows, dst};
  if (!rc) rc = gj_ckpttensor_load_rows(f, fname, path, g, t, buf, n, &sink);
  free(buf);
  return rc;
}
