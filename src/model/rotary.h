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
/* The same rotation of dy (not modified) into dx16 [same layout], rounded to bfloat16 as
 * gj_bf16_round rounds, in one pass; returns dx16. */
const gj_bf16 *gj_rotary_backward16(gj_bf16 *dx16, const float *dy, const float *cos_t,
                                    const float *sin_t, int64_t B, int64_t T, int64_t Hl,
                                    int64_t Hd, int64_t R, int64_t pos0, int64_t ld);
#endif
