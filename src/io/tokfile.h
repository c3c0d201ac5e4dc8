/* The token dataset (DESIGN.md §6) written in parallel: rank 0 creates the file with the
 * HDF5 library alone (its metadata, and /tokens and /doc_offsets allocated contiguous, not
 * filled), every rank then writes its ranges of the two arrays straight at their file
 * offsets. The same sizes and attributes give the same file bytes, whatever wrote the data.
 * /tokens is U16LE, contiguous, no filters; /doc_offsets U64LE, n_docs + 1 boundaries; the
 * attributes are those of gj_dataset_write. */
#ifndef GJ_IO_TOKFILE_H
#define GJ_IO_TOKFILE_H

#include <stdint.h>

/* Create path (truncating it) for n_tokens tokens and n_docs documents; *tok_at and *off_at
 * are the file offsets of /tokens[0] and /doc_offsets[0]. One process. */
int gj_tokfile_create(const char *path, uint64_t n_tokens, uint64_t n_docs, uint64_t n_bytes,
                      const char *source, int64_t vocab_size, uint64_t *tok_at, uint64_t *off_at);

/* Write n bytes at offset off of fd (all of them; path names the file in the message). */
int gj_tokfile_pwrite(int fd, const char *path, const void *buf, uint64_t n, uint64_t off);

#endif
