/* What a gptj HDF5 file holds, told by its root's "format" attribute: a checkpoint
 * ("gptj-mpi-checkpoint"), a token dataset ("gptj-mpi-tokens") or something else. For code
 * that must not see HDF5 (gptj info chooses what to print by it). */
#ifndef GJ_IO_FILEKIND_H
#define GJ_IO_FILEKIND_H

typedef enum { GJ_FILE_OTHER, GJ_FILE_CHECKPOINT, GJ_FILE_TOKENS } gj_filekind;

/* Fails only when path is not a readable HDF5 file (the message names it); a file without a
 * format attribute, or one that is not a string, is GJ_FILE_OTHER. */
int gj_filekind_of(const char *path, gj_filekind *kind);

#endif
