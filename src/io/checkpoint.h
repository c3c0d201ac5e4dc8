/* HDF5 checkpoints (DESIGN.md §5): one file, every tensor under its Hugging Face name with
 * its GLOBAL shape, written collectively with parallel HDF5 (each rank its slice), AdamW
 * moments beside them, a CRC32 per tensor (of the global row-major float32 bytes, so any
 * layout computes the same value), step / tokens / schedule / loader state / config as
 * attributes. Written under a temporary name, synced, renamed; `latest` updated last. */
#ifndef GJ_IO_CHECKPOINT_H
#define GJ_IO_CHECKPOINT_H

#include <stdint.h>

#include "common.h"
#include "io/loader.h"
#include "io/outfile.h"
#include "model/state.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

typedef struct {
  int64_t step;        /* training steps done */
  int64_t updates;     /* AdamW updates applied (AdamW's t): step less the skipped steps */
  int64_t tokens_seen;
  gj_loader_state loader;
  gj_adamw_hp hp;
  gj_schedule sched;
  int has_optim; /* set by gj_ckpt_load: the optimizer state, schedule and data order were loaded */
} gj_ckpt_meta;

/* Collective over g's world. compress: deflate level 0 (off) .. 9. */
int gj_ckpt_save(const char *path, gj_state *st, gj_grid *g, const gj_ckpt_meta *meta, int compress);
/* Collective. Loads parameters (and moments if with_optim) into this rank's slices, checking
 * every CRC, the format and the config against st->c (a mismatch names the key or tensor). */
int gj_ckpt_load(const char *path, gj_state *st, gj_grid *g, gj_ckpt_meta *meta, int with_optim);
/* Read the model config of a checkpoint (any rank, serial). */
int gj_ckpt_read_config(const char *path, gj_config *c);

/* An open HDF5 file, held by code that must not see HDF5 (an hid_t; -1 when closed). */
typedef int64_t gj_ckpt_file;

/* Streaming, serial writing of a model-only checkpoint (gptj convert): begin, one tensor at a
 * time under its HF name with its global shape, end (atomic rename). Loading such a file
 * restores the parameters and starts the optimizer, schedule and data order afresh. */
typedef struct {
  gj_ckpt_file f; /* out.tmp */
  gj_outfile out;
} gj_ckpt_writer;
/* end(ok) syncs and renames the temporary into place, end(!ok) removes it; a failed begin
 * leaves nothing to end. */
int gj_ckpt_writer_begin(gj_ckpt_writer *w, const char *path, const gj_config *c);
int gj_ckpt_writer_tensor(gj_ckpt_writer *w, const char *name, const float *data, int ndim,
                          int64_t rows, int64_t cols);
int gj_ckpt_writer_end(gj_ckpt_writer *w, int ok);

/* Serial reading of whole tensors of /model (gptj convert): open checks the format; each read
 * checks the tensor's shape and CRC. close is a no-op on a zeroed reader or one whose open
 * failed. */
typedef struct {
  gj_ckpt_file f;
  char path[GJ_PATH_BUF];
} gj_ckpt_reader;
int gj_ckpt_reader_open(gj_ckpt_reader *r, const char *path);
int gj_ckpt_reader_tensor(gj_ckpt_reader *r, const gj_tensor *t, float *out);
void gj_ckpt_reader_close(gj_ckpt_reader *r);

/* Print a checkpoint's metadata (gptj info). */
int gj_ckpt_info(const char *path);

#endif
