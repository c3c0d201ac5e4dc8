#include "io/blend.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

/* The shard paths while parsing, before any is opened. */
typedef struct {
  char **v;
  int n, cap;
} paths;

static int paths_add(paths *p, const char *s, size_t len) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    char **v = realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) return GJ_FAIL("out of memory for the shard list");
    p->v = v, p->cap = cap;
  }
  char *c = malloc(len + 1);
  if (!c) return GJ_FAIL("out of memory for the shard list");
  memcpy(c, s, len), c[len] = 0;
  p->v[p->n++] = c;
  return 0;
}

static void paths_free(paths *p) {
  for (int i = 0; i < p->n; i++) free(p->v[i]);
  free(p->v);
  *p = (paths){0};
}

static int exists(const char *path) {
  struct stat s;
  return stat(path, &s) == 0;
}

static int is_dir(const char *path) {
  struct stat s;
  return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && !strcmp(s + n - k, suffix);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The datasets of a directory, in name order: *.h5 files, and PREFIX for each PREFIX.idx with
 * a PREFIX.bin beside it. Hidden files are left out (a tokenize temporary is one). */
static int add_dir(paths *p, const char *flag, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return GJ_FAIL("%s %s: cannot list the directory: %s", flag, dir, strerror(errno));
  int first = p->n, rc = 0;
  char full[GJ_PATH_BUF], bin[GJ_PATH_BUF];
  for (struct dirent *e; !rc && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if ((rc = gj_path_join(full, sizeof full, dir, e->d_name))) break;
    size_t n = strlen(full);
    if (ends_with(e->d_name, ".h5") && !is_dir(full)) rc = paths_add(p, full, n);
    else if (ends_with(e->d_name, ".idx") && n - 4 + 5 <= sizeof bin) {
      snprintf(bin, sizeof bin, "%.*s.bin", (int)(n - 4), full);
      if (exists(bin)) rc = paths_add(p, full, n - 4);
    }
  }
  closedir(d);
  if (rc) return rc;
  if (p->n == first)
    return GJ_FAIL("%s %s: no token datasets in the directory (*.h5, or Megatron PREFIX.bin + PREFIX.idx)", flag, dir);
  qsort(p->v + first, (size_t)(p->n - first), sizeof *p->v, by_name);
  return 0;
}

/* The shards of one corpus: the whole text if it exists as written, else its '+' parts. */
static int add_corpus(paths *p, const char *flag, const char *s) {
  if (!*s) return GJ_FAIL("%s: a corpus without a path (WEIGHT:PATH)", flag);
  if (exists(s)) return is_dir(s) ? add_dir(p, flag, s) : paths_add(p, s, strlen(s));
  for (const char *a = s;;) {
    const char *b = strchr(a, '+');
    size_t len = b ? (size_t)(b - a) : strlen(a);
    if (len == 0) return GJ_FAIL("%s: an empty shard name in '%s'", flag, s);
    char one[GJ_PATH_BUF];
    if (len >= sizeof one) return GJ_FAIL("%s: a shard name longer than %zu bytes", flag, sizeof one - 1);
    memcpy(one, a, len), one[len] = 0;
    GJ_TRY(is_dir(one) ? add_dir(p, flag, one) : paths_add(p, one, len));
    if (!b) return 0;
    a = b + 1;
  }
}

/* item = [WEIGHT ':'] corpus: its weight (1 if none) and the corpus text. */
static int split_weight(const char *flag, const char *item, double *w, const char **corpus) {
  *w = 1, *corpus = item;
  const char *colon = strchr(item, ':');
  if (!colon || exists(item)) return 0;
  char num[64];
  size_t len = (size_t)(colon - item);
  int ok = 0;
  /* a decimal number only: strtod would also take leading blanks, hexadecimal (0x10 = 16) and
     hexadecimal exponents, none of which Megatron's weights are */
  if (len > 0 && len < sizeof num && strspn(item, "0123456789.eE+-") == len) {
    char *end;
    memcpy(num, item, len), num[len] = 0;
    errno = 0;
    *w = strtod(num, &end);
    ok = !*end && !errno && isfinite(*w);
  }
  if (!ok)
    return GJ_FAIL("%s: '%.*s' in '%s' is not a weight (WEIGHT:PATH, WEIGHT a positive decimal number)", flag,
                   (int)len, item, item);
  if (!(*w > 0)) return GJ_FAIL("%s: weight %g of '%s' is not positive", flag, *w, colon + 1);
  *corpus = colon + 1;
  return 0;
}

static void set_name(char *out, const char *s) {
  size_t n = strlen(s);
  if (n < GJ_CORPUS_NAME) memcpy(out, s, n + 1);
  else snprintf(out, GJ_CORPUS_NAME, "%.*s...", GJ_CORPUS_NAME - 4, s);
}

/* The corpora of spec: weights (not yet normalised), names, and every shard's path. */
static int parse(gj_data *d, const char *spec, const char *flag, paths *p) {
  char *copy = strdup(spec);
  if (!copy) return GJ_FAIL("out of memory");
  int rc = 0;
  char *save = NULL;
  if (!*spec) rc = GJ_FAIL("%s: empty", flag);
  for (char *item = copy; !rc && item; item = save) {
    save = strchr(item, ',');
    if (save) *save++ = 0;
    if (!*item) { rc = GJ_FAIL("%s: an empty item in '%s' (a ',' too many?)", flag, spec); break; }
    if (d->n_corpora == GJ_MAX_CORPORA) { rc = GJ_FAIL("%s: more than %d corpora", flag, GJ_MAX_CORPORA); break; }
    const char *corpus;
    int k = d->n_corpora;
    rc = split_weight(flag, item, &d->weight[k], &corpus);
    d->first[k] = p->n;
    if (!rc) rc = add_corpus(p, flag, corpus);
    if (!rc) set_name(d->name[k], corpus), d->n_corpora++;
  }
  free(copy);
  d->first[d->n_corpora] = p->n;
  return rc;
}

/* The weights as shares, each over their sum. When the sum overflows (1e308 + 1e308: every
 * share would be 0), the weights are first taken over the largest; otherwise the shares are
 * w / sum as they always were (a checkpoint's shares must compare equal on resume). A share
 * that underflows to 0 (1e-300 beside 1e300) is refused: that corpus would never be drawn,
 * and a checkpoint stores a share in (0, 1]. */
static int normalise(gj_data *d, const char *flag) {
  double top = 0, sum = 0, w[GJ_MAX_CORPORA];
  for (int k = 0; k < d->n_corpora; k++) w[k] = d->weight[k], top = fmax(top, w[k]), sum += w[k];
  double scale = isinf(sum) ? top : 1;
  if (scale != 1) {
    sum = 0;
    for (int k = 0; k < d->n_corpora; k++) sum += w[k] / scale;
  }
  for (int k = 0; k < d->n_corpora; k++) {
    d->weight[k] = w[k] / scale / sum;
    if (!(d->weight[k] > 0))
      return GJ_FAIL("%s: weight %g of '%s' is too small beside the largest, %g (its share underflows to 0)",
                     flag, w[k], d->name[k], top);
  }
  return 0;
}

int gj_data_open(gj_data *d, const char *spec, const char *flag, int64_t max_vocab) {
  memset(d, 0, sizeof *d);
  paths p = {0};
  int rc = parse(d, spec, flag, &p);
  if (!rc && !(d->shard = calloc((size_t)p.n, sizeof *d->shard))) rc = GJ_FAIL("out of memory for %d shards", p.n);
  for (int i = 0; !rc && i < p.n; i++) {
    rc = gj_dataset_open(&d->shard[i], p.v[i], max_vocab);
    if (!rc) d->n_shards = i + 1, d->n_tokens += d->shard[i].n_tokens;
  }
  paths_free(&p);
  if (!rc) rc = normalise(d, flag);
  if (rc) gj_data_free(d);
  return rc;
}

void gj_data_free(gj_data *d) {
  for (int i = 0; d->shard && i < d->n_shards; i++) gj_dataset_free(&d->shard[i]);
  free(d->shard);
  d->shard = NULL, d->n_shards = 0;
}

uint64_t gj_data_corpus_tokens(const gj_data *d, int k) {
  uint64_t n = 0;
  for (int i = d->first[k]; i < d->first[k + 1]; i++) n += d->shard[i].n_tokens;
  return n;
}

void gj_data_print(const gj_data *d) {
  printf("corpora: %d\n", d->n_corpora);
  for (int k = 0; k < d->n_corpora; k++) {
    uint64_t docs = 0;
    for (int i = d->first[k]; i < d->first[k + 1]; i++) docs += d->shard[i].n_docs;
    printf("corpus %d: weight %.6g, %d shard%s, %llu documents, %llu tokens: %s\n", k, d->weight[k],
           d->first[k + 1] - d->first[k], d->first[k + 1] - d->first[k] == 1 ? "" : "s",
           (unsigned long long)docs, (unsigned long long)gj_data_corpus_tokens(d, k), d->name[k]);
  }
  printf("tokens: %llu\n", (unsigned long long)d->n_tokens);
}
