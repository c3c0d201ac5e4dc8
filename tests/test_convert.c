/* gptj convert: golden weights written as Hugging Face safetensors (by a small generator here,
 * independent of the library's writer) convert to a checkpoint that reproduces the golden
 * logits and greedy ids; --to-hf then --from-hf round-trips bit-exactly; sharded input;
 * float16/bfloat16 inputs become the nearest float32 exactly; bfloat16 output rounds to
 * nearest even; inconsistent files are refused with one clear line; eval and generate read a
 * Hugging Face directory directly (--hf), at TP 1 and 2, as the converted checkpoint. */
#include <check.h>
#include <hdf5.h>
#include <jansson.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"
#include "io/dataset.h"
#include "io/h5util.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "testutil.h"

static char B_[1024], S_[1024], OUT[1200], GOLD[1200];
static gj_config cfg;
static gj_layout lay;

#define sh tu_sh

static float *golden_tensor(const gj_tensor *t) {
  hid_t f = H5Fopen(GOLD, H5F_ACC_RDONLY, H5P_DEFAULT);
  char p[300];
  snprintf(p, sizeof p, "/weights/%s", t->name);
  hid_t d = H5Dopen2(f, p, H5P_DEFAULT);
  float *v = malloc(t->numel * sizeof(float));
  H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d), H5Fclose(f);
  return v;
}

static void write_config(const char *dir) {
  FILE *f;
  char p[1400];
  snprintf(p, sizeof p, "%s/config.json", dir);
  f = fopen(p, "w");
  fprintf(f, "{\"architectures\": [\"GPTJForCausalLM\"], \"model_type\": \"gptj\", \"vocab_size\": %lld, "
          "\"n_positions\": %lld, \"n_embd\": %lld, \"n_layer\": %lld, \"n_head\": %lld, \"rotary_dim\": %lld, "
          "\"n_inner\": %lld, \"layer_norm_epsilon\": 1e-05, \"activation_function\": \"gelu_new\", "
          "\"tie_word_embeddings\": false}\n",
          (long long)cfg.vocab_size, (long long)cfg.n_positions, (long long)cfg.n_embd,
          (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.rotary_dim, (long long)cfg.n_inner);
  fclose(f);
}

/* Write tensors [first, last) of the layout as one safetensors file (F32), in layout order;
 * with buffers, after them each layer's attention-mask buffers as transformers before 4.31
 * saved them (attn.bias [1, 1, P, P] BOOL, U8 in older versions; attn.masked_bias [] of dtype
 * buffers: F32, or another of one byte an element). */
static void write_st_buffers(const char *path, int first, int last, const char *buffers) {
  json_t *h = json_object();
  uint64_t off = 0;
  for (int i = first; i < last; i++) {
    const gj_tensor *t = &lay.t[i];
    json_t *sh_ = t->ndim == 2 ? json_pack("[II]", (json_int_t)t->rows, (json_int_t)t->cols)
                               : json_pack("[I]", (json_int_t)t->rows);
    json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[II]}", "dtype", "F32", "shape", sh_,
                                              "data_offsets", (json_int_t)off,
                                              (json_int_t)(off + 4 * t->numel)));
    off += 4 * t->numel;
  }
  const json_int_t P = cfg.n_positions;
  for (int l = 0; buffers && l < cfg.n_layer; l++) {
    char nm[128];
    snprintf(nm, sizeof nm, "transformer.h.%d.attn.bias", l);
    json_object_set_new(h, nm, json_pack("{s:s, s:[IIII], s:[II]}", "dtype", l % 2 ? "U8" : "BOOL", "shape",
                                         (json_int_t)1, (json_int_t)1, P, P, "data_offsets", (json_int_t)off,
                                         (json_int_t)(off + P * P)));
    off += (uint64_t)(P * P);
    snprintf(nm, sizeof nm, "transformer.h.%d.attn.masked_bias", l);
    json_int_t mb = strcmp(buffers, "F32") ? 1 : 4;
    json_object_set_new(h, nm, json_pack("{s:s, s:[], s:[II]}", "dtype", buffers, "shape", "data_offsets",
                                         (json_int_t)off, (json_int_t)(off + mb)));
    off += (uint64_t)mb;
  }
  char *txt = json_dumps(h, JSON_COMPACT);
  uint64_t hl = strlen(txt);
  FILE *f = fopen(path, "wb");
  for (int i = 0; i < 8; i++) fputc((int)(hl >> (8 * i)) & 0xff, f);
  fwrite(txt, 1, hl, f);
  for (int i = first; i < last; i++) {
    float *v = golden_tensor(&lay.t[i]);
    fwrite(v, 4, lay.t[i].numel, f);
    free(v);
  }
  for (int l = 0; buffers && l < cfg.n_layer; l++) {
    for (json_int_t r = 0; r < P; r++)
      for (json_int_t c = 0; c < P; c++) fputc(c <= r, f);
    float mb = -1e9f;
    fwrite(&mb, strcmp(buffers, "F32") ? 1 : 4, 1, f);
  }
  fclose(f);
  free(txt);
  json_decref(h);
}

static void write_st(const char *path, int first, int last) { write_st_buffers(path, first, last, NULL); }

static void make_hf(const char *dir) {
  char p[1400];
  sh("rm -rf %s && mkdir -p %s", dir, dir);
  write_config(dir);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  write_st(p, 0, lay.n);
}

/* every /model tensor of two checkpoints, bit for bit */
static void same_models(const char *a, const char *b) {
  hid_t fa = H5Fopen(a, H5F_ACC_RDONLY, H5P_DEFAULT), fb = H5Fopen(b, H5F_ACC_RDONLY, H5P_DEFAULT);
  ck_assert(fa >= 0 && fb >= 0);
  for (int i = 0; i < lay.n; i++) {
    char p[300];
    snprintf(p, sizeof p, "/model/%s", lay.t[i].name);
    float *x = malloc(lay.t[i].numel * 4), *y = malloc(lay.t[i].numel * 4);
    hid_t da = H5Dopen2(fa, p, H5P_DEFAULT), db = H5Dopen2(fb, p, H5P_DEFAULT);
    ck_assert(da >= 0 && db >= 0);
    H5Dread(da, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dread(db, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
    ck_assert_msg(!memcmp(x, y, lay.t[i].numel * 4), "%s differs", p);
    H5Dclose(da), H5Dclose(db);
    free(x), free(y);
  }
  H5Fclose(fa), H5Fclose(fb);
}

START_TEST(test_from_hf_golden) {
  char hf[1300];
  snprintf(hf, sizeof hf, "%s/hf", OUT);
  make_hf(hf);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/ck.h5 >/dev/null", B_, hf, OUT), 0);
  ck_assert_int_eq(sh("%s/tests/golden-run --weights %s/ck.h5 %s %s/conv-out.h5 >/dev/null", B_, OUT, GOLD, OUT), 0);
  /* logits and greedy ids of the converted model equal the golden ones */
  hid_t r = H5Fopen(GOLD, H5F_ACC_RDONLY, H5P_DEFAULT);
  char p[1300];
  snprintf(p, sizeof p, "%s/conv-out.h5", OUT);
  hid_t c = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
  size_t n = 2 * 16 * cfg.vocab_size;
  double *lr = tu_dalloc(n), *lc = tu_dalloc(n), num = 0, den = 0;
  hid_t d1 = H5Dopen2(r, "/outputs/logits", H5P_DEFAULT), d2 = H5Dopen2(c, "/outputs/logits", H5P_DEFAULT);
  H5Dread(d1, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, lr);
  H5Dread(d2, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, lc);
  for (size_t i = 0; i < n; i++) num += (lr[i] - lc[i]) * (lr[i] - lc[i]), den += lr[i] * lr[i];
  ck_assert_double_le(sqrt(num / den), 1e-5);
  int32_t g1[17], g2[17];
  H5Dclose(d1), H5Dclose(d2);
  d1 = H5Dopen2(r, "/generate/greedy_ids", H5P_DEFAULT), d2 = H5Dopen2(c, "/generate/greedy_ids", H5P_DEFAULT);
  H5Dread(d1, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, g1);
  H5Dread(d2, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, g2);
  ck_assert(!memcmp(g1, g2, sizeof g1));
  H5Dclose(d1), H5Dclose(d2), H5Fclose(r), H5Fclose(c);
  free(lr), free(lc);
  /* --to-hf, then --from-hf: bit-exact */
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hf2 --checkpoint %s/ck.h5 >/dev/null", B_, OUT, OUT), 0);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s/hf2 --out %s/ck2.h5 >/dev/null", B_, OUT, OUT), 0);
  char a[1300], b[1300];
  snprintf(a, sizeof a, "%s/ck.h5", OUT), snprintf(b, sizeof b, "%s/ck2.h5", OUT);
  same_models(a, b);
  ck_assert_int_eq(sh("grep -q '\"architectures\"' %s/hf2/config.json && grep -q GPTJForCausalLM %s/hf2/config.json", OUT, OUT), 0);
  /* sharded input with an index */
  char hs[1300], p2[1400];
  snprintf(hs, sizeof hs, "%s/hfs", OUT);
  sh("rm -rf %s && mkdir -p %s", hs, hs);
  write_config(hs);
  int half = lay.n / 2;
  snprintf(p2, sizeof p2, "%s/model-00001-of-00002.safetensors", hs);
  write_st(p2, 0, half);
  snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", hs);
  write_st_buffers(p2, half, lay.n, "F32"); /* with HF's attention-mask buffers: skipped */
  json_t *idx = json_object(), *wm = json_object();
  for (int i = 0; i < lay.n; i++)
    json_object_set_new(wm, lay.t[i].name, json_string(i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors"));
  for (int l = 0; l < cfg.n_layer; l++) {
    char nm[128];
    snprintf(nm, sizeof nm, "transformer.h.%d.attn.bias", l);
    json_object_set_new(wm, nm, json_string("model-00002-of-00002.safetensors"));
    snprintf(nm, sizeof nm, "transformer.h.%d.attn.masked_bias", l);
    json_object_set_new(wm, nm, json_string("model-00002-of-00002.safetensors"));
  }
  json_object_set_new(idx, "weight_map", wm);
  snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", hs);
  json_dump_file(idx, p2, 0);
  json_decref(idx);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/ck3.h5 >/dev/null", B_, hs, OUT), 0);
  snprintf(b, sizeof b, "%s/ck3.h5", OUT);
  same_models(a, b);
  /* bfloat16 output: round to nearest even of every value */
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfb --checkpoint %s/ck.h5 --dtype bfloat16 >/dev/null", B_, OUT, OUT), 0);
  gj_st_file st;
  snprintf(p2, sizeof p2, "%s/hfb/model.safetensors", OUT);
  ck_assert_int_eq(gj_st_open(&st, p2), 0);
  const gj_tensor *t = gj_layout_find(&lay, "transformer.h.1.mlp.fc_in.weight");
  const gj_st_tensor *tt = gj_st_find(&st, t->name);
  ck_assert_ptr_nonnull(tt);
  ck_assert_int_eq(tt->dtype, GJ_ST_BF16);
  float *got = malloc(t->numel * 4), *orig = golden_tensor(t);
  ck_assert_int_eq(gj_st_read_f32(&st, tt, got), 0);
  for (size_t i = 0; i < t->numel; i++) {
    /* the nearest bfloat16, ties to even, found by looking at both neighbours */
    uint32_t u;
    memcpy(&u, &orig[i], 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4), memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)orig[i] - flo), dhi = fabs((double)fhi - orig[i]);
    float want = dlo < dhi ? flo : dhi < dlo ? fhi : (((lo >> 16) & 1) ? fhi : flo);
    ck_assert_msg(got[i] == want, "bf16 of %.9g: %.9g, expected %.9g", orig[i], got[i], want);
  }
  free(got), free(orig);
  gj_st_close(&st);
}
END_TEST

START_TEST(test_half_inputs_exact) {
  /* every 16-bit pattern that is a finite number */
  for (uint32_t b = 0; b < 65536; b++) {
    int e = (b >> 10) & 31, m = b & 1023, s = b >> 15;
    if (e != 31) {
      double want = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
      if (s) want = -want;
      ck_assert_msg(gj_f16_to_f32((uint16_t)b) == (float)want, "f16 0x%04x", b);
    }
    int be = (b >> 7) & 255, bm = b & 127;
    if (be != 255) {
      double want = be == 0 ? ldexp(bm, -133) : ldexp(128 + bm, be - 134);
      if (s) want = -want;
      ck_assert_msg(gj_bf16_to_f32((uint16_t)b) == (float)want, "bf16 0x%04x", b);
    }
  }
  ck_assert(isinf(gj_f16_to_f32(0x7c00)) && isnan(gj_f16_to_f32(0x7e00)));
}
END_TEST

static void expect_error(const char *dir, const char *want) {
  char log[1300];
  snprintf(log, sizeof log, "%s/err.log", OUT);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/bad.h5 2>%s", B_, dir, OUT, log), 1);
  ck_assert_int_eq(sh("test $(wc -l < %s) -eq 1 && grep -q -- \"%s\" %s", log, want, log), 0);
  ck_assert_int_ne(sh("test -e %s/bad.h5", OUT), 0);
}

START_TEST(test_bad_files) {
  char d[1300], p[1400];
  snprintf(d, sizeof d, "%s/hfbad", OUT);
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  /* header length beyond the file */
  make_hf(d);
  sh("printf '\\xff\\xff\\xff\\x00\\x00\\x00\\x00\\x00' | dd of=%s bs=1 count=8 conv=notrunc status=none", p);
  expect_error(d, "does not fit in the file");
  /* truncated data: offsets beyond the end */
  make_hf(d);
  sh("truncate -s -1000 %s", p);
  expect_error(d, "data_offsets outside");
  /* a config that disagrees with the tensors */
  make_hf(d);
  sh("sed -i 's/\"n_inner\": [0-9]*/\"n_inner\": 128/' %s/config.json", d);
  expect_error(d, "wrong shape for config.json");
  /* header that is not JSON */
  make_hf(d);
  sh("printf 'xxxxxxxx' | dd of=%s bs=1 seek=8 count=8 conv=notrunc status=none", p);
  expect_error(d, "not a JSON object");
  /* a missing directory */
  expect_error("/nonexistent-dir", "/nonexistent-dir/config.json");
}
END_TEST


/* A header of many small tensors (offsets in the reverse order of the names) opens in time
 * linear in its size, and every tensor is found: the overlap check and the lookups must not
 * be quadratic (this took minutes before they were). */
START_TEST(test_many_tensors) {
  enum { N = 200000 };
  char p[1400];
  snprintf(p, sizeof p, "%s/many.safetensors", OUT);
  json_t *h = json_object();
  char nm[64];
  for (int i = 0; i < N; i++) {
    snprintf(nm, sizeof nm, "t.%d.w", i);
    json_int_t off = 4 * (json_int_t)(N - 1 - i);
    json_object_set_new(h, nm, json_pack("{s:s, s:[i], s:[II]}", "dtype", "F32", "shape", 1,
                                         "data_offsets", off, off + 4));
  }
  char *txt = json_dumps(h, JSON_COMPACT);
  json_decref(h);
  uint64_t hl = strlen(txt);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 8; i++) fputc((int)(hl >> (8 * i)) & 0xff, f);
  fwrite(txt, 1, hl, f);
  for (int i = 0; i < N; i++) {
    float v = (float)(N - 1 - i); /* the value of tensor N-1-i, stored at slot i */
    fwrite(&v, 4, 1, f);
  }
  fclose(f);
  free(txt);
  gj_st_file st;
  double t0 = gj_now();
  ck_assert_int_eq(gj_st_open(&st, p), 0);
  double t1 = gj_now();
  ck_assert_int_eq(st.n, N);
  for (int i = 0; i < N; i++) {
    snprintf(nm, sizeof nm, "t.%d.w", i);
    const gj_st_tensor *t = gj_st_find(&st, nm);
    ck_assert_msg(t != NULL, "%s not found", nm);
    ck_assert_str_eq(t->name, nm);
    ck_assert_uint_eq(t->end - t->begin, 4);
  }
  snprintf(nm, sizeof nm, "t.%d.w", N);
  ck_assert_ptr_null(gj_st_find(&st, nm));
  ck_assert_ptr_null(gj_st_find(&st, ""));
  float v;
  ck_assert_int_eq(gj_st_read_f32(&st, gj_st_find(&st, "t.7.w"), &v), 0);
  ck_assert(v == 7.0f);
  fprintf(stderr, "many tensors: %d opened in %.3f s, all found in %.3f s\n", N, t1 - t0, gj_now() - t1);
  gj_st_close(&st);
  /* the sorted overlap check: neighbours by offset overlap, one tensor inside another, and an
   * empty tensor inside another (allowed); a name given twice */
  const char *hdr[] = {
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
      "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"};
  const char *want[] = {"tensors 'a' and 'b' overlap", "tensors 'b' and 'c' overlap", NULL, "duplicate"};
  for (int k = 0; k < 4; k++) {
    f = fopen(p, "wb");
    uint64_t n = strlen(hdr[k]);
    for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, f);
    fwrite(hdr[k], 1, n, f);
    for (int i = 0; i < 32; i++) fputc(0, f);
    fclose(f);
    int rc = gj_st_open(&st, p);
    if (!want[k]) {
      ck_assert_msg(rc == 0, "%s", gj_errmsg());
      ck_assert_ptr_nonnull(gj_st_find(&st, "e"));
      gj_st_close(&st);
    } else {
      ck_assert_int_eq(rc, -1);
      ck_assert_msg(strstr(gj_errmsg(), want[k]) != NULL, "header %d: %s", k, gj_errmsg());
    }
  }
}
END_TEST

/* eval and generate straight from a Hugging Face directory (--hf: F32 and BF16 safetensors),
 * each rank reading its TP slices: the same numbers and ids as the converted checkpoint, at
 * TP 1 and TP 2; a model over the memory limit refused before loading, naming the need. */
static void out_line(const char *cmd, char *line, size_t n) {
  char c2[3000];
  snprintf(c2, sizeof c2, "%s 2>&1 | grep -E '^nll|^[0-9 ]+$' | tail -1", cmd);
  FILE *p = popen(c2, "r");
  ck_assert_ptr_nonnull(p);
  line[0] = 0;
  if (!fgets(line, (int)n, p)) line[0] = 0;
  pclose(p);
  char *bar = strstr(line, " | ") ? strstr(strstr(line, " | ") + 3, " | ") : NULL; /* drop the time */
  if (bar && !strncmp(line, "nll", 3)) *bar = 0;
}

START_TEST(test_hf_direct) {
  char hf[1300], ds[1300], mpi[600];
  snprintf(hf, sizeof hf, "%s/hfd", OUT);
  snprintf(ds, sizeof ds, "%s/hfd-data.h5", OUT);
  snprintf(mpi, sizeof mpi, "%s --oversubscribe", tu_env("GJ_MPIRUN", "mpirun"));
  make_hf(hf);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/hfd.h5 >/dev/null", B_, hf, OUT), 0);
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfdb --checkpoint %s/hfd.h5 --dtype bfloat16 >/dev/null && "
                      "%s/gptj convert --from-hf %s/hfdb --out %s/hfdb.h5 >/dev/null", B_, OUT, OUT, B_, OUT, OUT), 0);
  uint16_t tok[600];
  uint64_t off[2] = {0, 600};
  for (int i = 0; i < 600; i++) tok[i] = (uint16_t)((i * 37 + i / 11) % cfg.vocab_size);
  ck_assert_int_eq(gj_dataset_write(ds, tok, 600, off, 1, 600, "synthetic"), 0);
  /* F32 files, BF16 files, and BF16 files under --precision bf16 (both bf16-resident: the GEMM
   * weights and the embedding read in blocks of rows and rounded into bfloat16, the only copy) */
  const char *kind[3] = {"", "b", "b"}, *prec[3] = {"--precision fp32", "--precision fp32", tu_bf16()};
  for (int k = 0; k < 3; k++) {
    char ref[2][512] = {"", ""};
    double nll1 = 0; /* the TP 1 loss */
    for (int tp = 1; tp <= 2; tp++) {
      /* in bf16 another TP split sums in another order: exact within a TP, close across */
      if (k == 2) ref[0][0] = ref[1][0] = 0;
      for (int src = 0; src < 2; src++) {
        char cmd[2600], got[2][512];
        const char *what = src ? "--hf" : "--checkpoint";
        char from[1400];
        snprintf(from, sizeof from, src ? "%s/hfd%s" : "%s/hfd%s.h5", OUT, kind[k]);
        snprintf(cmd, sizeof cmd, "%s -np %d %s/gptj eval %s %s --data %s --seq-len 64 --tp %d %s", mpi,
                 tp, B_, what, from, ds, tp, prec[k]);
        out_line(cmd, got[0], sizeof got[0]);
        snprintf(cmd, sizeof cmd, "%s -np %d %s/gptj generate %s %s --prompt-ids 5,9,3 --ids --temperature 0 "
                 "--max-new-tokens 12 --tp %d %s", mpi, tp, B_, what, from, tp, prec[k]);
        out_line(cmd, got[1], sizeof got[1]);
        for (int j = 0; j < 2; j++) {
          ck_assert_msg(strlen(got[j]) > 3, "%s: no output", cmd);
          if (!ref[j][0]) snprintf(ref[j], sizeof ref[j], "%s", got[j]);
          ck_assert_msg(!strcmp(got[j], ref[j]), "%s %s %s tp %d: '%s' vs '%s'", what, kind[k], prec[k], tp, got[j], ref[j]);
        }
        double nll = atof(got[0] + 4);
        if (tp == 1) nll1 = nll;
        ck_assert_msg(fabs(nll - nll1) <= 1e-3 * nll1, "%s tp %d: nll %.6f vs %.6f at tp 1", prec[k], tp, nll, nll1);
      }
    }
  }
  /* refused before loading, naming what it needs (bf16: the bf16-resident weights) */
  char log[1400];
  snprintf(log, sizeof log, "%s/hfd-mem.log", OUT);
  ck_assert_int_eq(sh("%s/gptj eval --hf %s --data %s --mem-per-rank-gb 0.001 >%s 2>&1", B_, hf, ds, log), 1);
  ck_assert_int_eq(sh("grep -q 'the model needs .* GB per rank (weights' %s", log), 0);
  ck_assert_int_eq(sh("%s/gptj eval --checkpoint %s/hfd.h5 %s --data %s --mem-per-rank-gb 0.001 >%s 2>&1",
                      B_, OUT, tu_bf16(), ds, log), 1);
  ck_assert_int_eq(sh("grep -q 'the model needs .* GB per rank (weights in bf16' %s", log), 0);
}
END_TEST

/* Set element e of checkpoint tensor `name` (a float32 dataset) to v; with fix_crc its crc32
 * attribute is recomputed (of the global row-major bytes), else left stale. */
static void edit_tensor(const char *file, const char *name, size_t e, float v, int fix_crc) {
  hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
  char p[300];
  snprintf(p, sizeof p, "/model/%s", name);
  hid_t d = H5Dopen2(f, p, H5P_DEFAULT), sp = H5Dget_space(d);
  size_t n = (size_t)H5Sget_simple_extent_npoints(sp);
  float *buf = malloc(n * sizeof(float));
  ck_assert(f >= 0 && d >= 0 && e < n);
  ck_assert_int_ge(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
  buf[e] = v;
  ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
  if (fix_crc) {
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)buf, (uInt)(n * sizeof(float)));
    hid_t at = H5Aopen(d, "crc32", H5P_DEFAULT);
    ck_assert_int_ge(H5Awrite(at, H5T_NATIVE_UINT32, &crc), 0);
    H5Aclose(at);
  }
  free(buf);
  H5Sclose(sp), H5Dclose(d), H5Fclose(f);
}

/* A bf16-resident load from a checkpoint (read in blocks, never whole) keeps its checks: a
 * changed value is refused by the CRC, a non-finite one with a fixed CRC by the finite check,
 * at TP 1 and TP 2 (fc_out is split by columns: one CRC per row segment), naming the tensor. */
START_TEST(test_ckpt_bf16_checks) {
  char ok[1300], bad[1300], ds[1300], log[1300], mpi[600];
  snprintf(ok, sizeof ok, "%s/hfdb.h5", OUT);
  snprintf(bad, sizeof bad, "%s/hfdb-bad.h5", OUT);
  snprintf(ds, sizeof ds, "%s/hfd-data.h5", OUT);
  snprintf(log, sizeof log, "%s/hfdb-bad.log", OUT);
  snprintf(mpi, sizeof mpi, "%s --oversubscribe", tu_env("GJ_MPIRUN", "mpirun"));
  if (access(ok, F_OK) || access(ds, F_OK)) { /* made by test_hf_direct */
    char hf[1300];
    snprintf(hf, sizeof hf, "%s/hfd", OUT);
    make_hf(hf);
    ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/hfd.h5 >/dev/null", B_, hf, OUT), 0);
    ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfdb --checkpoint %s/hfd.h5 --dtype bfloat16 >/dev/null && "
                        "%s/gptj convert --from-hf %s/hfdb --out %s >/dev/null", B_, OUT, OUT, B_, OUT, ok), 0);
    uint16_t tok[600];
    uint64_t off[2] = {0, 600};
    for (int i = 0; i < 600; i++) tok[i] = (uint16_t)((i * 37 + i / 11) % cfg.vocab_size);
    ck_assert_int_eq(gj_dataset_write(ds, tok, 600, off, 1, 600, "synthetic"), 0);
  }
  const char *name = "transformer.h.1.mlp.fc_out.weight";
  const char *want[2] = {"is corrupted", "holds a non-finite value"};
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(sh("cp %s %s", ok, bad), 0);
    edit_tensor(bad, name, 37, k ? NAN : 0.5f, k);
    for (int tp = 1; tp <= 2; tp++) {
      ck_assert_int_eq(sh("%s -np %d %s/gptj eval --checkpoint %s --data %s --seq-len 64 --tp %d %s >%s 2>&1",
                          mpi, tp, B_, bad, ds, tp, tu_bf16(), log), 1);
      ck_assert_msg(sh("grep -q '%s.*%s' %s", name, want[k], log) == 0, "tp %d: no '%s' in %s", tp, want[k], log);
    }
  }
}
END_TEST

/* gptj random-hf: the weights are gj_params_init's (float32 files hold them exactly), in
 * several shards with an index that --from-hf and --hf read. */
START_TEST(test_random_hf) {
  char d[1300], p[1400];
  snprintf(d, sizeof d, "%s/rhf", OUT);
  sh("rm -rf %s", d);
  ck_assert_int_eq(sh("%s/gptj random-hf --preset tiny --n_layer 3 --out %s --dtype float32 --shard-gb 0.01 --seed 9 >/dev/null",
                      B_, d), 0);
  ck_assert_int_eq(sh("test -f %s/model.safetensors.index.json", d), 0);
  int nsh = 0; /* model-0000K-of-0000N: N from the first file's name */
  for (int n = 2; n < 16 && !nsh; n++) {
    snprintf(p, sizeof p, "%s/model-00001-of-%05d.safetensors", d, n);
    if (!access(p, F_OK)) nsh = n;
  }
  ck_assert_int_gt(nsh, 1);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/rhf.h5 >/dev/null", B_, d, OUT), 0);
  gj_config c;
  gj_config_preset(&c, "tiny");
  c.n_layer = 3;
  gj_layout l;
  ck_assert_int_eq(gj_layout_build(&l, &c, 1, 0), 0);
  const gj_tensor *t = gj_layout_find(&l, "transformer.h.2.mlp.fc_in.weight");
  float *want = malloc(t->numel * 4), *got = malloc(t->numel * 4);
  gj_params_init_tensor(t, &c, want, 9);
  gj_st_file st;
  int found = 0;
  for (int k = 1; k <= nsh && !found; k++) {
    snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", d, k, nsh);
    ck_assert_int_eq(gj_st_open(&st, p), 0);
    const gj_st_tensor *tt = gj_st_find(&st, t->name);
    if (tt) {
      ck_assert_int_eq(gj_st_read_f32(&st, tt, got), 0);
      ck_assert(!memcmp(got, want, t->numel * 4));
      found = 1;
    }
    gj_st_close(&st);
  }
  ck_assert(found);
  free(want), free(got);
  gj_layout_free(&l);
  ck_assert_int_eq(sh("%s/gptj generate --hf %s --prompt-ids 1,2 --ids --max-new-tokens 3 >/dev/null 2>&1", B_, d), 0);
  /* generate --out refuses to replace a file the model is read from, before any work */
  ck_assert_int_eq(sh("cp %s/model-00001-of-%05d.safetensors %s/sh1.bak && "
                      "%s/gptj generate --hf %s --prompt-ids 1,2 --ids --max-new-tokens 3 --out %s/model-00001-of-%05d.safetensors "
                      ">/dev/null 2>%s/gen-out.err; test $? -eq 1 && grep -q 'refusing to overwrite an input' %s/gen-out.err && "
                      "cmp %s/sh1.bak %s/model-00001-of-%05d.safetensors", d, nsh, OUT, B_, d, d, nsh, OUT, OUT, OUT, d, nsh), 0);
  /* bad shapes are refused by the model's checks */
  ck_assert_int_eq(sh("%s/gptj random-hf --preset tiny --n_head 3 --out %s/rhf-bad >/dev/null 2>&1", B_, OUT), 1);
}
END_TEST

/* config.json's optional keys as transformers' GPTJConfig reads them: rotary_dim missing is its
 * default 64, null the whole width (transformers' rotary table is n_embd wide: with one head
 * the whole head; with several, a model it cannot run, refused); n_inner missing or null is
 * 4 n_embd. A default that does not fit the head is refused, saying where the 64 came from. */
START_TEST(test_hf_config_defaults) {
  struct { const char *extra; int embd, head; int64_t rot, inner; const char *err; } cs[] = {
      {"", 256, 2, 64, 1024, NULL},
      {", \"rotary_dim\": null, \"n_inner\": null", 128, 1, 128, 512, NULL},
      {", \"rotary_dim\": 32, \"n_inner\": 8", 256, 2, 32, 8, NULL},
      {"", 64, 2, 0, 0, "config.json: rotary_dim 64 is larger than the head dimension 32 (n_embd/n_head) (it has "
                        "no 'rotary_dim': transformers' default is 64"}, /* head 32 < 64 */
      {", \"rotary_dim\": null", 256, 2, 0, 0, "config.json: rotary_dim is null with n_head 2: transformers then "
                                               "builds its rotary table over n_embd (256)"}};
  char d[1300], p[1400];
  snprintf(d, sizeof d, "%s/hfcfg", OUT);
  sh("rm -rf %s && mkdir -p %s && printf '\\002\\000\\000\\000\\000\\000\\000\\000{}' > %s/model.safetensors", d, d, d);
  snprintf(p, sizeof p, "%s/config.json", d);
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"vocab_size\": 64, \"n_positions\": 32, \"n_embd\": %d, \"n_layer\": 1, \"n_head\": %d%s}",
            cs[i].embd, cs[i].head, cs[i].extra);
    fclose(f);
    gj_hf h;
    gj_config c;
    int rc = gj_hf_open(&h, d, &c);
    if (cs[i].err) {
      ck_assert_int_ne(rc, 0);
      ck_assert_msg(strstr(gj_errmsg(), cs[i].err), "%s", gj_errmsg());
      continue;
    }
    ck_assert_msg(rc == 0, "%s", gj_errmsg());
    ck_assert_int_eq(c.rotary_dim, cs[i].rot);
    ck_assert_int_eq(c.n_inner, cs[i].inner);
    gj_hf_close(&h);
  }
}
END_TEST

/* Element e of tensor `name` (F32) of the safetensors file at path set to v. */
static void poke_st(const char *path, const char *name, size_t e, float v) {
  gj_st_file st;
  ck_assert_int_eq(gj_st_open(&st, path), 0);
  const gj_st_tensor *t = gj_st_find(&st, name);
  ck_assert_ptr_nonnull(t);
  off_t at = (off_t)(t->begin + 4 * e);
  gj_st_close(&st);
  FILE *f = fopen(path, "r+b");
  ck_assert(f && !fseeko(f, at, SEEK_SET) && fwrite(&v, 4, 1, f) == 1);
  fclose(f);
}

/* A NaN or an infinity in the safetensors is refused by --from-hf as by eval --hf (a
 * checkpoint holding one would be refused later by every command), and nothing is written. */
START_TEST(test_from_hf_nonfinite) {
  char d[1300], p[1400];
  snprintf(d, sizeof d, "%s/hfnf", OUT);
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  for (int k = 0; k < 2; k++) {
    make_hf(d);
    poke_st(p, k ? "transformer.h.1.mlp.fc_in.weight" : "lm_head.bias", 7, k ? -INFINITY : NAN);
    expect_error(d, k ? "hfnf: tensor 'transformer.h.1.mlp.fc_in.weight' has a non-finite value"
                      : "hfnf: tensor 'lm_head.bias' has a non-finite value");
  }
}
END_TEST

/* bfloat16 output: a finite float32 beyond bfloat16's range (it would round to inf) is refused
 * naming the tensor, the value and the way out; the largest that rounds to a finite value is
 * written. convert --to-hf failing leaves an old directory as it was and removes one it made. */
START_TEST(test_to_hf_bf16_range) {
  char p[1400];
  snprintf(p, sizeof p, "%s/bfr.safetensors", OUT);
  const char *nm[1] = {"x"};
  int nd[1] = {1};
  int64_t shp[1][2] = {{2, 1}};
  uint32_t ok_bits = 0x7f7f7fffu, inf_bits = 0x7f7f8000u; /* below and at the rounding to inf */
  float v[2];
  memcpy(&v[0], &ok_bits, 4), v[1] = -v[0];
  gj_st_writer w;
  ck_assert_int_eq(gj_st_write_begin(&w, p, GJ_ST_BF16, 1, nm, nd, (const int64_t(*)[2])shp), 0);
  ck_assert_int_eq(gj_st_write_tensor(&w, "x", v, 2), 0);
  ck_assert_int_eq(gj_st_write_end(&w, 1), 0);
  memcpy(&v[1], &inf_bits, 4);
  ck_assert_int_eq(gj_st_write_begin(&w, p, GJ_ST_BF16, 1, nm, nd, (const int64_t(*)[2])shp), 0);
  ck_assert_int_eq(gj_st_write_tensor(&w, "x", v, 2), -1);
  ck_assert_msg(strstr(gj_errmsg(), "tensor 'x': 3.39617e+38") || strstr(gj_errmsg(), "tensor 'x': 3.3961"), "%s", gj_errmsg());
  gj_st_write_end(&w, 0);
  /* through the command, from a checkpoint with 3.4e38 in lm_head.bias (its CRC fixed) */
  char hf[1300], ck[1300], big[1300], log[1300];
  snprintf(hf, sizeof hf, "%s/hfbr", OUT);
  snprintf(ck, sizeof ck, "%s/hfbr.h5", OUT);
  snprintf(big, sizeof big, "%s/hfbr-big.h5", OUT);
  snprintf(log, sizeof log, "%s/hfbr.log", OUT);
  make_hf(hf);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s >/dev/null", B_, hf, ck), 0);
  ck_assert_int_eq(sh("cp %s %s", ck, big), 0);
  edit_tensor(big, "lm_head.bias", 5, 3.4e38f, 1);
  sh("rm -rf %s/hfbr-new", OUT);
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfbr-new --checkpoint %s --dtype bfloat16 >/dev/null 2>%s", B_, OUT,
                      big, log), 1);
  ck_assert_int_eq(sh("test $(wc -l < %s) -eq 1 && grep -q \"tensor 'lm_head.bias': 3.39999995e+38 is beyond the "
                      "range of bfloat16 (it would round to inf); write float32 (--dtype float32)\" %s", log, log), 0);
  ck_assert_int_ne(sh("test -e %s/hfbr-new", OUT), 0); /* the directory it made: removed */
  /* over an existing model: left as it was, no temporaries */
  ck_assert_int_eq(sh("rm -rf %s/hfbr-old %s/hfbr-copy && %s/gptj convert --to-hf %s/hfbr-old --checkpoint %s >/dev/null && "
                      "cp -a %s/hfbr-old %s/hfbr-copy", OUT, OUT, B_, OUT, ck, OUT, OUT), 0);
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfbr-old --checkpoint %s --dtype bfloat16 >/dev/null 2>&1", B_, OUT, big), 1);
  ck_assert_int_eq(sh("diff -r %s/hfbr-old %s/hfbr-copy", OUT, OUT), 0);
  /* float32 holds it */
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfbr-new --checkpoint %s >/dev/null", B_, OUT, big), 0);
  /* a checkpoint failing its CRC midway: the directory made for it is removed too */
  ck_assert_int_eq(sh("cp %s %s && rm -rf %s/hfbr-crc", ck, big, OUT), 0);
  edit_tensor(big, "transformer.wte.weight", 3, 0.25f, 0);
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s/hfbr-crc --checkpoint %s >/dev/null 2>%s", B_, OUT, big, log), 1);
  ck_assert_int_eq(sh("grep -q 'is corrupted' %s", log), 0);
  ck_assert_int_ne(sh("test -e %s/hfbr-crc", OUT), 0);
}
END_TEST

/* random-hf failing while it writes its shards (each file is limited to 1 MB, shard 2 needs
 * 2 MB) leaves the directory of the previous run exactly as it was: no new shard beside the
 * old config.json, index and other shards (which loaded as a mix of two models), and no
 * temporaries. */
START_TEST(test_random_hf_atomic) {
  char d[1300];
  const char *args = "--preset tiny --vocab_size 64 --n_inner 8192 --dtype float32 --shard-gb 0.001";
  snprintf(d, sizeof d, "%s/rha", OUT);
  sh("rm -rf %s %s.orig", d, d);
  ck_assert_int_eq(sh("%s/gptj random-hf %s --seed 1 --out %s >/dev/null && cp -a %s %s.orig", B_, args, d, d, d), 0);
  ck_assert_int_eq(sh("test -f %s/model.safetensors.index.json && test $(stat -c %%s %s/model-00002-of-*.safetensors) "
                      "-gt 1100000 && test $(stat -c %%s %s/model-00001-of-*.safetensors) -lt 1000000", d, d, d), 0);
  ck_assert_int_eq(sh("trap '' XFSZ; ulimit -f 1024; exec %s/gptj random-hf %s --seed 2 --out %s >/dev/null 2>%s/rha.log",
                      B_, args, d, OUT), 1);
  ck_assert_int_eq(sh("diff -r %s %s.orig", d, d), 0);
  ck_assert_int_eq(sh("test $(wc -l < %s/rha.log) -eq 1 && grep -q 'model-00002-of-.*write failed: File too large' %s/rha.log",
                      OUT, OUT), 0);
  /* and without the limit, the new model replaces the old one */
  ck_assert_int_eq(sh("%s/gptj random-hf %s --seed 2 --out %s >/dev/null", B_, args, d), 0);
  ck_assert_int_ne(sh("diff -r -q %s %s.orig >/dev/null", d, d), 0);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/rha.h5 >/dev/null", B_, d, OUT), 0);
}
END_TEST

/* random-hf holds the stop signals while it writes: a signal the process ignores (SIGHUP under
 * nohup) is held pending too, and must not stop it. */
START_TEST(test_random_hf_nohup) {
  char d[1300];
  snprintf(d, sizeof d, "%s/rhn", OUT);
  sh("rm -rf %s", d);
  ck_assert_int_eq(sh("(trap '' HUP; exec %s/gptj random-hf --preset gptj-125m --out %s >%s.log 2>&1) & p=$!; "
                      "until grep -q parameters %s.log || ! kill -0 $p 2>/dev/null; do sleep 0.01; done; "
                      "kill -HUP $p; wait $p", B_, d, d, d), 0);
  ck_assert_int_eq(sh("test -f %s/config.json && test -f %s/model.safetensors", d, d), 0);
  sh("rm -rf %s", d);
}
END_TEST

/* convert --to-hf stopped by SIGTERM while it writes: its temporaries are gone, and so is the
 * directory it made for them (empty then). */
START_TEST(test_to_hf_stopped) {
  char d[1300];
  snprintf(d, sizeof d, "%s/tostop", OUT);
  sh("rm -rf %s %s.hf %s.h5", d, d, d);
  ck_assert_int_eq(sh("%s/gptj random-hf --preset gptj-125m --out %s.hf >/dev/null && "
                      "%s/gptj convert --from-hf %s.hf --out %s.h5 >/dev/null", B_, d, B_, d, d), 0);
  ck_assert_int_eq(sh("%s/gptj convert --to-hf %s --checkpoint %s.h5 >%s.log 2>&1 & p=$!; "
                      "until test -d %s || ! kill -0 $p 2>/dev/null; do sleep 0.01; done; sleep 0.2; "
                      "kill -TERM $p; wait $p", B_, d, d, d, d), 128 + 15);
  ck_assert_int_ne(sh("test -e %s", d), 0);
  sh("rm -rf %s.hf %s.h5", d, d);
}
END_TEST

/* config.json and the index: a failed write says why (errno), not "disk full?" for all. */
START_TEST(test_hf_json_errors) {
  const char *nm[1] = {"lm_head.bias"}, *fl[1] = {"model.safetensors"};
  ck_assert_int_eq(gj_hf_write_config("/nonexistent-dir/config.json", &cfg, GJ_ST_F32), -1);
  ck_assert_msg(strstr(gj_errmsg(), "/nonexistent-dir/config.json: No such file or directory"), "%s", gj_errmsg());
  ck_assert_int_eq(gj_hf_write_config("/dev/full", &cfg, GJ_ST_BF16), -1);
  ck_assert_msg(strstr(gj_errmsg(), "/dev/full: write failed: No space left on device"), "%s", gj_errmsg());
  ck_assert_int_eq(gj_hf_write_index("/dev/full", nm, fl, 1, 4), -1);
  ck_assert_msg(strstr(gj_errmsg(), "/dev/full: write failed: No space left on device"), "%s", gj_errmsg());
}
END_TEST

static int open_header(const char *hdr, size_t data_bytes) {
  char p[1400];
  snprintf(p, sizeof p, "%s/hdr.safetensors", OUT);
  FILE *f = fopen(p, "wb");
  uint64_t n = strlen(hdr);
  for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, f);
  fwrite(hdr, 1, n, f);
  for (size_t i = 0; i < data_bytes; i++) fputc(0, f);
  fclose(f);
  gj_st_file st;
  int rc = gj_st_open(&st, p);
  if (!rc) {
    float x[8];
    const gj_st_tensor *t = gj_st_find(&st, "a");
    ck_assert_ptr_nonnull(t); /* not read: not a dtype of weights */
    ck_assert_int_eq(gj_st_read_f32(&st, t, x), -1);
    ck_assert_msg(strstr(gj_errmsg(), "is not supported for weights (F32, F16, BF16)"), "%s", gj_errmsg());
    gj_st_close(&st);
  }
  return rc;
}

/* Every dtype of the format is parsed with its size (F4 and F6 below a byte: a tensor of them
 * fills whole bytes), and a buffer in one is skipped; data_offsets are integers; a header of
 * more tensors than the limit is refused before it is parsed. */
START_TEST(test_st_dtypes) {
  ck_assert_int_eq(open_header("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]},"
                               "\"b\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[2,5]},"
                               "\"c\":{\"dtype\":\"F6_E3M2\",\"shape\":[2,2],\"data_offsets\":[5,8]},"
                               "\"d\":{\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[8,10]},"
                               "\"e\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[1],\"data_offsets\":[10,11]},"
                               "\"f\":{\"dtype\":\"F8_E5M2FNUZ\",\"shape\":[1],\"data_offsets\":[11,12]},"
                               "\"g\":{\"dtype\":\"C64\",\"shape\":[2],\"data_offsets\":[16,32]}}", 32), 0);
  ck_assert_int_eq(open_header("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 8), -1);
  ck_assert_msg(strstr(gj_errmsg(), "tensor 'a': 3 elements of 4 bits (F4) do not fill whole bytes"), "%s", gj_errmsg());
  ck_assert_int_eq(open_header("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 8), -1);
  ck_assert_msg(strstr(gj_errmsg(), "tensor 'a': 4 data bytes for 4 elements of 6 bits"), "%s", gj_errmsg());
  ck_assert_int_eq(open_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8.0]}}", 8), -1);
  ck_assert_msg(strstr(gj_errmsg(), "tensor 'a': data_offsets must be integers"), "%s", gj_errmsg());
  /* more tensors than the limit (empty ones, the cheapest): refused before parsing */
  size_t n = GJ_ST_MAX_TENSORS + 1, cap = n * 64 + 16, len = 1;
  char *h = malloc(cap);
  h[0] = '{';
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(h + len, cap - len, "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                            i ? "," : "", i);
  snprintf(h + len, cap - len, "}");
  ck_assert_int_eq(open_header(h, 0), -1);
  free(h);
  ck_assert_msg(strstr(gj_errmsg(), "more than 262144 tensors in the header"), "%s", gj_errmsg());
  /* HF's buffers in a dtype that is not read (one byte each) are skipped by --from-hf */
  char d[1300], p[1400];
  snprintf(d, sizeof d, "%s/hfdt", OUT);
  make_hf(d);
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/hfdt.h5 >/dev/null", B_, d, OUT), 0);
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  write_st_buffers(p, 0, lay.n, "F8_E8M0");
  ck_assert_int_eq(sh("%s/gptj convert --from-hf %s --out %s/hfdt2.h5 >/dev/null", B_, d, OUT), 0);
  char a[1300], b[1300];
  snprintf(a, sizeof a, "%s/hfdt.h5", OUT), snprintf(b, sizeof b, "%s/hfdt2.h5", OUT);
  same_models(a, b);
}
END_TEST

int main(void) {
  snprintf(B_, sizeof B_, "%s", tu_env("GJ_BUILDDIR", "."));
  snprintf(S_, sizeof S_, "%s", tu_env("GJ_SRCDIR", "."));
  snprintf(OUT, sizeof OUT, "%s/tests/out/convert", B_);
  snprintf(GOLD, sizeof GOLD, "%s/tests/golden/gptj-tiny.h5", S_);
  sh("mkdir -p %s", OUT);
  gj_h5_quiet();
  hid_t f = H5Fopen(GOLD, H5F_ACC_RDONLY, H5P_DEFAULT);
  gj_h5_attr_i64(f, GOLD, "vocab_size", &cfg.vocab_size);
  gj_h5_attr_i64(f, GOLD, "n_positions", &cfg.n_positions);
  gj_h5_attr_i64(f, GOLD, "n_embd", &cfg.n_embd);
  gj_h5_attr_i64(f, GOLD, "n_layer", &cfg.n_layer);
  gj_h5_attr_i64(f, GOLD, "n_head", &cfg.n_head);
  gj_h5_attr_i64(f, GOLD, "rotary_dim", &cfg.rotary_dim);
  gj_h5_attr_i64(f, GOLD, "n_inner", &cfg.n_inner);
  H5Fclose(f);
  cfg.layer_norm_epsilon = 1e-5;
  if (gj_layout_build(&lay, &cfg, 1, 0)) return 1;
  Suite *s = suite_create("convert");
  TCase *tc = tcase_create("convert");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_from_hf_golden);
  tcase_add_test(tc, test_half_inputs_exact);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_many_tensors);
  tcase_add_test(tc, test_hf_direct);
  tcase_add_test(tc, test_ckpt_bf16_checks);
  tcase_add_test(tc, test_random_hf);
  tcase_add_test(tc, test_hf_config_defaults);
  suite_add_tcase(s, tc);
  TU_ADD(s, test_from_hf_nonfinite, NULL, 300);
  TU_ADD(s, test_to_hf_bf16_range, NULL, 300);
  TU_ADD(s, test_random_hf_atomic, NULL, 300);
  TU_ADD(s, test_random_hf_nohup, NULL, 300);
  TU_ADD(s, test_to_hf_stopped, NULL, 300);
  TU_ADD(s, test_hf_json_errors, NULL, 300);
  TU_ADD(s, test_st_dtypes, NULL, 300);
  return tu_run(s);
}
