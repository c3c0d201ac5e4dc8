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
  if (f < 0) return GJ_H5_FAIL("%s: cannot create (directory missing or not writable?)", tmp);
  int rc = 0;
  hsize_t n = n_tokens, chunk = n < TOKENS_CHUNK ? (n ? n : 1) : TOKENS_CHUNK;
  hid_t sp = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  H5Pset_deflate(dcpl, 4);
  H5Pset_obj_track_times(dcpl, 0);
  hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0)
    rc = GJ_H5_FAIL("%s: cannot write /tokens (disk full?)", tmp);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  hsize_t no = n_docs + 1;
  sp = H5Screate_simple(1, &no, NULL);
  hid_t dcpl2 = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl2, 0);
  d = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, sp, H5P_DEFAULT, dcpl2, H5P_DEFAULT);
  if (!rc && (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_offsets) < 0))
    rc = GJ_H5_FAIL("%s: cannot write /doc_offsets", tmp);
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
    if (rc) rc = GJ_H5_FAIL("%s: cannot write attributes", tmp);
  }
  if (H5Fclose(f) < 0 && !rc) rc = GJ_H5_FAIL("%s: cannot close (disk full?)", tmp);
  return rc;
}

/* Whether every element of 1-D dataset d (n > 0 elements) has storage in the file: all its
 * chunks (a compressed dataset's storage is smaller than its data, so H5Dget_space_status
 * cannot tell), or its whole contiguous block. */
static int fully_stored(hid_t d, int64_t n) {
  hid_t dcpl = H5Dget_create_plist(d), t = H5Dget_type(d);
  H5D_layout_t lay = dcpl < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(dcpl);
  size_t esz = t < 0 ? 0 : H5Tget_size(t);
  int ok = 0;
  if (lay == H5D_COMPACT) {
    ok = 1;
  } else if (lay == H5D_CONTIGUOUS) {
    ok = esz > 0 && H5Dget_storage_size(d) >= (hsize_t)n * esz;
  } else if (lay == H5D_CHUNKED) {
    hsize_t ch = 0, nc = 0;
    hid_t sp = H5Dget_space(d);
    ok = H5Pget_chunk(dcpl, 1, &ch) == 1 && ch > 0 && sp >= 0 &&
         H5Dget_num_chunks(d, sp, &nc) >= 0 && nc == ((hsize_t)n + ch - 1) / ch;
    if (sp >= 0) H5Sclose(sp);
  }
  if (t >= 0) H5Tclose(t);
  if (dcpl >= 0) H5Pclose(dcpl);
  return ok;
}

/* Open 1-D dataset `name` of n elements whose type is an unsigned integer of `bytes` bytes
 * (0: of at most 8), fully written (a file that only declares a huge dataset is refused
 * before anything is allocated for it). */
static int open_ids(hid_t f, const char *path, const char *name, int64_t n, size_t bytes,
                    const char *want, const char *count, hid_t *ds) {
  int nd;
  int64_t dims[4];
  GJ_TRY(gj_h5_shape(f, path, name, &nd, dims));
  if (nd != 1 || dims[0] != n) return GJ_FAIL("%s: %s does not hold %s = %lld entries", path, name, count, (long long)n);
  *ds = H5Dopen2(f, name, H5P_DEFAULT);
  if (*ds < 0) return GJ_H5_FAIL("%s: cannot open %s", path, name);
  hid_t t = H5Dget_type(*ds);
  char tn[64] = "unreadable";
  if (t >= 0) gj_h5_type_name(t, tn, sizeof tn);
  int ok = t >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE &&
           (bytes ? H5Tget_size(t) == bytes : H5Tget_size(t) <= 8);
  if (t >= 0) H5Tclose(t);
  int rc = 0;
  if (!ok) rc = GJ_FAIL("%s: %s is %s, expected %s", path, name, tn, want);
  else if (n > 0 && !fully_stored(*ds, n))
    rc = GJ_FAIL("%s: %s is not fully written (truncated or corrupted)", path, name);
  if (rc) H5Dclose(*ds), *ds = -1;
  return rc;
}

/* /tokens in slices of 64 Mi ids, so that a stop request (gptj train) ends a long read early. */
static int read_tokens(hid_t tk, const char *path, uint16_t *out, uint64_t n) {
  const uint64_t piece = (uint64_t)1 << 26;
  hid_t fs = H5Dget_space(tk);
  int rc = fs < 0 ? GJ_H5_FAIL("%s: cannot read /tokens (corrupted?)", path) : 0;
  for (uint64_t off = 0; off < n && !rc; off += piece) {
    if (gj_stop_signal()) {
      rc = (GJ_FAIL("stopped by %s while reading %s", gj_signal_name(gj_stop_signal()), path), GJ_STOPPED);
      break;
    }
    hsize_t start = off, count = GJ_MIN(piece, n - off);
    hid_t ms = H5Screate_simple(1, &count, NULL);
    if (ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
        H5Dread(tk, H5T_NATIVE_UINT16, ms, fs, H5P_DEFAULT, out + off) < 0)
      rc = GJ_H5_FAIL("%s: cannot read /tokens (truncated or corrupted)", path);
    if (ms >= 0) H5Sclose(ms);
  }
  if (fs >= 0) H5Sclose(fs);
  return rc;
}

int gj_dataset_read(gj_dataset *d, const char *path, int64_t max_vocab) {
  memset(d, 0, sizeof *d);
  snprintf(d->path, sizeof d->path, "%s", path);
  hid_t f;
  GJ_TRY(gj_h5_open_read(path, &f));
  /* every count read from the file is bounded (2^62) before it sizes anything */
  const int64_t big = (int64_t)1 << 62;
  int64_t nt, nd, nb, vs;
  int rc = gj_h5_attr_i64_in(f, path, "n_tokens", 0, big, &nt);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "n_docs", 0, big, &nd);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "n_bytes", 0, big, &nb);
  if (!rc) rc = gj_h5_attr_i64_in(f, path, "vocab_size", 1, 65536, &vs);
  /* the format, where recorded (files made by other tools may lack it) */
  char fmt[64] = "";
  int64_t ver = 1, eot = 0;
  if (!rc && H5Aexists(f, "format") > 0) rc = gj_h5_attr_str(f, path, "format", fmt, sizeof fmt);
  if (!rc && *fmt && strcmp(fmt, "gptj-mpi-tokens"))
    rc = GJ_FAIL("%s: attribute 'format' is '%s', not a gptj token dataset (gptj-mpi-tokens)", path, fmt);
  if (!rc && H5Aexists(f, "format_version") > 0) rc = gj_h5_attr_i64_in(f, path, "format_version", 1, 1, &ver);
  if (!rc && H5Aexists(f, "eot_id") > 0) rc = gj_h5_attr_i64_in(f, path, "eot_id", 0, INT32_MAX, &eot);
  /* every document has text before its EOT: tokens beyond the EOTs came from bytes */
  if (!rc && nt > nd && nb == 0)
    rc = GJ_FAIL("%s: attribute 'n_bytes' = 0 for %lld tokens of %lld documents", path, (long long)nt, (long long)nd);
  hid_t tk = -1, of = -1;
  if (!rc) rc = open_ids(f, path, "/tokens", nt, 2, "uint16 token ids", "n_tokens", &tk);
  if (!rc) rc = open_ids(f, path, "/doc_offsets", nd + 1, 0, "unsigned integer (uint64) offsets", "n_docs + 1", &of);
  size_t tb = 0, ob = 0;
  if (!rc && (gj_mul_size(&tb, (size_t)(nt ? nt : 1), sizeof(uint16_t)) ||
              gj_mul_size(&ob, (size_t)nd + 1, sizeof(uint64_t))))
    rc = GJ_FAIL("%s: %lld tokens or %lld documents do not fit in memory", path, (long long)nt, (long long)nd);
  double share = gj_mem_share_bytes(); /* every rank holds the whole dataset */
  if (!rc && share > 0 && (double)tb + ob > share) {
    char how[GJ_PATH_BUF + 64];
    gj_mem_describe(how, sizeof how);
    rc = GJ_FAIL("%s: its %lld tokens need %.2f GB in memory on every rank, %.2f GB are available per rank (%s)",
                 path, (long long)nt, ((double)tb + ob) / 1e9, share / 1e9, how);
  }
  if (!rc) {
    d->n_tokens = nt, d->n_docs = nd, d->n_bytes = nb, d->vocab_size = vs;
    d->tokens = malloc(tb);
    d->doc_offsets = malloc(ob);
    if (!d->tokens || !d->doc_offsets) rc = GJ_FAIL("%s: out of memory for %lld tokens", path, (long long)nt);
  }
  if (!rc && nt > 0) rc = read_tokens(tk, path, d->tokens, (uint64_t)nt);
  if (!rc && H5Dread(of, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d->doc_offsets) < 0)
    rc = GJ_H5_FAIL("%s: cannot read /doc_offsets (truncated or corrupted)", path);
  if (tk >= 0) H5Dclose(tk);
  if (of >= 0) H5Dclose(of);
  H5Fclose(f);
  /* document boundaries: 0 = o[0] <= o[1] <= ... <= o[n_docs] = n_tokens */
  if (!rc && d->doc_offsets[0] != 0)
    rc = GJ_FAIL("%s: /doc_offsets[0] = %llu, expected 0", path, (unsigned long long)d->doc_offsets[0]);
  for (uint64_t i = 1; !rc && i <= d->n_docs; i++)
    if (d->doc_offsets[i] < d->doc_offsets[i - 1])
      rc = GJ_FAIL("%s: /doc_offsets decreases at entry %llu (%llu after %llu)", path, (unsigned long long)i,
                   (unsigned long long)d->doc_offsets[i], (unsigned long long)d->doc_offsets[i - 1]);
  if (!rc && d->doc_offsets[d->n_docs] != d->n_tokens)
    rc = GJ_FAIL("%s: /doc_offsets ends at %llu, expected n_tokens = %llu", path,
                 (unsigned long long)d->doc_offsets[d->n_docs], (unsigned long long)d->n_tokens);
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
