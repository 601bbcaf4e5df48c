/* The weight dequantizers of the format family on the GPU (core/ops_formats.h): FP8 E4M3 codes
 * with 128x128 UE8M0 scale blocks and packed FP4 E2M1 codes with 1x32 scales, to F32. Both are
 * exact: the element decodes are the bit patterns of src/formats/codec.h (a NaN code gives the
 * codec's sign | 0x7FC00000) and the one fp32 product with the power-of-two scale is IEEE
 * round-to-nearest without flushing (no --use_fast_math), as in the scalar reference. */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

/* codec.h dsv4_e4m3_to_f32, from the bits (the hardware conversion's NaN is another pattern). */
DSV4_CU_INLINE float e4m3_exact(uint32_t c)
{
    const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
    if ((c & 0x7Fu) == 0x7Fu) return __uint_as_float(sign | 0x7FC00000u);
    if (e == 0) {
        const float v = (float)m * (1.0f / 512.0f); /* exact */
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

/* codec.h dsv4_e2m1_table */
__constant__ float e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* One thread per output element, grid-stride over the n*k elements in row-major order. */
template <bool FP4>
__global__ void dequant_weight_kernel(const uint8_t *w, long long ldw, long long n, long long k, const uint8_t *scale,
                                      long long ss0, long long ss1, float *out, long long ldo)
{
    const long long total = n * k;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long i = idx / k, j = idx % k;
        float v, s;
        if (FP4) {
            const uint32_t b = w[i * ldw + j / 2];
            v = e2m1_values[(j & 1) ? b >> 4 : b & 0xFu];
            s = cu_e8m0_f32(scale[i * ss0 + (j / 32) * ss1]);
        } else {
            v = e4m3_exact(w[i * ldw + j]);
            s = cu_e8m0_f32(scale[(i / 128) * ss0 + (j / 128) * ss1]);
        }
        out[i * ldo + j] = __fmul_rn(v, s);
    }
}

extern "C" int dsv4_cu_dequant_weight_launch(int fp4, const uint8_t *w, long long ldw, long long n, long long k,
                                             const uint8_t *scale, long long ss0, long long ss1, float *out,
                                             long long ldo, void *stream)
{
    const long long total = n * k;
    if (total == 0) return 0;
    enum { THREADS = 256, MAX_BLOCKS = 65536 };
    const long long want = (total + THREADS - 1) / THREADS;
    const unsigned blocks = (unsigned)(want < MAX_BLOCKS ? want : MAX_BLOCKS);
    cudaStream_t st = (cudaStream_t)stream;
    if (fp4)
        dequant_weight_kernel<true><<<blocks, THREADS, 0, st>>>(w, ldw, n, k, scale, ss0, ss1, out, ldo);
    else
        dequant_weight_kernel<false><<<blocks, THREADS, 0, st>>>(w, ldw, n, k, scale, ss0, ss1, out, ldo);
    return (int)cudaGetLastError();
}
