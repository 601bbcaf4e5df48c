/* The scalar reference of the attention family (backend cpu-ref): plain loops written from the
 * contracts (docs/contracts.md §5-§6, docs/kernels.md §1-§4), the judge of every faster kernel. Its pieces
 * (addressing, quantize-and-write, RoPE) are reused by the cpu backend where it does not
 * vectorize them. Work over independent (token, head) rows may run on several threads; every
 * row is computed by one thread in a fixed order, so results never depend on the thread count. */
#include "backends/cpu/cpu_attention.h"
#include "core/pool.h"

#include <math.h>
#include <string.h>

#define NOPE DSV4_KVE_NOPE_DIM

void dsv4_ref_rope_pairs(float *x, const float *cs, int inverse)
{
    for (int i = 0; i < 32; i++) {
        float a = x[2 * i], b = x[2 * i + 1], c = cs[i], s = cs[32 + i];
        float ac = a * c, bs = b * s, as = a * s, bc = b * c;
        x[2 * i] = inverse ? ac + bs : ac - bs;
        x[2 * i + 1] = inverse ? bc - as : bc + as;
    }
}

float dsv4_ref_sumsq512(const float *x)
{
    float acc[16] = {0};
    for (int d = 0; d < DSV4_KV_DIM; d++) {
        float sq = x[d] * x[d];
        acc[d & 15] += sq;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

void dsv4_ref_qnorm_rope_row(uint16_t *q, const float *cs, float eps)
{
    float x[DSV4_KV_DIM];
    for (int d = 0; d < DSV4_KV_DIM; d++) x[d] = dsv4_bf16_to_f32(q[d]);
    float r = 1.0f / sqrtf(dsv4_ref_sumsq512(x) * (1.0f / 512.0f) + eps);
    for (int d = 0; d < DSV4_KV_DIM; d++) x[d] *= r;
    dsv4_ref_rope_pairs(x + NOPE, cs, 0);
    for (int d = 0; d < DSV4_KV_DIM; d++) q[d] = dsv4_bf16_from_f32(x[d]);
}

void dsv4_ref_kv_rope_bits(const uint16_t *kv, const float *cs, uint16_t rope_bits[64])
{
    if (!cs) {
        memcpy(rope_bits, kv + NOPE, 64 * sizeof *rope_bits);
        return;
    }
    float x[64];
    for (int d = 0; d < 64; d++) x[d] = dsv4_bf16_to_f32(kv[NOPE + d]);
    dsv4_ref_rope_pairs(x, cs, 0);
    for (int d = 0; d < 64; d++) rope_bits[d] = dsv4_bf16_from_f32(x[d]);
}

void dsv4_ref_kv_write(const dsv4_kv_geom *g, int64_t slot, const uint16_t *kv, const uint16_t rope_bits[64])
{
    float x[NOPE];
    for (int d = 0; d < NOPE; d++) x[d] = dsv4_bf16_to_f32(kv[d]);
    uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    for (int grp = 0; grp < DSV4_KVE_GROUPS; grp++)
        sc[grp] = dsv4_quantize_group(&dsv4_qrules[DSV4_QRULE_KV64], x + 64 * grp, 64, data + 64 * grp);
    sc[DSV4_KVE_GROUPS] = 0; /* the pad byte */
    memcpy(data + NOPE, rope_bits, 64 * sizeof *rope_bits); /* little-endian BF16 */
}

void dsv4_ref_kv_read(const dsv4_kv_geom *g, int bf16_rows, int64_t slot, float *k)
{
    if (bf16_rows) {
        const uint16_t *row = (const uint16_t *)(g->pages + slot * g->page_stride);
        for (int d = 0; d < DSV4_KV_DIM; d++) k[d] = dsv4_bf16_to_f32(row[d]);
        return;
    }
    const uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    for (int d = 0; d < NOPE; d++) k[d] = dsv4_e4m3_to_f32(data[d]) * dsv4_e8m0_to_f32(sc[d / 64]);
    uint16_t rope[64];
    memcpy(rope, data + NOPE, sizeof rope);
    for (int d = 0; d < 64; d++) k[NOPE + d] = dsv4_bf16_to_f32(rope[d]);
}

void dsv4_ref_kv_read_bf16(const dsv4_kv_geom *g, int64_t slot, uint16_t *out)
{
    const uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    for (int d = 0; d < NOPE; d++) out[d] = dsv4_bf16_from_f32(dsv4_e4m3_to_f32(data[d]) * dsv4_e8m0_to_f32(sc[d / 64]));
    memcpy(out + NOPE, data + NOPE, 64 * sizeof *out);
}

/* ---- the cpu-ref table -------------------------------------------------------------------- */
typedef struct {
    const double *freq;
    float *table;
} rope_job;

static void rope_rows(void *v, int64_t lo, int64_t hi)
{
    const rope_job *j = v;
    for (int64_t p = lo; p < hi; p++)
        for (int i = 0; i < 32; i++) {
            double th = (double)p * j->freq[i];
            j->table[p * 64 + i] = (float)cos(th);
            j->table[p * 64 + 32 + i] = (float)sin(th);
        }
}

static dsv4_status ref_rope_table(const dsv4_exec *ex, const double *freq, int64_t max_pos, float *table)
{
    rope_job j = {freq, table};
    dsv4_par_for(ex, max_pos, max_pos > 1024 ? DSV4_PAR_AUTO : max_pos, rope_rows, &j);
    return DSV4_OK;
}

static dsv4_status ref_kv_insert(const dsv4_exec *ex, const uint16_t *kv, int64_t ld_kv, int64_t n, const int64_t *slots,
                                 const int64_t *positions, const float *rope, int64_t max_pos, const dsv4_kv_geom *g)
{
    for (int64_t i = 0; i < n; i++) {
        if (!dsv4_kv_valid(g, slots[i])) continue;
        if (positions && (positions[i] < 0 || positions[i] >= max_pos)) continue;
        uint16_t rb[64];
        dsv4_ref_kv_rope_bits(kv + i * ld_kv, positions ? rope + positions[i] * 64 : NULL, rb);
        dsv4_ref_kv_write(g, slots[i], kv + i * ld_kv, rb);
    }
    return DSV4_OK;
}

typedef struct {
    uint16_t *q;
    int64_t q_st, q_sh, h;
    const int64_t *positions;
    const float *rope;
    int64_t max_pos;
    float eps;
} qnorm_job;

static void qnorm_rows(void *v, int64_t lo, int64_t hi)
{
    const qnorm_job *q = v;
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r / q->h, j = r % q->h;
        if (q->positions[i] >= 0 && q->positions[i] < q->max_pos)
            dsv4_ref_qnorm_rope_row(q->q + i * q->q_st + j * q->q_sh, q->rope + q->positions[i] * 64, q->eps);
    }
}

static dsv4_status ref_qnorm_rope_kv_insert(const dsv4_exec *ex, uint16_t *q, int64_t q_st, int64_t q_sh, int64_t n,
                                            int64_t h, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                            const int64_t *slots, const int64_t *positions, const float *rope,
                                            int64_t max_pos, float eps, const dsv4_kv_geom *g)
{
    qnorm_job j = {q, q_st, q_sh, h, positions, rope, max_pos, eps};
    dsv4_par_for(ex, n * h, n * h > 64 ? DSV4_PAR_AUTO : n * h, qnorm_rows, &j);
    return ref_kv_insert(ex, kv, ld_kv, n_ins, slots, positions, rope, max_pos, g);
}

static dsv4_status ref_dequant_gather(const dsv4_exec *ex, const dsv4_kv_geom *g, const int32_t *slots, int64_t s,
                                      uint16_t *out, int64_t ld_out)
{
    for (int64_t i = 0; i < s; i++) {
        if (dsv4_kv_valid(g, slots[i])) dsv4_ref_kv_read_bf16(g, slots[i], out + i * ld_out);
        else memset(out + i * ld_out, 0, DSV4_KV_DIM * sizeof *out);
    }
    return DSV4_OK;
}

static size_t ref_decode_workspace(const dsv4_exec *ex, int64_t t, int64_t h, int64_t width) { return 0; }

/* BODY for every valid entry of query t, in order, with k = the entry and x = its score scale * q.k. */
#define FOR_EACH_ENTRY(BODY)                                                                            \
    for (int s = 0; s < n_scopes; s++) {                                                                \
        int64_t len = sc[s].lengths ? sc[s].lengths[t] : sc[s].width;                                   \
        len = len < 0 ? 0 : len > sc[s].width ? sc[s].width : len;                                     \
        for (int64_t j = 0; j < len; j++) {                                                             \
            int64_t idx = sc[s].indices[t * sc[s].ld + j];                                              \
            if (!dsv4_kv_valid(&sc[s].cache, idx)) continue;                                            \
            dsv4_ref_kv_read(&sc[s].cache, bf16_rows, idx, k);                                          \
            float dot = 0.0f;                                                                           \
            for (int d = 0; d < DSV4_KV_DIM; d++) dot += q[d] * k[d];                                   \
            const float x = a->scale * dot;                                                             \
            BODY                                                                                        \
        }                                                                                               \
    }

/* One (query, head), in two passes over its valid entries: the maximum score m, then
 * p = exp(x - m) in fp32, summed unrounded, and rounded to BF16 for P.V (docs/kernels.md §3.2: the
 * reference kernels' precision; the same rounding points as tests/python/ref_model.py). */
static void ref_attend(const dsv4_attn_args *a, const dsv4_attn_scope *sc, int n_scopes, int bf16_rows, int64_t t,
                       int64_t h)
{
    float q[DSV4_KV_DIM], k[DSV4_KV_DIM], o[DSV4_KV_DIM] = {0};
    const uint16_t *qr = a->q + t * a->q_st + h * a->q_sh;
    for (int d = 0; d < DSV4_KV_DIM; d++) q[d] = dsv4_bf16_to_f32(qr[d]);
    float m = -INFINITY, l = 0.0f;
    int64_t count = 0;
    FOR_EACH_ENTRY(m = x > m ? x : m; count++;)
    if (count > 0 && m == -INFINITY) m = 0.0f; /* every score -inf: p = 0 throughout */
    FOR_EACH_ENTRY(const float p = x == -INFINITY ? 0.0f : expf(x - m); const float pb = dsv4_bf16_round(p);
                   for (int d = 0; d < DSV4_KV_DIM; d++) o[d] += pb * k[d];
                   l += p;)
    dsv4_attn_finish(a, t, h, o, m, l, count);
}
#undef FOR_EACH_ENTRY

void dsv4_attn_finish(const dsv4_attn_args *a, int64_t t, int64_t h, const float *o, float m, float l, int64_t count)
{
    uint16_t *out = a->out + t * a->o_st + h * a->o_sh;
    float lse = INFINITY;
    if (count == 0) {
        memset(out, 0, DSV4_KV_DIM * sizeof *out);
    } else {
        float den = l + (a->sink ? expf(a->sink[h] - m) : 0.0f), inv = 1.0f / den;
        for (int d = 0; d < DSV4_KV_DIM; d++) out[d] = dsv4_bf16_from_f32(o[d] * inv);
        lse = m + logf(l);
    }
    if (a->lse) a->lse[t * a->lse_st + h * a->lse_sh] = lse;
}

typedef struct {
    const dsv4_attn_args *a;
    const dsv4_attn_scope *sc;
    int n_scopes, bf16_rows;
} decode_job;

static void decode_rows(void *v, int64_t lo, int64_t hi)
{
    const decode_job *j = v;
    for (int64_t r = lo; r < hi; r++) ref_attend(j->a, j->sc, j->n_scopes, j->bf16_rows, r / j->a->h, r % j->a->h);
}

static void ref_decode(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *sc, int n_scopes,
                       int bf16_rows)
{
    decode_job j = {a, sc, n_scopes, bf16_rows};
    dsv4_par_for(ex, a->t * a->h, 1, decode_rows, &j); /* one (query, head) a chunk */
}

static dsv4_status ref_sparse_mla_decode(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scopes,
                                         int n_scopes)
{
    ref_decode(ex, a, scopes, n_scopes, 0);
    return DSV4_OK;
}

static dsv4_status ref_sparse_attn_bf16(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scope)
{
    ref_decode(ex, a, scope, 1, 1);
    return DSV4_OK;
}

void dsv4_ref_inv_rope_row(uint16_t *o, const float *cs)
{
    float x[64];
    for (int d = 0; d < 64; d++) x[d] = dsv4_bf16_to_f32(o[NOPE + d]);
    dsv4_ref_rope_pairs(x, cs, 1);
    for (int d = 0; d < 64; d++) o[NOPE + d] = dsv4_bf16_from_f32(x[d]);
}

static dsv4_status ref_inv_rope(const dsv4_exec *ex, uint16_t *o, int64_t st, int64_t sh, int64_t t, int64_t h,
                                const int64_t *positions, const float *rope, int64_t max_pos)
{
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < h; j++)
            if (positions[i] >= 0 && positions[i] < max_pos)
                dsv4_ref_inv_rope_row(o + i * st + j * sh, rope + positions[i] * 64);
    return DSV4_OK;
}

const struct dsv4_attention_ops dsv4_cpu_ref_attention_ops = {
    .rope_table = ref_rope_table,
    .kv_insert = ref_kv_insert,
    .qnorm_rope_kv_insert = ref_qnorm_rope_kv_insert,
    .dequant_gather = ref_dequant_gather,
    .decode_workspace = ref_decode_workspace,
    .sparse_mla_decode = ref_sparse_mla_decode,
    .sparse_attn_bf16 = ref_sparse_attn_bf16,
    .inv_rope = ref_inv_rope,
};

/* Shared with the cpu table: the table is computed once per model, in double. */
dsv4_status dsv4_cpu_rope_table(const dsv4_exec *ex, const double *freq, int64_t max_pos, float *table)
{
    return ref_rope_table(ex, freq, max_pos, table);
}
