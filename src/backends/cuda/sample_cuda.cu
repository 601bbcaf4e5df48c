/* Sampling rows of logits on the GPU (include/dsv4/tensor_ops.h dsv4_sample_rows): one CTA of
 * 1024 threads per row, giving the token and generator state of core/sample.c bit for bit.
 *
 * What makes it the same: every value is computed by the arithmetic of core/sample_math.h (exp,
 * -log and the generator, with the _rn intrinsics: no contraction) in the order core/sample.c uses
 * where order matters, and in any order only where the result is exact:
 *   rule and greedy   a min of the first bad index, a max with the lower id on ties (exact);
 *   softmax           p_i = f32(f32(e_i) / sum), e_i = exp((x_i - max) / T) in double; sum = the
 *                     128-id block sums (each in id order, by one thread) added in block order by
 *                     one thread: the CPU's order;
 *   top-p             probabilities >= 2^-29 are multiples of 2^-52 and their sums stay below 2, so
 *                     every sum of them is exact in double in any order: the CPU's heap stops at
 *                     the first prefix (p descending, ties by id) whose mass reaches top_p, and
 *                     that prefix is found here by a search on the float bits of its smallest p
 *                     (tau: the largest value whose mass of p >= tau reaches top_p), then the
 *                     lowest ids among the ties at tau by a scan in id order; the mass is the same
 *                     exact number, and so is each renormalized f32(p / mass);
 *   Gumbel-max        draw i is the i-th output of the row's xoshiro256** stream: thread t owns
 *                     ids [tL, tL + L) and starts from the state advanced tL steps, reached by the
 *                     GF(2)-linear jump T^(tL) = the product of T^(L 2^b) over the bits b of t
 *                     (256x256 bit matrices in shared memory, squared level by level); the best
 *                     p_i / E_i with the lower id on ties is a max (exact), and the thread of the
 *                     last id writes the state advanced V steps.
 * The row's workspace holds p (V floats) and the block sums. Nothing is allocated, read back or
 * waited for; a refused row gets its code (dsv4/tensor_ops.h) and keeps its generator state. */
#include "backends/cuda/cuda_device.cuh"
#include "backends/cuda/cuda_ops.h"
#include "core/sample_math.h"
#include "dsv4/engine.h"
#include "dsv4/tensor_ops.h"

#include <limits.h>

enum { THREADS = 1024, WARPS = THREADS / 32 };
#define FULL 0xFFFFFFFFu

struct op_sum {
    template <typename T> DSV4_CU_INLINE T operator()(T a, T b) const { return a + b; }
};
struct op_min {
    template <typename T> DSV4_CU_INLINE T operator()(T a, T b) const { return b < a ? b : a; }
};

/* op over the CTA, the result in every thread. Sums of doubles here are exact (see above), so
 * the tree order is free. */
template <typename T, typename Op> DSV4_CU_INLINE T cta_all(T v, Op op, T *sh)
{
    const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads(); /* sh may still be read by the previous call */
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = sh[l];
#pragma unroll
    for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

/* (v, i) <- the better of (v, i) and (v2, i2): the larger value, the lower id on ties. */
template <typename T> DSV4_CU_INLINE void take_best(T &v, long long &i, T v2, long long i2)
{
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

template <typename T> DSV4_CU_INLINE void cta_best(T &v, long long &i, T *shv, long long *shi)
{
    const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1) take_best(v, i, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, i, o));
    __syncthreads();
    if (l == 0) shv[w] = v, shi[w] = i;
    __syncthreads();
    v = shv[l];
    i = shi[l];
#pragma unroll
    for (int o = 16; o; o >>= 1) take_best(v, i, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, i, o));
}

/* The sum of v over the threads before this one. */
DSV4_CU_INLINE long long cta_exclusive(long long v, long long *sh)
{
    const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
    long long inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const long long n = __shfl_up_sync(FULL, inc, o);
        if (l >= o) inc += n;
    }
    __syncthreads();
    if (l == 31) sh[w] = inc;
    __syncthreads();
    long long before = inc - v;
    for (int k = 0; k < w; k++) before += sh[k];
    return before;
}

/* s <- M s over GF(2): column j of M (m[j], 256 bits) is the image of state bit j. */
DSV4_CU_INLINE void gf2_apply(const uint64_t (*m)[4], uint64_t s[4])
{
    uint64_t y[4] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint64_t word = s[w];
        while (word) {
            const int bit = __ffsll((long long)word) - 1;
            word &= word - 1;
            const uint64_t *c = m[w * 64 + bit];
            y[0] ^= c[0], y[1] ^= c[1], y[2] ^= c[2], y[3] ^= c[3];
        }
    }
    s[0] = y[0], s[1] = y[1], s[2] = y[2], s[3] = y[3];
}

__global__ void __launch_bounds__(THREADS) sample_kernel(const float *logits, long long ldl, long long V,
                                                         const dsv4_sampling *params, uint64_t *rng, int32_t *tokens,
                                                         long long tok_s, uint8_t *ws, long long ws_row)
{
    __shared__ uint64_t mat[2][256][4];
    __shared__ double shd[WARPS];
    __shared__ float shf[WARPS];
    __shared__ long long shl[WARPS], shi[WARPS];
    __shared__ double sh_sum;
    const long long r = blockIdx.x;
    const int tid = threadIdx.x;
    const float *x = logits + r * ldl;
    const dsv4_sampling sp = params[r];
    int32_t *tok = tokens + r * tok_s;
    if (!(sp.temperature >= 0.0f && isfinite(sp.temperature) && sp.top_p >= 0.0f)) {
        if (tid == 0) *tok = DSV4_SAMPLE_BAD_PARAMS;
        return;
    }
    uint64_t st[4]; /* read before any thread can write the row's state back */
    for (int k = 0; k < 4; k++) st[k] = rng[4 * r + k];

    /* the rule, and the max (first id on ties) */
    long long bad = LLONG_MAX, finite = 0, bi = LLONG_MAX;
    float bv = -INFINITY;
    for (long long i = tid; i < V; i += THREADS) {
        const float v = x[i];
        if (isfinite(v)) finite = 1;
        else if (v != -INFINITY && bad == LLONG_MAX) bad = i;
        if (v > bv) bv = v, bi = i;
    }
    bad = cta_all(bad, op_min(), shl);
    finite = cta_all(finite, op_sum(), shl);
    if (bad < V) {
        if (tid == 0) *tok = (int32_t)(isnan(x[bad]) ? DSV4_SAMPLE_NAN_LOGIT(bad) : DSV4_SAMPLE_INF_LOGIT(bad));
        return;
    }
    if (!finite) {
        if (tid == 0) *tok = DSV4_SAMPLE_ALL_MASKED;
        return;
    }
    cta_best(bv, bi, shf, shi);
    if (sp.temperature == 0.0f) {
        if (tid == 0) *tok = (int32_t)bi;
        return;
    }

    /* softmax */
    float *p = (float *)(ws + r * ws_row);
    double *bsum = (double *)(ws + r * ws_row + ((4 * V + 7) & ~7ll));
    const double m = (double)bv, temp = (double)sp.temperature;
    const long long nb = (V + DSV4_SAMPLE_SUM_BLOCK - 1) / DSV4_SAMPLE_SUM_BLOCK;
    for (long long b = tid; b < nb; b += THREADS) {
        const long long i0 = b * DSV4_SAMPLE_SUM_BLOCK;
        const long long i1 = i0 + DSV4_SAMPLE_SUM_BLOCK < V ? i0 + DSV4_SAMPLE_SUM_BLOCK : V;
        double part = 0.0;
        for (long long i = i0; i < i1; i++) {
            const double e = dsv4_sm_exp(__ddiv_rn(__dsub_rn((double)x[i], m), temp));
            p[i] = __double2float_rn(e);
            part = __dadd_rn(part, e);
        }
        bsum[b] = part;
    }
    __syncthreads();
    if (tid == 0) {
        double s = 0.0;
        for (long long b = 0; b < nb; b++) s = __dadd_rn(s, bsum[b]);
        sh_sum = s;
    }
    __syncthreads();
    const double sum = sh_sum;
    for (long long i = tid; i < V; i += THREADS) p[i] = __double2float_rn(__ddiv_rn((double)p[i], sum));
    __syncthreads();

    /* top-p; threads own contiguous ids from here on */
    const long long L = (V + THREADS - 1) / THREADS, c0 = tid * L, c1 = c0 + L < V ? c0 + L : V;
    const float tp = sp.top_p > 0.0f ? sp.top_p : 1.0f;
    if (tp < 1.0f) {
        const double tpd = (double)tp;
        double low = 0.0;
        for (long long i = tid; i < V; i += THREADS)
            if (p[i] >= DSV4_SAMPLE_P_EXACT) low += (double)p[i];
        low = cta_all(low, op_sum(), shd);
        if (low >= tpd) { /* else the nucleus would reach below 2^-29: every token kept */
            uint32_t lo = __float_as_uint(DSV4_SAMPLE_P_EXACT), hi = __float_as_uint(1.0f); /* p <= 1 */
            while (lo < hi) { /* the largest bits b with mass(p >= b) >= top_p; mass(p >= lo) is */
                const uint32_t mid = lo + (hi - lo + 1) / 2;
                double s = 0.0;
                for (long long i = tid; i < V; i += THREADS)
                    if (__float_as_uint(p[i]) >= mid) s += (double)p[i];
                s = cta_all(s, op_sum(), shd);
                if (s >= tpd) lo = mid;
                else hi = mid - 1;
            }
            const float tau = __uint_as_float(lo);
            const double td = (double)tau;
            double above = 0.0;
            long long ties = 0;
            for (long long i = tid; i < V; i += THREADS) {
                if (p[i] > tau) above += (double)p[i];
                else if (p[i] == tau) ties++;
            }
            above = cta_all(above, op_sum(), shd);
            ties = cta_all(ties, op_sum(), shl);
            /* j: the fewest ties at tau that bring the mass to top_p (every sum exact) */
            long long j = (long long)ceil(__ddiv_rn(__dsub_rn(tpd, above), td));
            if (j < 1) j = 1;
            if (j > ties) j = ties;
            while (j > 1 && __dadd_rn(above, __dmul_rn((double)(j - 1), td)) >= tpd) j--;
            while (j < ties && __dadd_rn(above, __dmul_rn((double)j, td)) < tpd) j++;
            const double mass = __dadd_rn(above, __dmul_rn((double)j, td));
            long long mine = 0;
            for (long long i = c0; i < c1; i++) mine += p[i] == tau;
            long long rank = cta_exclusive(mine, shl);
            for (long long i = c0; i < c1; i++) {
                const float q = p[i];
                const bool keep = q > tau || (q == tau && rank++ < j);
                p[i] = keep ? __double2float_rn(__ddiv_rn((double)q, mass)) : 0.0f;
            }
            __syncthreads();
        }
    }

    /* Gumbel-max: the stream jumped to this thread's first id */
    const long long chunks = (V + L - 1) / L;
    if (tid < 256) {
        uint64_t e[4] = {0, 0, 0, 0};
        e[tid >> 6] = 1ull << (tid & 63);
        for (long long k = 0; k < L; k++) dsv4_sm_next(e);
        for (int k = 0; k < 4; k++) mat[0][tid][k] = e[k];
    }
    __syncthreads();
    int cur = 0;
    for (int b = 0; (1ll << b) < chunks; b++) { /* mat[cur] = T^(L 2^b) */
        if ((tid >> b) & 1) gf2_apply(mat[cur], st);
        if ((2ll << b) < chunks && tid < 256) {
            uint64_t c[4] = {mat[cur][tid][0], mat[cur][tid][1], mat[cur][tid][2], mat[cur][tid][3]};
            gf2_apply(mat[cur], c);
            for (int k = 0; k < 4; k++) mat[cur ^ 1][tid][k] = c[k];
        }
        __syncthreads();
        cur ^= 1;
    }
    double gv = -1.0;
    long long gi = LLONG_MAX;
    for (long long i = c0; i < c1; i++) {
        const double ex = dsv4_sm_neg_log(__dsub_rn(1.0, dsv4_sm_uniform(st)));
        const float q = p[i];
        if (!(q > 0.0f)) continue;
        const double v = __ddiv_rn((double)q, ex);
        if (v > gv) gv = v, gi = i;
    }
    if (c0 < V && c1 == V)
        for (int k = 0; k < 4; k++) rng[4 * r + k] = st[k];
    cta_best(gv, gi, shd, shi);
    if (tid == 0) *tok = gi == LLONG_MAX ? 0 : (int32_t)gi;
}

extern "C" int dsv4_cu_sample_launch(const float *logits, long long ldl, long long B, long long V, const void *params,
                                     uint64_t *rng, int32_t *tokens, long long tok_s, void *ws, long long ws_row,
                                     void *stream)
{
    if (B == 0) return 0;
    if (B > 0x7FFFFFFFll) return (int)cudaErrorInvalidConfiguration;
    sample_kernel<<<(unsigned)B, THREADS, 0, (cudaStream_t)stream>>>(logits, ldl, V, (const dsv4_sampling *)params, rng,
                                                                     tokens, tok_s, (uint8_t *)ws, ws_row);
    return (int)cudaGetLastError();
}
