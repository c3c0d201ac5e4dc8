#include "io/weights.h"

#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "io/h5util.h"

int gj_weights_read(hid_t file, const char *fname, const char *prefix, const gj_layout *l,
                    float *base) {
  char path[256];
  for (int i = 0; i < l->n; i++) {
    const gj_tensor *t = &l->t[i];
    snprintf(path, sizeof path, "%s%s", prefix, t->name);
    GJ_TRY(gj_h5_read_block_f32(file, fname, path, t->rows, t->cols, t->ndim, t->row0, t->col0,
                                t->lrows, t->lcols, base + t->offset));
  }
  return 0;
}

int gj_tensor_gather(gj_grid *g, const gj_tensor *t, const float *base, float *out) {
  const float *local = base + t->offset;
  switch (t->shard) {
  case GJ_SHARD_ROWS: return gj_tp_gather_rows(g, out, local, t->rows, t->cols);
  case GJ_SHARD_COLS: return gj_tp_gather_cols(g, out, local, t->rows, t->cols);
  default:
    if (g->tp_rank == 0)
      for (size_t k = 0; k < t->numel; k++) out[k] = local[k];
    return 0;
  }
}

int gj_weights_write_gathered(gj_grid *g, hid_t file, const char *prefix, const gj_layout *l,
                              const float *base) {
  size_t maxn = 0;
  for (int i = 0; i < l->n; i++)
    if ((size_t)(l->t[i].rows * l->t[i].cols) > maxn) maxn = l->t[i].rows * l->t[i].cols;
  float *buf = g->tp_rank == 0 ? malloc(maxn * sizeof(float)) : NULL;
  if (g->tp_rank == 0 && !buf) return GJ_FAIL("out of memory gathering tensors");
  char path[256];
  int rc = 0;
  for (int i = 0; i < l->n && !rc; i++) {
    const gj_tensor *t = &l->t[i];
    rc = gj_tensor_gather(g, t, base, buf);
    if (!rc && g->rank == 0) {
      snprintf(path, sizeof path, "%s%s", prefix, t->name);
      int64_t dims[2] = {t->rows, t->cols};
      rc = gj_h5_write_f32(file, path, buf, t->ndim, dims);
    }
  }
  free(buf);
  return rc;
}
