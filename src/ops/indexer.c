/* Op layer of the lightning indexer (include/dsv4/indexer.h): contract checks, then dispatch. */
#include "core/error.h"
#include "core/ops_indexer.h"
#include "core/tensor_check.h"
#include "ops/indexer_internal.h"

#include <math.h>

dsv4_status dsv4_ix_check_views(const char *op, const dsv4_backend *b, const dsv4_tensor *const *t,
                                const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        if (!t[i]) continue;
        DSV4_TRY(dsv4_check_inner_contiguous(op, names[i], t[i]));
        if (t[i]->device != b->device)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, names[i], b->name);
    }
    return DSV4_OK;
}

/* Byte spans of two views overlap, except for row-interleaved 2-D views (same row stride, each
 * row of one inside the gap between rows of the other: e.g. the codes and scales of 68-byte
 * indexer cache entries). */
static int views_overlap(const dsv4_tensor *a, const dsv4_tensor *b)
{
    if (!dsv4_tensors_overlap(a, b)) return 0;
    if (a->ndim != 2 || b->ndim != 2 || a->shape[0] != b->shape[0]) return 1;
    const int64_t ea = (int64_t)dsv4_dtype_size(a->dtype), eb = (int64_t)dsv4_dtype_size(b->dtype);
    const int64_t s = a->stride[0] * ea;
    if (s <= 0 || s != b->stride[0] * eb || (a->shape[1] > 1 && a->stride[1] != 1) || (b->shape[1] > 1 && b->stride[1] != 1))
        return 1;
    int64_t delta = ((const char *)b->data - (const char *)a->data) % s;
    if (delta < 0) delta += s;
    return !(a->shape[1] * ea <= delta && delta + b->shape[1] * eb <= s);
}

dsv4_status dsv4_ix_check_disjoint(const char *op, const dsv4_tensor *const *outs, const char *const *onames, int no,
                                   const dsv4_tensor *const *ins, const char *const *inames, int ni)
{
    for (int i = 0; i < no; i++) {
        if (!outs[i]) continue;
        for (int j = i + 1; j < no; j++)
            if (outs[j] && views_overlap(outs[i], outs[j]))
                return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s and %s overlap", op, onames[i], onames[j]);
        for (int j = 0; j < ni; j++)
            if (ins[j] && views_overlap(outs[i], ins[j]))
                return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s overlaps the input %s", op, onames[i], inames[j]);
    }
    return DSV4_OK;
}

static dsv4_status check_dim(const char *op, int64_t d)
{
    if (d != 64 && d != 128 && d != 256)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: head dim %lld is not 64, 128 or 256", op, (long long)d);
    return DSV4_OK;
}

static int64_t pos_at(const dsv4_tensor *p, int64_t t)
{
    return p->dtype == DSV4_I64 ? ((const int64_t *)p->data)[t * p->stride[0]]
                                : ((const int32_t *)p->data)[t * p->stride[0]];
}

/* Positions in a device's memory (include/dsv4/indexer.h): I64, the backend's memory, not read here. */
static int on_device(const dsv4_tensor *p) { return p && p->device != DSV4_DEVICE_CPU; }

/* positions I32/I64 [T]; every p in [0, limit) (limit < 0: no upper bound). On a device: I64 in
 * the backend's memory, the values the backend's to clamp. */
static dsv4_status check_positions(const char *op, const dsv4_backend *b, const dsv4_tensor *p, int64_t tokens,
                                   int64_t limit, const char *what)
{
    DSV4_TRY(dsv4_check_tensor(op, "positions", p, DSV4_DT(DSV4_I32) | DSV4_DT(DSV4_I64), 1, (const int64_t[]){tokens}));
    if (on_device(p)) {
        if (p->device != b->device || p->dtype != DSV4_I64)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: positions on a device must be I64 in the memory of backend '%s'",
                             op, b->name);
        return DSV4_OK;
    }
    DSV4_TRY(dsv4_check_host(op, "positions", p));
    for (int64_t t = 0; t < tokens; t++) {
        int64_t v = pos_at(p, t);
        if (v < 0 || (limit >= 0 && v >= limit) || v > ((int64_t)1 << 52))
            return dsv4_fail(DSV4_ERR_RANGE, "%s: positions[%lld] = %lld is outside [0, %lld) (%s)", op, (long long)t,
                             (long long)v, (long long)(limit >= 0 ? limit : ((int64_t)1 << 52)), what);
    }
    return DSV4_OK;
}

/* A packed-FP4 pair: codes [..., d/2] (FP4X2/U8) + scales [..., d/32] (E8M0/U8) over `lead` dims. */
static dsv4_status check_fp4_pair(const char *op, const char *cn, const dsv4_tensor *c, const char *sn,
                                  const dsv4_tensor *s, int nlead, const int64_t *lead, int64_t d)
{
    int64_t cs[3], ss[3];
    for (int i = 0; i < nlead; i++) cs[i] = ss[i] = lead[i];
    cs[nlead] = d / 2;
    ss[nlead] = d / 32;
    DSV4_TRY(dsv4_check_tensor(op, cn, c, DSV4_DT(DSV4_FP4X2) | DSV4_DT(DSV4_U8), nlead + 1, cs));
    return dsv4_check_tensor(op, sn, s, DSV4_DT(DSV4_E8M0) | DSV4_DT(DSV4_U8), nlead + 1, ss);
}

dsv4_status dsv4_indexer_q(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_tensor *positions, const dsv4_tensor *rope,
                           dsv4_tensor *out, dsv4_tensor *out_scales)
{
    DSV4_OP_BEGIN("indexer_q", INDEXER);
    DSV4_TRY(dsv4_check_tensor(op, "q", q, DSV4_DT(DSV4_BF16), 3, NULL));
    const int64_t T = q->shape[0], H = q->shape[1], d = q->shape[2];
    DSV4_TRY(check_dim(op, d));
    DSV4_TRY(dsv4_check_tensor(op, "rope", rope, DSV4_DT(DSV4_F32), 2, (const int64_t[]){DSV4_ANY, 64}));
    DSV4_TRY(check_positions(op, b, positions, T, rope->shape[0], "rows of the rope table"));
    int packed = !(out && out->dtype == DSV4_BF16);
    if (packed) {
        DSV4_TRY(check_fp4_pair(op, "out", out, "out_scales", out_scales, 2, (const int64_t[]){T, H}, d));
    } else {
        if (out_scales) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: out_scales must be NULL when out holds BF16 values", op);
        DSV4_TRY(dsv4_check_tensor(op, "out", out, DSV4_DT(DSV4_BF16), 3, (const int64_t[]){T, H, d}));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    }
    /* positions are host memory on every backend (check_positions): not among the views */
    const dsv4_tensor *ins[3] = {q, rope, positions}, *outs[2] = {out, packed ? out_scales : NULL};
    const char *inames[3] = {"q", "rope", "positions"}, *onames[2] = {"out", "out_scales"};
    DSV4_TRY(dsv4_ix_check_views(op, b, ins, inames, 2));
    DSV4_TRY(dsv4_ix_check_views(op, b, outs, onames, 2));
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 2, ins, inames, 3));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, index_q, op));
    dsv4_ixq_call c = {
        .tokens = T, .heads = H, .dim = (int)d, .q = q->data, .ld_q_t = q->stride[0], .ld_q_h = q->stride[1],
        .positions = positions->data, .pos_i64 = positions->dtype == DSV4_I64, .ld_pos = positions->stride[0],
        .pos_device = on_device(positions), .rope_rows = rope->shape[0],
        .rope = rope->data, .ld_rope = rope->stride[0], .packed = packed, .out = out->data,
        .ld_out_t = out->stride[0], .ld_out_h = out->stride[1],
        .out_scales = packed ? out_scales->data : NULL, .ld_os_t = packed ? out_scales->stride[0] : 0,
        .ld_os_h = packed ? out_scales->stride[1] : 0,
    };
    if (T == 0 || H == 0) return DSV4_OK;
    return b->indexer->index_q(&ex, &c);
}

dsv4_status dsv4_indexer_weights(dsv4_ctx *ctx, const dsv4_tensor *proj, int head_dim, dsv4_tensor *out)
{
    DSV4_OP_BEGIN("indexer_weights", INDEXER);
    DSV4_CHECK_ARG(head_dim > 0, "%s: head_dim %d must be positive", op, head_dim);
    DSV4_TRY(dsv4_check_tensor(op, "proj", proj, DSV4_DT(DSV4_BF16) | DSV4_DT(DSV4_F32), 2, NULL));
    const int64_t T = proj->shape[0], H = proj->shape[1];
    DSV4_TRY(dsv4_check_tensor(op, "out", out, DSV4_DT(DSV4_F32), 2, (const int64_t[]){T, H}));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    const dsv4_tensor *ins[1] = {proj}, *outs[1] = {out};
    const char *inames[1] = {"proj"}, *onames[1] = {"out"};
    DSV4_TRY(dsv4_ix_check_views(op, b, ins, inames, 1));
    DSV4_TRY(dsv4_ix_check_views(op, b, outs, onames, 1));
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 1, ins, inames, 1));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, head_weights, op));
    if (T == 0 || H == 0) return DSV4_OK;
    /* d^-0.5 · H^-0.5 in double, rounded once to fp32 (the reference's Python float, used by
     * PyTorch as an fp32 scalar on the BF16 tensor) */
    float scale = (float)(1.0 / sqrt((double)head_dim) / sqrt((double)H));
    return b->indexer->head_weights(&ex, proj->data, proj->dtype == DSV4_BF16, proj->stride[0], T, H, scale, out->data,
                                    out->stride[0]);
}

/* Validate dsv4_indexer_args into raw operands. */
static dsv4_status check_args(const char *op, const dsv4_backend *b, const dsv4_indexer_args *a, dsv4_ix_operands *o)
{
    DSV4_CHECK_ARG(a, "%s: null arguments", op);
    DSV4_CHECK_ARG(a->ratio >= 1 && a->ratio <= 1 << 20, "%s: ratio %d not in [1, 2^20]", op, a->ratio);
    DSV4_TRY(dsv4_check_tensor(op, "q", a->q, DSV4_DT(DSV4_FP4X2) | DSV4_DT(DSV4_U8), 3, NULL));
    const int64_t T = a->q->shape[0], H = a->q->shape[1], d = a->q->shape[2] * 2;
    DSV4_TRY(check_dim(op, d));
    if (H < 1 || H > DSV4_IX_MAX_HEADS)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %lld heads not in [1, %d]", op, (long long)H, DSV4_IX_MAX_HEADS);
    DSV4_TRY(check_fp4_pair(op, "q", a->q, "q_scales", a->q_scales, 2, (const int64_t[]){T, H}, d));
    DSV4_TRY(dsv4_check_tensor(op, "weights", a->weights, DSV4_DT(DSV4_F32), 2, (const int64_t[]){T, H}));
    DSV4_TRY(dsv4_check_tensor(op, "k", a->k, DSV4_DT(DSV4_FP4X2) | DSV4_DT(DSV4_U8), 2, NULL));
    const int64_t N = a->k->shape[0];
    if (N >= ((int64_t)1 << 31) - 1)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %lld cache entries overflow int32 indices", op, (long long)N);
    DSV4_TRY(check_fp4_pair(op, "k", a->k, "k_scales", a->k_scales, 1, (const int64_t[]){N}, d));
    DSV4_TRY(check_positions(op, b, a->positions, T, -1, ""));
    for (int64_t t = 0; t < T && !on_device(a->positions); t++) {
        int64_t nt = (pos_at(a->positions, t) + 1) / a->ratio;
        if (nt > N)
            return dsv4_fail(DSV4_ERR_RANGE,
                             "%s: token %lld at position %lld has %lld candidates but the cache holds %lld entries", op,
                             (long long)t, (long long)pos_at(a->positions, t), (long long)nt, (long long)N);
    }
    const dsv4_tensor *ins[5] = {a->q, a->q_scales, a->weights, a->k, a->k_scales}; /* positions: host */
    const char *names[5] = {"q", "q_scales", "weights", "k", "k_scales"};
    DSV4_TRY(dsv4_ix_check_views(op, b, ins, names, 5));
    *o = (dsv4_ix_operands){
        .tokens = T, .heads = H, .n_cache = N, .dim = (int)d, .ratio = a->ratio,
        .q = a->q->data, .q_scales = a->q_scales->data, .ld_q_t = a->q->stride[0], .ld_q_h = a->q->stride[1],
        .ld_qs_t = a->q_scales->stride[0], .ld_qs_h = a->q_scales->stride[1],
        .weights = a->weights->data, .ld_w = a->weights->stride[0],
        .k = a->k->data, .k_scales = a->k_scales->data, .ld_k = a->k->stride[0], .ld_ks = a->k_scales->stride[0],
        .positions = a->positions->data, .pos_i64 = a->positions->dtype == DSV4_I64, .ld_pos = a->positions->stride[0],
        .pos_device = on_device(a->positions),
    };
    return DSV4_OK;
}

static const char *const arg_names[6] = {"q", "q_scales", "weights", "k", "k_scales", "positions"};

static void arg_views(const dsv4_indexer_args *a, const dsv4_tensor **v)
{
    v[0] = a->q; v[1] = a->q_scales; v[2] = a->weights; v[3] = a->k; v[4] = a->k_scales; v[5] = a->positions;
}

dsv4_status dsv4_indexer_scores(dsv4_ctx *ctx, const dsv4_indexer_args *args, dsv4_tensor *scores)
{
    DSV4_OP_BEGIN("indexer_scores", INDEXER);
    dsv4_ix_operands o;
    DSV4_TRY(check_args(op, b, args, &o));
    DSV4_TRY(dsv4_check_tensor(op, "scores", scores, DSV4_DT(DSV4_F32), 2, (const int64_t[]){o.tokens, o.n_cache}));
    DSV4_TRY(dsv4_check_output(op, "scores", scores));
    const dsv4_tensor *ins[6], *outs[1] = {scores};
    const char *onames[1] = {"scores"};
    arg_views(args, ins);
    DSV4_TRY(dsv4_ix_check_views(op, b, outs, onames, 1));
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 1, ins, arg_names, 6));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, scores, op));
    if (o.tokens == 0 || o.n_cache == 0) return DSV4_OK;
    return b->indexer->scores(&ex, &o, scores->data, scores->stride[0]);
}

size_t dsv4_indexer_workspace_size(dsv4_ctx *ctx, int64_t tokens, int64_t topk)
{
    const dsv4_backend *b;
    dsv4_exec ex;
    if (tokens < 0 || topk < 1 || topk > ((int64_t)1 << 30)) return 0;
    if (dsv4_op_resolve(ctx, "indexer_workspace_size", DSV4_FAMILY_INDEXER, &b, &ex) != DSV4_OK ||
        !b->indexer->workspace_size)
        return 0;
    return b->indexer->workspace_size(&ex, tokens, topk);
}

/* indices I32 [T, topk], lengths I32 [T], and the workspace. */
static dsv4_status check_topk_out(const char *op, const dsv4_backend *b, const dsv4_exec *ex, int64_t T, int64_t topk,
                                  dsv4_tensor *indices, dsv4_tensor *lengths, void *ws, size_t ws_bytes,
                                  dsv4_topk_out *out)
{
    if (topk < 1 || topk > ((int64_t)1 << 30))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: topk %lld not in [1, 2^30]", op, (long long)topk);
    DSV4_TRY(dsv4_check_tensor(op, "indices", indices, DSV4_DT(DSV4_I32), 2, (const int64_t[]){T, topk}));
    DSV4_TRY(dsv4_check_output(op, "indices", indices));
    DSV4_TRY(dsv4_check_tensor(op, "lengths", lengths, DSV4_DT(DSV4_I32), 1, (const int64_t[]){T}));
    DSV4_TRY(dsv4_check_output(op, "lengths", lengths));
    const dsv4_tensor *outs[1] = {indices};
    const char *onames[1] = {"indices"};
    DSV4_TRY(dsv4_ix_check_views(op, b, outs, onames, 1));
    if (lengths->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: lengths is not in the memory of backend '%s'", op, b->name);
    if (dsv4_tensors_overlap(indices, lengths)) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: indices and lengths overlap", op);
    size_t need = b->indexer->workspace_size ? b->indexer->workspace_size(ex, T, topk) : 0;
    if (need && (!ws || ws_bytes < need))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: workspace of %zu bytes given, %zu needed (dsv4_indexer_workspace_size)",
                         op, ws ? ws_bytes : 0, need);
    *out = (dsv4_topk_out){.topk = topk, .indices = indices->data, .ld_indices = indices->stride[0],
                           .lengths = lengths->data, .ld_lengths = lengths->stride[0],
                           .workspace = ws, .workspace_bytes = ws_bytes};
    return DSV4_OK;
}

/* The workspace must not overlap any view either. */
static dsv4_status check_ws_overlap(const char *op, void *ws, size_t bytes, const dsv4_tensor *const *views, int n)
{
    if (!ws || !bytes) return DSV4_OK;
    dsv4_tensor w;
    DSV4_TRY(dsv4_tensor_init(&w, ws, DSV4_U8, 1, (const int64_t[]){(int64_t)bytes}));
    for (int i = 0; i < n; i++)
        if (views[i] && dsv4_tensors_overlap(&w, views[i]))
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the workspace overlaps an argument", op);
    return DSV4_OK;
}

dsv4_status dsv4_indexer_select(dsv4_ctx *ctx, const dsv4_indexer_args *args, int64_t topk, dsv4_tensor *indices,
                                dsv4_tensor *lengths, void *workspace, size_t workspace_bytes)
{
    DSV4_OP_BEGIN("indexer_select", INDEXER);
    dsv4_ix_operands o;
    dsv4_topk_out out;
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, select, op));
    DSV4_TRY(check_args(op, b, args, &o));
    DSV4_TRY(check_topk_out(op, b, &ex, o.tokens, topk, indices, lengths, workspace, workspace_bytes, &out));
    const dsv4_tensor *all[8], *outs[2] = {indices, lengths};
    const char *onames[2] = {"indices", "lengths"};
    arg_views(args, all);
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 2, all, arg_names, 6));
    all[6] = indices;
    all[7] = lengths;
    DSV4_TRY(check_ws_overlap(op, workspace, workspace_bytes, all, 8));
    if (o.tokens == 0) return DSV4_OK;
    return b->indexer->select(&ex, &o, &out);
}

dsv4_status dsv4_indexer_topk(dsv4_ctx *ctx, const dsv4_tensor *scores, const dsv4_tensor *n_valid, int64_t topk,
                              dsv4_tensor *indices, dsv4_tensor *lengths, void *workspace, size_t workspace_bytes)
{
    DSV4_OP_BEGIN("indexer_topk", INDEXER);
    dsv4_topk_out out;
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, topk, op));
    DSV4_TRY(dsv4_check_tensor(op, "scores", scores, DSV4_DT(DSV4_F32), 2, NULL));
    DSV4_TRY(dsv4_check_output(op, "scores", scores));
    const int64_t T = scores->shape[0], N = scores->shape[1];
    if (N >= ((int64_t)1 << 31) - 1)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %lld candidates overflow int32 indices", op, (long long)N);
    const dsv4_tensor *ins[2] = {scores, n_valid};
    const char *inames[2] = {"scores", "n_valid"};
    if (n_valid) {
        DSV4_TRY(dsv4_check_tensor(op, "n_valid", n_valid, DSV4_DT(DSV4_I32), 1, (const int64_t[]){T}));
        DSV4_TRY(dsv4_check_host(op, "n_valid", n_valid));
        for (int64_t t = 0; t < T; t++) {
            int32_t v = ((const int32_t *)n_valid->data)[t * n_valid->stride[0]];
            if (v < 0 || v > N)
                return dsv4_fail(DSV4_ERR_RANGE, "%s: n_valid[%lld] = %d is outside [0, %lld]", op, (long long)t, v,
                                 (long long)N);
        }
    }
    DSV4_TRY(dsv4_ix_check_views(op, b, ins, inames, 1));
    DSV4_TRY(check_topk_out(op, b, &ex, T, topk, indices, lengths, workspace, workspace_bytes, &out));
    const dsv4_tensor *outs[2] = {indices, lengths}, *all[4] = {scores, n_valid, indices, lengths};
    const char *onames[2] = {"indices", "lengths"};
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 2, ins, inames, 2));
    DSV4_TRY(check_ws_overlap(op, workspace, workspace_bytes, all, 4));
    if (T == 0) return DSV4_OK;
    return b->indexer->topk(&ex, scores->data, scores->stride[0], T, N, n_valid ? n_valid->data : NULL,
                            n_valid ? n_valid->stride[0] : 0, &out);
}
