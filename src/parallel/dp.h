/* Data-parallel gradient reduction: the gradient block is summed over the DP group by
 * non-blocking all-reduces on buckets, each started as soon as backward reports its
 * gradients final, and waited for before the optimizer. */
#ifndef GJ_PARALLEL_DP_H
#define GJ_PARALLEL_DP_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "model/rowgrad.h"
#include "parallel/grid.h"

typedef struct {
  gj_grid *g;
  float *grads;
  size_t n;          /* floats in the block */
  size_t lo, hi;     /* [lo, hi): reported final, not posted yet (empty: lo == hi) */
  size_t done;       /* floats reported final this step */
  MPI_Request *req;
  int nreq, cap;
  size_t bucket;     /* floats per bucket */
  double wait_s;     /* exposed wait of the last finish */
  double bytes;      /* bytes of gradients reduced by this rank in the last step */
  gj_rowgrad *rows;  /* NULL, or the gradients of [0, skip) (the embedding) as rows: the block
                      * has no memory there; they are summed over the union of the ranks' rows */
  size_t skip;
  MPI_Request *greq; /* ZeRO-1's all-gather: one a piece */
  int gcap;
  /* gj_dp_gather16: the block's ranges [g16[2i], g16[2i+1]) that the all-gather sends in
   * bfloat16 (g16n of them, sorted) */
  size_t *g16;
  size_t g16n;
  int bf16;          /* --grad-reduce bf16: each bucket is rounded to bfloat16 into the first half
                      * of its own bytes, summed so (every partial sum rounded to bfloat16) and
                      * widened back in place when it is waited for */
  size_t f32_below;  /* bf16: the block's [0, f32_below), the embedding, is summed in float32 */
  size_t owner_P;    /* gj_dp_reduce_to_owners: the ranges' floats (0: all-reduces) */
  size_t *rng;       /* bf16: [lo, hi) of each request's bucket */
  uint16_t *stage;   /* bf16: a bucket of staging (the in-place rounding and widening) */
  MPI_Op op;         /* bf16: the sum of bfloat16 values, made if op_made */
  int op_made;
  /* the progress thread (gj_dp_progress): while buckets are in flight it tests them, sleeping
   * poll_us microseconds between tests; mu guards nreq, polling, busy (it is in MPI_Testall),
   * poll_rc and the counts */
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int th_made, polling, busy, quit, poll_us;
  int poll_rc;       /* the first failed MPI_Testall of the thread this step (gj_dp_finish's) */
  long polls, polled_done; /* its tests, and those that found every request complete */
} gj_dp_sync;

#define GJ_DP_BUCKET_FLOATS ((size_t)1 << 22) /* 16 MB, the default bucket */

/* The block's [0, skip) is the embedding's gradient; rows (or NULL): it is held as rows.
 * bucket_floats 0: the default. bf16: the sums go over the network in bfloat16 (half the
 * bytes; each rank's gradient and every partial sum rounded to bfloat16, nearest even), as
 * Megatron-LM's --grad-reduce-in-bf16 and PyTorch DDP's bf16_compress_hook do, but for the
 * embedding's, which stays float32 (as rows it is small; so the optimizer in backward, which
 * holds it whole, sums the same values). Every rank ends with the same bits either way. */
int gj_dp_init(gj_dp_sync *s, gj_grid *g, float *grads, size_t n, gj_rowgrad *rows, size_t skip,
               size_t bucket_floats, int bf16);
void gj_dp_free(gj_dp_sync *s);
/* Progress for the buckets in flight. Open MPI moves a non-blocking collective on only inside
 * MPI calls, and backward makes few (at TP 1 none between two buckets): over TCP a bucket then
 * waits, mostly unsent, for gj_dp_finish. With poll_us > 0 a thread of this rank calls
 * MPI_Testall on them from the first bucket posted to gj_dp_finish, sleeping poll_us
 * microseconds between calls, as Horovod's background thread and PyTorch DDP's communication
 * thread do. It needs MPI_THREAD_MULTIPLE (main asks for it for train and bench): without it,
 * or with poll_us 0 or DP 1, there is no thread (returns 0, *on = 0). An error of its
 * MPI_Testall is gj_dp_finish's to return. */
int gj_dp_progress(gj_dp_sync *s, int poll_us, int *on);
/* Start a step's reduction. */
void gj_dp_begin(gj_dp_sync *s);
/* The gradients [lo, hi) are final: reduce them, with the ranges reported before that join
 * them from above, once they make a bucket (a range that does not join them starts the pending
 * ones). Suitable as the model's grad_ready hook (g, where the model says the range is, is the
 * block's own: s->grads + lo). */
int gj_dp_ready(void *s, size_t lo, size_t hi, float *g);
/* Start whatever remains and wait for everything. */
int gj_dp_finish(gj_dp_sync *s);
/* Sum g[0, n), the block's [lo, lo + n), over DP now (blocking), in s's precision: the
 * optimizer in backward's parts. */
int gj_dp_sum(gj_dp_sync *s, float *g, size_t lo, size_t n);

/* ZeRO-1. The block is split into dp contiguous ranges of P floats (n = P dp). The gradients
 * are summed as without it (gj_dp_ready, gj_dp_finish: all-reduces overlapped with backward),
 * and each rank updates its range. A reduce-scatter would send half the bytes, but Open MPI's
 * non-blocking reduces progress only inside MPI calls, few during backward: measured (gptj-125m,
 * DP 2, one core a rank) 0.40 s of a 1.70 s step left to wait after backward, against 0.02 s of
 * 1.60 s with the all-reduces (a blocking reduce-scatter after backward: 0.88 s of 2.02 s).
 * With the progress thread (gj_dp_progress) measured again, as MPI_Ireduce of each bucket's
 * pieces to their range's owner (gptj-125m at B 1, T 128, DP 2 over two network namespaces,
 * one core a rank, `gptj bench --zero 1`, 5 steps): over a 1 Gbit/s link 7.97 / 8.02 s a step
 * with the all-reduces against 6.52 / 6.42 s; over the unlimited link 2.74 / 2.76 s against
 * 2.88 / 3.10 s. At 2 ranks libnbc reduces large messages by its chain algorithm, in 8 KB
 * fragments, each of which waits for a test of the thread; its binomial one (the whole piece in
 * one message, OMPI_MCA_coll_libnbc_ireduce_algorithm=2) is the reverse: 2.71 s unlimited,
 * 7.84 s at 1 Gbit/s. Neither is better on both links, so the all-reduces stay. Measured
 * again in bf16 with the bf16 all-gather (gj_dp_gather16), the pieces cut at the ranges' ends
 * and reduced to their owner (libnbc's default), 3-5 steps, two rounds each: 1 Gbit/s 5.61 /
 * 5.32 s against 6.93 / 7.09 s, the unlimited link 2.50 / 2.57 s against 2.33 / 2.27 s. An
 * option for slow networks (gj_dp_reduce_to_owners, --zero-reduce owner), not the default: as
 * built, at 1 Gbit/s gptj-125m 5.45 / 5.37 s against 7.04 / 6.99 s, gptj-350m 12.72 / 12.94 s
 * against 18.03 / 18.05 s, DP 4 (two ranks a node) 8.67 / 8.67 s against 9.37 / 9.15 s;
 * unlimited 2.80 / 3.10 s against 2.63 / 2.45 s (over five pairs the ratio's median 1.10; a
 * shorter --dp-poll-us, 100 or 20, no better). libnbc's binomial ireduce gave 2.34 / 2.62 s
 * unlimited and 6.83 / 6.80 s at 1 Gbit/s, its Rabenseifner 2.94 / 3.00 s and 5.68 / 5.67 s:
 * its default (the chain) stays. */
/* ZeRO-1 over a slow network: from now on each bucket is cut at the ends of the ranges of P
 * floats (n = P dp) and each piece summed onto its range's owner only (MPI_Ireduce), half the
 * bytes of an all-reduce; the rest of the block holds this rank's own gradients (or, in bf16,
 * their rounded values in its first bytes) and must not be read. The embedding's rows (where
 * it is held as rows) are still all-reduced (small). Not for gj_dp_sum (the optimizer in backward excludes ZeRO-1). */
int gj_dp_reduce_to_owners(gj_dp_sync *s, size_t P);
/* Every rank's range [r P, (r+1) P) of buf to all ranks (the updated parameters), after the
 * update, in place. Measured (gptj-125m, DP 2, one core a rank, three interleaved rounds): the
 * optimizer's time with it 0.095-0.109 s, against 0.204-0.253 s with MPI_Allgather through a
 * staging buffer, and a step as long as without ZeRO-1. Not overlapped with the next forward:
 * Open MPI progresses non-blocking collectives only inside MPI calls, which a forward at TP 1
 * does not make (tried: the pieces completed in the first MPI call after the step). */
int gj_dp_allgather(gj_dp_sync *s, float *buf, size_t P);
/* bf16 training under ZeRO-1: from now on the all-gather sends the GEMM weights of table l
 * (gj_tensor_has_w16) in bfloat16, half their bytes, the rest (the embedding, LayerNorms,
 * biases) in float32. Each owner rounds its range's weights, nearest even, as the GEMM door
 * rounds every operand in bf16; the other ranks widen them into place. Every product then
 * reads the bits it would have read after a float32 all-gather, so training is the same bit
 * for bit; what differs is that a rank holds the exact float32 values of those weights only in
 * its own range (the checkpoint writes each range from its owner: gj_state's params16). The bf16
 * values travel through the gradient block (s's grads, which must exist), idle from the update
 * to the next step's backward: no staging memory. */
int gj_dp_gather16(gj_dp_sync *s, const gj_layout *l);
/* For tests: gj_trainer_init leaves ZeRO-1's all-gather in float32 in bf16 training too. */
void gj_dp_test_gather_f32(int on);

#endif
