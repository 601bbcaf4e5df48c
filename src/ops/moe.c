/* Op layer of SwiGLU and the MoE block (layer.h). The MoE's checks cover every view, every
 * expert's weights and the work space plan; the backend's `moe` entry does the rest (it reads the
 * expert ids: this file reads no tensor data). Every scratch byte comes from the caller's work
 * space. */
#include "ops/layer_check.h"
#include "ops/linear_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static dsv4_status check_limit(const char *op, float limit)
{
    if (!(limit > 0.0f)) return dsv4_fail(DSV4_ERR_RANGE, "%s: swiglu limit %g must be > 0 (+inf: no clamp)", op, (double)limit);
    return DSV4_OK;
}

dsv4_status dsv4_swiglu(dsv4_ctx *ctx, const dsv4_tensor *g, const dsv4_tensor *u, const dsv4_tensor *row_weights,
                        float limit, dsv4_tensor *h)
{
    DSV4_OP_BEGIN("swiglu", LAYER);
    DSV4_TRY(dsv4_layer_arg(op, "g", g, DSV4_DT(DSV4_BF16), 2, NULL, b));
    const int64_t shape[2] = {g->shape[0], g->shape[1]}, wshape[1] = {g->shape[0]};
    DSV4_TRY(dsv4_layer_arg(op, "u", u, DSV4_DT(DSV4_BF16), 2, shape, b));
    if (row_weights) DSV4_TRY(dsv4_layer_arg(op, "row_weights", row_weights, DSV4_DT(DSV4_F32), 1, wshape, b));
    DSV4_TRY(dsv4_layer_out(op, "h", h, DSV4_DT(DSV4_BF16), 2, shape, b));
    DSV4_TRY(check_limit(op, limit));
    const dsv4_layer_io outs[1] = {{h, "h", "g"}};
    const dsv4_layer_io ins[3] = {{g, "g", NULL}, {u, "u", NULL}, {row_weights, "row_weights", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 3));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, swiglu, op));
    const dsv4_swiglu_args a = {g->data, g->stride[0], u->data, u->stride[0], row_weights ? row_weights->data : NULL,
                                h->data, h->stride[0], shape[0], shape[1], limit};
    return shape[0] && shape[1] ? b->layer->swiglu(&ex, &a) : DSV4_OK;
}

/* ---- MoE ------------------------------------------------------------------------------------ */
/* Stored columns of a [rows, k] weight in `fmt` (FP4 packs two values per byte). */
static int64_t stored_cols(dsv4_linear_format fmt, int64_t k) { return fmt == DSV4_LINEAR_FP4 ? k / 2 : k; }

/* An expert's shapes for hidden size D; gives its width I (rows of w1). */
static dsv4_status ffn_dims(const char *op, const char *name, const dsv4_ffn_weights *f, int64_t D, int64_t *I)
{
    if (!f || !f->w1 || !f->w3 || !f->w2)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s is missing a weight (w1, w3 and w2 are required)", op, name);
    if ((unsigned)f->fmt >= DSV4_LINEAR_FORMAT_COUNT)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s has an unknown weight format %d", op, name, (int)f->fmt);
    if (f->w1->ndim != 2 || f->w1->shape[0] < 1)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s.w1 must be a 2-D [I, D] weight", op, name);
    int64_t i = f->w1->shape[0];
    const int64_t s13[2] = {i, stored_cols(f->fmt, D)}, s2[2] = {D, stored_cols(f->fmt, i)};
    const dsv4_tensor *const w[3] = {f->w1, f->w3, f->w2};
    const char *const wn[3] = {"w1", "w3", "w2"};
    for (int m = 0; m < 3; m++) {
        const int64_t *want = m == 2 ? s2 : s13;
        if (w[m]->ndim != 2 || w[m]->shape[0] != want[0] || w[m]->shape[1] != want[1])
            return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s.%s must be [%lld, %lld] (%s, D = %lld, I = %lld)", op, name, wn[m],
                             (long long)want[0], (long long)want[1], dsv4_linear_format_name(f->fmt), (long long)D,
                             (long long)i);
    }
    *I = i;
    return DSV4_OK;
}

/* Work space regions, each 64-byte aligned from an aligned base. */
typedef struct moe_plan {
    int64_t T, D, I, Is;
    int k, E;
    size_t offsets, order, pos, wsorted, xg, g, u, out, sg, su, sout, lin, lin_bytes, total;
} moe_plan;

static size_t take(size_t *at, size_t bytes)
{
    size_t o = *at;
    *at += (bytes + 63) & ~(size_t)63;
    return o;
}

static dsv4_status lin_need(dsv4_ctx *ctx, dsv4_linear_format fmt, int64_t rows, int64_t k, size_t *need)
{
    size_t b = 0;
    DSV4_TRY(dsv4_linear_workspace_size(ctx, fmt, rows, k, &b));
    if (b > *need) *need = b;
    return DSV4_OK;
}

static dsv4_status plan_make(dsv4_ctx *ctx, int64_t T, int k, int E, int64_t D, const dsv4_ffn_weights *ex, int64_t I,
                             const dsv4_ffn_weights *sh, int64_t Is, moe_plan *p)
{
    const int64_t R = T * k;
    size_t lin = 0, at = 0;
    DSV4_TRY(lin_need(ctx, ex->fmt, R, D, &lin));
    DSV4_TRY(lin_need(ctx, ex->fmt, R, I, &lin));
    if (sh) {
        DSV4_TRY(lin_need(ctx, sh->fmt, T, D, &lin));
        DSV4_TRY(lin_need(ctx, sh->fmt, T, Is, &lin));
    }
    *p = (moe_plan){.T = T, .D = D, .I = I, .Is = Is, .k = k, .E = E, .lin_bytes = lin};
    p->offsets = take(&at, (size_t)(E + 1) * 4);
    p->order = take(&at, (size_t)R * 4);
    p->pos = take(&at, (size_t)R * 4);
    p->wsorted = take(&at, (size_t)R * 4);
    p->xg = take(&at, (size_t)(R * D) * 2);
    p->g = take(&at, (size_t)(R * I) * 2);
    p->u = take(&at, (size_t)(R * I) * 2);
    p->out = take(&at, (size_t)(R * D) * 2);
    p->sg = take(&at, sh ? (size_t)(T * Is) * 2 : 0);
    p->su = take(&at, sh ? (size_t)(T * Is) * 2 : 0);
    p->sout = take(&at, sh ? (size_t)(T * D) * 2 : 0);
    p->lin = take(&at, lin);
    p->total = at + 63; /* room to align the caller's base */
    return DSV4_OK;
}

static dsv4_status moe_shapes(const char *op, int n_experts, const dsv4_ffn_weights *expert,
                              const dsv4_ffn_weights *shared, int64_t *D, int64_t *I, int64_t *Is)
{
    if (n_experts < 1 || !expert)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: need at least one routed expert (got %d)", op, n_experts);
    if (!expert->w2 || expert->w2->ndim != 2)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: expert 0 needs a 2-D w2 [D, I]", op);
    if (*D <= 0) *D = expert->w2->shape[0];
    DSV4_TRY(ffn_dims(op, "expert 0", expert, *D, I));
    *Is = 0;
    if (shared) DSV4_TRY(ffn_dims(op, "shared expert", shared, *D, Is));
    return DSV4_OK;
}

dsv4_status dsv4_moe_workspace_size(dsv4_ctx *ctx, int64_t T, int topk, int n_experts, const dsv4_ffn_weights *expert,
                                    const dsv4_ffn_weights *shared, size_t *bytes)
{
    const char *op = "moe_workspace_size";
    DSV4_CHECK_ARG(bytes, "%s: null output", op);
    DSV4_CHECK_ARG(T >= 0 && topk >= 1 && topk <= DSV4_ROUTE_MAX_TOPK, "%s: need T >= 0 and 1 <= topk <= %d", op,
                   DSV4_ROUTE_MAX_TOPK);
    int64_t D = 0, I = 0, Is = 0;
    DSV4_TRY(moe_shapes(op, n_experts, expert, shared, &D, &I, &Is));
    moe_plan p;
    DSV4_TRY(plan_make(ctx, T, topk, n_experts, D, expert, I, shared, Is, &p));
    *bytes = p.total;
    return DSV4_OK;
}

/* One weight of an expert (name "w1" ...) against the linear family's contract, in the backend's
 * memory and clear of the work space [wlo, whi). */
static dsv4_status check_matrix(const char *op, const char *ename, const char *wn, dsv4_linear_format fmt,
                                const dsv4_tensor *w, const dsv4_tensor *s, int64_t rows, int64_t k,
                                const dsv4_backend *b, const char *wlo, const char *whi)
{
    char wname[48], sname[56];
    snprintf(wname, sizeof wname, "%s.%s", ename, wn);
    snprintf(sname, sizeof sname, "%s.%s_scale", ename, wn);
    DSV4_TRY(dsv4_linear_check_weight(op, wname, sname, fmt, w, s, rows, k));
    const dsv4_tensor *const t[2] = {w, s};
    for (int i = 0; i < 2; i++) {
        if (!t[i]) continue;
        if (t[i]->device != b->device)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, i ? sname : wname,
                             b->name);
        const char *lo, *hi;
        dsv4_tensor_span(t[i], &lo, &hi);
        if (lo < whi && wlo < hi)
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space overlaps %s", op, i ? sname : wname);
    }
    return DSV4_OK;
}

/* An expert of width I (from ffn_dims) in full: its three weights and scales. */
static dsv4_status check_expert(const char *op, const char *ename, const dsv4_ffn_weights *f, int64_t D, int64_t I,
                                const dsv4_backend *b, const char *wlo, const char *whi)
{
    DSV4_TRY(check_matrix(op, ename, "w1", f->fmt, f->w1, f->w1_scale, I, D, b, wlo, whi));
    DSV4_TRY(check_matrix(op, ename, "w3", f->fmt, f->w3, f->w3_scale, I, D, b, wlo, whi));
    return check_matrix(op, ename, "w2", f->fmt, f->w2, f->w2_scale, D, I, b, wlo, whi);
}

/* t has what check_matrix accepted in t0 (dtype, shape, strides, data, memory) and is clear of the
 * work space [wlo, whi); both NULL passes. The fast test of the experts after the first (a 2-D
 * view of t0's shape: its byte span computed here). */
static int same_layout(const dsv4_tensor *t, const dsv4_tensor *t0, const char *wlo, const char *whi)
{
    if (!t || !t0) return !t && !t0;
    if (t->dtype != t0->dtype || t->ndim != 2 || t->device != t0->device || !t->data || t->shape[0] != t0->shape[0] ||
        t->shape[1] != t0->shape[1] || t->stride[0] < 0 || t->stride[1] != t0->stride[1])
        return 0;
    const int64_t last = (t->shape[0] - 1) * t->stride[0] + (t->shape[1] - 1) * t->stride[1];
    const char *lo = t->data, *hi = lo + (size_t)(last + 1) * dsv4_dtype_size(t->dtype);
    return hi <= wlo || whi <= lo;
}

/* Every expert: expert 0 in full, the others by the fast match against it, and in full (for the
 * message, or because only a stride differs) when that fails. */
static dsv4_status check_experts(const char *op, const dsv4_ffn_weights *experts, int E, int64_t D, int64_t I,
                                 const dsv4_backend *b, const char *wlo, const char *whi)
{
    DSV4_TRY(check_expert(op, "expert 0", &experts[0], D, I, b, wlo, whi));
    const dsv4_ffn_weights *f0 = &experts[0];
    for (int e = 1; e < E; e++) {
        const dsv4_ffn_weights *f = &experts[e];
        if (f->fmt == f0->fmt && same_layout(f->w1, f0->w1, wlo, whi) &&
            same_layout(f->w1_scale, f0->w1_scale, wlo, whi) && same_layout(f->w3, f0->w3, wlo, whi) &&
            same_layout(f->w3_scale, f0->w3_scale, wlo, whi) && same_layout(f->w2, f0->w2, wlo, whi) &&
            same_layout(f->w2_scale, f0->w2_scale, wlo, whi))
            continue;
        char name[32];
        snprintf(name, sizeof name, "expert %d", e);
        int64_t ie = 0;
        DSV4_TRY(ffn_dims(op, name, f, D, &ie));
        if (ie != I || f->fmt != f0->fmt)
            return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s differs from expert 0 in format or width (%s, I = %lld)", op,
                             name, dsv4_linear_format_name(f->fmt), (long long)ie);
        DSV4_TRY(check_expert(op, name, f, D, I, b, wlo, whi));
    }
    return DSV4_OK;
}

/* dsv4_moe (yf NULL: y BF16, every expert) and dsv4_moe_partial (y F32, experts e_lo .. e_lo+e_n-1
 * at experts[0 ..]): the same checks, the backend entry of each. */
static dsv4_status moe_call(dsv4_ctx *ctx, const char *name, const dsv4_tensor *x, const dsv4_tensor *ids,
                            const dsv4_tensor *weights, const dsv4_ffn_weights *experts, int n_experts, int e_lo,
                            int e_n, const dsv4_ffn_weights *shared, float swiglu_limit, dsv4_tensor *y, int partial,
                            void *workspace, size_t workspace_bytes)
{
    DSV4_OP_BEGIN(name, LAYER);
    if (partial && (n_experts < 1 || e_lo < 0 || e_n < 1 || e_lo > n_experts - e_n))
        return dsv4_fail(DSV4_ERR_RANGE, "%s: experts %d .. %d + %d - 1 are not a range of [0, %d)", op, e_lo, e_lo, e_n,
                         n_experts);
    DSV4_TRY(dsv4_layer_arg(op, "x", x, DSV4_DT(DSV4_BF16), 2, NULL, b));
    int64_t T = x->shape[0], D = x->shape[1], I = 0, Is = 0;
    DSV4_TRY(moe_shapes(op, partial ? e_n : n_experts, experts, shared, &D, &I, &Is));
    DSV4_TRY(dsv4_layer_arg(op, "ids", ids, DSV4_DT(DSV4_I32), 2, NULL, b));
    int64_t k = ids->shape[1];
    if (ids->shape[0] != T || k < 1 || k > DSV4_ROUTE_MAX_TOPK || T * k > INT32_MAX)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: ids is [%lld, %lld]; need [T = %lld, topk <= %d]", op,
                         (long long)ids->shape[0], (long long)k, (long long)T, DSV4_ROUTE_MAX_TOPK);
    const int64_t wshape[2] = {T, k}, yshape[2] = {T, D};
    DSV4_TRY(dsv4_layer_arg(op, "weights", weights, DSV4_DT(DSV4_F32), 2, wshape, b));
    DSV4_TRY(dsv4_layer_out(op, "y", y, DSV4_DT(partial ? DSV4_F32 : DSV4_BF16), 2, yshape, b));
    DSV4_TRY(check_limit(op, swiglu_limit));
    const dsv4_layer_io outs[1] = {{y, "y", NULL}};
    const dsv4_layer_io ins[3] = {{x, "x", NULL}, {ids, "ids", NULL}, {weights, "weights", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 3));
    moe_plan p;
    DSV4_TRY(plan_make(ctx, T, (int)k, n_experts, D, experts, I, shared, Is, &p));
    if (workspace_bytes < p.total || !workspace)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: work space of %zu bytes; this call needs %zu (dsv4_moe_workspace_size)",
                         op, workspace ? workspace_bytes : 0, p.total);
    const char *wlo = workspace, *whi = wlo + workspace_bytes;
    const dsv4_tensor *const all[4] = {x, ids, weights, y};
    for (int i = 0; i < 4; i++) {
        const char *lo, *hi;
        dsv4_tensor_span(all[i], &lo, &hi);
        if (lo < whi && wlo < hi) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space overlaps an argument", op);
    }
    DSV4_TRY(check_experts(op, experts, partial ? e_n : n_experts, D, I, b, wlo, whi));
    if (shared) DSV4_TRY(check_expert(op, "shared expert", shared, D, Is, b, wlo, whi));
    if (partial) DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, moe_partial, op));
    else DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, layer, moe, op));
    if (!T) return DSV4_OK;

    char *base = (char *)(((uintptr_t)workspace + 63) & ~(uintptr_t)63);
    const dsv4_moe_args a = {
        .x = x->data, .ldx = x->stride[0], .ids = ids->data, .ldids = ids->stride[0],
        .weights = weights->data, .ldweights = weights->stride[0], .y = partial ? NULL : y->data, .ldy = y->stride[0],
        .T = T, .D = D, .I = I, .Is = Is, .k = (int)k, .E = n_experts, .experts = experts, .shared = shared,
        .limit = swiglu_limit,
        .offsets = (int32_t *)(base + p.offsets), .order = (int32_t *)(base + p.order), .pos = (int32_t *)(base + p.pos),
        .wsorted = (float *)(base + p.wsorted), .xg = (uint16_t *)(base + p.xg), .g = (uint16_t *)(base + p.g),
        .u = (uint16_t *)(base + p.u), .out = (uint16_t *)(base + p.out),
        .sg = shared ? (uint16_t *)(base + p.sg) : NULL, .su = shared ? (uint16_t *)(base + p.su) : NULL,
        .sout = shared ? (uint16_t *)(base + p.sout) : NULL, .lin = base + p.lin, .lin_bytes = p.lin_bytes,
        .e_lo = partial ? e_lo : 0, .e_n = partial ? e_n : n_experts, .yf = partial ? y->data : NULL,
        .ldyf = partial ? y->stride[0] : 0,
    };
    return partial ? b->layer->moe_partial(&ex, &a) : b->layer->moe(&ex, &a);
}

dsv4_status dsv4_moe(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *ids, const dsv4_tensor *weights,
                     const dsv4_ffn_weights *experts, int n_experts, const dsv4_ffn_weights *shared, float swiglu_limit,
                     dsv4_tensor *y, void *workspace, size_t workspace_bytes)
{
    return moe_call(ctx, "moe", x, ids, weights, experts, n_experts, 0, n_experts, shared, swiglu_limit, y, 0, workspace,
                    workspace_bytes);
}

dsv4_status dsv4_moe_partial(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *ids, const dsv4_tensor *weights,
                             const dsv4_ffn_weights *experts, int n_experts, int e_lo, int e_n,
                             const dsv4_ffn_weights *shared, float swiglu_limit, dsv4_tensor *y, void *workspace,
                             size_t workspace_bytes)
{
    return moe_call(ctx, "moe_partial", x, ids, weights, experts, n_experts, e_lo, e_n, shared, swiglu_limit, y, 1,
                    workspace, workspace_bytes);
}
