/* Layer kernels of the cpu backends (RMSNorm, mHC, router, MoE pieces): the drivers in
 * layer_cpu.c own the threading and call one ISA's span kernels; cpu-ref runs the same drivers
 * with the scalar kernels of layer_ref.c. Every dot product and sum is computed the same way
 * whoever computes it and whatever the batch, so results never depend on the thread count and a
 * token's result does not depend on the other tokens of the call. */
#ifndef DSV4_CPU_LAYER_H
#define DSV4_CPU_LAYER_H

#include "core/ops_layer.h"

extern const struct dsv4_layer_ops dsv4_cpu_ref_layer_ops;
extern const struct dsv4_layer_ops dsv4_cpu_layer_ops;

/* Most rows a dots kernel takes at once. */
#define DSV4_DOTS_MAX_ROWS 4

typedef struct dsv4_cpu_layer_kernels {
    /* Σ x[i]^2 over n BF16 (bf16 != 0) or F32 values. */
    float (*sumsq)(const void *x, int bf16, int64_t n);
    /* y[i] = (x[i] * r) * w[i] (w NULL: x[i] * r), stored as BF16 or F32. */
    void (*scale_row)(const void *x, int x_bf16, int64_t n, float r, const void *w, int w_bf16, void *y, int y_bf16);
    /* out[t] = Σ_k w[k]·x[t][k] for t < nt <= DSV4_DOTS_MAX_ROWS; w and each x[t] BF16 or F32. */
    void (*dots)(const void *w, int w_bf16, const void *const *x, int x_bf16, int nt, int64_t n, float *out);
    /* y[d] = bf16(Σ_j c[j]·x[j*sj + d]) for d in [d0, d1) (products and sums in j order, no FMA). */
    void (*hc_wsum)(const uint16_t *x, int64_t sj, int n, const float *c, uint16_t *y, int64_t d0, int64_t d1);
    /* out[k*so + d] = bf16(post[k]·x[d] + Σ_j comb[j*cj + k]·r[j*sr + d]) for d in [d0, d1), in
     * that order without FMA (bit-identical across ISAs). out may be r (all j read before writing). */
    void (*hc_post)(const uint16_t *x, const uint16_t *r, int64_t sr, int n, const float *post, const float *comb,
                    int64_t cj, uint16_t *out, int64_t so, int64_t d0, int64_t d1);
    /* h[i] = bf16((silu(min(g[i], L)) * clamp(u[i], -L, L)) * w); h may be g. */
    void (*swiglu_row)(const uint16_t *g, const uint16_t *u, int64_t n, float limit, float w, uint16_t *h);
    /* y[d] = bf16(((rows[0][d] + rows[1][d]) + ...) + shared[d]) for d in [d0, d1) (shared may be
     * NULL; sums in that order: bit-identical across ISAs). */
    void (*sum_rows)(const uint16_t *const *rows, int nrows, const uint16_t *shared, uint16_t *y, int64_t d0,
                     int64_t d1);
    /* y[i] = bf16(a[i] + b[i]) for i < n, one fp32 add (the tensor family's add_bf16), except that a
     * NaN a[i] gives a[i] (which NaN an add keeps when both are is not fixed); y may be a. */
    void (*add_row)(const uint16_t *a, const uint16_t *b, int64_t n, uint16_t *y);
} dsv4_cpu_layer_kernels;

/* The `dots` entry of an ISA file over its always-inline IMPL(w, w_bf16, x, x_bf16, NT, n, out):
 * one instance per dtype pair and row count, so every inner loop has constant types. */
#define DSV4_DOTS_NT(IMPL, WB, XB)                                                                                \
    switch (nt) {                                                                                                 \
    case 1: IMPL(w, WB, x, XB, 1, n, out); return;                                                                \
    case 2: IMPL(w, WB, x, XB, 2, n, out); return;                                                                \
    case 3: IMPL(w, WB, x, XB, 3, n, out); return;                                                                \
    default: IMPL(w, WB, x, XB, 4, n, out); return;                                                               \
    }
#define DSV4_DEFINE_DOTS(NAME, IMPL)                                                                              \
    static void NAME(const void *w, int w_bf16, const void *const *x, int x_bf16, int nt, int64_t n, float *out) \
    {                                                                                                             \
        if (w_bf16 && x_bf16) DSV4_DOTS_NT(IMPL, 1, 1)                                                            \
        if (w_bf16) DSV4_DOTS_NT(IMPL, 1, 0)                                                                      \
        if (x_bf16) DSV4_DOTS_NT(IMPL, 0, 1)                                                                      \
        DSV4_DOTS_NT(IMPL, 0, 0)                                                                                  \
    }

extern const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_scalar;
extern const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_avx2;
extern const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_avx512;
/* The kernel set of the execution settings' ISA level (layer_cpu.c). */
const dsv4_cpu_layer_kernels *dsv4_cpu_layer_kernels_best(const dsv4_exec *ex);

/* Scalar pieces shared by every ISA (layer_ref.c). */
/* From the nmix raw mixes of one token (already times the rsqrt): pre[n], and when nmix > n also
 * post[n] and comb[n*n] (Sinkhorn with `iters` iterations). */
void dsv4_hc_split(const float *mix, int n, int nmix, const float *scale, const float *base, int iters, float eps,
                   float *pre, float *post, float *comb);
/* silu(min(g, L)) * clamp(u, -L, L), the scalar definition the vector versions follow. */
float dsv4_swiglu1(float g, float u, float limit);
/* sqrt(softplus(z)) in fp32. */
float dsv4_router_score(float logit);
/* The topk (<= DSV4_ROUTE_MAX_TOPK) largest key[e] (= score[e] + bias[e]) in descending order,
 * ties to the lower index, NaN below every number. */
void dsv4_route_select(const float *score, const float *bias, int E, int topk, int32_t *ids);
/* w[s] = score_sel[s] / Σ score_sel · route_scale, in place. */
void dsv4_route_normalize(float *w, int topk, float route_scale);

#endif
