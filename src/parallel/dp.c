#include "parallel/dp.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

int gj_dp_init(gj_dp_sync *s, gj_grid *g, float *grads, size_t n, gj_rowgrad *rows, size_t skip,
               size_t bucket_floats) {
  memset(s, 0, sizeof *s);
  s->g = g, s->grads = grads, s->n = n;
  s->rows = rows, s->skip = rows ? skip : 0;
  s->bucket = bucket_floats ? bucket_floats : GJ_DP_BUCKET_FLOATS;
  /* a posted range of L >= bucket floats takes ceil(L / bucket) <= 2 L / bucket requests; the
   * shorter ones (the last, a range not adjacent to the one before) one each */
  s->cap = (int)(2 * (n / s->bucket) + 2 + 1024);
  s->req = malloc(s->cap * sizeof(MPI_Request));
  /* the pieces of the all-gather: ceil(P / bucket) <= P / bucket + 1 per rank */
  s->gcap = (int)(n / s->bucket + (size_t)g->dp_size + 1);
  s->greq = malloc(s->gcap * sizeof(MPI_Request));
  return s->req && s->greq ? 0 : GJ_FAIL("out of memory");
}

void gj_dp_free(gj_dp_sync *s) { free(s->req), free(s->greq); }

void gj_dp_begin(gj_dp_sync *s) {
  s->lo = s->hi = s->done = 0;
  s->nreq = 0;
  s->wait_s = 0;
  s->bytes = 0;
}

static int post(gj_dp_sync *s, size_t lo, size_t hi) {
  lo = GJ_MAX(lo, s->skip); /* rows: summed by rows_allreduce */
  for (size_t b = hi; b > lo;) {
    size_t a = b - lo > s->bucket ? b - s->bucket : lo;
    if (s->nreq == s->cap) return GJ_FAIL("internal: too many DP buckets");
    GJ_MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, s->grads + a, (int)(b - a), MPI_FLOAT, MPI_SUM, s->g->dp,
                              &s->req[s->nreq++]),
               "MPI_Iallreduce(gradients)");
    s->bytes += (double)(b - a) * sizeof(float);
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
  int flag; /* let the library progress what is in flight */
  if (s->nreq) MPI_Testall(s->nreq, s->req, &flag, MPI_STATUSES_IGNORE);
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
  int rc = MPI_Waitall(s->nreq, s->req, MPI_STATUSES_IGNORE);
  s->nreq = 0;
  if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Waitall(gradients)");
  rc = rows_allreduce(s);
  s->wait_s = gj_now() - t0;
  return rc;
}

/* Each rank's range goes as pieces of at most a bucket, each broadcast in place by its owner
 * (no staging copy; every count fits an int), all started at once, then waited for. */
int gj_dp_allgather(gj_dp_sync *s, float *buf, size_t P) {
  gj_grid *g = s->g;
  const int dp = g->dp_size;
  if (dp == 1) return 0;
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
