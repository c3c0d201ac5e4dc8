#include "parallel/dp.h"

#include <stdint.h>
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
  s->gend = malloc(s->gcap * sizeof(size_t));
  return s->req && s->greq && s->gend ? 0 : GJ_FAIL("out of memory");
}

void gj_dp_free(gj_dp_sync *s) {
  gj_dp_gather_wait(s, SIZE_MAX); /* every rank started it: it completes */
  free(s->req), free(s->greq), free(s->gend);
}

void gj_dp_begin(gj_dp_sync *s) {
  s->lo = s->hi = s->done = 0;
  s->nreq = 0;
  s->wait_s = 0;
  s->bytes = 0;
  s->gwait_s = 0;
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

int gj_dp_gather_start(gj_dp_sync *s, float *buf, size_t P) {
  gj_grid *g = s->g;
  const int dp = g->dp_size;
  if (dp == 1) return 0;
  if (s->gdone < s->gn) return GJ_FAIL("internal: an all-gather of the parameters is still in flight");
  s->gn = s->gdone = 0;
  for (int r = 0; r < dp; r++)
    for (size_t k = 0; k < P; k += s->bucket) {
      size_t c = GJ_MIN(s->bucket, P - k), a = (size_t)r * P + k;
      if (s->gn == s->gcap) return GJ_FAIL("internal: too many all-gather pieces");
      s->gend[s->gn] = a + c;
      GJ_MPI_TRY(MPI_Ibcast(buf + a, (int)c, MPI_FLOAT, r, g->dp, &s->greq[s->gn]),
                 "MPI_Ibcast(parameters)");
      s->gn++;
    }
  return 0;
}

int gj_dp_gather_wait(gj_dp_sync *s, size_t hi) {
  if (s->gdone == s->gn) return 0;
  int need = s->gdone;
  while (need < s->gn && (need == 0 ? 0 : s->gend[need - 1]) < hi) need++;
  if (need > s->gdone) {
    double t0 = gj_now();
    int rc = MPI_Waitall(need - s->gdone, s->greq + s->gdone, MPI_STATUSES_IGNORE);
    s->gwait_s += gj_now() - t0;
    if (rc != MPI_SUCCESS) {
      s->gdone = s->gn; /* not waited for again */
      return gj_mpi_fail(rc, "MPI_Waitall(parameters)");
    }
    s->gdone = need;
  }
  int flag = 0; /* let the library progress the rest */
  if (s->gdone < s->gn) MPI_Testall(s->gn - s->gdone, s->greq + s->gdone, &flag, MPI_STATUSES_IGNORE);
  if (flag) s->gdone = s->gn;
  return 0;
}

int gj_dp_params_ready(void *s, size_t hi) { return gj_dp_gather_wait(s, hi); }
