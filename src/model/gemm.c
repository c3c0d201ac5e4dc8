#include "model/gemm.h"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

/* ---- CPU features ---- */

static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

/* Linux keeps AMX tile data off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM). */
static int amx_permitted(void) {
  static int done = -1;
  int r;
#pragma omp critical(gj_amx_perm)
  {
    if (done < 0) done = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    r = done;
  }
  return r;
}

void gj_cpu_detect(gj_cpu_features *f) {
  memset(f, 0, sizeof *f);
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1;
  if (!osxsave) return;
  uint64_t xcr0 = xgetbv0();
  int ymm = (xcr0 & 6) == 6, zmm = ymm && (xcr0 & 0xe0) == 0xe0, tiles = (xcr0 & 0x60000) == 0x60000;
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  f->avx2 = ymm && fma && ((b >> 5) & 1);
  f->avx512 = zmm && ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  int amx = ((d >> 22) & 1) && ((d >> 24) & 1);
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f->avx512_bf16 = f->avx512 && ((a1 >> 5) & 1);
  f->amx_bf16 = amx && tiles && amx_permitted();
}

/* ---- names ---- */

int gj_gemm_backend_parse(const char *s, gj_gemm_backend *b) {
  if (!strcmp(s, "auto")) *b = GJ_GEMM_AUTO;
  else if (!strcmp(s, "openblas")) *b = GJ_GEMM_OPENBLAS;
  else if (!strcmp(s, "onednn")) *b = GJ_GEMM_ONEDNN;
  else return -1;
  return 0;
}

int gj_precision_parse(const char *s, gj_precision *p) {
  if (!strcmp(s, "fp32") || !strcmp(s, "float32")) *p = GJ_PREC_F32;
  else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *p = GJ_PREC_BF16;
  else return -1;
  return 0;
}

const char *gj_gemm_backend_name(gj_gemm_backend b) {
  return b == GJ_GEMM_OPENBLAS ? "openblas" : b == GJ_GEMM_ONEDNN ? "onednn" : "auto";
}
const char *gj_precision_name(gj_precision p) { return p == GJ_PREC_BF16 ? "bf16" : "fp32"; }

/* ---- state ---- */

static gj_gemm_backend g_backend = GJ_GEMM_OPENBLAS;
static gj_precision g_prec = GJ_PREC_F32;
static char g_desc[160] = "OpenBLAS fp32";

gj_gemm_backend gj_gemm_backend_in_use(void) { return g_backend; }
static int g_test_copies; /* gj_gemm_test_bf16_copies */
int gj_gemm_reads_bf16(void) {
  return g_prec == GJ_PREC_BF16 && (g_backend == GJ_GEMM_ONEDNN || g_test_copies);
}
void gj_gemm_test_bf16_copies(int on) { g_test_copies = on; }

gj_precision gj_gemm_precision(void) { return g_prec; }
const char *gj_gemm_describe(void) { return g_desc; }

/* Per-thread scratch: rounded operands and oneDNN's scratchpad. Grown on the first products
 * of a shape, then reused: the step loop allocates nothing after its first step. */
typedef struct {
  void *p;
  size_t cap;
} scratch;
static __thread scratch tl_a, tl_b, tl_c, tl_d, tl_pad;
static __thread dnnl_stream_t tl_stream;

static void *scratch_get(scratch *s, size_t bytes) {
  if (bytes > s->cap) {
    free(s->p);
    size_t cap = bytes + bytes / 4 + 4096;
    s->p = NULL;
    if (posix_memalign(&s->p, 64, cap)) {
      fprintf(stderr, "gptj: error: out of memory for a GEMM scratch buffer of %zu bytes\n", cap);
      abort();
    }
    s->cap = cap;
  }
  return s->p;
}

/* Round rows x cols of src (row stride lds) into dst (row stride ldd). */
static void round_rows_to(gj_bf16 *dst, int64_t ldd, const float *src, int64_t rows, int64_t cols,
                          int64_t lds) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > 65536)
  for (int64_t r = 0; r < rows; r++) gj_bf16_round(dst + r * ldd, src + r * lds, (size_t)cols);
}

/* The same densely (ldd = cols). */
static void round_rows(gj_bf16 *dst, const float *src, int64_t rows, int64_t cols, int64_t ld) {
  round_rows_to(dst, cols, src, rows, cols, ld);
}

static void round_generic(gj_bf16 *dst, const float *src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = gj_f32_to_bf16(src[i]);
}

/* VCVTNEPS2BF16 rounds to nearest even and quiets NaNs, as gj_f32_to_bf16 does. */
__attribute__((target("avx512f,avx512bf16"))) static void round_avx512bf16(gj_bf16 *dst,
                                                                           const float *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  for (; i < n; i++) dst[i] = gj_f32_to_bf16(src[i]);
}

void gj_bf16_round(gj_bf16 *dst, const float *src, size_t n) {
  /* __builtin_cpu_supports reads what a constructor filled in: cheap and thread-safe */
  if (__builtin_cpu_supports("avx512bf16")) round_avx512bf16(dst, src, n);
  else round_generic(dst, src, n);
}

/* ---- oneDNN ---- */

typedef struct {
  int ta, tb, bf16, bias, c16; /* c16: C is bfloat16 */
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
  size_t pad_bytes;
} prim_entry;

static dnnl_engine_t g_engine;
/* The primitive cache: a growing open-addressing table of pointers to entries that are never
 * moved or freed before gj_gemm_finalize, so a thread may use its entry while another grows
 * the table. Each thread first looks in a small direct-mapped table of its own, without the
 * lock. */
static prim_entry **g_cache;
static size_t g_cache_cap, g_cache_n;
#define GJ_TL_CACHE 64
static __thread prim_entry *tl_cache[GJ_TL_CACHE];
static __thread unsigned tl_epoch;
static unsigned g_epoch = 1; /* bumped by gj_gemm_finalize: every thread's table is then stale */

static uint64_t key_hash(const prim_entry *k) {
  uint64_t h = 1469598103934665603ull;
  int64_t v[] = {k->ta, k->tb, k->bf16, k->bias, k->c16, k->M, k->N, k->K, k->lda, k->ldb, k->ldc};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
  uint32_t fa, fb;
  memcpy(&fa, &k->alpha, 4), memcpy(&fb, &k->beta, 4);
  h = (h ^ fa) * 1099511628211ull;
  return (h ^ fb) * 1099511628211ull;
}

static int key_eq(const prim_entry *x, const prim_entry *y) {
  return x->ta == y->ta && x->tb == y->tb && x->bf16 == y->bf16 && x->bias == y->bias &&
         x->c16 == y->c16 && x->M == y->M && x->N == y->N && x->K == y->K && x->lda == y->lda &&
         x->ldb == y->ldb && x->ldc == y->ldc && x->alpha == y->alpha && x->beta == y->beta;
}

static void die_dnnl(const char *what, dnnl_status_t st, const prim_entry *k) {
  fprintf(stderr, "gptj: error: oneDNN %s failed (status %d) for a %s matmul %lldx%lldx%lld\n", what,
          (int)st, k->bf16 ? "bf16" : "fp32", (long long)k->M, (long long)k->N, (long long)k->K);
  abort();
}

static dnnl_status_t ensure_engine(void) {
  if (g_engine) return dnnl_success;
  return dnnl_engine_create(&g_engine, dnnl_cpu, 0);
}

/* Create the primitive of key k (its descriptors filled in). */
static dnnl_status_t prim_create(prim_entry *k) {
  dnnl_status_t st = ensure_engine();
  if (st != dnnl_success) return st;
  dnnl_data_type_t in = k->bf16 ? dnnl_bf16 : dnnl_f32;
  /* logical A [M, K], B [K, N], C [M, N]; a transposed operand is the stored matrix read by
   * columns, i.e. swapped strides */
  dnnl_dims_t ad = {k->M, k->K}, bd = {k->K, k->N}, cd = {k->M, k->N};
  dnnl_dims_t as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
  dnnl_dims_t bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
  dnnl_dims_t cs = {k->ldc, 1};
  if ((st = dnnl_memory_desc_init_by_strides(&k->a_md, 2, ad, in, as)) ||
      (st = dnnl_memory_desc_init_by_strides(&k->b_md, 2, bd, in, bs)) ||
      (st = dnnl_memory_desc_init_by_strides(&k->c_md, 2, cd, k->c16 ? dnnl_bf16 : dnnl_f32, cs)))
    return st;
  dnnl_dims_t biasd = {1, k->N};
  if (k->bias && (st = dnnl_memory_desc_init_by_tag(&k->bias_md, 2, biasd, dnnl_f32, dnnl_ab)))
    return st;
  dnnl_matmul_desc_t md;
  if ((st = dnnl_matmul_desc_init(&md, &k->a_md, &k->b_md, k->bias ? &k->bias_md : NULL, &k->c_md)))
    return st;
  dnnl_primitive_attr_t attr;
  if ((st = dnnl_primitive_attr_create(&attr))) return st;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (!st && k->alpha != 1.0f) st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
  if (!st && k->beta != 0.0f) {
    st = dnnl_post_ops_create(&po);
    if (!st) st = dnnl_post_ops_append_sum(po, k->beta);
    if (!st) st = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  if (!st) st = dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL);
  if (!st) {
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    k->pad_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
    st = dnnl_primitive_create(&k->prim, pd);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  return st;
}

/* The cached entry for key k, created on first use. */
static prim_entry *prim_get(const prim_entry *k) {
  uint64_t h = key_hash(k);
  if (tl_epoch != g_epoch) memset(tl_cache, 0, sizeof tl_cache), tl_epoch = g_epoch;
  prim_entry *e = tl_cache[h % GJ_TL_CACHE];
  if (e && key_eq(e, k)) return e;
  dnnl_status_t st = dnnl_success;
  int oom = 0;
  e = NULL;
#pragma omp critical(gj_gemm_cache)
  {
    if (2 * (g_cache_n + 1) > g_cache_cap) {
      size_t cap = g_cache_cap ? 2 * g_cache_cap : 256;
      prim_entry **t = calloc(cap, sizeof *t);
      if (t) {
        for (size_t i = 0; i < g_cache_cap; i++)
          if (g_cache[i]) {
            size_t j = key_hash(g_cache[i]) & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = g_cache[i];
          }
        free(g_cache);
        g_cache = t, g_cache_cap = cap;
      }
    }
    if (2 * (g_cache_n + 1) <= g_cache_cap) {
      size_t j = h & (g_cache_cap - 1);
      while (g_cache[j] && !key_eq(g_cache[j], k)) j = (j + 1) & (g_cache_cap - 1);
      if (g_cache[j]) e = g_cache[j];
      else if ((e = malloc(sizeof *e))) {
        *e = *k;
        st = prim_create(e);
        if (st == dnnl_success) g_cache[j] = e, g_cache_n++;
        else free(e), e = NULL;
      } else {
        oom = 1;
      }
    } else {
      oom = 1;
    }
  }
  if (st != dnnl_success) die_dnnl("primitive creation", st, k);
  if (oom || !e) {
    fprintf(stderr, "gptj: error: out of memory for the GEMM primitive cache\n");
    abort();
  }
  tl_cache[h % GJ_TL_CACHE] = e;
  return e;
}

/* The memory objects of a primitive's arguments, one set per thread and primitive (a
 * direct-mapped table): creating and destroying them for each product cost more than the
 * product itself on the attention's tiles. Each execution binds the operands' pointers. */
enum { MEM_N = 5 }; /* A, B, C, bias, scratchpad */
typedef struct {
  const prim_entry *e;
  dnnl_memory_t m[MEM_N];
} mem_set;
static __thread mem_set tl_mem[GJ_TL_CACHE];
static __thread unsigned tl_mem_epoch;

static void mem_set_clear(mem_set *ms) {
  for (int i = 0; i < MEM_N; i++)
    if (ms->m[i]) dnnl_memory_destroy(ms->m[i]);
  memset(ms, 0, sizeof *ms);
}

static mem_set *mem_set_get(const prim_entry *e) {
  if (tl_mem_epoch != g_epoch) { /* the entries were freed (and their addresses may come again) */
    for (int i = 0; i < GJ_TL_CACHE; i++) mem_set_clear(&tl_mem[i]);
    tl_mem_epoch = g_epoch;
  }
  mem_set *ms = &tl_mem[((uintptr_t)e / sizeof *e) % GJ_TL_CACHE];
  if (ms->e == e) return ms;
  mem_set_clear(ms);
  dnnl_memory_desc_t pmd;
  dnnl_dims_t pd = {(dnnl_dim_t)e->pad_bytes};
  dnnl_memory_desc_init_by_tag(&pmd, 1, pd, dnnl_u8, dnnl_a);
  const dnnl_memory_desc_t *md[MEM_N] = {&e->a_md, &e->b_md, &e->c_md, e->bias ? &e->bias_md : NULL,
                                         e->pad_bytes ? &pmd : NULL};
  for (int i = 0; i < MEM_N; i++) {
    dnnl_status_t st;
    if (md[i] && (st = dnnl_memory_create(&ms->m[i], md[i], g_engine, DNNL_MEMORY_NONE)))
      die_dnnl("memory creation", st, e);
  }
  ms->e = e;
  return ms;
}

/* C = alpha op(A) op(B) (+ bias, a row [N] added to every row; alpha is then 1) + beta C;
 * C is float, or bfloat16 (c16: the sum rounded as it is written; beta 0) */
static void dnnl_product(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, int64_t lda, const void *B, int64_t ldb, const float *bias,
                         float beta, void *C, int64_t ldc, int bf16, int c16) {
  /* oneDNN 2.6 runs a matmul on its AMX (brgemm) kernels only into a dense destination: with
   * ldc > N (an attention tile inside [T, D] rows) it falls to its non-AMX gemm, 2-5x slower on
   * the attention's tiles. Such a product goes to a dense scratch, then into C. */
  if (ldc != N) {
    const size_t es = c16 ? sizeof(gj_bf16) : sizeof(float);
    char *D = scratch_get(&tl_c, (size_t)M * N * es);
    dnnl_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, 0.0f, D, N, bf16, c16);
    for (int64_t i = 0; i < M; i++) {
      const char *d = D + i * N * es;
      if (beta == 0.0f) {
        memcpy((char *)C + i * ldc * es, d, (size_t)N * es);
      } else {
        float *c = (float *)C + i * ldc;
        const float *df = (const float *)d;
#pragma omp simd
        for (int64_t j = 0; j < N; j++) c[j] = df[j] + beta * c[j];
      }
    }
    return;
  }
  prim_entry key = {.ta = ta, .tb = tb, .bf16 = bf16, .bias = bias != NULL, .c16 = c16, .M = M,
                    .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta};
  prim_entry *e = prim_get(&key);
  dnnl_status_t st;
  if (!tl_stream && (st = dnnl_stream_create(&tl_stream, g_engine, dnnl_stream_default_flags)))
    die_dnnl("stream creation", st, &key);
  mem_set *ms = mem_set_get(e);
  void *ptr[MEM_N] = {(void *)A, (void *)B, C, (void *)bias,
                      e->pad_bytes ? scratch_get(&tl_pad, e->pad_bytes) : NULL};
  static const int arg[MEM_N] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS,
                                 DNNL_ARG_SCRATCHPAD};
  dnnl_exec_arg_t args[MEM_N];
  int nargs = 0;
  for (int i = 0; i < MEM_N; i++) {
    if (!ms->m[i]) continue;
    if ((st = dnnl_memory_set_data_handle(ms->m[i], ptr[i]))) die_dnnl("memory binding", st, &key);
    args[nargs++] = (dnnl_exec_arg_t){arg[i], ms->m[i]};
  }
  if ((st = dnnl_primitive_execute(e->prim, tl_stream, nargs, args))) die_dnnl("execution", st, &key);
  dnnl_stream_wait(tl_stream);
}

/* ---- recording ---- */

typedef struct {
  int ta, tb, par, a16, b16; /* a16, b16: the operand came with its bf16 copy */
  int bias;                  /* with a bias row (gj_gemm_bias) */
  int c16;                   /* C rounded to bfloat16 (gj_gemm_bias16) */
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  double count;
  double best; /* the shortest time of one product measured so far (0: none) */
} rec_shape;

#define GJ_REC_MAX 4096
static int g_record;
static rec_shape g_rec[GJ_REC_MAX];
static int g_rec_n;
static double g_rec_flops;

void gj_gemm_record(int on) { g_record = on; }
void gj_gemm_record_reset(void) { g_rec_n = 0, g_rec_flops = 0; }
double gj_gemm_recorded_flops(void) { return g_rec_flops; }
int gj_gemm_recorded_shapes(void) { return g_rec_n; }

static void record(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                   int64_t ldc, float alpha, float beta, int a16, int b16, int bias, int c16) {
  int par = omp_in_parallel();
  if (g_prec != GJ_PREC_BF16) a16 = b16 = 0;
#pragma omp critical(gj_gemm_rec)
  { /* the FLOPs of the recorded products only: a shape the full table drops is not replayed */
    int i = 0;
    for (; i < g_rec_n; i++) {
      rec_shape *r = &g_rec[i];
      if (r->ta == ta && r->tb == tb && r->par == par && r->a16 == a16 && r->b16 == b16 &&
          r->bias == bias && r->c16 == c16 && r->M == M && r->N == N && r->K == K &&
          r->lda == lda && r->ldb == ldb && r->ldc == ldc && r->alpha == alpha && r->beta == beta)
        break;
    }
    if (i < g_rec_n) g_rec[i].count += 1;
    else if (g_rec_n < GJ_REC_MAX)
      g_rec[g_rec_n++] =
          (rec_shape){ta, tb, par, a16, b16, bias, c16, M, N, K, lda, ldb, ldc, alpha, beta, 1, 0};
    if (i < g_rec_n) g_rec_flops += 2.0 * M * N * K;
  }
}

/* ---- bf16 operands on the float32 FMA units ----
 * Where AVX512_BF16 dot products run at half the float32 FMA rate (and there is no AMX), the
 * bf16 products are faster as sgemm on operands holding bfloat16 values in float32: each
 * operand is widened from its bf16 copy, or rounded to bfloat16 (nearest even) and kept in
 * float32. The product of two bfloat16 numbers is exact in float32 and the sums are float32,
 * as in a bf16 matmul; only the order of the float32 additions differs. An operand is widened
 * a piece at a time (GJ_FMA16_PIECE floats: the vocabulary head's weight is far larger), the
 * product split along K (beyond GJ_FMA16_KMAX), then M and N, to match. */
#define GJ_FMA16_PIECE ((int64_t)1 << 22)
#define GJ_FMA16_KMAX 4096

/* d[i] = x[i] widened (Xh given) or rounded to bfloat16 and widened back: 16 at a time with
 * AVX-512 (and VCVTNEPS2BF16, which rounds as gj_f32_to_bf16 does). */
static void to_f32_generic(float *d, const float *x, const gj_bf16 *xh, int64_t n) {
  if (xh) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = gj_bf16_to_f32(xh[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = gj_bf16_rounded(x[i]);
  }
}

__attribute__((target("avx512f,avx512bf16"))) static void to_f32_avx512(float *d, const float *x,
                                                                         const gj_bf16 *xh, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = xh ? _mm256_loadu_si256((const __m256i *)(xh + i))
                   : (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  to_f32_generic(d + i, x ? x + i : NULL, xh ? xh + i : NULL, n - i);
}

/* The same with the conversion instruction where the CPU has it (v: avx512bf16). */
static void to_f32(float *d, const float *x, const gj_bf16 *xh, int64_t n, int v) {
  if (v) to_f32_avx512(d, x, xh, n);
  else to_f32_generic(d, x, xh, n);
}

/* rows x cols of X (row stride ld; Xh: its bf16 copy, or NULL) densely into float32 scratch. */
static const float *fma16_operand(scratch *s, const float *X, const gj_bf16 *Xh, int64_t rows,
                                  int64_t cols, int64_t ld) {
  float *t = scratch_get(s, (size_t)rows * cols * sizeof(float));
  const int v = __builtin_cpu_supports("avx512bf16");
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > 65536)
  for (int64_t r = 0; r < rows; r++)
    to_f32(t + r * cols, Xh ? NULL : X + r * ld, Xh ? Xh + r * ld : NULL, cols, v);
  return t;
}

/* A few rows (decoding: one token's row) times a weight read as its rows: C[M, N] = alpha A
 * B^T + beta C with M <= GJ_DOT_MMAX, op(A) = A, op(B) = B^T. Widening all of B to float32
 * for sgemm would move 10 bytes per weight (read 2, write 4, read 4) for M multiply-adds each;
 * this reads each row of B once, in its own type (2 bytes from a bf16 copy), widened (or
 * rounded) a chunk at a time into a thread's buffer that stays in L1, and takes M dot products
 * with it. One sum order for both kinds of B (the same chunks, the same loop), so a bf16 copy
 * and the float it was rounded from give the same bits. */
#define GJ_DOT_MMAX 8
#define GJ_DOT_CHUNK 2048

GJ_HOT
static void dot_rows(float *acc, const float *a, int64_t lda, int64_t M, const float *b, int64_t n) {
  for (int64_t i = 0; i < M; i++) {
    const float *x = a + i * lda;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < n; k++) s += x[k] * b[k];
    acc[i] += s;
  }
}

static void bf16_rows_dot(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh,
                          int64_t ldb, float beta, float *C, int64_t ldc) {
  const float *a = fma16_operand(&tl_a, A, Ah, M, K, lda); /* M x K, dense, bf16 values */
  const int v = __builtin_cpu_supports("avx512bf16");
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && N * K >= 65536)
  for (int64_t j = 0; j < N; j++) {
    float buf[GJ_DOT_CHUNK] __attribute__((aligned(64)));
    float acc[GJ_DOT_MMAX] = {0};
    for (int64_t k0 = 0; k0 < K; k0 += GJ_DOT_CHUNK) {
      const int64_t n = GJ_MIN((int64_t)GJ_DOT_CHUNK, K - k0);
      to_f32(buf, Bh ? NULL : B + j * ldb + k0, Bh ? Bh + j * ldb + k0 : NULL, n, v);
      dot_rows(acc, a + k0, K, M, buf, n);
    }
    for (int64_t i = 0; i < M; i++) {
      float *c = C + i * ldc + j;
      *c = alpha * acc[i] + (beta == 0.0f ? 0.0f : beta * *c);
    }
  }
}

static void bf16_on_fma(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, const gj_bf16 *Ah, int64_t lda, const float *B,
                        const gj_bf16 *Bh, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (!ta && tb && M <= GJ_DOT_MMAX) {
    bf16_rows_dot(M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta, C, ldc);
    return;
  }
  /* pieces [mb, kb] of op(A) and [kb, nb] of op(B), each within GJ_FMA16_PIECE floats: a long
   * K (the vocabulary in d xf = d logits W) is cut first, so that each operand is widened once */
  const int64_t kb = GJ_MIN(K, GJ_FMA16_KMAX);
  const int64_t mb = GJ_MAX(1, GJ_MIN(M, GJ_FMA16_PIECE / kb));
  const int64_t nb = GJ_MAX(1, GJ_MIN(N, GJ_FMA16_PIECE / kb));
  for (int64_t k0 = 0; k0 < K; k0 += kb) {
    const int64_t k = GJ_MIN(kb, K - k0);
    const float bk = k0 == 0 ? beta : 1.0f; /* later pieces of K accumulate */
    const float *b = NULL;
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
      const int64_t m = GJ_MIN(mb, M - m0), ao = ta ? k0 * lda + m0 : m0 * lda + k0;
      const int64_t ar = ta ? k : m, ac = ta ? m : k;
      const float *a = fma16_operand(&tl_a, A ? A + ao : NULL, Ah ? Ah + ao : NULL, ar, ac, lda);
      for (int64_t n0 = 0; n0 < N; n0 += nb) {
        const int64_t n = GJ_MIN(nb, N - n0), bo = tb ? n0 * ldb + k0 : k0 * ldb + n0;
        const int64_t br = tb ? n : k, bc = tb ? k : n;
        if (!b || nb < N) b = fma16_operand(&tl_b, B ? B + bo : NULL, Bh ? Bh + bo : NULL, br, bc, ldb);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)m, (int)n, (int)k, alpha, a, (int)ac, b, (int)bc, bk, C + m0 * ldc + n0,
                    (int)ldc);
      }
    }
  }
}

/* ---- the door ---- */

/* C = bias + beta C, row by row (for the backends without a bias argument; they then run with
 * beta 1) */
static void bias_into(float *C, const float *bias, float beta, int64_t M, int64_t N, int64_t ldc) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && M * N > 65536)
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    if (beta == 0.0f) memcpy(c, bias, (size_t)N * sizeof(float));
    else
#pragma omp simd
      for (int64_t j = 0; j < N; j++) c[j] = bias[j] + beta * c[j];
  }
}

static uint64_t g_products; /* products run, for gj_gemm_products */
uint64_t gj_gemm_products(void) { return __atomic_load_n(&g_products, __ATOMIC_RELAXED); }

/* The door. C16 (with C NULL and beta 0): the product, bias added, rounded to bfloat16 into
 * C16 (row stride ldc) instead of written to C. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                 const float *bias, float beta, float *C, gj_bf16 *C16, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (C16 && !(g_backend == GJ_GEMM_ONEDNN && g_prec == GJ_PREC_BF16)) {
    /* a backend that writes float: the product densely into scratch (counted there), then rounded */
    float *D = scratch_get(&tl_d, (size_t)M * N * sizeof(float));
    gemm(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, bias, 0.0f, D, NULL, N);
    round_rows_to(C16, ldc, D, M, N, N);
    return;
  }
  __atomic_fetch_add(&g_products, 1, __ATOMIC_RELAXED);
  if (K <= 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float v = bias ? bias[j] : 0.0f;
        if (C16) C16[i * ldc + j] = gj_f32_to_bf16(v);
        else C[i * ldc + j] = v + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
      }
    return;
  }
  if (g_backend == GJ_GEMM_OPENBLAS && bias) bias_into(C, bias, beta, M, N, ldc), beta = 1.0f;
  if (g_backend == GJ_GEMM_OPENBLAS && g_prec == GJ_PREC_BF16) {
    bf16_on_fma(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta, C, ldc);
    return;
  }
  if (g_backend == GJ_GEMM_OPENBLAS) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return;
  }
  if (g_prec == GJ_PREC_F32) {
    dnnl_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, beta, C, ldc, 0, 0);
    return;
  }
  /* bf16: round the operands that have no bfloat16 copy, densely */
  if (!Ah) {
    int64_t r = ta ? K : M, c = ta ? M : K;
    gj_bf16 *t = scratch_get(&tl_a, (size_t)r * c * sizeof(gj_bf16));
    round_rows(t, A, r, c, lda);
    Ah = t, lda = c;
  }
  if (!Bh) {
    int64_t r = tb ? N : K, c = tb ? K : N;
    gj_bf16 *t = scratch_get(&tl_b, (size_t)r * c * sizeof(gj_bf16));
    round_rows(t, B, r, c, ldb);
    Bh = t, ldb = c;
  }
  if (C16) dnnl_product(ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, bias, 0.0f, C16, ldc, 1, 1);
  else dnnl_product(ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, bias, beta, C, ldc, 1, 0);
}

/* A product through the door: recorded (when on), then computed. */
static void door(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                 const float *bias, float beta, float *C, gj_bf16 *C16, int64_t ldc) {
  if (g_record && M > 0 && N > 0)
    record(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, Ah != NULL, Bh != NULL, bias != NULL,
           C16 != NULL);
  gemm(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, bias, beta, C, C16, ldc);
}

void gj_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
             float beta, float *C, int64_t ldc) {
  door(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, NULL, beta, C, NULL, ldc);
}

void gj_gemm_bias(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                  const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                  const float *bias, float beta, float *C, int64_t ldc) {
  door(ta, tb, M, N, K, 1.0f, A, Ah, lda, B, Bh, ldb, bias, beta, C, NULL, ldc);
}

void gj_gemm_bias16(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                    const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                    const float *bias, gj_bf16 *C16, int64_t ldc) {
  door(ta, tb, M, N, K, 1.0f, A, Ah, lda, B, Bh, ldb, bias, 0.0f, NULL, C16, ldc);
}

/* ---- checks and setup ---- */

static uint64_t lcg(uint64_t *s) { return *s = *s * 6364136223846793005ull + 1442695040888963407ull; }

int gj_gemm_selftest(gj_gemm_backend b, gj_precision prec) {
  gj_gemm_backend ob = g_backend;
  gj_precision op = g_prec;
  g_backend = b, g_prec = prec;
  int bad = 0;
  static const int64_t shapes[][3] = {{67, 45, 129}, {1, 300, 77}, {130, 1, 64}, {33, 97, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !bad; s++)
    for (int kind = 0; kind < 16 && !bad; kind++) {
      /* kinds 0-3: alpha 1, beta 0; 4-7: alpha 1/8, beta 1; 8-11: a bias row, beta 0 or 1;
       * 12-15: a bias row, the result rounded to bfloat16 */
      int ta = kind & 1, tb = (kind >> 1) & 1, mode = kind >> 2;
      float alpha = mode == 1 ? 0.125f : 1.0f, beta = mode == 1 || (mode == 2 && ta) ? 1.0f : 0.0f;
      int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
      /* dense and strided destinations (oneDNN's own kernels, and the door's dense staging) */
      int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2 * ((kind + (int)s) & 1);
      size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
      float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc((nc + N) * 4);
      float *bias = mode >= 2 ? C + nc : NULL;
      gj_bf16 *C16 = mode == 3 ? malloc(nc * sizeof(gj_bf16)) : NULL;
      double *R = malloc((size_t)M * N * 8);
      if (!A || !B || !C || !R || (mode == 3 && !C16)) {
        free(A), free(B), free(C), free(R), free(C16);
        bad = 2;
        break;
      }
      uint64_t seed = 12345 + s * 8 + kind;
      for (size_t i = 0; i < na; i++) A[i] = (float)((lcg(&seed) >> 40) / 16777216.0 - 0.5);
      for (size_t i = 0; i < nb; i++) B[i] = (float)((lcg(&seed) >> 40) / 16777216.0 - 0.5);
      for (size_t i = 0; i < nc + N; i++) C[i] = (float)((lcg(&seed) >> 40) / 16777216.0 - 0.5);
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double acc = 0;
          for (int64_t k = 0; k < K; k++) {
            float a = ta ? A[k * lda + i] : A[i * lda + k], bb = tb ? B[j * ldb + k] : B[k * ldb + j];
            if (prec == GJ_PREC_BF16) a = gj_bf16_to_f32(gj_f32_to_bf16(a)), bb = gj_bf16_to_f32(gj_f32_to_bf16(bb));
            acc += (double)a * bb;
          }
          R[i * N + j] = alpha * acc + (bias ? bias[j] : 0.0) + beta * C[i * ldc + j];
        }
      gemm(ta, tb, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, bias, C16 ? 0.0f : beta, C16 ? NULL : C,
           C16, ldc);
      /* float32 accumulation of K products of numbers below 1/2: error below K * 2^-24; a
       * bfloat16 result within half its unit more (at most 2^-8 of its magnitude) */
      double tol = 1e-6 * (double)K + 1e-6;
      for (int64_t i = 0; i < M && !bad; i++)
        for (int64_t j = 0; j < N; j++) {
          double r = C16 ? R[i * N + j] - beta * C[i * ldc + j] : R[i * N + j];
          double c = C16 ? gj_bf16_to_f32(C16[i * ldc + j]) : C[i * ldc + j];
          if (!(fabs(c - r) <= tol + (C16 ? fabs(r) / 256 : 0))) {
            bad = 1;
            break;
          }
        }
      free(A), free(B), free(C), free(R), free(C16);
    }
  g_backend = ob, g_prec = op;
  return bad;
}

/* OpenBLAS runs a kernel of the CPU's full vector width (AVX-512 on an AVX-512 CPU). */
static int blas_full_width(const gj_cpu_features *f) {
  const char *core = gj_blas_core();
  static const char *w512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
  static const char *w256[] = {"Haswell", "Zen", NULL};
  int is512 = 0, is256 = 0;
  for (int i = 0; w512[i]; i++) is512 |= !strcasecmp(core, w512[i]);
  for (int i = 0; w256[i]; i++) is256 |= !strcasecmp(core, w256[i]);
  return f->avx512 ? is512 : f->avx2 ? is512 || is256 : 1;
}

static int fma_beats_dpbf16(const gj_cpu_features *f, double *r32, double *r16);

int gj_gemm_setup(gj_gemm_backend want, gj_precision prec) {
  g_test_copies = 0;
  gj_cpu_features f;
  gj_cpu_detect(&f);
  const dnnl_version_t *v = dnnl_version();
  if (prec == GJ_PREC_BF16) {
    /* Without bf16 hardware only the float32 FMA path can run bf16's numerics, at fp32's speed
     * at best: the user asks for it by name (--gemm openblas), auto and oneDNN refuse. */
    if (!f.amx_bf16 && !f.avx512_bf16 && want != GJ_GEMM_OPENBLAS)
      return GJ_FAIL("--precision bf16: this CPU has neither AMX-BF16 nor AVX512_BF16; use --precision fp32, "
                     "or --gemm openblas for bf16 numerics on the fp32 FMA units (no faster than fp32)");
    /* auto: oneDNN's matmul on AMX; without AMX, whichever of the AVX512_BF16 dot products and
     * the float32 FMA (OpenBLAS on bf16 values) has the higher peak on this core */
    gj_gemm_backend b = want;
    double r16 = 0, r32 = 0;
    if (b == GJ_GEMM_AUTO) {
      b = GJ_GEMM_ONEDNN;
      if (!f.amx_bf16 && blas_full_width(&f)) {
        if (fma_beats_dpbf16(&f, &r32, &r16)) b = GJ_GEMM_OPENBLAS;
      }
    }
    if (gj_gemm_selftest(b, prec)) {
      if (want != GJ_GEMM_AUTO || b == GJ_GEMM_ONEDNN)
        return GJ_FAIL("--precision bf16: %s gives wrong bfloat16 products on this CPU; use %s",
                       b == GJ_GEMM_ONEDNN ? "oneDNN's matmul" : "OpenBLAS on bf16 values",
                       b == GJ_GEMM_ONEDNN ? "--precision fp32" : "--gemm onednn");
      gj_warn("OpenBLAS on bf16 values gives wrong products on this CPU (checked against a reference); using oneDNN");
      b = GJ_GEMM_ONEDNN;
      if (gj_gemm_selftest(b, prec))
        return GJ_FAIL("--precision bf16: oneDNN's bfloat16 matmul gives wrong results on this CPU; use --precision fp32");
    }
    g_backend = b, g_prec = prec;
    if (b == GJ_GEMM_ONEDNN && r16 > 0)
      snprintf(g_desc, sizeof g_desc, "oneDNN %d.%d.%d bf16 (AVX512_BF16: %.0f GFLOP/s a core, fp32 FMA %.0f)",
               v->major, v->minor, v->patch, r16 / 1e9, r32 / 1e9);
    else if (b == GJ_GEMM_ONEDNN)
      snprintf(g_desc, sizeof g_desc, "oneDNN %d.%d.%d bf16 (%s)", v->major, v->minor, v->patch,
               f.amx_bf16 ? "AMX" : "AVX512_BF16");
    else if (r16 > 0)
      snprintf(g_desc, sizeof g_desc, "OpenBLAS %s kernel, bf16 operands on the fp32 FMA units "
               "(%.0f GFLOP/s a core, AVX512_BF16 %.0f)", gj_blas_core(), r32 / 1e9, r16 / 1e9);
    else
      snprintf(g_desc, sizeof g_desc, "OpenBLAS %s kernel, bf16 operands on the fp32 FMA units", gj_blas_core());
    return 0;
  }
  gj_gemm_backend b = want;
  if (b == GJ_GEMM_AUTO) b = blas_full_width(&f) ? GJ_GEMM_OPENBLAS : GJ_GEMM_ONEDNN;
  gj_gemm_backend other = b == GJ_GEMM_OPENBLAS ? GJ_GEMM_ONEDNN : GJ_GEMM_OPENBLAS;
  if (gj_gemm_selftest(b, prec)) {
    gj_warn("the %s float32 GEMM gives wrong results on this CPU (checked against a reference product); using %s",
            gj_gemm_backend_name(b), gj_gemm_backend_name(other));
    if (gj_gemm_selftest(other, prec))
      return GJ_FAIL("neither OpenBLAS nor oneDNN computes correct float32 products on this CPU");
    b = other;
  }
  g_backend = b, g_prec = prec;
  if (b == GJ_GEMM_OPENBLAS)
    snprintf(g_desc, sizeof g_desc, "OpenBLAS %s kernel fp32", gj_blas_core());
  else
    snprintf(g_desc, sizeof g_desc, "oneDNN %d.%d.%d fp32 (%s)", v->major, v->minor, v->patch,
             f.avx512 ? "AVX-512" : f.avx2 ? "AVX2" : "SSE");
  return 0;
}

void gj_gemm_assume(gj_gemm_backend b, gj_precision prec) {
  g_test_copies = 0;
  g_backend = b == GJ_GEMM_AUTO ? GJ_GEMM_OPENBLAS : b, g_prec = prec;
  snprintf(g_desc, sizeof g_desc, "%s %s (assumed, not run here)",
           g_backend == GJ_GEMM_ONEDNN ? "oneDNN" : "OpenBLAS", gj_precision_name(prec));
}

void gj_gemm_finalize(void) {
  for (size_t i = 0; i < g_cache_cap; i++)
    if (g_cache[i]) dnnl_primitive_destroy(g_cache[i]->prim), free(g_cache[i]);
  free(g_cache);
  g_cache = NULL, g_cache_cap = g_cache_n = 0;
  g_epoch++;
  /* the engine and the threads' streams stay: other threads may still hold a stream */
  for (int i = 0; i < GJ_TL_CACHE; i++) mem_set_clear(&tl_mem[i]); /* this thread's */
  scratch *tl[] = {&tl_a, &tl_b, &tl_c, &tl_d, &tl_pad};
  for (size_t i = 0; i < sizeof tl / sizeof tl[0]; i++)
    free(tl[i]->p), memset(tl[i], 0, sizeof *tl[i]);
}

/* ---- the ceiling of the recorded products ---- */

/* Operands for the timings: per thread one buffer that holds the three operands of the
 * largest recorded shape (thread 0: of every shape; the others: of the shapes recorded inside
 * a parallel region) and one for their bf16 copies, allocated and filled once per
 * gj_gemm_recorded_rate: first-touching fresh operands for each shape would cost more than
 * timing it. */
typedef struct {
  float *f;
  gj_bf16 *h;
} probe_ops;

static void shape_sizes(const rec_shape *r, size_t *na, size_t *nb, size_t *nc) {
  *na = (size_t)(r->ta ? r->K : r->M) * r->lda, *nb = (size_t)(r->tb ? r->N : r->K) * r->ldb;
  *nc = (size_t)r->M * r->ldc + (r->bias ? (size_t)r->N : 0); /* C, then the bias row */
}

static float *fill_buf(size_t n) {
  float *p = gj_alloc(n * sizeof(float) + 64);
  if (p)
    for (size_t i = 0; i < n; i++) p[i] = (float)((int)(i % 13) - 6) * 0.01f;
  return p;
}

/* Thread t's operands for shape r ready (bf16 copies of the operands that came with one, as
 * the door read): 0, or -1 if one is missing. */
static int probe_ready(const rec_shape *r, const probe_ops *ops, int nt, size_t na, size_t nb) {
  for (int t = 0; t < nt; t++) {
    const probe_ops *o = &ops[t];
    if (!o->f || ((r->a16 || r->b16) && !o->h)) return -1;
    if (r->a16) gj_bf16_round(o->h, o->f, na);
    if (r->b16) gj_bf16_round(o->h + (r->a16 ? na : 0), o->f + na, nb);
  }
  return 0;
}

/* One product of shape r on operands o (a bf16 C written over the float one's first half). */
static void probe_one(const rec_shape *r, const probe_ops *o, size_t na, size_t nb) {
  float *A = o->f, *B = A + na, *C = B + nb;
  gemm(r->ta, r->tb, r->M, r->N, r->K, r->alpha, A, r->a16 ? o->h : NULL, r->lda, B,
       r->b16 ? o->h + (r->a16 ? na : 0) : NULL, r->ldb, r->bias ? C + (size_t)r->M * r->ldc : NULL,
       r->beta, r->c16 ? NULL : C, r->c16 ? (gj_bf16 *)C : NULL, r->ldc);
}

/* Seconds per product of shape r at the current backend (best of repetitions after a
 * warm-up, at least two, as many as fit in `seconds`: one run of a product of microseconds
 * is no ceiling). A shape recorded inside a parallel region runs on every thread at once, as
 * in the step, in one region (the repetition count decided by one thread for all); any other
 * outside any region, as in the step (the backend threads it). 0 if an operand is missing. */
static double time_shape(const rec_shape *r, double seconds, const probe_ops *ops) {
  size_t na, nb, nc;
  shape_sizes(r, &na, &nb, &nc);
  const int nt = r->par ? omp_get_max_threads() : 1;
  if (probe_ready(r, ops, nt, na, nb)) return 0;
  double best = 1e30, spent = 0, t0 = 0;
  if (!r->par) {
    for (int rep = 0; rep < 1000 && (rep < 3 || spent < seconds); rep++) {
      t0 = gj_now();
      probe_one(r, &ops[0], na, nb);
      double dt = gj_now() - t0;
      spent += dt;
      if (rep > 0 && dt < best) best = dt;
    }
    return best;
  }
  int go = 1;
#pragma omp parallel num_threads(nt)
  for (int rep = 0;; rep++) {
#pragma omp barrier
#pragma omp single
    {
      go = rep < 1000 && (rep < 3 || spent < seconds);
      t0 = gj_now();
    }
    if (!go) break;
    probe_one(r, &ops[omp_get_thread_num()], na, nb);
#pragma omp barrier
#pragma omp single
    {
      double dt = gj_now() - t0;
      spent += dt;
      if (rep > 0 && dt < best) best = dt;
    }
  }
  return best / nt;
}

/* What thread t's operands hold: the floats and bf16 values of the largest recorded shape it
 * runs (thread 0 every shape, the others those recorded inside a parallel region). */
static void probe_need(int t, size_t *nf, size_t *nh) {
  *nf = *nh = 0;
  for (int i = 0; i < g_rec_n; i++) {
    const rec_shape *r = &g_rec[i];
    if (t > 0 && !r->par) continue;
    size_t na, nb, nc;
    shape_sizes(r, &na, &nb, &nc);
    *nf = GJ_MAX(*nf, na + nb + nc);
    *nh = GJ_MAX(*nh, (r->a16 ? na : 0) + (r->b16 ? nb : 0));
  }
}

size_t gj_gemm_probe_bytes(void) {
  size_t bytes = 0, nf, nh;
  for (int t = 0; t < omp_get_max_threads(); t++)
    probe_need(t, &nf, &nh), bytes += nf * sizeof(float) + nh * sizeof(gj_bf16);
  return bytes;
}

/* Per thread the operands of the largest recorded shape it runs, filled (NULL: out of memory,
 * or nothing recorded). */
static probe_ops *probe_alloc(void) {
  const int nt = omp_get_max_threads();
  probe_ops *ops = calloc((size_t)nt, sizeof *ops);
  for (int t = 0; ops && t < nt; t++) {
    size_t nf, nh;
    probe_need(t, &nf, &nh);
    if (nf) ops[t].f = fill_buf(nf);
    if (nh) ops[t].h = malloc(nh * sizeof(gj_bf16) + 64);
  }
  return ops;
}

static void probe_free(probe_ops *ops) {
  for (int t = 0; ops && t < omp_get_max_threads(); t++) free(ops[t].f), free(ops[t].h);
  free(ops);
}

double gj_gemm_recorded_rate(double seconds_per_shape) {
  int was = g_record;
  g_record = 0;
  double flops = 0, time = 0;
  probe_ops *ops = probe_alloc();
  for (int i = 0; ops && i < g_rec_n; i++) {
    rec_shape *r = &g_rec[i];
    double f = 2.0 * r->M * r->N * r->K * r->count;
    /* small shapes get less time: their share of the step is small too */
    double t = time_shape(r, seconds_per_shape * GJ_MIN(1.0, f / (g_rec_flops + 1) * 10 + 0.05), ops);
    if (t <= 0) continue;
    if (r->best > 0 && r->best < t) t = r->best; /* a slower moment of a noisy machine */
    r->best = t;
    flops += f, time += t * r->count;
  }
  probe_free(ops);
  g_record = was;
  return time > 0 ? flops / time : 0;
}

/* The count products of shape r, as the step ran them: one after another (each threaded by the
 * backend), or, for a shape recorded inside a parallel region, shared out over the threads,
 * each running its part on its own operands. Seconds, the operands' bf16 copies made before
 * the clock starts; 0 if an operand is missing. */
static double replay_shape(const rec_shape *r, const probe_ops *ops) {
  size_t na, nb, nc;
  shape_sizes(r, &na, &nb, &nc);
  const int nt = r->par ? omp_get_max_threads() : 1;
  const int64_t count = (int64_t)r->count;
  if (probe_ready(r, ops, nt, na, nb)) return 0;
  double t0 = gj_now();
  if (!r->par) {
    for (int64_t k = 0; k < count; k++) probe_one(r, &ops[0], na, nb);
  } else {
#pragma omp parallel num_threads(nt)
    for (int64_t k = omp_get_thread_num(); k < count; k += nt) probe_one(r, &ops[omp_get_thread_num()], na, nb);
  }
  return gj_now() - t0;
}

double gj_gemm_recorded_replay(void) {
  int was = g_record;
  g_record = 0;
  double time = 0;
  probe_ops *ops = probe_alloc();
  int ok = ops != NULL;
  for (int i = 0; ok && i < g_rec_n; i++) {
    double t = replay_shape(&g_rec[i], ops);
    ok = t > 0, time += t; /* an operand missing: no figure */
  }
  probe_free(ops);
  g_record = was;
  return ok ? time : 0;
}

void gj_gemm_recorded_print(void) {
  gj_info("the step's products (op(A) [M, K] x op(B) [K, N]; 16: a bf16 copy came with the operand; "
          "par: called by each thread):");
  for (int i = 0; i < g_rec_n; i++) {
    const rec_shape *r = &g_rec[i];
    if (r->best <= 0) continue;
    gj_info("  %c%c M %6lld N %6lld K %6lld%s%s%s%s%s beta %g: %6.0f a step, %8.3f ms each, %6.1f GFLOP/s",
            r->ta ? 'T' : 'N', r->tb ? 'T' : 'N', (long long)r->M, (long long)r->N, (long long)r->K,
            r->a16 ? " A16" : "", r->b16 ? " B16" : "", r->par ? " par" : "", r->bias ? " bias" : "",
            r->c16 ? " C16" : "",
            r->beta, r->count,
            r->best * 1e3, 2.0 * r->M * r->N * r->K / r->best / 1e9);
  }
}

/* ---- hardware peak ---- */

/* Twelve independent chains of one vector instruction OP (latency 4, two ports: eight would
 * do), with distinct starting values and every chain opaque to the compiler so that none is
 * merged or removed. Returns the FLOPs done. Not instrumented by the sanitizers, whose checks of
 * a[j] keep the chains in memory: the loop touches no memory, and it must measure the hardware
 * in a sanitizer build too (there it read 4 GFLOP/s instead of 80, every step's MFU came out
 * above 1, and so each step measured the peak three times again). */
#define PEAK_LOOP(name, isa, V, SET1, OP, flops_per_op, cons)                                  \
  __attribute__((target(isa), no_sanitize("address", "undefined"))) static double name(        \
      int64_t iters) {                                                                         \
    V a[12];                                                                                   \
    _Pragma("GCC unroll 12") for (int j = 0; j < 12; j++) a[j] = SET1(1.0f + 0.1f * j);        \
    for (int64_t i = 0; i < iters; i++) {                                                      \
      _Pragma("GCC unroll 12") for (int j = 0; j < 12; j++) {                                  \
        a[j] = OP(a[j]);                                                                       \
        __asm__ volatile("" : "+" cons(a[j]));                                                 \
      }                                                                                        \
    }                                                                                          \
    return 12.0 * (flops_per_op) * (double)iters;                                              \
  }
#define FMA512(x) _mm512_fmadd_ps((x), _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f))
#define FMA256(x) _mm256_fmadd_ps((x), _mm256_set1_ps(0.999999f), _mm256_set1_ps(1e-7f))
#define DPBF16(x) _mm512_dpbf16_ps((x), (__m512bh)_mm512_set1_epi16(0x3f80), (__m512bh)_mm512_set1_epi16(0x3f80))
PEAK_LOOP(loop_fma512, "avx512f", __m512, _mm512_set1_ps, FMA512, 16 * 2, "v")
PEAK_LOOP(loop_fma256, "avx2,fma", __m256, _mm256_set1_ps, FMA256, 8 * 2, "x")
/* VDPBF16PS: 16 lanes, each two products added */
PEAK_LOOP(loop_dpbf16, "avx512f,avx512bf16", __m512, _mm512_set1_ps, DPBF16, 16 * 2 * 2, "v")

/* Four independent 16x16 float32 accumulator tiles fed by two A and two B tiles of 16x32
 * bfloat16: each TDPBF16PS is 16*16*32*2 FLOPs. */
typedef struct __attribute__((packed)) {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

__attribute__((target("amx-tile,amx-bf16"), no_sanitize("address", "undefined"))) static double loop_amx(int64_t iters) {
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  static __thread gj_bf16 tile[16 * 32] __attribute__((aligned(64)));
  for (int i = 0; i < 16 * 32; i++) tile[i] = 0x3c00; /* 2^-7 */
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, tile, 64);
  _tile_loadd(5, tile, 64);
  _tile_loadd(6, tile, 64);
  _tile_loadd(7, tile, 64);
  for (int64_t i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float out[16 * 16] __attribute__((aligned(64)));
  _tile_stored(0, out, 64);
  _tile_release();
  return (double)out[0] * 0 + 4.0 * 16 * 16 * 32 * 2 * (double)iters;
}

static double peak_of(double (*loop)(int64_t), int nthreads);

double gj_peak_flops(gj_precision prec, int nthreads, const char **how) {
  gj_cpu_features f;
  gj_cpu_detect(&f);
  double (*fma)(int64_t) = f.avx512 ? loop_fma512 : f.avx2 ? loop_fma256 : NULL;
  const char *fma_name = f.avx512 ? "AVX-512 FMA loop" : "AVX2 FMA loop";
  if (prec == GJ_PREC_F32) {
    if (how) *how = fma ? fma_name : "none";
    return fma ? peak_of(fma, nthreads) : 0;
  }
  /* bf16: the hardware's peak for bf16 operands, whichever unit --gemm runs them on: AMX where
   * the CPU has it, else the faster of VDPBF16PS and the float32 FMA units (on which bf16
   * values run widened: a CPU whose VDPBF16PS is the slower, or that has none) */
  if (f.amx_bf16) {
    if (how) *how = "AMX TDPBF16PS loop";
    return peak_of(loop_amx, nthreads);
  }
  const double p16 = f.avx512_bf16 ? peak_of(loop_dpbf16, nthreads) : 0;
  const double p32 = fma ? peak_of(fma, nthreads) : 0;
  const double peak = GJ_MAX(p16, p32);
  if (how)
    *how = !(peak > 0)  ? "none"
           : p16 >= p32 ? "AVX512_BF16 VDPBF16PS loop"
           : f.avx512   ? "AVX-512 FMA loop, bf16 values on the fp32 units"
                        : "AVX2 FMA loop, bf16 values on the fp32 units";
  return peak;
}

/* Iterations of loop for about 20 ms on one thread. */
static int64_t peak_iters(double (*loop)(int64_t)) {
  int64_t iters = 1000;
  for (;;) {
    double t0 = gj_now();
    loop(iters);
    double dt = gj_now() - t0;
    if (dt > 0.004 || iters > ((int64_t)1 << 40))
      return (int64_t)(iters * 0.02 / (dt > 1e-9 ? dt : 1e-9)) + 1;
    iters *= 4;
  }
}

/* The best per-thread rate of one round of loop on nthreads threads, raised into *best. */
static void peak_round(double (*loop)(int64_t), int64_t iters, int nthreads, double *best) {
#pragma omp parallel num_threads(nthreads)
  {
    double t0 = gj_now();
    double fl = loop(iters);
    double r = fl / (gj_now() - t0);
#pragma omp critical(gj_peak)
    if (r > *best) *best = r;
  }
}

/* One core's FMA and VDPBF16PS peaks (*r32, *r16): is the float32 FMA faster? The two loops
 * alternate round by round, so that the machine's other load (which lasts seconds on a shared
 * machine) lowers both or neither: measured one after the other, a busy moment during one of
 * them flipped the choice (and a run's numerics with it). */
static int fma_beats_dpbf16(const gj_cpu_features *f, double *r32, double *r16) {
  double (*l32)(int64_t) = f->avx512 ? loop_fma512 : loop_fma256;
  int64_t n32 = peak_iters(l32), n16 = f->avx512_bf16 ? peak_iters(loop_dpbf16) : 0;
  *r32 = *r16 = 0;
  for (int round = 0; round < 8; round++) {
    if (n16) peak_round(loop_dpbf16, n16, 1, r16);
    peak_round(l32, n32, 1, r32);
  }
  return *r32 > *r16;
}

static double peak_of(double (*loop)(int64_t), int nthreads) {
  /* The best per-thread rate over rounds, times the threads: a round in which the machine's
   * other load takes a thread's core only lowers that round's figure. */
  const int64_t iters = peak_iters(loop);
  double best = 0;
  for (int round = 0; round < 8; round++) peak_round(loop, iters, nthreads, &best);
  return best * nthreads;
}
