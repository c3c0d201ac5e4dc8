#include "model/rowgrad.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/embedding.h"

size_t gj_rowgrad_bytes(int64_t V, int64_t D, int64_t cap) {
  cap = GJ_MIN(cap, V);
  return (size_t)cap * (size_t)D * sizeof(float) + (size_t)cap * sizeof(int32_t) +
         (size_t)V * (sizeof(int32_t) + 1) + (size_t)D * sizeof(float);
}

int gj_rowgrad_create(gj_rowgrad *r, int64_t V, int64_t D, int64_t cap) {
  memset(r, 0, sizeof *r);
  if (V < 1 || D < 1 || cap < 1 || V > INT32_MAX)
    return GJ_FAIL("internal: embedding gradient rows [%lld, %lld], capacity %lld", (long long)V,
                   (long long)D, (long long)cap);
  cap = GJ_MIN(cap, V);
  r->V = V, r->D = D, r->cap = cap;
  r->row = malloc((size_t)cap * sizeof(int32_t));
  r->slot = malloc((size_t)V * sizeof(int32_t));
  r->mask = malloc((size_t)V);
  r->zero = calloc((size_t)D, sizeof(float));
  const size_t gbytes = (size_t)cap * (size_t)D * sizeof(float);
  if (posix_memalign((void **)&r->g, 64, gbytes)) r->g = NULL;
  else memset(r->g, 0, gbytes); /* touched once here: never a first-touch fault in a step */
  if (!r->row || !r->slot || !r->mask || !r->zero || !r->g) {
    gj_rowgrad_free(r);
    return GJ_FAIL("out of memory for %lld embedding gradient rows of %lld floats", (long long)cap,
                   (long long)D);
  }
  r->bytes = gj_rowgrad_bytes(V, D, cap);
  for (int64_t i = 0; i < V; i++) r->slot[i] = -1;
  return 0;
}

void gj_rowgrad_free(gj_rowgrad *r) {
  free(r->row), free(r->slot), free(r->mask), free(r->zero), free(r->g);
  memset(r, 0, sizeof *r);
}

void gj_rowgrad_clear(gj_rowgrad *r) {
  for (int64_t i = 0; i < r->n; i++) r->slot[r->row[i]] = -1;
  r->n = 0;
}

unsigned char *gj_rowgrad_mask(gj_rowgrad *r) {
  memset(r->mask, 0, (size_t)r->V);
  for (int64_t i = 0; i < r->n; i++) r->mask[r->row[i]] = 1;
  return r->mask;
}

int gj_rowgrad_expand(gj_rowgrad *r, const unsigned char *mask) {
  for (int64_t i = 0; i < r->n; i++)
    if (!mask[r->row[i]]) return GJ_FAIL("internal: an embedding gradient row missing from its union");
  int64_t u = 0;
  for (int64_t i = 0; i < r->V; i++) u += mask[i] != 0;
  if (u > r->cap)
    return GJ_FAIL("internal: %lld embedding gradient rows exceed their capacity %lld",
                   (long long)u, (long long)r->cap);
  const size_t D = (size_t)r->D;
  /* from the top down: a held row only moves up (the new order is a superset's), so the
   * rows not yet moved are never overwritten */
  int64_t i = r->n - 1, j = u - 1;
  for (int64_t row = r->V - 1; row >= 0 && j >= 0; row--) {
    if (!mask[row]) continue;
    float *dst = r->g + (size_t)j * D;
    if (i >= 0 && r->row[i] == row) {
      if (i != j) memmove(dst, r->g + (size_t)i * D, D * sizeof(float));
      i--;
    } else {
      memset(dst, 0, D * sizeof(float));
    }
    r->row[j] = (int32_t)row;
    r->slot[row] = (int32_t)j;
    j--;
  }
  r->n = u;
  return 0;
}

int gj_rowgrad_add(gj_rowgrad *r, const float *dout, const int32_t *ids, int64_t N, int64_t v0) {
  const int64_t V = r->V, D = r->D;
  int fresh = 0;
  for (int64_t i = 0; i < N && !fresh; i++) {
    int64_t row = (int64_t)ids[i] - v0;
    fresh = row >= 0 && row < V && r->slot[row] < 0;
  }
  if (fresh) { /* rows not held yet: hold the union */
    unsigned char *mask = gj_rowgrad_mask(r);
    for (int64_t i = 0; i < N; i++) {
      int64_t row = (int64_t)ids[i] - v0;
      if (row >= 0 && row < V) mask[row] = 1;
    }
    GJ_TRY(gj_rowgrad_expand(r, mask));
  }
  gj_embedding_backward(r->g, dout, ids, N, D, v0, V, r->slot);
  return 0;
}
