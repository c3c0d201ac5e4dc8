#include "parallel/dp.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "model/gemm.h"

/* ---- bfloat16 sums ---- */

/* The MPI reduction: io[i] = bf16(in[i] + io[i]), the float32 sum of the two widened values
 * rounded to nearest even (exact before the rounding unless their exponents differ by more
 * than 16). Commutative, so libnbc may run its Rabenseifner all-reduce on it. */
static void bf16_sum(void *in, void *io, int *len, MPI_Datatype *t) {
  (void)t;
  const gj_bf16 *a = in;
  gj_bf16 *b = io;
  const int n = *len;
#pragma omp simd
  for (int i = 0; i < n; i++) b[i] = gj_f32_to_bf16(gj_bf16_to_f32(a[i]) + gj_bf16_to_f32(b[i]));
}

enum { STAGE_PIECE = 1 << 16 }; /* floats a thread converts at a time */

/* x[0, n) (n <= the bucket) rounded to bfloat16 into x's first 2 n bytes: all of it is read
 * into the staging buffer before any of it is written. */
static void pack_bf16(gj_dp_sync *s, float *x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += STAGE_PIECE) gj_bf16_round(s->stage + c, x + c, GJ_MIN((size_t)STAGE_PIECE, n - c));
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += STAGE_PIECE)
    memcpy((char *)x + 2 * c, s->stage + c, 2 * GJ_MIN((size_t)STAGE_PIECE, n - c));
}

/* The reverse: the n bfloat16 values in x's first 2 n bytes widened into x[0, n). */
static void unpack_bf16(gj_dp_sync *s, float *x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += STAGE_PIECE)
    memcpy(s->stage + c, (const char *)x + 2 * c, 2 * GJ_MIN((size_t)STAGE_PIECE, n - c));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) x[i] = gj_bf16_to_f32(s->stage[i]);
}

int gj_dp_init(gj_dp_sync *s, gj_grid *g, float *grads, size_t n, gj_rowgrad *rows, size_t skip,
               size_t bucket_floats, int bf16) {
  memset(s, 0, sizeof *s);
  s->g = g, s->grads = grads, s->n = n;
  s->rows = rows, s->skip = rows ? skip : 0, s->f32_below = skip;
  s->bucket = bucket_floats ? bucket_floats : GJ_DP_BUCKET_FLOATS;
  /* a posted range of L >= bucket floats takes ceil(L / bucket) <= 2 L / bucket requests; the
   * shorter ones (the last, a range not adjacent to the one before) one each */
  s->cap = (int)(2 * (n / s->bucket) + 2 + 1024 + (size_t)g->dp_size); /* + the cuts at the
                                                                         * ranges' ends (owners) */
  s->req = malloc(s->cap * sizeof(MPI_Request));
  /* the pieces of the all-gather: ceil(P / bucket) <= P / bucket + 1 per rank */
  s->gcap = (int)(n / s->bucket + (size_t)g->dp_size + 1);
  s->greq = malloc(s->gcap * sizeof(MPI_Request));
  if (!s->req || !s->greq) return GJ_FAIL("out of memory");
  if (!bf16 || g->dp_size == 1) return 0;
  s->bf16 = 1;
  s->rng = malloc(2 * s->cap * sizeof(size_t));
  s->stage = malloc(s->bucket * sizeof(uint16_t));
  if (!s->rng || !s->stage) return GJ_FAIL("out of memory for the bf16 gradient reduction");
  GJ_MPI_TRY(MPI_Op_create(bf16_sum, 1, &s->op), "MPI_Op_create(bf16 sum)");
  s->op_made = 1;
  return 0;
}

/* ---- the progress thread ---- */

/* The thread tests the requests posted so far, [0, k), outside the lock: the main thread only
 * appends after them meanwhile, and waits for it to be out (busy 0) before it waits for them
 * itself. */
static void *poller(void *vs) {
  gj_dp_sync *s = vs;
  const struct timespec nap = {s->poll_us / 1000000, (long)(s->poll_us % 1000000) * 1000};
  pthread_mutex_lock(&s->mu);
  while (!s->quit) {
    if (!s->polling) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    const int k = s->nreq;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    int flag = 0;
    const int rc = MPI_Testall(k, s->req, &flag, MPI_STATUSES_IGNORE);
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    s->polls++;
    /* requests it completes are MPI_REQUEST_NULL to the main thread's MPI_Waitall, which then
     * cannot see their error: it is kept for gj_dp_finish */
    if (rc != MPI_SUCCESS && s->poll_rc == MPI_SUCCESS) s->poll_rc = rc;
    if (rc != MPI_SUCCESS) s->polling = 0;
    if (flag && rc == MPI_SUCCESS) s->polled_done++;
    if (flag && k == s->nreq) s->polling = 0; /* all done: until the next bucket */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int gj_dp_progress(gj_dp_sync *s, int poll_us, int *on) {
  *on = s->th_made;
  if (poll_us <= 0 || s->g->dp_size == 1 || s->th_made) return 0;
  int level = MPI_THREAD_SINGLE;
  GJ_MPI_TRY(MPI_Query_thread(&level), "MPI_Query_thread");
  if (level != MPI_THREAD_MULTIPLE) return 0;
  s->poll_us = poll_us, s->quit = 0, s->polling = 0, s->busy = 0, s->poll_rc = MPI_SUCCESS;
  if (pthread_mutex_init(&s->mu, NULL)) return GJ_FAIL("cannot make a mutex for the DP progress thread");
  if (pthread_cond_init(&s->cv, NULL))
    return pthread_mutex_destroy(&s->mu), GJ_FAIL("cannot make a condition for the DP progress thread");
  /* signals go to the other threads (the stop handlers' flags are the main loop's) */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&s->th, NULL, poller, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e) {
    pthread_cond_destroy(&s->cv), pthread_mutex_destroy(&s->mu);
    return GJ_FAIL("cannot start the DP progress thread: %s", strerror(e));
  }
  s->th_made = 1, *on = 1;
  return 0;
}

/* One more request in flight (req[nreq] made): the thread's from now on. */
static void posted(gj_dp_sync *s) {
  if (!s->th_made) {
    s->nreq++;
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->nreq++;
  if (!s->polling) s->polling = 1, pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* The thread stops testing and is out of MPI_Testall: the requests are the caller's. */
static void unpolled(gj_dp_sync *s) {
  if (!s->th_made) return;
  pthread_mutex_lock(&s->mu);
  s->polling = 0;
  while (s->busy) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

void gj_dp_free(gj_dp_sync *s) {
  if (s->th_made) {
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_cond_destroy(&s->cv), pthread_mutex_destroy(&s->mu);
    s->th_made = 0;
  }
  free(s->req), free(s->greq), free(s->rng), free(s->stage), free(s->g16);
  if (s->op_made) MPI_Op_free(&s->op); /* a zeroed gj_dp_sync (never initialised) has none */
  s->op_made = 0;
  s->req = s->greq = NULL, s->rng = NULL, s->stage = NULL, s->g16 = NULL, s->g16n = 0;
}

void gj_dp_begin(gj_dp_sync *s) {
  unpolled(s); /* after a step that failed before its finish: the thread lets go of its requests */
  s->poll_rc = MPI_SUCCESS;
  s->lo = s->hi = s->done = 0;
  s->nreq = 0;
  s->wait_s = 0;
  s->bytes = 0;
}

static int post(gj_dp_sync *s, size_t lo, size_t hi) {
  lo = GJ_MAX(lo, s->skip); /* rows: summed by rows_allreduce */
  for (size_t b = hi; b > lo;) {
    size_t a = b - lo > s->bucket ? b - s->bucket : lo;
    if (s->bf16 && a < s->f32_below && s->f32_below < b) a = s->f32_below; /* bf16 above, float32 below */
    const int root = s->owner_P ? (int)((b - 1) / s->owner_P) : -1; /* the range's owner: a piece within it */
    if (root >= 0) a = GJ_MAX(a, (size_t)root * s->owner_P);
    if (s->nreq == s->cap) return GJ_FAIL("internal: too many DP buckets");
    const int h = s->bf16 && a >= s->f32_below;
    if (s->bf16) s->rng[2 * s->nreq] = a, s->rng[2 * s->nreq + 1] = b;
    if (h) pack_bf16(s, s->grads + a, b - a);
    float *x = s->grads + a;
    const MPI_Datatype type = h ? MPI_UINT16_T : MPI_FLOAT;
    const MPI_Op op = h ? s->op : MPI_SUM;
    int rc;
    if (root < 0) rc = MPI_Iallreduce(MPI_IN_PLACE, x, (int)(b - a), type, op, s->g->dp, &s->req[s->nreq]);
    else if (root == s->g->dp_rank) rc = MPI_Ireduce(MPI_IN_PLACE, x, (int)(b - a), type, op, root, s->g->dp, &s->req[s->nreq]);
    else rc = MPI_Ireduce(x, NULL, (int)(b - a), type, op, root, s->g->dp, &s->req[s->nreq]);
    if (rc != MPI_SUCCESS)
      return gj_mpi_fail(rc, root < 0 ? (h ? "MPI_Iallreduce(gradients, bf16)" : "MPI_Iallreduce(gradients)")
                                      : (h ? "MPI_Ireduce(gradients, bf16)" : "MPI_Ireduce(gradients)"));
    posted(s);
    s->bytes += (double)(b - a) * (h ? 2 : sizeof(float));
    b = a;
  }
  return 0;
}

int gj_dp_ready(void *vs, size_t lo, size_t hi, float *g) {
  gj_dp_sync *s = vs;
  (void)g; /* the block's own: s->grads + lo */
  if (s->g->dp_size == 1) return 0;
  s->done += hi - lo;
  if (hi != s->lo) { /* not right below the pending range: that goes now */
    if (s->lo < s->hi) GJ_TRY(post(s, s->lo, s->hi));
    s->hi = hi;
  }
  s->lo = lo;
  /* Post only whole buckets now; small tails join the next range. */
  if (s->hi - s->lo >= s->bucket || lo == 0) {
    GJ_TRY(post(s, s->lo, s->hi));
    s->hi = s->lo;
  }
  int flag; /* let the library progress what is in flight (the thread's, where it runs) */
  if (s->nreq && !s->th_made) MPI_Testall(s->nreq, s->req, &flag, MPI_STATUSES_IGNORE);
  return 0;
}

/* The embedding's rows summed over DP: every rank holds the union of the ranks' rows (an OR
 * of row masks), in the same order, then one all-reduce of those rows. */
static int rows_allreduce(gj_dp_sync *s) {
  gj_rowgrad *r = s->rows;
  if (!r) return 0;
  unsigned char *mask = gj_rowgrad_mask(r);
  GJ_TRY(gj_allreduce_inplace(s->g->dp, mask, (size_t)r->V, MPI_UNSIGNED_CHAR, MPI_BOR));
  GJ_TRY(gj_rowgrad_expand(r, mask));
  size_t nf = (size_t)r->n * (size_t)r->D;
  GJ_TRY(gj_allreduce_inplace(s->g->dp, r->g, nf, MPI_FLOAT, MPI_SUM));
  s->bytes += (double)r->V + (double)nf * sizeof(float);
  return 0;
}

int gj_dp_finish(gj_dp_sync *s) {
  if (s->g->dp_size == 1) return 0;
  if (s->done != s->n)
    return GJ_FAIL("internal: backward reported %zu of %zu gradients final", s->done, s->n);
  if (s->lo < s->hi) {
    GJ_TRY(post(s, s->lo, s->hi));
    s->hi = s->lo;
  }
  double t0 = gj_now();
  unpolled(s); /* the rest is waited for here */
  int rc = MPI_Waitall(s->nreq, s->req, MPI_STATUSES_IGNORE);
  const int nreq = s->nreq;
  s->nreq = 0;
  if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Waitall(gradients)");
  if (s->poll_rc != MPI_SUCCESS) return gj_mpi_fail(s->poll_rc, "MPI_Testall(gradients, the DP progress thread)");
  if (s->bf16)
    for (int r = 0; r < nreq; r++) {
      const size_t a = s->rng[2 * r], b = s->rng[2 * r + 1];
      /* reduced to their owner: the other ranks' pieces hold their own rounded gradients */
      if (a >= s->f32_below && (!s->owner_P || a / s->owner_P == (size_t)s->g->dp_rank))
        unpack_bf16(s, s->grads + a, b - a);
    }
  rc = rows_allreduce(s);
  s->wait_s = gj_now() - t0;
  return rc;
}

int gj_dp_reduce_to_owners(gj_dp_sync *s, size_t P) {
  if (s->g->dp_size == 1) return 0;
  if (!P || P * (size_t)s->g->dp_size != s->n)
    return GJ_FAIL("internal: ZeRO-1's ranges of %zu floats do not make the block of %zu", P, s->n);
  s->owner_P = P;
  return 0;
}

int gj_dp_sum(gj_dp_sync *s, float *g, size_t lo, size_t n) {
  if (s->g->dp_size == 1) return 0;
  if (s->owner_P) return GJ_FAIL("internal: gj_dp_sum reduces to every rank, not to the owners");
  /* float32: all of it, or the part of it below f32_below */
  size_t off = !s->bf16 ? n : lo >= s->f32_below ? 0 : GJ_MIN(n, s->f32_below - lo);
  GJ_TRY(gj_allreduce_inplace(s->g->dp, g, off, MPI_FLOAT, MPI_SUM));
  for (; off < n; off += s->bucket) {
    size_t m = GJ_MIN(s->bucket, n - off);
    pack_bf16(s, g + off, m);
    GJ_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, g + off, (int)m, MPI_UINT16_T, s->op, s->g->dp),
               "MPI_Allreduce(gradients, bf16)");
    unpack_bf16(s, g + off, m);
  }
  return 0;
}

/* Each rank's range goes as pieces of at most a bucket, each broadcast in place by its owner
 * (no staging copy; every count fits an int), all started at once, then waited for. */
static int allgather16(gj_dp_sync *s, float *buf, size_t P);

int gj_dp_allgather(gj_dp_sync *s, float *buf, size_t P) {
  gj_grid *g = s->g;
  const int dp = g->dp_size;
  if (dp == 1) return 0;
  if (s->g16n) return allgather16(s, buf, P);
  int n = 0;
  for (int r = 0; r < dp; r++)
    for (size_t k = 0; k < P; k += s->bucket) {
      if (n == s->gcap) return GJ_FAIL("internal: too many all-gather pieces");
      GJ_MPI_TRY(MPI_Ibcast(buf + (size_t)r * P + k, (int)GJ_MIN(s->bucket, P - k), MPI_FLOAT, r, g->dp,
                            &s->greq[n]),
                 "MPI_Ibcast(parameters)");
      n++;
    }
  GJ_MPI_TRY(MPI_Waitall(n, s->greq, MPI_STATUSES_IGNORE), "MPI_Waitall(parameters)");
  return 0;
}

/* ---- ZeRO-1's all-gather with the GEMM weights in bfloat16 ---- */

static int g_gather_f32; /* gj_dp_test_gather_f32 */

void gj_dp_test_gather_f32(int on) { g_gather_f32 = on; }

int gj_dp_gather16(gj_dp_sync *s, const gj_layout *l) {
  if (g_gather_f32 || s->g->dp_size == 1) return 0;
  if (!s->grads) return GJ_FAIL("internal: the bf16 all-gather stages in the gradient block");
  free(s->g16);
  s->g16 = malloc(2 * (size_t)l->n * sizeof(size_t) + 1);
  if (!s->g16) return GJ_FAIL("out of memory");
  s->g16n = 0;
  for (int i = 0; i < l->n; i++) { /* the table's order is the block's: runs, adjacent ones joined */
    const gj_tensor *t = &l->t[i];
    if (!gj_tensor_has_w16(t) || !t->numel) continue;
    if (s->g16n && s->g16[2 * s->g16n - 1] == t->offset) s->g16[2 * s->g16n - 1] += t->numel;
    else s->g16[2 * s->g16n] = t->offset, s->g16[2 * s->g16n + 1] = t->offset + t->numel, s->g16n++;
  }
  return 0;
}

/* From x (below end): the end of the stretch of one kind, at most a bucket; *h = 1 inside a
 * bf16 range. */
static size_t stretch(const gj_dp_sync *s, size_t x, size_t end, int *h) {
  size_t lo = 0, hi = s->g16n; /* the first range that ends above x */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->g16[2 * mid + 1] <= x) lo = mid + 1;
    else hi = mid;
  }
  *h = lo < s->g16n && s->g16[2 * lo] <= x;
  size_t y = lo == s->g16n ? end : GJ_MIN(end, s->g16[2 * lo + *h]);
  return GJ_MIN(y, x + s->bucket);
}

/* One more all-gather request: the array grows as needed. */
static MPI_Request *greq_slot(gj_dp_sync *s, int n) {
  if (n == s->gcap) {
    if (s->gcap > INT32_MAX / 2) return NULL;
    MPI_Request *r = realloc(s->greq, 2 * (size_t)s->gcap * sizeof(MPI_Request));
    if (!r) return NULL;
    s->greq = r, s->gcap *= 2;
  }
  return &s->greq[n];
}

/* Every stretch of one kind a piece broadcast by its owner, all at once: float32 ones in place;
 * a bf16 stretch [x, y) through the first half of the gradient block's [x, y), idle between the
 * update and the next step's backward (which zeroes it first), never the embedding's rows
 * (float32): the owner rounds into it, the others receive there and widen into place once
 * everything has arrived. */
static int allgather16(gj_dp_sync *s, float *buf, size_t P) {
  gj_grid *g = s->g;
  const int dp = g->dp_size, me = g->dp_rank;
  int n = 0;
  for (int r = 0; r < dp; r++)
    for (size_t x = (size_t)r * P, y, b = x + P; x < b; x = y) {
      int h;
      y = stretch(s, x, b, &h);
      MPI_Request *q = greq_slot(s, n);
      if (!q) return GJ_FAIL("out of memory for the all-gather's requests");
      int e;
      if (!h) {
        e = MPI_Ibcast(buf + x, (int)(y - x), MPI_FLOAT, r, g->dp, q);
      } else {
        uint16_t *st = (uint16_t *)(s->grads + x);
        if (r == me) {
#pragma omp parallel for schedule(static)
          for (size_t c = x; c < y; c += STAGE_PIECE)
            gj_bf16_round(st + (c - x), buf + c, GJ_MIN((size_t)STAGE_PIECE, y - c));
        }
        e = MPI_Ibcast(st, (int)(y - x), MPI_UINT16_T, r, g->dp, q);
      }
      GJ_MPI_TRY(e, h ? "MPI_Ibcast(parameters, bf16)" : "MPI_Ibcast(parameters)");
      n++;
    }
  GJ_MPI_TRY(MPI_Waitall(n, s->greq, MPI_STATUSES_IGNORE), "MPI_Waitall(parameters)");
  for (int r = 0; r < dp; r++) {
    if (r == me) continue;
    for (size_t x = (size_t)r * P, y, b = x + P; x < b; x = y) {
      int h;
      y = stretch(s, x, b, &h);
      if (!h) continue;
      const uint16_t *st = (const uint16_t *)(s->grads + x);
#pragma omp parallel for schedule(static)
      for (size_t i = x; i < y; i++) buf[i] = gj_bf16_to_f32(st[i - x]);
    }
  }
  return 0;
}
