/* Training batches from a token dataset: windows of T+1 tokens (window w starts at token w*T),
 * visited in a seeded order per epoch. Every rank holds the same small state (seed, epoch,
 * cursor) and draws the same global batch; each DP rank then takes its own disjoint part.
 * A loader restored from a saved state continues with exactly the same batches.
 *
 * The data may be several shards (their windows one after the other; no window crosses a
 * shard's end) and several corpora with weights (io/blend.h). A blend draws window after
 * window from the corpus furthest behind its share (the largest weight * (i + 1) - drawn for
 * the i-th window drawn, the lowest index on a tie; as Megatron-LM's blending indices), each
 * corpus in its own shuffled order, and a corpus used up starts its next epoch alone. Its
 * state is the count drawn from each corpus, so it too is exact on resume, whatever the
 * layout.
 *
 * The order costs no memory: position i of epoch e is gj_loader_permute(n_windows, key(seed,
 * e), i), a keyed bijection on [0, n_windows) (a Feistel network with cycle walking), a
 * function of (seed, epoch, position) alone, whatever the number of ranks. Windows are read
 * from the dataset when asked for (gj_loader_window); gj_loader_next hints the dataset to
 * prefetch the next global batch's windows. */
#ifndef GJ_IO_LOADER_H
#define GJ_IO_LOADER_H

#include <stdint.h>

#include "io/blend.h"
#include "io/dataset.h"

#define GJ_LOADER_DATA 1024 /* bytes of the --data text kept in the state (for gptj info) */

typedef struct {
  uint64_t seed, epoch, cursor; /* one corpus: windows of this epoch's order already used; a
                                   blend: epoch 0, cursor the windows drawn in all */
  int n_corpora;                /* 0 or 1: one corpus; 2..GJ_MAX_CORPORA: a blend of */
  double weight[GJ_MAX_CORPORA];    /* shares */
  uint64_t windows[GJ_MAX_CORPORA]; /* windows of each corpus */
  uint64_t drawn[GJ_MAX_CORPORA];   /* windows drawn from each corpus (epochs included) */
  char data[GJ_LOADER_DATA];        /* the --data text (shortened with "..." if longer) */
} gj_loader_state;

typedef struct {
  const gj_dataset *shard; /* [n_shards]: corpus k is shards first[k] .. first[k+1]-1 */
  int n_shards;
  uint64_t *shard_first;   /* [n_shards + 1]: the first window of each shard */
  int first[GJ_MAX_CORPORA + 1];
  uint64_t corpus_first[GJ_MAX_CORPORA + 1]; /* the first window of each corpus */
  int64_t T;
  uint64_t n_windows;
  int shuffle;
  int64_t share_lo, share_n; /* the part of each global batch this rank reads (0, 0: all) */
  gj_loader_state st;
} gj_loader;

/* One dataset. shuffle = 0: windows in file order (evaluation). Fails if the dataset has fewer
 * than T+1 tokens. */
int gj_loader_init(gj_loader *l, const gj_dataset *ds, int64_t T, uint64_t seed, int shuffle);
/* The data of --data (shuffled; a blend if it has several corpora): fails if a corpus has no
 * window of T+1 tokens. spec: the --data text, recorded in the state. */
int gj_loader_init_data(gj_loader *l, const gj_data *d, int64_t T, uint64_t seed, const char *spec);
void gj_loader_free(gj_loader *l);
/* Restore a saved state (checks it against this data: the same blend, weights and windows). */
int gj_loader_restore(gj_loader *l, const gj_loader_state *st);
/* This rank reads windows [lo, lo + n) of each global batch: gj_loader_next prefetches only
 * those of the next batch (the page cache of a node is shared; its other ranks fetch theirs). */
void gj_loader_set_share(gj_loader *l, int64_t lo, int64_t n);
/* The next global batch of G windows (window indices into win[G]); one corpus moves to its
 * next epoch when fewer than G windows remain in this one. */
int gj_loader_next(gj_loader *l, int64_t G, uint64_t *win);
/* ids [T] = tokens of window w, targets [T] = the next tokens, read from its shard (an id
 * outside the vocabulary or a read error fails, naming the file and the token). */
int gj_loader_window(const gj_loader *l, uint64_t w, int32_t *ids, int32_t *targets);
/* The keyed bijection on [0, n): the image of i < n under key. */
uint64_t gj_loader_permute(uint64_t n, uint64_t key, uint64_t i);
/* The corpus of window w. */
int gj_loader_corpus_of(const gj_loader *l, uint64_t w);
/* The key of epoch `epoch` of a loader seeded with `seed` (corpus k of a blend: seed
 * gj_loader_corpus_seed(seed, k)). */
uint64_t gj_loader_key(uint64_t seed, uint64_t epoch);
uint64_t gj_loader_corpus_seed(uint64_t seed, int k);

#endif
