/* Op layer of the linear family: contract checks on tensor views (include/dsv4/linear.h), then
 * dispatch to the backend's linear table. Nothing is written before every check has passed. */
#include "core/error.h"
#include "core/ops_linear.h"
#include "core/tensor_check.h"
#include "ops/linear_check.h"

const char *dsv4_linear_format_name(dsv4_linear_format fmt) { return dsv4_linear_fmt_str(fmt); }

static int is_quantized(dsv4_linear_format fmt) { return fmt <= DSV4_LINEAR_FP4; }

static dsv4_status check_format(const char *op, dsv4_linear_format fmt)
{
    if ((unsigned)fmt >= DSV4_LINEAR_FORMAT_COUNT)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: unknown weight format %d (fp8_b128, mxfp8, fp4, bf16 or f32)", op,
                         (int)fmt);
    return DSV4_OK;
}

static dsv4_status check_k(const char *op, int64_t k)
{
    if (k < 32 || k % 32)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: K = %lld must be a positive multiple of 32", op, (long long)k);
    return DSV4_OK;
}

/* Unit stride in the last dim, unless the view is empty (numpy gives empty arrays any strides). */
static dsv4_status check_inner(const char *op, const char *arg, const dsv4_tensor *t)
{
    return dsv4_tensor_numel(t) ? dsv4_check_inner_contiguous(op, arg, t) : DSV4_OK;
}

static dsv4_status resolve(dsv4_ctx *ctx, const char *op, const dsv4_backend **b, dsv4_exec *ex)
{
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_LINEAR, b, ex));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(*b, linear, linear, op));
    return DSV4_BACKEND_ENTRY_CHECK(*b, linear, workspace_size, op);
}

dsv4_status dsv4_linear_workspace_size(dsv4_ctx *ctx, dsv4_linear_format fmt, int64_t rows, int64_t k, size_t *bytes)
{
    const char *op = "linear_workspace_size";
    DSV4_TRY(check_format(op, fmt));
    DSV4_TRY(check_k(op, k));
    DSV4_CHECK_ARG(rows >= 0, "%s: negative row count %lld", op, (long long)rows);
    DSV4_CHECK_ARG(bytes, "%s: null output pointer", op);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(resolve(ctx, op, &b, &ex));
    *bytes = b->linear->workspace_size(fmt, rows, k);
    return DSV4_OK;
}

/* The tensors of one call, checked together. x/y have xdims dims ([M, K] / [M, N], or
 * [T, G, K] / [T, G, R] for the grouped form); the weight holds groups * n rows. */
typedef struct call {
    const char *op;
    dsv4_linear_format fmt;
    const dsv4_tensor *x, *w, *scale, *bias;
    dsv4_tensor *y;
    int xdims;
    void *workspace;
    size_t workspace_bytes;
    int staged; /* dsv4_linear_staged: the quantized formats read the staging, not x */
} call;

dsv4_status dsv4_linear_check_weight(const char *op, const char *wname, const char *sname, dsv4_linear_format fmt,
                                     const dsv4_tensor *w, const dsv4_tensor *scale, int64_t rows, int64_t k)
{
    static const unsigned wtypes[DSV4_LINEAR_FORMAT_COUNT] = {
        DSV4_DT(DSV4_F8_E4M3) | DSV4_DT(DSV4_U8), DSV4_DT(DSV4_F8_E4M3) | DSV4_DT(DSV4_U8),
        DSV4_DT(DSV4_FP4X2) | DSV4_DT(DSV4_U8), DSV4_DT(DSV4_BF16), DSV4_DT(DSV4_F32)};
    const int64_t wshape[2] = {rows, fmt == DSV4_LINEAR_FP4 ? k / 2 : k};
    DSV4_TRY(dsv4_check_tensor(op, wname, w, wtypes[fmt], 2, wshape));
    DSV4_TRY(dsv4_check_inner_contiguous(op, wname, w));
    if (!is_quantized(fmt)) {
        if (scale)
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s weights take no %s (pass NULL)", op,
                             dsv4_linear_format_name(fmt), sname);
        return DSV4_OK;
    }
    if (!scale)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s weights need a %s tensor", op, dsv4_linear_format_name(fmt), sname);
    int64_t sshape[2] = {rows, k / 32};
    if (fmt == DSV4_LINEAR_FP8_B128) {
        sshape[0] = (rows + 127) / 128;
        sshape[1] = (k + 127) / 128;
    }
    return dsv4_check_tensor(op, sname, scale, DSV4_DT(DSV4_E8M0) | DSV4_DT(DSV4_U8), 2, sshape);
}

static dsv4_status check_overlaps(const call *c, size_t need)
{
    const dsv4_tensor *in[4] = {c->x, c->w, c->scale, c->bias};
    const char *names[4] = {"x", "w", "scale", "bias"};
    const char *wlo = c->workspace, *whi = wlo + (c->workspace ? need : 0);
    const char *ylo, *yhi;
    dsv4_tensor_span(c->y, &ylo, &yhi);
    if (wlo < yhi && ylo < whi) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space overlaps y", c->op);
    for (int i = 0; i < 4; i++) {
        if (!in[i]) continue;
        if (in[i]->device != c->y->device)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s and y are in different memories", c->op, names[i]);
        if (dsv4_tensors_overlap(in[i], c->y))
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: y overlaps %s", c->op, names[i]);
        const char *lo, *hi;
        dsv4_tensor_span(in[i], &lo, &hi);
        if (wlo < hi && lo < whi) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space overlaps %s", c->op, names[i]);
    }
    return DSV4_OK;
}

static dsv4_status run(dsv4_ctx *ctx, const call *c)
{
    const char *op = c->op;
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(check_format(op, c->fmt));
    DSV4_TRY(resolve(ctx, op, &b, &ex));
    DSV4_OP_TIMER(op, b, &ex);
    const int staged = c->staged && is_quantized(c->fmt);
    if (staged) DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, linear, stage, op));
    const unsigned fb = DSV4_DT(DSV4_F32) | DSV4_DT(DSV4_BF16);
    DSV4_TRY(dsv4_check_tensor(op, "x", c->x, fb, c->xdims, NULL));
    DSV4_TRY(check_inner(op, "x", c->x));
    const int grouped = c->xdims == 3;
    const int64_t m = c->x->shape[0], groups = grouped ? c->x->shape[1] : 1, k = c->x->shape[c->xdims - 1];
    DSV4_TRY(check_k(op, k));
    if (groups < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: x has %lld groups; at least 1", op, (long long)groups);
    if (!c->w) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: w is null", op);
    if (c->w->ndim != 2) return dsv4_fail(DSV4_ERR_SHAPE, "%s: w has %d dims, expected 2", op, c->w->ndim);
    const int64_t rows = c->w->shape[0];
    if (rows < 1 || rows % groups)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: w has %lld rows, not a positive multiple of the %lld groups", op,
                         (long long)rows, (long long)groups);
    const int64_t n = rows / groups;
    DSV4_TRY(dsv4_linear_check_weight(op, "w", "scale", c->fmt, c->w, c->scale, rows, k));
    const int64_t yshape[3] = {m, grouped ? groups : n, n};
    DSV4_TRY(dsv4_check_tensor(op, "y", c->y, fb, c->xdims, yshape));
    DSV4_TRY(dsv4_check_output(op, "y", c->y));
    DSV4_TRY(check_inner(op, "y", c->y));
    if (c->bias) {
        const int64_t bshape[1] = {n};
        DSV4_TRY(dsv4_check_tensor(op, "bias", c->bias, fb, 1, bshape));
    }
    if (c->y->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: y is not in the memory of backend '%s'", op, b->name);
    size_t need = b->linear->workspace_size(c->fmt, m * groups, k);
    if (c->workspace_bytes < need || (need && !c->workspace))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: work space of %zu bytes%s; %s needs %zu (dsv4_linear_workspace_size)",
                         op, c->workspace_bytes, c->workspace ? "" : " (null)", dsv4_linear_format_name(c->fmt), need);
    DSV4_TRY(check_overlaps(c, need));
    if (m == 0) return DSV4_OK;

    dsv4_linear_args a = {
        .fmt = c->fmt, .groups = groups, .m = m, .n = n, .k = k,
        .x = c->x->data, .x_bf16 = c->x->dtype == DSV4_BF16, .xs_m = c->x->stride[0], .xs_g = grouped ? c->x->stride[1] : 0,
        .w = c->w->data, .ws_r = c->w->stride[0],
        .scale = c->scale ? c->scale->data : NULL, .ss0 = c->scale ? c->scale->stride[0] : 0,
        .ss1 = c->scale ? c->scale->stride[1] : 0,
        .bias = c->bias ? c->bias->data : NULL, .bias_bf16 = c->bias && c->bias->dtype == DSV4_BF16,
        .bias_s = c->bias ? c->bias->stride[0] : 0,
        .y = c->y->data, .y_bf16 = c->y->dtype == DSV4_BF16, .ys_m = c->y->stride[0], .ys_g = grouped ? c->y->stride[1] : 0,
        .workspace = c->workspace, .workspace_bytes = c->workspace_bytes, .staged = staged,
    };
    return b->linear->linear(&ex, &a);
}

dsv4_status dsv4_linear(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, const dsv4_tensor *w,
                        const dsv4_tensor *scale, const dsv4_tensor *bias, dsv4_tensor *y, void *workspace,
                        size_t workspace_bytes)
{
    call c = {"linear", fmt, x, w, scale, bias, y, 2, workspace, workspace_bytes, 0};
    return run(ctx, &c);
}

dsv4_status dsv4_linear_staged(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, const dsv4_tensor *w,
                               const dsv4_tensor *scale, const dsv4_tensor *bias, dsv4_tensor *y, void *workspace,
                               size_t workspace_bytes)
{
    call c = {"linear_staged", fmt, x, w, scale, bias, y, 2, workspace, workspace_bytes, 1};
    return run(ctx, &c);
}

dsv4_status dsv4_linear_stage(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, void *workspace,
                              size_t workspace_bytes)
{
    const char *op = "linear_stage";
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(check_format(op, fmt));
    DSV4_TRY(resolve(ctx, op, &b, &ex));
    DSV4_OP_TIMER(op, b, &ex);
    DSV4_TRY(dsv4_check_tensor(op, "x", x, DSV4_DT(DSV4_F32) | DSV4_DT(DSV4_BF16), 2, NULL));
    DSV4_TRY(check_inner(op, "x", x));
    const int64_t m = x->shape[0], k = x->shape[1];
    DSV4_TRY(check_k(op, k));
    if (!is_quantized(fmt)) return DSV4_OK; /* nothing to stage: dsv4_linear_staged reads x */
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, linear, stage, op));
    if (x->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: x is not in the memory of backend '%s'", op, b->name);
    const size_t need = b->linear->workspace_size(fmt, m, k);
    if (workspace_bytes < need || !workspace)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: work space of %zu bytes%s; %s needs %zu (dsv4_linear_workspace_size)",
                         op, workspace_bytes, workspace ? "" : " (null)", dsv4_linear_format_name(fmt), need);
    const char *wlo = workspace, *whi = wlo + need, *lo, *hi;
    dsv4_tensor_span(x, &lo, &hi);
    if (wlo < hi && lo < whi) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space overlaps x", op);
    if (m == 0) return DSV4_OK;
    const dsv4_linear_args a = {
        .fmt = fmt, .groups = 1, .m = m, .k = k,
        .x = x->data, .x_bf16 = x->dtype == DSV4_BF16, .xs_m = x->stride[0],
        .workspace = workspace, .workspace_bytes = workspace_bytes,
    };
    return b->linear->stage(&ex, &a);
}

dsv4_status dsv4_grouped_linear(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, const dsv4_tensor *w,
                                const dsv4_tensor *scale, dsv4_tensor *y, void *workspace, size_t workspace_bytes)
{
    call c = {"grouped_linear", fmt, x, w, scale, NULL, y, 3, workspace, workspace_bytes, 0};
    return run(ctx, &c);
}
