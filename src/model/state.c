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

/* training = 0: the parameter block only; lazy = 1: the gradients in a mapping of their own
 * (gj_state_create_lazy_grads). */
static int create(gj_state *s, const gj_config *c, const gj_grid *g, int zero, int training,
                  int lazy) {
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
  lazy = lazy && training;
  s->bytes = (training ? (lazy ? 1 : 2) * np + 2 * P : np) * sizeof(float);
  s->arena = gj_arena_alloc(s->bytes);
  if (lazy) {
    s->grads_map = np * sizeof(float);
    s->grads = map_lazy(s->grads_map);
    if (!s->grads) s->grads_map = 0;
  }
  if (!s->arena || (lazy && !s->grads)) {
    size_t need = s->bytes + s->grads_map;
    gj_state_free(s);
    return GJ_FAIL("out of memory: parameter arena of %zu bytes", need);
  }
  s->params = s->arena;
  if (training && !lazy) s->grads = s->arena + np;
  if (training) s->m = s->arena + (lazy ? 1 : 2) * np, s->v = s->m + P;
  return 0;
}

int gj_state_create(gj_state *s, const gj_config *c, const gj_grid *g, int zero) {
  return create(s, c, g, zero, 1, 0);
}

int gj_state_create_lazy_grads(gj_state *s, const gj_config *c, const gj_grid *g) {
  return create(s, c, g, 0, 1, 1);
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
  /* the parts backward reports final: [tail, numel), each block, [0, block 0) */
  size_t hi = l.numel, big = 0;
  for (int64_t k = c->n_layer; k >= -1; k--) {
    size_t lo = k == c->n_layer ? gj_layout_tail(&l, 0)->offset : k >= 0 ? gj_layout_block(&l, k, 0)->offset : 0;
    big = GJ_MAX(big, hi - lo);
    hi = lo;
  }
  gj_layout_free(&l);
  *bytes = big * sizeof(float) + 2 * (size_t)sysconf(_SC_PAGESIZE); /* and the pages at its ends */
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
  if (s->grads_map) munmap(s->grads, s->grads_map);
  free(s->arena);
  gj_layout_free(&s->lay);
  memset(s, 0, sizeof *s);
}

void gj_state_zero_grads(gj_state *s) {
  if (s->grads_map) gj_state_release_grads(s, 0, s->numel_pad);
  else if (s->grads) memset(s->grads, 0, s->numel_pad * sizeof(float));
}

void gj_state_release_grads(gj_state *s, size_t lo, size_t hi) {
  if (!s->grads_map || lo >= hi) return;
  /* whole pages from the one holding lo (unless it also holds floats below lo, which may not
   * be consumed yet) up to the one holding hi - 1 (floats above hi were consumed before) */
  const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  size_t a = lo * sizeof(float), b = hi * sizeof(float);
  a = (a + pg - 1) / pg * pg;
  b = GJ_MIN((b + pg - 1) / pg * pg, (s->grads_map + pg - 1) / pg * pg);
  if (a < b) madvise((char *)s->grads + a, b - a, MADV_DONTNEED); /* reads as zero again */
}
