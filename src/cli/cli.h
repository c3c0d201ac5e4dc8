/* Subcommands of the gptj executable. */
#ifndef GJ_CLI_CLI_H
#define GJ_CLI_CLI_H

typedef struct {
  const char *name;
  const char *summary;
  int mpi;                          /* runs under MPI (main initialises it) */
  int result_on_stdout;             /* what it prints is its result: a write error fails it */
  int (*run)(int argc, char **argv); /* argv[0] is the command name; 0, or -1 with gj_errmsg */
} gj_command;

extern const gj_command gj_commands[]; /* NULL-terminated */

#endif
