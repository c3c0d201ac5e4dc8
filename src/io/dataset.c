#include "io/dataset.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "io/h5util.h"
#include "io/outfile.h"
#include "io/tokenizer.h"

#define TOKENS_CHUNK ((hsize_t)1 << 20)

int gj_dataset_write(const char *path, const uint16_t *tokens, uint64_t n_tokens,
                     const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                     const char *source) {
  gj_outfile o;
  GJ_TRY(gj_outfile_begin(&o, path));
  int rc = gj_dataset_write_tmp(&o, tokens, n_tokens, doc_offsets, n_docs, n_bytes, source);
  if (rc) gj_outfile_abort(&o);
  else rc = gj_outfile_commit(&o);
  return rc;
}

int gj_dataset_write_tmp(gj_outfile *o, const uint16_t *tokens, uint64_t n_tokens,
                         const uint64_t *doc_offsets, uint64_t n_docs, uint64_t n_bytes,
                         const char *source) {
  const char *tmp = o->tmp;
  gj_h5_quiet();
  /* No timestamps in object headers: the same input gives the same bytes. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  H5Pset_obj_track_times(fcpl, 0);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl);
  H5Pclose(fcpl), H5Pclose(fapl);
  if (f < 0) return GJ_FAIL("%s: cannot create (directory missing or not writable?)", tmp);
  int rc = 0;
  hsize_t n = n_tokens, chunk = n < TOKENS_CHUNK ? (n ? n : 1) : TOKENS_CHUNK;
  hid_t sp = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  H5Pset_deflate(dcpl, 4);
  H5Pset_obj_track_times(dcpl, 0);
  hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0)
    rc = GJ_FAIL("%s: cannot write /tokens (disk full?)", tmp);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  hsize_t no = n_docs + 1;
  sp = H5Screate_simple(1, &no, NULL);
  hid_t dcpl2 = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl2, 0);
  d = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, sp, H5P_DEFAULT, dcpl2, H5P_DEFAULT);
  if (!rc && (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_offsets) < 0))
    rc = GJ_FAIL("%s: cannot write /doc_offsets", tmp);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp), H5Pclose(dcpl), H5Pclose(dcpl2);
  if (!rc) {
    rc |= gj_h5_write_attr_str(f, "format", "gptj-mpi-tokens");
    rc |= gj_h5_write_attr_i64(f, "format_version", 1);
    rc |= gj_h5_write_attr_str(f, "tokenizer", "gpt2");
    rc |= gj_h5_write_attr_i64(f, "vocab_size", 50257);
    rc |= gj_h5_write_attr_i64(f, "eot_id", GJ_EOT_ID);
    rc |= gj_h5_write_attr_str(f, "source", source);
    rc |= gj_h5_write_attr_i64(f, "n_docs", (int64_t)n_docs);
    rc |= gj_h5_write_attr_i64(f, "n_tokens", (int64_t)n_tokens);
    rc |= gj_h5_write_attr_i64(f, "n_bytes", (int64_t)n_bytes);
    if (rc) rc = GJ_FAIL("%s: cannot write attributes", tmp);
  }
  if (H5Fclose(f) < 0 && !rc) rc = GJ_FAIL("%s: cannot close (disk full?)", tmp);
  return rc;
}

int gj_dataset_read(gj_dataset *d, const char *path, int64_t max_vocab) {
  memset(d, 0, sizeof *d);
  snprintf(d->path, sizeof d->path, "%s", path);
  hid_t f;
  GJ_TRY(gj_h5_open_read(path, &f));
  int64_t nt, nd, nb, vs;
  int rc = gj_h5_attr_i64(f, path, "n_tokens", &nt);
  if (!rc) rc = gj_h5_attr_i64(f, path, "n_docs", &nd);
  if (!rc) rc = gj_h5_attr_i64(f, path, "n_bytes", &nb);
  if (!rc) rc = gj_h5_attr_i64(f, path, "vocab_size", &vs);
  if (!rc && (nt < 0 || nd < 0 || nb < 0 || vs <= 0 || vs > 65536))
    rc = GJ_FAIL("%s: inconsistent attributes (not a gptj token dataset?)", path);
  if (!rc) {
    d->n_tokens = nt, d->n_docs = nd, d->n_bytes = nb, d->vocab_size = vs;
    d->tokens = malloc((nt ? nt : 1) * sizeof(uint16_t));
    d->doc_offsets = malloc((nd + 1) * sizeof(uint64_t));
    if (!d->tokens || !d->doc_offsets) rc = GJ_FAIL("%s: out of memory for %lld tokens", path, (long long)nt);
  }
  if (!rc) {
    int nd_;
    int64_t dims[4];
    rc = gj_h5_shape(f, path, "/tokens", &nd_, dims);
    if (!rc && (nd_ != 1 || dims[0] != nt)) rc = GJ_FAIL("%s: /tokens does not hold n_tokens = %lld ids", path, (long long)nt);
    hid_t ds = rc ? -1 : H5Dopen2(f, "/tokens", H5P_DEFAULT);
    if (!rc && H5Dread(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, d->tokens) < 0)
      rc = GJ_FAIL("%s: cannot read /tokens (truncated or corrupted)", path);
    if (ds >= 0) H5Dclose(ds);
  }
  if (!rc) {
    int nd_;
    int64_t dims[4];
    rc = gj_h5_shape(f, path, "/doc_offsets", &nd_, dims);
    if (!rc && (nd_ != 1 || dims[0] != nd + 1)) rc = GJ_FAIL("%s: /doc_offsets does not hold n_docs + 1 entries", path);
    hid_t ds = rc ? -1 : H5Dopen2(f, "/doc_offsets", H5P_DEFAULT);
    if (!rc && H5Dread(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d->doc_offsets) < 0)
      rc = GJ_FAIL("%s: cannot read /doc_offsets (truncated or corrupted)", path);
    if (ds >= 0) H5Dclose(ds);
  }
  H5Fclose(f);
  int64_t lim = max_vocab > 0 ? max_vocab : vs;
  for (uint64_t i = 0; !rc && i < d->n_tokens; i++)
    if (d->tokens[i] >= lim)
      rc = GJ_FAIL("%s: token %llu has id %u, not below the vocabulary size %lld", path,
                   (unsigned long long)i, d->tokens[i], (long long)lim);
  if (rc) gj_dataset_free(d);
  return rc;
}

void gj_dataset_free(gj_dataset *d) {
  free(d->tokens);
  free(d->doc_offsets);
  d->tokens = NULL, d->doc_offsets = NULL;
}
