/* One tensor's dataset in a checkpoint file (DESIGN.md §5): float32, its GLOBAL shape in HF
 * layout, a crc32 attribute (io/ckptshare.h: of the global row-major bytes). In a file open
 * with MPI-IO the ranks write and read it by shares: the replicas of a slice a share of its
 * rows each (whole chunks of a compressed dataset, so that each chunk has one writer), or under
 * ZeRO-1 each DP rank the moments it owns. path is the dataset's ("/model/<HF name>", ...);
 * fname the file's, for messages; fd the file opened by the caller for kernel hints (or -1). */
#ifndef GJ_IO_CKPTTENSOR_H
#define GJ_IO_CKPTTENSOR_H

#include <hdf5.h>
#include <stdint.h>

#include "model/params.h"
#include "model/state.h"
#include "parallel/grid.h"

/* The transfer property list of the writes below (collective; the caller closes it). */
hid_t gj_ckpttensor_transfer(int compress);
/* Collective: create the dataset (chunked, shuffled and deflated when compress is 1..9) and
 * write it from every rank's slice local [lrows, lcols], with its CRC. A failure may show on
 * some ranks only: the caller agrees before the next collective call. */
int gj_ckpttensor_write(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t,
                        const float *local, int compress, hid_t dxpl);
/* The same for moments under ZeRO-1, from each DP rank's owned elements (moments: this rank's
 * moment block [st->n]). */
int gj_ckpttensor_write_owned(hid_t f, int fd, const char *path, gj_state *st, gj_grid *g,
                              const gj_tensor *t, const float *moments, int compress, hid_t dxpl);

/* Collective, agreed: read this rank's share of its slice into local [lrows, lcols], exchange
 * the shares with the replicas, check the CRC and that every value is finite (a failure names
 * fname and the dataset on every rank). */
int gj_ckpttensor_load(hid_t f, const char *fname, const char *path, gj_grid *g, const gj_tensor *t,
                       float *local);
/* Where gj_ckpttensor_load_rows puts a tensor: rows [r0, r0 + nr) of this rank's slice (nr x
 * t->lcols floats), in order, as they are read. Nonzero: an error (recorded). */
typedef struct {
  int (*rows)(void *ctx, const gj_tensor *t, int64_t r0, int64_t nr, const float *v);
  void *ctx;
} gj_ckpttensor_sink;

/* Collective, agreed, with the checks and messages of gj_ckpttensor_load, without holding the
 * slice: every rank reads its whole slice itself in blocks of rows of at most buf_floats (buf;
 * at least one row), passes each block to the sink, and checks the CRC of the global tensor
 * from the blocks' CRCs, and that every value is finite, once all are read. */
int gj_ckpttensor_load_rows(hid_t f, const char *fname, const char *path, gj_grid *g,
                            const gj_tensor *t, float *buf, size_t buf_floats,
                            const gj_ckpttensor_sink *sink);
/* gj_ckpttensor_load_rows into dst [lrows, lcols], each value rounded to bfloat16 (as the bf16
 * GEMMs round their operands): a bf16-resident state's tensor, never in float32 whole. */
int gj_ckpttensor_load_bf16(hid_t f, const char *fname, const char *path, gj_grid *g,
                            const gj_tensor *t, gj_bf16 *dst);

/* Ask the kernel to start reading this rank's share (contiguous datasets), so that the disk
 * works while the previous tensor is exchanged and checked. Reports nothing: the load does. */
void gj_ckpttensor_prefetch(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t);

/* The crc32 attribute of an open dataset d: write (path names it in messages), read (-1 when
 * it has none, or it is not one integer that fits 32 bits, or it does not read). */
int gj_ckpttensor_write_crc(hid_t d, const char *path, uint32_t crc);
int gj_ckpttensor_read_crc(hid_t d, uint32_t *crc);

#endif
