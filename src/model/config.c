#include "model/config.h"

#include <string.h>

#include "common.h"

const char *const gj_config_preset_names[] = {"tiny", "gptj-125m", "gptj-350m", "gptj-6b", NULL};

int gj_config_preset(gj_config *c, const char *name) {
  /* V is GPT-2's 50257 padded to 50400 as GPT-J does; context 2048 except tiny. */
  gj_config base = {50400, 2048, 0, 0, 0, 0, 0, 1e-5};
  if (!strcmp(name, "tiny")) {
    base.n_positions = 128, base.n_embd = 64, base.n_layer = 2, base.n_head = 4;
    base.rotary_dim = 8, base.n_inner = 256;
  } else if (!strcmp(name, "gptj-125m")) {
    base.n_embd = 768, base.n_layer = 12, base.n_head = 12, base.rotary_dim = 16;
    base.n_inner = 3072;
  } else if (!strcmp(name, "gptj-350m")) {
    base.n_embd = 1024, base.n_layer = 24, base.n_head = 16, base.rotary_dim = 16;
    base.n_inner = 4096;
  } else if (!strcmp(name, "gptj-6b")) {
    base.n_embd = 4096, base.n_layer = 28, base.n_head = 16, base.rotary_dim = 64;
    base.n_inner = 16384;
  } else {
    return GJ_FAIL("unknown preset '%s' (presets: tiny, gptj-125m, gptj-350m, gptj-6b)", name);
  }
  *c = base;
  return 0;
}

int gj_config_set(gj_config *c, const char *key, const char *value) {
  struct { const char *key; int64_t *dst; } ints[] = {
      {"vocab_size", &c->vocab_size}, {"n_positions", &c->n_positions},
      {"n_embd", &c->n_embd},         {"n_layer", &c->n_layer},
      {"n_head", &c->n_head},         {"rotary_dim", &c->rotary_dim},
      {"n_inner", &c->n_inner},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    if (strcmp(key, ints[i].key)) continue;
    int64_t v;
    if (gj_parse_i64(value, &v) || v <= 0 || v > ((int64_t)1 << 31))
      return GJ_FAIL("%s: expected a positive integer, got '%s'", key, value);
    *ints[i].dst = v;
    return 0;
  }
  if (!strcmp(key, "layer_norm_epsilon")) {
    double v;
    if (gj_parse_f64(value, &v) || !(v > 0) || v > 1)
      return GJ_FAIL("%s: expected a number in (0, 1], got '%s'", key, value);
    c->layer_norm_epsilon = v;
    return 0;
  }
  return 1;
}

int gj_config_validate(const gj_config *c) {
  if (c->vocab_size <= 0) return GJ_FAIL("vocab_size must be positive (got %lld)", (long long)c->vocab_size);
  if (c->n_positions <= 0) return GJ_FAIL("n_positions must be positive (got %lld)", (long long)c->n_positions);
  if (c->n_embd <= 0) return GJ_FAIL("n_embd must be positive (got %lld)", (long long)c->n_embd);
  if (c->n_layer <= 0) return GJ_FAIL("n_layer must be positive (got %lld)", (long long)c->n_layer);
  if (c->n_head <= 0) return GJ_FAIL("n_head must be positive (got %lld)", (long long)c->n_head);
  if (c->n_inner <= 0) return GJ_FAIL("n_inner must be positive (got %lld)", (long long)c->n_inner);
  if (c->n_embd % c->n_head)
    return GJ_FAIL("n_embd %lld is not divisible by n_head %lld", (long long)c->n_embd,
                   (long long)c->n_head);
  int64_t hd = c->n_embd / c->n_head;
  if (c->rotary_dim < 0 || c->rotary_dim % 2)
    return GJ_FAIL("rotary_dim %lld must be even and non-negative", (long long)c->rotary_dim);
  if (c->rotary_dim > hd)
    return GJ_FAIL("rotary_dim %lld is larger than the head dimension %lld (n_embd/n_head)",
                   (long long)c->rotary_dim, (long long)hd);
  if (!(c->layer_norm_epsilon > 0))
    return GJ_FAIL("layer_norm_epsilon must be positive (got %g)", c->layer_norm_epsilon);
  return 0;
}

int64_t gj_config_n_params(const gj_config *c) {
  int64_t V = c->vocab_size, D = c->n_embd, F = c->n_inner;
  int64_t block = 2 * D + 4 * D * D + F * D + F + D * F + D;
  return V * D + c->n_layer * block + 2 * D + V * D + V;
}
