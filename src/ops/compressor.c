/* Op layer of the compressor (include/dsv4/indexer.h): contract checks, then dispatch. */
#include "core/error.h"
#include "core/ops_indexer.h"
#include "core/tensor_check.h"
#include "ops/indexer_internal.h"

#include <math.h>

#define POS_LIMIT ((int64_t)1 << 52)

int64_t dsv4_compressor_emit_count(int ratio, int64_t start_pos, int64_t n_tokens)
{
    if (ratio < 1 || start_pos < 0 || n_tokens < 0 || start_pos > POS_LIMIT || n_tokens > POS_LIMIT) return -1;
    return (start_pos + n_tokens) / ratio - start_pos / ratio;
}

static dsv4_status check_desc(const char *op, const dsv4_compressor_desc *d)
{
    DSV4_CHECK_ARG(d, "%s: null descriptor", op);
    if (d->kind != DSV4_COMPRESSOR_MAIN && d->kind != DSV4_COMPRESSOR_INDEXER)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: kind %d is neither main (0) nor indexer (1)", op, (int)d->kind);
    if (d->ratio < 2 || d->ratio > DSV4_CMP_MAX_RATIO)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: ratio %d not in [2, %d]", op, d->ratio, DSV4_CMP_MAX_RATIO);
    if (d->kind == DSV4_COMPRESSOR_MAIN && (d->dim < 64 || d->dim > DSV4_CMP_MAX_DIM || d->dim % 64))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: main compressor dim %d must be a multiple of 64 in [64, %d]", op,
                         d->dim, DSV4_CMP_MAX_DIM);
    if (d->kind == DSV4_COMPRESSOR_INDEXER && d->dim != 64 && d->dim != 128 && d->dim != 256)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: indexer compressor dim %d is not 64, 128 or 256", op, d->dim);
    if (!(d->eps >= 0.0f) || isinf(d->eps))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: eps %g must be finite and >= 0", op, (double)d->eps);
    if (d->overlap != 0 && d->overlap != 1)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: overlap %d must be 0 (HCA) or 1 (CSA)", op, d->overlap);
    if (d->fp8_sim && d->kind != DSV4_COMPRESSOR_MAIN)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: fp8_sim applies to the main compressor only", op);
    return DSV4_OK;
}

static dsv4_status check_state(const char *op, const dsv4_compressor_desc *d, const dsv4_tensor *skv,
                               const dsv4_tensor *ss)
{
    int coff = d->overlap ? 2 : 1;
    const int64_t shape[2] = {(int64_t)coff * d->ratio, (int64_t)coff * d->dim};
    DSV4_TRY(dsv4_check_tensor(op, "state_kv", skv, DSV4_DT(DSV4_F32), 2, shape));
    DSV4_TRY(dsv4_check_output(op, "state_kv", skv));
    DSV4_TRY(dsv4_check_tensor(op, "state_score", ss, DSV4_DT(DSV4_F32), 2, shape));
    DSV4_TRY(dsv4_check_output(op, "state_score", ss));
    DSV4_TRY(dsv4_check_inner_contiguous(op, "state_kv", skv));
    DSV4_TRY(dsv4_check_inner_contiguous(op, "state_score", ss));
    if (dsv4_tensors_overlap(skv, ss)) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: state_kv and state_score overlap", op);
    return DSV4_OK;
}

/* The host-memory form of dsv4_compressor_state_reset (no context: plain loops). */
dsv4_status dsv4_compressor_state_init(const dsv4_compressor_desc *desc, dsv4_tensor *state_kv, dsv4_tensor *state_score)
{
    const char *op = "compressor_state_init";
    DSV4_TRY(check_desc(op, desc));
    DSV4_TRY(check_state(op, desc, state_kv, state_score));
    DSV4_TRY(dsv4_check_host(op, "state_kv", state_kv));
    DSV4_TRY(dsv4_check_host(op, "state_score", state_score));
    for (int64_t r = 0; r < state_kv->shape[0]; r++) {
        float *a = (float *)state_kv->data + r * state_kv->stride[0];
        float *s = (float *)state_score->data + r * state_score->stride[0];
        for (int64_t j = 0; j < state_kv->shape[1]; j++) {
            a[j] = 0.0f;
            s[j] = -INFINITY;
        }
    }
    return DSV4_OK;
}

dsv4_status dsv4_compressor_state_reset(dsv4_ctx *ctx, const dsv4_compressor_desc *desc, dsv4_tensor *state_kv,
                                        dsv4_tensor *state_score)
{
    DSV4_OP_BEGIN("compressor_state_reset", INDEXER);
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, compress_reset, op));
    DSV4_TRY(check_desc(op, desc));
    DSV4_TRY(check_state(op, desc, state_kv, state_score));
    const dsv4_tensor *st[2] = {state_kv, state_score};
    const char *names[2] = {"state_kv", "state_score"};
    DSV4_TRY(dsv4_ix_check_views(op, b, st, names, 2));
    return b->indexer->compress_reset(&ex, state_kv->data, state_kv->stride[0], state_score->data, state_score->stride[0],
                                      state_kv->shape[0], state_kv->shape[1]);
}

static dsv4_status check_outputs(const char *op, const dsv4_compressor_desc *d, int64_t m, const dsv4_tensor *out,
                                 const dsv4_tensor *os, dsv4_cmp_out *mode)
{
    *mode = DSV4_CMP_OUT_BF16;
    if (m == 0) return DSV4_OK;
    const int64_t vshape[2] = {m, d->dim};
    if (d->kind == DSV4_COMPRESSOR_MAIN || (out && out->dtype == DSV4_BF16)) {
        if (os) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: out_scales must be NULL when out holds BF16 values", op);
        DSV4_TRY(dsv4_check_tensor(op, "out", out, DSV4_DT(DSV4_BF16), 2, vshape));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    } else {
        const int64_t cshape[2] = {m, d->dim / 2}, sshape[2] = {m, d->dim / 32};
        DSV4_TRY(dsv4_check_tensor(op, "out", out, DSV4_DT(DSV4_FP4X2) | DSV4_DT(DSV4_U8), 2, cshape));
    DSV4_TRY(dsv4_check_output(op, "out", out));
        DSV4_TRY(dsv4_check_tensor(op, "out_scales", os, DSV4_DT(DSV4_E8M0) | DSV4_DT(DSV4_U8), 2, sshape));
        DSV4_TRY(dsv4_check_inner_contiguous(op, "out_scales", os));
        *mode = DSV4_CMP_OUT_PACKED;
    }
    return dsv4_check_inner_contiguous(op, "out", out);
}

/* desc->position given: one token (kv [1, w]) and out with rows. On host memory the position is
 * read here and the call becomes the plain one at that position, its entry (if any) at out's row
 * c mod rows: *start_pos, *out, *out_scales are rewritten (views in o, os). On a device *dev_pos
 * is the backend's to read and *out_rows the rows of out. */
static dsv4_status resolve_position(const char *op, const dsv4_backend *b, const dsv4_compressor_desc *desc,
                                    const dsv4_tensor *kv, int64_t *start_pos, dsv4_tensor **out, dsv4_tensor **out_scales,
                                    dsv4_tensor *o, dsv4_tensor *os, const int64_t **dev_pos, int64_t *out_rows)
{
    const dsv4_tensor *pos = desc->position;
    DSV4_TRY(dsv4_check_tensor(op, "position", pos, DSV4_DT(DSV4_I64), 1, (const int64_t[]){1}));
    if (pos->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: position is not in the memory of backend '%s'", op, b->name);
    if (*start_pos != 0) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: start_pos must be 0 with a position tensor", op);
    if (!kv || kv->ndim != 2 || kv->shape[0] != 1)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: a position tensor takes one token (kv [1, coff*d])", op);
    dsv4_tensor *ot = *out, *st = *out_scales;
    DSV4_CHECK_ARG(ot && ot->ndim == 2 && ot->shape[0] >= 1, "%s: out must have rows with a position tensor", op);
    const int64_t rows = ot->shape[0];
    if (st && (st->ndim != 2 || st->shape[0] != rows))
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: out_scales must have the %lld rows of out", op, (long long)rows);
    if (b->device != DSV4_DEVICE_CPU) {
        *dev_pos = pos->data;
        *out_rows = rows;
        return DSV4_OK;
    }
    const int64_t p = *(const int64_t *)pos->data;
    *start_pos = p;
    if (p < 0 || (p + 1) % desc->ratio) { /* no entry (a bad p is refused by the caller's check) */
        *out = *out_scales = NULL;
        return DSV4_OK;
    }
    const int64_t row = (p / desc->ratio) % rows;
    *o = *ot;
    o->shape[0] = 1;
    o->data = (uint8_t *)ot->data + (size_t)(row * ot->stride[0]) * dsv4_dtype_size(ot->dtype);
    *out = o;
    if (st) {
        *os = *st;
        os->shape[0] = 1;
        os->data = (uint8_t *)st->data + (size_t)(row * st->stride[0]) * dsv4_dtype_size(st->dtype);
        *out_scales = os;
    }
    return DSV4_OK;
}

dsv4_status dsv4_compressor_forward(dsv4_ctx *ctx, const dsv4_compressor_desc *desc, int64_t start_pos,
                                    const dsv4_tensor *kv, const dsv4_tensor *gate, const dsv4_tensor *ape,
                                    const dsv4_tensor *norm, const dsv4_tensor *rope, dsv4_tensor *state_kv,
                                    dsv4_tensor *state_score, dsv4_tensor *out, dsv4_tensor *out_scales)
{
    DSV4_OP_BEGIN("compressor_forward", INDEXER);
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, indexer, compress, op));
    DSV4_TRY(check_desc(op, desc));
    const int64_t *dev_pos = NULL;
    int64_t out_rows = 0;
    dsv4_tensor o1, os1;
    if (desc->position)
        DSV4_TRY(resolve_position(op, b, desc, kv, &start_pos, &out, &out_scales, &o1, &os1, &dev_pos, &out_rows));
    if (start_pos < 0 || start_pos > POS_LIMIT)
        return dsv4_fail(DSV4_ERR_RANGE, "%s: start_pos %lld not in [0, 2^52]", op, (long long)start_pos);
    const int r = desc->ratio, d = desc->dim, coff = desc->overlap ? 2 : 1;
    const int64_t w = (int64_t)coff * d;
    DSV4_TRY(dsv4_check_tensor(op, "kv", kv, DSV4_DT(DSV4_F32), 2, (const int64_t[]){DSV4_ANY, w}));
    const int64_t n = kv->shape[0];
    if (n < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: no tokens (kv has 0 rows)", op);
    if (n > POS_LIMIT) return dsv4_fail(DSV4_ERR_SHAPE, "%s: %lld tokens is too many", op, (long long)n);
    DSV4_TRY(dsv4_check_tensor(op, "gate", gate, DSV4_DT(DSV4_F32), 2, (const int64_t[]){n, w}));
    DSV4_TRY(dsv4_check_tensor(op, "ape", ape, DSV4_DT(DSV4_F32), 2, (const int64_t[]){r, w}));
    DSV4_TRY(dsv4_check_tensor(op, "norm", norm, DSV4_DT(DSV4_F32) | DSV4_DT(DSV4_BF16), 1, (const int64_t[]){d}));
    DSV4_TRY(dsv4_check_tensor(op, "rope", rope, DSV4_DT(DSV4_F32), 2, (const int64_t[]){DSV4_ANY, 64}));
    const dsv4_tensor *ins[5] = {kv, gate, ape, norm, rope};
    const char *inames[5] = {"kv", "gate", "ape", "norm", "rope"};
    DSV4_TRY(dsv4_ix_check_views(op, b, ins, inames, 5));
    DSV4_TRY(check_state(op, desc, state_kv, state_score));

    /* on a device with a position tensor: out's rows are checked; the entry is the backend's */
    int64_t m = dev_pos ? out_rows : dsv4_compressor_emit_count(r, start_pos, n);
    int64_t first = start_pos / r;
    if (!dev_pos && m > 0 && (first + m - 1) * r >= rope->shape[0])
        return dsv4_fail(DSV4_ERR_RANGE, "%s: entry %lld starts at position %lld, past the %lld rows of the rope table", op,
                         (long long)(first + m - 1), (long long)((first + m - 1) * r), (long long)rope->shape[0]);
    dsv4_cmp_out mode;
    DSV4_TRY(check_outputs(op, desc, m, out, out_scales, &mode));
    const dsv4_tensor *outs[4] = {state_kv, state_score, m ? out : NULL, m ? out_scales : NULL};
    const char *onames[4] = {"state_kv", "state_score", "out", "out_scales"};
    DSV4_TRY(dsv4_ix_check_views(op, b, outs, onames, 4));
    DSV4_TRY(dsv4_ix_check_disjoint(op, outs, onames, 4, ins, inames, 5));

    dsv4_cmp_call c = {
        .kind = desc->kind, .ratio = r, .dim = d, .overlap = coff == 2, .fp8_sim = desc->fp8_sim != 0,
        .eps = desc->eps, .start_pos = start_pos, .n_tokens = n,
        .kv = kv->data, .gate = gate->data, .ld_in_kv = kv->stride[0], .ld_in_gate = gate->stride[0],
        .ape = ape->data, .ld_ape = ape->stride[0], .norm = norm->data, .norm_bf16 = norm->dtype == DSV4_BF16,
        .rope = rope->data, .ld_rope = rope->stride[0],
        .state_kv = state_kv->data, .state_score = state_score->data,
        .ld_state_kv = state_kv->stride[0], .ld_state_score = state_score->stride[0],
        .out_mode = mode, .out = m ? out->data : NULL, .ld_out = m ? out->stride[0] : 0,
        .out_scales = (m && mode == DSV4_CMP_OUT_PACKED) ? out_scales->data : NULL,
        .ld_out_scales = (m && mode == DSV4_CMP_OUT_PACKED) ? out_scales->stride[0] : 0,
        .position = dev_pos, .out_rows = out_rows, .rope_rows = rope->shape[0],
    };
    return b->indexer->compress(&ex, &c);
}
