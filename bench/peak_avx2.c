/* The fp32 FMA peak with 256-bit FMAs (bench_fma_peak on a machine without AVX-512):
 * independent chains per thread. Compiled for AVX2 only; called after the run-time check. */
#include "bench.h"

#include <immintrin.h>

#define CHAINS 12

double bench_fma_peak_avx2(int threads, long iters)
{
    double t0 = bench_now();
    float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m256 acc[CHAINS];
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps((float)c * 1e-3f);
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (long i = 0; i < iters; i++)
            for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
        __m256 s = acc[0];
        for (int c = 1; c < CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
        float t[8];
        _mm256_storeu_ps(t, s);
        for (int i = 0; i < 8; i++) sink += t[i];
    }
    double dt = bench_now() - t0;
    volatile float keep = sink;
    (void)keep;
    return (double)threads * (double)iters * CHAINS * 8 * 2 / dt * 1e-9;
}

