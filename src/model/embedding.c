#include "model/embedding.h"

#include <string.h>

void gj_embedding_forward(float *out, const int32_t *ids, const float *wte, int64_t N,
                          int64_t D, int64_t v0, int64_t Vl) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    int64_t r = (int64_t)ids[i] - v0;
    if (r >= 0 && r < Vl)
      memcpy(out + i * D, wte + r * D, D * sizeof(float));
    else
      memset(out + i * D, 0, D * sizeof(float));
  }
}

void gj_embedding_forward16(float *out, const int32_t *ids, const gj_bf16 *wte16, int64_t N,
                            int64_t D, int64_t v0, int64_t Vl) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    int64_t r = (int64_t)ids[i] - v0;
    float *o = out + i * D;
    if (r >= 0 && r < Vl) {
      const gj_bf16 *w = wte16 + r * D;
#pragma omp simd
      for (int64_t j = 0; j < D; j++) o[j] = gj_bf16_to_f32(w[j]);
    } else {
      memset(o, 0, D * sizeof(float));
    }
  }
}

void gj_embedding_backward(float *dwte, const float *dout, const int32_t *ids, int64_t N,
                           int64_t D, int64_t v0, int64_t Vl, const int32_t *slot) {
  /* Parallel over columns: rows repeat when a token repeats, columns never collide. */
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < D; c0 += 16) {
    int64_t c1 = c0 + 16 < D ? c0 + 16 : D;
    for (int64_t i = 0; i < N; i++) {
      int64_t r = (int64_t)ids[i] - v0;
      if (r < 0 || r >= Vl) continue;
      float *g = dwte + (slot ? slot[r] : r) * D;
      for (int64_t c = c0; c < c1; c++) g[c] += dout[i * D + c];
    }
  }
}
