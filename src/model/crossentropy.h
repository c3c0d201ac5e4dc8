/* Vocab-parallel softmax cross-entropy: each rank holds logits for vocab [v0, v0 + Vl).
 * The caller combines the per-rank partial results with TP all-reduces (max, then sums), so
 * the full [N, V] logits are never gathered. Targets < 0 are ignored rows. */
#ifndef GJ_MODEL_CROSSENTROPY_H
#define GJ_MODEL_CROSSENTROPY_H
#include <stdint.h>

#include "model/gemm.h"

/* One pass over this shard's logits [N, Vl] (each row read once from memory): mx [N] = the
 * row's max; stats [2N]: stats[i] = sum_j exp(logits[i,j] - mx[i]), stats[N+i] =
 * logits[i, target - v0] when the target is in this shard's range, else 0. */
void gj_ce_stats(float *mx, float *stats, const float *logits, const int32_t *targets, int64_t N,
                 int64_t Vl, int64_t v0);
/* After the max all-reduce over the shards turned each row's max into gmx [N]: stats[i] *=
 * exp(mx[i] - gmx[i]), the shard's sum relative to the global max (mx: the shard's own). Then
 * the shards' stats are summed. */
void gj_ce_rescale(float *stats, const float *mx, const float *gmx, int64_t N);
/* From global stats: lse [N] = log Z per row; returns the sum over valid rows of
 * (log Z - target logit) + zloss * (log Z)^2, the objective. *n_valid = number of valid rows;
 * *z_sum (if not NULL) gets the z-loss part, zloss * sum of (log Z)^2. */
double gj_ce_loss(float *lse, const float *mx, const float *stats, const int32_t *targets,
                  int64_t N, float zloss, int64_t *n_valid, double *z_sum);
/* d = scale * d(loss)/d(logits) = scale * (softmax * (1 + 2 zloss log Z) - onehot) of logits
 * [N, Vl], zero rows for ignored targets, in one pass that writes it to any of:
 * dlogits [N, Vl] (float; may be logits itself), d16 [N, Vl] (rounded to bfloat16), and
 * dbias [Vl] += its column sums. Each may be NULL; dbias needs acc, omp_get_max_threads() * Vl
 * floats of scratch. */
void gj_ce_backward(float *dlogits, gj_bf16 *d16, float *dbias, float *acc, const float *logits,
                    const float *lse, const int32_t *targets, int64_t N, int64_t Vl, int64_t v0,
                    float scale, float zloss);
/* Floats of scratch (acc) gj_ce_backward needs for a bias gradient over Vl columns. */
size_t gj_ce_backward_scratch(int nthreads, int64_t Vl);
#endif
