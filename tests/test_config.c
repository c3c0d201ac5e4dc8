/* Config presets and validation; the parameter table; initialisation that is a function of
 * (seed, name, global index) so that every TP shard equals its slice of the 1-rank model. */
#include <check.h>

#include "common.h"
#include "model/config.h"
#include "model/params.h"
#include "io/loader.h"
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
  ck_assert_int_eq(l.n, 5 + 10 * 2);
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
  gj_dataset ds = {0};
  ds.n_tokens = 1001;
  ds.tokens = malloc(ds.n_tokens * sizeof(uint16_t));
  for (uint64_t i = 0; i < ds.n_tokens; i++) ds.tokens[i] = (uint16_t)(i % 50000);
  snprintf(ds.path, sizeof ds.path, "synthetic");
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
      gj_loader_window(&l, win[0], ids, tg);
      for (int i = 0; i < T; i++) ck_assert_int_eq(tg[i], ds.tokens[win[0] * T + i + 1]);
    }
    gj_loader_free(&l);
  }
  /* restore from a saved state, mid-epoch and right at an epoch's end */
  for (int stop = 3; stop <= 7; stop += 4) {
    gj_loader a, b;
    gj_loader_init(&a, &ds, T, 5, 1);
    uint64_t wa[16], wb[16];
    for (int s2 = 0; s2 < stop; s2++) gj_loader_next(&a, G, wa);
    gj_loader_state st = a.st;
    gj_loader_init(&b, &ds, T, 123, 1);
    ck_assert_int_eq(gj_loader_restore(&b, st), 0);
    for (int s2 = 0; s2 < 20; s2++) {
      gj_loader_next(&a, G, wa), gj_loader_next(&b, G, wb);
      ck_assert(!memcmp(wa, wb, sizeof wa));
    }
    gj_loader_free(&a), gj_loader_free(&b);
  }
  /* a state from another dataset is refused */
  gj_loader c;
  gj_loader_init(&c, &ds, T, 1, 1);
  ck_assert_int_eq(gj_loader_restore(&c, (gj_loader_state){1, 0, 500}), -1);
  gj_loader_free(&c);
  free(ds.tokens);
}
END_TEST

int main(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_test(tc, test_presets);
  tcase_add_test(tc, test_validation);
  tcase_add_test(tc, test_layout);
  tcase_add_test(tc, test_init_sharded);
  tcase_add_test(tc, test_loader);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
