/* The format family of the cuda backend (core/ops_formats.h): the two weight dequantizers
 * (formats_cuda.cu), launched on the context's stream with nothing allocated or waited for. The
 * element codecs and the activation rules stay NULL here (the op layer answers
 * DSV4_ERR_UNSUPPORTED): the linear family stages activations itself (linear_cuda.cu). */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/ops_formats.h"

static dsv4_status cu_fp8_b128(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,
                               const uint8_t *scale, int64_t ss0, int64_t ss1, float *out, int64_t ldo)
{
    CU_LAUNCH(ex, "dequantize_weight",
              dsv4_cu_dequant_weight_launch(0, w, ldw, n, k, scale, ss0, ss1, out, ldo, dsv4_cu_stream(ex)));
}

static dsv4_status cu_fp4_g32(const dsv4_exec *ex, const uint8_t *w, int64_t ldw, int64_t n, int64_t k,
                              const uint8_t *scale, int64_t ss0, int64_t ss1, float *out, int64_t ldo)
{
    CU_LAUNCH(ex, "dequantize_weight",
              dsv4_cu_dequant_weight_launch(1, w, ldw, n, k, scale, ss0, ss1, out, ldo, dsv4_cu_stream(ex)));
}

const struct dsv4_format_ops dsv4_cuda_format_ops = {
    .dequantize_fp8_b128 = cu_fp8_b128,
    .dequantize_fp4_g32 = cu_fp4_g32,
};
