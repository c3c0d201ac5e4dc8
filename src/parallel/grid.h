/* The process grid (world = DP x TP, TP ranks adjacent) and the collectives the model and
 * the training loop use. Every collective is a no-op when its group has one rank. */
#ifndef GJ_PARALLEL_GRID_H
#define GJ_PARALLEL_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/comm.h"

typedef struct {
  gj_comm world, tp, dp;
  int rank, size;       /* in world */
  int tp_rank, tp_size; /* tp_rank = rank % tp_size */
  int dp_rank, dp_size;
  /* Counts of TP all-reduces (tests check one per layer per direction). */
  long n_tp_allreduce;
} gj_grid;

/* Build the grid on MPI_COMM_WORLD. Fails (same message on every rank) if tp does not
 * divide the world size. */
int gj_grid_init(gj_grid *g, int tp);
void gj_grid_free(gj_grid *g);

/* Sum / max over the TP group, in place. */
int gj_tp_allreduce_sum(gj_grid *g, float *buf, size_t n);
int gj_tp_allreduce_max(gj_grid *g, float *buf, size_t n);
/* Gather a row-major matrix split over the TP group, onto tp rank 0.
 * Split by rows: each rank holds its gj_split of the rows, [rows/tp (+1), cols]. By columns:
 * [rows, cols/tp (+1)].
 * out: [rows, cols] on tp rank 0 (ignored elsewhere). */
int gj_tp_gather_rows(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols);
int gj_tp_gather_cols(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols);

/* Megatron's mappings (mappings.py), named by the tensor-parallel region a tensor crosses,
 * each with its adjoint. A column-parallel layer (q, k, v, fc_in) reads the replicated x: its
 * input is copied into the region (forward identity) and the partial input gradients of the
 * shards are summed on the way back (backward all-reduce). A row-parallel layer (out_proj,
 * fc_out, the vocab-parallel embedding) leaves the region with partial sums: forward
 * all-reduce, backward identity. Each all-reduce is counted in n_tp_allreduce. */
static inline int gj_tp_copy_to_region(gj_grid *g, float *x, size_t n) { return 0; }
int gj_tp_copy_to_region_backward(gj_grid *g, float *dx, size_t n);
int gj_tp_reduce_from_region(gj_grid *g, float *x, size_t n);
static inline int gj_tp_reduce_from_region_backward(gj_grid *g, float *dx, size_t n) { return 0; }

/* The largest value over the TP group and its global index (the smallest index on a tie). */
int gj_tp_argmax(gj_grid *g, float *v, int64_t *idx);

/* One row of vocab-parallel logits made whole on every TP rank: tp rank r holds local, its
 * columns of the V (gj_split: V / tp, one more on the first V % tp ranks); full: [V], the same
 * on every TP rank (Megatron's gather_from_tensor_model_parallel_region). A copy when TP is 1. */
int gj_tp_allgather_vocab(gj_grid *g, float *full, const float *local, int64_t V);

#endif
