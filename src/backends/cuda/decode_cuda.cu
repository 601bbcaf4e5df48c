/* Sparse MLA decode on tensor cores (docs/contracts.md §6, docs/kernels.md §3.2).
 *
 * One CTA = one query token x one tile of heads x one split of that token's entries. The
 * entries of both scopes form one list: the first len0 columns of scope 0, then the first len1
 * of scope 1; split s of S takes the blocks [s*nb/S, (s+1)*nb/S) of 64 entries, so the grid is
 * fixed by the host (no device->host sync, graph-capturable) while the work follows the lengths
 * read on the device. Per block of 64 entries:
 *   1. entry indices are read one block ahead; FP8 entries (576 data + 8 scale bytes) arrive by
 *      cp.async in shared memory and all threads dequantize them into a BF16 tile [64][512]
 *      (E4M3 x 2^k is exact in BF16); BF16 rows (the two-pass design) are copied straight into
 *      one of two tiles;
 *   2. S = Q K^T (BF16 in, FP32 accumulate), masked entries -inf;
 *   3. online softmax in base 2 (fp32 sums), P rounded to BF16 (as FlashMLA does);
 *   4. O += P V with V = the same tile.
 * Kernels: decode_kernel<MT> (mma.sync m16n8k16 + ldmatrix, tiles of 16 or 32 heads, and the
 * fallback for 64) and, for tiles of 64 heads on sm_90a, the warpgroup-MMA kernels below: for FP8
 * pages the warp-specialized decode_ws_kernel / decode_ws_pair_kernel (a producer warpgroup
 * dequantizes while two consumer warpgroups run the matrix work: "ws2", one of them owning S, by
 * default; "ws1", the two splitting S, for comparison), or the single-role decode_fp8_kernel
 * ("v1") when a CTA has one block only; for BF16 rows decode_wgmma_bf16_kernel. The launcher's
 * choice can be forced with the context option cuda_decode (dsv4_cu_decode_launch).
 * Tiles in shared memory use the 128-byte swizzle of wgmma (tile_off). With S > 1 every split
 * writes its normalized partial output and lse; a combine kernel merges them in a fixed order
 * and applies the sink. */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "formats/kv_entry.h"

#include <stdlib.h>
#include <string.h>

/* Phase timing for kernel work (off unless built with -DDSV4_WS_PROFILE, as bench/experiments do):
 * each warp's lane 0 adds the cycles since its previous mark to bucket k of its role. */
#ifdef DSV4_WS_PROFILE
__device__ unsigned long long dsv4_ws_prof[3][8];
#define WS_PROF_START unsigned long long prof_t = clock64(), prof_acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}
#define WS_PROF(k)                                                                                       \
    do {                                                                                                 \
        const unsigned long long prof_n = clock64();                                                     \
        prof_acc[k] += prof_n - prof_t;                                                                  \
        prof_t = prof_n;                                                                                 \
    } while (0)
#define WS_PROF_END(role)                                                                                \
    do {                                                                                                 \
        if ((threadIdx.x & 31) == 0)                                                                     \
            for (int prof_k = 0; prof_k < 8; prof_k++) atomicAdd(&dsv4_ws_prof[role][prof_k], prof_acc[prof_k]); \
    } while (0)
#else
#define WS_PROF_START
#define WS_PROF(k)
#define WS_PROF_END(role)
#endif

#define NT 256           /* threads per CTA */
#define KB 64            /* entries per block */
#define ROW_BYTES 1024   /* one BF16 512-vector */
/* Raw FP8 entries (formats/kv_entry.h) in shared memory: 576 data bytes at a 592-byte stride
 * (37 x 16: the 16-byte reads of 8 consecutive entries hit 8 different bank groups), then 8 scale
 * bytes per entry. */
#define RAW_STRIDE 592
#define RAW_BYTES (KB * RAW_STRIDE + KB * DSV4_KVE_SCALE_BYTES)
#define RAW_SPAN 38912 /* RAW_BYTES rounded up to 1024 */
/* The copies below move an entry as 512 + 64 data bytes and one 8-byte scale row, and dequantize
 * 64-dim groups 0..6 (one E4M3 byte per dim) with group 7 the BF16 part at byte 448. */
static_assert(DSV4_KVE_DATA_BYTES == 512 + 64 && DSV4_KVE_SCALE_BYTES == 8 && DSV4_KVE_GROUP == 64 &&
                  DSV4_KVE_NOPE_BYTES == DSV4_KVE_GROUPS * DSV4_KVE_GROUP && RAW_STRIDE >= DSV4_KVE_DATA_BYTES &&
                  RAW_SPAN >= RAW_BYTES,
              "decode_cuda.cu: the entry copies assume the layout of formats/kv_entry.h");

/* Byte offset of 16-byte chunk c (0..63) of row `row` in a tile of `rows` BF16 512-vectors: eight
 * column blocks of 64 values, each [rows][128 B] with the 128-byte swizzle (cuda_device.cuh). */
static DSV4_CU_INLINE uint32_t tile_off(int row, int c, int rows)
{
    return (uint32_t)((c >> 3) * rows * 128 + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}
static DSV4_CU_INLINE uint8_t *align1024(uint8_t *p) { return (uint8_t *)(((uintptr_t)p + 1023) & ~(uintptr_t)1023); }

/* Programmatic dependent launch: every decode kernel lets the combine that follows it be launched
 * at once (its CTAs then wait on SMs the decode leaves free instead of being launched after the
 * decode ends); the combine waits for the whole decode grid and its writes before reading them.
 * The decode itself is launched the same way after the kernel before it (unless the context says
 * ",no-pdl"): its CTAs start, set up their barriers and wait there, before their first access to
 * global memory, for that kernel and its writes; the combine lets the next decode start early in
 * turn (cu_pdl_release / cu_pdl_wait of cuda_device.cuh). Both are no-ops when the launch asked for
 * no such overlap. */
/* The release of a decode CTA: first thing (at_end false) or once its loop is done (at_end true),
 * as the launch says (dsv4_cu_decode.release_late: the context's ",late-release"; first by
 * default: late measured as fast or slower on every shape but one, BENCHMARKS.md "CUDA sparse
 * decode vs FlashMLA, same run"). Each role of a warp-specialized CTA releases at the end of its
 * own loop. The combine waits for the whole decode grid either way (cu_pdl_wait), so the release
 * point changes no result. */
static DSV4_CU_INLINE void decode_release(const dsv4_cu_decode &p, bool at_end)
{
    if ((p.release_late != 0) == at_end) cu_pdl_release();
}

template <int MT, bool FP8> struct decode_cfg {
    static constexpr int MW = MT < 2 ? MT : 2;  /* m16 tiles per warp */
    static constexpr int HG = MT / MW;          /* head groups */
    static constexpr int DS = 8 / HG;           /* warps per head group */
    static constexpr int EW = KB / DS;          /* entries per warp in Q K^T */
    static constexpr int ENT = EW / 8;          /* n8 tiles of S per warp */
    static constexpr int DW = 512 / DS;         /* output dims per warp in P V */
    static constexpr int DNT = DW / 8;          /* n8 tiles of O per warp */
    static constexpr int ROWS = MT * 16;
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = ROWS * ROW_BYTES;
    static constexpr int K_TILES = FP8 ? 1 : 2;
    static constexpr int RAW_OFF = K_OFF + K_TILES * KB * ROW_BYTES;
    static constexpr int P_OFF = RAW_OFF + (FP8 ? RAW_SPAN : 0);
    static constexpr int RED_OFF = P_OFF + ROWS * 128;   /* float [8][64] row maxima */
    static constexpr int L_OFF = RED_OFF + 8 * 64 * 4;   /* float [8][64] row sums */
    static constexpr int OK_OFF = L_OFF + 8 * 64 * 4;    /* int [4][64] entry valid, by block % 4 */
    static constexpr int SMEM = OK_OFF + 4 * KB * 4 + 1024; /* + alignment of the base to 1024 */
};

/* Lengths of the two scopes for token t (clamped to the widths). */
static DSV4_CU_INLINE void scope_lengths(const dsv4_cu_decode &p, int t, long long *len0, long long *len1)
{
    long long l0 = p.scope[0].width, l1 = 0;
    if (p.scope[0].lengths) l0 = p.scope[0].lengths[t];
    l0 = l0 < 0 ? 0 : (l0 > p.scope[0].width ? p.scope[0].width : l0);
    if (p.n_scopes > 1) {
        l1 = p.scope[1].width;
        if (p.scope[1].lengths) l1 = p.scope[1].lengths[t];
        l1 = l1 < 0 ? 0 : (l1 > p.scope[1].width ? p.scope[1].width : l1);
    }
    *len0 = l0;
    *len1 = l1;
}

/* This CTA's part of the token's entry list: blocks [b0, b0 + nblk) of 64 entries, positions
 * below pend; positions below len0 come from scope 0, the rest from scope 1. */
typedef struct {
    long long len0, pos0, pend;
    int nblk;
} cta_range;

static DSV4_CU_INLINE cta_range cta_entries(const dsv4_cu_decode &p, int t, int split)
{
    long long len0, len1;
    scope_lengths(p, t, &len0, &len1);
    const long long n = len0 + len1, nb = (n + KB - 1) / KB;
    const long long b0 = split * nb / p.splits, b1 = (split + 1) * nb / p.splits;
    cta_range r = {len0, b0 * KB, b1 * KB < n ? b1 * KB : n, (int)(b1 - b0)};
    return r;
}

/* The index of one entry, read ahead of the loads that need it so that its latency hides behind
 * other work. idx -1: beyond the range. The read is one predicated load and nothing else uses
 * the value until the entry is loaded: a read inside a branch (or widened to 64 bits right away)
 * made the warp wait for it where the branch joins, which cost the producer a third of its time. */
typedef struct {
    int idx, second;
} ent_pf;

/* Lanes 0..7 of warp w hold entries w*8 .. w*8+7 of block jb. */
static DSV4_CU_INLINE ent_pf fetch_entry(const dsv4_cu_decode &p, int t, const cta_range &r, int jb, int warp, int lane)
{
    const long long pos = r.pos0 + (long long)jb * KB + warp * 8 + lane;
    const bool in = lane < 8 && jb < r.nblk && pos < r.pend;
    const int second = pos >= r.len0;
    const dsv4_cu_scope &sc = second ? p.scope[1] : p.scope[0];
    ent_pf f;
    f.idx = cu_ldg_s32_if(sc.indices + t * sc.ld + (second ? pos - r.len0 : pos), in, -1);
    f.second = in && second;
    return f;
}

/* Source of an entry: data (and scale row for FP8); 0 when the index is masked. */
template <bool FP8>
static DSV4_CU_INLINE int entry_source(const dsv4_cu_decode &p, const ent_pf &f, const uint8_t **data,
                                       const uint8_t **scl)
{
    const dsv4_cu_cache &c = f.second ? p.scope[1].cache : p.scope[0].cache;
    const long long idx = f.idx;
    if (idx < 0 || idx >= c.num_slots) return 0;
    if (!FP8) {
        *data = c.pages + idx * c.page_stride;
        return 1;
    }
    long long bs = c.block_size, page, row;
    if (bs <= 0x7FFFFFFF) {
        unsigned pg = (unsigned)idx / (unsigned)bs;
        page = pg;
        row = idx - (long long)pg * bs;
    } else {
        page = 0;
        row = idx;
    }
    const uint8_t *base = c.pages + page * c.page_stride;
    *data = base + dsv4_kve_row_data(row);
    *scl = base + dsv4_kve_row_scale(bs, row);
    return 1;
}

/* Issue the loads of one block of 64 entries (one commit group): lanes 0..7 resolve their
 * prefetched entry, then the warp copies its 8 entries one by one (512 + 64 data bytes and 8
 * scale bytes, or 1024 bytes of a BF16 row). */
template <bool FP8>
static DSV4_CU_INLINE void load_block(const dsv4_cu_decode &p, const ent_pf &f, uint8_t *dst, int *ok, int warp,
                                      int lane)
{
    const uint8_t *data = p.scope[0].cache.pages, *scl = data;
    int good = 0;
    if (lane < 8) {
        good = entry_source<FP8>(p, f, &data, &scl);
        ok[warp * 8 + lane] = good;
    }
#pragma unroll 1
    for (int i = 0; i < 8; i++) {
        const int e = warp * 8 + i;
        const int g = __shfl_sync(0xFFFFFFFFu, good, i);
        const uint8_t *src = (const uint8_t *)__shfl_sync(0xFFFFFFFFu, (unsigned long long)data, i);
        const uint8_t *ssrc = (const uint8_t *)__shfl_sync(0xFFFFFFFFu, (unsigned long long)scl, i);
        if (FP8) {
            if (!g) continue; /* masked: the dequantization writes zeros */
            uint8_t *raw = dst + e * RAW_STRIDE;
            uint8_t *rs = dst + KB * RAW_STRIDE + e * DSV4_KVE_SCALE_BYTES;
            if (p.aligned) {
                cu_cp_async16(cu_smem(raw + lane * 16), src + lane * 16);
                if (lane < 4) cu_cp_async16(cu_smem(raw + 512 + lane * 16), src + 512 + lane * 16);
                if (lane == 4) cu_cp_async8(cu_smem(rs), ssrc);
            } else {
                for (int b = lane; b < DSV4_KVE_DATA_BYTES; b += 32) raw[b] = src[b];
                if (lane < DSV4_KVE_SCALE_BYTES) rs[lane] = ssrc[lane];
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = lane + 32 * h;
                uint8_t *d = dst + tile_off(e, c, KB);
                if (!g) *(uint4 *)d = make_uint4(0, 0, 0, 0);
                else if (p.aligned) cu_cp_async16(cu_smem(d), src + c * 16);
                else *(uint4 *)d = cu_ld16(src + c * 16);
            }
        }
    }
    cu_cp_async_commit();
}

/* Q rows h0 .. h0 + ROWS - 1 of token t (zeros beyond H) into the swizzled tile; all loads of a
 * thread are in flight before the first store. */
template <int ROWS, int NTH = NT>
static DSV4_CU_INLINE void load_q(const dsv4_cu_decode &p, int t, int h0, uint8_t *sQ, int tid)
{
    constexpr int N = (ROWS * 64 + NTH - 1) / NTH;
    uint4 v[N];
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int i = k * NTH + tid, r = i >> 6, c = i & 63;
        v[k] = make_uint4(0, 0, 0, 0);
        if ((ROWS * 64 % NTH == 0 || i < ROWS * 64) && h0 + r < p.h)
            v[k] = cu_ld16(p.q + t * p.q_st + (long long)(h0 + r) * p.q_sh + c * 8);
    }
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int i = k * NTH + tid, r = i >> 6, c = i & 63;
        if (ROWS * 64 % NTH == 0 || i < ROWS * 64) *(uint4 *)(sQ + tile_off(r, c, ROWS)) = v[k];
    }
}

/* The same rows by cp.async (one commit group, waited for by the caller with its next
 * cp.async wait): the thread goes on at once, so the first entry loads are not queued behind Q's.
 * Rows beyond H are stored as zeros. */
template <int ROWS, int NTH>
static DSV4_CU_INLINE void load_q_async(const dsv4_cu_decode &p, int t, int h0, uint8_t *sQ, int tid)
{
    constexpr int N = (ROWS * 64 + NTH - 1) / NTH;
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int i = k * NTH + tid, r = i >> 6, c = i & 63;
        if (ROWS * 64 % NTH != 0 && i >= ROWS * 64) continue;
        uint8_t *d = sQ + tile_off(r, c, ROWS);
        if (h0 + r < p.h) cu_cp_async16(cu_smem(d), p.q + t * p.q_st + (long long)(h0 + r) * p.q_sh + c * 8);
        else *(uint4 *)d = make_uint4(0, 0, 0, 0);
    }
    cu_cp_async_commit();
}

/* Raw FP8 entries -> BF16 tile. A task is one 64-dim group of one entry (group 7: the RoPE
 * part, copied): one scale byte, four 16-byte reads, eight 16-byte writes; the 32 lanes of a warp
 * take 32 entries of the same group, so reads and writes are free of bank conflicts. Masked
 * entries become zeros. */
static DSV4_CU_INLINE void dequant_block(const uint8_t *raw, uint8_t *tile, const int *ok, int tid)
{
    const uint8_t *rs = raw + KB * RAW_STRIDE;
#pragma unroll 1
    for (int it = 0; it < (KB * (DSV4_KVE_DIM / DSV4_KVE_GROUP)) / NT; it++) {
        const int task = it * NT + tid, e = task & (KB - 1), g = task / KB;
        uint8_t *dst = tile + g * (KB * 128) + e * 128;
        const int sw = e & 7;
        if (!ok[e]) {
#pragma unroll
            for (int k = 0; k < 8; k++) *(uint4 *)(dst + ((k ^ sw) << 4)) = make_uint4(0, 0, 0, 0);
            continue;
        }
        const uint4 *src = (const uint4 *)(raw + e * RAW_STRIDE + g * 64);
        if (g < DSV4_KVE_GROUPS) {
            const uint32_t sb = rs[e * DSV4_KVE_SCALE_BYTES + g];
            uint4 c[4];
#pragma unroll
            for (int q = 0; q < 4; q++) c[q] = src[q];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint4 v[2];
                cu_e4m3x16_bf16<false>(c[q], sb, v);
                *(uint4 *)(dst + (((2 * q) ^ sw) << 4)) = v[0];
                *(uint4 *)(dst + (((2 * q + 1) ^ sw) << 4)) = v[1];
            }
        } else {
            uint4 r[8];
#pragma unroll
            for (int k = 0; k < 8; k++) r[k] = src[k];
#pragma unroll
            for (int k = 0; k < 8; k++) *(uint4 *)(dst + ((k ^ sw) << 4)) = r[k];
        }
    }
}

template <int MT, bool FP8>
__global__ void __launch_bounds__(NT, 1) decode_kernel(const dsv4_cu_decode p)
{
    typedef decode_cfg<MT, FP8> C;
    decode_release(p, false);
    cu_pdl_wait();
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *smem = align1024(smem_raw);
    uint8_t *sQ = smem + C::Q_OFF;
    uint8_t *sK = smem + C::K_OFF;
    uint8_t *sRaw = smem + C::RAW_OFF;
    uint8_t *sP = smem + C::P_OFF;
    float *sRed = (float *)(smem + C::RED_OFF);
    float *sL = (float *)(smem + C::L_OFF);
    int *sOk = (int *)(smem + C::OK_OFF);

    const int t = blockIdx.x, h0 = blockIdx.y * C::ROWS, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hg = warp / C::DS, ds = warp % C::DS;
    const int quad = lane >> 2, qcol = 2 * (lane & 3);

    const cta_range rg = cta_entries(p, t, split);
    const int nblk = rg.nblk;
    ent_pf fn = fetch_entry(p, t, rg, 0, warp, lane);
    load_q<C::ROWS>(p, t, h0, sQ, tid);

    float o[C::MW][C::DNT][4];
    float m_run[C::MW][2], l_part[C::MW][2];
#pragma unroll
    for (int mi = 0; mi < C::MW; mi++) {
#pragma unroll
        for (int nt = 0; nt < C::DNT; nt++) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.0f;
        m_run[mi][0] = m_run[mi][1] = -INFINITY;
        l_part[mi][0] = l_part[mi][1] = 0.0f;
    }

    const uint32_t qbase = cu_smem(sQ), pbase = cu_smem(sP);
    const int grp_bar = 1 + hg, grp_threads = C::DS * 32;

    if (nblk > 0) load_block<FP8>(p, fn, FP8 ? sRaw : sK, sOk, warp, lane);
    fn = fetch_entry(p, t, rg, 1, warp, lane);

    for (int j = 0; j < nblk; j++) {
        const int buf = j & 1;
        cu_cp_async_wait_all();
        __syncthreads(); /* block j landed; every warp is done with block j-1 */
        const int *ok = sOk + (j & 3) * KB;
        uint8_t *tile = sK;
        if (FP8) {
            dequant_block(sRaw, sK, ok, tid);
            __syncthreads(); /* tile ready, raw buffer free */
        } else {
            tile = sK + buf * KB * ROW_BYTES;
        }
        if (j + 1 < nblk) {
            uint8_t *dst = FP8 ? sRaw : sK + (buf ^ 1) * KB * ROW_BYTES;
            load_block<FP8>(p, fn, dst, sOk + ((j + 1) & 3) * KB, warp, lane);
            fn = fetch_entry(p, t, rg, j + 2, warp, lane);
        }
        const uint32_t kbase = cu_smem(tile);

        /* ---- S = Q K^T for this warp's head rows and entries ds*EW .. +EW ---- */
        float s[C::MW][C::ENT][4];
#pragma unroll
        for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
            for (int ni = 0; ni < C::ENT; ni++) s[mi][ni][0] = s[mi][ni][1] = s[mi][ni][2] = s[mi][ni][3] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < 32; kk++) {
            uint32_t a[C::MW][4];
#pragma unroll
            for (int mi = 0; mi < C::MW; mi++) {
                const int r = (hg * C::MW + mi) * 16 + (lane & 15);
                cu_ldsm_x4(qbase + tile_off(r, 2 * kk + (lane >> 4), C::ROWS), a[mi]);
            }
            if (C::ENT == 2) {
                uint32_t b[4];
                const int r = ds * C::EW + (lane & 7) + ((lane >> 4) << 3);
                cu_ldsm_x4(kbase + tile_off(r, 2 * kk + ((lane >> 3) & 1), KB), b);
#pragma unroll
                for (int mi = 0; mi < C::MW; mi++) {
                    cu_mma_bf16(s[mi][0], a[mi], b[0], b[1]);
                    cu_mma_bf16(s[mi][C::ENT - 1], a[mi], b[2], b[3]);
                }
            } else {
                uint32_t b[2];
                const int r = ds * C::EW + (lane & 7);
                cu_ldsm_x2(kbase + tile_off(r, 2 * kk + ((lane >> 3) & 1), KB), b);
#pragma unroll
                for (int mi = 0; mi < C::MW; mi++) cu_mma_bf16(s[mi][0], a[mi], b[0], b[1]);
            }
        }

        /* ---- mask, base-2 logits, row maxima across the head group ---- */
        float mx[C::MW][2];
#pragma unroll
        for (int mi = 0; mi < C::MW; mi++) {
            mx[mi][0] = mx[mi][1] = -INFINITY;
#pragma unroll
            for (int ni = 0; ni < C::ENT; ni++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int e = ds * C::EW + ni * 8 + qcol + (q & 1);
                    const float v = ok[e] ? s[mi][ni][q] * p.scale_log2 : -INFINITY;
                    s[mi][ni][q] = v;
                    mx[mi][q >> 1] = fmaxf(mx[mi][q >> 1], v);
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                mx[mi][hf] = fmaxf(mx[mi][hf], __shfl_xor_sync(0xFFFFFFFFu, mx[mi][hf], 1));
                mx[mi][hf] = fmaxf(mx[mi][hf], __shfl_xor_sync(0xFFFFFFFFu, mx[mi][hf], 2));
                if ((lane & 3) == 0) sRed[ds * 64 + (hg * C::MW + mi) * 16 + quad + 8 * hf] = mx[mi][hf];
            }
        }
        cu_bar(grp_bar, grp_threads);

        float alpha[C::MW][2], m_use[C::MW][2];
#pragma unroll
        for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = (hg * C::MW + mi) * 16 + quad + 8 * hf;
                float bm = -INFINITY;
#pragma unroll
                for (int d = 0; d < C::DS; d++) bm = fmaxf(bm, sRed[d * 64 + row]);
                const float m_new = fmaxf(m_run[mi][hf], bm);
                m_use[mi][hf] = m_new == -INFINITY ? 0.0f : m_new;
                alpha[mi][hf] = exp2f(m_run[mi][hf] - m_use[mi][hf]);
                m_run[mi][hf] = m_new;
                l_part[mi][hf] *= alpha[mi][hf];
            }

        /* ---- P = 2^(s - m) in fp32 for the sums, BF16 into shared memory ---- */
#pragma unroll
        for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
            for (int ni = 0; ni < C::ENT; ni++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const float p0 = exp2f(s[mi][ni][2 * hf] - m_use[mi][hf]);
                    const float p1 = exp2f(s[mi][ni][2 * hf + 1] - m_use[mi][hf]);
                    l_part[mi][hf] += p0 + p1;
                    const int row = (hg * C::MW + mi) * 16 + quad + 8 * hf;
                    const int col = ds * C::EW + ni * 8 + qcol;
                    *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2) =
                        cu_f32_bf16(p0) | (cu_f32_bf16(p1) << 16);
                }
        cu_bar(grp_bar, grp_threads);

        /* ---- O = O * alpha + P V over this warp's dims ds*DW .. +DW ---- */
#pragma unroll
        for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
            for (int nt = 0; nt < C::DNT; nt++) {
                o[mi][nt][0] *= alpha[mi][0];
                o[mi][nt][1] *= alpha[mi][0];
                o[mi][nt][2] *= alpha[mi][1];
                o[mi][nt][3] *= alpha[mi][1];
            }
#pragma unroll
        for (int kk = 0; kk < KB / 16; kk++) {
            uint32_t a[C::MW][4];
#pragma unroll
            for (int mi = 0; mi < C::MW; mi++) {
                const int r = (hg * C::MW + mi) * 16 + (lane & 15), c = 2 * kk + (lane >> 4);
                cu_ldsm_x4(pbase + r * 128 + ((c ^ (r & 7)) << 4), a[mi]);
            }
            const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
            for (int np = 0; np < C::DNT / 2; np++) {
                uint32_t b[4];
                cu_ldsm_x4_trans(kbase + tile_off(r, ds * (C::DW / 8) + 2 * np + (lane >> 4), KB), b);
#pragma unroll
                for (int mi = 0; mi < C::MW; mi++) {
                    cu_mma_bf16(o[mi][2 * np], a[mi], b[0], b[1]);
                    cu_mma_bf16(o[mi][2 * np + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }

    decode_release(p, true);
    /* ---- row sums across the group (fixed order), then the epilogue ---- */
#pragma unroll
    for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = l_part[mi][hf];
            l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
            l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
            if ((lane & 3) == 0) sL[ds * 64 + (hg * C::MW + mi) * 16 + quad + 8 * hf] = l;
        }
    __syncthreads();

    const long long th = (long long)t * p.h;
#pragma unroll
    for (int mi = 0; mi < C::MW; mi++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = (hg * C::MW + mi) * 16 + quad + 8 * hf, h = h0 + row;
            if (h >= p.h) continue;
            float l = 0.0f;
#pragma unroll
            for (int d = 0; d < C::DS; d++) l += sL[d * 64 + row];
            const bool empty = !(l > 0.0f);
            const float lse = empty ? INFINITY : (m_run[mi][hf] + log2f(l)) * 0.69314718055994531f;
            if (p.splits > 1) {
                const long long prow = (long long)split * p.t * p.h + th + h;
                if (ds == 0 && (lane & 3) == 0) p.part_lse[prow] = empty ? -INFINITY : lse;
                if (empty) continue;
                const float inv = 1.0f / l;
                float *dst = p.part_o + prow * 512 + ds * C::DW + qcol;
#pragma unroll
                for (int nt = 0; nt < C::DNT; nt++)
                    *(float2 *)(dst + nt * 8) = make_float2(o[mi][nt][2 * hf] * inv, o[mi][nt][2 * hf + 1] * inv);
            } else {
                if (ds == 0 && (lane & 3) == 0 && p.lse) p.lse[t * p.lse_st + h * p.lse_sh] = lse;
                float f = 0.0f;
                if (!empty) {
                    const float sink = p.sink ? p.sink[h] : -INFINITY;
                    f = (1.0f / l) / (1.0f + expf(sink - lse));
                }
                uint16_t *dst = p.out + t * p.o_st + h * p.o_sh + ds * C::DW + qcol;
#pragma unroll
                for (int nt = 0; nt < C::DNT; nt++) {
                    dst[nt * 8] = (uint16_t)cu_f32_bf16(o[mi][nt][2 * hf] * f);
                    dst[nt * 8 + 1] = (uint16_t)cu_f32_bf16(o[mi][nt][2 * hf + 1] * f);
                }
            }
        }
}

/* ---- the 64-head tile on Hopper's warpgroup MMA (sm_90a) ------------------------------------
 * Two consumer warpgroups; each holds all 64 rows. Q K^T: warpgroup g computes S for entries
 * 32g..32g+31 (wgmma m64n32k16, 32 k-steps, Q and K read from shared memory); the row maxima are
 * exchanged, P (BF16) goes to shared memory, and P V: warpgroup g accumulates output dims
 * 256g..256g+255 (wgmma m64n256k16, 4 k-steps, V = the K tile read MN-major).
 * decode_wgmma_bf16_kernel (BF16 rows, the two-pass design) copies rows into two tiles by
 * cp.async one block ahead; decode_fp8_kernel (FP8 pages) stages raw entries two blocks ahead
 * and dequantizes each block into its single tile. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Q K^T of one block, issued asynchronously (wg_wait_s waits). */
static DSV4_CU_INLINE void wg_qk(float *s, uint32_t qa, uint32_t ka, int wg)
{
    const uint64_t dq = cu_desc_sw128(qa, 16, 1024), dk = cu_desc_sw128(ka + wg * 32 * 128, 16, 1024);
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 32; kk++) {
        const uint32_t koff = ((kk >> 2) * 8192 + (kk & 3) * 32) >> 4;
        cu_wgmma_m64n32<0>(s, dq + koff, dk + koff, kk > 0);
    }
    cu_wgmma_commit();
}

static DSV4_CU_INLINE void wg_wait_s(float *s)
{
    cu_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; i++) cu_reg_fence(s[i]);
}

/* The barrier of the two consumer warpgroups: the whole CTA, or named barrier 1 over 256
 * threads when a producer warpgroup runs beside them (WS). */
template <bool WS> static DSV4_CU_INLINE void wg_sync()
{
    if (WS) cu_bar(1, 256);
    else __syncthreads();
}

/* Masked base-2 logits of this thread's N accumulators of S (entry e0 + 8 (i / 4) + qcol + i % 2 for
 * accumulator i, rows r0 and r0 + 8 by (i / 2) % 2), and the maxima of its two rows over the four
 * lanes that hold them. */
template <int N>
static DSV4_CU_INLINE void sm_logits(const dsv4_cu_decode &p, float *s, const int *ok, int e0, int qcol, float *mx)
{
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float v = ok[e0 + (i >> 2) * 8 + qcol + (i & 1)] ? s[i] * p.scale_log2 : -INFINITY;
        s[i] = v;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], v);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xFFFFFFFFu, mx[hf], 1));
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xFFFFFFFFu, mx[hf], 2));
    }
}

/* A row's running maximum moves to max(m_run, m_blk): the base of this block's exponentials
 * (m_use; 0 while the row has seen only masked entries), the factor of what came before (alpha),
 * and the row sum so far rescaled. */
static DSV4_CU_INLINE void sm_rescale(float m_blk, float &m_run, float &m_use, float &alpha, float &l)
{
    const float m_new = fmaxf(m_run, m_blk);
    m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha = cu_exp2(m_run - m_use);
    m_run = m_new;
    l *= alpha;
}

/* Masks, base-2 logits, the row maxima of both warpgroups (through sRed), P in BF16 into sP;
 * updates the running maxima and this thread's partial sums, returns the rescale factors. */
template <bool WS = false>
static DSV4_CU_INLINE void wg_softmax(const dsv4_cu_decode &p, float *s, const int *ok, float *sRed, uint8_t *sP,
                                      float *m_run, float *l_part, float *alpha, int wg, int r0, int lane)
{
    const int qcol = 2 * (lane & 3);
    float mx[2], m_use[2];
    sm_logits<16>(p, s, ok, wg * 32, qcol, mx);
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        if ((lane & 3) == 0) sRed[wg * 64 + r0 + 8 * hf] = mx[hf];
    wg_sync<WS>();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int row = r0 + 8 * hf;
        sm_rescale(fmaxf(sRed[row], sRed[64 + row]), m_run[hf], m_use[hf], alpha[hf], l_part[hf]);
    }
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
        const int hf = (i >> 1) & 1, row = r0 + 8 * hf, col = wg * 32 + (i >> 2) * 8 + qcol;
        const float p0 = cu_exp2(s[i] - m_use[hf]), p1 = cu_exp2(s[i + 1] - m_use[hf]);
        l_part[hf] += p0 + p1;
        *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2) =
            cu_f32_bf16(p0) | (cu_f32_bf16(p1) << 16);
    }
    cu_fence_proxy_async();
    wg_sync<WS>();
}

/* O (this thread's 128 accumulators: rows r0, r0 + 8 alternate in pairs) *= alpha of its row, skipped
 * while no row's maximum moved; fenced so that the compiler keeps it before the next wgmma. */
static DSV4_CU_INLINE void o_rescale(float *o, const float *alpha)
{
    if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 128; i++) o[i] *= alpha[(i >> 1) & 1];
    }
#pragma unroll
    for (int i = 0; i < 128; i++) cu_reg_fence(o[i]);
}

/* O = O * alpha + P V over dims 256 wg .. 256 wg + 255 (no rescale while the maxima hold). */
static DSV4_CU_INLINE void wg_pv(float *o, const float *alpha, uint32_t pa, uint32_t ka, int wg)
{
    o_rescale(o, alpha);
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++)
        cu_wgmma_m64n256<1>(o, cu_desc_sw128(pa + kk * 32, 16, 1024),
                            cu_desc_sw128(ka + wg * 4 * 8192 + kk * 16 * 128, 8192, 1024), 1);
    cu_wgmma_commit();
    cu_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; i++) cu_reg_fence(o[i]);
}

/* The sink of this thread's rows r0 and r0 + 8 of the tile at h0 (-inf: no sink, a row beyond H,
 * or a split, whose combine applies it). Read when the CTA starts, so that the epilogue does not
 * wait for a load (",late-sink": by the epilogue, as before; the same value either way). */
static DSV4_CU_INLINE void sink_rows(const dsv4_cu_decode &p, int h0, int r0, float *sk)
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int h = h0 + r0 + 8 * hf;
        sk[hf] = p.splits == 1 && p.sink && h < p.h ? p.sink[h] : -INFINITY;
    }
}

/* The factor of row h's output, given its row sum l and running maximum m (base 2), and its lse
 * (written by the caller's chosen thread, `writer`): with splits, 1/l (or -1: an empty row,
 * nothing to write) and the split's lse; otherwise 1/l times the sink's share (sink: sink_rows),
 * and the lse. */
static DSV4_CU_INLINE float row_factor(const dsv4_cu_decode &p, float l, float m, int t, int h, int split, bool writer,
                                       float sink)
{
    const bool empty = !(l > 0.0f);
    const float lse = empty ? INFINITY : (m + log2f(l)) * 0.69314718055994531f;
    if (p.splits > 1) {
        if (writer) p.part_lse[(long long)split * p.t * p.h + (long long)t * p.h + h] = empty ? -INFINITY : lse;
        return empty ? -1.0f : 1.0f / l;
    }
    if (writer && p.lse) p.lse[t * p.lse_st + h * p.lse_sh] = lse;
    if (empty) return 0.0f;
    return (1.0f / l) / (1.0f + expf(sink - lse));
}

/* Dims dim0 .. dim0 + 255 of rows r0 and r0 + 8 (accumulator layout of m64n256) times their
 * factors f[2]: BF16 into out, or FP32 into the split's partial output. */
static DSV4_CU_INLINE void store_rows(const dsv4_cu_decode &p, const float *o, const float *f, int t, int h0,
                                      int split, int dim0, int r0, int lane)
{
    const int qcol = 2 * (lane & 3);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int h = h0 + r0 + 8 * hf;
        if (h >= p.h) continue;
        if (p.splits > 1) {
            if (f[hf] < 0.0f) continue;
            float *dst = p.part_o + ((long long)split * p.t * p.h + (long long)t * p.h + h) * 512 + dim0 + qcol;
#pragma unroll
            for (int jn = 0; jn < 32; jn++)
                *(float2 *)(dst + jn * 8) = make_float2(o[4 * jn + 2 * hf] * f[hf], o[4 * jn + 2 * hf + 1] * f[hf]);
        } else if (p.wide_store && ((uintptr_t)(p.out + t * p.o_st + h * p.o_sh + dim0) & 15) == 0) {
            /* the four lanes of a row (a quad) hold words jn of dims 8 jn + qcol, + 1: a 4 x 4
             * transpose per 4 jn (two exchange steps, lane bit b against word bit b) leaves lane q
             * with the 8 dims of jn = 4 k + q, one 16-byte store; each store of a warp then fills
             * whole 32-byte sectors (64 bytes of each of 8 rows) instead of half of one. Only with
             * ",wide-store": measured slower but at SWA 128 T = 128 (BENCHMARKS.md) */
            uint16_t *dst = p.out + t * p.o_st + h * p.o_sh + dim0;
            const int q = lane & 3;
            const unsigned quad = 0xFu << (lane & 28);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t a[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    a[i] = cu_f32_bf16(o[4 * (4 * k + i) + 2 * hf] * f[hf]) |
                           (cu_f32_bf16(o[4 * (4 * k + i) + 2 * hf + 1] * f[hf]) << 16);
#pragma unroll
                for (int b = 1; b <= 2; b <<= 1)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        if (c & b) continue; /* c: the word pair {c, c + b} */
                        const bool up = (q & b) != 0; /* this lane sends word c + b if not up, c if up */
                        const uint32_t r = __shfl_xor_sync(quad, up ? a[c] : a[c + b], b);
                        if (up) a[c] = r;
                        else a[c + b] = r;
                    }
                cu_st16(dst + (4 * k + q) * 8, make_uint4(a[0], a[1], a[2], a[3]));
            }
        } else {
            uint16_t *dst = p.out + t * p.o_st + h * p.o_sh + dim0 + qcol;
            const bool w4 = ((uintptr_t)dst & 3) == 0;
#pragma unroll
            for (int jn = 0; jn < 32; jn++) {
                const uint32_t lo = cu_f32_bf16(o[4 * jn + 2 * hf] * f[hf]);
                const uint32_t hi = cu_f32_bf16(o[4 * jn + 2 * hf + 1] * f[hf]);
                if (w4) {
                    *(uint32_t *)(dst + jn * 8) = lo | (hi << 16);
                } else {
                    dst[jn * 8] = (uint16_t)lo;
                    dst[jn * 8 + 1] = (uint16_t)hi;
                }
            }
        }
    }
}

/* Row sums of both warpgroups (fixed order), then out/lse or the split's partial results. */
template <bool WS = false>
static DSV4_CU_INLINE void wg_epilogue(const dsv4_cu_decode &p, const float *o, const float *m_run,
                                       const float *l_part, float *sL, int t, int h0, int split, int wg, int r0,
                                       int lane, float *sk)
{
    if (p.late_sink) sink_rows(p, h0, r0, sk);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_part[hf];
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
        if ((lane & 3) == 0) sL[wg * 64 + r0 + 8 * hf] = l;
    }
    wg_sync<WS>();
    float f[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int row = r0 + 8 * hf;
        f[hf] = h0 + row < p.h ? row_factor(p, sL[row] + sL[64 + row], m_run[hf], t, h0 + row, split,
                                            wg == 0 && (lane & 3) == 0, sk[hf])
                               : 0.0f;
    }
    store_rows(p, o, f, t, h0, split, wg * 256, r0, lane);
}
#endif

/* Shared memory of the warpgroup kernels: Q, BF16 tiles (two for BF16 rows; one for FP8 pages,
 * plus two raw stages), P, maxima, sums, valid flags. */
template <bool FP8> struct wg_cfg {
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = 64 * ROW_BYTES;
    static constexpr int RAW_OFF = K_OFF + (FP8 ? 1 : 2) * KB * ROW_BYTES;
    static constexpr int P_OFF = RAW_OFF + (FP8 ? 2 * RAW_SPAN : 0);
    static constexpr int RED_OFF = P_OFF + 64 * 128;  /* float [2][64] row maxima */
    static constexpr int L_OFF = RED_OFF + 2 * 64 * 4; /* float [2][64] row sums */
    static constexpr int OK_OFF = L_OFF + 2 * 64 * 4;  /* int [4][64], by block % 4 */
    static constexpr int SMEM = OK_OFF + 4 * KB * 4 + 1024;
};

#define WG_SMEM_SETUP(FP8)                                                                              \
    typedef wg_cfg<FP8> C;                                                                              \
    extern __shared__ __align__(128) uint8_t smem_raw[];                                                \
    uint8_t *smem = align1024(smem_raw);                                                                \
    uint8_t *sQ = smem + C::Q_OFF, *sK = smem + C::K_OFF, *sP = smem + C::P_OFF;                        \
    float *sRed = (float *)(smem + C::RED_OFF), *sL = (float *)(smem + C::L_OFF);                       \
    int *sOk = (int *)(smem + C::OK_OFF);                                                               \
    const int t = blockIdx.x, h0 = blockIdx.y * 64, split = blockIdx.z;                                 \
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;                      \
    const int r0 = 16 * (warp & 3) + (lane >> 2); /* this thread's rows: r0 and r0 + 8 */               \
    const cta_range rg = cta_entries(p, t, split);                                                      \
    const int nblk = rg.nblk;                                                                           \
    float o[128], s[16], alpha[2];                                                                      \
    float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f}, sk[2];                           \
    if (!p.late_sink) sink_rows(p, h0, r0, sk);                                                         \
    for (int i = 0; i < 128; i++) o[i] = 0.0f;                                                          \
    const uint32_t qa = cu_smem(sQ), pa = cu_smem(sP)

/* BF16 rows (the two-pass design, docs/kernels.md §3.4): cp.async into two tiles, one block ahead. */
__global__ void __launch_bounds__(NT, 1) decode_wgmma_bf16_kernel(const dsv4_cu_decode p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    decode_release(p, false);
    cu_pdl_wait();
    WG_SMEM_SETUP(false);
    ent_pf fn = fetch_entry(p, t, rg, 0, warp, lane);
    load_q_async<64, NT>(p, t, h0, sQ, tid); /* waited for with block 0 (wait_all) */
    if (nblk > 0) load_block<false>(p, fn, sK, sOk, warp, lane);
    fn = fetch_entry(p, t, rg, 1, warp, lane);
    for (int j = 0; j < nblk; j++) {
        uint8_t *tile = sK + (j & 1) * KB * ROW_BYTES;
        cu_cp_async_wait_all();
        cu_fence_proxy_async();
        __syncthreads(); /* block j landed; both warpgroups are done with block j - 1 */
        wg_qk(s, qa, cu_smem(tile), wg);
        if (j + 1 < nblk) { /* into the tile of block j - 1 while the tensor cores run */
            load_block<false>(p, fn, sK + ((j + 1) & 1) * KB * ROW_BYTES, sOk + ((j + 1) & 3) * KB, warp, lane);
            fn = fetch_entry(p, t, rg, j + 2, warp, lane);
        }
        wg_wait_s(s);
        wg_softmax(p, s, sOk + (j & 3) * KB, sRed, sP, m_run, l_part, alpha, wg, r0, lane);
        wg_pv(o, alpha, pa, cu_smem(tile), wg);
    }
    cu_cp_async_wait_all(); /* Q of a CTA without blocks lands before it leaves */
    decode_release(p, true);
    wg_epilogue(p, o, m_run, l_part, sL, t, h0, split, wg, r0, lane, sk);
#else
    __trap(); /* only the sm_90a build has warpgroup MMA; the host picks the mma.sync kernel elsewhere */
#endif
}

/* FP8 pages: raw entries arrive by cp.async in two shared-memory stages, two blocks ahead; all
 * threads dequantize a block into the tile, then the next loads are issued while the tensor
 * cores run Q K^T. */
__global__ void __launch_bounds__(NT, 1) decode_fp8_kernel(const dsv4_cu_decode p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    decode_release(p, false);
    cu_pdl_wait();
    WG_SMEM_SETUP(true);
    uint8_t *const raw0 = smem + C::RAW_OFF, *const raw1 = raw0 + RAW_SPAN;
    ent_pf fn = fetch_entry(p, t, rg, 0, warp, lane);
    load_q_async<64, NT>(p, t, h0, sQ, tid); /* the oldest group: every wait of the loop covers it */
    for (int jb = 0; jb < 2; jb++) {
        if (jb < nblk) load_block<true>(p, fn, jb ? raw1 : raw0, sOk + jb * KB, warp, lane);
        fn = fetch_entry(p, t, rg, jb + 1, warp, lane);
    }
    for (int j = 0; j < nblk; j++) {
        const int buf = j & 1;
        if (j + 1 < nblk) cu_cp_async_wait<1>(); /* block j landed, j + 1 may be in flight */
        else cu_cp_async_wait_all();
        __syncthreads();
        dequant_block(buf ? raw1 : raw0, sK, sOk + (j & 3) * KB, tid);
        cu_fence_proxy_async();
        __syncthreads(); /* tile ready; raw stage `buf` free */
        wg_qk(s, qa, cu_smem(sK), wg);
        if (j + 2 < nblk) {
            load_block<true>(p, fn, buf ? raw1 : raw0, sOk + ((j + 2) & 3) * KB, warp, lane);
            fn = fetch_entry(p, t, rg, j + 3, warp, lane);
        }
        wg_wait_s(s);
        wg_softmax(p, s, sOk + (j & 3) * KB, sRed, sP, m_run, l_part, alpha, wg, r0, lane);
        wg_pv(o, alpha, pa, cu_smem(sK), wg);
    }
    cu_cp_async_wait_all(); /* Q of a CTA without blocks lands before it leaves */
    decode_release(p, true);
    wg_epilogue(p, o, m_run, l_part, sL, t, h0, split, wg, r0, lane, sk);
#else
    __trap();
#endif
}

/* ---- warp-specialized FP8 kernel (sm_90a), the default for 64-head tiles of FP8 pages --------
 * 384 threads = three warpgroups, one CTA per SM:
 *   WG0, WG1: the consumers. ws1: as in decode_fp8_kernel (Q K^T for entries 32g .. 32g + 31 of a
 *        block on wgmma m64n32k16, the row maxima exchanged, P in shared memory, O[:, 256g .. +255]
 *        += P V on m64n256k16); ws2: see w2_lead / w2_follow below. They never dequantize and
 *        never wait for global memory;
 *   WG2: the producer. It loads FP8 entries from global memory straight into registers (16-byte
 *        loads of 32 entries, one round ahead of the round it dequantizes, issued before it waits
 *        for a free tile) and dequantizes them into two BF16 tiles used in turn, so one tile
 *        fills while the consumers work on the other.
 * Handover through mbarriers: full[i] (producer -> consumers) and empty[i] (consumers ->
 * producer, one arrival per consumer thread; NCTA 2: through cdone[i], see ws_release); ws1's
 * consumers meet on a named barrier (256 threads), ws2's hand P over through mbarriers.
 * setmaxnreg moves registers from the producer to the consumers (ws_body).
 * NCTA 2: the two 64-head tiles of one token (H 128) run as a cluster of two CTAs; each CTA's
 * producer dequantizes its half of every block (32 entries) into its own tile and copies that
 * half into the peer's tile (a bulk shared::cluster copy that completes on the peer's full
 * barrier), so every entry is loaded and dequantized once per token instead of twice. */
#define WS_NT 384
#define WS_Q_OFF 0
#define WS_K_OFF (64 * ROW_BYTES)               /* two BF16 tiles [64][512] */
#define WS_P_OFF (WS_K_OFF + 2 * KB * ROW_BYTES) /* two BF16 P tiles [64][64] (ws1 uses the first) */
#define WS_RED_OFF (WS_P_OFF + 2 * 64 * 128)    /* float [2][64]: ws1 row maxima; ws2 rescale factors by P tile */
#define WS_L_OFF (WS_RED_OFF + 2 * 64 * 4)      /* float [2][64]: ws1 row sums; ws2 output factors */
#define WS_OK_OFF (WS_L_OFF + 2 * 64 * 4)       /* int [2][64]: entry valid, by tile */
#define WS_IDX_OFF (WS_OK_OFF + 2 * KB * 4)     /* int [WS_IDX_SLOTS][128]: the producers' index ring */
#define WS_IDX_AHEAD 4                          /* rounds an index is read ahead of its entry's loads */
#define WS_IDX_SLOTS 8
#define WS_BAR_OFF (WS_IDX_OFF + WS_IDX_SLOTS * 128 * 4) /* uint64 full[2], empty[2], pfree[2], epi, pfull[2], cdone[2] */
#define WS_CDONE(b) (WS_BAR_OFF + 72 + 8 * (b)) /* NCTA 2: this CTA's consumers are done with tile b */
#define WS_SMEM (WS_BAR_OFF + 88 + 1024)


#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Index of entry e (0..63) of block jb of this CTA's range; idx -1 beyond it. */
/* Round R of a producer thread: entry e0 (+ 32 for odd rounds of NCTA 1) of block R / RPB. The
 * producers read indices WS_IDX_AHEAD rounds ahead through a ring in shared memory filled with
 * cp.async (slot R % WS_IDX_SLOTS of the thread's column `ring`; each thread reads back only its
 * own slots, one cp.async group per round): read into a register, an index shares a scoreboard
 * with the entry loads issued after it, so waiting for the index waited for a round of entries
 * (ncu: over a third of the producer's stall samples). */
template <int NCTA> struct ws_round {
    static constexpr int RPB = NCTA == 1 ? 2 : 1; /* rounds per block */
    const cta_range &r;
    int e0;
    uint32_t ring;
    DSV4_CU_INLINE long long pos(int R) const { return r.pos0 + (long long)(R / RPB) * KB + ent(R); }
    DSV4_CU_INLINE int ent(int R) const { return e0 + (NCTA == 1 ? 32 * (R & 1) : 0); }
    DSV4_CU_INLINE bool in(int R) const { return R / RPB < r.nblk && pos(R) < r.pend; }
    DSV4_CU_INLINE uint32_t slot(int R) const { return ring + (R % WS_IDX_SLOTS) * 128 * 4; }
    /* start reading round R's index (one cp.async group per round, empty beyond the range) */
    DSV4_CU_INLINE void issue(const dsv4_cu_decode &p, int t, int R) const
    {
        const long long ps = pos(R);
        const int second = ps >= r.len0;
        const dsv4_cu_scope &sc = second ? p.scope[1] : p.scope[0];
        cu_cp_async4_if(slot(R), sc.indices + t * sc.ld + (second ? ps - r.len0 : ps), in(R));
        cu_cp_async_commit();
    }
    /* round R's index (its group is complete once at most WS_IDX_AHEAD - 1 later ones are
     * pending), and the read of round R + WS_IDX_AHEAD started */
    DSV4_CU_INLINE ent_pf take(const dsv4_cu_decode &p, int t, int R) const
    {
        ent_pf f = {-1, 0};
        cu_cp_async_wait<WS_IDX_AHEAD - 1>();
        if (in(R)) {
            f.idx = (int)cu_lds4(slot(R));
            f.second = pos(R) >= r.len0;
        }
        issue(p, t, R + WS_IDX_AHEAD);
        return f;
    }
};

/* One producer thread's share of a round: one entry's 16-byte quarter of each 64-byte group
 * (seven FP8 groups, the two halves of the BF16 RoPE part) and its scale bytes. */
typedef struct {
    uint4 d[DSV4_KVE_GROUPS], rp[2];
    uint2 s8;
    int good;
} ws_raw;

static DSV4_CU_INLINE void ws_load(const dsv4_cu_decode &p, const ent_pf &f, int q4, ws_raw &w)
{
    const uint8_t *src = p.scope[0].cache.pages, *ssrc = src;
    w.good = entry_source<true>(p, f, &src, &ssrc);
    if (w.good) {
#pragma unroll
        for (int g = 0; g < DSV4_KVE_GROUPS; g++) w.d[g] = cu_ldg16_stream(src + g * DSV4_KVE_GROUP + q4 * 16);
#pragma unroll
        for (int i = 0; i < 2; i++) w.rp[i] = cu_ldg16_stream(src + DSV4_KVE_NOPE_BYTES + i * 64 + q4 * 16);
        w.s8 = cu_ldg8_stream(ssrc);
    } else { /* masked: zeros (scale 2^-127, finite) */
#pragma unroll
        for (int g = 0; g < DSV4_KVE_GROUPS; g++) w.d[g] = make_uint4(0, 0, 0, 0);
        w.rp[0] = w.rp[1] = make_uint4(0, 0, 0, 0);
        w.s8 = make_uint2(0, 0);
    }
}

/* The L2 lines of one entry (576 data bytes from `data`, 5 or 6 lines, and its scale row), shared
 * by the four lanes q4 of the entry. Timing only: nothing reads what a prefetch brings. */
static DSV4_CU_INLINE void ws_prefetch(const uint8_t *data, const uint8_t *scl, int q4)
{
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(data + q4 * 128));
    if (q4 == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(data + 512));
    if (q4 == 1) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(data + DSV4_KVE_DATA_BYTES - 1));
    if (q4 == 2) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(scl));
}

/* Dequantize into entry e of the tile at byte offset `tile`: lanes 8q .. 8q + 7 hold 8 entries,
 * so each 16-byte store of a warp hits 8 different bank groups of the swizzled rows. */
static DSV4_CU_INLINE void ws_store(uint32_t base, uint32_t tile, uint32_t okoff, int e, int q4, const ws_raw &w)
{
    const uint32_t row = base + tile + e * 128;
    const int sw = e & 7;
#pragma unroll
    for (int g = 0; g < DSV4_KVE_GROUPS; g++) {
        uint4 v[2];
        cu_e4m3x16_bf16<false>(w.d[g], ((g < 4 ? w.s8.x : w.s8.y) >> (8 * (g & 3))) & 0xFFu, v);
        cu_sts16(row + g * (KB * 128) + (((2 * q4) ^ sw) << 4), v[0]);
        cu_sts16(row + g * (KB * 128) + (((2 * q4 + 1) ^ sw) << 4), v[1]);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) cu_sts16(row + 7 * (KB * 128) + (((4 * i + q4) ^ sw) << 4), w.rp[i]);
    if (q4 == 0) cu_sts4(base + okoff + e * 4, (uint32_t)w.good);
}

/* The producer warpgroup. Round R (32 entries) is entries 32 (R % 2) .. of block R / 2 (NCTA 1),
 * or this CTA's half, entries 32 rank .., of block R (NCTA 2); lane 8q + i of warp pw takes entry
 * 8 pw + i of the round and quarter q of its groups. Round R + 1 is loaded while round R is
 * dequantized; indices come WS_IDX_AHEAD rounds ahead through the ring (ws_round). Measured and
 * not kept (BENCHMARKS.md): an L2 prefetch of entries two blocks ahead, a third round of registers
 * in flight, and two producer warpgroups splitting each entry's groups (512 threads leave 128
 * registers at entry, too few for m64n256 accumulators, and the same bytes in flight). */
template <int NCTA>
static DSV4_CU_INLINE void ws_producer(const dsv4_cu_decode &p, const cta_range &rg, int t, uint8_t *smem, int pw,
                                       int lane, uint32_t rank)
{
    constexpr int RPB = NCTA == 1 ? 2 : 1; /* rounds per block */
    const int q4 = lane >> 3;
    const int nr = rg.nblk * RPB;
    const uint32_t base = cu_smem(smem), rbase = NCTA == 2 ? cu_mapa(base, rank ^ 1u) : 0u;
    const int e0 = (NCTA == 1 ? 0 : 32 * (int)rank) + 8 * pw + (lane & 7);
    const ws_round<NCTA> rd = {rg, e0, base + WS_IDX_OFF + (32 * pw + lane) * 4};
#pragma unroll 1
    for (int R = 0; R < WS_IDX_AHEAD; R++) rd.issue(p, t, R);
    if (p.prefetch) {
        /* rounds 2 and 3 (the second block; NCTA 2: the third and fourth) into L2 as soon as their
         * indices land: the registers hold two rounds, so their loads are issued only once round 0
         * is stored, and a CTA of two blocks (a SWA scope of 128) waits for them after its first
         * block. The indices are read again by take (the ring's slots are kept). Only with ",prefetch":
         * measured slower on every shape it changed (BENCHMARKS.md, "Latency variants ..."). */
        cu_cp_async_wait_all();
#pragma unroll
        for (int R = 2; R < 4; R++)
            if (R < nr && rd.in(R)) {
                ent_pf f = {(int)cu_lds4(rd.slot(R)), rd.pos(R) >= rg.len0};
                const uint8_t *src = NULL, *ssrc = NULL;
                if (entry_source<true>(p, f, &src, &ssrc)) ws_prefetch(src, ssrc, q4);
            }
    }
    ws_raw wa, wb;
    WS_PROF_START;
    if (nr > 0) ws_load(p, rd.take(p, t, 0), q4, wa);
#pragma unroll 1
    for (int R = 0; R < nr; R += 2) {
        /* round R + 1 in flight */
        if (R + 1 < nr) ws_load(p, rd.take(p, t, R + 1), q4, wb);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int RR = R + h;
            if (RR >= nr) break;
            const int j = RR / RPB, b = j & 1;
            WS_PROF(2);
            if (RR % RPB == 0 && j >= 2) {
                if (NCTA == 2 && pw == 0 && lane == 0) {
                    /* this CTA's consumers are done with block j - 2: tell this CTA's producers
                     * and the peer's, which copies its half of block j into this CTA's tile */
                    cu_mbar_wait<0>(base + WS_CDONE(b), ((j >> 1) - 1) & 1);
                    cu_mbar_arrive(base + WS_BAR_OFF + 16 + b * 8);
                    cu_mbar_arrive_cluster(rbase + WS_BAR_OFF + 16 + b * 8);
                }
                cu_mbar_wait<NCTA - 1>(base + WS_BAR_OFF + 16 + b * 8, ((j >> 1) - 1) & 1);
            }
            WS_PROF(0);
            const uint32_t tile = WS_K_OFF + b * KB * ROW_BYTES, okoff = WS_OK_OFF + b * KB * 4;
            ws_store(base, tile, okoff, rd.ent(RR), q4, h ? wb : wa);
            WS_PROF(1);
            if (RR % RPB == RPB - 1) { /* this CTA's part of block j is in its tile */
                const uint32_t full = WS_BAR_OFF + b * 8;
                cu_fence_proxy_async();
                if (NCTA == 2 && p.warp_copy) {
                    /* each warp copies its own 8 rows (8 column blocks of 1 KB and 8 valid flags)
                     * into the peer's tile as soon as they are stored, without waiting for the other
                     * warps; thread 0 expects the peer's whole half (",one-copy": the path below) */
                    __syncwarp();
                    if (lane == 0) {
                        const uint32_t rows = (32 * rank + 8 * pw) * 128;
#pragma unroll 1
                        for (int cb = 0; cb < 8; cb++)
                            cu_bulk_copy_cluster(rbase + tile + cb * (KB * 128) + rows, base + tile + cb * (KB * 128) + rows,
                                                 8 * 128, rbase + full);
                        cu_bulk_copy_cluster(rbase + okoff + rows / 32, base + okoff + rows / 32, 32, rbase + full);
                    }
                    if (pw == 0 && lane == 0) cu_mbar_arrive_expect_tx(base + full, 8 * 32 * 128 + 128);
                    else cu_mbar_arrive(base + full);
                    WS_PROF(4);
                } else if (NCTA == 2) {
                    /* all 32 rows of this half, then one thread copies them into the peer's tile
                     * (8 column blocks of 4 KB and the 32 valid flags) and expects the peer's half */
                    WS_PROF(1);
                    cu_bar(2, 128);
                    WS_PROF(3);
                    if (pw == 0 && lane == 0) {
                        const uint32_t half = rank * 32 * 128;
#pragma unroll 1
                        for (int cb = 0; cb < 8; cb++)
                            cu_bulk_copy_cluster(rbase + tile + cb * (KB * 128) + half, base + tile + cb * (KB * 128) + half,
                                                 32 * 128, rbase + full);
                        cu_bulk_copy_cluster(rbase + okoff + rank * 128, base + okoff + rank * 128, 128, rbase + full);
                        cu_mbar_arrive_expect_tx(base + full, 8 * 32 * 128 + 128);
                    } else {
                        cu_mbar_arrive(base + full);
                    }
                    WS_PROF(4);
                } else {
                    cu_mbar_arrive(base + full);
                }
            }
            if (h == 0 && R + 2 < nr) ws_load(p, rd.take(p, t, R + 2), q4, wa); /* in flight while R + 1 is dequantized */
        }
    }
    WS_PROF(2);
    cu_cp_async_wait_all(); /* nothing of this thread lands after it leaves */
    WS_PROF_END(0);
}

/* A consumer waits until tile j & 1 holds block j. */
static DSV4_CU_INLINE void ws_wait_full(uint32_t base, int j) { cu_mbar_wait<0>(base + WS_BAR_OFF + (j & 1) * 8, (j >> 1) & 1); }

/* A value the compiler cannot see through: keeps the per-k-step descriptors of the loops below
 * from being hoisted out of the block loop (64 of them would hold 128 registers). */
static DSV4_CU_INLINE uint64_t ws_opaque(uint64_t x)
{
    uint64_t r;
    asm volatile("mov.b64 %0, %1;\n" : "=l"(r) : "l"(x));
    return r;
}

/* wg_qk and wg_pv with the descriptors rebuilt in every block. ws_qk: S of N entries (32: those
 * of ka's rows 0..31, the caller offsets ka; 64: all), m64nNk16 over the 512 dims. */
template <int N> static DSV4_CU_INLINE void ws_qk(float *s, uint32_t qa, uint32_t ka)
{
    const uint64_t dq = ws_opaque(cu_desc_sw128(qa, 16, 1024)), dk = ws_opaque(cu_desc_sw128(ka, 16, 1024));
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 32; kk++) {
        const uint32_t koff = ((kk >> 2) * 8192 + (kk & 3) * 32) >> 4;
        if (N == 32) cu_wgmma_m64n32<0>(s, dq + koff, dk + koff, kk > 0);
        else cu_wgmma_m64n64<0>(s, dq + koff, dk + koff, kk > 0);
    }
    cu_wgmma_commit();
}

static DSV4_CU_INLINE void ws_pv(float *o, const float *alpha, uint32_t pa, uint32_t ka, int wg)
{
    o_rescale(o, alpha);
    const uint64_t dp = ws_opaque(cu_desc_sw128(pa, 16, 1024)), dv = ws_opaque(cu_desc_sw128(ka + wg * 4 * 8192, 8192, 1024));
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++) cu_wgmma_m64n256<1>(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
    cu_wgmma_commit();
    cu_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; i++) cu_reg_fence(o[i]);
}

/* A consumer thread is done with tile b (its wgmma reads have completed). Every thread arrives
 * for itself (one lane per warp after a __syncwarp made compute-sanitizer racecheck report the
 * other lanes' reads of the valid flags as hazards). NCTA 2: on this CTA's cdone[b], and one
 * producer thread passes it on to both CTAs' empty[b], the peer's with a single cluster-scope
 * arrival (every consumer thread arriving on both CTAs' barriers at cluster scope cost the lead
 * ~1600 cycles a block). */
template <int NCTA> static DSV4_CU_INLINE void ws_release(uint32_t base, int b)
{
    cu_mbar_arrive(base + (NCTA == 2 ? WS_CDONE(b) : WS_BAR_OFF + 16 + b * 8));
}

/* ---- ws2: one consumer warpgroup owns S ------------------------------------------------------
 * WG0 (the lead) computes S = Q K^T over all 64 entries of a block (m64n64k16: twice the width of
 * ws1's m64n32 per instruction), the softmax of whole rows (no exchange of maxima), and keeps P
 * in registers as the A operand of its P V on dims 0..255 (m64n256k16, A from registers); it
 * hands P (BF16, shared memory) and the rescale factors to WG1 (the follower), which runs P V on
 * dims 256..511. The follower's P V of block j runs beside the lead's P V and overlaps the lead's
 * next Q K^T and softmax. The lead waits for its P V before it releases the tile: releasing it
 * only after issuing the next Q K^T (to overlap its own P V with that) measured 1-1.4 % slower.
 * Handoffs between the two go through mbarriers: pfull[b] (the lead wrote P tile b and its
 * rescale factors), pfree[b] (the follower is done with P tile b), epi (the row factors are
 * written). (Named barriers between the two, bar.sync / bar.arrive over 256 threads, made
 * compute-sanitizer racecheck report hazards.) */
#define WS_PFREE(b) (WS_BAR_OFF + 32 + 8 * (b)) /* one arrival per follower thread */
#define WS_EPI (WS_BAR_OFF + 48)                /* one arrival per lead thread */
#define WS_PFULL(b) (WS_BAR_OFF + 56 + 8 * (b)) /* one arrival per lead thread */

/* O (dims 0..255) += P V with P in registers (pf: the m64k16 A fragments of the 4 k-steps). */
static DSV4_CU_INLINE void w2_pv_rs(float *o, const uint32_t *pf, uint32_t ka)
{
    const uint64_t dv = ws_opaque(cu_desc_sw128(ka, 8192, 1024));
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++) cu_wgmma_m64n256_rs<1>(o, pf + 4 * kk, dv + ((kk * 16 * 128) >> 4));
    cu_wgmma_commit();
}

template <int NCTA>
static DSV4_CU_INLINE void w2_lead(const dsv4_cu_decode &p, uint8_t *smem, int nblk, int t, int h0, int split,
                                   int warp, int lane, float *sk)
{
    const uint32_t base = cu_smem(smem);
    const int r0 = 16 * (warp & 3) + (lane >> 2), qcol = 2 * (lane & 3);
    float *sAlpha = (float *)(smem + WS_RED_OFF), *sF = (float *)(smem + WS_L_OFF);
    float o[128], s[32];
    uint32_t pf[16];
    float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.0f;
    WS_PROF_START;
#pragma unroll 1
    for (int j = 0; j < nblk; j++) {
        const int b = j & 1;
        const uint32_t ka = base + WS_K_OFF + b * KB * ROW_BYTES;
        ws_wait_full(base, j); /* tile b holds block j */
        WS_PROF(0);
        ws_qk<64>(s, base + WS_Q_OFF, ka);
        cu_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; i++) cu_reg_fence(s[i]);
#pragma unroll
        for (int i = 0; i < 128; i++) cu_reg_fence(o[i]);
        WS_PROF(1);

        /* masks, base-2 logits, maxima of whole rows (the 4 lanes of a row), P */
        float mx[2], m_use[2], alpha[2];
        sm_logits<32>(p, s, (const int *)(smem + WS_OK_OFF) + b * KB, 0, qcol, mx);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) sm_rescale(mx[hf], m_run[hf], m_use[hf], alpha[hf], l_part[hf]);
        /* pf[4 kk + q]: k-step kk; q 0/1 rows r0/r0 + 8 at entries 16 kk + qcol, q 2/3 at + 8 */
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            const int hf = (i >> 1) & 1;
            const float p0 = cu_exp2(s[i] - m_use[hf]), p1 = cu_exp2(s[i + 1] - m_use[hf]);
            l_part[hf] += p0 + p1;
            pf[i >> 1] = cu_f32_bf16(p0) | (cu_f32_bf16(p1) << 16);
        }

        WS_PROF(2);
        /* P and the rescale factors to the follower (P tile b is free once it finished block j - 2) */
        if (j >= 2) cu_mbar_wait<0>(base + WS_PFREE(b), ((j >> 1) - 1) & 1);
        WS_PROF(3);
        uint8_t *sP = smem + WS_P_OFF + b * 64 * 128;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int row = r0 + 8 * (k & 1), col = 16 * (k >> 2) + 8 * ((k >> 1) & 1) + qcol;
            *(uint32_t *)(sP + row * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2) = pf[k];
        }
        if ((lane & 3) == 0) {
            sAlpha[b * 64 + r0] = alpha[0];
            sAlpha[b * 64 + r0 + 8] = alpha[1];
        }
        cu_fence_proxy_async(); /* P is read by the follower's wgmma */
        cu_mbar_arrive(base + WS_PFULL(b));

        o_rescale(o, alpha);
        w2_pv_rs(o, pf, ka);
        cu_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; i++) cu_reg_fence(o[i]);
        ws_release<NCTA>(base, b); /* Q K^T and P V of block j are done with tile b */
        WS_PROF(4);
    }
    WS_PROF_END(1);

    float f[2];
    if (p.late_sink) sink_rows(p, h0, r0, sk);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_part[hf];
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
        const int row = r0 + 8 * hf;
        f[hf] = h0 + row < p.h ? row_factor(p, l, m_run[hf], t, h0 + row, split, (lane & 3) == 0, sk[hf]) : 0.0f;
        if ((lane & 3) == 0) sF[row] = f[hf];
    }
    cu_mbar_arrive(base + WS_EPI);
    decode_release(p, true);
    store_rows(p, o, f, t, h0, split, 0, r0, lane);
}

template <int NCTA>
static DSV4_CU_INLINE void w2_follow(const dsv4_cu_decode &p, uint8_t *smem, int nblk, int t, int h0, int split,
                                     int warp, int lane)
{
    const uint32_t base = cu_smem(smem);
    const int r0 = 16 * (warp & 3) + (lane >> 2);
    const float *sAlpha = (const float *)(smem + WS_RED_OFF), *sF = (const float *)(smem + WS_L_OFF);
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.0f;
    WS_PROF_START;
#pragma unroll 1
    for (int j = 0; j < nblk; j++) {
        const int b = j & 1;
        cu_mbar_wait<0>(base + WS_PFULL(b), (j >> 1) & 1); /* P of block j in P tile b */
        ws_wait_full(base, j); /* (complete: orders the tile's reads) */
        WS_PROF(0);
        const float alpha[2] = {sAlpha[b * 64 + r0], sAlpha[b * 64 + r0 + 8]};
        ws_pv(o, alpha, base + WS_P_OFF + b * 64 * 128, base + WS_K_OFF + b * KB * ROW_BYTES, 1);
        WS_PROF(1);
        ws_release<NCTA>(base, b);
        cu_mbar_arrive(base + WS_PFREE(b));
        WS_PROF(2);
    }
    WS_PROF_END(2);
    cu_mbar_wait<0>(base + WS_EPI, 0);
    decode_release(p, true);
    const float f[2] = {sF[r0], sF[r0 + 8]};
    store_rows(p, o, f, t, h0, split, 256, r0, lane);
}

/* Q, loaded by the two consumer warpgroups alone (cp.async) while the producer already issues
 * the first entry loads; the consumers meet on named barrier 1 before anything reads it. */
static DSV4_CU_INLINE void ws_consumer_q(const dsv4_cu_decode &p, int t, int h0, uint8_t *smem, int tid)
{
    load_q_async<64, 256>(p, t, h0, smem + WS_Q_OFF, tid);
    cu_cp_async_wait_all();
    cu_fence_proxy_async();
    cu_bar(1, 256);
}

template <int NCTA, bool W2> static DSV4_CU_INLINE void ws_body(const dsv4_cu_decode &p)
{
    decode_release(p, false);
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *smem = align1024(smem_raw);
    const int t = blockIdx.x, h0 = blockIdx.y * 64, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const uint32_t rank = NCTA == 2 ? cu_cluster_rank() : 0u;
    const uint32_t base = cu_smem(smem);
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < 2; b++) {
            cu_mbar_init(base + WS_BAR_OFF + b * 8, 128);           /* full: every producer thread */
            /* empty: every consumer thread; NCTA 2: one arrival from each CTA's producer */
            cu_mbar_init(base + WS_BAR_OFF + 16 + b * 8, NCTA == 2 ? 2 : 256);
            cu_mbar_init(base + WS_CDONE(b), 256);
            cu_mbar_init(base + WS_PFREE(b), 128);
            cu_mbar_init(base + WS_PFULL(b), 128);
        }
        cu_mbar_init(base + WS_EPI, 128);
        cu_fence_mbar_init();
    }
    cu_pdl_wait(); /* nothing above touched global memory */
    const cta_range rg = cta_entries(p, t, split);
    const int nblk = rg.nblk;
    __syncthreads();
    if (NCTA == 2) cu_cluster_sync(); /* the peer's barriers are initialized */

    /* Registers: 168 per thread at launch (384 x 168 of the 64 K), moved from the producer to the
     * consumers: ws1 192 + 192 + 120, ws2 216 (the lead) + 160 + 128 (= 3 x 168). */
    if (wg == 2) {
        if (W2) cu_setmaxnreg_dec<128>();
        else cu_setmaxnreg_dec<120>();
        ws_producer<NCTA>(p, rg, t, smem, warp & 3, lane, rank);
        decode_release(p, true);
        if (NCTA == 2) cu_cluster_sync(); /* no CTA leaves while its peer may still signal it */
    } else if (W2) {
        if (wg == 0) {
            cu_setmaxnreg_inc<216>();
            float sk[2];
            if (!p.late_sink) sink_rows(p, h0, 16 * (warp & 3) + (lane >> 2), sk);
            ws_consumer_q(p, t, h0, smem, tid);
            w2_lead<NCTA>(p, smem, nblk, t, h0, split, warp, lane, sk);
        } else {
            cu_setmaxnreg_dec<160>(); /* below the 168 of the launch: gives 8 back */
            ws_consumer_q(p, t, h0, smem, tid);
            w2_follow<NCTA>(p, smem, nblk, t, h0, split, warp, lane);
        }
        if (NCTA == 2) cu_cluster_sync();
    } else {
        cu_setmaxnreg_inc<192>();
        const int r0 = 16 * (warp & 3) + (lane >> 2); /* this thread's rows: r0 and r0 + 8 */
        float sk[2];
        if (!p.late_sink) sink_rows(p, h0, r0, sk);
        ws_consumer_q(p, t, h0, smem, tid);
        const uint32_t qa = base + WS_Q_OFF, pa = base + WS_P_OFF, ka0 = base + WS_K_OFF;
        float *sRed = (float *)(smem + WS_RED_OFF), *sL = (float *)(smem + WS_L_OFF);
        float o[128], s[16], alpha[2];
        float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 128; i++) o[i] = 0.0f;
        WS_PROF_START;
#pragma unroll 1
        for (int j = 0; j < nblk; j++) {
            const int b = j & 1;
            const uint32_t ka = ka0 + b * KB * ROW_BYTES;
            ws_wait_full(base, j); /* tile b holds block j */
            WS_PROF(0);
            ws_qk<32>(s, qa, ka + wg * 32 * 128);
            wg_wait_s(s);
            WS_PROF(1);
            wg_softmax<true>(p, s, (const int *)(smem + WS_OK_OFF) + b * KB, sRed, smem + WS_P_OFF, m_run, l_part,
                             alpha, wg, r0, lane);
            WS_PROF(2);
            ws_pv(o, alpha, pa, ka, wg);
            WS_PROF(3);
            ws_release<NCTA>(base, b);
        }
        WS_PROF_END(1 + wg);
        decode_release(p, true);
        wg_epilogue<true>(p, o, m_run, l_part, sL, t, h0, split, wg, r0, lane, sk);
        if (NCTA == 2) cu_cluster_sync();
    }
}
#endif

/* W2: ws2 (one warpgroup owns S); otherwise ws1 (the two consumers split the entries of S). */
template <bool W2> __global__ void __launch_bounds__(WS_NT, 1) decode_ws_kernel(const dsv4_cu_decode p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ws_body<1, W2>(p);
#else
    __trap();
#endif
}

/* Two 64-head tiles of one token as a cluster (grid y even). */
template <bool W2>
__global__ void __cluster_dims__(1, 2, 1) __launch_bounds__(WS_NT, 1) decode_ws_pair_kernel(const dsv4_cu_decode p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ws_body<2, W2>(p);
#else
    __trap();
#endif
}

/* One CTA of COMBINE_NT threads per (token, head), each thread 8 of the 512 values: merge the
 * splits in order, apply the sink, write BF16 + lse. At small T the rows are few (64 at T = 1), so
 * a row gets a CTA of its own: the kernel is load latency, not bandwidth (docs/kernels.md §12.1).
 * Two kernels add the same terms in split order (the same bits, test_cuda checks it), chosen by
 * the split count (launch_combine): combine_kernel issues every load of a chunk of COMBINE_CHUNK
 * splits (their lse and values) before anything waits for one — the values do not depend on the
 * lse (a split without entries leaves its partial output unwritten; it is read and never used) —
 * so up to COMBINE_CHUNK splits cost one round trip to memory; combine_seq_kernel reads every lse,
 * then the values of four splits at a time behind their lse, two round trips per four splits, but
 * with 56 registers a thread against 119 more of its CTAs fit on an SM. */
#define COMBINE_NT 64
#define COMBINE_CHUNK 8

/* The row's lse and output from its merged sums. */
static DSV4_CU_INLINE void combine_store(const dsv4_cu_decode &p, int t, int h, int d0, float L, float wsum,
                                         const float *acc)
{
    const bool empty = !(wsum > 0.0f);
    const float lse = empty ? INFINITY : L + logf(wsum);
    float f = 0.0f;
    if (!empty) {
        const float sink = p.sink ? p.sink[h] : -INFINITY;
        f = (1.0f / wsum) / (1.0f + expf(sink - lse));
    }
    if (threadIdx.x == 0 && p.lse) p.lse[t * p.lse_st + h * p.lse_sh] = lse;
    uint32_t wv[4];
#pragma unroll
    for (int k = 0; k < 4; k++) wv[k] = cu_f32_bf16(acc[2 * k] * f) | (cu_f32_bf16(acc[2 * k + 1] * f) << 16);
    cu_st16(p.out + t * p.o_st + h * p.o_sh + d0, make_uint4(wv[0], wv[1], wv[2], wv[3]));
}

/* acc += wt * v over the 8 values of one split, wsum += wt (the split's term). */
static DSV4_CU_INLINE void combine_add(float *acc, float &wsum, float wt, const float4 *v)
{
    wsum += wt;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        acc[4 * k] += wt * v[k].x;
        acc[4 * k + 1] += wt * v[k].y;
        acc[4 * k + 2] += wt * v[k].z;
        acc[4 * k + 3] += wt * v[k].w;
    }
}

__global__ void __launch_bounds__(COMBINE_NT) combine_kernel(const dsv4_cu_decode p)
{
    const long long w = blockIdx.x, rows = (long long)p.t * p.h;
    const int d0 = threadIdx.x * 8, S = p.splits;
    const int t = (int)(w / p.h), h = (int)(w % p.h);
    cu_pdl_release(); /* the next decode may start and wait for this grid (see above) */
    cu_pdl_wait(); /* launched while the decode runs: its partial results are complete from here */
    float ls[COMBINE_CHUNK];
    float4 v[COMBINE_CHUNK][2];
    float L = -INFINITY;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.0f;
    float wsum = 0.0f;
    for (int s0 = 0; s0 < S; s0 += COMBINE_CHUNK) {
#pragma unroll
        for (int i = 0; i < COMBINE_CHUNK; i++) { /* every load of the chunk first */
            const int s = s0 + i;
            ls[i] = -INFINITY;
            if (s < S) {
                const float4 *src = (const float4 *)(p.part_o + (s * rows + w) * 512 + d0);
                ls[i] = p.part_lse[s * rows + w];
                v[i][0] = src[0];
                v[i][1] = src[1];
            }
        }
        if (s0 == 0) { /* the maximum over every split before the first weight */
#pragma unroll
            for (int i = 0; i < COMBINE_CHUNK; i++) L = fmaxf(L, ls[i]);
            for (int s = COMBINE_CHUNK; s < S; s++) L = fmaxf(L, p.part_lse[s * rows + w]);
        }
        if (L == -INFINITY) break;
#pragma unroll
        for (int i = 0; i < COMBINE_CHUNK; i++) /* then the sums, in split order */
            if (ls[i] != -INFINITY) combine_add(acc, wsum, expf(ls[i] - L), v[i]);
    }
    combine_store(p, t, h, d0, L, wsum, acc);
}

/* The combine of few splits (",seq-combine": of any count): the maximum lse, then per four splits
 * their lse, the loads of those with entries, their sums. */
__global__ void __launch_bounds__(COMBINE_NT) combine_seq_kernel(const dsv4_cu_decode p)
{
    const long long w = blockIdx.x, rows = (long long)p.t * p.h;
    const int d0 = threadIdx.x * 8;
    const int t = (int)(w / p.h), h = (int)(w % p.h);
    cu_pdl_release();
    cu_pdl_wait();
    float L = -INFINITY;
    for (int s = 0; s < p.splits; s++) L = fmaxf(L, p.part_lse[s * rows + w]);
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.0f;
    float wsum = 0.0f;
    if (L != -INFINITY) {
        for (int s0 = 0; s0 < p.splits; s0 += 4) {
            float wt[4];
            bool used[4];
            float4 v[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int s = s0 + i;
                const float ls = s < p.splits ? p.part_lse[s * rows + w] : -INFINITY;
                used[i] = ls != -INFINITY;
                wt[i] = used[i] ? expf(ls - L) : 0.0f;
                if (used[i]) {
                    const float4 *src = (const float4 *)(p.part_o + (s * rows + w) * 512 + d0);
                    v[i][0] = src[0], v[i][1] = src[1];
                } else {
                    v[i][0] = v[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (used[i]) combine_add(acc, wsum, wt[i], v[i]);
        }
    }
    combine_store(p, t, h, d0, L, wsum, acc);
}

extern "C" int dsv4_cu_decode_rows(long long h) { return h <= 16 ? 16 : (h <= 32 ? 32 : 64); }

/* One launch of a decode-family kernel; pdl: as a programmatic dependent of the kernel before it
 * on the stream (a programmatic edge under graph capture): see the comment above cu_pdl_release. */
static int launch_k(void (*kernel)(dsv4_cu_decode), const dsv4_cu_decode *d, dim3 grid, int threads, int smem,
                    cudaStream_t stream, int pdl)
{
    return (int)cu_launch_dependent_smem(kernel, grid, threads, (size_t)smem, stream, pdl != 0, *d);
}


template <int MT, bool FP8> static int launch_decode(const dsv4_cu_decode *d, cudaStream_t stream)
{
    typedef decode_cfg<MT, FP8> C;
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    const int e = cu_smem_opt_in(configured, d->device, decode_kernel<MT, FP8>, C::SMEM);
    if (e) return e;
    dim3 grid((unsigned)d->t, (unsigned)((d->h + C::ROWS - 1) / C::ROWS), (unsigned)d->splits);
    return launch_k(decode_kernel<MT, FP8>, d, grid, NT, C::SMEM, stream, d->pdl);
}

template <bool FP8> static int launch_wgmma(const dsv4_cu_decode *d, cudaStream_t stream)
{
    void (*kernel)(dsv4_cu_decode) = FP8 ? decode_fp8_kernel : decode_wgmma_bf16_kernel;
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    const int e = cu_smem_opt_in(configured, d->device, kernel, wg_cfg<FP8>::SMEM);
    if (e) return e;
    dim3 grid((unsigned)d->t, (unsigned)((d->h + 63) / 64), (unsigned)d->splits);
    return launch_k(kernel, d, grid, NT, wg_cfg<FP8>::SMEM, stream, d->pdl);
}

/* The warp-specialized FP8 kernel (ws2, or ws1 when !w2); pair: tiles in clusters of two (the
 * tile count is even). */
static int launch_ws(const dsv4_cu_decode *d, cudaStream_t stream, int w2, int pair)
{
    void (*const kernels[4])(dsv4_cu_decode) = {decode_ws_kernel<false>, decode_ws_pair_kernel<false>,
                                                decode_ws_kernel<true>, decode_ws_pair_kernel<true>};
    static unsigned char configured[4][DSV4_CU_MAX_DEVICES];
    const int k = 2 * w2 + pair;
    const int e = cu_smem_opt_in(configured[k], d->device, kernels[k], WS_SMEM);
    if (e) return e;
    dim3 grid((unsigned)d->t, (unsigned)((d->h + 63) / 64), (unsigned)d->splits);
    return launch_k(kernels[k], d, grid, WS_NT, WS_SMEM, stream, d->pdl);
}

/* The kernel for 64-head tiles of FP8 pages on sm_90a: ws2 by default; v1 (the single-role
 * decode_fp8_kernel) when no CTA has more than one 64-entry block, since with nothing to pipeline
 * its eight warps dequantize a lone block sooner than a producer's four. The kernel depends on the
 * entries a CTA gets, never on whether the query is split, so a token's result does not depend on
 * the call size (docs/kernels.md §3.3). (v1 for every query of
 * two blocks at most, a choice by the widths alone, measured slower for SWA 128 at T = 64: 20.4
 * against ws2's 18.8 us, and equal at T = 128; BENCHMARKS.md "CUDA sparse decode vs FlashMLA, same
 * run".) The context's cuda_decode
 * option (d->kernel: ws2, ws1 or v1) forces one, and its "no-pair" (d->no_pair) keeps the tiles of
 * a token in separate CTAs (benchmarks and tests compare them). */
enum { K_V1, K_WS1, K_WS2 };
static int fp8_kernel_choice(const dsv4_cu_decode *d)
{
    if (d->kernel == DSV4_CU_V1) return K_V1;
    if (d->kernel == DSV4_CU_WS1) return K_WS1;
    if (d->kernel == DSV4_CU_WS2) return K_WS2;
    long long width = d->scope[0].width + (d->n_scopes > 1 ? d->scope[1].width : 0);
    long long blocks = (width + KB - 1) / KB, per_cta = (blocks + d->splits - 1) / d->splits;
    return per_cta <= 1 ? K_V1 : K_WS2;
}

/* The combine as a programmatic dependent of the decode just launched on the same stream. Its
 * SMs keep the largest shared-memory carveout, so that the CTAs of a decode launched after it can
 * start beside its own. Up to COMBINE_SEQ_MAX splits combine_seq_kernel, beyond it combine_kernel
 * (same run, h 64: 10 splits at T = 1 / 8 14.5 / 19.4 against 15.0 / 20.1 us; 2 splits of 4096 rows
 * at T = 64 36.7 against 35.6 us, where the 119 registers a thread leave fewer CTAs an SM; 2
 * splits of 64 / 512 rows within 0.2 us; BENCHMARKS.md "CUDA sparse decode vs FlashMLA, same run"). */
#define COMBINE_SEQ_MAX 4
static int launch_combine(const dsv4_cu_decode *d, cudaStream_t stream)
{
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    const bool known = d->device >= 0 && d->device < DSV4_CU_MAX_DEVICES;
    if (!known || !configured[d->device]) {
        for (int k = 0; k < 2; k++) {
            const cudaError_t e = cudaFuncSetAttribute(k ? combine_seq_kernel : combine_kernel,
                                                       cudaFuncAttributePreferredSharedMemoryCarveout,
                                                       cudaSharedmemCarveoutMaxShared);
            if (e != cudaSuccess) return (int)e;
        }
        if (known) configured[d->device] = 1;
    }
    const bool chunked = !d->seq_combine && d->splits > COMBINE_SEQ_MAX;
    return launch_k(chunked ? combine_kernel : combine_seq_kernel, d, dim3((unsigned)((long long)d->t * d->h)),
                    COMBINE_NT, 0, stream, 1);
}

/* Whether the decode is launched as a programmatic dependent of the kernel before it (d->pdl: 0
 * never, ",no-pdl"; 2 always, ",pdl"; 1 the rule): yes, except for a v1 grid (FP8 pages) over
 * more than half the SMs. Measured in one run on one shape only (h 64, 128 + 512 entries, T = 8:
 * 80 v1 CTAs, 512 combine rows): plain 18.5 / 18.6 us against 19.4 / 19.7 with PDL (and 18.9 /
 * 19.2 with ",late-release"); with 10 or 16 v1 CTAs (T = 1, SWA 128 at T = 8) and on the ws2
 * grids PDL was as fast or faster (BENCHMARKS.md "CUDA sparse decode vs FlashMLA, same run"). A v1
 * CTA takes every register of its SM (255 x 256), so it starts only on an SM that nothing else
 * runs on. Timing only: no result depends on it. */
static int launch_pdl(const dsv4_cu_decode *d, bool v1_fp8)
{
    if (d->pdl != 1) return d->pdl != 0;
    const long long ctas = (long long)d->t * ((d->h + 63) / 64) * d->splits;
    return !(v1_fp8 && 2 * ctas > d->sms);
}

extern "C" int dsv4_cu_decode_launch(const dsv4_cu_decode *dd, void *stream)
{
    if (dd->t == 0 || dd->h == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const int rows = dsv4_cu_decode_rows(dd->h);
    const long long tiles = (dd->h + 63) / 64;
    const int choice = rows == 64 && dd->wgmma && dd->fp8 && dd->aligned ? fp8_kernel_choice(dd) : K_V1;
    const bool wg = rows == 64 && dd->wgmma && (dd->aligned || !dd->fp8);
    dsv4_cu_decode l = *dd;
    l.pdl = launch_pdl(dd, choice == K_V1 && wg && dd->fp8);
    const dsv4_cu_decode *d = &l;
    int err;
    if (choice != K_V1)
        err = launch_ws(d, st, choice == K_WS2, tiles % 2 == 0 && !d->no_pair);
    else if (wg) err = d->fp8 ? launch_wgmma<true>(d, st) : launch_wgmma<false>(d, st);
    else if (d->fp8) err = rows == 16 ? launch_decode<1, true>(d, st) : rows == 32 ? launch_decode<2, true>(d, st) : launch_decode<4, true>(d, st);
    else err = rows == 16 ? launch_decode<1, false>(d, st) : rows == 32 ? launch_decode<2, false>(d, st) : launch_decode<4, false>(d, st);
    if (err || d->splits <= 1) return err;
    return launch_combine(d, st);
}
