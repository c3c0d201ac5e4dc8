#include "parallel/grid.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* MPI 3.1 counts are int: move large buffers in pieces. 16 Mi elements also keeps Open MPI's
 * temporary buffers small (DESIGN.md §12: big single all-reduces are slow here). */
#define GJ_CHUNK ((size_t)1 << 22)

int gj_mpi_fail(int code, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return GJ_FAIL("MPI error in %s: %s", what, msg);
}

#define MPI_TRY(call, what)                                                                  \
  do {                                                                                       \
    int mpi_rc_ = (call);                                                                    \
    if (mpi_rc_ != MPI_SUCCESS) return gj_mpi_fail(mpi_rc_, what);                          \
  } while (0)

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
  MPI_TRY(MPI_Comm_split(g->world, g->dp_rank, g->tp_rank, &g->tp), "MPI_Comm_split(tp)");
  MPI_TRY(MPI_Comm_split(g->world, g->tp_rank, g->dp_rank, &g->dp), "MPI_Comm_split(dp)");
  MPI_Comm_set_errhandler(g->tp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(g->dp, MPI_ERRORS_RETURN);
  return 0;
}

void gj_grid_free(gj_grid *g) {
  if (g->tp != MPI_COMM_NULL && g->tp) MPI_Comm_free(&g->tp);
  if (g->dp != MPI_COMM_NULL && g->dp) MPI_Comm_free(&g->dp);
}

static int allreduce_chunked(MPI_Comm comm, void *buf, size_t n, MPI_Datatype t, size_t esize,
                             MPI_Op op) {
  for (size_t off = 0; off < n; off += GJ_CHUNK) {
    int cnt = (int)GJ_MIN(GJ_CHUNK, n - off);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esize, cnt, t, op, comm),
            "MPI_Allreduce");
  }
  return 0;
}

int gj_tp_allreduce_sum(gj_grid *g, float *buf, size_t n) {
  if (g->tp_size == 1) return 0;
  g->n_tp_allreduce++;
  return allreduce_chunked(g->tp, buf, n, MPI_FLOAT, sizeof(float), MPI_SUM);
}

int gj_tp_allreduce_max(gj_grid *g, float *buf, size_t n) {
  if (g->tp_size == 1) return 0;
  return allreduce_chunked(g->tp, buf, n, MPI_FLOAT, sizeof(float), MPI_MAX);
}

int gj_allreduce_sum_f64(MPI_Comm comm, double *buf, size_t n) {
  int size;
  MPI_Comm_size(comm, &size);
  if (size == 1) return 0;
  return allreduce_chunked(comm, buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}

/* Gather equal contiguous blocks of `each` floats onto rank 0 of comm, in rank order. */
static int gather_blocks(MPI_Comm comm, float *out, const float *local, size_t each) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (rank == 0) {
    memcpy(out, local, each * sizeof(float));
    for (int r = 1; r < size; r++)
      for (size_t off = 0; off < each; off += GJ_CHUNK)
        MPI_TRY(MPI_Recv(out + r * each + off, (int)GJ_MIN(GJ_CHUNK, each - off), MPI_FLOAT, r,
                         7, comm, MPI_STATUS_IGNORE),
                "MPI_Recv(gather)");
  } else {
    for (size_t off = 0; off < each; off += GJ_CHUNK)
      MPI_TRY(MPI_Send(local + off, (int)GJ_MIN(GJ_CHUNK, each - off), MPI_FLOAT, 0, 7, comm),
              "MPI_Send(gather)");
  }
  return 0;
}

int gj_tp_gather_rows(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols) {
  return gather_blocks(g->tp, out, local, (size_t)(rows / g->tp_size) * cols);
}

int gj_tp_gather_cols(gj_grid *g, float *out, const float *local, int64_t rows, int64_t cols) {
  int64_t lc = cols / g->tp_size;
  size_t each = (size_t)rows * lc;
  float *tmp = NULL;
  if (g->tp_rank == 0) {
    tmp = malloc(each * g->tp_size * sizeof(float));
    if (!tmp) return GJ_FAIL("out of memory gathering a [%lld, %lld] tensor", (long long)rows, (long long)cols);
  }
  int rc = gather_blocks(g->tp, tmp, local, each);
  if (!rc && g->tp_rank == 0)
    for (int r = 0; r < g->tp_size; r++)
      for (int64_t i = 0; i < rows; i++)
        memcpy(out + i * cols + r * lc, tmp + r * each + i * lc, lc * sizeof(float));
  free(tmp);
  return rc;
}

int gj_agree(MPI_Comm comm, int rc) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) return rc;
  /* the lowest failing rank of comm, if any, in one reduction */
  int me, first = INT_MAX;
  MPI_Comm_rank(comm, &me);
  int mine = rc ? me : INT_MAX;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
    if (!rc) GJ_FAIL("MPI error agreeing on a failure");
    return rc ? rc : -1;
  }
  if (first == INT_MAX) return 0;
  /* its code, world rank and message, to every rank */
  struct { int rc, world; char msg[GJ_ERRMSG_MAX]; } e;
  if (me == first) {
    e.rc = rc < 0 ? rc : -1, e.world = gj_log_rank();
    snprintf(e.msg, sizeof e.msg, "%s", gj_errmsg());
  }
  if (MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, comm) != MPI_SUCCESS) {
    if (!rc) GJ_FAIL("MPI error agreeing on a failure");
    return rc ? rc : -1;
  }
  e.msg[sizeof e.msg - 1] = 0;
  if (me != first || e.world != 0) {
    const char *m = e.msg;
    /* a message that already names its rank keeps the name */
    if (e.world != 0 && strncmp(m, "[rank ", 6)) GJ_FAIL("[rank %d] %s", e.world, m);
    else GJ_FAIL("%s", m);
  }
  return e.rc;
}

int gj_same_int(MPI_Comm comm, int v, int *same) {
  int mm[2] = {-v, v};
  int rc = MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, comm);
  if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Allreduce(same value)");
  *same = -mm[0] == mm[1];
  return 0;
}
