/* Format kernels of the cpu backends: the scalar reference (cpu-ref, and the judge of every
 * faster version) and the ISA-specific versions the cpu backend picks at run time. */
#ifndef DSV4_CPU_FORMATS_H
#define DSV4_CPU_FORMATS_H

#include "core/ops_formats.h"

/* Work is cut into chunks of this many elements (rows for row kernels are cut the same way), so
 * results never depend on the thread count. */
#define DSV4_CPU_CHUNK 65536

extern const struct dsv4_format_ops dsv4_cpu_ref_format_ops;
extern const struct dsv4_format_ops dsv4_cpu_format_ops;

/* Scalar pieces reused by the fast paths for what they do not vectorize. */
void dsv4_ref_encode_span(dsv4_scalar_format fmt, const float *x, int64_t n, void *codes);
void dsv4_ref_decode_span(dsv4_scalar_format fmt, const void *codes, int64_t n, float *x);
void dsv4_ref_quantize_row(dsv4_qrule rule, const float *x, int64_t k, uint8_t *codes, uint8_t *scales);
void dsv4_ref_dequantize_row(dsv4_qrule rule, const uint8_t *codes, const uint8_t *scales, int64_t k, float *x);
void dsv4_ref_dequant_fp8_b128_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out);
void dsv4_ref_dequant_fp4_g32_row(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out);

/* One ISA's row/span kernels (formats_avx512.c, formats_avx2.c). A NULL entry falls back to
 * the scalar span function. */
typedef struct dsv4_cpu_format_kernels {
    void (*encode_span)(dsv4_scalar_format fmt, const float *x, int64_t n, void *codes);
    void (*decode_span)(dsv4_scalar_format fmt, const void *codes, int64_t n, float *x);
    void (*quantize_row)(dsv4_qrule rule, const float *x, int64_t k, uint8_t *codes, uint8_t *scales);
    void (*dequantize_row)(dsv4_qrule rule, const uint8_t *codes, const uint8_t *scales, int64_t k, float *x);
    void (*dequant_fp8_b128_row)(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out);
    void (*dequant_fp4_g32_row)(const uint8_t *w, int64_t k, const uint8_t *srow, int64_t ss1, float *out);
} dsv4_cpu_format_kernels;

extern const dsv4_cpu_format_kernels dsv4_cpu_format_kernels_scalar;
extern const dsv4_cpu_format_kernels dsv4_cpu_format_kernels_avx2;
extern const dsv4_cpu_format_kernels dsv4_cpu_format_kernels_avx512;

#endif
