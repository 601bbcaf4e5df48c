/* The compressor on the GPU (include/dsv4/indexer.h; docs/kernels.md §12): the batched
 * state machine of src/backends/cpu/compressor_cpu.c with cpu-ref's arithmetic, so that entries
 * and state are its bytes. Two kernels on the caller's stream, in this order:
 *   entries  one CTA per emitted entry, a thread per channel (strided): the softmax pool over the
 *            window rows in cpu-ref's order (indexer_ref.c dsv4_ix_ref_pool: the max, then the
 *            weights exp(s - max) by the polynomial of indexer_cpu.h dsv4_ix_expf, summed row by
 *            row, one division), then compressor_cpu.c finish_entry: BF16, the RMS norm (the sum
 *            of squares in index order, by one thread), BF16, RoPE on the last 64 values, and the
 *            indexer tail of indexer_common.c (Hadamard, FP4) or the main kind's FP8 round trip;
 *   state    a thread per (residue k, column j): it alone reads and writes rows k and
 *            (overlap ? ratio : 0) + k at column j, so the copy of the last block (read from the
 *            current rows) and the latest tokens (written over them) need no barrier.
 * Every product, sum and quotient is an explicitly rounded intrinsic (no contraction into FMA
 * where cpu-ref multiplies and adds); nothing is allocated or waited for. */
#include "backends/cuda/cuda_indexer.cuh"
#include "backends/cuda/cuda_indexer.h"

enum { CMP_MAX_THREADS = 256 };

/* indexer_cpu.h dsv4_ix_expf, operation for operation. */
DSV4_CU_INLINE float cmp_expf(float x)
{
    if (!(x > -87.0f)) return x != x ? x : 0.0f;
    if (x > 88.0f) x = 88.0f;
    const float n = rintf(__fmul_rn(x, 1.44269504f));
    float r = __fmaf_rn(n, -0.693359375f, x);
    r = __fmaf_rn(n, 2.12194440e-4f, r);
    float p = __fmaf_rn(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = __fmaf_rn(p, r, 8.3334519073e-3f);
    p = __fmaf_rn(p, r, 4.1665795894e-2f);
    p = __fmaf_rn(p, r, 1.6666665459e-1f);
    p = __fmaf_rn(p, r, 5.0000001201e-1f);
    const float y = __fadd_rn(__fmaf_rn(p, __fmul_rn(r, r), r), 1.0f);
    return __fmul_rn(y, __uint_as_float((uint32_t)((int)n + 127) << 23));
}

/* Where row t of block `blk` (token q = blk * ratio + t) is, as compressor_cpu.c row_of sees it
 * before this call: a new token's row of kv / gate (its score gate + ape[t]), or for q < start_pos
 * a state row (the current block at start_pos in rows (overlap ? r : 0) + t, the block before it
 * in rows t) holding kv and the stored score. */
typedef struct {
    const float *kv, *score, *ape; /* ape NULL: score is the stored sum */
} cmp_row;

DSV4_CU_INLINE cmp_row row_of(const dsv4_cu_cmp &a, long long blk, int t)
{
    const long long r = a.ratio, q = blk * r + t, p0 = a.start_pos;
    cmp_row w;
    if (q >= p0) {
        w.kv = a.kv + (q - p0) * a.ld_in_kv;
        w.score = a.gate + (q - p0) * a.ld_in_gate;
        w.ape = a.ape + t * a.ld_ape;
    } else {
        const long long srow = (blk == p0 / r ? (a.overlap ? r : 0) : 0) + t;
        w.kv = a.state_kv + srow * a.ld_state_kv;
        w.score = a.state_score + srow * a.ld_state_score;
        w.ape = NULL;
    }
    return w;
}

DSV4_CU_INLINE float score_of(const cmp_row &w, int col)
{
    return w.ape ? __fadd_rn(w.score[col], w.ape[col]) : w.score[col];
}

/* The pooled value of channel e of entry `entry` (indexer_ref.c dsv4_ix_ref_pool over the rows
 * compressor_cpu.c cmp_entries lists: with overlap the previous block's first d columns, none
 * before position 0, then the entry's own block, its columns from d with overlap). */
DSV4_CU_INLINE float pool_channel(const dsv4_cu_cmp &a, long long entry, int e)
{
    const int r = a.ratio, own = a.overlap ? a.dim + e : e;
    const bool prev = a.overlap && entry > 0;
    float m = -INFINITY;
    if (prev)
        for (int t = 0; t < r; t++) {
            const float s = score_of(row_of(a, entry - 1, t), e);
            m = s > m ? s : m;
        }
    for (int t = 0; t < r; t++) {
        const float s = score_of(row_of(a, entry, t), own);
        m = s > m ? s : m;
    }
    float den = 0.0f, num = 0.0f;
    if (prev)
        for (int t = 0; t < r; t++) {
            const cmp_row w = row_of(a, entry - 1, t);
            const float x = cmp_expf(__fsub_rn(score_of(w, e), m));
            den = __fadd_rn(den, x);
            num = __fadd_rn(num, __fmul_rn(x, w.kv[e]));
        }
    for (int t = 0; t < r; t++) {
        const cmp_row w = row_of(a, entry, t);
        const float x = cmp_expf(__fsub_rn(score_of(w, own), m));
        den = __fadd_rn(den, x);
        num = __fadd_rn(num, __fmul_rn(x, w.kv[own]));
    }
    return __fdiv_rn(num, den);
}

/* codec.h dsv4_e4m3_to_f32 (0x7F / 0xFF: a quiet NaN with the code's sign). */
DSV4_CU_INLINE float cmp_e4m3_f32(uint32_t c)
{
    const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
    if ((c & 0x7Fu) == 0x7Fu) return __uint_as_float(sign | 0x7FC00000u);
    if (e == 0) {
        const float v = __fmul_rn((float)m, 1.0f / 512.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

/* A position read on the device becomes start_pos; *row: the output row of entry `entry`. Returns
 * whether the call's token emits that entry (always for a host start_pos: the grid has m CTAs). */
DSV4_CU_INLINE bool resolve_position(dsv4_cu_cmp &a, long long i, long long *row)
{
    *row = i;
    if (!a.position) return true;
    a.start_pos = *a.position;
    const long long p = a.start_pos, c = p / a.ratio;
    if (p < 0 || (p + 1) % a.ratio || c * a.ratio >= a.rope_rows) return false;
    *row = c % a.out_rows;
    return true;
}

__global__ void __launch_bounds__(CMP_MAX_THREADS) cmp_entries_kernel(dsv4_cu_cmp a)
{
    __shared__ float xs[DSV4_CU_CMP_MAX_DIM];
    __shared__ float rs_shared;
    long long i;
    if (!resolve_position(a, blockIdx.x, &i)) return;
    const int d = a.dim, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const long long entry = a.start_pos / a.ratio + (a.position ? 0 : i);
    for (int e = tid; e < d; e += nt) xs[e] = cu_bf16_round(pool_channel(a, entry, e));
    __syncthreads();
    if (tid == 0) { /* finish_entry's sum of squares, in index order */
        float ss = 0.0f;
#pragma unroll 8
        for (int e = 0; e < d; e++) ss = __fadd_rn(ss, __fmul_rn(xs[e], xs[e]));
        rs_shared = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), a.eps)));
    }
    __syncthreads();
    const float rs = rs_shared;
    for (int e = tid; e < d; e += nt) {
        const float w = a.norm_bf16 ? cu_bf16_f32(((const uint16_t *)a.norm)[e]) : ((const float *)a.norm)[e];
        xs[e] = cu_bf16_round(__fmul_rn(w, __fmul_rn(xs[e], rs)));
    }
    __syncthreads();
    if (tid < 32) cu_ix_rope_pair(xs + d - 64, a.rope + entry * a.ratio * a.ld_rope, tid); /* position entry * ratio */
    __syncthreads();
    if (a.kind == 1) { /* DSV4_COMPRESSOR_INDEXER: indexer_common.c dsv4_ix_hadamard_fp4 */
        cu_ix_fwht<true>(xs, d, tid, nt);
        const float hscale = (float)(1.0 / sqrt((double)d)); /* IEEE double, as indexer_common.c */
        uint8_t *oc = a.packed ? (uint8_t *)a.out + i * a.ld_out : NULL;
        uint8_t *os = a.packed ? a.out_scales + i * a.ld_out_scales : NULL;
        uint16_t *ov = a.packed ? NULL : (uint16_t *)a.out + i * a.ld_out;
        for (int g = warp; g < d / 32; g += nw)
            cu_ix_fp4_group(cu_bf16_round(__fmul_rn(xs[32 * g + lane], hscale)), lane, g, oc, os, ov);
        return;
    }
    if (a.fp8_sim) /* the FP8 round trip of dims 0..d-65, rule kv64, a warp per group of 64 */
        for (int g = warp; g < (d - 64) / 64; g += nw) {
            float *x = xs + 64 * g;
            const float v0 = x[lane], v1 = x[32 + lane];
            const float m0 = cu_warp_absmax(v0), m1 = cu_warp_absmax(v1);
            const int ex = cu_kv64_exponent(m1 > m0 ? m1 : m0);
            const float inv = cu_pow2f(-ex), s = cu_e8m0_f32((uint32_t)(ex + 127));
            const float d0 = cmp_e4m3_f32(cu_f32_e4m3(__fmul_rn(v0, inv)));
            const float d1 = cmp_e4m3_f32(cu_f32_e4m3(__fmul_rn(v1, inv)));
            /* a NaN operand is the product (the first one's, as on the host) */
            x[lane] = isnan(d0) ? d0 : (isnan(s) ? s : __fmul_rn(d0, s));
            x[32 + lane] = isnan(d1) ? d1 : (isnan(s) ? s : __fmul_rn(d1, s));
        }
    __syncthreads();
    uint16_t *o = (uint16_t *)a.out + i * a.ld_out;
    for (int e = tid; e < d; e += nt) o[e] = (uint16_t)cu_f32_bf16(xs[e]);
}

/* compressor_cpu.c dsv4_cmp_run's state update for residue k = blockIdx.y, column j. */
__global__ void cmp_state_kernel(dsv4_cu_cmp a)
{
    if (a.position) {
        a.start_pos = *a.position;
        if (a.start_pos < 0) return;
    }
    const long long r = a.ratio, k = blockIdx.y, width = (long long)(a.overlap ? 2 : 1) * a.dim;
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    const long long p0 = a.start_pos, p1 = p0 + a.n_tokens, cur = a.overlap ? r : 0;
    const bool block = a.overlap && p1 / r > p0 / r; /* an entry was emitted: keep its block */
    float bkv = 0.0f, bsc = 0.0f;
    if (block) {
        const cmp_row w = row_of(a, p1 / r - 1, (int)k);
        bkv = w.kv[j];
        bsc = score_of(w, (int)j);
    }
    /* the token of residue k in [lo, p1), a new one (lo >= p0) */
    const long long lo = p1 - r > p0 ? p1 - r : p0, q = lo + ((k - lo % r) % r + r) % r;
    const bool tok = q < p1;
    float tkv = 0.0f, tsc = 0.0f;
    if (tok) {
        tkv = a.kv[(q - p0) * a.ld_in_kv + j];
        tsc = __fadd_rn(a.gate[(q - p0) * a.ld_in_gate + j], a.ape[k * a.ld_ape + j]);
    }
    if (block) {
        a.state_kv[k * a.ld_state_kv + j] = bkv;
        a.state_score[k * a.ld_state_score + j] = bsc;
    }
    if (tok) {
        a.state_kv[(cur + k) * a.ld_state_kv + j] = tkv;
        a.state_score[(cur + k) * a.ld_state_score + j] = tsc;
    }
}

extern "C" int dsv4_cu_cmp_launch(const dsv4_cu_cmp *a, void *stream)
{
    const int d = a->dim, r = a->ratio;
    if (d < 64 || d > DSV4_CU_CMP_MAX_DIM || d % 32 || r < 1 || r > 65535 || a->n_tokens < 1)
        return (int)cudaErrorInvalidValue;
    /* a position on the device: one CTA that finds out whether the token emits */
    const long long m = a->position ? 1 : (a->start_pos + a->n_tokens) / r - a->start_pos / r;
    if (a->position && (a->n_tokens != 1 || a->out_rows < 1)) return (int)cudaErrorInvalidValue;
    if (m > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    cudaStream_t s = (cudaStream_t)stream;
    if (m > 0) {
        const int threads = d < CMP_MAX_THREADS ? d : CMP_MAX_THREADS;
        cmp_entries_kernel<<<(unsigned)m, threads, 0, s>>>(*a);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return (int)e;
    }
    const long long width = (long long)(a->overlap ? 2 : 1) * d;
    cmp_state_kernel<<<dim3((unsigned)((width + 127) / 128), (unsigned)r), 128, 0, s>>>(*a);
    return (int)cudaGetLastError();
}

__global__ void cmp_reset_kernel(float *kv, long long ld_kv, float *sc, long long ld_sc, long long rows, long long cols)
{
    const long long n = rows * cols;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const long long i = t / cols, j = t % cols;
        kv[i * ld_kv + j] = 0.0f;
        sc[i * ld_sc + j] = -INFINITY;
    }
}

extern "C" int dsv4_cu_cmp_reset_launch(float *state_kv, long long ld_kv, float *state_score, long long ld_score,
                                        long long rows, long long cols, void *stream)
{
    const long long n = rows * cols;
    if (n == 0) return 0;
    long long blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    cmp_reset_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(state_kv, ld_kv, state_score, ld_score, rows,
                                                                          cols);
    return (int)cudaGetLastError();
}
