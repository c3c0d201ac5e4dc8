/* Move parameter blocks between HDF5 groups of Hugging Face-named tensors (global shapes)
 * and this rank's TP slices. */
#ifndef GJ_IO_WEIGHTS_H
#define GJ_IO_WEIGHTS_H

#include <hdf5.h>

#include "model/params.h"
#include "parallel/grid.h"

/* Read every tensor of the layout from <prefix><name> (e.g. "/weights/"), this rank's slice
 * only, into block base. */
int gj_weights_read(hid_t file, const char *fname, const char *prefix, const gj_layout *l,
                    float *base);
/* Gather tensor t of block base onto TP rank 0 as a global [rows, cols] array in out
 * (ignored on other ranks). Collective over the TP group. */
int gj_tensor_gather(gj_grid *g, const gj_tensor *t, const float *base, float *out);
/* Gather every tensor and write it under <prefix><name> on world rank 0 (file is only
 * used there). Collective over the TP group. */
int gj_weights_write_gathered(gj_grid *g, hid_t file, const char *prefix, const gj_layout *l,
                              const float *base);
#endif
