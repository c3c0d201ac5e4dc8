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

void *gj_arena_alloc(size_t bytes) {
  void *p = NULL;
  size_t align = (size_t)2 << 20;
  bytes = (bytes + align - 1) / align * align;
  if (posix_memalign(&p, align, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  memset(p, 0, bytes);
  return p;
}

static void *map_lazy(size_t bytes);

/* training = 0: the parameter block only; slot = 1: the gradients of one part of the network
 * at a time (gj_state_create_oib). */
static int create(gj_state *s, const gj_config *c, const gj_grid *g, int zero, int training,
                  int slot) {
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
  s->arena = gj_arena_alloc(s->bytes);
  if (!s->arena) {
    size_t need = s->bytes;
    gj_state_free(s);
    return GJ_FAIL("out of memory: parameter arena of %zu bytes", need);
  }
  s->params = s->arena;
  if (slot) s->gslot = s->arena + np, s->gslot_n = ng;
  else if (training) s->grads = s->arena + np;
  if (training) s->m = s->arena + np + ng, s->v = s->m + P;
  return 0;
}

int gj_state_create(gj_state *s, const gj_config *c, const gj_grid *g, int zero) {
  return create(s, c, g, zero, 1, 0);
}

int gj_state_create_oib(gj_state *s, const gj_config *c, const gj_grid *g, int slot) {
  GJ_TRY(create(s, c, g, 0, 1, slot));
  s->oib = 1;
  return 0;
}

int gj_state_create_weights(gj_state *s, const gj_config *c, const gj_grid *g) {
  return create(s, c, g, 0, 0, 0);
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

void gj_state_free(gj_state *s) {
  if (s->arena_map) munmap(s->arena, s->arena_map), s->arena = NULL;
  if (s->w16) munmap(s->w16, s->w16_bytes);
  free(s->arena);
  gj_layout_free(&s->lay);
  memset(s, 0, sizeof *s);
}

void gj_state_zero_grads(gj_state *s) {
  if (s->grads) memset(s->grads, 0, s->numel_pad * sizeof(float)); /* a slot: the model's part by part */
}
