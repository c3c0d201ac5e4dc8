#include "io/kvconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "io/outfile.h"

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

int gj_kvconf_read(const char *path, gj_kv_fn fn, void *ctx) {
  /* every rank reads the file itself: under mpirun it must be a regular file */
  GJ_TRY(gj_outfile_check_input(path, NULL, 0));
  FILE *f = fopen(path, "r");
  if (!f) return GJ_FAIL("%s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int lineno = 0, rc = 0;
  char where[GJ_PATH_BUF + 16];
  struct { char key[128]; int line; } seen[256];
  int nseen = 0;
  while (!rc && (len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    snprintf(where, sizeof where, "%s:%d", path, lineno);
    if ((size_t)len != strlen(line)) { rc = GJ_FAIL("%s: NUL byte in the line", where); break; }
    if (len > 4096) { rc = GJ_FAIL("%s: line too long", where); break; }
    /* a comment: '#' at the line's start or after white space (a path's '#', as in a/h#x, is text) */
    for (char *h = line; (h = strchr(h, '#')); h++)
      if (h == line || isspace((unsigned char)h[-1])) {
        *h = 0;
        break;
      }
    char *s = trim(line);
    if (!*s) continue;
    char *eq = strchr(s, '=');
    if (!eq) { rc = GJ_FAIL("%s: expected 'key = value'", where); break; }
    *eq = 0;
    char *k = trim(s), *v = trim(eq + 1);
    if (!*k) { rc = GJ_FAIL("%s: missing key before '='", where); break; }
    if (!*v) { rc = GJ_FAIL("%s: missing value for '%s'", where, k); break; }
    /* a key given twice (n_embd or n-embd) is a mistake in one of the lines: say which */
    char norm[128];
    snprintf(norm, sizeof norm, "%s", k);
    for (char *c = norm; *c; c++)
      if (*c == '-') *c = '_';
    int dup = 0;
    for (int i = 0; i < nseen && !dup; i++)
      if (!strcmp(seen[i].key, norm)) dup = seen[i].line;
    if (dup) { rc = GJ_FAIL("%s: '%s' is given again (first on line %d)", where, k, dup); break; }
    if (nseen < (int)(sizeof seen / sizeof seen[0])) /* known keys only get this far: few */
      snprintf(seen[nseen].key, sizeof seen[nseen].key, "%s", norm), seen[nseen++].line = lineno;
    int r = fn(ctx, k, v);
    if (r > 0) rc = GJ_FAIL("%s: unknown key '%s'", where, k);
    else if (r < 0) rc = gj_err_prefix(where);
  }
  free(line);
  fclose(f);
  return rc;
}
