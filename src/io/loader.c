#include "io/loader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

uint64_t gj_loader_corpus_seed(uint64_t seed, int k) {
  return gj_mix64(seed ^ (0xa0761d6478bd642fULL * (uint64_t)(k + 1)));
}

static int blended(const gj_loader *l) { return l->st.n_corpora > 1; }

/* Window pos of epoch `epoch` of corpus k's order, as a global window index. */
static uint64_t window_at(const gj_loader *l, int k, uint64_t epoch, uint64_t pos) {
  uint64_t n = l->corpus_first[k + 1] - l->corpus_first[k];
  uint64_t seed = blended(l) ? gj_loader_corpus_seed(l->st.seed, k) : l->st.seed;
  return l->corpus_first[k] + (l->shuffle ? gj_loader_permute(n, gj_loader_key(seed, epoch), pos) : pos);
}

/* The windows of every shard and corpus (shard_first, corpus_first, n_windows). */
static int count_windows(gj_loader *l) {
  if (!(l->shard_first = malloc(((size_t)l->n_shards + 1) * sizeof *l->shard_first)))
    return GJ_FAIL("out of memory for %d shards", l->n_shards);
  uint64_t w = 0;
  for (int i = 0; i < l->n_shards; i++) {
    l->shard_first[i] = w;
    uint64_t n = l->shard[i].n_tokens;
    w += n > (uint64_t)l->T ? (n - 1) / (uint64_t)l->T : 0;
  }
  l->shard_first[l->n_shards] = l->n_windows = w;
  for (int k = 0; k <= l->st.n_corpora; k++) l->corpus_first[k] = l->shard_first[l->first[k]];
  return 0;
}

static int init_common(gj_loader *l, int64_t T, uint64_t seed, int shuffle, int n_corpora) {
  l->T = T, l->shuffle = shuffle, l->shard_first = NULL, l->n_windows = 0, l->share_lo = l->share_n = 0;
  memset(&l->st, 0, sizeof l->st);
  l->st.seed = seed, l->st.n_corpora = n_corpora;
  if (T < 1) return GJ_FAIL("sequence length %lld: below 1", (long long)T);
  return count_windows(l);
}

int gj_loader_init(gj_loader *l, const gj_dataset *ds, int64_t T, uint64_t seed, int shuffle) {
  l->shard = ds, l->n_shards = 1, l->first[0] = 0, l->first[1] = 1;
  GJ_TRY(init_common(l, T, seed, shuffle, 1));
  if (l->n_windows == 0)
    return GJ_FAIL("%s: %llu tokens, fewer than one window of seq_len + 1 = %lld", ds->path,
                   (unsigned long long)ds->n_tokens, (long long)T + 1);
  return 0;
}

int gj_loader_init_data(gj_loader *l, const gj_data *d, int64_t T, uint64_t seed, const char *spec) {
  l->shard = d->shard, l->n_shards = d->n_shards;
  memcpy(l->first, d->first, ((size_t)d->n_corpora + 1) * sizeof *l->first);
  GJ_TRY(init_common(l, T, seed, 1, d->n_corpora));
  gj_loader_state *st = &l->st;
  size_t n = strlen(spec);
  if (n < sizeof st->data) memcpy(st->data, spec, n + 1);
  else snprintf(st->data, sizeof st->data, "%.*s...", (int)sizeof st->data - 4, spec);
  for (int k = 0; k < d->n_corpora; k++) {
    st->weight[k] = d->weight[k];
    st->windows[k] = l->corpus_first[k + 1] - l->corpus_first[k];
    if (st->windows[k] == 0)
      return GJ_FAIL("--data: corpus %s has %llu tokens, fewer than one window of seq_len + 1 = %lld in "
                     "each shard", d->name[k], (unsigned long long)gj_data_corpus_tokens(d, k), (long long)T + 1);
  }
  if (d->n_corpora == 1) st->weight[0] = 0; /* one corpus: no blend state but its window count */
  return 0;
}

void gj_loader_free(gj_loader *l) {
  free(l->shard_first);
  l->shard_first = NULL;
}

/* A blend's saved state against this run's blend. */
static int restore_blend(gj_loader *l, const gj_loader_state *st) {
  const char *name = l->shard[0].path;
  int n = l->st.n_corpora;
  if (st->n_corpora != n)
    return GJ_FAIL("%s: the checkpoint's data order is of %d corpora, this run's --data has %d (resume "
                   "with the same --data)", name, st->n_corpora > 1 ? st->n_corpora : 1, n > 1 ? n : 1);
  uint64_t total = 0;
  int over = 0;
  for (int k = 0; k < n; k++) {
    if (st->weight[k] != l->st.weight[k])
      return GJ_FAIL("--data: corpus %d has share %.17g in the checkpoint, %.17g in this run (resume "
                     "with the same weights)", k, st->weight[k], l->st.weight[k]);
    if (st->windows[k] != l->st.windows[k])
      return GJ_FAIL("--data: corpus %d has %llu windows in the checkpoint, %llu in this run (another "
                     "dataset or sequence length?)", k, (unsigned long long)st->windows[k],
                     (unsigned long long)l->st.windows[k]);
    if (st->drawn[k] > st->cursor - total) over = 1; /* past the cursor (a sum that could wrap) */
    else total += st->drawn[k];
  }
  if (over || total != st->cursor || st->epoch != 0)
    return GJ_FAIL("%s: the checkpoint's blend state is inconsistent (%s)", name,
                   st->epoch ? "epoch is not 0, as a blend's always is"
                   : over    ? "its corpora's windows drawn add up to more than the cursor"
                             : "its corpora's windows drawn do not add up to the cursor");
  memcpy(l->st.drawn, st->drawn, sizeof st->drawn);
  l->st.cursor = st->cursor;
  return 0;
}

int gj_loader_restore(gj_loader *l, const gj_loader_state *st) {
  int fresh = st->n_corpora <= 1 && st->epoch == 0 && st->cursor == 0; /* nothing drawn yet */
  if (blended(l) || st->n_corpora > 1) {
    if (fresh) { /* a checkpoint without a data order (gptj convert): the blend from its start */
      l->st.seed = st->seed, l->st.cursor = 0;
      memset(l->st.drawn, 0, sizeof l->st.drawn);
      return 0;
    }
    l->st.seed = st->seed;
    return restore_blend(l, st);
  }
  /* the epoch's order is a permutation of the windows: over another count, the saved position
   * would repeat some windows of the epoch and skip others (a checkpoint of before the count was
   * recorded, windows 0, is checked by its position alone) */
  if ((st->windows[0] && st->windows[0] != l->n_windows) || st->cursor > l->n_windows)
    return GJ_FAIL("%s: the checkpoint's data order is over %llu windows, this run's data has %llu "
                   "(another dataset or --seq-len?): resume with the checkpoint's --data and --seq-len, "
                   "or train on this data from its weights alone (gptj convert --to-hf, then --from-hf)",
                   l->shard[0].path, (unsigned long long)(st->windows[0] ? st->windows[0] : st->cursor),
                   (unsigned long long)l->n_windows);
  l->st.seed = st->seed, l->st.epoch = st->epoch, l->st.cursor = st->cursor;
  return 0;
}

/* The corpus a blend draws next: the furthest behind its share. */
static int next_corpus(const gj_loader_state *st, const uint64_t *drawn, uint64_t i) {
  int best = 0;
  double gap = -HUGE_VAL;
  for (int k = 0; k < st->n_corpora; k++) {
    double e = st->weight[k] * (double)(i + 1) - (double)drawn[k];
    if (e > gap) gap = e, best = k;
  }
  return best;
}

/* G windows of a blend from the counts drawn[] (advanced), total drawn i. */
static void draw_blend(const gj_loader *l, uint64_t *drawn, uint64_t i, int64_t G, uint64_t *win) {
  for (int64_t j = 0; j < G; j++, i++) {
    int k = next_corpus(&l->st, drawn, i);
    uint64_t n = l->st.windows[k];
    win[j] = window_at(l, k, drawn[k] / n, drawn[k] % n);
    drawn[k]++;
  }
}

/* The shard of window w: shard_first[s] <= w < shard_first[s + 1]. */
static int shard_of(const gj_loader *l, uint64_t w) {
  int s = 0, hi = l->n_shards;
  while (hi - s > 1) {
    int mid = (s + hi) / 2;
    if (l->shard_first[mid] <= w) s = mid;
    else hi = mid;
  }
  return s;
}

static void advise(const gj_loader *l, uint64_t w) {
  int s = shard_of(l, w);
  gj_dataset_advise(&l->shard[s], (w - l->shard_first[s]) * (uint64_t)l->T, (uint64_t)l->T + 1);
}

void gj_loader_set_share(gj_loader *l, int64_t lo, int64_t n) { l->share_lo = lo, l->share_n = n; }

/* Whether window i of a global batch of G is this rank's to prefetch. */
static int mine(const gj_loader *l, int64_t i) {
  return l->share_n <= 0 || (i >= l->share_lo && i < l->share_lo + l->share_n);
}

int gj_loader_next(gj_loader *l, int64_t G, uint64_t *win) {
  if (G < 1 || (!blended(l) && (uint64_t)G > l->n_windows))
    return GJ_FAIL("%s: a global batch of %lld windows exceeds the dataset's %llu windows of %lld "
                   "tokens", l->shard[0].path, (long long)G, (unsigned long long)l->n_windows,
                   (long long)l->T + 1);
  if (blended(l)) {
    draw_blend(l, l->st.drawn, l->st.cursor, G, win);
    l->st.cursor += (uint64_t)G;
    /* the next global batch, for the page cache to fetch while this one runs */
    uint64_t drawn[GJ_MAX_CORPORA];
    memcpy(drawn, l->st.drawn, sizeof drawn);
    for (int64_t i = 0; i < G; i++) {
      uint64_t w;
      draw_blend(l, drawn, l->st.cursor + (uint64_t)i, 1, &w);
      if (mine(l, i)) advise(l, w);
    }
    return 0;
  }
  if (l->st.cursor + G > l->n_windows) l->st.epoch++, l->st.cursor = 0;
  for (int64_t i = 0; i < G; i++) win[i] = window_at(l, 0, l->st.epoch, l->st.cursor + i);
  l->st.cursor += G;
  /* the next global batch (the same rule), for the page cache to fetch while this one runs */
  uint64_t e = l->st.epoch, c = l->st.cursor;
  if (c + G > l->n_windows) e++, c = 0;
  for (int64_t i = 0; i < G; i++)
    if (mine(l, i)) advise(l, window_at(l, 0, e, c + i));
  return 0;
}

int gj_loader_corpus_of(const gj_loader *l, uint64_t w) {
  int k = 0;
  while (k + 1 < (l->st.n_corpora > 1 ? l->st.n_corpora : 1) && l->corpus_first[k + 1] <= w) k++;
  return k;
}

int gj_loader_window(const gj_loader *l, uint64_t w, int32_t *ids, int32_t *targets) {
  if (w >= l->n_windows) return GJ_FAIL("internal: window %llu of %llu", (unsigned long long)w, (unsigned long long)l->n_windows);
  int s = shard_of(l, w);
  uint64_t at = (w - l->shard_first[s]) * (uint64_t)l->T;
  GJ_TRY(gj_dataset_get(&l->shard[s], at, (uint64_t)l->T, ids));
  return gj_dataset_get(&l->shard[s], at + 1, (uint64_t)l->T, targets);
}
