#include "io/h5util.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "io/outfile.h"

void gj_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

void gj_h5_at_start(void) { H5dont_atexit(); }

/* The innermost entry of the error stack (the walk upward starts there). */
static herr_t innermost(unsigned n, const H5E_error2_t *e, void *ctx) {
  char *out = ctx;
  if (n > 0) return 0;
  char minor[160] = "";
  if (H5Eget_msg(e->min_num, NULL, minor, sizeof minor) < 0) minor[0] = 0;
  snprintf(out, 320, "%s%s%s", minor, *minor && e->desc && *e->desc ? ": " : "", e->desc ? e->desc : "");
  return 0;
}

int gj_h5_fail_at(const char *file, int line, const char *fmt, ...) {
  char msg[GJ_ERRMSG_MAX], why[320] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, why);
  H5Eclear2(H5E_DEFAULT);
  for (char *p = why; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  if (*why) return gj_fail_at(file, line, "%s (HDF5: %s)", msg, why);
  return gj_fail_at(file, line, "%s", msg);
}

int gj_h5_open_read(const char *path, hid_t *file) {
  /* a regular file: HDF5 seeks, and a FIFO would block the open */
  GJ_TRY(gj_outfile_check_input(path, NULL, GJ_IN_SEEK));
  FILE *f = fopen(path, "rb");
  if (!f) return GJ_FAIL("%s: %s", path, strerror(errno));
  fclose(f);
  gj_h5_quiet();
  if (H5Fis_hdf5(path) <= 0)
    return GJ_H5_FAIL("%s: not an HDF5 file (or truncated)", path);
  *file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (*file < 0) return GJ_H5_FAIL("%s: cannot open as HDF5 (truncated or corrupted?)", path);
  return 0;
}

int gj_h5_create(const char *path, hid_t *file) {
  gj_h5_quiet();
  *file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (*file < 0) return GJ_H5_FAIL("%s: cannot create HDF5 file", path);
  return 0;
}

/* "name", or "group/name" for an attribute of a group other than the root (/optim/lr is
 * "optim/lr"), for messages. */
static void attr_label(hid_t obj, const char *name, char *out, size_t n) {
  char g[256] = "";
  if (H5Iget_type(obj) != H5I_FILE && H5Iget_name(obj, g, sizeof g) > 0 && strcmp(g, "/"))
    snprintf(out, n, "%s/%s", g[0] == '/' ? g + 1 : g, name);
  else
    snprintf(out, n, "%s", name);
}

/* An attribute opened for reading, and its label for messages. */
typedef struct {
  hid_t a, type; /* the attribute and its file type */
  hssize_t n;    /* elements */
  char lab[320];
} attr_rd;

static void attr_close(attr_rd *r) {
  if (r->type >= 0) H5Tclose(r->type);
  if (r->a >= 0) H5Aclose(r->a);
}

/* The lines every reader starts with: the attribute exists, opens, and has a type and size. */
static int attr_open(hid_t obj, const char *fname, const char *name, attr_rd *r) {
  r->a = r->type = -1;
  attr_label(obj, name, r->lab, sizeof r->lab);
  htri_t ex = H5Aexists(obj, name);
  if (ex < 0) return GJ_H5_FAIL("%s: cannot look up attribute '%s' (corrupted?)", fname, r->lab);
  if (ex == 0) return GJ_FAIL("%s: missing attribute '%s'", fname, r->lab);
  r->a = H5Aopen(obj, name, H5P_DEFAULT);
  if (r->a < 0) return GJ_H5_FAIL("%s: cannot open attribute '%s' (corrupted?)", fname, r->lab);
  hid_t sp = H5Aget_space(r->a);
  r->n = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
  if (sp >= 0) H5Sclose(sp);
  r->type = H5Aget_type(r->a);
  return 0;
}

/* A numeric scalar attribute: one element of integer or floating-point class. */
static int num_open(hid_t obj, const char *fname, const char *name, attr_rd *r, H5T_class_t *cls) {
  GJ_TRY(attr_open(obj, fname, name, r));
  *cls = r->type < 0 ? H5T_NO_CLASS : H5Tget_class(r->type);
  if (r->n == 1 && (*cls == H5T_INTEGER || *cls == H5T_FLOAT)) return 0;
  attr_close(r);
  return GJ_FAIL("%s: attribute '%s' is not a numeric scalar", fname, r->lab);
}

static int read_i64(const attr_rd *r, H5T_class_t cls, const char *fname, int64_t *out) {
  const char *lab = r->lab;
  if (cls == H5T_FLOAT) {
    /* a float holding an integer is accepted; a fraction, infinity or NaN is not */
    double v;
    if (H5Aread(r->a, H5T_NATIVE_DOUBLE, &v) < 0) return GJ_H5_FAIL("%s: cannot read attribute '%s' (corrupted?)", fname, lab);
    if (!isfinite(v) || v < -9223372036854775808.0 || v >= 9223372036854775808.0)
      return GJ_FAIL("%s: attribute '%s' = %g is not an integer in the int64 range", fname, lab, v);
    if (v != floor(v)) return GJ_FAIL("%s: attribute '%s' = %.17g is not an integer", fname, lab, v);
    *out = (int64_t)v;
    return 0;
  }
  /* read in the widest type of the same sign: every stored value is exact */
  size_t sz = H5Tget_size(r->type);
  H5T_sign_t sg = H5Tget_sign(r->type);
  if (sz == 0 || sz > 8 || sg == H5T_SGN_ERROR)
    return GJ_FAIL("%s: attribute '%s' is a %zu-byte integer (at most 8 bytes)", fname, lab, sz);
  if (sg == H5T_SGN_NONE) {
    uint64_t u;
    if (H5Aread(r->a, H5T_NATIVE_UINT64, &u) < 0) return GJ_H5_FAIL("%s: cannot read attribute '%s' (corrupted?)", fname, lab);
    if (u > (uint64_t)INT64_MAX)
      return GJ_FAIL("%s: attribute '%s' = %llu is out of the int64 range", fname, lab, (unsigned long long)u);
    *out = (int64_t)u;
    return 0;
  }
  if (H5Aread(r->a, H5T_NATIVE_INT64, out) < 0) return GJ_H5_FAIL("%s: cannot read attribute '%s' (corrupted?)", fname, lab);
  return 0;
}

static int read_f64(const attr_rd *r, H5T_class_t cls, const char *fname, double *out) {
  double v;
  if (cls == H5T_INTEGER && H5Tget_size(r->type) > 8)
    return GJ_FAIL("%s: attribute '%s' is a %zu-byte integer (at most 8 bytes)", fname, r->lab, H5Tget_size(r->type));
  if (H5Aread(r->a, H5T_NATIVE_DOUBLE, &v) < 0) return GJ_H5_FAIL("%s: cannot read attribute '%s' (corrupted?)", fname, r->lab);
  if (!isfinite(v)) return GJ_FAIL("%s: attribute '%s' = %g is not a finite number", fname, r->lab, v);
  *out = v;
  return 0;
}

/* The unranged readers are the ranged ones over every value their type can hold. */
int gj_h5_attr_i64(hid_t obj, const char *fname, const char *name, int64_t *out) {
  return gj_h5_attr_i64_in(obj, fname, name, INT64_MIN, INT64_MAX, out);
}

int gj_h5_attr_f64(hid_t obj, const char *fname, const char *name, double *out) {
  return gj_h5_attr_f64_in(obj, fname, name, -HUGE_VAL, HUGE_VAL, 0, out); /* read_f64 refuses inf */
}

int gj_h5_attr_i64_in(hid_t obj, const char *fname, const char *name, int64_t lo, int64_t hi,
                      int64_t *out) {
  attr_rd r;
  H5T_class_t cls;
  GJ_TRY(num_open(obj, fname, name, &r, &cls));
  int64_t v = 0;
  int rc = read_i64(&r, cls, fname, &v);
  if (!rc && (v < lo || v > hi))
    rc = GJ_FAIL("%s: attribute '%s' = %lld is out of range [%lld, %lld]", fname, r.lab, (long long)v,
                 (long long)lo, (long long)hi);
  attr_close(&r);
  if (!rc) *out = v;
  return rc;
}

int gj_h5_attr_f64_in(hid_t obj, const char *fname, const char *name, double lo, double hi,
                      int open, double *out) {
  attr_rd r;
  H5T_class_t cls;
  GJ_TRY(num_open(obj, fname, name, &r, &cls));
  double v = 0;
  int rc = read_f64(&r, cls, fname, &v);
  int lo_open = open & GJ_H5_LO_OPEN, hi_open = open & GJ_H5_HI_OPEN;
  if (!rc && ((lo_open ? !(v > lo) : !(v >= lo)) || (hi_open ? !(v < hi) : !(v <= hi))))
    rc = GJ_FAIL("%s: attribute '%s' = %g is out of range %c%g, %g%c", fname, r.lab, v,
                 lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
  attr_close(&r);
  if (!rc) *out = v;
  return rc;
}

int gj_h5_attr_str(hid_t obj, const char *fname, const char *name, char *out, size_t n) {
  attr_rd r;
  GJ_TRY(attr_open(obj, fname, name, &r));
  const char *lab = r.lab;
  int rc = 0;
  if (r.type < 0 || H5Tget_class(r.type) != H5T_STRING || H5Tis_variable_str(r.type) != 0 || r.n != 1) {
    rc = GJ_FAIL("%s: attribute '%s' is not a fixed-length string", fname, lab);
  } else {
    size_t sz = H5Tget_size(r.type);
    char *buf = sz && sz <= 65536 ? calloc(sz + 1, 1) : NULL;
    hid_t mt = H5Tcopy(r.type);
    if (!sz || sz > 65536) rc = GJ_FAIL("%s: attribute '%s' is a string of %zu bytes (at most 65536)", fname, lab, sz);
    else if (!buf || mt < 0 || H5Aread(r.a, mt, buf) < 0) rc = GJ_H5_FAIL("%s: cannot read attribute '%s'", fname, lab);
    else snprintf(out, n, "%s", buf);
    if (mt >= 0) H5Tclose(mt);
    free(buf);
  }
  attr_close(&r);
  return rc;
}

static int write_attr(hid_t obj, const char *name, hid_t filet, hid_t memt, const void *v) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0)
    return GJ_H5_FAIL("cannot replace attribute '%s'", name);
  hid_t sp = H5Screate(H5S_SCALAR);
  if (sp < 0) return GJ_H5_FAIL("cannot write attribute '%s': no dataspace", name);
  hid_t a = H5Acreate2(obj, name, filet, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, memt, v);
  if (a >= 0 && H5Aclose(a) < 0) rc = -1;
  H5Sclose(sp);
  if (rc < 0) return GJ_H5_FAIL("cannot write attribute '%s'", name);
  return 0;
}

int gj_h5_write_attr_i64(hid_t obj, const char *name, int64_t v) {
  return write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

int gj_h5_write_attr_u32(hid_t obj, const char *name, uint32_t v) {
  return write_attr(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v);
}

int gj_h5_write_attr_f64(hid_t obj, const char *name, double v) {
  return write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

int gj_h5_write_attr_str(hid_t obj, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0 || H5Tset_size(t, strlen(s) ? strlen(s) : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0) {
    if (t >= 0) H5Tclose(t);
    return GJ_H5_FAIL("cannot write attribute '%s': no string type", name);
  }
  int rc = write_attr(obj, name, t, t, s);
  H5Tclose(t);
  return rc;
}

hid_t gj_h5_lcpl_parents(void) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  if (lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0) return lcpl;
  if (lcpl >= 0) H5Pclose(lcpl);
  GJ_H5_FAIL("cannot set up a link creation property list");
  return -1;
}

/* The data of a dataset lives in this file: no external storage (raw data in other files)
 * and no virtual layout (data of other datasets, maybe other files). */
static int check_storage(hid_t d, const char *fname, const char *path) {
  hid_t dcpl = H5Dget_create_plist(d);
  if (dcpl < 0) return GJ_H5_FAIL("%s: cannot read the layout of '%s'", fname, path);
  int ext = H5Pget_external_count(dcpl);
  H5D_layout_t lay = H5Pget_layout(dcpl);
  H5Pclose(dcpl);
  if (ext < 0 || lay < 0) return GJ_H5_FAIL("%s: cannot read the layout of '%s'", fname, path);
  if (ext != 0 || lay == H5D_VIRTUAL)
    return GJ_FAIL("%s: dataset '%s' keeps its data %s: gptj reads only data stored in the file", fname, path,
                   lay == H5D_VIRTUAL ? "in other datasets (virtual)" : "in external files");
  return 0;
}

static int open_dset(hid_t file, const char *fname, const char *path, hid_t *d) {
  *d = H5Dopen2(file, path, H5P_DEFAULT);
  if (*d < 0) return GJ_FAIL("%s: '%s' is not a dataset", fname, path);
  int rc = check_storage(*d, fname, path);
  if (rc) H5Dclose(*d), *d = -1;
  return rc;
}

/* 1 if every component of path exists as a hard link (0 if one is missing); -1 with an error
 * for a soft or external link (which could lead to any file, a FIFO among them). */
static int path_exists(hid_t file, const char *fname, const char *path) {
  char buf[GJ_PATH_BUF];
  if (strlen(path) >= sizeof buf) return 0;
  snprintf(buf, sizeof buf, "%s", path);
  size_t n = strlen(buf);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    if (H5Lexists(file, buf, H5P_DEFAULT) <= 0) return 0;
    H5L_info_t li;
    if (H5Lget_info(file, buf, &li, H5P_DEFAULT) < 0) return GJ_H5_FAIL("%s: cannot read the link '%s'", fname, buf);
    if (li.type != H5L_TYPE_HARD)
      return GJ_FAIL("%s: '%s' is %s link: gptj reads only objects inside the file", fname, buf,
                     li.type == H5L_TYPE_EXTERNAL ? "an external" : "a soft");
    buf[i] = c;
  }
  return 1;
}

int gj_h5_plain_dataset(hid_t file, const char *fname, const char *path) {
  int e = path_exists(file, fname, path);
  if (e < 0) return -1;
  if (!e) return GJ_FAIL("%s: missing dataset '%s'", fname, path);
  hid_t d;
  GJ_TRY(open_dset(file, fname, path, &d));
  H5Dclose(d);
  return 0;
}

/* The shape of an open dataset (rank <= 4, each dimension < 2^62). */
static int dset_shape(hid_t d, const char *fname, const char *path, int *ndim, int64_t dims[4]) {
  hid_t sp = H5Dget_space(d);
  int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
  hsize_t hd[4] = {0};
  int rc = 0;
  if (nd < 0 || nd > 4) rc = GJ_FAIL("%s: dataset '%s' has an unsupported rank", fname, path);
  else if (H5Sget_simple_extent_dims(sp, hd, NULL) < 0) rc = GJ_H5_FAIL("%s: cannot read the shape of dataset '%s'", fname, path);
  for (int i = 0; !rc && i < nd; i++) {
    if (hd[i] >= (hsize_t)1 << 62)
      rc = GJ_FAIL("%s: dataset '%s' has a dimension of %llu", fname, path, (unsigned long long)hd[i]);
    dims[i] = (int64_t)hd[i];
  }
  if (!rc) *ndim = nd;
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

int gj_h5_shape(hid_t file, const char *fname, const char *path, int *ndim, int64_t dims[4]) {
  int ex = path_exists(file, fname, path);
  if (ex <= 0) return ex < 0 ? -1 : GJ_FAIL("%s: missing dataset '%s'", fname, path);
  hid_t d = -1;
  GJ_TRY(open_dset(file, fname, path, &d));
  int rc = dset_shape(d, fname, path, ndim, dims);
  H5Dclose(d);
  return rc;
}

const char *gj_h5_type_name(hid_t t, char *out, size_t n) {
  H5T_class_t cls = H5Tget_class(t);
  size_t sz = H5Tget_size(t);
  if (cls == H5T_INTEGER)
    snprintf(out, n, "%s%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int", 8 * sz);
  else if (cls == H5T_FLOAT) snprintf(out, n, "float%zu", 8 * sz);
  else if (cls == H5T_STRING) snprintf(out, n, "string");
  else if (cls == H5T_ENUM) snprintf(out, n, "enum (bool?)");
  else if (cls == H5T_COMPOUND) snprintf(out, n, "compound");
  else snprintf(out, n, "type class %d", (int)cls);
  return out;
}

/* Opens path and checks that its element type is of class want (H5T_INTEGER or H5T_FLOAT;
 * what: how to say it in the message). */
static int open_typed(hid_t file, const char *fname, const char *path, H5T_class_t want,
                      const char *what, hid_t *d) {
  int ex = path_exists(file, fname, path);
  if (ex <= 0) return ex < 0 ? -1 : GJ_FAIL("%s: missing dataset '%s'", fname, path);
  GJ_TRY(open_dset(file, fname, path, d));
  hid_t t = H5Dget_type(*d);
  if (t >= 0 && H5Tget_class(t) == want && H5Tget_size(t) <= 8) {
    H5Tclose(t);
    return 0;
  }
  char tn[64] = "unreadable";
  if (t >= 0) gj_h5_type_name(t, tn, sizeof tn), H5Tclose(t);
  H5Dclose(*d);
  *d = -1;
  return GJ_FAIL("%s: dataset '%s' is %s, expected %s", fname, path, tn, what);
}

int gj_h5_read_block_f32(hid_t file, const char *fname, const char *path, int64_t rows,
                         int64_t cols, int ndim, int64_t row0, int64_t col0, int64_t nrows,
                         int64_t ncols, float *out) {
  if (row0 < 0 || col0 < 0 || nrows < 0 || ncols < 0 || row0 + nrows > rows || col0 + ncols > cols)
    return GJ_FAIL("internal: block [%lld+%lld, %lld+%lld] of %s outside [%lld, %lld]", (long long)row0,
                   (long long)nrows, (long long)col0, (long long)ncols, path, (long long)rows, (long long)cols);
  hid_t d;
  /* an integer dataset would be converted silently: it is not a float tensor */
  GJ_TRY(open_typed(file, fname, path, H5T_FLOAT, "floating point (float32)", &d));
  int nd;
  int64_t dims[4];
  int rc = dset_shape(d, fname, path, &nd, dims);
  int ok = !rc && nd == ndim && (nd == 0 || dims[0] == rows) && (nd < 2 || dims[1] == cols);
  if (!rc && !ok) {
    if (ndim == 2)
      rc = GJ_FAIL("%s: dataset '%s' should have shape [%lld, %lld]", fname, path,
                   (long long)rows, (long long)cols);
    else
      rc = GJ_FAIL("%s: dataset '%s' should have shape [%lld]", fname, path, (long long)rows);
  }
  if (rc || (nd > 0 && (nrows == 0 || ncols == 0))) return H5Dclose(d), rc;
  hid_t fs = H5Dget_space(d);
  hsize_t start[2] = {(hsize_t)row0, (hsize_t)col0}, count[2] = {(hsize_t)nrows, (hsize_t)ncols};
  hsize_t mdims[2] = {(hsize_t)nrows, (hsize_t)ncols};
  hid_t ms = nd == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(nd, mdims, NULL);
  herr_t r = fs < 0 || ms < 0 ? -1 : 0;
  if (!r && nd > 0) r = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (!r) r = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out);
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  H5Dclose(d);
  if (r < 0) return GJ_H5_FAIL("%s: cannot read dataset '%s' (corrupted?)", fname, path);
  return 0;
}

static int read_all(hid_t file, const char *fname, const char *path, int64_t n, hid_t memt,
                    H5T_class_t cls, const char *what, void *out) {
  hid_t d;
  GJ_TRY(open_typed(file, fname, path, cls, what, &d));
  int nd;
  int64_t dims[4];
  size_t total = 1;
  int rc = dset_shape(d, fname, path, &nd, dims);
  for (int i = 0; !rc && i < nd; i++)
    if (gj_mul_size(&total, total, (size_t)dims[i])) rc = GJ_FAIL("%s: dataset '%s' is too large", fname, path);
  if (!rc && (n < 0 || total != (size_t)n))
    rc = GJ_FAIL("%s: dataset '%s' has %zu elements, expected %lld", fname, path, total, (long long)n);
  if (!rc && H5Dread(d, memt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    rc = GJ_H5_FAIL("%s: cannot read dataset '%s' (corrupted?)", fname, path);
  H5Dclose(d);
  return rc;
}

int gj_h5_read_i32(hid_t file, const char *fname, const char *path, int64_t n, int32_t *out) {
  /* integer datasets only; wider values than int32 would be clamped by the conversion */
  hid_t d;
  GJ_TRY(open_typed(file, fname, path, H5T_INTEGER, "an integer type", &d));
  hid_t t = H5Dget_type(d);
  size_t sz = t < 0 ? 0 : H5Tget_size(t);
  int uns = t >= 0 && H5Tget_sign(t) == H5T_SGN_NONE;
  char tn[64] = "unreadable";
  if (t >= 0) gj_h5_type_name(t, tn, sizeof tn), H5Tclose(t);
  H5Dclose(d);
  if (sz == 0 || sz > 4 || (uns && sz == 4))
    return GJ_FAIL("%s: dataset '%s' is %s, expected an integer type within int32", fname, path, tn);
  return read_all(file, fname, path, n, H5T_NATIVE_INT32, H5T_INTEGER, "an integer type", out);
}

int gj_h5_read_f64(hid_t file, const char *fname, const char *path, int64_t n, double *out) {
  return read_all(file, fname, path, n, H5T_NATIVE_DOUBLE, H5T_FLOAT, "floating point", out);
}

static int write_ds(hid_t file, const char *path, hid_t filet, hid_t memt, const void *data,
                    int ndim, const int64_t *dims) {
  hsize_t hd[4];
  for (int i = 0; i < ndim; i++) hd[i] = (hsize_t)dims[i];
  hid_t sp = ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(ndim, hd, NULL);
  if (sp < 0) return GJ_H5_FAIL("cannot write dataset '%s': no dataspace", path);
  hid_t lcpl = gj_h5_lcpl_parents();
  if (lcpl < 0) return H5Sclose(sp), gj_err_prefix(path);
  hid_t d = H5Dcreate2(file, path, filet, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dwrite(d, memt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  if (d >= 0 && H5Dclose(d) < 0) rc = -1;
  H5Pclose(lcpl), H5Sclose(sp);
  if (rc < 0) return GJ_H5_FAIL("cannot write dataset '%s'", path);
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
