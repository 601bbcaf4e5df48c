/* Device steps shared by the indexer's query path (indexer_cuda.cu) and the compressor
 * (compressor_cuda.cu): the RoPE of the last 64 values and the FP4 tail of
 * src/backends/cpu/indexer_common.c, with its roundings. */
#ifndef DSV4_CUDA_INDEXER_CUH
#define DSV4_CUDA_INDEXER_CUH

#include "backends/cuda/cuda_device.cuh"

/* 2 x E2M1 of nibble n as an int8 byte (indexer_cpu.h dsv4_ix_fp4x2): 0 1 2 3 4 6 8 12, negated
 * for the sign bit (-0 gives 0). */
DSV4_CU_INLINE uint32_t cu_fp4x2_val(uint32_t n)
{
    const unsigned long long pos = 0x0C08060403020100ull, neg = 0xF4F8FAFCFDFEFF00ull;
    return (uint32_t)(((n & 8u) ? neg : pos) >> (8 * (n & 7u))) & 0xFFu;
}

/* E2M1 code c as a float (codec.h dsv4_e2m1_to_f32: code 8 is -0). */
DSV4_CU_INLINE float cu_e2m1_f32(uint32_t c)
{
    const float m = 0.5f * (float)(int)cu_fp4x2_val(c & 7u);
    return (c & 8u) ? -m : m;
}

DSV4_CU_INLINE float cu_bf16_round(float x) { return cu_bf16_f32(cu_f32_bf16(x)); }

/* The largest |v| over a warp's lanes, NaN skipped (codec.h dsv4_absmax; the maximum is
 * order-free). Every lane of the warp calls it. */
DSV4_CU_INLINE float cu_warp_absmax(float v)
{
    float m = fabsf(v);
    m = m > 0.0f ? m : 0.0f;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float n = __shfl_xor_sync(0xFFFFFFFFu, m, o);
        m = n > m ? n : m;
    }
    return m;
}

/* indexer_common.c dsv4_ix_rope64 for lane l of a warp: the pair r[2l], r[2l+1] of the last 64
 * values r, rotated by the table row cs (cos ‖ sin), each result rounded to BF16. */
DSV4_CU_INLINE void cu_ix_rope_pair(float *r, const float *cs, int lane)
{
    const float p = r[2 * lane], b = r[2 * lane + 1], c = cs[lane], s = cs[32 + lane];
    r[2 * lane] = cu_bf16_round(__fsub_rn(__fmul_rn(p, c), __fmul_rn(b, s)));
    r[2 * lane + 1] = cu_bf16_round(__fadd_rn(__fmul_rn(p, s), __fmul_rn(b, c)));
}

/* indexer_ref.c dsv4_ix_ref_fwht in place on x[0..d) in shared memory: the unnormalized
 * Walsh-Hadamard stages h = 1, 2, 4, ..., the butterflies of a stage (independent) spread over n
 * threads (this one is `id`), a barrier after each: the CTA's (BLOCK) or the warp's. */
template <bool BLOCK> DSV4_CU_INLINE void cu_ix_fwht(float *x, int d, int id, int n)
{
    for (int h = 1; h < d; h <<= 1) {
        for (int p = id; p < d / 2; p += n) {
            const int i = (p / h) * 2 * h + p % h, j = i + h;
            const float u = x[i], v = x[j];
            x[i] = __fadd_rn(u, v);
            x[j] = __fsub_rn(u, v);
        }
        if (BLOCK)
            __syncthreads();
        else
            __syncwarp();
    }
}

/* Group g of 32 Hadamard-rotated values, v = this lane's (already × d^-0.5 and rounded to BF16),
 * through the FP4 rule fp4_32 (codec.h dsv4_qrule_exponent with its parameters): packed codes + the scale byte (codes, scales: the row), or
 * the simulated BF16 values (values: the row). Every lane of the warp calls it. */
DSV4_CU_INLINE void cu_ix_fp4_group(float v, int lane, int g, uint8_t *codes, uint8_t *scales, uint16_t *values)
{
    const float m = cu_warp_absmax(v);
    const float amax = m >= 6.0f * 1.17549435e-38f ? m : 6.0f * 1.17549435e-38f;
    int e = cu_ceil_log2_bits(__fdiv_rn(amax, 6.0f));
    e = e < -127 ? -127 : (e > 128 ? 128 : e);
    const uint32_t code = dsv4_e2m1_from_f32(__fmul_rn(v, cu_pow2f(-e)));
    if (codes) {
        const uint32_t up = __shfl_down_sync(0xFFFFFFFFu, code, 1);
        if ((lane & 1) == 0) codes[16 * g + lane / 2] = (uint8_t)(code | (up << 4));
        if (lane == 0) scales[g] = (uint8_t)(e + 127);
    } else {
        values[32 * g + lane] = (uint16_t)cu_f32_bf16(__fmul_rn(cu_e2m1_f32(code), cu_e8m0_f32((uint32_t)(e + 127))));
    }
}

#endif
