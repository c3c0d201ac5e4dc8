#include "model/state.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

void gj_state_sizes(size_t numel, int dp, int zero, size_t *np, size_t *P) {
  *np = *P = numel;
  if (zero && dp > 1) {
    *P = (numel + dp - 1) / dp;
    *P = (*P + 15) / 16 * 16;
    *np = *P * dp;
  }
}

/* gj_arena_alloc's allocation without the touch; *rounded: its bytes */
static void *arena_untouched(size_t bytes, size_t *rounded) {
  void *p = NULL;
  size_t align = (size_t)2 << 20;
  bytes = (bytes + align - 1) / align * align;
  if (posix_memalign(&p, align, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  *rounded = bytes;
  return p;
}

/* Zero [p, p + bytes) by every thread, 2 MB at a time: the first touch of fresh pages is
 * mostly the kernel's (and a hypervisor's) page faults, which run in parallel (on this 2-core
 * VM a 2 GB first touch ran at 0.4-2 GB/s on one thread). */
static void zero_parallel(void *p, size_t bytes) {
  char *c = p;
  const size_t chunk = (size_t)2 << 20;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes; i += chunk) memset(c + i, 0, GJ_MIN(chunk, bytes - i));
}

void *gj_arena_alloc(size_t bytes) {
  void *p = arena_untouched(bytes, &bytes);
  if (p) zero_parallel(p, bytes);
  return p;
}

/* The whole pages of [p, p + bytes): [*a, *b) (empty: *a >= *b). */
static void inner_pages(const void *p, size_t bytes, uintptr_t *a, uintptr_t *b) {
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  *a = ((uintptr_t)p + pg - 1) / pg * pg;
  *b = ((uintptr_t)p + bytes) / pg * pg;
}

static void *map_lazy(size_t bytes);
static int rows_shape(const gj_layout *l, const gj_config *c, int64_t tokens, int64_t *V,
                      int64_t *cap);

/* training = 0: the parameter block only; slot = 1: the gradients of one part of the network
 * at a time (gj_state_create_oib); rows_tokens > 0: the whole pages under the embedding's dense
 * gradient are not touched where rows for that many tokens will replace it (rows_shape;
 * gj_state_create_rows gives them back). */
static int create(gj_state *s, const gj_config *c, const gj_grid *g, int zero, int training,
                  int slot, int64_t rows_tokens) {
  memset(s, 0, sizeof *s);
  GJ_TRY(gj_config_validate(c));
  if (g->dp_size < 1) return GJ_FAIL("internal: DP size %d", g->dp_size);
  s->c = *c;
  GJ_TRY(gj_layout_build(&s->lay, c, g->tp_size, g->tp_rank));
  size_t np, P;
  s->zero = zero && g->dp_size > 1;
  gj_state_sizes(s->lay.numel, g->dp_size, s->zero, &np, &P);
  s->numel_pad = np;
  s->lo = s->zero ? P * g->dp_rank : 0;
  s->n = training ? P : 0;
  slot = slot && training;
  /* the slot's floats, padded to 16 so that the moments stay 64-byte aligned */
  size_t ng = !training ? 0 : slot ? (gj_layout_part_max(&s->lay) + 15) / 16 * 16 : np;
  s->bytes = (np + ng + (training ? 2 * P : 0)) * sizeof(float);
  size_t rounded;
  s->arena = arena_untouched(s->bytes, &rounded);
  if (!s->arena) {
    size_t need = s->bytes;
    gj_state_free(s);
    return GJ_FAIL("out of memory: parameter arena of %zu bytes", need);
  }
  uintptr_t a = 0, b = 0; /* every page touched once, but these */
  int64_t V, cap;
  if (rows_tokens > 0 && training && !slot && s->lay.t[0].offset == 0 &&
      rows_shape(&s->lay, c, rows_tokens, &V, &cap))
    inner_pages(s->arena + np, s->lay.t[0].numel * sizeof(float), &a, &b);
  char *base = (char *)s->arena, *end = base + rounded;
  if (a < b) {
    zero_parallel(base, (size_t)((char *)a - base));
    zero_parallel((char *)b, (size_t)(end - (char *)b));
  } else {
    zero_parallel(base, rounded);
  }
  s->params = s->arena;
  if (slot) s->gslot = s->arena + np, s->gslot_n = ng;
  else if (training) s->grads = s->arena + np;
  if (training) s->m = s->arena + np + ng, s->v = s->m + P;
  return 0;
}

int gj_state_create(gj_state *s, const gj_config *c, const gj_grid *g, int zero) {
  return create(s, c, g, zero, 1, 0, 0);
}

int gj_state_create_oib(gj_state *s, const gj_config *c, const gj_grid *g, int slot) {
  GJ_TRY(create(s, c, g, 0, 1, slot, 0));
  s->oib = 1;
  return 0;
}

int gj_state_create_weights(gj_state *s, const gj_config *c, const gj_grid *g) {
  return create(s, c, g, 0, 0, 0, 0);
}

/* An anonymous mapping whose pages become resident when written (not before). */
static void *map_lazy(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE); /* fewer faults where whole 2 MB pages are written */
#endif
  return p;
}

/* The bytes of a layout's weights held bf16-resident: GEMM weights and the embedding in bf16,
 * the rest float32. */
static size_t resident16_bytes(const gj_layout *l) {
  size_t b = 0;
  for (int i = 0; i < l->n; i++)
    b += l->t[i].numel * (gj_tensor_resident16(&l->t[i]) ? sizeof(gj_bf16) : sizeof(float));
  return b;
}

int gj_state_weights16_bytes(const gj_config *c, int tp, size_t *bytes) {
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, c, tp, 0));
  *bytes = resident16_bytes(&l);
  gj_layout_free(&l);
  return 0;
}

int gj_state_oib_grad_bytes(const gj_config *c, int tp, size_t *bytes) {
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, c, tp, 0));
  *bytes = (gj_layout_part_max(&l) + 15) / 16 * 16 * sizeof(float);
  gj_layout_free(&l);
  return 0;
}

int gj_state_create_weights16(gj_state *s, const gj_config *c, const gj_grid *g) {
  memset(s, 0, sizeof *s);
  GJ_TRY(gj_config_validate(c));
  s->c = *c;
  GJ_TRY(gj_layout_build(&s->lay, c, g->tp_size, g->tp_rank));
  s->numel_pad = s->lay.numel;
  s->arena_map = s->numel_pad * sizeof(float), s->w16_bytes = s->numel_pad * sizeof(gj_bf16);
  s->arena = map_lazy(s->arena_map);
  s->w16 = map_lazy(s->w16_bytes);
  if (!s->arena || !s->w16) {
    size_t need = s->arena_map + s->w16_bytes;
    gj_state_free(s);
    return GJ_FAIL("out of address space: bf16 weights of %zu bytes", need);
  }
  s->params = s->arena;
  s->bytes = resident16_bytes(&s->lay);
  return 0;
}

/* The embedding's rows and their capacity for (layout, tokens); 0: rows would not be smaller
 * than the dense tensor (a step's tokens reach nearly every row of the shard). */
static int rows_shape(const gj_layout *l, const gj_config *c, int64_t tokens, int64_t *V,
                      int64_t *cap) {
  *V = (int64_t)(l->t[0].numel / (size_t)c->n_embd);
  *cap = GJ_MAX(GJ_MIN(tokens, *V), 1);
  return gj_rowgrad_bytes(*V, c->n_embd, *cap) < l->t[0].numel * sizeof(float);
}

int gj_state_train_grad_bytes(const gj_config *c, int tp, int oib, int64_t grad_accum,
                              int64_t tokens, size_t *grads) {
  if (oib && grad_accum == 1) return gj_state_oib_grad_bytes(c, tp, grads);
  if (oib) return 0; /* the whole block, the embedding's included */
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, c, tp, 0));
  int64_t V, cap;
  if (!rows_shape(&l, c, tokens, &V, &cap)) {
    gj_layout_free(&l);
    return 0;
  }
  *grads = *grads - l.t[0].numel * sizeof(float) + gj_rowgrad_bytes(V, c->n_embd, cap);
  gj_layout_free(&l);
  return 0;
}

int gj_state_embedding_rows(gj_state *s, int64_t tokens) {
  if (!s->grads || s->erows || s->oib || s->lay.t[0].offset != 0)
    return GJ_FAIL("internal: embedding gradient rows need a state with a gradient block, "
                   "without the optimizer in backward");
  int64_t V, cap;
  if (!rows_shape(&s->lay, &s->c, tokens, &V, &cap)) return 0; /* dense is as small */
  s->erows = malloc(sizeof *s->erows);
  if (!s->erows) return GJ_FAIL("out of memory");
  int rc = gj_rowgrad_create(s->erows, V, s->c.n_embd, cap);
  if (rc) {
    free(s->erows), s->erows = NULL;
    return rc;
  }
  /* the whole pages under the dense tensor: given back, and a fault if anything touches them */
  uintptr_t a, b;
  inner_pages(s->grads, s->lay.t[0].numel * sizeof(float), &a, &b);
  if (b > a && !madvise((void *)a, b - a, MADV_DONTNEED) && !mprotect((void *)a, b - a, PROT_NONE))
    s->hole = (void *)a, s->hole_len = b - a;
  s->bytes = s->bytes - s->hole_len + s->erows->bytes;
  return 0;
}

int gj_state_create_rows(gj_state *s, const gj_config *c, const gj_grid *g, int zero,
                         int64_t tokens) {
  GJ_TRY(create(s, c, g, zero, 1, 0, tokens));
  int rc = gj_state_embedding_rows(s, tokens);
  if (rc) gj_state_free(s);
  return rc;
}

void gj_state_free(gj_state *s) {
  if (s->hole) mprotect(s->hole, s->hole_len, PROT_READ | PROT_WRITE); /* before free() */
  if (s->erows) gj_rowgrad_free(s->erows), free(s->erows);
  if (s->arena_map) munmap(s->arena, s->arena_map), s->arena = NULL;
  if (s->w16) munmap(s->w16, s->w16_bytes);
  free(s->arena);
  gj_layout_free(&s->lay);
  memset(s, 0, sizeof *s);
}

void gj_state_zero_grads(gj_state *s) {
  if (!s->grads) return; /* a slot: the model's part by part */
  size_t e = s->erows ? s->lay.t[0].numel : 0, n = s->numel_pad - e;
  float *g = s->grads + e;
  /* by both threads' stores (a single memset of a 125M-model's gradients took 0.05 s) */
  zero_parallel(g, n * sizeof(float));
  if (s->erows) gj_rowgrad_clear(s->erows);
}
