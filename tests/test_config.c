/* Config presets and validation; the parameter table; initialisation that is a function of
 * (seed, name, global index) so that every TP shard equals its slice of the 1-rank model. */
#include <check.h>
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/modelopts.h"
#include "common.h"
#include "model/config.h"
#include "model/gptj.h"
#include "model/params.h"
#include "io/blend.h"
#include "io/dataset.h"
#include "io/kvconf.h"
#include "io/loader.h"
#include "io/megatron.h"
#include "testutil.h"

START_TEST(test_presets) {
  gj_config c;
  for (int i = 0; gj_config_preset_names[i]; i++) {
    ck_assert_int_eq(gj_config_preset(&c, gj_config_preset_names[i]), 0);
    ck_assert_int_eq(gj_config_validate(&c), 0);
    ck_assert_int_eq(c.vocab_size, 50400);
  }
  ck_assert_int_eq(gj_config_preset(&c, "gptj-6b"), 0);
  ck_assert_int_eq(gj_config_n_params(&c), 6050882784LL);
  ck_assert_int_eq(c.n_embd / c.n_head, 256);
  ck_assert_int_eq(gj_config_preset(&c, "tiny"), 0);
  ck_assert_int_eq(c.n_embd, 64);
  ck_assert_int_eq(c.rotary_dim, 8);
  ck_assert_int_eq(gj_config_preset(&c, "gpt-huge"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "gpt-huge"));
}
END_TEST

/* The model options in the command line's order: the last --preset (either form), every
 * --config file in order (later keys win; a file's preset line where it stands), then the
 * flags over the files; in a file '#' starts a comment at a line's start or after white space
 * only (a path's '#' is text). */
START_TEST(test_modelopts_order) {
  const char *dir = "tests/out/modelopts";
  ck_assert_int_eq(tu_sh("mkdir -p %s && printf 'n_layer = 3 # three\\n# a comment\\nn_head = 2\\n' > %s/a.conf && "
                         "printf 'n_layer = 5\\ndata = x/h#y\\n' > %s/b.conf && printf 'preset = gptj-125m\\n' > %s/p.conf",
                         dir, dir, dir, dir), 0);
  const char *data = NULL;
  double lr = 0;
  gj_opt table[] = {{"data", GJ_OPT_STR, &data, "", 1, 0}, {"lr", GJ_OPT_F64, &lr, "", 0, 1}, {NULL}};
  char a[256], b[256], p[256];
  snprintf(a, sizeof a, "%s/a.conf", dir), snprintf(b, sizeof b, "%s/b.conf", dir), snprintf(p, sizeof p, "%s/p.conf", dir);
  struct { const char *argv[8]; int64_t layers, heads, embd; const char *data; } cs[] = {
      {{"x", "--preset=gptj-125m", "--preset", "tiny"}, 2, 4, 64, NULL},
      {{"x", "--preset", "tiny", "--preset=gptj-125m"}, 12, 12, 768, NULL},
      {{"x", "--config", a, "--config", b}, 5, 2, 64, "x/h#y"},
      {{"x", "--config=", b, "--config", a}, 0, 0, 0, NULL}, /* "--config=" names the empty file: refused */
      {{"x", "--config", b, "--config=", a}, 0, 0, 0, NULL},
      {{"x", "--n_layer", "7", "--config", a}, 7, 2, 64, NULL},
      {{"x", "--config", a, "--config", p}, 12, 12, 768, NULL},
      {{"x", "--config", p, "--config", a, "--preset", "tiny"}, 3, 2, 768, NULL}}; /* the file's preset after --preset */
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    gj_modelopts mo;
    int argc = 0;
    while (argc < 8 && cs[i].argv[argc]) argc++;
    data = NULL;
    int rc = gj_modelopts_parse(&mo, argc, (char **)cs[i].argv, table, "u", "s");
    if (!cs[i].layers) {
      ck_assert_int_ne(rc, 0);
      continue;
    }
    ck_assert_msg(rc == 0, "case %zu: %s", i, gj_errmsg());
    ck_assert_msg(mo.config.n_layer == cs[i].layers && mo.config.n_head == cs[i].heads && mo.config.n_embd == cs[i].embd,
                  "case %zu: n_layer %lld, n_head %lld, n_embd %lld", i, (long long)mo.config.n_layer,
                  (long long)mo.config.n_head, (long long)mo.config.n_embd);
    if (cs[i].data) ck_assert_str_eq(data, cs[i].data);
  }
}
END_TEST

/* gj_kvconf_write gives back every string through gj_kvconf_read: white space at the ends, '#'
 * after a space or not, quotes, backslashes, a newline. */
static const char *const kv_values[] = {"plain/path.h5", "tr ain #1.h5", " lead", "trail ", "a#b", "#start",
                                        "\"quoted\"", "x\\y\\", "two\nlines", "mid\"dle", "tab\there"};
static int kv_check(void *ctx, const char *key, const char *value) {
  int *n = ctx;
  ck_assert_str_eq(value, kv_values[*n]);
  ck_assert_int_eq(atoi(key + 1), *n);
  ++*n;
  return 0;
}

START_TEST(test_kvconf_roundtrip) {
  const char *path = "tests/out/kv.conf";
  ck_assert_int_eq(tu_sh("mkdir -p tests/out"), 0);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  const int n = (int)(sizeof kv_values / sizeof kv_values[0]);
  for (int i = 0; i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "k%d", i);
    gj_kvconf_write(f, key, kv_values[i]);
  }
  fclose(f);
  int got = 0;
  ck_assert_msg(gj_kvconf_read(path, kv_check, &got) == 0, "%s", gj_errmsg());
  ck_assert_int_eq(got, n);
}
END_TEST

START_TEST(test_validation) {
  gj_config c;
  gj_config_preset(&c, "tiny");
  ck_assert_int_eq(gj_config_set(&c, "n_head", "5"), 0);
  ck_assert_int_eq(gj_config_validate(&c), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "n_embd 64 is not divisible by n_head 5"));
  gj_config_preset(&c, "tiny");
  gj_config_set(&c, "rotary_dim", "7");
  ck_assert_int_eq(gj_config_validate(&c), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "rotary_dim 7"));
  gj_config_preset(&c, "tiny");
  gj_config_set(&c, "rotary_dim", "32");
  ck_assert_int_eq(gj_config_validate(&c), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "larger than the head dimension 16"));
  gj_config_preset(&c, "tiny"); /* 0: no rotary embedding (as transformers' GPTJ computes it) */
  ck_assert_int_eq(gj_config_set(&c, "rotary_dim", "0"), 0);
  ck_assert_int_eq(gj_config_validate(&c), 0);
  ck_assert_int_eq(gj_config_set(&c, "rotary_dim", "-2"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "rotary_dim: expected a non-negative integer"));
  ck_assert_int_eq(gj_config_set(&c, "n_layer", "-2"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "n_layer"));
  ck_assert_int_eq(gj_config_set(&c, "n_embd", "12x"), -1);
  ck_assert_int_eq(gj_config_set(&c, "n_head", "0"), -1);
  ck_assert_int_eq(gj_config_set(&c, "layer_norm_epsilon", "nan"), -1);
  ck_assert_int_eq(gj_config_set(&c, "learning_rate", "1"), 1); /* not a model key */
}
END_TEST

START_TEST(test_layout) {
  gj_config c;
  gj_config_preset(&c, "tiny");
  gj_layout l;
  ck_assert_int_eq(gj_layout_build(&l, &c, 1, 0), 0);
  ck_assert_int_eq(l.n, gj_layout_count(2));
  ck_assert_int_eq(l.n_global, gj_config_n_params(&c));
  const gj_tensor *t = gj_layout_find(&l, "transformer.h.1.mlp.fc_out.weight");
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(t->rows, 64);
  ck_assert_int_eq(t->cols, 256);
  ck_assert_int_eq(t->decay, 1);
  ck_assert_int_eq(gj_layout_find(&l, "lm_head.bias")->decay, 0);
  for (int i = 0; i < l.n; i++) ck_assert_int_eq(l.t[i].offset % 16, 0);
  gj_layout_free(&l);
  ck_assert_int_eq(gj_layout_build(&l, &c, 3, 0), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "--tp 3 does not divide n_head 4"));
}
END_TEST

START_TEST(test_init_sharded) {
  gj_config c;
  gj_config_preset(&c, "tiny");
  gj_config_set(&c, "vocab_size", "512");
  gj_layout full, part;
  ck_assert_int_eq(gj_layout_build(&full, &c, 1, 0), 0);
  float *pf = gj_alloc(full.numel * sizeof(float));
  gj_params_init(&full, &c, pf, 1234);
  for (int tp = 2; tp <= 4; tp *= 2)
    for (int r = 0; r < tp; r++) {
      ck_assert_int_eq(gj_layout_build(&part, &c, tp, r), 0);
      float *pp = gj_alloc(part.numel * sizeof(float));
      gj_params_init(&part, &c, pp, 1234);
      for (int i = 0; i < part.n; i++) {
        const gj_tensor *a = &part.t[i], *b = &full.t[i];
        for (int64_t y = 0; y < a->lrows; y++)
          for (int64_t x = 0; x < a->lcols; x++)
            ck_assert_float_eq(pp[a->offset + y * a->lcols + x],
                               pf[b->offset + (a->row0 + y) * b->cols + a->col0 + x]);
      }
      free(pp);
      gj_layout_free(&part);
    }
  /* Statistics: fc_in ~ truncated normal with sigma 1/sqrt(D), within 2 sigma. */
  const gj_tensor *t = gj_layout_find(&full, "transformer.h.0.mlp.fc_in.weight");
  double s2 = 0, sigma = 1 / sqrt(64.0), mx = 0;
  for (size_t k = 0; k < t->numel; k++) {
    double v = pf[t->offset + k];
    s2 += v * v;
    mx = fabs(v) > mx ? fabs(v) : mx;
  }
  double sd = sqrt(s2 / t->numel);
  /* a normal truncated at 2 sigma has sd 0.8796 sigma */
  ck_assert_double_le(fabs(sd / sigma - 0.8796), 0.02);
  ck_assert_double_le(mx, 2 * sigma + 1e-6);
  ck_assert_float_eq(pf[gj_layout_find(&full, "transformer.ln_f.weight")->offset], 1.0f);
  ck_assert_float_eq(pf[gj_layout_find(&full, "lm_head.bias")->offset + 3], 0.0f);
  /* Another seed gives other values. */
  float *pg = gj_alloc(full.numel * sizeof(float));
  gj_params_init(&full, &c, pg, 1235);
  ck_assert(pg[t->offset] != pf[t->offset]);
  free(pf), free(pg);
  gj_layout_free(&full);
}
END_TEST

/* The loader: each DP rank's part of a global batch (as gptj train indexes it) is disjoint
 * from the others and their union is the global batch, for DP 1, 2, 4; the same global
 * batches whatever DP is; a loader restored from a saved state continues identically,
 * across epoch boundaries. */
START_TEST(test_loader) {
  gj_dataset ds;
  uint16_t *tokens = malloc(1001 * sizeof(uint16_t));
  for (uint64_t i = 0; i < 1001; i++) tokens[i] = (uint16_t)(i % 50000);
  gj_dataset_wrap(&ds, tokens, 1001, 50257, "synthetic");
  const int64_t T = 8, G = 16, A = 2; /* 125 windows, 16 per global batch */
  uint64_t ref[40][16];
  for (int dp = 1; dp <= 4; dp *= 2) {
    gj_loader l;
    ck_assert_int_eq(gj_loader_init(&l, &ds, T, 99, 1), 0);
    ck_assert_int_eq(l.n_windows, 125);
    int64_t B = G / (A * dp);
    for (int step = 0; step < 40; step++) { /* 40 x 16 > 125: several epochs */
      uint64_t win[16];
      ck_assert_int_eq(gj_loader_next(&l, G, win), 0);
      int seen[125] = {0}, count = 0;
      for (int r = 0; r < dp; r++)
        for (int64_t a = 0; a < A; a++)
          for (int64_t b = 0; b < B; b++) {
            uint64_t w = win[(r * A + a) * B + b];
            ck_assert_uint_lt(w, 125);
            ck_assert_int_eq(seen[w], 0); /* disjoint */
            seen[w] = 1, count++;
          }
      ck_assert_int_eq(count, G); /* the union is the whole global batch */
      if (dp == 1) memcpy(ref[step], win, sizeof win);
      else ck_assert(!memcmp(ref[step], win, sizeof win));
      int32_t ids[8], tg[8];
      ck_assert_int_eq(gj_loader_window(&l, win[0], ids, tg), 0);
      for (int i = 0; i < T; i++) {
        ck_assert_int_eq(ids[i], tokens[win[0] * T + i]);
        ck_assert_int_eq(tg[i], tokens[win[0] * T + i + 1]);
      }
    }
    gj_loader_free(&l);
  }
  /* restore from a saved state, mid-epoch and right at an epoch's end, in the first epoch and
   * in later ones (7 global batches an epoch: 125 windows, 16 a batch) */
  const int stops[] = {3, 7, 10, 17};
  for (int si = 0; si < 4; si++) {
    const int stop = stops[si];
    gj_loader a, b;
    gj_loader_init(&a, &ds, T, 5, 1);
    uint64_t wa[16], wb[16];
    for (int s2 = 0; s2 < stop; s2++) gj_loader_next(&a, G, wa);
    gj_loader_state st = a.st;
    ck_assert_uint_eq(st.epoch, (uint64_t)((stop - 1) / 7));
    gj_loader_init(&b, &ds, T, 123, 1);
    ck_assert_int_eq(gj_loader_restore(&b, &st), 0);
    for (int s2 = 0; s2 < 20; s2++) {
      gj_loader_next(&a, G, wa), gj_loader_next(&b, G, wb);
      ck_assert(!memcmp(wa, wb, sizeof wa));
    }
    gj_loader_free(&a), gj_loader_free(&b);
  }
  /* windows a multiple of the global batch (128 of 16): an epoch is 8 batches, every window in
   * it once, none dropped; the 9th batch starts the next epoch */
  {
    uint16_t *t2 = malloc(1025 * sizeof(uint16_t));
    for (uint64_t i = 0; i < 1025; i++) t2[i] = (uint16_t)(i % 50000);
    gj_dataset d2;
    gj_dataset_wrap(&d2, t2, 1025, 50257, "synthetic");
    gj_loader l;
    ck_assert_int_eq(gj_loader_init(&l, &d2, T, 11, 1), 0);
    ck_assert_int_eq(l.n_windows, 128);
    int seen[128] = {0};
    uint64_t win[16];
    for (int step = 0; step < 8; step++) {
      ck_assert_int_eq(gj_loader_next(&l, G, win), 0);
      ck_assert_uint_eq(l.st.epoch, 0);
      for (int i = 0; i < G; i++) seen[win[i]]++;
    }
    for (int w = 0; w < 128; w++) ck_assert_int_eq(seen[w], 1);
    ck_assert_int_eq(gj_loader_next(&l, G, win), 0);
    ck_assert_uint_eq(l.st.epoch, 1);
    gj_loader_free(&l);
    free(t2);
  }
  /* a state from another dataset is refused */
  gj_loader c;
  gj_loader_init(&c, &ds, T, 1, 1);
  ck_assert_int_eq(gj_loader_restore(&c, &(gj_loader_state){.seed = 1, .cursor = 500}), -1);
  gj_loader_free(&c);
  free(tokens);
}
END_TEST


/* A gj_data over wrapped token arrays: corpus k is shards first[k] .. first[k+1]-1. */
static void wrap_data(gj_data *d, gj_dataset *shards, int n_shards, const int *first, const double *w, int nc) {
  memset(d, 0, sizeof *d);
  d->shard = shards, d->n_shards = n_shards, d->n_corpora = nc;
  double sum = 0;
  for (int k = 0; k < nc; k++) sum += w[k];
  for (int k = 0; k <= nc; k++) d->first[k] = first[k];
  for (int k = 0; k < nc; k++) d->weight[k] = w[k] / sum, snprintf(d->name[k], sizeof d->name[k], "c%d", k);
  for (int i = 0; i < n_shards; i++) d->n_tokens += shards[i].n_tokens;
}

/* Blends: over many batches each corpus's count stays within 1 of its share (0.3/0.7,
 * 0.001/0.999, three corpora); a corpus used up starts a new epoch alone, each epoch a
 * permutation of its windows; windows never cross a shard's end and read their own shard;
 * the order is the same for any global batch size; a restored state continues identically;
 * a state of another blend (weights, windows, one corpus) is refused. */
START_TEST(test_blend) {
  enum { NS = 4, T = 8 };
  const uint64_t len[NS] = {41, 801, 1601, 8001}; /* 5, 100, 200, 1000 windows */
  uint16_t *tok[NS];
  gj_dataset sh[NS];
  for (int i = 0; i < NS; i++) {
    tok[i] = malloc(len[i] * sizeof(uint16_t));
    for (uint64_t j = 0; j < len[i]; j++) tok[i][j] = (uint16_t)(10000 * i + j % 9973); /* the shard in the id */
    gj_dataset_wrap(&sh[i], tok[i], len[i], 50257, "shard");
  }
  struct { int nc, first[4]; double w[3]; } cases[] = {
      {2, {0, 1, 4}, {0.3, 0.7}}, {2, {0, 2, 4}, {0.001, 0.999}}, {2, {0, 3, 4}, {0.999, 0.001}},
      {3, {0, 1, 3, 4}, {5, 2, 3}}, {2, {0, 1, 4}, {0.5, 0.5}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    gj_data d;
    wrap_data(&d, sh, NS, cases[c].first, cases[c].w, cases[c].nc);
    gj_loader l, l1;
    ck_assert_int_eq(gj_loader_init_data(&l, &d, T, 7, "spec"), 0);
    ck_assert_int_eq(gj_loader_init_data(&l1, &d, T, 7, "spec"), 0);
    uint64_t count[3] = {0}, n = 0, win[64], w1;
    uint64_t *seen = calloc(l.n_windows, sizeof *seen); /* draws of each window */
    for (int step = 0; step < 300; step++) {
      ck_assert_int_eq(gj_loader_next(&l, 37, win), 0);
      for (int j = 0; j < 37; j++, n++) {
        ck_assert_int_eq(gj_loader_next(&l1, 1, &w1), 0); /* the same order, one at a time */
        ck_assert_uint_eq(w1, win[j]);
        int k = gj_loader_corpus_of(&l, win[j]);
        count[k]++, seen[win[j]]++;
        for (int q = 0; q < cases[c].nc; q++) /* the largest deficit first keeps each within 1 */
          ck_assert_msg(fabs((double)count[q] - d.weight[q] * (double)(n + 1)) <= 1.0, "case %zu corpus %d: %llu of %llu",
                        c, q, (unsigned long long)count[q], (unsigned long long)n + 1);
        /* each corpus is in its epoch e: every window of it drawn e or e+1 times */
        uint64_t nk = l.st.windows[k], e = (count[k] - 1) / nk;
        ck_assert_uint_ge(seen[win[j]], 1);
        ck_assert_uint_le(seen[win[j]], e + 1);
        int32_t ids[T], tg[T];
        ck_assert_int_eq(gj_loader_window(&l, win[j], ids, tg), 0);
        int s = ids[0] / 10000; /* the shard the window was read from */
        ck_assert_int_ge(s, d.first[k]);
        ck_assert_int_lt(s, d.first[k + 1]);
        for (int i = 0; i < T; i++) ck_assert_int_eq(tg[i] / 10000, s); /* not across its end */
      }
    }
    /* whole epochs: a corpus drawn m times has each window floor(m/n) or that + 1 times */
    for (int k = 0; k < cases[c].nc; k++) {
      uint64_t nk = l.st.windows[k], e = count[k] / nk;
      for (uint64_t w = l.corpus_first[k]; w < l.corpus_first[k + 1]; w++)
        ck_assert(seen[w] == e || seen[w] == e + 1);
      ck_assert_uint_eq(l.st.drawn[k], count[k]);
    }
    /* restore mid-run into a loader with another seed: the same continuation */
    gj_loader b;
    ck_assert_int_eq(gj_loader_init_data(&b, &d, T, 99, "spec"), 0);
    ck_assert_int_eq(gj_loader_restore(&b, &l.st), 0);
    uint64_t wa[64], wb[64];
    for (int step = 0; step < 20; step++) {
      gj_loader_next(&l, 64, wa), gj_loader_next(&b, 64, wb);
      ck_assert(!memcmp(wa, wb, sizeof wa));
    }
    gj_loader_state bad = l.st;
    bad.weight[0] = nextafter(bad.weight[0], 1.0);
    ck_assert_int_eq(gj_loader_restore(&b, &bad), -1);
    ck_assert_ptr_nonnull(strstr(gj_errmsg(), "share"));
    bad = l.st, bad.windows[1]++;
    ck_assert_int_eq(gj_loader_restore(&b, &bad), -1);
    ck_assert_ptr_nonnull(strstr(gj_errmsg(), "windows"));
    bad = l.st, bad.drawn[0]++;
    ck_assert_int_eq(gj_loader_restore(&b, &bad), -1);
    /* counts whose sum wraps around to the cursor */
    bad = l.st, bad.drawn[0] += (uint64_t)1 << 63, bad.drawn[1] += (uint64_t)1 << 63;
    ck_assert_int_eq(gj_loader_restore(&b, &bad), -1);
    ck_assert_ptr_nonnull(strstr(gj_errmsg(), "add up to more than the cursor"));
    ck_assert_int_eq(gj_loader_restore(&b, &(gj_loader_state){.seed = 7, .epoch = 2, .cursor = 10}), -1); /* a one-corpus state */
    ck_assert_ptr_nonnull(strstr(gj_errmsg(), "corpora"));
    ck_assert_int_eq(gj_loader_restore(&b, &(gj_loader_state){.seed = 7}), 0); /* a fresh one (convert) */
    ck_assert_int_eq(b.st.cursor, 0);
    gj_loader single;
    ck_assert_int_eq(gj_loader_init(&single, &sh[3], T, 7, 1), 0);
    ck_assert_int_eq(gj_loader_restore(&single, &l.st), -1); /* a blend's state, one corpus */
    free(seen);
    gj_loader_free(&l), gj_loader_free(&l1), gj_loader_free(&b), gj_loader_free(&single);
  }
  /* one corpus of several shards: the one-corpus order over all their windows */
  gj_data d;
  wrap_data(&d, sh, 3, (int[]){0, 3}, (double[]){1}, 1);
  gj_loader l;
  ck_assert_int_eq(gj_loader_init_data(&l, &d, T, 7, "a+b+c"), 0);
  ck_assert_int_eq(l.n_windows, 305);
  uint64_t win[305];
  ck_assert_int_eq(gj_loader_next(&l, 305, win), 0);
  int *hit = calloc(305, sizeof *hit);
  for (int j = 0; j < 305; j++) ck_assert_int_eq(hit[win[j]]++, 0);
  free(hit);
  gj_loader_free(&l);
  /* a corpus without a window */
  wrap_data(&d, sh, 2, (int[]){0, 1, 2}, (double[]){1, 1}, 2);
  ck_assert_int_eq(gj_loader_init_data(&l, &d, 64, 7, "x"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "fewer than one window"));
  gj_loader_free(&l);
  for (int i = 0; i < NS; i++) free(tok[i]);
}
END_TEST

/* --data parsing: weights, '+' lists, directories (name order, *.h5 and Megatron pairs), and
 * the refusals (a weight that is not a positive number, a missing shard, an empty item or
 * directory, too many corpora). */
START_TEST(test_data_spec) {
  char dir[] = "/tmp/gj-test-blend-XXXXXX", p[512], spec[4096];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  uint16_t ids[100];
  for (int i = 0; i < 100; i++) ids[i] = (uint16_t)i;
  uint64_t offs[2] = {0, 100};
  snprintf(p, sizeof p, "%s/shards", dir);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  const char *names[] = {"shards/b.h5", "shards/a.h5", "shards/c.h5", "one.h5", "x:y.h5"};
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    offs[1] = 100 - (uint64_t)i;
    ck_assert_int_eq(gj_dataset_write(p, ids, offs[1], offs, 1, 400, "test"), 0);
  }
  snprintf(p, sizeof p, "%s/shards/README", dir); /* not a dataset: left out */
  FILE *f = fopen(p, "w");
  fputs("hi\n", f), fclose(f);
  gj_data d;
  snprintf(spec, sizeof spec, "3:%s/shards,1:%s/one.h5+%s/one.h5,%s/x:y.h5", dir, dir, dir, dir);
  ck_assert_msg(gj_data_open(&d, spec, "--data", 0) == 0, "%s", gj_errmsg());
  ck_assert_int_eq(d.n_corpora, 3);
  ck_assert_int_eq(d.n_shards, 6);
  ck_assert_int_eq(d.first[1], 3);
  ck_assert_int_eq(d.first[2], 5);
  ck_assert_int_eq(d.first[3], 6);
  ck_assert(fabs(d.weight[0] - 0.6) < 1e-15 && fabs(d.weight[1] - 0.2) < 1e-15 && fabs(d.weight[2] - 0.2) < 1e-15);
  ck_assert_uint_eq(d.shard[0].n_tokens, 99); /* a, b, c */
  ck_assert_uint_eq(d.shard[1].n_tokens, 100);
  ck_assert_uint_eq(d.shard[2].n_tokens, 98);
  ck_assert_uint_eq(d.shard[5].n_tokens, 96);
  ck_assert_uint_eq(gj_data_corpus_tokens(&d, 0), 297);
  ck_assert_uint_eq(d.n_tokens, 297 + 2 * 97 + 96);
  gj_data_free(&d);
  /* weights whose sum overflows: the shares are still theirs (not 0, which no checkpoint holds) */
  snprintf(spec, sizeof spec, "1e308:%s/one.h5,1e308:%s/one.h5,5e307:%s/one.h5", dir, dir, dir);
  ck_assert_msg(gj_data_open(&d, spec, "--data", 0) == 0, "%s", gj_errmsg());
  ck_assert(fabs(d.weight[0] - 0.4) < 1e-15 && fabs(d.weight[1] - 0.4) < 1e-15 && fabs(d.weight[2] - 0.2) < 1e-15);
  gj_data_free(&d);
  struct { const char *fmt, *err; } bad[] = {
      {"abc:%s/one.h5", "is not a weight"}, {"0:%s/one.h5", "not positive"}, {"-1:%s/one.h5", "not positive"},
      {"nan:%s/one.h5", "is not a weight"}, {"1e999:%s/one.h5", "is not a weight"}, {":%s/one.h5", "is not a weight"},
      {"1:%s/one.h5+%s/missing.h5", "missing.h5"}, {"1:%s/one.h5,,1:%s/one.h5", "empty item"},
      {"1:%s/one.h5+", "empty shard"}, {"2:", "without a path"}, {"%s/shards/README-none", "README-none"},
      {"1e-300:%s/one.h5,1e300:%s/one.h5", "weight 1e-300 of"},
      {"0x10:%s/one.h5", "'0x10' in"}, {" 1:%s/one.h5", "' 1' in"}, {"1e+:%s/one.h5", "is not a weight"}, {"", "empty"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(spec, sizeof spec, bad[i].fmt, dir, dir);
    ck_assert_int_eq(gj_data_open(&d, spec, "--data", 0), -1);
    ck_assert_msg(strstr(gj_errmsg(), bad[i].err), "%s: %s", spec, gj_errmsg());
    gj_data_free(&d);
  }
  snprintf(p, sizeof p, "%s/empty", dir);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  ck_assert_int_eq(gj_data_open(&d, p, "--data", 0), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "no token datasets"));
  size_t at = 0;
  for (int i = 0; i <= GJ_MAX_CORPORA; i++) at += (size_t)snprintf(spec + at, sizeof spec - at, "%s%s/one.h5", i ? "," : "", dir);
  ck_assert_int_lt(at, sizeof spec);
  ck_assert_int_eq(gj_data_open(&d, spec, "--data", 0), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "more than 64 corpora"));
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The documented upper bounds of gj_config_validate: each field at its bound passes, one
 * above (or 0, or negative, or INT64_MAX) is refused naming the key; the parameter count is
 * bounded without overflowing; the table and the size pass refuse what validation refuses. */
START_TEST(test_limits) {
  struct { const char *key; int64_t max; } f[] = {
      {"vocab_size", GJ_MAX_VOCAB}, {"n_positions", GJ_MAX_POSITIONS}, {"n_embd", GJ_MAX_EMBD},
      {"n_layer", GJ_MAX_LAYER},    {"n_head", GJ_MAX_EMBD},          {"n_inner", GJ_MAX_INNER}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    int64_t bad[] = {f[i].max + 1, 0, -1, INT64_MAX, INT64_MIN};
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
      gj_config c = {64, 32, 64, 1, 4, 8, 64, 1e-5};
      int64_t *dst = !strcmp(f[i].key, "vocab_size") ? &c.vocab_size : !strcmp(f[i].key, "n_positions") ? &c.n_positions
                     : !strcmp(f[i].key, "n_embd") ? &c.n_embd : !strcmp(f[i].key, "n_layer") ? &c.n_layer
                     : !strcmp(f[i].key, "n_head") ? &c.n_head : &c.n_inner;
      *dst = bad[j];
      ck_assert_int_eq(gj_config_validate(&c), -1);
      ck_assert_msg(strstr(gj_errmsg(), f[i].key) != NULL, "%s = %lld: %s", f[i].key, (long long)bad[j], gj_errmsg());
      gj_layout l; /* the table needs every size but n_positions */
      if (strcmp(f[i].key, "n_positions")) ck_assert_int_eq(gj_layout_build(&l, &c, 1, 0), -1);
    }
  }
  /* each bound itself is valid (the others small) */
  gj_config at[] = {{GJ_MAX_VOCAB, 32, 64, 1, 4, 8, 64, 1e-5}, {64, GJ_MAX_POSITIONS, 64, 1, 4, 8, 64, 1e-5},
                    {64, 32, GJ_MAX_EMBD, 1, GJ_MAX_EMBD, 0, 64, 1e-5}, {64, 32, 64, GJ_MAX_LAYER, 4, 8, 64, 1e-5},
                    {64, 32, 64, 1, 4, 8, GJ_MAX_INNER, 1e-5}, {64, 32, 64, 1, 4, 8, 64, 1.0}};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    ck_assert_msg(gj_config_validate(&at[i]) == 0, "bound %zu: %s", i, gj_errmsg());
    ck_assert_int_le(gj_config_n_params(&at[i]), GJ_MAX_PARAMS);
  }
  gj_layout l;
  ck_assert_int_eq(gj_layout_build(&l, &at[3], 1, 0), 0); /* 4096 layers: 40966 tensors */
  ck_assert_int_eq(l.n, gj_layout_count(GJ_MAX_LAYER));
  ck_assert_ptr_eq(gj_layout_find(&l, "transformer.h.4095.mlp.fc_out.bias"),
                   gj_layout_block(&l, 4095, GJ_BLK_FC_OUT_B));
  ck_assert_ptr_eq(gj_layout_find(&l, "lm_head.bias"), gj_layout_tail(&l, GJ_TAIL_LM_B));
  ck_assert_ptr_null(gj_layout_find(&l, "transformer.h.4096.ln_1.weight"));
  gj_layout_free(&l);
  /* every factor in range, the product not: refused, and computed without overflow */
  gj_config huge = {GJ_MAX_VOCAB, 2048, GJ_MAX_EMBD, GJ_MAX_LAYER, 64, 64, GJ_MAX_INNER, 1e-5};
  ck_assert_int_gt(gj_config_n_params(&huge), GJ_MAX_PARAMS);
  ck_assert_int_eq(gj_config_validate(&huge), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "parameters, more than the limit"));
  /* layer_norm_epsilon: finite, in (0, 1] */
  double eps[] = {0.0, -1e-5, 1.5, NAN, INFINITY};
  for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
    gj_config c = {64, 32, 64, 1, 4, 8, 64, eps[i]};
    ck_assert_int_eq(gj_config_validate(&c), -1);
    ck_assert_ptr_nonnull(strstr(gj_errmsg(), "layer_norm_epsilon"));
  }
  /* every preset stays valid, gptj-6b included */
  gj_config c;
  ck_assert_int_eq(gj_config_preset(&c, "gptj-6b"), 0);
  ck_assert_int_eq(gj_config_validate(&c), 0);
  /* the size pass refuses a batch whose activations overflow, instead of wrapping */
  gj_mem_sizes ms;
  gj_config wide = {GJ_MAX_VOCAB, GJ_MAX_POSITIONS, 64, 1, 4, 8, 64, 1e-5};
  ck_assert_int_eq(gj_model_sizes(&ms, &wide, 1, 1, 0, 0, 0, 1 << 20, GJ_MAX_POSITIONS, 1), -1); /* logits 2^64 */
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "activations of a micro-batch"));
  ck_assert_int_eq(gj_model_sizes(&ms, &c, 1, 1, 0, 0, 1, 1, 2048, 1), 0);
  ck_assert_int_eq(gj_model_sizes(&ms, &c, 1, 1, 0, 0, 1, 1, 4096, 1), -1); /* beyond n_positions */
}
END_TEST

/* gj_layout_find finds every name of the table and nothing else. */
START_TEST(test_layout_find) {
  gj_config c;
  gj_config_preset(&c, "tiny");
  c.n_layer = 12;
  gj_layout l;
  ck_assert_int_eq(gj_layout_build(&l, &c, 1, 0), 0);
  for (int i = 0; i < l.n; i++) ck_assert_ptr_eq(gj_layout_find(&l, l.t[i].name), &l.t[i]);
  const char *no[] = {"", "transformer.h.", "transformer.h.12.ln_1.weight", "transformer.h.01.ln_1.weight",
                      "transformer.h.-1.ln_1.weight", "transformer.h.1.ln_1.weightx", "transformer.h.1.ln_1",
                      "transformer.h.1", "transformer.h.1.", "transformer.h.99999999999.ln_1.weight",
                      "lm_head.weigh", "transformer.wte.weight ", "h.0.ln_1.weight", "transformer.h.1.attn.bias"};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    ck_assert_msg(gj_layout_find(&l, no[i]) == NULL, "'%s' found", no[i]);
  gj_layout_free(&l);
}
END_TEST

/* The shuffled order is a bijection on [0, n) for many n (1, 2, primes, 2^k - 1, 2^k,
 * 2^k + 1), differs from the identity when n > 4, and depends on the key. */
START_TEST(test_permute) {
  uint64_t sizes[64];
  int ns = 0;
  for (uint64_t n = 1; n <= 40; n++) sizes[ns++] = n;
  const uint64_t more[] = {61, 97, 127, 128, 129, 255, 256, 257, 1021, 1023, 1024, 1025, 4093, 4095,
                           4096, 4097, 65521, 65535, 65536, 65537};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) sizes[ns++] = more[i];
  unsigned char *seen = malloc(65537);
  for (int k = 0; k < ns; k++) {
    uint64_t n = sizes[k];
    for (uint64_t key = 1; key <= 3; key++) {
      memset(seen, 0, n);
      uint64_t fixed = 0, same = 0;
      for (uint64_t i = 0; i < n; i++) {
        uint64_t p = gj_loader_permute(n, gj_loader_key(key, 0), i);
        ck_assert_msg(p < n, "n %llu: %llu -> %llu", (unsigned long long)n, (unsigned long long)i, (unsigned long long)p);
        ck_assert_msg(!seen[p], "n %llu: %llu appears twice", (unsigned long long)n, (unsigned long long)p);
        seen[p] = 1, fixed += p == i;
        same += p == gj_loader_permute(n, gj_loader_key(key, 1), i);
      }
      if (n > 4) ck_assert_msg(fixed < n, "n %llu: the identity", (unsigned long long)n);
      if (n > 4) ck_assert_msg(same < n, "n %llu: epochs 0 and 1 in the same order", (unsigned long long)n);
    }
  }
  free(seen);
  /* large n: a sample is in range and without collisions among nearby positions */
  const uint64_t big = ((uint64_t)1 << 40) + 3;
  uint64_t v[256];
  for (int i = 0; i < 256; i++) {
    v[i] = gj_loader_permute(big, 77, (uint64_t)i);
    ck_assert(v[i] < big);
    for (int j = 0; j < i; j++) ck_assert(v[j] != v[i]);
  }
}
END_TEST

/* A token file as another tool may write it: /tokens uint16 or uint32, contiguous or chunked
 * (deflate). */
static void write_tokens(const char *path, const uint32_t *ids, uint64_t n, int u32, int chunked, int64_t vocab) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert(f >= 0);
  hsize_t dn = n, ch = 100, no = 2;
  hid_t sp = H5Screate_simple(1, &dn, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunked) H5Pset_chunk(dcpl, 1, &ch), H5Pset_deflate(dcpl, 1);
  hid_t d = H5Dcreate2(f, "tokens", u32 ? H5T_STD_U32LE : H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ck_assert(d >= 0 && H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids) >= 0);
  H5Dclose(d), H5Sclose(sp), H5Pclose(dcpl);
  uint64_t offs[2] = {0, n};
  sp = H5Screate_simple(1, &no, NULL);
  d = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offs);
  H5Dclose(d), H5Sclose(sp);
  const char *names[] = {"n_tokens", "n_docs", "n_bytes", "vocab_size"};
  int64_t vals[] = {(int64_t)n, 1, 4 * (int64_t)n, vocab};
  hid_t as = H5Screate(H5S_SCALAR);
  for (int i = 0; i < 4; i++) {
    hid_t a = H5Acreate2(f, names[i], H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &vals[i]);
    H5Aclose(a);
  }
  H5Sclose(as);
  ck_assert(H5Fclose(f) >= 0);
}

/* Datasets are read on demand, the same from every layout: uint16 and uint32 ids, contiguous
 * (mapped) and chunked (hyperslab reads); a file written by gj_dataset_write (today's chunked
 * files); ranges past the end and ids outside the vocabulary fail, naming the file and the
 * token. */
START_TEST(test_dataset_read) {
  char dir[] = "/tmp/gj-test-dataset-XXXXXX", path[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  const uint64_t n = 1234;
  uint32_t *ids = malloc(n * sizeof(uint32_t));
  uint16_t *ids16 = malloc(n * sizeof(uint16_t));
  int32_t got[300], *all = malloc(n * sizeof(int32_t));
  for (int u32 = 0; u32 <= 1; u32++)
    for (int chunked = 0; chunked <= 2; chunked++) {
      const int64_t V = u32 ? 100000 : 50257;
      for (uint64_t i = 0; i < n; i++) ids[i] = (uint32_t)((i * 7919 + 13) % (uint64_t)V), ids16[i] = (uint16_t)ids[i];
      snprintf(path, sizeof path, "%s/t%d%d.h5", dir, u32, chunked);
      if (chunked == 2) { /* gptj's own writer: uint16 only */
        if (u32) continue;
        uint64_t offs[2] = {0, n};
        ck_assert_int_eq(gj_dataset_write(path, ids16, n, offs, 1, 4 * n, "test"), 0);
      } else {
        write_tokens(path, ids, n, u32, chunked, V);
      }
      gj_dataset d;
      ck_assert_msg(gj_dataset_open(&d, path, 0) == 0, "%s: %s", path, gj_errmsg());
      ck_assert_int_eq(d.n_tokens, n);
      ck_assert_int_eq(d.width, u32 ? 4 : 2);
      ck_assert_msg(chunked ? d.map == NULL : d.map != NULL, "%s: mapped %d", path, d.map != NULL);
      const uint64_t starts[] = {0, 1, 99, 100, 555, n - 300};
      for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) {
        ck_assert_int_eq(gj_dataset_get(&d, starts[k], 300, got), 0);
        for (int i = 0; i < 300; i++) ck_assert_int_eq(got[i], (int32_t)ids[starts[k] + i]);
      }
      ck_assert_int_eq(gj_dataset_get(&d, n, 0, got), 0);
      ck_assert_int_eq(gj_dataset_get(&d, n - 5, 6, got), -1);
      ck_assert_ptr_nonnull(strstr(gj_errmsg(), "beyond its 1234 tokens"));
      gj_dataset_advise(&d, 10, 100);
      gj_loader l;
      ck_assert_int_eq(gj_loader_init(&l, &d, 16, 3, 1), 0);
      uint64_t win[4];
      int32_t a[16], b[16];
      ck_assert_int_eq(gj_loader_next(&l, 4, win), 0);
      ck_assert_int_eq(gj_loader_window(&l, win[2], a, b), 0);
      for (int i = 0; i < 16; i++) {
        ck_assert_int_eq(a[i], (int32_t)ids[win[2] * 16 + i]);
        ck_assert_int_eq(b[i], (int32_t)ids[win[2] * 16 + i + 1]);
      }
      gj_loader_free(&l);
      gj_dataset_free(&d);
      /* against a smaller model vocabulary: the first id at or above it is named */
      ck_assert_int_eq(gj_dataset_open(&d, path, 1000), 0);
      uint64_t first = 0;
      while (ids[first] < 1000) first++;
      ck_assert_int_eq(gj_dataset_get(&d, 0, n, all), -1);
      char want[512];
      snprintf(want, sizeof want, "%s: token %llu has id %u, not below the vocabulary size 1000", path,
               (unsigned long long)first, ids[first]);
      ck_assert_msg(strstr(gj_errmsg(), want), "%s vs %s", gj_errmsg(), want);
      gj_dataset_free(&d);
      gj_dataset_free(&d); /* twice: harmless */
      unlink(path);
    }
  free(ids), free(ids16), free(all);
  rmdir(dir);
}
END_TEST

/* A Megatron indexed dataset written from the MMIDIDX definition (io/megatron.h): PREFIX.bin
 * holds the ids of the S sequences one after another (width w, little-endian); PREFIX.idx the
 * header (magic, version 1, dtype code, S, D), int32 lengths, int64 byte pointers and the D
 * int64 document indices. seq[S + 1]: the sequences' token boundaries; docs[D]. */
static void put_le(FILE *f, uint64_t v, int w) {
  for (int b = 0; b < w; b++) fputc((int)(v >> (8 * b) & 0xff), f);
}
static void write_megatron(const char *prefix, const int64_t *ids, const uint64_t *seq, uint64_t S,
                           const uint64_t *docs, uint64_t D, int code, int w) {
  char p[512];
  snprintf(p, sizeof p, "%s.bin", prefix);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  for (uint64_t i = 0; i < seq[S]; i++) put_le(f, (uint64_t)ids[i], w);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(p, sizeof p, "%s.idx", prefix);
  f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  fwrite("MMIDIDX\0\0", 1, 9, f);
  put_le(f, 1, 8), put_le(f, (uint64_t)code, 1), put_le(f, S, 8), put_le(f, D, 8);
  for (uint64_t i = 0; i < S; i++) put_le(f, seq[i + 1] - seq[i], 4);
  for (uint64_t i = 0; i < S; i++) put_le(f, seq[i] * (uint64_t)w, 8);
  for (uint64_t i = 0; i < D; i++) put_le(f, docs[i], 8);
  ck_assert_int_eq(fclose(f), 0);
}

/* Megatron datasets of every integer dtype read as the same token stream (the concatenation of
 * the sequences, an empty one among them), by prefix, PREFIX.bin or PREFIX.idx; negative ids
 * and ids beyond the vocabulary fail as read, naming the .bin and the token; float dtypes and
 * an index whose pointers disagree with the .bin are refused at open. */
START_TEST(test_megatron_read) {
  char dir[] = "/tmp/gj-test-megatron-XXXXXX", prefix[256], path[300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(prefix, sizeof prefix, "%s/corpus_text_document", dir);
  const uint64_t n = 1000, S = 7;
  const uint64_t seq[8] = {0, 100, 100, 333, 500, 501, 900, 1000}, docs[4] = {0, 2, 5, 7};
  int64_t *ids = malloc(n * sizeof(int64_t));
  int32_t *got = malloc(n * sizeof(int32_t));
  const struct { int code, w; int64_t V; } ts[] = {{1, 1, 256}, {3, 2, 32768}, {8, 2, 50257}, {4, 4, 100000}, {5, 8, 100000}};
  for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++) {
    for (uint64_t i = 0; i < n; i++) ids[i] = (int64_t)((i * 7919 + 13) % (uint64_t)ts[t].V);
    write_megatron(prefix, ids, seq, S, docs, 4, ts[t].code, ts[t].w);
    const char *sfx[] = {"", ".bin", ".idx"};
    for (int k = 0; k < 3; k++) {
      snprintf(path, sizeof path, "%s%s", prefix, sfx[k]);
      gj_dataset d;
      ck_assert_msg(gj_dataset_open(&d, path, 0) == 0, "%s: %s", path, gj_errmsg());
      ck_assert_int_eq(d.n_tokens, n);
      ck_assert_int_eq(d.n_docs, 3);
      ck_assert_int_eq(d.n_seqs, S);
      ck_assert_int_eq(d.width, ts[t].w);
      ck_assert_str_eq(d.format, "megatron-mmidx");
      ck_assert_ptr_nonnull(d.map);
      const uint64_t starts[] = {0, 1, 99, 100, 555, n - 300};
      for (size_t j = 0; j < sizeof starts / sizeof starts[0]; j++) {
        ck_assert_int_eq(gj_dataset_get(&d, starts[j], 300, got), 0);
        for (int i = 0; i < 300; i++) ck_assert_int_eq(got[i], (int32_t)ids[starts[j] + i]);
      }
      ck_assert_int_eq(gj_dataset_get(&d, n - 5, 6, got), -1);
      gj_dataset_advise(&d, 10, 100);
      gj_loader l;
      ck_assert_int_eq(gj_loader_init(&l, &d, 16, 3, 1), 0);
      uint64_t win[4];
      int32_t a[16], b[16];
      ck_assert_int_eq(gj_loader_next(&l, 4, win), 0);
      ck_assert_int_eq(gj_loader_window(&l, win[1], a, b), 0);
      for (int i = 0; i < 16; i++) ck_assert_int_eq(b[i], (int32_t)ids[win[1] * 16 + i + 1]);
      gj_loader_free(&l);
      gj_dataset_free(&d);
    }
    /* against a smaller model vocabulary */
    gj_dataset d;
    ck_assert_int_eq(gj_dataset_open(&d, prefix, 100), 0);
    uint64_t first = 0;
    while (ids[first] < 100) first++;
    ck_assert_int_eq(gj_dataset_get(&d, 0, n, got), -1);
    char want[512];
    snprintf(want, sizeof want, "%s.bin: token %llu has id %lld, not below the vocabulary size 100", prefix,
             (unsigned long long)first, (long long)ids[first]);
    ck_assert_msg(strstr(gj_errmsg(), want), "%s vs %s", gj_errmsg(), want);
    gj_dataset_free(&d);
    if (ts[t].code != 1 && ts[t].code != 8) { /* signed: a negative id */
      ids[777] = -3;
      write_megatron(prefix, ids, seq, S, docs, 4, ts[t].code, ts[t].w);
      ck_assert_int_eq(gj_dataset_open(&d, prefix, 0), 0);
      ck_assert_int_eq(gj_dataset_get(&d, 700, 100, got), -1);
      ck_assert_ptr_nonnull(strstr(gj_errmsg(), "token 777 has the negative id -3"));
      gj_dataset_free(&d);
    }
  }
  /* float32 ids and a .bin longer than the index says are refused at open */
  write_megatron(prefix, ids, seq, S, docs, 4, 7, 4);
  gj_dataset d;
  ck_assert_int_eq(gj_dataset_open(&d, prefix, 0), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "dtype code 7 (float32) cannot hold token ids"));
  write_megatron(prefix, ids, seq, S, docs, 4, 8, 2);
  snprintf(path, sizeof path, "%s.bin", prefix);
  FILE *f = fopen(path, "ab");
  fputs("xx", f);
  fclose(f);
  ck_assert_int_eq(gj_dataset_open(&d, prefix, 0), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "the index does not match the .bin"));
  tu_sh("rm -rf %s", dir);
  free(ids), free(got);
}
END_TEST

/* The step losses of a run (metrics.jsonl), as text: n found. */
static int run_losses(const char *run, char losses[][32], int max) {
  char p[1400], line[4096];
  snprintf(p, sizeof p, "%s/metrics.jsonl", run);
  FILE *f = fopen(p, "r");
  int n = 0;
  while (f && n < max && fgets(line, sizeof line, f)) {
    char *l = strstr(line, "\"loss\": ");
    if (!l || !strstr(line, "\"step\": ")) continue;
    sscanf(l + 8, "%31[^,}]", losses[n++]);
  }
  if (f) fclose(f);
  return n;
}

/* The Brown validation text tokenized by gptj tokenize, and the same documents written as a
 * Megatron dataset (one sequence per document, its EOT included, as Megatron's preprocessor
 * with --append-eod writes it), uint16 and int32: the same token stream through
 * gj_dataset_get, and gptj train over each gives the same losses. */
START_TEST(test_megatron_tokenize) {
  char B[1024], S[1024], M[512], out[1200], data[1200], prefix[1300], cmd[4096];
  ck_assert_int_eq(tu_gptj_setup(B, S, M, out, data, 1024, "megatron"), 0);
  gj_dataset h;
  ck_assert_msg(gj_dataset_open(&h, data, 0) == 0, "%s", gj_errmsg());
  const uint64_t n = h.n_tokens, nd = h.n_docs;
  int32_t *a = malloc(n * sizeof(int32_t)), *b = malloc(n * sizeof(int32_t));
  int64_t *ids = malloc(n * sizeof(int64_t));
  uint64_t *offs = malloc((nd + 1) * sizeof(uint64_t)), *docs = malloc((nd + 1) * sizeof(uint64_t));
  ck_assert_int_eq(gj_dataset_get(&h, 0, n, a), 0);
  gj_dataset_free(&h);
  hid_t f = H5Fopen(data, H5F_ACC_RDONLY, H5P_DEFAULT), o = H5Dopen2(f, "doc_offsets", H5P_DEFAULT);
  ck_assert(H5Dread(o, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offs) >= 0);
  H5Dclose(o), H5Fclose(f);
  for (uint64_t i = 0; i < n; i++) ids[i] = a[i];
  for (uint64_t i = 0; i <= nd; i++) docs[i] = i;
  const struct { int code, w; const char *name; } ts[] = {{8, 2, "uint16"}, {4, 4, "int32"}};
  char ref[8][32], got[8][32];
  snprintf(cmd, sizeof cmd, "train --preset tiny --seq-len 32 --micro-batch 4 --steps 4 --seed 7 --lr 1e-3");
  ck_assert_int_eq(tu_sh("rm -rf %s/run-h5 && %s/gptj %s --data %s --run-dir %s/run-h5 >%s/h5.log 2>&1", out, B,
                         cmd, data, out, out), 0);
  ck_assert_int_eq(run_losses(strcat(strcpy(prefix, out), "/run-h5"), ref, 8), 4);
  for (int t = 0; t < 2; t++) {
    snprintf(prefix, sizeof prefix, "%s/valid_%s_document", out, ts[t].name);
    write_megatron(prefix, ids, offs, nd, docs, nd + 1, ts[t].code, ts[t].w);
    gj_dataset m;
    ck_assert_msg(gj_dataset_open(&m, prefix, 50400) == 0, "%s", gj_errmsg());
    ck_assert_int_eq(m.n_tokens, n);
    ck_assert_int_eq(m.n_docs, nd);
    ck_assert_int_eq(gj_dataset_get(&m, 0, n, b), 0);
    ck_assert_int_eq(memcmp(a, b, n * sizeof(int32_t)), 0);
    gj_dataset_free(&m);
    ck_assert_int_eq(tu_sh("%s/gptj info %s | grep -q '^tokens: %llu$'", B, prefix, (unsigned long long)n), 0);
    ck_assert_int_eq(tu_sh("%s/gptj info %s.idx | grep -q '^dtype: %s$'", B, prefix, ts[t].name), 0);
    ck_assert_int_eq(tu_sh("rm -rf %s/run-%s && %s/gptj %s --data %s.bin --run-dir %s/run-%s >%s/%s.log 2>&1", out,
                           ts[t].name, B, cmd, prefix, out, ts[t].name, out, ts[t].name), 0);
    char run[1400];
    snprintf(run, sizeof run, "%s/run-%s", out, ts[t].name);
    ck_assert_int_eq(run_losses(run, got, 8), 4);
    for (int k = 0; k < 4; k++) ck_assert_msg(!strcmp(ref[k], got[k]), "%s: step %d loss %s vs %s", ts[t].name, k + 1, got[k], ref[k]);
  }
  free(a), free(b), free(ids), free(offs), free(docs);
}
END_TEST

int main(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_test(tc, test_presets);
  tcase_add_test(tc, test_validation);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_layout_find);
  tcase_add_test(tc, test_layout);
  tcase_add_test(tc, test_init_sharded);
  tcase_add_test(tc, test_loader);
  tcase_add_test(tc, test_blend);
  tcase_add_test(tc, test_data_spec);
  tcase_add_test(tc, test_permute);
  tcase_add_test(tc, test_dataset_read);
  tcase_add_test(tc, test_megatron_read);
  tcase_add_test(tc, test_megatron_tokenize);
  tcase_add_test(tc, test_modelopts_order);
  tcase_add_test(tc, test_kvconf_roundtrip);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
