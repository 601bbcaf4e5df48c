/* The attention family of the cpu backend: drivers on the context's pool around the per-ISA kernels.
 *
 * Sparse decode: the work of each query is cut into head tiles (<= DSV4_ATTN_TILE heads) and
 * splits of its prefix list (a fixed number of positions each); every (query, tile, split) unit
 * dequantizes its entries once for all heads of the tile and keeps an online softmax. A query
 * that fits in one split is written directly; otherwise the units leave (o, max, sum) partials
 * in the caller's workspace and a second pass merges them in split order. Tile and split sizes
 * depend only on (T, H, width), never on the thread count, so results are bit-identical for any
 * number of threads. */
#include "backends/cpu/cpu_attention_unit.h"
#include "core/pool.h"

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

/* The rows of one call of the attention helpers below (the members each one reads). */
typedef struct {
    const dsv4_cpu_attn_row_kernels *rk;
    const dsv4_kv_geom *g;
    const uint16_t *kv;
    uint16_t *x; /* q or o */
    const int64_t *slots, *positions;
    const int32_t *slots32;
    const float *rope;
    int64_t n, h, ld, st, sh, max_pos;
    float eps;
} rows_job;

static void insert_classes(void *v, int64_t c0, int64_t c1)
{
    const rows_job *j = v;
    for (int64_t c = c0; c < c1; c++)
        for (int64_t i = 0; i < j->n; i++) {
            int64_t slot = j->slots[i];
            if (!dsv4_kv_valid(j->g, slot) || slot % CLASSES != c) continue;
            if (j->positions && !in_table(j->positions[i], j->max_pos)) continue;
            j->rk->kv_write(j->g, slot, j->kv + i * j->ld, j->positions ? j->rope + j->positions[i] * 64 : NULL);
        }
}

static dsv4_status cpu_kv_insert(const dsv4_exec *ex, const uint16_t *kv, int64_t ld_kv, int64_t n, const int64_t *slots,
                                 const int64_t *positions, const float *rope, int64_t max_pos, const dsv4_kv_geom *g)
{
    rows_job j = {.rk = rows(ex), .g = g, .kv = kv, .slots = slots, .positions = positions, .rope = rope, .n = n,
                  .ld = ld_kv, .max_pos = max_pos};
    dsv4_par_for(ex, CLASSES, n >= 4 * CLASSES ? 1 : CLASSES, insert_classes, &j);
    return DSV4_OK;
}

static void qnorm_rows(void *v, int64_t lo, int64_t hi)
{
    const rows_job *j = v;
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r / j->h, k = r % j->h;
        if (in_table(j->positions[i], j->max_pos))
            j->rk->qnorm_rope_row(j->x + i * j->st + k * j->sh, j->rope + j->positions[i] * 64, j->eps);
    }
}

static dsv4_status cpu_qnorm_rope_kv_insert(const dsv4_exec *ex, uint16_t *q, int64_t q_st, int64_t q_sh, int64_t n,
                                            int64_t h, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                            const int64_t *slots, const int64_t *positions, const float *rope,
                                            int64_t max_pos, float eps, const dsv4_kv_geom *g)
{
    rows_job j = {.rk = rows(ex), .x = q, .positions = positions, .rope = rope, .h = h, .st = q_st, .sh = q_sh,
                  .max_pos = max_pos, .eps = eps};
    dsv4_par_for(ex, n * h, n * h >= 64 ? DSV4_PAR_AUTO : n * h, qnorm_rows, &j);
    return cpu_kv_insert(ex, kv, ld_kv, n_ins, slots, positions, rope, max_pos, g);
}

static void gather_rows(void *v, int64_t lo, int64_t hi)
{
    const rows_job *j = v;
    for (int64_t i = lo; i < hi; i++) {
        if (dsv4_kv_valid(j->g, j->slots32[i])) j->rk->gather_row(j->g, j->slots32[i], j->x + i * j->ld);
        else memset(j->x + i * j->ld, 0, DSV4_KV_DIM * sizeof *j->x);
    }
}

static dsv4_status cpu_dequant_gather(const dsv4_exec *ex, const dsv4_kv_geom *g, const int32_t *slots, int64_t s,
                                      uint16_t *out, int64_t ld_out)
{
    rows_job j = {.rk = rows(ex), .g = g, .x = out, .slots32 = slots, .ld = ld_out};
    dsv4_par_for(ex, s, s >= 64 ? DSV4_PAR_AUTO : s, gather_rows, &j);
    return DSV4_OK;
}

static void inv_rope_rows(void *v, int64_t lo, int64_t hi)
{
    const rows_job *j = v;
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r / j->h, k = r % j->h;
        if (in_table(j->positions[i], j->max_pos))
            j->rk->inv_rope_row(j->x + i * j->st + k * j->sh, j->rope + j->positions[i] * 64);
    }
}

static dsv4_status cpu_inv_rope(const dsv4_exec *ex, uint16_t *o, int64_t st, int64_t sh, int64_t t, int64_t h,
                                const int64_t *positions, const float *rope, int64_t max_pos)
{
    rows_job j = {.rk = rows(ex), .x = o, .positions = positions, .rope = rope, .h = h, .st = st, .sh = sh,
                  .max_pos = max_pos};
    dsv4_par_for(ex, t * h, t * h >= 256 ? DSV4_PAR_AUTO : t * h, inv_rope_rows, &j);
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

/* One block of queries t0 .. t0 + nt - 1 of decode_run. */
typedef struct {
    const dsv4_attn_args *a;
    const dsv4_attn_scope *sc;
    int n_scopes, bf16_rows;
    dsv4_attn_unit_fn fn;
    const attn_plan *P;
    int64_t t0, per_t;
} decode_job;

/* Work units [lo, hi): (query, head tile, split) each, computed whole. */
static void decode_units(void *v, int64_t lo, int64_t hi)
{
    const decode_job *j = v;
    const dsv4_attn_args *a = j->a;
    const attn_plan *P = j->P;
    float *ws = a->workspace;
    for (int64_t w = lo; w < hi; w++) {
        int64_t tb = w / j->per_t, t = j->t0 + tb, tile = w % j->per_t / P->max_splits, sp = w % P->max_splits;
        dsv4_attn_unit u = {a, j->sc, j->n_scopes, j->bf16_rows, t, tile * P->tile, 0, {0, 0}, 0, 0};
        u.nh = a->h - u.h0 < P->tile ? a->h - u.h0 : P->tile;
        query_lengths(j->sc, j->n_scopes, t, u.len);
        int64_t n = u.len[0] + u.len[1], nsp = splits_of(P, n);
        if (sp >= nsp) continue;
        u.p0 = sp * P->split;
        u.p1 = n - u.p0 < P->split ? n : u.p0 + P->split;
        if (nsp > 1) {
            j->fn(&u, ws + ((tb * P->max_splits + sp) * a->h + u.h0) * DSV4_ATTN_PART);
            continue;
        }
        _Alignas(64) float part[DSV4_ATTN_TILE * DSV4_ATTN_PART];
        j->fn(&u, part);
        for (int64_t k = 0; k < u.nh; k++) {
            const float *pt = part + k * DSV4_ATTN_PART;
            dsv4_attn_finish(a, t, u.h0 + k, pt, pt[512], pt[513], (int64_t)pt[514]);
        }
    }
}

/* Rows [lo, hi) of (query of the block, head): the merge of its splits. */
static void merge_rows(void *v, int64_t lo, int64_t hi)
{
    const decode_job *j = v;
    const dsv4_attn_args *a = j->a;
    for (int64_t r = lo; r < hi; r++) {
        int64_t tb = r / a->h, len[2];
        query_lengths(j->sc, j->n_scopes, j->t0 + tb, len);
        int64_t nsp = splits_of(j->P, len[0] + len[1]);
        if (nsp > 1) merge_head(a, j->P, j->t0 + tb, tb, r % a->h, nsp);
    }
}

static void decode_run(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *sc, int n_scopes,
                       int bf16_rows, dsv4_attn_unit_fn fn)
{
    int64_t width = 0;
    for (int s = 0; s < n_scopes; s++) width += sc[s].width;
    const attn_plan P = plan_for(a->t, a->h, width);
    decode_job j = {a, sc, n_scopes, bf16_rows, fn, &P, 0, P.n_tiles * P.max_splits};
    for (j.t0 = 0; j.t0 < a->t; j.t0 += P.block) {
        const int64_t nt = a->t - j.t0 < P.block ? a->t - j.t0 : P.block, units = nt * j.per_t;
        dsv4_par_for(ex, units, 1, decode_units, &j); /* one unit a chunk: units differ in length */
        if (P.max_splits == 1) continue;
        dsv4_par_for(ex, nt * a->h, nt * a->h > 16 ? DSV4_PAR_AUTO : nt * a->h, merge_rows, &j);
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
