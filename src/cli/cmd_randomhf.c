/* gptj random-hf: a GPT-J of any shape with random weights (initialised as GPT-J was trained,
 * DESIGN.md §9), written as a Hugging Face directory: config.json and safetensors shards
 * (bfloat16 by default) with model.safetensors.index.json, one tensor at a time (memory: the
 * largest tensor), so that the 6B path runs here without downloading anything. */
#include <math.h>
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
  gj_outfile *outs;  /* [nshards + 1] the temporaries of the shards and the index, renamed together */
} rhf;

static void rhf_free(rhf *x) {
  for (int s = 0; x->outs && s <= x->nshards; s++) gj_outfile_abort(&x->outs[s]);
  free(x->buf), free(x->shard), free(x->files), free(x->outs);
  gj_layout_free(&x->l);
}

/* The shards for a limit of lim bytes: tensors in table order, a new shard when the next
 * tensor would pass the limit (shard: [l.n] or NULL); returns how many. */
static int count_shards(const rhf *x, uint64_t lim, int *shard) {
  uint64_t es = x->dt == GJ_ST_F32 ? 4 : 2, in = 0;
  int n = 1;
  for (int i = 0; i < x->l.n; i++) {
    uint64_t b = x->l.t[i].numel * es;
    if (in > 0 && in + b > lim) n++, in = 0;
    if (shard) shard[i] = n - 1;
    in += b;
  }
  return n;
}

static int plan_shards(rhf *x, uint64_t *total) {
  *total = 0;
  for (int i = 0; i < x->l.n; i++) *total += x->l.t[i].numel * (x->dt == GJ_ST_F32 ? 4 : 2);
  x->nshards = count_shards(x, (uint64_t)(x->shard_gb * 1e9), NULL);
  if (x->nshards > GJ_HF_MAX_SHARDS) {
    /* the least limit that gives few enough shards (fewer with a larger limit), in MB */
    uint64_t lo = (uint64_t)(x->shard_gb * 1e9), hi = *total;
    while (hi - lo > 1) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (count_shards(x, mid, NULL) > GJ_HF_MAX_SHARDS) lo = mid;
      else hi = mid;
    }
    double gb = ceil(hi / 1e6) / 1e3;
    while (count_shards(x, (uint64_t)(gb * 1e9), NULL) > GJ_HF_MAX_SHARDS) gb += 0.001;
    return GJ_FAIL("--shard-gb %g: %d shards, more than the %d a reader accepts; give --shard-gb %g or more",
                   x->shard_gb, x->nshards, GJ_HF_MAX_SHARDS, gb);
  }
  x->shard = malloc(x->l.n * sizeof(int));
  x->files = calloc(x->nshards, sizeof *x->files);
  x->outs = calloc(x->nshards + 1, sizeof *x->outs);
  if (!x->shard || !x->files || !x->outs) return GJ_FAIL("out of memory");
  count_shards(x, (uint64_t)(x->shard_gb * 1e9), x->shard);
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
    rc = gj_st_write_tensor(&w, t->name, x->buf, t->numel);
    if (!rc && gj_stop_pending()) rc = GJ_FAIL("stopped by %s", gj_signal_name(gj_stop_pending()));
  }
  if (begun && rc) gj_st_write_end(&w, 0);
  if (begun && !rc) rc = gj_st_write_close(&w);
  if (begun && !rc) x->outs[s] = w.out; /* complete: renamed with the others at the end */
  if (!rc) gj_info("random-hf: %s (%d tensors)", path, n);
  free(names), free(nd), free(sh);
  return rc;
}

/* config.json and, for several shards, the index, under temporary names; then every file is
 * renamed into place, config.json last (gj_hf_commit). */
static int write_meta(rhf *x, uint64_t total) {
  char p[GJ_PATH_BUF];
  gj_outfile cfg, *idx = &x->outs[x->nshards];
  GJ_TRY(gj_path_join(p, sizeof p, x->out, "config.json"));
  GJ_TRY(gj_outfile_begin(&cfg, p));
  int rc = gj_hf_write_config(cfg.tmp, &x->c, x->dt);
  const char **names = NULL, **files = NULL;
  if (!rc && x->nshards > 1) { /* the index: renamed after every shard it names */
    names = malloc(x->l.n * sizeof *names), files = malloc(x->l.n * sizeof *files);
    if (!names || !files) rc = GJ_FAIL("out of memory");
    for (int i = 0; !rc && i < x->l.n; i++) names[i] = x->l.t[i].name, files[i] = x->files[x->shard[i]];
    if (!rc) rc = gj_path_join(p, sizeof p, x->out, "model.safetensors.index.json");
    if (!rc) rc = gj_outfile_begin(idx, p);
    if (!rc) rc = gj_hf_write_index(idx->tmp, names, files, x->l.n, total);
  }
  free(names), free(files);
  if (!rc) rc = gj_hf_commit(x->outs, x->nshards + (x->nshards > 1), &cfg);
  gj_outfile_abort(&cfg);
  return rc;
}

static int run(rhf *x) {
  if (!x->out) return GJ_FAIL("--out: required");
  if (!strcmp(x->dtype, "bfloat16")) x->dt = GJ_ST_BF16;
  else if (!strcmp(x->dtype, "float32")) x->dt = GJ_ST_F32;
  else return GJ_FAIL("--dtype %s: expected bfloat16 or float32", x->dtype);
  GJ_TRY(gj_hf_config_writable(&x->c, "random-hf"));
  GJ_TRY(gj_layout_build(&x->l, &x->c, 1, 0));
  size_t mx = 0;
  for (int i = 0; i < x->l.n; i++) mx = GJ_MAX(mx, x->l.t[i].numel);
  GJ_TRY(gj_mem_check_local(8.0 * mx, "writing one tensor at a time"));
  x->buf = malloc(mx * sizeof(float));
  if (!x->buf) return GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  uint64_t total = 0;
  GJ_TRY(plan_shards(x, &total));
  int made = 0;
  GJ_TRY(gj_hf_make_dir(x->out, "--out", &made));
  struct stat st;
  char idx[GJ_PATH_BUF];
  int rc = gj_path_join(idx, sizeof idx, x->out, "model.safetensors.index.json");
  if (!rc && x->nshards == 1 && !lstat(idx, &st))
    rc = GJ_FAIL("--out %s: holds a sharded model (model.safetensors.index.json), which gptj would take "
                 "instead of the model.safetensors written here; remove it or give another directory", x->out);
  /* and the other way round: transformers takes a model.safetensors before an index */
  char one[GJ_PATH_BUF];
  if (!rc) rc = gj_path_join(one, sizeof one, x->out, "model.safetensors");
  if (!rc && x->nshards > 1 && !lstat(one, &st))
    rc = GJ_FAIL("--out %s: holds a single-file model (model.safetensors), which transformers would take "
                 "instead of the shards written here; remove it or give another directory", x->out);
  if (!rc)
    gj_info("random-hf: %lld parameters, %.2f GB of %s in %d file(s) -> %s", (long long)x->l.n_global,
            total / 1e9, x->dtype, x->nshards, x->out);
  /* Every file goes to its temporary, and only when all are complete are they renamed into
   * place: a failure or a stop while writing leaves the old directory as it was. The stop
   * signals are held meanwhile (the handler removes at most 16 temporaries) and looked at
   * between tensors; the temporaries are removed before a signal is let through. */
  gj_signals_hold(1);
  for (int s = 0; s < x->nshards && !rc; s++) rc = write_shard(x, s);
  if (!rc) rc = write_meta(x, total);
  for (int s = 0; s <= x->nshards; s++) gj_outfile_abort(&x->outs[s]);
  gj_hf_unmake_dir(x->out, rc ? made : 0);
  /* a stop signal ends the process as it is let through: say why first */
  if (rc && gj_stop_pending()) fprintf(stderr, "gptj random-hf: error: %s\n", gj_errmsg());
  gj_signals_hold(0);
  return rc;
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
  /* A plain process (MPI_Init fails under a file-size limit, which its tests set): under mpirun
   * with several ranks each would write the same files. Refused, said once (by rank 0). */
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *wr = getenv("OMPI_COMM_WORLD_RANK");
  long world = ws ? strtol(ws, NULL, 10) : 1;
  if (world > 1) {
    gj_log_set_world(wr ? (int)strtol(wr, NULL, 10) : 0, (int)world);
    return GJ_FAIL("random-hf is a plain process: run it without mpirun (here %ld ranks would each "
                   "write the same files)", world);
  }
  x.c = mo.config;
  rc = run(&x);
  rhf_free(&x);
  return rc;
}
