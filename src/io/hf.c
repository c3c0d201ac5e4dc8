#include "io/hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* How a JSON value that should have been an integer looks, for messages. */
static void json_what(json_t *v, char *out, size_t n) {
  if (json_is_real(v)) {
    /* the shortest digits that give the value back, with a decimal point: 64.0, not 64 */
    for (int p = 15; p <= 17; p++) {
      snprintf(out, n, "%.*g", p, json_real_value(v));
      if (strtod(out, NULL) == json_real_value(v)) break;
    }
    if (!strpbrk(out, ".eEin")) snprintf(out + strlen(out), n - strlen(out), ".0");
  }
  else if (json_is_string(v)) snprintf(out, n, "the string \"%.40s\"", json_string_value(v));
  else if (json_is_boolean(v)) snprintf(out, n, "%s", json_is_true(v) ? "true" : "false");
  else if (json_is_null(v)) snprintf(out, n, "null");
  else if (!v) snprintf(out, n, "nothing (missing)");
  else snprintf(out, n, "an %s", json_is_array(v) ? "array" : "object");
}

static int read_config(const char *dir, gj_config *c) {
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
    } else if (!v) {
      *ks[i].dst = -2; /* missing, not null: GPTJConfig's default */
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
  /* HF: n_inner None (GPTJConfig's default too) means 4 n_embd; rotary_dim None the whole
   * width n_embd (its one head's: several cannot run), and a config without it has
   * GPTJConfig's default, 64 */
  int rot_missing = c->rotary_dim == -2;
  if (c->rotary_dim == -1 && c->n_head > 1) /* transformers' table is n_embd wide, not a head's */
    return GJ_FAIL("%s: rotary_dim is null with n_head %lld: transformers then builds its rotary table over "
                   "n_embd (%lld), which runs one head only; give rotary_dim (%lld rotates whole heads)",
                   p, (long long)c->n_head, (long long)c->n_embd, (long long)(c->n_embd / c->n_head));
  if (c->n_inner < 0) c->n_inner = 4 * c->n_embd;
  if (c->rotary_dim == -1) c->rotary_dim = c->n_embd / c->n_head;
  if (rot_missing) c->rotary_dim = 64;
  if (!gj_config_validate(c)) return 0;
  if (!rot_missing || !strstr(gj_errmsg(), "rotary_dim")) return gj_err_prefix(p);
  char why[GJ_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", gj_errmsg());
  return GJ_FAIL("%s: %s (it has no 'rotary_dim': transformers' default is 64; null means the whole "
                 "width, for a model of one head)", p, why);
}

/* The shard files, from model.safetensors.index.json, or the single model.safetensors. */
static int open_files(gj_hf *h, const char *dir) {
  h->files = malloc(GJ_HF_MAX_SHARDS * sizeof *h->files);
  h->open = calloc(GJ_HF_MAX_SHARDS, sizeof *h->open);
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
    const char *k;
    json_t *v;
    /* O(entries x shards), the shards at most GJ_HF_MAX_SHARDS */
    json_object_foreach(wm, k, v) {
      if (!json_is_string(v) || strchr(json_string_value(v), '/'))
        return json_decref(r), GJ_FAIL("%s: weight_map['%s'] is not a file name", p, k);
      int found = 0;
      char f[GJ_PATH_BUF];
      if (gj_path_join(f, sizeof f, dir, json_string_value(v))) return json_decref(r), -1;
      for (int i = 0; i < h->nfiles; i++) found |= !strcmp(h->files[i], f);
      if (!found) {
        if (h->nfiles == GJ_HF_MAX_SHARDS)
          return json_decref(r), GJ_FAIL("%s: more than %d shards", p, GJ_HF_MAX_SHARDS);
        memcpy(h->files[h->nfiles++], f, sizeof f);
      }
    }
    json_decref(r);
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

int gj_hf_open(gj_hf *h, const char *dir, gj_config *c) {
  memset(h, 0, sizeof *h);
  snprintf(h->dir, sizeof h->dir, "%s", dir);
  int rc = gj_path_join(h->config, sizeof h->config, dir, "config.json");
  if (!rc) rc = read_config(dir, c);
  if (!rc) rc = open_files(h, dir);
  if (rc) gj_hf_close(h);
  return rc;
}

void gj_hf_close(gj_hf *h) {
  for (int i = 0; h->open && i < h->nfiles; i++) gj_st_close(&h->open[i]);
  free(h->files), free(h->open);
  h->files = NULL, h->open = NULL, h->nfiles = 0;
}

int gj_hf_inputs(const gj_hf *h, gj_file_ref *ins, int max) {
  int n = 0;
  if (n < max) ins[n++] = (gj_file_ref){"input", h->config};
  if (*h->index && n < max) ins[n++] = (gj_file_ref){"input", h->index};
  for (int i = 0; i < h->nfiles && n < max; i++) ins[n++] = (gj_file_ref){"input", h->files[i]};
  return n;
}

static int find(gj_hf *h, const char *name, gj_st_file **f, const gj_st_tensor **t) {
  for (int i = 0; i < h->nfiles; i++)
    if ((*t = gj_st_find(&h->open[i], name))) return *f = &h->open[i], 0;
  return GJ_FAIL("%s: tensor '%s' not found", h->nfiles == 1 ? h->files[0] : "the safetensors shards", name);
}

static int check_shape(const gj_st_file *f, const gj_st_tensor *st, const gj_tensor *t) {
  if (st->dtype == GJ_ST_OTHER)
    return GJ_FAIL("%s: tensor '%s': dtype %s is not supported for weights (F32, F16, BF16)", f->path, t->name, st->dtype_name);
  int ok = st->ndim == t->ndim && st->shape[0] == t->rows && (t->ndim == 1 || st->shape[1] == t->cols);
  if (!ok) {
    char want[64];
    if (t->ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)t->rows, (long long)t->cols);
    else snprintf(want, sizeof want, "[%lld]", (long long)t->rows);
    return GJ_FAIL("%s: tensor '%s' has the wrong shape for config.json (expected %s)", f->path, t->name, want);
  }
  return 0;
}

int gj_hf_check(gj_hf *h, const gj_layout *l) {
  int rc = 0;
  /* every tensor of the files must be one we know (HF's attention mask buffers excepted),
   * in one shard only; gj_layout_find is O(1), so this is linear in the tensors */
  int *seen = rc ? NULL : calloc((size_t)l->n, sizeof(int));
  if (!rc && !seen) rc = GJ_FAIL("out of memory");
  for (int i = 0; !rc && i < h->nfiles; i++)
    for (int j = 0; !rc && j < h->open[i].n; j++) {
      const char *nm = h->open[i].t[j].name;
      size_t n = strlen(nm);
      int buffer = (n > 9 && !strcmp(nm + n - 9, "attn.bias")) || (n > 16 && !strcmp(nm + n - 16, "attn.masked_bias"));
      const gj_tensor *lt = buffer ? NULL : gj_layout_find(l, nm);
      if (!buffer && !lt)
        rc = GJ_FAIL("%s: tensor '%s' is not part of a GPT-J of this config", h->files[i], nm);
      else if (lt && seen[lt - l->t])
        rc = GJ_FAIL("%s: tensor '%s' is also in %s", h->files[i], nm, h->files[seen[lt - l->t] - 1]);
      else if (lt)
        seen[lt - l->t] = i + 1;
    }
  free(seen);
  for (int i = 0; i < l->n && !rc; i++) {
    gj_st_file *f;
    const gj_st_tensor *st;
    rc = find(h, l->t[i].name, &f, &st);
    if (!rc) rc = check_shape(f, st, &l->t[i]);
  }
  return rc;
}

int gj_hf_read(gj_hf *h, const gj_tensor *t, float *out) {
  gj_st_file *f;
  const gj_st_tensor *st;
  GJ_TRY(find(h, t->name, &f, &st));
  GJ_TRY(check_shape(f, st, t));
  return gj_st_read_block_f32(f, st, t->row0, t->lrows, t->col0, t->lcols, out);
}

int gj_hf_read_rows(gj_hf *h, const gj_tensor *t, int64_t r0, int64_t nr, float *out) {
  gj_st_file *f;
  const gj_st_tensor *st;
  GJ_TRY(find(h, t->name, &f, &st));
  GJ_TRY(check_shape(f, st, t));
  if (r0 < 0 || nr < 0 || r0 + nr > t->lrows)
    return GJ_FAIL("internal: rows [%lld, %lld) of a slice of %lld rows", (long long)r0, (long long)(r0 + nr),
                   (long long)t->lrows);
  return gj_st_read_block_f32(f, st, t->row0 + r0, nr, t->col0, t->lcols, out);
}

/* config.json of HF's GPTJConfig for c */
static json_t *config_json(const gj_config *c, gj_st_dtype dt) {
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

int gj_hf_config_writable(const gj_config *c, const char *what) {
  if (c->rotary_dim == 0)
    return GJ_FAIL("%s: the model has rotary_dim 0 (no rotary embedding), which transformers' GPT-J cannot "
                   "run (it reads 0 as a table of n_embd and fails); keep it in gptj's format", what);
  return 0;
}

/* j as JSON into path, through a FILE of ours so that a failure says why (errno) */
static int dump_json(json_t *j, const char *path) {
  if (!j) return GJ_FAIL("%s: out of memory", path);
  FILE *f = fopen(path, "w");
  if (!f) return GJ_FAIL("%s: %s", path, strerror(errno));
  errno = 0;
  int bad = json_dumpf(j, f, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || fputc('\n', f) == EOF || fflush(f) != 0;
  int e = errno;
  bad |= fclose(f) != 0;
  if (bad && !e) e = errno;
  return bad ? GJ_FAIL("%s: write failed: %s", path, e ? strerror(e) : "out of memory") : 0;
}

int gj_hf_write_config(const char *path, const gj_config *c, gj_st_dtype dtype) {
  json_t *j = config_json(c, dtype);
  int rc = dump_json(j, path);
  json_decref(j);
  return rc;
}

int gj_hf_write_index(const char *path, const char *const *names, const char *const *files, int n,
                      uint64_t total_size) {
  json_t *j = json_object(), *wm = json_object();
  for (int i = 0; i < n; i++) json_object_set_new(wm, names[i], json_string(files[i]));
  json_object_set_new(j, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total_size));
  json_object_set_new(j, "weight_map", wm);
  int rc = dump_json(j, path);
  json_decref(j);
  return rc;
}

int gj_hf_make_dir(const char *dir, const char *what, int *made) {
  struct stat st;
  *made = 0;
  if (!mkdir(dir, 0755)) *made = 1, gj_tmp_register_dir(dir);
  else if (errno != EEXIST) return GJ_FAIL("%s %s: %s", what, dir, strerror(errno));
  if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return GJ_FAIL("%s %s: not a directory", what, dir);
  return 0;
}

void gj_hf_unmake_dir(const char *dir, int made) {
  gj_tmp_register_dir(NULL);
  if (made) rmdir(dir); /* fails, as it should, unless it is still empty */
}

int gj_hf_commit(gj_outfile *files, int n, gj_outfile *cfg) {
  gj_signals_hold(1);
  int rc = 0;
  if (unlink(cfg->path) && errno != ENOENT)
    rc = GJ_FAIL("%s: cannot remove the old one before renaming the new files into place: %s", cfg->path,
                 strerror(errno));
  for (int i = 0; i < n && !rc; i++) rc = gj_outfile_commit(&files[i]);
  if (!rc) rc = gj_outfile_commit(cfg);
  for (int i = 0; i < n; i++) gj_outfile_abort(&files[i]); /* those not renamed (no-op for the others) */
  gj_outfile_abort(cfg);
  gj_signals_hold(0);
  return rc;
}
