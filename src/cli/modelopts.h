/* Options shared by the commands that build a model: --preset NAME, --config FILE (a
 * `key = value` file of model keys and the command's own options), and model keys as flags
 * (--n_embd 128 or --n-embd 128). Precedence: the last --preset < each --config file in the
 * command line's order < the other flags of the command line. */
#ifndef GJ_CLI_MODELOPTS_H
#define GJ_CLI_MODELOPTS_H

#include "cli/args.h"
#include "model/config.h"

typedef struct {
  gj_config config;
  const char *preset, *config_file;
  int model_set; /* a preset, config file or model key was given */
  gj_opt *table;
} gj_modelopts;

/* Returns 0, 1 after --help, or -1. Validates the config. */
int gj_modelopts_parse(gj_modelopts *mo, int argc, char **argv, gj_opt *table,
                       const char *usage, const char *summary);

#endif
