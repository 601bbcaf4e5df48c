/* Scalar reference kernels of the format family (backend "cpu-ref"). Plain loops over the
 * codec of formats/codec.h; rows in parallel where that changes nothing but speed. */
#include "backends/cpu/cpu_formats.h"
#include "formats/codec.h"

void dsv4_ref_encode_span(dsv4_scalar_format fmt, const float *x, int64_t n, void *codes)
{
    if (fmt == DSV4_FMT_BF16) {
        uint16_t *o = codes;
        for (int64_t i = 0; i < n; i++) o[i] = dsv4_bf16_from_f32(x[i]);
    } else if (fmt == DSV4_FMT_E2M1) {
        uint8_t *o = codes;
        for (int64_t i = 0; i < n; i++) o[i] = dsv4_e2m1_from_f32(x[i]);
    } else {
        uint8_t *o = codes;
        for (int64_t i = 0; i < n; i++) o[i] = dsv4_e4m3_from_f32(x[i]);
    }
}

void dsv4_ref_decode_span(dsv4_scalar_format fmt, const void *codes, int64_t n, float *x)
{
    const uint8_t *c = codes;
    switch (fmt) {
    case DSV4_FMT_BF16:
        for (int64_t i = 0; i < n; i++) x[i] = dsv4_bf16_to_f32(((const uint16_t *)codes)[i]);
        break;
    case DSV4_FMT_E2M1:
        for (int64_t i = 0; i < n; i++) x[i] = dsv4_e2m1_to_f32(c[i]);
        break;
    case DSV4_FMT_E8M0:
        for (int64_t i = 0; i < n; i++) x[i] = dsv4_e8m0_to_f32(c[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) x[i] = dsv4_e4m3_to_f32(c[i]);
    }
}

void dsv4_ref_quantize_row(dsv4_qrule rule, const float *x, int64_t k, uint8_t *codes, uint8_t *scales)
{
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    for (int64_t g = 0; g < k / p->group; g++)
        scales[g] = dsv4_quantize_group(p, x + g * p->group, p->group, codes + g * p->group);
}

void dsv4_ref_dequantize_row(dsv4_qrule rule, const uint8_t *codes, const uint8_t *scales, int64_t k, float *x)
{
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    for (int64_t i = 0; i < k; i++) {
        float v = p->fp4 ? dsv4_e2m1_to_f32(codes[i]) : dsv4_e4m3_to_f32(codes[i]);
        x[i] = v * dsv4_e8m0_to_f32(scales[i / p->group]);
    }
}

void dsv4_ref_dequant_fp8_b128_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out)
{
    for (int64_t j = 0; j < k; j++) out[j] = dsv4_e4m3_to_f32(w[j]) * dsv4_e8m0_to_f32(srow[(j / 128) * ss1]);
}

void dsv4_ref_dequant_fp4_g32_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out)
{
    for (int64_t j = 0; j < k; j++) {
        uint8_t b = w[j / 2];
        out[j] = dsv4_e2m1_to_f32((j & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0xF)) * dsv4_e8m0_to_f32(srow[(j / 32) * ss1]);
    }
}

const dsv4_cpu_format_kernels dsv4_cpu_format_kernels_scalar = {
    dsv4_ref_encode_span,         dsv4_ref_decode_span,         dsv4_ref_quantize_row,
    dsv4_ref_dequantize_row,      dsv4_ref_dequant_fp8_b128_row, dsv4_ref_dequant_fp4_g32_row,
};
