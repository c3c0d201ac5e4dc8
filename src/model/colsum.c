#include "model/colsum.h"

#include <stdio.h>
#include <stdlib.h>

#include "common.h"

static __thread double *tl_part;
static __thread size_t tl_cap;

void gj_colsum_begin(gj_colsum *c, int64_t rows, int64_t width) {
  c->rows = rows, c->width = width;
  c->per = (rows + GJ_COLSUM_GROUPS - 1) / GJ_COLSUM_GROUPS;
  c->groups = (rows + c->per - 1) / c->per;
  size_t n = (size_t)c->groups * (size_t)width;
  if (n > tl_cap) {
    free(tl_part);
    if (posix_memalign((void **)&tl_part, 64, n * sizeof(double))) {
      fprintf(stderr, "gptj: error: out of memory for %zu column partial sums\n", n);
      abort();
    }
    tl_cap = n;
  }
  c->part = tl_part;
}

GJ_HOT
void gj_colsum_finish(const gj_colsum *c, float *dst, int64_t off, int64_t n) {
#pragma omp parallel for schedule(static) if (n * c->groups > 65536)
  for (int64_t j = 0; j < n; j++) {
    double s = 0;
    for (int64_t g = 0; g < c->groups; g++) s += c->part[g * c->width + off + j];
    dst[j] += (float)s;
  }
}
