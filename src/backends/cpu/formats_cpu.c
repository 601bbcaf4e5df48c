/* The format family of both cpu backends: the same driver loops, run with the scalar kernels
 * (cpu-ref) or with the best ISA's (cpu). Work is cut into fixed chunks / whole rows, so the
 * result never depends on the thread count. */
#include "backends/cpu/cpu_formats.h"

static const dsv4_cpu_format_kernels *best_kernels(const dsv4_exec *ex)
{
    switch (ex->isa) {
    case DSV4_ISA_AVX512: return &dsv4_cpu_format_kernels_avx512;
    case DSV4_ISA_AVX2: return &dsv4_cpu_format_kernels_avx2;
    default: return &dsv4_cpu_format_kernels_scalar;
    }
}

static size_t code_size(dsv4_scalar_format fmt) { return fmt == DSV4_FMT_BF16 ? 2 : 1; }

static dsv4_status encode_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_scalar_format fmt,
                               const float *x, int64_t n, void *codes)
{
    int64_t chunks = (n + DSV4_CPU_CHUNK - 1) / DSV4_CPU_CHUNK;
    size_t cs = code_size(fmt);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * DSV4_CPU_CHUNK, len = n - lo < DSV4_CPU_CHUNK ? n - lo : DSV4_CPU_CHUNK;
        kn->encode_span(fmt, x + lo, len, (char *)codes + (size_t)lo * cs);
    }
    return DSV4_OK;
}

static dsv4_status decode_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_scalar_format fmt,
                               const void *codes, int64_t n, float *x)
{
    int64_t chunks = (n + DSV4_CPU_CHUNK - 1) / DSV4_CPU_CHUNK;
    size_t cs = code_size(fmt);
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * DSV4_CPU_CHUNK, len = n - lo < DSV4_CPU_CHUNK ? n - lo : DSV4_CPU_CHUNK;
        kn->decode_span(fmt, (const char *)codes + (size_t)lo * cs, len, x + lo);
    }
    return DSV4_OK;
}

static dsv4_status quantize_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_qrule rule,
                                 const float *x, int64_t ldx, int64_t rows, int64_t k, uint8_t *codes, int64_t ldc,
                                 uint8_t *scales, int64_t lds)
{
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (rows * k > DSV4_CPU_CHUNK)
    for (int64_t r = 0; r < rows; r++) kn->quantize_row(rule, x + r * ldx, k, codes + r * ldc, scales + r * lds);
    return DSV4_OK;
}

static dsv4_status dequantize_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_qrule rule,
                                   const uint8_t *codes, int64_t ldc, const uint8_t *scales, int64_t lds,
                                   int64_t rows, int64_t k, float *x, int64_t ldx)
{
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (rows * k > DSV4_CPU_CHUNK)
    for (int64_t r = 0; r < rows; r++) kn->dequantize_row(rule, codes + r * ldc, scales + r * lds, k, x + r * ldx);
    return DSV4_OK;
}

static dsv4_status fp8_b128_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, const uint8_t *w,
                                 int64_t ldw, int64_t n, int64_t k, const uint8_t *scale, int64_t ss0, int64_t ss1,
                                 float *out, int64_t ldo)
{
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (n * k > DSV4_CPU_CHUNK)
    for (int64_t i = 0; i < n; i++) kn->dequant_fp8_b128_row(w + i * ldw, k, scale + (i / 128) * ss0, ss1, out + i * ldo);
    return DSV4_OK;
}

static dsv4_status fp4_g32_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, const uint8_t *w,
                                int64_t ldw, int64_t n, int64_t k, const uint8_t *scale, int64_t ss0, int64_t ss1,
                                float *out, int64_t ldo)
{
#pragma omp parallel for num_threads(ex->threads) schedule(static) if (n * k > DSV4_CPU_CHUNK)
    for (int64_t i = 0; i < n; i++) kn->dequant_fp4_g32_row(w + i * ldw, k, scale + i * ss0, ss1, out + i * ldo);
    return DSV4_OK;
}

/* Two tables over the same drivers: the kernels set is the only difference. */
#define DEFINE_FORMAT_OPS(prefix, kernels_expr)                                                                  \
    static dsv4_status prefix##_encode(const dsv4_exec *ex, dsv4_scalar_format f, const float *x, int64_t n,   \
                                       void *c) { return encode_with(kernels_expr, ex, f, x, n, c); }          \
    static dsv4_status prefix##_decode(const dsv4_exec *ex, dsv4_scalar_format f, const void *c, int64_t n,    \
                                       float *x) { return decode_with(kernels_expr, ex, f, c, n, x); }         \
    static dsv4_status prefix##_quantize(const dsv4_exec *ex, dsv4_qrule r, const float *x, int64_t ldx,        \
                                         int64_t rows, int64_t k, uint8_t *c, int64_t ldc, uint8_t *s,          \
                                         int64_t lds)                                                            \
    { return quantize_with(kernels_expr, ex, r, x, ldx, rows, k, c, ldc, s, lds); }                              \
    static dsv4_status prefix##_dequantize(const dsv4_exec *ex, dsv4_qrule r, const uint8_t *c, int64_t ldc,    \
                                           const uint8_t *s, int64_t lds, int64_t rows, int64_t k, float *x,     \
                                           int64_t ldx)                                                          \
    { return dequantize_with(kernels_expr, ex, r, c, ldc, s, lds, rows, k, x, ldx); }                            \
    static dsv4_status prefix##_fp8(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,  \
                                    const uint8_t *s, int64_t ss0, int64_t ss1, float *o, int64_t ldo)          \
    { return fp8_b128_with(kernels_expr, ex, w, ldw, n, k, s, ss0, ss1, o, ldo); }                               \
    static dsv4_status prefix##_fp4(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,  \
                                    const uint8_t *s, int64_t ss0, int64_t ss1, float *o, int64_t ldo)          \
    { return fp4_g32_with(kernels_expr, ex, w, ldw, n, k, s, ss0, ss1, o, ldo); }

DEFINE_FORMAT_OPS(ref, &dsv4_cpu_format_kernels_scalar)
DEFINE_FORMAT_OPS(fast, best_kernels(ex))

const struct dsv4_format_ops dsv4_cpu_ref_format_ops = {ref_encode,     ref_decode, ref_quantize,
                                                        ref_dequantize, ref_fp8,    ref_fp4};
const struct dsv4_format_ops dsv4_cpu_format_ops = {fast_encode,     fast_decode, fast_quantize,
                                                    fast_dequantize, fast_fp8,    fast_fp4};
