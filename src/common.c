#include "common.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char errmsg[GJ_ERRMSG_MAX];
static char errwhere[128];
static int log_rank = 0, log_world = 1;

int gj_fail_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errmsg, sizeof errmsg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  snprintf(errwhere, sizeof errwhere, "%s:%d", base ? base + 1 : file, line);
  return -1;
}

const char *gj_errmsg(void) { return errmsg; }

int gj_err_prefix(const char *prefix) {
  char tmp[2 * GJ_ERRMSG_MAX];
  snprintf(tmp, sizeof tmp, "%s: %s", prefix, errmsg);
  tmp[GJ_ERRMSG_MAX - 1] = 0;
  memcpy(errmsg, tmp, GJ_ERRMSG_MAX);
  return -1;
}
const char *gj_errwhere(void) { return errwhere; }
void gj_err_clear(void) { errmsg[0] = errwhere[0] = 0; }

void gj_log_set_rank(int rank) { log_rank = rank; }
int gj_log_rank(void) { return log_rank; }
void gj_log_set_world(int rank, int size) { log_rank = rank, log_world = size; }
int gj_log_world(void) { return log_world; }

int gj_path_join(char *out, size_t n, const char *a, const char *b) {
  size_t max = GJ_MIN(n, (size_t)GJ_PATH_MAX + 1);
  int len = a ? snprintf(out, n, "%s/%s", a, b) : snprintf(out, n, "%s", b);
  if (len < 0 || (size_t)len >= max) {
    if (n) out[0] = 0;
    return GJ_FAIL("%.200s%s%.200s...: path longer than %d characters", a ? a : "", a ? "/" : "",
                   b, GJ_PATH_MAX);
  }
  return 0;
}

int gj_mul_size(size_t *n, size_t a, size_t b) { return __builtin_mul_overflow(a, b, n) ? -1 : 0; }
int gj_add_size(size_t *n, size_t a, size_t b) { return __builtin_add_overflow(a, b, n) ? -1 : 0; }

/* Temporaries: fixed slots written before a file is created and cleared after its rename, so
 * that the signal handler only reads memory that is never freed. */
#define TMP_SLOTS 16
static char tmp_path[TMP_SLOTS][GJ_PATH_BUF];
static volatile sig_atomic_t tmp_used[TMP_SLOTS];
static volatile sig_atomic_t stop_sig = 0;
static int graceful_mode = 0;

void gj_tmp_register(const char *path) {
  for (int i = 0; i < TMP_SLOTS; i++)
    if (!tmp_used[i]) {
      snprintf(tmp_path[i], sizeof tmp_path[i], "%s", path);
      tmp_used[i] = 1;
      return;
    }
}

void gj_tmp_unregister(const char *path) {
  for (int i = 0; i < TMP_SLOTS; i++)
    if (tmp_used[i] && !strcmp(tmp_path[i], path)) tmp_used[i] = 0;
}

static void die_by(int sig) {
  for (int i = 0; i < TMP_SLOTS; i++)
    if (tmp_used[i]) unlink(tmp_path[i]);
  signal(sig, SIG_DFL);
  raise(sig);
  _exit(128 + sig);
}

static void on_signal(int sig) {
  if (!graceful_mode || (stop_sig && (sig == SIGINT || sig == SIGTERM))) die_by(sig);
  if (!stop_sig) stop_sig = sig;
}

void gj_signals_install(int graceful) {
  graceful_mode = graceful;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    /* a signal the caller ignores (nohup) stays ignored */
    if (!sigaction(sigs[i], NULL, &old) && old.sa_handler == SIG_IGN) continue;
    sigaction(sigs[i], &sa, NULL);
  }
}

int gj_stop_signal(void) { return stop_sig; }

void gj_info(const char *fmt, ...) {
  if (log_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
  fflush(stdout);
}

void gj_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[rank %d] warning: ", log_rank);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

void *gj_alloc(size_t n) {
  void *p = NULL;
  size_t sz = (n + 63) / 64 * 64;
  if (sz == 0) sz = 64;
  if (posix_memalign(&p, 64, sz)) return NULL;
  memset(p, 0, sz);
  return p;
}

int gj_parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

int gj_parse_f64(const char *s, double *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

double gj_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double meminfo(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double v = 0;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ':') {
      v = atof(line + kl + 1) * 1024.0;
      break;
    }
  fclose(f);
  return v;
}

double gj_mem_total_bytes(void) { return meminfo("MemTotal"); }
double gj_mem_available_bytes(void) { return meminfo("MemAvailable"); }
