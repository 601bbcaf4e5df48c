/* Op layer of the layer family: RMSNorm, mHC and the router. Contract checks on the tensor views
 * (layer.h), then dispatch to the backend's layer table. Nothing is written on error. */
#include "ops/layer_check.h"

#include <math.h>
#include <string.h>

int dsv4_same_view(const dsv4_tensor *a, const dsv4_tensor *b)
{
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i])) return 0;
    return 1;
}

dsv4_status dsv4_layer_arg(const char *op, const char *name, const dsv4_tensor *t, unsigned dtypes, int ndim,
                           const int64_t *shape, const dsv4_backend *b)
{
    DSV4_TRY(dsv4_check_tensor(op, name, t, dtypes, ndim, shape));
    if (dsv4_tensor_numel(t)) DSV4_TRY(dsv4_check_inner_contiguous(op, name, t)); /* numpy: empty views, any strides */
    if (t->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, name, b->name);
    return DSV4_OK;
}

dsv4_status dsv4_layer_out(const char *op, const char *name, const dsv4_tensor *t, unsigned dtypes, int ndim,
                           const int64_t *shape, const dsv4_backend *b)
{
    DSV4_TRY(dsv4_layer_arg(op, name, t, dtypes, ndim, shape, b));
    return dsv4_check_output(op, name, t);
}

dsv4_status dsv4_layer_no_overlap(const char *op, const dsv4_layer_io *outs, int nout, const dsv4_layer_io *ins,
                                  int nin)
{
    for (int o = 0; o < nout; o++) {
        for (int p = 0; p < o; p++)
            if (dsv4_tensors_overlap(outs[o].t, outs[p].t))
                return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: outputs %s and %s overlap", op, outs[p].name, outs[o].name);
        for (int i = 0; i < nin; i++) {
            if (!ins[i].t || !dsv4_tensors_overlap(outs[o].t, ins[i].t)) continue;
            int may_alias = outs[o].alias && !strcmp(outs[o].alias, ins[i].name);
            if (may_alias && dsv4_same_view(outs[o].t, ins[i].t)) continue;
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: output %s overlaps input %s%s", op, outs[o].name, ins[i].name,
                             may_alias ? " without being the same view" : "");
        }
    }
    return DSV4_OK;
}

static dsv4_status check_eps(const char *op, const char *name, float eps)
{
    if (!(eps >= 0.0f) || isinf(eps))
        return dsv4_fail(DSV4_ERR_RANGE, "%s: %s = %g must be finite and >= 0", op, name, (double)eps);
    return DSV4_OK;
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */
dsv4_status dsv4_rms_norm(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *weight, float eps, dsv4_tensor *y)
{
    DSV4_OP_BEGIN("rms_norm", LAYER);
    const unsigned ft = DSV4_DT(DSV4_BF16) | DSV4_DT(DSV4_F32);
    DSV4_TRY(dsv4_layer_arg(op, "x", x, ft, 2, NULL, b));
    int64_t rows = x->shape[0], d = x->shape[1];
    if (d < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: rows of x are empty", op);
    const int64_t wshape[1] = {d}, yshape[2] = {rows, d};
    if (weight) DSV4_TRY(dsv4_layer_arg(op, "weight", weight, ft, 1, wshape, b));
    DSV4_TRY(dsv4_layer_out(op, "y", y, ft, 2, yshape, b));
    DSV4_TRY(check_eps(op, "eps", eps));
    const dsv4_layer_io outs[1] = {{y, "y", "x"}}, ins[2] = {{x, "x", NULL}, {weight, "weight", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 2));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, rms_norm, op));
    const dsv4_rms_args a = {x->data, x->stride[0], x->dtype == DSV4_BF16, weight ? weight->data : NULL,
                             weight && weight->dtype == DSV4_BF16, y->data, y->stride[0], y->dtype == DSV4_BF16,
                             rows, d, eps};
    return rows ? b->layer->rms_norm(&ex, &a) : DSV4_OK;
}

/* ---- mHC --------------------------------------------------------------------------------- */
/* Streams [T, n, D] BF16: fixes n and D from the first one seen (n = 0 on entry). */
static dsv4_status check_streams(const char *op, const char *name, const dsv4_tensor *t, int64_t T, int *n, int64_t *D,
                                 const dsv4_backend *b, int out)
{
    const int64_t want[3] = {T, *n ? *n : DSV4_ANY, *n ? *D : DSV4_ANY};
    DSV4_TRY((out ? dsv4_layer_out : dsv4_layer_arg)(op, name, t, DSV4_DT(DSV4_BF16), 3, want, b));
    if (!*n) {
        if (t->shape[1] < 1 || t->shape[1] > DSV4_HC_MAX || t->shape[2] < 1)
            return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s must be [T, n, D] with 1 <= n <= %d and D >= 1 (got n = %lld, D = %lld)",
                             op, name, DSV4_HC_MAX, (long long)t->shape[1], (long long)t->shape[2]);
        *n = (int)t->shape[1];
        *D = t->shape[2];
    }
    return DSV4_OK;
}

static dsv4_hc_streams streams_of(const dsv4_tensor *t)
{
    dsv4_hc_streams s = {t->data, t->stride[0], t->stride[1]};
    return s;
}

/* The site's parameters for n streams of D; head: hc_head's shapes. Fills the site part of a. */
static dsv4_status check_site(const char *op, const dsv4_hc_site *site, int n, int64_t D, int head,
                              const dsv4_backend *b, dsv4_hc_args *a)
{
    DSV4_CHECK_ARG(site, "%s: site is null", op);
    const int nmix = head ? n : (2 + n) * n;
    const int64_t fshape[2] = {nmix, n * D}, sshape[1] = {head ? 1 : 3}, bshape[1] = {nmix};
    const unsigned f32 = DSV4_DT(DSV4_F32);
    DSV4_TRY(dsv4_layer_arg(op, "fn", &site->fn, f32, 2, fshape, b));
    DSV4_TRY(dsv4_layer_arg(op, "scale", &site->scale, f32, 1, sshape, b));
    DSV4_TRY(dsv4_layer_arg(op, "base", &site->base, f32, 1, bshape, b));
    if (!head && site->sinkhorn_iters < 1)
        return dsv4_fail(DSV4_ERR_RANGE, "%s: sinkhorn_iters = %d must be >= 1", op, site->sinkhorn_iters);
    DSV4_TRY(check_eps(op, "eps", site->eps));
    DSV4_TRY(check_eps(op, "norm_eps", site->norm_eps));
    a->n = n;
    a->D = D;
    a->nmix = nmix;
    a->fn = site->fn.data;
    a->ldfn = site->fn.stride[0];
    a->scale = site->scale.data;
    a->base = site->base.data;
    a->iters = site->sinkhorn_iters;
    a->eps = site->eps;
    a->norm_eps = site->norm_eps;
    return DSV4_OK;
}

/* post [T, n] and comb [T, n, n] F32 (inputs or outputs). */
static dsv4_status check_post_comb(const char *op, const char *pn, const dsv4_tensor *post, const char *cn,
                                   const dsv4_tensor *comb, int64_t T, int n, const dsv4_backend *b, int out)
{
    const int64_t ps[2] = {T, n}, cs[3] = {T, n, n};
    dsv4_status (*chk)(const char *, const char *, const dsv4_tensor *, unsigned, int, const int64_t *,
                       const dsv4_backend *) = out ? dsv4_layer_out : dsv4_layer_arg;
    DSV4_TRY(chk(op, pn, post, DSV4_DT(DSV4_F32), 2, ps, b));
    return chk(op, cn, comb, DSV4_DT(DSV4_F32), 3, cs, b);
}

/* hc_post's inputs: x [T, D], residual [T, n, D], post, comb. Fixes T, n, D. */
static dsv4_status check_post_inputs(const char *op, const dsv4_tensor *x, const dsv4_tensor *residual,
                                     const dsv4_tensor *post, const dsv4_tensor *comb, const dsv4_backend *b,
                                     dsv4_hc_args *a)
{
    DSV4_TRY(dsv4_layer_arg(op, "x", x, DSV4_DT(DSV4_BF16), 2, NULL, b));
    int n = 0;
    int64_t T = x->shape[0], D = 0;
    DSV4_TRY(check_streams(op, "residual", residual, T, &n, &D, b, 0));
    if (x->shape[1] != D)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: x has %lld columns, the streams have D = %lld", op,
                         (long long)x->shape[1], (long long)D);
    DSV4_TRY(check_post_comb(op, "post", post, "comb", comb, T, n, b, 0));
    a->T = T;
    a->n = n;
    a->D = D;
    a->x = x->data;
    a->ldx = x->stride[0];
    a->res = streams_of(residual);
    a->post = post->data;
    a->post_t = post->stride[0];
    a->comb = comb->data;
    a->comb_t = comb->stride[0];
    a->comb_j = comb->stride[1];
    return DSV4_OK;
}

static void set_pre_outputs(dsv4_hc_args *a, dsv4_tensor *y, dsv4_tensor *post, dsv4_tensor *comb)
{
    a->y = y->data;
    a->ldy = y->stride[0];
    if (post) {
        a->post_out = post->data;
        a->post_out_t = post->stride[0];
        a->comb_out = comb->data;
        a->comb_out_t = comb->stride[0];
        a->comb_out_j = comb->stride[1];
    }
}

/* hc_pre and hc_head: same checks, head = no post/comb. */
static dsv4_status pre_or_head(dsv4_ctx *ctx, const char *op, const dsv4_hc_site *site, const dsv4_tensor *x,
                               dsv4_tensor *y, dsv4_tensor *post, dsv4_tensor *comb)
{
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_LAYER, &b, &ex));
    DSV4_OP_TIMER(op, b, &ex);
    dsv4_hc_args a = {0};
    int n = 0;
    int64_t D = 0;
    DSV4_TRY(check_streams(op, "x", x, DSV4_ANY, &n, &D, b, 0));
    int64_t T = x->shape[0];
    const int head = post == NULL;
    DSV4_TRY(check_site(op, site, n, D, head, b, &a));
    const int64_t yshape[2] = {T, D};
    DSV4_TRY(dsv4_layer_out(op, "y", y, DSV4_DT(DSV4_BF16), 2, yshape, b));
    if (!head) DSV4_TRY(check_post_comb(op, "post", post, "comb", comb, T, n, b, 1));
    const dsv4_layer_io outs[3] = {{y, "y", NULL}, {post, "post", NULL}, {comb, "comb", NULL}};
    const dsv4_layer_io ins[4] = {{x, "x", NULL}, {&site->fn, "fn", NULL}, {&site->scale, "scale", NULL},
                                  {&site->base, "base", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, head ? 1 : 3, ins, 4));
    if (head)
        DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, hc_head, op));
    else
        DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, hc_pre, op));
    a.T = T;
    a.in = streams_of(x);
    set_pre_outputs(&a, y, post, comb);
    if (!T) return DSV4_OK;
    return head ? b->layer->hc_head(&ex, &a) : b->layer->hc_pre(&ex, &a);
}

dsv4_status dsv4_hc_pre(dsv4_ctx *ctx, const dsv4_hc_site *site, const dsv4_tensor *x, dsv4_tensor *y,
                        dsv4_tensor *post, dsv4_tensor *comb)
{
    DSV4_CHECK_ARG(post && comb, "hc_pre: post and comb outputs are required");
    return pre_or_head(ctx, "hc_pre", site, x, y, post, comb);
}

dsv4_status dsv4_hc_head(dsv4_ctx *ctx, const dsv4_hc_site *site, const dsv4_tensor *x, dsv4_tensor *y)
{
    return pre_or_head(ctx, "hc_head", site, x, y, NULL, NULL);
}

/* Backend and hc_post's inputs, shared by hc_post and the fused op. */
static dsv4_status post_setup(dsv4_ctx *ctx, const char *op, const dsv4_tensor *x, const dsv4_tensor *residual,
                              const dsv4_tensor *post, const dsv4_tensor *comb, const dsv4_backend **b, dsv4_exec *ex,
                              dsv4_hc_args *a)
{
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_LAYER, b, ex));
    *a = (dsv4_hc_args){0};
    return check_post_inputs(op, x, residual, post, comb, *b, a);
}

dsv4_status dsv4_hc_post(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *residual, const dsv4_tensor *post,
                         const dsv4_tensor *comb, dsv4_tensor *out)
{
    const char *op = "hc_post";
    const dsv4_backend *b;
    dsv4_exec ex;
    dsv4_hc_args a;
    DSV4_TRY(post_setup(ctx, op, x, residual, post, comb, &b, &ex, &a));
    DSV4_OP_TIMER(op, b, &ex);
    int n = a.n;
    int64_t D = a.D;
    DSV4_TRY(check_streams(op, "out", out, a.T, &n, &D, b, 1));
    const dsv4_layer_io outs[1] = {{out, "out", "residual"}};
    const dsv4_layer_io ins[4] = {{x, "x", NULL}, {residual, "residual", NULL}, {post, "post", NULL}, {comb, "comb", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 4));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, hc_post, op));
    a.out = streams_of(out);
    return a.T ? b->layer->hc_post(&ex, &a) : DSV4_OK;
}

dsv4_status dsv4_hc_post_pre(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *residual,
                             const dsv4_tensor *post, const dsv4_tensor *comb, const dsv4_hc_site *next,
                             dsv4_tensor *streams, dsv4_tensor *y, dsv4_tensor *post_out, dsv4_tensor *comb_out)
{
    const char *op = "hc_post_pre";
    const dsv4_backend *b;
    dsv4_exec ex;
    dsv4_hc_args a;
    DSV4_TRY(post_setup(ctx, op, x, residual, post, comb, &b, &ex, &a));
    DSV4_OP_TIMER(op, b, &ex);
    int n = a.n;
    int64_t T = a.T, D = a.D;
    DSV4_TRY(check_site(op, next, n, D, 0, b, &a));
    DSV4_TRY(check_streams(op, "streams", streams, T, &n, &D, b, 1));
    const int64_t yshape[2] = {T, D};
    DSV4_TRY(dsv4_layer_out(op, "y", y, DSV4_DT(DSV4_BF16), 2, yshape, b));
    DSV4_TRY(check_post_comb(op, "post_out", post_out, "comb_out", comb_out, T, n, b, 1));
    const dsv4_layer_io outs[4] = {{streams, "streams", "residual"}, {y, "y", NULL}, {post_out, "post_out", "post"},
                                   {comb_out, "comb_out", "comb"}};
    const dsv4_layer_io ins[7] = {{x, "x", NULL},           {residual, "residual", NULL}, {post, "post", NULL},
                                  {comb, "comb", NULL},     {&next->fn, "fn", NULL},      {&next->scale, "scale", NULL},
                                  {&next->base, "base", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 4, ins, 7));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, hc_post_pre, op));
    a.out = streams_of(streams);
    set_pre_outputs(&a, y, post_out, comb_out);
    return T ? b->layer->hc_post_pre(&ex, &a) : DSV4_OK;
}

/* ---- router ------------------------------------------------------------------------------ */
static int64_t index_at(const dsv4_tensor *t, int64_t i, int64_t j)
{
    int64_t off = i * t->stride[0] + (t->ndim > 1 ? j * t->stride[1] : 0);
    return t->dtype == DSV4_I64 ? ((const int64_t *)t->data)[off] : ((const int32_t *)t->data)[off];
}

/* Every token id in [0, V) and every table entry it selects in [0, E). */
static dsv4_status check_hash(const char *op, const dsv4_tensor *tid2eid, const dsv4_tensor *token_ids, int E)
{
    int64_t V = tid2eid->shape[0], k = tid2eid->shape[1];
    for (int64_t t = 0; t < token_ids->shape[0]; t++) {
        int64_t tok = index_at(token_ids, t, 0);
        if (tok < 0 || tok >= V)
            return dsv4_fail(DSV4_ERR_RANGE, "%s: token_ids[%lld] = %lld is outside the table's %lld rows", op,
                             (long long)t, (long long)tok, (long long)V);
        for (int64_t s = 0; s < k; s++) {
            int64_t e = index_at(tid2eid, tok, s);
            if (e < 0 || e >= E)
                return dsv4_fail(DSV4_ERR_RANGE, "%s: tid2eid[%lld][%lld] = %lld is not an expert in [0, %d)", op,
                                 (long long)tok, (long long)s, (long long)e, E);
        }
    }
    return DSV4_OK;
}

dsv4_status dsv4_route(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *gate_w, const dsv4_tensor *bias,
                       const dsv4_tensor *tid2eid, const dsv4_tensor *token_ids, float route_scale, dsv4_tensor *ids,
                       dsv4_tensor *weights)
{
    DSV4_OP_BEGIN("route", LAYER);
    const unsigned ft = DSV4_DT(DSV4_BF16) | DSV4_DT(DSV4_F32), it = DSV4_DT(DSV4_I32) | DSV4_DT(DSV4_I64);
    DSV4_TRY(dsv4_layer_arg(op, "x", x, ft, 2, NULL, b));
    int64_t T = x->shape[0], D = x->shape[1];
    const int64_t wshape[2] = {DSV4_ANY, D};
    DSV4_TRY(dsv4_layer_arg(op, "gate_w", gate_w, ft, 2, wshape, b));
    int64_t E = gate_w->shape[0];
    if (E < 1 || E > DSV4_ROUTE_MAX_EXPERTS || D < 1)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: gate_w is [%lld, %lld]; need 1 <= E <= %d experts and D >= 1", op,
                         (long long)E, (long long)D, DSV4_ROUTE_MAX_EXPERTS);
    DSV4_TRY(dsv4_layer_out(op, "ids", ids, DSV4_DT(DSV4_I32), 2, NULL, b));
    int64_t k = ids->shape[1];
    if (ids->shape[0] != T || k < 1 || k > E || k > DSV4_ROUTE_MAX_TOPK)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: ids is [%lld, %lld]; need [T = %lld, topk] with 1 <= topk <= min(E = %lld, %d)",
                         op, (long long)ids->shape[0], (long long)k, (long long)T, (long long)E, DSV4_ROUTE_MAX_TOPK);
    const int64_t oshape[2] = {T, k}, bshape[1] = {E}, tshape[2] = {DSV4_ANY, k}, kshape[1] = {T};
    DSV4_TRY(dsv4_layer_out(op, "weights", weights, DSV4_DT(DSV4_F32), 2, oshape, b));
    if (bias) DSV4_TRY(dsv4_layer_arg(op, "bias", bias, DSV4_DT(DSV4_F32), 1, bshape, b));
    if (tid2eid) {
        if (bias) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: hash routing (tid2eid) takes no bias", op);
        DSV4_TRY(dsv4_layer_arg(op, "tid2eid", tid2eid, it, 2, tshape, b));
        DSV4_CHECK_ARG(token_ids, "%s: hash routing (tid2eid) needs token_ids", op);
        DSV4_TRY(dsv4_check_tensor(op, "token_ids", token_ids, it, 1, kshape));
        if (token_ids->device != b->device)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: token_ids is not in the memory of backend '%s'", op, b->name);
    }
    if (!isfinite(route_scale)) return dsv4_fail(DSV4_ERR_RANGE, "%s: route_scale is not finite", op);
    const dsv4_layer_io outs[2] = {{ids, "ids", NULL}, {weights, "weights", NULL}};
    const dsv4_layer_io ins[5] = {{x, "x", NULL}, {gate_w, "gate_w", NULL}, {bias, "bias", NULL},
                                  {tid2eid, "tid2eid", NULL}, {tid2eid ? token_ids : NULL, "token_ids", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 2, ins, 5));
    if (tid2eid && b->device == DSV4_DEVICE_CPU) DSV4_TRY(check_hash(op, tid2eid, token_ids, (int)E));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, route, op));
    dsv4_route_args a = {x->data, x->stride[0], x->dtype == DSV4_BF16, gate_w->data, gate_w->stride[0],
                         gate_w->dtype == DSV4_BF16, bias ? bias->data : NULL, NULL, 0, 0, 0, NULL, 0, 0,
                         ids->data, ids->stride[0], weights->data, weights->stride[0], T, D, (int)E, (int)k,
                         route_scale};
    if (tid2eid) {
        a.tid2eid = tid2eid->data;
        a.ldtid = tid2eid->stride[0];
        a.V = tid2eid->shape[0];
        a.tid_i64 = tid2eid->dtype == DSV4_I64;
        a.token_ids = token_ids->data;
        a.tok_stride = token_ids->stride[0];
        a.tok_i64 = token_ids->dtype == DSV4_I64;
    }
    return T ? b->layer->route(&ex, &a) : DSV4_OK;
}
