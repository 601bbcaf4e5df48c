/* Sampling (core/sample.h, include/dsv4/engine.h): greedy, temperature, top-p and the reference's
 * Gumbel-max form argmax(p / E), E ~ Exp(1) (docs/model.md §1.2, docs/engine.md §7; DeepSeek's
 * generate.py), with a seeded xoshiro256** generator. */
#include "core/sample.h"

#include "core/error.h"
#include "core/sample_math.h"

#include "dsv4/tensor_ops.h"

#include <math.h>

void dsv4_rng_seed(uint64_t seed, uint64_t rng[4])
{
    if (!rng) return;
    for (int i = 0; i < 4; i++) rng[i] = dsv4_sm_splitmix64(&seed);
}

double dsv4_rng_uniform(uint64_t rng[4]) { return dsv4_sm_uniform(rng); }

int32_t dsv4_sample_check_row(const float *x, int64_t n)
{
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(x[i])) {
            finite++;
            continue;
        }
        if (x[i] == -INFINITY) continue; /* a token masked out: probability 0 */
        return (int32_t)(x[i] != x[i] ? DSV4_SAMPLE_NAN_LOGIT(i) : DSV4_SAMPLE_INF_LOGIT(i));
    }
    return finite ? 0 : DSV4_SAMPLE_ALL_MASKED;
}

dsv4_status dsv4_sample_result(int32_t token, const char *what)
{
    if (token >= 0) return DSV4_OK;
    if (token == DSV4_SAMPLE_BAD_PARAMS)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: temperature must be finite and >= 0, top_p >= 0 (0: 1)", what);
    if (token == DSV4_SAMPLE_ALL_MASKED)
        return dsv4_fail(DSV4_ERR_RANGE, "%s: every logit is -Inf: no token can be sampled", what);
    const int64_t code = -(int64_t)token - 3; /* 2i (NaN) or 2i + 1 (+Inf) */
    return dsv4_fail(DSV4_ERR_RANGE, "%s: logit %lld is %s (NaN and +Inf logits are refused: broken weights or inputs)",
                     what, (long long)(code / 2), code % 2 ? "+Inf" : "NaN");
}

/* Rows reach these only through dsv4_sample_check_row: no NaN, no +Inf, at least one finite logit. */
int32_t dsv4_sample_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

int32_t dsv4_sample_gumbel(const float *p, int64_t n, uint64_t rng[4])
{
    int64_t best = -1;
    double best_v = -1.0;
    for (int64_t i = 0; i < n; i++) {
        /* Exp(1); one draw per id keeps the stream aligned */
        const double ex = dsv4_sm_neg_log(1.0 - dsv4_sm_uniform(rng));
        if (!(p[i] > 0.0f)) continue;
        double v = (double)p[i] / ex;
        if (v > best_v) {
            best_v = v;
            best = i;
        }
    }
    return (int32_t)(best < 0 ? 0 : best);
}

/* heap order: the higher probability first, then the lower id */
static int before(const float *p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

static void sift_down(int32_t *h, int64_t n, int64_t i, const float *p)
{
    for (;;) {
        int64_t l = 2 * i + 1, best = i;
        if (l < n && before(p, h[l], h[best])) best = l;
        if (l + 1 < n && before(p, h[l + 1], h[best])) best = l + 1;
        if (best == i) return;
        int32_t t = h[i];
        h[i] = h[best];
        h[best] = t;
        i = best;
    }
}

void dsv4_sample_probs(const float *logits, int64_t V, float temperature, float top_p, float *out, int32_t *order)
{
    double m = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > m) m = logits[i];
    for (int64_t b = 0; b < V; b += DSV4_SAMPLE_SUM_BLOCK) { /* the fixed order of core/sample_math.h */
        const int64_t e = b + DSV4_SAMPLE_SUM_BLOCK < V ? b + DSV4_SAMPLE_SUM_BLOCK : V;
        double part = 0.0;
        for (int64_t i = b; i < e; i++) {
            const double v = dsv4_sm_exp(((double)logits[i] - m) / temperature);
            out[i] = (float)v;
            part += v;
        }
        sum += part;
    }
    for (int64_t i = 0; i < V; i++) out[i] = (float)(out[i] / sum);
    if (top_p <= 0.0f) top_p = 1.0f; /* 0: the default, every token */
    if (!(top_p < 1.0f)) return;
    /* nucleus: the most likely tokens, one at a time off a max-heap (no sort of the whole
     * vocabulary, no allocation), until their mass reaches top_p; the mass is exact while the
     * tokens popped have p >= DSV4_SAMPLE_P_EXACT (core/sample_math.h), and a nucleus that would
     * reach below that (or take every token) keeps every token as it is */
    int32_t *h = order;
    for (int64_t i = 0; i < V; i++) h[i] = (int32_t)i;
    for (int64_t i = V / 2 - 1; i >= 0; i--) sift_down(h, V, i, out);
    double mass = 0.0;
    int64_t n = V;
    while (n > 0 && (n == V || mass < top_p)) { /* popped ids collect at h[n..V-1] */
        const int32_t top = h[0];
        if (out[top] < DSV4_SAMPLE_P_EXACT) return;
        mass += out[top];
        h[0] = h[--n];
        h[n] = top;
        sift_down(h, n, 0, out);
    }
    if (mass < top_p) return; /* every token popped: all kept */
    for (int64_t i = 0; i < n; i++) out[h[i]] = 0.0f;
    for (int64_t i = n; i < V; i++) out[h[i]] = (float)(out[h[i]] / mass);
}

int32_t dsv4_sample_row(const float *logits, int64_t V, const dsv4_sampling *s, uint64_t rng[4], float *probs,
                        int32_t *order)
{
    if (!(s->temperature >= 0.0f && isfinite(s->temperature) && s->top_p >= 0.0f)) return DSV4_SAMPLE_BAD_PARAMS;
    const int32_t bad = dsv4_sample_check_row(logits, V);
    if (bad) return bad;
    if (s->temperature == 0.0f) return dsv4_sample_argmax(logits, V);
    dsv4_sample_probs(logits, V, s->temperature, s->top_p, probs, order);
    return dsv4_sample_gumbel(probs, V, rng);
}
