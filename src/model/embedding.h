/* Vocab-parallel token embedding: this rank holds rows [v0, v0 + Vl) of wte. */
#ifndef GJ_MODEL_EMBEDDING_H
#define GJ_MODEL_EMBEDDING_H
#include <stdint.h>

#include "model/gemm.h"

/* out [N, D] = wte[ids - v0] for ids in range, 0 otherwise. ids [N], wte [Vl, D]. */
void gj_embedding_forward(float *out, const int32_t *ids, const float *wte, int64_t N,
                          int64_t D, int64_t v0, int64_t Vl);
/* The same from a bfloat16 table wte16 [Vl, D], each row read widened to float32. */
void gj_embedding_forward16(float *out, const int32_t *ids, const gj_bf16 *wte16, int64_t N,
                            int64_t D, int64_t v0, int64_t Vl);
/* dwte [Vl, D] += dout [N, D] rows scattered by ids in range; with slot (or NULL), row r of the
 * gradient is dwte's row slot[r] (model/rowgrad.h). */
void gj_embedding_backward(float *dwte, const float *dout, const int32_t *ids, int64_t N,
                           int64_t D, int64_t v0, int64_t Vl, const int32_t *slot);
#endif
