/* Gathers named by what they do to the data, for code that shares the pieces of a tensor
 * (the checkpoint): every call is in place (each rank's block already sits at its place in the
 * buffer, and every rank ends with all the blocks), checks its MPI return code and is a no-op
 * when the group has one rank.
 *
 * Counts and displacements are size_t, in elements. MPI 3.1 counts and displacements are int:
 * when the whole buffer (the end of the last block) is below INT_MAX elements the gather is one
 * MPI call, otherwise each block is broadcast by its owner in pieces of GJ_CHUNK elements. */
#ifndef GJ_PARALLEL_GATHER_H
#define GJ_PARALLEL_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/comm.h"
#include "parallel/grid.h"

/* Hints for MPI-IO (parallel HDF5's file access), for code that must not spell MPI types. */
typedef MPI_Info gj_comm_info;
gj_comm_info gj_comm_info_none(void);

/* The ranks that hold the same copy of some data, and this rank's index k of n among them:
 * the whole world for data replicated over the grid, the DP group for a TP shard (each TP
 * rank's slice is held by the DP ranks of its column). */
typedef struct {
  gj_comm comm;
  int n, k;
} gj_replicas;
gj_replicas gj_replicas_of(const gj_grid *g, int tp_sharded);

/* Rank r's block is buf[r * each, (r + 1) * each). */
int gj_allgather_u32(gj_comm c, uint32_t *buf, size_t each);
/* Rank r's block is buf[dsp[r], dsp[r] + cnt[r]) (blocks do not overlap). */
int gj_allgatherv_u32(gj_comm c, uint32_t *buf, const size_t *cnt, const size_t *dsp);
int gj_allgatherv_f32(gj_comm c, float *buf, const size_t *cnt, const size_t *dsp);

#endif
