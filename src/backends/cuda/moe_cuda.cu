/* The MoE block's own kernels (core/ops_layer.h dsv4_moe_args): the grouping of the (token, slot)
 * pairs by expert, the gather of their rows and the combine, all on the device so that the block
 * never waits on the host. The grouping is the counting sort of layer_cpu.c moe_group (stable:
 * the pairs of one expert in pair order), the combine the sums of layer_ref.c sum_rows in the same
 * order, so with the same expert outputs y is bit for bit cpu-ref's. Each is launched as a
 * programmatic dependent of the kernel before it (linear_cuda.cu, "launches"): it waits for that
 * kernel before touching memory and then lets the next one start. */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

enum { GROUP_THREADS = 1024, GROUP_WARPS = GROUP_THREADS / 32, ROW_THREADS = 256 };

DSV4_CU_INLINE int pair_expert(const int32_t *ids, long long ldids, int k, int E, long long p)
{
    const int e = ids[(p / k) * ldids + p % k];
    return e >= 0 && e < E ? e : -1;
}

/* One CTA, E < GROUP_THREADS. In shared memory cur[e + 1] counts expert e, a block-wide scan (one
 * element per thread: warp scans, then the warps' totals) turns cur[e] into e's first row and then
 * its cursor; the pairs are placed a chunk of GROUP_THREADS at a time, warp after warp, a warp's
 * lanes of one expert by their rank among themselves, so every pair keeps its pair order; the
 * offsets are written once at the end (the cursors stand at each expert's end). */
__global__ void __launch_bounds__(GROUP_THREADS) moe_group_kernel(const int32_t *ids, long long ldids,
                                                                  const float *weights, long long ldweights,
                                                                  long long T, int k, int E, int32_t *off,
                                                                  int32_t *order, int32_t *pos, float *wsorted)
{
    __shared__ int cur[GROUP_THREADS], warp_sum[GROUP_WARPS];
    const long long R = T * k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    cu_pdl_wait();
    cu_pdl_release();
    cur[threadIdx.x] = 0;
    __syncthreads();
    for (long long p = threadIdx.x; p < R; p += GROUP_THREADS) {
        const int e = pair_expert(ids, ldids, k, E, p);
        if (e >= 0) atomicAdd(&cur[e + 1], 1);
    }
    __syncthreads();
    int v = cur[threadIdx.x]; /* inclusive scan of cur[0 .. GROUP_THREADS) */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xFFFFFFFFu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) warp_sum[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = warp_sum[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xFFFFFFFFu, w, o);
            if (lane >= o) w += u;
        }
        warp_sum[lane] = w;
    }
    __syncthreads();
    cur[threadIdx.x] = v + (warp ? warp_sum[warp - 1] : 0);
    __syncthreads();
    const int kept = cur[E];
    for (long long c = 0; c < R; c += GROUP_THREADS) {
        const long long p = c + threadIdx.x;
        const int e = p < R ? pair_expert(ids, ldids, k, E, p) : -1;
        const unsigned same = __match_any_sync(0xFFFFFFFFu, e);
        const int rank = __popc(same & ((1u << lane) - 1u));
        /* only the warps that hold pairs of the chunk take turns (a decode step's 6 pairs: one) */
        const long long left = (R - c + 31) / 32;
        const int turns = left < GROUP_WARPS ? (int)left : GROUP_WARPS;
        for (int w = 0; w < turns; w++) {
            if (w == warp && p < R) {
                if (e >= 0) {
                    const int i = cur[e] + rank;
                    order[i] = (int32_t)p;
                    pos[p] = i;
                    wsorted[i] = weights[(p / k) * ldweights + p % k];
                } else {
                    pos[p] = -1;
                }
            }
            __syncwarp();
            if (w == warp && e >= 0 && rank == 0) cur[e] += __popc(same);
            __syncthreads();
        }
    }
    for (long long i = kept + threadIdx.x; i < R; i += GROUP_THREADS) order[i] = -1, wsorted[i] = 0.0f;
    for (int e = threadIdx.x; e <= E; e += GROUP_THREADS) off[e] = e ? cur[e - 1] : 0;
}

extern "C" int dsv4_cu_moe_group_launch(const int32_t *ids, long long ldids, const float *weights,
                                        long long ldweights, long long T, int k, int E, int32_t *offsets,
                                        int32_t *order, int32_t *pos, float *wsorted, void *stream)
{
    static_assert(DSV4_CU_MOE_MAX_EXPERTS < GROUP_THREADS, "cur[E] is a thread's element");
    if (E < 1 || E > DSV4_CU_MOE_MAX_EXPERTS) return (int)cudaErrorInvalidValue;
    return (int)cu_launch_dependent(moe_group_kernel, dim3(1), GROUP_THREADS, (cudaStream_t)stream, dsv4_cu_linear_pdl(),
                                    ids, ldids, weights, ldweights, T, k, E, offsets, order, pos, wsorted);
}

__global__ void __launch_bounds__(ROW_THREADS) moe_gather_kernel(const uint16_t *x, long long ldx,
                                                                 const int32_t *order, int k, long long D,
                                                                 uint16_t *xg)
{
    const long long i = blockIdx.x;
    cu_pdl_wait();
    cu_pdl_release();
    const int p = order[i];
    const uint16_t *src = p >= 0 ? x + (long long)(p / k) * ldx : nullptr;
    for (long long d = threadIdx.x; d < D; d += ROW_THREADS) xg[i * D + d] = src ? src[d] : (uint16_t)0;
}

extern "C" int dsv4_cu_moe_gather_launch(const uint16_t *x, long long ldx, const int32_t *order, int k, long long R,
                                         long long D, uint16_t *xg, void *stream)
{
    if (R == 0) return 0;
    if (R > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    return (int)cu_launch_dependent(moe_gather_kernel, dim3((unsigned)R), ROW_THREADS, (cudaStream_t)stream,
                                    dsv4_cu_linear_pdl(), x, ldx, order, k, D, xg);
}

/* CTA (t, j): token t's elements j·ROW_THREADS + i·(ROW_THREADS·gridDim.y) + thread; its kept slots
 * sorted by (expert, slot) (every CTA of the token sorts them), then per element the fp32 sum in
 * that order, the shared expert last, rounded once. One CTA a token took 33 µs for one token
 * (D = 4096, ncu, BENCHMARKS.md "Linear layers on the GPU"): 16 dependent trips of 7 loads. */
__global__ void __launch_bounds__(ROW_THREADS) moe_combine_kernel(const int32_t *ids, long long ldids,
                                                                  const int32_t *pos, int k, int E,
                                                                  const uint16_t *out, const uint16_t *shared,
                                                                  long long D, uint16_t *y, long long ldy)
{
    __shared__ int rows[DSV4_CU_ROUTE_MAX_TOPK];
    __shared__ int nrows;
    const long long t = blockIdx.x;
    cu_pdl_wait();
    cu_pdl_release();
    if (threadIdx.x == 0) {
        int slot[DSV4_CU_ROUTE_MAX_TOPK], n = 0;
        for (int s = 0; s < k; s++) {
            const int e = pair_expert(ids, ldids, k, E, t * k + s);
            if (e < 0) continue;
            int q = n++;
            while (q > 0 && ids[t * ldids + slot[q - 1]] > e) slot[q] = slot[q - 1], q--;
            slot[q] = s;
        }
        for (int i = 0; i < n; i++) rows[i] = pos[t * k + slot[i]];
        nrows = n;
    }
    __syncthreads();
    const int n = nrows;
    for (long long d = (long long)blockIdx.y * ROW_THREADS + threadIdx.x; d < D; d += (long long)gridDim.y * ROW_THREADS) {
        float s = 0.0f;
        for (int r = 0; r < n; r++) s = __fadd_rn(s, cu_bf16_f32(out[(long long)rows[r] * D + d]));
        if (shared) s = __fadd_rn(s, cu_bf16_f32(shared[t * D + d]));
        y[t * ldy + d] = (uint16_t)cu_f32_bf16(s);
    }
}

extern "C" int dsv4_cu_moe_combine_launch(const int32_t *ids, long long ldids, const int32_t *pos, int k, int E,
                                          const uint16_t *out, const uint16_t *shared, long long T, long long D,
                                          uint16_t *y, long long ldy, int split, void *stream)
{
    if (T == 0) return 0;
    if (T > 0x7FFFFFFFll || k > DSV4_CU_ROUTE_MAX_TOPK) return (int)cudaErrorInvalidConfiguration;
    const long long dy = (D + ROW_THREADS - 1) / ROW_THREADS;
    const dim3 grid((unsigned)T, (unsigned)(!split || dy < 1 ? 1 : dy < 65535 ? dy : 65535));
    return (int)cu_launch_dependent(moe_combine_kernel, grid, ROW_THREADS, (cudaStream_t)stream,
                                    dsv4_cu_linear_pdl(), ids, ldids, pos, k, E, out, shared, D, y, ldy);
}
