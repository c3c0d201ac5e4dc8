/* The attributes of a checkpoint (DESIGN.md §5) in one table: the root's format, counters,
 * layout and model config, /optim's hyperparameters and schedule, /loader's data order. Each
 * entry has its name, type, field and the range a reader accepts; the writers, the readers,
 * the config check of a resume and gptj info all walk it, so that a key is spelled once. */
#ifndef GJ_IO_CKPTATTR_H
#define GJ_IO_CKPTATTR_H

#include <hdf5.h>

#include "io/checkpoint.h"
#include "model/config.h"

#define GJ_CKPT_FORMAT "gptj-mpi-checkpoint"
#define GJ_CKPT_VERSION 1

/* What the attributes hold. */
typedef struct {
  char format[64];    /* GJ_CKPT_FORMAT */
  int64_t format_version;
  gj_ckpt_meta meta;  /* step and tokens_seen (root), hp and sched (/optim), loader (/loader) */
  int64_t written_tp, written_dp;
  int64_t has_optim;  /* 0: weights only (gptj convert); a file without it has the optimizer */
  char precision[32]; /* the run's compute precision; "" is not written (gptj convert) */
  gj_config c;
} gj_ckpt_attrs;

/* Sets of entries, or-ed into masks. */
#define GJ_CA_FORMAT 1     /* format */
#define GJ_CA_VERSION 2    /* format_version */
#define GJ_CA_STATE 4      /* step, tokens_seen, updates */
#define GJ_CA_LAYOUT 8     /* written_tp, written_dp */
#define GJ_CA_HAS_OPTIM 16
#define GJ_CA_PRECISION 32
#define GJ_CA_CONFIG 64    /* the model config */
#define GJ_CA_ROOT 127     /* all of the above: the root's attributes */
#define GJ_CA_OPTIM 128    /* group /optim */
#define GJ_CA_LOADER 256   /* group /loader */
#define GJ_CA_ALL 511

/* Write the entries of the sets in mask (creating /optim and /loader as needed), in the
 * table's order. */
int gj_ckptattr_write(hid_t f, const gj_ckpt_attrs *a, int mask);
/* Read the entries of the sets in mask into a, each checked against its type and range; an
 * optional entry that is missing (has_optim, precision) keeps the value a had. path names
 * the file in messages. */
int gj_ckptattr_read(hid_t f, const char *path, gj_ckpt_attrs *a, int mask);
/* Read the entries of mask and compare each with run's: a mismatch names the key
 * ("<path>: checkpoint has n_embd = 64, this run has 128"). */
int gj_ckptattr_check(hid_t f, const char *path, const gj_ckpt_attrs *run, int mask);
/* Print the entries of mask, one "name: value" line each (gptj info). */
void gj_ckptattr_print(const gj_ckpt_attrs *a, int mask);

#endif
