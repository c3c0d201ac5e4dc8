#include "io/tokfile.h"

#include <errno.h>
#include <hdf5.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "io/dataset.h"
#include "io/h5util.h"
#include "io/tokenizer.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the parallel dataset writer stores native integers as U16LE/U64LE: little-endian hosts only"
#endif

/* A contiguous 1-D dataset of n elements, its storage allocated now and never filled (every
 * element is written by a rank afterwards). */
static hid_t contiguous(hid_t f, const char *name, hid_t type, uint64_t n) {
  hsize_t dims = n;
  hid_t sp = H5Screate_simple(1, &dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_obj_track_times(dcpl, 0);
  hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Sclose(sp), H5Pclose(dcpl);
  return d;
}

static int offset_of(hid_t d, uint64_t n, uint64_t *at) {
  haddr_t a = H5Dget_offset(d);
  if (n > 0 && a == HADDR_UNDEF) return -1;
  *at = n > 0 ? (uint64_t)a : 0;
  return 0;
}

int gj_tokfile_create(const char *path, uint64_t n_tokens, uint64_t n_docs, uint64_t n_bytes,
                      const char *source, int64_t vocab_size, uint64_t *tok_at, uint64_t *off_at) {
  gj_h5_quiet();
  /* No timestamps in object headers: the same input gives the same bytes. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_obj_track_times(fcpl, 0);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
  H5Pclose(fcpl), H5Pclose(fapl);
  if (f < 0) return GJ_H5_FAIL("%s: cannot create (directory missing or not writable?)", path);
  int rc = 0;
  hid_t dt = contiguous(f, "tokens", H5T_STD_U16LE, n_tokens);
  hid_t doff = contiguous(f, "doc_offsets", H5T_STD_U64LE, n_docs + 1);
  if (dt < 0 || doff < 0) rc = GJ_H5_FAIL("%s: cannot create /tokens and /doc_offsets (disk full?)", path);
  if (!rc && (offset_of(dt, n_tokens, tok_at) || offset_of(doff, n_docs + 1, off_at)))
    rc = GJ_H5_FAIL("%s: no file offset for /tokens or /doc_offsets", path);
  if (dt >= 0) H5Dclose(dt);
  if (doff >= 0) H5Dclose(doff);
  if (!rc) rc = gj_dataset_write_attrs(f, path, n_docs, n_tokens, n_bytes, source, vocab_size);
  if (H5Fclose(f) < 0 && !rc) rc = GJ_H5_FAIL("%s: cannot close (disk full?)", path);
  return rc;
}

int gj_tokfile_pwrite(int fd, const char *path, const void *buf, uint64_t n, uint64_t off) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = pwrite(fd, p, (size_t)(n < ((uint64_t)1 << 30) ? n : ((uint64_t)1 << 30)), (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return GJ_FAIL("%s: write error: %s", path, k < 0 ? strerror(errno) : "nothing written (disk full?)");
    p += k, n -= (uint64_t)k, off += (uint64_t)k;
  }
  return 0;
}
