#include "cli/args.h"

#include <stdio.h>
#include <string.h>

#include "common.h"

static void print_help(const gj_cmdline *cl) {
  printf("usage: %s\n\n%s\n\noptions:\n", cl->usage, cl->summary);
  for (const gj_opt *o = cl->opts; o->name; o++) {
    char def[64] = "";
    switch (o->type) {
    case GJ_OPT_I64: snprintf(def, sizeof def, " (default %lld)", (long long)*(int64_t *)o->dst); break;
    case GJ_OPT_F64: snprintf(def, sizeof def, " (default %g)", *(double *)o->dst); break;
    case GJ_OPT_STR:
      if (*(const char **)o->dst) snprintf(def, sizeof def, " (default %.40s)", *(const char **)o->dst);
      break;
    case GJ_OPT_FLAG: break;
    }
    const char *arg = o->type == GJ_OPT_FLAG ? "" : o->type == GJ_OPT_STR ? " S" : " N";
    char left[64];
    snprintf(left, sizeof left, "--%s%s", o->name, arg);
    printf("  %-24s %s%s\n", left, o->help, def);
  }
  printf("  %-24s %s\n", "--help", "this text");
  if (cl->extra_help) printf("\n%s\n", cl->extra_help);
}

static int set_opt(const gj_opt *o, const char *v) {
  switch (o->type) {
  case GJ_OPT_I64: {
    int64_t x;
    if (gj_parse_i64(v, &x)) return GJ_FAIL("--%s: expected an integer, got '%s'", o->name, v);
    if (o->min <= o->max && (x < o->min || x > o->max))
      return GJ_FAIL("--%s: %lld is out of range [%lld, %lld]", o->name, (long long)x, (long long)o->min,
                     (long long)o->max);
    *(int64_t *)o->dst = x;
    return 0;
  }
  case GJ_OPT_F64: {
    double x;
    if (gj_parse_f64(v, &x)) return GJ_FAIL("--%s: expected a number, got '%s'", o->name, v);
    if (o->min <= o->max && (x < o->min || x > o->max))
      return GJ_FAIL("--%s: %s is out of range [%g, %g]", o->name, v, o->min, o->max);
    *(double *)o->dst = x;
    return 0;
  }
  case GJ_OPT_STR:
    if (!*v) return GJ_FAIL("--%s: empty value", o->name);
    *(const char **)o->dst = v;
    return 0;
  case GJ_OPT_FLAG: *(int *)o->dst = 1; return 0;
  }
  return 0;
}

int gj_args_parse(const gj_cmdline *cl, int argc, char **argv, char **pos, int *npos) {
  *npos = 0;
  for (int i = 1; i < argc; i++) {
    char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      print_help(cl);
      return 1;
    }
    if (strncmp(a, "--", 2) || !a[2]) {
      if (a[0] == '-' && a[1])
        return GJ_FAIL("unknown option '%s' (see --help)", a);
      if (*npos >= cl->max_positional) return GJ_FAIL("unexpected argument '%s' (see --help)", a);
      pos[(*npos)++] = a;
      continue;
    }
    char name[128];
    const char *val = NULL;
    const char *eq = strchr(a + 2, '=');
    snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a - 2) : (int)strlen(a + 2), a + 2);
    if (eq) val = eq + 1;
    const gj_opt *o = NULL;
    for (const gj_opt *p = cl->opts; p->name; p++)
      if (!strcmp(p->name, name)) o = p;
    if (o) {
      if (o->type == GJ_OPT_FLAG) {
        if (eq) return GJ_FAIL("--%s takes no value", name);
        GJ_TRY(set_opt(o, NULL));
        continue;
      }
      if (!val) {
        if (i + 1 >= argc) return GJ_FAIL("--%s: missing value", name);
        val = argv[++i];
        /* the next option, not a value (--%s=--x gives a value that starts with --) */
        if (!strncmp(val, "--", 2) && val[2])
          return GJ_FAIL("--%s: missing value before '%s' (--%s=VALUE for a value that starts with --)", name, val, name);
      }
      GJ_TRY(set_opt(o, val));
      continue;
    }
    if (cl->extra) {
      const char *v = val ? val : (i + 1 < argc ? argv[i + 1] : NULL);
      int rc = cl->extra(cl->extra_ctx, name, v);
      if (rc < 0) return rc;
      if (rc == 0) {
        if (!val) i++;
        continue;
      }
    }
    return GJ_FAIL("unknown option '--%s' (see --help)", name);
  }
  return 0;
}
