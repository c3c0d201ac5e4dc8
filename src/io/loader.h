/* Training batches from a token dataset: windows of T+1 tokens (window w starts at token w*T),
 * visited in a seeded order per epoch. Every rank holds the same small state (seed, epoch,
 * cursor) and draws the same global batch; each DP rank then takes its own disjoint part.
 * A loader restored from a saved state continues with exactly the same batches.
 *
 * The order costs no memory: position i of epoch e is gj_loader_permute(n_windows, key(seed,
 * e), i), a keyed bijection on [0, n_windows) (a Feistel network with cycle walking), a
 * function of (seed, epoch, position) alone, whatever the number of ranks. Windows are read
 * from the dataset when asked for (gj_loader_window); gj_loader_next hints the dataset to
 * prefetch the next global batch's windows. */
#ifndef GJ_IO_LOADER_H
#define GJ_IO_LOADER_H

#include <stdint.h>

#include "io/dataset.h"

typedef struct {
  uint64_t seed, epoch, cursor; /* cursor: windows of this epoch's order already used */
} gj_loader_state;

typedef struct {
  const gj_dataset *ds;
  int64_t T;
  uint64_t n_windows;
  int shuffle;
  gj_loader_state st;
} gj_loader;

/* shuffle = 0: windows in file order (evaluation). Fails if the dataset has fewer than T+1
 * tokens. Allocates nothing. */
int gj_loader_init(gj_loader *l, const gj_dataset *ds, int64_t T, uint64_t seed, int shuffle);
void gj_loader_free(gj_loader *l);
/* Restore a saved state (checks it against this dataset). */
int gj_loader_restore(gj_loader *l, gj_loader_state st);
/* The next global batch of G windows (window indices into win[G]); moves to the next epoch
 * when fewer than G windows remain in this one. */
int gj_loader_next(gj_loader *l, int64_t G, uint64_t *win);
/* ids [T] = tokens of window w, targets [T] = the next tokens, read from the dataset (an id
 * outside the vocabulary or a read error fails, naming the file and the token). */
int gj_loader_window(const gj_loader *l, uint64_t w, int32_t *ids, int32_t *targets);
/* The keyed bijection on [0, n): the image of i < n under key. */
uint64_t gj_loader_permute(uint64_t n, uint64_t key, uint64_t i);
/* The key of epoch `epoch` of a loader seeded with `seed`. */
uint64_t gj_loader_key(uint64_t seed, uint64_t epoch);

#endif
