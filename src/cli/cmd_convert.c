/* gptj convert: Hugging Face GPT-J (config.json + safetensors, single or sharded; F32, F16 or
 * BF16) <-> gptj-mpi checkpoints, streaming one tensor at a time (memory: the largest tensor). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "io/outfile.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "parallel/comm.h"

/* --out must not replace any file it is converted from */
static int from_hf_plan(const gj_hf *h, const char *out) {
  gj_file_ref ins[GJ_HF_MAX_SHARDS + 2], o = {"--out", out};
  return gj_outfile_plan(&o, 1, ins, gj_hf_inputs(h, ins, GJ_HF_MAX_SHARDS + 2));
}

static int from_hf(const char *dir, const char *out) {
  gj_config c;
  gj_hf h;
  GJ_TRY(gj_hf_open(&h, dir, &c));
  gj_layout l;
  int rc = gj_layout_build(&l, &c, 1, 0);
  size_t mx = 0;
  for (int i = 0; !rc && i < l.n; i++) mx = GJ_MAX(mx, l.t[i].numel);
  if (!rc) rc = gj_mem_check_local(8.0 * mx, "converting one tensor at a time"); /* float32 + file buffer */
  float *buf = rc ? NULL : malloc(mx * sizeof(float));
  if (!rc && !buf) rc = GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  if (!rc) rc = gj_hf_check(&h, &l);
  gj_ckpt_writer w;
  int begun = 0;
  if (!rc) rc = from_hf_plan(&h, out);
  if (!rc) rc = gj_ckpt_writer_begin(&w, out, &c), begun = !rc;
  for (int i = 0; i < l.n && !rc; i++) {
    const gj_tensor *t = &l.t[i];
    rc = gj_hf_read(&h, t, buf);
    /* gptj refuses a checkpoint with such a value (eval --hf refuses the file): so does this */
    for (size_t k = 0; !rc && k < t->numel; k++)
      if (!isfinite(buf[k])) rc = GJ_FAIL("%s: tensor '%s' has a non-finite value", dir, t->name);
    if (!rc) rc = gj_ckpt_writer_tensor(&w, t->name, buf, t->ndim, t->rows, t->cols);
  }
  if (begun) {
    int e = gj_ckpt_writer_end(&w, !rc);
    if (!rc) rc = e;
  }
  if (!rc) gj_info("converted %s -> %s (%lld parameters, %d tensors)", dir, out, (long long)l.n_global, l.n);
  free(buf);
  gj_hf_close(&h);
  gj_layout_free(&l);
  return rc;
}


/* The directory of --to-hf exists (made if need be: *made), and neither output replaces the
 * checkpoint being read; a sharded model already there beside the new file would make two
 * models of the directory (gptj's reader takes the index, transformers the single file), so it
 * is refused too. */
static int to_hf_plan(const char *ckpt, const char *dir, const char *st_path, const char *cfg_path, int *made) {
  struct stat st;
  GJ_TRY(gj_hf_make_dir(dir, "--to-hf", made));
  char idx[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(idx, sizeof idx, dir, "model.safetensors.index.json"));
  if (!lstat(idx, &st))
    return GJ_FAIL("--to-hf %s: holds a sharded model (model.safetensors.index.json), which gptj would "
                   "take instead of the model.safetensors written here; remove it or give another directory", dir);
  gj_file_ref outs[2] = {{"output", st_path}, {"output", cfg_path}}, in = {"--checkpoint", ckpt};
  return gj_outfile_plan(outs, 2, &in, 1);
}

static const gj_tensor *sort_t;
static int by_name(const void *a, const void *b) { return strcmp(sort_t[*(const int *)a].name, sort_t[*(const int *)b].name); }

static int to_hf(const char *ckpt, const char *dir, const char *dtype) {
  gj_st_dtype dt;
  if (!strcmp(dtype, "float32")) dt = GJ_ST_F32;
  else if (!strcmp(dtype, "bfloat16")) dt = GJ_ST_BF16;
  else return GJ_FAIL("--dtype: expected float32 or bfloat16, got '%s'", dtype);
  char st_path[GJ_PATH_BUF], cfg_path[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(st_path, sizeof st_path, dir, "model.safetensors"));
  GJ_TRY(gj_path_join(cfg_path, sizeof cfg_path, dir, "config.json"));
  GJ_TRY(gj_outfile_check_input(ckpt, "--checkpoint", GJ_IN_SEEK));
  gj_config c;
  GJ_TRY(gj_ckpt_read_config(ckpt, &c));
  GJ_TRY(gj_hf_config_writable(&c, "--to-hf"));
  int made = 0;
  int rc = to_hf_plan(ckpt, dir, st_path, cfg_path, &made);
  /* from here on, one way out: everything below is freed at the end */
  gj_layout l = {0};
  if (!rc) rc = gj_layout_build(&l, &c, 1, 0);
  /* safetensors lists tensors by name; write the data in that (sorted) order */
  int n = rc ? 0 : l.n, *order = malloc(n * sizeof(int) + 1), *snd = malloc(n * sizeof(int) + 1);
  const char **sn = malloc(n * sizeof(char *) + 1);
  int64_t (*ssh)[2] = malloc(n * sizeof *ssh + 1);
  if (!rc && (!order || !snd || !sn || !ssh)) rc = GJ_FAIL("out of memory for %d tensor names", n);
  size_t mx = 0;
  for (int i = 0; !rc && i < n; i++) order[i] = i, mx = GJ_MAX(mx, l.t[i].numel);
  sort_t = l.t;
  if (!rc) qsort(order, n, sizeof(int), by_name);
  for (int i = 0; !rc && i < n; i++) {
    const gj_tensor *t = &l.t[order[i]];
    sn[i] = t->name, snd[i] = t->ndim, ssh[i][0] = t->rows, ssh[i][1] = t->cols;
  }
  if (!rc) rc = gj_mem_check_local(8.0 * mx, "converting one tensor at a time");
  float *buf = rc ? NULL : malloc(mx * sizeof(float));
  if (!rc && !buf) rc = GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  gj_ckpt_reader rd = {0};
  if (!rc) rc = gj_ckpt_reader_open(&rd, ckpt);
  /* Both files go to temporaries first (config.json, then the tensors); only when both are
   * complete are they renamed into place (gj_hf_commit: config.json last), so a failure leaves
   * the old ones as they were. */
  gj_outfile cfg = {0};
  if (!rc) rc = gj_outfile_begin(&cfg, cfg_path);
  if (!rc) rc = gj_hf_write_config(cfg.tmp, &c, dt);
  gj_st_writer w;
  int begun = 0;
  if (!rc) rc = gj_st_write_begin(&w, st_path, dt, n, sn, snd, (const int64_t(*)[2])ssh), begun = !rc;
  for (int i = 0; i < n && !rc; i++) {
    const gj_tensor *t = &l.t[order[i]];
    rc = gj_ckpt_reader_tensor(&rd, t, buf);
    if (!rc) rc = gj_st_write_tensor(&w, t->name, buf, t->numel);
  }
  if (begun && rc) gj_st_write_end(&w, 0);
  if (begun && !rc) rc = gj_st_write_close(&w);
  if (!rc) rc = gj_hf_commit(&w.out, 1, &cfg);
  else if (begun) gj_outfile_abort(&w.out);
  gj_outfile_abort(&cfg);
  gj_ckpt_reader_close(&rd);
  if (!rc) gj_info("converted %s -> %s (model.safetensors %s, config.json)", ckpt, dir, dtype);
  free(order), free(sn), free(snd), free(ssh), free(buf);
  gj_layout_free(&l);
  gj_hf_unmake_dir(dir, rc ? made : 0);
  return rc;
}

int gj_cmd_convert(int argc, char **argv) {
  const char *from = NULL, *to = NULL, *out = NULL, *ckpt = NULL, *dtype = NULL;
  gj_opt opts[] = {
      {"from-hf", GJ_OPT_STR, &from, "Hugging Face GPT-J directory to read (config.json + safetensors)", 1, 0},
      {"out", GJ_OPT_STR, &out, "checkpoint to write (with --from-hf)", 1, 0},
      {"to-hf", GJ_OPT_STR, &to, "Hugging Face directory to write", 1, 0},
      {"checkpoint", GJ_OPT_STR, &ckpt, "checkpoint to read (with --to-hf)", 1, 0},
      {"dtype", GJ_OPT_STR, &dtype, "with --to-hf: float32 (default) or bfloat16", 1, 0},
      {NULL}};
  gj_cmdline cl = {"gptj convert --from-hf DIR --out CKPT.h5 | --to-hf DIR --checkpoint CKPT.h5 [--dtype bfloat16]",
                   "Converts between Hugging Face GPT-J (config.json with model.safetensors, or sharded\n"
                   "with model.safetensors.index.json; F32, F16 or BF16) and gptj-mpi checkpoints,\n"
                   "one tensor at a time. A converted checkpoint holds weights only: training from it\n"
                   "(--resume FILE) starts the optimizer afresh.",
                   opts, NULL, NULL, NULL, 0};
  int np, rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  /* Under mpirun, rank 0 converts and the others wait for its outcome (one output, written
   * once); every rank ends with rank 0's code and message. */
  int world = gj_log_world();
  if (rc > 0) rc = 0; /* --help */
  else if (!rc && gj_log_rank() != 0) rc = 0;
  else if (!rc && !from == !to) rc = GJ_FAIL("give one of --from-hf or --to-hf");
  else if (!rc && from && (ckpt || dtype))
    rc = GJ_FAIL("--%s is an option of --to-hf, not of --from-hf (which writes --out)", ckpt ? "checkpoint" : "dtype");
  else if (!rc && to && out) rc = GJ_FAIL("--out is an option of --from-hf; --to-hf writes into its directory");
  else if (!rc && from) rc = out ? from_hf(from, out) : GJ_FAIL("--out: required with --from-hf");
  else if (!rc) rc = ckpt ? to_hf(ckpt, to, dtype ? dtype : "float32") : GJ_FAIL("--checkpoint: required with --to-hf");
  return world > 1 ? gj_agree_after_idle(gj_comm_world(), rc) : rc;
}
