#include "cli/modelopts.h"

#include <stdio.h>
#include <string.h>

#include "common.h"
#include "io/kvconf.h"

static void norm_key(char *out, size_t n, const char *k, char from, char to) {
  snprintf(out, n, "%s", k);
  for (char *p = out; *p; p++)
    if (*p == from) *p = to;
}

static int set_model_key(gj_modelopts *mo, const char *name, const char *value) {
  char k[128];
  norm_key(k, sizeof k, name, '-', '_');
  if (!value) {
    gj_config tmp = mo->config;
    if (gj_config_set(&tmp, k, "1") == 1) return 1;
    return GJ_FAIL("--%s: missing value", name);
  }
  int rc = gj_config_set(&mo->config, k, value);
  if (rc == 0) mo->model_set = 1;
  return rc;
}

/* Command-line extras: model keys, and --preset/--config already applied in the first pass. */
static int extra(void *ctx, const char *name, const char *value) {
  gj_modelopts *mo = ctx;
  if (!strcmp(name, "preset") || !strcmp(name, "config")) return value ? 0 : GJ_FAIL("--%s: missing value", name);
  return set_model_key(mo, name, value);
}

static int file_key(void *ctx, const char *key, const char *value) {
  gj_modelopts *mo = ctx;
  if (!strcmp(key, "preset")) {
    GJ_TRY(gj_config_preset(&mo->config, value));
    mo->model_set = 1;
    char *name = strdup(value); /* the line's text does not outlive the file (kept to exit) */
    if (!name) return GJ_FAIL("out of memory");
    mo->preset = name;
    return 0;
  }
  int rc = set_model_key(mo, key, value);
  if (rc <= 0) return rc;
  char k[128];
  norm_key(k, sizeof k, key, '_', '-');
  for (gj_opt *o = mo->table; o->name; o++) {
    if (strcmp(o->name, k)) continue;
    if (o->type == GJ_OPT_FLAG) { /* a flag: 1 or 0 */
      int on = !strcmp(value, "1") || !strcmp(value, "true"), off = !strcmp(value, "0") || !strcmp(value, "false");
      if (!on && !off) return GJ_FAIL("'%s' is a flag: expected 1 or 0, got '%s'", key, value);
      *(int *)o->dst = on;
      return 0;
    }
    /* reuse the command-line parser for the value's type and range */
    char flag[160];
    snprintf(flag, sizeof flag, "--%s", k);
    char *argv[3] = {"config", flag, (char *)value};
    gj_cmdline cl = {"", "", o, NULL, NULL, NULL, 0};
    gj_opt one[2] = {*o, {NULL}};
    cl.opts = one;
    int np;
    if (o->type == GJ_OPT_STR) {
      /* the file's text must outlive it */
      char *copy = strdup(value);
      if (!copy) return GJ_FAIL("out of memory");
      argv[2] = copy;
    }
    return gj_args_parse(&cl, 3, argv, NULL, &np);
  }
  return 1;
}

int gj_modelopts_parse(gj_modelopts *mo, int argc, char **argv, gj_opt *table,
                       const char *usage, const char *summary) {
  memset(mo, 0, sizeof *mo);
  mo->table = table;
  mo->preset = "tiny";
  /* the first pass, in the command line's order: the last --preset, every --config file */
  const char *files[64];
  int nfiles = 0, help = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int cfg = 0;
    if ((!strcmp(argv[i], "--preset") || !strcmp(argv[i], "--config")) && i + 1 < argc)
      cfg = argv[i][2] == 'c', v = argv[++i];
    else if (!strncmp(argv[i], "--preset=", 9) || !strncmp(argv[i], "--config=", 9))
      cfg = argv[i][2] == 'c', v = argv[i] + 9;
    help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    if (v && !cfg) mo->preset = v, mo->model_set = 1;
    if (v && cfg && nfiles == (int)(sizeof files / sizeof files[0])) return GJ_FAIL("--config: more than 64 files");
    if (v && cfg) files[nfiles++] = mo->config_file = v;
  }
  if (!help) {
    if (gj_config_preset(&mo->config, mo->preset)) return gj_err_prefix("--preset");
    for (int k = 0; k < nfiles; k++) GJ_TRY(gj_kvconf_read(files[k], file_key, mo));
  } else {
    gj_config_preset(&mo->config, "tiny");
  }
  char help_text[1024];
  snprintf(help_text, sizeof help_text,
           "model:\n"
           "  --preset NAME            tiny (default), gptj-125m, gptj-350m, gptj-6b\n"
           "  --config FILE            'key = value' lines: model keys and any option above\n"
           "                           (after the preset, files in order; flags override them)\n"
           "  --KEY VALUE              a model key: vocab_size, n_positions, n_embd, n_layer,\n"
           "                           n_head, rotary_dim, n_inner, layer_norm_epsilon");
  gj_cmdline cl = {usage, summary, table, extra, mo, help_text, 0};
  int np;
  int rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) return rc;
  if (gj_config_validate(&mo->config)) return -1;
  return 0;
}
