/* gptj convert: Hugging Face GPT-J (config.json + safetensors, single or sharded; F32, F16 or
 * BF16) <-> gptj-mpi checkpoints, streaming one tensor at a time (memory: the largest tensor). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/memcheck.h"
#include "common.h"
#include "io/checkpoint.h"
#include "io/outfile.h"
#include "io/safetensors.h"
#include "model/params.h"

#define MAX_SHARDS 256

/* How a JSON value that should have been an integer looks, for messages. */
static void json_what(json_t *v, char *out, size_t n) {
  if (json_is_real(v)) snprintf(out, n, "%.17g", json_real_value(v));
  else if (json_is_string(v)) snprintf(out, n, "the string \"%.40s\"", json_string_value(v));
  else if (json_is_boolean(v)) snprintf(out, n, "%s", json_is_true(v) ? "true" : "false");
  else if (json_is_null(v)) snprintf(out, n, "null");
  else if (!v) snprintf(out, n, "nothing (missing)");
  else snprintf(out, n, "an %s", json_is_array(v) ? "array" : "object");
}

static int read_hf_config(const char *dir, gj_config *c) {
  char p[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(p, sizeof p, dir, "config.json"));
  GJ_TRY(gj_outfile_check_input(p, NULL, GJ_IN_SEEK)); /* regular: a FIFO would block the read */
  json_error_t err;
  /* a key given twice would leave it open which value is meant */
  json_t *r = json_load_file(p, JSON_REJECT_DUPLICATES, &err);
  if (!r) return GJ_FAIL("%s: %s", p, err.text);
  if (!json_is_object(r)) return json_decref(r), GJ_FAIL("%s: not a JSON object", p);
  struct { const char *k; int64_t *dst; int required; } ks[] = {
      {"vocab_size", &c->vocab_size, 1}, {"n_positions", &c->n_positions, 1}, {"n_embd", &c->n_embd, 1},
      {"n_layer", &c->n_layer, 1}, {"n_head", &c->n_head, 1}, {"rotary_dim", &c->rotary_dim, 0},
      {"n_inner", &c->n_inner, 0}};
  int rc = 0;
  c->rotary_dim = c->n_inner = -1;
  /* integers only (4096.0, 64.5, "64" and true are refused); their ranges are
   * gj_config_validate's, as for every other source of a config */
  for (size_t i = 0; i < sizeof ks / sizeof ks[0] && !rc; i++) {
    json_t *v = json_object_get(r, ks[i].k);
    char what[96];
    if (json_is_integer(v)) {
      *ks[i].dst = json_integer_value(v);
      if (*ks[i].dst < 0) /* not to be taken for a missing value (-1 below) */
        rc = GJ_FAIL("%s: '%s' = %lld is negative", p, ks[i].k, (long long)*ks[i].dst);
    } else if (ks[i].required || (v && !json_is_null(v))) {
      json_what(v, what, sizeof what);
      rc = GJ_FAIL("%s: '%s' must be an integer, got %s", p, ks[i].k, what);
    }
  }
  json_t *eps = json_object_get(r, "layer_norm_epsilon");
  c->layer_norm_epsilon = 1e-5;
  if (!rc && eps && !json_is_null(eps)) {
    if (json_is_number(eps)) c->layer_norm_epsilon = json_number_value(eps);
    else rc = GJ_FAIL("%s: 'layer_norm_epsilon' must be a number", p);
  }
  json_t *act = json_object_get(r, "activation_function");
  if (!rc && act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu_new")))
    rc = GJ_FAIL("%s: activation_function must be gelu_new", p);
  json_t *tie = json_object_get(r, "tie_word_embeddings");
  if (!rc && json_is_true(tie)) rc = GJ_FAIL("%s: tie_word_embeddings is true; GPT-J's lm_head is untied", p);
  json_decref(r);
  if (rc) return rc;
  /* HF's None defaults, from values checked first (no division by zero, no overflow) */
  gj_config given = *c;
  if (given.n_inner < 0) given.n_inner = 1;
  if (given.rotary_dim < 0) given.rotary_dim = 0;
  if (gj_config_validate(&given)) return gj_err_prefix(p);
  if (c->n_inner < 0) c->n_inner = 4 * c->n_embd;              /* HF: None means 4 n_embd */
  if (c->rotary_dim < 0) c->rotary_dim = c->n_embd / c->n_head; /* None: the whole head */
  if (gj_config_validate(c)) return gj_err_prefix(p);
  return 0;
}

/* name -> shard file, from model.safetensors.index.json, or the single model.safetensors */
typedef struct {
  char (*files)[GJ_PATH_BUF]; /* MAX_SHARDS */
  gj_st_file *open;           /* MAX_SHARDS */
  int nfiles;
  json_t *map;
  char index[GJ_PATH_BUF];    /* model.safetensors.index.json, "" if none */
} hf_files;

static int hf_open(hf_files *h, const char *dir) {
  memset(h, 0, sizeof *h);
  h->files = malloc(MAX_SHARDS * sizeof *h->files);
  h->open = calloc(MAX_SHARDS, sizeof *h->open);
  if (!h->files || !h->open) return GJ_FAIL("out of memory");
  char p[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(p, sizeof p, dir, "model.safetensors.index.json"));
  struct stat st;
  if (!stat(p, &st)) {
    GJ_TRY(gj_outfile_check_input(p, NULL, GJ_IN_SEEK)); /* regular: a FIFO would block the read */
    snprintf(h->index, sizeof h->index, "%s", p);
    json_error_t err;
    json_t *r = json_load_file(p, JSON_REJECT_DUPLICATES, &err);
    if (!r) return GJ_FAIL("%s: %s", p, err.text);
    json_t *wm = json_object_get(r, "weight_map");
    if (!json_is_object(wm)) return json_decref(r), GJ_FAIL("%s: no weight_map object", p);
    h->map = json_incref(wm);
    json_decref(r);
    const char *k;
    json_t *v;
    /* O(entries x shards), the shards at most MAX_SHARDS */
    json_object_foreach(h->map, k, v) {
      if (!json_is_string(v) || strchr(json_string_value(v), '/'))
        return GJ_FAIL("%s: weight_map['%s'] is not a file name", p, k);
      int found = 0;
      char f[GJ_PATH_BUF];
      GJ_TRY(gj_path_join(f, sizeof f, dir, json_string_value(v)));
      for (int i = 0; i < h->nfiles; i++) found |= !strcmp(h->files[i], f);
      if (!found) {
        if (h->nfiles == MAX_SHARDS) return GJ_FAIL("%s: more than %d shards", p, MAX_SHARDS);
        memcpy(h->files[h->nfiles++], f, sizeof f);
      }
    }
  } else {
    GJ_TRY(gj_path_join(h->files[0], sizeof h->files[0], dir, "model.safetensors"));
    h->nfiles = 1;
  }
  for (int i = 0; i < h->nfiles; i++) {
    GJ_TRY(gj_outfile_check_input(h->files[i], NULL, GJ_IN_SEEK));
    GJ_TRY(gj_st_open(&h->open[i], h->files[i]));
  }
  return 0;
}

static void hf_close(hf_files *h) {
  for (int i = 0; h->open && i < h->nfiles; i++) gj_st_close(&h->open[i]);
  json_decref(h->map);
  free(h->files), free(h->open);
}

/* --out must not replace any file it is converted from */
static int from_hf_plan(const hf_files *h, const char *dir, const char *out) {
  gj_file_ref ins[MAX_SHARDS + 2], o = {"--out", out};
  char cfg[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(cfg, sizeof cfg, dir, "config.json"));
  int n = 0;
  ins[n++] = (gj_file_ref){"input", cfg};
  if (*h->index) ins[n++] = (gj_file_ref){"input", h->index};
  for (int i = 0; i < h->nfiles; i++) ins[n++] = (gj_file_ref){"input", h->files[i]};
  return gj_outfile_plan(&o, 1, ins, n);
}

static int hf_find(hf_files *h, const char *name, gj_st_file **f, const gj_st_tensor **t) {
  for (int i = 0; i < h->nfiles; i++)
    if ((*t = gj_st_find(&h->open[i], name))) return *f = &h->open[i], 0;
  return GJ_FAIL("%s: tensor '%s' not found", h->nfiles == 1 ? h->files[0] : "the safetensors shards", name);
}

static int from_hf(const char *dir, const char *out) {
  gj_config c;
  GJ_TRY(read_hf_config(dir, &c));
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, &c, 1, 0));
  hf_files h;
  int rc = hf_open(&h, dir);
  size_t mx = 0;
  for (int i = 0; i < l.n; i++) mx = GJ_MAX(mx, l.t[i].numel);
  if (!rc) rc = gj_mem_check_local(8.0 * mx, "converting one tensor at a time"); /* float32 + file buffer */
  float *buf = rc ? NULL : malloc(mx * sizeof(float));
  if (!rc && !buf) rc = GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  /* every tensor of the files must be one we know (HF's attention mask buffers excepted),
   * in one shard only; gj_layout_find is O(1), so this is linear in the tensors */
  int *seen = rc ? NULL : calloc((size_t)l.n, sizeof(int));
  if (!rc && !seen) rc = GJ_FAIL("out of memory");
  for (int i = 0; !rc && i < h.nfiles; i++)
    for (int j = 0; !rc && j < h.open[i].n; j++) {
      const char *nm = h.open[i].t[j].name;
      size_t n = strlen(nm);
      int buffer = (n > 9 && !strcmp(nm + n - 9, "attn.bias")) || (n > 16 && !strcmp(nm + n - 16, "attn.masked_bias"));
      const gj_tensor *lt = buffer ? NULL : gj_layout_find(&l, nm);
      if (!buffer && !lt)
        rc = GJ_FAIL("%s: tensor '%s' is not part of a GPT-J of this config", h.files[i], nm);
      else if (lt && seen[lt - l.t])
        rc = GJ_FAIL("%s: tensor '%s' is also in %s", h.files[i], nm, h.files[seen[lt - l.t] - 1]);
      else if (lt)
        seen[lt - l.t] = i + 1;
    }
  gj_ckpt_writer w;
  int begun = 0;
  if (!rc) rc = from_hf_plan(&h, dir, out);
  if (!rc) rc = gj_ckpt_writer_begin(&w, out, &c), begun = !rc;
  for (int i = 0; i < l.n && !rc; i++) {
    const gj_tensor *t = &l.t[i];
    gj_st_file *f = NULL;
    const gj_st_tensor *st = NULL;
    rc = hf_find(&h, t->name, &f, &st);
    if (rc) break;
    int ok = st->ndim == t->ndim && st->shape[0] == t->rows && (t->ndim == 1 || st->shape[1] == t->cols);
    if (!ok) {
      char want[64];
      if (t->ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)t->rows, (long long)t->cols);
      else snprintf(want, sizeof want, "[%lld]", (long long)t->rows);
      rc = GJ_FAIL("%s: tensor '%s' has the wrong shape for config.json (expected %s)", f->path, t->name, want);
      break;
    }
    rc = gj_st_read_f32(f, st, buf);
    if (!rc) rc = gj_ckpt_writer_tensor(&w, t->name, buf, t->ndim, t->rows, t->cols);
  }
  if (begun) {
    int e = gj_ckpt_writer_end(&w, !rc);
    if (!rc) rc = e;
  }
  if (!rc) gj_info("converted %s -> %s (%lld parameters, %d tensors)", dir, out, (long long)l.n_global, l.n);
  free(buf);
  free(seen);
  hf_close(&h);
  gj_layout_free(&l);
  return rc;
}

/* config.json of HF's GPTJConfig for c */
static json_t *hf_config_json(const gj_config *c, gj_st_dtype dt) {
  json_t *j = json_object();
  json_object_set_new(j, "architectures", json_pack("[s]", "GPTJForCausalLM"));
  json_object_set_new(j, "model_type", json_string("gptj"));
  json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(j, "n_positions", json_integer(c->n_positions));
  json_object_set_new(j, "n_embd", json_integer(c->n_embd));
  json_object_set_new(j, "n_layer", json_integer(c->n_layer));
  json_object_set_new(j, "n_head", json_integer(c->n_head));
  json_object_set_new(j, "rotary_dim", json_integer(c->rotary_dim));
  json_object_set_new(j, "n_inner", json_integer(c->n_inner));
  json_object_set_new(j, "layer_norm_epsilon", json_real(c->layer_norm_epsilon));
  json_object_set_new(j, "activation_function", json_string("gelu_new"));
  json_object_set_new(j, "resid_pdrop", json_real(0.0));
  json_object_set_new(j, "embd_pdrop", json_real(0.0));
  json_object_set_new(j, "attn_pdrop", json_real(0.0));
  json_object_set_new(j, "initializer_range", json_real(0.02));
  json_object_set_new(j, "bos_token_id", json_integer(50256));
  json_object_set_new(j, "eos_token_id", json_integer(50256));
  json_object_set_new(j, "tie_word_embeddings", json_false());
  json_object_set_new(j, "use_cache", json_true());
  json_object_set_new(j, "torch_dtype", json_string(dt == GJ_ST_F32 ? "float32" : "bfloat16"));
  return j;
}

/* The directory of --to-hf exists (made if need be), and neither output replaces the
 * checkpoint being read; a sharded model already there would shadow the new file (readers
 * prefer model.safetensors.index.json), so it is refused too. */
static int to_hf_plan(const char *ckpt, const char *dir, const char *st_path, const char *cfg_path) {
  struct stat st;
  if (mkdir(dir, 0755) && errno != EEXIST) return GJ_FAIL("--to-hf %s: %s", dir, strerror(errno));
  if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return GJ_FAIL("--to-hf %s: not a directory", dir);
  char idx[GJ_PATH_BUF];
  GJ_TRY(gj_path_join(idx, sizeof idx, dir, "model.safetensors.index.json"));
  if (!lstat(idx, &st))
    return GJ_FAIL("--to-hf %s: holds a sharded model (model.safetensors.index.json), which readers would "
                   "take instead of the model.safetensors written here; remove it or give another directory", dir);
  gj_file_ref outs[2] = {{"output", st_path}, {"output", cfg_path}}, in = {"--checkpoint", ckpt};
  return gj_outfile_plan(outs, 2, &in, 1);
}

static const char **sort_names;
static int by_name(const void *a, const void *b) { return strcmp(sort_names[*(const int *)a], sort_names[*(const int *)b]); }

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
  GJ_TRY(to_hf_plan(ckpt, dir, st_path, cfg_path));
  gj_layout l;
  GJ_TRY(gj_layout_build(&l, &c, 1, 0));
  const char **names = malloc(l.n * sizeof(char *));
  int *nd = malloc(l.n * sizeof(int));
  int64_t (*shapes)[2] = malloc(l.n * sizeof *shapes);
  size_t mx = 0;
  for (int i = 0; i < l.n; i++) {
    names[i] = l.t[i].name, nd[i] = l.t[i].ndim, shapes[i][0] = l.t[i].rows, shapes[i][1] = l.t[i].cols;
    mx = GJ_MAX(mx, l.t[i].numel);
  }
  /* safetensors lists tensors by name; write the data in that (sorted) order */
  int *order = malloc(l.n * sizeof(int));
  for (int i = 0; i < l.n; i++) order[i] = i;
  sort_names = names;
  qsort(order, l.n, sizeof(int), by_name);
  const char **sn = malloc(l.n * sizeof(char *));
  int *snd = malloc(l.n * sizeof(int));
  int64_t (*ssh)[2] = malloc(l.n * sizeof *ssh);
  for (int i = 0; i < l.n; i++)
    sn[i] = names[order[i]], snd[i] = nd[order[i]], ssh[i][0] = shapes[order[i]][0], ssh[i][1] = shapes[order[i]][1];
  int rc = gj_mem_check_local(8.0 * mx, "converting one tensor at a time");
  float *buf = rc ? NULL : malloc(mx * sizeof(float));
  if (!rc && !buf) rc = GJ_FAIL("out of memory for a tensor of %zu floats", mx);
  gj_ckpt_reader rd = {0};
  if (!rc) rc = gj_ckpt_reader_open(&rd, ckpt);
  /* Both files go to temporaries first (config.json, then the tensors); only when both are
   * complete are they renamed into place, so a failure leaves the old ones as they were. */
  gj_outfile cfg = {0};
  if (!rc) rc = gj_outfile_begin(&cfg, cfg_path);
  if (!rc) {
    json_t *j = hf_config_json(&c, dt);
    if (json_dump_file(j, cfg.tmp, JSON_INDENT(2) | JSON_SORT_KEYS))
      rc = GJ_FAIL("%s: write failed (disk full?)", cfg.tmp);
    json_decref(j);
  }
  gj_st_writer w;
  int begun = 0;
  if (!rc) rc = gj_st_write_begin(&w, st_path, dt, l.n, sn, snd, (const int64_t(*)[2])ssh), begun = !rc;
  for (int i = 0; i < l.n && !rc; i++) {
    const gj_tensor *t = &l.t[order[i]];
    rc = gj_ckpt_reader_tensor(&rd, t, buf);
    if (!rc) rc = gj_st_write_tensor(&w, buf, t->numel);
  }
  gj_signals_hold(1); /* model.safetensors and config.json both new, or both old */
  if (begun) {
    int e = gj_st_write_end(&w, !rc);
    if (!rc) rc = e;
  }
  if (!rc) rc = gj_outfile_commit(&cfg);
  gj_signals_hold(0);
  gj_outfile_abort(&cfg);
  gj_ckpt_reader_close(&rd);
  if (!rc) gj_info("converted %s -> %s (model.safetensors %s, config.json)", ckpt, dir, dtype);
  free(names), free(nd), free(shapes), free(order), free(sn), free(snd), free(ssh), free(buf);
  gj_layout_free(&l);
  return rc;
}

int gj_cmd_convert(int argc, char **argv) {
  const char *from = NULL, *to = NULL, *out = NULL, *ckpt = NULL, *dtype = "float32";
  gj_opt opts[] = {
      {"from-hf", GJ_OPT_STR, &from, "Hugging Face GPT-J directory to read (config.json + safetensors)", 1, 0},
      {"out", GJ_OPT_STR, &out, "checkpoint to write (with --from-hf)", 1, 0},
      {"to-hf", GJ_OPT_STR, &to, "Hugging Face directory to write", 1, 0},
      {"checkpoint", GJ_OPT_STR, &ckpt, "checkpoint to read (with --to-hf)", 1, 0},
      {"dtype", GJ_OPT_STR, &dtype, "with --to-hf: float32 or bfloat16", 1, 0},
      {NULL}};
  gj_cmdline cl = {"gptj convert --from-hf DIR --out CKPT.h5 | --to-hf DIR --checkpoint CKPT.h5 [--dtype bfloat16]",
                   "Converts between Hugging Face GPT-J (config.json with model.safetensors, or sharded\n"
                   "with model.safetensors.index.json; F32, F16 or BF16) and gptj-mpi checkpoints,\n"
                   "one tensor at a time. A converted checkpoint holds weights only: training from it\n"
                   "(--resume FILE) starts the optimizer afresh.",
                   opts, NULL, NULL, NULL, 0};
  int np;
  int rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) return rc > 0 ? 0 : rc;
  if (!from == !to) return GJ_FAIL("give one of --from-hf or --to-hf");
  if (from) {
    if (!out) return GJ_FAIL("--out: required with --from-hf");
    return from_hf(from, out);
  }
  if (!ckpt) return GJ_FAIL("--checkpoint: required with --to-hf");
  return to_hf(ckpt, to, dtype);
}
