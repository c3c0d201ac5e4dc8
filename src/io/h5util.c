#include "io/h5util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

void gj_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

int gj_h5_open_read(const char *path, hid_t *file) {
  struct stat st;
  if (stat(path, &st)) return GJ_FAIL("%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return GJ_FAIL("%s: is a directory, expected an HDF5 file", path);
  FILE *f = fopen(path, "rb");
  if (!f) return GJ_FAIL("%s: %s", path, strerror(errno));
  fclose(f);
  gj_h5_quiet();
  if (H5Fis_hdf5(path) <= 0)
    return GJ_FAIL("%s: not an HDF5 file (or truncated)", path);
  *file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (*file < 0) return GJ_FAIL("%s: cannot open as HDF5 (truncated or corrupted?)", path);
  return 0;
}

int gj_h5_create(const char *path, hid_t *file) {
  gj_h5_quiet();
  *file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (*file < 0) return GJ_FAIL("%s: cannot create HDF5 file", path);
  return 0;
}

static int read_attr(hid_t obj, const char *fname, const char *name, hid_t memt, void *out) {
  if (H5Aexists(obj, name) <= 0) return GJ_FAIL("%s: missing attribute '%s'", fname, name);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return GJ_FAIL("%s: cannot open attribute '%s'", fname, name);
  hid_t sp = H5Aget_space(a);
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  H5Sclose(sp);
  H5T_class_t cls = H5Tget_class(H5Aget_type(a));
  herr_t rc = -1;
  if (n == 1 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) rc = H5Aread(a, memt, out);
  H5Aclose(a);
  if (rc < 0) return GJ_FAIL("%s: attribute '%s' is not a numeric scalar", fname, name);
  return 0;
}

int gj_h5_attr_i64(hid_t obj, const char *fname, const char *name, int64_t *out) {
  return read_attr(obj, fname, name, H5T_NATIVE_INT64, out);
}

int gj_h5_attr_f64(hid_t obj, const char *fname, const char *name, double *out) {
  return read_attr(obj, fname, name, H5T_NATIVE_DOUBLE, out);
}

int gj_h5_attr_str(hid_t obj, const char *fname, const char *name, char *out, size_t n) {
  if (H5Aexists(obj, name) <= 0) return GJ_FAIL("%s: missing attribute '%s'", fname, name);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t ft = H5Aget_type(a);
  int rc = 0;
  if (H5Tget_class(ft) != H5T_STRING || H5Tis_variable_str(ft) > 0) {
    rc = GJ_FAIL("%s: attribute '%s' is not a fixed-length string", fname, name);
  } else {
    size_t sz = H5Tget_size(ft);
    char *buf = calloc(sz + 1, 1);
    hid_t mt = H5Tcopy(ft);
    if (!buf || H5Aread(a, mt, buf) < 0) rc = GJ_FAIL("%s: cannot read attribute '%s'", fname, name);
    else snprintf(out, n, "%s", buf);
    H5Tclose(mt);
    free(buf);
  }
  H5Tclose(ft);
  H5Aclose(a);
  return rc;
}

static int write_attr(hid_t obj, const char *name, hid_t filet, hid_t memt, const void *v) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, filet, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, memt, v);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  if (rc < 0) return GJ_FAIL("cannot write attribute '%s'", name);
  return 0;
}

int gj_h5_write_attr_i64(hid_t obj, const char *name, int64_t v) {
  return write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

int gj_h5_write_attr_f64(hid_t obj, const char *name, double v) {
  return write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

int gj_h5_write_attr_str(hid_t obj, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(s) ? strlen(s) : 1);
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  int rc = write_attr(obj, name, t, t, s);
  H5Tclose(t);
  return rc;
}

static int open_dset(hid_t file, const char *fname, const char *path, hid_t *d) {
  *d = H5Dopen2(file, path, H5P_DEFAULT);
  if (*d < 0) return GJ_FAIL("%s: '%s' is not a dataset", fname, path);
  return 0;
}

static int path_exists(hid_t file, const char *path) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int e = H5Lexists(file, buf, H5P_DEFAULT) > 0;
    *p = '/';
    if (!e) return 0;
  }
  return H5Lexists(file, buf, H5P_DEFAULT) > 0;
}

int gj_h5_shape(hid_t file, const char *fname, const char *path, int *ndim, int64_t dims[4]) {
  if (!path_exists(file, path)) return GJ_FAIL("%s: missing dataset '%s'", fname, path);
  hid_t d = -1;
  GJ_TRY(open_dset(file, fname, path, &d));
  hid_t sp = H5Dget_space(d);
  int nd = H5Sget_simple_extent_ndims(sp);
  hsize_t hd[8] = {0};
  if (nd < 0 || nd > 4) {
    H5Sclose(sp), H5Dclose(d);
    return GJ_FAIL("%s: dataset '%s' has an unsupported rank", fname, path);
  }
  H5Sget_simple_extent_dims(sp, hd, NULL);
  for (int i = 0; i < nd; i++) dims[i] = (int64_t)hd[i];
  *ndim = nd;
  H5Sclose(sp), H5Dclose(d);
  return 0;
}

int gj_h5_read_block_f32(hid_t file, const char *fname, const char *path, int64_t rows,
                         int64_t cols, int ndim, int64_t row0, int64_t col0, int64_t nrows,
                         int64_t ncols, float *out) {
  int nd;
  int64_t dims[4];
  GJ_TRY(gj_h5_shape(file, fname, path, &nd, dims));
  int ok = nd == ndim && (nd == 0 || dims[0] == rows) && (nd < 2 || dims[1] == cols);
  if (!ok) {
    if (ndim == 2)
      return GJ_FAIL("%s: dataset '%s' should have shape [%lld, %lld]", fname, path,
                     (long long)rows, (long long)cols);
    return GJ_FAIL("%s: dataset '%s' should have shape [%lld]", fname, path, (long long)rows);
  }
  if (nd > 0 && (nrows == 0 || ncols == 0)) return 0;
  hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
  hid_t fs = H5Dget_space(d);
  hsize_t start[2] = {(hsize_t)row0, (hsize_t)col0}, count[2] = {(hsize_t)nrows, (hsize_t)ncols};
  if (nd > 0) H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  hsize_t mdims[2] = {(hsize_t)nrows, (hsize_t)ncols};
  hid_t ms = nd == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(nd, mdims, NULL);
  herr_t rc = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out);
  H5Sclose(ms), H5Sclose(fs), H5Dclose(d);
  if (rc < 0) return GJ_FAIL("%s: cannot read dataset '%s' (corrupted?)", fname, path);
  return 0;
}

static int read_all(hid_t file, const char *fname, const char *path, int64_t n, hid_t memt,
                    void *out) {
  int nd;
  int64_t dims[4], total = 1;
  GJ_TRY(gj_h5_shape(file, fname, path, &nd, dims));
  for (int i = 0; i < nd; i++) total *= dims[i];
  if (total != n)
    return GJ_FAIL("%s: dataset '%s' has %lld elements, expected %lld", fname, path,
                   (long long)total, (long long)n);
  hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
  herr_t rc = H5Dread(d, memt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
  H5Dclose(d);
  if (rc < 0) return GJ_FAIL("%s: cannot read dataset '%s' (corrupted?)", fname, path);
  return 0;
}

int gj_h5_read_i32(hid_t file, const char *fname, const char *path, int64_t n, int32_t *out) {
  return read_all(file, fname, path, n, H5T_NATIVE_INT32, out);
}

int gj_h5_read_f64(hid_t file, const char *fname, const char *path, int64_t n, double *out) {
  return read_all(file, fname, path, n, H5T_NATIVE_DOUBLE, out);
}

static int write_ds(hid_t file, const char *path, hid_t filet, hid_t memt, const void *data,
                    int ndim, const int64_t *dims) {
  hsize_t hd[4];
  for (int i = 0; i < ndim; i++) hd[i] = (hsize_t)dims[i];
  hid_t sp = ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(ndim, hd, NULL);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t d = H5Dcreate2(file, path, filet, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dwrite(d, memt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  if (d >= 0) H5Dclose(d);
  H5Pclose(lcpl), H5Sclose(sp);
  if (rc < 0) return GJ_FAIL("cannot write dataset '%s'", path);
  return 0;
}

int gj_h5_write_f32(hid_t file, const char *path, const float *data, int ndim,
                    const int64_t *dims) {
  return write_ds(file, path, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data, ndim, dims);
}

int gj_h5_write_i32(hid_t file, const char *path, const int32_t *data, int64_t n) {
  return write_ds(file, path, H5T_STD_I32LE, H5T_NATIVE_INT32, data, 1, &n);
}

int gj_h5_write_scalar_f64(hid_t file, const char *path, double v) {
  return write_ds(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, 0, NULL);
}
