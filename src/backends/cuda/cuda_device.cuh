/* Device helpers shared by the CUDA kernels: number formats (the device form of the rules in
 * src/formats/codec.h, bit for bit: E4M3 encoding goes through the hardware's saturating
 * round-to-nearest-even conversion, which spec/README.md contract 2 names as the reference),
 * unaligned-safe 16-byte loads/stores, and the PTX wrappers (cp.async, ldmatrix, mma). */
#ifndef DSV4_CUDA_DEVICE_CUH
#define DSV4_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define DSV4_CU_INLINE __device__ __forceinline__

/* ---- formats ----------------------------------------------------------------------------- */
DSV4_CU_INLINE float cu_bf16_f32(uint32_t b) { return __uint_as_float((b & 0xFFFFu) << 16); }

/* RNE, NaN kept quiet (codec.h dsv4_bf16_from_f32). */
DSV4_CU_INLINE uint32_t cu_f32_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* 2^k for k in [-149, 127] (codec.h dsv4_pow2f). */
DSV4_CU_INLINE float cu_pow2f(int k)
{
    return k >= -126 ? __uint_as_float((uint32_t)(k + 127) << 23) : __uint_as_float(1u << (k + 149));
}

/* UE8M0 byte -> 2^(b-127), 255 -> NaN. */
DSV4_CU_INLINE float cu_e8m0_f32(uint32_t b) { return b == 255u ? __uint_as_float(0x7FC00000u) : cu_pow2f((int)b - 127); }

/* E4M3FN code -> float, exact (codec.h dsv4_e4m3_to_f32). */
DSV4_CU_INLINE float cu_e4m3_f32(uint32_t c)
{
    uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
    if ((c & 0x7Fu) == 0x7Fu) return __uint_as_float(sign | 0x7FC00000u);
    if (e == 0) {
        float v = (float)m * (1.0f / 512.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

/* float -> E4M3FN: RNE, saturating to +-448, NaN -> sign|0x7F (the codec's NaN keeps its sign). */
DSV4_CU_INLINE uint32_t cu_f32_e4m3(float x)
{
    if (isnan(x)) return ((__float_as_uint(x) >> 24) & 0x80u) | 0x7Fu;
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* Two E4M3 codes (low byte first) times a power-of-two scale -> BF16x2 (low half first), exact. */
DSV4_CU_INLINE uint32_t cu_e4m3x2_bf16x2(uint32_t codes, float scale)
{
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(codes & 0xFFFFu), __NV_E4M3);
    __half2 h;
    memcpy(&h, &hr, 4);
    float2 f = __half22float2(h);
    __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
    uint32_t r;
    memcpy(&r, &b, 4);
    return r;
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
DSV4_CU_INLINE void cu_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
DSV4_CU_INLINE void cu_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
DSV4_CU_INLINE void cu_cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

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
DSV4_CU_INLINE void cu_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Keeps the compiler from moving accumulator reads/writes across the asynchronous MMA. */
DSV4_CU_INLINE void cu_reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
/* Generic-proxy shared-memory writes (st.shared, cp.async) made visible to the tensor cores. */
DSV4_CU_INLINE void cu_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* d[0..15] (+)= A * B for m64n32k16 (BF16 in, FP32 accumulate), A and B from shared memory
 * descriptors; scale_d 0 overwrites d; TB 1 reads B MN-major (transposed). */
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n32(float *d, uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, %16, %17, p, 1, 1, 0, %19;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

/* d[0..127] (+)= A * B for m64n256k16 (BF16 in, FP32 accumulate), A and B from shared memory
 * descriptors; scale_d 0 overwrites d; TB 1 reads B MN-major (transposed). */
template <int TB> DSV4_CU_INLINE void cu_wgmma_m64n256(float *d, uint64_t da, uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

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

#endif
