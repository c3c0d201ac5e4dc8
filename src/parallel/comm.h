/* Collectives on any communicator, named by what they do to the data. Every call checks its
 * MPI return code (MPI_ERRORS_RETURN is set on every communicator gptj makes) and records
 * MPI's own message; each is a no-op when the group has one rank. The only file outside
 * src/parallel/ that touches MPI directly is main.c (MPI_Init, MPI_Finalize, MPI_Comm_rank). */
#ifndef GJ_PARALLEL_COMM_H
#define GJ_PARALLEL_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

/* A communicator, held by code that must not spell MPI types. */
typedef MPI_Comm gj_comm;

/* Turn an MPI error code into a recorded message (returns the error code to propagate). */
int gj_mpi_fail(int code, const char *what);

/* For src/parallel/ only: return MPI's message when call fails. */
#define GJ_MPI_TRY(call, what)                                                               \
  do {                                                                                       \
    int gj_mpi_rc_ = (call);                                                                 \
    if (gj_mpi_rc_ != MPI_SUCCESS) return gj_mpi_fail(gj_mpi_rc_, what);                    \
  } while (0)

/* For src/parallel/ only. MPI 3.1 counts are int: large buffers move in pieces. 4 Mi elements
 * also keeps Open MPI's temporary buffers small (DESIGN.md §12: big single all-reduces are
 * slow here). */
#define GJ_CHUNK ((size_t)1 << 22)
int gj_allreduce_inplace(gj_comm c, void *buf, size_t n, MPI_Datatype t, MPI_Op op);

/* The MPI library's settings, before MPI_Init (main). */
void gj_comm_before_init(void);

gj_comm gj_comm_world(void);
int gj_comm_rank(gj_comm c);
int gj_comm_size(gj_comm c);

/* Ranks of c on this node (shared-memory neighbours), this one included. */
int gj_comm_node_size(gj_comm c, int *n);

/* bytes of buf from root to every rank (any size). */
int gj_bcast(gj_comm c, void *buf, size_t bytes, int root);
/* In place over c: element-wise max of ints / doubles, sum of doubles / uint64. */
int gj_allreduce_max_int(gj_comm c, int *buf, size_t n);
int gj_allreduce_max_f64(gj_comm c, double *buf, size_t n);
int gj_allreduce_sum_f64(gj_comm c, double *buf, size_t n);
int gj_allreduce_sum_u64(gj_comm c, uint64_t *buf, size_t n);
int gj_barrier(gj_comm c);

/* All ranks agree on a failure: returns 0 on every rank if rc was 0 on every rank, else, on
 * every rank, the code of the lowest failing rank (negative), whose message every rank then
 * holds, prefixed "[rank K] " when K is not world rank 0. */
int gj_agree(gj_comm comm, int rc);
/* The same after long work that some ranks do alone (rank 0 converting a model): the others
 * wait without keeping a core busy (a non-blocking barrier tested every 5 ms). */
int gj_agree_after_idle(gj_comm comm, int rc);
/* The agree-else-fail pattern: if ((rc = gj_agree(c, rc))) return rc; */
#define GJ_AGREE(c, rc)                                                                      \
  do {                                                                                       \
    int gj_agree_rc_ = gj_agree((c), (rc));                                                  \
    if (gj_agree_rc_) return gj_agree_rc_;                                                   \
  } while (0)

/* *same = 1 on every rank if every rank passed the same v. */
int gj_same_int(gj_comm comm, int v, int *same);

/* Ordered gather: every rank's n elements of esize bytes, concatenated in rank order onto
 * rank 0 of c (an MPI_Gatherv with 64-bit counts). On rank 0 *out is a new buffer of *total
 * elements (malloc'ed, at least one byte; the caller frees it); elsewhere *out = NULL and
 * *total = 0. The data move in GJ_CHUNK-byte pieces; on one rank it is a copy. Collective;
 * returns the same code on every rank (rank 0 out of memory included). */
int gj_gather_ordered(gj_comm c, void **out, uint64_t *total, const void *mine, uint64_t n,
                      size_t esize);

#endif
