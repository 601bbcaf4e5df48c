/* AVX-512 layer kernels. Sums use four accumulators over 16-lane blocks (block b goes to
 * accumulator b mod 4) reduced in a fixed order; hc_wsum / hc_post use separate multiplies and
 * adds in the scalar order, so they are bit-identical to the scalar reference. */
#include "backends/cpu/cpu_layer.h"
#include "backends/cpu/simd_avx512.h"

#define INLINE static inline __attribute__((always_inline))
#define FULL ((__mmask16)0xFFFF)

INLINE __mmask16 mask_for(int64_t left) { return left >= 16 ? FULL : (__mmask16)((1u << left) - 1u); }

INLINE __m512 ld(const void *p, int bf16, int64_t i, __mmask16 m)
{
    if (bf16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

INLINE void st(void *p, int bf16, int64_t i, __m512 v, __mmask16 m)
{
    if (bf16)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, v512_bf16_encode(v));
    else
        _mm512_mask_storeu_ps((float *)p + i, m, v);
}

INLINE float reduce4(const __m512 *a)
{
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

static float sumsq(const void *x, int bf16, int64_t n)
{
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int u = 0; u < 4; u++) {
            __m512 v = ld(x, bf16, i + 16 * u, FULL);
            a[u] = _mm512_fmadd_ps(v, v, a[u]);
        }
    for (int u = 0; i < n; i += 16, u++) {
        __m512 v = ld(x, bf16, i, mask_for(n - i));
        a[u] = _mm512_fmadd_ps(v, v, a[u]);
    }
    return reduce4(a);
}

static void scale_row(const void *x, int x_bf16, int64_t n, float r, const void *w, int w_bf16, void *y, int y_bf16)
{
    const __m512 rv = _mm512_set1_ps(r);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mask_for(n - i);
        __m512 v = _mm512_mul_ps(ld(x, x_bf16, i, m), rv);
        if (w) v = _mm512_mul_ps(v, ld(w, w_bf16, i, m));
        st(y, y_bf16, i, v, m);
    }
}

/* NT dot products sharing each load of w; the order of every dot is independent of NT. */
INLINE void dots_impl(const void *w, const int wb, const void *const *x, const int xb, const int NT, int64_t n,
                      float *out)
{
    __m512 a[DSV4_DOTS_MAX_ROWS][4];
    for (int t = 0; t < NT; t++)
        for (int u = 0; u < 4; u++) a[t][u] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int u = 0; u < 4; u++) {
            __m512 wv = ld(w, wb, i + 16 * u, FULL);
            for (int t = 0; t < NT; t++) a[t][u] = _mm512_fmadd_ps(wv, ld(x[t], xb, i + 16 * u, FULL), a[t][u]);
        }
    for (int u = 0; i < n; i += 16, u++) {
        __mmask16 m = mask_for(n - i);
        __m512 wv = ld(w, wb, i, m);
        for (int t = 0; t < NT; t++) a[t][u] = _mm512_fmadd_ps(wv, ld(x[t], xb, i, m), a[t][u]);
    }
    for (int t = 0; t < NT; t++) out[t] = reduce4(a[t]);
}

DSV4_DEFINE_DOTS(dots, dots_impl)

static void hc_wsum(const uint16_t *x, int64_t sj, int n, const float *c, uint16_t *y, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 16) {
        __mmask16 m = mask_for(d1 - d);
        __m512 s = _mm512_mul_ps(_mm512_set1_ps(c[0]), ld(x, 1, d, m));
        for (int j = 1; j < n; j++) s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(c[j]), ld(x, 1, j * sj + d, m)));
        st(y, 1, d, s, m);
    }
}

static void hc_post(const uint16_t *x, const uint16_t *r, int64_t sr, int n, const float *post, const float *comb,
                    int64_t cj, uint16_t *out, int64_t so, int64_t d0, int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 16) {
        __mmask16 m = mask_for(d1 - d);
        __m512 xv = ld(x, 1, d, m), rv[DSV4_HC_MAX];
        for (int j = 0; j < n; j++) rv[j] = ld(r, 1, j * sr + d, m);
        for (int k = 0; k < n; k++) {
            __m512 s = _mm512_mul_ps(_mm512_set1_ps(post[k]), xv);
            for (int j = 0; j < n; j++) s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(comb[j * cj + k]), rv[j]));
            st(out, 1, k * so + d, s, m);
        }
    }
}

/* e^x within ~2 ulp of expf (Cephes polynomial on [-ln2/2, ln2/2]); scalef gives +Inf above ~88.7
 * and 0 below ~-103.9, as expf does. */
INLINE __m512 v_exp(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(e, k);
}

static void swiglu_row(const uint16_t *g, const uint16_t *u, int64_t n, float limit, float w, uint16_t *h)
{
    const __m512 lim = _mm512_set1_ps(limit), nlim = _mm512_set1_ps(-limit), wv = _mm512_set1_ps(w);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mask_for(n - i);
        __m512 gv = _mm512_min_ps(lim, ld(g, 1, i, m)); /* second operand on NaN: NaN stays */
        __m512 uv = _mm512_max_ps(nlim, _mm512_min_ps(lim, ld(u, 1, i, m)));
        __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, v_exp(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        st(h, 1, i, _mm512_mul_ps(_mm512_mul_ps(silu, uv), wv), m);
    }
}

static void sum_rows(const uint16_t *const *rows, int nrows, const uint16_t *shared, uint16_t *y, int64_t d0,
                     int64_t d1)
{
    for (int64_t d = d0; d < d1; d += 16) {
        __mmask16 m = mask_for(d1 - d);
        __m512 s = _mm512_setzero_ps();
        for (int r = 0; r < nrows; r++) s = _mm512_add_ps(s, ld(rows[r], 1, d, m));
        if (shared) s = _mm512_add_ps(s, ld(shared, 1, d, m));
        st(y, 1, d, s, m);
    }
}

static void add_row(const uint16_t *a, const uint16_t *b, int64_t n, uint16_t *y)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mask_for(n - i);
        __m512 va = ld(a, 1, i, m), s = _mm512_add_ps(va, ld(b, 1, i, m));
        st(y, 1, i, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(va, va, _CMP_UNORD_Q), s, va), m);
    }
}

const dsv4_cpu_layer_kernels dsv4_cpu_layer_kernels_avx512 = {sumsq,   scale_row,  dots,     hc_wsum,
                                                               hc_post, swiglu_row, sum_rows, add_row};
