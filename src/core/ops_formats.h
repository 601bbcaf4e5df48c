/* Format op family: element-wise codecs and block quantization (docs/contracts.md §2-§4). */
#ifndef DSV4_CORE_OPS_FORMATS_H
#define DSV4_CORE_OPS_FORMATS_H

#include "core/backend.h"

struct dsv4_format_ops {
    dsv4_status (*encode)(const dsv4_exec *ex, dsv4_scalar_format fmt, const float *x, int64_t n, void *codes);
    dsv4_status (*decode)(const dsv4_exec *ex, dsv4_scalar_format fmt, const void *codes, int64_t n, float *x);
    /* rows x k floats (row stride ldx) -> codes (row stride ldc) + scale bytes (row stride lds). */
    dsv4_status (*quantize_rows)(const dsv4_exec *ex, dsv4_qrule rule, const float *x, int64_t ldx, int64_t rows,
                                 int64_t k, uint8_t *codes, int64_t ldc, uint8_t *scales, int64_t lds);
    dsv4_status (*dequantize_rows)(const dsv4_exec *ex, dsv4_qrule rule, const uint8_t *codes, int64_t ldc,
                                   const uint8_t *scales, int64_t lds, int64_t rows, int64_t k, float *x,
                                   int64_t ldx);
    /* FP8 [n, k] codes with scale blocks of 128x128 (scale element (i, j) at
     * scale[i*ss0 + j*ss1]) -> f32 [n, k] (row stride ldo). */
    dsv4_status (*dequantize_fp8_b128)(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,
                                       const uint8_t *scale, int64_t ss0, int64_t ss1, float *out, int64_t ldo);
    /* FP4 packed [n, k/2] with 1x32 scales -> f32 [n, k]. */
    dsv4_status (*dequantize_fp4_g32)(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,
                                      const uint8_t *scale, int64_t ss0, int64_t ss1, float *out, int64_t ldo);
};

#endif
