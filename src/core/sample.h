/* The sampling rule of include/dsv4/engine.h on the host: the one owner of its arithmetic
 * (generator, softmax with temperature, top-p nucleus, Gumbel-max pick, the non-finite-logit rule
 * and its result codes, include/dsv4/tensor_ops.h dsv4_sample_rows). The cpu backends' sample
 * entry runs it row by row; the engine's MTP acceptance (rejection sampling) uses its pieces on
 * the same numbers. Nothing here allocates: the callers pass the V-float and V-int buffers. */
#ifndef DSV4_CORE_SAMPLE_H
#define DSV4_CORE_SAMPLE_H

#include "dsv4/engine.h"

/* A uniform double in [0, 1) with 53 random bits; advances rng (xoshiro256**). */
double dsv4_rng_uniform(uint64_t rng[4]);
/* 0 when the row x [n] can be sampled, else its result code (dsv4_sample_rows): the first NaN or
 * +Inf logit, or every logit -Inf. */
int32_t dsv4_sample_check_row(const float *x, int64_t n);
/* The first index of the largest value (the row passed dsv4_sample_check_row). */
int32_t dsv4_sample_argmax(const float *x, int64_t n);
/* p = softmax(logits / temperature) (temperature > 0) restricted to the top-p nucleus into
 * out [V]; order [V] is scratch. */
void dsv4_sample_probs(const float *logits, int64_t V, float temperature, float top_p, float *out, int32_t *order);
/* argmax_i p_i / E_i, E_i ~ Exp(1), one draw per id. */
int32_t dsv4_sample_gumbel(const float *p, int64_t n, uint64_t rng[4]);
/* One row: the token (>= 0) or a result code (< 0, rng untouched); probs [V] and order [V] are
 * scratch. */
int32_t dsv4_sample_row(const float *logits, int64_t V, const dsv4_sampling *s, uint64_t rng[4], float *probs,
                        int32_t *order);

#endif
