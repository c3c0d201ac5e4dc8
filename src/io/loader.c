#include "io/loader.h"

#include "common.h"

uint64_t gj_loader_key(uint64_t seed, uint64_t epoch) {
  return gj_mix64(seed ^ gj_mix64(epoch + 0x5851f42d4c957f2dULL));
}

/* A balanced Feistel network of 6 rounds on 2h bits (the smallest even width with 4^h >= n,
 * so fewer than 4n values), each round's function a SplitMix64 hash of the half and the round
 * key: a permutation of [0, 4^h). Cycle walking (apply it again until the value is below n)
 * restricts it to a permutation of [0, n); the expected number of walks is below 4. */
uint64_t gj_loader_permute(uint64_t n, uint64_t key, uint64_t i) {
  if (n <= 1) return 0;
  int bits = 64 - __builtin_clzll(n - 1); /* 2^bits >= n */
  int h = (bits + 1) / 2;
  const uint64_t mask = (h == 32) ? 0xffffffffULL : (((uint64_t)1 << h) - 1);
  uint64_t rk[6];
  for (int r = 0; r < 6; r++) rk[r] = gj_mix64(key + 0x9e3779b97f4a7c15ULL * (uint64_t)(r + 1));
  uint64_t x = i;
  do {
    uint64_t L = x >> h, R = x & mask;
    for (int r = 0; r < 6; r++) {
      uint64_t t = L ^ (gj_mix64(R ^ rk[r]) & mask);
      L = R, R = t;
    }
    x = (L << h) | R;
  } while (x >= n);
  return x;
}

static uint64_t window_at(const gj_loader *l, uint64_t epoch, uint64_t pos) {
  return l->shuffle ? gj_loader_permute(l->n_windows, gj_loader_key(l->st.seed, epoch), pos) : pos;
}

int gj_loader_init(gj_loader *l, const gj_dataset *ds, int64_t T, uint64_t seed, int shuffle) {
  l->ds = ds, l->T = T, l->shuffle = shuffle;
  l->st = (gj_loader_state){seed, 0, 0};
  l->n_windows = 0;
  if (T < 1 || ds->n_tokens < (uint64_t)T + 1)
    return GJ_FAIL("%s: %llu tokens, fewer than one window of seq_len + 1 = %lld", ds->path,
                   (unsigned long long)ds->n_tokens, (long long)T + 1);
  l->n_windows = (ds->n_tokens - 1) / T;
  return 0;
}

void gj_loader_free(gj_loader *l) { (void)l; }

int gj_loader_restore(gj_loader *l, gj_loader_state st) {
  if (st.cursor > l->n_windows)
    return GJ_FAIL("%s: saved loader position %llu is beyond the dataset's %llu windows (another "
                   "dataset or sequence length?)", l->ds->path, (unsigned long long)st.cursor,
                   (unsigned long long)l->n_windows);
  l->st = st;
  return 0;
}

int gj_loader_next(gj_loader *l, int64_t G, uint64_t *win) {
  if (G < 1 || (uint64_t)G > l->n_windows)
    return GJ_FAIL("%s: a global batch of %lld windows exceeds the dataset's %llu windows of %lld "
                   "tokens", l->ds->path, (long long)G, (unsigned long long)l->n_windows,
                   (long long)l->T + 1);
  if (l->st.cursor + G > l->n_windows) l->st.epoch++, l->st.cursor = 0;
  for (int64_t i = 0; i < G; i++) win[i] = window_at(l, l->st.epoch, l->st.cursor + i);
  l->st.cursor += G;
  /* the next global batch (the same rule), for the page cache to fetch while this one runs */
  uint64_t e = l->st.epoch, c = l->st.cursor;
  if (c + G > l->n_windows) e++, c = 0;
  for (int64_t i = 0; i < G; i++)
    gj_dataset_advise(l->ds, window_at(l, e, c + i) * (uint64_t)l->T, (uint64_t)l->T + 1);
  return 0;
}

int gj_loader_window(const gj_loader *l, uint64_t w, int32_t *ids, int32_t *targets) {
  uint64_t at = w * (uint64_t)l->T;
  GJ_TRY(gj_dataset_get(l->ds, at, (uint64_t)l->T, ids));
  return gj_dataset_get(l->ds, at + 1, (uint64_t)l->T, targets);
}
