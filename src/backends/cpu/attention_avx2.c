/* The decode unit for AVX2 + FMA machines without AVX-512 BF16 (this file is compiled with those
 * flags and runs only after the run-time check). Everything is fp32: blocks of BLK entries are
 * dequantized once into an fp32 tile shared by the unit's heads; Q K^T runs two heads x four
 * entries per pass (eight accumulators, FMA-bound), then the online softmax of the block (a
 * vector exp, P rounded to BF16 for P.V and the sum kept in fp32, as the reference), then P V
 * eight output vectors at a time with P broadcast from memory. */
#include "backends/cpu/cpu_attention.h"

#include "formats/codec.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define BLK 8

/* FP8 entry -> fp32, exact. A code's sign and 7 low bits placed as fp32 bits (sign to 31,
 * exponent and mantissa to 20..26) are its value times 2^-120 (subnormal codes land on fp32
 * subnormals, also exactly: nothing here sets DAZ); one multiply by 2^(b - 7) makes the
 * product with the group's scale 2^(b - 127), exact for b in [8, 134], where every value is
 * also a BF16 value. Other scale bytes and NaN codes take the reference's read. */
static void load_fp8(const dsv4_kv_geom *g, int64_t idx, float *out)
{
    const uint8_t *data = dsv4_kv_data(g, idx), *scl = dsv4_kv_scale_row(g, idx);
    int fast = 1;
    for (int grp = 0; grp < 7; grp++) fast &= scl[grp] >= 8 && scl[grp] <= 134;
    const __m256i low7 = _mm256_set1_epi8(0x7F);
    for (int c = 0; c < 448 / 32 && fast; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(data + 32 * c));
        fast = !_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(v, low7), low7));
    }
    if (!fast) {
        dsv4_ref_kv_read(g, 0, idx, out);
        return;
    }
    const __m256i sign = _mm256_set1_epi32(0x80), mag = _mm256_set1_epi32(0x7F);
    for (int grp = 0; grp < 7; grp++) {
        const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)(scl[grp] + 120) << 23)));
        for (int i = 0; i < 8; i++) {
            __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(data + 64 * grp + 8 * i)));
            __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(x, sign), 24),
                                           _mm256_slli_epi32(_mm256_and_si256(x, mag), 20));
            _mm256_store_ps(out + 64 * grp + 8 * i, _mm256_mul_ps(_mm256_castsi256_ps(bits), f));
        }
    }
    const uint16_t *rope = (const uint16_t *)(data + 448);
    for (int i = 0; i < 8; i++) {
        __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(rope + 8 * i)));
        _mm256_store_ps(out + 448 + 8 * i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
}

static void load_bf16(const uint16_t *src, float *out)
{
    for (int i = 0; i < DSV4_KV_DIM / 8; i++) {
        __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 8 * i)));
        _mm256_store_ps(out + 8 * i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sc[0..3] and sc[BLK..BLK+3] = q_a . k[0..3] and q_b . k[0..3] */
static inline void qk_2x4(const float *qa, const float *qb, const float (*k)[DSV4_KV_DIM], float *sa, float *sb)
{
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int d = 0; d < DSV4_KV_DIM; d += 8) {
        const __m256 a = _mm256_load_ps(qa + d), b = _mm256_load_ps(qb + d);
        for (int e = 0; e < 4; e++) {
            const __m256 kv = _mm256_load_ps(k[e] + d);
            acc[e] = _mm256_fmadd_ps(a, kv, acc[e]);
            acc[4 + e] = _mm256_fmadd_ps(b, kv, acc[4 + e]);
        }
    }
    for (int e = 0; e < 4; e++) {
        sa[e] = hsum8(acc[e]);
        sb[e] = hsum8(acc[4 + e]);
    }
}

/* exp(x) for x <= 0 (the softmax's arguments; NaN passes): degree-7 polynomial on the reduced
 * argument, within a few ulp of expf; arguments below -87 give ~1e-38 (callers zero masked lanes). */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DSV4_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DSV4_LN2_LO), r);
    __m256 p = _mm256_set1_ps(dsv4_exp_poly[0]);
    for (int i = 1; i < 8; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(dsv4_exp_poly[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* fp32 -> nearest-even BF16 -> fp32 (finite, non-negative inputs: the probabilities) */
static inline __m256 bf16_round8(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* o = o * alpha + sum over the block's nb entries of p[e] * k[e] (64 dims per pass) */
static inline void pv_head(float *o, const float (*k)[DSV4_KV_DIM], const float *p, int nb, float alpha)
{
    const __m256 al = _mm256_set1_ps(alpha);
    for (int d0 = 0; d0 < DSV4_KV_DIM; d0 += 64) {
        __m256 acc[8];
        for (int c = 0; c < 8; c++) {
            acc[c] = _mm256_loadu_ps(o + d0 + 8 * c);
            if (alpha != 1.0f) acc[c] = _mm256_mul_ps(acc[c], al);
        }
        for (int e = 0; e < nb; e++) {
            const __m256 pe = _mm256_broadcast_ss(p + e);
            for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(pe, _mm256_load_ps(k[e] + d0 + 8 * c), acc[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
    }
}

void dsv4_attn_unit_avx2(const dsv4_attn_unit *u, float *part)
{
    const dsv4_attn_args *a = u->a;
    const int nh = (int)u->nh;
    _Alignas(32) float q[DSV4_ATTN_TILE + 1][DSV4_KV_DIM]; /* + a spare: heads go in pairs */
    _Alignas(32) float k[BLK][DSV4_KV_DIM];
    _Alignas(32) float sc[DSV4_ATTN_TILE + 1][BLK];
    _Alignas(32) float pb[BLK];
    float m[DSV4_ATTN_TILE], l[DSV4_ATTN_TILE];
    for (int j = 0; j < nh; j++) {
        load_bf16(a->q + u->t * a->q_st + (u->h0 + j) * a->q_sh, q[j]);
        memset(part + (size_t)j * DSV4_ATTN_PART, 0, DSV4_KV_DIM * sizeof(float)); /* o accumulates in place */
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    if (nh & 1) memcpy(q[nh], q[nh - 1], sizeof q[nh]); /* the spare's scores are not used */
    const __m256 scale = _mm256_set1_ps(a->scale);
    int64_t p = u->p0, count = 0;
    for (int nb = BLK; nb == BLK;) {
        int64_t idx[BLK];
        int scope[BLK];
        nb = dsv4_attn_next_slots(u, &p, BLK, idx, scope);
        if (nb == 0) break;
        for (int e = 0; e < nb; e++) {
            const dsv4_kv_geom *g = &u->scopes[scope[e]].cache;
            if (u->bf16_rows) load_bf16((const uint16_t *)((const uint8_t *)g->pages + idx[e] * g->page_stride), k[e]);
            else load_fp8(g, idx[e], k[e]);
        }
        count += nb;
        for (int e = nb; e < BLK; e++) memset(k[e], 0, sizeof k[e]);
        for (int j = 0; j < nh; j += 2)
            for (int e0 = 0; e0 < nb; e0 += 4)
                qk_2x4(q[j], q[j + 1], (const float(*)[DSV4_KV_DIM])k + e0, sc[j] + e0, sc[j + 1] + e0);
        const __m256 valid = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        for (int j = 0; j < nh; j++) {
            const __m256 s =
                _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_mul_ps(_mm256_load_ps(sc[j]), scale), valid);
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float bm = _mm_cvtss_f32(h), mn = bm > m[j] ? bm : m[j];
            const float alpha = mn == m[j] ? 1.0f : expf(m[j] - mn);
            const __m256 pr = _mm256_and_ps(valid, exp256(_mm256_sub_ps(s, _mm256_set1_ps(mn))));
            l[j] = l[j] * alpha + hsum8(pr);
            m[j] = mn;
            _mm256_store_ps(pb, bf16_round8(pr));
            pv_head(part + (size_t)j * DSV4_ATTN_PART, (const float(*)[DSV4_KV_DIM])k, pb, nb, alpha);
        }
    }
    for (int j = 0; j < nh; j++) {
        float *dst = part + (size_t)j * DSV4_ATTN_PART;
        dst[512] = m[j];
        dst[513] = l[j];
        dst[514] = (float)count;
    }
}
