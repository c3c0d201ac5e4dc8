/* The embedding's gradient as rows: only the vocabulary rows the step's tokens touched.
 *
 * A step of N tokens touches at most N of the Vl rows of wte's gradient (a 50,400-row
 * vocabulary and 2,048 tokens: under 4%), so a training state keeps those rows only, ascending
 * by vocabulary row, in a buffer of `cap` rows: min(Vl, the tokens of a step on all DP ranks).
 * The gradient block's range of wte then has no memory (gj_state_embedding_rows). Every
 * consumer reads the rows as the dense tensor they stand for, absent rows zero, in the same
 * order of operations (the sum of squares, AdamW), so training is bit for bit that of the
 * dense gradient (up to the order in which MPI adds more than two DP ranks); the DP reduction sums the union of the ranks' rows (an OR of row masks first),
 * which also sends less than the whole table whenever the union is smaller. */
#ifndef GJ_MODEL_ROWGRAD_H
#define GJ_MODEL_ROWGRAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t V, D;    /* rows of the tensor (this TP shard's vocabulary) and columns */
  int64_t cap;     /* row capacity */
  int64_t n;       /* rows held */
  int32_t *row;    /* [cap] the rows held, ascending */
  int32_t *slot;   /* [V] where each row is held, or -1 */
  unsigned char *mask; /* [V] scratch: the rows of a union */
  float *g;        /* [cap, D] their gradients */
  float *zero;     /* [D] zeros: an absent row's gradient */
  size_t bytes;    /* allocated */
} gj_rowgrad;

int gj_rowgrad_create(gj_rowgrad *r, int64_t V, int64_t D, int64_t cap);
/* The bytes gj_rowgrad_create allocates for (V, D, cap): the rows, their ids, the slot map, the
 * mask and a zero row. */
size_t gj_rowgrad_bytes(int64_t V, int64_t D, int64_t cap);
void gj_rowgrad_free(gj_rowgrad *r);
/* No rows held (the gradient is zero). */
void gj_rowgrad_clear(gj_rowgrad *r);
/* r->mask = the rows held (1) and no other; returns it, for the caller to add rows to. */
unsigned char *gj_rowgrad_mask(gj_rowgrad *r);
/* Hold every row of mask (a superset of the rows held): rows move to their places in the
 * ascending order, new rows start at zero. Fails if they exceed the capacity. */
int gj_rowgrad_expand(gj_rowgrad *r, const unsigned char *mask);
/* gradient rows (ids - v0) += dout [N, D] for ids in [v0, v0 + V) (gj_embedding_backward into
 * the rows held: the same sums in the same order). */
int gj_rowgrad_add(gj_rowgrad *r, const float *dout, const int32_t *ids, int64_t N, int64_t v0);
/* The gradient of a row: its held values, or r->zero. */
static inline const float *gj_rowgrad_row(const gj_rowgrad *r, int64_t row) {
  int32_t s = r->slot[row];
  return s < 0 ? r->zero : r->g + (size_t)s * r->D;
}
#endif
