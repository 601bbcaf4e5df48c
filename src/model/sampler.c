/* Sampling (include/dsv4/engine.h): greedy, temperature, top-p and the reference's Gumbel-max
 * form argmax(p / E), E ~ Exp(1) (docs/model.md §1.2, docs/engine.md; DeepSeek's generate.py), with a seeded
 * xoshiro256** generator. Works in the engine's scratch: nothing is allocated. */
#include "model/engine_internal.h"

#include "core/error.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dsv4_rng_seed(uint64_t seed, uint64_t rng[4])
{
    if (!rng) return;
    for (int i = 0; i < 4; i++) rng[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
double eng_rng_uniform(uint64_t rng[4]) { return (double)(next_u64(rng) >> 11) * 0x1.0p-53; }

/* Rows reach these only through eng_check_logits: no NaN, no +Inf, at least one finite logit. */
int32_t eng_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

dsv4_status eng_check_logits(const dsv4_engine *e, const float *logits, const char *what)
{
    int64_t finite = 0;
    for (int64_t i = 0; i < e->V; i++) {
        const float x = logits[i];
        if (isfinite(x)) {
            finite++;
            continue;
        }
        if (x == -INFINITY) continue; /* a token masked out: probability 0 */
        return dsv4_fail(DSV4_ERR_RANGE, "%s: logit %lld is %s (NaN and +Inf logits are refused: broken weights or inputs)",
                         what, (long long)i, x != x ? "NaN" : "+Inf");
    }
    if (!finite) return dsv4_fail(DSV4_ERR_RANGE, "%s: every logit is -Inf: no token can be sampled", what);
    return DSV4_OK;
}

int32_t eng_gumbel_pick(const float *p, int64_t n, uint64_t rng[4])
{
    int64_t best = -1;
    double best_v = -1.0;
    for (int64_t i = 0; i < n; i++) {
        double ex = -log1p(-eng_rng_uniform(rng)); /* Exp(1); one draw per token keeps the stream aligned */
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

void eng_probs(dsv4_engine *e, const float *logits, const dsv4_sampling *s, float *out)
{
    const int64_t V = e->V;
    double m = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > m) m = logits[i];
    for (int64_t i = 0; i < V; i++) {
        double v = exp(((double)logits[i] - m) / s->temperature);
        out[i] = (float)v;
        sum += v;
    }
    for (int64_t i = 0; i < V; i++) out[i] = (float)(out[i] / sum);
    const float top_p = s->top_p > 0.0f ? s->top_p : 1.0f; /* 0: the default, every token */
    if (!(top_p < 1.0f)) return;
    /* nucleus: the most likely tokens, one at a time off a max-heap (no sort of the whole
     * vocabulary, no allocation), until their mass reaches top_p */
    int32_t *h = e->s.order;
    for (int64_t i = 0; i < V; i++) h[i] = (int32_t)i;
    for (int64_t i = V / 2 - 1; i >= 0; i--) sift_down(h, V, i, out);
    double mass = 0.0;
    int64_t n = V;
    while (n > 0 && (n == V || mass < top_p)) { /* popped ids collect at h[n..V-1] */
        int32_t top = h[0];
        mass += out[top];
        h[0] = h[--n];
        h[n] = top;
        sift_down(h, n, 0, out);
    }
    for (int64_t i = 0; i < n; i++) out[h[i]] = 0.0f;
    for (int64_t i = n; i < V; i++) out[h[i]] = (float)(out[h[i]] / mass);
}

dsv4_status dsv4_engine_sample(dsv4_engine *e, const float *logits, const dsv4_sampling *s, uint64_t rng[4], int32_t *token)
{
    DSV4_CHECK_ARG(e && logits && s && rng && token, "engine_sample: null argument");
    DSV4_CHECK_ARG(s->temperature >= 0.0f && isfinite(s->temperature), "engine_sample: temperature %g must be finite and >= 0",
                   (double)s->temperature);
    DSV4_CHECK_ARG(s->top_p >= 0.0f, "engine_sample: top_p %g must be >= 0 (0: 1)", (double)s->top_p);
    DSV4_TRY(eng_check_logits(e, logits, "engine_sample"));
    if (s->temperature == 0.0f) {
        *token = eng_argmax(logits, e->V);
        return DSV4_OK;
    }
    eng_probs(e, logits, s, e->s.probs);
    *token = eng_gumbel_pick(e->s.probs, e->V, rng);
    return DSV4_OK;
}
