#include "optim/schedule.h"

#include <math.h>

double gj_schedule_lr(const gj_schedule *s, int64_t t) {
  if (s->warmup > 0 && t <= s->warmup) return s->lr * (double)t / (double)s->warmup;
  if (s->decay_steps <= s->warmup) return s->decay_steps > 0 ? s->lr * s->floor : s->lr;
  if (t >= s->decay_steps) return s->lr * s->floor;
  double frac = (double)(t - s->warmup) / (double)(s->decay_steps - s->warmup);
  double cosv = 0.5 * (1.0 + cos(M_PI * frac));
  return s->lr * (s->floor + (1.0 - s->floor) * cosv);
}
