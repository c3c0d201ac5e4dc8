#include "cli/cli.h"

#include <stddef.h>

const gj_command gj_commands[] = {
    {NULL, NULL, 0, NULL},
};
