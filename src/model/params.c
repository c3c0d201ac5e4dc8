#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int add(gj_layout *l, int cap, const char *name, int ndim, int64_t rows, int64_t cols,
               enum gj_shard shard, enum gj_init init, int tp, int tr) {
  if (l->n >= cap) return GJ_FAIL("internal: parameter table overflow");
  gj_tensor *t = &l->t[l->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim, t->rows = rows, t->cols = cols, t->shard = shard, t->init = init;
  t->lrows = rows, t->lcols = cols;
  if (shard == GJ_SHARD_ROWS) t->lrows = gj_split(rows, tp, tr, &t->row0);
  if (shard == GJ_SHARD_COLS) t->lcols = gj_split(cols, tp, tr, &t->col0);
  t->numel = (size_t)t->lrows * t->lcols;
  t->decay = ndim == 2;
  t->offset = l->numel;
  l->numel += (t->numel + 15) / 16 * 16; /* 64-byte aligned tensors */
  l->n_global += rows * cols;
  return 0;
}

/* The names of a block's tensors and of the tail's, in table order (params.h). */
static const char *const block_suffix[GJ_BLOCK_TENSORS] = {
    [GJ_BLK_LN1_W] = "ln_1.weight", [GJ_BLK_LN1_B] = "ln_1.bias",
    [GJ_BLK_WQ] = "attn.q_proj.weight", [GJ_BLK_WK] = "attn.k_proj.weight",
    [GJ_BLK_WV] = "attn.v_proj.weight", [GJ_BLK_WO] = "attn.out_proj.weight",
    [GJ_BLK_FC_IN_W] = "mlp.fc_in.weight", [GJ_BLK_FC_IN_B] = "mlp.fc_in.bias",
    [GJ_BLK_FC_OUT_W] = "mlp.fc_out.weight", [GJ_BLK_FC_OUT_B] = "mlp.fc_out.bias"};
static const char *const tail_name[GJ_TAIL_TENSORS] = {
    [GJ_TAIL_LNF_W] = "transformer.ln_f.weight", [GJ_TAIL_LNF_B] = "transformer.ln_f.bias",
    [GJ_TAIL_LM_W] = "lm_head.weight", [GJ_TAIL_LM_B] = "lm_head.bias"};

int gj_layout_build(gj_layout *l, const gj_config *c, int tp, int tr) {
  memset(l, 0, sizeof *l);
  /* the bounds of a valid config keep every size below (table entries, numels, the
   * global count) far from overflowing */
  GJ_TRY(gj_config_check_sizes(c));
  if (tp < 1 || tr < 0 || tr >= tp) return GJ_FAIL("internal: TP rank %d of %d", tr, tp);
  if (c->n_head % tp)
    return GJ_FAIL("--tp %d does not divide n_head %lld", tp, (long long)c->n_head);
  if (c->n_inner % tp)
    return GJ_FAIL("--tp %d does not divide n_inner %lld", tp, (long long)c->n_inner);
  if (c->vocab_size < tp) /* the vocabulary's rows are split unevenly, but none may be empty */
    return GJ_FAIL("--tp %d is larger than vocab_size %lld", tp, (long long)c->vocab_size);
  int cap = gj_layout_count(c->n_layer); /* n_layer <= GJ_MAX_LAYER */
  l->t = calloc(cap, sizeof *l->t);
  if (!l->t) return GJ_FAIL("out of memory building the parameter table");
  int64_t V = c->vocab_size, D = c->n_embd, F = c->n_inner;
  char nm[64];
  GJ_TRY(add(l, cap, "transformer.wte.weight", 2, V, D, GJ_SHARD_ROWS, GJ_INIT_EMBED, tp, tr));
  for (int i = 0; i < c->n_layer; i++) {
#define ADD(k, nd, r, cc, sh, in)                                                            \
  snprintf(nm, sizeof nm, "transformer.h.%d.%s", i, block_suffix[k]);                        \
  GJ_TRY(add(l, cap, nm, nd, r, cc, sh, in, tp, tr))
    ADD(GJ_BLK_LN1_W, 1, D, 1, GJ_SHARD_NONE, GJ_INIT_ONE);
    ADD(GJ_BLK_LN1_B, 1, D, 1, GJ_SHARD_NONE, GJ_INIT_ZERO);
    ADD(GJ_BLK_WQ, 2, D, D, GJ_SHARD_ROWS, GJ_INIT_LINEAR);
    ADD(GJ_BLK_WK, 2, D, D, GJ_SHARD_ROWS, GJ_INIT_LINEAR);
    ADD(GJ_BLK_WV, 2, D, D, GJ_SHARD_ROWS, GJ_INIT_LINEAR);
    ADD(GJ_BLK_WO, 2, D, D, GJ_SHARD_COLS, GJ_INIT_PROJ);
    ADD(GJ_BLK_FC_IN_W, 2, F, D, GJ_SHARD_ROWS, GJ_INIT_LINEAR);
    ADD(GJ_BLK_FC_IN_B, 1, F, 1, GJ_SHARD_ROWS, GJ_INIT_ZERO);
    ADD(GJ_BLK_FC_OUT_W, 2, D, F, GJ_SHARD_COLS, GJ_INIT_PROJ);
    ADD(GJ_BLK_FC_OUT_B, 1, D, 1, GJ_SHARD_NONE, GJ_INIT_ZERO);
#undef ADD
  }
#define ADD(k, nd, r, cc, sh, in) GJ_TRY(add(l, cap, tail_name[k], nd, r, cc, sh, in, tp, tr))
  ADD(GJ_TAIL_LNF_W, 1, D, 1, GJ_SHARD_NONE, GJ_INIT_ONE);
  ADD(GJ_TAIL_LNF_B, 1, D, 1, GJ_SHARD_NONE, GJ_INIT_ZERO);
  ADD(GJ_TAIL_LM_W, 2, V, D, GJ_SHARD_ROWS, GJ_INIT_LINEAR);
  ADD(GJ_TAIL_LM_B, 1, V, 1, GJ_SHARD_ROWS, GJ_INIT_ZERO);
#undef ADD
  return 0;
}

void gj_layout_free(gj_layout *l) {
  free(l->t);
  memset(l, 0, sizeof *l);
}

/* Constant time: the position of a name in the table follows from the name (layer number and
 * suffix, or one of the five tensors outside the blocks); the table entry then confirms it. */
const gj_tensor *gj_layout_find(const gj_layout *l, const char *name) {
  if (l->n < gj_layout_count(0)) return NULL;
  int n_layer = gj_layout_n_layer(l), i = -1;
  static const char pre[] = "transformer.h.";
  if (!strncmp(name, pre, sizeof pre - 1)) {
    const char *p = name + sizeof pre - 1;
    int64_t layer = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 6; p++, digits++) layer = layer * 10 + (*p - '0');
    if (digits == 0 || *p != '.' || layer >= n_layer) return NULL;
    for (int k = 0; k < GJ_BLOCK_TENSORS && i < 0; k++)
      if (!strcmp(p + 1, block_suffix[k])) i = gj_layout_block_index(layer, k);
  } else if (!strcmp(name, "transformer.wte.weight")) {
    i = GJ_LAYOUT_WTE;
  } else {
    for (int k = 0; k < GJ_TAIL_TENSORS && i < 0; k++)
      if (!strcmp(name, tail_name[k])) i = gj_layout_tail_index(n_layer, k);
  }
  return i >= 0 && i < l->n && !strcmp(l->t[i].name, name) ? &l->t[i] : NULL;
}

size_t gj_layout_part_max(const gj_layout *l) {
  size_t big = 0;
  for (int k = 0; k < gj_layout_parts(l); k++) big = GJ_MAX(big, gj_layout_part_hi(l, k) - gj_layout_part_lo(l, k));
  return big;
}

/* parts = 0: base + offset; parts = 1: base + (offset - the offset of the tensor's part) */
static void layout_ptrs(const gj_layout *l, const gj_config *c, float *base, int parts, gj_ptrs *p) {
  const int last = gj_layout_parts(l) - 1;
  p->wte = base + (l->t[GJ_LAYOUT_WTE].offset - (parts ? gj_layout_part_lo(l, last) : 0));
  for (int i = 0; i < c->n_layer; i++) {
    const gj_tensor *b = gj_layout_block(l, i, 0);
    size_t r = parts ? gj_layout_part_lo(l, (int)c->n_layer - i) : 0;
    gj_block_ptrs *h = &p->h[i];
    h->ln1_w = base + (b[GJ_BLK_LN1_W].offset - r), h->ln1_b = base + (b[GJ_BLK_LN1_B].offset - r);
    h->wq = base + (b[GJ_BLK_WQ].offset - r), h->wk = base + (b[GJ_BLK_WK].offset - r);
    h->wv = base + (b[GJ_BLK_WV].offset - r), h->wo = base + (b[GJ_BLK_WO].offset - r);
    h->fc_in_w = base + (b[GJ_BLK_FC_IN_W].offset - r), h->fc_in_b = base + (b[GJ_BLK_FC_IN_B].offset - r);
    h->fc_out_w = base + (b[GJ_BLK_FC_OUT_W].offset - r), h->fc_out_b = base + (b[GJ_BLK_FC_OUT_B].offset - r);
  }
  const gj_tensor *f = gj_layout_tail(l, 0);
  size_t r = parts ? gj_layout_part_lo(l, 0) : 0;
  p->lnf_w = base + (f[GJ_TAIL_LNF_W].offset - r), p->lnf_b = base + (f[GJ_TAIL_LNF_B].offset - r);
  p->lm_w = base + (f[GJ_TAIL_LM_W].offset - r), p->lm_b = base + (f[GJ_TAIL_LM_B].offset - r);
}

void gj_layout_ptrs(const gj_layout *l, const gj_config *c, float *base, gj_ptrs *p) {
  layout_ptrs(l, c, base, 0, p);
}

void gj_layout_ptrs_parts(const gj_layout *l, const gj_config *c, float *slot, gj_ptrs *p) {
  layout_ptrs(l, c, slot, 1, p);
}

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

/* Counter-based randomness (gj_mix64): a value is a pure function of (key, index, draw). */
static double uniform01(uint64_t key, uint64_t idx, uint64_t draw) {
  uint64_t r = gj_mix64(key ^ gj_mix64(idx * 4 + draw));
  return ((r >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0, 1) */
}

/* Standard normal truncated to [-2, 2] by rejection; draws are counted so the result
 * depends only on (key, idx). */
static double trunc_normal(uint64_t key, uint64_t idx) {
  for (uint64_t d = 0;; d += 2) {
    double u1 = uniform01(key, idx, d), u2 = uniform01(key + d, idx, d + 1);
    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    if (fabs(z) <= 2.0) return z;
  }
}

void gj_params_init_tensor(const gj_tensor *t, const gj_config *c, float *p, uint64_t seed) {
  double sigma = 0;
  switch (t->init) {
  case GJ_INIT_ZERO: memset(p, 0, t->numel * sizeof(float)); return;
  case GJ_INIT_ONE: for (size_t k = 0; k < t->numel; k++) p[k] = 1.0f; return;
  case GJ_INIT_LINEAR: sigma = 1.0 / sqrt((double)t->cols); break; /* fan_in = in features */
  case GJ_INIT_PROJ: sigma = (2.0 / c->n_layer) / sqrt((double)c->n_embd); break;
  case GJ_INIT_EMBED: sigma = 1.0 / sqrt((double)c->vocab_size); break;
  }
  uint64_t key = gj_mix64(seed) ^ hash_name(t->name);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < t->lrows; r++)
    for (int64_t cc = 0; cc < t->lcols; cc++) {
      uint64_t g = (uint64_t)(t->row0 + r) * t->cols + (t->col0 + cc);
      p[r * t->lcols + cc] = (float)(sigma * trunc_normal(key, g));
    }
}

void gj_params_init(const gj_layout *l, const gj_config *c, float *base, uint64_t seed) {
  for (int i = 0; i < l->n; i++) gj_params_init_tensor(&l->t[i], c, base + l->t[i].offset, seed);
}

int gj_tensor_has_w16(const gj_tensor *t) {
  return t->ndim == 2 && strcmp(t->name, "transformer.wte.weight") != 0;
}

size_t gj_layout_w16_numel(const gj_layout *l) {
  size_t n = 0;
  for (int i = 0; i < l->n; i++)
    if (gj_tensor_has_w16(&l->t[i])) n += l->t[i].numel;
  return n;
}

int gj_tensor_resident16(const gj_tensor *t) { return t->ndim == 2; }
