/* Attention kernels of the cpu backends: the scalar reference (cpu-ref), the pieces the fast
 * paths share with it, and the per-ISA kernels the cpu backend picks at run time. */
#ifndef DSV4_CPU_ATTENTION_H
#define DSV4_CPU_ATTENTION_H

#include "core/ops_attention.h"
#include "formats/codec.h"
#include "formats/kv_entry.h"

extern const struct dsv4_attention_ops dsv4_cpu_ref_attention_ops;
extern const struct dsv4_attention_ops dsv4_cpu_attention_ops;

/* ---- cache addressing (the layout: formats/kv_entry.h) ------------------------------------- */
static inline uint8_t *dsv4_kv_data(const dsv4_kv_geom *g, int64_t slot)
{
    return g->pages + dsv4_kve_slot_data(g->page_stride, g->block_size, slot);
}
static inline uint8_t *dsv4_kv_scale_row(const dsv4_kv_geom *g, int64_t slot)
{
    return g->pages + dsv4_kve_slot_scale(g->page_stride, g->block_size, slot);
}
static inline int dsv4_kv_valid(const dsv4_kv_geom *g, int64_t slot) { return slot >= 0 && slot < g->num_slots; }

/* ---- scalar pieces (attention_ref.c), reused by the fast paths ------------------------------ */
/* Rotate 32 interleaved pairs x[2i], x[2i+1] by row cs (cos || sin); inverse: by -theta. fp32,
 * each product rounded, no fused multiply-add. */
void dsv4_ref_rope_pairs(float *x, const float *cs, int inverse);
/* Sum of squares of 512 floats in the fixed order the vector kernels use: 16 lane sums
 * (lane j takes d = j mod 16, in order), then lanes j += j+8, j += j+4, j += j+2, j += j+1. */
float dsv4_ref_sumsq512(const float *x);
/* One q head in place (norm + RoPE, see ops_attention.h). */
void dsv4_ref_qnorm_rope_row(uint16_t *q, const float *cs, float eps);
/* The rotated, BF16-rounded dims 448..511 of a kv row (bits), or the row's own bits if cs is NULL. */
void dsv4_ref_kv_rope_bits(const uint16_t *kv, const float *cs, uint16_t rope_bits[64]);
/* Quantize one kv row (rope dims given as bits) and write its 584 bytes at slot. */
void dsv4_ref_kv_write(const dsv4_kv_geom *g, int64_t slot, const uint16_t *kv, const uint16_t rope_bits[64]);
/* Dequantized entry as floats / BF16 bits (exact); bf16_rows: the geometry is plain BF16 rows. */
void dsv4_ref_kv_read(const dsv4_kv_geom *g, int bf16_rows, int64_t slot, float *k);
void dsv4_ref_kv_read_bf16(const dsv4_kv_geom *g, int64_t slot, uint16_t *out);
/* Dims 448..511 of one output head rotated back (inverse RoPE), in place. */
void dsv4_ref_inv_rope_row(uint16_t *o, const float *cs);
/* The RoPE table both cpu backends use (one row per position, double angles). */
dsv4_status dsv4_cpu_rope_table(const dsv4_exec *ex, const double *freq, int64_t max_pos, float *table);
/* Write the output row (and lse) of query t, head h from o (fp32, natural order), the running
 * max m, the sum l of exp(s - m) and the count of valid entries (0: zeros and lse = +inf). */
void dsv4_attn_finish(const dsv4_attn_args *a, int64_t t, int64_t h, const float *o, float m, float l, int64_t count);

/* ---- split decode (attention_cpu.c) --------------------------------------------------------
 * Work of one (query, head tile, split): heads h0..h0+nh-1 (nh <= DSV4_ATTN_TILE) over positions
 * p0..p1-1 of the query's prefix list (scope 0's first len0 entries, then scope 1's). It leaves
 * per head the running max m, the sum l of exp(s - m) and o = sum exp(s - m) k (fp32, natural
 * dim order) and the count of valid entries. */
#define DSV4_ATTN_TILE 64
/* exp(r) for |r| <= ln(2)/2 as a polynomial (Taylor, 1/7! first) and ln(2) split in two for the
 * argument reduction: the vector exps of the AVX2 and AVX-512 decode units. */
static const float dsv4_exp_poly[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                       1.0f / 6.0f,    0.5f,           1.0f,           1.0f};
#define DSV4_LN2_HI 0.693145751953125f
#define DSV4_LN2_LO 1.428606765330187e-06f
#define DSV4_ATTN_PART 528 /* floats per (head, split) in the workspace: o[512], m, l, count, pad */

typedef struct dsv4_attn_unit {
    const dsv4_attn_args *a;
    const dsv4_attn_scope *scopes;
    int n_scopes;
    int bf16_rows;
    int64_t t, h0, nh;
    int64_t len[2]; /* clamped lengths of the query's scopes */
    int64_t p0, p1;
} dsv4_attn_unit;

/* part: nh rows of DSV4_ATTN_PART floats. */
typedef void (*dsv4_attn_unit_fn)(const dsv4_attn_unit *u, float *part);

void dsv4_attn_unit_generic(const dsv4_attn_unit *u, float *part); /* portable C (attention_cpu.c) */
void dsv4_attn_unit_avx2(const dsv4_attn_unit *u, float *part);    /* the portable code built for AVX2 */
void dsv4_attn_unit_avx512(const dsv4_attn_unit *u, float *part);  /* AVX-512 BF16 (vdpbf16ps) */

/* Next valid slot at position >= *p (< u->p1), advancing *p past it and telling its scope;
 * -1 when none is left. (dsv4_attn_next_slots below: up to n of them.) */
static inline int64_t dsv4_attn_next_slot(const dsv4_attn_unit *u, int64_t *p, int *scope)
{
    while (*p < u->p1) {
        int64_t pos = (*p)++;
        int s = pos >= u->len[0];
        const dsv4_attn_scope *sc = &u->scopes[s];
        int64_t idx = sc->indices[u->t * sc->ld + (s ? pos - u->len[0] : pos)];
        if (dsv4_kv_valid(&sc->cache, idx)) {
            *scope = s;
            return idx;
        }
    }
    return -1;
}

/* Up to n next valid slots (their scopes in scope[]); fewer only when the unit's range ends. */
static inline int dsv4_attn_next_slots(const dsv4_attn_unit *u, int64_t *p, int n, int64_t *idx, int *scope)
{
    int k = 0;
    while (k < n && (idx[k] = dsv4_attn_next_slot(u, p, &scope[k])) >= 0) k++;
    return k;
}

/* Optimized per-ISA row kernels of the insert/gather/inv-rope side (NULL: use the scalar one). */
typedef struct dsv4_cpu_attn_row_kernels {
    void (*qnorm_rope_row)(uint16_t *q, const float *cs, float eps);
    void (*kv_write)(const dsv4_kv_geom *g, int64_t slot, const uint16_t *kv, const float *cs);
    void (*gather_row)(const dsv4_kv_geom *g, int64_t slot, uint16_t *out);
    void (*inv_rope_row)(uint16_t *o, const float *cs);
} dsv4_cpu_attn_row_kernels;

extern const dsv4_cpu_attn_row_kernels dsv4_cpu_attn_rows_avx512;

#endif
