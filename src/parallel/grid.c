#include "parallel/grid.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "parallel/gather.h"

int gj_grid_init(gj_grid *g, int tp) {
  memset(g, 0, sizeof *g);
  g->world = MPI_COMM_WORLD;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g->world, &g->rank);
  MPI_Comm_size(g->world, &g->size);
  if (tp < 1 || g->size % tp)
    return GJ_FAIL("--tp %d does not divide the number of ranks %d", tp, g->size);
  g->tp_size = tp;
  g->tp_rank = g->rank % tp;
  g->dp_size = g->size / tp;
  g->dp_rank = g->rank / tp;
  GJ_MPI_TRY(MPI_Comm_split(g->world, g->dp_rank, g->tp_rank, &g->tp), "MPI_Comm_split(tp)");
  GJ_MPI_TRY(MPI_Comm_split(g->world, g->tp_rank, g->dp_rank, &g->dp), "MPI_Comm_split(dp)");
  MPI_Comm_set_errhandler(g->tp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(g->dp, MPI_ERRORS_RETURN);
  return 0;
}

void gj_grid_free(gj_grid *g) {
  if (g->tp != MPI_COMM_NULL && g->tp) MPI_Comm_free(&g->tp);
  if (g->dp != MPI_COMM_NULL && g->dp) MPI_Comm_free(&g->dp);
}

int gj_tp_allreduce_sum(gj_grid *g, float *buf, size_t n) {
  if (g->tp_size == 1) return 0;
  g->n_tp_allreduce++;
  return gj_allreduce_inplace(g->tp, buf, n, MPI_FLOAT, MPI_SUM);
}

int gj_tp_reduce_from_region(gj_grid *g, float *x, size_t n) { return gj_tp_allreduce_sum(g, x, n); }

int gj_tp_copy_to_region_backward(gj_grid *g, float *dx, size_t n) {
  return gj_tp_allreduce_sum(g, dx, n);
}

int gj_tp_argmax(gj_grid *g, float *v, int64_t *idx) {
  if (g->tp_size == 1) return 0;
  if (*idx < 0 || *idx > INT_MAX) return GJ_FAIL("internal: argmax index %lld out of range", (long long)*idx);
  /* MAXLOC keeps the smaller index on equal values: the first index wins a tie. */
  struct { float v; int i; } mine = {*v, (int)*idx}, all;
  GJ_MPI_TRY(MPI_Allreduce(&mine, &all, 1, MPI_FLOAT_INT, MPI_MAXLOC, g->tp), "MPI_Allreduce(argmax)");
  *v = all.v, *idx = all.i;
  return 0;
}

int gj_tp_allreduce_max(gj_grid *g, float *buf, size_t n) {
  if (g->tp_size == 1) return 0;
  return gj_allreduce_inplace(g->tp, buf, n, MPI_FLOAT, MPI_MAX);
}

/* Gather contiguous blocks onto rank 0 of comm, in rank order: rank r's is its part of n
 * units of `unit` floats (gj_split), at out + first * unit. */
static int gather_blocks(MPI_Comm comm, float *out, const float *local, int64_t n, size_t unit) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int64_t first;
  size_t mine = (size_t)gj_split(n, size, rank, &first) * unit;
  if (rank == 0) {
    memcpy(out, local, mine * sizeof(float));
    for (int r = 1; r < size; r++) {
      size_t each = (size_t)gj_split(n, size, r, &first) * unit;
      float *to = out + (size_t)first * unit;
      for (size_t off = 0; off < each; off += GJ_CHUNK)
        GJ_MPI_TRY(MPI_Recv(to + off, (int)GJ_MIN(GJ_CHUNK, each - off), MPI_FLOAT, r, 7, comm,
                            MPI_STATUS_IGNORE),
                   "MPI_Recv(gather)");
    }
  } else {
    for (size_t off = 0; off < mine; off += GJ_CHUNK)
      GJ_MPI_TRY(MPI_Send(local + off, (int)GJ_MIN(GJ_CHUNK, mine - off), MPI_FLOAT, 0, 7, comm),
                 "MPI_Send(gather)");
  }
  return 0;
}

int gj_tp_gather_rows(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols) {
  return gather_blocks(g->tp, out, local, rows, (size_t)cols);
}

int gj_tp_gather_cols(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols) {
  float *tmp = NULL;
  if (g->tp_rank == 0) {
    tmp = malloc((size_t)rows * cols * sizeof(float));
    if (!tmp) return GJ_FAIL("out of memory gathering a [%lld, %lld] tensor", (long long)rows, (long long)cols);
  }
  /* rank r's [rows, lc] block lies at tmp + rows * c0: the blocks of a split of cols columns
   * in units of rows floats */
  int rc = gather_blocks(g->tp, tmp, local, cols, (size_t)rows);
  if (!rc && g->tp_rank == 0)
    for (int r = 0; r < g->tp_size; r++) {
      int64_t c0, lc = gj_split(cols, g->tp_size, r, &c0);
      for (int64_t i = 0; i < rows; i++)
        memcpy(out + i * cols + c0, tmp + (size_t)rows * c0 + i * lc, lc * sizeof(float));
    }
  free(tmp);
  return rc;
}

int gj_tp_allgather_vocab(gj_grid *g, float *full, const float *local, int64_t V) {
  if (V < 0) return GJ_FAIL("internal: vocabulary of %lld entries", (long long)V);
  int64_t v0, Vl = gj_split(V, g->tp_size, g->tp_rank, &v0);
  if (g->tp_size == 1) {
    if (full != local) memcpy(full, local, (size_t)Vl * sizeof(float));
    return 0;
  }
  size_t *cnt = malloc(2 * (size_t)g->tp_size * sizeof(size_t)), *dsp = cnt + g->tp_size;
  if (!cnt) return GJ_FAIL("out of memory");
  for (int r = 0; r < g->tp_size; r++) {
    int64_t first;
    cnt[r] = (size_t)gj_split(V, g->tp_size, r, &first), dsp[r] = (size_t)first;
  }
  memcpy(full + v0, local, (size_t)Vl * sizeof(float));
  int rc = gj_allgatherv_f32(g->tp, full, cnt, dsp);
  free(cnt);
  return rc;
}
