/* Device helpers shared by the CUDA kernels: number formats (the device form of the rules in
 * src/formats/codec.h, bit for bit: E4M3 encoding goes through the hardware's saturating
 * round-to-nearest-even conversion, which docs/contracts.md §2 names as the reference),
 * unaligned-safe 16-byte loads/stores, and the PTX wrappers (cp.async, ldmatrix, mma). */
#ifndef DSV4_CUDA_DEVICE_CUH
#define DSV4_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "formats/codec.h" /* dsv4_e2m1_from_f32: the E2M1 rule, host and device */

#define DSV4_CU_INLINE __device__ __forceinline__

/* ---- formats ----------------------------------------------------------------------------- */
DSV4_CU_INLINE float cu_bf16_f32(uint32_t b) { return __uint_as_float((b & 0xFFFFu) << 16); }

/* RNE, NaN -> its sign | 0x7FC0 (codec.h dsv4_bf16_from_f32). */
DSV4_CU_INLINE uint32_t cu_f32_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) & 0x8000u) | 0x7FC0u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* 2^k for k in [-149, 127] (codec.h dsv4_pow2f). */
DSV4_CU_INLINE float cu_pow2f(int k)
{
    return k >= -126 ? __uint_as_float((uint32_t)(k + 127) << 23) : __uint_as_float(1u << (k + 149));
}

/* UE8M0 byte -> 2^(b-127), 255 -> NaN: b << 23 for the codes 1..254; code 0 (2^-127, a
 * subnormal) and 255 (NaN) both add bit 22 (cu_pow2f's and the NaN's bits in fewer operations). */
DSV4_CU_INLINE float cu_e8m0_f32(uint32_t b) { return __uint_as_float((b << 23) | ((b + 1u) & 0xFEu ? 0u : 0x00400000u)); }

/* float -> E4M3FN: RNE, saturating to +-448, NaN -> sign|0x7F (the codec's NaN keeps its sign). */
DSV4_CU_INLINE uint32_t cu_f32_e4m3(float x)
{
    if (isnan(x)) return ((__float_as_uint(x) >> 24) & 0x80u) | 0x7Fu;
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}


/* Sixteen E4M3FN codes (c, byte i = code i) times the UE8M0 scale 2^(sb - 127) as BF16 (code i in
 * the 16 bits of out[i / 8] word (i % 8) / 2 at bit 16 (i % 2)), exact: the conversion unit turns
 * code pairs into FP16 pairs (every E4M3 value is an FP16 value), FP32 products with the scale are
 * exact, and one RNE rounding to BF16 follows, as in the codec. NaN codes or a NaN scale give NaN;
 * EXACT_NAN gives the codec's bits for them too (a NaN code: its sign | 0x7FC0; a NaN scale:
 * 0x7FC0), at the cost of a check of all sixteen codes (the gather, whose bytes tests compare;
 * the decode only needs NaN to stay NaN). A version on integer and BF16-multiply instructions
 * measured 2.4x slower in the decode's producer on the H200. */
template <bool EXACT_NAN> DSV4_CU_INLINE void cu_e4m3x16_bf16(uint4 c, uint32_t sb, uint4 out[2])
{
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    const float sc = sb == 255u ? __uint_as_float(0x7FC00000u) : cu_pow2f((int)sb - 127);
    uint32_t r[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const __half2_raw hr =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu), __NV_E4M3);
        __half2 h;
        memcpy(&h, &hr, 4);
        const float2 f = __half22float2(h);
        const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, sc), __fmul_rn(f.y, sc));
        memcpy(&r[i], &b, 4);
    }
    if (EXACT_NAN) {
        uint32_t nan = 0; /* a byte 0x7F or 0xFF: bit 7 of that byte of (w & 0x7F..) + 0x01.. */
#pragma unroll
        for (int i = 0; i < 4; i++) nan |= ((w[i] & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
        if (sb == 255u) {
#pragma unroll
            for (int i = 0; i < 8; i++) r[i] = 0x7FC07FC0u;
        } else if (nan) {
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const uint32_t code = (w[i >> 2] >> (8 * (i & 3))) & 0xFFu, sh = 16 * (i & 1);
                if ((code & 0x7Fu) == 0x7Fu)
                    r[i >> 1] = (r[i >> 1] & ~(0xFFFFu << sh)) | ((((code & 0x80u) << 8) | 0x7FC0u) << sh);
            }
        }
    }
    out[0] = make_uint4(r[0], r[1], r[2], r[3]);
    out[1] = make_uint4(r[4], r[5], r[6], r[7]);
}

/* ceil(log2(y)) of a positive normal float or +Inf, from its bits (codec.h). */
DSV4_CU_INLINE int cu_ceil_log2_bits(float y)
{
    uint32_t u = __float_as_uint(y);
    return (int)((u >> 23) & 0xFFu) - 127 + ((u & 0x7FFFFFu) != 0);
}

/* The KV64 scale exponent of a group with absolute maximum amax (codec.h dsv4_qrule_exponent
 * with the kv64 parameters: amax floored at 1e-4, max code 448). */
DSV4_CU_INLINE int cu_kv64_exponent(float amax)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    int e = cu_ceil_log2_bits(__fdiv_rn(amax, 448.0f));
    return e < -127 ? -127 : (e > 128 ? 128 : e);
}

/* 2^x with the hardware approximation (relative error below 2^-22; -inf -> +0). */
DSV4_CU_INLINE float cu_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- memory ------------------------------------------------------------------------------ */
DSV4_CU_INLINE uint4 cu_ld16(const void *p)
{
    if (((uintptr_t)p & 15u) == 0) return *(const uint4 *)p;
    const uint8_t *b = (const uint8_t *)p;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)b[4 * i] | ((uint32_t)b[4 * i + 1] << 8) | ((uint32_t)b[4 * i + 2] << 16) |
               ((uint32_t)b[4 * i + 3] << 24);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

DSV4_CU_INLINE void cu_st16(void *p, uint4 v)
{
    if (((uintptr_t)p & 15u) == 0) {
        *(uint4 *)p = v;
        return;
    }
    uint8_t *b = (uint8_t *)p;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; i++) b[i] = (uint8_t)(w[i >> 2] >> (8 * (i & 3)));
}

DSV4_CU_INLINE uint32_t cu_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

DSV4_CU_INLINE void cu_cp_async16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_CU_INLINE void cu_cp_async8(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
/* 4 bytes global -> shared when pred (nothing otherwise). */
DSV4_CU_INLINE void cu_cp_async4_if(uint32_t dst, const void *src, bool pred)
{
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q cp.async.ca.shared.global [%0], [%1], 4;\n}\n" ::"r"(dst),
                 "l"(src), "r"((int)pred)
                 : "memory");
}
DSV4_CU_INLINE void cu_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
DSV4_CU_INLINE void cu_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
/* Until at most N of this thread's committed groups are pending. */
template <int N> DSV4_CU_INLINE void cu_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Named barrier over `threads` threads (id 0 is __syncthreads'). */
DSV4_CU_INLINE void cu_bar(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- tensor cores ------------------------------------------------------------------------ */
DSV4_CU_INLINE void cu_ldsm_x4(uint32_t addr, uint32_t *r)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
DSV4_CU_INLINE void cu_ldsm_x4_trans(uint32_t addr, uint32_t *r)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
DSV4_CU_INLINE void cu_ldsm_x2(uint32_t addr, uint32_t *r)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

/* d += a * b: m16n8k16, BF16 inputs, FP32 accumulators. */
DSV4_CU_INLINE void cu_mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


/* ---- Hopper warpgroup MMA (sm_90a) ---------------------------------------------------------
 * Operands in shared memory use the 128-byte-swizzled layout: rows of 128 bytes (64 BF16),
 * 8-row atoms of 1024 bytes (1024-byte aligned), the 16-byte chunk c of row r stored at chunk
 * c ^ (r % 8). K-major operands (rows = M or N, 64 K-values per row) step K by moving the
 * start address 32 bytes per k16; an MN-major operand (rows = K) has 64-column blocks LBO bytes
 * apart. Descriptor: start >> 4 | LBO >> 4 << 16 | SBO >> 4 << 32 | swizzle 128B (1) << 62. */
DSV4_CU_INLINE uint64_t cu_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}
DSV4_CU_INLINE void cu_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DSV4_CU_INLINE void cu_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Keeps the compiler from moving accumulator reads/writes across the asynchronous MMA. */
DSV4_CU_INLINE void cu_reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
/* 16-byte store to shared memory at a 32-bit shared-window address (generic stores through a
 * 64-bit pointer cost more registers and address work in the producers' inner loop). */
DSV4_CU_INLINE void cu_sts16(uint32_t addr, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
DSV4_CU_INLINE uint32_t cu_lds4(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
DSV4_CU_INLINE void cu_sts4(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
/* Generic-proxy shared-memory writes (st.shared, cp.async) made visible to the tensor cores. */
DSV4_CU_INLINE void cu_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Operand lists of the wgmma wrappers: accumulators d[0 .. n-1] as "+f" operands %0 .. %n-1. */
#define CU_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                      "+f"(d[i + 6]), "+f"(d[i + 7])
#define CU_ACC32(d, i) CU_ACC8(d, i), CU_ACC8(d, i + 8), CU_ACC8(d, i + 16), CU_ACC8(d, i + 24)
#define CU_ACC128(d) CU_ACC32(d, 0), CU_ACC32(d, 32), CU_ACC32(d, 64), CU_ACC32(d, 96)
#define CU_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define CU_REGS32 CU_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CU_REGS128                                                                                               \
    CU_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "              \
              "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                \
              "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                \
              "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                \
              "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "     \
              "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

/* d (+)= A * B, BF16 in, FP32 accumulate, A and B from shared-memory descriptors (the "SS" form):
 * m64nNk16 with N 32 (d[0..15]), 64 (d[0..31]) or 256 (d[0..127]); scale_d 0 overwrites d; TB 1
 * reads B MN-major (transposed). */
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n32(float *d, uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" CU_REGS16 "}, %16, %17, p, 1, 1, 0, %19;\n}\n"
                 : CU_ACC8(d, 0), CU_ACC8(d, 8)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n64(float *d, uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" CU_REGS32 "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
                 : CU_ACC32(d, 0)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n256(float *d, uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" CU_REGS128 "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
                 : CU_ACC128(d)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}
/* The "RS" form of m64n256k16: A from registers a[0..3] (the m16n8k16 A fragment of this warp's
 * 16 rows: a[0] row g k 2c.., a[1] row g+8, a[2] row g k 2c+8.., a[3] row g+8 k 2c+8..; g = lane / 4,
 * c = lane % 4), accumulating into d. a must stay unchanged until the wgmma has completed. */
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n256_rs(float *d, const uint32_t *a, uint64_t db)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" CU_REGS128 "}, "
                 "{%128, %129, %130, %131}, %132, 1, 1, 1, %133;\n"
                 : CU_ACC128(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
/* Wait until at most N committed wgmma groups of this warpgroup are pending. */
template <int N> DSV4_CU_INLINE void cu_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* ---- warp specialization (sm_90a): mbarriers, register reallocation, and the distributed
 * shared memory of a thread-block cluster ---------------------------------------------------- */
DSV4_CU_INLINE void cu_mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialized barriers visible to the cluster (and to the async proxy). */
DSV4_CU_INLINE void cu_fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* Arrive (release, CTA scope) on a barrier of this CTA. */
DSV4_CU_INLINE void cu_mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Arrive (release, cluster scope) on a barrier given by its shared::cluster address (this CTA's
 * or a peer's, from cu_mapa). */
DSV4_CU_INLINE void cu_mbar_arrive_cluster(uint32_t bar)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Wait until the phase of parity `parity` of a barrier of this CTA has completed; CL 1 acquires
 * at cluster scope (arrivals from a peer CTA). */
template <int CL> DSV4_CU_INLINE void cu_mbar_wait(uint32_t bar, uint32_t parity)
{
    if (CL)
        asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%0], %1;\n"
                     "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
    else
        asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                     "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
template <int N> DSV4_CU_INLINE void cu_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> DSV4_CU_INLINE void cu_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
DSV4_CU_INLINE uint32_t cu_cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* All threads of the cluster (release / acquire). */
DSV4_CU_INLINE void cu_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* The shared::cluster address of this CTA's shared address `addr` in cluster CTA `rank`. */
DSV4_CU_INLINE uint32_t cu_mapa(uint32_t addr, uint32_t rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
/* Bulk copy of `bytes` (a multiple of 16) from this CTA's shared memory to a shared::cluster
 * address (a peer CTA's), completing as transaction bytes on the mbarrier at shared::cluster
 * address `bar` (in the destination CTA). */
DSV4_CU_INLINE void cu_bulk_copy_cluster(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "r"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* Arrive on a barrier of this CTA and raise its expected transaction bytes by `bytes`. */
DSV4_CU_INLINE void cu_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* *p when pred, else `fallback`: one predicated read-only load (no branch, so nothing waits for
 * the value before it is used). */
DSV4_CU_INLINE int cu_ldg_s32_if(const int32_t *p, bool pred, int fallback)
{
    int v;
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, %3;\n@q ld.global.nc.b32 %0, [%1];\n}\n"
                 : "=r"(v)
                 : "l"(p), "r"((int)pred), "r"(fallback));
    return v;
}
/* 16- and 8-byte read-only global loads (no L1 allocation; the L2 fetches 256-byte lines). */
DSV4_CU_INLINE uint4 cu_ldg16_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
DSV4_CU_INLINE uint2 cu_ldg8_stream(const void *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}


/* ---- launch configuration (host) ---------------------------------------------------------- */
/* The opt-in to more than 48 KB of dynamic shared memory is an attribute of a function on one
 * device: each launcher keeps a flag per device ordinal (set once; a race sets it twice, which is
 * harmless). A device beyond DSV4_CU_MAX_DEVICES sets it on every launch. */
#define DSV4_CU_MAX_DEVICES 64
template <typename F> static int cu_smem_opt_in(unsigned char *done, int device, F *kernel, int bytes)
{
    const bool known = device >= 0 && device < DSV4_CU_MAX_DEVICES;
    if (known && done[device]) return 0;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return (int)e;
    if (known) done[device] = 1;
    return 0;
}

/* ---- programmatic dependent launch -------------------------------------------------------------- */
/* A kernel launched by cu_launch_dependent(pdl = true) may start while the kernel before it on the
 * stream still runs (under graph capture: a programmatic edge). Its rules (docs/kernels.md §12):
 * before cu_pdl_wait it reads only what no kernel writes (weights, scales, its parameters) and
 * writes nothing; cu_pdl_wait returns once the kernel before has completed and its writes are
 * visible; every CTA calls it, so a kernel's completion implies its predecessors'.
 * cu_pdl_release lets the next dependent launch start (its CTAs then wait on free slots). Both are
 * no-ops for a kernel launched plainly. */
DSV4_CU_INLINE void cu_pdl_release()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
DSV4_CU_INLINE void cu_pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* kernel<<<grid, threads, smem, s>>>(args...), with pdl as a programmatic dependent of the kernel
 * before it on s (see cu_pdl_wait). */
template <typename... P, typename... A>
static cudaError_t cu_launch_dependent_smem(void (*kernel)(P...), dim3 grid, int threads, size_t smem, cudaStream_t s,
                                            bool pdl, A &&...args)
{
    cudaLaunchAttribute attr[1];
    memset(attr, 0, sizeof attr);
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}
template <typename... P, typename... A>
static cudaError_t cu_launch_dependent(void (*kernel)(P...), dim3 grid, int threads, cudaStream_t s, bool pdl,
                                       A &&...args)
{
    return cu_launch_dependent_smem(kernel, grid, threads, 0, s, pdl, static_cast<A &&>(args)...);
}

#endif
