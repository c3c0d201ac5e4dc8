/* gptj: one executable, subcommands dispatched by name. */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"
#include "io/h5util.h"
#include "io/rundir.h"
#include "model/gemm.h"
#include "parallel/grid.h"

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

/* Every rank must run the same command with the same options (an MPMD launch or a wrapper
 * that changes them would make the ranks disagree in ways that hang or crash collectives):
 * compared by a hash of the command line, refused naming the first rank that differs. */
static int same_command(int argc, char **argv) {
  uint64_t h = 1469598103934665603ULL, h0;
  for (int i = 1; i < argc; i++)
    for (const unsigned char *p = (const unsigned char *)argv[i];; p++) {
      h = (h ^ *p) * 1099511628211ULL; /* FNV-1a, the NUL ending each argument included */
      if (!*p) break;
    }
  h0 = h;
  GJ_TRY(gj_bcast(gj_comm_world(), &h0, sizeof h0, 0));
  int rc = h != h0 ? GJ_FAIL("its command line differs from rank 0's: every rank must be given the same "
                             "command and options") : 0;
  return gj_agree(gj_comm_world(), rc);
}

/* Whether MPI is asked for MPI_THREAD_MULTIPLE: for train and bench (the DP progress thread,
 * parallel/dp.h), unless the command line sets --dp-poll-us 0 (the last one given), so that a
 * user whose MPI transport refuses that level (UCX built without threads) can keep it off. */
static int dp_thread(const char *cmd, int argc, char **argv) {
  if (strcmp(cmd, "train") && strcmp(cmd, "bench")) return 0;
  int on = 1;
  for (int i = 2; i < argc; i++) {
    const char *v = NULL;
    if (!strcmp(argv[i], "--dp-poll-us") && i + 1 < argc) v = argv[++i];
    else if (!strncmp(argv[i], "--dp-poll-us=", 13)) v = argv[i] + 13;
    if (v) {
      char *end;
      const long n = strtol(v, &end, 10);
      on = !(end != v && *end == '\0' && n == 0);
    }
  }
  return on;
}

int main(int argc, char **argv) {
  /* first: a stop signal from here on is handled (train stops cleanly at its next stop point;
   * other commands remove their temporary files and end) */
  gj_signals_install(argc > 1 && !strcmp(argv[1], "train"));
  gj_blas_select_kernel(argv);
  gj_h5_at_start();
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
  int needs_mpi = cmd->mpi;
  if (needs_mpi) gj_comm_before_init();
  if (needs_mpi) { /* MULTIPLE for the DP progress thread (parallel/dp.h); with less, none */
    int provided;
    MPI_Init_thread(&argc, &argv, dp_thread(cmd->name, argc, argv) ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE,
                    &provided);
  }
  int rank = 0, size = 1;
  if (needs_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank), size = gj_comm_size(gj_comm_world());
  gj_log_set_world(rank, size);
  if (needs_mpi) { /* the ranks of this node share its memory */
    int local = 1;
    if (gj_comm_node_size(gj_comm_world(), &local)) local = 1;
    gj_set_node_ranks(local);
  }
  int rc = needs_mpi && size > 1 ? same_command(argc, argv) : 0;
  if (!rc) rc = cmd->run(argc - 1, argv + 1);
  if (rc == GJ_STOPPED) {
    /* a stop signal before the command changed anything: a clean exit */
    if (rank == 0) printf("gptj %s: %s\n", cmd->name, gj_errmsg()), fflush(stdout);
    rc = 0;
  } else if (rc < 0) {
    /* Commands agree on failure across ranks before returning (gj_agree gives every rank the
     * first failing rank's message); print once. */
    if (gj_log_rank() == 0) fprintf(stderr, "gptj %s: error: %s\n", cmd->name, gj_errmsg());
    if (getenv("GJ_DEBUG")) fprintf(stderr, "  (at %s)\n", gj_errwhere());
    rc = 1;
  }
  /* what the command printed may not have reached its file (a full disk, a closed pipe): a
   * result lost is a failure */
  if (rc == 0 && cmd->result_on_stdout && (fflush(stdout) || ferror(stdout))) {
    fprintf(stderr, "gptj %s: error: stdout: write error: %s\n", cmd->name, errno ? strerror(errno) : "a write failed");
    rc = 1;
  }
  gj_rundir_unlock(); /* a run directory's lock goes before MPI_Finalize (after it, mpirun
                       * may end the process before exit handlers run) */
  if (rc) gj_rundir_discard_new();
  if (needs_mpi) MPI_Finalize();
  return rc;
}
