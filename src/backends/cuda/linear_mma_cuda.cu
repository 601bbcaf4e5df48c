/* Linear layers on the tensor cores (docs/kernels.md §5): the product of linear_cuda.cu for M at or
 * above DSV4_CUDA_MMA_MIN_M rows (prefill, batched decode, MTP verification; opt-in, cuda_ops.h), for the FP8_B128, MXFP8
 * and FP4 weights on their BF16 staging and for BF16 weights on BF16 activations. F32 weights, F32
 * activations and layouts it cannot copy in 16-byte pieces stay on the streaming kernel.
 *
 * A CTA of 4 warps owns a 64 (M) x 64 (N) tile of y and walks its share of K in tiles of 128: the
 * activation rows and the raw weight bytes go through shared memory by cp.async in a 3-stage ring
 * (16-byte pieces outside M, N or K are zero-filled), a warp owns 32 x 32 of the tile, loads its
 * activations and weight bytes with plain shared loads and decodes the weights to BF16 in
 * registers (E4M3 pairs by the conversion unit to FP16, then FP32, then one BF16 pack; E2M1 by a
 * byte-permute lookup), and multiplies by mma.sync m16n8k16 (BF16 in, FP32 out).
 *
 * K inside an m16n8k16 is permuted: for a span of 32 K a lane holds the 8 contiguous values
 * 8c .. 8c+7 (c = lane % 4) of its rows and columns, and the two k16 steps take the first and the
 * second four as the fragment's (2c, 2c+1, 2c+8, 2c+9). Both operands are permuted alike, so every
 * product is still x[m, k] w[n, k], and the loads are 16 (activations), 8 (FP8), 4 (FP4) bytes.
 *
 * Numerics: a product of two BF16 values (the staged activation e4m3(code)·2^e, the weight's E4M3 or
 * E2M1 value or BF16) is exact in FP32, and so is a sum's scaling by a power of two. The tensor core
 * sums each scale block (FP8_B128: 128 of K, MXFP8 and FP4: 32) from zero; that partial is then
 * multiplied by its weight scale and added to an FP32 accumulator outside the tensor core, block after
 * block in K order (the promotion of include/dsv4/linear.h's formula; BF16 weights accumulate on the
 * tensor core throughout). K may be split over the CTAs of a cluster (up to 8, chosen from N, K and
 * the groups alone), whose partial tiles are added in rank order through distributed shared memory.
 * So the order depends on K, N, the groups and the format, never on M, the other rows or the launch:
 * a row's bytes are those of any other call with that row (tests/c/test_backend_ops.c linear_mma).
 * The tensor core's own accumulation (its alignment and truncation of the 16 products) is the one
 * difference from the streaming kernel's order; the bound it keeps is stated in that test. */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

#include <cooperative_groups.h>
#include <limits.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

namespace {

enum { FMT_B128 = 0, FMT_MX = 1, FMT_FP4 = 2, FMT_BF16 = 3 };
enum {
    BM = 64, BK = 128, THREADS = 128, MAX_SPLIT = 8,
    SPLIT_TILE = 64,             /* the N tile split_of counts in (whatever the launch's tile) */
    A_ROW = BK * 2,              /* bytes of an activation row in a stage */
    TARGET_CTAS = 264,           /* the split's aim: two CTAs per SM of an H200 (a constant: see split_of) */
};

/* NI: n8 pieces of a warp's columns (4: a 64-wide tile of the CTA, 8: 128-wide). */
template <int FMT, int NI> struct tile_fmt {
    static constexpr int BN = 16 * NI, WN = 8 * NI;
    static constexpr int STAGES = NI == 8 && FMT == FMT_BF16 ? 2 : 3;
    static constexpr int W_ROW = FMT == FMT_FP4 ? BK / 2 : FMT == FMT_BF16 ? BK * 2 : BK; /* weight bytes per row */
    static constexpr int BLOCKS = FMT == FMT_B128 ? 1 : FMT == FMT_BF16 ? 0 : BK / 32;   /* scale blocks per tile */
    static constexpr int STAGE = BM * A_ROW + BN * W_ROW;
    static constexpr int SMEM = STAGES * STAGE + 2 * BN * 4 * 4; /* + two tiles of scales (float) */
    static_assert(BM * BN * 4 <= STAGES * STAGE, "the split's tile fits the stages");
};

/* 16 bytes global -> shared, zeros when !valid (src is then not read). */
DSV4_CU_INLINE void cp16_zfill(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
DSV4_CU_INLINE uint4 lds16(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}
DSV4_CU_INLINE uint2 lds8(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}
/* d = a * b (+ 0): the first k16 step of a scale block. */
DSV4_CU_INLINE void mma_bf16_zero(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    const float z = 0.0f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %10, %10, %10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

/* Byte offsets in a stage, swizzled so that a warp's loads hit distinct banks. Activation and
 * BF16 weight rows (256 bytes): 16-byte piece p of row r at p ^ 4 (r & 1). FP8 rows (128 bytes):
 * 32-byte span s at s ^ (r & 3). FP4 rows (64 bytes): 16-byte span s at s ^ ((r >> 1) & 3). */
DSV4_CU_INLINE uint32_t off_row256(int r, int piece) { return r * 256 + ((piece ^ ((r & 1) << 2)) << 4); }
DSV4_CU_INLINE uint32_t off_fp8(int r, int piece) /* piece: 16 bytes */
{
    return r * 128 + ((((piece >> 1) ^ (r & 3)) << 1 | (piece & 1)) << 4);
}
DSV4_CU_INLINE uint32_t off_fp4(int r, int piece) { return r * 64 + ((piece ^ ((r >> 1) & 3)) << 4); }

/* Two E4M3 codes (low byte first) -> a BF16 pair, exact (NaN stays NaN). */
DSV4_CU_INLINE uint32_t e4m3x2_bf16x2(uint32_t pair)
{
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFFu), __NV_E4M3);
    __half2 h;
    memcpy(&h, &hr, 4);
    const float2 f = __half22float2(h);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    uint32_t r;
    memcpy(&r, &b, 4);
    return r;
}

/* Four E2M1 codes (the nibbles of `q`, low first) -> two BF16 pairs, exact: the magnitude's low
 * and high BF16 bytes by byte-permute lookups of its 3 bits, the sign from bit 3. BF16 of
 * 0, .5, 1, 1.5, 2, 3, 4, 6: 0000 3F00 3F80 3FC0 4000 4040 4080 40C0. */
DSV4_CU_INLINE void e2m1x4_bf16x2(uint32_t q, uint32_t *out)
{
    const uint32_t sel = q & 0x7777u;
    const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel), hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
    out[0] = __byte_perm(lo, hi, 0x5140) | ((q << 12) & 0x8000u) | ((q << 24) & 0x80000000u);
    out[1] = __byte_perm(lo, hi, 0x7362) | ((q << 4) & 0x8000u) | ((q << 16) & 0x80000000u);
}

/* The weight fragments of one 32-wide span of K of weight row n: four BF16 pairs, K order. */
template <int FMT> DSV4_CU_INLINE void weight_frag(uint32_t wst, int n, int span, int c, uint32_t *d)
{
    if constexpr (FMT == FMT_BF16) {
        const uint4 v = lds16(wst + off_row256(n, 4 * span + c));
        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
    } else if constexpr (FMT == FMT_FP4) {
        const uint32_t q = cu_lds4(wst + off_fp4(n, span) + 4 * c);
        e2m1x4_bf16x2(q & 0xFFFFu, d);
        e2m1x4_bf16x2(q >> 16, d + 2);
    } else {
        const uint2 v = lds8(wst + off_fp8(n, 2 * span + (c >> 1)) + 8 * (c & 1));
        d[0] = e4m3x2_bf16x2(v.x), d[1] = e4m3x2_bf16x2(v.x >> 16);
        d[2] = e4m3x2_bf16x2(v.y), d[3] = e4m3x2_bf16x2(v.y >> 16);
    }
}

/* grid: x = N tiles x split (a cluster of `split` along x shares a tile), y = M tiles, z = groups. */
template <int FMT, int NI>
__global__ void __launch_bounds__(THREADS) mma_linear_kernel(const dsv4_cu_linear p, int split)
{
    typedef tile_fmt<FMT, NI> T;
    constexpr int BN = T::BN, WN = T::WN, STAGES = T::STAGES;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, c4 = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int rank = (int)(blockIdx.x % (unsigned)split);
    const long long n0 = (long long)(blockIdx.x / (unsigned)split) * BN, m0 = (long long)blockIdx.y * BM;
    const long long grp = blockIdx.z;
    const long long ktiles = (p.k + BK - 1) / BK;
    const long long kt0 = ktiles * rank / split, kt1 = ktiles * (rank + 1) / split, nt = kt1 - kt0;
    const uint32_t s_base = cu_smem(smem);
    float *scales = (float *)(smem + STAGES * T::STAGE); /* [2][BN][BLOCKS] */

    const uint8_t *xb = (const uint8_t *)p.x + grp * p.xs_g * 2;
    const uint8_t *wb = (const uint8_t *)p.w + grp * p.n * p.ws_r_bytes;

    auto load_tile = [&](long long kt, int stage) {
        const uint32_t ast = s_base + stage * T::STAGE, wst = ast + BM * A_ROW;
        const long long k0 = kt * BK;
        for (int i = tid; i < BM * 16; i += THREADS) { /* activation rows: 16 pieces of 8 values */
            const int r = i >> 4, pc = i & 15;
            const long long m = m0 + r, k = k0 + pc * 8;
            const bool ok = m < p.m && k < p.k;
            cp16_zfill(ast + off_row256(r, pc), ok ? xb + (m * p.xs_m + k) * 2 : p.x, ok);
        }
        constexpr int PIECES = T::W_ROW / 16, VALS = FMT == FMT_FP4 ? 32 : FMT == FMT_BF16 ? 8 : 16;
        for (int i = tid; i < BN * PIECES; i += THREADS) {
            const int r = i / PIECES, pc = i % PIECES;
            const long long n = n0 + r, k = k0 + (long long)pc * VALS;
            const bool ok = n < p.n && k < p.k;
            const uint32_t o = FMT == FMT_FP4 ? off_fp4(r, pc) : FMT == FMT_BF16 ? off_row256(r, pc) : off_fp8(r, pc);
            cp16_zfill(wst + o, ok ? wb + n * p.ws_r_bytes + pc * 16 + kt * T::W_ROW : p.w, ok);
        }
    };
    /* The weight scales of tile kt, as floats [BN][BLOCKS] (rows past N repeat the last; blocks past
     * K are never used). Read into registers one tile ahead, stored after the compute. */
    constexpr int NSC = T::BLOCKS ? (BN * T::BLOCKS + THREADS - 1) / THREADS : 1;
    float sc_next[NSC];
    auto fetch_scales = [&](long long kt) {
#pragma unroll
        for (int q = 0; q < NSC; q++) {
            const int e = tid + q * THREADS;
            sc_next[q] = 1.0f;
            if (T::BLOCKS && e < BN * T::BLOCKS && kt < kt1) {
                constexpr int NB = T::BLOCKS ? T::BLOCKS : 1;
                const int r = e / NB, b = e % NB;
                const long long n = n0 + r < p.n ? n0 + r : p.n - 1, row = grp * p.n + n;
                const long long kb = kt * NB + b;
                if (kb * (BK / NB) < p.k)
                    sc_next[q] = cu_e8m0_f32(__ldg(p.scale + (FMT == FMT_B128 ? row / 128 : row) * p.ss0 + kb * p.ss1));
            }
        }
    };
    auto store_scales = [&](long long kt) {
        float *dst = scales + (kt & 1) * BN * 4;
#pragma unroll
        for (int q = 0; q < NSC; q++) {
            const int e = tid + q * THREADS;
            if (T::BLOCKS && e < BN * T::BLOCKS) dst[e] = sc_next[q];
        }
    };

    float acc[2][NI][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nt) load_tile(kt0 + s, s);
        cu_cp_async_commit();
    }
    if (T::BLOCKS) {
        fetch_scales(kt0);
        store_scales(kt0);
    }
    const bool warp_live = m0 + wm * 32 < p.m; /* a warp whose rows all lie past M only loads */
    for (long long it = 0; it < nt; it++) {
        const long long kt = kt0 + it;
        cu_cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (it + STAGES - 1 < nt) load_tile(kt + STAGES - 1, (int)((it + STAGES - 1) % STAGES));
        cu_cp_async_commit();
        if (T::BLOCKS) fetch_scales(kt + 1);
        const uint32_t ast = s_base + (int)(it % STAGES) * T::STAGE, wst = ast + BM * A_ROW;
        const float *sc = scales + (kt & 1) * BN * 4;
        if (warp_live) {
            float part[2][NI][4];
#pragma unroll
            for (int span = 0; span < 4; span++) {
                uint4 av[2][2];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) av[mi][h] = lds16(ast + off_row256(wm * 32 + mi * 16 + h * 8 + g8, 4 * span + c4));
                uint32_t bv[NI][4];
#pragma unroll
                for (int ni = 0; ni < NI; ni++) weight_frag<FMT>(wst, wn * WN + ni * 8 + g8, span, c4, bv[ni]);
#pragma unroll
                for (int st = 0; st < 2; st++)
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        const uint32_t a[4] = {st ? av[mi][0].z : av[mi][0].x, st ? av[mi][1].z : av[mi][1].x,
                                               st ? av[mi][0].w : av[mi][0].y, st ? av[mi][1].w : av[mi][1].y};
#pragma unroll
                        for (int ni = 0; ni < NI; ni++) {
                            if (FMT == FMT_BF16) cu_mma_bf16(acc[mi][ni], a, bv[ni][2 * st], bv[ni][2 * st + 1]);
                            else if ((FMT == FMT_B128 ? span : 0) == 0 && st == 0)
                                mma_bf16_zero(part[mi][ni], a, bv[ni][0], bv[ni][1]);
                            else cu_mma_bf16(part[mi][ni], a, bv[ni][2 * st], bv[ni][2 * st + 1]);
                        }
                    }
                /* promotion: the end of a scale block (MXFP8/FP4: every span; FP8_B128: the tile) */
                const bool block_end = FMT == FMT_B128 ? span == 3 : FMT != FMT_BF16;
                const bool in_k = kt * BK + span * 32 < p.k; /* FP8_B128's one block always is */
                if (block_end && (FMT == FMT_B128 || in_k)) {
                    const int b = FMT == FMT_B128 ? 0 : span, bl = T::BLOCKS ? T::BLOCKS : 1;
#pragma unroll
                    for (int ni = 0; ni < NI; ni++) {
                        const int col = wn * WN + ni * 8 + 2 * c4;
                        const float s0 = sc[col * bl + b], s1 = sc[(col + 1) * bl + b];
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            acc[mi][ni][0] = fmaf(part[mi][ni][0], s0, acc[mi][ni][0]);
                            acc[mi][ni][1] = fmaf(part[mi][ni][1], s1, acc[mi][ni][1]);
                            acc[mi][ni][2] = fmaf(part[mi][ni][2], s0, acc[mi][ni][2]);
                            acc[mi][ni][3] = fmaf(part[mi][ni][3], s1, acc[mi][ni][3]);
                        }
                    }
                }
            }
        }
        if (T::BLOCKS) store_scales(kt + 1); /* its buffer was last read before this tile's barrier */
    }
    cu_cp_async_wait<0>();
    __syncthreads(); /* the stages are free: the split's partial tiles go there */

    auto store = [&](long long m, long long n, float v) {
        if (p.bias) {
            const long long bi = n * p.bias_s;
            v += p.bias_bf16 ? cu_bf16_f32(((const uint16_t *)p.bias)[bi]) : ((const float *)p.bias)[bi];
        }
        const long long yi = m * p.ys_m + grp * p.ys_g + n;
        if (p.y_bf16) ((uint16_t *)p.y)[yi] = (uint16_t)cu_f32_bf16(v);
        else ((float *)p.y)[yi] = v;
    };
    if (split == 1) {
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const long long m = m0 + wm * 32 + mi * 16 + g8 + (e >> 1) * 8, n = n0 + wn * WN + ni * 8 + 2 * c4 + (e & 1);
                    if (m < p.m && n < p.n) store(m, n, acc[mi][ni][e]);
                }
        return;
    }
    /* the split: every CTA's tile [BM][BN] in its shared memory, then rank r adds rows
     * r*BM/split .. of all ranks' tiles in rank order */
    float *red = (float *)smem;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[(wm * 32 + mi * 16 + g8 + (e >> 1) * 8) * BN + wn * WN + ni * 8 + 2 * c4 + (e & 1)] = acc[mi][ni][e];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int rows = BM / split, r0 = rank * rows;
    for (int i = tid; i < rows * BN; i += THREADS) {
        const int r = r0 + i / BN, cidx = i % BN;
        const long long m = m0 + r, n = n0 + cidx;
        if (m >= p.m || n >= p.n) continue;
        float v = 0.0f;
        for (int q = 0; q < split; q++) {
            const float *peer = cl.map_shared_rank(red, q);
            v = q ? v + peer[r * BN + cidx] : peer[r * BN + cidx];
        }
        store(m, n, v);
    }
    cl.sync(); /* the peers' tiles stay until every rank has read them */
}

/* K split over the CTAs of a cluster while the tiles would not give an H200 two CTAs per SM and
 * every CTA keeps at least four K tiles: from N, K and the groups alone (never M), so the
 * summation order is fixed by the shape. */
int split_of(long long n, long long k, long long groups)
{
    const long long tiles = (n + SPLIT_TILE - 1) / SPLIT_TILE * groups, ktiles = (k + BK - 1) / BK;
    int s = 1;
    while (s < MAX_SPLIT && tiles * s < TARGET_CTAS && ktiles >= 8 * s) s <<= 1;
    return s;
}

template <int FMT, int NI> int launch_fmt(const dsv4_cu_linear *a, int split, cudaStream_t stream)
{
    typedef tile_fmt<FMT, NI> T;
    static unsigned char opted[DSV4_CU_MAX_DEVICES];
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) return (int)cudaErrorInvalidDevice;
    const int e = cu_smem_opt_in(opted, dev, mma_linear_kernel<FMT, NI>, T::SMEM);
    if (e) return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(((a->n + T::BN - 1) / T::BN) * split), (unsigned)((a->m + BM - 1) / BM), (unsigned)a->groups);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = T::SMEM;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, mma_linear_kernel<FMT, NI>, *a, split);
}

template <int FMT> int launch_fmt(const dsv4_cu_linear *a, int split, int wide, cudaStream_t stream)
{
    return wide ? launch_fmt<FMT, 8>(a, split, stream) : launch_fmt<FMT, 4>(a, split, stream);
}

int a16(const void *q) { return ((uintptr_t)q & 15u) == 0; }

/* A positive integer from the environment (read once by the caller), else dflt. */
long long env_rows(const char *name, long long dflt)
{
    const char *s = getenv(name);
    char *end = NULL;
    const long long e = s && *s ? strtoll(s, &end, 10) : 0;
    return s && *s && end && !*end && e > 0 ? e : dflt;
}

/* The thresholds: the environment's DSV4_CUDA_MMA_MIN_M rows for this path (read once; unset: the
 * path is off, see cuda_ops.h), WIDE_MIN_M (or DSV4_CUDA_MMA_WIDE_M) for the 128-wide tiles (fewer
 * shared-memory reads per product; the 64-wide ones give small M more CTAs). The tile width does
 * not change a result: it is not part of the order. */
enum { WIDE_MIN_M = 128 };
long long min_m(void)
{
    static long long v = -1;
    if (v < 0) v = env_rows("DSV4_CUDA_MMA_MIN_M", LLONG_MAX);
    return v;
}
long long wide_m(void)
{
    static long long v = -1;
    if (v < 0) v = env_rows("DSV4_CUDA_MMA_WIDE_M", WIDE_MIN_M);
    return v;
}

} // namespace

extern "C" int dsv4_cu_linear_mma_launch(const dsv4_cu_linear *a, void *stream, int *handled)
{
    *handled = 0;
    if (a->m < min_m() || a->fmt > FMT_BF16 || (a->fmt == FMT_BF16 && !a->x_bf16)) return 0;
    if (!a16(a->x) || !a16(a->w) || a->ws_r_bytes % 16 || (a->xs_m * 2) % 16 || (a->groups > 1 && (a->xs_g * 2) % 16))
        return 0;
    if ((a->m + BM - 1) / BM > 65535 || a->groups > 65535 || (a->n + 63) / 64 * MAX_SPLIT > 0x7FFFFFFFll) return 0;
    *handled = 1;
    const int split = split_of(a->n, a->k, a->groups), wide = a->m >= wide_m();
    cudaStream_t s = (cudaStream_t)stream;
    switch (a->fmt) {
    case FMT_B128: return launch_fmt<FMT_B128>(a, split, wide, s);
    case FMT_MX: return launch_fmt<FMT_MX>(a, split, wide, s);
    case FMT_FP4: return launch_fmt<FMT_FP4>(a, split, wide, s);
    default: return launch_fmt<FMT_BF16>(a, split, wide, s);
    }
}
