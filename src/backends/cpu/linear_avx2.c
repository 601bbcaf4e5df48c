/* AVX2 linear kernels (no BF16 dot products): weights decoded to fp32 (exact), staged BF16
 * activations widened to fp32 (exact), fp32 FMAs; each 32- or 128-element block sum is scaled
 * by its weight scale with one FMA. Tiles of 1 x 4 or 2 x 2 outputs share the decoding; per
 * output the operation sequence is fixed, so results do not depend on the tiling or the thread
 * count. */
#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/simd_avx2.h"
#include "formats/codec.h"

#include <math.h>

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

/* 8 BF16 or F32 weights (the unscaled formats) as fp32. */
static inline __m256 plain8(dsv4_linear_format fmt, const void *w, int64_t k)
{
    return fmt == DSV4_LINEAR_BF16 ? bf16x8((const uint16_t *)w + k) : _mm256_loadu_ps((const float *)w + k);
}

static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 E4M3 codes as two fp32 vectors times 2^-8: a code's byte, sign-extended to 16 bits and
 * shifted left by 7, is the FP16 number with the code's sign, its 4-bit exponent in the low end of
 * FP16's 5-bit field and its 3-bit mantissa on top of FP16's, i.e. the code's value times 2^-8
 * (subnormal codes land on FP16 subnormals, also exactly; bit 14 is cleared); F16C widens it
 * exactly. NaN codes would come out finite: *nan collects them for the caller. */
static inline void e4m3x16(const uint8_t *p, __m256 *lo, __m256 *hi, __m128i *nan)
{
    const __m128i c = _mm_loadu_si128((const __m128i *)p);
    const __m128i low7 = _mm_set1_epi8(0x7F);
    *nan = _mm_or_si128(*nan, _mm_cmpeq_epi8(_mm_and_si128(c, low7), low7));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(c), 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* The block-scaled formats (FP8 128-blocks, MXFP8, FP4 32-blocks), MT activation rows x NT weight
 * rows: each weight block is decoded once for the MT rows; per output, one 8-lane partial sum per
 * block over K in order, scaled by the block's scale into an 8-lane total (FP8 partial sums, taken
 * at 2^-8 scale, are multiplied back by 256 first, exactly), whatever the tile shape. */
static inline __attribute__((always_inline)) void tile_blocks(const dsv4_lin_tile *t,
                                                               float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT,
                                                               const int NT)
{
    const int fp8 = t->fmt != DSV4_LINEAR_FP4;
    const int64_t wb = t->fmt == DSV4_LINEAR_FP8_B128 ? 128 : 32;
    __m256 acc[DSV4_LIN_MT][DSV4_LIN_NT];
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < t->k; b0 += wb) {
        const int64_t end = t->k - b0 < wb ? t->k : b0 + wb;
        __m256 p[DSV4_LIN_MT][DSV4_LIN_NT];
        __m128i nan[DSV4_LIN_NT];
        for (int j = 0; j < NT; j++) {
            nan[j] = _mm_setzero_si128();
            for (int i = 0; i < MT; i++) p[i][j] = _mm256_setzero_ps();
        }
        for (int64_t k = b0; k < end; k += 16) {
            __m256 alo[DSV4_LIN_MT], ahi[DSV4_LIN_MT];
            for (int i = 0; i < MT; i++) {
                alo[i] = bf16x8((const uint16_t *)t->act[i] + k);
                ahi[i] = bf16x8((const uint16_t *)t->act[i] + k + 8);
            }
            for (int j = 0; j < NT; j++) {
                __m256 wlo, whi;
                if (fp8) {
                    e4m3x16((const uint8_t *)t->w[j] + k, &wlo, &whi, &nan[j]);
                } else {
                    wlo = fp4x8((const uint8_t *)t->w[j] + k / 2);
                    whi = fp4x8((const uint8_t *)t->w[j] + k / 2 + 4);
                }
                for (int i = 0; i < MT; i++) {
                    p[i][j] = _mm256_fmadd_ps(alo[i], wlo, p[i][j]);
                    p[i][j] = _mm256_fmadd_ps(ahi[i], whi, p[i][j]);
                }
            }
        }
        for (int j = 0; j < NT; j++) {
            const __m256 sc = _mm256_set1_ps(dsv4_e8m0_to_f32(t->s[j][(b0 / wb) * t->ss1]));
            const int has_nan = fp8 && !_mm_testz_si128(nan[j], nan[j]);
            for (int i = 0; i < MT; i++) {
                __m256 v = fp8 ? _mm256_mul_ps(p[i][j], _mm256_set1_ps(256.0f)) : p[i][j];
                if (has_nan) v = _mm256_set1_ps(NAN); /* a NaN weight makes the row's products NaN */
                acc[i][j] = _mm256_fmadd_ps(v, sc, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) out[i][j] = hsum(acc[i][j]);
}

/* BF16 / F32 weights, MT x NT: the x rows (BF16 or F32) read once per tile; per output one 8-lane
 * sum over K in order, as dot() does. */
static inline __attribute__((always_inline)) void tile_plain(const dsv4_lin_tile *t,
                                                              float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT,
                                                              const int NT)
{
    __m256 acc[DSV4_LIN_MT][DSV4_LIN_NT];
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < t->k; k += 8) {
        __m256 x[DSV4_LIN_MT];
        for (int i = 0; i < MT; i++)
            x[i] = t->x_bf16 ? bf16x8((const uint16_t *)t->act[i] + k) : _mm256_loadu_ps((const float *)t->act[i] + k);
        for (int j = 0; j < NT; j++) {
            const __m256 w = plain8(t->fmt, t->w[j], k);
            for (int i = 0; i < MT; i++) acc[i][j] = _mm256_fmadd_ps(x[i], w, acc[i][j]);
        }
    }
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) out[i][j] = hsum(acc[i][j]);
}

/* One activation row x four weight rows, or two x two for M > 1 (weights decoded once for both). */
static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    (void)fmt;
    *mt = m > 1 ? 2 : 1;
    *nt = m > 1 ? 2 : 4;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    const int blocks = t->fmt <= DSV4_LINEAR_FP4;
    if (t->mt == 1) blocks ? tile_blocks(t, out, 1, 4) : tile_plain(t, out, 1, 4);
    else blocks ? tile_blocks(t, out, 2, 2) : tile_plain(t, out, 2, 2);
}

static void stage_group(const uint8_t *codes, int len, float scale, uint16_t *dst)
{
    const __m256 s = _mm256_set1_ps(scale);
    for (int i = 0; i < len; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), v256_bf16_encode(_mm256_mul_ps(v256_e4m3_decode(codes + i), s)));
}

const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx2 = {1, shape, tile, stage_group, NULL, NULL};
