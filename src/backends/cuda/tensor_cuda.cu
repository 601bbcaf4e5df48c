/* The tensor family on the GPU (include/dsv4/tensor_ops.h): embedding rows, the BF16 residual
 * add and row copies. Copies move 16-byte words where the addresses allow and bytes otherwise, so
 * every backend writes the same bytes; the add is one fp32 add rounded once, with the NaN rule of
 * the CPU kernels (a's NaN, else b's, else the x86 default NaN, which is negative). */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

/* One CTA per destination row: `bytes` bytes from src to dst. */
DSV4_CU_INLINE void copy_row(const uint8_t *src, uint8_t *dst, long long bytes)
{
    if ((((uintptr_t)src | (uintptr_t)dst) & 15u) == 0) {
        const long long n16 = bytes / 16;
        for (long long i = threadIdx.x; i < n16; i += blockDim.x) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
        for (long long i = n16 * 16 + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    } else {
        for (long long i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

/* An id outside [0, V) gives a row of zeros (the ids are not read on the host: tensor_cuda.c). */
__global__ void embed_kernel(const uint16_t *table, long long ldt, long long v, long long d, const int32_t *ids,
                             long long ids_s, uint16_t *out, long long so_t, long long so_j, long long copies)
{
    const long long t = blockIdx.x / copies, j = blockIdx.x % copies, id = ids[t * ids_s];
    uint16_t *o = out + t * so_t + j * so_j;
    if (id < 0 || id >= v) {
        for (long long i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0;
        return;
    }
    copy_row((const uint8_t *)(table + id * ldt), (uint8_t *)o, d * 2);
}

__global__ void copy_rows_kernel(const uint8_t *src, long long lds, const int32_t *idx, long long idx_s, uint8_t *dst,
                                 long long ldd, long long row_bytes)
{
    const long long i = blockIdx.x, r = idx ? (long long)idx[i * idx_s] : i;
    copy_row(src + r * lds, dst + i * ldd, row_bytes);
}

__global__ void add_kernel(long long n, long long d, const uint16_t *a, long long sa_t, long long sa_j,
                           const uint16_t *b, long long sb_t, uint16_t *y, long long sy_t, long long sy_j)
{
    const long long t = blockIdx.x / n, j = blockIdx.x % n;
    const uint16_t *ar = a + t * sa_t + j * sa_j, *br = b + t * sb_t;
    uint16_t *yr = y + t * sy_t + j * sy_j;
    for (long long i = threadIdx.x; i < d; i += blockDim.x) {
        const float fa = cu_bf16_f32(ar[i]), fb = cu_bf16_f32(br[i]);
        float s = __fadd_rn(fa, fb);
        if (isnan(fa)) s = fa;
        else if (isnan(fb)) s = fb;
        else if (isnan(s)) s = __uint_as_float(0xFFC00000u);
        yr[i] = (uint16_t)cu_f32_bf16(s);
    }
}

__global__ void paged_slots_kernel(const int32_t *table, long long n_blocks, long long block_size,
                                   const int32_t *entries, long long es, int32_t *slots, long long ss, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t e = entries[i * es];
    slots[i * ss] = e < 0 || (long long)e >= n_blocks * block_size
                        ? -1
                        : (int32_t)((long long)table[e / block_size] * block_size + e % block_size);
}

static unsigned threads_for(long long bytes) { return bytes >= 4096 ? 256 : bytes >= 1024 ? 128 : 64; }

extern "C" int dsv4_cu_embed_launch(const uint16_t *table, long long ldt, long long v, long long d, const int32_t *ids,
                                    long long ids_s, long long t, uint16_t *out, long long so_t, long long so_j,
                                    long long copies, void *stream)
{
    if (t * copies == 0) return 0;
    if (t * copies > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    embed_kernel<<<(unsigned)(t * copies), threads_for(d * 2), 0, (cudaStream_t)stream>>>(table, ldt, v, d, ids,
                                                                                          ids_s, out, so_t, so_j, copies);
    return (int)cudaGetLastError();
}

extern "C" int dsv4_cu_add_bf16_launch(long long t, long long n, long long d, const uint16_t *a, long long sa_t,
                                       long long sa_j, const uint16_t *b, long long sb_t, uint16_t *y, long long sy_t,
                                       long long sy_j, void *stream)
{
    if (t * n == 0 || d == 0) return 0;
    if (t * n > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    add_kernel<<<(unsigned)(t * n), threads_for(d * 2), 0, (cudaStream_t)stream>>>(n, d, a, sa_t, sa_j, b, sb_t, y,
                                                                                   sy_t, sy_j);
    return (int)cudaGetLastError();
}

extern "C" int dsv4_cu_copy_rows_launch(const void *src, long long lds, const int32_t *idx, long long idx_s, void *dst,
                                        long long ldd, long long n, long long row_bytes, void *stream)
{
    if (n == 0 || row_bytes == 0) return 0;
    if (n > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    copy_rows_kernel<<<(unsigned)n, threads_for(row_bytes), 0, (cudaStream_t)stream>>>(
        (const uint8_t *)src, lds, idx, idx_s, (uint8_t *)dst, ldd, row_bytes);
    return (int)cudaGetLastError();
}

extern "C" int dsv4_cu_paged_slots_launch(const int32_t *table, long long n_blocks, long long block_size,
                                          const int32_t *entries, long long es, int32_t *slots, long long ss, long long n,
                                          void *stream)
{
    if (n == 0) return 0;
    if (n > 0x7FFFFFFFll * 256) return (int)cudaErrorInvalidConfiguration;
    paged_slots_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(table, n_blocks, block_size, entries,
                                                                                      es, slots, ss, n);
    return (int)cudaGetLastError();
}
