/* Op layer of the attention family: contract checks on tensor views (shapes, dtypes, strides,
 * devices, overlaps, and index ranges of host data), then one call into the backend's table.
 * Nothing is written before every check has passed. */
#include "core/error.h"
#include "core/ops_attention.h"
#include "core/tensor_check.h"

#include <math.h>

#define KVD DSV4_KV_DIM

#define NEED_ENTRY(b, entry, op) DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, attention, entry, op))

/* The start of every op: its name, the context's backend and execution settings, the entry. */
#define OP_BEGIN(name, entry)        \
    DSV4_OP_BEGIN(name, ATTENTION); \
    NEED_ENTRY(b, entry, op)

static dsv4_status on_device(const char *op, const char *arg, const dsv4_tensor *t, const dsv4_backend *b)
{
    if (t->device != b->device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, arg, b->name);
    return DSV4_OK;
}

/* A tensor of one of `mask`'s dtypes and shape `want` (ndim dims), unit inner stride, in the
 * backend's memory. */
static dsv4_status check_arg(const char *op, const char *arg, const dsv4_tensor *t, unsigned mask, int ndim,
                             const int64_t *want, const dsv4_backend *b)
{
    DSV4_TRY(dsv4_check_tensor(op, arg, t, mask, ndim, want));
    DSV4_TRY(dsv4_check_inner_contiguous(op, arg, t));
    return on_device(op, arg, t, b);
}

/* A 1-D vector of n elements; n == DSV4_ANY accepts any length. */
static dsv4_status check_vec(const char *op, const char *arg, const dsv4_tensor *t, dsv4_dtype dt, int64_t n,
                             const dsv4_backend *b)
{
    const int64_t want[1] = {n};
    return check_arg(op, arg, t, DSV4_DT(dt), 1, want, b);
}

/* Heads tensor [N, H, 512] BF16 with unit inner stride; H >= 1. */
static dsv4_status check_heads(const char *op, const char *arg, const dsv4_tensor *t, int64_t n, int64_t h,
                               const dsv4_backend *b)
{
    const int64_t want[3] = {n, h, KVD};
    DSV4_TRY(check_arg(op, arg, t, DSV4_DT(DSV4_BF16), 3, want, b));
    if (t->shape[1] < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s needs at least one head", op, arg);
    return DSV4_OK;
}

static dsv4_status check_cache(const char *op, const char *arg, const dsv4_kv_cache *c, const dsv4_backend *b,
                               dsv4_kv_geom *g)
{
    if (!c) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s is null", op, arg);
    DSV4_TRY(check_arg(op, arg, &c->pages, DSV4_DT(DSV4_U8), 2, NULL, b));
    int64_t bs = c->block_size, np = c->pages.shape[0];
    if (bs < 1 || bs > INT32_MAX / DSV4_KV_ENTRY_BYTES)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s block_size %lld is out of range", op, arg, (long long)bs);
    if (np < 1 || np > INT32_MAX / bs)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s has %lld pages of %lld entries (need >= 1 page, < 2^31 slots)", op,
                         arg, (long long)np, (long long)bs);
    int64_t need = bs * DSV4_KV_ENTRY_BYTES, stride = np > 1 ? c->pages.stride[0] : c->pages.shape[1];
    if (c->pages.shape[1] < need || stride < need)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s pages of %lld bytes (stride %lld) cannot hold %lld entries of 584 bytes",
                         op, arg, (long long)c->pages.shape[1], (long long)stride, (long long)bs);
    g->pages = c->pages.data;
    g->page_stride = stride;
    g->block_size = bs;
    g->num_slots = np * bs;
    return DSV4_OK;
}

static int is_host(const dsv4_tensor *t) { return t->device == DSV4_DEVICE_CPU; }

/* Host index data: every element of an I32/I64 vector or matrix in [lo, hi), or negative
 * when allow_negative. Element (i, j) at i*stride[0] + j. */
static dsv4_status check_range(const char *op, const char *arg, const dsv4_tensor *t, int64_t lo, int64_t hi,
                               int allow_negative)
{
    if (!is_host(t)) return DSV4_OK;
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
    int64_t rs = t->ndim == 2 ? t->stride[0] : 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t at = i * rs + j;
            int64_t v = t->dtype == DSV4_I64 ? ((const int64_t *)t->data)[at] : ((const int32_t *)t->data)[at];
            if ((v < 0 && allow_negative) || (v >= lo && v < hi)) continue;
            return dsv4_fail(DSV4_ERR_RANGE, "%s: %s[%lld] = %lld is outside [%lld, %lld)%s", op, arg,
                             (long long)(i * cols + j), (long long)v, (long long)lo, (long long)hi,
                             allow_negative ? " (negative = no entry)" : "");
        }
    return DSV4_OK;
}

/* positions I64 [n] and rope F32 [max_pos, 64] (contiguous). */
static dsv4_status check_rope(const char *op, const dsv4_tensor *positions, const dsv4_tensor *rope, int64_t n,
                              const dsv4_backend *b)
{
    DSV4_TRY(check_vec(op, "positions", positions, DSV4_I64, n, b));
    const int64_t rw[2] = {DSV4_ANY, 2 * 32};
    DSV4_TRY(check_arg(op, "rope", rope, DSV4_DT(DSV4_F32), 2, rw, b));
    DSV4_TRY(dsv4_check_contiguous(op, "rope", rope));
    if (rope->shape[0] < 1) return dsv4_fail(DSV4_ERR_SHAPE, "%s: the rope table has no rows", op);
    return check_range(op, "positions", positions, 0, rope->shape[0], 0);
}

static dsv4_status no_overlap(const char *op, const char *wname, const dsv4_tensor *w, const dsv4_tensor *const *others,
                              const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (others[i] && dsv4_tensors_overlap(w, others[i]))
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s overlaps %s", op, wname, names[i]);
    return DSV4_OK;
}

/* ---- RoPE --------------------------------------------------------------------------------- */
dsv4_rope_params dsv4_rope_v4_params(dsv4_rope_kind kind)
{
    dsv4_rope_params p = {10000.0, 1.0, 0.0, 32.0, 1.0};
    if (kind == DSV4_ROPE_YARN) {
        p.theta = 160000.0;
        p.factor = 16.0;
        p.original_max_pos = 65536.0;
    }
    return p;
}

dsv4_status dsv4_rope_frequencies(const dsv4_rope_params *p, double freq[32])
{
    DSV4_CHECK_ARG(p && freq, "rope_frequencies: null pointer");
    DSV4_CHECK_ARG(isfinite(p->theta) && p->theta > 1.0, "rope_frequencies: theta %g must be > 1", p->theta);
    int yarn = p->factor > 1.0;
    DSV4_CHECK_ARG(!yarn || (isfinite(p->factor) && p->original_max_pos > 0 && p->beta_fast > 0 && p->beta_slow > 0),
                   "rope_frequencies: YaRN needs a finite factor and positive original length and betas");
    const double dim = 64.0, two_pi = 6.283185307179586;
    double low = 0, high = 0;
    if (yarn) {
        low = floor(dim * log(p->original_max_pos / (p->beta_fast * two_pi)) / (2.0 * log(p->theta)));
        high = ceil(dim * log(p->original_max_pos / (p->beta_slow * two_pi)) / (2.0 * log(p->theta)));
        low = fmax(low, 0.0);
        high = fmin(high, dim - 1.0);
        if (high == low) high += 0.001; /* the reference's guard against a zero-width ramp */
    }
    for (int i = 0; i < 32; i++) {
        double f = pow(p->theta, -2.0 * i / dim);
        if (yarn) {
            double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
            f = f * (1.0 - ramp) + f / p->factor * ramp;
        }
        freq[i] = f;
    }
    return DSV4_OK;
}

dsv4_status dsv4_rope_table(dsv4_ctx *ctx, const dsv4_rope_params *params, dsv4_tensor *table)
{
    OP_BEGIN("rope_table", rope_table);
    const int64_t want[2] = {DSV4_ANY, 64};
    DSV4_TRY(check_arg(op, "table", table, DSV4_DT(DSV4_F32), 2, want, b));
    DSV4_TRY(dsv4_check_contiguous(op, "table", table));
    double freq[32];
    DSV4_TRY(dsv4_rope_frequencies(params, freq));
    if (table->shape[0] == 0) return DSV4_OK;
    return b->attention->rope_table(&ex, freq, table->shape[0], table->data);
}

/* ---- insert ------------------------------------------------------------------------------- */
static dsv4_status check_insert(const char *op, const dsv4_tensor *kv, const dsv4_kv_cache *cache,
                                const dsv4_tensor *slots, int64_t n, const dsv4_backend *b, dsv4_kv_geom *g)
{
    const int64_t kw[2] = {n, KVD};
    DSV4_TRY(check_arg(op, "kv", kv, DSV4_DT(DSV4_BF16), 2, kw, b));
    DSV4_TRY(check_cache(op, "cache", cache, b, g));
    DSV4_TRY(check_vec(op, "slot_mapping", slots, DSV4_I64, DSV4_ANY, b));
    if (slots->shape[0] > kv->shape[0])
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: %lld slots for %lld kv rows (N_ins must be <= N)", op,
                         (long long)slots->shape[0], (long long)kv->shape[0]);
    return check_range(op, "slot_mapping", slots, 0, g->num_slots, 1);
}

dsv4_status dsv4_qnorm_rope_kv_insert(dsv4_ctx *ctx, dsv4_tensor *q, const dsv4_tensor *kv, const dsv4_kv_cache *cache,
                                      const dsv4_tensor *slot_mapping, const dsv4_tensor *positions,
                                      const dsv4_tensor *rope, float eps)
{
    OP_BEGIN("qnorm_rope_kv_insert", qnorm_rope_kv_insert);
    DSV4_TRY(check_heads(op, "q", q, DSV4_ANY, DSV4_ANY, b));
    DSV4_TRY(dsv4_check_output(op, "q", q));
    int64_t n = q->shape[0], h = q->shape[1];
    dsv4_kv_geom g;
    DSV4_TRY(check_insert(op, kv, cache, slot_mapping, n, b, &g));
    DSV4_TRY(check_rope(op, positions, rope, n, b));
    DSV4_CHECK_ARG(isfinite(eps) && eps >= 0.0f, "%s: eps %g must be finite and >= 0", op, (double)eps);
    const dsv4_tensor *others[5] = {kv, &cache->pages, slot_mapping, positions, rope};
    const char *names[5] = {"kv", "cache", "slot_mapping", "positions", "rope"};
    DSV4_TRY(no_overlap(op, "q", q, others, names, 5));
    const dsv4_tensor *cins[4] = {kv, slot_mapping, positions, rope};
    const char *cnames[4] = {"kv", "slot_mapping", "positions", "rope"};
    DSV4_TRY(no_overlap(op, "cache", &cache->pages, cins, cnames, 4));
    if (n == 0) return DSV4_OK;
    return b->attention->qnorm_rope_kv_insert(&ex, q->data, q->stride[0], q->stride[1], n, h, kv->data, kv->stride[0],
                                              slot_mapping->shape[0], slot_mapping->data, positions->data,
                                              rope->data, rope->shape[0], eps, &g);
}

dsv4_status dsv4_kv_insert(dsv4_ctx *ctx, const dsv4_tensor *kv, const dsv4_kv_cache *cache,
                           const dsv4_tensor *slot_mapping, const dsv4_tensor *positions, const dsv4_tensor *rope)
{
    OP_BEGIN("kv_insert", kv_insert);
    DSV4_CHECK_ARG(kv && slot_mapping, "%s: kv and slot_mapping are required", op);
    DSV4_CHECK_ARG(!positions == !rope, "%s: give both positions and rope, or neither", op);
    DSV4_TRY(dsv4_check_tensor(op, "slot_mapping", slot_mapping, DSV4_DT(DSV4_I64), 1, NULL));
    int64_t n = slot_mapping->shape[0];
    dsv4_kv_geom g;
    DSV4_TRY(check_insert(op, kv, cache, slot_mapping, n, b, &g));
    if (positions) DSV4_TRY(check_rope(op, positions, rope, n, b));
    const dsv4_tensor *others[4] = {kv, slot_mapping, positions, rope};
    const char *names[4] = {"kv", "slot_mapping", "positions", "rope"};
    DSV4_TRY(no_overlap(op, "cache", &cache->pages, others, names, 4));
    if (n == 0) return DSV4_OK;
    return b->attention->kv_insert(&ex, kv->data, kv->stride[0], n, slot_mapping->data,
                                   positions ? positions->data : NULL, rope ? rope->data : NULL,
                                   rope ? rope->shape[0] : 0, &g);
}

/* ---- gather ------------------------------------------------------------------------------- */
dsv4_status dsv4_dequant_gather(dsv4_ctx *ctx, const dsv4_kv_cache *cache, const dsv4_tensor *slots, dsv4_tensor *out)
{
    OP_BEGIN("dequant_gather", dequant_gather);
    dsv4_kv_geom g;
    DSV4_TRY(check_cache(op, "cache", cache, b, &g));
    DSV4_TRY(check_vec(op, "slots", slots, DSV4_I32, DSV4_ANY, b));
    int64_t s = slots->shape[0];
    const int64_t ow[2] = {s, KVD};
    DSV4_TRY(check_arg(op, "out", out, DSV4_DT(DSV4_BF16), 2, ow, b));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    DSV4_TRY(check_range(op, "slots", slots, 0, g.num_slots, 1));
    const dsv4_tensor *others[2] = {&cache->pages, slots};
    const char *names[2] = {"cache", "slots"};
    DSV4_TRY(no_overlap(op, "out", out, others, names, 2));
    if (s == 0) return DSV4_OK;
    return b->attention->dequant_gather(&ex, &g, slots->data, s, out->data, out->stride[0]);
}

/* ---- sparse decode ------------------------------------------------------------------------ */
dsv4_status dsv4_sparse_mla_decode_workspace(dsv4_ctx *ctx, int64_t t, int64_t h, int64_t width, int64_t extra_width,
                                             size_t *bytes)
{
    const char *op = "sparse_mla_decode_workspace";
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_CHECK_ARG(bytes, "%s: null output pointer", op);
    DSV4_CHECK_ARG(t >= 0 && h >= 1 && width >= 0 && extra_width >= 0,
                   "%s: need t >= 0, h >= 1, widths >= 0 (got %lld, %lld, %lld, %lld)", op, (long long)t, (long long)h,
                   (long long)width, (long long)extra_width);
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_ATTENTION, &b, &ex));
    NEED_ENTRY(b, decode_workspace, op);
    *bytes = b->attention->decode_workspace(&ex, t, h, width + extra_width);
    return DSV4_OK;
}

/* q/out/lse/sink/workspace checks shared by both decodes; fills everything of `a` but the scopes. */
static dsv4_status check_attn_io(const char *op, const dsv4_tensor *q, const dsv4_tensor *sink, float scale,
                                 dsv4_tensor *out, dsv4_tensor *lse, dsv4_tensor *workspace, int64_t width,
                                 const dsv4_backend *b, const dsv4_exec *ex, dsv4_attn_args *a)
{
    DSV4_TRY(check_heads(op, "q", q, DSV4_ANY, DSV4_ANY, b));
    int64_t t = q->shape[0], h = q->shape[1];
    DSV4_TRY(check_heads(op, "out", out, t, h, b));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    if (lse) {
        const int64_t lw[2] = {t, h};
        DSV4_TRY(dsv4_check_tensor(op, "lse", lse, DSV4_DT(DSV4_F32), 2, lw));
        DSV4_TRY(on_device(op, "lse", lse, b));
    }
    if (sink) DSV4_TRY(check_vec(op, "sink", sink, DSV4_F32, h, b));
    DSV4_CHECK_ARG(isfinite(scale), "%s: scale must be finite", op);
    size_t need = b->attention->decode_workspace(ex, t, h, width);
    size_t have = 0;
    if (workspace) {
        DSV4_TRY(dsv4_check_tensor(op, "workspace", workspace, DSV4_DT(DSV4_U8), 1, NULL));
        DSV4_TRY(dsv4_check_contiguous(op, "workspace", workspace));
        DSV4_TRY(on_device(op, "workspace", workspace, b));
        have = (size_t)workspace->shape[0];
    }
    if (have < need)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the workspace has %zu bytes, %zu needed (sparse_mla_decode_workspace)",
                         op, have, need);
    const dsv4_tensor *ins[3] = {q, sink, workspace};
    const char *in_names[3] = {"q", "sink", "workspace"};
    DSV4_TRY(no_overlap(op, "out", out, ins, in_names, 3));
    if (lse) {
        const dsv4_tensor *lins[4] = {q, sink, workspace, out};
        const char *lnames[4] = {"q", "sink", "workspace", "out"};
        DSV4_TRY(no_overlap(op, "lse", lse, lins, lnames, 4));
    }
    *a = (dsv4_attn_args){q->data, q->stride[0], q->stride[1], t, h, sink ? sink->data : NULL, scale, out->data,
                          out->stride[0], out->stride[1], lse ? lse->data : NULL, lse ? lse->stride[0] : 0,
                          lse ? lse->stride[1] : 0, workspace ? workspace->data : NULL, have};
    return DSV4_OK;
}

/* indices I32 [t, width] (unit inner stride), lengths I32 [t] or NULL; lengths in [0, width]. */
static dsv4_status check_indices(const char *op, const char *iname, const char *lname, const dsv4_tensor *idx,
                                 const dsv4_tensor *len, int64_t t, const dsv4_backend *b, dsv4_attn_scope *s)
{
    const int64_t iw[2] = {t, DSV4_ANY};
    DSV4_TRY(check_arg(op, iname, idx, DSV4_DT(DSV4_I32), 2, iw, b));
    s->indices = idx->data;
    s->ld = idx->stride[0];
    s->width = idx->shape[1];
    s->lengths = NULL;
    if (len) {
        DSV4_TRY(check_vec(op, lname, len, DSV4_I32, t, b));
        DSV4_TRY(check_range(op, lname, len, 0, s->width + 1, 0));
        s->lengths = len->data;
    }
    return DSV4_OK;
}

/* Outputs must not overlap any input of a scope. */
static dsv4_status scope_overlaps(const char *op, const dsv4_attn_args *a, const dsv4_tensor *out,
                                  const dsv4_tensor *lse, const dsv4_tensor *workspace, const dsv4_tensor *const *in,
                                  const char *const *names, int n)
{
    DSV4_TRY(no_overlap(op, "out", out, in, names, n));
    if (lse) DSV4_TRY(no_overlap(op, "lse", lse, in, names, n));
    if (workspace && a->workspace_bytes) DSV4_TRY(no_overlap(op, "workspace", workspace, in, names, n));
    return DSV4_OK;
}

dsv4_status dsv4_sparse_mla_decode(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_sparse_scope *swa,
                                   const dsv4_sparse_scope *extra, const dsv4_tensor *sink, float scale,
                                   dsv4_tensor *out, dsv4_tensor *lse, dsv4_tensor *workspace)
{
    OP_BEGIN("sparse_mla_decode", sparse_mla_decode);
    NEED_ENTRY(b, decode_workspace, op);
    DSV4_CHECK_ARG(q && swa && swa->indices, "%s: q and the swa scope's indices are required", op);
    DSV4_CHECK_ARG(!extra || extra->indices, "%s: the extra scope has no indices", op);
    DSV4_TRY(dsv4_check_tensor(op, "q", q, DSV4_DT(DSV4_BF16), 3, NULL));
    int64_t t = q->shape[0];
    dsv4_attn_scope sc[2];
    const dsv4_sparse_scope *in[2] = {swa, extra};
    const char *cn[2] = {"swa cache", "extra cache"}, *in_n[2] = {"swa indices", "extra indices"},
               *ln[2] = {"swa lengths", "extra lengths"};
    int n_scopes = extra ? 2 : 1;
    int64_t width = 0;
    for (int i = 0; i < n_scopes; i++) {
        DSV4_TRY(check_cache(op, cn[i], in[i]->cache, b, &sc[i].cache));
        DSV4_TRY(check_indices(op, in_n[i], ln[i], in[i]->indices, in[i]->lengths, t, b, &sc[i]));
        width += sc[i].width;
    }
    dsv4_attn_args a;
    DSV4_TRY(check_attn_io(op, q, sink, scale, out, lse, workspace, width, b, &ex, &a));
    for (int i = 0; i < n_scopes; i++) {
        const dsv4_tensor *ins[3] = {&in[i]->cache->pages, in[i]->indices, in[i]->lengths};
        const char *names[3] = {cn[i], in_n[i], ln[i]};
        DSV4_TRY(scope_overlaps(op, &a, out, lse, workspace, ins, names, 3));
    }
    if (t == 0) return DSV4_OK;
    return b->attention->sparse_mla_decode(&ex, &a, sc, n_scopes);
}

dsv4_status dsv4_sparse_attn_bf16(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_tensor *kv,
                                  const dsv4_tensor *indices, const dsv4_tensor *lengths, const dsv4_tensor *sink,
                                  float scale, dsv4_tensor *out, dsv4_tensor *lse, dsv4_tensor *workspace)
{
    OP_BEGIN("sparse_attn_bf16", sparse_attn_bf16);
    NEED_ENTRY(b, decode_workspace, op);
    DSV4_CHECK_ARG(q && indices, "%s: q and indices are required", op);
    DSV4_TRY(dsv4_check_tensor(op, "q", q, DSV4_DT(DSV4_BF16), 3, NULL));
    int64_t t = q->shape[0];
    const int64_t kw[2] = {DSV4_ANY, KVD};
    DSV4_TRY(check_arg(op, "kv", kv, DSV4_DT(DSV4_BF16), 2, kw, b));
    if (kv->shape[0] > INT32_MAX) return dsv4_fail(DSV4_ERR_SHAPE, "%s: kv has more than 2^31 - 1 rows", op);
    dsv4_attn_scope sc;
    sc.cache = (dsv4_kv_geom){kv->data, (kv->shape[0] > 1 ? kv->stride[0] : KVD) * 2, 1, kv->shape[0]};
    DSV4_TRY(check_indices(op, "indices", "lengths", indices, lengths, t, b, &sc));
    dsv4_attn_args a;
    DSV4_TRY(check_attn_io(op, q, sink, scale, out, lse, workspace, sc.width, b, &ex, &a));
    const dsv4_tensor *ins[3] = {kv, indices, lengths};
    const char *names[3] = {"kv", "indices", "lengths"};
    DSV4_TRY(scope_overlaps(op, &a, out, lse, workspace, ins, names, 3));
    if (t == 0) return DSV4_OK;
    return b->attention->sparse_attn_bf16(&ex, &a, &sc);
}

/* ---- output side -------------------------------------------------------------------------- */
dsv4_status dsv4_inv_rope(dsv4_ctx *ctx, dsv4_tensor *o, const dsv4_tensor *positions, const dsv4_tensor *rope)
{
    OP_BEGIN("inv_rope", inv_rope);
    DSV4_TRY(check_heads(op, "o", o, DSV4_ANY, DSV4_ANY, b));
    DSV4_TRY(dsv4_check_output(op, "o", o));
    DSV4_TRY(check_rope(op, positions, rope, o->shape[0], b));
    const dsv4_tensor *others[2] = {positions, rope};
    const char *names[2] = {"positions", "rope"};
    DSV4_TRY(no_overlap(op, "o", o, others, names, 2));
    if (o->shape[0] == 0) return DSV4_OK;
    return b->attention->inv_rope(&ex, o->data, o->stride[0], o->stride[1], o->shape[0], o->shape[1], positions->data,
                                  rope->data, rope->shape[0]);
}
