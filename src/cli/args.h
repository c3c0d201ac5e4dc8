/* Command-line options: `--name value`, `--name=value` and flags, from a table. Errors name
 * the flag. `--help` prints the table. */
#ifndef GJ_CLI_ARGS_H
#define GJ_CLI_ARGS_H

#include <stdint.h>

typedef enum { GJ_OPT_I64, GJ_OPT_F64, GJ_OPT_STR, GJ_OPT_FLAG } gj_opt_type;

typedef struct {
  const char *name; /* without the leading -- */
  gj_opt_type type;
  void *dst;        /* int64_t*, double*, const char**, int* */
  const char *help; /* the default is printed from dst */
  double min, max;  /* range for numbers (min > max: unchecked) */
} gj_opt;

/* Called for an option not in the table with its value (NULL if none follows); returns 0 if
 * taken, 1 if unknown, -1 on a bad value (with the message set). */
typedef int (*gj_opt_extra)(void *ctx, const char *name, const char *value);

typedef struct {
  const char *usage;   /* "gptj train [options]" */
  const char *summary; /* a paragraph */
  const gj_opt *opts;  /* terminated by {NULL} */
  gj_opt_extra extra;
  void *extra_ctx;
  const char *extra_help; /* a paragraph for the extra keys */
  int max_positional;
} gj_cmdline;

/* Parse argv[1..]. Returns 0, 1 if --help was printed (exit 0), or -1 with a message.
 * Positional arguments are returned in pos[] (up to max_positional). */
int gj_args_parse(const gj_cmdline *cl, int argc, char **argv, char **pos, int *npos);

#endif
