/* One read pass of the bandwidth probe (bench_bandwidth.c) with 256-bit loads: eight independent
 * XOR chains over 256 bytes a step, optionally with a software prefetch of every line `far` bytes
 * ahead into L2. Compiled for AVX2 only; called after the run-time check. */
#include "bench.h"

#include <immintrin.h>

uint64_t bench_read_pass_avx2(const void *p, size_t bytes, size_t far)
{
    const char *c = p;
    __m256i a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        if (far)
            for (int j = 0; j < 4; j++) _mm_prefetch(c + i + far + 64 * j, _MM_HINT_T1);
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_xor_si256(a[j], _mm256_load_si256((const __m256i *)(const void *)(c + i + 32 * j)));
    }
    for (int j = 1; j < 8; j++) a[0] = _mm256_xor_si256(a[0], a[j]);
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, a[0]);
    uint64_t r = t[0] ^ t[1] ^ t[2] ^ t[3];
    for (; i < bytes; i++) r ^= (uint64_t)(unsigned char)c[i];
    return r;
}
