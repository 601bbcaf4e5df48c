/* The attention family of the cuda backend (core/ops_attention.h): argument translation, the
 * split-KV plan and its workspace, launches on the context's stream. Nothing here allocates,
 * synchronizes or reads device data, so every op can be captured in a CUDA graph. */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/ops_attention.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdlib.h>

static dsv4_status cu_rope_table(const dsv4_exec *ex, const double *freq, int64_t max_pos, float *table)
{
    CU_LAUNCH(ex, "rope_table", dsv4_cu_rope_table_launch(freq, max_pos, table, dsv4_cu_stream(ex)));
}

static dsv4_cu_insert insert_args(const dsv4_kv_geom *cache, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                  const int64_t *slots, const int64_t *positions, const float *rope, int64_t max_pos)
{
    dsv4_cu_insert a = {0};
    a.kv = kv;
    a.ld_kv = ld_kv;
    a.n_ins = n_ins;
    a.slots = slots;
    a.positions = positions;
    a.rope = rope;
    a.max_pos = max_pos;
    a.pages = cache->pages;
    a.page_stride = cache->page_stride;
    a.block_size = cache->block_size;
    a.num_slots = cache->num_slots;
    return a;
}

static dsv4_status cu_kv_insert(const dsv4_exec *ex, const uint16_t *kv, int64_t ld_kv, int64_t n, const int64_t *slots,
                                const int64_t *positions, const float *rope, int64_t max_pos, const dsv4_kv_geom *cache)
{
    dsv4_cu_insert a = insert_args(cache, kv, ld_kv, n, slots, positions, rope, max_pos);
    CU_LAUNCH(ex, "kv_insert", dsv4_cu_insert_launch(&a, dsv4_cu_stream(ex)));
}

static dsv4_status cu_qnorm_rope_kv_insert(const dsv4_exec *ex, uint16_t *q, int64_t q_st, int64_t q_sh, int64_t n,
                                           int64_t h, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                           const int64_t *slots, const int64_t *positions, const float *rope,
                                           int64_t max_pos, float eps, const dsv4_kv_geom *cache)
{
    dsv4_cu_insert a = insert_args(cache, kv, ld_kv, n_ins, slots, positions, rope, max_pos);
    a.q = q;
    a.q_st = q_st;
    a.q_sh = q_sh;
    a.n = n;
    a.h = h;
    a.eps = eps;
    CU_LAUNCH(ex, "qnorm_rope_kv_insert", dsv4_cu_insert_launch(&a, dsv4_cu_stream(ex)));
}

static dsv4_cu_cache cache_of(const dsv4_kv_geom *g)
{
    dsv4_cu_cache c = {g->pages, g->page_stride, g->block_size, g->num_slots};
    return c;
}

static dsv4_status cu_dequant_gather(const dsv4_exec *ex, const dsv4_kv_geom *cache, const int32_t *slots, int64_t s,
                                     uint16_t *out, int64_t ld_out)
{
    CU_LAUNCH(ex, "dequant_gather", dsv4_cu_gather_launch(cache_of(cache), slots, s, out, ld_out, dsv4_cu_stream(ex)));
}

static dsv4_status cu_inv_rope(const dsv4_exec *ex, uint16_t *o, int64_t st, int64_t sh, int64_t t, int64_t h,
                               const int64_t *positions, const float *rope, int64_t max_pos)
{
    CU_LAUNCH(ex, "inv_rope", dsv4_cu_inv_rope_launch(o, st, sh, t, h, positions, rope, max_pos, dsv4_cu_stream(ex)));
}

/* ---- split-KV plan --------------------------------------------------------------------------
 * CTAs without splitting: t x head tiles. When they fill the GPU, no split (and no workspace);
 * otherwise split each token's entries into up to sms / ctas parts of at least one 64-entry
 * block. Two blocks with the unsplit grid at a quarter of the GPU or more stay unsplit: one CTA
 * pipelines both sooner than two CTAs and the combine (docs/kernels.md §12.1, measured at
 * T = 64 and T = 8; the context's ",split2" splits them anyway, to measure the rule). The plan
 * depends only on (device, t, h, width, variant) and never exceeds sms / tiles splits in all,
 * the bound the workspace query asks for; a smaller workspace than asked for lowers the split
 * count instead of failing. */
static int64_t plan_splits(int sms, int64_t t, int64_t h, int64_t width, int split2)
{
    int64_t rows = dsv4_cu_decode_rows(h);
    int64_t ctas = t * ((h + rows - 1) / rows), blocks = (width + 63) / 64;
    if (ctas <= 0 || blocks <= 1 || ctas >= sms || (blocks == 2 && !split2 && 4 * ctas >= sms)) return 1;
    int64_t s = sms / ctas;
    return s > blocks ? blocks : s;
}

static size_t split_bytes(int64_t splits, int64_t t, int64_t h)
{
    return splits > 1 ? (size_t)splits * (size_t)t * (size_t)h * (512 + 1) * sizeof(float) + 256 : 0;
}

/* The call splits each of t queries s ways with s * t * tiles <= sms and s <= blocks, so s * t is
 * at most min(t * blocks, sms / tiles): asked for as such, a bound that never decreases with t
 * or width (src/core/ops_attention.h). */
static size_t cu_decode_workspace(const dsv4_exec *ex, int64_t t, int64_t h, int64_t width)
{
    const int64_t rows = dsv4_cu_decode_rows(h), tiles = (h + rows - 1) / rows, blocks = (width + 63) / 64;
    if (t <= 0 || blocks <= 1) return 0;
    const int64_t most = dsv4_cu_sm_count(ex) / tiles, st = t * blocks < most ? t * blocks : most;
    return st > 1 ? (size_t)st * (size_t)h * (512 + 1) * sizeof(float) + 256 : 0;
}

/* The warpgroup-MMA kernel is built for sm_90a only: use it on compute capability 9.0 unless the
 * context asks for the mma.sync kernels (cuda_decode "mma-sync"; tests and benchmarks compare the
 * two). */
static int use_wgmma(const dsv4_exec *ex)
{
    if ((ex->variant & DSV4_CU_KERNEL_MASK) == DSV4_CU_MMA_SYNC) return 0;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ex->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ex->device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major == 9 && minor == 0;
}

static int aligned16(const dsv4_kv_geom *g) { return ((uintptr_t)g->pages % 16 == 0) && (g->page_stride % 16 == 0); }

static dsv4_status decode(const dsv4_exec *ex, const char *op, const dsv4_attn_args *a, const dsv4_attn_scope *scopes,
                          int n_scopes, int fp8)
{
    if (a->t > INT_MAX || a->h > INT_MAX)
        return dsv4_fail(DSV4_ERR_RANGE, "%s: %lld queries x %lld heads exceed the CUDA grid", op, (long long)a->t,
                         (long long)a->h);
    dsv4_cu_decode d = {0};
    d.q = a->q;
    d.q_st = a->q_st;
    d.q_sh = a->q_sh;
    d.t = (int)a->t;
    d.h = (int)a->h;
    d.sink = a->sink;
    d.scale_log2 = a->scale * 1.4426950408889634f;
    d.out = a->out;
    d.o_st = a->o_st;
    d.o_sh = a->o_sh;
    d.lse = a->lse;
    d.lse_st = a->lse_st;
    d.lse_sh = a->lse_sh;
    d.n_scopes = n_scopes;
    d.fp8 = fp8;
    d.aligned = 1;
    int64_t width = 0;
    for (int i = 0; i < n_scopes; i++) {
        d.scope[i].cache = cache_of(&scopes[i].cache);
        d.scope[i].indices = scopes[i].indices;
        d.scope[i].ld = scopes[i].ld;
        d.scope[i].width = scopes[i].width;
        d.scope[i].lengths = scopes[i].lengths;
        d.aligned &= aligned16(&scopes[i].cache);
        width += scopes[i].width;
    }
    d.wgmma = use_wgmma(ex);
    d.kernel = d.wgmma ? ex->variant & DSV4_CU_KERNEL_MASK : DSV4_CU_AUTO;
    d.no_pair = (ex->variant & DSV4_CU_NO_PAIR) != 0;
    d.device = ex->device;
    d.pdl = ex->variant & DSV4_CU_NO_PDL ? 0 : ex->variant & DSV4_CU_PDL ? 2 : 1;
    d.seq_combine = (ex->variant & DSV4_CU_SEQ_COMBINE) != 0;
    d.release_late = (ex->variant & DSV4_CU_LATE_RELEASE) != 0;
    d.late_sink = (ex->variant & DSV4_CU_LATE_SINK) != 0;
    d.prefetch = (ex->variant & DSV4_CU_PREFETCH) != 0;
    d.wide_store = (ex->variant & DSV4_CU_WIDE_STORE) != 0;
    d.warp_copy = (ex->variant & DSV4_CU_ONE_COPY) == 0;
    const int sms = dsv4_cu_sm_count(ex);
    d.sms = sms;
    int64_t splits = ex->variant & DSV4_CU_NO_SPLIT ? 1 : plan_splits(sms, a->t, a->h, width, (ex->variant & DSV4_CU_SPLIT2) != 0);
    uintptr_t ws = ((uintptr_t)a->workspace + 255) & ~(uintptr_t)255;
    while (splits > 1 && (!a->workspace || split_bytes(splits, a->t, a->h) > a->workspace_bytes)) splits--;
    d.splits = (int)splits;
    if (splits > 1) {
        d.part_o = (float *)ws;
        d.part_lse = d.part_o + splits * a->t * a->h * 512;
    }
    CU_LAUNCH(ex, op, dsv4_cu_decode_launch(&d, dsv4_cu_stream(ex)));
}

static dsv4_status cu_sparse_mla_decode(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scopes,
                                        int n_scopes)
{
    return decode(ex, "sparse_mla_decode", a, scopes, n_scopes, 1);
}

static dsv4_status cu_sparse_attn_bf16(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scope)
{
    return decode(ex, "sparse_attn_bf16", a, scope, 1, 0);
}

const struct dsv4_attention_ops dsv4_cuda_attention_ops = {
    .rope_table = cu_rope_table,
    .kv_insert = cu_kv_insert,
    .qnorm_rope_kv_insert = cu_qnorm_rope_kv_insert,
    .dequant_gather = cu_dequant_gather,
    .decode_workspace = cu_decode_workspace,
    .sparse_mla_decode = cu_sparse_mla_decode,
    .sparse_attn_bf16 = cu_sparse_attn_bf16,
    .inv_rope = cu_inv_rope,
};
