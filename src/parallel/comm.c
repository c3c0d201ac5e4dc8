#include "parallel/comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  /* The DP gradient sum is an in-place MPI_Iallreduce of 16 MB buckets (dp.c). For an in-place
   * call, and for any call on fewer than 4 ranks, Open MPI's libnbc picks its binomial
   * algorithm: a reduce to rank 0 and a broadcast back, each moving the whole bucket in every
   * round, 2 log2(p) times the bucket in sequence. Rabenseifner's (a reduce-scatter by recursive
   * halving, then an all-gather) moves 2 (p - 1) / p of it, as a ring does, in as few rounds as
   * the binomial, which matters because the schedule only advances when gptj calls MPI (once a
   * layer during backward). Measured 2.7x faster at 2 ranks on two nodes (README, "DP
   * bandwidth"). Every rank ends with the same bits: each segment is summed on one rank, then
   * copied. The user's own choice (the variable set) is kept. */
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
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
  int mm[2] = {~v, v}; /* max(~v) = ~min(v), defined for every int (-v is not for INT_MIN) */
  int rc = MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, comm);
  if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Allreduce(same value)");
  *same = ~mm[0] == mm[1];
  return 0;
}

/* MPI's return code as ours: 0, or MPI's message recorded. */
static int mpi_ok(int code, const char *what) { return code == MPI_SUCCESS ? 0 : gj_mpi_fail(code, what); }

/* Rank 0 takes every rank's piece in turn: peak memory is the result, and no rank but 0 holds
 * more than its own share (a Gatherv would need int counts and displacements). */
int gj_gather_ordered(gj_comm c, void **out, uint64_t *total, const void *mine, uint64_t n,
                      size_t esize) {
  enum { TAG = 8 };
  int rank = gj_comm_rank(c), size = gj_comm_size(c), rc = 0;
  uint64_t *counts = NULL, sum = 0;
  size_t bytes = 0;
  *out = NULL, *total = 0;
  if (size == 1) {
    if (gj_mul_size(&bytes, n, esize) || !(*out = malloc(bytes ? bytes : 1)))
      return GJ_FAIL("out of memory gathering %llu elements of %zu bytes", (unsigned long long)n, esize);
    if (bytes) memcpy(*out, mine, bytes);
    *total = n;
    return 0;
  }
  if (rank == 0 && !(counts = malloc((size_t)size * sizeof *counts))) rc = GJ_FAIL("out of memory");
  rc = gj_agree(c, rc);
  if (!rc) rc = mpi_ok(MPI_Gather(&n, 1, MPI_UINT64_T, counts, 1, MPI_UINT64_T, 0, c), "MPI_Gather(counts)");
  for (int r = 0; !rc && rank == 0 && r < size; r++) {
    if (sum + counts[r] < sum) rc = GJ_FAIL("internal: gathered counts overflow 64 bits");
    sum += counts[r];
  }
  if (!rc && rank == 0 && (gj_mul_size(&bytes, sum, esize) || !(*out = malloc(bytes ? bytes : 1))))
    rc = GJ_FAIL("out of memory gathering %llu elements of %zu bytes onto rank 0", (unsigned long long)sum, esize);
  rc = gj_agree(c, rc);
  if (!rc && rank == 0) {
    char *dst = *out;
    if (n) memcpy(dst, mine, n * esize);
    dst += n * esize;
    for (int r = 1; r < size && !rc; r++) {
      size_t b = counts[r] * esize;
      for (size_t off = 0; off < b && !rc; off += GJ_CHUNK)
        rc = mpi_ok(MPI_Recv(dst + off, (int)GJ_MIN(GJ_CHUNK, b - off), MPI_BYTE, r, TAG, c, MPI_STATUS_IGNORE),
                    "MPI_Recv(ordered gather)");
      dst += b;
    }
  } else if (!rc) {
    size_t b = n * esize;
    for (size_t off = 0; off < b && !rc; off += GJ_CHUNK)
      rc = mpi_ok(MPI_Send((const char *)mine + off, (int)GJ_MIN(GJ_CHUNK, b - off), MPI_BYTE, 0, TAG, c),
                  "MPI_Send(ordered gather)");
  }
  rc = gj_agree(c, rc);
  free(counts);
  if (rc) free(*out), *out = NULL;
  else *total = sum;
  return rc;
}

int gj_agree_after_idle(gj_comm comm, int rc) {
  MPI_Request req;
  int done = 0;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) return gj_agree(comm, rc);
  while (!done) {
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    if (!done) nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  return gj_agree(comm, rc);
}
