#include "io/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

float gj_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (m << 13); /* inf, nan (payload kept) */
  } else if (e == 0) {
    float v = ldexpf((float)m, -24); /* zero and subnormals: exact in float */
    return sign ? -v : v;
  } else {
    bits = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

float gj_bf16_to_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t gj_f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* quiet nan */
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

/* The dtypes of the safetensors format and their sizes in bits (F4 and F6 pack elements below
 * a byte: a tensor of them must fill whole bytes); the first three are the ones read. */
static const struct {
  const char *name;
  gj_st_dtype dtype;
  int bits;
} dtypes[] = {{"F32", GJ_ST_F32, 32},       {"F16", GJ_ST_F16, 16},         {"BF16", GJ_ST_BF16, 16},
              {"BOOL", GJ_ST_OTHER, 8},      {"U8", GJ_ST_OTHER, 8},         {"I8", GJ_ST_OTHER, 8},
              {"F4", GJ_ST_OTHER, 4},        {"F6_E2M3", GJ_ST_OTHER, 6},    {"F6_E3M2", GJ_ST_OTHER, 6},
              {"F8_E4M3", GJ_ST_OTHER, 8},   {"F8_E5M2", GJ_ST_OTHER, 8},    {"F8_E8M0", GJ_ST_OTHER, 8},
              {"F8_E4M3FNUZ", GJ_ST_OTHER, 8}, {"F8_E5M2FNUZ", GJ_ST_OTHER, 8}, {"I16", GJ_ST_OTHER, 16},
              {"U16", GJ_ST_OTHER, 16},      {"I32", GJ_ST_OTHER, 32},       {"U32", GJ_ST_OTHER, 32},
              {"I64", GJ_ST_OTHER, 64},      {"U64", GJ_ST_OTHER, 64},       {"F64", GJ_ST_OTHER, 64},
              {"C64", GJ_ST_OTHER, 64}};

static int dtype_of(const char *s, gj_st_tensor *t) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(s, dtypes[i].name)) {
      t->dtype = dtypes[i].dtype, t->elem_bits = dtypes[i].bits, t->elem_size = dtypes[i].bits / 8;
      snprintf(t->dtype_name, sizeof t->dtype_name, "%s", s);
      return 0;
    }
  return -1;
}

static size_t dtype_size(gj_st_dtype d) { return d == GJ_ST_F32 ? 4 : 2; }

void gj_st_close(gj_st_file *s) {
  if (s->f) fclose(s->f);
  free(s->t);
  memset(s, 0, sizeof *s);
}

/* Order of tensors by data offset (then end), for the overlap check. */
static int by_offset(const void *a, const void *b) {
  const gj_st_tensor *x = *(const gj_st_tensor *const *)a, *y = *(const gj_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const gj_st_tensor *)a)->name, ((const gj_st_tensor *)b)->name);
}

/* One header entry into t; the message names the tensor. */
static int parse_tensor(const char *path, const char *key, json_t *v, uint64_t data0, uint64_t dsize,
                        gj_st_tensor *t) {
  if (strlen(key) >= sizeof t->name) return GJ_FAIL("%s: tensor name too long (%zu bytes)", path, strlen(key));
  snprintf(t->name, sizeof t->name, "%s", key);
  if (!json_is_object(v)) return GJ_FAIL("%s: tensor '%s' is not a JSON object", path, key);
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
         *off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || dtype_of(json_string_value(dt), t))
    return GJ_FAIL("%s: tensor '%s': dtype %s is not a safetensors dtype", path, key,
                   json_is_string(dt) ? json_string_value(dt) : "(missing)");
  if (!json_is_array(sh) || json_array_size(sh) > 4 || !json_is_array(off) || json_array_size(off) != 2)
    return GJ_FAIL("%s: tensor '%s': bad shape or data_offsets", path, key);
  t->ndim = (int)json_array_size(sh);
  /* numel and bytes in checked arithmetic: a shape whose product overflows is refused */
  size_t numel = 1, bytes;
  for (int i = 0; i < t->ndim; i++) {
    json_t *d = json_array_get(sh, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > ((json_int_t)1 << 40))
      return GJ_FAIL("%s: tensor '%s': bad shape (dimensions are integers in [0, 2^40])", path, key);
    t->shape[i] = json_integer_value(d);
    if (gj_mul_size(&numel, numel, (size_t)t->shape[i]))
      return GJ_FAIL("%s: tensor '%s': the shape's element count overflows", path, key);
  }
  size_t bits;
  if (gj_mul_size(&bits, numel, (size_t)t->elem_bits))
    return GJ_FAIL("%s: tensor '%s': the shape's byte count overflows", path, key);
  if (bits % 8)
    return GJ_FAIL("%s: tensor '%s': %zu elements of %d bits (%s) do not fill whole bytes", path, key, numel,
                   t->elem_bits, t->dtype_name);
  bytes = bits / 8;
  json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
  if (!json_is_integer(b) || !json_is_integer(e))
    return GJ_FAIL("%s: tensor '%s': data_offsets must be integers", path, key);
  if (json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b) ||
      (uint64_t)json_integer_value(e) > dsize)
    return GJ_FAIL("%s: tensor '%s': data_offsets outside the %llu data bytes of the file", path, key,
                   (unsigned long long)dsize);
  t->begin = data0 + (uint64_t)json_integer_value(b), t->end = data0 + (uint64_t)json_integer_value(e);
  if (t->end - t->begin != bytes)
    return GJ_FAIL("%s: tensor '%s': %llu data bytes for %zu elements of %d bits", path, key,
                   (unsigned long long)(t->end - t->begin), numel, t->elem_bits);
  return 0;
}

/* The JSON objects of a header (braces outside strings), counted before it is parsed: each
 * tensor is one, and parsing a million of them would take seconds and gigabytes. */
static size_t count_objects(const char *h, size_t n) {
  size_t k = 0;
  for (size_t i = 0, in_str = 0; i < n; i++)
    if (in_str && h[i] == '\\') i++;
    else if (h[i] == '"') in_str = !in_str;
    else if (!in_str && h[i] == '{') k++;
  return k;
}

int gj_st_open(gj_st_file *s, const char *path) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s", path);
  GJ_TRY(gj_outfile_check_input(path, NULL, GJ_IN_SEEK)); /* regular: it is read by seeking */
  struct stat st;
  if (stat(path, &st)) return GJ_FAIL("%s: %s", path, strerror(errno));
  uint64_t size = (uint64_t)st.st_size;
  s->f = fopen(path, "rb");
  if (!s->f) return GJ_FAIL("%s: %s", path, strerror(errno));
  unsigned char lb[8];
  if (size < 8 || fread(lb, 1, 8, s->f) != 8) return gj_st_close(s), GJ_FAIL("%s: too short for a safetensors header", path);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | lb[i];
  if (hl < 2 || hl > GJ_ST_MAX_HEADER || hl > size - 8)
    return gj_st_close(s), GJ_FAIL("%s: header length %llu does not fit in the file of %llu bytes "
                                   "(or is above the limit of %llu)", path, (unsigned long long)hl,
                                   (unsigned long long)size, (unsigned long long)GJ_ST_MAX_HEADER);
  char *hdr = malloc(hl + 1);
  if (!hdr || fread(hdr, 1, hl, s->f) != hl) return free(hdr), gj_st_close(s), GJ_FAIL("%s: cannot read the header", path);
  if (count_objects(hdr, hl) > GJ_ST_MAX_TENSORS + 2) /* the header's own object and __metadata__ */
    return free(hdr), gj_st_close(s), GJ_FAIL("%s: more than %d tensors in the header (a GPT-J file has a few "
                                              "hundred)", path, GJ_ST_MAX_TENSORS);
  json_error_t err;
  /* a name given twice would leave it open which tensor is meant */
  json_t *root = json_loadb(hdr, hl, JSON_REJECT_DUPLICATES, &err);
  free(hdr);
  if (!root || !json_is_object(root)) {
    json_decref(root);
    gj_st_close(s);
    return GJ_FAIL("%s: header is not a JSON object without duplicate keys (%s)", path,
                   root ? "another JSON value" : err.text);
  }
  uint64_t data0 = 8 + hl, dsize = size - data0;
  size_t nkeys = json_object_size(root), nt = nkeys - (json_object_get(root, "__metadata__") != NULL);
  if (nt > GJ_ST_MAX_TENSORS) {
    json_decref(root);
    gj_st_close(s);
    return GJ_FAIL("%s: more than %d tensors in the header (a GPT-J file has a few hundred)", path, GJ_ST_MAX_TENSORS);
  }
  s->t = calloc(nkeys + 1, sizeof(gj_st_tensor));
  int rc = s->t ? 0 : GJ_FAIL("%s: out of memory for %zu tensors", path, nkeys);
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (rc) break;
    if (!strcmp(key, "__metadata__")) continue;
    rc = parse_tensor(path, key, v, data0, dsize, &s->t[s->n]);
    if (!rc) s->n++;
  }
  json_decref(root);
  /* Tensors must not overlap: sorted by offset, each non-empty tensor starts at or after the
   * end of every earlier one (O(n log n)). */
  const gj_st_tensor **ord = rc ? NULL : malloc(((size_t)s->n + 1) * sizeof *ord);
  if (!rc && !ord) rc = GJ_FAIL("%s: out of memory", path);
  if (!rc) {
    for (int i = 0; i < s->n; i++) ord[i] = &s->t[i];
    qsort(ord, s->n, sizeof *ord, by_offset);
    const gj_st_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; !rc && i < s->n; i++) {
      if (ord[i]->end == ord[i]->begin) continue;
      if (last && ord[i]->begin < last->end)
        rc = GJ_FAIL("%s: tensors '%s' and '%s' overlap", path, last->name, ord[i]->name);
      if (!last || ord[i]->end > last->end) last = ord[i];
    }
  }
  free(ord);
  /* sorted by name for gj_st_find (names are unique: duplicates were refused) */
  if (!rc) qsort(s->t, s->n, sizeof *s->t, by_name);
  if (rc) gj_st_close(s);
  return rc;
}

const gj_st_tensor *gj_st_find(const gj_st_file *s, const char *name) {
  if (!s->t || s->n == 0 || strlen(name) >= sizeof s->t->name) return NULL;
  gj_st_tensor key;
  snprintf(key.name, sizeof key.name, "%s", name);
  return bsearch(&key, s->t, s->n, sizeof *s->t, by_name);
}

/* n elements of t from element e0 (row-major), converted to float32 into out. */
static int read_elems(gj_st_file *s, const gj_st_tensor *t, uint64_t e0, uint64_t n, float *out) {
  if (t->dtype == GJ_ST_OTHER)
    return GJ_FAIL("%s: tensor '%s': dtype %s is not supported for weights (F32, F16, BF16)", s->path, t->name, t->dtype_name);
  size_t es = (size_t)t->elem_size;
  if (fseeko(s->f, (off_t)(t->begin + e0 * es), SEEK_SET)) return GJ_FAIL("%s: seek failed", s->path);
  if (t->dtype == GJ_ST_F32) {
    if (fread(out, 4, n, s->f) != n) return GJ_FAIL("%s: tensor '%s' truncated", s->path, t->name);
    return 0;
  }
  /* 16-bit types: read in pieces, widen */
  uint16_t buf[65536];
  for (uint64_t i = 0; i < n;) {
    size_t k = (size_t)GJ_MIN((uint64_t)65536, n - i);
    if (fread(buf, 2, k, s->f) != k) return GJ_FAIL("%s: tensor '%s' truncated", s->path, t->name);
    for (size_t j = 0; j < k; j++)
      out[i + j] = t->dtype == GJ_ST_F16 ? gj_f16_to_f32(buf[j]) : gj_bf16_to_f32(buf[j]);
    i += k;
  }
  return 0;
}

int gj_st_read_f32(gj_st_file *s, const gj_st_tensor *t, float *out) {
  /* elem_size is 0 for the dtypes below a byte, which read_elems refuses */
  return read_elems(s, t, 0, t->elem_size ? (t->end - t->begin) / (uint64_t)t->elem_size : 0, out);
}

int gj_st_read_block_f32(gj_st_file *s, const gj_st_tensor *t, int64_t row0, int64_t nrows, int64_t col0,
                         int64_t ncols, float *out) {
  int64_t rows = t->ndim > 0 ? t->shape[0] : 1, cols = 1;
  for (int d = 1; d < t->ndim; d++) cols *= t->shape[d];
  if (row0 < 0 || nrows < 0 || col0 < 0 || ncols < 0 || row0 + nrows > rows || col0 + ncols > cols)
    return GJ_FAIL("%s: tensor '%s': block [%lld:%lld, %lld:%lld] outside its [%lld, %lld]", s->path, t->name,
                   (long long)row0, (long long)(row0 + nrows), (long long)col0, (long long)(col0 + ncols),
                   (long long)rows, (long long)cols);
  if (ncols == cols) return read_elems(s, t, (uint64_t)row0 * cols, (uint64_t)nrows * cols, out);
  for (int64_t r = 0; r < nrows; r++) /* a column block: one read per row */
    GJ_TRY(read_elems(s, t, (uint64_t)(row0 + r) * cols + col0, (uint64_t)ncols, out + r * ncols));
  return 0;
}

int gj_st_write_begin(gj_st_writer *w, const char *path, gj_st_dtype dtype, int n,
                      const char *const *names, const int *ndims, const int64_t (*shapes)[2]) {
  memset(w, 0, sizeof *w);
  w->dtype = dtype;
  json_t *root = json_object(), *meta = json_object();
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(root, "__metadata__", meta);
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    json_t *o = json_object(), *sh = json_array(), *of = json_array();
    uint64_t numel = 1;
    for (int d = 0; d < ndims[i]; d++) json_array_append_new(sh, json_integer(shapes[i][d])), numel *= shapes[i][d];
    json_array_append_new(of, json_integer((json_int_t)off));
    off += numel * dtype_size(dtype);
    json_array_append_new(of, json_integer((json_int_t)off));
    json_object_set_new(o, "dtype", json_string(dtype == GJ_ST_F32 ? "F32" : dtype == GJ_ST_F16 ? "F16" : "BF16"));
    json_object_set_new(o, "shape", sh);
    json_object_set_new(o, "data_offsets", of);
    json_object_set_new(root, names[i], o);
  }
  char *hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(root);
  if (!hdr) return GJ_FAIL("out of memory");
  size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8; /* data aligned to 8 bytes */
  int rc = gj_outfile_begin(&w->out, path);
  if (rc) return free(hdr), rc;
  w->f = fopen(w->out.tmp, "wb");
  if (!w->f) {
    rc = GJ_FAIL("%s: %s", w->out.tmp, strerror(errno));
    gj_outfile_abort(&w->out);
    return free(hdr), rc;
  }
  unsigned char lb[8];
  uint64_t total = hl + pad;
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(total >> (8 * i));
  int bad = fwrite(lb, 1, 8, w->f) != 8 || fwrite(hdr, 1, hl, w->f) != hl;
  for (size_t i = 0; i < pad; i++) bad |= fputc(' ', w->f) == EOF;
  free(hdr);
  w->data_start = 8 + total;
  if (!bad) return 0;
  rc = GJ_FAIL("%s: write failed: %s", w->out.tmp, strerror(errno));
  fclose(w->f), w->f = NULL;
  gj_outfile_abort(&w->out);
  return rc;
}

int gj_st_write_tensor(gj_st_writer *w, const char *name, const float *data, uint64_t numel) {
  if (w->dtype == GJ_ST_F32) {
    if (fwrite(data, 4, numel, w->f) != numel) return GJ_FAIL("%s: write failed: %s", w->out.tmp, strerror(errno));
    return 0;
  }
  uint16_t buf[65536];
  for (uint64_t i = 0; i < numel;) {
    size_t k = (size_t)GJ_MIN((uint64_t)65536, numel - i);
    for (size_t j = 0; j < k; j++) {
      buf[j] = gj_f32_to_bf16(data[i + j]);
      /* beyond 3.3961e38 a float32 rounds to bfloat16's inf: not the value it was */
      if ((buf[j] & 0x7fff) == 0x7f80 && isfinite(data[i + j]))
        return GJ_FAIL("%s: tensor '%s': %.9g is beyond the range of bfloat16 (it would round to inf); "
                       "write float32 (--dtype float32)", w->out.path, name, data[i + j]);
    }
    if (fwrite(buf, 2, k, w->f) != k) return GJ_FAIL("%s: write failed: %s", w->out.tmp, strerror(errno));
    i += k;
  }
  return 0;
}

int gj_st_write_close(gj_st_writer *w) {
  if (!w->f) return GJ_FAIL("%s: not being written", w->out.path);
  /* synced here, not in the commit: the renames that follow should be quick */
  int bad = fflush(w->f) != 0 || fsync(fileno(w->f)) != 0;
  int e = errno;
  bad |= fclose(w->f) != 0;
  if (bad && !e) e = errno;
  w->f = NULL;
  if (!bad) return 0;
  int rc = GJ_FAIL("%s: write failed: %s", w->out.tmp, strerror(e));
  gj_outfile_abort(&w->out);
  return rc;
}

int gj_st_write_end(gj_st_writer *w, int ok) {
  if (!w->f) return 0;
  if (!ok) {
    fclose(w->f), w->f = NULL;
    gj_outfile_abort(&w->out);
    return 0;
  }
  GJ_TRY(gj_st_write_close(w));
  return gj_outfile_commit(&w->out);
}
