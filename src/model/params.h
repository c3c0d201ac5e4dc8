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

typedef struct {
  gj_tensor *t;
  int n;
  size_t numel;         /* local floats in one block, with alignment padding */
  int64_t n_global;     /* global parameter count */
} gj_layout;

/* Pointers into one block (parameters, or gradients) by role. Shapes are this rank's:
 * Dl = D/tp (local heads x head_dim), Fl = F/tp, Vl = V/tp. */
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

/* Build the table for a config at TP (tp_size, tp_rank). Checks that TP divides n_head,
 * n_inner and vocab_size. */
int gj_layout_build(gj_layout *l, const gj_config *c, int tp_size, int tp_rank);
void gj_layout_free(gj_layout *l);
const gj_tensor *gj_layout_find(const gj_layout *l, const char *name);
/* Point p (n_layer entries allocated by the caller in p->h) into block base. */
void gj_layout_ptrs(const gj_layout *l, const gj_config *c, float *base, gj_ptrs *p);

/* Initialise a block as GPT-J was trained (DESIGN.md §9); each element depends only on
 * (seed, tensor name, global index). */
void gj_params_init(const gj_layout *l, const gj_config *c, float *base, uint64_t seed);

#endif
