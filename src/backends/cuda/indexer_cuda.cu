/* Lightning-indexer kernels on the GPU (include/dsv4/indexer.h): the query path, head weights,
 * scores of the FP4 cache and the top-k selection. Every result is cpu-ref's to the bit
 * (indexer_ref.c, indexer_common.c): the group dots are exact integer sums, the scaled sums and the
 * 16 per-lane head accumulations use cpu-ref's fused multiply-adds in its order, the query path
 * its roundings, and the selection reproduces its total order of keys
 * (indexer_cpu.h dsv4_ix_key: score, then the smaller index; NaN ranks as -inf, -0 ties with +0).
 * Nothing here allocates or synchronizes; per-token candidate counts come in the launch
 * parameters (the op layer reads positions and n_valid on the host), so a captured graph replays
 * the counts it was captured with, as a direct call with the same host arrays would use. */
#include "backends/cuda/cuda_indexer.cuh"
#include "backends/cuda/cuda_indexer.h"
#include "backends/cuda/cuda_ops.h" /* dsv4_cu_linear_pdl */

/* ---- head weights ---------------------------------------------------------------------------- */
__global__ void ix_weights_kernel(const void *proj, int bf16, long long ld_proj, long long tokens, long long heads,
                                  float scale, float *out, long long ld_out)
{
    const long long h = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= heads) return;
    for (long long t = blockIdx.y; t < tokens; t += gridDim.y) {
        const float v =
            bf16 ? cu_bf16_f32(((const uint16_t *)proj)[t * ld_proj + h]) : ((const float *)proj)[t * ld_proj + h];
        out[t * ld_out + h] = cu_bf16_f32(cu_f32_bf16(__fmul_rn(v, scale)));
    }
}

extern "C" int dsv4_cu_ix_weights_launch(const void *proj, int proj_bf16, long long ld_proj, long long tokens,
                                         long long heads, float scale, float *out, long long ld_out, void *stream)
{
    if (tokens == 0 || heads == 0) return 0;
    ix_weights_kernel<<<dim3((unsigned)((heads + 127) / 128), (unsigned)(tokens < 65535 ? tokens : 65535)), 128, 0,
                        (cudaStream_t)stream>>>(proj, proj_bf16, ld_proj, tokens, heads, scale, out, ld_out);
    return (int)cudaGetLastError();
}

/* ---- query path ----------------------------------------------------------------------------------
 * A warp per (token, head) row, the row in shared memory: GPT-J RoPE of its last 64 values (each
 * result rounded to BF16), the unnormalized Walsh-Hadamard stages h = 1, 2, 4, ..., the product
 * with d^-0.5 rounded to BF16, then the FP4 rule fp4_32 per 32 values (indexer_common.c, the same
 * operations: the butterflies of a stage are independent, the group maximum is order-free). */
enum { IXQ_WARPS = 4 };

/* The rope row of local token tl: from the launch, or read on the device and clamped to the table. */
DSV4_CU_INLINE long long ixq_pos(const dsv4_cu_ixq &a, long long tl)
{
    if (!a.dpos) return a.pos[tl];
    const long long p = a.dpos[(a.t0 + tl) * a.ld_dpos];
    return p < 0 ? 0 : (p >= a.rope_rows ? a.rope_rows - 1 : p);
}

__global__ void __launch_bounds__(IXQ_WARPS * 32) ixq_kernel(dsv4_cu_ixq a)
{
    __shared__ float xs[IXQ_WARPS][256];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, d = a.dim;
    const long long row = (long long)blockIdx.x * IXQ_WARPS + wi;
    if (row >= a.tokens * a.heads) return; /* whole warps leave: no block-wide barrier below */
    const long long tl = row / a.heads, h = row % a.heads, t = a.t0 + tl;
    float *x = xs[wi];
    const uint16_t *q = a.q + t * a.ld_q_t + h * a.ld_q_h;
    for (int e = lane; e < d; e += 32) x[e] = cu_bf16_f32(q[e]);
    __syncwarp();
    cu_ix_rope_pair(x + d - 64, a.rope + ixq_pos(a, tl) * a.ld_rope, lane);
    __syncwarp();
    cu_ix_fwht<false>(x, d, lane, 32);
    const float hscale = (float)(1.0 / sqrt((double)d)); /* IEEE double, as indexer_common.c */
    uint8_t *oc = a.packed ? (uint8_t *)a.out + t * a.ld_out_t + h * a.ld_out_h : NULL;
    uint8_t *os = a.packed ? a.out_scales + t * a.ld_os_t + h * a.ld_os_h : NULL;
    uint16_t *ov = a.packed ? NULL : (uint16_t *)a.out + t * a.ld_out_t + h * a.ld_out_h;
    for (int g = 0; g < d / 32; g++)
        cu_ix_fp4_group(cu_bf16_round(__fmul_rn(x[32 * g + lane], hscale)), lane, g, oc, os, ov);
}

extern "C" int dsv4_cu_ixq_launch(const dsv4_cu_ixq *a, void *stream)
{
    const long long rows = a->tokens * a->heads;
    if (rows == 0) return 0;
    if (a->tokens > DSV4_CU_IXQ_TOKENS || (a->dim != 64 && a->dim != 128 && a->dim != 256))
        return (int)cudaErrorInvalidValue;
    const long long blocks = (rows + IXQ_WARPS - 1) / IXQ_WARPS;
    if (blocks > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    ixq_kernel<<<(unsigned)blocks, IXQ_WARPS * 32, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

/* ---- scores ------------------------------------------------------------------------------------
 * grid (x: candidate blocks, y: tokens of the chunk), SC_THREADS candidates per block, a thread per
 * candidate. The CTA expands its token's query into shared memory as int8 quads of 2 x the E2M1
 * values (low nibbles and high nibbles of 4 packed bytes apart), the thread its cache entry in
 * registers; a group's integer dot is then 8 dp4a. */
enum { SC_THREADS = 128, SC_MAX_BLOCKS = 512 };

/* A packed word (4 bytes = 8 codes) -> the int8 quads of its low nibbles and of its high nibbles. */
DSV4_CU_INLINE void expand_word(uint32_t w, uint32_t *lo, uint32_t *hi)
{
    uint32_t l = 0, h = 0;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        l |= cu_fp4x2_val((w >> (8 * b)) & 15u) << (8 * b);
        h |= cu_fp4x2_val((w >> (8 * b + 4)) & 15u) << (8 * b);
    }
    *lo = l;
    *hi = h;
}

DSV4_CU_INLINE uint32_t ld_u32_bytes(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* One level of indexer_cpu.h dsv4_ix_lane_tree: l[i] += l[i + W]. */
template <int W> DSV4_CU_INLINE void lane_tree(float *l)
{
#pragma unroll
    for (int i = 0; i < W; i++) l[i] = __fadd_rn(l[i], l[i + W]);
}

DSV4_CU_INLINE float half_scale(uint32_t b) { return __fmul_rn(cu_e8m0_f32(b), 0.5f); }

/* A token's query in shared memory, as the scores need it. */
struct ix_query {
    uint32_t lo[DSV4_CU_IX_MAX_HEADS * 32], hi[DSV4_CU_IX_MAX_HEADS * 32]; /* [h][d/8] */
    float sc[DSV4_CU_IX_MAX_HEADS * 8], w[DSV4_CU_IX_MAX_HEADS];           /* [h][d/32], [h] */
};

/* Every thread of the CTA takes part; a __syncthreads must follow before use. */
template <int D> DSV4_CU_INLINE void load_query(const dsv4_cu_ix_scores &a, long long t, ix_query *q)
{
    constexpr int W = D / 8, G = D / 32;
    const int H = a.heads;
    for (int i = threadIdx.x; i < H * W; i += blockDim.x) {
        const int h = i / W, j = i % W;
        expand_word(ld_u32_bytes(a.q + t * a.ld_q_t + h * a.ld_q_h + 4 * j), &q->lo[i], &q->hi[i]);
    }
    for (int i = threadIdx.x; i < H * G; i += blockDim.x) {
        const int h = i / G, g = i % G;
        q->sc[i] = half_scale(a.q_scales[t * a.ld_qs_t + h * a.ld_qs_h + g]);
    }
    for (int h = threadIdx.x; h < H; h += blockDim.x) q->w[h] = a.weights[t * a.ld_w + h];
}

/* Score of cache entry c for the query q (indexer_ref.c dsv4_ix_ref_score). */
template <int D> DSV4_CU_INLINE float score_one(const dsv4_cu_ix_scores &a, const ix_query *q, long long c)
{
    constexpr int W = D / 8, G = D / 32;
    const int H = a.heads;
    uint32_t klo[W], khi[W];
    float ks[G];
    const uint8_t *kp = a.k + c * a.ld_k, *kq = a.k_scales + c * a.ld_ks;
#pragma unroll
    for (int j = 0; j < W; j++) expand_word(ld_u32_bytes(kp + 4 * j), &klo[j], &khi[j]);
#pragma unroll
    for (int g = 0; g < G; g++) ks[g] = half_scale(kq[g]);
    float lanes[16];
#pragma unroll
    for (int l = 0; l < 16; l++) lanes[l] = 0.0f;
    for (int h0 = 0; h0 < H; h0 += 16) /* lane l takes heads l, l + 16, ... in order */
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int h = h0 + l;
            if (h >= H) continue;
            const uint32_t *ql = q->lo + h * W, *qh = q->hi + h * W;
            float dot = 0.0f;
#pragma unroll
            for (int g = 0; g < G; g++) {
                int sum = 0;
#pragma unroll
                for (int j = 4 * g; j < 4 * g + 4; j++) {
                    sum = __dp4a((int)ql[j], (int)klo[j], sum);
                    sum = __dp4a((int)qh[j], (int)khi[j], sum);
                }
                dot = __fmaf_rn((float)sum, __fmul_rn(q->sc[h * G + g], ks[g]), dot);
            }
            lanes[l] = __fmaf_rn(dot > 0.0f ? dot : 0.0f, q->w[h], lanes[l]);
        }
    lane_tree<8>(lanes), lane_tree<4>(lanes), lane_tree<2>(lanes), lane_tree<1>(lanes);
    return lanes[0];
}

/* Candidates of local token tl (dsv4_cu_ix_scores count / dpos). */
DSV4_CU_INLINE long long ix_count(const dsv4_cu_ix_scores &a, int tl)
{
    if (!a.dpos) return a.count[tl];
    const long long p = a.dpos[(a.t0 + tl) * a.ld_dpos], n = p < 0 ? 0 : (p + 1) / a.ratio;
    return n < a.n_cache ? n : a.n_cache;
}

template <int D>
__global__ void __launch_bounds__(SC_THREADS) ix_scores_kernel(dsv4_cu_ix_scores a, float *scores, long long ld)
{
    __shared__ ix_query q;
    const int tl = blockIdx.y;
    const long long t = a.t0 + tl, N = a.n_cache, nt = ix_count(a, tl);
    load_query<D>(a, t, &q);
    __syncthreads();
    float *row = scores + t * ld;
    for (long long c0 = (long long)blockIdx.x * SC_THREADS; c0 < N; c0 += (long long)gridDim.x * SC_THREADS) {
        const long long c = c0 + threadIdx.x;
        if (c >= N) break;
        row[c] = c < nt ? score_one<D>(a, &q, c) : -INFINITY;
    }
}

extern "C" int dsv4_cu_ix_scores_launch(const dsv4_cu_ix_scores *a, float *scores, long long ld, void *stream)
{
    if (a->tokens == 0 || a->n_cache == 0) return 0;
    if (a->tokens > DSV4_CU_IX_TOKENS || a->heads < 1 || a->heads > DSV4_CU_IX_MAX_HEADS)
        return (int)cudaErrorInvalidValue;
    long long blocks = (a->n_cache + SC_THREADS - 1) / SC_THREADS;
    if (blocks > SC_MAX_BLOCKS) blocks = SC_MAX_BLOCKS;
    const dim3 grid((unsigned)blocks, (unsigned)a->tokens);
    cudaStream_t s = (cudaStream_t)stream;
    switch (a->dim) {
    case 64: ix_scores_kernel<64><<<grid, SC_THREADS, 0, s>>>(*a, scores, ld); break;
    case 128: ix_scores_kernel<128><<<grid, SC_THREADS, 0, s>>>(*a, scores, ld); break;
    case 256: ix_scores_kernel<256><<<grid, SC_THREADS, 0, s>>>(*a, scores, ld); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

/* ---- top-k ---------------------------------------------------------------------------------------
 * One CTA per token. The 32-bit order key of a score (the high half of dsv4_ix_key) is found by a
 * radix select, 8 bits per pass from the top: the threshold key K and how many candidates equal to
 * it make the top k (`want`). A pass in index order then keeps every key above K and the first
 * `want` equal to K (the smaller indices, as the 64-bit key says), a bitonic sort in shared memory
 * orders the kept 64-bit keys descending, and the indices are written with the -1 fill. */
enum { TK_THREADS = 1024, TK_WARPS = TK_THREADS / 32 };

DSV4_CU_INLINE uint32_t order_key(float s)
{
    uint32_t u = __float_as_uint(s);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) u = 0xFF800000u;
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* hist[bin] += 1 for the lanes with ok, one shared atomic per distinct bin of the warp (the scores
 * of a row mostly share their top bits); every lane of the warp calls it. */
DSV4_CU_INLINE void hist_add(unsigned *hist, bool ok, unsigned bin)
{
    const unsigned active = __ballot_sync(0xFFFFFFFFu, ok);
    if (!ok) return;
    const unsigned peers = __match_any_sync(active, bin);
    if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* The digit of a radix pass: the bin b holding the *want-th largest key, given the counts of the
 * keys that matched the prefix so far; *want becomes its rank among b's keys. */
DSV4_CU_INLINE unsigned pick_bin(const unsigned *hist, unsigned *want)
{
    unsigned above = 0, b = 255;
    for (; b > 0; b--) {
        if (above + hist[b] >= *want) break;
        above += hist[b];
    }
    *want -= above;
    return b;
}

/* keys[0..n) in descending order by a bitonic sort over the next power of two (keys[n..) are
 * overwritten with 0, below every real key); every thread of the CTA takes part. */
DSV4_CU_INLINE void sort_desc(unsigned long long *keys, unsigned n)
{
    unsigned p = 1;
    while (p < n) p <<= 1;
    for (unsigned i = n + threadIdx.x; i < p; i += blockDim.x) keys[i] = 0ull;
    __syncthreads();
    for (unsigned size = 2; size <= p; size <<= 1)
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            for (unsigned i = threadIdx.x; i < p / 2; i += blockDim.x) {
                const unsigned lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const unsigned long long x = keys[lo], y = keys[hi];
                if ((x < y) == desc) keys[lo] = y, keys[hi] = x;
            }
            __syncthreads();
        }
}

/* The `take` kept keys (in shared memory) sorted, their indices written with the -1 fill to k. */
DSV4_CU_INLINE void sort_emit(unsigned long long *keys, unsigned take, long long k, int32_t *idx, int32_t *len)
{
    sort_desc(keys, take);
    for (long long i = threadIdx.x; i < k; i += blockDim.x) idx[i] = i < take ? (int32_t)~(uint32_t)keys[i] : -1;
    if (threadIdx.x == 0) *len = (int32_t)take;
}

__global__ void __launch_bounds__(TK_THREADS) ix_topk_kernel(dsv4_cu_ix_topk a)
{
    __shared__ unsigned long long keys[DSV4_CU_IX_MAX_TOPK];
    __shared__ unsigned hist[256];
    __shared__ unsigned warp_n[TK_WARPS];
    __shared__ unsigned sh_prefix, sh_want, sh_gt;
    const int tl = blockIdx.x;
    const long long t = a.t0 + tl, n = a.count[tl], k = a.topk;
    const float *row = a.scores + t * a.ld;
    const unsigned take = (unsigned)(n < k ? n : k);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        sh_prefix = 0;
        sh_want = take;
        sh_gt = 0;
    }
    __syncthreads();
    unsigned mask = 0;
    for (int shift = 24; shift >= 0 && take > 0; shift -= 8) {
        for (int i = tid; i < 256; i += TK_THREADS) hist[i] = 0;
        __syncthreads();
        const unsigned prefix = sh_prefix;
        for (long long c0 = 0; c0 < n; c0 += TK_THREADS) { /* whole warps: hist_add is warp-wide */
            const long long c = c0 + tid;
            const uint32_t u = c < n ? order_key(row[c]) : 0u;
            hist_add(hist, c < n && (u & mask) == prefix, (u >> shift) & 255u);
        }
        __syncthreads();
        if (tid == 0) sh_prefix = prefix | (pick_bin(hist, &sh_want) << shift);
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t thr = sh_prefix;
    const unsigned want = sh_want, n_gt = take - want;
    /* the kept keys: above the threshold in any slot of [0, n_gt), equal ones in index order after */
    unsigned base = 0;
    for (long long c0 = 0; c0 < n && take > 0; c0 += TK_THREADS) {
        const long long c = c0 + tid;
        const uint32_t u = c < n ? order_key(row[c]) : 0u;
        const unsigned long long key = ((unsigned long long)u << 32) | (uint32_t)~(uint32_t)c;
        if (c < n && u > thr) keys[atomicAdd(&sh_gt, 1u)] = key;
        const bool eq = c < n && u == thr;
        const unsigned bal = __ballot_sync(0xFFFFFFFFu, eq);
        if (lane == 0) warp_n[warp] = __popc(bal);
        __syncthreads();
        unsigned before = base, total = 0;
        for (int w = 0; w < TK_WARPS; w++) {
            if (w < warp) before += warp_n[w];
            total += warp_n[w];
        }
        const unsigned rank = before + __popc(bal & ((1u << lane) - 1u));
        if (eq && rank < want) keys[n_gt + rank] = key;
        base += total;
        __syncthreads(); /* warp_n is rewritten by the next chunk */
    }
    sort_emit(keys, take, k, a.indices + t * a.ld_indices, a.lengths + t * a.ld_lengths);
}

extern "C" int dsv4_cu_ix_topk_launch(const dsv4_cu_ix_topk *a, void *stream)
{
    if (a->tokens == 0) return 0;
    if (a->tokens > DSV4_CU_IX_TOKENS || a->topk < 1 || a->topk > DSV4_CU_IX_MAX_TOPK)
        return (int)cudaErrorInvalidValue;
    ix_topk_kernel<<<(unsigned)a->tokens, TK_THREADS, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

/* ---- select: scores and top-k in one op ------------------------------------------------------------
 * (1) grid (parts, tokens): part p of token t scores the candidate blocks p, p + parts, ... and
 * keeps the best topk of them in a shared buffer (a block's keys above the buffer's k-th enter; when
 * more than k are held the buffer is sorted and cut to k), then writes its k keys (0 past its
 * count) to its row of the workspace. (2) one CTA per token: a radix select of the 64-bit keys of
 * the token's parts (distinct: 8 passes end on the k-th key itself), then sort and emit as above;
 * with at most k candidates every part kept all of its own, so the nonzero keys are the answer:
 * they are collected (a warp per part row, up to its first 0) and sorted with no radix pass.
 * The total order makes the result independent of the parts. */
enum { SEL_THREADS = 256 };

DSV4_CU_INLINE unsigned long long cand_key(float s, long long c)
{
    return ((unsigned long long)order_key(s) << 32) | (uint32_t)~(uint32_t)c;
}

__host__ __device__ __forceinline__ unsigned pow2_at_least(unsigned n)
{
    unsigned p = 1;
    while (p < n) p <<= 1;
    return p;
}

template <int D> __global__ void __launch_bounds__(SEL_THREADS) ix_select_part_kernel(dsv4_cu_ix_select a)
{
    extern __shared__ unsigned long long buf[]; /* pow2_at_least(topk + SEL_THREADS) keys */
    __shared__ ix_query q;
    __shared__ unsigned held;
    __shared__ unsigned long long bar;
    cu_pdl_wait();
    cu_pdl_release();
    const int tl = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
    const long long t = a.s.t0 + tl, nt = ix_count(a.s, tl), k = a.topk;
    load_query<D>(a.s, t, &q);
    if (threadIdx.x == 0) held = 0, bar = 0ull;
    __syncthreads();
    for (long long c0 = (long long)part * SEL_THREADS; c0 < nt; c0 += (long long)parts * SEL_THREADS) {
        const long long c = c0 + threadIdx.x;
        if (c < nt) {
            const unsigned long long key = cand_key(score_one<D>(a.s, &q, c), c);
            if (key > bar) buf[atomicAdd(&held, 1u)] = key;
        }
        __syncthreads();
        if (held > k) { /* uniform: read after the barrier, written again only after the next one */
            sort_desc(buf, held);
            if (threadIdx.x == 0) held = (unsigned)k, bar = buf[k - 1];
        }
        __syncthreads();
    }
    const unsigned n = held;
    sort_desc(buf, n);
    unsigned long long *row = a.ws + ((long long)tl * parts + part) * k;
    for (long long i = threadIdx.x; i < k; i += SEL_THREADS) row[i] = i < n ? buf[i] : 0ull;
}

__global__ void __launch_bounds__(TK_THREADS) ix_select_merge_kernel(dsv4_cu_ix_select a, int parts)
{
    __shared__ unsigned long long keys[DSV4_CU_IX_MAX_TOPK];
    __shared__ unsigned hist[256];
    __shared__ unsigned long long sh_prefix;
    __shared__ unsigned sh_want, sh_n;
    cu_pdl_wait();
    cu_pdl_release();
    const int tl = blockIdx.x, tid = threadIdx.x;
    const long long t = a.s.t0 + tl, nt = ix_count(a.s, tl), k = a.topk, m = (long long)parts * k;
    const unsigned long long *src = a.ws + (long long)tl * m;
    const unsigned take = (unsigned)(nt < k ? nt : k);
    if (tid == 0) sh_prefix = 0ull, sh_want = take, sh_n = 0;
    __syncthreads();
    if (nt <= k) { /* every part kept all its candidates: the nt keys (all nonzero) are the top k */
        const int lane = tid & 31;
        for (int p = tid >> 5; p < parts; p += TK_WARPS) /* a warp per part, up to its row's first 0 */
            for (long long i0 = 0; i0 < k; i0 += 32) {
                const long long i = i0 + lane;
                const unsigned long long x = i < k ? src[(long long)p * k + i] : 0ull;
                if (x) keys[atomicAdd(&sh_n, 1u)] = x;
                if (__ballot_sync(0xFFFFFFFFu, x != 0ull) != 0xFFFFFFFFu) break;
            }
        __syncthreads();
        sort_emit(keys, take, k, a.indices + t * a.ld_indices, a.lengths + t * a.ld_lengths);
        return;
    }
    unsigned long long mask = 0ull;
    for (int shift = 56; shift >= 0 && take > 0; shift -= 8) {
        for (int i = tid; i < 256; i += TK_THREADS) hist[i] = 0;
        __syncthreads();
        const unsigned long long prefix = sh_prefix;
        for (long long i0 = 0; i0 < m; i0 += TK_THREADS) { /* whole warps: hist_add is warp-wide */
            const long long i = i0 + tid;
            const unsigned long long x = i < m ? src[i] : 0ull;
            hist_add(hist, i < m && (x & mask) == prefix, (unsigned)(x >> shift) & 255u);
        }
        __syncthreads();
        if (tid == 0) sh_prefix = prefix | ((unsigned long long)pick_bin(hist, &sh_want) << shift);
        mask |= 255ull << shift;
        __syncthreads();
    }
    const unsigned long long thr = sh_prefix; /* the take-th key: exactly take keys are >= it */
    for (long long i = tid; i < m && take > 0; i += TK_THREADS) {
        const unsigned long long x = src[i];
        if (x >= thr) keys[atomicAdd(&sh_n, 1u)] = x;
    }
    __syncthreads();
    sort_emit(keys, take, k, a.indices + t * a.ld_indices, a.lengths + t * a.ld_lengths);
}

static size_t select_buffer(long long topk)
{
    return (size_t)pow2_at_least((unsigned)topk + SEL_THREADS) * sizeof(unsigned long long);
}

/* The part kernel opts in once per device to the buffer of the largest topk. */
template <int D> static int select_parts(const dsv4_cu_ix_select *a, int parts, cudaStream_t s)
{
    static unsigned char configured[DSV4_CU_MAX_DEVICES];
    int device = -1;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return (int)e;
    const int err =
        cu_smem_opt_in(configured, device, ix_select_part_kernel<D>, (int)select_buffer(DSV4_CU_IX_MAX_TOPK));
    if (err) return err;
    const dim3 grid((unsigned)parts, (unsigned)a->s.tokens);
    return (int)cu_launch_dependent_smem(ix_select_part_kernel<D>, grid, SEL_THREADS, select_buffer(a->topk), s,
                                         dsv4_cu_linear_pdl() != 0, *a);
}

extern "C" int dsv4_cu_ix_select_launch(const dsv4_cu_ix_select *a, int parts, void *stream)
{
    if (a->s.tokens == 0) return 0;
    if (a->s.tokens > DSV4_CU_IX_TOKENS || a->s.heads < 1 || a->s.heads > DSV4_CU_IX_MAX_HEADS || a->topk < 1 ||
        a->topk > DSV4_CU_IX_MAX_TOPK || parts < 1)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    int e;
    switch (a->s.dim) {
    case 64: e = select_parts<64>(a, parts, s); break;
    case 128: e = select_parts<128>(a, parts, s); break;
    case 256: e = select_parts<256>(a, parts, s); break;
    default: return (int)cudaErrorInvalidValue;
    }
    if (e) return e;
    return (int)cu_launch_dependent(ix_select_merge_kernel, dim3((unsigned)a->s.tokens), TK_THREADS, s,
                                    dsv4_cu_linear_pdl() != 0, *a, parts);
}
