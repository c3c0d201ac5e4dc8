/* OpenBLAS's kernel: chosen by gptj for the CPU, checked, with a fallback.
 *
 * OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded, so a different kernel needs the
 * program to start again: the choice is made before MPI is initialised and applied by re-executing the
 * program with the variable set. Debian's 0.3.21 does not know recent Intel cores and falls
 * back to its generic Prescott (SSE3) kernel on them; and some OpenBLAS builds compute wrong
 * results (or crash) with some kernels on some CPUs. So gptj picks the widest kernel the CPU
 * runs (SkylakeX with AVX-512, Haswell with AVX2 + FMA), whatever OPENBLAS_CORETYPE says
 * (the same kernel on the same CPU however the job was launched),
 * checks it against a double-precision product in a forked child (a crash there is only a
 * failed check), and falls back SkylakeX -> Haswell -> Prescott with a warning if it fails.
 * GJ_OPENBLAS_CORETYPE=NAME imposes a kernel (still checked). */
#include <cblas.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "model/gemm.h"

char *openblas_get_corename(void);
void openblas_set_num_threads(int);

const char *gj_blas_core(void) { return openblas_get_corename(); }

/* The kernel to use: the widest this CPU runs. */
static const char *wanted_core(void) {
  const char *user = getenv("GJ_OPENBLAS_CORETYPE");
  if (user && *user) return user;
  gj_cpu_features f;
  gj_cpu_detect(&f);
  if (f.avx512) return "SkylakeX";
  if (f.avx2) return "Haswell";
  return NULL;
}

/* sgemm in all four transpositions against a double loop, in a child process. */
static int kernel_ok(void) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return 1; /* cannot check: trust it */
  if (pid == 0) {
    openblas_set_num_threads(1);
    enum { M = 37, N = 29, K = 83 };
    static float a[M * K], b[K * N], c[M * N];
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7919 % 201) - 100) / 128.0f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((i * 104729 % 193) - 96) / 128.0f;
    for (int kind = 0; kind < 4; kind++) {
      int ta = kind & 1, tb = kind >> 1;
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c, N);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double)(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
          if (!(fabs(s - c[i * N + j]) <= 1e-4)) _exit(1);
        }
    }
    _exit(0);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void reexec(char **argv, const char *core) {
  setenv("OPENBLAS_CORETYPE", core, 1);
  setenv("GJ_BLAS_REEXEC", core, 1);
  /* a stop request received so far survives the exec, and one arriving during it waits,
   * blocked (the mask survives exec), until the new image has its handlers */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT), sigaddset(&stop, SIGTERM), sigaddset(&stop, SIGHUP), sigaddset(&stop, SIGUSR1);
  sigprocmask(SIG_BLOCK, &stop, NULL);
  char sig[16];
  snprintf(sig, sizeof sig, "%d", gj_stop_signal());
  if (gj_stop_signal()) setenv("GJ_STOP_SIGNAL", sig, 1);
  /* exec the real path, not /proc/self/exe, so that the process keeps its name */
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    execv(self, argv);
  }
  sigprocmask(SIG_UNBLOCK, &stop, NULL);
  /* exec failed: go on with the kernel loaded */
}

void gj_blas_select_kernel(char **argv) {
  const char *core = openblas_get_corename();
  const char *tried = getenv("GJ_BLAS_REEXEC"); /* the kernel a previous exec asked for */
  if (!tried) {
    /* exactly the wanted kernel, not one OpenBLAS found as wide by itself: its own pick
     * depends on OPENBLAS_CORETYPE in the environment (on a Zen 5, Cooperlake unset and
     * whatever it names set), and kernels of the same width sum in different orders, so a
     * job's results would depend on how it was launched */
    const char *want = wanted_core();
    if (want && strcasecmp(core, want)) {
      reexec(argv, want);
      return;
    }
  }
  if (kernel_ok()) return;
  const char *next = !strcasecmp(core, "Haswell") ? "Prescott" : strcasecmp(core, "Prescott") ? "Haswell" : NULL;
  if (!next) {
    fprintf(stderr, "gptj: warning: OpenBLAS's %s kernel gives wrong products on this CPU; "
            "the GEMM check will choose another backend\n", core);
    return;
  }
  fprintf(stderr, "gptj: warning: OpenBLAS's %s kernel gives wrong products on this CPU "
          "(checked against a reference); using its %s kernel\n", core, next);
  reexec(argv, next);
}
