/* AVX2 linear kernels (no BF16 dot products): weights decoded to fp32 (exact), staged BF16
 * activations widened to fp32 (exact), fp32 FMAs; each 32- or 128-element block sum is scaled
 * by its weight scale with one FMA. One output at a time; per output the operation sequence is
 * fixed, so results do not depend on the tiling or the thread count. */
#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/simd_avx2.h"
#include "formats/codec.h"

static inline __m256 bf16x8(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 4 packed bytes -> 8 E2M1 values in K order. */
static inline __m256 fp4x8(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    const __m128i b = _mm_cvtsi32_si128(v);
    __m256i d = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b)); /* b0 b0 b1 b1 ... */
    d = _mm256_and_si256(_mm256_srlv_epi32(d, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), V256_I(0xF));
    const __m256 mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), d);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(d, V256_I(8)), 28)));
}

static inline __m256 weight8(dsv4_linear_format fmt, const void *w, int64_t k)
{
    switch (fmt) {
    case DSV4_LINEAR_FP4: return fp4x8((const uint8_t *)w + k / 2);
    case DSV4_LINEAR_BF16: return bf16x8((const uint16_t *)w + k);
    case DSV4_LINEAR_F32: return _mm256_loadu_ps((const float *)w + k);
    default: return v256_e4m3_decode((const uint8_t *)w + k);
    }
}

static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot(const dsv4_lin_tile *t, const void *act, const void *w, const uint8_t *s)
{
    __m256 acc = _mm256_setzero_ps();
    if (t->fmt > DSV4_LINEAR_FP4) {
        for (int64_t k = 0; k < t->k; k += 8) {
            const __m256 x = t->x_bf16 ? bf16x8((const uint16_t *)act + k) : _mm256_loadu_ps((const float *)act + k);
            acc = _mm256_fmadd_ps(x, weight8(t->fmt, w, k), acc);
        }
        return hsum(acc);
    }
    const int64_t wb = t->fmt == DSV4_LINEAR_FP8_B128 ? 128 : 32;
    for (int64_t b0 = 0; b0 < t->k; b0 += wb) {
        const int64_t end = t->k - b0 < wb ? t->k : b0 + wb;
        __m256 p = _mm256_setzero_ps();
        for (int64_t k = b0; k < end; k += 8)
            p = _mm256_fmadd_ps(bf16x8((const uint16_t *)act + k), weight8(t->fmt, w, k), p);
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(dsv4_e8m0_to_f32(s[(b0 / wb) * t->ss1])), acc);
    }
    return hsum(acc);
}

static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    *mt = 1;
    *nt = 4;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    for (int i = 0; i < t->mt; i++)
        for (int j = 0; j < t->nt; j++) out[i][j] = dot(t, t->act[i], t->w[j], t->s[j]);
}

static void stage_group(const uint8_t *codes, int len, float scale, uint16_t *dst)
{
    const __m256 s = _mm256_set1_ps(scale);
    for (int i = 0; i < len; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), v256_bf16_encode(_mm256_mul_ps(v256_e4m3_decode(codes + i), s)));
}

const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx2 = {1, shape, tile, stage_group, NULL, NULL};
