/* gptj random-hf: a GPT-J of any shape with random weights (initialised as GPT-J was trained,
 * DESIGN.md §9), written as a Hugging Face directory: config.json and safetensors shards
 * (bfloat16 by default) with model.safetensors.index.json, one tensor at a time (memory: the
 * largest tensor), so that the 6B path runs here without downloading anything. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/memcheck.h"
#include "cli/modelopts.h"
#include "common.h"
#include "io/hf.h"
#include "io/outfile.h"
#include "io/safetensors.h"
#include "model/params.h"

typedef struct {
  const char *out, *dtype;
  double shard_gb;
  int64_t seed;
  gj_config c;
  gj_layout l;
  gj_st_dtype dt;
  float *buf;
  int nshards;
  int *shard;        /* [l.n] the shard of each tensor */
  char (*files)[64]; /* [nshards] base names */
} rhf;

static void rhf_free(rhf *x) {
  free(x->buf), free(x->shard), free(x->files);
  gj_layout_free(&x->l);
}

/* The shards: tensors in table order, a new shard when the next tensor would pass the limit. */
static int plan_shards(rhf *x, uint64_t *total) {
  size_t es = x->dt == GJ_ST_F32 ? 4 : 2;
  uint64_t lim = (uint64_t)(x->shard_gb * 1e9), in = 0;
  x->shard = malloc(x->l.n * sizeof(int));
  if (!x->shard) return GJ_FAIL("out of memory");
  *total = 0;
  x->nshards = 1;
  for (int i = 0; i < x->l.n; i++) {
    uint64_t b = x->l.t[i].numel * es;
    if (in > 0 && in + b > lim) x->nshards++, in = 0;
    x->shard[i] = x->nshards - 1, in += b, *total += b;
  }
  x->files = calloc(x->nshards, sizeof *x->files);
  if (!x->files) return GJ_FAIL("out of memory");
  for (int s = 0; s < x->nshards; s++)
    if (x->nshards == 1) snprintf(x->files[s], sizeof x->files[s], "model.safetensors");
    else snprintf(x->files[s], sizeof x->files[s], "model-%05d-of-%05d.safetensors", s + 1, x->nshards);
  return 0;
}

static int write_shard(rhf *x, int s) {
  int n = 0, first = -1;
  for (int i = 0; i < x->l.n; i++)
    if (x->shard[i] == s) n++, first = first < 0 ? i : first;
  const char **names = malloc(n * sizeof *names);
  int *nd = malloc(n * sizeof(int));
  int64_t(*sh)[2] = malloc(n * sizeof *sh);
  int rc = names && nd && sh ? 0 : GJ_FAIL("out of memory");
  for (int k = 0; k < n && !rc; k++) {
    const gj_tensor *t = &x->l.t[first + k];
    names[k] = t->name, nd[k] = t->ndim, sh[k][0] = t->rows, sh[k][1] = t->cols;
  }
  char path[GJ_PATH_BUF];
  if (!rc) rc = gj_path_join(path, sizeof path, x->out, x->files[s]);
  gj_st_writer w;
  int begun = 0;
  if (!rc) rc = gj_st_write_begin(&w, path, x->dt, n, names, nd, (const int64_t(*)[2])sh), begun = !rc;
  for (int k = 0; k < n && !rc; k++) {
    const gj_tensor *t = &x->l.t[first + k];
    gj_params_init_tensor(t, &x->c, x->buf, (uint64_t)x->seed);
    rc = gj_st_write_tensor(&w, x->buf, t->numel);
    if (!rc && gj_stop_signal()) rc = GJ_FAIL("stopped by %s", gj_signal_name(gj_stop_signal()));
  }
  if (begun) {
    int e = gj_st_write_end(&w, !rc);
    if (!rc) rc = e;
  }
  if (!rc) gj_info("random-hf: %s (%d tensors)", path, n);
  free(names), free(nd), free(sh);
  return rc;
}

/* config.json and, for several shards, the index: under temporary names, then renamed. */
static int write_meta(rhf *x, uint64_t total) {
  char p[GJ_PATH_BUF];
  gj_outfile o;
  GJ_TRY(gj_path_join(p, sizeof p, x->out, "config.json"));
  GJ_TRY(gj_outfile_begin(&o, p));
  int rc = gj_hf_write_config(o.tmp, &x->c, x->dt);
  rc = rc ? (gj_outfile_abort(&o), rc) : gj_outfile_commit(&o);
  if (rc || x->nshards == 1) return rc;
  const char **names = malloc(x->l.n * sizeof *names), **files = malloc(x->l.n * sizeof *files);
  if (!names || !files) return free(names), free(files), GJ_FAIL("out of memory");
  for (int i = 0; i < x->l.n; i++) names[i] = x->l.t[i].name, files[i] = x->files[x->shard[i]];
  rc = gj_path_join(p, sizeof p, x->out, "model.safetensors.index.json");
  if (!rc) rc = gj_outfile_begin(&o, p);
  if (!rc) {
    rc = gj_hf_write_index(o.tmp, names, files, x->l.n, total);
    rc = rc ? (gj_outfile_abort(&o), rc) : gj_outfile_commit(&o);
  }
  free(names), free(files);
  return rc;
}

static int run(rhf *x) {
  if (!x->out) return GJ_FAIL("--out: required");
  if (!strcmp(x->dtype, "bfloat16")) x->dt = GJ_ST_BF16;
  else if (!strcmp(x->dtype, "float32")) x->dt = GJ_ST_F32;
  else return GJ_FAIL("--dtype %s: expected bfloat16 or float32", x->dtype);
  GJ_TRY(gj_hf_config_writable(&x->c, "random-hf"));
  if (mkdir(x->out, 0755) && errno != EEXIST) return GJ_FAIL("--out %s: %s", x->out, strerror(errno));
  struct stat st;
  if (stat(x->out, &st) || !S_ISDIR(st.st_mode)) return GJ_FAIL("--out %s: not a directory", x->out);
  GJ_TRY(gj_layout_build(&x->l, &x->c, 1, 0));
  size_t mx = 0;
  for (int i = 0; i < x->l.n; i++) mx = GJ_MAX(mx, x->l.t[i].numel);
  GJ_TRY(gj_mem_check_local(8.0 * mx, "writing one tensor at a time"));
  x->buf = malloc(mx * sizeof(float));
  if (!x->buf) return GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  uint64_t total = 0;
  GJ_TRY(plan_shards(x, &total));
  char idx[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(idx, sizeof idx, x->out, "model.safetensors.index.json"));
  if (x->nshards == 1 && !lstat(idx, &st))
    return GJ_FAIL("--out %s: holds a sharded model (model.safetensors.index.json), which readers would take "
                   "instead of the model.safetensors written here; remove it or give another directory", x->out);
  gj_info("random-hf: %lld parameters, %.2f GB of %s in %d file(s) -> %s", (long long)x->l.n_global, total / 1e9,
          x->dtype, x->nshards, x->out);
  for (int s = 0; s < x->nshards; s++) GJ_TRY(write_shard(x, s));
  return write_meta(x, total);
}

int gj_cmd_random_hf(int argc, char **argv) {
  rhf x;
  memset(&x, 0, sizeof x);
  x.dtype = "bfloat16", x.shard_gb = 5, x.seed = 1234;
  gj_opt table[] = {
      {"out", GJ_OPT_STR, &x.out, "directory to write (created if missing), required", 1, 0},
      {"dtype", GJ_OPT_STR, &x.dtype, "bfloat16 or float32", 1, 0},
      {"shard-gb", GJ_OPT_F64, &x.shard_gb, "largest safetensors file, GB (several: with an index)", 0.001, 1e6},
      {"seed", GJ_OPT_I64, &x.seed, "seed of the weights", 0, 9e18},
      {NULL}};
  gj_modelopts mo;
  int rc = gj_modelopts_parse(&mo, argc, argv, table, "gptj random-hf --out DIR [--preset NAME] [model keys] [options]",
                              "Writes a GPT-J with random weights (initialised as GPT-J was trained) as a Hugging\n"
                              "Face directory: config.json and safetensors shards with their index, one tensor\n"
                              "at a time. For trying the 6B path without downloading the model.");
  if (rc) return rc > 0 ? 0 : rc;
  x.c = mo.config;
  rc = run(&x);
  rhf_free(&x);
  return rc;
}
