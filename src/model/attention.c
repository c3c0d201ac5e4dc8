#include "model/attention.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common.h"
#include "model/fastmath.h"
#include "model/gemm.h"
#include "model/rotary.h"

/* Head (b, h) of bf16 copy i of a set, head-major [B, Hl, n, Hd] (NULL if none); a pointer
 * moved by off. A head's rows are dense there (row stride Hd), as the AMX kernels want them. */
#define HEAD16(set, i, n) ((set) && (set)[i] ? (set)[i] + ((size_t)(b * Hl + h) * (n)) * Hd : NULL)
#define AT(p, off) ((p) ? (p) + (off) : NULL)

GJ_HOT
void gj_attention_heads16_at(gj_bf16 *dst, int64_t Tc, int64_t t0, const float *src, int64_t B,
                             int64_t T, int64_t Hl, int64_t Hd, int64_t ld) {
  assert(t0 >= 0 && t0 + T <= Tc);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; bt++) {
    int64_t b = bt / T, t = bt % T;
    for (int64_t h = 0; h < Hl; h++)
      gj_bf16_round(dst + ((b * Hl + h) * Tc + t0 + t) * Hd, src + bt * ld + h * Hd, (size_t)Hd);
  }
}

void gj_attention_heads16(gj_bf16 *dst, const float *src, int64_t B, int64_t T, int64_t Hl,
                          int64_t Hd, int64_t ld) {
  gj_attention_heads16_at(dst, T, 0, src, B, T, Hl, Hd, ld);
}

/* A thread's scratch: two [QBLOCK, Tk] blocks (scores and their gradients), dK, dV and dQ of
 * its head, dense [Tk, Hd] each (backward; dQ with bf16 outputs only), then two [QBLOCK, Tk]
 * bfloat16 blocks: the copies of the probabilities and of the scores' gradients that the
 * products read when they read bf16 (written by the softmax loops, so that the door rounds no
 * tile, dS not twice). */
static size_t thread_floats(int64_t Tk, int64_t Hd) {
  return 2 * (size_t)Tk * GJ_ATTN_QBLOCK + 3 * (size_t)Tk * Hd + (size_t)GJ_ATTN_QBLOCK * Tk;
}
/* its bfloat16 blocks */
static gj_bf16 *thread_bf16(float *t, int64_t Tk, int64_t Hd) {
  return (gj_bf16 *)(t + 2 * (size_t)Tk * GJ_ATTN_QBLOCK + 3 * (size_t)Tk * Hd);
}

size_t gj_attention_scratch_floats(int nthreads, int64_t Tk, int64_t Hd) {
  return (size_t)nthreads * thread_floats(Tk, Hd);
}

GJ_HOT
void gj_attention_forward(float *out, gj_bf16 *out16, float *lse, const float *q, const float *k,
                          const float *v, const gj_bf16 *const qkv16[3], int64_t Tkc,
                          float *scratch, int64_t B, int64_t Tq, int64_t Tk, int64_t Hl, int64_t Hd,
                          int64_t ldo, int64_t ldq, int64_t qbs, int64_t ldk, int64_t kbs) {
  const float scale = 1.0f / sqrtf((float)Hd);
  const int64_t pos0 = Tk - Tq;
  assert(pos0 >= 0 && Tkc >= Tk && (out || out16));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * Hl; bh++) {
    int64_t b = bh / Hl, h = bh % Hl;
    float *S = scratch + (size_t)omp_get_thread_num() * thread_floats(Tk, Hd);
    gj_bf16 *P16 = gj_gemm_reads_bf16() ? thread_bf16(S, Tk, Hd) : NULL;
    const float *Q = q + b * qbs + h * Hd, *K = k + b * kbs + h * Hd, *Vv = v + b * kbs + h * Hd;
    const gj_bf16 *Q16 = HEAD16(qkv16, 0, Tq), *K16 = HEAD16(qkv16, 1, Tkc), *V16 = HEAD16(qkv16, 2, Tkc);
    /* the stride of what the GEMM door reads: the bf16 copy when there is one */
    const int64_t lq = Q16 ? Hd : ldq, lk = K16 ? Hd : ldk, lv = V16 ? Hd : ldk;
    /* the output tile: into out, or (out NULL) into dense scratch (past the P block, where
     * backward keeps dK), rounded from there */
    float *O = out ? out + b * Tq * ldo + h * Hd : S + 2 * GJ_ATTN_QBLOCK * Tk;
    const int64_t lo = out ? ldo : Hd;
    for (int64_t i0 = 0; i0 < Tq; i0 += GJ_ATTN_QBLOCK) {
      int64_t qb = Tq - i0 < GJ_ATTN_QBLOCK ? Tq - i0 : GJ_ATTN_QBLOCK;
      int64_t nk = pos0 + i0 + qb; /* keys the last query of the block sees */
      gj_gemm(0, 1, qb, nk, Hd, scale, Q + i0 * ldq, AT(Q16, i0 * Hd), lq, K, K16, lk, 0.0f, S, nk);
      for (int64_t r = 0; r < qb; r++) {
        float *s = S + r * nk;
        int64_t nv = pos0 + i0 + r + 1; /* visible keys */
        const float mx = gj_row_max(s, nv);
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) s[j] = gj_expf(s[j] - mx);
        const float sum = gj_row_sum(s, nv), inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) s[j] *= inv;
        for (int64_t j = nv; j < nk; j++) s[j] = 0.0f;
        if (P16) gj_bf16_round(P16 + r * nk, s, (size_t)nk);
        if (lse) lse[(b * Hl + h) * Tq + i0 + r] = mx + logf(sum);
      }
      float *Ob = out ? O + i0 * ldo : O;
      gj_gemm(0, 0, qb, Hd, nk, 1.0f, S, P16, nk, Vv, V16, lv, 0.0f, Ob, lo);
      if (out16)
        for (int64_t r = 0; r < qb; r++)
          gj_bf16_round(out16 + (size_t)(b * Tq + i0 + r) * ldo + h * Hd, Ob + r * lo, (size_t)Hd);
    }
  }
}

GJ_HOT
void gj_attention_backward_prep(float *delta, gj_bf16 *dout16, const float *dout, const float *out,
                                const gj_bf16 *out16, int64_t B, int64_t T, int64_t Hl, int64_t Hd,
                                int64_t ld) {
  enum { CH = 256 }; /* columns of out16 widened at a time */
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t b = bt / T, t = bt % T;
    for (int64_t h = 0; h < Hl; h++) {
      const float *dor = dout + bt * ld + h * Hd;
      float Di = 0;
      if (out16) {
        float ob[CH];
        for (int64_t d0 = 0; d0 < Hd; d0 += CH) {
          const int64_t m = Hd - d0 < CH ? Hd - d0 : CH;
          const gj_bf16 *o16 = out16 + bt * ld + h * Hd + d0;
#pragma omp simd
          for (int64_t d = 0; d < m; d++) ob[d] = gj_bf16_to_f32(o16[d]);
          Di += gj_row_dot(dor + d0, ob, m);
        }
      } else {
        Di = gj_row_dot(dor, out + bt * ld + h * Hd, Hd);
      }
      delta[(b * Hl + h) * T + t] = Di;
      if (dout16) gj_bf16_round(dout16 + ((b * Hl + h) * T + t) * Hd, dor, (size_t)Hd);
    }
  }
}

GJ_HOT
void gj_attention_backward(float *dq, float *dk, float *dv, const gj_attn_grad16 *g16,
                           const float *dout, const float *delta, const float *lse, const float *q,
                           const float *k, const float *v, const gj_bf16 *const qkvd16[4],
                           float *scratch, int64_t B, int64_t T, int64_t Hl, int64_t Hd, int64_t ld) {
  const float scale = 1.0f / sqrtf((float)Hd);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * Hl; bh++) {
    int64_t b = bh / Hl, h = bh % Hl;
    float *P = scratch + (size_t)omp_get_thread_num() * thread_floats(T, Hd);
    float *dS = P + GJ_ATTN_QBLOCK * T;
    /* the head's dK and dV are summed over the query blocks in dense [T, Hd] scratch, where the
     * AMX kernels accumulate (a strided destination would not get them), then copied out; with
     * bf16 outputs dQ too, rotated and rounded from there */
    float *dKh = dS + GJ_ATTN_QBLOCK * T, *dVh = dKh + T * Hd, *dQh = dVh + T * Hd;
    gj_bf16 *P16 = gj_gemm_reads_bf16() ? thread_bf16(P, T, Hd) : NULL;
    gj_bf16 *dS16 = P16 ? P16 + GJ_ATTN_QBLOCK * T : NULL;
    size_t base = (size_t)b * T * ld + h * Hd;
    const float *Q = q + base, *K = k + base, *Vv = v + base, *dO = dout + base;
    const gj_bf16 *Q16 = HEAD16(qkvd16, 0, T), *K16 = HEAD16(qkvd16, 1, T), *V16 = HEAD16(qkvd16, 2, T);
    const gj_bf16 *dO16 = HEAD16(qkvd16, 3, T);
    const int64_t lq = Q16 ? Hd : ld, lk = K16 ? Hd : ld, lv = V16 ? Hd : ld, lo = dO16 ? Hd : ld;
    /* where the tiles' dQ goes: the float output, or the dense dQh */
    float *dQ = g16 ? dQh : dq + base;
    const int64_t ldq = g16 ? Hd : ld;
    const float *L = lse + (b * Hl + h) * T, *Dr = delta + (b * Hl + h) * T;
    memset(dKh, 0, 2 * (size_t)T * Hd * sizeof(float));
    for (int64_t i0 = 0; i0 < T; i0 += GJ_ATTN_QBLOCK) {
      int64_t qb = T - i0 < GJ_ATTN_QBLOCK ? T - i0 : GJ_ATTN_QBLOCK;
      int64_t nk = i0 + qb;
      gj_gemm(0, 1, qb, nk, Hd, scale, Q + i0 * ld, AT(Q16, i0 * Hd), lq, K, K16, lk, 0.0f, P, nk);
      gj_gemm(0, 1, qb, nk, Hd, 1.0f, dO + i0 * ld, AT(dO16, i0 * Hd), lo, Vv, V16, lv, 0.0f, dS, nk);
      for (int64_t r = 0; r < qb; r++) {
        float *p = P + r * nk, *ds = dS + r * nk;
        const float Di = Dr[i0 + r]; /* rowsum(dO * O) = sum_j P_j dP_j */
        int64_t nv = i0 + r + 1;
        float l = L[i0 + r];
        /* dS carries the softmax's scale, which dQ and dK both take: the products then have
         * alpha 1 (oneDNN's output scale costs a pass of its own on small tiles) */
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) {
          p[j] = gj_expf(p[j] - l);
          ds[j] = scale * (p[j] * (ds[j] - Di));
        }
        for (int64_t j = nv; j < nk; j++) p[j] = ds[j] = 0.0f;
        if (P16) {
          gj_bf16_round(P16 + r * nk, p, (size_t)nk);
          gj_bf16_round(dS16 + r * nk, ds, (size_t)nk);
        }
      }
      gj_gemm(0, 0, qb, Hd, nk, 1.0f, dS, dS16, nk, K, K16, lk, 0.0f, dQ + i0 * ldq, ldq);
      gj_gemm(1, 0, nk, Hd, qb, 1.0f, dS, dS16, nk, Q + i0 * ld, AT(Q16, i0 * Hd), lq, 1.0f, dKh,
              Hd);
      gj_gemm(1, 0, nk, Hd, qb, 1.0f, P, P16, nk, dO + i0 * ld, AT(dO16, i0 * Hd), lo, 1.0f, dVh,
              Hd);
    }
    if (g16) {
      const int64_t hr = g16->R / 2;
      for (int64_t t = 0; t < T; t++) {
        const float *c = g16->cos + t * hr, *sn = g16->sin + t * hr;
        gj_rotary_row16(g16->dq + base + t * ld, dQh + t * Hd, c, sn, Hd, g16->R, -1.0f);
        gj_rotary_row16(g16->dk + base + t * ld, dKh + t * Hd, c, sn, Hd, g16->R, -1.0f);
        gj_bf16_round(g16->dv + base + t * ld, dVh + t * Hd, (size_t)Hd);
      }
    } else {
      float *dK = dk + base, *dV = dv + base;
      for (int64_t t = 0; t < T; t++) {
        memcpy(dK + t * ld, dKh + t * Hd, Hd * sizeof(float));
        memcpy(dV + t * ld, dVh + t * Hd, Hd * sizeof(float));
      }
    }
  }
}
