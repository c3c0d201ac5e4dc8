#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char errmsg[GJ_ERRMSG_MAX];
static char errwhere[128];
static int log_rank = 0;

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
