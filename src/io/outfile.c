#include "io/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* dir (or ".") and base name of path; -1 if it does not fit. */
static int split(const char *path, char *dir, size_t n, const char **base) {
  const char *sl = strrchr(path, '/');
  *base = sl ? sl + 1 : path;
  if (!sl) return snprintf(dir, n, ".") >= (int)n ? -1 : 0;
  size_t l = sl == path ? 1 : (size_t)(sl - path); /* "/x" lives in "/" */
  if (l >= n) return -1;
  memcpy(dir, path, l);
  dir[l] = 0;
  return 0;
}

/* What identifies a file: its inode if it exists, else the real path of its directory plus
 * its base name (so that "a.h5", "./a.h5" and "d/../a.h5" are one output). */
typedef struct {
  int exists;
  dev_t dev;
  ino_t ino;
  char name[GJ_PATH_BUF + NAME_MAX + 2];
} ident;

static void identify(const char *path, ident *id) {
  struct stat st;
  memset(id, 0, sizeof *id);
  int r = strcmp(path, "-") ? stat(path, &st) : fstat(0, &st);
  if (!r) {
    id->exists = 1, id->dev = st.st_dev, id->ino = st.st_ino;
    return;
  }
  char dir[GJ_PATH_BUF], real[PATH_MAX];
  const char *base;
  if (!split(path, dir, sizeof dir, &base) && realpath(dir, real))
    snprintf(id->name, sizeof id->name, "%s/%s", real, base);
  else
    snprintf(id->name, sizeof id->name, "%s", path);
}

static int same_ident(const ident *a, const ident *b) {
  if (a->exists != b->exists) return 0;
  if (a->exists) return a->dev == b->dev && a->ino == b->ino;
  return !strcmp(a->name, b->name);
}

int gj_outfile_same(const char *a, const char *b) {
  ident *ia = malloc(2 * sizeof(ident));
  if (!ia) return !strcmp(a, b);
  identify(a, &ia[0]), identify(b, &ia[1]);
  int r = same_ident(&ia[0], &ia[1]);
  free(ia);
  return r;
}

/* "--out x" or "the input x" */
static const char *label(const gj_file_ref *f, char *buf, size_t n) {
  if (!strncmp(f->what, "--", 2)) snprintf(buf, n, "%s %.1000s", f->what, f->path);
  else snprintf(buf, n, "the %s %.1000s", f->what, f->path);
  return buf;
}

/* The temporary name of path: <path>.tmp.<pid>, or <dir>/.gptj.<k>.tmp.<pid> when the base
 * name would pass NAME_MAX. */
static int tmp_name(const char *path, char *tmp, size_t n) {
  static int counter = 0;
  char suf[48], dir[GJ_PATH_BUF];
  const char *base;
  snprintf(suf, sizeof suf, ".tmp.%d", (int)getpid());
  if (!*path || split(path, dir, sizeof dir, &base)) return GJ_FAIL("%.200s: not a file name", path);
  if (!*base) return GJ_FAIL("%.1000s: names a directory, expected a file", path);
  int len;
  if (strlen(base) + strlen(suf) <= NAME_MAX) len = snprintf(tmp, n, "%s%s", path, suf);
  else len = snprintf(tmp, n, "%s/.gptj.%d%s", dir, counter++, suf);
  if (len < 0 || (size_t)len >= n || len >= PATH_MAX)
    return GJ_FAIL("%.200s...: path too long for a temporary name beside it (%d characters at most)",
                   path, PATH_MAX - 1 - (int)strlen(suf));
  return 0;
}

static int check_dest(const gj_file_ref *o) {
  char dir[GJ_PATH_BUF], tmp[GJ_PATH_BUF], lb[1100];
  const char *base;
  struct stat st;
  if (!o->path || !*o->path) return GJ_FAIL("%s: empty file name", o->what);
  /* the flag first, as in every other message here */
  if (gj_path_join(tmp, sizeof tmp, NULL, o->path) || tmp_name(o->path, tmp, sizeof tmp)) return gj_err_prefix(o->what);
  if (!stat(o->path, &st) && S_ISDIR(st.st_mode))
    return GJ_FAIL("%s: is a directory, expected a file name", label(o, lb, sizeof lb));
  /* the rename would replace a device or a FIFO (/dev/null!) by a regular file */
  if (!stat(o->path, &st) && !S_ISREG(st.st_mode))
    return GJ_FAIL("%s: exists and is not a regular file (a device or a FIFO); give a file name",
                   label(o, lb, sizeof lb));
  split(o->path, dir, sizeof dir, &base);
  if (stat(dir, &st)) return GJ_FAIL("%s: directory %.1000s: %s", label(o, lb, sizeof lb), dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return GJ_FAIL("%s: %.1000s is not a directory", label(o, lb, sizeof lb), dir);
  return 0;
}

int gj_outfile_plan(const gj_file_ref *outs, int nout, const gj_file_ref *ins, int nin) {
  for (int i = 0; i < nout; i++) GJ_TRY(check_dest(&outs[i]));
  ident *id = malloc((size_t)(nout + nin) * sizeof(ident) + 1);
  if (!id) return GJ_FAIL("out of memory");
  for (int i = 0; i < nout; i++) identify(outs[i].path, &id[i]);
  for (int i = 0; i < nin; i++) identify(ins[i].path, &id[nout + i]);
  int rc = 0;
  char a[1100], b[1100];
  for (int i = 0; i < nout && !rc; i++) {
    for (int j = 0; j < i && !rc; j++)
      if (same_ident(&id[i], &id[j]))
        rc = GJ_FAIL("%s: the same file as %s; give two different outputs", label(&outs[i], a, sizeof a),
                     label(&outs[j], b, sizeof b));
    for (int j = 0; j < nin && !rc; j++)
      if (id[nout + j].exists && same_ident(&id[i], &id[nout + j]))
        rc = GJ_FAIL("%s: the same file as %s; refusing to overwrite an input", label(&outs[i], a, sizeof a),
                     label(&ins[j], b, sizeof b));
  }
  free(id);
  return rc;
}

int gj_outfile_begin(gj_outfile *o, const char *path) {
  memset(o, 0, sizeof *o);
  GJ_TRY(gj_path_join(o->path, sizeof o->path, NULL, path));
  GJ_TRY(tmp_name(path, o->tmp, sizeof o->tmp));
  gj_tmp_register(o->tmp);
  o->active = 1;
  return 0;
}

void gj_outfile_abort(gj_outfile *o) {
  if (!o->active) return;
  unlink(o->tmp);
  gj_tmp_unregister(o->tmp);
  o->active = 0;
}

int gj_outfile_commit(gj_outfile *o) {
  if (!o->active) return GJ_FAIL("%s: no temporary file to commit", o->path);
  int rc = 0, fd = open(o->tmp, O_RDONLY);
  if (fd < 0 || fsync(fd)) rc = GJ_FAIL("%s: cannot sync: %s", o->tmp, strerror(errno));
  if (fd >= 0) close(fd);
  if (!rc && rename(o->tmp, o->path)) rc = GJ_FAIL("%s: cannot rename into place: %s", o->path, strerror(errno));
  if (rc) {
    gj_outfile_abort(o);
    return rc;
  }
  gj_tmp_unregister(o->tmp);
  o->active = 0;
  /* the rename itself must survive a crash: sync the directory that holds it */
  char dir[GJ_PATH_BUF];
  const char *base;
  if (split(o->path, dir, sizeof dir, &base)) return 0;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  if (dfd < 0) return 0;
  if (fsync(dfd) && errno != EINVAL && errno != ENOTSUP && errno != EROFS)
    rc = GJ_FAIL("%s: cannot sync the directory %s: %s", o->path, dir, strerror(errno));
  close(dfd);
  return rc;
}

static const char *kind(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO (pipe)" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int gj_outfile_check_input(const char *path, const char *what, int flags) {
  char pre[1100];
  if (what) snprintf(pre, sizeof pre, "%s %.1000s", what, path);
  else snprintf(pre, sizeof pre, "%.1000s", path);
  int world = gj_log_world();
  if (!strcmp(path, "-") && (flags & GJ_IN_STDIN)) {
    if (world > 1)
      return GJ_FAIL("%s: stdin reaches rank 0 only under mpirun (%d ranks) and every rank reads "
                     "its input; give a regular file", pre, world);
    return 0;
  }
  struct stat st;
  if (stat(path, &st)) return GJ_FAIL("%s: %s", pre, strerror(errno));
  if (S_ISDIR(st.st_mode)) return GJ_FAIL("%s: is a directory, expected a file", pre);
  if (S_ISREG(st.st_mode)) return 0;
  if (flags & GJ_IN_SEEK)
    return GJ_FAIL("%s: is %s; it is read at random offsets, so give a regular file", pre, kind(st.st_mode));
  if (world > 1)
    return GJ_FAIL("%s: is %s; under mpirun (%d ranks) every rank reads it, so give a regular file",
                   pre, kind(st.st_mode), world);
  return 0;
}
