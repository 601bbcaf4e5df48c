/* The attention family of the cpu backend: OpenMP drivers around the per-ISA kernels.
 *
 * Sparse decode: the work of each query is cut into head tiles (<= DSV4_ATTN_TILE heads) and
 * splits of its prefix list (a fixed number of positions each); every (query, tile, split) unit
 * dequantizes its entries once for all heads of the tile and keeps an online softmax. A query
 * that fits in one split is written directly; otherwise the units leave (o, max, sum) partials
 * in the caller's workspace and a second pass merges them in split order. Tile and split sizes
 * depend only on (T, H, width), never on the thread count, so results are bit-identical for any
 * number of threads. */
#include "backends/cpu/cpu_attention_unit.h"

#include <string.h>

/* ---- row kernels: the best ISA's, else the scalar reference's ------------------------------- */
static void kv_write_scalar(const dsv4_kv_geom *g, int64_t slot, const uint16_t *kv, const float *cs)
{
    uint16_t rb[64];
    dsv4_ref_kv_rope_bits(kv, cs, rb);
    dsv4_ref_kv_write(g, slot, kv, rb);
}

static const dsv4_cpu_attn_row_kernels rows_scalar = {dsv4_ref_qnorm_rope_row, kv_write_scalar,
                                                      dsv4_ref_kv_read_bf16, dsv4_ref_inv_rope_row};

static const dsv4_cpu_attn_row_kernels *rows(const dsv4_exec *ex)
{
    return ex->isa == DSV4_ISA_AVX512 ? &dsv4_cpu_attn_rows_avx512 : &rows_scalar;
}

static int in_table(int64_t pos, int64_t max_pos) { return pos >= 0 && pos < max_pos; }

/* Inserts are split by slot class (slot mod CLASSES): each class walks the tokens in order, so a
 * slot written twice ends with the last write, as in a sequential loop, whatever the threads. */
#define CLASSES 16

static dsv4_status cpu_kv_insert(const dsv4_exec *ex, const uint16_t *kv, int64_t ld_kv, int64_t n, const int64_t *slots,
                                 const int64_t *positions, const float *rope, int64_t max_pos, const dsv4_kv_geom *g)
{
    const dsv4_cpu_attn_row_kernels *rk = rows(ex);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (n >= 4 * CLASSES)
    for (int c = 0; c < CLASSES; c++)
        for (int64_t i = 0; i < n; i++) {
            int64_t slot = slots[i];
            if (!dsv4_kv_valid(g, slot) || slot % CLASSES != c) continue;
            if (positions && !in_table(positions[i], max_pos)) continue;
            rk->kv_write(g, slot, kv + i * ld_kv, positions ? rope + positions[i] * 64 : NULL);
        }
    return DSV4_OK;
}

static dsv4_status cpu_qnorm_rope_kv_insert(const dsv4_exec *ex, uint16_t *q, int64_t q_st, int64_t q_sh, int64_t n,
                                            int64_t h, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                            const int64_t *slots, const int64_t *positions, const float *rope,
                                            int64_t max_pos, float eps, const dsv4_kv_geom *g)
{
    const dsv4_cpu_attn_row_kernels *rk = rows(ex);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (n * h >= 64)
    for (int64_t r = 0; r < n * h; r++) {
        int64_t i = r / h, j = r % h;
        if (in_table(positions[i], max_pos)) rk->qnorm_rope_row(q + i * q_st + j * q_sh, rope + positions[i] * 64, eps);
    }
    return cpu_kv_insert(ex, kv, ld_kv, n_ins, slots, positions, rope, max_pos, g);
}

static dsv4_status cpu_dequant_gather(const dsv4_exec *ex, const dsv4_kv_geom *g, const int32_t *slots, int64_t s,
                                      uint16_t *out, int64_t ld_out)
{
    const dsv4_cpu_attn_row_kernels *rk = rows(ex);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (s >= 64)
    for (int64_t i = 0; i < s; i++) {
        if (dsv4_kv_valid(g, slots[i])) rk->gather_row(g, slots[i], out + i * ld_out);
        else memset(out + i * ld_out, 0, DSV4_KV_DIM * sizeof *out);
    }
    return DSV4_OK;
}

static dsv4_status cpu_inv_rope(const dsv4_exec *ex, uint16_t *o, int64_t st, int64_t sh, int64_t t, int64_t h,
                                const int64_t *positions, const float *rope, int64_t max_pos)
{
    const dsv4_cpu_attn_row_kernels *rk = rows(ex);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (t * h >= 256)
    for (int64_t r = 0; r < t * h; r++) {
        int64_t i = r / h, j = r % h;
        if (in_table(positions[i], max_pos)) rk->inv_rope_row(o + i * st + j * sh, rope + positions[i] * 64);
    }
    return DSV4_OK;
}

/* ---- sparse decode -------------------------------------------------------------------------- */
/* A query's entries are cut into splits of a fixed size (merged by LSE in split order), so its
 * result depends on nothing but its own entries: not on T, the scope widths or the thread count.
 * That keeps a prefill of n tokens bit-identical to n single-token decodes. Queries run in
 * blocks sized so that the partials of one block fit in WS_BUDGET bytes (the block size changes
 * only the work space, never a result). */
#define SPLIT 64                  /* entries per split */
#define WS_BUDGET (16u << 20)     /* bytes of partials per block of queries, at most (>= one query) */

typedef struct {
    int64_t n_tiles, tile, split, max_splits, block;
} attn_plan;

static attn_plan plan_for(int64_t t, int64_t h, int64_t width)
{
    attn_plan P;
    P.n_tiles = (h + DSV4_ATTN_TILE - 1) / DSV4_ATTN_TILE;
    P.tile = (h + P.n_tiles - 1) / P.n_tiles;
    P.split = SPLIT;
    P.max_splits = width > 0 ? (width + SPLIT - 1) / SPLIT : 1;
    size_t per_query = (size_t)(P.max_splits * h) * DSV4_ATTN_PART * sizeof(float);
    int64_t fit = per_query ? (int64_t)(WS_BUDGET / per_query) : t;
    P.block = fit < 1 ? 1 : fit > t ? (t > 0 ? t : 1) : fit;
    return P;
}

/* A block of queries uses block * max_splits * h partials, at most WS_BUDGET bytes or one query's
 * worth, and at most t queries' worth: the bound min(t queries, max(WS_BUDGET, one query)) is
 * what is asked for, since it never decreases with t or width (src/core/ops_attention.h). */
static size_t cpu_decode_workspace(const dsv4_exec *ex, int64_t t, int64_t h, int64_t width)
{
    (void)ex;
    attn_plan P = plan_for(t, h, width);
    if (P.max_splits <= 1 || t <= 0) return 0;
    const size_t one = (size_t)(P.max_splits * h) * DSV4_ATTN_PART * sizeof(float), all = (size_t)t * one;
    const size_t block = one > WS_BUDGET ? one : WS_BUDGET;
    return all < block ? all : block;
}

static int64_t splits_of(const attn_plan *P, int64_t n) { return n == 0 ? 1 : (n + P->split - 1) / P->split; }

static void query_lengths(const dsv4_attn_scope *sc, int n_scopes, int64_t t, int64_t len[2])
{
    len[1] = 0;
    for (int s = 0; s < n_scopes; s++) {
        int64_t v = sc[s].lengths ? sc[s].lengths[t] : sc[s].width;
        len[s] = v < 0 ? 0 : v > sc[s].width ? sc[s].width : v;
    }
}

static dsv4_attn_unit_fn unit_kernel(const dsv4_exec *ex)
{
    if (dsv4_cpu_isa_bf16(ex->isa)) return dsv4_attn_unit_avx512;
    if (ex->isa >= DSV4_ISA_AVX2) return dsv4_attn_unit_avx2;
    return dsv4_attn_unit_generic;
}

/* Merge the partials of query t (row tb of the block's work space), head h over its nsp splits
 * (in split order). */
static void merge_head(const dsv4_attn_args *a, const attn_plan *P, int64_t t, int64_t tb, int64_t h, int64_t nsp)
{
    const float *ws = a->workspace;
    float o[DSV4_KV_DIM] = {0}, mx = -INFINITY, l = 0.0f;
    int64_t count = 0;
    for (int64_t s = 0; s < nsp; s++) {
        const float *pt = ws + ((tb * P->max_splits + s) * a->h + h) * DSV4_ATTN_PART;
        if (pt[514] > 0.0f && pt[512] > mx) mx = pt[512];
    }
    for (int64_t s = 0; s < nsp; s++) {
        const float *pt = ws + ((tb * P->max_splits + s) * a->h + h) * DSV4_ATTN_PART;
        if (!(pt[514] > 0.0f)) continue;
        float f = pt[512] == mx ? 1.0f : expf(pt[512] - mx);
        for (int d = 0; d < DSV4_KV_DIM; d++) o[d] += f * pt[d];
        l += f * pt[513];
        count += (int64_t)pt[514];
    }
    dsv4_attn_finish(a, t, h, o, mx, l, count);
}

static void decode_run(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *sc, int n_scopes,
                       int bf16_rows, dsv4_attn_unit_fn fn)
{
    int64_t width = 0;
    for (int s = 0; s < n_scopes; s++) width += sc[s].width;
    const attn_plan P = plan_for(a->t, a->h, width);
    const int64_t per_t = P.n_tiles * P.max_splits;
    float *ws = a->workspace;
    for (int64_t t0 = 0; t0 < a->t; t0 += P.block) {
        const int64_t nt = a->t - t0 < P.block ? a->t - t0 : P.block, units = nt * per_t;
#pragma omp parallel for num_threads(ex->threads) schedule(dynamic) if (units > 1)
        for (int64_t w = 0; w < units; w++) {
            int64_t tb = w / per_t, t = t0 + tb, tile = w % per_t / P.max_splits, sp = w % P.max_splits;
            dsv4_attn_unit u = {a, sc, n_scopes, bf16_rows, t, tile * P.tile, 0, {0, 0}, 0, 0};
            u.nh = a->h - u.h0 < P.tile ? a->h - u.h0 : P.tile;
            query_lengths(sc, n_scopes, t, u.len);
            int64_t n = u.len[0] + u.len[1], nsp = splits_of(&P, n);
            if (sp >= nsp) continue;
            u.p0 = sp * P.split;
            u.p1 = n - u.p0 < P.split ? n : u.p0 + P.split;
            if (nsp > 1) {
                fn(&u, ws + ((tb * P.max_splits + sp) * a->h + u.h0) * DSV4_ATTN_PART);
                continue;
            }
            _Alignas(64) float part[DSV4_ATTN_TILE * DSV4_ATTN_PART];
            fn(&u, part);
            for (int64_t j = 0; j < u.nh; j++) {
                const float *pt = part + j * DSV4_ATTN_PART;
                dsv4_attn_finish(a, t, u.h0 + j, pt, pt[512], pt[513], (int64_t)pt[514]);
            }
        }
        if (P.max_splits == 1) continue;
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (nt * a->h > 16)
        for (int64_t r = 0; r < nt * a->h; r++) {
            int64_t tb = r / a->h, len[2];
            query_lengths(sc, n_scopes, t0 + tb, len);
            int64_t nsp = splits_of(&P, len[0] + len[1]);
            if (nsp > 1) merge_head(a, &P, t0 + tb, tb, r % a->h, nsp);
        }
    }
}

void dsv4_attn_unit_generic(const dsv4_attn_unit *u, float *part) { dsv4_attn_unit_portable(u, part); }

static dsv4_status cpu_sparse_mla_decode(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scopes,
                                         int n_scopes)
{
    decode_run(ex, a, scopes, n_scopes, 0, unit_kernel(ex));
    return DSV4_OK;
}

static dsv4_status cpu_sparse_attn_bf16(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scope)
{
    decode_run(ex, a, scope, 1, 1, unit_kernel(ex));
    return DSV4_OK;
}

const struct dsv4_attention_ops dsv4_cpu_attention_ops = {
    .rope_table = dsv4_cpu_rope_table,
    .kv_insert = cpu_kv_insert,
    .qnorm_rope_kv_insert = cpu_qnorm_rope_kv_insert,
    .dequant_gather = cpu_dequant_gather,
    .decode_workspace = cpu_decode_workspace,
    .sparse_mla_decode = cpu_sparse_mla_decode,
    .sparse_attn_bf16 = cpu_sparse_attn_bf16,
    .inv_rope = cpu_inv_rope,
};
