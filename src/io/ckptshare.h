/* Who holds which part of a checkpoint tensor, and the tensor's CRC32 computed from the parts.
 *
 * A tensor's local slice (this TP rank's, gj_tensor) is held by its replicas (gj_replicas_of:
 * every rank for a replicated tensor, the DP group for a TP shard). To read or write it once,
 * the replicas split its rows into shares; under ZeRO-1 the moments are split instead by the
 * DP ranks' flat ranges of the block (gj_state: [lo, lo + n)).
 *
 * The CRC stored with a tensor is that of its GLOBAL row-major float32 bytes, so that any
 * DP x TP layout, with or without ZeRO-1, computes the same value: each rank checksums its part,
 * the parts are gathered and combined (zlib's crc32_combine) in global order. No file is
 * touched here; the calls marked collective are so over the replicas, or the grid's world. */
#ifndef GJ_IO_CKPTSHARE_H
#define GJ_IO_CKPTSHARE_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "model/state.h"
#include "parallel/grid.h"

/* zlib CRC-32 of n bytes, the OpenMP threads on pieces when n is large. */
uint32_t gj_ckptshare_crc_bytes(const void *p, size_t n);

/* Rows [*a, *b) of t's local slice that this rank reads or writes: its replicas split the slice,
 * the inner boundaries on global rows that are multiples of unit (the chunk height of a
 * compressed dataset, so that each chunk has one writer; 1 otherwise). */
void gj_ckptshare_rows(const gj_grid *g, const gj_tensor *t, int64_t unit, int64_t *a, int64_t *b);
/* Collective over the replicas: each read its rows (gj_ckptshare_rows with unit) of local
 * [lrows, lcols]; afterwards every replica holds the whole slice. */
int gj_ckptshare_gather_rows(gj_grid *g, const gj_tensor *t, float *local, int64_t unit);
/* Collective over the world: the CRC of the global tensor from every rank's whole slice
 * local [lrows, lcols] (the replicas checksum a share each). */
int gj_ckptshare_crc(gj_grid *g, const gj_tensor *t, const float *local, uint32_t *out);

/* Collective over the TP group: the CRC of the global tensor from this rank's CRCs of its whole
 * slice, computed by the caller: slice [gj_ckptshare_slice_units(g, t) * tp parts], this rank's
 * at gj_ckptshare_slice_at (one CRC of the slice's bytes, or, when the global rows interleave
 * the TP slices, one per row of the slice); the rest is filled here. */
int gj_ckptshare_slices_crc(gj_grid *g, const gj_tensor *t, uint32_t *slice, uint32_t *out);
/* The CRCs of a slice that gj_ckptshare_slices_crc takes from each TP part (1, or t->lrows),
 * the parts (1 for a replicated tensor, else the TP size), and where this rank's go. */
int64_t gj_ckptshare_slice_units(const gj_grid *g, const gj_tensor *t);
int gj_ckptshare_slice_parts(const gj_grid *g, const gj_tensor *t);
int64_t gj_ckptshare_slice_at(const gj_grid *g, const gj_tensor *t);

/* ZeRO-1 (st->zero): elements [*lo, *hi) of t's local slice whose moments DP rank r holds
 * (lo = hi = 0 when none). */
void gj_ckptshare_owned(const gj_state *st, const gj_tensor *t, int r, int64_t *lo, int64_t *hi);
/* Collective over the world: the CRC of the global tensor from each DP rank's owned elements,
 * mine = this rank's elements [lo, hi) (gj_ckptshare_owned of g->dp_rank). */
int gj_ckptshare_owned_crc(const gj_state *st, gj_grid *g, const gj_tensor *t, const float *mine,
                           uint32_t *out);
/* Loading under ZeRO-1: copy this rank's owned part of a whole local slice (slice [lrows,
 * lcols]) into its moment block (moments [st->n], element k of the block at k - st->lo). */
void gj_ckptshare_keep_owned(const gj_state *st, const gj_tensor *t, const float *slice, float *moments);

#endif
