/* Layer op family (include/dsv4/layer.h): RMSNorm, mHC, router, SwiGLU and the MoE block (whose
 * expert products an implementation runs with its own backend's linear family). The op layer
 * (src/ops/layer.c, src/ops/moe.c) has validated every pointer, shape and stride before an entry
 * is called. */
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

/* Router (dsv4_route). With tid2eid in host memory the op layer has checked every token id and
 * table entry; in device memory it cannot, and the entry must stay inside the table: a token id
 * outside [0, V) or an entry outside [0, E) gives that slot id -1 and weight 0 (the other slots
 * are normalized among themselves), which the device MoE block drops. */
typedef struct dsv4_route_args {
    const void *x;
    int64_t ldx;
    int x_bf16;
    const void *w;
    int64_t ldw;
    int w_bf16;
    const float *bias;       /* NULL: none */
    const void *tid2eid;     /* NULL: biased top-k */
    int64_t ldtid, V;        /* row stride and rows of tid2eid */
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

/* The whole MoE block (dsv4_moe) on operands the op layer has checked: the views of x, ids,
 * weights and y, every expert (all of experts[0]'s format and shapes, in the backend's memory,
 * clear of the work space), the shared expert and the work space regions. The entry reads ids and
 * rejects one outside [0, E) (DSV4_ERR_RANGE, with the message "moe: ids[t][s] = e is not an
 * expert in [0, E)") before writing y; then it groups the T*k (token, slot) pairs p = t*k + s by
 * expert, runs each used expert once over all its rows (gathered), the shared expert over x, and
 * combines: y[t] = bf16(Σ over the token's pairs in ascending (expert, slot) + shared[t]).
 * ids in device memory cannot be checked before the launch without a wait: there a pair whose id
 * lies outside [0, E) (the -1 of a hash slot the router could not fill) is dropped from the sums. */
typedef struct dsv4_moe_args {
    const uint16_t *x;
    int64_t ldx;
    const int32_t *ids;
    int64_t ldids;
    const float *weights;
    int64_t ldweights;
    uint16_t *y;
    int64_t ldy;
    int64_t T, D, I, Is; /* tokens, hidden size, expert width, shared expert width */
    int k, E;
    const dsv4_ffn_weights *experts; /* [E] */
    const dsv4_ffn_weights *shared;  /* NULL: none */
    float limit;
    /* work space regions (64-byte aligned; R = T*k sorted rows) */
    int32_t *offsets;            /* [E + 1]: expert e's sorted rows are [offsets[e], offsets[e+1]) */
    int32_t *order, *pos;        /* [R]: sorted row i holds pair order[i]; pair p sits at row pos[p] */
    float *wsorted;              /* [R]: routing weight of sorted row i */
    uint16_t *xg, *g, *u, *out;  /* [R, D] gathered x, [R, I] gate and up, [R, D] expert outputs */
    uint16_t *sg, *su, *sout;    /* shared expert: [T, Is], [T, Is], [T, D] (NULL: no shared) */
    void *lin;                   /* the linear products' work space */
    size_t lin_bytes;            /* >= the linear family's workspace_size of R (and T) rows, k = D, I, Is */
    /* The experts run: ids e_lo .. e_lo + e_n - 1, expert e at experts[e - e_lo]; pairs of other
     * ids (still checked against [0, E)) contribute nothing. yf: NULL, or F32 [T, D] (row stride
     * ldyf) that takes the sums unrounded, in the same order, instead of y (dsv4_moe_partial).
     * The `moe` entry is only called with e_lo = 0, e_n = E and yf NULL (dsv4_moe); a backend
     * that implements the general case sets `moe_partial` too. */
    int e_lo, e_n;
    float *yf;
    int64_t ldyf;
} dsv4_moe_args;

struct dsv4_layer_ops {
    dsv4_status (*rms_norm)(const dsv4_exec *ex, const dsv4_rms_args *a);
    dsv4_status (*hc_pre)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_post)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_post_pre)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*hc_head)(const dsv4_exec *ex, const dsv4_hc_args *a);
    dsv4_status (*route)(const dsv4_exec *ex, const dsv4_route_args *a);
    dsv4_status (*swiglu)(const dsv4_exec *ex, const dsv4_swiglu_args *a);
    dsv4_status (*moe)(const dsv4_exec *ex, const dsv4_moe_args *a);
    dsv4_status (*moe_partial)(const dsv4_exec *ex, const dsv4_moe_args *a); /* NULL: DSV4_ERR_UNSUPPORTED */
};

#endif
