#include "model/generate.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"

int gj_logits_argmax(gj_model *m, int64_t row, int32_t *out) {
  const float *l = m->a.logits + row * m->Vl;
  struct { float v; int i; } best = {-INFINITY, 0}, all;
  for (int64_t j = 0; j < m->Vl; j++)
    if (l[j] > best.v) best.v = l[j], best.i = (int)(m->v0 + j);
  if (m->g->tp_size > 1) {
    /* MAXLOC keeps the smaller index on equal values: the first index wins a tie. */
    int rc = MPI_Allreduce(&best, &all, 1, MPI_FLOAT_INT, MPI_MAXLOC, m->g->tp);
    if (rc != MPI_SUCCESS) return gj_mpi_fail(rc, "MPI_Allreduce(argmax)");
    best = all;
  }
  *out = best.i;
  return 0;
}

int gj_generate_greedy_recompute(gj_model *m, int32_t *ids, int64_t n_prompt, int64_t n_new) {
  if (n_prompt + n_new - 1 > m->Tmax)
    return GJ_FAIL("prompt plus new tokens (%lld) exceed the model's context %lld",
                   (long long)(n_prompt + n_new), (long long)m->Tmax);
  int32_t *tg = malloc((n_prompt + n_new) * sizeof(int32_t));
  if (!tg) return GJ_FAIL("out of memory");
  for (int64_t i = 0; i < n_prompt + n_new; i++) tg[i] = -1;
  int rc = 0;
  for (int64_t s = 0; s < n_new && !rc; s++) {
    int64_t T = n_prompt + s;
    double loss;
    int64_t nv;
    rc = gj_model_forward(m, ids, tg, 1, T, 0.0f, &loss, &nv);
    if (!rc) rc = gj_logits_argmax(m, T - 1, &ids[T]);
  }
  free(tg);
  return rc;
}
