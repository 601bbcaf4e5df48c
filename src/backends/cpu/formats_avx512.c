/* AVX-512 format kernels; bit-identical to the scalar reference (tests/python/test_formats.py). */
#include "backends/cpu/cpu_formats.h"
#include "backends/cpu/simd_avx512.h"
#include "formats/codec.h"

static void encode_span(dsv4_scalar_format fmt, const float *x, int64_t n, void *codes)
{
    int64_t i = 0;
    if (fmt == DSV4_FMT_E4M3) {
        uint8_t *o = codes;
        for (; i + 16 <= n; i += 16) _mm_storeu_si128((__m128i *)(o + i), v512_e4m3_encode(_mm512_loadu_ps(x + i)));
    } else if (fmt == DSV4_FMT_BF16) {
        uint16_t *o = codes;
        for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(o + i), v512_bf16_encode(_mm512_loadu_ps(x + i)));
    } else if (fmt == DSV4_FMT_E2M1) {
        uint8_t *o = codes;
        for (; i + 16 <= n; i += 16) _mm_storeu_si128((__m128i *)(o + i), v512_e2m1_encode(_mm512_loadu_ps(x + i)));
    }
    size_t cs = fmt == DSV4_FMT_BF16 ? 2 : 1;
    dsv4_ref_encode_span(fmt, x + i, n - i, (char *)codes + (size_t)i * cs);
}

static void decode_span(dsv4_scalar_format fmt, const void *codes, int64_t n, float *x)
{
    int64_t i = 0;
    if (fmt == DSV4_FMT_E4M3) {
        const uint8_t *c = codes;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, v512_e4m3_decode(c + i));
    } else if (fmt == DSV4_FMT_BF16) {
        const uint16_t *c = codes;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, v512_bf16_decode(c + i));
    } else if (fmt == DSV4_FMT_E2M1) {
        const uint8_t *c = codes;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, v512_e2m1_decode(c + i));
    }
    size_t cs = fmt == DSV4_FMT_BF16 ? 2 : 1;
    dsv4_ref_decode_span(fmt, (const char *)codes + (size_t)i * cs, n - i, x + i);
}

static void quantize_row(dsv4_qrule rule, const float *x, int64_t k, uint8_t *codes, uint8_t *scales)
{
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    const int g = p->group;
    const __m512 absmask = _mm512_castsi512_ps(V512_I(0x7FFFFFFF));
    for (int64_t b = 0; b < k / g; b++) {
        const float *xb = x + b * g;
        __m512 m = _mm512_setzero_ps();
        /* max(|x|, m): the second operand wins on NaN, so NaN elements are skipped */
        for (int i = 0; i < g; i += 16) m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + i), absmask), m);
        int e = dsv4_qrule_exponent(p, _mm512_reduce_max_ps(m));
        __m512 inv = _mm512_set1_ps(dsv4_pow2f(-e));
        for (int i = 0; i < g; i += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + i), inv);
            _mm_storeu_si128((__m128i *)(codes + b * g + i), p->fp4 ? v512_e2m1_encode(v) : v512_e4m3_encode(v));
        }
        scales[b] = (uint8_t)(e + 127);
    }
}

static void dequantize_row(dsv4_qrule rule, const uint8_t *codes, const uint8_t *scales, int64_t k, float *x)
{
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    for (int64_t b = 0; b < k / p->group; b++) {
        __m512 s = _mm512_set1_ps(dsv4_e8m0_to_f32(scales[b]));
        for (int i = 0; i < p->group; i += 16) {
            int64_t j = b * p->group + i;
            __m512 v = p->fp4 ? v512_e2m1_decode(codes + j) : v512_e4m3_decode(codes + j);
            _mm512_storeu_ps(x + j, _mm512_mul_ps(v, s));
        }
    }
}

static void dequant_fp8_b128_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out)
{
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512 s = _mm512_set1_ps(dsv4_e8m0_to_f32(srow[(j / 128) * ss1])); /* 16 | 128: one block per vector */
        _mm512_storeu_ps(out + j, _mm512_mul_ps(v512_e4m3_decode(w + j), s));
    }
    for (; j < k; j++) out[j] = dsv4_e4m3_to_f32(w[j]) * dsv4_e8m0_to_f32(srow[(j / 128) * ss1]);
}

static void dequant_fp4_g32_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out)
{
    for (int64_t j = 0; j < k; j += 16) { /* k is a multiple of 32 */
        __m512 s = _mm512_set1_ps(dsv4_e8m0_to_f32(srow[(j / 32) * ss1]));
        _mm512_storeu_ps(out + j, _mm512_mul_ps(v512_e2m1_decode_packed8(w + j / 2), s));
    }
}

const dsv4_cpu_format_kernels dsv4_cpu_format_kernels_avx512 = {
    encode_span, decode_span, quantize_row, dequantize_row, dequant_fp8_b128_row, dequant_fp4_g32_row,
};
