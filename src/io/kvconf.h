/* `key = value` configuration files: one pair per line, `#` starts a comment, blank lines
 * ignored. Errors name the file and line. */
#ifndef GJ_IO_KVCONF_H
#define GJ_IO_KVCONF_H

/* fn returns 0 if the pair was taken, 1 for an unknown key, -1 for a bad value (message
 * set; it is prefixed with FILE:LINE). */
typedef int (*gj_kv_fn)(void *ctx, const char *key, const char *value);
int gj_kvconf_read(const char *path, gj_kv_fn fn, void *ctx);

#endif
