/* The one door for every matrix product (DESIGN.md §2, §8).
 *
 * C[M, N] = alpha op(A) op(B) + beta C, row-major, float32 accumulation and float32 output.
 * op(X) is X (trans 0) or X^T (trans 1); lda, ldb, ldc are row strides as in cblas.
 * In float32 precision the operands are used as they are; in bfloat16 precision they are
 * rounded to bfloat16 (nearest, ties to even) first. A caller that keeps a bfloat16 copy of an
 * operand (the model's weights, refreshed after each optimizer step) passes it as Ah / Bh and
 * saves the rounding; otherwise pass NULL. lda (ldb) is the row stride of the operand the door
 * reads: of Ah in bf16 precision when Ah is given, of A otherwise (Ah exists only in bf16).
 *
 * Backends: OpenBLAS sgemm (float32, and bf16 values held in float32) and oneDNN matmul
 * (float32 or bfloat16; AMX where the CPU has it, AVX512_BF16 otherwise). A oneDNN primitive
 * is created on the first product of a shape (transpositions, sizes, strides, alpha, beta,
 * bias, output type) and reused; a strided destination (ldc > N) gets a dense scratch, since
 * oneDNN's AMX kernels write only dense ones. Backend and precision are one process-wide
 * choice, made by gj_gemm_setup before the first product. Safe to call from inside OpenMP
 * parallel regions (the product then runs on the calling thread). */
#ifndef GJ_MODEL_GEMM_H
#define GJ_MODEL_GEMM_H

#include <stddef.h>
#include <stdint.h>

typedef uint16_t gj_bf16;

typedef enum { GJ_GEMM_AUTO, GJ_GEMM_OPENBLAS, GJ_GEMM_ONEDNN } gj_gemm_backend;
typedef enum { GJ_PREC_F32, GJ_PREC_BF16 } gj_precision;

/* OpenBLAS's kernel (model/blaskernel.c): choose the widest the CPU runs, check it, fall back;
 * may re-execute the program. Call first in main, before MPI is initialised. */
void gj_blas_select_kernel(char **argv);
/* The OpenBLAS core in use (e.g. "SkylakeX"). */
const char *gj_blas_core(void);

/* CPU features that the choice depends on (cpuid and the OS's saved state). */
typedef struct {
  int avx2, avx512, avx512_bf16, amx_bf16;
} gj_cpu_features;
void gj_cpu_detect(gj_cpu_features *f);

/* Parse "auto|openblas|onednn" and "fp32|bf16" (for the flag parsers). Return -1 if unknown. */
int gj_gemm_backend_parse(const char *s, gj_gemm_backend *b);
int gj_precision_parse(const char *s, gj_precision *p);
const char *gj_gemm_backend_name(gj_gemm_backend b);
const char *gj_precision_name(gj_precision p);

/* Choose the backend for a precision on this CPU and check it: each product kind
 * (transpositions, alpha, beta) on odd shapes is compared against a double-precision reference
 * of the same (rounded) operands. AUTO takes the fastest correct backend for the precision
 * (float32: OpenBLAS when it runs an AVX-512 or AVX2 kernel, else oneDNN; bf16: oneDNN on AMX,
 * without AMX the faster of one core's AVX512_BF16 dot products (oneDNN) and float32 FMA
 * (OpenBLAS on bf16 values), measured here). A backend that fails its check is replaced by the
 * other with a warning; bf16 on a CPU with neither AMX nor AVX512_BF16 runs only when OpenBLAS is
 * asked for (the FMA path), else it is an error. Returns 0 or -1 with the error
 * recorded. Ranks agree through gj_gemm_agree (in src/parallel). */
int gj_gemm_setup(gj_gemm_backend want, gj_precision prec);
/* For sizing only (gptj plan for another machine): make b (not auto) and prec the process-wide
 * choice without checking that this CPU runs them. Buffers are then sized as that backend's
 * products need them; no product may run. */
void gj_gemm_assume(gj_gemm_backend b, gj_precision prec);
/* Check one backend at one precision against the reference (0 if correct). */
int gj_gemm_selftest(gj_gemm_backend b, gj_precision prec);
gj_gemm_backend gj_gemm_backend_in_use(void);
gj_precision gj_gemm_precision(void);
/* Whether the products read bfloat16 operands (bf16 on oneDNN): a caller's bf16 copy of an
 * operand then saves a rounding pass per product, and the model keeps copies of its weights.
 * bf16 on the float32 FMA units widens every operand to float32 anyway, as fast from the float
 * as from a copy, so the model keeps none there (2 bytes a parameter less). */
int gj_gemm_reads_bf16(void);
/* For tests: in bf16 on OpenBLAS, make gj_gemm_reads_bf16 true, so that the model takes the
 * paths written for a backend that reads bfloat16 (the weights' bf16 copies, the head's copy in
 * the work buffers, fc_in's output written as bf16, bf16 attention probabilities). The door
 * widens those copies to the very floats it would otherwise round to, so every result is the
 * same, bit for bit: a CPU without bf16 hardware (whose oneDNN has no bf16 matmul) tests those
 * paths against the plain ones. gj_gemm_setup turns it off; change it only between models. */
void gj_gemm_test_bf16_copies(int on);
/* One line describing the choice, e.g. "oneDNN 2.6.3 bf16 (AMX)". */
const char *gj_gemm_describe(void);
/* Free the primitive cache and this thread's scratch (the engine and streams stay). */
void gj_gemm_finalize(void);

void gj_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
             float beta, float *C, int64_t ldc);

/* The same with alpha 1 and a bias row added to every row of the product:
 * C[M, N] = op(A) op(B) + bias[N] + beta C. oneDNN adds it as the product is written (no pass
 * over C of its own, and with beta 0 C is not read); OpenBLAS gets C = bias + beta C first. */
void gj_gemm_bias(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                  const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                  const float *bias, float beta, float *C, int64_t ldc);

/* The same product rounded to bfloat16 as it is written: C16[M, N] = bf16(op(A) op(B) + bias)
 * (bias may be NULL; row stride ldc). With oneDNN reading bf16 the float sums never reach
 * memory; the other backends write them to scratch and round. */
void gj_gemm_bias16(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                    const gj_bf16 *Ah, int64_t lda, const float *B, const gj_bf16 *Bh, int64_t ldb,
                    const float *bias, gj_bf16 *C16, int64_t ldc);

/* bfloat16 rounding (nearest, ties to even; NaN stays NaN; float32 subnormals become signed
 * zero, as the AVX512_BF16 conversion instruction does) and widening. */
void gj_bf16_round(gj_bf16 *dst, const float *src, size_t n);
static inline float gj_bf16_to_f32(gj_bf16 h) {
  union { uint32_t u; float f; } x = {(uint32_t)h << 16};
  return x.f;
}
static inline gj_bf16 gj_f32_to_bf16(float f) {
  union { float f; uint32_t u; } x = {f};
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return (gj_bf16)((x.u >> 16) | 0x40);
  if ((x.u & 0x7f800000u) == 0) return (gj_bf16)((x.u >> 16) & 0x8000); /* subnormal: as VCVTNEPS2BF16 */
  return (gj_bf16)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}
/* gj_bf16_to_f32(gj_f32_to_bf16(f)), the same bits, without branches: selects, which a
 * vectorized loop does as blends (8 at a time with AVX2). */
static inline float gj_bf16_rounded(float f) {
  union { float f; uint32_t u; } x = {f};
  const uint32_t u = x.u;
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  r = (u & 0x7f800000u) == 0 ? u & 0x80000000u : r;                   /* subnormal: signed zero */
  r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) & 0xffff0000u : r; /* NaN stays NaN */
  union { uint32_t u; float f; } y = {r};
  return y.f;
}

/* Shape recording: while on, every product's kind and shape is counted (and whether it ran
 * inside a parallel region). gj_gemm_recorded_rate then times each recorded shape alone, with
 * the same backend, precision and threading, and returns the recorded FLOPs per step over the
 * time they take at those rates: the GEMM ceiling of exactly the step's products. Each shape's
 * best time is kept across calls (until the reset): a second call takes the faster of both. */
void gj_gemm_record(int on);
void gj_gemm_record_reset(void);
double gj_gemm_recorded_flops(void); /* FLOPs recorded since the reset */
int gj_gemm_recorded_shapes(void);    /* distinct shapes recorded since the reset */
double gj_gemm_recorded_rate(double seconds_per_shape);
/* The bytes gj_gemm_recorded_rate and gj_gemm_recorded_replay allocate for their operands (per
 * thread the largest recorded shape it runs; freed when they return). */
size_t gj_gemm_probe_bytes(void);
/* The recorded products replayed once alone, each shape as many times as the step ran it (a
 * shape recorded inside a parallel region shared out over the threads, as there): seconds, 0
 * if it could not be done (out of memory). Its operands are allocated and filled before the
 * clock starts, and freed after; the same in every process of a job, no communication. */
double gj_gemm_recorded_replay(void);
/* The number of products run through the doors so far (recorded or not, replays included). */
uint64_t gj_gemm_products(void);
/* Each recorded shape with its count and its best time from gj_gemm_recorded_rate (log lines). */
void gj_gemm_recorded_print(void);

/* The hardware's peak FLOP/s for a precision, from a short tight loop run on every thread at
 * once (the best per-thread rate of 8 rounds, times the threads): float32: AVX-512 or AVX2 FMA;
 * bf16: AMX tiles, else the faster of AVX512_BF16 dot products and the FMA units, whatever
 * unit --gemm chose (MFU is against the hardware, not the backend). 0: no such unit. */
double gj_peak_flops(gj_precision prec, int nthreads, const char **how);

#endif
