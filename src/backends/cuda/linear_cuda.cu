/* Linear layers on the GPU (include/dsv4/linear.h, docs/kernels.md §5 and §12): the activation
 * staging (act128 / mx32, bit for bit the rules of src/formats/codec.h), the tensor-core product
 * of the quantized formats (mma_kernel below, which says when it runs: at every row count) and
 * one fp32 streaming product kernel for every weight format (the rest: BF16, F32, odd shapes).
 *
 * The fp32 product reads each weight byte once, in 16-byte loads that bypass L1 (the activations,
 * re-read by every CTA, stay there), decodes in registers and multiply-adds in fp32:
 *   a CTA is 8 warps in 8/KW sets of KW: a set owns four weight rows (two for M > 2), its KW warps
 *   split K (chunks of 32 lanes x 16 bytes, warp w of the set taking chunks w, w + KW, ...), KW as
 *   small as still gives the grid two CTAs per SM (launch below); a lane keeps rows x 2 chunks of
 *   16 bytes in flight (a ring of three chunks, two ahead of the one in use); a CTA handles MT <= 16 activation rows
 *   (larger M: one CTA row per 16, the weights re-read from L2 — the simple path for big M).
 * Numerics: a lane sums the 16 (FP4: 32) products of its piece of K in order, a piece lying in one
 * scale block of both operands, and adds that partial times the weight scale into its accumulator;
 * the staged activation already carries its own power-of-two scale, so every product and scaling
 * is exact and only the fp32 summation order differs from include/dsv4/linear.h's formula. The
 * lanes are reduced by a fixed butterfly and the K-splitting warps in warp order; the order depends
 * on K and the format only (never on M, the other rows or the launch), so stage + staged == linear
 * bit for bit, and a result lies within the accumulation-order bound of the CPU kernels
 * (tests/c/test_linear_cases.h). */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"

#include <stdlib.h>
#include <type_traits>

enum { FMT_B128 = 0, FMT_MX = 1, FMT_FP4 = 2, FMT_BF16 = 3, FMT_F32 = 4 };
enum { THREADS = 256, WARPS = 8, TARGET_CTAS = 264 };
/* Weight rows a warp set owns: four for one or two activation rows (the activation words each
 * lane loads and decodes serve four rows), two above (registers). */
__host__ __device__ constexpr int rows_of(int mt) { return mt <= 2 ? 4 : 2; }

/* ---- launches ------------------------------------------------------------------------------------ */
/* Every kernel of this file and of moe_cuda.cu is launched as a programmatic dependent of the
 * kernel before it (cu_launch_dependent, cuda_device.cuh), unless $DSV4_CUDA_LINEAR_PDL is 0: the
 * staging waits for that kernel and then lets the product start, whose first weight loads (the
 * rings below) are issued before it waits for the staging; a product lets the next kernel start
 * at once. Weights are read before the wait only behind a staging, which has waited for the
 * kernel before it, so a kernel that wrote them has completed. The settings are read once. */
static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
static bool linear_pdl()
{
    static int on = -1;
    if (on < 0) on = env_int("DSV4_CUDA_LINEAR_PDL", 1) != 0;
    return on != 0;
}
/* A row bound from the environment: $name, negative as 0, dflt when unset. */
static long long env_rows(const char *name, int dflt)
{
    const int v = env_int(name, dflt);
    return v < 0 ? 0 : v;
}
/* Quantized MoE products of at most this many rows in all take the fp32 kernel's slots instead of
 * the tensor-core kernel's ($DSV4_CUDA_MOE_FP32_ROWS, default 0: measured slower for one token,
 * BENCHMARKS.md "Linear layers on the GPU"; its MoE instances hold ~180-240 registers, one CTA
 * per SM). Read once. */
static long long moe_fp32_rows()
{
    static long long r = -1;
    if (r < 0) r = env_rows("DSV4_CUDA_MOE_FP32_ROWS", 0);
    return r;
}
/* Plain quantized products of at most this many rows take the fp32 kernel ($DSV4_CUDA_FP32_ROWS,
 * default 0). For timing only: the two kernels sum in different orders, so any other value makes
 * a row's bytes depend on the call's row count, which the engine's batches rely on not to. */
static long long fp32_rows()
{
    static long long r = -1;
    if (r < 0) r = env_rows("DSV4_CUDA_FP32_ROWS", 0);
    return r;
}
/* The streaming tensor-core kernels give the same bits as mma_kernel, so only the speed depends
 * on these; read at every call, so that one process can run both ways (the A/B of
 * tests/c/test_backend_ops.c and of bench linear-cuda; the host cost is one getenv):
 * MoE products of at most $DSV4_CUDA_MOE_STREAM_ROWS rows in all (default 64, a decode step of up
 * to 10 tokens at 6 experts) take mma_stream_kernel, plain FP8 products of at most
 * $DSV4_CUDA_GEMV_ROWS rows (default and at most GV_ROWS, 8) mma_gemv_kernel; 0 keeps mma_kernel. */
static long long moe_stream_rows() { return env_rows("DSV4_CUDA_MOE_STREAM_ROWS", 64); }
static long long gemv_rows() { return env_rows("DSV4_CUDA_GEMV_ROWS", 8); }
extern "C" int dsv4_cu_linear_pdl(void) { return linear_pdl() ? 1 : 0; }

/* ---- staging ----------------------------------------------------------------------------------- */
/* One warp per (row, group): codec.h dsv4_quantize_group with the act128 or mx32 parameters, each
 * code then stored dequantized (e4m3(code)·scale, exact in BF16). */
/* Where a staged row's values come from: plain rows of x (STAGE_PLAIN); the MoE's gathered rows,
 * sorted row i being token order[i] / topk's row of x, a zero row where order[i] < 0 (STAGE_GATHER,
 * the rows moe_cuda.cu's gather writes); or the MoE's SwiGLU rows, row i of x as g and of u
 * times w[i] (w NULL: 1), rounded to BF16 (STAGE_SWIGLU, the values layer_cuda.cu's swiglu_kernel
 * writes, the same operations in the same order). Each reads exactly the BF16 values the
 * separate kernel would have stored, so the staging is bit for bit that of its output. */
enum { STAGE_PLAIN = 0, STAGE_GATHER = 1, STAGE_SWIGLU = 2 };
struct stage_src {
    const int32_t *order; /* STAGE_GATHER */
    int topk;
    const uint16_t *u; /* STAGE_SWIGLU */
    long long ldu;
    const float *w;
    float limit;
};

template <int SRC>
DSV4_CU_INLINE float stage_value(const void *x, int x_bf16, long long off, long long mi, long long kk,
                                 const stage_src &src)
{
    if (SRC == STAGE_SWIGLU) {
        float gv = cu_bf16_f32(((const uint16_t *)x)[off + kk]), uv = cu_bf16_f32(src.u[mi * src.ldu + kk]);
        gv = gv > src.limit ? src.limit : gv;
        uv = uv > src.limit ? src.limit : uv < -src.limit ? -src.limit : uv;
        const float s = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv);
        return cu_bf16_f32((uint16_t)cu_f32_bf16(__fmul_rn(s, src.w ? src.w[mi] : 1.0f)));
    }
    return x_bf16 ? cu_bf16_f32(((const uint16_t *)x)[off + kk]) : ((const float *)x)[off + kk];
}

template <int SRC>
__global__ void __launch_bounds__(THREADS) stage_kernel(const void *x, int x_bf16, long long xs_m, long long xs_g,
                                                        long long m, long long groups, long long k, int mx32,
                                                        dsv4_cu_stage_head *head, const stage_src src)
{
    const int G = mx32 ? 32 : 128, per = G / 32;
    const long long ngr = (k + G - 1) / G;
    const long long wid = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    cu_pdl_wait();    /* x is the kernel before's, which may still read this work space */
    cu_pdl_release(); /* after the wait: the product's early weight loads follow a completed kernel */
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        head->magic = DSV4_CU_STAGE_MAGIC;
        head->rows = m * groups;
        head->k = k;
        head->mx32 = mx32;
    }
    if (wid >= m * groups * ngr) return;
    const long long row = wid / ngr, k0 = (wid % ngr) * G, len = k - k0 < G ? k - k0 : G;
    const long long mi = row / groups, gi = row % groups;
    long long off = mi * xs_m + gi * xs_g;
    bool zero = false;
    if (SRC == STAGE_GATHER) {
        const int pr = src.order[mi];
        zero = pr < 0;
        off = zero ? 0 : (long long)(pr / src.topk) * xs_m;
    }
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = 0.0f;
        const long long kk = k0 + lane * per + i;
        if (i < per && lane * per + i < len) {
            v[i] = zero ? 0.0f : stage_value<SRC>(x, x_bf16, off, mi, kk, src);
            const float a = fabsf(v[i]);
            if (a > amax) amax = a; /* NaN is skipped, as codec.h dsv4_absmax does */
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float b = __shfl_xor_sync(0xFFFFFFFFu, amax, o);
        if (b > amax) amax = b;
    }
    const float floor_a = mx32 ? 1e-10f : 1e-4f;
    if (!(amax >= floor_a)) amax = floor_a;
    float q = __fdiv_rn(amax, 448.0f);
    if (mx32 && q < 1e-10f) q = 1e-10f;
    int e = cu_ceil_log2_bits(q);
    e = e < -127 ? -127 : (e > 128 ? 128 : e);
    const float inv = cu_pow2f(-e), sc = cu_e8m0_f32((uint32_t)(e + 127));
    const long long rows = m * groups;
    uint16_t *dst = (uint16_t *)((uint8_t *)head + sizeof(dsv4_cu_stage_head)) + row * k;
    const bool codes = k % 32 == 0; /* the tensor-core product's operands (cuda_ops.h) */
    uint16_t *cdst = (uint16_t *)((uint8_t *)head + dsv4_cu_stage_codes_offset(rows, k)) + row * k;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long long kk = k0 + lane * per + i;
        if (i < per && lane * per + i < len) {
            const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)cu_f32_e4m3(__fmul_rn(v[i], inv)), __NV_E4M3);
            __half hh;
            memcpy(&hh, &h, 2);
            dst[kk] = (uint16_t)cu_f32_bf16(__fmul_rn(__half2float(hh), sc));
            const int b = (int)(kk & 7); /* k0 k4 k1 k5 k2 k6 k3 k7 */
            if (codes) cdst[(kk & ~7ll) + (b < 4 ? 2 * b : 2 * (b - 4) + 1)] = h.x;
        }
    }
    if (codes && lane == 0)
        ((float *)((uint8_t *)head + dsv4_cu_stage_scales_offset(rows, k)))[row * ngr + k0 / G] = sc;
}

extern "C" int dsv4_cu_stage_launch(const void *x, int x_bf16, long long xs_m, long long xs_g, long long m,
                                    long long groups, long long k, int mx32, void *head, void *stream)
{
    const long long G = mx32 ? 32 : 128, warps = m * groups * ((k + G - 1) / G);
    const long long blocks = (warps + WARPS - 1) / WARPS;
    if (blocks == 0) return 0;
    if (blocks > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    return (int)cu_launch_dependent(stage_kernel<STAGE_PLAIN>, dim3((unsigned)blocks), THREADS, (cudaStream_t)stream,
                                    linear_pdl(), x, x_bf16, xs_m, xs_g, m, groups, k, mx32,
                                    (dsv4_cu_stage_head *)head, stage_src{});
}

static long long stage_blocks(long long m, long long k, int mx32)
{
    const long long G = mx32 ? 32 : 128;
    return (m * ((k + G - 1) / G) + WARPS - 1) / WARPS;
}

extern "C" int dsv4_cu_stage_gather_launch(const uint16_t *x, long long ldx, const int32_t *order, int topk,
                                           long long R, long long k, int mx32, void *head, void *stream)
{
    const long long blocks = stage_blocks(R, k, mx32);
    if (blocks == 0) return 0;
    if (blocks > 0x7FFFFFFFll || topk < 1) return (int)cudaErrorInvalidConfiguration;
    stage_src src{};
    src.order = order, src.topk = topk;
    return (int)cu_launch_dependent(stage_kernel<STAGE_GATHER>, dim3((unsigned)blocks), THREADS, (cudaStream_t)stream,
                                    linear_pdl(), (const void *)x, 1, ldx, 0ll, R, 1ll, k, mx32,
                                    (dsv4_cu_stage_head *)head, src);
}

extern "C" int dsv4_cu_stage_swiglu_launch(const uint16_t *g, long long ldg, const uint16_t *u, long long ldu,
                                           const float *w, float limit, long long rows, long long n, int mx32,
                                           void *head, void *stream)
{
    const long long blocks = stage_blocks(rows, n, mx32);
    if (blocks == 0) return 0;
    if (blocks > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    stage_src src{};
    src.u = u, src.ldu = ldu, src.w = w, src.limit = limit;
    return (int)cu_launch_dependent(stage_kernel<STAGE_SWIGLU>, dim3((unsigned)blocks), THREADS, (cudaStream_t)stream,
                                    linear_pdl(), (const void *)g, 1, ldg, 0ll, rows, 1ll, n, mx32,
                                    (dsv4_cu_stage_head *)head, src);
}

/* ---- the product --------------------------------------------------------------------------------- */
template <int FMT> struct fmt_traits {
    /* weight values per 16-byte load and per 32-bit word of it */
    static constexpr int VEC = FMT == FMT_FP4 ? 32 : FMT == FMT_BF16 ? 8 : FMT == FMT_F32 ? 4 : 16;
    static constexpr int WPW = VEC / 4;
    static constexpr bool Q = FMT <= FMT_FP4;
};

DSV4_CU_INLINE uint32_t ld_bytes4(const uint8_t *b)
{
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}

DSV4_CU_INLINE uint32_t word(uint4 v, int q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

/* NB (2..16) bytes at p as 32-bit words (the last one partial for NB = 2). */
template <int NB> DSV4_CU_INLINE void ld_x(const uint8_t *p, bool aligned, uint32_t *w)
{
    if (aligned) {
        if (NB == 16) {
            const uint4 v = __ldg((const uint4 *)p);
            w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
        } else if (NB == 8) {
            const uint2 v = __ldg((const uint2 *)p);
            w[0] = v.x, w[1] = v.y;
        } else if (NB == 4) {
            w[0] = __ldg((const uint32_t *)p);
        } else {
            w[0] = __ldg((const uint16_t *)p);
        }
    } else {
#pragma unroll
        for (int i = 0; i < (NB + 3) / 4; i++)
            w[i] = NB >= 4 ? ld_bytes4(p + 4 * i) : ((uint32_t)p[0] | ((uint32_t)p[1] << 8));
    }
}

/* Word q of a weight load -> its WPW values in K order (FP4: times 2^-14, see below). */
template <int FMT> DSV4_CU_INLINE void decode_word(uint32_t w, float *f)
{
    if (FMT == FMT_B128 || FMT == FMT_MX) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w >> (16 * h)) & 0xFFFFu), __NV_E4M3);
            __half2 hh;
            memcpy(&hh, &hr, 4);
            const float2 v = __half22float2(hh);
            f[2 * h] = v.x, f[2 * h + 1] = v.y;
        }
    } else if (FMT == FMT_FP4) {
        /* An E2M1 nibble s|e1 e0|m placed as FP16 bits s<<15 | e1 e0 m<<9 is its value times 2^-14
         * exactly (e = 0 lands on the FP16 subnormals), so four shifts and masks give two values. */
        const uint32_t a = ((w & 0x00070007u) << 9) | ((w & 0x00080008u) << 12); /* k 0, 4 */
        const uint32_t b = ((w & 0x00700070u) << 5) | ((w & 0x00800080u) << 8);  /* k 1, 5 */
        const uint32_t c = ((w & 0x07000700u) << 1) | ((w & 0x08000800u) << 4);  /* k 2, 6 */
        const uint32_t d = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);         /* k 3, 7 */
        const uint32_t hw[4] = {a, b, c, d};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 hh;
            memcpy(&hh, &hw[i], 4);
            const float2 v = __half22float2(hh);
            f[i] = v.x, f[i + 4] = v.y;
        }
    } else if (FMT == FMT_BF16) {
        f[0] = __uint_as_float(w << 16), f[1] = __uint_as_float(w & 0xFFFF0000u);
    } else {
        f[0] = __uint_as_float(w);
    }
}

/* Activation values e0 .. e0+NV-1 (BF16 or F32) of the words w. */
template <bool XF32, int NV> DSV4_CU_INLINE void decode_x(const uint32_t *w, int e0, float *f)
{
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int e = e0 + i;
        f[i] = XF32 ? __uint_as_float(w[e]) : ((e & 1) ? __uint_as_float(w[e / 2] & 0xFFFF0000u) : __uint_as_float(w[e / 2] << 16));
    }
}

/* One chunk piece of a lane: NR = rows_of(MT) rows of VEC weights against MT activation rows. */
template <int FMT, bool XF32, int MT>
DSV4_CU_INLINE void chunk(const uint4 *w, const uint32_t *sb, const uint8_t *const *xr, long long k0, int aligned,
                          float (*acc)[MT])
{
    typedef fmt_traits<FMT> T;
    constexpr int VEC = T::VEC, WPW = T::WPW, XB = XF32 ? 4 : 2, XW = VEC * XB / 4; /* x words per piece */
    constexpr int NR = rows_of(MT);
    float part[NR][MT];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) part[r][i] = 0.0f;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        uint32_t xw[XW];
        const uint8_t *xp = xr[i] + k0 * XB;
#pragma unroll
        for (int q = 0; q < XW; q += 4) {
            if constexpr (XW >= 4) ld_x<16>(xp + 4 * q, aligned, xw + q);
            else ld_x<XW * 4>(xp, aligned, xw);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float xf[WPW];
            decode_x<XF32, WPW>(xw, q * WPW, xf);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                float wf[WPW];
                decode_word<FMT>(word(w[r], q), wf);
#pragma unroll
                for (int j = 0; j < WPW; j++) {
                    if (T::Q) part[r][i] = fmaf(xf[j], wf[j], part[r][i]);
                    else acc[r][i] = fmaf(xf[j], wf[j], acc[r][i]);
                }
            }
        }
    }
    if (T::Q) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float sw = cu_e8m0_f32(sb[r]);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const float pv = FMT == FMT_FP4 ? part[r][i] * 16384.0f : part[r][i]; /* exact */
                acc[r][i] = fmaf(pv, sw, acc[r][i]);
            }
        }
    }
}

/* y[m, g, n] = v + bias[n], one rounding (y: p.y, or an MoE set's). */
DSV4_CU_INLINE void store_y(const dsv4_cu_linear &p, void *y, long long m, long long g, long long n, float v)
{
    if (p.bias) {
        const long long bi = n * p.bias_s;
        v += p.bias_bf16 ? cu_bf16_f32(((const uint16_t *)p.bias)[bi]) : ((const float *)p.bias)[bi];
    }
    const long long yi = m * p.ys_m + g * p.ys_g + n;
    if (p.y_bf16) ((uint16_t *)y)[yi] = (uint16_t)cu_f32_bf16(v);
    else ((float *)y)[yi] = v;
}

/* The experts of an MoE launch (dsv4_cu_moe_linear_launch): blockIdx.y picks one. A kernel
 * parameter read in place (__grid_constant__), so indexing it copies nothing. */
struct moe_tab {
    const void *w[2][DSV4_CU_MOE_CHUNK];
    const uint8_t *s[2][DSV4_CU_MOE_CHUNK];
    void *y[2];
    int n;
};
struct no_tab {
    int unused;
};

static moe_tab moe_table(const dsv4_cu_moe_chunk *mo)
{
    moe_tab t = {};
    for (int j = 0; j < mo->sets; j++) {
        for (int i = 0; i < mo->n; i++) t.w[j][i] = mo->w[j][i], t.s[j][i] = mo->s[j][i];
        t.y[j] = mo->y[j];
    }
    t.n = mo->n;
    return t;
}

/* The expert (index into `tab`) of MoE slot blockIdx.y: the y-th of the chunk's experts that have
 * rows, -1 past the last. Every thread of the CTA calls it (two barriers). */
template <typename TAB> DSV4_CU_INLINE int moe_slot_expert(const TAB &tab, const int32_t *off, int e0)
{
    static_assert(DSV4_CU_MOE_CHUNK <= THREADS, "one expert of the chunk per thread");
    __shared__ int warp_count[WARPS], slot_expert;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, e = threadIdx.x;
    const bool has_rows = e < tab.n && off[e0 + e + 1] > off[e0 + e];
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, has_rows);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    if (threadIdx.x == 0) slot_expert = -1;
    __syncthreads();
    int rank = __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; w++) rank += warp_count[w];
    if (has_rows && rank == (int)blockIdx.y) slot_expert = e;
    __syncthreads();
    return slot_expert;
}

/* MOE false: group blockIdx.y, row tile blockIdx.z (one pass of the tile loop, which the compiler
 * sees). MOE: blockIdx.y is a slot (moe_slot_expert), weight set blockIdx.z, the slot's expert's
 * rows [off[e], off[e+1]) of x and y read on the device and walked in tiles of MT. */
template <int FMT, bool XF32, int MT, bool MOE, typename TAB>
__global__ void __launch_bounds__(THREADS) linear_kernel(dsv4_cu_linear p, int kw, int aligned,
                                                         const __grid_constant__ TAB tab, const int32_t *off, int e0)
{
    typedef fmt_traits<FMT> T;
    constexpr int VEC = T::VEC, CK = 32 * VEC, NR = rows_of(MT);
    constexpr int XB = XF32 ? 4 : 2;                          /* activation bytes per value */
    constexpr int WB16 = FMT == FMT_FP4 ? 1 : FMT == FMT_BF16 ? 4 : FMT == FMT_F32 ? 8 : 2; /* weight bytes per 2 values */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rsets = WARPS / kw, rs = warp / kw, kwi = warp % kw;
    const long long g = MOE ? 0 : blockIdx.y; /* the group of x, w and y (MoE: one weight per expert) */
    long long m0 = (long long)blockIdx.z * MT, mend = p.m < m0 + MT ? p.m : m0 + MT;
    const uint8_t *wb = (const uint8_t *)p.w, *sb = p.scale;
    void *yout = p.y;
    cu_pdl_release();
    if (MOE || !T::Q) cu_pdl_wait(); /* off and unstaged weights may be the kernel before's */
    if constexpr (MOE) {
        const int se = moe_slot_expert(tab, off, e0);
        if (se < 0) return;
        m0 = off[e0 + se], mend = off[e0 + se + 1];
        wb = (const uint8_t *)tab.w[blockIdx.z][se], sb = tab.s[blockIdx.z][se];
        yout = tab.y[blockIdx.z];
    }
    const long long nbase = ((long long)blockIdx.x * rsets + rs) * NR;

    const uint8_t *wr[NR];
    const uint8_t *sr[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const long long nr = nbase + r < p.n ? nbase + r : p.n - 1; /* rows past n repeat the last */
        const long long grow = g * p.n + nr;
        wr[r] = wb + grow * p.ws_r_bytes;
        sr[r] = T::Q ? sb + (FMT == FMT_B128 ? grow / 128 : grow) * p.ss0 : nullptr;
    }
    do {
        const int mv = (int)(mend - m0 < MT ? mend - m0 : MT);
        const uint8_t *xr[MT];
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const long long mi = m0 + (i < mv ? i : mv - 1);
            xr[i] = (const uint8_t *)p.x + (mi * p.xs_m + g * p.xs_g) * XB;
        }

        float acc[NR][MT];
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < MT; i++) acc[r][i] = 0.0f;

        const long long nchunks = (p.k + CK - 1) / CK;
        /* three chunks in the ring: the one being used and the next two in flight */
        uint4 wv[3][NR];
        uint32_t sv[3][NR];
        auto fetch = [&](long long c, uint4 *dst, uint32_t *sdst) {
            const long long k0 = c * CK + lane * VEC;
            const bool ok = c < nchunks && k0 < p.k;
#pragma unroll
            for (int r = 0; r < NR; r++) {
                dst[r] = make_uint4(0, 0, 0, 0);
                sdst[r] = 127;
                if (ok) {
                    const uint8_t *src = wr[r] + k0 * WB16 / 2;
                    dst[r] = aligned ? cu_ldg16_stream(src) : cu_ld16(src); /* weights bypass L1, x stays */
                    if (T::Q) sdst[r] = __ldg(sr[r] + (k0 / (FMT == FMT_B128 ? 128 : 32)) * p.ss1);
                }
            }
        };
        fetch(kwi, wv[0], sv[0]);
        fetch(kwi + kw, wv[1], sv[1]);
        if (!MOE && T::Q) cu_pdl_wait(); /* x: the staging just before */
        for (long long c = kwi; c < nchunks; c += 3 * kw) {
#pragma unroll
            for (int st = 0; st < 3; st++) {
                const long long cc = c + st * kw;
                if (cc >= nchunks) break;
                fetch(cc + 2 * kw, wv[(st + 2) % 3], sv[(st + 2) % 3]);
                const long long k0 = cc * CK + lane * VEC;
                if (k0 < p.k) chunk<FMT, XF32, MT>(wv[st], sv[st], xr, k0, aligned, acc);
            }
        }

        __shared__ float red[WARPS][NR * MT];
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < MT; i++) {
                float v = acc[r][i];
#pragma unroll
                for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                if (lane == 0) red[warp][r * MT + i] = v;
            }
        __syncthreads();
        for (int t = threadIdx.x; t < rsets * NR * MT; t += THREADS) {
            const int set = t / (NR * MT), e = t % (NR * MT), r = e / MT, i = e % MT;
            const long long n = ((long long)blockIdx.x * rsets + set) * NR + r;
            if (n >= p.n || i >= mv) continue;
            float v = red[set * kw][e];
            for (int j = 1; j < kw; j++) v += red[set * kw + j][e];
            store_y(p, yout, m0 + i, g, n, v);
        }
        if (MOE) __syncthreads(); /* red is reused by the next tile */
    } while (MOE && (m0 += MT) < mend);
}

/* ---- the tensor-core product ------------------------------------------------------------------ */
/* FP8_B128, MXFP8 and FP4 weights against any number of activation rows (a CTA takes 8 or 16 of
 * them, blockIdx.z the next 16; an MoE expert: any rows, in passes of 8), when K holds whole
 * pieces: the weight codes decoded to FP16 (exact: E4M3 by cvt, E2M1 as its value times 2^-14) are
 * the m16 operand of mma.sync m16n8k16, the staging's FP16 codes (cuda_ops.h) the n8 operand, the
 * fp32 accumulation on the tensor core.
 *   a warp owns 16 weight rows; lane (g, q) = (lane / 4, lane % 4) takes bytes 8q .. 8q+7 of each
 *   32-byte piece of rows g and g+8 — a plain product from its warp's ring in shared memory
 *   (RING_STAGES - 1 pieces in flight, copied by cp.async), an MoE's straight from global memory
 *   (a quad reads 32 contiguous bytes of a row, three pieces in flight); the KW warps of a set
 *   take pieces w, w + KW, ... (KW chosen as for the fp32 path);
 *   a piece is one scale block of both operands per mma: FP8 (32 values) lies in one 128-block or
 *   is one 32-block; FP4 (64 values, two 32-blocks) is regrouped so that a lane holds one word of
 *   each block (a swap of one word with lane q ^ 2), and each mma takes one block;
 *   the k order inside a mma is the lanes' (a permutation of the piece the activation codes
 *   follow, the staging stores each run of 8 as k0 k4 k1 k5 ...).
 * Numerics: the products are exact in the tensor core's fp32 sums (E4M3 x E4M3: 8-bit
 * significands; FP4: 2 x 4 bits), a piece's sum (two mmas) is scaled by activation scale x
 * weight scale (powers of two: exact) and added to the lane's accumulator in piece order, the
 * K-splitting warps then in warp order: the order depends on K and the format only, never on the
 * other rows or the launch — every row count takes this kernel when the format and K allow it,
 * so a row's bytes do not depend on how many rows its call has. The tensor core adds with its own
 * alignment and rounding, within the bound of tests/c/test_linear_cases.h
 * (tests/c/test_backend_ops.c). */

/* 8 bytes of weights: no L1 allocation, the L2 fetches 256-byte lines. */
DSV4_CU_INLINE uint2 ldg8_weights(const void *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* The two E4M3 codes of the low 16 bits of v as FP16x2 (exact). */
DSV4_CU_INLINE uint32_t e4m3x2_f16x2(uint32_t v)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xFFFFu), __NV_E4M3);
    uint32_t r;
    memcpy(&r, &h, 4);
    return r;
}

/* An FP4 word's nibbles as the high bytes of their FP16 codes, each its value times 2^-14
 * (decode_word's rule: the sign to bit 7, the magnitude to bits 3..1, the low byte zero): the even
 * nibbles 0, 2, 4, 6 in bytes 0..3 of lo, the odd ones in hi. */
struct e2m1_bytes {
    uint32_t lo, hi;
    DSV4_CU_INLINE explicit e2m1_bytes(uint32_t w)
        : lo(((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu)), hi((w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu))
    {
    }
    /* nibbles i and i + 4 as FP16x2: one byte permutation (with the shifts and masks above, 11
     * operations a word where a pair shifted and masked its magnitude and its sign took 15) */
    DSV4_CU_INLINE uint32_t pair(int i) const { return __byte_perm(i & 1 ? hi : lo, 0u, i < 2 ? 0x2404u : 0x3414u); }
};

/* The m16 operand halves of one mma block: FP4 block b of rows g, g+8 (words wq[row][b]), or the
 * FP8 piece of rows g, g+8 (a lane's 8 bytes of each), every tensor-core path's decode. */
DSV4_CU_INLINE void fp4_frags(const uint32_t (&wq)[2][2], int b, uint32_t *A0, uint32_t *A1)
{
    const e2m1_bytes r0(wq[0][b]), r1(wq[1][b]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        A0[2 * h] = r0.pair(h), A0[2 * h + 1] = r1.pair(h);
        A1[2 * h] = r0.pair(2 + h), A1[2 * h + 1] = r1.pair(2 + h);
    }
}
DSV4_CU_INLINE void fp8_frags(uint2 w0, uint2 w1, uint32_t *A0, uint32_t *A1)
{
    A0[0] = e4m3x2_f16x2(w0.x), A0[1] = e4m3x2_f16x2(w1.x), A0[2] = e4m3x2_f16x2(w0.x >> 16), A0[3] = e4m3x2_f16x2(w1.x >> 16);
    A1[0] = e4m3x2_f16x2(w0.y), A1[1] = e4m3x2_f16x2(w1.y), A1[2] = e4m3x2_f16x2(w0.y >> 16), A1[3] = e4m3x2_f16x2(w1.y >> 16);
}

/* c += A (16 x 16, FP16: rows g / g+8 x k 2q.. / 2q+8..) B (16 x 8, FP16: k x column g). */
DSV4_CU_INLINE void mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* A plain product's weights pass through a ring of RING_STAGES pieces per warp in shared memory
 * (cp.async, 16 bytes a lane: lane l copies half l & 1 of row l >> 1's 32 bytes), so the bytes in
 * flight are not bounded by registers; its scales run RING_SCALES pieces ahead in registers. */
enum { RING_STAGES = 16, RING_SCALES = 4, RING_BYTES = WARPS * RING_STAGES * 512 };

template <int FMT> struct mma_fmt {
    static constexpr int VPP = FMT == FMT_FP4 ? 64 : 32;  /* k values per 32-byte piece */
    static constexpr int NS = FMT == FMT_FP4 ? 4 : 2;     /* weight scale bytes a lane needs per piece */
    static constexpr int G = FMT == FMT_MX ? 32 : 128;    /* the activation rule's group */
};

template <int FMT, int NT, bool MOE, typename TAB>
__global__ void __launch_bounds__(THREADS, NT == 1 && !MOE && FMT != FMT_FP4 ? 3 : 2) mma_kernel(dsv4_cu_linear p, int kw, const __grid_constant__ TAB tab,
                                                      const int32_t *off, int e0)
{
    typedef mma_fmt<FMT> F;
    /* RING: the weights through shared memory (plain products); else a lane's register ring of
     * PIPE pieces, all but one in flight (an MoE's loop over passes costs registers) */
    constexpr bool RING = !MOE;
    constexpr int PIPE = RING ? RING_STAGES : 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int rsets = WARPS / kw, rs = warp / kw, kwi = warp % kw;
    const long long gi = MOE ? 0 : blockIdx.y;
    long long m0 = MOE ? 0 : (long long)blockIdx.z * 16, mend = p.m;
    const uint8_t *wb = (const uint8_t *)p.w, *sb = p.scale;
    void *yout = p.y;
    cu_pdl_release();
    if (MOE) cu_pdl_wait(); /* off is the kernel before's (a plain product waits after its first loads) */
    if constexpr (MOE) { /* blockIdx.y: a slot (moe_slot_expert), blockIdx.z the weight set */
        const int se = moe_slot_expert(tab, off, e0);
        if (se < 0) return;
        m0 = off[e0 + se], mend = off[e0 + se + 1];
        wb = (const uint8_t *)tab.w[blockIdx.z][se], sb = tab.s[blockIdx.z][se];
        yout = tab.y[blockIdx.z];
    }
    const long long row0 = ((long long)blockIdx.x * rsets + rs) * 16;
    const uint8_t *wr[2], *sr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const long long nr = row0 + g + 8 * r < p.n ? row0 + g + 8 * r : p.n - 1; /* rows past n repeat the last */
        const long long grow = gi * p.n + nr;
        wr[r] = wb + grow * p.ws_r_bytes + 8 * q;
        sr[r] = sb + (FMT == FMT_B128 ? grow / 128 : grow) * p.ss0;
    }
    const long long npieces = p.k / F::VPP, ngr = (p.k + F::G - 1) / F::G;
    const int lo = q < 2, j = (q & 1) * 2 + (q >> 1); /* FP4: the word of each block lane q holds */
    __shared__ float red[WARPS][NT * 4][32];
#pragma unroll 1
    for (;; m0 += 8 * NT) {
        const int mv = (int)(mend - m0 < 8 * NT ? mend - m0 : 8 * NT);
        const uint16_t *xc[NT]; /* the n8 operand: activation row nt*8 + g */
        const float *xs[NT][2]; /* the scales of the accumulator's columns nt*8 + 2q, +1 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int t = nt * 8 + g;
            xc[nt] = t < mv ? p.xcodes + ((m0 + t) * p.groups + gi) * p.k : nullptr;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int tc = nt * 8 + 2 * q + c;
                xs[nt][c] = tc < mv ? p.xscales + ((m0 + tc) * p.groups + gi) * ngr : nullptr;
            }
        }
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[nt][c] = 0.0f;

        constexpr int WP = RING ? 1 : PIPE, SP = RING ? RING_SCALES : PIPE;
        static_assert(PIPE % SP == 0, "the scale ring turns with the weight ring");
        uint2 wv[WP][2];
        uint32_t sv[SP][F::NS];
        auto fetch_s = [&](long long pc, uint32_t *s) {
            if (pc >= npieces) return;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (FMT == FMT_FP4) {
                    s[2 * r] = __ldg(sr[r] + (2 * pc) * p.ss1);
                    s[2 * r + 1] = __ldg(sr[r] + (2 * pc + 1) * p.ss1);
                } else {
                    s[r] = __ldg(sr[r] + (FMT == FMT_B128 ? pc / 4 : pc) * p.ss1);
                }
            }
        };
        auto fetch = [&](long long pc, uint2 *w, uint32_t *s) {
            if (pc >= npieces) return;
#pragma unroll
            for (int r = 0; r < 2; r++) w[r] = ldg8_weights(wr[r] + pc * 32);
            fetch_s(pc, s);
        };
        /* the ring: this warp's stages, the lane's copy of each piece and where it reads its words */
        extern __shared__ __align__(16) uint8_t wring[];
        const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(wring) + (uint32_t)warp * (RING_STAGES * 512);
        const uint8_t *csrc = nullptr;
        if constexpr (RING) {
            const long long cr = row0 + (lane >> 1) < p.n ? row0 + (lane >> 1) : p.n - 1;
            csrc = wb + (gi * p.n + cr) * p.ws_r_bytes + 16 * (lane & 1);
        }
        auto issue = [&](long long pc, int slot) { /* one commit group per call, empty past the end */
            if (pc < npieces) cu_cp_async16(ring0 + slot * 512 + (lane >> 1) * 32 + 16 * (lane & 1), csrc + pc * 32);
            cu_cp_async_commit();
        };
        auto ring_words = [&](int slot, uint2 *w) { /* as fetch's registers: row g's, row g+8's */
            const uint8_t *st = wring + warp * (RING_STAGES * 512) + slot * 512;
#pragma unroll
            for (int r = 0; r < 2; r++) w[r] = *(const uint2 *)(st + (g + 8 * r) * 32 + 8 * q);
        };
        /* The activation side of a piece, loaded XD pieces ahead of its use (L1 / L2 hits whose
         * latency would otherwise stall every piece): the lane's 8 codes of each block for every
         * n8 tile (xk the k offset of block b) and the scales of the lane's two columns. */
        constexpr int XB = FMT == FMT_FP4 ? 2 : 1, XD = 2;
        static_assert(PIPE % XD == 0, "the activation ring turns with the weight ring");
        struct xpiece {
            uint4 x[NT][XB];
            float sx[NT][2];
        };
        auto fetch_x = [&](long long pc, xpiece &xp) {
            if (pc >= npieces) return;
            const long long xk0 = FMT == FMT_FP4 ? pc * 64 + 8 * j : pc * 32 + 8 * q, grp = xk0 / F::G;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int b = 0; b < XB; b++)
                    xp.x[nt][b] = xc[nt] ? __ldg((const uint4 *)(xc[nt] + xk0 + 32 * b)) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    xp.sx[nt][c] = xs[nt][c] ? xs[nt][c][grp] : 0.0f;
                    if (FMT == FMT_FP4) xp.sx[nt][c] *= 16384.0f; /* the decode's 2^-14 (exact) */
                }
            }
        };
        /* One block's two mmas for every n8 tile, scaled into acc: A0/A1 the weight halves, b the
         * block of the piece, sw the weight scales of rows g, g+8. */
        auto block = [&](const uint32_t *A0, const uint32_t *A1, const xpiece &xp, int b, float sw0, float sw1) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 X = xp.x[nt][b];
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (FMT == FMT_FP4) {
                    mma_f16(part, A0, X.x, X.y);
                    mma_f16(part, A1, X.z, X.w);
                } else { /* FP8 words hold k0 k1 k2 k3 | k4 .. k7: the natural pairs of the codes */
                    mma_f16(part, A0, __byte_perm(X.x, X.y, 0x5410), __byte_perm(X.z, X.w, 0x5410));
                    mma_f16(part, A1, __byte_perm(X.x, X.y, 0x7632), __byte_perm(X.z, X.w, 0x7632));
                }
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[nt][c] = fmaf(part[c] * xp.sx[nt][c & 1], c < 2 ? sw0 : sw1, acc[nt][c]);
            }
        };
        auto piece = [&](const uint2 *w, const uint32_t *s, const xpiece &xp) {
            if (FMT == FMT_FP4) {
                uint32_t wq[2][2]; /* [row][block] */
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const uint32_t keep = lo ? w[r].x : w[r].y;
                    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, lo ? w[r].y : w[r].x, 2);
                    wq[r][0] = lo ? keep : got;
                    wq[r][1] = lo ? got : keep;
                }
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    uint32_t A0[4], A1[4];
                    fp4_frags(wq, b, A0, A1);
                    block(A0, A1, xp, b, cu_e8m0_f32(s[b]), cu_e8m0_f32(s[2 + b]));
                }
            } else {
                uint32_t A0[4], A1[4];
                fp8_frags(w[0], w[1], A0, A1);
                block(A0, A1, xp, 0, cu_e8m0_f32(s[0]), cu_e8m0_f32(s[1]));
            }
        };
        xpiece xr[XD];
        if constexpr (RING) {
#pragma unroll
            for (int i = 0; i < PIPE - 1; i++) issue(kwi + i * kw, i);
#pragma unroll
            for (int i = 0; i < SP - 1; i++) fetch_s(kwi + i * kw, sv[i]);
            cu_pdl_wait(); /* the staging just before */
        } else {
#pragma unroll
            for (int i = 0; i < PIPE - 1; i++) fetch(kwi + i * kw, wv[i], sv[i]);
        }
#pragma unroll
        for (int i = 0; i < XD; i++) fetch_x(kwi + i * kw, xr[i]);
        for (long long pc = kwi; pc < npieces; pc += PIPE * kw) {
#pragma unroll
            for (int st = 0; st < PIPE; st++) {
                const long long cc = pc + st * kw;
                if (cc >= npieces) break;
                if constexpr (RING) {
                    cu_cp_async_wait<PIPE - 2>(); /* this lane's copy of piece cc has landed */
                    __syncwarp();                 /* and every lane's; slot st - 1 is read */
                    ring_words(st, wv[0]);
                    issue(cc + (PIPE - 1) * kw, (st + PIPE - 1) % PIPE);
                    fetch_s(cc + (SP - 1) * kw, sv[(st + SP - 1) % SP]);
                    piece(wv[0], sv[st % SP], xr[st % XD]);
                } else {
                    fetch(cc + (PIPE - 1) * kw, wv[(st + PIPE - 1) % PIPE], sv[(st + PIPE - 1) % PIPE]);
                    piece(wv[st], sv[st], xr[st % XD]);
                }
                fetch_x(cc + XD * kw, xr[st % XD]);
            }
        }
        if constexpr (RING) cu_cp_async_wait_all();

#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) red[warp][nt * 4 + c][lane] = acc[nt][c];
        __syncthreads();
        for (int t = threadIdx.x; t < rsets * NT * 4 * 32; t += THREADS) {
            const int set = t / (NT * 4 * 32), e = t / 32 % (NT * 4), ln = t % 32, c = e % 4;
            const long long n = ((long long)blockIdx.x * rsets + set) * 16 + (ln >> 2) + (c >= 2 ? 8 : 0);
            const int tok = e / 4 * 8 + 2 * (ln & 3) + (c & 1);
            if (n >= p.n || tok >= mv) continue;
            float v = red[set * kw][e][ln];
            for (int i = 1; i < kw; i++) v += red[set * kw + i][e][ln];
            store_y(p, yout, m0 + tok, gi, n, v);
        }
        if (!MOE || m0 + 8 * NT >= mend) break;
        __syncthreads(); /* red is reused by the next pass */
    }
}

/* ---- the streaming tensor-core product of an MoE's few rows ---------------------------------- */
/* FP4 experts of few rows (a decode step's: at most $DSV4_CUDA_MOE_STREAM_ROWS rows in all, see
 * stream_fits) run mma_kernel<FMT_FP4, 1, true>'s arithmetic with another memory side, so the two
 * give the same bits and the choice between them is free:
 *   a CTA is KW warps (k_split's K split) owning 16 weight rows of one (slot, weight set) over the
 *   whole of K, warp w taking pieces w, w + KW, ... as mma_kernel's warp w does (the grid
 *   (N / 16, slots, sets) is one wave for a token's 6 experts; mma_kernel's CTAs of a few pieces
 *   each streamed at ~1 TB/s for one token, BENCHMARKS.md "Linear layers on the GPU"); the CTA
 *   copies stages of PPS pieces of its 16 rows (PPS * 32 contiguous bytes a row, 16-byte cp.async
 *   that bypass L1) and their scale bytes into a ring of ST stages in shared memory, ST - 1 in
 *   flight while it computes one; lane (g, q) reads from there the two words mma_kernel's lane
 *   holds after its swap with lane q ^ 2 (bytes 4j and 16 + 4j of a piece of rows g and g + 8, j
 *   as there), so the fragments, the mmas, the scalings and the activation codes are mma_kernel's,
 *   operation for operation; the warps' partials are summed as mma_kernel sums them: warp 0's plus
 *   1, 2, ... in turn. The activation scales of a pass sit in a table after the ring.
 * An expert of more than 8 rows is walked in passes of 8 (mma_kernel's passes), its weights
 * streamed again each pass. */
/* A stage of PPS pieces: a weight row's PPS * 32 bytes plus 16 (conflict-free 4-byte reads), a
 * scale row's 2 * PPS bytes. */
static __host__ __device__ constexpr int stream_rowb(int pps) { return pps * 32 + 16; }
static __host__ __device__ constexpr int stream_stage_bytes(int pps) { return 16 * stream_rowb(pps) + 16 * 2 * pps; }

/* The expert (index into `tab`) of MoE slot blockIdx.y, found by one warp alone (each warp of a
 * CTA finds the same): moe_slot_expert's rule (the y-th expert of the chunk that has rows, -1 past
 * the last), every offset loaded at once. */
DSV4_CU_INLINE int moe_slot_expert_warp(const moe_tab &tab, const int32_t *off, int e0)
{
    constexpr int C = DSV4_CU_MOE_CHUNK / 32;
    const int lane = threadIdx.x & 31;
    bool has[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int e = 32 * c + lane;
        has[c] = e < tab.n && off[e0 + e + 1] > off[e0 + e];
    }
    int base = 0;
#pragma unroll
    for (int c = 0; c < C; c++) {
        unsigned b = __ballot_sync(0xFFFFFFFFu, has[c]);
        const int cnt = __popc(b), want = (int)blockIdx.y - base;
        if (want < cnt) {
            for (int i = 0; i < want; i++) b &= b - 1;
            return 32 * c + __ffs(b) - 1;
        }
        base += cnt;
    }
    return -1;
}

/* The streaming kernels' walk over a ring of ST stages (a power of two): stage st sits in slot
 * st % ST; before stage(st, slot) runs, it is in for every thread of the CTA and stage st - 1 has
 * been read by every warp, so stage() may first refill slot (st - 1) % ST with stage st + ST - 1. */
template <int ST, typename F> DSV4_CU_INLINE void ring_stages(int nst, F &&stage)
{
#pragma unroll 1
    for (int st0 = 0; st0 < nst; st0 += ST) {
#pragma unroll
        for (int s = 0; s < ST; s++) {
            if (st0 + s >= nst) break;
            cu_cp_async_wait<ST - 2>();
            __syncthreads();
            stage(st0 + s, s);
        }
    }
}

/* The streaming kernels' K-splitting warps' accumulators into warp 0's, in warp order (mma_kernel's
 * sum of its warps' partials); every thread of the CTA calls it. */
template <int KW> DSV4_CU_INLINE void warp_partials(float *acc, float (*red)[4][32], int warp, int lane)
{
    if constexpr (KW > 1) {
#pragma unroll
        for (int c = 0; c < 4; c++) red[warp][c][lane] = acc[c];
        __syncthreads();
        if (warp == 0)
#pragma unroll
            for (int c = 0; c < 4; c++)
#pragma unroll
                for (int w = 1; w < KW; w++) acc[c] += red[w][c][lane];
    }
}

template <int KW, int ST, int PPS>
__global__ void __launch_bounds__(32 * KW) mma_stream_kernel(dsv4_cu_linear p, const __grid_constant__ moe_tab tab,
                                                              const int32_t *off, int e0)
{
    typedef mma_fmt<FMT_FP4> F;
    constexpr int NT = 32 * KW, ROWB = stream_rowb(PPS), SB = stream_stage_bytes(PPS), WCOLS = 2 * PPS, SCOLS = PPS / 2;
    constexpr int WCH = 16 * WCOLS / NT, SCH = (16 * SCOLS + NT - 1) / NT;
    static_assert(PPS % KW == 0 && PPS % 2 == 0, "a stage holds whole turns of the warps and whole scale words");
    static_assert(NT % WCOLS == 0 && ST >= 2 && (ST & (ST - 1)) == 0, "a thread's chunks keep their columns; masks");
    extern __shared__ __align__(16) uint8_t wring[];
    __shared__ float red[KW > 1 ? KW : 1][4][32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3, j = (q & 1) * 2 + (q >> 1);
    cu_pdl_release();
    cu_pdl_wait(); /* off is the kernel before's */
    const int se = moe_slot_expert_warp(tab, off, e0); /* every warp finds the same */
    if (se < 0) return;
    long long m0 = off[e0 + se];
    const long long mend = off[e0 + se + 1];
    const uint8_t *wb = (const uint8_t *)tab.w[blockIdx.z][se], *sb = tab.s[blockIdx.z][se];
    void *yout = tab.y[blockIdx.z];
    const long long row0 = (long long)blockIdx.x * 16;
    const int npieces = (int)(p.k / F::VPP), nst = (npieces + PPS - 1) / PPS, ngr = (int)((p.k + F::G - 1) / F::G);
    float *sx = (float *)(wring + ST * SB); /* [8][ngr]: this pass's activation scales times 2^14 */
    const uint32_t ring = cu_smem(wring);
    /* the copy: 16-byte chunk c of a stage's weights is column c % WCOLS of row c / WCOLS, 4-byte
     * chunk c of its scales column c % SCOLS of row c / SCOLS */
    const uint8_t *wsrc[WCH], *ssrc[SCH];
    uint32_t wdst[WCH], sdst[SCH];
#pragma unroll
    for (int i = 0; i < WCH; i++) {
        const int c = tid + i * NT;
        const long long r = row0 + c / WCOLS, nr = r < p.n ? r : p.n - 1; /* rows past n repeat the last */
        wsrc[i] = wb + nr * p.ws_r_bytes + (c % WCOLS) * 16;
        wdst[i] = (uint32_t)((c / WCOLS) * ROWB + (c % WCOLS) * 16);
    }
#pragma unroll
    for (int i = 0; i < SCH; i++) {
        const int c = tid + i * NT < 16 * SCOLS ? tid + i * NT : 0;
        const long long r = row0 + c / SCOLS, nr = r < p.n ? r : p.n - 1;
        ssrc[i] = sb + nr * p.ss0 + 4 * (c % SCOLS);
        sdst[i] = (uint32_t)(16 * ROWB + (c / SCOLS) * 2 * PPS + 4 * (c % SCOLS));
    }
    const int wpc = (tid % WCOLS) >> 1, spc = 2 * (tid % SCOLS); /* the first piece of a thread's chunks */
    auto issue = [&](int st) { /* one commit group per call, empty past the end */
        if (st < nst) {
            const uint32_t d = ring + (uint32_t)(st & (ST - 1)) * SB;
            const long long pc0 = (long long)st * PPS;
#pragma unroll
            for (int i = 0; i < WCH; i++)
                if (pc0 + wpc < npieces) cu_cp_async16(d + wdst[i], wsrc[i] + pc0 * 32);
#pragma unroll
            for (int i = 0; i < SCH; i++)
                cu_cp_async4_if(d + sdst[i], ssrc[i] + 2 * pc0, tid + i * NT < 16 * SCOLS && pc0 + spc < npieces);
        }
        cu_cp_async_commit();
    };
#pragma unroll 1
    for (;; m0 += 8) {
        const int mv = (int)(mend - m0 < 8 ? mend - m0 : 8);
        /* the n8 operand: activation row g; the scales of the accumulator's columns 2q, 2q + 1 */
        const uint16_t *xc = g < mv ? p.xcodes + (m0 + g) * p.k : nullptr;
        const bool c0 = 2 * q < mv, c1 = 2 * q + 1 < mv;
        const float *sx0 = sx + (c0 ? 2 * q : 0) * ngr, *sx1 = sx + (c1 ? 2 * q + 1 : 0) * ngr;
        __syncthreads(); /* the ring, sx and red are free (a pass before) */
        for (int i = tid; i < mv * ngr; i += NT) sx[i] = p.xscales[(m0 + i / ngr) * ngr + i % ngr] * 16384.0f; /* 2^-14 */
#pragma unroll
        for (int st = 0; st < ST - 1; st++) issue(st);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        ring_stages<ST>(nst, [&](int st, int s) { /* (and sx is written) */
                issue(st + ST - 1);
                const uint8_t *ws = wring + s * SB, *ss = ws + 16 * ROWB;
#pragma unroll
                for (int jj = 0; jj < PPS / KW; jj++) {
                    const int pi = warp + jj * KW, pc = st * PPS + pi;
                    if (pc >= npieces) break;
                    const int grp = pc >> 1; /* a 128-group holds two pieces */
                    const float sxv[2] = {c0 ? sx0[grp] : 0.0f, c1 ? sx1[grp] : 0.0f};
                    uint32_t wq[2][2], sc[2]; /* [row g, g + 8][block]; the rows' two scale bytes */
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const uint8_t *row = ws + (g + 8 * r) * ROWB + pi * 32;
                        wq[r][0] = *(const uint32_t *)(row + 4 * j);
                        wq[r][1] = *(const uint32_t *)(row + 16 + 4 * j);
                        sc[r] = *(const uint16_t *)(ss + (g + 8 * r) * 2 * PPS + 2 * pi);
                    }
#pragma unroll
                    for (int b = 0; b < 2; b++) {
                        uint32_t A0[4], A1[4];
                        fp4_frags(wq, b, A0, A1);
                        const long long xk = (long long)pc * 64 + 32 * b + 8 * j;
                        uint4 X = make_uint4(0, 0, 0, 0);
                        if (xc) X = __ldg((const uint4 *)(xc + xk));
                        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_f16(part, A0, X.x, X.y);
                        mma_f16(part, A1, X.z, X.w);
                        const float sw0 = cu_e8m0_f32((sc[0] >> (8 * b)) & 0xFFu), sw1 = cu_e8m0_f32((sc[1] >> (8 * b)) & 0xFFu);
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[c] = fmaf(part[c] * sxv[c & 1], c < 2 ? sw0 : sw1, acc[c]);
                    }
                }
        });
        cu_cp_async_wait<0>();
        warp_partials<KW>(acc, red, warp, lane);
        if (warp == 0)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const long long n = row0 + g + (c >= 2 ? 8 : 0);
                const int tok = 2 * q + (c & 1);
                if (n < p.n && tok < mv) store_y(p, yout, m0 + tok, 0, n, acc[c]);
            }
        if (m0 + 8 >= mend) break;
    }
}

/* ---- the streaming tensor-core product of a plain FP8 product of few rows ---------------------- */
/* An FP8 (128 x 128 block-scaled) product of at most 8 rows (a decode step's) runs
 * mma_kernel<FMT_B128, 1, false>'s arithmetic with another memory side, so the two give the same
 * bits (every fragment, mma, scaling and sum in the same order) and the choice is free:
 *   a CTA is KW warps (k_split's K split) owning 16 weight rows of one group over the whole of K,
 *   warp w taking pieces w, w + KW, ... as mma_kernel's warp w does; the CTA copies stages of
 *   GV_PPS pieces (8, or 16 for 8 warps: 256 or 512 contiguous bytes a row) of its 16 rows and
 *   of the staged activation codes of its M rows into a ring of ST stages in shared memory
 *   (16-byte cp.async, ST - 1 stages in flight while it computes one), so a piece costs two 8-byte
 *   and one 16-byte shared loads beside its mmas (mma_kernel at M = 1 issued ~150 instructions per
 *   512-byte piece and streamed ~1.5 TB/s, BENCHMARKS.md "Linear layers on the GPU"); both sides'
 *   scales are decoded once into tables after the ring. The warps' partials are summed as
 *   mma_kernel sums them: warp 0's plus 1, 2, ... in turn. */
enum { GV_ROWS = 8 };
/* A stage of PPS pieces: a weight row's PPS * 32 bytes plus 32 (conflict-free 8-byte reads), an
 * activation row's PPS * 64 bytes of codes plus 64 (conflict-free 16-byte reads). */
static __host__ __device__ constexpr int gemv_rowb(int pps) { return pps * 32 + 32; }
static __host__ __device__ constexpr int gemv_xrowb(int pps) { return pps * 64 + 64; }

enum { GV_MAXK = 16384 /* the scale tables' bound: 6 KB at M = 8 */ };
static __host__ __device__ inline size_t gemv_stage_bytes(int pps, long long m)
{
    return (size_t)16 * gemv_rowb(pps) + (size_t)m * gemv_xrowb(pps);
}
static inline size_t gemv_scale_bytes(long long m, long long k) { return (size_t)(16 + m) * (size_t)((k / 32 + 3) / 4) * 4; }

template <int KW, int ST, int GV_PPS>
__global__ void __launch_bounds__(32 * KW) mma_gemv_kernel(dsv4_cu_linear p)
{
    constexpr int GV_ROWB = gemv_rowb(GV_PPS), GV_XROWB = gemv_xrowb(GV_PPS), WCOLS = 2 * GV_PPS, XCOLS = 4 * GV_PPS;
    static_assert(GV_PPS % KW == 0, "a stage holds whole turns of the warps");
    static_assert((32 * KW) % XCOLS == 0, "a thread's chunks keep their columns");
    static_assert(ST >= 2 && (ST & (ST - 1)) == 0, "the ring turns by masks");
    constexpr int NT = 32 * KW, WCH = 16 * WCOLS / NT, XCH = (GV_ROWS * XCOLS + NT - 1) / NT;
    extern __shared__ __align__(16) uint8_t gring[];
    __shared__ float red[KW > 1 ? KW : 1][4][32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const long long gi = blockIdx.y, row0 = (long long)blockIdx.x * 16;
    const int mv = (int)p.m, npieces = (int)(p.k / 32), nst = (npieces + GV_PPS - 1) / GV_PPS, nblk = (npieces + 3) / 4;
    const uint32_t sbytes = (uint32_t)gemv_stage_bytes(GV_PPS, mv), ring = cu_smem(gring);
    /* after the ring: the scales as floats, sw[16][nblk] of the weight rows, sx[mv][nblk] of the
     * activation rows (e8m0 decoded once, as mma_kernel decodes each) */
    float *sw = (float *)(gring + ST * sbytes), *sx = sw + 16 * nblk;
    cu_pdl_release();
    /* the copy: 16-byte chunk c of a stage's weights is column c % WCOLS of row c / WCOLS, chunk c
     * of its codes column c % XCOLS of activation row c / XCOLS; each source advances one stage a
     * call */
    const uint8_t *wsrc[WCH];
    uint32_t wdst[WCH];
#pragma unroll
    for (int i = 0; i < WCH; i++) {
        const int c = tid + i * NT;
        const long long r = row0 + c / WCOLS, nr = r < p.n ? r : p.n - 1; /* rows past n repeat the last */
        wsrc[i] = (const uint8_t *)p.w + (gi * p.n + nr) * p.ws_r_bytes + (c % WCOLS) * 16;
        wdst[i] = (uint32_t)((c / WCOLS) * GV_ROWB + (c % WCOLS) * 16);
    }
    const int wpc0 = (tid % WCOLS) >> 1; /* the piece of a weight chunk within its stage */
    const uint16_t *xsrc[XCH];
    uint32_t xdst[XCH];
#pragma unroll
    for (int i = 0; i < XCH; i++) {
        const int c = tid + i * NT, t = c / XCOLS < mv ? c / XCOLS : 0;
        xsrc[i] = p.xcodes + (t * p.groups + gi) * p.k + (c % XCOLS) * 8;
        xdst[i] = (uint32_t)(16 * GV_ROWB + t * GV_XROWB + (c % XCOLS) * 16);
    }
    const int xpc0 = (tid % XCOLS) >> 2; /* 8 codes a chunk: piece (c % XCOLS) / 4 */
    auto issue_w = [&](int st) {
        const uint32_t d = ring + (uint32_t)(st & (ST - 1)) * sbytes;
        const bool on = st < nst && st * GV_PPS + wpc0 < npieces;
#pragma unroll
        for (int i = 0; i < WCH; i++) {
            if (on) cu_cp_async16(d + wdst[i], wsrc[i]);
            wsrc[i] += GV_PPS * 32;
        }
    };
    auto issue_x = [&](int st) {
        const uint32_t d = ring + (uint32_t)(st & (ST - 1)) * sbytes;
        const bool on = st < nst && st * GV_PPS + xpc0 < npieces;
#pragma unroll
        for (int i = 0; i < XCH; i++) {
            if (on && tid + i * NT < mv * XCOLS) cu_cp_async16(d + xdst[i], xsrc[i]);
            xsrc[i] += GV_PPS * 32;
        }
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        issue_w(i);
        cu_cp_async_commit();
    }
    for (int i = tid; i < 16 * nblk; i += NT) {
        const long long r = row0 + i / nblk, nr = r < p.n ? r : p.n - 1;
        sw[i] = cu_e8m0_f32(__ldg(p.scale + (gi * p.n + nr) / 128 * p.ss0 + (i % nblk) * p.ss1));
    }
    cu_pdl_wait(); /* the staging just before: its codes and scales */
#pragma unroll
    for (int i = 0; i < ST - 1; i++) issue_x(i);
    cu_cp_async_commit();
    for (int i = tid; i < mv * nblk; i += NT) {
        const int t = i / nblk;
        sx[i] = p.xscales[(t * p.groups + gi) * ((p.k + 127) / 128) + i % nblk];
    }
    cu_cp_async_wait<0>(); /* the prologue's stages, activations included (the barrier: below) */
    /* this lane's scale entries: weight rows g, g + 8, activation columns 2q, 2q + 1 (0 past mv) */
    const float *sw0p = sw + g * nblk, *sw1p = sw + (g + 8) * nblk;
    const bool c0 = 2 * q < mv, c1 = 2 * q + 1 < mv;
    const float *sx0p = sx + (c0 ? 2 * q : 0) * nblk, *sx1p = sx + (c1 ? 2 * q + 1 : 0) * nblk;
    const bool xon = g < mv;
    const uint32_t woff = (uint32_t)(g * GV_ROWB + 8 * q), xoff = (uint32_t)(16 * GV_ROWB + g * GV_XROWB + 16 * q);
    ring_stages<ST>(nst, [&](int st, int s) {
            issue_w(st + ST - 1);
            issue_x(st + ST - 1);
            cu_cp_async_commit();
            const uint8_t *stg = gring + s * sbytes;
#pragma unroll
            for (int j = 0; j < GV_PPS / KW; j++) {
                const int pi = warp + j * KW, pc = st * GV_PPS + pi;
                if (pc >= npieces) break;
                const uint2 w0 = *(const uint2 *)(stg + woff + pi * 32);
                const uint2 w1 = *(const uint2 *)(stg + woff + 8 * GV_ROWB + pi * 32);
                const uint4 X = xon ? *(const uint4 *)(stg + xoff + pi * 64) : make_uint4(0, 0, 0, 0);
                uint32_t A0[4], A1[4];
                fp8_frags(w0, w1, A0, A1);
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_f16(part, A0, __byte_perm(X.x, X.y, 0x5410), __byte_perm(X.z, X.w, 0x5410));
                mma_f16(part, A1, __byte_perm(X.x, X.y, 0x7632), __byte_perm(X.z, X.w, 0x7632));
                const int b = pc >> 2;
                const float ws0 = sw0p[b], ws1 = sw1p[b], xs2[2] = {c0 ? sx0p[b] : 0.0f, c1 ? sx1p[b] : 0.0f};
#pragma unroll
                for (int c = 0; c < 4; c++) acc[c] = fmaf(part[c] * xs2[c & 1], c < 2 ? ws0 : ws1, acc[c]);
            }
    });
    cu_cp_async_wait<0>();
    warp_partials<KW>(acc, red, warp, lane);
    if (warp) return;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const long long n = row0 + g + (c >= 2 ? 8 : 0);
        const int tok = 2 * q + (c & 1);
        if (n < p.n && tok < mv) store_y(p, p.y, tok, gi, n, acc[c]);
    }
}

/* The launch of one format and activation type: a plain (grouped) product, or with `mo` an MoE
 * chunk of experts. The MoE instances are few, for compile time (each costs more than a plain
 * one): BF16 activations (the block's rows and stagings are BF16) and row tiles of one (the
 * decode of one token; more rows re-read the expert's weights per row, from L2). */

template <int FMT, bool XF32> struct launcher {
    template <int MT> static cudaError_t one(const dsv4_cu_linear *a, dim3 grid, int kw, int aligned,
                                             const dsv4_cu_moe_chunk *mo, cudaStream_t s)
    {
        if constexpr (!XF32 && MT == 1)
            if (mo) {
                const moe_tab t = moe_table(mo);
                return cu_launch_dependent(linear_kernel<FMT, XF32, MT, true, moe_tab>, grid, THREADS, s, linear_pdl(),
                                           *a, kw, aligned, t, mo->offsets, mo->e0);
            }
        return cu_launch_dependent(linear_kernel<FMT, XF32, MT, false, no_tab>, grid, THREADS, s, linear_pdl(), *a, kw,
                                   aligned, no_tab{}, (const int32_t *)nullptr, 0);
    }
    static cudaError_t run(const dsv4_cu_linear *a, dim3 grid, int mt, int kw, int aligned,
                           const dsv4_cu_moe_chunk *mo, cudaStream_t s)
    {
        switch (mt) {
        case 1: return one<1>(a, grid, kw, aligned, mo, s);
        case 2: return one<2>(a, grid, kw, aligned, mo, s);
        case 4: return one<4>(a, grid, kw, aligned, mo, s);
        case 8: return one<8>(a, grid, kw, aligned, mo, s);
        default: return one<16>(a, grid, kw, aligned, mo, s);
        }
    }
};

static int a16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static int a8(const void *p) { return ((uintptr_t)p & 7u) == 0; }

/* The tensor-core product takes a quantized format with the staging's codes, any number of rows
 * (unless fp32_rows / moe_fp32_rows say otherwise), K in whole pieces, 8-byte aligned weight rows
 * (16-byte for a plain product's ring); the rest is the fp32 path's. The choice depends on the format and the shape of the weight
 * alone, never on M: the two kernels sum in different orders, and a token's logits must not depend
 * on the size of the batch it was decoded in. (One and two rows alone stream faster on the fp32
 * kernel: BENCHMARKS.md "Linear layers on the GPU".) */
static bool mma_fits(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo)
{
    if (a->fmt > FMT_FP4 || !a->xcodes || !a->xscales) return false;
    if (!mo && a->m <= fp32_rows()) return false;
    if (mo && a->m <= moe_fp32_rows()) return false;
    if (a->k % (a->fmt == FMT_FP4 ? 64 : 32) || !a8(a->w) || a->ws_r_bytes % 8) return false;
    if (!mo && (!a16(a->w) || a->ws_r_bytes % 16)) return false; /* the ring's 16-byte copies */
    for (int j = 0; mo && j < mo->sets; j++)
        for (int i = 0; i < mo->n; i++)
            if (!a8(mo->w[j][i])) return false;
    return true;
}

/* A plain instance with its weight ring (RING_BYTES of dynamic shared memory, opted in once per
 * device and instance). */
template <int FMT, int NT> static cudaError_t mma_plain(const dsv4_cu_linear *a, dim3 grid, int kw, cudaStream_t s)
{
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    int device = -1;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = (cudaError_t)cu_smem_opt_in(configured, device, mma_kernel<FMT, NT, false, no_tab>, RING_BYTES);
    if (e != cudaSuccess) return e;
    return cu_launch_dependent_smem(mma_kernel<FMT, NT, false, no_tab>, grid, THREADS, RING_BYTES, s, linear_pdl(), *a,
                                    kw, no_tab{}, (const int32_t *)nullptr, 0);
}

template <int FMT> static cudaError_t mma_run(const dsv4_cu_linear *a, dim3 grid, int kw, const dsv4_cu_moe_chunk *mo,
                                              cudaStream_t s)
{
    if (mo) {
        const moe_tab t = moe_table(mo);
        return cu_launch_dependent(mma_kernel<FMT, 1, true, moe_tab>, grid, THREADS, s, linear_pdl(), *a, kw, t,
                                   mo->offsets, mo->e0);
    }
    return a->m <= 8 ? mma_plain<FMT, 1>(a, grid, kw, s) : mma_plain<FMT, 2>(a, grid, kw, s);
}

/* The streaming kernel takes an MoE product that mma_kernel would take (mma_fits) with FP4
 * weights, K in whole stages of pairs of pieces (a scale word holds two pieces), 16-byte aligned
 * weight rows, contiguous scale bytes in 4-byte aligned rows, and few rows (moe_stream_rows). */
static bool stream_fits(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo)
{
    if (a->fmt != FMT_FP4 || a->k % 128 || a->k > 16384 || a->ws_r_bytes % 16 || a->ss1 != 1 || a->ss0 % 4) return false;
    if (a->m > moe_stream_rows()) return false;
    for (int j = 0; j < mo->sets; j++)
        for (int i = 0; i < mo->n; i++)
            if (!a16(mo->w[j][i]) || ((uintptr_t)mo->s[j][i] & 3u)) return false;
    return true;
}

/* K is split over more warps only while the grid would not give every SM of an H200 two CTAs of
 * `set_rows`-row sets: long runs along K keep a lane's loads in flight, the split covers small N.
 * The choice depends on the shape alone (a constant, not the device's SM count; an MoE counts one
 * expert), and with it the summation order. */
static int k_split(long long n, long long groups, long long steps, int set_rows)
{
    int kw = 1;
    while (kw < WARPS && 2 * kw <= steps &&
           (n + (WARPS / kw) * set_rows - 1) / ((WARPS / kw) * set_rows) * groups < TARGET_CTAS)
        kw <<= 1;
    return kw;
}

/* The streaming kernels' instance for a K split kw (1, 2, 4, 8) over `pieces` pieces: stages of 8
 * pieces (16 when 8 warps share them: two pieces a warp a stage, the ring's upkeep spread over more
 * work), a ring of as many stages as K has, up to 8 (4 of 16); run(KW, ST, PPS) launches it, each
 * an std::integral_constant. */
template <int KW, typename R> static cudaError_t streaming_depth(long long pieces, R &&run)
{
    using std::integral_constant;
    constexpr int PPS = KW == 8 ? 16 : 8;
    const long long nst = (pieces + PPS - 1) / PPS;
    const integral_constant<int, KW> kw;
    const integral_constant<int, PPS> pps;
    if (nst <= 2) return run(kw, integral_constant<int, 2>(), pps);
    if constexpr (PPS == 16) return run(kw, integral_constant<int, 4>(), pps);
    else return nst <= 4 ? run(kw, integral_constant<int, 4>(), pps) : run(kw, integral_constant<int, 8>(), pps);
}

template <typename R> static cudaError_t streaming_dispatch(int kw, long long pieces, R &&run)
{
    switch (kw) {
    case 1: return streaming_depth<1>(pieces, run);
    case 2: return streaming_depth<2>(pieces, run);
    case 4: return streaming_depth<4>(pieces, run);
    default: return streaming_depth<8>(pieces, run);
    }
}

/* KW warps a CTA (mma_launch's K split: its order), 16 rows of one (slot, weight set) each. */
template <int KW, int ST, int PPS>
static cudaError_t stream_run(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, dim3 grid, cudaStream_t s)
{
    const size_t smem = (size_t)ST * stream_stage_bytes(PPS) + (size_t)8 * ((a->k + 127) / 128) * 4;
    return cu_launch_dependent_smem(mma_stream_kernel<KW, ST, PPS>, grid, 32 * KW, smem, s, linear_pdl(), *a,
                                    moe_table(mo), mo->offsets, mo->e0);
}

static int stream_launch(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, cudaStream_t s)
{
    const long long slots = a->m < mo->n ? a->m : mo->n, gx = (a->n + 15) / 16;
    const int kw = k_split(a->n, 1, a->k / 64, 16);
    if (gx > 0x7FFFFFFFll || slots > 65535) return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)slots, (unsigned)mo->sets);
    return (int)streaming_dispatch(kw, a->k / 64, [&](auto KW, auto ST, auto PPS) {
        return stream_run<decltype(KW)::value, decltype(ST)::value, decltype(PPS)::value>(a, mo, grid, s);
    });
}

/* The streaming kernel takes a plain product that mma_kernel would take (mma_fits: K in whole
 * pieces, 16-byte aligned weight rows) with FP8 block weights, K up to GV_MAXK, at most gemv_rows()
 * (<= GV_ROWS) rows and 16-byte aligned staged rows. */
static bool gemv_fits(const dsv4_cu_linear *a)
{
    return a->fmt == FMT_B128 && a->m <= gemv_rows() && a->m <= GV_ROWS && a->k <= GV_MAXK && a16(a->xcodes);
}

template <int KW, int ST, int PPS> static cudaError_t gemv_run(const dsv4_cu_linear *a, dim3 grid, cudaStream_t s)
{
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    int device = -1;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess)
        e = (cudaError_t)cu_smem_opt_in(configured, device, mma_gemv_kernel<KW, ST, PPS>,
                                        (int)(ST * gemv_stage_bytes(PPS, GV_ROWS) + gemv_scale_bytes(GV_ROWS, GV_MAXK)));
    if (e != cudaSuccess) return e;
    return cu_launch_dependent_smem(mma_gemv_kernel<KW, ST, PPS>, grid, 32 * KW,
                                    ST * gemv_stage_bytes(PPS, a->m) + gemv_scale_bytes(a->m, a->k), s, linear_pdl(), *a);
}

/* KW warps a CTA (mma_launch's K split: its order), 16 rows of one group each. */
static int gemv_launch(const dsv4_cu_linear *a, cudaStream_t s)
{
    const long long gx = (a->n + 15) / 16, npieces = a->k / 32;
    const int kw = k_split(a->n, a->groups, npieces, 16);
    if (gx > 0x7FFFFFFFll || a->groups > 65535) return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)a->groups, 1);
    return (int)streaming_dispatch(kw, npieces, [&](auto KW, auto ST, auto PPS) {
        return gemv_run<decltype(KW)::value, decltype(ST)::value, decltype(PPS)::value>(a, grid, s);
    });
}

static int mma_launch(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, cudaStream_t s)
{
    /* an MoE: one slot per expert that can have rows (at most one per row), found on the device */
    const long long groups = mo ? (a->m < mo->n ? a->m : mo->n) : a->groups, vpp = a->fmt == FMT_FP4 ? 64 : 32;
    const int kw = k_split(a->n, mo ? 1 : groups, a->k / vpp, 16);
    const long long gx = (a->n + (WARPS / kw) * 16 - 1) / ((WARPS / kw) * 16), gz = mo ? mo->sets : (a->m + 15) / 16;
    if (gx > 0x7FFFFFFFll || groups > 65535 || gz > 65535) return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)groups, (unsigned)gz);
    switch (a->fmt) {
    case FMT_B128: return (int)mma_run<FMT_B128>(a, grid, kw, mo, s);
    case FMT_MX: return (int)mma_run<FMT_MX>(a, grid, kw, mo, s);
    default: return (int)mma_run<FMT_FP4>(a, grid, kw, mo, s);
    }
}

/* A plain product (mo NULL) or one chunk of an MoE product (cuda_ops.h). */
static int linear_launch(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, void *stream)
{
    if (a->m == 0 || (mo && mo->n == 0)) return 0;
    if (mma_fits(a, mo))
        return mo && stream_fits(a, mo)  ? stream_launch(a, mo, (cudaStream_t)stream)
               : !mo && gemv_fits(a)     ? gemv_launch(a, (cudaStream_t)stream)
                                         : mma_launch(a, mo, (cudaStream_t)stream);
    /* an MoE: one slot per expert that can have rows, as in mma_launch */
    const long long groups = mo ? (a->m < mo->n ? a->m : mo->n) : a->groups;
    const int vec = a->fmt == FMT_FP4 ? 32 : a->fmt == FMT_BF16 ? 8 : a->fmt == FMT_F32 ? 4 : 16;
    const long long nchunks = (a->k + 32 * vec - 1) / (32 * vec);
    const int kw = k_split(a->n, mo ? 1 : groups, nchunks, 4);
    const int mt = mo ? 1 : a->m >= 16 ? 16 : a->m > 4 ? 8 : a->m > 2 ? 4 : (int)a->m;
    const long long rows_per_cta = (WARPS / kw) * rows_of(mt);
    const long long gx = (a->n + rows_per_cta - 1) / rows_per_cta, gz = mo ? mo->sets : (a->m + mt - 1) / mt;
    if (gx > 0x7FFFFFFFll || groups > 65535 || gz > 65535) return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)groups, (unsigned)gz);
    const int xb = a->fmt <= FMT_FP4 || a->x_bf16 ? 2 : 4;
    int aligned = a16(a->w) && a->ws_r_bytes % 16 == 0 && a16(a->x) && ((a->m == 1 && !mo) || (a->xs_m * xb) % 16 == 0) &&
                  (a->groups == 1 || (a->xs_g * xb) % 16 == 0);
    for (int j = 0; mo && j < mo->sets; j++)
        for (int i = 0; i < mo->n; i++) aligned = aligned && a16(mo->w[j][i]);
    if (mo && a->fmt > FMT_FP4 && !a->x_bf16) return (int)cudaErrorInvalidValue; /* no F32-activation instance */
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    switch (a->fmt) {
    case FMT_B128: e = launcher<FMT_B128, false>::run(a, grid, mt, kw, aligned, mo, s); break;
    case FMT_MX: e = launcher<FMT_MX, false>::run(a, grid, mt, kw, aligned, mo, s); break;
    case FMT_FP4: e = launcher<FMT_FP4, false>::run(a, grid, mt, kw, aligned, mo, s); break;
    case FMT_BF16:
        e = a->x_bf16 ? launcher<FMT_BF16, false>::run(a, grid, mt, kw, aligned, mo, s)
                      : launcher<FMT_BF16, true>::run(a, grid, mt, kw, aligned, mo, s);
        break;
    default:
        e = a->x_bf16 ? launcher<FMT_F32, false>::run(a, grid, mt, kw, aligned, mo, s)
                      : launcher<FMT_F32, true>::run(a, grid, mt, kw, aligned, mo, s);
        break;
    }
    return (int)e;
}

extern "C" int dsv4_cu_linear_launch(const dsv4_cu_linear *a, void *stream) { return linear_launch(a, nullptr, stream); }

extern "C" int dsv4_cu_moe_linear_launch(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, void *stream)
{
    return mo->n > DSV4_CU_MOE_CHUNK || mo->sets < 1 || mo->sets > 2 ? (int)cudaErrorInvalidValue
                                                                      : linear_launch(a, mo, stream);
}
