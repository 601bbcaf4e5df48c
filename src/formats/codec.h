/* The one owner of every scalar number-format rule (docs/contracts.md §2-§4, docs/formats.md).
 * Header-only so kernels inline them; vectorized kernels must stay bit-identical to these.
 * Depends on nothing but the C library. */
#ifndef DSV4_FORMATS_CODEC_H
#define DSV4_FORMATS_CODEC_H

#include <stdint.h>
#include <string.h>

/* The functions marked DSV4_CODEC_FN are plain arithmetic that CUDA kernels call too (through
 * src/backends/cuda/cuda_device.cuh): one definition of the rule for host and device. */
#ifdef __CUDACC__
#define DSV4_CODEC_FN static __host__ __device__ __forceinline__
#else
#define DSV4_CODEC_FN static inline
#endif

DSV4_CODEC_FN uint32_t dsv4_f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
DSV4_CODEC_FN float dsv4_bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* 2^k as a float for k in [-149, 127] (exact; subnormal below -126). */
static inline float dsv4_pow2f(int k)
{
    if (k >= -126) return dsv4_bits_f32((uint32_t)(k + 127) << 23);
    return dsv4_bits_f32(1u << (k + 149));
}

/* ---- E4M3FN ------------------------------------------------------------------------------ */
static inline uint8_t dsv4_e4m3_from_f32(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7F;           /* NaN */
    if (a >= 0x43E00000u) return sign | 0x7E;          /* >= 448 or Inf: saturate */
    if (a < 0x3C800000u) {                             /* < 2^-6: subnormal step 2^-9 */
        /* a * 2^9 is exact; round half to even by hand (no dependence on the FP mode). */
        float s = dsv4_bits_f32(a) * 512.0f;
        uint32_t i = (uint32_t)s;
        float frac = s - (float)i;
        if (frac > 0.5f || (frac == 0.5f && (i & 1u))) i++;
        return sign | (uint8_t)i;                      /* i == 8 is the smallest normal, 2^-6 */
    }
    uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);      /* round mantissa to 3 bits, ties to even */
    return sign | (uint8_t)((r >> 20) - (120u << 3));  /* rebias 127 -> 7 */
}

static inline float dsv4_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t e = (c >> 3) & 0xF, m = c & 7;
    if ((c & 0x7F) == 0x7F) return dsv4_bits_f32(sign | 0x7FC00000u);
    if (e == 0) {
        float v = (float)m * (1.0f / 512.0f);
        return sign ? -v : v;
    }
    return dsv4_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* ---- BF16 -------------------------------------------------------------------------------- */
static inline uint16_t dsv4_bf16_from_f32(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u); /* canonical quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float dsv4_bf16_to_f32(uint16_t b) { return dsv4_bits_f32((uint32_t)b << 16); }
/* Round a float through BF16 and back. */
static inline float dsv4_bf16_round(float x) { return dsv4_bf16_to_f32(dsv4_bf16_from_f32(x)); }

/* ---- E2M1 -------------------------------------------------------------------------------- */
static const float dsv4_e2m1_table[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

DSV4_CODEC_FN uint8_t dsv4_e2m1_from_f32(float x)
{
    uint32_t u = dsv4_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0;     /* NaN -> +0 (no NaN code) */
    uint8_t sign = (uint8_t)((u >> 28) & 0x8);
    float a = dsv4_bits_f32(u & 0x7FFFFFFFu);
    uint8_t c;                                         /* midpoints go to the even code */
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return sign | c;
}
static inline float dsv4_e2m1_to_f32(uint8_t c) { return dsv4_e2m1_table[c & 0xF]; }

/* ---- E8M0 -------------------------------------------------------------------------------- */
static inline float dsv4_e8m0_to_f32(uint8_t b)
{
    if (b == 255) return dsv4_bits_f32(0x7FC00000u);
    return dsv4_pow2f((int)b - 127);
}

/* ---- scale rules ------------------------------------------------------------------------- */
typedef struct dsv4_qrule_params {
    int group;
    float max_code;
    float amax_floor;
    float quot_floor; /* 0: none */
    int fp4;          /* codes are E2M1 instead of E4M3 */
} dsv4_qrule_params;

/* Indexed by dsv4_qrule (include/dsv4/formats.h). */
static const dsv4_qrule_params dsv4_qrules[4] = {
    {64, 448.0f, 1e-4f, 0.0f, 0},
    {128, 448.0f, 1e-4f, 0.0f, 0},
    {32, 448.0f, 1e-10f, 1e-10f, 0},
    {32, 6.0f, 6.0f * 1.17549435e-38f /* 6 * 2^-126 */, 0.0f, 1},
};

/* ceil(log2(y)) for a positive normal float or +Inf (-> 128), exactly from its bits. */
static inline int dsv4_ceil_log2_bits(float y)
{
    uint32_t u = dsv4_f32_bits(y);
    int e = (int)((u >> 23) & 0xFF) - 127;
    return e + ((u & 0x7FFFFFu) != 0);
}

/* Exponent e of a group's scale 2^e, given its amax before flooring (NaN-free, >= 0). */
static inline int dsv4_qrule_exponent(const dsv4_qrule_params *p, float amax)
{
    if (!(amax >= p->amax_floor)) amax = p->amax_floor;
    float y = amax / p->max_code;
    if (y < p->quot_floor) y = p->quot_floor;
    int e = dsv4_ceil_log2_bits(y);
    if (e < -127) e = -127;
    if (e > 128) e = 128;
    return e;
}

/* Max |x| over n floats; NaN elements are skipped (as fmaxf-based reductions do). */
static inline float dsv4_absmax(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (a > m) m = a;
    }
    return m;
}

/* Quantize one group: returns the scale byte, writes n codes. */
static inline uint8_t dsv4_quantize_group(const dsv4_qrule_params *p, const float *x, int n, uint8_t *codes)
{
    int e = dsv4_qrule_exponent(p, dsv4_absmax(x, n));
    float inv = dsv4_pow2f(-e); /* exact power of two, so x * inv == x / scale exactly */
    if (p->fp4)
        for (int i = 0; i < n; i++) codes[i] = dsv4_e2m1_from_f32(x[i] * inv);
    else
        for (int i = 0; i < n; i++) codes[i] = dsv4_e4m3_from_f32(x[i] * inv);
    return (uint8_t)(e + 127);
}

#endif
