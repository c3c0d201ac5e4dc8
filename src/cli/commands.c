#include "cli/cli.h"

#include <stddef.h>

int gj_cmd_encode(int argc, char **argv);
int gj_cmd_decode(int argc, char **argv);

const gj_command gj_commands[] = {
    {"encode", "text on stdin -> GPT-2 token ids", 0, gj_cmd_encode},
    {"decode", "GPT-2 token ids on stdin -> text", 0, gj_cmd_decode},
    {NULL, NULL, 0, NULL},
};
