#include "io/ckptattr.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "io/h5util.h"

/* Ranges of the step and token counters read back: the largest --steps, and 2^62 tokens (so
 * that adding a step's tokens cannot overflow int64). */
#define MAX_STEP ((int64_t)1000000000000)
#define MAX_TOKENS ((int64_t)1 << 62)

typedef enum { T_I64, T_U64, T_F64, T_STR } entry_type; /* T_U64: a uint64_t field, written as int64 */

/* optional: a reader keeps the field's value when the attribute is missing. write_only: never
 * read back (/optim/step repeats the root's step). */
#define OPTIONAL 1
#define WRITE_ONLY 2

typedef struct {
  const char *name;
  int set; /* GJ_CA_*: also the group (/optim, /loader or the root) */
  entry_type type;
  size_t off, size; /* of the field in gj_ckpt_attrs */
  int flags;
  int64_t lo, hi;       /* T_I64, T_U64: the range a reader accepts */
  double flo, fhi;      /* T_F64 */
  int open;             /* T_F64: GJ_H5_LO_OPEN / GJ_H5_HI_OPEN */
} entry;

#define FIELD(f) .off = offsetof(gj_ckpt_attrs, f), .size = sizeof(((gj_ckpt_attrs *)0)->f)
#define I64(set_, name_, f, flags_, lo_, hi_) \
  {.name = name_, .set = set_, .type = T_I64, FIELD(f), .flags = flags_, .lo = lo_, .hi = hi_}
#define U64(set_, name_, f, lo_, hi_) {.name = name_, .set = set_, .type = T_U64, FIELD(f), .lo = lo_, .hi = hi_}
#define F64(set_, name_, f, lo_, hi_, open_) \
  {.name = name_, .set = set_, .type = T_F64, FIELD(f), .flo = lo_, .fhi = hi_, .open = open_}
#define STR(set_, name_, f, flags_) {.name = name_, .set = set_, .type = T_STR, FIELD(f), .flags = flags_}
/* No range: the config is checked by gj_config_validate as a whole. */
#define I64_ANY(set_, name_, f, flags_) I64(set_, name_, f, flags_, INT64_MIN, INT64_MAX)
#define F64_ANY(set_, name_, f) F64(set_, name_, f, -HUGE_VAL, HUGE_VAL, 0)

/* In the order the attributes are written. The ranges are those the training flags allow (a
 * negative step would train with a negative learning rate, a tokens_seen near INT64_MAX would
 * overflow as training goes on); the config's bounds are gj_config_validate's (I64_ANY). */
static const entry table[] = {
    STR(GJ_CA_FORMAT, "format", format, 0),
    I64_ANY(GJ_CA_VERSION, "format_version", format_version, 0),
    I64(GJ_CA_STATE, "step", meta.step, 0, 0, MAX_STEP),
    I64(GJ_CA_STATE, "tokens_seen", meta.tokens_seen, 0, 0, MAX_TOKENS),
    /* AdamW's t (a skipped step is not counted); a file without it had none skipped */
    I64(GJ_CA_STATE, "updates", meta.updates, OPTIONAL, 0, MAX_STEP),
    I64(GJ_CA_LAYOUT, "written_tp", written_tp, 0, 1, INT32_MAX),
    I64(GJ_CA_LAYOUT, "written_dp", written_dp, 0, 1, INT32_MAX),
    I64(GJ_CA_HAS_OPTIM, "has_optim", has_optim, OPTIONAL, 0, 1),
    /* the precision the run computed in; the weights are float32 either way, so any run
     * resumes from it */
    STR(GJ_CA_PRECISION, "precision", precision, OPTIONAL),
    I64_ANY(GJ_CA_CONFIG, "vocab_size", c.vocab_size, 0),
    I64_ANY(GJ_CA_CONFIG, "n_positions", c.n_positions, 0),
    I64_ANY(GJ_CA_CONFIG, "n_embd", c.n_embd, 0),
    I64_ANY(GJ_CA_CONFIG, "n_layer", c.n_layer, 0),
    I64_ANY(GJ_CA_CONFIG, "n_head", c.n_head, 0),
    I64_ANY(GJ_CA_CONFIG, "rotary_dim", c.rotary_dim, 0),
    I64_ANY(GJ_CA_CONFIG, "n_inner", c.n_inner, 0),
    F64_ANY(GJ_CA_CONFIG, "layer_norm_epsilon", c.layer_norm_epsilon),
    F64(GJ_CA_OPTIM, "lr", meta.hp.lr, 0, 10, 0),
    F64(GJ_CA_OPTIM, "beta1", meta.hp.beta1, 0, 1, GJ_H5_HI_OPEN),
    F64(GJ_CA_OPTIM, "beta2", meta.hp.beta2, 0, 1, GJ_H5_HI_OPEN),
    F64(GJ_CA_OPTIM, "eps", meta.hp.eps, 0, 1, GJ_H5_LO_OPEN),
    F64(GJ_CA_OPTIM, "weight_decay", meta.hp.weight_decay, 0, 10, 0),
    F64(GJ_CA_OPTIM, "grad_clip", meta.hp.grad_clip, 0, 1e9, 0),
    I64(GJ_CA_OPTIM, "warmup", meta.sched.warmup, 0, 0, (int64_t)1e12),
    I64(GJ_CA_OPTIM, "decay_steps", meta.sched.decay_steps, 0, 0, (int64_t)1e12),
    F64(GJ_CA_OPTIM, "lr_floor", meta.sched.floor, 0, 1, 0),
    I64_ANY(GJ_CA_OPTIM, "step", meta.step, WRITE_ONLY),
    U64(GJ_CA_LOADER, "seed", meta.loader.seed, 0, INT64_MAX),
    U64(GJ_CA_LOADER, "epoch", meta.loader.epoch, 0, MAX_TOKENS),
    U64(GJ_CA_LOADER, "cursor", meta.loader.cursor, 0, MAX_TOKENS),
    /* the --data text, for gptj info (not checked: files may move) */
    STR(GJ_CA_LOADER, "data", meta.loader.data, OPTIONAL),
};
#define N_ENTRIES (int)(sizeof table / sizeof table[0])

/* The groups: handle h[i] of a walk holds the entries of group_set[i]. */
static const char *const group_name[3] = {"/", "optim", "loader"};
static const int group_set[3] = {GJ_CA_ROOT, GJ_CA_OPTIM, GJ_CA_LOADER};

static int group_of(const entry *e) { return e->set == GJ_CA_OPTIM ? 1 : e->set == GJ_CA_LOADER ? 2 : 0; }

static void *field(gj_ckpt_attrs *a, const entry *e) { return (char *)a + e->off; }
static const void *cfield(const gj_ckpt_attrs *a, const entry *e) { return (const char *)a + e->off; }

static int write_entry(hid_t h, const entry *e, const gj_ckpt_attrs *a) {
  const void *v = cfield(a, e);
  switch (e->type) {
  case T_I64: return gj_h5_write_attr_i64(h, e->name, *(const int64_t *)v);
  case T_U64: return gj_h5_write_attr_i64(h, e->name, (int64_t)*(const uint64_t *)v);
  case T_F64: return gj_h5_write_attr_f64(h, e->name, *(const double *)v);
  case T_STR: return *(const char *)v ? gj_h5_write_attr_str(h, e->name, v) : 0;
  }
  return 0;
}

/* One entry's value from h into the field of a (a missing optional one left as it is). */
static int read_entry(hid_t h, const char *path, const entry *e, gj_ckpt_attrs *a) {
  void *v = field(a, e);
  if ((e->flags & OPTIONAL) && H5Aexists(h, e->name) <= 0) return 0;
  int64_t i;
  switch (e->type) {
  case T_I64: return gj_h5_attr_i64_in(h, path, e->name, e->lo, e->hi, v);
  case T_U64:
    GJ_TRY(gj_h5_attr_i64_in(h, path, e->name, e->lo, e->hi, &i));
    *(uint64_t *)v = (uint64_t)i;
    return 0;
  case T_F64: return gj_h5_attr_f64_in(h, path, e->name, e->flo, e->fhi, e->open, v);
  case T_STR: return gj_h5_attr_str(h, path, e->name, v, e->size);
  }
  return 0;
}

/* Apply fn to the entries of mask whose group handle is open, in table order. */
static int walk(hid_t h[3], const char *path, const gj_ckpt_attrs *in, gj_ckpt_attrs *out, int mask,
                int (*fn)(hid_t, const char *, const entry *, const gj_ckpt_attrs *, gj_ckpt_attrs *)) {
  for (int i = 0; i < N_ENTRIES; i++) {
    const entry *e = &table[i];
    if ((e->set & mask) && h[group_of(e)] >= 0) GJ_TRY(fn(h[group_of(e)], path, e, in, out));
  }
  return 0;
}

static void close_groups(hid_t h[3]) {
  for (int i = 1; i < 3; i++)
    if (h[i] >= 0) H5Gclose(h[i]);
}

/* A blend's state in /loader: corpora = K, and for each corpus k corpus_<k>_share,
 * corpus_<k>_windows and corpus_<k>_drawn; for one corpus, windows (its window count). */
static void blend_key(char *out, size_t n, int k, const char *what) { snprintf(out, n, "corpus_%d_%s", k, what); }

static int write_blend(hid_t h, const gj_loader_state *st) {
  if (st->n_corpora <= 1) /* one corpus: its window count */
    return st->windows[0] ? gj_h5_write_attr_i64(h, "windows", (int64_t)st->windows[0]) : 0;
  GJ_TRY(gj_h5_write_attr_i64(h, "corpora", st->n_corpora));
  char key[64];
  for (int k = 0; k < st->n_corpora; k++) {
    blend_key(key, sizeof key, k, "share");
    GJ_TRY(gj_h5_write_attr_f64(h, key, st->weight[k]));
    blend_key(key, sizeof key, k, "windows");
    GJ_TRY(gj_h5_write_attr_i64(h, key, (int64_t)st->windows[k]));
    blend_key(key, sizeof key, k, "drawn");
    GJ_TRY(gj_h5_write_attr_i64(h, key, (int64_t)st->drawn[k]));
  }
  return 0;
}

static int read_blend(hid_t h, const char *path, gj_loader_state *st) {
  st->n_corpora = 1;
  int64_t n, v;
  if (H5Aexists(h, "corpora") <= 0) { /* one corpus: its window count, 0 if not recorded */
    st->windows[0] = 0;
    if (H5Aexists(h, "windows") <= 0) return 0;
    GJ_TRY(gj_h5_attr_i64_in(h, path, "windows", 1, MAX_TOKENS, &v));
    st->windows[0] = (uint64_t)v;
    return 0;
  }
  GJ_TRY(gj_h5_attr_i64_in(h, path, "corpora", 2, GJ_MAX_CORPORA, &n));
  st->n_corpora = (int)n;
  char key[64];
  for (int k = 0; k < st->n_corpora; k++) {
    blend_key(key, sizeof key, k, "share");
    GJ_TRY(gj_h5_attr_f64_in(h, path, key, 0, 1, GJ_H5_LO_OPEN, &st->weight[k]));
    blend_key(key, sizeof key, k, "windows");
    GJ_TRY(gj_h5_attr_i64_in(h, path, key, 1, MAX_TOKENS, &v));
    st->windows[k] = (uint64_t)v;
    blend_key(key, sizeof key, k, "drawn");
    GJ_TRY(gj_h5_attr_i64_in(h, path, key, 0, MAX_TOKENS, &v));
    st->drawn[k] = (uint64_t)v;
  }
  return 0;
}

static int do_write(hid_t h, const char *path, const entry *e, const gj_ckpt_attrs *in, gj_ckpt_attrs *out) {
  return write_entry(h, e, in);
}

int gj_ckptattr_write(hid_t f, const gj_ckpt_attrs *a, int mask) {
  /* the root's attributes, then the groups, then theirs */
  hid_t h[3] = {f, -1, -1};
  int rc = walk(h, NULL, a, NULL, mask & GJ_CA_ROOT, do_write);
  for (int i = 1; i < 3 && !rc; i++) {
    if (!(mask & group_set[i])) continue;
    h[i] = H5Gcreate2(f, group_name[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (h[i] < 0) rc = GJ_H5_FAIL("cannot create group /%s", group_name[i]);
  }
  if (!rc) rc = walk(h, NULL, a, NULL, mask & ~GJ_CA_ROOT, do_write);
  if (!rc && (mask & GJ_CA_LOADER)) rc = write_blend(h[2], &a->meta.loader);
  close_groups(h);
  return rc;
}

/* Open the groups of mask (a walk over them reads nothing from a group that is not open). */
static int open_groups(hid_t f, const char *path, int mask, hid_t h[3]) {
  h[0] = f, h[1] = h[2] = -1;
  int missing = 0;
  for (int i = 1; i < 3; i++) {
    if (!(mask & group_set[i])) continue;
    h[i] = H5Lexists(f, group_name[i], H5P_DEFAULT) > 0 ? H5Gopen2(f, group_name[i], H5P_DEFAULT) : -1;
    missing |= h[i] < 0;
  }
  if (!missing) return 0;
  close_groups(h);
  return GJ_FAIL("%s: missing /optim or /loader", path);
}

static int do_read(hid_t h, const char *path, const entry *e, const gj_ckpt_attrs *in, gj_ckpt_attrs *out) {
  if (e->flags & WRITE_ONLY) return 0;
  return read_entry(h, path, e, out);
}

int gj_ckptattr_read(hid_t f, const char *path, gj_ckpt_attrs *a, int mask) {
  /* the root's attributes first: a bad counter is reported before a missing group */
  hid_t h[3] = {f, -1, -1};
  GJ_TRY(walk(h, path, NULL, a, mask & GJ_CA_ROOT, do_read));
  if (!(mask & ~GJ_CA_ROOT)) return 0;
  GJ_TRY(open_groups(f, path, mask, h));
  int rc = walk(h, path, NULL, a, mask & ~GJ_CA_ROOT, do_read);
  if (!rc && (mask & GJ_CA_LOADER)) rc = read_blend(h[2], path, &a->meta.loader);
  close_groups(h);
  return rc;
}

static int do_check(hid_t h, const char *path, const entry *e, const gj_ckpt_attrs *run, gj_ckpt_attrs *tmp) {
  if (e->flags & WRITE_ONLY) return 0;
  GJ_TRY(read_entry(h, path, e, tmp));
  const void *have = cfield(tmp, e), *want = cfield(run, e);
  switch (e->type) {
  case T_I64:
  case T_U64:
    if (memcmp(have, want, sizeof(int64_t)))
      return GJ_FAIL("%s: checkpoint has %s = %lld, this run has %lld", path, e->name,
                     (long long)*(const int64_t *)have, (long long)*(const int64_t *)want);
    return 0;
  case T_F64:
    if (*(const double *)have != *(const double *)want)
      return GJ_FAIL("%s: checkpoint has %s = %g, this run has %g", path, e->name, *(const double *)have,
                     *(const double *)want);
    return 0;
  case T_STR:
    if (strcmp(have, want))
      return GJ_FAIL("%s: checkpoint has %s = %s, this run has %s", path, e->name, (const char *)have,
                     (const char *)want);
    return 0;
  }
  return 0;
}

int gj_ckptattr_check(hid_t f, const char *path, const gj_ckpt_attrs *run, int mask) {
  if (mask & ~GJ_CA_ROOT) return GJ_FAIL("internal: gj_ckptattr_check of a group");
  hid_t h[3] = {f, -1, -1};
  gj_ckpt_attrs tmp = *run;
  return walk(h, path, run, &tmp, mask, do_check);
}

void gj_ckptattr_print(const gj_ckpt_attrs *a, int mask) {
  for (int i = 0; i < N_ENTRIES; i++) {
    const entry *e = &table[i];
    if (!(e->set & mask)) continue;
    const void *v = cfield(a, e);
    switch (e->type) {
    case T_I64: printf("%s: %lld\n", e->name, (long long)*(const int64_t *)v); break;
    case T_U64: printf("%s: %llu\n", e->name, (unsigned long long)*(const uint64_t *)v); break;
    case T_F64: printf("%s: %g\n", e->name, *(const double *)v); break;
    case T_STR: printf("%s: %s\n", e->name, (const char *)v); break;
    }
  }
  const gj_loader_state *st = &a->meta.loader;
  if (!(mask & GJ_CA_LOADER) || st->n_corpora <= 1) return;
  printf("corpora: %d (a blend)\n", st->n_corpora);
  for (int k = 0; k < st->n_corpora; k++)
    printf("corpus %d: share %.6g, %llu windows, %llu drawn (epoch %llu)\n", k, st->weight[k],
           (unsigned long long)st->windows[k], (unsigned long long)st->drawn[k],
           (unsigned long long)(st->drawn[k] / st->windows[k]));
}
