/* Compressor and lightning-indexer kernels of the cpu backends (include/dsv4/indexer.h).
 *
 * Both backends run the same drivers (indexer_cpu.c, compressor_cpu.c) over a kernel set:
 * cpu-ref uses the scalar set, cpu the best ISA's. The vector kernels repeat the scalar ones
 * operation for operation (same exp polynomial, same per-channel and per-lane summation order,
 * exact integer dot products), so the two backends agree to the bit and the tests compare them
 * exactly. Everything outside the kernels (norm, RoPE, FP8/FP4 rounding, top-k) is shared code. */
#ifndef DSV4_CPU_INDEXER_H
#define DSV4_CPU_INDEXER_H

#include "core/ops_indexer.h"
#include "formats/codec.h"

#include <math.h>

/* ---- shared scalar math ------------------------------------------------------------------ */

/* exp(x) for the pooling softmax: Cephes-style range reduction and degree-6 polynomial with
 * fused multiply-adds (relative error ~2e-7); x <= -87 gives 0 (so -inf gives exactly 0), x > 88
 * is clamped, NaN stays NaN. The vector kernels compute the same operations lane by lane. */
#define DSV4_EXP_LOG2E 1.44269504f
#define DSV4_EXP_LN2_HI 0.693359375f
#define DSV4_EXP_LN2_LO (-2.12194440e-4f)
#define DSV4_EXP_P0 1.9875691500e-4f
#define DSV4_EXP_P1 1.3981999507e-3f
#define DSV4_EXP_P2 8.3334519073e-3f
#define DSV4_EXP_P3 4.1665795894e-2f
#define DSV4_EXP_P4 1.6666665459e-1f
#define DSV4_EXP_P5 5.0000001201e-1f
static inline float dsv4_ix_expf(float x)
{
    if (!(x > -87.0f)) return x != x ? x : 0.0f;
    if (x > 88.0f) x = 88.0f;
    float n = nearbyintf(x * DSV4_EXP_LOG2E);
    float r = fmaf(n, -DSV4_EXP_LN2_HI, x);
    r = fmaf(n, -DSV4_EXP_LN2_LO, r);
    float p = fmaf(DSV4_EXP_P0, r, DSV4_EXP_P1);
    p = fmaf(p, r, DSV4_EXP_P2);
    p = fmaf(p, r, DSV4_EXP_P3);
    p = fmaf(p, r, DSV4_EXP_P4);
    p = fmaf(p, r, DSV4_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    return y * dsv4_bits_f32((uint32_t)((int32_t)n + 127) << 23);
}

/* 2 x the E2M1 value of a code, as an integer in [-12, 12]. */
static const int8_t dsv4_ix_fp4x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/* 2^(b-128) = half the UE8M0 scale (NaN for 255): FP4 values x2 times this are exact. */
static inline float dsv4_ix_half_scale(uint8_t b) { return dsv4_e8m0_to_f32(b) * 0.5f; }

/* The 16 score lanes added as a tree: i + i+8, i + i+4, i + i+2, i + i+1. */
static inline float dsv4_ix_lane_tree(float *l)
{
    for (int w = 8; w >= 1; w >>= 1)
        for (int i = 0; i < w; i++) l[i] = l[i] + l[i + w];
    return l[0];
}

/* ---- kernel sets ------------------------------------------------------------------------- */

/* A query row prepared for the vector scoring kernels: heads padded to a multiple of 16 with
 * zero weight and zero values. Quads (4 consecutive bytes) of a head's d values are stored in a
 * permuted element order matching the cache decode: quad m < d/8 holds the low nibbles (even
 * elements) of packed bytes 4m..4m+3, quad d/8 + m their high nibbles (odd elements). */
typedef struct dsv4_ix_qprep {
    int heads, hpad, dim;
    _Alignas(64) int8_t qi[DSV4_IX_MAX_DIM * DSV4_IX_MAX_HEADS]; /* [d/4][hpad][4], 2 x value */
    _Alignas(64) float qs[DSV4_IX_MAX_DIM / 32 * DSV4_IX_MAX_HEADS];   /* [d/32][hpad], 2^(e-1) */
    _Alignas(64) int32_t corr[DSV4_IX_MAX_DIM / 32 * DSV4_IX_MAX_HEADS]; /* [d/32][hpad], -12 x group sum */
    _Alignas(64) float w[DSV4_IX_MAX_HEADS];
} dsv4_ix_qprep;

void dsv4_ix_qprep_build(dsv4_ix_qprep *qp, const dsv4_ix_operands *o, int64_t t);

typedef struct dsv4_ix_kernels {
    /* Per-channel softmax pooling: v[e] = Σ_j w_j a_j[e] / Σ_j w_j, w_j = exp(s_j[e] - max_j s_j[e]),
     * s_j = g_j[e] (+ ape_j[e] when ape_j != NULL); rows j in order. */
    void (*pool)(int nrows, const float *const *a, const float *const *g, const float *const *ape, int d, float *v);
    /* In-place unnormalized Walsh–Hadamard transform, stages h = 1, 2, 4, … */
    void (*fwht)(float *x, int d);
    /* Scores of candidates c0..c0+n-1 for query token t (qp = its prepared row when needs_qprep). */
    void (*score_run)(const dsv4_ix_operands *o, int64_t t, const dsv4_ix_qprep *qp, int64_t c0, int64_t n,
                      float *out);
    int needs_qprep;
} dsv4_ix_kernels;

extern const dsv4_ix_kernels dsv4_ix_kernels_scalar;
extern const dsv4_ix_kernels dsv4_ix_kernels_avx2;
extern const dsv4_ix_kernels dsv4_ix_kernels_avx512; /* needs AVX-512 VNNI */

/* Scalar pieces (indexer_ref.c). */
void dsv4_ix_ref_pool(int nrows, const float *const *a, const float *const *g, const float *const *ape, int d, float *v);
void dsv4_ix_ref_fwht(float *x, int d);
float dsv4_ix_ref_score(const dsv4_ix_operands *o, int64_t t, int64_t c);

/* Shared post-processing (indexer_common.c). x holds d values (BF16-exact floats). */
/* GPT-J RoPE of x[0..63] with a cos||sin row, each result rounded to BF16. */
void dsv4_ix_rope64(float *x, const float *cs);
/* Hadamard (x d^-0.5, BF16) then FP4 rule fp4_32: packed codes [d/2] + scales [d/32], or BF16 values. */
void dsv4_ix_hadamard_fp4(const dsv4_ix_kernels *kn, float *x, int d, uint8_t *codes, uint8_t *scales,
                          uint16_t *values);

/* The op tables. */
extern const struct dsv4_indexer_ops dsv4_cpu_indexer_ops;
extern const struct dsv4_indexer_ops dsv4_cpu_ref_indexer_ops;

/* Compressor driver (compressor_cpu.c) and the query path driver, shared by both tables. */
/* A driver's loop on the context's pool (core/pool.h): the kernels and the call. */
typedef struct dsv4_ix_job {
    const dsv4_ix_kernels *kn;
    const void *call; /* dsv4_cmp_call or dsv4_ixq_call */
} dsv4_ix_job;
dsv4_status dsv4_cmp_run(const dsv4_ix_kernels *kn, const dsv4_exec *ex, const dsv4_cmp_call *c);
/* The compress_reset entry of both cpu backends (plain loops). */
dsv4_status dsv4_cmp_reset(const dsv4_exec *ex, float *state_kv, int64_t ld_kv, float *state_score, int64_t ld_score,
                           int64_t rows, int64_t cols);
dsv4_status dsv4_ixq_run(const dsv4_ix_kernels *kn, const dsv4_exec *ex, const dsv4_ixq_call *c);

/* Top-k selection (indexer_topk.c). Keys order (score, -index) totally: larger key = better. */
static inline uint64_t dsv4_ix_key(float s, int64_t idx)
{
    uint32_t u = dsv4_f32_bits(s);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) u = 0xFF800000u; /* NaN ranks as -inf */
    if (u == 0x80000000u) u = 0;                            /* -0 ties with +0 */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)~(uint32_t)idx;
}
static inline int32_t dsv4_ix_key_index(uint64_t key) { return (int32_t)~(uint32_t)key; }

/* A streaming selection buffer: keeps (at least) the `k` best keys admitted so far. */
typedef struct dsv4_ix_stream {
    uint64_t *keys; /* capacity 2k */
    int64_t n, k;
    uint64_t thr;   /* keys <= thr can no longer make the top k */
} dsv4_ix_stream;

void dsv4_ix_stream_init(dsv4_ix_stream *s, uint64_t *keys, int64_t k);
/* Offer the scores of candidates c0..c0+n-1. */
void dsv4_ix_stream_push(dsv4_ix_stream *s, const float *scores, int64_t c0, int64_t n);
/* Reduce to min(k, count) keys, the best ones; returns the count. */
int64_t dsv4_ix_stream_finish(dsv4_ix_stream *s);
/* Rearrange keys[0..n) so that the first min(n, k) are the best; returns min(n, k). */
int64_t dsv4_ix_keep_best(uint64_t *keys, int64_t n, int64_t k);
/* Sort keys descending, write indices (and -1 fill) and the length. */
void dsv4_ix_emit(uint64_t *keys, int64_t n, const dsv4_topk_out *out, int64_t t);
/* Reference selection with a binary min-heap of k keys (no streaming buffer). */
void dsv4_ix_heap_push(uint64_t *heap, int64_t *size, int64_t k, uint64_t key);

/* Workspace: per thread a count and 2k keys. */
size_t dsv4_ix_workspace_size(const dsv4_exec *ex, int64_t tokens, int64_t topk);

#endif
