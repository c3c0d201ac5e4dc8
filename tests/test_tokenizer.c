/* GPT-2 BPE: every golden case gives exactly its ids and decodes back to its text; the
 * whitespace-divergence cases follow Unicode White_Space; any byte string round-trips; the
 * Brown splits have the token counts of ../shared/data/README.md. */
#include <check.h>
#include <jansson.h>

#include "common.h"
#include "io/tokenizer.h"
#include "testutil.h"

static gj_tokenizer *tok;
static char srcdir[1024];

static void check_jsonl(const char *name, const char *ids_key) {
  char path[1200];
  snprintf(path, sizeof path, "%s/tests/golden/%s", srcdir, name);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *line = NULL;
  size_t cap = 0;
  int n = 0;
  while (getline(&line, &cap, f) > 0) {
    json_error_t err;
    json_t *o = json_loads(line, JSON_ALLOW_NUL, &err);
    ck_assert_ptr_nonnull(o);
    json_t *text = json_object_get(o, "text"), *ids = json_object_get(o, ids_key);
    ck_assert(json_is_string(text) && json_is_array(ids));
    gj_ids got = {0};
    ck_assert_int_eq(gj_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &got), 0);
    ck_assert_msg(got.n == json_array_size(ids), "%s line %d: %zu ids, expected %zu", name, n + 1,
                  got.n, json_array_size(ids));
    for (size_t i = 0; i < got.n; i++)
      ck_assert_msg(got.v[i] == json_integer_value(json_array_get(ids, i)), "%s line %d id %zu",
                    name, n + 1, i);
    gj_bytes back = {0};
    ck_assert_int_eq(gj_tokenizer_decode(tok, got.v, got.n, &back), 0);
    ck_assert_int_eq(back.n, json_string_length(text));
    ck_assert(!memcmp(back.v, json_string_value(text), back.n));
    free(got.v), free(back.v);
    json_decref(o);
    n++;
  }
  ck_assert_int_gt(n, 0);
  free(line);
  fclose(f);
}

START_TEST(test_golden_cases) { check_jsonl("tokenizer.jsonl", "ids"); }
END_TEST
START_TEST(test_white_space) { check_jsonl("tokenizer-ws-divergence.jsonl", "ids_unicode_white_space"); }
END_TEST

START_TEST(test_endoftext_is_text) {
  gj_ids got = {0};
  const char *s = "<|endoftext|>";
  ck_assert_int_eq(gj_tokenizer_encode(tok, s, strlen(s), &got), 0);
  int want[] = {27, 91, 437, 1659, 5239, 91, 29};
  ck_assert_int_eq(got.n, 7);
  for (int i = 0; i < 7; i++) ck_assert_int_eq(got.v[i], want[i]);
  free(got.v);
}
END_TEST

START_TEST(test_any_bytes_round_trip) {
  /* Random bytes (invalid UTF-8, NULs), and mixtures with text and long runs. */
  char buf[4096];
  for (int trial = 0; trial < 300; trial++) {
    size_t n = 1 + (size_t)((tu_rand() + 1) * 2000) % 4000;
    for (size_t i = 0; i < n; i++) {
      double r = tu_rand();
      static const char pool[] = "ab cd\xc3\xa9 12,!\n";
      buf[i] = r < -0.3 ? (char)(int)((tu_rand() + 1) * 128)
                        : (r < 0.5 ? pool[(int)((tu_rand() + 1) * 0.5 * (sizeof pool - 1))] : 'a');
    }
    gj_ids ids = {0};
    gj_bytes back = {0};
    ck_assert_int_eq(gj_tokenizer_encode(tok, buf, n, &ids), 0);
    ck_assert_int_eq(gj_tokenizer_decode(tok, ids.v, ids.n, &back), 0);
    ck_assert_int_eq(back.n, n);
    ck_assert(!memcmp(back.v, buf, n));
    free(ids.v), free(back.v);
  }
  /* A long piece with no break (a single 200 kB word) stays fast and exact. */
  size_t n = 200000;
  char *w = malloc(n);
  for (size_t i = 0; i < n; i++) w[i] = "abcab"[i % 5];
  gj_ids ids = {0};
  gj_bytes back = {0};
  ck_assert_int_eq(gj_tokenizer_encode(tok, w, n, &ids), 0);
  ck_assert_int_eq(gj_tokenizer_decode(tok, ids.v, ids.n, &back), 0);
  ck_assert(back.n == n && !memcmp(back.v, w, n));
  free(w), free(ids.v), free(back.v);
}
END_TEST

START_TEST(test_decode_bad_id) {
  int32_t ids[2] = {15496, 50257};
  gj_bytes b = {0};
  ck_assert_int_eq(gj_tokenizer_decode(tok, ids, 2, &b), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "50257"));
  free(b.v);
}
END_TEST

static size_t count_file(const char *name) {
  char path[1200];
  snprintf(path, sizeof path, "%s/data/%s", srcdir, name);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  gj_bytes b = {0};
  char buf[65536];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) gj_bytes_append(&b, buf, k);
  fclose(f);
  gj_ids ids = {0};
  ck_assert_int_eq(gj_tokenizer_encode(tok, b.v, b.n, &ids), 0);
  size_t n = ids.n;
  free(b.v), free(ids.v);
  return n;
}

START_TEST(test_brown_counts) {
  ck_assert_int_eq(count_file("brown-train.txt"), 1093677);
  ck_assert_int_eq(count_file("brown-valid.txt"), 63904);
  ck_assert_int_eq(count_file("brown-test.txt"), 64042);
}
END_TEST

START_TEST(test_bad_vocab_dir) {
  gj_tokenizer *t = NULL;
  ck_assert_int_eq(gj_tokenizer_load(&t, "/nonexistent/gpt2"), -1);
  ck_assert_ptr_nonnull(strstr(gj_errmsg(), "/nonexistent/gpt2"));
}
END_TEST

int main(void) {
  snprintf(srcdir, sizeof srcdir, "%s", tu_env("GJ_SRCDIR", "."));
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/data/gpt2", srcdir);
  if (gj_tokenizer_load(&tok, dir)) {
    fprintf(stderr, "%s\n", gj_errmsg());
    return 1;
  }
  Suite *s = suite_create("tokenizer");
  TCase *tc = tcase_create("tokenizer");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_golden_cases);
  tcase_add_test(tc, test_white_space);
  tcase_add_test(tc, test_endoftext_is_text);
  tcase_add_test(tc, test_any_bytes_round_trip);
  tcase_add_test(tc, test_decode_bad_id);
  tcase_add_test(tc, test_brown_counts);
  tcase_add_test(tc, test_bad_vocab_dir);
  suite_add_tcase(s, tc);
  int failed = tu_run(s);
  gj_tokenizer_free(tok);
  return failed;
}
