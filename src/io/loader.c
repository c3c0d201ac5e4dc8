#include "io/loader.h"

#include <stdlib.h>

#include "common.h"

static void make_order(gj_loader *l) {
  for (uint64_t i = 0; i < l->n_windows; i++) l->order[i] = i;
  if (l->shuffle) { /* Fisher-Yates keyed by (seed, epoch) */
    uint64_t key = gj_mix64(l->st.seed ^ gj_mix64(l->st.epoch + 0x5851f42d4c957f2dULL));
    for (uint64_t i = l->n_windows - 1; i > 0; i--) {
      uint64_t j = gj_mix64(key + i) % (i + 1), t = l->order[i];
      l->order[i] = l->order[j], l->order[j] = t;
    }
  }
  l->order_epoch = l->st.epoch;
}

int gj_loader_init(gj_loader *l, const gj_dataset *ds, int64_t T, uint64_t seed, int shuffle) {
  l->ds = ds, l->T = T, l->shuffle = shuffle;
  l->st = (gj_loader_state){seed, 0, 0};
  if (T < 1 || ds->n_tokens < (uint64_t)T + 1)
    return GJ_FAIL("%s: %llu tokens, fewer than one window of seq_len + 1 = %lld", ds->path,
                   (unsigned long long)ds->n_tokens, (long long)T + 1);
  l->n_windows = (ds->n_tokens - 1) / T;
  size_t bytes;
  l->order = gj_mul_size(&bytes, (size_t)l->n_windows, sizeof(uint64_t)) ? NULL : malloc(bytes);
  if (!l->order)
    return GJ_FAIL("%s: out of memory for the order of %llu windows", ds->path, (unsigned long long)l->n_windows);
  make_order(l);
  return 0;
}

void gj_loader_free(gj_loader *l) {
  free(l->order);
  l->order = NULL;
}

int gj_loader_restore(gj_loader *l, gj_loader_state st) {
  if (st.cursor > l->n_windows)
    return GJ_FAIL("%s: saved loader position %llu is beyond the dataset's %llu windows (another "
                   "dataset or sequence length?)", l->ds->path, (unsigned long long)st.cursor,
                   (unsigned long long)l->n_windows);
  l->st = st;
  make_order(l);
  return 0;
}

int gj_loader_next(gj_loader *l, int64_t G, uint64_t *win) {
  if (G < 1 || (uint64_t)G > l->n_windows)
    return GJ_FAIL("%s: a global batch of %lld windows exceeds the dataset's %llu windows of %lld "
                   "tokens", l->ds->path, (long long)G, (unsigned long long)l->n_windows,
                   (long long)l->T + 1);
  if (l->st.cursor + G > l->n_windows) {
    l->st.epoch++, l->st.cursor = 0;
    make_order(l);
  }
  for (int64_t i = 0; i < G; i++) win[i] = l->order[l->st.cursor + i];
  l->st.cursor += G;
  return 0;
}

void gj_loader_window(const gj_loader *l, uint64_t w, int32_t *ids, int32_t *targets) {
  const uint16_t *t = l->ds->tokens + w * l->T;
  for (int64_t i = 0; i < l->T; i++) ids[i] = t[i], targets[i] = t[i + 1];
}
