#include "io/checkpoint.h"

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
#include "io/ckptattr.h"
#include "io/ckptshare.h"
#include "io/ckpttensor.h"
#include "io/h5util.h"
#include "model/gemm.h"
#include "parallel/gather.h"

_Static_assert(sizeof(hid_t) == sizeof(gj_ckpt_file), "gj_ckpt_file holds an hid_t");

/* The three blocks of a checkpoint and their HDF5 prefixes. */
static const char *const block_prefix[3] = {"/model/", "/optim/exp_avg/", "/optim/exp_avg_sq/"};

static void dset_path(char *p, size_t n, int block, const gj_tensor *t) {
  snprintf(p, n, "%s%s", block_prefix[block], t->name);
}

/* ---- Files ---------------------------------------------------------------------------- */

/* File access: MPI-IO over *comm (NULL: HDF5's serial default) and, for a file to create,
 * the HDF5 1.10 format (DESIGN.md §12: compressed collective writes need it). */
static hid_t file_access(const gj_comm *comm, int create) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && (!comm || H5Pset_fapl_mpio(fapl, *comm, gj_comm_info_none()) >= 0) &&
      (!create || H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0))
    return fapl;
  GJ_H5_FAIL("cannot set up the file access%s", comm ? " (MPI-IO)" : "");
  if (fapl >= 0) H5Pclose(fapl);
  return -1;
}

/* Open a checkpoint for reading: serial checks first (a readable HDF5 file of our format and
 * version), then, with comm, the collective open (all of comm agree on the outcome). */
static int open_checked(const char *path, hid_t *f, const gj_comm *comm) {
  hid_t s;
  int rc = gj_h5_open_read(path, &s);
  if (!rc) {
    gj_ckpt_attrs a;
    rc = gj_ckptattr_read(s, path, &a, GJ_CA_FORMAT);
    if (!rc && strcmp(a.format, GJ_CKPT_FORMAT)) rc = GJ_FAIL("%s: not a gptj-mpi checkpoint (format '%s')", path, a.format);
    if (!rc) rc = gj_ckptattr_read(s, path, &a, GJ_CA_VERSION);
    if (!rc && a.format_version != GJ_CKPT_VERSION)
      rc = GJ_FAIL("%s: checkpoint format_version %lld is not supported (expected %d)", path,
                   (long long)a.format_version, GJ_CKPT_VERSION);
    H5Fclose(s);
  }
  if (!comm) return rc ? rc : gj_h5_open_read(path, f);
  GJ_AGREE(*comm, rc);
  hid_t fapl = file_access(comm, 0);
  *f = fapl < 0 ? -1 : H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (fapl < 0) rc = gj_err_prefix(path);
  else if (*f < 0) rc = GJ_H5_FAIL("%s: cannot open (truncated or corrupted?)", path);
  if (fapl >= 0) H5Pclose(fapl);
  if ((rc = gj_agree(*comm, rc))) {
    if (*f >= 0) H5Fclose(*f);
    return rc;
  }
  return 0;
}

/* ---- Saving (collective) -------------------------------------------------------------- */

/* The directory of path ("." for a bare name). */
static void dir_of(const char *path, char *dir, size_t n) {
  snprintf(dir, n, "%s", path);
  char *sl = strrchr(dir, '/');
  if (sl) *sl = 0;
  else snprintf(dir, n, ".");
}

/* Room for the file first: HDF5 1.10 can hang in the collective close of a file whose write
 * failed for lack of space, so a full disk is refused before anything is written. */
static int check_room(const char *path, const gj_state *st, gj_grid *g) {
  int rc = 0;
  if (g->rank == 0) {
    char dir[GJ_PATH_BUF];
    dir_of(path, dir, sizeof dir);
    double need = 3.0 * (double)st->lay.n_global * sizeof(float) + (4 << 20);
    struct statvfs vfs;
    if (!statvfs(dir, &vfs)) {
      double avail = (double)vfs.f_bavail * vfs.f_frsize;
      if (avail < need)
        rc = GJ_FAIL("%s: %.0f MB free, the checkpoint needs %.0f MB (disk full?); the previous "
                     "checkpoint is kept", dir, avail / 1e6, need / 1e6);
    }
  }
  return gj_agree(g->world, rc);
}

/* Create tmp collectively (rank 0 registers it for removal by a second interrupt). */
static int create_file(const char *tmp, gj_grid *g, hid_t *f) {
  if (g->rank == 0) gj_tmp_register(tmp);
  hid_t fapl = file_access(&g->world, 1);
  *f = fapl < 0 ? -1 : H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  int rc = 0;
  if (fapl < 0) rc = gj_err_prefix(tmp);
  else if (*f < 0) rc = GJ_H5_FAIL("%s: cannot create checkpoint (directory missing or not writable?)", tmp);
  if (fapl >= 0) H5Pclose(fapl);
  if ((rc = gj_agree(g->world, rc)) && g->rank == 0) gj_tmp_unregister(tmp);
  return rc;
}

static int write_attrs(hid_t f, const char *tmp, const gj_state *st, gj_grid *g, const gj_ckpt_meta *meta) {
  gj_ckpt_attrs a = {.format = GJ_CKPT_FORMAT, .format_version = GJ_CKPT_VERSION, .meta = *meta,
                     .written_tp = g->tp_size, .written_dp = g->dp_size, .has_optim = 1, .c = st->c};
  snprintf(a.precision, sizeof a.precision, "%s", gj_precision_name(gj_gemm_precision()));
  return gj_ckptattr_write(f, &a, GJ_CA_ALL) ? gj_err_prefix(tmp) : 0;
}

/* Every tensor of the three blocks; failures agreed after each one. */
static int write_blocks(hid_t f, const char *tmp, gj_state *st, gj_grid *g, int compress) {
  hid_t dxpl = gj_ckpttensor_transfer(compress);
  int rc = gj_agree(g->world, dxpl < 0 ? gj_err_prefix(tmp) : 0);
  char p[512];
  float *blocks[3] = {st->params, st->m, st->v};
  int wfd = rc ? -1 : open(tmp, O_WRONLY); /* for writeback hints only */
  for (int b = 0; b < 3 && !rc; b++)
    for (int i = 0; i < st->lay.n && !rc; i++) {
      const gj_tensor *t = &st->lay.t[i];
      dset_path(p, sizeof p, b, t);
      if (b && st->zero)
        rc = gj_ckpttensor_write_owned(f, wfd, p, st, g, t, blocks[b], compress, dxpl);
      else if (!b && st->params16) /* exact only in each owner's range (gj_dp_gather16) */
        rc = gj_ckpttensor_write_owned(f, wfd, p, st, g, t, st->params + st->lo, compress, dxpl);
      else
        rc = gj_ckpttensor_write(f, wfd, p, g, t, blocks[b] + t->offset - (b ? st->lo : 0), compress, dxpl);
      /* A failed write (a full disk) may show on some ranks only: agree before the next
       * collective call, or the others would wait in it for ever. */
      rc = gj_agree(g->world, rc);
    }
  if (wfd >= 0) close(wfd);
  if (dxpl >= 0) H5Pclose(dxpl);
  return rc;
}

/* Close, then every rank syncs the file (on a network file system, each node's writes reach the
 * server, and fail, at its own sync), and only when all agree rank 0 renames it into place and
 * syncs the directory. */
static int commit(hid_t f, const char *tmp, const char *path, gj_grid *g) {
  int rc = gj_agree(g->world, H5Fclose(f) < 0 ? GJ_H5_FAIL("%s: cannot close (disk full?)", tmp) : 0);
  if (!rc) {
    int fd = open(tmp, O_RDONLY);
    if (fd < 0 || fsync(fd)) rc = GJ_FAIL("%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    rc = gj_agree(g->world, rc);
  }
  if (g->rank == 0 && !rc) {
    if (rename(tmp, path)) rc = GJ_FAIL("%s: rename failed: %s", path, strerror(errno));
    char dir[GJ_PATH_BUF];
    dir_of(path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) fsync(dfd), close(dfd);
  }
  rc = gj_agree(g->world, rc);
  if (rc && g->rank == 0) unlink(tmp);
  if (g->rank == 0) gj_tmp_unregister(tmp);
  return rc;
}

int gj_ckpt_save(const char *path, gj_state *st, gj_grid *g, const gj_ckpt_meta *meta, int compress) {
  char tmp[GJ_PATH_BUF + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path); /* one name for every rank; the run's lock makes it ours */
  gj_h5_quiet();
  GJ_TRY(check_room(path, st, g));
  hid_t f;
  GJ_TRY(create_file(tmp, g, &f));
  int rc = gj_agree(g->world, write_attrs(f, tmp, st, g, meta));
  if (!rc) rc = write_blocks(f, tmp, st, g, compress);
  if (rc) {
    /* A write failed on some rank (all agree by now). Closing would be collective and can
     * hang in HDF5 1.10 after a failed write: leave the handle (main turns off HDF5's
     * close-at-exit), remove the temporary file and report. */
    if (g->rank == 0) unlink(tmp), gj_tmp_unregister(tmp);
    return rc;
  }
  return commit(f, tmp, path, g);
}

/* ---- Loading (collective) ------------------------------------------------------------- */

/* updates as read (-1: the attribute is missing, in a file written before skipped steps were
 * counted, which had none): at most step. */
static int check_updates(const char *path, gj_ckpt_meta *meta) {
  if (meta->updates < 0) meta->updates = meta->step;
  if (meta->updates > meta->step)
    return GJ_FAIL("%s: updates = %lld is above step = %lld (a step applies one update at most)", path,
                   (long long)meta->updates, (long long)meta->step);
  return 0;
}

/* Every attribute, checked before any tensor: the config against the run's (a mismatch names
 * the key), then the counters and, with the optimizer, /optim and /loader. */
static int read_attrs(hid_t f, const char *path, const gj_state *st, gj_ckpt_meta *meta, int with_optim,
                      int *has_optim) {
  gj_ckpt_attrs a = {.meta = *meta, .has_optim = 1, .c = st->c};
  GJ_TRY(gj_ckptattr_check(f, path, &a, GJ_CA_CONFIG));
  GJ_TRY(gj_ckptattr_read(f, path, &a, GJ_CA_HAS_OPTIM));
  int optim = with_optim && a.has_optim;
  a.meta.updates = -1;
  GJ_TRY(gj_ckptattr_read(f, path, &a, GJ_CA_STATE | (optim ? GJ_CA_OPTIM | GJ_CA_LOADER : 0)));
  GJ_TRY(check_updates(path, &a.meta));
  if (optim) a.meta.sched.lr = a.meta.hp.lr;
  *meta = a.meta;
  *has_optim = (int)a.has_optim;
  return 0;
}

/* The tensors of the first nb blocks (parameters, then the moments). Every rank reads (and
 * checks) every tensor; collectives inside stay in step because a failure is agreed on before
 * the next tensor. The next tensor is prefetched meanwhile. */
static int load_blocks(hid_t f, const char *path, gj_state *st, gj_grid *g, int nb) {
  float *blocks[3] = {st->params, st->m, st->v}, *stage = NULL;
  if (st->zero && nb > 1) { /* a whole local slice of moments, of which this rank keeps its part */
    size_t mx = 0;
    for (int i = 0; i < st->lay.n; i++) mx = GJ_MAX(mx, st->lay.t[i].numel);
    stage = malloc(mx * sizeof(float));
  }
  int rc = gj_agree(g->world, st->zero && nb > 1 && !stage ? GJ_FAIL("out of memory staging moments") : 0);
  if (rc) return free(stage), rc;
  char p[512];
  int nt = nb * st->lay.n, n = st->lay.n;
  int fd = open(path, O_RDONLY);
  for (int k = 0; k < nt && !rc; k++) {
    for (int j = k ? k + 1 : 0; j <= k + 1 && j < nt; j++) {
      dset_path(p, sizeof p, j / n, &st->lay.t[j % n]);
      gj_ckpttensor_prefetch(f, fd, p, g, &st->lay.t[j % n]);
    }
    int b = k / n;
    const gj_tensor *t = &st->lay.t[k % n];
    float *local = b && st->zero ? stage : blocks[b] + t->offset - (b ? st->lo : 0);
    dset_path(p, sizeof p, b, t);
    if (b == 0 && st->w16 && gj_tensor_resident16(t)) /* bf16-resident: rounded as read */
      rc = gj_ckpttensor_load_bf16(f, path, p, g, t, st->w16 + t->offset);
    else
      rc = gj_ckpttensor_load(f, path, p, g, t, local);
    if (!rc && b && st->zero) gj_ckptshare_keep_owned(st, t, stage, blocks[b]);
  }
  if (fd >= 0) close(fd);
  free(stage);
  return rc;
}

int gj_ckpt_load(const char *path, gj_state *st, gj_grid *g, gj_ckpt_meta *meta, int with_optim) {
  gj_h5_quiet();
  hid_t f;
  GJ_TRY(open_checked(path, &f, &g->world));
  gj_ckpt_meta got = *meta;
  int has_optim = 1;
  int rc = gj_agree(g->world, read_attrs(f, path, st, &got, with_optim, &has_optim));
  if (rc) return H5Fclose(f), rc;
  *meta = got;
  meta->has_optim = with_optim && has_optim;
  if (!has_optim && with_optim) {
    /* a model-only checkpoint (from gptj convert): fresh optimizer, schedule and data order */
    with_optim = 0;
    memset(st->m, 0, st->n * sizeof(float));
    memset(st->v, 0, st->n * sizeof(float));
    meta->loader = (gj_loader_state){.seed = meta->loader.seed};
    gj_info("%s holds weights only: the optimizer starts afresh", path);
  }
  if (!has_optim) meta->step = meta->updates = meta->tokens_seen = 0;
  rc = load_blocks(f, path, st, g, with_optim ? 3 : 1);
  H5Fclose(f);
  return gj_agree(g->world, rc);
}

/* ---- Serial access -------------------------------------------------------------------- */

/* The model config of an open checkpoint, validated (the bounds of gj_config_validate keep
 * every size computed from it from overflowing). */
static int read_config(hid_t f, const char *path, gj_ckpt_attrs *a, int mask) {
  GJ_TRY(gj_ckptattr_read(f, path, a, mask | GJ_CA_CONFIG));
  if (gj_config_validate(&a->c)) return gj_err_prefix(path);
  return 0;
}

int gj_ckpt_read_config(const char *path, gj_config *c) {
  hid_t f;
  GJ_TRY(open_checked(path, &f, NULL));
  gj_ckpt_attrs a;
  int rc = read_config(f, path, &a, 0);
  H5Fclose(f);
  if (!rc) *c = a.c;
  return rc;
}

int gj_ckpt_info(const char *path) {
  hid_t f;
  GJ_TRY(open_checked(path, &f, NULL));
  gj_ckpt_attrs a = {.precision = "fp32 (not recorded)", .has_optim = 1, .meta.updates = -1};
  int rc = read_config(f, path, &a, GJ_CA_ROOT & ~GJ_CA_HAS_OPTIM);
  /* the data order, in a file with the optimizer state (not one of gptj convert) */
  if (!rc) rc = gj_ckptattr_read(f, path, &a, GJ_CA_HAS_OPTIM);
  if (!rc && a.has_optim) rc = gj_ckptattr_read(f, path, &a, GJ_CA_LOADER);
  H5Fclose(f);
  if (!rc) rc = check_updates(path, &a.meta);
  if (rc) return rc;
  struct stat s;
  stat(path, &s);
  printf("file: %s\nformat: %s version %lld\n", path, a.format, (long long)a.format_version);
  gj_ckptattr_print(&a, GJ_CA_STATE);
  printf("written from: dp %lld x tp %lld, precision %s (weights float32)\n", (long long)a.written_dp,
         (long long)a.written_tp, a.precision);
  gj_ckptattr_print(&a, GJ_CA_CONFIG);
  printf("parameters: %lld\nfile size: %lld bytes\n", (long long)gj_config_n_params(&a.c), (long long)s.st_size);
  if (a.has_optim) gj_ckptattr_print(&a, GJ_CA_LOADER);
  return 0;
}

int gj_ckpt_writer_begin(gj_ckpt_writer *w, const char *path, const gj_config *c) {
  memset(w, 0, sizeof *w);
  w->f = -1;
  GJ_TRY(gj_outfile_begin(&w->out, path));
  gj_h5_quiet();
  hid_t fapl = file_access(NULL, 1);
  hid_t f = fapl < 0 ? -1 : H5Fcreate(w->out.tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  int rc = 0;
  if (fapl < 0) rc = gj_err_prefix(w->out.tmp);
  else if (f < 0) rc = GJ_H5_FAIL("%s: cannot create (directory missing or not writable?)", w->out.tmp);
  if (fapl >= 0) H5Pclose(fapl);
  /* a model-only file: no precision, no /optim or /loader, has_optim 0 */
  gj_ckpt_attrs a = {.format = GJ_CKPT_FORMAT, .format_version = GJ_CKPT_VERSION, .written_tp = 1,
                     .written_dp = 1, .has_optim = 0, .c = *c};
  if (!rc && gj_ckptattr_write(f, &a, GJ_CA_ROOT)) rc = gj_err_prefix(w->out.tmp);
  if (rc) {
    if (f >= 0) H5Fclose(f);
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
  uint32_t crc = gj_ckptshare_crc_bytes(data, (size_t)rows * cols * sizeof(float));
  int64_t dims[2] = {rows, cols};
  if (gj_h5_write_f32((hid_t)w->f, p, data, ndim, dims)) return gj_err_prefix(w->out.tmp);
  hid_t d = H5Dopen2((hid_t)w->f, p, H5P_DEFAULT);
  if (d < 0) return GJ_H5_FAIL("%s: cannot reopen %s", w->out.tmp, p);
  int rc = gj_ckpttensor_write_crc(d, p, crc) ? gj_err_prefix(w->out.tmp) : 0;
  H5Dclose(d);
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

int gj_ckpt_reader_open(gj_ckpt_reader *r, const char *path) {
  hid_t f;
  r->f = -1;
  snprintf(r->path, sizeof r->path, "%s", path);
  GJ_TRY(open_checked(path, &f, NULL));
  r->f = f;
  return 0;
}

int gj_ckpt_reader_tensor(gj_ckpt_reader *r, const gj_tensor *t, float *out) {
  char p[512];
  snprintf(p, sizeof p, "/model/%s", t->name);
  GJ_TRY(gj_h5_read_block_f32((hid_t)r->f, r->path, p, t->rows, t->cols, t->ndim, 0, 0, t->rows, t->cols, out));
  uint32_t want;
  hid_t d = H5Dopen2((hid_t)r->f, p, H5P_DEFAULT);
  int e = gj_ckpttensor_read_crc(d, &want);
  if (d >= 0) H5Dclose(d);
  if (e < 0) return GJ_FAIL("%s: %s has no crc32 attribute, or not one unsigned 32-bit integer", r->path, p);
  if (gj_ckptshare_crc_bytes(out, (size_t)t->rows * t->cols * sizeof(float)) != want)
    return GJ_FAIL("%s: %s is corrupted (CRC32 mismatch)", r->path, p);
  return 0;
}

void gj_ckpt_reader_close(gj_ckpt_reader *r) {
  if (r->f > 0) H5Fclose((hid_t)r->f);
  r->f = -1;
}
