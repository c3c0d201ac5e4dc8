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

/* Cut s at a comment: '#' at the line's start or after white space (a path's '#', as in a/h#x,
 * is text). */
static void cut_comment(char *s, const char *line) {
  for (char *h = s; (h = strchr(h, '#')); h++)
    if (h == line || isspace((unsigned char)h[-1])) {
      *h = 0;
      return;
    }
}

/* A quoted value in place: v starts with '"'; the text up to the closing quote, unescaped, then
 * only white space or a comment. -1 if malformed. */
static int unquote(char *v) {
  char *r = v + 1, *w = v;
  for (; *r && *r != '"'; r++) {
    if (*r == '\\') {
      r++;
      if (*r == 'n') *w++ = '\n';
      else if (*r == '\\' || *r == '"') *w++ = *r;
      else return -1;
    } else {
      *w++ = *r;
    }
  }
  if (*r != '"') return -1;
  *w = 0;
  for (r++; isspace((unsigned char)*r); r++) {}
  return *r && *r != '#' ? -1 : 0;
}

void gj_kvconf_write(FILE *f, const char *key, const char *value) {
  size_t n = strlen(value);
  int plain = n > 0 && !isspace((unsigned char)value[0]) && !isspace((unsigned char)value[n - 1]) &&
              value[0] != '"' && !strpbrk(value, "#\n\r");
  if (plain) {
    fprintf(f, "%s = %s\n", key, value);
    return;
  }
  fprintf(f, "%s = \"", key);
  for (const char *c = value; *c; c++) {
    if (*c == '\n') fputs("\\n", f);
    else if (*c == '\\' || *c == '"') fputc('\\', f), fputc(*c, f);
    else fputc(*c, f);
  }
  fputs("\"\n", f);
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
    if (len > 3 * GJ_PATH_BUF) { rc = GJ_FAIL("%s: line too long", where); break; }
    /* a comment before the '=' (or without one) ends the line; after it, the value decides */
    char *eq = strchr(line, '=');
    if (eq) *eq = 0;
    char *hash = line + strlen(line);
    cut_comment(line, line);
    if (eq && line + strlen(line) < hash) eq = NULL; /* the '=' was in the comment */
    char *s = trim(line);
    if (!*s && !eq) continue;
    if (!eq) { rc = GJ_FAIL("%s: expected 'key = value'", where); break; }
    char *k = s, *v = eq + 1;
    while (isspace((unsigned char)*v)) v++;
    if (*v == '"') { /* a quoted value: the text between the quotes, \\, \" and \n escaped */
      if (unquote(v)) { rc = GJ_FAIL("%s: a quoted value must end with '\"' and nothing after it but a comment", where); break; }
    } else {
      cut_comment(v, line);
      v = trim(v);
    }
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
