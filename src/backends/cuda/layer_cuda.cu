/* Layer kernels on the GPU (include/dsv4/layer.h): RMSNorm, SwiGLU with clamp and routing weight,
 * and hc_post. RMSNorm reduces its sum of squares in a block-wide tree (another fp32 order than
 * the CPU's: within one BF16 ulp of it, tests/c/test_backend_ops.c); the per-element arithmetic of
 * all three is the CPU reference's, one rounding per operation (_rn intrinsics keep nvcc from
 * contracting into FMAs), so hc_post is bit-identical to cpu-ref and SwiGLU differs only by the
 * device's expf (within 2 ulp of glibc's). */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

#include <cooperative_groups.h>

enum { RMS_THREADS = 1024, RMS_AHEAD = 4 }; /* a 4096-wide row: one batch of loads a thread */

DSV4_CU_INLINE float ld_any(const void *p, int bf16, long long i)
{
    return bf16 ? cu_bf16_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

DSV4_CU_INLINE void st_any(void *p, int bf16, long long i, float v)
{
    if (bf16) ((uint16_t *)p)[i] = (uint16_t)cu_f32_bf16(v);
    else ((float *)p)[i] = v;
}

/* One CTA per row. A row of at most RMS_AHEAD * RMS_THREADS values (V4-Flash's 4096) is read once
 * into registers, its weights before cu_pdl_wait (they are no kernel's output), so the row costs
 * one trip to memory; a longer row is read twice, RMS_AHEAD elements a thread at a time. Either
 * way a thread sums its elements in the order of one after another. */
__global__ void __launch_bounds__(RMS_THREADS) rms_kernel(const void *x, long long ldx, int x_bf16, const void *w,
                                                          int w_bf16, void *y, long long ldy, int y_bf16, long long d,
                                                          float eps)
{
    constexpr int A = RMS_AHEAD;
    const bool held = d <= (long long)A * RMS_THREADS;
    float v[A], g[A];
    if (held)
#pragma unroll
        for (int a = 0; a < A; a++) {
            const long long i = threadIdx.x + (long long)a * RMS_THREADS;
            g[a] = i < d && w ? ld_any(w, w_bf16, i) : 0.0f;
        }
    cu_pdl_wait();
    cu_pdl_release();
    const long long r = blockIdx.x;
    const char *xr = (const char *)x + r * ldx * (x_bf16 ? 2 : 4);
    char *yr = (char *)y + r * ldy * (y_bf16 ? 2 : 4);
    float s = 0.0f;
    for (long long i0 = threadIdx.x; i0 < d; i0 += A * RMS_THREADS) { /* once for a held row: v stays */
#pragma unroll
        for (int a = 0; a < A; a++) {
            const long long i = i0 + (long long)a * RMS_THREADS;
            v[a] = i < d ? ld_any(xr, x_bf16, i) : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < A; a++)
            if (i0 + (long long)a * RMS_THREADS < d) s = __fadd_rn(s, __fmul_rn(v[a], v[a]));
    }
    __shared__ float part[RMS_THREADS / 32];
#pragma unroll
    for (int o = 16; o; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = part[0];
    for (int i = 1; i < RMS_THREADS / 32; i++) tot = __fadd_rn(tot, part[i]);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(tot, (float)d), eps)));
    /* a thread writes only the elements it read (y may be x) */
    for (long long i0 = threadIdx.x; i0 < d; i0 += A * RMS_THREADS) {
        if (!held)
#pragma unroll
            for (int a = 0; a < A; a++) {
                const long long i = i0 + (long long)a * RMS_THREADS;
                v[a] = i < d ? ld_any(xr, x_bf16, i) : 0.0f;
                g[a] = i < d && w ? ld_any(w, w_bf16, i) : 0.0f;
            }
#pragma unroll
        for (int a = 0; a < A; a++) {
            const long long i = i0 + (long long)a * RMS_THREADS;
            if (i >= d) continue;
            const float u = __fmul_rn(v[a], inv);
            st_any(yr, y_bf16, i, w ? __fmul_rn(u, g[a]) : u);
        }
    }
}

extern "C" int dsv4_cu_rms_launch(const void *x, long long ldx, int x_bf16, const void *w, int w_bf16, void *y,
                                  long long ldy, int y_bf16, long long rows, long long d, float eps, void *stream)
{
    if (rows == 0) return 0;
    if (rows > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    return (int)cu_launch_dependent(rms_kernel, dim3((unsigned)rows), RMS_THREADS, (cudaStream_t)stream,
                                    dsv4_cu_linear_pdl() != 0, x, ldx, x_bf16, w, w_bf16, y, ldy, y_bf16, d, eps);
}

/* layer_ref.c dsv4_swiglu1, then times the row's weight, rounded once. Launched as a programmatic
 * dependent (cu_launch_dependent, as the linear family around it in an MoE block): it reads
 * nothing before cu_pdl_wait, and lets the next kernel (a staging or product that loads its
 * weights early) start at once. */
__global__ void swiglu_kernel(const uint16_t *g, long long ldg, const uint16_t *u, long long ldu, const float *w,
                              uint16_t *h, long long ldh, long long rows, long long n, float limit)
{
    cu_pdl_wait();
    cu_pdl_release();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        float gv = cu_bf16_f32(g[r * ldg + i]), uv = cu_bf16_f32(u[r * ldu + i]);
        gv = gv > limit ? limit : gv;
        uv = uv > limit ? limit : uv < -limit ? -limit : uv;
        const float s = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv);
        h[r * ldh + i] = (uint16_t)cu_f32_bf16(__fmul_rn(s, w ? w[r] : 1.0f));
    }
}

extern "C" int dsv4_cu_swiglu_launch(const uint16_t *g, long long ldg, const uint16_t *u, long long ldu,
                                     const float *w, uint16_t *h, long long ldh, long long rows, long long n,
                                     float limit, void *stream)
{
    if (rows == 0 || n == 0) return 0;
    const long long bx = (n + 255) / 256;
    if (bx > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    return (int)cu_launch_dependent(swiglu_kernel, dim3((unsigned)bx, (unsigned)(rows < 65535 ? rows : 65535)), 256,
                                    (cudaStream_t)stream, dsv4_cu_linear_pdl() != 0, g, ldg, u, ldu, w, h, ldh, rows,
                                    n, limit);
}

/* out[t][k][d] = bf16(post[t][k]·x[t][d] + Σ_j comb[t][j][k]·res[t][j][d]) in layer_ref.c's order. */
__global__ void hc_post_kernel(long long T, long long D, int n, const uint16_t *x, long long ldx, const uint16_t *res,
                               long long res_t, long long res_j, const float *post, long long post_t,
                               const float *comb, long long comb_t, long long comb_j, uint16_t *out, long long out_t,
                               long long out_j)
{
    cu_pdl_wait();
    cu_pdl_release();
    const long long d = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    for (long long t = blockIdx.y; t < T; t += gridDim.y) {
        float rv[8];
        const float xv = cu_bf16_f32(x[t * ldx + d]);
        for (int j = 0; j < n; j++) rv[j] = cu_bf16_f32(res[t * res_t + j * res_j + d]);
        const float *pt = post + t * post_t, *ct = comb + t * comb_t;
        for (int k = 0; k < n; k++) {
            float s = __fmul_rn(pt[k], xv);
            for (int j = 0; j < n; j++) s = __fadd_rn(s, __fmul_rn(ct[j * comb_j + k], rv[j]));
            out[t * out_t + k * out_j + d] = (uint16_t)cu_f32_bf16(s);
        }
    }
}

extern "C" int dsv4_cu_hc_post_launch(long long T, long long D, int n, const uint16_t *x, long long ldx,
                                      const uint16_t *res, long long res_t, long long res_j, const float *post,
                                      long long post_t, const float *comb, long long comb_t, long long comb_j,
                                      uint16_t *out, long long out_t, long long out_j, void *stream)
{
    if (T == 0 || D == 0) return 0;
    if (n < 1 || n > 8) return (int)cudaErrorInvalidValue;
    return (int)cu_launch_dependent(hc_post_kernel, dim3((unsigned)((D + 127) / 128), (unsigned)(T < 65535 ? T : 65535)),
                                    128, (cudaStream_t)stream, dsv4_cu_linear_pdl() != 0, T, D, n, x, ldx, res, res_t,
                                    res_j, post, post_t, comb, comb_t, comb_j, out, out_t, out_j);
}

/* ---- hc_pre / hc_head ------------------------------------------------------------------------
 * Two launches. (1) grid (S, T): CTA s takes the s-th slice of token t's flattened streams and
 * writes, for every row i of fn and then for the sum of squares, its partial sum into token t's
 * row of y (as fp32 bit pairs: y is overwritten by (2) anyway, which is why the op needs
 * 2·D >= 4·S·(nmix+1) bytes there). (2) a cluster of CTAs per token (hc_finish_kernel): the
 * partials summed in slice order, the split and Sinkhorn of layer_ref.c dsv4_hc_split in its
 * operation order, and the weighted sum of the streams into y. S depends on n and D only, so the
 * summation order does too. */
enum { HC_THREADS = 256, HC_MAX_N = 8, HC_MAX_MIX = (2 + HC_MAX_N) * HC_MAX_N, HC_MAX_SLICES = 64 };

DSV4_CU_INLINE float block_sum(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    __syncthreads(); /* sh is reused between calls */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = sh[0];
    for (int i = 1; i < HC_THREADS / 32; i++) t = __fadd_rn(t, sh[i]);
    return t;
}

DSV4_CU_INLINE void put_f32(uint16_t *p, long long i, float v)
{
    const uint32_t b = __float_as_uint(v);
    p[2 * i] = (uint16_t)(b & 0xFFFFu);
    p[2 * i + 1] = (uint16_t)(b >> 16);
}

DSV4_CU_INLINE float get_f32(const uint16_t *p, long long i)
{
    return __uint_as_float((uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 16));
}

__global__ void __launch_bounds__(HC_THREADS) hc_dots_kernel(long long T, long long D, int n, int nmix, const float *fn,
                                                             long long ldfn, const uint16_t *x, long long x_t,
                                                             long long x_j, uint16_t *y, long long ldy, int S)
{
    __shared__ float sh[HC_THREADS / 32];
    cu_pdl_wait();
    cu_pdl_release();
    const long long nd = (long long)n * D, len = (nd + S - 1) / S;
    const long long e0 = blockIdx.x * len, e1 = e0 + len < nd ? e0 + len : nd;
    for (long long t = blockIdx.y; t < T; t += gridDim.y) {
        const uint16_t *xt = x + t * x_t;
        uint16_t *yt = y + t * ldy;
        for (int i = 0; i <= nmix; i++) {
            float s = 0.0f;
            for (long long e = e0 + threadIdx.x; e < e1; e += HC_THREADS) {
                const float v = cu_bf16_f32(xt[(e / D) * x_j + e % D]);
                s = __fadd_rn(s, __fmul_rn(i < nmix ? fn[i * ldfn + e] : v, v));
            }
            s = block_sum(s, sh);
            if (threadIdx.x == 0) put_f32(yt, (long long)blockIdx.x * (nmix + 1) + i, s);
        }
    }
}

/* hc_dots_kernel for MIX1 = nmix + 1 known at compile time (the mHC sites of n = 4: 25 sums, the
 * head's 5): each x value read once for all the sums, each sum's warp butterfly, then one barrier
 * and the warps' partials added in warp order. Every sum's operations and their order are
 * hc_dots_kernel's (a thread's strided partial, the butterfly, the warps in order), so the bytes
 * are the same; only the 2 * MIX1 barriers and MIX1 re-reads of x are gone. */
template <int MIX1>
__global__ void __launch_bounds__(HC_THREADS) hc_dots_all_kernel(long long T, long long D, int n, const float *fn,
                                                                 long long ldfn, const uint16_t *x, long long x_t,
                                                                 long long x_j, uint16_t *y, long long ldy, int S)
{
    __shared__ float sh[HC_THREADS / 32][MIX1];
    cu_pdl_wait();
    cu_pdl_release();
    const long long nd = (long long)n * D, len = (nd + S - 1) / S;
    const long long e0 = blockIdx.x * len, e1 = e0 + len < nd ? e0 + len : nd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long t = blockIdx.y; t < T; t += gridDim.y) {
        const uint16_t *xt = x + t * x_t;
        uint16_t *yt = y + t * ldy;
        float s[MIX1];
#pragma unroll
        for (int i = 0; i < MIX1; i++) s[i] = 0.0f;
        for (long long e = e0 + threadIdx.x; e < e1; e += HC_THREADS) {
            const float v = cu_bf16_f32(xt[(e / D) * x_j + e % D]);
#pragma unroll
            for (int i = 0; i < MIX1 - 1; i++) s[i] = __fadd_rn(s[i], __fmul_rn(fn[i * ldfn + e], v));
            s[MIX1 - 1] = __fadd_rn(s[MIX1 - 1], __fmul_rn(v, v));
        }
#pragma unroll
        for (int i = 0; i < MIX1; i++) {
#pragma unroll
            for (int o = 16; o; o >>= 1) s[i] = __fadd_rn(s[i], __shfl_xor_sync(0xFFFFFFFFu, s[i], o));
            if (lane == 0) sh[warp][i] = s[i];
        }
        __syncthreads();
        if (threadIdx.x < MIX1) {
            float v = sh[0][threadIdx.x];
            for (int w = 1; w < HC_THREADS / 32; w++) v = __fadd_rn(v, sh[w][threadIdx.x]);
            put_f32(yt, (long long)blockIdx.x * MIX1 + threadIdx.x, v);
        }
        __syncthreads(); /* sh is reused for the next token */
    }
}

DSV4_CU_INLINE float sigmoid_rn(float z) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))); }

/* A cluster of HC_CLUSTER CTAs a token: each reads the partials it needs (CTA 0 all of them, the
 * others those of pre's sums), computes pre itself (the same operations: the same bits in every
 * CTA) and writes its HC_CLUSTER-th of the weighted sum; CTA 0's warp 0 computes post and the
 * combination (Sinkhorn) meanwhile. The partials sit in y's row, so no CTA writes y before every
 * CTA of the cluster has read them (the cluster barrier between them). One CTA a token waited on
 * its loads of all n * D stream values, n trips of a batch at a time (16 µs a call at D = 4096,
 * BENCHMARKS.md "The engine on the GPU"). */
/* Sinkhorn on warp 0 with lane i*n + k holding entry (i, k) of cm (n * n <= 32): each lane gathers
 * its row (column) by shuffles and sums it in the order of one thread, then divides its own entry,
 * so a phase is one division deep instead of n (the same operations: the same bits). NF = n known
 * at compile time (V4's n = 4) unrolls the gathers: a phase's shuffles issue together. */
template <int NF>
DSV4_CU_INLINE void sinkhorn_lanes(const float *cm, int n_rt, int iters, float eps, float *comb, long long comb_j)
{
    const int n = NF ? NF : n_rt, j = threadIdx.x, nn = n * n, ri = j < nn ? j / n : 0, ck = j < nn ? j % n : 0;
    float v = j < nn ? cm[j] : 0.0f;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < (NF ? NF : HC_MAX_N); k++)
                if (k < n) s = __fadd_rn(s, __shfl_sync(0xFFFFFFFFu, v, ri * n + k));
            v = __fdiv_rn(v, __fadd_rn(s, eps));
        }
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < (NF ? NF : HC_MAX_N); i++)
            if (i < n) s = __fadd_rn(s, __shfl_sync(0xFFFFFFFFu, v, i * n + ck));
        v = __fdiv_rn(v, __fadd_rn(s, eps));
    }
    if (j < nn) comb[ri * comb_j + ck] = v;
}

enum { HC_CLUSTER = 8, HC_SUM_AHEAD = 4, HC_PART_AHEAD = 8 /* 8 * HC_THREADS: a site's 25 sums of 64 slices in one batch */, HC_MIX_AHEAD = 16 };

__global__ void __cluster_dims__(HC_CLUSTER, 1, 1) __launch_bounds__(HC_THREADS)
    hc_finish_kernel(long long D, int n, int nmix, const float *scale, const float *base, int iters, float eps,
                     float norm_eps, const uint16_t *x, long long x_t, long long x_j, uint16_t *y, long long ldy, int S,
                     float *post_out, long long post_t, float *comb_out, long long comb_t, long long comb_j)
{
    namespace cg = cooperative_groups;
    __shared__ float mix[HC_MAX_MIX + 1], pre[HC_MAX_N], cm[HC_MAX_N * HC_MAX_N];
    __shared__ float part[HC_MAX_SLICES * (HC_MAX_MIX + 1)];
    cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    cu_pdl_wait();
    cu_pdl_release();
    const long long t = blockIdx.x / HC_CLUSTER;
    uint16_t *yt = y + t * ldy;
    const int m1 = nmix + 1, need = rank == 0 ? m1 : n + 1; /* sums a CTA needs: pre's n, then the squares' */
    /* The partials, every load of a thread before its stores: CTA 0 all S * m1 of them,
     * HC_PART_AHEAD a thread; the others those of thread p's slice p. */
    if (rank == 0) {
        constexpr int PA = HC_PART_AHEAD;
        for (int i0 = threadIdx.x; i0 < S * m1; i0 += PA * HC_THREADS) {
            float v[PA];
#pragma unroll
            for (int a = 0; a < PA; a++) v[a] = i0 + a * HC_THREADS < S * m1 ? get_f32(yt, i0 + a * HC_THREADS) : 0.0f;
#pragma unroll
            for (int a = 0; a < PA; a++)
                if (i0 + a * HC_THREADS < S * m1) part[i0 + a * HC_THREADS] = v[a];
        }
    } else if ((int)threadIdx.x < S) {
        const int p = threadIdx.x;
        float v[HC_MAX_N + 1];
#pragma unroll
        for (int r = 0; r <= HC_MAX_N; r++) v[r] = r < n ? get_f32(yt, p * m1 + r) : r == n ? get_f32(yt, p * m1 + nmix) : 0.0f;
#pragma unroll
        for (int r = 0; r <= HC_MAX_N; r++)
            if (r <= n) part[p * m1 + (r < n ? r : nmix)] = v[r];
    }
    __syncthreads();
    cl.barrier_arrive(); /* this CTA's reads of the partials are done */
    /* the sums in slice order, HC_MIX_AHEAD partials read before they are added */
    for (int i = threadIdx.x; i < need; i += HC_THREADS) {
        const int row = i < n || rank == 0 ? i : nmix;
        constexpr int MA = HC_MIX_AHEAD;
        float s = part[row];
        for (int p0 = 1; p0 < S; p0 += MA) {
            float v[MA];
#pragma unroll
            for (int a = 0; a < MA; a++) v[a] = p0 + a < S ? part[(p0 + a) * m1 + row] : 0.0f;
#pragma unroll
            for (int a = 0; a < MA; a++)
                if (p0 + a < S) s = __fadd_rn(s, v[a]);
        }
        mix[row] = s;
    }
    __syncthreads();
    /* Warp 0: lane j < n takes row j (pre, post, the row's softmax, the row phases of Sinkhorn)
     * and column j (the column phases), with the operations and order of one thread doing every
     * row and column in turn (hc_pre of layer_ref.c), so the results are that thread's. */
    const int j = threadIdx.x;
    float r = 0.0f;
    if (j < 32) {
        r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(mix[nmix], (float)((long long)n * D)), norm_eps)));
        if (j < n) pre[j] = __fadd_rn(sigmoid_rn(__fadd_rn(__fmul_rn(__fmul_rn(mix[j], r), scale[0]), base[j])), eps);
    }
    __syncthreads(); /* pre is set */
    /* CTA 0's warp 0: post and the combination (Sinkhorn) while the other warps write the sum */
    if (rank == 0 && j < 32) {
        if (j < n) {
            if (nmix != n) {
                post_out[t * post_t + j] =
                    __fmul_rn(2.0f, sigmoid_rn(__fadd_rn(__fmul_rn(__fmul_rn(mix[n + j], r), scale[1]), base[n + j])));
                float *row = cm + j * n; /* row softmax, then + eps */
                for (int k = 0; k < n; k++)
                    row[k] = __fadd_rn(__fmul_rn(__fmul_rn(mix[2 * n + j * n + k], r), scale[2]), base[2 * n + j * n + k]);
                float mx = row[0], s = 0.0f;
                for (int k = 1; k < n; k++) mx = row[k] > mx ? row[k] : mx;
                for (int k = 0; k < n; k++) s = __fadd_rn(s, row[k] = expf(__fsub_rn(row[k], mx)));
                for (int k = 0; k < n; k++) row[k] = __fadd_rn(__fdiv_rn(row[k], s), eps);
            }
        }
        __syncwarp();
        if (nmix != n && n == 4) sinkhorn_lanes<4>(cm, n, iters, eps, comb_out + t * comb_t, comb_j);
        else if (nmix != n && n * n <= 32) sinkhorn_lanes<0>(cm, n, iters, eps, comb_out + t * comb_t, comb_j);
        else if (nmix != n) {
            for (int it = 0; it < iters; it++) {
                if (it > 0) {
                    if (j < n) {
                        float s = 0.0f;
                        for (int k = 0; k < n; k++) s = __fadd_rn(s, cm[j * n + k]);
                        for (int k = 0; k < n; k++) cm[j * n + k] = __fdiv_rn(cm[j * n + k], __fadd_rn(s, eps));
                    }
                    __syncwarp();
                }
                if (j < n) {
                    const int k = j; /* column k */
                    float s = 0.0f;
                    for (int i = 0; i < n; i++) s = __fadd_rn(s, cm[i * n + k]);
                    for (int i = 0; i < n; i++) cm[i * n + k] = __fdiv_rn(cm[i * n + k], __fadd_rn(s, eps));
                }
                __syncwarp();
            }
            for (int i = j; i < n * n; i += 32) comb_out[t * comb_t + (i / n) * comb_j + i % n] = cm[i];
        }
        cl.barrier_wait();
        return;
    }
    const uint16_t *xt = x + t * x_t;
    /* this CTA's part of the weighted sum, HC_SUM_AHEAD elements of every stream a thread at a time,
     * all their loads before the sums (x and y are distinct buffers, which the compiler cannot
     * know); the stores wait for every CTA's reads of the partials. Offsets within the part are
     * 32-bit (a part is at most D / HC_CLUSTER + 1 elements; dsv4_cu_hc_pre_launch bounds D). */
    const int first = rank == 0 ? 32 : 0, sumt = HC_THREADS - first;
    const long long chunk = (D + HC_CLUSTER - 1) / HC_CLUSTER, lo = rank * chunk, hi = lo + chunk < D ? lo + chunk : D;
    const int len = hi > lo ? (int)(hi - lo) : 0;
    const uint16_t *xs[HC_MAX_N];
#pragma unroll
    for (int h = 0; h < HC_MAX_N; h++) xs[h] = xt + (h < n ? h : 0) * x_j + lo;
    uint16_t *ys = yt + lo;
    constexpr int A = HC_SUM_AHEAD;
    bool waited = false;
    for (int d0 = (int)threadIdx.x - first; d0 < len; d0 += A * sumt) {
        float v[HC_MAX_N][A];
#pragma unroll
        for (int h = 0; h < HC_MAX_N; h++)
#pragma unroll
            for (int a = 0; a < A; a++) {
                const int d = d0 + a * sumt;
                v[h][a] = h < n && d < len ? cu_bf16_f32(__ldg(xs[h] + d)) : 0.0f;
            }
        if (!waited) cl.barrier_wait(), waited = true;
#pragma unroll
        for (int a = 0; a < A; a++) {
            const int d = d0 + a * sumt;
            if (d >= len) continue;
            float s = __fmul_rn(pre[0], v[0][a]);
#pragma unroll
            for (int h = 1; h < HC_MAX_N; h++)
                if (h < n) s = __fadd_rn(s, __fmul_rn(pre[h], v[h][a]));
            ys[d] = (uint16_t)cu_f32_bf16(s);
        }
    }
    if (!waited) cl.barrier_wait();
}

extern "C" int dsv4_cu_hc_slices(long long D, int nmix)
{
    long long s = 2 * D / (4 * (long long)(nmix + 1));
    const long long work = (4 * D + HC_THREADS - 1) / HC_THREADS;
    if (s > HC_MAX_SLICES) s = HC_MAX_SLICES;
    if (s > work) s = work;
    return (int)s;
}

extern "C" int dsv4_cu_hc_pre_launch(const dsv4_cu_hc_pre *a, void *stream)
{
    if (a->T == 0) return 0;
    const int S = dsv4_cu_hc_slices(a->D, a->nmix);
    if (S < 1 || a->n < 1 || a->n > HC_MAX_N || a->T > 0x7FFFFFFFll / HC_CLUSTER || a->D > 0x7FFFFFFFll)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)S, (unsigned)(a->T < 65535 ? a->T : 65535));
    const bool pdl = dsv4_cu_linear_pdl() != 0;
    cudaError_t e;
    if (a->nmix + 1 == 25)
        e = cu_launch_dependent(hc_dots_all_kernel<25>, grid, HC_THREADS, s, pdl, a->T, a->D, a->n, a->fn, a->ldfn, a->x,
                                a->x_t, a->x_j, a->y, a->ldy, S);
    else if (a->nmix + 1 == 5)
        e = cu_launch_dependent(hc_dots_all_kernel<5>, grid, HC_THREADS, s, pdl, a->T, a->D, a->n, a->fn, a->ldfn, a->x,
                                a->x_t, a->x_j, a->y, a->ldy, S);
    else
        e = cu_launch_dependent(hc_dots_kernel, grid, HC_THREADS, s, pdl, a->T, a->D, a->n, a->nmix, a->fn, a->ldfn, a->x,
                                a->x_t, a->x_j, a->y, a->ldy, S);
    if (e != cudaSuccess) return (int)e;
    return (int)cu_launch_dependent(hc_finish_kernel, dim3((unsigned)(a->T * HC_CLUSTER)), HC_THREADS, s, pdl, a->D, a->n, a->nmix,
                                    a->scale, a->base, a->iters, a->eps, a->norm_eps, a->x, a->x_t, a->x_j, a->y, a->ldy,
                                    S, a->post_out, a->post_t, a->comb_out, a->comb_t, a->comb_j);
}

/* ---- router ------------------------------------------------------------------------------- */
/* include/dsv4/layer.h dsv4_route: the gate dots in fp32 (a lane's strided partial sums, then a
 * butterfly: another order than the CPU's), the score of layer_ref.c dsv4_router_score with the
 * device's expf/log1pf (within 2 ulp of glibc's), then the selection and normalization of
 * layer_ref.c exactly (the same total order of keys, one rounding per operation). */
enum { RT_THREADS = 1024, RT_WARPS = RT_THREADS / 32 };

DSV4_CU_INLINE long long ld_index(const void *p, int i64, long long i)
{
    return i64 ? ((const long long *)p)[i] : (long long)((const int32_t *)p)[i];
}

DSV4_CU_INLINE float router_score(float z) { return __fsqrt_rn(z > 20.0f ? z : log1pf(expf(z))); }

/* (ka, ia) ranks before (kb, ib): larger key first, ties to the lower index, NaN below numbers. */
DSV4_CU_INLINE bool ranks_before(float ka, int ia, float kb, int ib)
{
    if (isnan(kb)) return !isnan(ka) || ia < ib;
    if (isnan(ka)) return false;
    return ka > kb || (ka == kb && ia < ib);
}

/* Σ_k w[k]·x[k] over a warp (every lane gets it). */
DSV4_CU_INLINE float warp_dot(const void *w, int w_bf16, const void *x, int x_bf16, long long d, int lane)
{
    float s = 0.0f;
    for (long long k = lane; k < d; k += 32) s = fmaf(ld_any(w, w_bf16, k), ld_any(x, x_bf16, k), s);
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    return s;
}

/* The gate dot of warp_dot for BF16 weights in 16-byte-aligned rows, its operations in its order
 * (lane l's fmaf chain over k = l, l + 32, ..., then the butterfly): the warp streams the row in
 * tiles of RT_TILE values through a ring of RT_RING tiles in shared memory (cp.async, a lane 16
 * bytes of each tile, RT_RING tiles in flight), from which lane l reads its values l + 32 i of a
 * tile in order. With `pre`, the ring's first RT_RING tiles were issued already (before the
 * kernel's cu_pdl_wait). Every call commits one group per tile plus RT_RING, so the count of
 * pending groups the waits rely on holds from call to call. */
enum { RT_TILE = 256, RT_RING = 8 };

DSV4_CU_INLINE void rt_issue(const uint16_t *w, long long tiles, long long i, uint16_t *ring, int lane)
{
    if (i < tiles) cu_cp_async16(cu_smem(ring + (i % RT_RING) * RT_TILE + 8 * lane), w + i * RT_TILE + 8 * lane);
    cu_cp_async_commit(); /* empty past the last tile: the groups stay one per step */
}

DSV4_CU_INLINE float warp_dot_ring(const uint16_t *w, const void *x, int x_bf16, long long d, int lane, uint16_t *ring,
                                   bool pre)
{
    const long long tiles = d / RT_TILE;
    if (!pre)
        for (int i = 0; i < RT_RING; i++) rt_issue(w, tiles, i, ring, lane);
    float s = 0.0f;
    for (long long i = 0; i < tiles; i++) {
        cu_cp_async_wait<RT_RING - 1>(); /* tile i has landed (this lane's part) */
        __syncwarp();                    /* ... and every lane's */
        const uint16_t *tl = ring + (i % RT_RING) * RT_TILE;
        const long long k0 = i * RT_TILE + lane;
#pragma unroll
        for (int j = 0; j < RT_TILE / 32; j++) s = fmaf(cu_bf16_f32(tl[lane + 32 * j]), ld_any(x, x_bf16, k0 + 32 * j), s);
        __syncwarp(); /* the slot is refilled next */
        rt_issue(w, tiles, i + RT_RING, ring, lane);
    }
    for (long long k = tiles * RT_TILE + lane; k < d; k += 32) s = fmaf(cu_bf16_f32(w[k]), ld_any(x, x_bf16, k), s);
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    return s;
}

/* A cluster of RT_CLUSTER CTAs per token (RT_CLUSTER * RT_WARPS warps): warp g of the cluster
 * takes experts g, g + RT_CLUSTER * RT_WARPS, ... (or the table's slots) and writes their scores
 * into CTA 0's shared memory; after the cluster barrier CTA 0 alone selects: the keys (score +
 * bias) in shared memory, then warp 0 takes topk rounds of a warp-wide maximum under
 * ranks_before. Launched as a programmatic dependent: before cu_pdl_wait it reads only its gate
 * rows' first tiles. */
enum { RT_CLUSTER = 8, RT_GWARPS = RT_CLUSTER * RT_WARPS, RT_SMEM = RT_WARPS * RT_RING * RT_TILE * 2 };

__global__ void __cluster_dims__(RT_CLUSTER, 1, 1) __launch_bounds__(RT_THREADS) route_kernel(dsv4_cu_route a)
{
    namespace cg = cooperative_groups;
    __shared__ float score[DSV4_CU_ROUTE_MAX_EXPERTS], key[DSV4_CU_ROUTE_MAX_EXPERTS];
    __shared__ unsigned char used[DSV4_CU_ROUTE_MAX_EXPERTS];
    __shared__ int sel[DSV4_CU_ROUTE_MAX_TOPK];
    __shared__ float sel_w[DSV4_CU_ROUTE_MAX_TOPK];
    extern __shared__ __align__(16) uint16_t rt_rings[]; /* RT_WARPS rings of RT_RING tiles */
    cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    const long long t = blockIdx.x / RT_CLUSTER;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gw = (int)rank * RT_WARPS + warp;
    const size_t wrow = (size_t)a.ldw * (a.w_bf16 ? 2 : 4);
    const bool tiled = a.w_bf16 && ((uintptr_t)a.w & 15u) == 0 && (wrow & 15u) == 0;
    uint16_t *ring = rt_rings + (size_t)warp * RT_RING * RT_TILE;
    const bool pre = tiled && !a.tid2eid && gw < a.E;
    if (pre)
        for (int i = 0; i < RT_RING; i++) rt_issue((const uint16_t *)((const char *)a.w + gw * wrow), a.D / RT_TILE, i, ring, lane);
    cl.barrier_arrive(); /* every CTA of the cluster has started before CTA 0's memory is written */
    cu_pdl_wait();
    cu_pdl_release();
    float *score0 = cl.map_shared_rank(score, 0u), *sel_w0 = cl.map_shared_rank(sel_w, 0u);
    int *sel0 = cl.map_shared_rank(sel, 0u);
    const void *xt = (const char *)a.x + t * a.ldx * (a.x_bf16 ? 2 : 4);
    if (a.tid2eid) {
        const long long tok = gw < a.topk ? ld_index(a.token_ids, a.tok_i64, t * a.tok_stride) : -1;
        float z = 0.0f;
        long long e = -1;
        if (gw < a.topk) {
            e = tok >= 0 && tok < a.V ? ld_index(a.tid2eid, a.tid_i64, tok * a.ldtid + gw) : -1;
            const bool ok = e >= 0 && e < a.E; /* the table in device memory: checked here */
            if (!ok) e = -1;
            else {
                const void *wr = (const char *)a.w + e * wrow;
                z = tiled ? warp_dot_ring((const uint16_t *)wr, xt, a.x_bf16, a.D, lane, ring, false)
                          : warp_dot(wr, a.w_bf16, xt, a.x_bf16, a.D, lane);
            }
        }
        cl.barrier_wait();
        if (gw < a.topk && lane == 0) sel0[gw] = (int)e, sel_w0[gw] = e >= 0 ? router_score(z) : 0.0f;
        for (int s = gw + RT_GWARPS; s < a.topk; s += RT_GWARPS) { /* more slots than warps: never at V4's sizes */
            const long long e2 = tok >= 0 && tok < a.V ? ld_index(a.tid2eid, a.tid_i64, tok * a.ldtid + s) : -1;
            const bool ok = e2 >= 0 && e2 < a.E;
            const float z2 = ok ? warp_dot((const char *)a.w + e2 * wrow, a.w_bf16, xt, a.x_bf16, a.D, lane) : 0.0f;
            if (lane == 0) sel0[s] = ok ? (int)e2 : -1, sel_w0[s] = ok ? router_score(z2) : 0.0f;
        }
    } else {
        float z = 0.0f;
        if (gw < a.E) {
            const void *wr = (const char *)a.w + gw * wrow;
            z = tiled ? warp_dot_ring((const uint16_t *)wr, xt, a.x_bf16, a.D, lane, ring, true)
                      : warp_dot(wr, a.w_bf16, xt, a.x_bf16, a.D, lane);
        }
        cl.barrier_wait();
        if (gw < a.E && lane == 0) score0[gw] = router_score(z);
        for (int e = gw + RT_GWARPS; e < a.E; e += RT_GWARPS) {
            const void *wr = (const char *)a.w + e * wrow;
            const float z2 = tiled ? warp_dot_ring((const uint16_t *)wr, xt, a.x_bf16, a.D, lane, ring, false)
                                   : warp_dot(wr, a.w_bf16, xt, a.x_bf16, a.D, lane);
            if (lane == 0) score0[e] = router_score(z2);
        }
    }
    cl.sync(); /* the scores (or slots) are in CTA 0's memory */
    if (rank != 0) return;
    if (!a.tid2eid) {
        for (int e = threadIdx.x; e < a.E; e += RT_THREADS)
            used[e] = 0, key[e] = a.bias ? __fadd_rn(score[e], a.bias[e]) : score[e];
        __syncthreads();
        if (warp == 0)
            for (int s = 0; s < a.topk; s++) {
                float bk = 0.0f;
                int bi = -1;
                for (int e = lane; e < a.E; e += 32) {
                    if (used[e]) continue;
                    if (bi < 0 || ranks_before(key[e], e, bk, bi)) bk = key[e], bi = e;
                }
#pragma unroll
                for (int o = 16; o; o >>= 1) {
                    const float ok = __shfl_xor_sync(0xFFFFFFFFu, bk, o);
                    const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
                    if (oi >= 0 && (bi < 0 || ranks_before(ok, oi, bk, bi))) bk = ok, bi = oi;
                }
                __syncwarp(); /* every lane's reads of used[] before lane 0 marks the winner */
                if (lane == 0) sel[s] = bi, sel_w[s] = score[bi], used[bi] = 1;
                __syncwarp();
            }
        __syncthreads();
    }
    if (threadIdx.x == 0) { /* layer_ref.c dsv4_route_normalize: the sum in slot order */
        float sum = 0.0f;
        for (int s = 0; s < a.topk; s++) sum = __fadd_rn(sum, sel_w[s]);
        for (int s = 0; s < a.topk; s++) {
            a.ids[t * a.ldids + s] = sel[s];
            a.weights[t * a.ldweights + s] = sel[s] < 0 ? 0.0f : __fmul_rn(__fdiv_rn(sel_w[s], sum), a.route_scale);
        }
    }
}

extern "C" int dsv4_cu_route_launch(const dsv4_cu_route *a, void *stream)
{
    if (a->T == 0) return 0;
    if (a->T > 0x7FFFFFFFll || a->E > DSV4_CU_ROUTE_MAX_EXPERTS || a->topk > DSV4_CU_ROUTE_MAX_TOPK)
        return (int)cudaErrorInvalidConfiguration;
    if (a->T > 0x7FFFFFFFll / RT_CLUSTER) return (int)cudaErrorInvalidConfiguration;
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    int device = -1;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return (int)e;
    const int err = cu_smem_opt_in(configured, device, route_kernel, RT_SMEM);
    if (err) return err;
    return (int)cu_launch_dependent_smem(route_kernel, dim3((unsigned)(a->T * RT_CLUSTER)), RT_THREADS, RT_SMEM,
                                         (cudaStream_t)stream, dsv4_cu_linear_pdl() != 0, *a);
}
