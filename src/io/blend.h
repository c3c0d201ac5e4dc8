/* The training data named by --data: one corpus, or a blend of several corpora with weights,
 * each corpus one or more shard datasets (io/dataset.h: gptj-mpi HDF5 token files or
 * Megatron PREFIX.bin + PREFIX.idx pairs).
 *
 *   spec   := item (',' item)*
 *   item   := [WEIGHT ':'] corpus        WEIGHT: a positive decimal number (default 1); the shares are
 *                                        the weights over their sum
 *   corpus := path ('+' path)*           shards read one after the other
 *   path   := a dataset file, a Megatron prefix, or a directory: its *.h5 files and Megatron
 *             pairs (*.idx beside *.bin), in name order
 *
 * e.g. --data 0.7:web/,0.3:books-00.h5+books-01.h5. A path that exists as it is written is a
 * path, even with a ':' in it. Nothing of the size of a corpus is read at open (each shard
 * is opened as gj_dataset_open does). */
#ifndef GJ_IO_BLEND_H
#define GJ_IO_BLEND_H

#include <stdint.h>

#include "io/dataset.h"

#define GJ_MAX_CORPORA 64
#define GJ_CORPUS_NAME 256 /* bytes of a corpus's name kept (its spec, shortened if longer) */

typedef struct {
  int n_corpora;
  double weight[GJ_MAX_CORPORA];            /* shares, summing to 1 */
  int first[GJ_MAX_CORPORA + 1];            /* corpus k: shards [first[k], first[k + 1]) */
  char name[GJ_MAX_CORPORA][GJ_CORPUS_NAME]; /* the corpus as written in the spec */
  gj_dataset *shard;                        /* [n_shards] */
  int n_shards;
  uint64_t n_tokens; /* of all shards */
} gj_data;

/* Parse spec and open every shard (ids checked against max_vocab as gj_dataset_open). flag
 * names the option in messages ("--data"). */
int gj_data_open(gj_data *d, const char *spec, const char *flag, int64_t max_vocab);
/* Close every shard; harmless on a zeroed or freed one. */
void gj_data_free(gj_data *d);
/* Tokens of corpus k (all its shards). */
uint64_t gj_data_corpus_tokens(const gj_data *d, int k);
/* Print the corpora (weight, shards, documents, tokens), one line each (gptj info). */
void gj_data_print(const gj_data *d);

#endif
