/* Token datasets (DESIGN.md §6): one HDF5 file with /tokens (uint16, chunked, deflate),
 * /doc_offsets (uint64, n_docs + 1 boundaries) and attributes tokenizer, vocab_size, eot_id,
 * source, n_docs, n_tokens, n_bytes (UTF-8 bytes of the source documents). Each document is
 * followed by the EOT token 50256. */
#ifndef GJ_IO_DATASET_H
#define GJ_IO_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "io/outfile.h"

typedef struct {
  uint16_t *tokens;
  uint64_t n_tokens;
  uint64_t *doc_offsets; /* n_docs + 1 */
  uint64_t n_docs, n_bytes;
  int64_t vocab_size;
  char path[GJ_PATH_BUF];
} gj_dataset;

/* Write a dataset file atomically (io/outfile.h: temporary name, sync, rename, directory sync;
 * the temporary is removed on failure or a stop signal). */
int gj_dataset_write(const char *path, const uint16_t *tokens, uint64_t n_tokens,
                     const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                     const char *source);
/* Read a whole dataset into memory; checks its ids against max_vocab (the model's vocab_size;
 * 0: check against the file's own vocab_size only). */
int gj_dataset_read(gj_dataset *d, const char *path, int64_t max_vocab);
void gj_dataset_free(gj_dataset *d);
/* The same into the temporary of o (gj_outfile_begin done), for a caller that renames several
 * outputs together: it commits or aborts o itself. */
int gj_dataset_write_tmp(gj_outfile *o, const uint16_t *tokens, uint64_t n_tokens,
                         const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                         const char *source);

#endif
