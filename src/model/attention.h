/* Causal multi-head self-attention, tiled by query blocks so that no [T, T] matrix per head
 * is ever stored: forward keeps only the log-sum-exp per query row; backward recomputes the
 * probabilities block by block. All products go through cblas_sgemm. */
#ifndef GJ_MODEL_ATTENTION_H
#define GJ_MODEL_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#define GJ_ATTN_QBLOCK 64

/* Floats of scratch the kernels need for nthreads threads and up to Tk keys. */
size_t gj_attention_scratch_floats(int nthreads, int64_t Tk);

/* Query row t of batch b (absolute position pos0 + t, pos0 = Tk - Tq) sees keys 0..pos0+t.
 * out [B, Tq, Hl*Hd] (row stride ldo, batch stride Tq*ldo);
 * lse [B, Hl, Tq] (NULL allowed);
 * q [B, Tq rows, stride ldq; batch stride qbs]; k, v [B, Tk rows, stride ldk; batch stride kbs];
 * scratch: gj_attention_scratch_floats() floats. */
void gj_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          float *scratch, int64_t B, int64_t Tq, int64_t Tk, int64_t Hl,
                          int64_t Hd, int64_t ldo, int64_t ldq, int64_t qbs, int64_t ldk,
                          int64_t kbs);
/* Backward for Tq = Tk = T, all row strides ld, batch strides T*ld.
 * dq, dk, dv [B*T, ld] (written, not accumulated); dout, out [B*T, ld]; lse [B, Hl, T]. */
void gj_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           float *scratch, int64_t B, int64_t T, int64_t Hl, int64_t Hd,
                           int64_t ld);
#endif
