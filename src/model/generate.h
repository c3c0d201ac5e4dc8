/* Decoding. */
#ifndef GJ_MODEL_GENERATE_H
#define GJ_MODEL_GENERATE_H

#include <stdint.h>

#include "model/gptj.h"

/* Argmax over the full vocabulary of row `row` of the last forward's logits (vocab-parallel:
 * the result is the same on every TP rank; the first index wins a tie). */
int gj_logits_argmax(gj_model *m, int64_t row, int32_t *out);

/* Greedy decoding by recomputing the whole prefix each step (no cache): the reference the
 * KV-cache path is checked against. ids [n_prompt + n_new] holds the prompt on entry. */
int gj_generate_greedy_recompute(gj_model *m, int32_t *ids, int64_t n_prompt, int64_t n_new);

/* Incremental forward of n tokens at positions pos0.. of one sequence, with the KV cache kept
 * in the model's k/v activation slots. The logits of the last token land in row 0 of
 * m->a.logits (this rank's vocab shard). */
int gj_model_forward_cached(gj_model *m, const int32_t *ids, int64_t n, int64_t pos0);
/* Greedy decoding with the KV cache: prefill with the prompt, then one token per step. */
int gj_generate_greedy(gj_model *m, int32_t *ids, int64_t n_prompt, int64_t n_new);

#endif
