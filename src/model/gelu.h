/* gelu_new (tanh approximation): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#ifndef GJ_MODEL_GELU_H
#define GJ_MODEL_GELU_H
#include <stddef.h>

/* y [n] = gelu(x [n]) */
void gj_gelu_forward(float *y, const float *x, size_t n);
/* dx [n] = dy [n] * gelu'(x [n]) (overwrites; dx may alias dy) */
void gj_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
#endif
