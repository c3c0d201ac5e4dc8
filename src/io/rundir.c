#include "io/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "io/outfile.h"

int gj_ckpt_path(char *out, size_t n, const char *dir, int64_t step) {
  char name[64];
  snprintf(name, sizeof name, "ckpt-%08lld.h5", (long long)step);
  return gj_path_join(out, n, dir, name);
}

/* The longest name the run directory holds beside its path: "/ckpt-<step>.h5.tmp" and the
 * temporaries of config.conf and metrics.jsonl ("/metrics.jsonl.tmp.<pid>"). */
#define RUNDIR_NAME_ROOM 48

/* The directories gj_rundir_create made: the whole path and the first one made (""), which a
 * run that fails before it writes anything removes again (gj_rundir_discard_new). */
static char made_path[GJ_PATH_BUF], made_first[GJ_PATH_BUF];

void gj_rundir_discard_new(void) {
  if (!made_first[0]) return;
  char p[GJ_PATH_BUF];
  snprintf(p, sizeof p, "%s", made_path);
  for (size_t n = strlen(p); n > 1 && p[n - 1] == '/'; n--) p[n - 1] = 0;
  for (;;) { /* from the deepest up to the first one made; rmdir removes empty ones only */
    if (rmdir(p)) break;
    if (!strcmp(p, made_first)) break;
    char *slash = strrchr(p, '/');
    if (!slash || slash == p) break;
    *slash = 0;
  }
  made_first[0] = 0;
}

int gj_rundir_create(const char *dir) {
  char buf[GJ_PATH_BUF];
  if (strlen(dir) + RUNDIR_NAME_ROOM > GJ_PATH_MAX)
    return GJ_FAIL("--run-dir %.200s...: %zu characters, at most %d so that the paths of its files fit in "
                   "PATH_MAX (%d)", dir, strlen(dir), GJ_PATH_MAX - RUNDIR_NAME_ROOM, GJ_PATH_MAX);
  GJ_TRY(gj_path_join(buf, sizeof buf, NULL, dir));
  size_t len = strlen(buf);
  for (size_t i = 1; i <= len; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    struct stat st;
    if (mkdir(buf, 0755)) {
      if (errno != EEXIST) return GJ_FAIL("--run-dir %s: cannot create %s: %s", dir, buf, strerror(errno));
    } else if (!made_first[0]) {
      snprintf(made_first, sizeof made_first, "%s", buf);
    }
    if (stat(buf, &st)) return GJ_FAIL("--run-dir %s: %s: %s", dir, buf, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return GJ_FAIL("--run-dir %s: %s: Not a directory", dir, buf);
    buf[i] = c;
  }
  if (made_first[0]) snprintf(made_path, sizeof made_path, "%s", buf);
  return 0;
}

/* The step of a checkpoint's file name ckpt-<digits>.h5 (at least 8 digits), or -1. */
static int64_t name_step(const char *name) {
  if (strncmp(name, "ckpt-", 5)) return -1;
  const char *d = name + 5, *e = d;
  while (*e >= '0' && *e <= '9') e++;
  if (e - d < 8 || e - d > 18 || strcmp(e, ".h5")) return -1;
  int64_t s = 0;
  for (const char *p = d; p < e; p++) s = s * 10 + (*p - '0');
  char canon[64]; /* one name per step: no leading zeros beyond the 8 digits */
  snprintf(canon, sizeof canon, "ckpt-%08lld.h5", (long long)s);
  return strcmp(canon, name) ? -1 : s;
}

static int desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

int gj_rundir_steps(const char *dir, int64_t **steps, int *n) {
  *steps = NULL, *n = 0;
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : GJ_FAIL("%s: %s", dir, strerror(errno));
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s = name_step(e->d_name);
    if (s < 0) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      int64_t *p = realloc(*steps, cap * sizeof(int64_t));
      if (!p) return closedir(d), free(*steps), *steps = NULL, *n = 0, GJ_FAIL("out of memory listing %s", dir);
      *steps = p;
    }
    (*steps)[(*n)++] = s;
  }
  closedir(d);
  if (*n) qsort(*steps, *n, sizeof(int64_t), desc);
  return 0;
}

int64_t gj_rundir_latest(const char *dir) {
  char lp[GJ_PATH_BUF], name[256];
  if (gj_path_join(lp, sizeof lp, dir, "latest")) return -1;
  FILE *f = fopen(lp, "r");
  if (!f) return -1;
  int64_t s = -1;
  if (fgets(name, sizeof name, f)) {
    name[strcspn(name, "\n")] = 0;
    s = name_step(name);
  }
  fclose(f);
  return s;
}

/* Write text to path as every output is written (io/outfile.h): a temporary beside it,
 * synced, renamed, the directory synced. */
static int write_atomic(const char *path, const char *text, size_t len) {
  gj_outfile o;
  GJ_TRY(gj_outfile_begin(&o, path));
  int fd = open(o.tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return gj_outfile_abort(&o), GJ_FAIL("%s: %s", o.tmp, strerror(errno));
  int e = 0;
  for (size_t off = 0; off < len && !e;) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) e = w < 0 ? errno : EIO;
    else off += (size_t)w;
  }
  if (close(fd) && !e) e = errno;
  if (e) return gj_outfile_abort(&o), GJ_FAIL("%s: write failed: %s", o.tmp, strerror(e));
  return gj_outfile_commit(&o);
}

int gj_ckpt_set_latest(const char *dir, const char *path) {
  char fin[GJ_PATH_BUF], line[300];
  GJ_TRY(gj_path_join(fin, sizeof fin, dir, "latest"));
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  snprintf(line, sizeof line, "%s\n", base);
  return write_atomic(fin, line, strlen(line));
}

int gj_ckpt_candidates(const char *dir, int64_t **steps, int *n) {
  GJ_TRY(gj_rundir_steps(dir, steps, n));
  int64_t l = gj_rundir_latest(dir);
  int found = 0;
  for (int i = 0; i < *n && l >= 0 && !found; i++)
    if ((*steps)[i] == l) { /* latest first, the others by step */
      memmove(*steps + 1, *steps, i * sizeof(int64_t));
      (*steps)[0] = l;
      found = 1;
    }
  char lp[GJ_PATH_BUF];
  if (!found && !gj_path_join(lp, sizeof lp, dir, "latest") && access(lp, F_OK) == 0 && *n > 0)
    gj_warn("%s does not name a checkpoint of %s%s: resuming from the newest by step", lp, dir,
            l >= 0 ? " (its file is gone)" : "");
  return 0;
}

static int remove_ckpt(const char *dir, int64_t step) {
  char p[GJ_PATH_BUF];
  GJ_TRY(gj_ckpt_path(p, sizeof p, dir, step));
  if (unlink(p) && errno != ENOENT) gj_warn("cannot remove checkpoint %s: %s", p, strerror(errno));
  return 0;
}

int gj_ckpt_rotate(const char *dir, int keep, int64_t just_written) {
  if (keep <= 0) return 0;
  int64_t *steps;
  int n;
  GJ_TRY(gj_rundir_steps(dir, &steps, &n));
  int64_t l = gj_rundir_latest(dir);
  int kept = 0;
  for (int i = 0; i < n; i++) {
    int protect = steps[i] == l || steps[i] == just_written;
    if (kept < keep || protect) kept++;
    else remove_ckpt(dir, steps[i]);
  }
  free(steps);
  return 0;
}

int gj_rundir_drop_after(const char *dir, int64_t after, int *deleted) {
  int64_t *steps;
  int n;
  *deleted = 0;
  GJ_TRY(gj_rundir_steps(dir, &steps, &n));
  int64_t l = gj_rundir_latest(dir);
  char lp[GJ_PATH_BUF];
  int rc = gj_path_join(lp, sizeof lp, dir, "latest");
  /* `latest` first, so that it never names a deleted file */
  if (!rc && (l > after || (after < 0 && access(lp, F_OK) == 0)) && unlink(lp) && errno != ENOENT)
    rc = GJ_FAIL("%s: %s", lp, strerror(errno));
  for (int i = 0; i < n && !rc; i++)
    if (steps[i] > after) rc = remove_ckpt(dir, steps[i]), ++*deleted;
  free(steps);
  return rc;
}

/* The step of a metrics.jsonl record ({"step": N, ...}), -1 if none. */
static int64_t record_step(const char *line) {
  const char *p = strstr(line, "\"step\":");
  if (!p) return -1;
  char *end;
  long long s = strtoll(p + 7, &end, 10);
  return end == p + 7 ? -1 : s;
}

int gj_rundir_trim_metrics(const char *path, int64_t step) {
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT ? 0 : GJ_FAIL("%s: %s", path, strerror(errno));
  char *line = NULL, *out = NULL;
  size_t cap = 0, olen = 0, ocap = 0;
  ssize_t len;
  int dropped = 0, rc = 0;
  while (!rc && (len = getline(&line, &cap, f)) >= 0) {
    /* a record cut short by a crash (no newline) is dropped too */
    if (record_step(line) > step || line[len - 1] != '\n') {
      dropped++;
      continue;
    }
    if (olen + len + 1 > ocap) {
      ocap = 2 * (olen + len + 1) + 4096;
      char *p = realloc(out, ocap);
      if (!p) rc = GJ_FAIL("%s: out of memory", path);
      else out = p;
    }
    if (!rc) memcpy(out + olen, line, len), olen += len;
  }
  if (!rc && ferror(f)) rc = GJ_FAIL("%s: read error", path);
  fclose(f);
  free(line);
  if (!rc && dropped) rc = write_atomic(path, out ? out : "", olen);
  free(out);
  return rc;
}

/* Whether name is one of the temporaries gptj writes in a run directory, exactly:
 * ckpt-<digits>.h5.tmp, and latest, config.conf and metrics.jsonl's .tmp.<pid>, lock.stale.<pid>
 * (a user's file such as ckpt-notes.tmp.txt is not). */
static int our_tmp(const char *name) {
  static const char *const pre[] = {"latest.tmp.", "config.conf.tmp.", "metrics.jsonl.tmp.", "lock.stale."};
  const char *p = NULL;
  if (!strncmp(name, "ckpt-", 5)) {
    for (p = name + 5; *p >= '0' && *p <= '9'; p++) {}
    return p > name + 5 && !strcmp(p, ".h5.tmp");
  }
  for (size_t i = 0; i < sizeof pre / sizeof pre[0] && !p; i++)
    if (!strncmp(name, pre[i], strlen(pre[i]))) p = name + strlen(pre[i]);
  if (!p || !*p) return 0;
  for (; *p >= '0' && *p <= '9'; p++) {}
  return !*p;
}

int gj_rundir_clean_tmp(const char *dir, int *removed) {
  *removed = 0;
  DIR *d = opendir(dir);
  if (!d) return GJ_FAIL("%s: %s", dir, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d)) && !rc) {
    if (!our_tmp(e->d_name)) continue;
    char p[GJ_PATH_BUF];
    rc = gj_path_join(p, sizeof p, dir, e->d_name);
    if (!rc && unlink(p) == 0) ++*removed;
  }
  closedir(d);
  return rc;
}

int gj_rundir_check(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return GJ_FAIL("%s: %s", dir, strerror(errno));
  const char *own[] = {"latest", "config.conf", "metrics.jsonl", "lock"};
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d)) && !rc) {
    int mine = name_step(e->d_name) >= 0;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) mine |= !strcmp(e->d_name, own[i]);
    if (!mine) continue;
    char p[GJ_PATH_BUF];
    struct stat st;
    rc = gj_path_join(p, sizeof p, dir, e->d_name);
    if (!rc && stat(p, &st)) {
      if (errno != ENOENT || lstat(p, &st) == 0) rc = GJ_FAIL("%s: %s (a dangling link?)", p, strerror(errno));
    } else if (!rc && !S_ISREG(st.st_mode))
      rc = GJ_FAIL("%s: is %s, not a regular file: the run directory keeps its own files under this name; "
                   "remove it", p, S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a special file");
  }
  closedir(d);
  return rc;
}

/* ---- the lock ---- */

static struct {
  char path[GJ_PATH_BUF];
  char token[64];
  char text[1024];
  int held;
  volatile int stop, lost;
  double stale_s;
  pthread_t thread;
} lk;

static double stale_seconds(void) {
  const char *s = getenv("GJ_LOCK_STALE_S");
  double v;
  if (s && !gj_parse_f64(s, &v) && v > 0) return v;
  return 300;
}

static int read_text(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO in the lock's place reads empty, not blocks */
  if (fd < 0) return -1;
  ssize_t r = read(fd, buf, n - 1);
  close(fd);
  if (r < 0) return -1;
  buf[r] = 0;
  return 0;
}

/* A process's state letter and start time (clock ticks after boot) from /proc; 0 if it does
 * not exist. */
static int proc_state(long pid, unsigned long long *start) {
  char p[64], buf[1024];
  snprintf(p, sizeof p, "/proc/%ld/stat", pid);
  if (read_text(p, buf, sizeof buf)) return 0;
  char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!rp || rp[1] != ' ') return 0;
  char st = rp[2];
  *start = 0;
  char *f = rp + 2; /* fields 3.. ; the start time is field 22 */
  for (int i = 3; i < 22 && f; i++) f = strchr(f + 1, ' ');
  if (f) *start = strtoull(f + 1, NULL, 10);
  return st;
}

/* This process's pid namespace ("pid:[4026531836]"), or "-". */
static void pid_ns(char *out, size_t n) {
  ssize_t k = readlink("/proc/self/ns/pid", out, n - 1);
  out[k > 0 && !memchr(out, ' ', (size_t)k) ? k : 0] = 0;
  if (!*out) snprintf(out, n, "-");
}

/* Whether the lock text describes a process of this host that no longer runs (1: gone, a
 * zombie, or its pid now another process's, by its start time), one that runs (0), one of
 * another host (-1), or one whose pid means nothing here (-2: another pid namespace, as in a
 * container, or not visible in /proc): only the lock's age tells. */
static int holder_dead_here(const char *text) {
  long pid = 0;
  unsigned long long start = 0, now_start = 0;
  char host[256] = "", me[256] = "", ns[64] = "", my_ns[64];
  const char *p = strstr(text, "pid "), *h = strstr(text, "host "), *t = strstr(text, " start ");
  const char *q = strstr(text, " pidns ");
  if (!p || !h || sscanf(p, "pid %ld", &pid) != 1 || sscanf(h, "host %255s", host) != 1) return -2;
  gethostname(me, sizeof me - 1);
  if (strcmp(host, me) || pid <= 0) return -1;
  pid_ns(my_ns, sizeof my_ns);
  if (q && sscanf(q, " pidns %63s", ns) == 1 && strcmp(ns, my_ns)) return -2;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
  int st = proc_state(pid, &now_start);
  if (!st) return -2;
  if (st == 'Z' || st == 'X') return 1;
  return t && sscanf(t, " start %llu", &start) == 1 && start != now_start;
}

/* Slurm's states of a job that may still be running its tasks. */
static int slurm_state_live(const char *st) {
  static const char *live[] = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING",
                               "SIGNALING", "STAGE_OUT", "STOPPED"};
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
    if (!strcmp(st, live[i])) return 1;
  return 0;
}

/* For a holder on another host, whose process cannot be looked at: whether Slurm says its job
 * has ended (1), or it runs or nobody can tell (0). The lock names the job (SLURM_JOB_ID), its
 * restart count (SLURM_RESTART_COUNT) and cluster (SLURM_CLUSTER_NAME). A lock of this very job
 * at an earlier restart is its own previous run (a requeue, after a node was lost, say);
 * another job of this cluster is asked of squeue (all states), and one it no longer knows
 * ("Invalid job id") or knows in a state other than running has no tasks left. Outside Slurm,
 * for another cluster's job, or when squeue fails otherwise, the lock expires by its age. */
static int slurm_holder_ended(const char *text) {
  char job[64] = "", cl[128] = "";
  long restart = 0;
  const char *j = strstr(text, " job "), *r = strstr(text, " restart "), *c = strstr(text, " cluster ");
  if (!j || sscanf(j, " job %63s", job) != 1 || !strcmp(job, "-")) return 0;
  if (r) sscanf(r, " restart %ld", &restart);
  if (c) sscanf(c, " cluster %127s", cl);
  const char *me = getenv("SLURM_JOB_ID"), *my_restart = getenv("SLURM_RESTART_COUNT");
  const char *my_cl = getenv("SLURM_CLUSTER_NAME");
  if (!me || !my_cl || strcmp(cl, my_cl)) return 0;
  if (!strcmp(me, job)) return (my_restart ? atol(my_restart) : 0) > restart;
  for (const char *q = job; *q; q++)
    if ((*q < '0' || *q > '9') && *q != '_') return 0; /* a job id, nothing for the shell */
  char cmd[160], out[256] = "";
  snprintf(cmd, sizeof cmd, "timeout 10 squeue -h -t all -j %s -o %%T 2>&1", job);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  size_t n = fread(out, 1, sizeof out - 1, p);
  int st = pclose(p);
  out[n] = 0;
  if (strstr(out, "Invalid job id")) return 1;
  out[strcspn(out, "\n")] = 0;
  if (st != 0 || !*out || strspn(out, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") != strlen(out)) return 0; /* no answer */
  return !slurm_state_live(out);
}

/* The lock's text written to its new file fd, synced, and fd closed: 0, or -1 (errno set). */
static int lock_write(int fd, const char *text) {
  size_t len = strlen(text);
  int e = write(fd, text, len) == (ssize_t)len ? 0 : errno ? errno : EIO; /* the first failure's */
  if (fsync(fd) && !e) e = errno;
  if (close(fd) && !e) e = errno;
  if (e) errno = e;
  return e ? -1 : 0;
}

/* One look at the lock: 0 ours (and touched now), 1 another holder's text, 2 absent, 3 could
 * not be read or touched (an I/O error, a stale NFS handle, no file descriptors left). */
static int lock_look(int *err) {
  char text[1024];
  if (read_text(lk.path, text, sizeof text)) return *err = errno, errno == ENOENT ? 2 : 3;
  if (!strstr(text, lk.token)) return 1;
  if (utimensat(AT_FDCWD, lk.path, NULL, 0)) return *err = errno, 3;
  return 0;
}

/* The holder's thread: touches the lock every stale_s / 5. The lock is lost (1) when another
 * holder's text is in it. When it is gone (removed by hand, or moved aside for a moment by
 * a process judging it) and was touched less than stale_s / 2 ago, nobody can have judged it
 * stale: it is created again with O_EXCL (whoever else creates it first has it). Gone after a
 * longer silence (this process stopped, SIGSTOP or a stall), another trainer may have taken
 * it over and released it since: lost (3). A failure to read or touch it (or a dangling link
 * in its place) is let pass until no touch has succeeded for stale_s / 2: lost (2). */
static void *heartbeat(void *arg) {
  (void)arg;
  double every = GJ_MAX(lk.stale_s / 5, 0.05), next = gj_now() + every, ok_at = gj_now();
  int warned = 0, err = 0;
  while (!lk.stop) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (gj_now() < next) continue;
    next = gj_now() + every;
    int st = lock_look(&err);
    for (int i = 0; i < 5 && st == 2; i++) { /* moved aside and put back by another process? */
      nanosleep(&ts, NULL);
      st = lock_look(&err);
    }
    if (st == 2 && gj_now() - ok_at > lk.stale_s / 2) {
      lk.lost = 3;
      break;
    }
    if (st == 2) {
      int fd = open(lk.path, O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd < 0) st = errno == EEXIST ? lock_look(&err) : (err = errno, 3);
      if (fd < 0 && st == 2) st = 3, err = ENOENT; /* a dangling symbolic link in its place */
      if (fd >= 0) {
        st = lock_write(fd, lk.text) ? (err = errno, 3) : 0;
        if (!st) gj_warn("%s: the lock was removed while this run held it: taken again", lk.path);
      }
    }
    if (st == 1) {
      lk.lost = 1;
      break;
    }
    if (st == 0) ok_at = gj_now(), warned = 0;
    else if (!warned) gj_warn("%s: cannot refresh the lock (%s): retrying", lk.path, strerror(err)), warned = 1;
    if (st == 3 && gj_now() - ok_at > lk.stale_s / 2) {
      lk.lost = 2;
      break;
    }
  }
  return NULL;
}

static void release_at_exit(void) { gj_rundir_unlock(); }

/* The lock file's text: who holds it (pid, host, Slurm job, since, process start time) and a
 * token of this holder. */
static void lock_text(char *text, size_t n) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const char *job = getenv("SLURM_JOB_ID"), *restart = getenv("SLURM_RESTART_COUNT");
  const char *cluster = getenv("SLURM_CLUSTER_NAME");
  time_t now = time(NULL);
  struct tm tm;
  char when[64];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
  snprintf(lk.token, sizeof lk.token, "%08lx%08lx", (unsigned long)getpid() ^ (unsigned long)now,
           (unsigned long)(gj_now() * 1e6));
  unsigned long long start = 0;
  proc_state((long)getpid(), &start);
  char ns[64];
  pid_ns(ns, sizeof ns);
  snprintf(text, n, "gptj train: pid %ld host %s job %s restart %ld cluster %s since %s start %llu pidns %s token %s\n",
           (long)getpid(), host, job && *job ? job : "-", restart ? atol(restart) : 0L,
           cluster && *cluster && !strpbrk(cluster, " \n") ? cluster : "-", when, start, ns, lk.token);
}

/* The lock was created (fd): write it, hold it, start the heartbeat. */
static int lock_taken(int fd, const char *text) {
  if (lock_write(fd, text)) return unlink(lk.path), GJ_FAIL("%s: cannot write the lock: %s", lk.path, strerror(errno));
  lk.held = 1, lk.stop = 0, lk.lost = 0;
  snprintf(lk.text, sizeof lk.text, "%s", text);
  gj_tmp_register(lk.path); /* removed also when a second interrupt ends the process */
  static int registered;
  if (!registered) atexit(release_at_exit), registered = 1;
  if (pthread_create(&lk.thread, NULL, heartbeat, NULL)) {
    gj_rundir_unlock();
    return GJ_FAIL("%s: cannot start the lock's heartbeat thread", lk.path);
  }
  return 0;
}

/* Someone holds the lock (its text: held). Returns 1 to try again (it was released, taken
 * meanwhile, or stale and removed here), or the refusal when a live holder has it. */
static int lock_held(const char *dir, char *held, size_t n) {
  struct stat st;
  if (read_text(lk.path, held, n) || stat(lk.path, &st)) return 1; /* just released */
  struct timespec now_ts;
  clock_gettime(CLOCK_REALTIME, &now_ts);
  double age = (double)(now_ts.tv_sec - st.st_mtim.tv_sec) + 1e-9 * (now_ts.tv_nsec - st.st_mtim.tv_nsec);
  int dead = holder_dead_here(held);
  /* a holder of this host just killed (a restart right after kill -9) takes a moment to go */
  int changed = 0;
  for (int i = 0; i < 100 && dead == 0 && !changed; i++) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char again[1024] = "";
    changed = read_text(lk.path, again, sizeof again) || strcmp(again, held);
    if (!changed) dead = holder_dead_here(held);
  }
  if (changed) return 1; /* released or taken meanwhile: try again */
  /* a holder known to run on this host is never stale (stopped, suspended, slow to touch) */
  int alive_here = dead == 0;
  if (dead == -1) dead = slurm_holder_ended(held) ? 2 : 0;
  if (dead < 0) dead = 0;
  if (!dead && (alive_here || age < lk.stale_s)) {
    held[strcspn(held, "\n")] = 0;
    char *tok = strstr(held, " start ");
    if (tok) *tok = 0;
    return GJ_FAIL("--run-dir %s is in use by %s (lock %s, touched %.0f s ago; a crashed holder's "
                   "lock expires after %.0f s): wait for it, or use another --run-dir",
                   dir, *held ? held : "another process", lk.path, age, lk.stale_s);
  }
  /* Stale: move it aside under a name of our own, check that what moved is what we judged
   * (another process may have taken over meanwhile: then put it back), and remove it. */
  char aside[GJ_PATH_BUF + 32], moved[1024] = "";
  snprintf(aside, sizeof aside, "%s.stale.%ld", lk.path, (long)getpid());
  if (rename(lk.path, aside)) return 1;
  if (read_text(aside, moved, sizeof moved) || strcmp(moved, held)) {
    if (link(aside, lk.path) == 0 || errno == EEXIST) unlink(aside);
    return 1;
  }
  unlink(aside);
  held[strcspn(held, "\n")] = 0;
  gj_warn("%s: removed a stale lock (%s; %s)", lk.path, held,
          dead == 2 ? "its Slurm job has ended" : dead ? "its process has ended" : "not touched for longer than GJ_LOCK_STALE_S");
  return 1;
}

int gj_rundir_lock(const char *dir) {
  if (lk.held) return 0;
  GJ_TRY(gj_path_join(lk.path, sizeof lk.path, dir, "lock"));
  lk.stale_s = stale_seconds();
  char text[1024];
  lock_text(text, sizeof text);
  struct stat ls;
  if (lstat(lk.path, &ls) == 0 && !S_ISREG(ls.st_mode))
    return GJ_FAIL("%s: is %s, not a regular file: the run directory keeps its lock under this name; remove it",
                   lk.path, S_ISDIR(ls.st_mode) ? "a directory" : S_ISLNK(ls.st_mode) ? "a symbolic link" : "a special file");
  for (int attempt = 0; attempt < 5; attempt++) {
    int fd = open(lk.path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) return lock_taken(fd, text);
    if (errno != EEXIST) return GJ_FAIL("%s: cannot create the lock: %s", lk.path, strerror(errno));
    char held[1024] = "";
    int rc = lock_held(dir, held, sizeof held);
    if (rc < 0) return rc;
  }
  return GJ_FAIL("%s: cannot take the lock (it keeps changing hands)", lk.path);
}

void gj_rundir_unlock(void) {
  if (!lk.held) return;
  lk.stop = 1;
  pthread_join(lk.thread, NULL);
  char text[1024];
  if (!read_text(lk.path, text, sizeof text) && strstr(text, lk.token)) unlink(lk.path);
  gj_tmp_unregister(lk.path);
  lk.held = 0;
}

int gj_rundir_lock_lost(void) { return lk.held ? lk.lost : 0; }
