/* safetensors files (Hugging Face): an 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
 * The header is parsed with a real JSON parser and every offset and length is checked against
 * the file size before any tensor is read: dimensions in [0, 2^40], element and byte counts
 * without overflow, data_offsets inside the file and consistent with the shape and dtype,
 * no two tensors overlapping, no name given twice. Opening takes O(n log n) time in the number
 * of tensors. */
#ifndef GJ_IO_SAFETENSORS_H
#define GJ_IO_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "io/outfile.h"

/* GJ_ST_OTHER: any other safetensors dtype (BOOL, U8, I64, F64, F8_*, F4, ...): its bytes are checked
 * like any tensor's, but it is not read (Hugging Face's attention-mask buffers, skipped). */
typedef enum { GJ_ST_F32, GJ_ST_F16, GJ_ST_BF16, GJ_ST_OTHER } gj_st_dtype;

typedef struct {
  char name[256];
  gj_st_dtype dtype;
  char dtype_name[16]; /* as the header spells it */
  int elem_size;       /* bytes per element (0 for F4 and F6, below a byte) */
  int elem_bits;       /* bits per element */
  int ndim;
  int64_t shape[4];
  uint64_t begin, end; /* absolute file offsets */
} gj_st_tensor;

/* Longest header accepted (the limit of Hugging Face's own reader, 100 MB: about a million
 * tensors); a longer one is refused before it is read. */
#define GJ_ST_MAX_HEADER 100000000ULL
/* Most tensors in one file (a GPT-J file has a few hundred), counted before the header is
 * parsed: parsing a header of a million empty tensors would take seconds and gigabytes. */
#define GJ_ST_MAX_TENSORS 262144

typedef struct {
  char path[GJ_PATH_BUF];
  FILE *f;
  gj_st_tensor *t; /* sorted by name */
  int n;
} gj_st_file;

int gj_st_open(gj_st_file *s, const char *path);
void gj_st_close(gj_st_file *s);
/* The tensor of that name, or NULL; O(log n). */
const gj_st_tensor *gj_st_find(const gj_st_file *s, const char *name);
/* Read tensor t converted to float32 into out (numel floats); t must be F32, F16 or BF16 (the
 * readers refuse another dtype, naming it). */
int gj_st_read_f32(gj_st_file *s, const gj_st_tensor *t, float *out);
/* Rows [row0, row0 + nrows) x columns [col0, col0 + ncols) of t seen as [shape[0], the rest]
 * (a 1-D tensor: one column), converted to float32 into out [nrows, ncols]; only those bytes
 * are read. */
int gj_st_read_block_f32(gj_st_file *s, const gj_st_tensor *t, int64_t row0, int64_t nrows, int64_t col0,
                         int64_t ncols, float *out);

/* Writing: give the tensors (names, shapes, dtype) first, then their data in the same order,
 * then end. The data goes to a temporary file beside path (io/outfile.h) that end(ok) syncs
 * and renames into place and end(!ok) removes: a failure leaves an old file at path as it
 * was. A failed begin leaves nothing to end. A value that the dtype cannot hold (a float32
 * beyond bfloat16's range, which would round to inf) is refused, naming the tensor. */
typedef struct {
  FILE *f;
  gj_outfile out;
  gj_st_dtype dtype;
  uint64_t data_start;
} gj_st_writer;
int gj_st_write_begin(gj_st_writer *w, const char *path, gj_st_dtype dtype, int n,
                      const char *const *names, const int *ndims, const int64_t (*shapes)[2]);
int gj_st_write_tensor(gj_st_writer *w, const char *name, const float *data, uint64_t numel);
int gj_st_write_end(gj_st_writer *w, int ok);
/* Instead of end(1), for a file committed together with others (gj_hf_commit): the data is
 * complete, synced and closed in w->out.tmp, which the caller then commits or aborts; on
 * failure the temporary is removed. */
int gj_st_write_close(gj_st_writer *w);

/* Exact conversions. */
float gj_f16_to_f32(uint16_t h);
float gj_bf16_to_f32(uint16_t b);
uint16_t gj_f32_to_bf16(float f); /* round to nearest even */

#endif
