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

/* Upper bounds that gj_config_validate enforces on every config, wherever it comes from (preset,
 * flags, config file, checkpoint attributes, Hugging Face config.json). They are far above any
 * real GPT-J (gptj-6b: V 50400, context 2048, D 4096, 28 layers, 16 heads, F 16384) and small
 * enough that every later size product cannot overflow: a tensor's numel is at most
 * GJ_MAX_VOCAB * GJ_MAX_EMBD = 2^40, the parameter count (bounded by GJ_MAX_PARAMS) and any
 * per-rank byte count (at most 16 bytes per parameter) fit int64 and size_t with room to spare,
 * and the parameter table's gj_layout_count(n_layer) entries fit an int. */
#define GJ_MAX_VOCAB ((int64_t)1 << 24)     /* token ids are int32; GPT-2/GPT-J use 50257/50400 */
#define GJ_MAX_POSITIONS ((int64_t)1 << 20) /* the largest --seq-len */
#define GJ_MAX_EMBD ((int64_t)1 << 16)      /* D; also bounds n_head (which divides it) */
#define GJ_MAX_LAYER ((int64_t)4096)
#define GJ_MAX_INNER ((int64_t)1 << 18)     /* F; 4 * GJ_MAX_EMBD */
#define GJ_MAX_PARAMS ((int64_t)1 << 40)    /* 1.1e12 parameters, 4.4 TB of float32 */

/* Names of the presets, NULL-terminated. */
extern const char *const gj_config_preset_names[];

/* Fill c from a preset; -1 (message names the preset) if unknown. */
int gj_config_preset(gj_config *c, const char *name);
/* Set one key from text. Returns 0 if set, 1 if the key is not a model key, -1 on a bad value. */
int gj_config_set(gj_config *c, const char *key, const char *value);
/* Check every field against its range (the bounds above; rotary_dim even and at most the head
 * dimension; layer_norm_epsilon finite in (0, 1]) and the combination (n_head divides n_embd,
 * at most GJ_MAX_PARAMS parameters); the message names the offending key and value. */
int gj_config_validate(const gj_config *c);
/* The part of gj_config_validate that the parameter table needs: vocab_size, n_embd,
 * n_layer, n_head and n_inner in range and at most GJ_MAX_PARAMS parameters. */
int gj_config_check_sizes(const gj_config *c);
/* Number of parameters (all tensors, global). Exact for a config that passes
 * gj_config_validate (which bounds each factor so that the sum cannot overflow). */
int64_t gj_config_n_params(const gj_config *c);

static inline int64_t gj_config_head_dim(const gj_config *c) { return c->n_embd / c->n_head; }

#endif
