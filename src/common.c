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
static FILE *info_out; /* NULL: stdout */

void gj_info_to_stderr(void) { info_out = stderr; }

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
/* a directory the command made for its outputs: removed with them if it is still empty */
static char made_dir[GJ_PATH_BUF];
static volatile sig_atomic_t made_dir_used;

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

void gj_tmp_register_dir(const char *path) {
  made_dir_used = 0;
  snprintf(made_dir, sizeof made_dir, "%s", path);
  made_dir_used = path != NULL;
}

static void die_by(int sig) {
  for (int i = 0; i < TMP_SLOTS; i++)
    if (tmp_used[i]) unlink(tmp_path[i]);
  if (made_dir_used) rmdir(made_dir); /* fails, as it should, unless it is empty */
  signal(sig, SIG_DFL);
  /* called from sig's own handler, where sig is blocked: raised while blocked it would stay
   * pending, and the process would exit 128 + sig instead of dying by the signal (a shell
   * running gptj in a loop tells the two apart: only a death by SIGINT stops the script) */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  raise(sig);
  _exit(128 + sig);
}

/* A closed pipe on stdout or stderr (gptj ... | head): the process ends as the signal would
 * end it, without leaving its temporaries. */
static void on_pipe(int sig) { die_by(sig); }

static const int stop_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
#define N_STOP_SIGS (sizeof stop_sigs / sizeof stop_sigs[0])

/* In graceful mode a second SIGINT or SIGTERM ends the process at once, unless the first stop
 * signal was SIGUSR1: a scheduler's request to checkpoint (Slurm's --signal, or train.sbatch's
 * trap) is often followed by its SIGTERM, which must not cost the checkpoint. That SIGTERM
 * then counts as the first. Two signals may be handled at once by two threads: the record is
 * a compare-and-swap, so one of them is the first. */
static void on_signal(int sig) {
  if (!graceful_mode) die_by(sig);
  const int urgent = sig == SIGINT || sig == SIGTERM;
  int old = 0;
  while (!__atomic_compare_exchange_n(&stop_sig, &old, sig, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    if (!urgent) return;              /* a later USR1 or HUP: the stop is already asked for */
    if (old != SIGUSR1) die_by(sig);  /* a second SIGINT or SIGTERM */
  }
}

void gj_signals_install(int graceful) {
  graceful_mode = graceful;
  const char *pending = getenv("GJ_STOP_SIGNAL"); /* received before a re-exec (blaskernel.c) */
  if (pending) {
    stop_sig = atoi(pending);
    unsetenv("GJ_STOP_SIGNAL");
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < N_STOP_SIGS; i++) {
    struct sigaction old;
    /* a signal the caller ignores (nohup) stays ignored */
    if (!sigaction(stop_sigs[i], NULL, &old) && old.sa_handler == SIG_IGN) continue;
    sigaction(stop_sigs[i], &sa, NULL);
  }
  struct sigaction old;
  if (!sigaction(SIGPIPE, NULL, &old) && old.sa_handler != SIG_IGN) {
    sa.sa_handler = on_pipe;
    sigaction(SIGPIPE, &sa, NULL);
  }
  gj_signals_hold(0); /* blocked across a re-exec (blaskernel.c): delivered now, to the handlers */
}

int gj_stop_signal(void) { return stop_sig; }

void gj_signals_hold(int on) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < N_STOP_SIGS; i++) sigaddset(&set, stop_sigs[i]);
  sigprocmask(on ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

int gj_stop_pending(void) {
  sigset_t set;
  if (sigpending(&set)) return gj_stop_signal();
  for (size_t i = 0; i < N_STOP_SIGS; i++) {
    struct sigaction sa;
    /* a signal the process ignores (nohup's SIGHUP) stays pending while held too: not a stop */
    if (sigismember(&set, stop_sigs[i]) && !sigaction(stop_sigs[i], NULL, &sa) && sa.sa_handler != SIG_IGN)
      return stop_sigs[i];
  }
  return gj_stop_signal();
}

const char *gj_signal_name(int sig) {
  switch (sig) {
  case SIGINT: return "SIGINT";
  case SIGTERM: return "SIGTERM";
  case SIGHUP: return "SIGHUP";
  case SIGUSR1: return "SIGUSR1";
  default: return "a signal";
  }
}

void gj_info(const char *fmt, ...) {
  if (log_rank != 0) return;
  FILE *o = info_out ? info_out : stdout;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(o, fmt, ap);
  va_end(ap);
  fputc('\n', o);
  fflush(o);
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
  if ((errno && errno != ERANGE) || *end || !isfinite(v)) return -1; /* underflow: the tiny value (1e-310) */
  *out = v;
  return 0;
}

double gj_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* A "Key: N kB" line of a /proc file, in bytes (0 if absent). */
static double proc_kb(const char *file, const char *key) {
  FILE *f = fopen(file, "r");
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
static double meminfo(const char *key) { return proc_kb("/proc/meminfo", key); }
double gj_self_rss_bytes(void) { return proc_kb("/proc/self/status", "VmRSS"); }
double gj_self_hwm_bytes(void) { return proc_kb("/proc/self/status", "VmHWM"); }

/* A number from a cgroup file ("max" and v1's near-2^63 "no limit" give -1). */
static double cg_number(const char *dir, const char *file) {
  char p[GJ_PATH_BUF], buf[64];
  if (snprintf(p, sizeof p, "%s/%s", dir, file) >= (int)sizeof p) return -1;
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  double v = -1;
  if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) {
    char *end;
    v = strtod(buf, &end);
    if (end == buf || v < 0 || v >= 0x1p60) v = -1;
  }
  fclose(f);
  return v;
}

/* A key of a cgroup's memory.stat (0 if absent). */
static double cg_stat(const char *dir, const char *key) {
  char p[GJ_PATH_BUF], line[256];
  if (snprintf(p, sizeof p, "%s/memory.stat", dir) >= (int)sizeof p) return 0;
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  double v = 0;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ' ') {
      v = atof(line + kl + 1);
      break;
    }
  fclose(f);
  return v;
}

/* Walk from the cgroup dir up to the hierarchy's root, keeping the tightest limit. */
static void cg_walk(const char *mount, const char *path, int v2, gj_cgroup_mem *out) {
  char rel[GJ_PATH_BUF], dir[GJ_PATH_BUF];
  snprintf(rel, sizeof rel, "%s", path);
  for (;;) {
    size_t l = strlen(rel);
    while (l > 1 && rel[l - 1] == '/') rel[--l] = 0;
    if (snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") ? rel : "") >= (int)sizeof dir) return;
    double lim = cg_number(dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    if (lim >= 0) {
      double use = cg_number(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
      /* the page cache that can be dropped is not in use */
      double cache = cg_stat(dir, v2 ? "inactive_file" : "total_inactive_file");
      double left = use >= 0 ? lim - GJ_MAX(0.0, use - cache) : lim;
      if (out->limit < 0 || left < out->available) {
        out->limit = lim, out->available = GJ_MAX(0.0, left);
        snprintf(out->path, sizeof out->path, "%s", dir);
      }
    }
    if (!strcmp(rel, "/") || !*rel) return;
    char *sl = strrchr(rel, '/');
    if (sl == rel) rel[1] = 0;
    else if (sl) *sl = 0;
    else return;
  }
}

int gj_cgroup_memory(const char *proc_cgroup, const char *root, gj_cgroup_mem *out) {
  out->limit = out->available = -1;
  out->path[0] = 0;
  FILE *f = fopen(proc_cgroup, "r");
  if (!f) return -1;
  char line[GJ_PATH_BUF];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    const char *ctl = c1 + 1, *path = c2 + 1;
    char mount[GJ_PATH_BUF];
    if (!*ctl) { /* v2: the unified hierarchy at root, or at root/unified (hybrid) */
      const char *where[2] = {"", "/unified"};
      for (int i = 0; i < 2; i++) {
        snprintf(mount, sizeof mount, "%s%s", root, where[i]);
        char probe[GJ_PATH_BUF + 32];
        snprintf(probe, sizeof probe, "%s/cgroup.controllers", mount);
        if (access(probe, R_OK) == 0) cg_walk(mount, path, 1, out);
      }
    } else { /* v1: the memory controller's own hierarchy */
      int mem = 0;
      char ctls[256];
      snprintf(ctls, sizeof ctls, "%s", ctl);
      for (char *t = strtok(ctls, ","); t; t = strtok(NULL, ",")) mem |= !strcmp(t, "memory");
      if (!mem) continue;
      snprintf(mount, sizeof mount, "%s/memory", root);
      cg_walk(mount, path, 0, out);
    }
  }
  fclose(f);
  return out->limit >= 0 ? 0 : -1;
}

static void cgroup_self(gj_cgroup_mem *cg) {
  const char *root = getenv("GJ_CGROUP_ROOT"); /* tests: a cgroup tree of their own */
  gj_cgroup_memory("/proc/self/cgroup", root && *root ? root : "/sys/fs/cgroup", cg);
}

double gj_mem_available_bytes(void) {
  gj_cgroup_mem cg;
  cgroup_self(&cg);
  double a = meminfo("MemAvailable");
  return cg.available >= 0 && (a <= 0 || cg.available < a) ? cg.available : a;
}

static int node_ranks = 1;
void gj_set_node_ranks(int n) { node_ranks = n > 0 ? n : 1; }
double gj_mem_share_bytes(void) { return gj_mem_available_bytes() / node_ranks; }

void gj_mem_describe(char *out, size_t n) {
  gj_cgroup_mem cg;
  cgroup_self(&cg);
  double a = meminfo("MemAvailable");
  if (cg.available >= 0 && (a <= 0 || cg.available < a))
    snprintf(out, n, "under the cgroup memory limit of %.2f GB of %s", cg.limit / 1e9, cg.path);
  else
    snprintf(out, n, "MemAvailable of this host");
}
