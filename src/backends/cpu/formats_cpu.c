/* The format family of both cpu backends: the same driver loops, run with the scalar kernels
 * (cpu-ref) or with the best ISA's (cpu). Work is cut into fixed chunks / whole rows, so the
 * result never depends on the thread count. */
#include "backends/cpu/cpu_formats.h"
#include "core/pool.h"

static const dsv4_cpu_format_kernels *best_kernels(const dsv4_exec *ex)
{
    switch (ex->isa) {
    case DSV4_ISA_AVX512: return &dsv4_cpu_format_kernels_avx512;
    case DSV4_ISA_AVX2: return &dsv4_cpu_format_kernels_avx2;
    default: return &dsv4_cpu_format_kernels_scalar;
    }
}

static size_t code_size(dsv4_scalar_format fmt) { return fmt == DSV4_FMT_BF16 ? 2 : 1; }

/* One call of a driver below: rows (or DSV4_CPU_CHUNK spans) of src into dst, with scales. */
typedef struct {
    const dsv4_cpu_format_kernels *kn;
    int fmt; /* dsv4_scalar_format or dsv4_qrule */
    const void *src;
    void *dst;
    const uint8_t *scale; /* dequantize, fp8_b128, fp4_g32 */
    uint8_t *scales;      /* quantize */
    int64_t n, k, lds, ldd, ld_scale, ss1;
} fmt_job;

/* A loop of whole rows (or chunks of elements) runs on several threads once it moves more than
 * DSV4_CPU_CHUNK elements. */
static int64_t grain_for(int64_t items, int64_t elems) { return elems > DSV4_CPU_CHUNK ? DSV4_PAR_AUTO : items; }

static void encode_spans(void *v, int64_t c0, int64_t c1)
{
    const fmt_job *j = v;
    const size_t cs = code_size((dsv4_scalar_format)j->fmt);
    for (int64_t c = c0; c < c1; c++) {
        int64_t lo = c * DSV4_CPU_CHUNK, len = j->n - lo < DSV4_CPU_CHUNK ? j->n - lo : DSV4_CPU_CHUNK;
        j->kn->encode_span((dsv4_scalar_format)j->fmt, (const float *)j->src + lo, len, (char *)j->dst + (size_t)lo * cs);
    }
}

static dsv4_status encode_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_scalar_format fmt,
                               const float *x, int64_t n, void *codes)
{
    fmt_job j = {.kn = kn, .fmt = fmt, .src = x, .dst = codes, .n = n};
    const int64_t chunks = (n + DSV4_CPU_CHUNK - 1) / DSV4_CPU_CHUNK;
    dsv4_par_for(ex, chunks, 1, encode_spans, &j);
    return DSV4_OK;
}

static void decode_spans(void *v, int64_t c0, int64_t c1)
{
    const fmt_job *j = v;
    const size_t cs = code_size((dsv4_scalar_format)j->fmt);
    for (int64_t c = c0; c < c1; c++) {
        int64_t lo = c * DSV4_CPU_CHUNK, len = j->n - lo < DSV4_CPU_CHUNK ? j->n - lo : DSV4_CPU_CHUNK;
        j->kn->decode_span((dsv4_scalar_format)j->fmt, (const char *)j->src + (size_t)lo * cs, len, (float *)j->dst + lo);
    }
}

static dsv4_status decode_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_scalar_format fmt,
                               const void *codes, int64_t n, float *x)
{
    fmt_job j = {.kn = kn, .fmt = fmt, .src = codes, .dst = x, .n = n};
    const int64_t chunks = (n + DSV4_CPU_CHUNK - 1) / DSV4_CPU_CHUNK;
    dsv4_par_for(ex, chunks, 1, decode_spans, &j);
    return DSV4_OK;
}

static void quantize_rows(void *v, int64_t r0, int64_t r1)
{
    const fmt_job *j = v;
    for (int64_t r = r0; r < r1; r++)
        j->kn->quantize_row((dsv4_qrule)j->fmt, (const float *)j->src + r * j->lds, j->k, (uint8_t *)j->dst + r * j->ldd,
                            j->scales + r * j->ld_scale);
}

static dsv4_status quantize_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_qrule rule,
                                 const float *x, int64_t ldx, int64_t rows, int64_t k, uint8_t *codes, int64_t ldc,
                                 uint8_t *scales, int64_t lds)
{
    fmt_job j = {.kn = kn, .fmt = rule, .src = x, .dst = codes, .scales = scales, .k = k, .lds = ldx, .ldd = ldc,
                 .ld_scale = lds};
    dsv4_par_for(ex, rows, grain_for(rows, rows * k), quantize_rows, &j);
    return DSV4_OK;
}

static void dequantize_rows(void *v, int64_t r0, int64_t r1)
{
    const fmt_job *j = v;
    for (int64_t r = r0; r < r1; r++)
        j->kn->dequantize_row((dsv4_qrule)j->fmt, (const uint8_t *)j->src + r * j->lds, j->scale + r * j->ld_scale, j->k,
                              (float *)j->dst + r * j->ldd);
}

static dsv4_status dequantize_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, dsv4_qrule rule,
                                   const uint8_t *codes, int64_t ldc, const uint8_t *scales, int64_t lds,
                                   int64_t rows, int64_t k, float *x, int64_t ldx)
{
    fmt_job j = {.kn = kn, .fmt = rule, .src = codes, .dst = x, .scale = scales, .k = k, .lds = ldc, .ldd = ldx,
                 .ld_scale = lds};
    dsv4_par_for(ex, rows, grain_for(rows, rows * k), dequantize_rows, &j);
    return DSV4_OK;
}

static void fp8_b128_rows(void *v, int64_t i0, int64_t i1)
{
    const fmt_job *j = v;
    for (int64_t i = i0; i < i1; i++)
        j->kn->dequant_fp8_b128_row((const uint8_t *)j->src + i * j->lds, j->k, j->scale + (i / 128) * j->ld_scale, j->ss1,
                                    (float *)j->dst + i * j->ldd);
}

static dsv4_status fp8_b128_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, const uint8_t *w,
                                 int64_t ldw, int64_t n, int64_t k, const uint8_t *scale, int64_t ss0, int64_t ss1,
                                 float *out, int64_t ldo)
{
    fmt_job j = {.kn = kn, .src = w, .dst = out, .scale = scale, .k = k, .lds = ldw, .ldd = ldo, .ld_scale = ss0, .ss1 = ss1};
    dsv4_par_for(ex, n, grain_for(n, n * k), fp8_b128_rows, &j);
    return DSV4_OK;
}

static void fp4_g32_rows(void *v, int64_t i0, int64_t i1)
{
    const fmt_job *j = v;
    for (int64_t i = i0; i < i1; i++)
        j->kn->dequant_fp4_g32_row((const uint8_t *)j->src + i * j->lds, j->k, j->scale + i * j->ld_scale, j->ss1,
                                   (float *)j->dst + i * j->ldd);
}

static dsv4_status fp4_g32_with(const dsv4_cpu_format_kernels *kn, const dsv4_exec *ex, const uint8_t *w,
                                int64_t ldw, int64_t n, int64_t k, const uint8_t *scale, int64_t ss0, int64_t ss1,
                                float *out, int64_t ldo)
{
    fmt_job j = {.kn = kn, .src = w, .dst = out, .scale = scale, .k = k, .lds = ldw, .ldd = ldo, .ld_scale = ss0, .ss1 = ss1};
    dsv4_par_for(ex, n, grain_for(n, n * k), fp4_g32_rows, &j);
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
