/* One read pass of the bandwidth probe (bench_bandwidth.c) with 512-bit loads: eight independent
 * XOR chains over 512 bytes a step, optionally with a software prefetch of every line `far` bytes
 * ahead into L2 (the distance the linear kernels use, src/backends/cpu/linear_avx512.c). Compiled
 * for AVX-512 only; called after the run-time check. */
#include "bench.h"

#include <immintrin.h>

uint64_t bench_read_pass_avx512(const void *p, size_t bytes, size_t far)
{
    const char *c = p;
    __m512i a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_si512();
    size_t i = 0;
    if (far)
        for (; i + 512 <= bytes; i += 512) {
            for (int j = 0; j < 8; j++) _mm_prefetch(c + i + far + 64 * j, _MM_HINT_T1);
            for (int j = 0; j < 8; j++) a[j] = _mm512_xor_si512(a[j], _mm512_load_si512((const void *)(c + i + 64 * j)));
        }
    else
        for (; i + 512 <= bytes; i += 512)
            for (int j = 0; j < 8; j++) a[j] = _mm512_xor_si512(a[j], _mm512_load_si512((const void *)(c + i + 64 * j)));
    for (int j = 1; j < 8; j++) a[0] = _mm512_xor_si512(a[0], a[j]);
    uint64_t r = (uint64_t)_mm512_reduce_or_epi64(a[0]);
    for (; i < bytes; i++) r ^= (uint64_t)(unsigned char)c[i];
    return r;
}
