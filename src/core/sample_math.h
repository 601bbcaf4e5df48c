/* The arithmetic of sampling that every backend must reproduce bit for bit (core/sample.h, the cpu
 * backends; src/backends/cuda/sample_cuda.cu, the device): the generator (splitmix64 seeding,
 * xoshiro256**, 53-bit uniforms), and exp and -log built from IEEE double +, -, *, / in a fixed
 * order (no libm: glibc's and CUDA's exp and log1p differ in the last bit on some inputs). Device
 * code uses the _rn intrinsics, which are never contracted into an FMA; host code relies on ISO C
 * (CMAKE_C_EXTENSIONS OFF: GCC then contracts nothing). Accuracy: within a few ulps of the true
 * values (Taylor and atanh series cut below 1e-17), which is all sampling needs; what matters is
 * that both sides compute the same bits. Header-only, for C and CUDA alike. */
#ifndef DSV4_CORE_SAMPLE_MATH_H
#define DSV4_CORE_SAMPLE_MATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DSV4_SM static __host__ __device__ __forceinline__
#else
#define DSV4_SM static inline
#endif

#if defined(__CUDA_ARCH__)
#define DSV4_SM_ADD(a, b) __dadd_rn((a), (b))
#define DSV4_SM_SUB(a, b) __dsub_rn((a), (b))
#define DSV4_SM_MUL(a, b) __dmul_rn((a), (b))
#define DSV4_SM_DIV(a, b) __ddiv_rn((a), (b))
#else
#define DSV4_SM_ADD(a, b) ((a) + (b))
#define DSV4_SM_SUB(a, b) ((a) - (b))
#define DSV4_SM_MUL(a, b) ((a) * (b))
#define DSV4_SM_DIV(a, b) ((a) / (b))
#endif

/* Ids per block of the softmax's sum: each block summed in id order, the block sums in block order. */
#define DSV4_SAMPLE_SUM_BLOCK 128
/* Probabilities at or above 2^-29 are multiples of 2^-52, so any sum of them below 2 is exact in
 * double, in any order: the top-p nucleus is decided among them only (docs/engine.md §7). */
#define DSV4_SAMPLE_P_EXACT 0x1p-29f

DSV4_SM uint64_t dsv4_sm_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

DSV4_SM uint64_t dsv4_sm_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**: the output, and the state advanced (a linear map over GF(2)^256). */
DSV4_SM uint64_t dsv4_sm_next(uint64_t s[4])
{
    const uint64_t r = dsv4_sm_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = dsv4_sm_rotl(s[3], 45);
    return r;
}

/* In [0, 1), 53 random bits (exact). */
DSV4_SM double dsv4_sm_uniform(uint64_t s[4]) { return (double)(dsv4_sm_next(s) >> 11) * 0x1p-53; }

DSV4_SM uint64_t dsv4_sm_bits(double x)
{
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
#endif
}

DSV4_SM double dsv4_sm_double(uint64_t u)
{
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double x;
    memcpy(&x, &u, 8);
    return x;
#endif
}

/* 2^k for k in [-1022, 1023]. */
DSV4_SM double dsv4_sm_pow2(int k) { return dsv4_sm_double((uint64_t)(k + 1023) << 52); }

#define DSV4_SM_LN2_HI 0x1.62e42fee00000p-1
#define DSV4_SM_LN2_LO 1.90821492927058770002e-10

/* e^x for x <= 0 (0 below -746, -Inf included): x = k ln2 + r, |r| <= ln2/2, a degree-13 Taylor
 * polynomial of e^r, times 2^k (in two exact steps below 2^-1022: one rounding). */
DSV4_SM double dsv4_sm_exp(double x)
{
    if (!(x > -746.0)) return 0.0;
    double kd = DSV4_SM_ADD(DSV4_SM_MUL(x, 0x1.71547652b82fep0), 0.5); /* x / ln2 + 1/2 */
    kd = (double)(int64_t)kd - ((double)(int64_t)kd > kd ? 1.0 : 0.0); /* floor, exact */
    const int k = (int)kd;
    const double r = DSV4_SM_SUB(DSV4_SM_SUB(x, DSV4_SM_MUL(kd, DSV4_SM_LN2_HI)), DSV4_SM_MUL(kd, DSV4_SM_LN2_LO));
#define DSV4_SM_H(p, c) p = DSV4_SM_ADD(DSV4_SM_MUL(p, r), c)
    double p = 1.6059043836821613e-10; /* 1/13!, then Horner down to 1/0! */
    DSV4_SM_H(p, 2.08767569878681e-09);
    DSV4_SM_H(p, 2.505210838544172e-08);
    DSV4_SM_H(p, 2.755731922398589e-07);
    DSV4_SM_H(p, 2.7557319223985893e-06);
    DSV4_SM_H(p, 2.48015873015873e-05);
    DSV4_SM_H(p, 0.0001984126984126984);
    DSV4_SM_H(p, 0.001388888888888889);
    DSV4_SM_H(p, 0.008333333333333333);
    DSV4_SM_H(p, 0.041666666666666664);
    DSV4_SM_H(p, 0.16666666666666666);
    DSV4_SM_H(p, 0.5);
    DSV4_SM_H(p, 1.0);
    DSV4_SM_H(p, 1.0);
#undef DSV4_SM_H
    if (k >= -1022) return DSV4_SM_MUL(p, dsv4_sm_pow2(k));
    return DSV4_SM_MUL(DSV4_SM_MUL(p, dsv4_sm_pow2(k + 600)), dsv4_sm_pow2(-600));
}

/* -log(w) for w in (0, 1] as +0 or more (the Exp(1) draw of a uniform u: w = 1 - u, exact):
 * w = 2^e f, f in [sqrt(1/2), sqrt(2)), log f = 2 atanh((f-1)/(f+1)) through s^23. */
DSV4_SM double dsv4_sm_neg_log(double w)
{
    const uint64_t b = dsv4_sm_bits(w);
    int e = (int)(b >> 52) - 1023; /* w is normal: w >= 2^-53 */
    double f = dsv4_sm_double((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    if (f > 1.4142135623730951) {
        f = DSV4_SM_MUL(f, 0.5);
        e++;
    }
    const double s = DSV4_SM_DIV(DSV4_SM_SUB(f, 1.0), DSV4_SM_ADD(f, 1.0)), z = DSV4_SM_MUL(s, s);
#define DSV4_SM_H(q, c) q = DSV4_SM_ADD(DSV4_SM_MUL(q, z), c)
    double q = 0.043478260869565216; /* 1/23, then Horner down to 1/1 */
    DSV4_SM_H(q, 0.047619047619047616);
    DSV4_SM_H(q, 0.05263157894736842);
    DSV4_SM_H(q, 0.058823529411764705);
    DSV4_SM_H(q, 0.06666666666666667);
    DSV4_SM_H(q, 0.07692307692307693);
    DSV4_SM_H(q, 0.09090909090909091);
    DSV4_SM_H(q, 0.1111111111111111);
    DSV4_SM_H(q, 0.14285714285714285);
    DSV4_SM_H(q, 0.2);
    DSV4_SM_H(q, 0.3333333333333333);
    DSV4_SM_H(q, 1.0);
#undef DSV4_SM_H
    const double lf = DSV4_SM_MUL(DSV4_SM_MUL(2.0, s), q), ed = (double)e;
    const double lw = DSV4_SM_ADD(DSV4_SM_MUL(ed, DSV4_SM_LN2_HI), DSV4_SM_ADD(DSV4_SM_MUL(ed, DSV4_SM_LN2_LO), lf));
    return DSV4_SM_SUB(0.0, lw); /* 0 - (+-0) is +0: a draw of u = 0 is E = +0, p / E = +Inf */
}

#endif
