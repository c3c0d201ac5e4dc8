#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common.h"
#include "io/ckptshare.h"
#include "io/h5util.h"
#include "model/gemm.h"

#define CKPT_FORMAT "gptj-mpi-checkpoint"
#define CKPT_VERSION 1
/* Ranges of the step and token counters read back: the largest --steps, and 2^62 tokens (so
 * that adding a step's tokens cannot overflow int64). */
#define CKPT_MAX_STEP ((int64_t)1000000000000)
#define CKPT_MAX_TOKENS ((int64_t)1 << 62)

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
 * is 1..9). *chunk_rows: rows per chunk (1 when contiguous). */
static hid_t create_dataset(hid_t f, const char *path, const gj_tensor *t, int compress,
                            int64_t *chunk_rows) {
  hsize_t dims[2] = {(hsize_t)t->rows, (hsize_t)t->cols};
  hid_t sp = H5Screate_simple(t->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  hsize_t ch[2] = {1, 1};
  if (compress) {
    /* Large chunks (about 4 MB) of whole rows: few chunks keep collective filtered writes
     * fast and safe. Byte shuffle first: it groups the floats' exponent bytes, which
     * compress well, and makes deflate both faster and tighter on weights and moments. */
    ch[1] = t->ndim == 2 ? dims[1] : 1;
    ch[0] = (hsize_t)GJ_MAX(1, GJ_MIN((int64_t)dims[0], ((int64_t)1 << 20) / (int64_t)ch[1]));
    H5Pset_chunk(dcpl, t->ndim, ch);
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, (unsigned)compress);
  }
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t d = H5Dcreate2(f, path, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
  H5Pclose(lcpl), H5Pclose(dcpl), H5Sclose(sp);
  *chunk_rows = (int64_t)ch[0];
  if (d < 0) GJ_H5_FAIL("cannot create dataset %s", path);
  return d;
}

/* The collective write of n elements from buf to the selection fs of dataset d (closes d and
 * fs), then its crc32 attribute. Rows [a, b) of the local slice: where writeback starts. */
static int write_selection(hid_t d, hid_t fs, int fd, const char *path, const gj_tensor *t,
                           const float *buf, hsize_t n, int64_t a, int64_t b, uint32_t crc,
                           hid_t dxpl) {
  hid_t ms = H5Screate_simple(1, &n, NULL);
  if (!n) H5Sselect_none(fs), H5Sselect_none(ms);
  herr_t wr = H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf);
  H5Sclose(ms), H5Sclose(fs);
  if (wr >= 0) start_writeback(fd, d, t, a, b);
  int rc = wr < 0 ? GJ_H5_FAIL("cannot write %s (disk full?)", path) : 0;
  if (!rc) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t at = H5Acreate2(d, "crc32", H5T_STD_U32LE, as, H5P_DEFAULT, H5P_DEFAULT);
    if (at < 0 || H5Awrite(at, H5T_NATIVE_UINT32, &crc) < 0) rc = GJ_H5_FAIL("cannot write crc32 of %s", path);
    if (at >= 0) H5Aclose(at);
    H5Sclose(as);
  }
  H5Dclose(d);
  return rc;
}

static int write_tensor(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t,
                        const float *local, int compress, hid_t dxpl) {
  uint32_t crc;
  GJ_TRY(gj_ckptshare_crc(g, t, local, &crc));
  int64_t unit;
  hid_t d = create_dataset(f, path, t, compress, &unit);
  if (d < 0) return -1;
  /* One copy of each element is written: the replicas of a slice write a share of its rows
   * each (whole chunks when compressed, so that each chunk is compressed by one rank).
   * Everyone takes part in the collective call. */
  int64_t a, b;
  gj_ckptshare_rows(g, t, unit, &a, &b);
  hid_t fs = H5Dget_space(d);
  if (b > a) {
    hsize_t start[2] = {(hsize_t)(t->row0 + a), (hsize_t)t->col0};
    hsize_t count[2] = {(hsize_t)(b - a), (hsize_t)t->lcols};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  }
  return write_selection(d, fs, fd, path, t, local + a * t->lcols, (hsize_t)((b - a) * t->lcols),
                         a, b, crc, dxpl);
}

/* Read this rank's share of its slice of a tensor (the replicas of a slice read a share of
 * its rows each, whole chunks of a compressed dataset; no collectives) and the stored CRC.
 * *unit: the row granularity of the shares, for gj_ckptshare_gather_rows. */
static int read_share(hid_t f, const char *fname, const char *path, gj_grid *g, const gj_tensor *t,
                      float *local, uint32_t *want, int64_t *unit) {
  *unit = 1;
  herr_t r = -1;
  GJ_TRY(gj_h5_plain_dataset(f, fname, path)); /* before anything follows a link */
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  if (d >= 0) {
    hid_t dcpl = H5Dget_create_plist(d);
    hsize_t ch[2] = {1, 1};
    if (H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, ch) >= 1) *unit = (int64_t)GJ_MAX(ch[0], 1);
    H5Pclose(dcpl);
    hid_t at = H5Aexists(d, "crc32") > 0 ? H5Aopen(d, "crc32", H5P_DEFAULT) : -1;
    r = at >= 0 ? H5Aread(at, H5T_NATIVE_UINT32, want) : -1;
    if (at >= 0) H5Aclose(at);
    H5Dclose(d);
  }
  int64_t a, b;
  gj_ckptshare_rows(g, t, *unit, &a, &b);
  /* the read names a missing or misshapen dataset; the CRC check comes after */
  GJ_TRY(gj_h5_read_block_f32(f, fname, path, t->rows, t->cols, t->ndim, t->row0 + a, t->col0,
                              b - a, t->lcols, local + a * t->lcols));
  if (r < 0) return GJ_FAIL("%s: %s has no crc32 attribute", fname, path);
  return 0;
}

/* Ask the kernel to start reading this rank's share of a tensor (contiguous datasets), so
 * that the disk works while the previous tensor is exchanged and checked. */
static void prefetch_share(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t) {
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

/* Under ZeRO-1 each DP rank writes the moments it owns: elements [lo, hi) of the tensor's
 * local slice, a union of at most three blocks of the dataset (a partial row, whole rows, a
 * partial row). Replicated tensors are written by the DP group of TP rank 0. */
static int write_owned(hid_t f, int fd, const char *path, gj_state *m, gj_grid *g, const gj_tensor *t,
                       const float *shard_block, int compress, hid_t dxpl) {
  int64_t unit, lo, hi;
  gj_ckptshare_owned(m, t, g->dp_rank, &lo, &hi);
  const float *mine = shard_block + (t->offset + lo) - m->lo;
  uint32_t crc = 0;
  GJ_TRY(gj_ckptshare_owned_crc(m, g, t, mine, &crc));
  if (t->shard == GJ_SHARD_NONE && g->tp_rank != 0) hi = lo;
  hid_t d = create_dataset(f, path, t, compress, &unit);
  if (d < 0) return -1;
  hid_t fs = H5Dget_space(d);
  H5S_seloper_t op = H5S_SELECT_SET;
  for (int64_t e = lo, L = t->lcols; e < hi; op = H5S_SELECT_OR) {
    int64_t i = e / L, j = e % L, nr = 1, nc = GJ_MIN(L - j, hi - e);
    if (j == 0 && hi - e >= L) nr = (hi - e) / L, nc = L;
    hsize_t start[2] = {(hsize_t)(t->row0 + i), (hsize_t)(t->col0 + j)};
    hsize_t count[2] = {(hsize_t)nr, (hsize_t)nc};
    H5Sselect_hyperslab(fs, op, start, NULL, count, NULL);
    e += nr * nc;
  }
  return write_selection(d, fs, fd, path, t, mine, (hsize_t)(hi - lo), lo / t->lcols,
                         hi > lo ? (hi - 1) / t->lcols + 1 : lo / t->lcols, crc, dxpl);
}

/* The three blocks of a checkpoint and their HDF5 prefixes. */
static const char *const block_prefix[3] = {"/model/", "/optim/exp_avg/", "/optim/exp_avg_sq/"};

/* Under ZeRO-1, a buffer for one tensor's whole local slice of moments (NULL otherwise). */
static int zero_stage_alloc(const gj_state *m, float **stage) {
  *stage = NULL;
  if (!m->zero) return 0;
  size_t mx = 0;
  for (int i = 0; i < m->lay.n; i++) mx = GJ_MAX(mx, m->lay.t[i].numel);
  *stage = malloc(mx * sizeof(float));
  return *stage ? 0 : GJ_FAIL("out of memory staging moments");
}

static const char *cfg_keys[] = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                                 "rotary_dim", "n_inner"};

static int64_t *cfg_field(gj_config *c, int i) {
  int64_t *f[] = {&c->vocab_size, &c->n_positions, &c->n_embd, &c->n_layer,
                  &c->n_head,     &c->rotary_dim,  &c->n_inner};
  return f[i];
}

int gj_ckpt_save(const char *path, gj_state *m, gj_grid *g, const gj_ckpt_meta *meta, int compress) {
  char tmp[GJ_PATH_BUF + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path); /* one name for every rank; the run's lock makes it ours */
  gj_h5_quiet();
  /* Room for the file first: HDF5 1.10 can hang in the collective close of a file whose
   * write failed for lack of space, so a full disk is refused before anything is written. */
  int rc = 0;
  if (g->rank == 0) {
    char dir[GJ_PATH_BUF];
    snprintf(dir, sizeof dir, "%s", path);
    char *sl = strrchr(dir, '/');
    if (sl) *sl = 0; else snprintf(dir, sizeof dir, ".");
    double need = 3.0 * (double)m->lay.n_global * sizeof(float) + (4 << 20);
    struct statvfs vfs;
    if (!statvfs(dir, &vfs)) {
      double avail = (double)vfs.f_bavail * vfs.f_frsize;
      if (avail < need)
        rc = GJ_FAIL("%s: %.0f MB free, the checkpoint needs %.0f MB (disk full?); the previous "
                     "checkpoint is kept", dir, avail / 1e6, need / 1e6);
    }
  }
  if ((rc = gj_agree(g->world, rc))) return rc;
  if (g->rank == 0) gj_tmp_register(tmp); /* removed if a second interrupt ends the process */
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, g->world, MPI_INFO_NULL);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (f < 0) rc = GJ_H5_FAIL("%s: cannot create checkpoint (directory missing or not writable?)", tmp);
  if ((rc = gj_agree(g->world, rc))) {
    if (g->rank == 0) gj_tmp_unregister(tmp);
    return rc;
  }
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* Uncompressed, each rank's share is one contiguous run of the file: it writes it itself
   * (no two-phase aggregation through one rank). Filtered writes stay fully collective. */
  if (!compress) H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO);
  gj_config c = m->c;
  rc |= gj_h5_write_attr_str(f, "format", CKPT_FORMAT);
  rc |= gj_h5_write_attr_i64(f, "format_version", CKPT_VERSION);
  rc |= gj_h5_write_attr_i64(f, "step", meta->step);
  rc |= gj_h5_write_attr_i64(f, "tokens_seen", meta->tokens_seen);
  rc |= gj_h5_write_attr_i64(f, "written_tp", g->tp_size);
  rc |= gj_h5_write_attr_i64(f, "written_dp", g->dp_size);
  rc |= gj_h5_write_attr_i64(f, "has_optim", 1);
  /* the precision the run computed in; the weights are float32 either way, so any run
   * resumes from it */
  rc |= gj_h5_write_attr_str(f, "precision", gj_precision_name(gj_gemm_precision()));
  for (int i = 0; i < 7; i++) rc |= gj_h5_write_attr_i64(f, cfg_keys[i], *cfg_field(&c, i));
  rc |= gj_h5_write_attr_f64(f, "layer_norm_epsilon", c.layer_norm_epsilon);
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  hid_t go = H5Gcreate2(f, "optim", H5P_DEFAULT, gcpl, H5P_DEFAULT);
  hid_t gl = H5Gcreate2(f, "loader", H5P_DEFAULT, gcpl, H5P_DEFAULT);
  H5Pclose(gcpl);
  if (go < 0 || gl < 0) rc = -1;
  if (!rc) {
    const gj_adamw_hp *h = &meta->hp;
    rc |= gj_h5_write_attr_f64(go, "lr", h->lr);
    rc |= gj_h5_write_attr_f64(go, "beta1", h->beta1);
    rc |= gj_h5_write_attr_f64(go, "beta2", h->beta2);
    rc |= gj_h5_write_attr_f64(go, "eps", h->eps);
    rc |= gj_h5_write_attr_f64(go, "weight_decay", h->weight_decay);
    rc |= gj_h5_write_attr_f64(go, "grad_clip", h->grad_clip);
    rc |= gj_h5_write_attr_i64(go, "warmup", meta->sched.warmup);
    rc |= gj_h5_write_attr_i64(go, "decay_steps", meta->sched.decay_steps);
    rc |= gj_h5_write_attr_f64(go, "lr_floor", meta->sched.floor);
    rc |= gj_h5_write_attr_i64(go, "step", meta->step);
    rc |= gj_h5_write_attr_i64(gl, "seed", (int64_t)meta->loader.seed);
    rc |= gj_h5_write_attr_i64(gl, "epoch", (int64_t)meta->loader.epoch);
    rc |= gj_h5_write_attr_i64(gl, "cursor", (int64_t)meta->loader.cursor);
  }
  if (go >= 0) H5Gclose(go);
  if (gl >= 0) H5Gclose(gl);
  if (rc) rc = GJ_H5_FAIL("%s: cannot write attributes (disk full?)", tmp);
  rc = gj_agree(g->world, rc);
  char p[512];
  float *blocks[3] = {m->params, m->m, m->v};
  int wfd = open(tmp, O_WRONLY); /* for writeback hints only */
  for (int b = 0; b < 3 && !rc; b++)
    for (int i = 0; i < m->lay.n && !rc; i++) {
      const gj_tensor *t = &m->lay.t[i];
      snprintf(p, sizeof p, "%s%s", block_prefix[b], t->name);
      if (b && m->zero)
        rc = write_owned(f, wfd, p, m, g, t, blocks[b], compress, dxpl);
      else
        rc = write_tensor(f, wfd, p, g, t, blocks[b] + t->offset - (b ? m->lo : 0), compress, dxpl);
      /* A failed write (a full disk) may show on some ranks only: agree before the next
       * collective call, or the others would wait in it for ever. */
      rc = gj_agree(g->world, rc);
    }
  if (wfd >= 0) close(wfd);
  H5Pclose(dxpl);
  if (rc) {
    /* A write failed on some rank (all agree by now). Closing would be collective and can
     * hang in HDF5 1.10 after a failed write: leave the handle (main turns off HDF5's
     * close-at-exit), remove the temporary file and report. */
    if (g->rank == 0) unlink(tmp), gj_tmp_unregister(tmp);
    return rc;
  }
  if (H5Fclose(f) < 0 && !rc) rc = GJ_H5_FAIL("%s: cannot close (disk full?)", tmp);
  if (g->rank == 0 && !rc) {
    int fd = open(tmp, O_RDONLY);
    if (fd < 0 || fsync(fd)) rc = GJ_FAIL("%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (!rc && rename(tmp, path)) rc = GJ_FAIL("%s: rename failed: %s", path, strerror(errno));
    char dir[GJ_PATH_BUF];
    snprintf(dir, sizeof dir, "%s", path);
    char *sl = strrchr(dir, '/');
    if (sl) *sl = 0; else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) fsync(dfd), close(dfd);
  }
  if ((rc = gj_agree(g->world, rc))) {
    if (g->rank == 0) unlink(tmp);
    if (g->rank == 0) gj_tmp_unregister(tmp);
    return rc;
  }
  if (g->rank == 0) gj_tmp_unregister(tmp);
  return 0;
}

static int check_config(hid_t f, const char *path, const gj_config *c) {
  gj_config cc = *c;
  for (int i = 0; i < 7; i++) {
    int64_t v;
    GJ_TRY(gj_h5_attr_i64(f, path, cfg_keys[i], &v));
    if (v != *cfg_field(&cc, i))
      return GJ_FAIL("%s: checkpoint has %s = %lld, this run has %lld", path, cfg_keys[i],
                     (long long)v, (long long)*cfg_field(&cc, i));
  }
  double eps;
  GJ_TRY(gj_h5_attr_f64(f, path, "layer_norm_epsilon", &eps));
  if (eps != c->layer_norm_epsilon)
    return GJ_FAIL("%s: checkpoint has layer_norm_epsilon = %g, this run has %g", path, eps,
                   c->layer_norm_epsilon);
  return 0;
}

static int open_checked(const char *path, hid_t *f, MPI_Comm comm) {
  /* Serial checks first (a readable HDF5 file), then the collective open. */
  hid_t s;
  int rc = gj_h5_open_read(path, &s);
  if (!rc) {
    char fmt[64] = "";
    rc = gj_h5_attr_str(s, path, "format", fmt, sizeof fmt);
    if (!rc && strcmp(fmt, CKPT_FORMAT)) rc = GJ_FAIL("%s: not a gptj-mpi checkpoint (format '%s')", path, fmt);
    int64_t v = 0;
    if (!rc) rc = gj_h5_attr_i64(s, path, "format_version", &v);
    if (!rc && v != CKPT_VERSION) rc = GJ_FAIL("%s: checkpoint format_version %lld is not supported (expected %d)", path, (long long)v, CKPT_VERSION);
    H5Fclose(s);
  }
  if (comm == MPI_COMM_NULL) {
    if (!rc) rc = gj_h5_open_read(path, f);
    return rc;
  }
  if ((rc = gj_agree(comm, rc))) return rc;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  *f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  rc = *f < 0 ? GJ_H5_FAIL("%s: cannot open (truncated or corrupted?)", path) : 0;
  if ((rc = gj_agree(comm, rc))) {
    if (*f >= 0) H5Fclose(*f);
    return rc;
  }
  return 0;
}

/* The attributes of a checkpoint's training state, each checked against the range its
 * training flag allows (a negative step would train with a negative learning rate, a
 * tokens_seen near INT64_MAX would overflow as training goes on). */
static int read_state(hid_t f, const char *path, gj_ckpt_meta *meta, int with_optim) {
  GJ_TRY(gj_h5_attr_i64_in(f, path, "step", 0, CKPT_MAX_STEP, &meta->step));
  GJ_TRY(gj_h5_attr_i64_in(f, path, "tokens_seen", 0, CKPT_MAX_TOKENS, &meta->tokens_seen));
  if (!with_optim) return 0;
  hid_t go = H5Lexists(f, "optim", H5P_DEFAULT) > 0 ? H5Gopen2(f, "optim", H5P_DEFAULT) : -1;
  hid_t gl = H5Lexists(f, "loader", H5P_DEFAULT) > 0 ? H5Gopen2(f, "loader", H5P_DEFAULT) : -1;
  int rc = go < 0 || gl < 0 ? GJ_FAIL("%s: missing /optim or /loader", path) : 0;
  gj_adamw_hp *h = &meta->hp;
  const double big = 1e12;
  int64_t v;
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "lr", 0, 10, 0, &h->lr);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "beta1", 0, 1, GJ_H5_HI_OPEN, &h->beta1);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "beta2", 0, 1, GJ_H5_HI_OPEN, &h->beta2);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "eps", 0, 1, GJ_H5_LO_OPEN, &h->eps);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "weight_decay", 0, 10, 0, &h->weight_decay);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "grad_clip", 0, 1e9, 0, &h->grad_clip);
  if (!rc) rc = gj_h5_attr_i64_in(go, path, "warmup", 0, (int64_t)big, &meta->sched.warmup);
  if (!rc) rc = gj_h5_attr_i64_in(go, path, "decay_steps", 0, (int64_t)big, &meta->sched.decay_steps);
  if (!rc) rc = gj_h5_attr_f64_in(go, path, "lr_floor", 0, 1, 0, &meta->sched.floor);
  if (!rc) rc = gj_h5_attr_i64_in(gl, path, "seed", 0, INT64_MAX, &v), meta->loader.seed = (uint64_t)v;
  if (!rc) rc = gj_h5_attr_i64_in(gl, path, "epoch", 0, CKPT_MAX_TOKENS, &v), meta->loader.epoch = (uint64_t)v;
  if (!rc) rc = gj_h5_attr_i64_in(gl, path, "cursor", 0, CKPT_MAX_TOKENS, &v), meta->loader.cursor = (uint64_t)v;
  meta->sched.lr = h->lr;
  if (go >= 0) H5Gclose(go);
  if (gl >= 0) H5Gclose(gl);
  return rc;
}

int gj_ckpt_load(const char *path, gj_state *m, gj_grid *g, gj_ckpt_meta *meta, int with_optim) {
  gj_h5_quiet();
  hid_t f;
  GJ_TRY(open_checked(path, &f, g->world));
  int rc = check_config(f, path, &m->c);
  int64_t has_optim = 1;
  if (!rc && H5Aexists(f, "has_optim") > 0) rc = gj_h5_attr_i64_in(f, path, "has_optim", 0, 1, &has_optim);
  /* every attribute is read and checked before any tensor */
  gj_ckpt_meta st = *meta;
  if (!rc) rc = read_state(f, path, &st, with_optim && has_optim);
  if ((rc = gj_agree(g->world, rc))) return H5Fclose(f), rc;
  *meta = st;
  meta->has_optim = with_optim && has_optim;
  if (!has_optim && with_optim) {
    /* a model-only checkpoint (from gptj convert): fresh optimizer, schedule and data order */
    with_optim = 0;
    memset(m->m, 0, m->n * sizeof(float));
    memset(m->v, 0, m->n * sizeof(float));
    meta->loader = (gj_loader_state){meta->loader.seed, 0, 0};
    gj_info("%s holds weights only: the optimizer starts afresh", path);
  }
  if (!has_optim) meta->step = meta->tokens_seen = 0;
  char p[512];
  float *blocks[3] = {m->params, m->m, m->v};
  float *stage;
  if (zero_stage_alloc(m, &stage)) return H5Fclose(f), -1;
  /* Every rank reads (and checks) every tensor; collectives inside stay in step because a
   * failure is agreed on before the next tensor. The next tensor is prefetched meanwhile. */
  int nt = (with_optim ? 3 : 1) * m->lay.n;
  int fd = open(path, O_RDONLY);
  for (int k = 0; k < nt; k++) {
    for (int j = k ? k + 1 : 0; j <= k + 1 && j < nt && !rc; j++) {
      snprintf(p, sizeof p, "%s%s", block_prefix[j / m->lay.n], m->lay.t[j % m->lay.n].name);
      prefetch_share(f, fd, p, g, &m->lay.t[j % m->lay.n]);
    }
    int b = k / m->lay.n, i = k % m->lay.n;
    const gj_tensor *t = &m->lay.t[i];
    float *local = b && m->zero ? stage : blocks[b] + t->offset - (b ? m->lo : 0);
    uint32_t want = 0, got = 0;
    int64_t unit = 1;
    snprintf(p, sizeof p, "%s%s", block_prefix[b], t->name);
    if (!rc && gj_stop_signal()) /* a stop request (gptj train) ends a long load early */
      rc = (GJ_FAIL("stopped by %s while loading %s", gj_signal_name(gj_stop_signal()), path), GJ_STOPPED);
    if (!rc) rc = read_share(f, path, p, g, t, local, &want, &unit);
    if (!(rc = gj_agree(g->world, rc))) {
      rc = gj_ckptshare_gather_rows(g, t, local, unit);
      if (!rc) rc = gj_ckptshare_crc(g, t, local, &got);
      if (!rc && got != want)
        rc = GJ_FAIL("%s: %s is corrupted (CRC32 %08x, expected %08x)", path, p, got, want);
      /* a checkpoint of a run that diverged (or was edited) trains and evaluates to NaN */
      size_t bad = SIZE_MAX;
      if (!rc) {
#pragma omp parallel for reduction(min : bad) schedule(static)
        for (size_t e = 0; e < t->numel; e++)
          if (!isfinite(local[e]) && e < bad) bad = e;
      }
      if (!rc && bad != SIZE_MAX)
        rc = GJ_FAIL("%s: %s holds a non-finite value (%g at element %zu)", path, p, local[bad], bad);
    }
    if ((rc = gj_agree(g->world, rc))) {
      H5Fclose(f);
      if (fd >= 0) close(fd);
      free(stage);
      return rc;
    }
    if (b && m->zero) gj_ckptshare_keep_owned(m, t, stage, blocks[b]);
  }
  if (fd >= 0) close(fd);
  free(stage);
  H5Fclose(f);
  if ((rc = gj_agree(g->world, rc))) return rc;
  return 0;
}

/* The model config of an open checkpoint, validated (the bounds of gj_config_validate keep
 * every size computed from it from overflowing). */
static int read_cfg(hid_t f, const char *path, gj_config *c) {
  for (int i = 0; i < 7; i++) GJ_TRY(gj_h5_attr_i64(f, path, cfg_keys[i], cfg_field(c, i)));
  GJ_TRY(gj_h5_attr_f64(f, path, "layer_norm_epsilon", &c->layer_norm_epsilon));
  if (gj_config_validate(c)) return gj_err_prefix(path);
  return 0;
}

int gj_ckpt_read_config(const char *path, gj_config *c) {
  hid_t f;
  GJ_TRY(open_checked(path, &f, MPI_COMM_NULL));
  int rc = read_cfg(f, path, c);
  H5Fclose(f);
  return rc;
}

int gj_ckpt_info(const char *path) {
  hid_t f;
  GJ_TRY(open_checked(path, &f, MPI_COMM_NULL));
  int64_t step = 0, tok = 0, tp = 0, dp = 0, ver = 0;
  gj_config c;
  int rc = gj_h5_attr_i64_in(f, path, "step", 0, CKPT_MAX_STEP, &step);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "tokens_seen", 0, CKPT_MAX_TOKENS, &tok);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "written_tp", 1, INT32_MAX, &tp);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "written_dp", 1, INT32_MAX, &dp);
  if (!rc) rc = gj_h5_attr_i64(f, path, "format_version", &ver);
  if (!rc) rc = read_cfg(f, path, &c);
  char prec[32] = "fp32 (not recorded)";
  if (!rc && H5Aexists(f, "precision") > 0) rc = gj_h5_attr_str(f, path, "precision", prec, sizeof prec);
  H5Fclose(f);
  if (rc) return rc;
  struct stat st;
  stat(path, &st);
  printf("file: %s\nformat: %s version %lld\nstep: %lld\ntokens_seen: %lld\n", path, CKPT_FORMAT,
         (long long)ver, (long long)step, (long long)tok);
  printf("written from: dp %lld x tp %lld, precision %s (weights float32)\n", (long long)dp, (long long)tp, prec);
  for (int i = 0; i < 7; i++) printf("%s: %lld\n", cfg_keys[i], (long long)*cfg_field(&c, i));
  printf("layer_norm_epsilon: %g\nparameters: %lld\nfile size: %lld bytes\n", c.layer_norm_epsilon,
         (long long)gj_config_n_params(&c), (long long)st.st_size);
  return 0;
}

int gj_ckpt_writer_begin(gj_ckpt_writer *w, const char *path, const gj_config *c) {
  memset(w, 0, sizeof *w);
  w->f = -1;
  GJ_TRY(gj_outfile_begin(&w->out, path));
  gj_h5_quiet();
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  hid_t f = H5Fcreate(w->out.tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (f < 0) {
    gj_outfile_abort(&w->out);
    return GJ_H5_FAIL("%s: cannot create (directory missing or not writable?)", w->out.tmp);
  }
  gj_config cc = *c;
  int rc = 0;
  rc |= gj_h5_write_attr_str(f, "format", CKPT_FORMAT);
  rc |= gj_h5_write_attr_i64(f, "format_version", CKPT_VERSION);
  rc |= gj_h5_write_attr_i64(f, "step", 0);
  rc |= gj_h5_write_attr_i64(f, "tokens_seen", 0);
  rc |= gj_h5_write_attr_i64(f, "written_tp", 1);
  rc |= gj_h5_write_attr_i64(f, "written_dp", 1);
  rc |= gj_h5_write_attr_i64(f, "has_optim", 0);
  for (int i = 0; i < 7; i++) rc |= gj_h5_write_attr_i64(f, cfg_keys[i], *cfg_field(&cc, i));
  rc |= gj_h5_write_attr_f64(f, "layer_norm_epsilon", c->layer_norm_epsilon);
  if (rc) {
    rc = GJ_H5_FAIL("%s: cannot write attributes", w->out.tmp);
    H5Fclose(f);
    gj_outfile_abort(&w->out);
    return rc;
  }
  w->f = f;
  return 0;
}

int gj_ckpt_writer_tensor(gj_ckpt_writer *w, const char *name, const float *data, int ndim,
                          int64_t rows, int64_t cols) {
  char p[512];
  snprintf(p, sizeof p, "/model/%s", name);
  uint32_t c32 = gj_ckptshare_crc_bytes(data, (size_t)rows * cols * sizeof(float));
  int64_t dims[2] = {rows, cols};
  GJ_TRY(gj_h5_write_f32((hid_t)w->f, p, data, ndim, dims));
  hid_t d = H5Dopen2((hid_t)w->f, p, H5P_DEFAULT);
  hid_t as = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, "crc32", H5T_STD_U32LE, as, H5P_DEFAULT, H5P_DEFAULT);
  int rc = (a < 0 || H5Awrite(a, H5T_NATIVE_UINT32, &c32) < 0) ? GJ_H5_FAIL("%s: cannot write crc32 of %s", w->out.tmp, p) : 0;
  if (a >= 0) H5Aclose(a);
  H5Sclose(as), H5Dclose(d);
  return rc;
}

int gj_ckpt_writer_end(gj_ckpt_writer *w, int ok) {
  if (w->f < 0) return 0;
  int rc = H5Fclose((hid_t)w->f) < 0 && ok ? GJ_H5_FAIL("%s: cannot close (disk full?)", w->out.tmp) : 0;
  w->f = -1;
  if (ok && !rc) return gj_outfile_commit(&w->out);
  gj_outfile_abort(&w->out);
  return rc;
}

int gj_ckpt_read_tensor(const char *path, long long f, const gj_tensor *t, float *out) {
  char p[512];
  snprintf(p, sizeof p, "/model/%s", t->name);
  GJ_TRY(gj_h5_read_block_f32((hid_t)f, path, p, t->rows, t->cols, t->ndim, 0, 0, t->rows, t->cols, out));
  uint32_t want;
  hid_t d = H5Dopen2((hid_t)f, p, H5P_DEFAULT);
  hid_t a = H5Aexists(d, "crc32") > 0 ? H5Aopen(d, "crc32", H5P_DEFAULT) : -1;
  herr_t r = a >= 0 ? H5Aread(a, H5T_NATIVE_UINT32, &want) : -1;
  if (a >= 0) H5Aclose(a);
  H5Dclose(d);
  if (r < 0) return GJ_FAIL("%s: %s has no crc32 attribute", path, p);
  if (gj_ckptshare_crc_bytes(out, (size_t)t->rows * t->cols * sizeof(float)) != want) return GJ_FAIL("%s: %s is corrupted (CRC32 mismatch)", path, p);
  return 0;
}
