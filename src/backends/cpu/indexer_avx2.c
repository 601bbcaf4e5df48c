/* AVX2 kernels of the indexer family, operation-for-operation equal to the scalar ones (and to
 * the AVX-512 ones): 8-lane registers stand in for the 16 score lanes as a low and a high half,
 * and the exact int8 group dot products use vpmaddubsw + vpmaddwd instead of vpdpbusd. */
#include "backends/cpu/indexer_cpu.h"

#include "backends/cpu/indexer_simd.h"

static inline __m256 v_exp(__m256 x)
{
    __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(DSV4_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DSV4_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DSV4_EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(DSV4_EXP_P0), r, _mm256_set1_ps(DSV4_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DSV4_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DSV4_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DSV4_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(DSV4_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    __m256 alt = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* NaN stays, else 0 */
    return _mm256_blendv_ps(alt, y, ok);
}

static inline __m256 score_row(const float *g, const float *ape, int e)
{
    __m256 s = _mm256_loadu_ps(g + e);
    return ape ? _mm256_add_ps(s, _mm256_loadu_ps(ape + e)) : s;
}

static void pool(int nrows, const float *const *a, const float *const *g, const float *const *ape, int d, float *v)
{
    for (int e = 0; e < d; e += 8) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < nrows; j++) m = _mm256_max_ps(score_row(g[j], ape[j], e), m);
        __m256 den = _mm256_setzero_ps(), num = _mm256_setzero_ps();
        for (int j = 0; j < nrows; j++) {
            __m256 w = v_exp(_mm256_sub_ps(score_row(g[j], ape[j], e), m));
            den = _mm256_add_ps(den, w);
            num = _mm256_add_ps(num, _mm256_mul_ps(w, _mm256_loadu_ps(a[j] + e)));
        }
        _mm256_storeu_ps(v + e, _mm256_div_ps(num, den));
    }
}

static void fwht(float *x, int d)
{
    if (d % 8 || d > 256) {
        dsv4_ix_ref_fwht(x, d);
        return;
    }
    __m256 r[32];
    const int nv = d / 8;
    for (int v = 0; v < nv; v++) r[v] = _mm256_loadu_ps(x + 8 * v);
    for (int h = 1; h < 8; h <<= 1) {
        __m256i idx = _mm256_xor_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(h));
        __m256 hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_and_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(h)), _mm256_setzero_si256()));
        for (int v = 0; v < nv; v++) {
            __m256 p = _mm256_permutevar8x32_ps(r[v], idx);
            r[v] = _mm256_blendv_ps(_mm256_add_ps(r[v], p), _mm256_sub_ps(p, r[v]), hi);
        }
    }
    for (int hv = 1; hv < nv; hv <<= 1)
        for (int i = 0; i < nv; i += 2 * hv)
            for (int j = i; j < i + hv; j++) {
                __m256 a = r[j], b = r[j + hv];
                r[j] = _mm256_add_ps(a, b);
                r[j + hv] = _mm256_sub_ps(a, b);
            }
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(x + 8 * v, r[v]);
}

/* Heads 8*v0 .. 8*(v0+HB)-1 of one candidate, folded into the low / high lane halves. */
static inline __attribute__((always_inline)) void one_heads(const dsv4_ix_qprep *qp, int v0, const int HB,
                                                            const uint8_t *kb, const float *ks, __m256 *lo, __m256 *hi)
{
    const int hpad = qp->hpad, groups = qp->dim / 32, q8 = qp->dim / 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[4];
#pragma GCC unroll 4
    for (int i = 0; i < HB; i++) f[i] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256i a[4];
#pragma GCC unroll 4
        for (int i = 0; i < HB; i++) a[i] = _mm256_load_si256((const __m256i *)(qp->corr + g * hpad + 8 * (v0 + i)));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int m = (j >> 2) * q8 + 4 * g + (j & 3);
            const __m256i b = _mm256_set1_epi32(dsv4_ix_quad(kb + 4 * m));
            const int8_t *qrow = qp->qi + ((size_t)m * hpad + 8 * v0) * 4;
#pragma GCC unroll 4
            for (int i = 0; i < HB; i++) {
                __m256i qv = _mm256_load_si256((const __m256i *)(qrow + 32 * i));
                a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(b, qv), ones));
            }
        }
        const __m256 s = _mm256_set1_ps(ks[g]);
#pragma GCC unroll 4
        for (int i = 0; i < HB; i++) {
            __m256 sq = _mm256_load_ps(qp->qs + g * hpad + 8 * (v0 + i));
            f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_mul_ps(sq, s), f[i]);
        }
    }
    const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < HB; i++) {
        __m256 *l = ((v0 + i) & 1) ? hi : lo; /* heads 16j+8..16j+15 are lanes 8..15 */
        *l = _mm256_fmadd_ps(_mm256_max_ps(f[i], zero), _mm256_load_ps(qp->w + 8 * (v0 + i)), *l);
    }
}

static void score_run(const dsv4_ix_operands *o, int64_t t, const dsv4_ix_qprep *qp, int64_t c0, int64_t n, float *out)
{
    (void)t;
    const int d = o->dim, nv = qp->hpad / 8, groups = d / 32;
    _Alignas(32) uint8_t kb[DSV4_IX_MAX_DIM];
    float ks[DSV4_IX_MAX_DIM / 32];
    for (int64_t i = 0; i < n; i++) {
        dsv4_ix_decode_k(o->k + (c0 + i) * o->ld_k, d, kb);
        for (int g = 0; g < groups; g++) ks[g] = dsv4_ix_half_scale(o->k_scales[(c0 + i) * o->ld_ks + g]);
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int v = 0; v < nv; v += 4) { /* nv is even: hpad is a multiple of 16 */
            if (nv - v >= 4) one_heads(qp, v, 4, kb, ks, &lo, &hi);
            else one_heads(qp, v, 2, kb, ks, &lo, &hi);
        }
        __m256 r8 = _mm256_add_ps(lo, hi);
        __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
        __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
        out[i] = _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
    }
}

const dsv4_ix_kernels dsv4_ix_kernels_avx2 = {pool, fwht, score_run, 1};
