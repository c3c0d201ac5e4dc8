/* Small HDF5 helpers with errors that name the file and the object. */
#ifndef GJ_IO_H5UTIL_H
#define GJ_IO_H5UTIL_H

#include <hdf5.h>
#include <stdint.h>

/* A dataset reached through hard links only, with its data in the file (no external or soft
 * links, external storage or virtual layout, which could lead to other files or FIFOs):
 * checked before anything opens it. */
int gj_h5_plain_dataset(hid_t file, const char *fname, const char *path);
/* Silence HDF5's automatic error printing (we report errors ourselves). */
void gj_h5_quiet(void);
/* Once, first in main: files are closed by the code that opened them; a checkpoint whose
 * write failed is deliberately left open (see gj_ckpt_save), so HDF5 closes nothing at exit. */
void gj_h5_at_start(void);
/* Record an error like GJ_FAIL, followed by HDF5's own reason for the failed call when its
 * error stack has one (the innermost entry: " (HDF5: <what failed>: <detail>)"); the stack
 * is cleared. Returns -1. */
int gj_h5_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define GJ_H5_FAIL(...) gj_h5_fail_at(__FILE__, __LINE__, __VA_ARGS__)
/* Open for reading with the default (serial) driver. Checks that the path is a readable
 * HDF5 file and names it in the error. */
int gj_h5_open_read(const char *path, hid_t *file);
int gj_h5_create(const char *path, hid_t *file); /* truncates */

/* Numeric scalar attributes. An int64 read takes an integer of at most 8 bytes (an unsigned
 * value above INT64_MAX is refused) or a float holding an integer (a fraction, infinity or NaN
 * is refused); a double read takes either class and refuses infinity and NaN. Messages name
 * the file and the attribute (group/name for a group's attribute). */
int gj_h5_attr_i64(hid_t obj, const char *fname, const char *name, int64_t *out);
int gj_h5_attr_f64(hid_t obj, const char *fname, const char *name, double *out);
/* The same, and refuse a value outside [lo, hi] (open: GJ_H5_LO_OPEN and/or GJ_H5_HI_OPEN
 * exclude the bound). */
#define GJ_H5_LO_OPEN 1
#define GJ_H5_HI_OPEN 2
int gj_h5_attr_i64_in(hid_t obj, const char *fname, const char *name, int64_t lo, int64_t hi,
                      int64_t *out);
int gj_h5_attr_f64_in(hid_t obj, const char *fname, const char *name, double lo, double hi,
                      int open, double *out);
int gj_h5_attr_str(hid_t obj, const char *fname, const char *name, char *out, size_t n);
int gj_h5_write_attr_i64(hid_t obj, const char *name, int64_t v);
int gj_h5_write_attr_u32(hid_t obj, const char *name, uint32_t v);
int gj_h5_write_attr_f64(hid_t obj, const char *name, double v);
int gj_h5_write_attr_str(hid_t obj, const char *name, const char *s);
/* A link-creation property list that creates the missing groups of a path (the caller closes
 * it); -1 with an error. */
hid_t gj_h5_lcpl_parents(void);

/* Shape of a dataset: *ndim and dims[0..ndim-1] (ndim <= 4; a scalar has ndim 0; each
 * dimension below 2^62). */
int gj_h5_shape(hid_t file, const char *fname, const char *path, int *ndim, int64_t dims[4]);
/* A short name of an HDF5 type for messages ("uint16", "int64", "float32", ...). */
const char *gj_h5_type_name(hid_t type, char *out, size_t n);
/* Read the block [row0, row0+nrows) x [col0, col0+ncols) of a 1-D (cols = 1) or 2-D dataset
 * whose shape must be exactly (rows, cols) and whose type must be floating point (an integer
 * dataset is refused, not converted); converts to float. A scalar: rows = cols = 1. */
int gj_h5_read_block_f32(hid_t file, const char *fname, const char *path, int64_t rows,
                         int64_t cols, int ndim, int64_t row0, int64_t col0, int64_t nrows,
                         int64_t ncols, float *out);
/* Read a whole dataset of n elements as int32 (integer types within int32's range only) or
 * double (floating-point types only). */
int gj_h5_read_i32(hid_t file, const char *fname, const char *path, int64_t n, int32_t *out);
int gj_h5_read_f64(hid_t file, const char *fname, const char *path, int64_t n, double *out);
/* Write a float32 (or int32, or scalar double) dataset, creating intermediate groups. */
int gj_h5_write_f32(hid_t file, const char *path, const float *data, int ndim, const int64_t *dims);
int gj_h5_write_i32(hid_t file, const char *path, const int32_t *data, int64_t n);
int gj_h5_write_scalar_f64(hid_t file, const char *path, double v);

#endif
