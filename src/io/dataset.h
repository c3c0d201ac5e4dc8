/* Token datasets (DESIGN.md §6): one HDF5 file with /tokens (uint16 or uint32 ids),
 * /doc_offsets (uint64, n_docs + 1 boundaries) and attributes tokenizer, vocab_size, eot_id,
 * source, n_docs, n_tokens, n_bytes (UTF-8 bytes of the source documents). Each document is
 * followed by the EOT token 50256.
 *
 * A dataset is opened, not loaded: gj_dataset_open checks the file (format, attributes, shapes
 * and types, that /tokens is fully written, and the /doc_offsets invariants, streamed in
 * slices and not kept) and then reads any range of tokens on demand, whatever the corpus size:
 *  - /tokens contiguous (and little-endian): the file is memory-mapped at the dataset's file
 *    offset (H5Dget_offset), read-only and shared, so the ranks of a node share the page cache;
 *    the pages of each range read are unmapped again at once (they stay in the page cache),
 *    so that they do not add up in the rank's resident set;
 *  - /tokens chunked (the files gptj tokenize writes today: 1 Mi ids per chunk, deflate):
 *    read by hyperslab through HDF5's chunk cache (GJ_DATASET_CHUNK_CACHE bytes per dataset).
 * Both layouts load; the ids read are checked against the vocabulary as they are read.
 *
 * gj_dataset_open also reads Megatron-LM / GPT-NeoX indexed datasets (io/megatron.h): a path
 * ending in .bin or .idx, or a prefix PATH for which PATH.idx exists (and no file PATH), is
 * read as PREFIX.bin + PREFIX.idx, the .bin memory-mapped. */
#ifndef GJ_IO_DATASET_H
#define GJ_IO_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "io/outfile.h"

#define GJ_DATASET_CHUNK_CACHE ((size_t)8 << 20) /* 4 of gptj tokenize's 2 MB chunks */

typedef struct {
  uint64_t n_tokens, n_docs, n_bytes;
  int64_t vocab_size; /* the file's attribute */
  int64_t max_id;     /* ids read must be below it: the model's vocab_size, or the file's */
  int width;          /* bytes per stored id: 2 (uint16) or 4 (uint32); Megatron: 1, 2, 4 or 8 */
  int is_signed;      /* Megatron int16/int32/int64 ids (a negative id fails as read) */
  uint64_t n_seqs;    /* Megatron: sequences in the index (0 for HDF5) */
  char format[32];    /* "gptj-mpi-tokens" or "megatron-mmidx" */
  char dtype[16];     /* Megatron: the index's dtype (uint16, int32, ...) */
  char path[GJ_PATH_BUF]; /* the HDF5 file; Megatron: PREFIX.bin */
  /* where the ids are read from: map (mapped, or in memory for tests) or the HDF5 dataset */
  const unsigned char *map; /* [n_tokens * width], little-endian ids */
  void *map_base;           /* the mapping (page-aligned below map); NULL if not mapped */
  size_t map_len;
  uint64_t map_off; /* the file offset of map_base */
  int64_t file, tokens; /* hid_t of the file and /tokens (hyperslab reads); -1 if unused */
} gj_dataset;

/* The attributes of a token dataset (format, tokenizer, counts, source, the vocabulary's size)
 * on an open HDF5 file (its hid_t); path names it in messages. */
int gj_dataset_write_attrs(int64_t file, const char *path, uint64_t n_docs, uint64_t n_tokens,
                           uint64_t n_bytes, const char *source, int64_t vocab_size);

/* Write a dataset file atomically (io/outfile.h: temporary name, sync, rename, directory sync;
 * the temporary is removed on failure or a stop signal). */
int gj_dataset_write(const char *path, const uint16_t *tokens, uint64_t n_tokens,
                     const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                     const char *source);
/* Open a dataset for reading (see above). max_vocab: the model's vocab_size, which every id
 * read must be below (0: the file's own vocab_size). Nothing of the size of the corpus is
 * allocated. */
int gj_dataset_open(gj_dataset *d, const char *path, int64_t max_vocab);
/* A dataset over n ids held by the caller (tests; not copied, must outlive d). */
void gj_dataset_wrap(gj_dataset *d, const uint16_t *tokens, uint64_t n, int64_t max_id,
                     const char *name);
/* out[n] = the ids of tokens [start, start + n); fails (naming the file and the token's
 * offset) on an id not below max_id, on a range beyond the end or a read error. */
int gj_dataset_get(const gj_dataset *d, uint64_t start, uint64_t n, int32_t *out);
/* A hint that tokens [start, start + n) will be read soon (madvise(MADV_WILLNEED) on a
 * mapping; nothing for hyperslab reads). */
void gj_dataset_advise(const gj_dataset *d, uint64_t start, uint64_t n);
/* Close (unmap) a dataset; harmless on a zeroed or already freed one. */
void gj_dataset_free(gj_dataset *d);
/* The same into the temporary of o (gj_outfile_begin done), for a caller that renames several
 * outputs together: it commits or aborts o itself. */
int gj_dataset_write_tmp(gj_outfile *o, const uint16_t *tokens, uint64_t n_tokens,
                         const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                         const char *source);

#endif
