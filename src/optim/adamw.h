/* AdamW as torch.optim.AdamW with clip_grad_norm_ (../shared/golden/README.md):
 * global-norm clipping with coef = min(1, clip / (norm + 1e-6)), decoupled weight decay on
 * 2-D tensors only (applied before the Adam step), bias correction. */
#ifndef GJ_OPTIM_ADAMW_H
#define GJ_OPTIM_ADAMW_H

#include <stdint.h>

#include "model/params.h"
#include "model/rowgrad.h"

typedef struct {
  double lr;           /* peak learning rate */
  double beta1, beta2, eps, weight_decay, grad_clip;
} gj_adamw_hp;

/* GPT-J's training values: betas 0.9/0.999, eps 1e-8, wd 0.1, clip 1.0. */
void gj_adamw_defaults(gj_adamw_hp *hp);

/* Sum of squares of this rank's gradients of the flat range [lo, lo + n) of the block (g
 * holds the range only: g[0] is element lo), counting tensors that TP replicates only on
 * tp_rank 0 (so that a sum over the TP group counts each element once). rows: NULL, or the
 * embedding's (tensor 0's) gradients as rows (model/rowgrad.h), read instead of g there: the
 * same sum, bit for bit, as over the dense tensor. */
double gj_grad_sumsq(const gj_layout *l, const float *grads, const gj_rowgrad *rows, int tp_rank,
                     size_t lo, size_t n);
/* The clip factor for a global norm. */
double gj_clip_coef(double norm, double clip);

/* The largest gradient element an update is applied with: below it g^2 < 1e38, so AdamW's
 * float32 second moment (beta2 v + (1 - beta2) g^2) stays finite. A step with a larger one is
 * skipped as a non-finite one is (only possible with --clip 0: clipping bounds every element by
 * the clip): an infinite v would freeze its weight and be written to every later checkpoint,
 * which the loader refuses. */
#define GJ_GRAD_MAX 1e19
/* Whether a gradient element of the flat range [lo, lo + n) (g and rows as in gj_grad_sumsq) is
 * GJ_GRAD_MAX or more in magnitude; sumsq is gj_grad_sumsq's result for the range: below
 * GJ_GRAD_MAX^2 no element can be, and the elements are not looked at. */
int gj_grad_huge(const gj_layout *l, const float *grads, const gj_rowgrad *rows, size_t lo, size_t n,
                 double sumsq);

/* One AdamW update (step t >= 1, learning rate lr for this step) of the elements of the flat
 * range [lo, lo + n) of the parameter block; gradients are multiplied by clip_coef first.
 * p is the whole block; g, m and v hold the range only (g[0], m[0] are element lo); rows as
 * in gj_grad_sumsq (an absent row's gradient is zero: its moments decay, its weights too). */
void gj_adamw_update(const gj_layout *l, float *p, const float *g, const gj_rowgrad *rows,
                     float *m, float *v, size_t lo, size_t n, const gj_adamw_hp *hp, int64_t t,
                     double lr, double clip_coef);
/* The same update on a flat range of n elements with one decay setting (kernel). */
void gj_adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     double beta1, double beta2, float eps, float decay, float bc1, float bc2_sqrt,
                     float clip_coef);

#endif
