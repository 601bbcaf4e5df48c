/* AVX-512 versions of the formats/codec.h rules, bit-identical to them (tests check every
 * code). Include only from *_avx512.c files, which are compiled for AVX-512. */
#ifndef DSV4_SIMD_AVX512_H
#define DSV4_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#define V512_I(x) _mm512_set1_epi32((int)(x))

/* 16 floats -> 16 E4M3 codes (RNE, saturating, NaN -> 0x7F with sign). */
static inline __m128i v512_e4m3_encode(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), V512_I(0x80));
    __m512i a = _mm512_and_si512(u, V512_I(0x7FFFFFFF));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, V512_I(0x7FFFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(a, 20), V512_I(1)));
    __m512i c = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), V512_I(120 << 3));
    __m512 s = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f));
    __m512i cs = _mm512_cvt_roundps_epi32(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a, V512_I(0x3C800000)), c, cs);
    c = _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(a, V512_I(0x43E00000)), c, V512_I(0x7E));
    c = _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(a, V512_I(0x7F800000)), c, V512_I(0x7F));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(c, sign));
}

/* 16 E4M3 codes (as 32-bit lanes, 0..255) -> 16 floats, exact. */
static inline __m512 v512_e4m3_decode_epi32(__m512i c)
{
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, V512_I(0x80)), 24);
    __m512i em = _mm512_and_si512(c, V512_I(0x7F));
    __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 20), V512_I(120u << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(1.0f / 512.0f));
    __m512i v = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(em, V512_I(8)), normal, _mm512_castps_si512(sub));
    v = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(em, V512_I(0x7F)), v, V512_I(0x7FC00000));
    return _mm512_castsi512_ps(_mm512_or_si512(v, sign));
}

/* decode(encode(x)) without the codes, for |x| <= 448 or NaN (inputs already scaled into the E4M3
 * range, as after a block scale): RNE to 3 mantissa bits, below 2^-6 to a multiple of 2^-9
 * (E4M3 subnormals). Bit-identical to the codec on that domain; a NaN stays a (quiet) NaN. */
static inline __m512 v512_e4m3_round(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, V512_I(0x7FFFF)), _mm512_and_si512(_mm512_srli_epi32(u, 20), V512_I(1)));
    __m512 normal = _mm512_castsi512_ps(_mm512_and_si512(r, V512_I(0xFFF00000u)));
    __m512 sub = _mm512_roundscale_ps(x, (9 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 a = _mm512_abs_ps(x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_NGE_UQ), normal, sub);
}

static inline __m512 v512_e4m3_decode(const uint8_t *p)
{
    return v512_e4m3_decode_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 floats -> 16 BF16 (RNE, NaN -> canonical quiet NaN with its sign). */
static inline __m256i v512_bf16_encode(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, V512_I(0x7FFF)),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), V512_I(1))), 16);
    __m512i q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), V512_I(0x8000)), V512_I(0x7FC0));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, V512_I(0x7FFFFFFF)), V512_I(0x7F800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

static inline __m512 v512_bf16_decode(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 16 E8M0 scale bytes (as 32-bit lanes, 0..255) -> 2^(b-127); 0 -> 2^-127 (subnormal), 255 -> NaN. */
static inline __m512 v512_e8m0_decode_epi32(__m512i b)
{
    __m512i v = _mm512_slli_epi32(b, 23);
    v = _mm512_mask_mov_epi32(v, _mm512_testn_epi32_mask(b, b), V512_I(0x00400000));
    v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(b, V512_I(255)), V512_I(0x7FC00000));
    return _mm512_castsi512_ps(v);
}

/* 2^k as a vector (k in the normal range). */
static inline __m512 v512_pow2(int k) { return _mm512_castsi512_ps(V512_I((uint32_t)(k + 127) << 23)); }

/* 16 floats -> 16 E2M1 codes (one per byte): nearest, ties to the even code, saturating,
 * NaN -> +0. The code of |x| is the number of midpoints it passes (>= at ties that round up). */
static inline __m128i v512_e2m1_encode(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512 a = _mm512_castsi512_ps(_mm512_and_si512(u, V512_I(0x7FFFFFFF)));
    __m512i c = _mm512_setzero_si512(), one = V512_I(1);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), c, one);
    __mmask16 num = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
    c = _mm512_maskz_or_epi32(num, c, _mm512_and_si512(_mm512_srli_epi32(u, 28), V512_I(8)));
    return _mm512_cvtepi32_epi8(c);
}

/* 16 E2M1 codes (one per byte) -> 16 floats. */
static inline __m512 v512_e2m1_decode(const uint8_t *p)
{
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                        -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), table);
}

/* 16 E2M1 nibbles (8 packed bytes, low nibble first) -> 16 floats. */
static inline __m512 v512_e2m1_decode_packed8(const uint8_t *p)
{
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                        -2.0f, -3.0f, -4.0f, -6.0f);
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    return _mm512_permutexvar_ps(idx, table);
}

#endif
