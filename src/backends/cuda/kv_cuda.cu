/* CUDA kernels of the KV side (docs/kernels.md §1-§2, §4.1): fused q-norm + RoPE + FP8 insert (one
 * launch), KV-only insert, dequant-gather, inverse RoPE and RoPE tables. One warp per 512-wide
 * row, 16 consecutive dims per lane: lanes 0..27 hold the 448 nope dims (4 lanes per 64-dim
 * scale group), lanes 28..31 the 64 RoPE dims. Products and sums that the CPU reference rounds
 * one by one use the _rn intrinsics so that no multiply-add is contracted: the cache bytes are
 * then identical to the CPU backends'. Device data is not range-checked by the op layer: a slot
 * outside the cache or a position outside the table skips that row, and a slot written twice in
 * one call keeps the later row (as the sequential CPU loop does). */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "formats/kv_entry.h"

#define WARPS_PER_BLOCK 8
/* One warp per entry row, 16 dims per lane: lanes 0..27 the E4M3 groups (4 lanes each), 28..31 the BF16 part. */
static_assert(DSV4_KVE_DIM == 32 * 16 && DSV4_KVE_NOPE_DIM == 28 * 16 && DSV4_KVE_GROUP == 4 * 16,
              "kv_cuda.cu: the lane map assumes the 448 + 64 entry of formats/kv_entry.h");

/* 16 BF16 values (two 16-byte loads) -> floats. */
static DSV4_CU_INLINE void load_row16(const uint16_t *p, float *v)
{
    uint4 a = cu_ld16(p), b = cu_ld16(p + 8);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[2 * i] = cu_bf16_f32(w[i]);
        v[2 * i + 1] = cu_bf16_f32(w[i] >> 16);
    }
}

static DSV4_CU_INLINE void store_row16(uint16_t *p, const uint32_t *bits)
{
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (bits[2 * i] & 0xFFFFu) | (bits[2 * i + 1] << 16);
    cu_st16(p, make_uint4(w[0], w[1], w[2], w[3]));
    cu_st16(p + 8, make_uint4(w[4], w[5], w[6], w[7]));
}

/* GPT-J rotation of this lane's 8 pairs (lanes 28..31) by row `pos` of the table; sign -1 rotates
 * back. Each product is rounded, then the sum: a' = a c - b s, b' = a s + b c. */
static DSV4_CU_INLINE void rotate8(float *v, const float *rope, long long pos, int lane, float sign)
{
    const float *cs = rope + pos * 64;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int pi = (lane - 28) * 8 + i;
        float c = cs[pi], s = sign * cs[32 + pi];
        float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

static DSV4_CU_INLINE void q_row(const dsv4_cu_insert &a, long long i, long long head, int lane)
{
    long long pos = a.positions[i];
    if (pos < 0 || pos >= a.max_pos) return;
    uint16_t *row = a.q + i * a.q_st + head * a.q_sh + lane * 16;
    float v[16];
    load_row16(row, v);
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; k++) ss = __fadd_rn(ss, __fmul_rn(v[k], v[k]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xFFFFFFFFu, ss, off));
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(ss, 1.0f / 512.0f), a.eps)));
#pragma unroll
    for (int k = 0; k < 16; k++) v[k] = __fmul_rn(v[k], r);
    if (lane >= 28) rotate8(v, a.rope, pos, lane, 1.0f);
    uint32_t bits[16];
#pragma unroll
    for (int k = 0; k < 16; k++) bits[k] = cu_f32_bf16(v[k]);
    store_row16(row, bits);
}

/* Entry address of a slot in a paged cache. */
static DSV4_CU_INLINE uint8_t *entry_page(uint8_t *pages, long long page_stride, long long block_size, long long slot,
                                          long long *row)
{
    long long page = slot / block_size;
    *row = slot - page * block_size;
    return pages + page * page_stride;
}

static DSV4_CU_INLINE void kv_row(const dsv4_cu_insert &a, long long i, int lane)
{
    long long slot = a.slots[i];
    if (slot < 0 || slot >= a.num_slots) return;
    long long pos = 0;
    if (a.positions) {
        pos = a.positions[i];
        if (pos < 0 || pos >= a.max_pos) return;
    }
    /* A slot written twice in one call ends with the later row, as a sequential loop leaves it:
     * a row that a later (written) row overwrites is skipped. */
    for (long long j0 = i + 1; j0 < a.n_ins; j0 += 32) {
        long long j = j0 + lane;
        bool hit = j < a.n_ins && a.slots[j] == slot;
        if (hit && a.positions) hit = a.positions[j] >= 0 && a.positions[j] < a.max_pos;
        if (__any_sync(0xFFFFFFFFu, hit)) return;
    }
    float v[16];
    load_row16(a.kv + i * a.ld_kv + lane * 16, v);
    long long row;
    uint8_t *page = entry_page(a.pages, a.page_stride, a.block_size, slot, &row);
    uint8_t *entry = page + dsv4_kve_row_data(row);

    /* Group amax over the 4 lanes of a 64-dim group (NaN skipped, as the codec's loop does). */
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        float x = fabsf(v[k]);
        amax = x > amax ? x : amax;
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        float o = __shfl_xor_sync(0xFFFFFFFFu, amax, off);
        amax = o > amax ? o : amax;
    }
    int e = cu_kv64_exponent(amax);
    uint32_t sbyte = (uint32_t)(e + 127);

    if (lane < 28) {
        float inv = cu_pow2f(-e);
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int k = 0; k < 16; k++) w[k >> 2] |= cu_f32_e4m3(__fmul_rn(v[k], inv)) << (8 * (k & 3));
        cu_st16(entry + lane * 16, make_uint4(w[0], w[1], w[2], w[3]));
    } else {
        if (a.positions) rotate8(v, a.rope, pos, lane, 1.0f);
        uint32_t bits[16];
#pragma unroll
        for (int k = 0; k < 16; k++) bits[k] = cu_f32_bf16(v[k]);
        store_row16((uint16_t *)(entry + DSV4_KVE_NOPE_BYTES + (lane - 28) * 32), bits);
    }
    /* 7 scale bytes (group g from lane 4g) and the zero pad byte. */
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int g = 0; g < DSV4_KVE_GROUPS; g++) {
        uint32_t b = __shfl_sync(0xFFFFFFFFu, sbyte, 4 * g);
        if (g < 4) lo |= b << (8 * g);
        else hi |= b << (8 * (g - 4));
    }
    if (lane == 0) {
        uint8_t *s = page + dsv4_kve_row_scale(a.block_size, row);
        if (((uintptr_t)s & 7u) == 0) {
            *(uint2 *)s = make_uint2(lo, hi);
        } else {
            for (int k = 0; k < DSV4_KVE_SCALE_BYTES; k++) s[k] = (uint8_t)((k < 4 ? lo : hi) >> (8 * (k & 3)));
        }
    }
}

/* Warps 0..n*h-1: q rows (token w / h, head w % h); the next n_ins warps: KV rows. */
__global__ void __launch_bounds__(WARPS_PER_BLOCK * 32) insert_kernel(dsv4_cu_insert a)
{
    long long w = (long long)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    long long nq = a.q ? a.n * a.h : 0;
    if (w < nq) q_row(a, w / a.h, w % a.h, lane);
    else if (w < nq + a.n_ins) kv_row(a, w - nq, lane);
}

extern "C" int dsv4_cu_insert_launch(const dsv4_cu_insert *a, void *stream)
{
    long long warps = (a->q ? a->n * a->h : 0) + a->n_ins;
    if (warps == 0) return 0;
    long long blocks = (warps + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    insert_kernel<<<(unsigned)blocks, WARPS_PER_BLOCK * 32, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

/* ---- dequant-gather ---------------------------------------------------------------------- */
__global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
    gather_kernel(dsv4_cu_cache c, const int32_t *slots, long long s, uint16_t *out, long long ld_out)
{
    long long i = (long long)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (i >= s) return;
    long long slot = slots[i];
    uint16_t *dst = out + i * ld_out + lane * 16;
    if (slot < 0 || slot >= c.num_slots) {
        cu_st16(dst, make_uint4(0, 0, 0, 0));
        cu_st16(dst + 8, make_uint4(0, 0, 0, 0));
        return;
    }
    long long row;
    const uint8_t *page = entry_page((uint8_t *)c.pages, c.page_stride, c.block_size, slot, &row);
    const uint8_t *entry = page + dsv4_kve_row_data(row);
    if (lane < 28) {
        uint4 v[2];
        cu_e4m3x16_bf16<true>(cu_ld16(entry + lane * 16), page[dsv4_kve_row_scale(c.block_size, row) + (lane >> 2)], v);
        cu_st16(dst, v[0]);
        cu_st16(dst + 8, v[1]);
    } else {
        const uint8_t *src = entry + DSV4_KVE_NOPE_BYTES + (lane - 28) * 32;
        cu_st16(dst, cu_ld16(src));
        cu_st16(dst + 8, cu_ld16(src + 16));
    }
}

extern "C" int dsv4_cu_gather_launch(dsv4_cu_cache cache, const int32_t *slots, long long s, uint16_t *out,
                                     long long ld_out, void *stream)
{
    if (s == 0) return 0;
    long long blocks = (s + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    gather_kernel<<<(unsigned)blocks, WARPS_PER_BLOCK * 32, 0, (cudaStream_t)stream>>>(cache, slots, s, out, ld_out);
    return (int)cudaGetLastError();
}

/* ---- inverse RoPE: one thread per (token, head, pair) --------------------------------------- */
__global__ void inv_rope_kernel(uint16_t *o, long long st, long long sh, long long t, long long h,
                                const int64_t *positions, const float *rope, long long max_pos)
{
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= t * h * 32) return;
    int pair = (int)(g & 31);
    long long th = g >> 5, i = th / h, j = th % h;
    long long pos = positions[i];
    if (pos < 0 || pos >= max_pos) return;
    uint16_t *p = o + i * st + j * sh + DSV4_KVE_NOPE_DIM + 2 * pair;
    float a = cu_bf16_f32(p[0]), b = cu_bf16_f32(p[1]);
    float c = rope[pos * 64 + pair], s = rope[pos * 64 + 32 + pair];
    p[0] = (uint16_t)cu_f32_bf16(__fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    p[1] = (uint16_t)cu_f32_bf16(__fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

extern "C" int dsv4_cu_inv_rope_launch(uint16_t *o, long long st, long long sh, long long t, long long h,
                                       const int64_t *positions, const float *rope, long long max_pos, void *stream)
{
    long long n = t * h * 32;
    if (n == 0) return 0;
    inv_rope_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(o, st, sh, t, h, positions, rope,
                                                                                     max_pos);
    return (int)cudaGetLastError();
}

/* ---- RoPE table: angles and trigonometry in double, rounded once ---------------------------- */
typedef struct {
    double f[32];
} rope_freqs;

__global__ void rope_table_kernel(rope_freqs fr, long long max_pos, float *table)
{
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= max_pos * 32) return;
    long long p = g >> 5;
    int i = (int)(g & 31);
    double ang = (double)p * fr.f[i];
    table[p * 64 + i] = (float)cos(ang);
    table[p * 64 + 32 + i] = (float)sin(ang);
}

extern "C" int dsv4_cu_rope_table_launch(const double *freq, long long max_pos, float *table, void *stream)
{
    if (max_pos == 0) return 0;
    rope_freqs fr;
    for (int i = 0; i < 32; i++) fr.f[i] = freq[i];
    long long n = max_pos * 32;
    rope_table_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(fr, max_pos, table);
    return (int)cudaGetLastError();
}
