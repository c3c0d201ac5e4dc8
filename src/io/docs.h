/* Reading documents from text files: plain text with documents separated by blank lines, or
 * JSONL with a "text" field per line (the Pile's format); either may be gzip-compressed. */
#ifndef GJ_IO_DOCS_H
#define GJ_IO_DOCS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *pool;
  size_t n, cap;
  uint64_t *off; /* document i is pool[off[i] .. off[i+1]) */
  size_t ndocs, offcap;
} gj_docs;

/* Append the documents of path ("-": stdin, one rank only). JSONL when the name ends in
 * .jsonl or .json (before an optional .gz); errors name the file and line. Under mpirun with
 * more than one rank every rank reads path itself, so it must be a regular file. */
int gj_docs_read(gj_docs *d, const char *path);
void gj_docs_free(gj_docs *d);

#endif
