#include "train/evaluate.h"

#include <stdlib.h>

#include "common.h"

int gj_evaluate(gj_model *m, const gj_dataset *ds, int64_t T, int64_t S, int64_t B,
                int64_t max_windows, double *nll, int64_t *count) {
  gj_grid *g = m->g;
  const int64_t n = (int64_t)ds->n_tokens;
  if (n < 2) return GJ_FAIL("%s: fewer than 2 tokens: nothing to evaluate", ds->path);
  if (S < 1 || S > T) return GJ_FAIL("--stride %lld must be in [1, seq_len %lld]", (long long)S, (long long)T);
  int32_t *ids = malloc(B * T * sizeof(int32_t)), *tg = malloc(B * T * sizeof(int32_t));
  /* agreed: the TP partners of a rank that failed would wait in forward */
  if (gj_agree(g->world, ids && tg ? 0 : GJ_FAIL("out of memory for a batch of %lld x %lld ids", (long long)B, (long long)T)))
    return free(ids), free(tg), -1;
  double sum = 0;
  int64_t cnt = 0, nb = 0, Tb = 0;
  int rc = 0;
  int64_t prev_end = 0;
  for (int64_t w = 0, b = 0; prev_end < n - 1 && !rc; w++, b += S) {
    if (max_windows > 0 && w >= max_windows) break;
    int64_t e = GJ_MIN(b + T, n - 1), len = e - b;
    int mine = w % g->dp_size == g->dp_rank;
    if (mine) {
      /* a batch holds windows of one length: flush when the length changes */
      if (nb > 0 && len != Tb) {
        double ls; int64_t nv;
        rc = gj_model_forward(m, ids, tg, nb, Tb, 0.0f, &ls, &nv);
        sum += ls, cnt += nv, nb = 0;
      }
      Tb = len;
      /* the window's tokens and their successors, read from the dataset */
      if (!rc) rc = gj_dataset_get(ds, (uint64_t)b, (uint64_t)len, ids + nb * len);
      if (!rc) rc = gj_dataset_get(ds, (uint64_t)b + 1, (uint64_t)len, tg + nb * len);
      for (int64_t i = 0; i < len && !rc; i++)
        if (b + i + 1 <= prev_end) tg[nb * len + i] = -1; /* target b+i+1 scored by an earlier window */
      if (!rc && ++nb == B) {
        double ls; int64_t nv;
        rc = gj_model_forward(m, ids, tg, nb, Tb, 0.0f, &ls, &nv);
        sum += ls, cnt += nv, nb = 0;
      }
    }
    prev_end = e;
  }
  if (nb > 0 && !rc) {
    double ls; int64_t nv;
    rc = gj_model_forward(m, ids, tg, nb, Tb, 0.0f, &ls, &nv);
    sum += ls, cnt += nv;
  }
  free(ids), free(tg);
  GJ_AGREE(g->world, rc);
  double v[2] = {sum, (double)cnt};
  GJ_TRY(gj_allreduce_sum_f64(g->dp, v, 2));
  *nll = v[0];
  *count = (int64_t)v[1];
  return 0;
}
