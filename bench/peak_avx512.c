/* FMA peak of this machine: independent chains of 512-bit FMAs per thread (AVX-512 when
 * present, else the 256-bit AVX2 FMAs of bench/peak_avx2.c, a unit compiled for AVX2 only: in
 * this one the compiler may give 256-bit code AVX-512 encodings), and the vdpbf16ps peak
 * (AVX-512 BF16). */
#include "bench.h"
#include "dsv4.h"

#include <immintrin.h>
#include <string.h>

#define CHAINS 12
/* the best of many short runs (~3 ms each): on a shared machine one of them finds the cores free */
#define PEAK_REPS 24
#define PEAK_ITERS 400000L

/* dot = 0: vfmadd (2 FLOP per lane); dot = 1: vdpbf16ps, 16 lanes x 2 BF16 products summed into
 * fp32 per instruction (4 FLOP per lane), the instruction the FP8 / FP4 / BF16 linear kernels
 * run on (src/backends/cpu/linear_avx512.c). */
static double peak512(int threads, long iters, int dot)
{
    double t0 = bench_now();
    float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m512 acc[CHAINS];
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c * 1e-3f);
        const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
        const __m512bh ah = _mm512_cvtne2ps_pbh(b, b), bh = _mm512_cvtne2ps_pbh(b, b);
        if (dot)
            for (long i = 0; i < iters; i++)
                for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], ah, bh);
        else
            for (long i = 0; i < iters; i++)
                for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
        __m512 s = acc[0];
        for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
        sink += _mm512_reduce_add_ps(s);
    }
    double dt = bench_now() - t0;
    volatile float keep = sink;
    (void)keep;
    return (double)threads * (double)iters * CHAINS * 16 * (dot ? 4 : 2) / dt * 1e-9;
}

double bench_dot_peak(int threads)
{
    if (strcmp(dsv4_cpu_isa(), "avx512+bf16")) return bench_fma_peak(threads);
    double best = 0.0;
    for (int r = 0; r < PEAK_REPS; r++) {
        double g = peak512(threads, PEAK_ITERS, 1);
        if (g > best) best = g;
    }
    return best;
}

double bench_fma_peak(int threads)
{
    const char *isa = dsv4_cpu_isa();
    int wide = strncmp(isa, "avx512", 6) == 0;
    double best = 0.0;
    for (int r = 0; r < PEAK_REPS; r++) {
        double g = wide ? peak512(threads, PEAK_ITERS, 0) : bench_fma_peak_avx2(threads, PEAK_ITERS);
        if (g > best) best = g;
    }
    return best;
}
