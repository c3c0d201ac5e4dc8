/* Column sums over the rows of a matrix (bias and LayerNorm parameter gradients), computed by
 * the kernel that already reads the rows, and the same at any thread count: the rows are cut
 * into at most GJ_COLSUM_GROUPS groups fixed by the row count alone, a kernel's parallel loop
 * runs over the groups and sums each group's rows into the group's own double-precision row
 * of partial sums, and gj_colsum_finish adds the groups in order. */
#ifndef GJ_MODEL_COLSUM_H
#define GJ_MODEL_COLSUM_H
#include <stdint.h>

#define GJ_COLSUM_GROUPS 64

typedef struct {
  int64_t rows, per, groups; /* rows [g per, (g + 1) per) form group g */
  int64_t width;             /* partial sums a group: one or more rows of columns side by side */
  double *part;              /* [groups, width], thread-local scratch (grown, never shrunk) */
} gj_colsum;

/* Partials of `width` sums over `rows` rows (rows >= 1). Aborts with a message when out of
 * memory (as the GEMM door's scratch does). Not reentrant within a thread. */
void gj_colsum_begin(gj_colsum *c, int64_t rows, int64_t width);

/* Group g's rows and its partial sums, zeroed. */
static inline double *gj_colsum_group(const gj_colsum *c, int64_t g, int64_t *r0, int64_t *r1) {
  *r0 = g * c->per;
  *r1 = *r0 + c->per < c->rows ? *r0 + c->per : c->rows;
  double *s = c->part + g * c->width;
  for (int64_t j = 0; j < c->width; j++) s[j] = 0;
  return s;
}

/* dst[j] += the sum over the groups, in order, of partial off + j, for j < n. */
void gj_colsum_finish(const gj_colsum *c, float *dst, int64_t off, int64_t n);

#endif
