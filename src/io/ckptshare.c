#include "io/ckptshare.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common.h"
#include "io/crc32.h"
#include "parallel/gather.h"

uint32_t gj_ckptshare_crc_bytes(const void *p, size_t n) {
  const unsigned char *c = p;
  size_t piece = (size_t)8 << 20;
  int np = (int)GJ_MIN((n + piece - 1) / piece, (size_t)256);
  if (np <= 1) return gj_crc32(0, c, n);
  size_t len = (n + np - 1) / np;
  uLong part[256];
#pragma omp parallel for schedule(static)
  for (int i = 0; i < np; i++) {
    size_t lo = (size_t)i * len, hi = GJ_MIN(n, lo + len);
    part[i] = lo < hi ? gj_crc32(0, c + lo, hi - lo) : 0;
  }
  uLong r = part[0];
  for (int i = 1; i < np; i++) {
    size_t lo = (size_t)i * len, hi = GJ_MIN(n, lo + len);
    if (lo < hi) r = crc32_combine64(r, part[i], (z_off64_t)(hi - lo));
  }
  return (uint32_t)r;
}

static gj_replicas replicas(const gj_grid *g, const gj_tensor *t) {
  return gj_replicas_of(g, t->shard != GJ_SHARD_NONE);
}

/* The TP ranks whose slices make up the global tensor: 1 for a replicated one. */
static int tp_parts(const gj_grid *g, const gj_tensor *t) {
  return t->shard == GJ_SHARD_NONE ? 1 : g->tp_size;
}

/* Rows [*a, *b) of the local slice that replica k of n handles. */
static void replica_rows(const gj_tensor *t, int n, int k, int64_t unit, int64_t *a, int64_t *b) {
  int64_t end = t->row0 + t->lrows;
  int64_t cut[2];
  for (int j = 0; j < 2; j++) {
    int64_t kk = k + j;
    int64_t r = t->row0 + t->lrows * kk / n;
    if (kk > 0 && kk < n) r = GJ_MIN(end, GJ_MAX(t->row0, (r + unit - 1) / unit * unit));
    cut[j] = r - t->row0;
  }
  *a = cut[0], *b = cut[1];
}

void gj_ckptshare_rows(const gj_grid *g, const gj_tensor *t, int64_t unit, int64_t *a, int64_t *b) {
  gj_replicas r = replicas(g, t);
  replica_rows(t, r.n, r.k, unit, a, b);
}

int gj_ckptshare_gather_rows(gj_grid *g, const gj_tensor *t, float *local, int64_t unit) {
  gj_replicas r = replicas(g, t);
  if (r.n == 1) return 0;
  size_t *cnt = malloc(2 * (size_t)r.n * sizeof(size_t)), *dsp = cnt + r.n;
  if (!cnt) return GJ_FAIL("out of memory");
  for (int k = 0; k < r.n; k++) {
    int64_t a, b;
    replica_rows(t, r.n, k, unit, &a, &b);
    cnt[k] = (size_t)((b - a) * t->lcols), dsp[k] = (size_t)(a * t->lcols);
  }
  int rc = gj_allgatherv_f32(r.comm, local, cnt, dsp);
  free(cnt);
  return rc;
}

/* Whether a tensor's global rows interleave the TP slices (column-sharded at TP > 1): its
 * CRC is then assembled from one CRC per row segment, else from one per slice. */
static int crc_per_row(const gj_grid *g, const gj_tensor *t) {
  return t->shard == GJ_SHARD_COLS && g->tp_size > 1;
}

/* The last step of a tensor's CRC: slice holds, at this rank's TP position (0 for replicated
 * tensors), the CRC of its slice or of each row segment of it; exchange them over the TP group
 * and combine in global order. */
int gj_ckptshare_slices_crc(gj_grid *g, const gj_tensor *t, uint32_t *slice, uint32_t *out) {
  int tp = tp_parts(g, t);
  int64_t units = crc_per_row(g, t) ? t->lrows : 1;
  if (tp > 1) GJ_TRY(gj_allgather_u32(g->tp, slice, (size_t)units));
  uLong r = 0;
  if (units > 1) { /* global row i is the segments of row i of every TP rank */
    uLong *op = malloc((size_t)tp * sizeof *op);
    if (!op) return GJ_FAIL("out of memory");
    for (int q = 0; q < tp; q++)
      op[q] = crc32_combine_gen64((z_off64_t)((size_t)gj_split(t->cols, tp, q, NULL) * sizeof(float)));
    for (int64_t i = 0; i < t->lrows; i++)
      for (int q = 0; q < tp; q++) r = crc32_combine_op(r, slice[q * units + i], op[q]);
    free(op);
  } else { /* TP rank q's slice: its rows (gj_split: the vocabulary's may differ by one) */
    for (int q = 0; q < tp; q++)
      r = crc32_combine64(r, slice[q], (z_off64_t)((size_t)gj_split(t->rows, tp, q, NULL) * t->lcols * sizeof(float)));
  }
  *out = (uint32_t)r;
  return 0;
}

int64_t gj_ckptshare_slice_units(const gj_grid *g, const gj_tensor *t) {
  return crc_per_row(g, t) ? t->lrows : 1;
}
int gj_ckptshare_slice_parts(const gj_grid *g, const gj_tensor *t) { return tp_parts(g, t); }
int64_t gj_ckptshare_slice_at(const gj_grid *g, const gj_tensor *t) {
  return tp_parts(g, t) > 1 ? gj_ckptshare_slice_units(g, t) * g->tp_rank : 0;
}

/* The replicas of a slice checksum a share of its rows each (one CRC, or one per row segment),
 * exchange them, and the slices are combined by gj_ckptshare_slices_crc. */
int gj_ckptshare_crc(gj_grid *g, const gj_tensor *t, const float *local, uint32_t *out) {
  gj_replicas rep = replicas(g, t);
  int tp = tp_parts(g, t), per_row = crc_per_row(g, t);
  size_t seglen = (size_t)t->lcols * sizeof(float);
  int64_t units = per_row ? t->lrows : 1, nparts = per_row ? t->lrows : rep.n;
  uint32_t *slice = malloc((units * tp + nparts) * sizeof(uint32_t));
  size_t *cnt = malloc(2 * (size_t)rep.n * sizeof(size_t)), *dsp = cnt + rep.n;
  if (!slice || !cnt) return free(slice), free(cnt), GJ_FAIL("out of memory");
  uint32_t *part = slice + units * tp, *own = slice + (tp > 1 ? units * g->tp_rank : 0);
  int64_t a, b;
  for (int k = 0; k < rep.n; k++) {
    replica_rows(t, rep.n, k, 1, &a, &b);
    cnt[k] = per_row ? (size_t)(b - a) : 1, dsp[k] = per_row ? (size_t)a : (size_t)k;
  }
  replica_rows(t, rep.n, rep.k, 1, &a, &b);
  if (per_row) {
#pragma omp parallel for schedule(static) if (b - a > 64)
    for (int64_t i = a; i < b; i++) part[i] = gj_crc32(0, local + i * t->lcols, seglen);
  } else {
    part[rep.k] = gj_ckptshare_crc_bytes(local + a * t->lcols, (size_t)(b - a) * seglen);
  }
  int rc = gj_allgatherv_u32(rep.comm, part, cnt, dsp);
  if (!rc && per_row) {
    memcpy(own, part, t->lrows * sizeof(uint32_t));
  } else if (!rc) { /* the replicas' parts in order */
    uLong r = 0;
    for (int k = 0; k < rep.n; k++) {
      replica_rows(t, rep.n, k, 1, &a, &b);
      r = crc32_combine64(r, part[k], (z_off64_t)((b - a) * seglen));
    }
    own[0] = (uint32_t)r;
  }
  if (!rc) rc = gj_ckptshare_slices_crc(g, t, slice, out);
  free(slice), free(cnt);
  return rc;
}

void gj_ckptshare_owned(const gj_state *st, const gj_tensor *t, int r, int64_t *lo, int64_t *hi) {
  size_t P = st->n;
  size_t a = GJ_MAX(t->offset, r * P), b = GJ_MIN(t->offset + t->numel, (r + 1) * P);
  *lo = b > a ? (int64_t)(a - t->offset) : 0;
  *hi = b > a ? (int64_t)(b - t->offset) : 0;
}

void gj_ckptshare_keep_owned(const gj_state *st, const gj_tensor *t, const float *slice, float *moments) {
  size_t lo = GJ_MAX(t->offset, st->lo), hi = GJ_MIN(t->offset + t->numel, st->lo + st->n);
  for (size_t k = lo; k < hi; k++) moments[k - st->lo] = slice[k - t->offset];
}

/* Elements [lo, hi) of a local slice, cut where a CRC piece ends: at row ends when the
 * global rows interleave the TP slices (per_row), else nowhere. Calls fn for each piece. */
static size_t pieces(const gj_tensor *t, int64_t lo, int64_t hi, int per_row,
                     void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx) {
  size_t n = 0;
  while (lo < hi) {
    int64_t end = per_row ? GJ_MIN(hi, (lo / t->lcols + 1) * t->lcols) : hi;
    if (fn) fn(ctx, lo, end);
    lo = end, n++;
  }
  return n;
}

typedef struct {
  const float *base; /* element `off` of the local slice */
  int64_t off;
  uint32_t *crc;
  int64_t *start, *len; /* per piece, in elements of the local slice */
  size_t n;
} piece_ctx;

static void piece_crc(void *c, int64_t lo, int64_t hi) {
  piece_ctx *p = c;
  if (p->crc) p->crc[p->n] = gj_ckptshare_crc_bytes(p->base + (lo - p->off), (size_t)(hi - lo) * sizeof(float));
  if (p->start) p->start[p->n] = lo, p->len[p->n] = hi - lo;
  p->n++;
}

/* Each DP rank checksums its owned range in pieces, the pieces are gathered over DP and
 * combined into the slice's CRC (or its rows'), then gj_ckptshare_slices_crc as for gj_ckptshare_crc. */
int gj_ckptshare_owned_crc(const gj_state *st, gj_grid *g, const gj_tensor *t, const float *mine,
                           uint32_t *out) {
  int dp = g->dp_size, me = g->dp_rank;
  int tp = tp_parts(g, t), per_row = crc_per_row(g, t);
  int64_t lo, hi, units = per_row ? t->lrows : 1;
  size_t *pc = malloc(2 * (size_t)dp * sizeof(size_t)), *pd = pc + dp, np = 0;
  if (!pc) return GJ_FAIL("out of memory");
  for (int r = 0; r < dp; r++) {
    gj_ckptshare_owned(st, t, r, &lo, &hi);
    pd[r] = np, np += pc[r] = pieces(t, lo, hi, per_row, NULL, NULL);
  }
  uint32_t *crc = malloc(np * sizeof(uint32_t) + units * tp * sizeof(uint32_t));
  int64_t *start = malloc(2 * GJ_MAX(np, (size_t)1) * sizeof(int64_t));
  if (!crc || !start) return free(pc), free(crc), free(start), GJ_FAIL("out of memory");
  uint32_t *slice = crc + np, *own = slice + (tp > 1 ? units * g->tp_rank : 0);
  piece_ctx all = {NULL, 0, NULL, start, start + GJ_MAX(np, (size_t)1), 0};
  for (int r = 0; r < dp; r++) {
    gj_ckptshare_owned(st, t, r, &lo, &hi);
    pieces(t, lo, hi, per_row, piece_crc, &all);
  }
  gj_ckptshare_owned(st, t, me, &lo, &hi);
  piece_ctx my = {mine, lo, crc + pd[me], NULL, NULL, 0};
  pieces(t, lo, hi, per_row, piece_crc, &my);
  int rc = gj_allgatherv_u32(g->dp, crc, pc, pd);
  if (!rc) {
    for (int64_t i = 0; i < units; i++) own[i] = 0; /* the CRC of nothing */
    for (size_t k = 0; k < np; k++) {
      int64_t row = per_row ? start[k] / t->lcols : 0;
      own[row] = (uint32_t)crc32_combine64(own[row], crc[k], (z_off64_t)(all.len[k] * sizeof(float)));
    }
    rc = gj_ckptshare_slices_crc(g, t, slice, out);
  }
  free(pc), free(crc), free(start);
  return rc;
}
