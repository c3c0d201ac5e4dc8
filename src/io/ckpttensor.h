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
/* Ask the kernel to start reading this rank's share (contiguous datasets), so that the disk
 * works while the previous tensor is exchanged and checked. Reports nothing: the load does. */
void gj_ckpttensor_prefetch(hid_t f, int fd, const char *path, gj_grid *g, const gj_tensor *t);

/* The crc32 attribute of an open dataset d: write (path names it in messages), read (-1 when
 * it has none or it does not read). */
int gj_ckpttensor_write_crc(hid_t d, const char *path, uint32_t crc);
int gj_ckpttensor_read_crc(hid_t d, uint32_t *crc);

#endif
