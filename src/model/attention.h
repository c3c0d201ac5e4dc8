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
 * in the same layout, written too (out may then be NULL: the bf16 copy alone is written);
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
/* bf16 training's outputs of the attention backward (gj_attention_backward's g16): d q and
 * d k inverse-rotated (gj_rotary_backward; cos, sin: the table, row t at position t, R rotary
 * dims) and d v, each rounded to bfloat16 into [B*T, ld] as the float ones would be laid out,
 * in one pass from the head's dense sums: the float ones are never written. */
typedef struct {
  gj_bf16 *dq, *dk, *dv;
  const float *cos, *sin;
  int64_t R;
} gj_attn_grad16;
/* The first pass of the backward (Tq = Tk = T, row strides ld, batch strides T*ld), over the
 * rows in order: delta [B, Hl, T] = the row sums of dout * out per head (out16: NULL, or out's
 * bf16 copy, read instead of out, which may then be NULL), and dout16 (if not NULL) dout's
 * head-major bfloat16 copy [B, Hl, T, Hd], in the same pass. (Summed per head inside the
 * backward's loop instead, these rows were read with a stride and from memory: most of its
 * time outside the products.) */
void gj_attention_backward_prep(float *delta, gj_bf16 *dout16, const float *dout, const float *out,
                                const gj_bf16 *out16, int64_t B, int64_t T, int64_t Hl, int64_t Hd,
                                int64_t ld);
/* Backward for Tq = Tk = T, all row strides ld, batch strides T*ld.
 * dq, dk, dv [B*T, ld] (written, not accumulated; with g16 not at all, and may be NULL);
 * dout [B*T, ld] (not read where qkvd16 has its copy); delta [B, Hl, T] from
 * gj_attention_backward_prep; lse [B, Hl, T];
 * qkvd16: NULL, or head-major bfloat16 copies of q, k, v and dout (as for the forward). */
void gj_attention_backward(float *dq, float *dk, float *dv, const gj_attn_grad16 *g16,
                           const float *dout, const float *delta, const float *lse, const float *q,
                           const float *k, const float *v, const gj_bf16 *const qkvd16[4],
                           float *scratch, int64_t B, int64_t T, int64_t Hl, int64_t Hd, int64_t ld);
#endif
