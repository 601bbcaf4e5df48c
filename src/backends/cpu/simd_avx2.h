/* AVX2 versions of the formats/codec.h rules, bit-identical to them. Include only from
 * *_avx2.c files. */
#ifndef DSV4_SIMD_AVX2_H
#define DSV4_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#define V256_I(x) _mm256_set1_epi32((int)(x))

/* 8 floats -> 8 E4M3 codes in the low 8 bytes. */
static inline __m128i v256_e4m3_encode(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), V256_I(0x80));
    __m256i a = _mm256_and_si256(u, V256_I(0x7FFFFFFF)); /* non-negative: signed compares are safe */
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, V256_I(0x7FFFF)),
                                 _mm256_and_si256(_mm256_srli_epi32(a, 20), V256_I(1)));
    __m256i c = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), V256_I(120 << 3));
    __m256i cs = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f))); /* MXCSR: RNE */
    c = _mm256_blendv_epi8(c, cs, _mm256_cmpgt_epi32(V256_I(0x3C800000), a));
    c = _mm256_blendv_epi8(c, V256_I(0x7E), _mm256_cmpgt_epi32(a, V256_I(0x43E00000 - 1)));
    c = _mm256_blendv_epi8(c, V256_I(0x7F), _mm256_cmpgt_epi32(a, V256_I(0x7F800000)));
    c = _mm256_or_si256(c, sign);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    return _mm_packus_epi16(w, w);
}

static inline __m256 v256_e4m3_decode_epi32(__m256i c)
{
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, V256_I(0x80)), 24);
    __m256i em = _mm256_and_si256(c, V256_I(0x7F));
    __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 20), V256_I(120u << 23));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
    __m256i v = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), _mm256_cmpgt_epi32(V256_I(8), em));
    v = _mm256_blendv_epi8(v, V256_I(0x7FC00000), _mm256_cmpeq_epi32(em, V256_I(0x7F)));
    return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

static inline __m256 v256_e4m3_decode(const uint8_t *p)
{
    return v256_e4m3_decode_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m128i v256_bf16_encode(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, V256_I(0x7FFF)),
                                                   _mm256_and_si256(_mm256_srli_epi32(u, 16), V256_I(1))), 16);
    __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), V256_I(0x8000)), V256_I(0x7FC0));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, V256_I(0x7FFFFFFF)), V256_I(0x7F800000));
    __m256i v = _mm256_blendv_epi8(r, q, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

static inline __m256 v256_bf16_decode(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 E8M0 scale bytes -> fp32, as dsv4_e8m0_to_f32: byte << 23, byte 0 the subnormal 2^-127,
 * byte 255 NaN. */
static inline __m256 v256_e8m0_decode(const uint8_t *p)
{
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i v = _mm256_slli_epi32(b, 23);
    v = _mm256_blendv_epi8(v, V256_I(0x00400000), _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    v = _mm256_blendv_epi8(v, V256_I(0x7FC00000), _mm256_cmpeq_epi32(b, V256_I(255)));
    return _mm256_castsi256_ps(v);
}

#endif
