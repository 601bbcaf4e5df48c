/* AVX-512 (+VNNI) kernels of the indexer family, operation-for-operation equal to the scalar
 * ones in indexer_ref.c (the tests compare them bit for bit).
 *
 * Scoring: lanes are 16 heads. A candidate's 64 packed bytes become 128 unsigned bytes 2k+12
 * (a nibble lookup), and each group of 32 products is one exact int32 per head from 8 vpdpbusd
 * (4 broadcast key bytes x 16 heads x 4 query bytes), started from -12 x the query's group sum
 * to undo the +12. Two candidates share every query load. */
#include "backends/cpu/indexer_cpu.h"

#include "backends/cpu/indexer_simd.h"

static inline __m512 v_exp(__m512 x)
{
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GT_OQ);
    __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(DSV4_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DSV4_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DSV4_EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(DSV4_EXP_P0), r, _mm512_set1_ps(DSV4_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DSV4_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DSV4_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DSV4_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DSV4_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    __m512 alt = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x); /* NaN stays, else 0 */
    return _mm512_mask_blend_ps(ok, alt, y);
}

static inline __m512 score_row(const float *g, const float *ape, int e)
{
    __m512 s = _mm512_loadu_ps(g + e);
    return ape ? _mm512_add_ps(s, _mm512_loadu_ps(ape + e)) : s;
}

static void pool(int nrows, const float *const *a, const float *const *g, const float *const *ape, int d, float *v)
{
    for (int e = 0; e < d; e += 16) { /* d is a multiple of 64 */
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < nrows; j++) m = _mm512_max_ps(score_row(g[j], ape[j], e), m);
        __m512 den = _mm512_setzero_ps(), num = _mm512_setzero_ps();
        for (int j = 0; j < nrows; j++) {
            __m512 w = v_exp(_mm512_sub_ps(score_row(g[j], ape[j], e), m));
            den = _mm512_add_ps(den, w);
            num = _mm512_add_ps(num, _mm512_mul_ps(w, _mm512_loadu_ps(a[j] + e)));
        }
        _mm512_storeu_ps(v + e, _mm512_div_ps(num, den));
    }
}

static void fwht(float *x, int d)
{
    if (d % 16 || d > 256) {
        dsv4_ix_ref_fwht(x, d);
        return;
    }
    __m512 r[16];
    const int nv = d / 16;
    for (int v = 0; v < nv; v++) r[v] = _mm512_loadu_ps(x + 16 * v);
    for (int h = 1; h < 16; h <<= 1) { /* within a register: lane i pairs with lane i ^ h */
        __m512i idx = _mm512_xor_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                       _mm512_set1_epi32(h));
        __mmask16 hi = 0;
        for (int i = 0; i < 16; i++) hi |= (__mmask16)((i & h) ? 1u << i : 0);
        for (int v = 0; v < nv; v++) {
            __m512 p = _mm512_permutexvar_ps(idx, r[v]);
            r[v] = _mm512_mask_blend_ps(hi, _mm512_add_ps(r[v], p), _mm512_sub_ps(p, r[v]));
        }
    }
    for (int hv = 1; hv < nv; hv <<= 1)
        for (int i = 0; i < nv; i += 2 * hv)
            for (int j = i; j < i + hv; j++) {
                __m512 a = r[j], b = r[j + hv];
                r[j] = _mm512_add_ps(a, b);
                r[j + hv] = _mm512_sub_ps(a, b);
            }
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(x + 16 * v, r[v]);
}

static inline float lane_tree(__m512 l)
{
    __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(l), _mm512_extractf32x8_ps(l, 1));
    __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

/* Heads 16*hv0 .. 16*(hv0+HB)-1 of two candidates, folded into their lanes. */
static inline __attribute__((always_inline)) void pair_heads(const dsv4_ix_qprep *qp, int hv0, const int HB,
                                                             const uint8_t *kb0, const uint8_t *kb1, const float *ks0,
                                                             const float *ks1, __m512 *lanes0, __m512 *lanes1)
{
    const int hpad = qp->hpad, groups = qp->dim / 32, q8 = qp->dim / 8;
    __m512 f0[4], f1[4];
#pragma GCC unroll 4
    for (int i = 0; i < HB; i++) f0[i] = f1[i] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i a0[4], a1[4];
#pragma GCC unroll 4
        for (int i = 0; i < HB; i++) a0[i] = a1[i] = _mm512_load_si512(qp->corr + g * hpad + 16 * (hv0 + i));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int m = (j >> 2) * q8 + 4 * g + (j & 3);
            const __m512i b0 = _mm512_set1_epi32(dsv4_ix_quad(kb0 + 4 * m));
            const __m512i b1 = _mm512_set1_epi32(dsv4_ix_quad(kb1 + 4 * m));
            const int8_t *qrow = qp->qi + ((size_t)m * hpad + 16 * hv0) * 4;
#pragma GCC unroll 4
            for (int i = 0; i < HB; i++) {
                __m512i qv = _mm512_load_si512(qrow + 64 * i);
                a0[i] = _mm512_dpbusd_epi32(a0[i], b0, qv);
                a1[i] = _mm512_dpbusd_epi32(a1[i], b1, qv);
            }
        }
        const __m512 s0 = _mm512_set1_ps(ks0[g]), s1 = _mm512_set1_ps(ks1[g]);
#pragma GCC unroll 4
        for (int i = 0; i < HB; i++) {
            __m512 sq = _mm512_load_ps(qp->qs + g * hpad + 16 * (hv0 + i));
            f0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[i]), _mm512_mul_ps(sq, s0), f0[i]);
            f1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[i]), _mm512_mul_ps(sq, s1), f1[i]);
        }
    }
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < HB; i++) {
        __m512 w = _mm512_load_ps(qp->w + 16 * (hv0 + i));
        *lanes0 = _mm512_fmadd_ps(_mm512_max_ps(f0[i], zero), w, *lanes0);
        *lanes1 = _mm512_fmadd_ps(_mm512_max_ps(f1[i], zero), w, *lanes1);
    }
}

static void score_run(const dsv4_ix_operands *o, int64_t t, const dsv4_ix_qprep *qp, int64_t c0, int64_t n, float *out)
{
    (void)t;
    const int d = o->dim, nv = qp->hpad / 16, groups = d / 32;
    _Alignas(64) uint8_t kb0[DSV4_IX_MAX_DIM], kb1[DSV4_IX_MAX_DIM];
    float ks0[DSV4_IX_MAX_DIM / 32], ks1[DSV4_IX_MAX_DIM / 32];
    for (int64_t i = 0; i < n; i += 2) {
        const int64_t ca = c0 + i, cb = i + 1 < n ? ca + 1 : ca;
        dsv4_ix_decode_k(o->k + ca * o->ld_k, d, kb0);
        dsv4_ix_decode_k(o->k + cb * o->ld_k, d, kb1);
        for (int g = 0; g < groups; g++) {
            ks0[g] = dsv4_ix_half_scale(o->k_scales[ca * o->ld_ks + g]);
            ks1[g] = dsv4_ix_half_scale(o->k_scales[cb * o->ld_ks + g]);
        }
        __m512 l0 = _mm512_setzero_ps(), l1 = _mm512_setzero_ps();
        for (int hv = 0; hv < nv; hv += 4) {
            switch (nv - hv < 4 ? nv - hv : 4) {
            case 1: pair_heads(qp, hv, 1, kb0, kb1, ks0, ks1, &l0, &l1); break;
            case 2: pair_heads(qp, hv, 2, kb0, kb1, ks0, ks1, &l0, &l1); break;
            case 3: pair_heads(qp, hv, 3, kb0, kb1, ks0, ks1, &l0, &l1); break;
            default: pair_heads(qp, hv, 4, kb0, kb1, ks0, ks1, &l0, &l1); break;
            }
        }
        out[i] = lane_tree(l0);
        if (i + 1 < n) out[i + 1] = lane_tree(l1);
    }
}

const dsv4_ix_kernels dsv4_ix_kernels_avx512 = {pool, fwht, score_run, 1};
