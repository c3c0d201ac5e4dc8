#include "parallel/comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int gj_mpi_fail(int code, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return GJ_FAIL("MPI error in %s: %s", what, msg);
}

void gj_comm_before_init(void) {
  /* Open MPI's "lockedfile" shared-file-pointer component (which gptj never uses) writes the
   * file's path into a fixed buffer when MPI-IO opens a file, and aborts on paths of ~230
   * characters: leave it out, unless the user chose the components. */
  setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
}

gj_comm gj_comm_world(void) { return MPI_COMM_WORLD; }

int gj_comm_rank(gj_comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

int gj_comm_size(gj_comm c) {
  int n = 1;
  MPI_Comm_size(c, &n);
  return n;
}

int gj_comm_node_size(gj_comm c, int *n) {
  MPI_Comm node;
  GJ_MPI_TRY(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
             "MPI_Comm_split_type(node)");
  int rc = MPI_Comm_size(node, n);
  MPI_Comm_free(&node);
  return rc == MPI_SUCCESS ? 0 : gj_mpi_fail(rc, "MPI_Comm_size(node)");
}

int gj_allreduce_inplace(gj_comm c, void *buf, size_t n, MPI_Datatype t, MPI_Op op) {
  if (gj_comm_size(c) == 1) return 0;
  int esize;
  GJ_MPI_TRY(MPI_Type_size(t, &esize), "MPI_Type_size");
  for (size_t off = 0; off < n; off += GJ_CHUNK) {
    int cnt = (int)GJ_MIN(GJ_CHUNK, n - off);
    GJ_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esize, cnt, t, op, c), "MPI_Allreduce");
  }
  return 0;
}

int gj_bcast(gj_comm c, void *buf, size_t bytes, int root) {
  if (gj_comm_size(c) == 1) return 0;
  for (size_t off = 0; off < bytes; off += GJ_CHUNK)
    GJ_MPI_TRY(MPI_Bcast((char *)buf + off, (int)GJ_MIN(GJ_CHUNK, bytes - off), MPI_BYTE, root, c),
               "MPI_Bcast");
  return 0;
}

int gj_allreduce_max_int(gj_comm c, int *buf, size_t n) {
  return gj_allreduce_inplace(c, buf, n, MPI_INT, MPI_MAX);
}
int gj_allreduce_max_f64(gj_comm c, double *buf, size_t n) {
  return gj_allreduce_inplace(c, buf, n, MPI_DOUBLE, MPI_MAX);
}
int gj_allreduce_sum_f64(gj_comm c, double *buf, size_t n) {
  return gj_allreduce_inplace(c, buf, n, MPI_DOUBLE, MPI_SUM);
}
int gj_allreduce_sum_u64(gj_comm c, uint64_t *buf, size_t n) {
  return gj_allreduce_inplace(c, buf, n, MPI_UINT64_T, MPI_SUM);
}

int gj_barrier(gj_comm c) {
  if (gj_comm_size(c) == 1) return 0;
  GJ_MPI_TRY(MPI_Barrier(c), "MPI_Barrier");
  return 0;
}

int gj_agree(gj_comm comm, int rc) {
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

int gj_same_int(gj_comm comm, int v, int *same) {
  int mm[2] = {-v, v};
  int rc = MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, comm);
  if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Allreduce(same value)");
  *same = -mm[0] == mm[1];
  return 0;
}
