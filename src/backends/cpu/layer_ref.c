/* Scalar layer kernels: the reference (cpu-ref) every vector version is tested against, and the
 * per-token scalar pieces (mHC split + Sinkhorn, router scores and top-k) every ISA shares. */
#include "backends/cpu/cpu_layer.h"
#include "formats/codec.h"

#include <math.h>

static inline float load(const void *p, int bf16, int64_t i)
{
    return bf16 ? dsv4_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store(void *p, int bf16, int64_t i, float v)
{
    if (bf16)
        ((uint16_t *)p)[i] = dsv4_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

static float sumsq(const void *x, int bf16, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = load(x, bf16, i);
        s += v * v;
    }
    return s;
}

static void scale_row(const void *x, int x_bf16, int64_t n, float r, const void *w, int w_bf16, void *y, int y_bf16)
{
    for (int64_t i = 0; i < n; i++) {
        float v = load(x, x_bf16, i) * r;
        store(y, y_bf16, i, w ? v * load(w, w_bf16, i) : v);
    }
}

static void dots(const void *w, int w_bf16, const void *const *x, int x_bf16, int nt, int64_t n, float *out)
{
    for (int t = 0; t < nt; t++) {
        float s = 0.0f;
        for (int64_t k = 0; k < n; k++) s += load(w, w_bf16, k) * load(x[t], x_bf16, k);
        out[t] = s;
    }
}

static void hc_wsum(const uint16_t *x, int64_t sj, int n, const float *c, uint16_t *y, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d++) {
        float s = c[0] * dsv4_bf16_to_f32(x[d]);
        for (int j = 1; j < n; j++) s += c[j] * dsv4_bf16_to_f32(x[j * sj + d]);
        y[d] = dsv4_bf16_from_f32(s);
    }
}

static void hc_post(const uint16_t *x, const uint16_t *r, int64_t sr, int n, const float *post, const float *comb,
                    int64_t cj, uint16_t *out, int64_t so, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d++) {
        float rv[DSV4_HC_MAX], xv = dsv4_bf16_to_f32(x[d]);
        for (int j = 0; j < n; j++) rv[j] = dsv4_bf16_to_f32(r[j * sr + d]);
        for (int k = 0; k < n; k++) {
            float s = post[k] * xv;
            for (int j = 0; j < n; j++) s += comb[j * cj + k] * rv[j];
            out[k * so + d] = dsv4_bf16_from_f32(s);
        }
    }
}

float dsv4_swiglu1(float g, float u, float limit)
{
    g = g > limit ? limit : g; /* NaN stays NaN */
    u = u > limit ? limit : u < -limit ? -limit : u;
    return g / (1.0f + expf(-g)) * u;
}

static void swiglu_row(const uint16_t *g, const uint16_t *u, int64_t n, float limit, float w, uint16_t *h)
{
    for (int64_t i = 0; i < n; i++)
        h[i] = dsv4_bf16_from_f32(dsv4_swiglu1(dsv4_bf16_to_f32(g[i]), dsv4_bf16_to_f32(u[i]), limit) * w);
}

static void sum_rows(const uint16_t *const *rows, int nrows, const uint16_t *shared, uint16_t *y, int64_t d0,
                     int64_t d1)
{
    for (int64_t d = d0; d < d1; d++) {
        float s = 0.0f;
        for (int r = 0; r < nrows; r++) s += dsv4_bf16_to_f32(rows[r][d]);
        if (shared) s += dsv4_bf16_to_f32(shared[d]);
        y[d] = dsv4_bf16_from_f32(s);
    }
}

static void add_row(const uint16_t *a, const uint16_t *b, int64_t n, uint16_t *y)
{
    for (int64_t i = 0; i < n; i++) {
        float fa = dsv4_bf16_to_f32(a[i]);
        y[i] = dsv4_bf16_from_f32(isnan(fa) ? fa : fa + dsv4_bf16_to_f32(b[i]));
    }
}

const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_scalar = {sumsq,   scale_row,  dots,     hc_wsum,
                                                               hc_post, swiglu_row, sum_rows, add_row};

/* ---- per-token scalar pieces ------------------------------------------------------------ */
static float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

void dsv4_hc_split(const float *mix, int n, int nmix, const float *scale, const float *base, int iters, float eps,
                   float *pre, float *post, float *comb)
{
    for (int j = 0; j < n; j++) pre[j] = sigmoidf(mix[j] * scale[0] + base[j]) + eps;
    if (nmix == n) return;
    for (int j = 0; j < n; j++) post[j] = 2.0f * sigmoidf(mix[n + j] * scale[1] + base[n + j]);
    float *c = comb;
    for (int i = 0; i < n * n; i++) c[i] = mix[2 * n + i] * scale[2] + base[2 * n + i];
    for (int j = 0; j < n; j++) { /* row softmax, then + eps */
        float *row = c + j * n, m = row[0], s = 0.0f;
        for (int k = 1; k < n; k++) m = row[k] > m ? row[k] : m;
        for (int k = 0; k < n; k++) s += row[k] = expf(row[k] - m);
        for (int k = 0; k < n; k++) row[k] = row[k] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < n; j++) { /* rows */
                float s = 0.0f;
                for (int k = 0; k < n; k++) s += c[j * n + k];
                for (int k = 0; k < n; k++) c[j * n + k] /= s + eps;
            }
        for (int k = 0; k < n; k++) { /* columns */
            float s = 0.0f;
            for (int j = 0; j < n; j++) s += c[j * n + k];
            for (int j = 0; j < n; j++) c[j * n + k] /= s + eps;
        }
    }
}

float dsv4_router_score(float z) { return sqrtf(z > 20.0f ? z : log1pf(expf(z))); }

/* a ranks before b (a's key ka, index ia; b's kb, ib). */
static int ranks_before(float ka, int ia, float kb, int ib)
{
    if (isnan(kb)) return !isnan(ka) || ia < ib;
    if (isnan(ka)) return 0;
    return ka > kb || (ka == kb && ia < ib);
}

void dsv4_route_select(const float *score, const float *bias, int E, int topk, int32_t *ids)
{
    float key[DSV4_ROUTE_MAX_TOPK];
    int have = 0;
    for (int e = 0; e < E; e++) {
        float k = bias ? score[e] + bias[e] : score[e];
        if (have == topk && !ranks_before(k, e, key[have - 1], ids[have - 1])) continue;
        int pos = have < topk ? have++ : topk - 1;
        while (pos > 0 && ranks_before(k, e, key[pos - 1], ids[pos - 1])) {
            key[pos] = key[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        key[pos] = k;
        ids[pos] = e;
    }
}

void dsv4_route_normalize(float *w, int topk, float route_scale)
{
    float s = 0.0f;
    for (int i = 0; i < topk; i++) s += w[i];
    for (int i = 0; i < topk; i++) w[i] = w[i] / s * route_scale;
}
