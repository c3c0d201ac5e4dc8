/* Perplexity over a token dataset (used by gptj eval and by validation during training).
 *
 * Targets are the tokens at indices 1..n-1 of the dataset's token stream, each scored once.
 * Window w begins at b = w*S and feeds x[b .. e-1] to predict x[b+1 .. e], e = min(b+T, n-1);
 * it scores only targets after the previous window's end, so each has up to T-S tokens of
 * extra context (S = T: non-overlapping windows). Windows are spread over the DP ranks; the
 * model runs over TP. */
#ifndef GJ_TRAIN_EVALUATE_H
#define GJ_TRAIN_EVALUATE_H

#include <stdint.h>

#include "io/dataset.h"
#include "model/gptj.h"

/* max_windows 0: all. Results (summed NLL in nats, scored tokens) are on every rank. */
int gj_evaluate(gj_model *m, const gj_dataset *ds, int64_t T, int64_t S, int64_t B,
                int64_t max_windows, double *nll, int64_t *count);

#endif
