/* The decode engine: load, memory plan, sequences, state export (include/dsv4/engine.h).
 *
 * Every buffer is planned by one walk over the model (layout()) that runs twice: first to add up
 * the sizes of the four arenas (converted parameters, KV caches, states, scratch), then, after one
 * allocation per arena, to hand out the pointers and convert the parameters. Nothing is allocated
 * after dsv4_engine_create except the block tables of a new sequence. */
#include "model/engine_internal.h"

#include "core/backend.h"
#include "core/error.h"
#include "dsv4/device.h"
#include "dsv4/tensor_ops.h"
#include "dsv4/formats.h"
#include "formats/codec.h"
#include "formats/kv_entry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Arenas. The first four are the context's memory (dsv4_device_alloc: device memory on an
 * accelerator backend, host memory on the CPU backends): what the kernels read and write. A_HOST
 * is the engine's own bookkeeping, always in host memory: token histories, segment lists,
 * duplicate marks. */
enum { A_CONV = 0, A_KV = 1, A_STATE = 2, A_SCRATCH = 3, A_HOST = 4, N_ARENAS = 5 };

/* ---- small helpers ------------------------------------------------------------------------- */
static dsv4_tensor view(const void *p, dsv4_dtype dt, int nd, const int64_t *shape)
{
    dsv4_tensor t;
    memset(&t, 0, sizeof t);
    dsv4_tensor_init(&t, (void *)p, dt, nd, shape);
    return t;
}
dsv4_tensor eng_t1(const void *p, dsv4_dtype dt, int64_t a) { return view(p, dt, 1, (const int64_t[]){a}); }
dsv4_tensor eng_t2(const void *p, dsv4_dtype dt, int64_t a, int64_t b) { return view(p, dt, 2, (const int64_t[]){a, b}); }
dsv4_tensor eng_t3(const void *p, dsv4_dtype dt, int64_t a, int64_t b, int64_t c)
{
    return view(p, dt, 3, (const int64_t[]){a, b, c});
}

static dsv4_tensor on_ctx(const dsv4_engine *e, dsv4_tensor t)
{
    t.device = e->device;
    return t;
}
dsv4_tensor eng_v1(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a) { return on_ctx(e, eng_t1(p, dt, a)); }
dsv4_tensor eng_v2(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a, int64_t b)
{
    return on_ctx(e, eng_t2(p, dt, a, b));
}
dsv4_tensor eng_v3(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a, int64_t b, int64_t c)
{
    return on_ctx(e, eng_t3(p, dt, a, b, c));
}

dsv4_status eng_copy(const dsv4_engine *e, void *dst, const void *src, int64_t bytes)
{
    if (!bytes) return DSV4_OK;
    dsv4_tensor s = eng_v2(e, src, DSV4_U8, 1, bytes), d = eng_v2(e, dst, DSV4_U8, 1, bytes);
    return dsv4_copy_rows(e->ctx, &s, NULL, &d);
}

dsv4_status eng_wrap(dsv4_status st, const char *what, int index)
{
    if (st == DSV4_OK) return st;
    char msg[480];
    snprintf(msg, sizeof msg, "%s", dsv4_last_error());
    if (index >= 0) return dsv4_fail(st, "%s %d: %s", what, index, msg);
    return dsv4_fail(st, "%s: %s", what, msg);
}

dsv4_linear_format eng_fmt(const dsv4_linear_weight *w)
{
    if (w->format == DSV4_WFMT_FP8) return DSV4_LINEAR_FP8_B128;
    if (w->format == DSV4_WFMT_FP4) return DSV4_LINEAR_FP4;
    return w->weight.dtype == DSV4_F32 ? DSV4_LINEAR_F32 : DSV4_LINEAR_BF16;
}

dsv4_linear_format eng_tfmt(const dsv4_tensor *w) { return w->dtype == DSV4_F32 ? DSV4_LINEAR_F32 : DSV4_LINEAR_BF16; }

dsv4_status eng_check_seq(const dsv4_engine *e, int seq, const char *op)
{
    DSV4_CHECK_ARG(e, "%s: null engine", op);
    if (seq < 0 || seq >= e->opt.max_seqs || !e->seqs[seq].live)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: sequence %d does not exist (max_seqs %d)", op, seq, e->opt.max_seqs);
    return DSV4_OK;
}

dsv4_status eng_check_usable(const dsv4_engine *e, int seq, const char *op)
{
    DSV4_TRY(eng_check_seq(e, seq, op));
    if (e->seqs[seq].failed)
        return dsv4_fail(DSV4_ERR_INVALID_ARG,
                         "%s: sequence %d is unusable: an earlier call failed after changing its caches "
                         "(dsv4_engine_seq_reset or dsv4_engine_seq_free it)", op, seq);
    return DSV4_OK;
}

dsv4_status eng_seq_failed(dsv4_engine *e, int seq, dsv4_status st, const char *op)
{
    if (st == DSV4_OK) return st;
    e->seqs[seq].failed = 1;
    char msg[480];
    snprintf(msg, sizeof msg, "%s", dsv4_last_error());
    return dsv4_fail(st, "%s: sequence %d is now unusable until reset or freed (its caches were partly updated): %s", op,
                     seq, msg);
}

float *eng_state(const dsv4_engine *e, const eng_layer *L, int sq) { return L->state + (size_t)sq * (size_t)L->state_floats; }

/* ---- arenas -------------------------------------------------------------------------------- */
typedef struct arena {
    uint8_t *base;
    uint64_t off;
} arena;

static void *take(arena *a, uint64_t bytes)
{
    uint64_t o = (a->off + 63) & ~(uint64_t)63;
    a->off = o + bytes;
    return a->base ? a->base + o : NULL;
}

/* ---- parameter conversion (second layout pass only) ----------------------------------------
 * Conversions run on the host (the host context, bit-exact as every backend is) from the
 * checkpoint's mapping. A converted parameter is written where the ops read it: straight into its
 * arena when the context's memory is host memory, else into a host buffer that is then uploaded. */
static int64_t numel(const dsv4_tensor *t) { return t->data ? dsv4_tensor_numel(t) : 0; }

static void *stage(const dsv4_engine *e, void *dst, uint64_t bytes)
{
    return e->on_device ? malloc(bytes ? (size_t)bytes : 1) : dst;
}

/* The staged bytes into dst (a device upload, or nothing), the buffer released; st: the conversion's. */
static dsv4_status unstage(const dsv4_engine *e, void *dst, void *buf, uint64_t bytes, dsv4_status st)
{
    if (!e->on_device) return st;
    if (st == DSV4_OK && bytes) st = dsv4_device_upload(e->ctx, dst, buf, (size_t)bytes);
    free(buf);
    return st;
}

/* dst = src as contiguous F32: the mapped tensor itself when it is F32 and aligned (on a CPU
 * backend), else a copy. */
static dsv4_status param_f32(dsv4_engine *e, arena *conv, const dsv4_tensor *src, dsv4_tensor *dst)
{
    memset(dst, 0, sizeof *dst);
    if (!src->data) return DSV4_OK;
    if (!e->on_device && src->dtype == DSV4_F32 && !((uintptr_t)src->data & 3)) {
        *dst = *src;
        return DSV4_OK;
    }
    int64_t n = numel(src);
    float *buf = take(conv, (uint64_t)n * 4);
    *dst = on_ctx(e, view(buf, DSV4_F32, src->ndim, src->shape));
    if (!buf) return DSV4_OK;
    if (src->dtype != DSV4_F32 && src->dtype != DSV4_BF16)
        return dsv4_fail(DSV4_ERR_DTYPE, "engine: parameter of dtype %s where F32 or BF16 is needed", dsv4_dtype_name(src->dtype));
    float *h = stage(e, buf, (uint64_t)n * 4);
    if (!h) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory converting a parameter");
    dsv4_status st = DSV4_OK;
    if (src->dtype == DSV4_F32) memcpy(h, src->data, (size_t)n * 4);
    else st = dsv4_decode_array(e->hctx, DSV4_FMT_BF16, src->data, n, h);
    return unstage(e, buf, h, (uint64_t)n * 4, st);
}

static dsv4_status hc_site(dsv4_engine *e, arena *conv, const dsv4_tensor *fn, const dsv4_tensor *scale,
                           const dsv4_tensor *base, dsv4_hc_site *site)
{
    DSV4_TRY(param_f32(e, conv, fn, &site->fn));
    DSV4_TRY(param_f32(e, conv, scale, &site->scale));
    DSV4_TRY(param_f32(e, conv, base, &site->base));
    site->sinkhorn_iters = (int)e->cfg->hc_sinkhorn_iters;
    site->eps = (float)e->cfg->hc_eps;
    site->norm_eps = (float)e->cfg->norm_eps;
    return DSV4_OK;
}

/* wo_a as the ops take it: BF16/F32 in place (dev: the copy the ops read); FP8 (lw: the
 * checkpoint's) dequantized to BF16 once (exact: E4M3 times a power of two fits BF16), as
 * DeepSeek's converter does, so it runs as the BF16 grouped product. */
static dsv4_status wo_a_weight(dsv4_engine *e, arena *conv, const dsv4_linear_weight *lw, const dsv4_linear_weight *dev,
                               dsv4_tensor *dst)
{
    if (lw->format != DSV4_WFMT_FP8) {
        *dst = dev->weight;
        return DSV4_OK;
    }
    const int64_t N = lw->out_features, K = lw->in_features;
    uint16_t *buf = take(conv, (uint64_t)(N * K) * 2);
    *dst = eng_v2(e, buf, DSV4_BF16, N, K);
    if (!buf) return DSV4_OK;
    float *tmp = malloc((size_t)(128 * K) * sizeof *tmp);
    uint16_t *h = stage(e, buf, (uint64_t)(N * K) * 2);
    if (!tmp || !h) {
        free(tmp);
        return unstage(e, buf, h, 0, dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory converting wo_a"));
    }
    dsv4_status st = DSV4_OK;
    for (int64_t r0 = 0; r0 < N && st == DSV4_OK; r0 += 128) {
        int64_t rows = N - r0 < 128 ? N - r0 : 128;
        dsv4_tensor w, sc, out = eng_t2(tmp, DSV4_F32, rows, K);
        st = dsv4_tensor_slice(&lw->weight, 0, r0, r0 + rows, &w);
        if (st == DSV4_OK) st = dsv4_tensor_slice(&lw->scale, 0, r0 / 128, r0 / 128 + 1, &sc);
        if (st == DSV4_OK) st = dsv4_dequantize_weight(e->hctx, &w, &sc, &out);
        if (st == DSV4_OK) st = dsv4_encode_array(e->hctx, DSV4_FMT_BF16, tmp, rows * K, h + r0 * K);
    }
    free(tmp);
    return unstage(e, buf, h, (uint64_t)(N * K) * 2, st);
}

static const dsv4_tensor *opt_t(const dsv4_tensor *t) { return t->data ? t : NULL; }

static dsv4_ffn_weights ffn_of(const dsv4_expert_weights *x)
{
    dsv4_ffn_weights f = {eng_fmt(&x->w1), &x->w1.weight, opt_t(&x->w1.scale), &x->w3.weight, opt_t(&x->w3.scale),
                          &x->w2.weight, opt_t(&x->w2.scale)};
    return f;
}

/* ---- workspace sizes ------------------------------------------------------------------------
 * One workspace serves every op. What an op needs can depend on the number of tokens T of the
 * call and, for the sparse attention, on the width of its scopes in a way that is not monotone
 * (more queries can mean fewer splits per query): the plan is the maximum over every T in
 * [1, max_batch] and every scope width a call can have. Shapes that several blocks share are
 * asked once. A query that fails fails the engine's creation, not a forward pass. */
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

#define WS_KEYS 64
typedef struct ws_plan {
    dsv4_engine *e;
    size_t bytes;
    int64_t keys[WS_KEYS][8]; /* the shapes asked already */
    int n_keys;
} ws_plan;

/* 1 if `key` was asked before (else it is recorded). */
static int seen(ws_plan *p, const int64_t key[8])
{
    for (int i = 0; i < p->n_keys; i++)
        if (!memcmp(p->keys[i], key, sizeof p->keys[i])) return 1;
    if (p->n_keys < WS_KEYS) memcpy(p->keys[p->n_keys++], key, sizeof p->keys[0]);
    return 0;
}

/* A product of T * rows_per_T rows of length k, for every T. */
static dsv4_status plan_linear(ws_plan *p, dsv4_linear_format fmt, int64_t k, int64_t rows_per_T)
{
    const int64_t key[8] = {1, fmt, k, rows_per_T};
    if (seen(p, key)) return DSV4_OK;
    for (int64_t T = 1; T <= p->e->opt.max_batch; T++) {
        size_t b = 0;
        DSV4_TRY(dsv4_linear_workspace_size(p->e->ctx, fmt, T * rows_per_T, k, &b));
        p->bytes = max_sz(p->bytes, b);
    }
    return DSV4_OK;
}

static dsv4_status plan_lin(ws_plan *p, const dsv4_linear_weight *w, int64_t rows_per_T)
{
    return w->weight.data ? plan_linear(p, eng_fmt(w), w->in_features, rows_per_T) : DSV4_OK;
}

static dsv4_status plan_plain(ws_plan *p, const dsv4_tensor *w, int64_t rows_per_T)
{
    return w->data ? plan_linear(p, eng_tfmt(w), w->shape[w->ndim - 1], rows_per_T) : DSV4_OK;
}

static void ffn_key(const dsv4_ffn_weights *f, int64_t *key)
{
    key[0] = f->fmt;
    key[1] = f->w1->shape[0];
    key[2] = f->w1->shape[1];
    key[3] = f->w2->shape[0];
    key[4] = f->w2->shape[1];
}

static dsv4_status plan_block(ws_plan *p, const eng_layer *L)
{
    dsv4_engine *e = p->e;
    const dsv4_layer_weights *w = L->w;
    const dsv4_model_config *c = e->cfg;
    const dsv4_linear_weight *lins[] = {&w->wq_a, &w->wq_b, &w->wkv, &w->wo_b, &w->index_wq_b, &w->e_proj};
    for (size_t i = 0; i < sizeof lins / sizeof *lins; i++) DSV4_TRY(plan_lin(p, lins[i], 1));
    DSV4_TRY(plan_lin(p, &w->h_proj, e->hc));
    const dsv4_tensor *plain[] = {&w->compressor.wkv, &w->compressor.wgate, &w->index_compressor.wkv,
                                  &w->index_compressor.wgate, &w->index_weights_proj};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) DSV4_TRY(plan_plain(p, plain[i], 1));
    DSV4_TRY(plan_linear(p, eng_tfmt(&L->wo_a), L->wo_a.shape[1], c->o_groups)); /* grouped: T*G rows */
    dsv4_ffn_weights ex = ffn_of(&w->experts[0]), sh = ffn_of(&w->shared);
    int64_t key[8] = {2};
    ffn_key(&ex, key + 1);
    if (L->has_shared) key[6] = sh.fmt + 1, key[7] = sh.w1->shape[0];
    if (seen(p, key)) return DSV4_OK;
    for (int64_t T = 1; T <= e->opt.max_batch; T++) {
        size_t b = 0;
        DSV4_TRY(dsv4_moe_workspace_size(e->ctx, T, (int)c->n_activated_experts, (int)c->n_routed_experts, &ex,
                                         L->has_shared ? &sh : NULL, &b));
        p->bytes = max_sz(p->bytes, b);
    }
    return DSV4_OK;
}

/* The sparse attention: SWA scope of width W, plus a compressed scope of width 0 (none yet), topk
 * (CSA) or 1 .. max_context/ratio (HCA: every entry so far). */
/* Attention calls take up to max_batch queries over the window plus one scope: the index_topk
 * entries of a CSA layer or up to max_context / ratio of an HCA layer. Both workspace queries
 * never decrease with their sizes (src/core/ops_attention.h, ops_indexer.h), so the largest call
 * bounds them all: two queries, whatever max_context and max_batch are. */
static dsv4_status plan_attention(ws_plan *p)
{
    dsv4_engine *e = p->e;
    size_t b = 0;
    DSV4_TRY(dsv4_sparse_mla_decode_workspace(e->ctx, e->opt.max_batch, e->H, e->W, e->cwidth, &b));
    p->bytes = max_sz(p->bytes, b);
    for (int l = 0; l < e->n_blocks; l++)
        if (e->layers[l].kind == DSV4_ATTN_CSA) {
            p->bytes = max_sz(p->bytes, dsv4_indexer_workspace_size(e->ctx, e->opt.max_batch, e->cfg->index_topk));
            break;
        }
    return DSV4_OK;
}

static dsv4_status plan_workspace(dsv4_engine *e, size_t *bytes)
{
    ws_plan *p = calloc(1, sizeof *p);
    if (!p) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory");
    p->e = e;
    dsv4_status st = DSV4_OK;
    for (int b = 0; b < e->n_blocks && st == DSV4_OK; b++) st = eng_wrap(plan_block(p, &e->layers[b]), "engine: workspace of block", b);
    if (st == DSV4_OK) st = eng_wrap(plan_attention(p), "engine: workspace of the attention", -1);
    if (st == DSV4_OK) st = eng_wrap(plan_plain(p, &e->w->head, 1), "engine: workspace of the head", -1);
    *bytes = p->bytes;
    free(p);
    return st;
}

/* The embedding as the forward copies it: BF16 rows, converted once here from an F32 table
 * (RNE, as the per-token conversion did). */
static dsv4_status embed_table(dsv4_engine *e, arena *conv)
{
    const dsv4_tensor *t = &e->w->embed;
    if (t->dtype == DSV4_BF16) {
        e->embed = e->dw->embed.data;
        return DSV4_OK;
    }
    if (t->dtype != DSV4_F32)
        return dsv4_fail(DSV4_ERR_DTYPE, "engine: embed.weight of dtype %s where BF16 or F32 is needed", dsv4_dtype_name(t->dtype));
    const int64_t n = e->V * e->D;
    uint16_t *buf = take(conv, (uint64_t)n * 2);
    e->embed = buf;
    if (!buf) return DSV4_OK;
    uint16_t *h = stage(e, buf, (uint64_t)n * 2);
    if (!h) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory converting the embedding");
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, src + i * 4, 4); /* mapped in place: maybe unaligned */
        h[i] = dsv4_bf16_from_f32(f);
    }
    return unstage(e, buf, h, (uint64_t)n * 2, DSV4_OK);
}

static int64_t tid2eid_at(const dsv4_tensor *t, int64_t v, int64_t j)
{
    const int sz = t->dtype == DSV4_I64 ? 8 : 4;
    const uint8_t *at = (const uint8_t *)t->data + (v * t->stride[0] + j * t->stride[1]) * sz;
    if (sz == 8) {
        int64_t x;
        memcpy(&x, at, 8); /* mapped in place: maybe unaligned */
        return x;
    }
    int32_t y;
    memcpy(&y, at, 4);
    return y;
}

/* Hash routing reads tid2eid[token] in the middle of a forward pass: every entry is checked here,
 * once, so that no token can make a forward fail after earlier layers changed the caches. A
 * token's experts are distinct (its k routing weights go to k different experts, as for learned
 * routing's top-k). */
static dsv4_status check_tid2eid(const dsv4_engine *e, int b)
{
    const dsv4_tensor *t = &e->w->layers[b].tid2eid;
    const int64_t E = e->cfg->n_routed_experts;
    if (t->dtype != DSV4_I32 && t->dtype != DSV4_I64)
        return dsv4_fail(DSV4_ERR_DTYPE, "engine: block %d: ffn.gate.tid2eid has dtype %s (I32 or I64 needed)", b,
                         dsv4_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] < e->cfg->vocab_size)
        return dsv4_fail(DSV4_ERR_SHAPE, "engine: block %d: ffn.gate.tid2eid needs [%lld, k] rows", b,
                         (long long)e->cfg->vocab_size);
    for (int64_t v = 0; v < t->shape[0]; v++)
        for (int64_t j = 0; j < t->shape[1]; j++) {
            const int64_t x = tid2eid_at(t, v, j);
            if (x < 0 || x >= E)
                return dsv4_fail(DSV4_ERR_FORMAT, "engine: block %d: ffn.gate.tid2eid[%lld][%lld] = %lld is not an expert in [0, %lld)",
                                 b, (long long)v, (long long)j, (long long)x, (long long)E);
            for (int64_t i = 0; i < j; i++)
                if (tid2eid_at(t, v, i) == x)
                    return dsv4_fail(DSV4_ERR_FORMAT,
                                     "engine: block %d: ffn.gate.tid2eid[%lld] names expert %lld twice (entries %lld and %lld)", b,
                                     (long long)v, (long long)x, (long long)i, (long long)j);
        }
    return DSV4_OK;
}

/* Block size of a compressed pool of ratio r: about 256 positions a page, 1 to 64 entries. */
static int64_t pool_block(int64_t r) { return 256 / r < 1 ? 1 : 256 / r > 64 ? 64 : 256 / r; }

/* ---- the layout walk ----------------------------------------------------------------------- */
static dsv4_status layout_layer(dsv4_engine *e, arena *A, eng_layer *L, int b)
{
    const dsv4_model_config *c = e->cfg;
    const dsv4_layer_weights *w = &e->w->layers[b], *dw = &e->dw->layers[b]; /* the checkpoint's; the ops' */
    const int64_t S = e->opt.max_seqs, E = c->n_routed_experts;
    arena *conv = &A[A_CONV];
    L->w = dw;
    L->is_mtp = w->is_mtp;
    L->kind = w->kind;
    L->ratio = w->kind == DSV4_ATTN_SWA ? 0 : w->compress_ratio;
    L->hash = w->hash_routed;
    L->rope = L->ratio ? &e->rope_compress : &e->rope_main;
    DSV4_TRY(hc_site(e, conv, &w->hc_attn_fn, &w->hc_attn_scale, &w->hc_attn_base, &L->hc_attn));
    DSV4_TRY(hc_site(e, conv, &w->hc_ffn_fn, &w->hc_ffn_scale, &w->hc_ffn_base, &L->hc_ffn));
    if (L->is_mtp) DSV4_TRY(hc_site(e, conv, &w->hc_head_fn, &w->hc_head_scale, &w->hc_head_base, &L->hc_head));
    DSV4_TRY(param_f32(e, conv, &w->attn_sink, &L->sink));
    DSV4_TRY(param_f32(e, conv, &w->compressor.ape, &L->ape));
    DSV4_TRY(param_f32(e, conv, &w->index_compressor.ape, &L->index_ape));
    DSV4_TRY(param_f32(e, conv, &w->gate_bias, &L->gate_bias));
    DSV4_TRY(wo_a_weight(e, conv, &w->wo_a, &dw->wo_a, &L->wo_a));
    L->experts = take(&A[A_HOST], (uint64_t)E * sizeof *L->experts); /* views the moe op reads on the host */
    if (L->experts)
        for (int64_t x = 0; x < E; x++) L->experts[x] = ffn_of(&dw->experts[x]);
    L->has_shared = c->n_shared_experts > 0;
    if (L->has_shared) L->shared = ffn_of(&dw->shared);

    /* caches: the ring of every block; compressed entries and the indexer cache */
    int64_t ring_pages = S * (e->R / ENG_RING_BLOCK), pb = dsv4_kv_page_bytes(ENG_RING_BLOCK);
    void *ring = take(&A[A_KV], (uint64_t)(ring_pages * pb));
    if (ring) DSV4_TRY(dsv4_kv_cache_view(&L->ring, ring, ring_pages, ENG_RING_BLOCK, dsv4_ctx_device_kind(e->ctx), 0));
    L->state_floats = 0;
    if (L->ratio) {
        int p = 0;
        while (p < e->n_pools && e->pool_ratio[p] != L->ratio) p++;
        L->pool = p;
        int64_t bs = pool_block(L->ratio);
        int64_t entries = (e->opt.max_context + L->ratio - 1) / L->ratio;
        int64_t pages = S * ((entries + bs - 1) / bs);
        void *comp = take(&A[A_KV], (uint64_t)(pages * dsv4_kv_page_bytes(bs)));
        if (comp) DSV4_TRY(dsv4_kv_cache_view(&L->comp, comp, pages, bs, dsv4_ctx_device_kind(e->ctx), 0));
        int64_t coff = eng_overlap(L) ? 2 : 1;
        L->state_floats = eng_main_state_floats(L);
        L->proj_ld = 2 * coff * c->head_dim;
    }
    if (L->kind == DSV4_ATTN_CSA) {
        L->index_cache = take(&A[A_KV], (uint64_t)(S * e->index_entries * e->index_entry_bytes));
        L->state_floats += 2 * (2 * L->ratio) * (2 * c->index_head_dim);
        L->proj_ld += 4 * c->index_head_dim;
    }
    if (L->ratio && e->opt.max_mtp && !L->is_mtp) { /* rollback of rejected drafts */
        L->snapshot = take(&A[A_STATE], (uint64_t)(S * L->state_floats) * 4);
        L->saved_proj = take(&A[A_STATE], (uint64_t)(e->opt.max_batch * L->proj_ld) * 4);
    }
    L->state = take(&A[A_STATE], (uint64_t)(S * L->state_floats) * 4);
    return DSV4_OK;
}

/* The index tables of one call carved from `base` (NULL: only sized); returns their bytes. */
static uint64_t tables(const dsv4_engine *e, uint8_t *base, eng_tables *t)
{
    arena a = {base, 0};
    const int64_t T = e->opt.max_batch;
    memset(t, 0, sizeof *t);
    t->positions = take(&a, (uint64_t)T * 8);
    t->tokens = take(&a, (uint64_t)T * 4);
    t->rslots = take(&a, (uint64_t)T * 8);
    t->sidx = take(&a, (uint64_t)(T * e->W) * 4);
    t->slen = take(&a, (uint64_t)T * 4);
    for (int p = 0; p < e->n_pools; p++) {
        t->pslots[p] = take(&a, (uint64_t)T * 8);
        if (!e->pool_hca[p]) continue;
        t->hidx[p] = take(&a, (uint64_t)(e->max_segs * e->hrow[p]) * 4);
        t->hlen[p] = take(&a, (uint64_t)T * 4);
    }
    return a.off;
}

static dsv4_status layout(dsv4_engine *e, arena *A)
{
    const dsv4_model_config *c = e->cfg;
    const int64_t T = e->opt.max_batch, D = e->D, hc = e->hc, H = e->H, V = e->V, S = e->opt.max_seqs;
    const int64_t ql = c->q_lora_rank, nI = c->index_n_heads, dI = c->index_head_dim, topk = c->n_activated_experts;
    const int64_t maxc = e->opt.max_context;
    for (int p = 0; p < e->n_pools; p++) e->hrow[p] = maxc / e->pool_ratio[p] + 1;
    /* RoPE tables and the model-level hc_head */
    float *rm = take(&A[A_CONV], (uint64_t)maxc * 64 * 4), *rc = take(&A[A_CONV], (uint64_t)maxc * 64 * 4);
    e->rope_main = eng_v2(e, rm, DSV4_F32, maxc, 64);
    e->rope_compress = eng_v2(e, rc, DSV4_F32, maxc, 64);
    if (rm) {
        const dsv4_rope_config *rcf[2] = {&c->rope_main, &c->rope_compress};
        float *dst[2] = {rm, rc};
        for (int i = 0; i < 2; i++) {
            dsv4_rope_params p = {rcf[i]->theta, rcf[i]->yarn ? rcf[i]->factor : 1.0, (double)rcf[i]->original_max_position,
                                  rcf[i]->beta_fast, rcf[i]->beta_slow};
            float *h = stage(e, dst[i], (uint64_t)maxc * 64 * 4);
            if (!h) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory building the RoPE tables");
            dsv4_tensor tab = eng_t2(h, DSV4_F32, maxc, 64);
            DSV4_TRY(unstage(e, dst[i], h, (uint64_t)maxc * 64 * 4, dsv4_rope_table(e->hctx, &p, &tab)));
        }
    }
    DSV4_TRY(hc_site(e, &A[A_CONV], &e->w->hc_head_fn, &e->w->hc_head_scale, &e->w->hc_head_base, &e->hc_head));
    DSV4_TRY(embed_table(e, &A[A_CONV]));
    for (int b = 0; b < e->n_blocks; b++) DSV4_TRY(eng_wrap(layout_layer(e, A, &e->layers[b], b), "engine: block", b));
    for (int sq = 0; sq < S; sq++) {
        eng_seq *q = &e->seqs[sq];
        q->pending = take(&A[A_STATE], (uint64_t)(2 * hc * D) * 2);
        q->hist = take(&A[A_HOST], (uint64_t)maxc * sizeof *q->hist);
        if (e->opt.max_mtp) {
            q->head_logits = take(&A[A_HOST], (uint64_t)V * 4);
            q->head_streams = take(&A[A_STATE], (uint64_t)(hc * D) * 2);
        }
        for (int p = 0; p < e->n_pools; p++) {
            const int64_t r = e->pool_ratio[p], entries = (maxc + r - 1) / r, bs = pool_block(r);
            q->btab_n[p] = (entries + bs - 1) / bs;
            q->btab[p] = take(&A[A_STATE], (uint64_t)q->btab_n[p] * 4);
        }
    }

    /* scratch of one forward call */
    arena *s = &A[A_SCRATCH];
    eng_scratch *x = &e->s;
    x->X = take(s, (uint64_t)(T * hc * D) * 2);
    x->Xm = take(s, (uint64_t)(T * hc * D) * 2);
    x->xin = take(s, (uint64_t)(T * D) * 2);
    x->x = take(s, (uint64_t)(T * D) * 2);
    x->a = take(s, (uint64_t)(T * D) * 2);
    x->post = take(s, (uint64_t)(T * hc) * 4);
    x->comb = take(s, (uint64_t)(T * hc * hc) * 4);
    x->qr = take(s, (uint64_t)(T * ql) * 2);
    x->q = take(s, (uint64_t)(T * H * 512) * 2);
    x->kv = take(s, (uint64_t)(T * 512) * 2);
    x->o = take(s, (uint64_t)(T * H * 512) * 2);
    x->z = take(s, (uint64_t)(T * c->o_groups * c->o_lora_rank) * 2);
    x->ckv = take(s, (uint64_t)(T * 2 * 512) * 4);
    x->cgate = take(s, (uint64_t)(T * 2 * 512) * 4);
    x->cout = take(s, (uint64_t)(T * 512) * 2);
    x->tab_bytes = tables(e, NULL, &x->t);
    x->tab = take(&A[A_HOST], x->tab_bytes);
    tables(e, x->tab, &x->t);
    x->dtab = e->on_device ? take(s, x->tab_bytes) : x->tab;
    tables(e, x->dtab, &x->dt);
    x->cslots = take(&A[A_HOST], (uint64_t)T * 8);
    x->mtok = take(&A[A_HOST], (uint64_t)T * 4);
    x->vtok = take(&A[A_HOST], (uint64_t)T * 4);
    x->qrow = take(&A[A_HOST], (uint64_t)e->max_segs * 8);
    x->xrow = take(&A[A_HOST], (uint64_t)e->max_segs * 8);
    x->segs = take(&A[A_HOST], (uint64_t)e->max_segs * sizeof *x->segs);
    x->plan = take(&A[A_HOST], (uint64_t)e->max_segs * sizeof *x->plan);
    x->msegs = take(&A[A_HOST], (uint64_t)e->max_segs * sizeof *x->msegs);
    x->lrow = take(&A[A_HOST], (uint64_t)e->max_segs * sizeof *x->lrow);
    x->mark = take(&A[A_HOST], (uint64_t)S);
    x->qi = take(s, (uint64_t)(T * nI * dI) * 2);
    x->wp = take(s, (uint64_t)(T * nI) * 2);
    x->qpk = take(s, (uint64_t)(T * nI * dI / 2));
    x->qsc = take(s, (uint64_t)(T * nI * dI / 32));
    x->wts = take(s, (uint64_t)(T * nI) * 4);
    x->ikv = take(s, (uint64_t)(T * 2 * dI) * 4);
    x->igate = take(s, (uint64_t)(T * 2 * dI) * 4);
    x->cidx = take(s, (uint64_t)(T * c->index_topk) * 4);
    x->clen = take(s, (uint64_t)T * 4);
    x->ids = take(s, (uint64_t)(T * topk) * 4);
    x->rw = take(s, (uint64_t)(T * topk) * 4);
    /* a step's rows: every request's verified tokens (or its last one), every draft */
    const int64_t step_rows = T < (int64_t)S * (1 + e->opt.max_mtp) ? T : (int64_t)S * (1 + e->opt.max_mtp);
    const int64_t draft_rows = T < (int64_t)S * e->opt.max_mtp ? T : (int64_t)S * e->opt.max_mtp;
    const int64_t logits_rows = e->opt.logits_rows > step_rows ? e->opt.logits_rows : step_rows;
    x->logits = take(&A[A_HOST], (uint64_t)(logits_rows * V) * 4);
    if (e->comm) { /* the MoE sums and the head's slices of a shard (forward.c) */
        x->moe_sum = take(s, (uint64_t)(T * D) * 4);
        x->head_part_rows = logits_rows;
        x->head_parts = take(s, (uint64_t)(e->n_ranks * logits_rows * e->v_slice) * 4);
    }
    x->qlogits = take(&A[A_HOST], (uint64_t)(draft_rows * V) * 4);
    x->dlogits_rows = e->on_device ? logits_rows : 0;
    x->dlogits = e->on_device ? take(s, (uint64_t)(logits_rows * V) * 4) : NULL;
    /* a plain step's sampling on a device: params | generator states | tokens of its rows, and
     * their host twin (engine_generate.c sample_on_device) */
    x->samp_rows = e->on_device ? e->max_segs : 0;
    const uint64_t samp_bytes = (uint64_t)x->samp_rows * (sizeof(dsv4_sampling) + 4 * 8 + 4);
    x->samp = e->on_device ? take(s, samp_bytes) : NULL;
    x->hsamp = e->on_device ? take(&A[A_HOST], samp_bytes) : NULL;
    x->probs = take(&A[A_HOST], (uint64_t)DSV4_SAMPLE_ROW_BYTES(V));
    x->order = x->probs ? (int32_t *)(x->probs + V) : NULL;
    x->probs2 = take(&A[A_HOST], (uint64_t)V * 4);
    if (!s->base) { /* sizes pass: the blocks' weights are set */
        DSV4_TRY(plan_workspace(e, &e->s.ws_bytes));
        size_t sb = 0;
        if (x->samp_rows) DSV4_TRY(dsv4_sample_workspace_size(e->ctx, x->samp_rows, V, &sb));
        if (sb > e->s.ws_bytes) e->s.ws_bytes = sb;
    }
    x->ws = take(s, e->s.ws_bytes ? e->s.ws_bytes : 1);
    return DSV4_OK;
}

/* ---- create / destroy ---------------------------------------------------------------------- */
static dsv4_status check_config(const dsv4_engine *e)
{
    const dsv4_model_config *c = e->cfg;
    if (c->head_dim != DSV4_KV_DIM || c->rope_head_dim != DSV4_KV_ROPE_DIM)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: head_dim %lld / rope dims %lld: the KV cache format needs 512 / 64",
                         (long long)c->head_dim, (long long)c->rope_head_dim);
    if (c->hc_mult < 1 || c->hc_mult > DSV4_HC_MAX)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: hc_mult %lld not in [1, %d]", (long long)c->hc_mult, DSV4_HC_MAX);
    if (c->score_func != DSV4_SCORE_SQRTSOFTPLUS || !c->norm_topk_prob)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: only the sqrtsoftplus router with normalized top-k weights is implemented");
    if (c->n_shared_experts > 1)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: %lld shared experts (DeepSeek-V4 has 1)", (long long)c->n_shared_experts);
    if (c->o_groups < 1 || c->n_heads % c->o_groups)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: %lld heads do not split into %lld groups", (long long)c->n_heads,
                         (long long)c->o_groups);
    for (int b = 0; b < e->n_blocks; b++) {
        const dsv4_layer_weights *w = &e->w->layers[b];
        if (w->hash_routed) DSV4_TRY(check_tid2eid(e, b));
        if (w->kind != DSV4_ATTN_SWA && (w->compress_ratio < 2 || w->compress_ratio > 512)) /* dsv4/indexer.h */
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: block %d is %s with ratio %d (the compressor takes 2 to 512)", b,
                             dsv4_attn_kind_name(w->kind), w->compress_ratio);
    }
    return DSV4_OK;
}

static dsv4_status resolve_options(dsv4_engine *e, const dsv4_engine_options *o)
{
    const dsv4_model_config *c = e->cfg;
    dsv4_engine_options r = o ? *o : (dsv4_engine_options){0};
    if (r.max_context == 0) r.max_context = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (r.max_seqs == 0) r.max_seqs = 1;
    if (r.max_batch == 0) r.max_batch = 128;
    if (e->w->n_mtp == 0) r.max_mtp = 0;
    DSV4_CHECK_ARG(r.max_context >= 1 && r.max_context <= ((int64_t)1 << 24),
                   "engine: max_context %lld not in [1, 2^24]", (long long)r.max_context);
    DSV4_CHECK_ARG(r.max_seqs >= 1 && r.max_seqs <= 4096, "engine: max_seqs %d not in [1, 4096]", r.max_seqs);
    DSV4_CHECK_ARG(r.max_batch >= 1 && r.max_batch <= 65536, "engine: max_batch %d not in [1, 65536]", r.max_batch);
    DSV4_CHECK_ARG(r.max_mtp >= 0 && r.max_mtp < r.max_batch && r.max_mtp <= 64,
                   "engine: max_mtp %d not in [0, min(64, max_batch - 1)]", r.max_mtp);
    if (r.logits_rows == 0) r.logits_rows = 1 + r.max_mtp;
    DSV4_CHECK_ARG(r.logits_rows >= 1 + r.max_mtp && r.logits_rows <= r.max_batch,
                   "engine: logits_rows %d not in [1 + max_mtp, max_batch]", r.logits_rows);
    if (r.max_context > c->max_position_embeddings)
        dsv4_warn("engine: max_context %lld exceeds the model's max_position_embeddings %lld: positions past it are "
                  "beyond what the model was trained for", (long long)r.max_context, (long long)c->max_position_embeddings);
    e->opt = r;
    return DSV4_OK;
}

/* The shard's part of the model (docs/engine.md §9): a contiguous range of the routed experts
 * (the router's ids stay global; a range keeps the sum of a shard a run of the unsharded order,
 * and the weights a shard reads one run of the checkpoint's expert tensors) and a slice of the
 * vocabulary rows of the head, ceil(V/N) wide (the all-gather moves equal parts). */
static dsv4_status shard_setup(dsv4_engine *e, dsv4_comm *comm)
{
    const int64_t E = e->cfg->n_routed_experts, V = e->cfg->vocab_size;
    const int N = comm ? dsv4_comm_size(comm) : 1, r = comm ? dsv4_comm_rank(comm) : 0;
    e->comm = N > 1 ? comm : NULL;
    e->rank = r;
    e->n_ranks = N;
    e->e_lo = 0;
    e->e_n = (int)E;
    e->v_lo = 0;
    e->v_n = e->v_slice = V;
    if (N == 1) return DSV4_OK;
    if (e->on_device)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: a sharded engine runs on a CPU backend (its collectives read "
                                               "host memory)");
    if (N > E || N > V)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "engine: %d shards for %lld routed experts and a vocabulary of %lld", N,
                         (long long)E, (long long)V);
    e->e_lo = (int)(r * E / N);
    e->e_n = (int)((r + 1) * E / N) - e->e_lo;
    e->v_slice = (V + N - 1) / N;
    e->v_lo = r * e->v_slice < V ? r * e->v_slice : V;
    e->v_n = (e->v_lo + e->v_slice < V ? e->v_lo + e->v_slice : V) - e->v_lo;
    return DSV4_OK;
}

static int64_t lcm64(int64_t a, int64_t b)
{
    int64_t x = a, y = b;
    while (y) {
        int64_t t = x % y;
        x = y, y = t;
    }
    return a / x * b;
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* The plan against the memory it is to live in, before any of it is allocated: refused at once
 * (with the numbers) when it exceeds what is available, a warning when it takes more than half.
 * The context's arenas are device memory on an accelerator backend, host memory otherwise. */
static dsv4_status check_memory(const dsv4_engine *e, const arena *A, uint64_t weights_bytes)
{
    uint64_t ctx_bytes = weights_bytes, host_bytes = A[A_HOST].off;
    for (int i = 0; i < N_ARENAS; i++)
        if (i != A_HOST) ctx_bytes += A[i].off;
    const int on_device = dsv4_ctx_device_kind(e->ctx) != DSV4_DEVICE_CPU;
    uint64_t avail = 0, total = 0;
    dsv4_host_memory(&avail, &total);
    if (!avail) avail = total;
    char what[160];
    snprintf(what, sizeof what, "max_context %lld x max_seqs %d, max_batch %d", (long long)e->opt.max_context,
             e->opt.max_seqs, e->opt.max_batch);
    struct {
        uint64_t need, have;
        const char *where;
    } m[2] = {{on_device ? host_bytes : host_bytes + ctx_bytes, avail, "host memory"}, {0, 0, "device memory"}};
    if (on_device) {
        dsv4_device_info di;
        if (dsv4_device_info_get(e->ctx, &di) == DSV4_OK) m[1].have = di.free_memory;
        m[1].need = ctx_bytes;
    }
    for (int k = 0; k < 2; k++) {
        if (!m[k].have || !m[k].need) continue;
        if (m[k].need > m[k].have && k == 1 && weights_bytes)
            return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: the weights (%.2f GiB) and the plan (%s, %.2f GiB) need %.2f GiB of "
                             "device memory, %.2f GiB is free on the device: the model does not fit one device",
                             gib(weights_bytes), what, gib(m[k].need - weights_bytes), gib(m[k].need), gib(m[k].have));
        if (m[k].need > m[k].have)
            return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: the plan (%s) needs %.2f GiB of %s, %.2f GiB is available",
                             what, gib(m[k].need), m[k].where, gib(m[k].have));
        if (m[k].need > m[k].have / 2)
            dsv4_warn("engine: the plan (%s) takes %.2f GiB, %.0f%% of the %.2f GiB of %s available", what,
                      gib(m[k].need), 100.0 * (double)m[k].need / (double)m[k].have, gib(m[k].have), m[k].where);
    }
    return DSV4_OK;
}

/* The host context of a device engine: the cpu backend (its conversions and sampling are the
 * definitions' bits, as every backend's). */
static dsv4_status host_context(dsv4_engine *e)
{
    e->device = dsv4_ctx_device_kind(e->ctx);
    e->on_device = e->device != DSV4_DEVICE_CPU;
    /* DSV4_ENGINE_DEVICE_PATH=1 (tests): a CPU backend takes the device path too (separate
     * tables, staged conversions, the weights' copy, logits through the device buffer, a host
     * context of its own), its copies being host copies, so CI runs that code and checks that it
     * gives the plain path's bytes (docs/engine.md §2.2). */
    const char *force = getenv("DSV4_ENGINE_DEVICE_PATH");
    if (force && force[0] == '1') e->on_device = 1;
    /* decode rows on the device path: the shaped step, recorded as graphs where the backend has
     * them (DSV4_CUDA_GRAPH=0: the plain launches; =shaped: the shaped ones, not recorded) */
    const char *graph = getenv("DSV4_CUDA_GRAPH");
    e->step_mode = !e->on_device || (graph && !strcmp(graph, "0")) ? ENG_STEP_PLAIN
                   : e->device == DSV4_DEVICE_CPU || (graph && !strcmp(graph, "shaped")) ? ENG_STEP_SHAPED
                                                                                        : ENG_STEP_GRAPH;
    if (!e->on_device) {
        e->hctx = e->ctx;
        return DSV4_OK;
    }
    const dsv4_ctx_options o = {.backend = "cpu"};
    return eng_wrap(dsv4_ctx_create(&o, &e->hctx), "engine: the host context", -1);
}

static void upload_progress(void *user, const eng_dev_progress *p)
{
    const dsv4_engine *e = user;
    char line[160];
    eng_dev_progress_line(p, line, sizeof line);
    e->opt.progress(e->opt.progress_user, line);
}

static dsv4_status setup(dsv4_engine *e, const dsv4_engine_options *options, dsv4_comm *comm)
{
    e->cfg = dsv4_model_get_config(e->model);
    e->w = e->dw = dsv4_model_get_weights(e->model);
    DSV4_TRY(host_context(e));
    const dsv4_model_config *c = e->cfg;
    DSV4_TRY(resolve_options(e, options));
    DSV4_TRY(shard_setup(e, comm));
    e->n_blocks = (int)c->n_layers + (e->opt.max_mtp ? 1 : 0);
    DSV4_TRY(check_config(e));
    e->D = c->dim;
    e->H = c->n_heads;
    e->hc = c->hc_mult;
    e->V = c->vocab_size;
    e->W = c->window_size;
    int64_t need = e->W + e->opt.max_batch + e->opt.max_mtp;
    e->R = (need + ENG_RING_BLOCK - 1) / ENG_RING_BLOCK * ENG_RING_BLOCK;
    e->index_entry_bytes = c->index_head_dim / 2 + c->index_head_dim / 32;
    e->index_entries = 0; /* the most indexer entries of a CSA layer: its ratio's */
    e->max_segs = e->opt.max_seqs < e->opt.max_batch ? e->opt.max_seqs : e->opt.max_batch;
    e->restart_lcm = 1;
    e->cwidth = 1;
    for (int b = 0; b < e->n_blocks; b++) {
        const dsv4_layer_weights *w = &e->w->layers[b];
        if (w->kind == DSV4_ATTN_CSA && c->index_topk > e->cwidth) e->cwidth = c->index_topk;
        if (w->kind == DSV4_ATTN_CSA && (e->opt.max_context + w->compress_ratio - 1) / w->compress_ratio > e->index_entries)
            e->index_entries = (e->opt.max_context + w->compress_ratio - 1) / w->compress_ratio;
        if (w->kind == DSV4_ATTN_HCA && e->opt.max_context / w->compress_ratio > e->cwidth)
            e->cwidth = e->opt.max_context / w->compress_ratio;
        if (w->kind == DSV4_ATTN_SWA) continue;
        /* truncation restarts where every compressor starts a block, less the overlapping
         * window of the CSA compressors (main and indexer: the layer's ratio) */
        e->restart_lcm = lcm64(e->restart_lcm, w->compress_ratio);
        if (w->kind == DSV4_ATTN_CSA && w->compress_ratio > e->restart_overlap) e->restart_overlap = w->compress_ratio;
        int p = 0;
        while (p < e->n_pools && e->pool_ratio[p] != w->compress_ratio) p++;
        if (p == e->n_pools) {
            if (p == ENG_MAX_RATIOS) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "engine: more than %d compression ratios", ENG_MAX_RATIOS);
            e->pool_ratio[e->n_pools++] = w->compress_ratio;
        }
        e->pool_hca[p] |= w->kind == DSV4_ATTN_HCA; /* CSA and HCA layers of one ratio share its pool */
    }
    e->layers = calloc((size_t)e->n_blocks, sizeof *e->layers);
    e->seqs = calloc((size_t)e->opt.max_seqs, sizeof *e->seqs);
    if (!e->layers || !e->seqs) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory");

    arena A[N_ARENAS];
    memset(A, 0, sizeof A);
    DSV4_TRY(layout(e, A)); /* sizes */
    uint64_t weights_bytes = 0;
    if (e->on_device) DSV4_TRY(eng_dev_weights_size(e->model, e->n_blocks, &weights_bytes));
    DSV4_TRY(check_memory(e, A, weights_bytes));
    for (int i = 0; i < N_ARENAS; i++) { /* placement: one zeroed allocation per arena */
        e->mem_bytes[i] = A[i].off;
        const size_t bytes = (size_t)A[i].off + 64;
        /* on a device the host block is pinned: the tables' upload can then sit in a graph, and the
         * logits come back faster (plain host memory if the device has none to give) */
        if (i == A_HOST && e->on_device && dsv4_device_host_alloc(e->ctx, bytes, &e->mem[i]) == DSV4_OK) {
            memset(e->mem[i], 0, bytes);
            e->host_pinned = 1;
        } else if (i == A_HOST) {
            dsv4_clear_error();
            e->mem[i] = calloc(1, bytes);
        } else if (dsv4_device_alloc(e->ctx, bytes, &e->mem[i]) != DSV4_OK || dsv4_device_memset(e->ctx, e->mem[i], 0, bytes) != DSV4_OK)
            e->mem[i] = NULL;
        if (!e->mem[i])
            return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: cannot allocate the planned %.1f MiB", (double)A[i].off / 1048576.0);
        A[i].base = (uint8_t *)(((uintptr_t)e->mem[i] + 63) & ~(uintptr_t)63);
        A[i].off = 0;
    }
    if (e->on_device) { /* every weight the ops read, copied once */
        const eng_dev_upload_options uo = {.progress = e->opt.progress ? upload_progress : NULL, .user = e};
        DSV4_TRY(eng_wrap(eng_dev_weights_upload(e->ctx, e->model, e->n_blocks, &uo, &e->devw), "engine: weights", -1));
        e->dw = &e->devw.w;
    }
    DSV4_TRY(layout(e, A)); /* pointers and conversions */
    /* page pools: every sequence reserves its whole context when it is created */
    DSV4_TRY(dsv4_kv_pages_create(e->opt.max_seqs * (e->R / ENG_RING_BLOCK), ENG_RING_BLOCK, &e->ring_pool));
    for (int p = 0; p < e->n_pools; p++) {
        const eng_layer *L = NULL;
        for (int b = 0; b < e->n_blocks && !L; b++)
            if (e->layers[b].ratio == e->pool_ratio[p]) L = &e->layers[b];
        DSV4_TRY(dsv4_kv_pages_create(L->comp.pages.shape[0], L->comp.block_size, &e->pools[p]));
    }
    int64_t n = dsv4_checkpoint_count(dsv4_model_get_checkpoint(e->model));
    for (int64_t i = 0; i < n; i++) {
        dsv4_tensor_entry en;
        if (dsv4_checkpoint_entry(dsv4_model_get_checkpoint(e->model), i, &en) == DSV4_OK) e->weights_mapped += en.nbytes;
    }
    return DSV4_OK;
}

dsv4_status dsv4_engine_create(dsv4_ctx *ctx, const char *model_dir, const dsv4_engine_options *options, dsv4_engine **out)
{
    return dsv4_engine_create_sharded(ctx, model_dir, options, NULL, out);
}

dsv4_status dsv4_engine_create_sharded(dsv4_ctx *ctx, const char *model_dir, const dsv4_engine_options *options,
                                       dsv4_comm *comm, dsv4_engine **out)
{
    DSV4_CHECK_ARG(model_dir && out, "engine_create: null argument");
    dsv4_engine *e = calloc(1, sizeof *e);
    if (!e) return dsv4_fail(DSV4_ERR_NO_MEMORY, "engine: out of memory");
    e->ctx = ctx;
    const dsv4_model_open_options mo = {0, options ? options->load : DSV4_LOAD_MAP};
    dsv4_status st = dsv4_model_open(model_dir, &mo, &e->model);
    if (st == DSV4_OK) st = setup(e, options, comm);
    if (st != DSV4_OK) {
        dsv4_engine_destroy(e);
        return st;
    }
    *out = e;
    return DSV4_OK;
}

void dsv4_engine_destroy(dsv4_engine *e)
{
    if (!e) return;
    if (e->seqs)
        for (int s = 0; s < e->opt.max_seqs; s++)
            if (e->seqs[s].live) dsv4_engine_seq_free(e, s);
    for (int p = 0; p < e->n_pools; p++) dsv4_kv_pages_destroy(e->pools[p]);
    dsv4_kv_pages_destroy(e->ring_pool);
    for (int k = 0; k < ENG_GRAPHS; k++) dsv4_device_graph_destroy(e->graphs[k].graph);
    if (e->s.tab_inflight) dsv4_device_sync(e->ctx);
    for (int i = 0; i < N_ARENAS; i++) {
        if (i == A_HOST && e->host_pinned) dsv4_device_host_free(e->ctx, e->mem[i]);
        else if (i == A_HOST) free(e->mem[i]);
        else dsv4_device_free(e->ctx, e->mem[i]);
    }
    if (e->on_device) {
        eng_dev_weights_free(e->ctx, &e->devw);
        dsv4_ctx_destroy(e->hctx);
    }
    free(e->layers);
    free(e->seqs);
    dsv4_model_close(e->model);
    free(e);
}

const dsv4_model_config *dsv4_engine_config(const dsv4_engine *e) { return e ? e->cfg : NULL; }

dsv4_engine_options dsv4_engine_get_options(const dsv4_engine *e)
{
    dsv4_engine_options o = {0};
    return e ? e->opt : o;
}

/* ---- sequences ----------------------------------------------------------------------------- */
/* An empty sequence: fresh compressor states, length 0. Cache entries left by an earlier use of
 * the slot are never read: a query sees only positions and entries written before it. */
static dsv4_status seq_clear(dsv4_engine *e, int sq)
{
    eng_seq *s = &e->seqs[sq];
    for (int b = 0; b < e->n_blocks; b++) {
        const eng_layer *L = &e->layers[b];
        if (!L->ratio) continue;
        float *st = eng_state(e, L, sq);
        const int64_t d = e->cfg->head_dim, dI = e->cfg->index_head_dim;
        int coff = eng_overlap(L) ? 2 : 1;
        int64_t rows = coff * L->ratio, cols = coff * d;
        dsv4_compressor_desc md = {.kind = DSV4_COMPRESSOR_MAIN, .ratio = L->ratio, .dim = (int)d, .eps = 1e-6f,
                                   .overlap = eng_overlap(L)};
        dsv4_tensor skv = eng_v2(e, st, DSV4_F32, rows, cols), ssc = eng_v2(e, st + rows * cols, DSV4_F32, rows, cols);
        DSV4_TRY(dsv4_compressor_state_reset(e->ctx, &md, &skv, &ssc));
        if (L->kind != DSV4_ATTN_CSA) continue;
        float *ist = st + 2 * rows * cols;
        dsv4_compressor_desc id = {.kind = DSV4_COMPRESSOR_INDEXER, .ratio = L->ratio, .dim = (int)dI, .eps = 1e-6f,
                                   .overlap = 1};
        skv = eng_v2(e, ist, DSV4_F32, 2 * L->ratio, 2 * dI);
        ssc = eng_v2(e, ist + 2 * L->ratio * 2 * dI, DSV4_F32, 2 * L->ratio, 2 * dI);
        DSV4_TRY(dsv4_compressor_state_reset(e->ctx, &id, &skv, &ssc));
    }
    s->len = 0;
    s->mtp_len = 0;
    s->failed = 0;
    return DSV4_OK;
}

static dsv4_status seq_init(dsv4_engine *e, int sq)
{
    eng_seq *s = &e->seqs[sq];
    DSV4_TRY(dsv4_kv_seq_create(e->ring_pool, e->R, &s->ring));
    DSV4_TRY(dsv4_kv_seq_reserve(s->ring, e->R));
    for (int p = 0; p < e->n_pools; p++) {
        int64_t entries = (e->opt.max_context + e->pool_ratio[p] - 1) / e->pool_ratio[p];
        DSV4_TRY(dsv4_kv_seq_create(e->pools[p], entries, &s->comp[p]));
        DSV4_TRY(dsv4_kv_seq_reserve(s->comp[p], entries));
        int64_t nb = 0; /* the table the ops read (dsv4_paged_slots): fixed while the sequence lives */
        const int32_t *table = dsv4_kv_seq_block_table(s->comp[p], &nb);
        if (nb != s->btab_n[p])
            return dsv4_fail(DSV4_ERR_CAPACITY, "engine: sequence %d holds %lld blocks of pool %d, %lld planned", sq,
                             (long long)nb, p, (long long)s->btab_n[p]);
        DSV4_TRY(dsv4_device_upload(e->ctx, s->btab[p], table, (size_t)nb * 4));
    }
    DSV4_TRY(seq_clear(e, sq));
    s->live = 1;
    return DSV4_OK;
}

static void seq_release(eng_seq *s)
{
    dsv4_kv_seq_destroy(s->ring);
    s->ring = NULL;
    for (int p = 0; p < ENG_MAX_RATIOS; p++) {
        dsv4_kv_seq_destroy(s->comp[p]);
        s->comp[p] = NULL;
    }
    s->live = 0;
}

dsv4_status dsv4_engine_seq_create(dsv4_engine *e, int *seq)
{
    DSV4_CHECK_ARG(e && seq, "engine_seq_create: null argument");
    int sq = 0;
    while (sq < e->opt.max_seqs && e->seqs[sq].live) sq++;
    if (sq == e->opt.max_seqs)
        return dsv4_fail(DSV4_ERR_CAPACITY, "engine_seq_create: all %d sequences (max_seqs) are in use", e->opt.max_seqs);
    dsv4_status st = seq_init(e, sq);
    if (st != DSV4_OK) {
        seq_release(&e->seqs[sq]);
        return st;
    }
    *seq = sq;
    return DSV4_OK;
}

dsv4_status dsv4_engine_seq_reset(dsv4_engine *e, int seq)
{
    DSV4_TRY(eng_check_seq(e, seq, "engine_seq_reset"));
    return seq_clear(e, seq);
}

dsv4_status dsv4_engine_seq_free(dsv4_engine *e, int seq)
{
    DSV4_TRY(eng_check_seq(e, seq, "engine_seq_free"));
    seq_release(&e->seqs[seq]);
    return DSV4_OK;
}

/* Cache entry `entry` of sequence table `from` into the same entry of `to` (one cache). */
static dsv4_status copy_entry(const dsv4_engine *e, const dsv4_kv_cache *c, const dsv4_kv_seq *from, const dsv4_kv_seq *to, int64_t entry)
{
    int64_t a, b;
    DSV4_TRY(dsv4_kv_seq_slots(from, &entry, 1, &a));
    DSV4_TRY(dsv4_kv_seq_slots(to, &entry, 1, &b));
    uint8_t *pages = c->pages.data;
    const int64_t ps = c->pages.stride[0], bs = c->block_size;
    DSV4_TRY(eng_copy(e, pages + dsv4_kve_slot_data(ps, bs, b), pages + dsv4_kve_slot_data(ps, bs, a), DSV4_KVE_DATA_BYTES));
    return eng_copy(e, pages + dsv4_kve_slot_scale(ps, bs, b), pages + dsv4_kve_slot_scale(ps, bs, a), DSV4_KVE_SCALE_BYTES);
}

static dsv4_status copy_seq(dsv4_engine *e, int src, int dst)
{
    eng_seq *a = &e->seqs[src], *b = &e->seqs[dst];
    const int64_t rs = e->hc * e->D;
    for (int l = 0; l < e->n_blocks; l++) {
        const eng_layer *L = &e->layers[l];
        const int64_t n = L->is_mtp ? a->mtp_len : a->len;
        for (int64_t r = 0; r < e->R; r++) DSV4_TRY(copy_entry(e, &L->ring, a->ring, b->ring, r));
        if (!L->ratio) continue;
        for (int64_t c = 0; c < n / L->ratio; c++) DSV4_TRY(copy_entry(e, &L->comp, a->comp[L->pool], b->comp[L->pool], c));
        if (L->kind == DSV4_ATTN_CSA) {
            const size_t row = (size_t)(e->index_entries * e->index_entry_bytes);
            DSV4_TRY(eng_copy(e, L->index_cache + (size_t)dst * row, L->index_cache + (size_t)src * row,
                              n / L->ratio * e->index_entry_bytes));
        }
        DSV4_TRY(eng_copy(e, eng_state(e, L, dst), eng_state(e, L, src), L->state_floats * 4));
    }
    memcpy(b->hist, a->hist, (size_t)a->len * sizeof *a->hist); /* host bookkeeping */
    DSV4_TRY(eng_copy(e, b->pending, a->pending, 2 * rs * 2));
    if (e->opt.max_mtp) {
        memcpy(b->head_logits, a->head_logits, (size_t)e->V * 4); /* host */
        DSV4_TRY(eng_copy(e, b->head_streams, a->head_streams, rs * 2));
    }
    b->len = a->len;
    b->mtp_len = a->mtp_len;
    b->pend = a->pend;
    b->head_tok = a->head_tok;
    b->failed = 0;
    return DSV4_OK;
}

dsv4_status dsv4_engine_seq_copy(dsv4_engine *e, int src, int dst)
{
    const char *op = "engine_seq_copy";
    DSV4_TRY(eng_check_usable(e, src, op));
    DSV4_TRY(eng_check_seq(e, dst, op));
    DSV4_CHECK_ARG(src != dst, "%s: source and destination are both sequence %d", op, src);
    dsv4_status st = copy_seq(e, src, dst);
    return st == DSV4_OK ? st : eng_seqs_failed(e, &dst, 1, sizeof dst, st, op);
}

/* Whether the rings still hold the SWA window that recomputing from `restart` reads: positions
 * max(0, restart-W+1) .. restart-1, written by the first `len` tokens (a ring keeps the last R;
 * the MTP block's ring, which runs behind the main model, holds no less). */
static int ring_holds(const dsv4_engine *e, int64_t len, int64_t restart)
{
    int64_t lo = restart - e->W + 1 < 0 ? 0 : restart - e->W + 1;
    return restart == 0 || lo >= len - e->R;
}

dsv4_status dsv4_engine_seq_truncate(dsv4_engine *e, int seq, int64_t length, int64_t *recomputed)
{
    const char *op = "engine_seq_truncate";
    DSV4_TRY(eng_check_usable(e, seq, op));
    eng_seq *q = &e->seqs[seq];
    DSV4_CHECK_ARG(length >= 0 && length <= q->len, "%s: length %lld not in [0, %lld] (the sequence's length)", op,
                   (long long)length, (long long)q->len);
    if (recomputed) *recomputed = 0;
    if (length == q->len) return DSV4_OK;
    if (length == 0) return seq_clear(e, seq);
    /* The restart point: the last multiple of every ratio at or before the new end (its last
     * token with MTP, whose pending streams come from running it), less the overlapping window
     * whose rows the CSA compressors keep; the compressor states there are rebuilt by running the
     * tokens again, their entries (in the caches already) dropped. Earlier multiples when the
     * ring no longer holds the window of a later one; position 0 always works. */
    const int64_t M = e->restart_lcm, end = e->opt.max_mtp ? length - 1 : length;
    int64_t restart = 0;
    for (int64_t P = end / M * M; P > 0; P -= M) {
        int64_t r = P - e->restart_overlap;
        if (r >= 0 && ring_holds(e, q->len, r)) {
            restart = r;
            break;
        }
    }
    const int64_t n = length - restart;
    if (restart == 0) DSV4_TRY(seq_clear(e, seq)); /* fresh states; the caches are rewritten */
    q->len = q->mtp_len = restart; /* the MTP rows of the recomputed positions run again too */
    dsv4_status st = DSV4_OK;
    for (int64_t c0 = 0; c0 < n && st == DSV4_OK; c0 += e->opt.max_batch) {
        int64_t T = n - c0 < e->opt.max_batch ? n - c0 : e->opt.max_batch, m = 0;
        eng_seg *g = &e->s.segs[0];
        *g = (eng_seg){seq, 0, q->len, T, 0, 0, 0};
        st = eng_main_forward(e, g, 1, q->hist + restart + c0, ENG_REPLAY);
        if (st != DSV4_OK || !e->opt.max_mtp) continue;
        int k = 0;
        st = eng_mtp_catch_up(e, g, &k, &m);
        if (st == DSV4_OK && k) st = eng_mtp_rows(e, e->s.msegs, k, e->s.mtok);
    }
    if (st != DSV4_OK) return eng_seqs_failed(e, &seq, 1, sizeof seq, st, op);
    if (recomputed) *recomputed = n;
    return DSV4_OK;
}

dsv4_status dsv4_engine_seq_tokens(const dsv4_engine *e, int seq, int32_t *out, int64_t cap, int64_t *len)
{
    DSV4_TRY(eng_check_seq(e, seq, "engine_seq_tokens"));
    DSV4_CHECK_ARG(len && (cap == 0 || out) && cap >= 0, "engine_seq_tokens: need a length pointer and a buffer");
    const eng_seq *q = &e->seqs[seq];
    if (out) memcpy(out, q->hist, (size_t)(q->len < cap ? q->len : cap) * sizeof *out);
    *len = q->len;
    return DSV4_OK;
}

int64_t dsv4_engine_seq_length(const dsv4_engine *e, int seq)
{
    if (!e || seq < 0 || seq >= e->opt.max_seqs || !e->seqs[seq].live) return -1;
    return e->seqs[seq].len;
}

/* ---- memory and export --------------------------------------------------------------------- */
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

dsv4_status dsv4_engine_memory_info(const dsv4_engine *e, dsv4_engine_memory *out)
{
    DSV4_CHECK_ARG(e && out, "engine_memory_info: null argument");
    memset(out, 0, sizeof *out);
    out->weights_mapped = e->weights_mapped;
    out->weights_device = e->on_device ? e->devw.bytes : 0;
    out->weights_converted = e->mem_bytes[A_CONV];
    out->kv_cache = e->mem_bytes[A_KV];
    out->state = e->mem_bytes[A_STATE];
    out->scratch = e->mem_bytes[A_SCRATCH] + e->mem_bytes[A_HOST];
    out->planned = out->weights_converted + out->kv_cache + out->state + out->scratch;
    for (int sq = 0; sq < e->opt.max_seqs; sq++) {
        const eng_seq *s = &e->seqs[sq];
        if (!s->live) continue;
        for (int b = 0; b < e->n_blocks; b++) {
            const eng_layer *L = &e->layers[b];
            int64_t len = L->is_mtp ? s->mtp_len : s->len;
            out->kv_used += (uint64_t)min64(len, e->R) * DSV4_KV_ENTRY_BYTES;
            if (L->ratio) out->kv_used += (uint64_t)(len / L->ratio) * DSV4_KV_ENTRY_BYTES;
            if (L->kind == DSV4_ATTN_CSA) out->kv_used += (uint64_t)(len / L->ratio * e->index_entry_bytes);
        }
    }
    return DSV4_OK;
}

/* Append `n` bytes of the context's memory to the export (or only count them). */
static dsv4_status put(const dsv4_engine *e, uint8_t *out, size_t cap, size_t *pos, const void *src, size_t n)
{
    dsv4_status st = DSV4_OK;
    if (out && *pos + n <= cap && n) {
        if (e->on_device) st = dsv4_device_download(e->ctx, out + *pos, src, n);
        else memcpy(out + *pos, src, n);
    }
    *pos += n;
    return st;
}

/* The 584 bytes of a cache entry at `slot`: data row, then its scale row (formats/kv_entry.h). */
static dsv4_status put_entry(const dsv4_engine *e, const dsv4_kv_cache *c, int64_t slot, uint8_t *out, size_t cap,
                             size_t *pos)
{
    const uint8_t *pages = (const uint8_t *)c->pages.data;
    const int64_t ps = c->pages.stride[0];
    DSV4_TRY(put(e, out, cap, pos, pages + dsv4_kve_slot_data(ps, c->block_size, slot), DSV4_KVE_DATA_BYTES));
    return put(e, out, cap, pos, pages + dsv4_kve_slot_scale(ps, c->block_size, slot), DSV4_KVE_SCALE_BYTES);
}

/* The export's bytes into out (NULL: only counted in *pos). */
static dsv4_status export_bytes(const dsv4_engine *e, int seq, uint8_t *o, size_t cap, size_t *pos)
{
    const eng_seq *s = &e->seqs[seq];
    for (int b = 0; b < e->n_blocks; b++) {
        const eng_layer *L = &e->layers[b];
        int64_t n = L->is_mtp ? s->mtp_len : s->len;
        for (int64_t p = n - e->W < 0 ? 0 : n - e->W; p < n; p++) {
            int64_t entry = p % e->R, slot;
            DSV4_TRY(dsv4_kv_seq_slots(s->ring, &entry, 1, &slot));
            DSV4_TRY(put_entry(e, &L->ring, slot, o, cap, pos));
        }
        if (!L->ratio) continue;
        for (int64_t c = 0; c < n / L->ratio; c++) {
            int64_t slot;
            DSV4_TRY(dsv4_kv_seq_slots(s->comp[L->pool], &c, 1, &slot));
            DSV4_TRY(put_entry(e, &L->comp, slot, o, cap, pos));
        }
        if (L->kind == DSV4_ATTN_CSA)
            DSV4_TRY(put(e, o, cap, pos, L->index_cache + (size_t)(seq * e->index_entries * e->index_entry_bytes),
                         (size_t)(n / L->ratio * e->index_entry_bytes)));
        DSV4_TRY(put(e, o, cap, pos, eng_state(e, L, seq), (size_t)L->state_floats * 4));
    }
    return DSV4_OK;
}

dsv4_status dsv4_engine_seq_export(const dsv4_engine *e, int seq, void *out, size_t cap, size_t *len)
{
    DSV4_TRY(eng_check_usable(e, seq, "engine_seq_export"));
    DSV4_CHECK_ARG(len, "engine_seq_export: null length pointer");
    size_t n = 0; /* counted first: a short buffer is refused before a byte is written */
    DSV4_TRY(export_bytes(e, seq, NULL, 0, &n));
    if (out && n > cap) return dsv4_fail(DSV4_ERR_CAPACITY, "engine_seq_export: %zu bytes needed, %zu given", n, cap);
    if (out) {
        size_t pos = 0;
        DSV4_TRY(export_bytes(e, seq, out, cap, &pos));
    }
    *len = n;
    return DSV4_OK;
}
