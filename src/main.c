/* gptj: one executable, subcommands dispatched by name. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"
#include "model/gemm.h"

#include <hdf5.h>

static void usage(FILE *out) {
  fprintf(out,
          "usage: gptj <command> [options]\n"
          "\n"
          "A distributed GPT-J trainer over MPI (data and tensor parallel). Every command runs\n"
          "as a plain process or under mpirun/srun.\n"
          "\n"
          "commands:\n");
  for (const gj_command *c = gj_commands; c->name; c++) fprintf(out, "  %-10s %s\n", c->name, c->summary);
  fprintf(out,
          "\n"
          "  gptj <command> --help   options of one command\n"
          "  gptj --version          version\n");
}

int main(int argc, char **argv) {
  /* first: a stop signal from here on is handled (train stops cleanly at its next stop point;
   * other commands remove their temporary files and end) */
  gj_signals_install(argc > 1 && !strcmp(argv[1], "train"));
  gj_blas_select_kernel(argv);
  /* files are closed by the code that opened them; a checkpoint whose write failed is
   * deliberately left open (see gj_ckpt_save), so no close at exit */
  H5dont_atexit();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("gptj (gptj-mpi) %s\n", PACKAGE_VERSION);
    return 0;
  }
  const gj_command *cmd = NULL;
  for (const gj_command *c = gj_commands; c->name; c++)
    if (!strcmp(c->name, argv[1])) cmd = c;
  if (!cmd) {
    fprintf(stderr, "gptj: error: unknown command '%s' (see gptj --help)\n", argv[1]);
    return 2;
  }
  /* Open MPI's "lockedfile" shared-file-pointer component (which gptj never uses) writes the
   * file's path into a fixed buffer when MPI-IO opens a file, and aborts on paths of ~230
   * characters: leave it out, unless the user chose the components. */
  setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
  int needs_mpi = cmd->mpi;
  if (needs_mpi) MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  if (needs_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
  gj_log_set_world(rank, size);
  int rc = cmd->run(argc - 1, argv + 1);
  if (rc == GJ_STOPPED) {
    /* a stop signal before the command changed anything: a clean exit */
    if (rank == 0) printf("gptj %s: %s\n", cmd->name, gj_errmsg()), fflush(stdout);
    rc = 0;
  } else if (rc < 0) {
    /* Commands agree on failure across ranks before returning (gj_agree gives every rank the
     * first failing rank's message); print once. */
    if (rank == 0) fprintf(stderr, "gptj %s: error: %s\n", cmd->name, gj_errmsg());
    if (getenv("GJ_DEBUG")) fprintf(stderr, "  (at %s)\n", gj_errwhere());
    rc = 1;
  }
  if (needs_mpi) MPI_Finalize();
  return rc;
}
