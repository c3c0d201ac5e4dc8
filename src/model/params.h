/* The parameter table: every tensor by its Hugging Face name, its global shape, how tensor
 * parallelism splits it, and where this rank's slice lives in the arena. The same table drives
 * initialisation, sharding, gradients, optimizer state and checkpoints. */
#ifndef GJ_MODEL_PARAMS_H
#define GJ_MODEL_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

enum gj_shard { GJ_SHARD_NONE, GJ_SHARD_ROWS, GJ_SHARD_COLS };
enum gj_init { GJ_INIT_ZERO, GJ_INIT_ONE, GJ_INIT_LINEAR, GJ_INIT_PROJ, GJ_INIT_EMBED };

typedef struct {
  char name[64];
  int ndim;             /* 1 or 2 */
  int64_t rows, cols;   /* global; a 1-D tensor of n is rows = n, cols = 1 */
  enum gj_shard shard;
  int64_t lrows, lcols; /* this rank's slice */
  int64_t row0, col0;   /* the slice's global origin */
  size_t offset;        /* in floats, from the start of a parameter block */
  size_t numel;         /* local elements */
  int decay;            /* AdamW weight decay applies (2-D tensors) */
  enum gj_init init;
} gj_tensor;

/* The order of the table, which gj_layout_find, gj_layout_ptrs, the gradients' readiness in
 * backward (from the end of the block towards its start) and the checkpoints rely on:
 *   index 0                                  transformer.wte.weight
 *   1 + GJ_BLOCK_TENSORS * layer + k         transformer.h.<layer>.<k-th block tensor>
 *   1 + GJ_BLOCK_TENSORS * n_layer + k       the k-th tail tensor
 * with the tensors of a block and of the tail in the orders of the enums below. The offsets
 * in a parameter block increase with the index. Index arithmetic goes through the accessors
 * below and nowhere else. */
enum gj_block_tensor {
  GJ_BLK_LN1_W, GJ_BLK_LN1_B, GJ_BLK_WQ, GJ_BLK_WK, GJ_BLK_WV, GJ_BLK_WO,
  GJ_BLK_FC_IN_W, GJ_BLK_FC_IN_B, GJ_BLK_FC_OUT_W, GJ_BLK_FC_OUT_B,
  GJ_BLOCK_TENSORS
};
enum gj_tail_tensor { GJ_TAIL_LNF_W, GJ_TAIL_LNF_B, GJ_TAIL_LM_W, GJ_TAIL_LM_B, GJ_TAIL_TENSORS };
#define GJ_LAYOUT_WTE 0 /* the embedding's index */

/* Index of tensor k of block `layer`, of tail tensor k, and the number of tensors. */
static inline int gj_layout_block_index(int64_t layer, int k) {
  return 1 + GJ_BLOCK_TENSORS * (int)layer + k;
}
static inline int gj_layout_tail_index(int64_t n_layer, int k) {
  return gj_layout_block_index(n_layer, 0) + k;
}
static inline int gj_layout_count(int64_t n_layer) {
  return gj_layout_tail_index(n_layer, GJ_TAIL_TENSORS);
}

typedef struct {
  gj_tensor *t;
  int n;
  size_t numel;         /* local floats in one block, with alignment padding */
  int64_t n_global;     /* global parameter count */
} gj_layout;

/* Pointers into one block (parameters, or gradients) by role. Shapes are this rank's:
 * Dl = D/tp (local heads x head_dim), Fl = F/tp, Vl = this rank's vocabulary rows (gj_split). */
typedef struct {
  float *ln1_w, *ln1_b; /* [D] */
  float *wq, *wk, *wv;  /* [Dl, D] */
  float *wo;            /* [D, Dl] */
  float *fc_in_w;       /* [Fl, D] */
  float *fc_in_b;       /* [Fl] */
  float *fc_out_w;      /* [D, Fl] */
  float *fc_out_b;      /* [D], replicated */
} gj_block_ptrs;

typedef struct {
  float *wte;           /* [Vl, D] */
  gj_block_ptrs *h;     /* [n_layer] */
  float *lnf_w, *lnf_b; /* [D] */
  float *lm_w;          /* [Vl, D] */
  float *lm_b;          /* [Vl] */
} gj_ptrs;

/* The table's entries by role (l built for n_layer layers: l->n = gj_layout_count(n_layer)). */
static inline int gj_layout_n_layer(const gj_layout *l) {
  return (l->n - gj_layout_count(0)) / GJ_BLOCK_TENSORS;
}
static inline const gj_tensor *gj_layout_block(const gj_layout *l, int64_t layer, int k) {
  return &l->t[gj_layout_block_index(layer, k)];
}
static inline const gj_tensor *gj_layout_tail(const gj_layout *l, int k) {
  return &l->t[gj_layout_tail_index(gj_layout_n_layer(l), k)];
}

/* The parts of a parameter block that backward completes one after the other, from the top:
 * part 0 the head (ln_f and lm_head: [tail, numel)), part 1 + i block n_layer - 1 - i, the last
 * part (n_layer + 1) the embedding [0, block 0). Each is a range of offsets; together they
 * cover the block. Over a gradient slot (the optimizer in backward) each part's gradients in
 * turn are a tensor's offset minus its part's lo. */
static inline int gj_layout_parts(const gj_layout *l) { return gj_layout_n_layer(l) + 2; }
static inline size_t gj_layout_part_lo(const gj_layout *l, int k) {
  const int L = gj_layout_n_layer(l);
  return k == 0 ? gj_layout_tail(l, 0)->offset : k <= L ? gj_layout_block(l, L - k, 0)->offset : 0;
}
static inline size_t gj_layout_part_hi(const gj_layout *l, int k) {
  return k == 0 ? l->numel : gj_layout_part_lo(l, k - 1);
}
/* The floats of the largest part. */
size_t gj_layout_part_max(const gj_layout *l);

/* Build the table for a config at TP (tp_size, tp_rank). Checks that TP divides n_head,
 * n_inner and vocab_size. */
int gj_layout_build(gj_layout *l, const gj_config *c, int tp_size, int tp_rank);
void gj_layout_free(gj_layout *l);
const gj_tensor *gj_layout_find(const gj_layout *l, const char *name);
/* Point p (n_layer entries allocated by the caller in p->h) into block base. */
void gj_layout_ptrs(const gj_layout *l, const gj_config *c, float *base, gj_ptrs *p);
/* The same with every part (gj_layout_part_lo) starting at slot: a tensor at offset o of the
 * part starting at offset s is slot + (o - s). */
void gj_layout_ptrs_parts(const gj_layout *l, const gj_config *c, float *slot, gj_ptrs *p);

/* The tensors that bf16 precision multiplies from bfloat16 copies: the GEMM weights, every
 * 2-D tensor but the embedding (a lookup table). */
int gj_tensor_has_w16(const gj_tensor *t);
/* The elements of l's tensors that have a bf16 copy (gj_tensor_has_w16): the GEMM weights. */
size_t gj_layout_w16_numel(const gj_layout *l);
/* The tensors a bf16-resident state (inference in bf16, gj_state_create_weights16) holds in
 * bfloat16 only: the GEMM weights and the embedding (its lookup widens the rows it reads). */
int gj_tensor_resident16(const gj_tensor *t);

/* Initialise a block as GPT-J was trained (DESIGN.md §9); each element depends only on
 * (seed, tensor name, global index). */
void gj_params_init(const gj_layout *l, const gj_config *c, float *base, uint64_t seed);
/* The same for one tensor, into p [t->numel]. */
void gj_params_init_tensor(const gj_tensor *t, const gj_config *c, float *p, uint64_t seed);

#endif
