/* GPT-J's learning-rate schedule: linear warmup from 0 to lr over `warmup` steps, cosine decay
 * to lr * floor over the next (decay_steps - warmup) steps, then flat at lr * floor. */
#ifndef GJ_OPTIM_SCHEDULE_H
#define GJ_OPTIM_SCHEDULE_H
#include <stdint.h>

typedef struct {
  double lr;          /* peak */
  int64_t warmup;     /* steps of linear warmup (0: none) */
  int64_t decay_steps;/* step at which the cosine reaches the floor (0: no decay) */
  double floor;       /* final lr as a fraction of the peak, in [0, 1] */
} gj_schedule;

/* Learning rate for step t (1-based: the t-th update). */
double gj_schedule_lr(const gj_schedule *s, int64_t t);
#endif
