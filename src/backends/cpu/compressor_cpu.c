/* Compressor driver of both cpu backends (docs/model.md §5.5): the batched form of the
 * per-token state machine. A call with tokens P0..P1-1 pools every entry c whose last token lies
 * in that range, reading each window row from the new tokens (position >= P0) or from the state
 * (the current block at P0, and with overlap the block before it), then leaves the state that
 * P1-P0 single-token steps leave. Entries are independent: they run in parallel. */
#include "backends/cpu/indexer_cpu.h"
#include "core/pool.h"

#include <string.h>

typedef struct {
    const float *a, *g, *ape; /* ape NULL: g already holds gate + ape (state rows) */
} cmp_row;

/* The (kv, score) row of token q, columns from `col`, as seen before this call's tokens. */
static cmp_row row_of(const dsv4_cmp_call *c, int64_t q, int col)
{
    const int r = c->ratio;
    const int64_t p0 = c->start_pos;
    cmp_row w;
    if (q >= p0) {
        w.a = c->kv + (q - p0) * c->ld_in_kv + col;
        w.g = c->gate + (q - p0) * c->ld_in_gate + col;
        w.ape = c->ape + (q % r) * c->ld_ape + col;
    } else {
        /* the current block at P0 sits in rows (overlap ? r : 0) + q mod r, the block before it
         * (overlap only) in rows q mod r */
        int64_t srow = (q / r == p0 / r) ? (c->overlap ? r : 0) + q % r : q % r;
        w.a = c->state_kv + srow * c->ld_state_kv + col;
        w.g = c->state_score + srow * c->ld_state_score + col;
        w.ape = NULL;
    }
    return w;
}

/* Norm, RoPE and rounding of one pooled entry; writes output row i. */
static void finish_entry(const dsv4_ix_kernels *kn, const dsv4_cmp_call *c, int64_t entry, int64_t i, float *x)
{
    const int d = c->dim;
    for (int e = 0; e < d; e++) x[e] = dsv4_bf16_round(x[e]);
    float ss = 0.0f;
    for (int e = 0; e < d; e++) ss = ss + x[e] * x[e];
    const float rs = 1.0f / sqrtf(ss / (float)d + c->eps);
    for (int e = 0; e < d; e++) {
        float w = c->norm_bf16 ? dsv4_bf16_to_f32(((const uint16_t *)c->norm)[e]) : ((const float *)c->norm)[e];
        x[e] = dsv4_bf16_round(w * (x[e] * rs));
    }
    dsv4_ix_rope64(x + d - 64, c->rope + entry * c->ratio * c->ld_rope);
    if (c->kind == DSV4_COMPRESSOR_INDEXER) {
        if (c->out_mode == DSV4_CMP_OUT_PACKED)
            dsv4_ix_hadamard_fp4(kn, x, d, (uint8_t *)c->out + i * c->ld_out, c->out_scales + i * c->ld_out_scales, NULL);
        else
            dsv4_ix_hadamard_fp4(kn, x, d, NULL, NULL, (uint16_t *)c->out + i * c->ld_out);
        return;
    }
    if (c->fp8_sim) {
        const dsv4_qrule_params *p = &dsv4_qrules[DSV4_QRULE_KV64];
        for (int g = 0; g < (d - 64) / 64; g++) {
            uint8_t codes[64];
            float s = dsv4_e8m0_to_f32(dsv4_quantize_group(p, x + 64 * g, 64, codes));
            for (int j = 0; j < 64; j++) x[64 * g + j] = dsv4_e4m3_to_f32(codes[j]) * s;
        }
    }
    uint16_t *o = (uint16_t *)c->out + i * c->ld_out;
    for (int e = 0; e < d; e++) o[e] = dsv4_bf16_from_f32(x[e]);
}

/* Copy token q's full row (all coff*d columns, score = gate + ape) into state row `dst`. */
static void store_row(const dsv4_cmp_call *c, int64_t q, int64_t dst, int width)
{
    cmp_row w = row_of(c, q, 0);
    float *a = c->state_kv + dst * c->ld_state_kv, *g = c->state_score + dst * c->ld_state_score;
    if (a != w.a) memmove(a, w.a, (size_t)width * sizeof(float));
    if (w.ape)
        for (int e = 0; e < width; e++) g[e] = w.g[e] + w.ape[e];
    else if (g != w.g)
        memmove(g, w.g, (size_t)width * sizeof(float));
}

/* Entries first + lo .. first + hi - 1, each pooled whole. */
static void cmp_entries(void *v, int64_t lo, int64_t hi)
{
    const dsv4_ix_kernels *kn = ((const dsv4_ix_job *)v)->kn;
    const dsv4_cmp_call *c = ((const dsv4_ix_job *)v)->call;
    const int r = c->ratio, d = c->dim;
    const int64_t first = c->start_pos / r;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t entry = first + i, start = entry * r;
        const float *a[2 * DSV4_CMP_MAX_RATIO], *g[2 * DSV4_CMP_MAX_RATIO], *ape[2 * DSV4_CMP_MAX_RATIO];
        float x[DSV4_CMP_MAX_DIM];
        int n = 0;
        if (c->overlap) /* the previous block, first d columns; none before position 0 */
            for (int64_t q = start - r; q < start; q++) {
                if (q < 0) continue;
                cmp_row w = row_of(c, q, 0);
                a[n] = w.a, g[n] = w.g, ape[n++] = w.ape;
            }
        for (int64_t q = start; q < start + r; q++) {
            cmp_row w = row_of(c, q, c->overlap ? d : 0);
            a[n] = w.a, g[n] = w.g, ape[n++] = w.ape;
        }
        kn->pool(n, a, g, ape, d, x);
        finish_entry(kn, c, entry, i, x);
    }
}

dsv4_status dsv4_cmp_run(const dsv4_ix_kernels *kn, const dsv4_exec *ex, const dsv4_cmp_call *c)
{
    const int r = c->ratio, d = c->dim, coff = c->overlap ? 2 : 1;
    const int64_t p0 = c->start_pos, p1 = p0 + c->n_tokens, m = p1 / r - p0 / r;
    dsv4_ix_job job = {kn, c};
    dsv4_par_for(ex, m, 4, cmp_entries, &job);
    /* State: with overlap, rows 0..r-1 take the last emitted block (read before the current rows
     * change); rows (overlap ? r : 0) + q mod r take the latest token of each residue. */
    const int width = coff * d;
    if (c->overlap && m > 0)
        for (int64_t q = (p1 / r - 1) * r; q < (p1 / r) * r; q++) store_row(c, q, q % r, width);
    for (int64_t q = p1 - r > p0 ? p1 - r : p0; q < p1; q++) store_row(c, q, (c->overlap ? r : 0) + q % r, width);
    return DSV4_OK;
}

dsv4_status dsv4_cmp_reset(const dsv4_exec *ex, float *state_kv, int64_t ld_kv, float *state_score, int64_t ld_score,
                           int64_t rows, int64_t cols)
{
    (void)ex;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            state_kv[r * ld_kv + j] = 0.0f;
            state_score[r * ld_score + j] = -INFINITY;
        }
    return DSV4_OK;
}
