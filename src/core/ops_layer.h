/* Layer op family (include/dsv4/layer.h): RMSNorm, mHC, router, and the MoE pieces that are not
 * matrix products (those go through the linear family). The op layer (src/ops/layer.c,
 * src/ops/moe.c) has validated every pointer, shape and stride before an entry is called. */
#ifndef DSV4_CORE_OPS_LAYER_H
#define DSV4_CORE_OPS_LAYER_H

#include "core/backend.h"
#include "dsv4/layer.h"

/* rows x d values (row strides ldx, ldy in elements) -> y; w == NULL: unweighted. */
typedef struct dsv4_rms_args {
    const void *x;
    int64_t ldx;
    int x_bf16;
    const void *w;
    int w_bf16;
    void *y;
    int64_t ldy;
    int y_bf16;
    int64_t rows, d;
    float eps;
} dsv4_rms_args;

/* One BF16 stream set [T, n, D]: element (t, j, d) at data[t*st + j*sj + d]. */
typedef struct dsv4_hc_streams {
    uint16_t *data;
    int64_t st, sj;
} dsv4_hc_streams;

/* Arguments of the four mHC entries. Which fields are read depends on the entry:
 *   hc_pre:      site (nmix = (2+n)·n), in, y, post_out, comb_out
 *   hc_post:     x, res, post, comb, out
 *   hc_post_pre: x, res, post, comb, out (streams) and then site on `out`, y, post_out, comb_out
 *   hc_head:     site (nmix = n), in, y
 * post/comb rows have unit inner stride: post[t*post_t + j], comb[t*comb_t + j*comb_j + k]. */
typedef struct dsv4_hc_args {
    int64_t T, D;
    int n, nmix;
    /* site */
    const float *fn;
    int64_t ldfn;
    const float *scale, *base;
    int iters;
    float eps, norm_eps;
    /* hc_pre / hc_head input streams */
    dsv4_hc_streams in;
    /* hc_post inputs */
    const uint16_t *x;
    int64_t ldx;
    dsv4_hc_streams res;
    const float *post;
    int64_t post_t;
    const float *comb;
    int64_t comb_t, comb_j;
    /* outputs */
    dsv4_hc_streams out;
    uint16_t *y;
    int64_t ldy;
    float *post_out;
    int64_t post_out_t;
    float *comb_out;
    int64_t comb_out_t, comb_out_j;
} dsv4_hc_args;

typedef struct dsv4_route_args {
    const void *x;
    int64_t ldx;
    int x_bf16;
    const void *w;
    int64_t ldw;
    int w_bf16;
    const float *bias;       /* NULL: none */
    const void *tid2eid;     /* NULL: biased top-k */
    int64_t ldtid;
    int tid_i64;
    const void *token_ids;
    int64_t tok_stride;
    int tok_i64;
    int32_t *ids;
    int64_t ldids;
    float *weights;
    int64_t ldweights;
    int64_t T, D;
    int E, topk;
    float route_scale;
} dsv4_route_args;

/* h[r*ldh + i] = bf16(silu(min(g, L)) · clamp(u, -L, L) · w[r]) (w NULL: 1); h may be g. */
typedef struct dsv4_swiglu_args {
    const uint16_t *g;
    int64_t ldg;
    const uint16_t *u;
    int64_t ldu;
    const float *w;
    uint16_t *h;
    int64_t ldh;
    int64_t rows, n;
    float limit;
} dsv4_swiglu_args;

/* MoE bookkeeping over the T*k (token, slot) pairs p = t*k + s, grouped by expert. */
typedef struct dsv4_moe_group_args {
    const int32_t *ids;
    int64_t ldids;
    const float *weights;
    int64_t ldweights;
    int64_t T;
    int k, E;
    int32_t *offsets; /* [E + 1]: expert e's rows are [offsets[e], offsets[e+1]) */
    int32_t *order;   /* [T*k]: sorted row i holds pair order[i] (pairs of one expert in p order) */
    int32_t *pos;     /* [T*k]: pair p sits at sorted row pos[p] */
    float *wsorted;   /* [T*k]: routing weight of sorted row i */
} dsv4_moe_group_args;

/* y[t] = bf16(Σ over the token's pairs in ascending (expert, slot) of rows[pos[p]], + shared[t]). */
typedef struct dsv4_moe_combine_args {
    const uint16_t *rows; /* [T*k, D] contiguous */
    const int32_t *pos, *ids;
    int64_t ldids;
    const uint16_t *shared; /* [T, D] contiguous or NULL */
    uint16_t *y;
    int64_t ldy;
    int64_t T, D;
    int k;
} dsv4_moe_combine_args;

struct dsv4_layer_ops {
    dsv4_status (*rms_norm)(const dsv4_exec *ex, const dsv4_rms_args *a);
    dsv4_status (*hc_pre)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_post)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_post_pre)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_head)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*route)(const dsv4_exec *ex, const dsv4_route_args *a);
    dsv4_status (*swiglu)(const dsv4_exec *ex, const dsv4_swiglu_args *a);
    dsv4_status (*moe_group)(const dsv4_exec *ex, const dsv4_moe_group_args *a);
    /* xg[i] = x[order[i] / k] for the n sorted rows (BF16 rows of D, x row stride ldx). */
    dsv4_status (*moe_gather)(const dsv4_exec *ex, const uint16_t *x, int64_t ldx, const int32_t *order, int64_t n,
                              int k, int64_t D, uint16_t *xg);
    dsv4_status (*moe_combine)(const dsv4_exec *ex, const dsv4_moe_combine_args *a);
};

#endif
