/* Pieces shared by the AVX2 and AVX-512 indexer kernels (AVX2 instructions only). Include only
 * from indexer_avx2.c / indexer_avx512.c. */
#ifndef DSV4_CPU_INDEXER_SIMD_H
#define DSV4_CPU_INDEXER_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* d/2 packed FP4 bytes -> d unsigned bytes 2k+12 in [0, 24]: low nibbles (even elements) first,
 * then high nibbles (odd elements), the order of dsv4_ix_qprep's quads. */
static inline void dsv4_ix_decode_k(const uint8_t *kc, int d, uint8_t *kb)
{
    const __m256i tbl = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                         18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < d / 2; j += 32) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(kc + j));
        _mm256_store_si256((__m256i *)(kb + j), _mm256_shuffle_epi8(tbl, _mm256_and_si256(b, low)));
        _mm256_store_si256((__m256i *)(kb + d / 2 + j),
                           _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(b, 4), low)));
    }
}

/* Four bytes as one int32 (for a broadcast). */
static inline int32_t dsv4_ix_quad(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#endif
