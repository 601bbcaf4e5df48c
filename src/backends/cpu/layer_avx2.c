/* AVX2 layer kernels: the AVX-512 file's structure on 8 lanes (block b of 8 goes to accumulator
 * b mod 4); partial blocks go through a zero-padded stack copy. hc_wsum / hc_post are
 * bit-identical to the scalar reference. */
#include "backends/cpu/cpu_layer.h"
#include "backends/cpu/simd_avx2.h"
#include "formats/codec.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 ld(const void *p, int bf16, int64_t i, int64_t left)
{
    if (left >= 8)
        return bf16 ? v256_bf16_decode((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
    float tmp[8] = {0};
    for (int64_t k = 0; k < left; k++)
        tmp[k] = bf16 ? dsv4_bf16_to_f32(((const uint16_t *)p)[i + k]) : ((const float *)p)[i + k];
    return _mm256_loadu_ps(tmp);
}

INLINE void st(void *p, int bf16, int64_t i, __m256 v, int64_t left)
{
    if (left >= 8) {
        if (bf16)
            _mm_storeu_si128((__m128i *)((uint16_t *)p + i), v256_bf16_encode(v));
        else
            _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    for (int64_t k = 0; k < left; k++) {
        if (bf16)
            ((uint16_t *)p)[i + k] = dsv4_bf16_from_f32(tmp[k]);
        else
            ((float *)p)[i + k] = tmp[k];
    }
}

INLINE float reduce4(const __m256 *a)
{
    __m256 s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

static float sumsq(const void *x, int bf16, int64_t n)
{
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int u = 0; u < 4; u++) {
            __m256 v = ld(x, bf16, i + 8 * u, 8);
            a[u] = _mm256_fmadd_ps(v, v, a[u]);
        }
    for (int u = 0; i < n; i += 8, u++) {
        __m256 v = ld(x, bf16, i, n - i);
        a[u] = _mm256_fmadd_ps(v, v, a[u]);
    }
    return reduce4(a);
}

static void scale_row(const void *x, int x_bf16, int64_t n, float r, const void *w, int w_bf16, void *y, int y_bf16)
{
    const __m256 rv = _mm256_set1_ps(r);
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_mul_ps(ld(x, x_bf16, i, n - i), rv);
        if (w) v = _mm256_mul_ps(v, ld(w, w_bf16, i, n - i));
        st(y, y_bf16, i, v, n - i);
    }
}

INLINE void dots_impl(const void *w, const int wb, const void *const *x, const int xb, const int NT, int64_t n,
                      float *out)
{
    __m256 a[DSV4_DOTS_MAX_ROWS][4];
    for (int t = 0; t < NT; t++)
        for (int u = 0; u < 4; u++) a[t][u] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int u = 0; u < 4; u++) {
            __m256 wv = ld(w, wb, i + 8 * u, 8);
            for (int t = 0; t < NT; t++) a[t][u] = _mm256_fmadd_ps(wv, ld(x[t], xb, i + 8 * u, 8), a[t][u]);
        }
    for (int u = 0; i < n; i += 8, u++) {
        __m256 wv = ld(w, wb, i, n - i);
        for (int t = 0; t < NT; t++) a[t][u] = _mm256_fmadd_ps(wv, ld(x[t], xb, i, n - i), a[t][u]);
    }
    for (int t = 0; t < NT; t++) out[t] = reduce4(a[t]);
}

DSV4_DEFINE_DOTS(dots, dots_impl)

static void hc_wsum(const uint16_t *x, int64_t sj, int n, const float *c, uint16_t *y, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 8) {
        __m256 s = _mm256_mul_ps(_mm256_set1_ps(c[0]), ld(x, 1, d, d1 - d));
        for (int j = 1; j < n; j++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(c[j]), ld(x, 1, j * sj + d, d1 - d)));
        st(y, 1, d, s, d1 - d);
    }
}

static void hc_post(const uint16_t *x, const uint16_t *r, int64_t sr, int n, const float *post, const float *comb,
                    int64_t cj, uint16_t *out, int64_t so, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 8) {
        __m256 xv = ld(x, 1, d, d1 - d), rv[DSV4_HC_MAX];
        for (int j = 0; j < n; j++) rv[j] = ld(r, 1, j * sr + d, d1 - d);
        for (int k = 0; k < n; k++) {
            __m256 s = _mm256_mul_ps(_mm256_set1_ps(post[k]), xv);
            for (int j = 0; j < n; j++) s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(comb[j * cj + k]), rv[j]));
            st(out, 1, k * so + d, s, d1 - d);
        }
    }
}

/* e^x within ~2 ulp of expf for x in [-87.3, 88.3] (Cephes polynomial); clamped outside, so the
 * result stays a normal float (silu then gives a value within 1e-36 of expf's). */
INLINE __m256 v_exp(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i pow2k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2k));
}

static void swiglu_row(const uint16_t *g, const uint16_t *u, int64_t n, float limit, float w, uint16_t *h)
{
    const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit), wv = _mm256_set1_ps(w);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256 gv = _mm256_min_ps(lim, ld(g, 1, i, n - i)); /* second operand on NaN: NaN stays */
        __m256 uv = _mm256_max_ps(nlim, _mm256_min_ps(lim, ld(u, 1, i, n - i)));
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, v_exp(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        st(h, 1, i, _mm256_mul_ps(_mm256_mul_ps(silu, uv), wv), n - i);
    }
}

static void sum_rows(const uint16_t *const *rows, int nrows, const uint16_t *shared, uint16_t *y, int64_t d0,
                     int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int r = 0; r < nrows; r++) s = _mm256_add_ps(s, ld(rows[r], 1, d, d1 - d));
        if (shared) s = _mm256_add_ps(s, ld(shared, 1, d, d1 - d));
        st(y, 1, d, s, d1 - d);
    }
}

static void add_row(const uint16_t *a, const uint16_t *b, int64_t n, uint16_t *y)
{
    for (int64_t i = 0; i < n; i += 8) {
        __m256 va = ld(a, 1, i, n - i), s = _mm256_add_ps(va, ld(b, 1, i, n - i));
        st(y, 1, i, _mm256_blendv_ps(s, va, _mm256_cmp_ps(va, va, _CMP_UNORD_Q)), n - i);
    }
}

const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_avx2 = {sumsq,   scale_row,  dots,     hc_wsum,
                                                             hc_post, swiglu_row, sum_rows, add_row};
