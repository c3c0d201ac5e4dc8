/* FLOP accounting (DESIGN.md §8) and the GEMM rate gptj plan assumes. */
#ifndef GJ_MODEL_FLOPS_H
#define GJ_MODEL_FLOPS_H

#include <stdint.h>

#include "model/config.h"

/* Training FLOPs per token: 6 N + 12 n_layer D T, N = all parameters but the embedding
 * (lm_head included). */
double gj_flops_per_token(const gj_config *c, int64_t T);
/* Best FLOP/s of the GEMM door (row-major, C[M,N] = A[M,K] B[N,K]^T; float32 OpenBLAS unless
 * gj_gemm_setup chose otherwise) over a few repetitions of at least min_seconds in all, at the
 * current thread count. gptj plan's rate; train and bench measure the step's own products
 * (gj_gemm_recorded_rate). */
double gj_sgemm_rate(int64_t M, int64_t N, int64_t K, double min_seconds);

/* GEMM FLOP/s on the model's own forward GEMM shapes for N tokens on TP rank shards
 * (q, k, v, out_proj, fc_in, fc_out per layer and lm_head, each weighted by its FLOPs). */
double gj_sgemm_model_rate(const gj_config *c, int64_t N, int tp, double seconds_per_shape);

/* About the bytes of the GEMM-rate probe's operands (gj_gemm_probe_bytes, which is known once a
 * step has run) for a training step of N rows per micro-batch on TP shards: the largest
 * product's operands, and in bf16 the copies of its inputs (at most); the attention's tiles,
 * per thread, are left out (a few MB). */
double gj_probe_bytes_estimate(const gj_config *c, int tp, int64_t N, int late_head, int bf16);

#endif
