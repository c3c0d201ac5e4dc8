/* `key = value` configuration files: one pair per line, `#` at a line's start or after white
 * space starts a comment, blank lines ignored; a value in double quotes is the text between them
 * (\\, \" and \n escaped), so that any string can be written (gj_kvconf_write). Errors name the file and line. Every rank reads the file itself, so under mpirun
 * with more than one rank it must be a regular file (io/outfile.h); one rank also reads a FIFO. */
#ifndef GJ_IO_KVCONF_H
#define GJ_IO_KVCONF_H

#include <stdio.h>

/* fn returns 0 if the pair was taken, 1 for an unknown key, -1 for a bad value (message
 * set; it is prefixed with FILE:LINE). */
typedef int (*gj_kv_fn)(void *ctx, const char *key, const char *value);
int gj_kvconf_read(const char *path, gj_kv_fn fn, void *ctx);
/* One `key = value` line that gj_kvconf_read gives back as value: as it is, or quoted where it
 * has white space at an end, a '#', a newline or a leading quote. */
void gj_kvconf_write(FILE *f, const char *key, const char *value);

#endif
