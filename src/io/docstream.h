/* Streaming documents out of text files, in bounded memory: plain text (documents separated
 * by blank lines; a document's lines joined with "\n") or JSONL (one object a line, the text
 * under a key), each plain, gzip (zlib) or zstd. The compression is told by the name (.gz,
 * .zst: the file must then be one) or else by the magic bytes; JSONL by the name (.jsonl or
 * .json before an optional .gz/.zst).
 *
 * An uncompressed file can be read in byte ranges: the part [lo, hi) holds the documents
 * whose first line starts in [lo, hi) (text: the cuts are moved forward to the next blank
 * line, so a document is never split). The parts of any partition of [0, size) give, one
 * after the other, exactly the documents of the whole file. */
#ifndef GJ_IO_DOCSTREAM_H
#define GJ_IO_DOCSTREAM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *text_key; /* JSONL: the field holding the text ("text") */
  size_t max_doc;       /* longest document (and JSONL line) accepted, in bytes */
} gj_docstream_opts;

/* Called for each document (n > 0 bytes); nonzero stops the reading and is returned. */
typedef int (*gj_doc_fn)(void *ctx, const char *text, size_t n);

/* Compression of path: 0 plain, 1 gzip, 2 zstd (-1 with the message on a read error, or a
 * .gz/.zst name whose content is not one). Reads its first bytes (stdin "-", a FIFO or a
 * device: 0, not read; gj_docstream_read tells from the stream). */
int gj_docstream_kind(const char *path, int *kind);
/* 1 if path names JSONL. */
int gj_docstream_is_jsonl(const char *path);

/* Read the documents of path ("-": stdin) in [lo, hi) (hi = UINT64_MAX: to the end; lo > 0
 * or a finite hi only for an uncompressed regular file), calling fn for each. *raw counts
 * the bytes read from the file as they come (for progress; may be NULL). Errors name the
 * file (and the line, for text that is not what it should be). */
int gj_docstream_read(const char *path, uint64_t lo, uint64_t hi, const gj_docstream_opts *o,
                      gj_doc_fn fn, void *ctx, volatile uint64_t *raw);

#endif
