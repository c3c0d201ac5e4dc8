/* Causal multi-head self-attention, tiled by query blocks so that no [T, T] matrix per head
 * is ever stored: forward keeps only the log-sum-exp per query row; backward recomputes the
 * probabilities block by block. All products go through the GEMM door (model/gemm.h). */
#ifndef GJ_MODEL_ATTENTION_H
#define GJ_MODEL_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#include "model/gemm.h"

#define GJ_ATTN_QBLOCK 64

/* Floats of scratch the kernels need for nthreads threads, up to Tk keys and head size Hd. */
size_t gj_attention_scratch_floats(int nthreads, int64_t Tk, int64_t Hd);

/* Query row t of batch b (absolute position pos0 + t, pos0 = Tk - Tq) sees keys 0..pos0+t.
 * out [B, Tq, Hl*Hd] (row stride ldo, batch stride Tq*ldo); out16: NULL, or out's bf16 copy
 * in the same layout, written too;
 * lse [B, Hl, Tq] (NULL allowed);
 * q [B, Tq rows, stride ldq; batch stride qbs]; k, v [B, Tk rows, stride ldk; batch stride kbs];
 * qkv16: NULL, or bfloat16 copies of q, k, v for bf16 precision, head-major [B, Hl, Tq, Hd]
 * for q and [B, Hl, Tkc, Hd] for k and v, Tkc >= Tk (Tk for copies of these keys alone, a KV
 * cache's capacity for a cache; gj_attention_heads16), so that the tiles' products neither
 * round them again nor read strided rows (any of the three may be NULL; k or v is then not
 * read where its copy is given);
 * scratch: gj_attention_scratch_floats() floats. */
void gj_attention_forward(float *out, gj_bf16 *out16, float *lse, const float *q, const float *k,
                          const float *v,
                          const gj_bf16 *const qkv16[3], int64_t Tkc, float *scratch, int64_t B,
                          int64_t Tq, int64_t Tk, int64_t Hl, int64_t Hd, int64_t ldo,
                          int64_t ldq, int64_t qbs, int64_t ldk, int64_t kbs);
/* dst [B, Hl, T, Hd] = src [B, T, ld] (head h at columns h*Hd) rounded to bfloat16. */
void gj_attention_heads16(gj_bf16 *dst, const float *src, int64_t B, int64_t T, int64_t Hl,
                          int64_t Hd, int64_t ld);
/* The same into rows t0 .. t0+T-1 of dst [B, Hl, Tc, Hd] (a KV cache of Tc positions). */
void gj_attention_heads16_at(gj_bf16 *dst, int64_t Tc, int64_t t0, const float *src, int64_t B,
                             int64_t T, int64_t Hl, int64_t Hd, int64_t ld);
/* Backward for Tq = Tk = T, all row strides ld, batch strides T*ld.
 * dq, dk, dv [B*T, ld] (written, not accumulated); dout, out [B*T, ld] (out16: NULL, or out's
 * bf16 copy, read instead of out, which may then be NULL); lse [B, Hl, T];
 * qkvd16: NULL, or head-major bfloat16 copies of q, k, v and dout (as for the forward). */
void gj_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const gj_bf16 *out16, const float *lse, const float *q, const float *k,
                           const float *v, const gj_bf16 *const qkvd16[4], float *scratch,
                           int64_t B, int64_t T, int64_t Hl, int64_t Hd, int64_t ld);
#endif
