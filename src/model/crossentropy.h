/* Vocab-parallel softmax cross-entropy: each rank holds logits for vocab [v0, v0 + Vl).
 * The caller combines the per-rank partial results with TP all-reduces (max, then sums), so
 * the full [N, V] logits are never gathered. Targets < 0 are ignored rows. */
#ifndef GJ_MODEL_CROSSENTROPY_H
#define GJ_MODEL_CROSSENTROPY_H
#include <stdint.h>

/* mx [N] = row max of logits [N, Vl]. */
void gj_ce_rowmax(float *mx, const float *logits, int64_t N, int64_t Vl);
/* stats [2N]: stats[i] = sum_j exp(logits[i,j] - mx[i]); stats[N+i] = logits[i, target - v0]
 * when the target is in this rank's range, else 0. mx must already be the global max. */
void gj_ce_stats(float *stats, const float *logits, const float *mx, const int32_t *targets,
                 int64_t N, int64_t Vl, int64_t v0);
/* From global stats: lse [N] = log Z per row; returns the sum over valid rows of
 * (log Z - target logit) + zloss * (log Z)^2. *n_valid = number of valid rows. */
double gj_ce_loss(float *lse, const float *mx, const float *stats, const int32_t *targets,
                  int64_t N, float zloss, int64_t *n_valid);
/* In place: logits [N, Vl] -> scale * d(loss)/d(logits) = scale * (softmax * (1 + 2 zloss
 * log Z) - onehot), zero rows for ignored targets. */
void gj_ce_backward(float *dlogits, const float *lse, const int32_t *targets, int64_t N,
                    int64_t Vl, int64_t v0, float scale, float zloss);
#endif
