/* `key = value` configuration files: one pair per line, `#` starts a comment, blank lines
 * ignored. Errors name the file and line. Every rank reads the file itself, so under mpirun
 * with more than one rank it must be a regular file (io/outfile.h); one rank also reads a FIFO. */
#ifndef GJ_IO_KVCONF_H
#define GJ_IO_KVCONF_H

/* fn returns 0 if the pair was taken, 1 for an unknown key, -1 for a bad value (message
 * set; it is prefixed with FILE:LINE). */
typedef int (*gj_kv_fn)(void *ctx, const char *key, const char *value);
int gj_kvconf_read(const char *path, gj_kv_fn fn, void *ctx);

#endif
