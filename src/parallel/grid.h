/* The process grid (world = DP x TP, TP ranks adjacent) and the collectives the model and
 * the training loop use. Every collective is a no-op when its group has one rank. */
#ifndef GJ_PARALLEL_GRID_H
#define GJ_PARALLEL_GRID_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  MPI_Comm world, tp, dp;
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
/* Sum of doubles over a communicator, in place. */
int gj_allreduce_sum_f64(MPI_Comm comm, double *buf, size_t n);

/* Gather a row-major matrix split over the TP group, onto tp rank 0.
 * Split by rows: each rank holds [rows/tp, cols]. By columns: [rows, cols/tp].
 * out: [rows, cols] on tp rank 0 (ignored elsewhere). */
int gj_tp_gather_rows(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols);
int gj_tp_gather_cols(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols);

/* All ranks agree on a failure: returns 0 on every rank if rc was 0 on every rank, else, on
 * every rank, the code of the lowest failing rank (negative), whose message every rank then
 * holds, prefixed "[rank K] " when K is not world rank 0. Callers: if ((rc = gj_agree(c, rc)))
 * return rc; */
int gj_agree(MPI_Comm comm, int rc);

/* *same = 1 on every rank if every rank passed the same v. */
int gj_same_int(MPI_Comm comm, int v, int *same);

/* Turn an MPI error code into a recorded message. */
int gj_mpi_fail(int code, const char *what);

#endif
