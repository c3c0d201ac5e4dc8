/* GPT-J hyperparameters, presets and validation. */
#ifndef GJ_MODEL_CONFIG_H
#define GJ_MODEL_CONFIG_H

#include <stdint.h>

typedef struct {
  int64_t vocab_size;  /* V, padded (50400 for GPT-J) */
  int64_t n_positions; /* maximum context */
  int64_t n_embd;      /* D */
  int64_t n_layer;
  int64_t n_head;      /* H */
  int64_t rotary_dim;  /* R: rotated dims at the start of each head */
  int64_t n_inner;     /* F */
  double layer_norm_epsilon;
} gj_config;

/* Names of the presets, NULL-terminated. */
extern const char *const gj_config_preset_names[];

/* Fill c from a preset; -1 (message names the preset) if unknown. */
int gj_config_preset(gj_config *c, const char *name);
/* Set one key from text. Returns 0 if set, 1 if the key is not a model key, -1 on a bad value. */
int gj_config_set(gj_config *c, const char *key, const char *value);
/* Check the combination; the message names the offending value. */
int gj_config_validate(const gj_config *c);
/* Number of parameters (all tensors, global). */
int64_t gj_config_n_params(const gj_config *c);

static inline int64_t gj_config_head_dim(const gj_config *c) { return c->n_embd / c->n_head; }

#endif
