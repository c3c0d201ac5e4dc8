/* Output and input files: the one rule for every file a gptj command writes, and the check
 * of the inputs every rank reads itself.
 *
 * An output is planned before any work (gj_outfile_plan: its directory exists, it is not a
 * directory, it names no input of the command and no other output of it), then written under
 * a temporary name beside it (<final>.tmp.<pid>, registered with gj_tmp_register so that a
 * stop signal removes it), synced, renamed into place and its directory synced
 * (gj_outfile_commit). Any failure removes the temporary (gj_outfile_abort) and leaves the
 * file that was there before untouched. */
#ifndef GJ_IO_OUTFILE_H
#define GJ_IO_OUTFILE_H

#include "common.h"

typedef struct {
  char path[GJ_PATH_BUF]; /* the final name */
  char tmp[GJ_PATH_BUF];  /* where the data goes until the commit */
  int active;             /* tmp is registered (and may exist) */
} gj_outfile;

/* A file of a command, named in messages as "<what> <path>" (what: "--out", "input", ...). */
typedef struct {
  const char *what;
  const char *path;
} gj_file_ref;

/* 1 if a and b name the same file: the same inode when both exist, the same real parent
 * directory and base name when neither does; 0 otherwise. */
int gj_outfile_same(const char *a, const char *b);

/* Check the outputs of a command before it starts: each one's directory exists, it is not
 * a directory, its temporary name fits, and it is neither one of the inputs nor another
 * output. Returns -1 with one line naming the clash. */
int gj_outfile_plan(const gj_file_ref *outs, int nout, const gj_file_ref *ins, int nin);

/* Choose and register the temporary name of path (nothing is created). */
int gj_outfile_begin(gj_outfile *o, const char *path);
/* The data is complete in o->tmp (closed): sync it, rename it to o->path, sync the
 * directory. On failure the temporary is removed. Either way o is finished. */
int gj_outfile_commit(gj_outfile *o);
/* Remove the temporary (if begun and not committed) and unregister it. */
void gj_outfile_abort(gj_outfile *o);

/* Check an input file before it is opened (what names it in the message: "--config", or
 * NULL for the path alone): it exists and is not a directory. Under mpirun with more than one
 * rank, where every rank reads it itself, it must be a regular file: a FIFO, a device or
 * stdin can be read by one process only. One rank may read a FIFO or a device, and "-"
 * (stdin) with GJ_IN_STDIN, unless the reader seeks (GJ_IN_SEEK: always a regular file). */
#define GJ_IN_STDIN 1
#define GJ_IN_SEEK 2
int gj_outfile_check_input(const char *path, const char *what, int flags);

#endif
