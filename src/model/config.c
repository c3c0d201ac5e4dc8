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
  /* min: the least value; rotary_dim 0 is no rotary embedding at all */
  struct { const char *key; int64_t *dst; int64_t min; } ints[] = {
      {"vocab_size", &c->vocab_size, 1}, {"n_positions", &c->n_positions, 1},
      {"n_embd", &c->n_embd, 1},         {"n_layer", &c->n_layer, 1},
      {"n_head", &c->n_head, 1},         {"rotary_dim", &c->rotary_dim, 0},
      {"n_inner", &c->n_inner, 1},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    if (strcmp(key, ints[i].key)) continue;
    int64_t v;
    if (gj_parse_i64(value, &v) || v < ints[i].min || v > ((int64_t)1 << 31))
      return GJ_FAIL("%s: expected a %s integer, got '%s'", key, ints[i].min ? "positive" : "non-negative", value);
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

int gj_config_check_sizes(const gj_config *c) {
  struct { const char *key; int64_t v, max; } f[] = {
      {"vocab_size", c->vocab_size, GJ_MAX_VOCAB}, {"n_embd", c->n_embd, GJ_MAX_EMBD},
      {"n_layer", c->n_layer, GJ_MAX_LAYER},       {"n_head", c->n_head, GJ_MAX_EMBD},
      {"n_inner", c->n_inner, GJ_MAX_INNER},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 1 || f[i].v > f[i].max)
      return GJ_FAIL("%s = %lld is out of range [1, %lld]", f[i].key, (long long)f[i].v,
                     (long long)f[i].max);
  /* every factor is bounded above, so this sum cannot overflow int64 (< 2^48) */
  int64_t n = gj_config_n_params(c);
  if (n > GJ_MAX_PARAMS)
    return GJ_FAIL("the model has %lld parameters, more than the limit %lld (vocab_size %lld, "
                   "n_embd %lld, n_layer %lld, n_inner %lld)", (long long)n, (long long)GJ_MAX_PARAMS,
                   (long long)c->vocab_size, (long long)c->n_embd, (long long)c->n_layer,
                   (long long)c->n_inner);
  return 0;
}

int gj_config_validate(const gj_config *c) {
  GJ_TRY(gj_config_check_sizes(c));
  if (c->n_positions < 1 || c->n_positions > GJ_MAX_POSITIONS)
    return GJ_FAIL("n_positions = %lld is out of range [1, %lld]", (long long)c->n_positions,
                   (long long)GJ_MAX_POSITIONS);
  if (c->n_embd % c->n_head)
    return GJ_FAIL("n_embd %lld is not divisible by n_head %lld", (long long)c->n_embd,
                   (long long)c->n_head);
  int64_t hd = c->n_embd / c->n_head;
  if (c->rotary_dim < 0 || c->rotary_dim % 2)
    return GJ_FAIL("rotary_dim %lld must be even and non-negative", (long long)c->rotary_dim);
  if (c->rotary_dim > hd)
    return GJ_FAIL("rotary_dim %lld is larger than the head dimension %lld (n_embd/n_head)",
                   (long long)c->rotary_dim, (long long)hd);
  if (!(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon <= 1)) /* also refuses NaN */
    return GJ_FAIL("layer_norm_epsilon = %g is out of range (0, 1]", c->layer_norm_epsilon);
  return 0;
}

int64_t gj_config_n_params(const gj_config *c) {
  int64_t V = c->vocab_size, D = c->n_embd, F = c->n_inner;
  int64_t block = 2 * D + 4 * D * D + F * D + F + D * F + D;
  return V * D + c->n_layer * block + 2 * D + V * D + V;
}
