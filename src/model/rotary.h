/* GPT-J rotary position embedding: interleaved pairs (2i, 2i+1) of the first R dims of each
 * head, theta = p * 10000^(-2i/R). Applied to q and k in place. */
#ifndef GJ_MODEL_ROTARY_H
#define GJ_MODEL_ROTARY_H
#include <stdint.h>

#include "model/gemm.h"

/* cos, sin [P, R/2] for positions 0..P-1. */
void gj_rotary_table(float *cos_t, float *sin_t, int64_t P, int64_t R);
/* x [B*T rows of stride ld, Hl heads of Hd]: rotate in place; row b*T+t has position pos0+t. */
void gj_rotary_forward(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                       int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld);
/* dx = R(theta)^T dy, in place on dy (the inverse rotation). */
void gj_rotary_backward(float *dx, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                        int64_t Hl, int64_t Hd, int64_t R, int64_t pos0, int64_t ld);
/* One head's row x [Hd] at position (c, s: the table's row [R/2]), its first R dims rotated by
 * sign (1: forward, -1: the inverse), rounded to bfloat16 into y16 [Hd] as gj_bf16_round
 * rounds: bit for bit the float rotation's result rounded. */
void gj_rotary_row16(gj_bf16 *y16, const float *x, const float *c, const float *s, int64_t Hd,
                     int64_t R, float sign);
/* dst [B, Hl, T, Hd] (head-major, as gj_attention_heads16) = src [B*T rows of stride ld]
 * rotated (row b*T+t at position t) and rounded to bfloat16, src untouched: bf16 training's
 * copies of q and k in one pass. */
void gj_rotary_heads16(gj_bf16 *dst, const float *src, const float *cos_t, const float *sin_t,
                       int64_t B, int64_t T, int64_t Hl, int64_t Hd, int64_t R, int64_t ld);
#endif
