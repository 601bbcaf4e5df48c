/* AVX-512 kernels of the attention family (compiled with AVX-512 flags, run only after the
 * run-time check). The insert/gather/inverse-RoPE row kernels are bit-identical to the scalar
 * reference (same operations, same order). The decode unit reads FP8 pages directly: E4M3 codes
 * become BF16 in registers (exact: the scales are powers of two), q.k and p.v run on vdpbf16ps
 * with fp32 accumulation, the softmax is fp32, probabilities are rounded to BF16 for p.v
 * (as FlashMLA does). */
#include "backends/cpu/cpu_attention.h"
#include "backends/cpu/cpu_formats.h"
#include "backends/cpu/simd_avx512.h"

#include <math.h>
#include <string.h>

#define NOPE DSV4_KVE_NOPE_DIM

/* ---- row kernels (bit-identical to attention_ref.c) ----------------------------------------- */

/* 16 floats = 8 pairs; cs points at the 8 cosines of these pairs (sines at cs + 32). */
static inline __m512 rope16(__m512 x, const float *cs, int inverse)
{
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs)));
    __m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + 32)));
    __m512 xc = _mm512_mul_ps(x, c), t = _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), s);
    /* forward: even a*c - b*s, odd b*c + a*s; inverse: even a*c + b*s, odd b*c - a*s */
    const __mmask16 even = 0x5555;
    __mmask16 sub = inverse ? (__mmask16)~even : even;
    return _mm512_mask_sub_ps(_mm512_add_ps(xc, t), sub, xc, t);
}

/* Sum of 16 lanes in the order of dsv4_ref_sumsq512's tree. */
static inline float tree_sum16(__m512 v)
{
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    return _mm512_cvtss_f32(v);
}

static void qnorm_rope_row(uint16_t *q, const float *cs, float eps)
{
    __m512 x[32], acc = _mm512_setzero_ps();
    for (int c = 0; c < 32; c++) {
        x[c] = v512_bf16_decode(q + 16 * c);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x[c], x[c]));
    }
    __m512 r = _mm512_set1_ps(1.0f / sqrtf(tree_sum16(acc) * (1.0f / 512.0f) + eps));
    for (int c = 0; c < 32; c++) {
        __m512 y = _mm512_mul_ps(x[c], r);
        if (c >= NOPE / 16) y = rope16(y, cs + 8 * (c - NOPE / 16), 0);
        _mm256_storeu_si256((__m256i *)(q + 16 * c), v512_bf16_encode(y));
    }
}

static void kv_write(const dsv4_kv_geom *g, int64_t slot, const uint16_t *kv, const float *cs)
{
    float x[NOPE];
    for (int c = 0; c < NOPE / 16; c++) _mm512_storeu_ps(x + 16 * c, v512_bf16_decode(kv + 16 * c));
    uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    dsv4_cpu_format_kernels_avx512.quantize_row(DSV4_QRULE_KV64, x, NOPE, data, sc);
    sc[DSV4_KVE_GROUPS] = 0; /* the pad byte */
    for (int c = 0; c < 4; c++) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(kv + NOPE + 16 * c));
        if (cs) bits = v512_bf16_encode(rope16(v512_bf16_decode(kv + NOPE + 16 * c), cs + 8 * c, 0));
        _mm256_storeu_si256((__m256i *)(data + NOPE + 32 * c), bits);
    }
}

static void gather_row(const dsv4_kv_geom *g, int64_t slot, uint16_t *out)
{
    const uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    for (int grp = 0; grp < DSV4_KVE_GROUPS; grp++) {
        __m512 s = _mm512_set1_ps(dsv4_e8m0_to_f32(sc[grp]));
        for (int c = 0; c < 4; c++) {
            __m512 v = _mm512_mul_ps(v512_e4m3_decode(data + 64 * grp + 16 * c), s);
            _mm256_storeu_si256((__m256i *)(out + 64 * grp + 16 * c), v512_bf16_encode(v));
        }
    }
    memcpy(out + NOPE, data + NOPE, DSV4_KVE_ROPE_BYTES);
}

static void inv_rope_row(uint16_t *o, const float *cs)
{
    for (int c = 0; c < 4; c++) {
        __m512 y = rope16(v512_bf16_decode(o + NOPE + 16 * c), cs + 8 * c, 1);
        _mm256_storeu_si256((__m256i *)(o + NOPE + 16 * c), v512_bf16_encode(y));
    }
}

const dsv4_cpu_attn_row_kernels dsv4_cpu_attn_rows_avx512 = {qnorm_rope_row, kv_write, gather_row, inv_rope_row};

/* ---- decode unit ---------------------------------------------------------------------------- */
#define BLK 16 /* entries per block */

/* E4M3 magnitude code a (0..127) -> BF16 bits of its value, as two 128-entry byte tables (low
 * and high bytes) for vpermi2b. Normal codes: (a << 4) + 0x3C00 (rebias 7 -> 127); subnormal
 * codes m * 2^-9 are normal in BF16: 0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60. */
typedef struct {
    __m512i lo0, lo1, hi0, hi1;
} e4m3_bf16_lut;

static inline e4m3_bf16_lut make_lut(void)
{
    const __m512i idx0 = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45,
                                         44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26,
                                         25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                         5, 4, 3, 2, 1, 0);
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi8(64));
    const __m512i sub_lo = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x60402000C0800000ll);
    const __m512i sub_hi = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x3C3C3C3C3B3B3B00ll);
    e4m3_bf16_lut t;
    t.lo0 = _mm512_and_si512(_mm512_slli_epi16(idx0, 4), _mm512_set1_epi8((char)0xF0));
    t.lo1 = _mm512_and_si512(_mm512_slli_epi16(idx1, 4), _mm512_set1_epi8((char)0xF0));
    t.hi0 = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(idx0, 4), _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(0x3C));
    t.hi1 = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(idx1, 4), _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(0x3C));
    t.lo0 = _mm512_mask_blend_epi8(0xFF, t.lo0, sub_lo);
    t.hi0 = _mm512_mask_blend_epi8(0xFF, t.hi0, sub_hi);
    return t;
}

/* One 584-byte entry (or a BF16 row) -> 512 BF16 values (exact; see gather_row for the
 * general path, used when a scale byte or a NaN code would leave the fast path's range). */
static inline void load_entry(const e4m3_bf16_lut *lut, const dsv4_kv_geom *g, int bf16_rows, int64_t slot,
                              uint16_t *dst)
{
    if (bf16_rows) {
        const uint16_t *row = (const uint16_t *)(g->pages + slot * g->page_stride);
        for (int c = 0; c < 16; c++) _mm512_store_si512((__m512i *)(dst + 32 * c), _mm512_loadu_si512(row + 32 * c));
        return;
    }
    const uint8_t *data = dsv4_kv_data(g, slot), *sc = dsv4_kv_scale_row(g, slot);
    const __m512i q0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), q1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int grp = 0; grp < DSV4_KVE_GROUPS; grp++) {
        __m512i c = _mm512_loadu_si512(data + 64 * grp);
        __m512i a = _mm512_and_si512(c, _mm512_set1_epi8(0x7F));
        int b = sc[grp];
        if (b < 10 || b > 246 || _mm512_cmpeq_epi8_mask(a, _mm512_set1_epi8(0x7F))) {
            /* outside the exponent-add range (or NaN codes): through fp32 */
            __m512 s = _mm512_set1_ps(dsv4_e8m0_to_f32((uint8_t)b));
            for (int k = 0; k < 4; k++) {
                __m512 v = _mm512_mul_ps(v512_e4m3_decode(data + 64 * grp + 16 * k), s);
                _mm256_store_si256((__m256i *)(dst + 64 * grp + 16 * k), (__m256i)_mm512_cvtneps_pbh(v));
            }
            continue;
        }
        __m512i lo = _mm512_permutex2var_epi8(lut->lo0, a, lut->lo1);
        __m512i hi = _mm512_or_si512(_mm512_permutex2var_epi8(lut->hi0, a, lut->hi1),
                                     _mm512_and_si512(c, _mm512_set1_epi8((char)0x80)));
        __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
        __m512i o0 = _mm512_permutex2var_epi64(w0, q0, w1), o1 = _mm512_permutex2var_epi64(w0, q1, w1);
        __m512i delta = _mm512_set1_epi16((short)((b - 127) * 128)); /* 2^(b-127): add to the exponent */
        o0 = _mm512_mask_add_epi16(o0, _mm512_test_epi16_mask(o0, _mm512_set1_epi16(0x7FFF)), o0, delta);
        o1 = _mm512_mask_add_epi16(o1, _mm512_test_epi16_mask(o1, _mm512_set1_epi16(0x7FFF)), o1, delta);
        _mm512_store_si512((__m512i *)(dst + 64 * grp), o0);
        _mm512_store_si512((__m512i *)(dst + 64 * grp + 32), o1);
    }
    for (int c = 0; c < 2; c++)
        _mm512_store_si512((__m512i *)(dst + NOPE + 32 * c), _mm512_loadu_si512(data + NOPE + 64 * c));
}

/* Lane i of the result = sum of the lanes of v[i]. */
static inline __m512 reduce16(const __m512 *v)
{
    __m512 r[8], s[4];
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(r[2 * i]), y = _mm512_castps_pd(r[2 * i + 1]);
        s[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x44), _mm512_shuffle_f32x4(s[0], s[1], 0xEE));
    __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x44), _mm512_shuffle_f32x4(s[2], s[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

/* Scores of two heads (qa, qb) against 8 entry rows: lanes 0..7 head a, 8..15 head b. */
static inline __m512 qk_2x8(const uint16_t *qa, const uint16_t *qb, const uint16_t (*kb)[DSV4_KV_DIM])
{
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int c = 0; c < 16; c++) {
        __m512bh q0 = (__m512bh)_mm512_loadu_si512(qa + 32 * c), q1 = (__m512bh)_mm512_loadu_si512(qb + 32 * c);
#pragma GCC unroll 8
        for (int e = 0; e < 8; e++) {
            __m512bh k = (__m512bh)_mm512_load_si512(kb[e] + 32 * c);
            acc[e] = _mm512_dpbf16_ps(acc[e], q0, k);
            acc[8 + e] = _mm512_dpbf16_ps(acc[8 + e], q1, k);
        }
    }
    return reduce16(acc);
}

static inline __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(88.5f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x)); /* NaN passes */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DSV4_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DSV4_LN2_LO), r);
    __m512 p = _mm512_set1_ps(dsv4_exp_poly[0]);
    for (int i = 1; i < 8; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(dsv4_exp_poly[i]));
    return _mm512_scalef_ps(p, n);
}

/* o[h0..h0+G) (permuted dim order, see unit) = o * alpha + sum over entry pairs of p.v. */
static inline __attribute__((always_inline)) void pv_heads(float (*o)[DSV4_KV_DIM], const uint32_t (*vp)[DSV4_KV_DIM],
                                                           const uint32_t (*pp)[BLK / 2], const float *alpha, int h0,
                                                           int G, int npairs, int first)
{
    int rescale = 0; /* once the running maxima settle, alpha is 1 and the rescale is skipped */
    for (int g = 0; g < G; g++) rescale |= alpha[h0 + g] != 1.0f;
    for (int dg = 0; dg < DSV4_KV_DIM / 64; dg++) {
        __m512 acc[4][4];
        for (int g = 0; g < G; g++) {
            __m512 al = _mm512_set1_ps(alpha[h0 + g]);
            for (int c = 0; c < 4; c++) {
                acc[g][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(o[h0 + g] + 64 * dg + 16 * c);
                if (rescale && !first) acc[g][c] = _mm512_mul_ps(acc[g][c], al);
            }
        }
        for (int ep = 0; ep < npairs; ep++) {
            __m512bh v[4];
            for (int c = 0; c < 4; c++) v[c] = (__m512bh)_mm512_load_si512(vp[ep] + 64 * dg + 16 * c);
            for (int g = 0; g < G; g++) {
                __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp[h0 + g][ep]);
                for (int c = 0; c < 4; c++) acc[g][c] = _mm512_dpbf16_ps(acc[g][c], v[c], pb);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) _mm512_store_ps(o[h0 + g] + 64 * dg + 16 * c, acc[g][c]);
    }
}

/* Prefetch the cache lines of the next `n` valid entries after position *pf (advancing *pf), so
 * that the gather latency of the next block overlaps the arithmetic of the current one. */
static inline void prefetch_ahead(const dsv4_attn_unit *u, int64_t *pf, int n)
{
    for (int i = 0; i < n; i++) {
        int s;
        int64_t idx = dsv4_attn_next_slot(u, pf, &s);
        if (idx < 0) return;
        const dsv4_kv_geom *g = &u->scopes[s].cache;
        const char *row = u->bf16_rows ? (const char *)g->pages + idx * g->page_stride
                                       : (const char *)dsv4_kv_data(g, idx);
        for (int l = 0; l < (u->bf16_rows ? 16 : 9); l++) _mm_prefetch(row + 64 * l, _MM_HINT_T0);
        if (!u->bf16_rows) _mm_prefetch((const char *)dsv4_kv_scale_row(g, idx), _MM_HINT_T0);
    }
}

void dsv4_attn_unit_avx512(const dsv4_attn_unit *u, float *part)
{
    const dsv4_attn_args *a = u->a;
    const int nh = (int)u->nh;
    _Alignas(64) uint16_t kb[BLK][DSV4_KV_DIM];
    _Alignas(64) uint32_t vp[BLK / 2][DSV4_KV_DIM]; /* entry pairs interleaved, permuted dims */
    _Alignas(64) float o[DSV4_ATTN_TILE][DSV4_KV_DIM];
    _Alignas(64) float sc[DSV4_ATTN_TILE][BLK];
    _Alignas(64) uint32_t pp[DSV4_ATTN_TILE][BLK / 2];
    float m[DSV4_ATTN_TILE], l[DSV4_ATTN_TILE], alpha[DSV4_ATTN_TILE];
    const uint16_t *qrow[DSV4_ATTN_TILE];
    for (int j = 0; j < nh; j++) {
        qrow[j] = a->q + u->t * a->q_st + (u->h0 + j) * a->q_sh;
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    const e4m3_bf16_lut lut = make_lut();
    const __m512 scale = _mm512_set1_ps(a->scale);
    int64_t p = u->p0, pf = u->p0, count = 0;
    prefetch_ahead(u, &pf, BLK);
    for (int nb = BLK; nb == BLK;) {
        prefetch_ahead(u, &pf, BLK); /* the block after this one */
        int64_t idx[BLK];
        int scope[BLK];
        nb = dsv4_attn_next_slots(u, &p, BLK, idx, scope);
        if (nb == 0) break;
        for (int e = 0; e < nb; e++) load_entry(&lut, &u->scopes[scope[e]].cache, u->bf16_rows, idx[e], kb[e]);
        count += nb;
        for (int e = nb; e < BLK; e++) memset(kb[e], 0, sizeof kb[e]);
        /* scores */
        for (int j = 0; j < nh; j += 2) {
            const uint16_t *qa = qrow[j], *qb = qrow[j + 1 < nh ? j + 1 : j];
            __m512 r0 = qk_2x8(qa, qb, kb), r1 = nb > 8 ? qk_2x8(qa, qb, kb + 8) : _mm512_setzero_ps();
            _mm512_store_ps(sc[j], _mm512_shuffle_f32x4(r0, r1, 0x44));
            if (j + 1 < nh) _mm512_store_ps(sc[j + 1], _mm512_shuffle_f32x4(r0, r1, 0xEE));
        }
        /* online softmax */
        const __mmask16 valid = (__mmask16)((1u << nb) - 1u);
        for (int j = 0; j < nh; j++) {
            __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY),
                                            _mm512_mul_ps(_mm512_load_ps(sc[j]), scale));
            float bm = _mm512_reduce_max_ps(s), mn = bm > m[j] ? bm : m[j];
            alpha[j] = mn == m[j] ? 1.0f : expf(m[j] - mn);
            __m512 pr = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, _mm512_set1_ps(mn))));
            l[j] = l[j] * alpha[j] + _mm512_reduce_add_ps(pr);
            m[j] = mn;
            _mm256_store_si256((__m256i *)pp[j], (__m256i)_mm512_cvtneps_pbh(pr));
        }
        /* entry pairs interleaved for p.v */
        int npairs = (nb + 1) / 2;
        for (int ep = 0; ep < npairs; ep++)
            for (int c = 0; c < DSV4_KV_DIM / 32; c++) {
                __m512i x = _mm512_load_si512(kb[2 * ep] + 32 * c), y = _mm512_load_si512(kb[2 * ep + 1] + 32 * c);
                _mm512_store_si512((__m512i *)(vp[ep] + 32 * c), _mm512_unpacklo_epi16(x, y));
                _mm512_store_si512((__m512i *)(vp[ep] + 32 * c + 16), _mm512_unpackhi_epi16(x, y));
            }
        int j = 0, first = count == nb; /* the first block starts the sums (no zero-fill needed) */
        for (; j + 4 <= nh; j += 4) pv_heads(o, vp, pp, alpha, j, 4, npairs, first);
        switch (nh - j) {
        case 3: pv_heads(o, vp, pp, alpha, j, 3, npairs, first); break;
        case 2: pv_heads(o, vp, pp, alpha, j, 2, npairs, first); break;
        case 1: pv_heads(o, vp, pp, alpha, j, 1, npairs, first); break;
        default: break;
        }
    }
    if (count == 0) memset(o, 0, sizeof(float) * DSV4_KV_DIM * (size_t)nh);
    /* back to natural dim order: within each 32 dims, lo = {0-3, 8-11, 16-19, 24-27},
     * hi = {4-7, 12-15, 20-23, 28-31} */
    const __m512i il = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i ih = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int j = 0; j < nh; j++) {
        float *dst = part + (size_t)j * DSV4_ATTN_PART;
        for (int c = 0; c < DSV4_KV_DIM / 32; c++) {
            __m512 lo = _mm512_load_ps(o[j] + 32 * c), hi = _mm512_load_ps(o[j] + 32 * c + 16);
            _mm512_storeu_ps(dst + 32 * c, _mm512_permutex2var_ps(lo, il, hi));
            _mm512_storeu_ps(dst + 32 * c + 16, _mm512_permutex2var_ps(lo, ih, hi));
        }
        dst[512] = m[j];
        dst[513] = l[j];
        dst[514] = (float)count;
    }
}
