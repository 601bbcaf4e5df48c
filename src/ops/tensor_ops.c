/* Op layer of the tensor family (include/dsv4/tensor_ops.h): embedding rows, the broadcast BF16
 * add, row copies. Contract checks on the views, then one call into the backend's table; index
 * tensors are left to the backend to read (this file reads no tensor data), and so are the
 * sampling parameters. */
#include "core/ops_tensor.h"
#include "ops/layer_check.h"

#include <stdint.h>

/* An index tensor: I32 [n] (any stride) in the backend's memory. */
static dsv4_status check_index(const char *op, const char *name, const dsv4_tensor *t, int64_t n, const dsv4_backend *b)
{
    const int64_t shape[1] = {n};
    DSV4_TRY(dsv4_check_tensor(op, name, t, DSV4_DT(DSV4_I32), 1, shape));
    if (t->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, name, b->name);
    return DSV4_OK;
}

/* A [T, n, D] or [T, D] BF16 view (out: an output) -> its strides of T and of the copies, and n. */
static dsv4_status check_copies(const char *op, const char *name, const dsv4_tensor *t, int64_t T, int64_t D,
                                const dsv4_backend *b, int out, int64_t *st, int64_t *sj, int64_t *n)
{
    DSV4_CHECK_ARG(t, "%s: %s is null", op, name);
    const int nd = t->ndim == 3 ? 3 : 2;
    const int64_t want[3] = {T, nd == 3 ? DSV4_ANY : D, D};
    DSV4_TRY((out ? dsv4_layer_out : dsv4_layer_arg)(op, name, t, DSV4_DT(DSV4_BF16), nd, want, b));
    *n = nd == 3 ? t->shape[1] : 1;
    if (*n < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s has no copies (dim 1 is 0)", op, name);
    *st = t->stride[0];
    *sj = nd == 3 ? t->stride[1] : 0;
    return DSV4_OK;
}

dsv4_status dsv4_embed_rows(dsv4_ctx *ctx, const dsv4_tensor *table, const dsv4_tensor *ids, dsv4_tensor *out)
{
    DSV4_OP_BEGIN("embed_rows", TENSOR);
    DSV4_TRY(dsv4_layer_arg(op, "table", table, DSV4_DT(DSV4_BF16), 2, NULL, b));
    const int64_t V = table->shape[0], D = table->shape[1];
    if (V < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: the table has no rows", op);
    DSV4_CHECK_ARG(ids, "%s: ids is null", op);
    DSV4_TRY(check_index(op, "ids", ids, DSV4_ANY, b));
    const int64_t T = ids->shape[0];
    int64_t st, sj, copies;
    DSV4_TRY(check_copies(op, "out", out, T, D, b, 1, &st, &sj, &copies));
    const dsv4_layer_io outs[1] = {{out, "out", NULL}};
    const dsv4_layer_io ins[2] = {{table, "table", NULL}, {ids, "ids", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 2));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, tensor, embed_rows, op));
    const dsv4_embed_args a = {table->data, table->stride[0], V, D, ids->data, ids->stride[0], T,
                               out->data, st, sj, copies};
    return T ? b->tensor->embed_rows(&ex, &a) : DSV4_OK;
}

dsv4_status dsv4_add_bf16(dsv4_ctx *ctx, const dsv4_tensor *a, const dsv4_tensor *b_, dsv4_tensor *y)
{
    DSV4_OP_BEGIN("add_bf16", TENSOR);
    DSV4_TRY(dsv4_layer_arg(op, "b", b_, DSV4_DT(DSV4_BF16), 2, NULL, b));
    const int64_t T = b_->shape[0], D = b_->shape[1];
    int64_t sa_t, sa_j, n, sy_t, sy_j, ny;
    DSV4_TRY(check_copies(op, "a", a, T, D, b, 0, &sa_t, &sa_j, &n));
    DSV4_TRY(check_copies(op, "y", y, T, D, b, 1, &sy_t, &sy_j, &ny));
    if (y->ndim != a->ndim || ny != n)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: y must have a's shape (%d dims, %lld copies; got %d dims, %lld copies)",
                         op, a->ndim, (long long)n, y->ndim, (long long)ny);
    const dsv4_layer_io outs[1] = {{y, "y", "a"}};
    const dsv4_layer_io ins[2] = {{a, "a", NULL}, {b_, "b", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 2));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, tensor, add_bf16, op));
    const dsv4_add_args args = {.T = T, .n = n, .D = D, .a = a->data, .b = b_->data, .y = y->data,
                                .sa_t = sa_t, .sa_j = sa_j, .sb_t = b_->stride[0], .sy_t = sy_t, .sy_j = sy_j};
    return T && D ? b->tensor->add_bf16(&ex, &args) : DSV4_OK;
}

dsv4_status dsv4_copy_rows(dsv4_ctx *ctx, const dsv4_tensor *src, const dsv4_tensor *idx, dsv4_tensor *dst)
{
    DSV4_OP_BEGIN("copy_rows", TENSOR);
    const unsigned any = DSV4_DT(DSV4_DTYPE_COUNT) - 1;
    DSV4_TRY(dsv4_layer_arg(op, "src", src, any, 2, NULL, b));
    const int64_t R = src->shape[0], C = src->shape[1];
    int64_t n = R;
    if (idx) {
        DSV4_TRY(check_index(op, "idx", idx, DSV4_ANY, b));
        n = idx->shape[0];
    }
    const int64_t shape[2] = {n, C};
    DSV4_TRY(dsv4_layer_out(op, "dst", dst, any, 2, shape, b));
    if (dst->dtype != src->dtype)
        return dsv4_fail(DSV4_ERR_DTYPE, "%s: dst has dtype %s, src %s (they must match)", op,
                         dsv4_dtype_name(dst->dtype), dsv4_dtype_name(src->dtype));
    if (idx && n && !R) return dsv4_fail(DSV4_ERR_RANGE, "%s: idx selects rows of a src without rows", op);
    /* dst may be src itself only as a plain copy (nothing to move); a gather in place would race */
    const dsv4_layer_io outs[1] = {{dst, "dst", idx ? NULL : "src"}};
    const dsv4_layer_io ins[2] = {{src, "src", NULL}, {idx, "idx", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 2));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, tensor, copy_rows, op));
    if (!n || !C || (!idx && dst->data == src->data)) return DSV4_OK;
    const int64_t es = (int64_t)dsv4_dtype_size(src->dtype);
    const dsv4_copy_rows_args a = {src->data, src->stride[0] * es, R, idx ? idx->data : NULL, idx ? idx->stride[0] : 0,
                                   dst->data, dst->stride[0] * es, n, C * es};
    return b->tensor->copy_rows(&ex, &a);
}

dsv4_status dsv4_paged_slots(dsv4_ctx *ctx, const dsv4_tensor *block_table, int64_t block_size,
                             const dsv4_tensor *entries, dsv4_tensor *slots)
{
    DSV4_OP_BEGIN("paged_slots", TENSOR);
    DSV4_CHECK_ARG(block_table && entries && slots, "%s: null tensor", op);
    DSV4_TRY(check_index(op, "block_table", block_table, DSV4_ANY, b));
    if (block_table->stride[0] != 1 && block_table->shape[0] > 1)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: block_table must be contiguous", op);
    const int64_t nb = block_table->shape[0];
    if (block_size < 1 || block_size > ((int64_t)1 << 30) || nb * block_size > INT32_MAX)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: block_size %lld with %lld blocks: slots must fit int32", op,
                         (long long)block_size, (long long)nb);
    DSV4_TRY(check_index(op, "entries", entries, DSV4_ANY, b));
    const int64_t n = entries->shape[0];
    DSV4_TRY(check_index(op, "slots", slots, n, b));
    DSV4_TRY(dsv4_check_output(op, "slots", slots));
    const int in_place = slots->data == entries->data && slots->stride[0] == entries->stride[0];
    const dsv4_layer_io outs[1] = {{slots, "slots", in_place ? "entries" : NULL}};
    const dsv4_layer_io ins[2] = {{entries, "entries", NULL}, {block_table, "block_table", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 2));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, tensor, paged_slots, op));
    const dsv4_paged_slots_args a = {block_table->data, entries->data, slots->data, nb, block_size, entries->stride[0],
                                     slots->stride[0], n};
    return n ? b->tensor->paged_slots(&ex, &a) : DSV4_OK;
}

dsv4_status dsv4_sample_workspace_size(dsv4_ctx *ctx, int64_t rows, int64_t V, size_t *bytes)
{
    (void)ctx; /* the same for every backend */
    DSV4_CHECK_ARG(bytes && rows >= 0 && V >= 0, "sample_workspace_size: rows %lld and V %lld must be >= 0",
                   (long long)rows, (long long)V);
    *bytes = (size_t)rows * (size_t)DSV4_SAMPLE_ROW_BYTES(V);
    return DSV4_OK;
}

dsv4_status dsv4_sample_rows(dsv4_ctx *ctx, const dsv4_tensor *logits, const struct dsv4_sampling *params,
                             uint64_t *rng, dsv4_tensor *tokens, void *workspace, size_t workspace_bytes)
{
    DSV4_OP_BEGIN("sample_rows", TENSOR);
    DSV4_TRY(dsv4_layer_arg(op, "logits", logits, DSV4_DT(DSV4_F32), 2, NULL, b));
    const int64_t B = logits->shape[0], V = logits->shape[1];
    if (V < 1 || V > (1 << 29))
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: V = %lld is outside [1, 2^29]", op, (long long)V);
    DSV4_CHECK_ARG(tokens, "%s: tokens is null", op);
    DSV4_TRY(check_index(op, "tokens", tokens, B, b));
    DSV4_TRY(dsv4_check_output(op, "tokens", tokens));
    DSV4_CHECK_ARG(!B || (params && rng && workspace), "%s: null params, rng or workspace", op);
    size_t need = 0;
    DSV4_TRY(dsv4_sample_workspace_size(ctx, B, V, &need));
    if (workspace_bytes < need)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the workspace has %zu bytes, %zu are needed", op, workspace_bytes,
                         need);
    const dsv4_layer_io outs[1] = {{tokens, "tokens", NULL}};
    const dsv4_layer_io ins[1] = {{logits, "logits", NULL}};
    DSV4_TRY(dsv4_layer_no_overlap(op, outs, 1, ins, 1));
    const char *wlo = workspace, *whi = wlo + need, *lo, *hi;
    dsv4_tensor_span(tokens, &lo, &hi);
    if (B && lo < whi && wlo < hi) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: tokens overlaps the workspace", op);
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, tensor, sample, op));
    const dsv4_sample_args a = {logits->data, logits->stride[0], B, V, params, rng, tokens->data, tokens->stride[0],
                                workspace, DSV4_SAMPLE_ROW_BYTES(V)};
    return B ? b->tensor->sample(&ex, &a) : DSV4_OK;
}
