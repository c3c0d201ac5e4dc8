/* A Hugging Face GPT-J directory (config.json, and model.safetensors or the shards named by
 * model.safetensors.index.json; F32, F16 or BF16), read one tensor (or one rank's slice of
 * one) at a time: gptj convert --from-hf, and eval and generate with --hf DIR. Everything is
 * checked before any tensor is read: config.json's keys (integers only, GPT-J's activation,
 * an untied lm_head) against the config bounds, every tensor of the files known to a GPT-J of
 * that config and in one shard only (HF's attention-mask buffers aside), every tensor of the
 * model present with its shape. */
#ifndef GJ_IO_HF_H
#define GJ_IO_HF_H

#include "io/outfile.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

#define GJ_HF_MAX_SHARDS 256

typedef struct {
  char dir[GJ_PATH_BUF];
  char config[GJ_PATH_BUF];   /* config.json */
  char index[GJ_PATH_BUF];    /* model.safetensors.index.json, "" if none */
  char (*files)[GJ_PATH_BUF]; /* [GJ_HF_MAX_SHARDS] */
  gj_st_file *open;           /* [GJ_HF_MAX_SHARDS] */
  int nfiles;
} gj_hf;

/* Read config.json into *c and open the safetensors files. On failure h is closed. */
int gj_hf_open(gj_hf *h, const char *dir, gj_config *c);
void gj_hf_close(gj_hf *h);
/* The files tensors are read from (config.json, the index, the shards) as inputs of a command
 * (for gj_outfile_plan): fills up to max entries, returns how many. */
int gj_hf_inputs(const gj_hf *h, gj_file_ref *ins, int max);
/* Every tensor of the files belongs to the table (built for the config, any TP rank) and is
 * in one shard only; every tensor of the table is in the files with its global shape. */
int gj_hf_check(gj_hf *h, const gj_layout *l);
/* This rank's slice of tensor t (t->lrows x t->lcols from (t->row0, t->col0)) as float32 into
 * out [t->numel]: only those bytes are read. */
int gj_hf_read(gj_hf *h, const gj_tensor *t, float *out);
/* Rows [r0, r0 + nr) of that slice (nr x t->lcols floats). */
int gj_hf_read_rows(gj_hf *h, const gj_tensor *t, int64_t r0, int64_t nr, float *out);

/* Whether transformers' GPT-J can run c: rotary_dim 0 (no rotary embedding, which gptj runs)
 * it cannot (it sizes its sin/cos table by n_embd when rotary_dim is 0 and fails on the empty
 * slice); what names the command's option in the error. */
int gj_hf_config_writable(const gj_config *c, const char *what);
/* config.json of Hugging Face's GPTJConfig for c (torch_dtype from dtype) written to path. */
int gj_hf_write_config(const char *path, const gj_config *c, gj_st_dtype dtype);
/* model.safetensors.index.json: tensor names[i] in file files[i] (a base name), total_size the
 * bytes of all tensors. */
int gj_hf_write_index(const char *path, const char *const *names, const char *const *files, int n,
                      uint64_t total_size);

/* The directory a command writes a model into (what: its flag, for messages), made if it is
 * missing (*made = 1 then; until unmake, a stop signal removes it if it is empty). unmake ends
 * that: after a failure (made: this command made it) it removes the directory if it is still
 * empty; after a success pass made = 0. */
int gj_hf_make_dir(const char *dir, const char *what, int *made);
void gj_hf_unmake_dir(const char *dir, int made);
/* Rename complete temporaries (files[n], then cfg: config.json) into place, the stop signals
 * held. The old config.json is removed before the first rename and the new one renamed in
 * last: a directory caught between two renames (a failed rename, a crash) has no config.json
 * and is not loadable, never a mix of the old model and the new. The temporaries not renamed
 * are removed. */
int gj_hf_commit(gj_outfile *files, int n, gj_outfile *cfg);

#endif
