/* Launchers of the cuda backend's linear, layer and tensor families as the C glue sees them
 * (linear_cuda.c, layer_cuda.c, tensor_cuda.c): plain C structs, a cudaError_t returned as int
 * (0 = success), never a synchronization. Every pointer is device memory; strides are in elements
 * of the pointed-to type unless named in bytes. */
#ifndef DSV4_CUDA_OPS_H
#define DSV4_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- linear (linear_cuda.cu) ------------------------------------------------------------------ */
/* The staging of the quantized formats (in the caller's work space, from its first 64-byte
 * boundary): this 64-byte description, then rows*k BF16 values, row r at 64 + r*k*2 bytes. A
 * staged value is the dequantized activation e4m3(code)·2^(byte−127) of the act128 or mx32 rule,
 * exact in BF16 (a 4-bit significand times a power of two of the rules' range). */
#define DSV4_CU_STAGE_MAGIC 0x6164757334766473ull /* "sdv4suda" */
typedef struct dsv4_cu_stage_head {
    uint64_t magic;
    long long rows, k;
    int mx32; /* 1: the mx32 rule (MXFP8), 0: act128 (FP8_B128, FP4) */
    int pad[9];
} dsv4_cu_stage_head;

/* After the BF16 rows, for the tensor-core product of linear_cuda.cu (written when k % 32 == 0):
 * at the next 16-byte boundary the codes e4m3(code) as FP16 [rows, k], each run of 8 stored in the
 * order k0 k4 k1 k5 k2 k6 k3 k7 (the pairs an FP4 word decodes into), then at the next 16-byte
 * boundary the scales 2^(byte−127) as f32 [rows, ceil(k / G)] (G = 32 for mx32, else 128): a
 * staged value is code · scale. Byte offsets from the description: */
#ifdef __CUDACC__
#define DSV4_CU_HOST_DEVICE __host__ __device__
#else
#define DSV4_CU_HOST_DEVICE
#endif
DSV4_CU_HOST_DEVICE static inline long long dsv4_cu_stage_codes_offset(long long rows, long long k)
{
    return (long long)sizeof(dsv4_cu_stage_head) + (rows * k * 2 + 15) / 16 * 16;
}
DSV4_CU_HOST_DEVICE static inline long long dsv4_cu_stage_scales_offset(long long rows, long long k)
{
    return dsv4_cu_stage_codes_offset(rows, k) + (rows * k * 2 + 15) / 16 * 16;
}
/* The whole staging (the description included), for either rule. */
DSV4_CU_HOST_DEVICE static inline long long dsv4_cu_stage_bytes(long long rows, long long k)
{
    return dsv4_cu_stage_scales_offset(rows, k) + rows * ((k + 31) / 32) * 4;
}

/* Quantize rows (m, g) of x (F32 or BF16; row (m, g) at x + m*xs_m + g*xs_g) into the staging
 * (staged row m*groups + g) and write its description. */
int dsv4_cu_stage_launch(const void *x, int x_bf16, long long xs_m, long long xs_g, long long m, long long groups,
                         long long k, int mx32, void *head, void *stream);

/* The MoE's stagings fused with the kernel before them (linear_cuda.cu stage_kernel's sources):
 * sorted row i of x [.., k] gathered from token order[i] / topk's row (order[i] < 0: a zero row),
 * the rows moe_cuda.cu's gather would write; or row i of swiglu(g, u)·w[i] (w NULL: 1, clamp at
 * limit), the rows layer_cuda.cu's swiglu kernel would write. Bit for bit the staging of those. */
int dsv4_cu_stage_gather_launch(const uint16_t *x, long long ldx, const int32_t *order, int topk, long long R,
                                long long k, int mx32, void *head, void *stream);
int dsv4_cu_stage_swiglu_launch(const uint16_t *g, long long ldg, const uint16_t *u, long long ldu, const float *w,
                                float limit, long long rows, long long n, int mx32, void *head, void *stream);

typedef struct dsv4_cu_linear {
    int fmt; /* dsv4_linear_format */
    long long groups, m, n, k;
    const void *x; /* quantized formats: the staged rows; BF16/F32: the caller's x */
    int x_bf16;    /* BF16/F32 weights: x is BF16 (else F32) */
    long long xs_m, xs_g;
    const void *w;
    long long ws_r_bytes;
    const uint8_t *scale;
    long long ss0, ss1;
    const void *bias;
    int bias_bf16;
    long long bias_s;
    void *y;
    int y_bf16;
    long long ys_m, ys_g;
    /* quantized formats: the staging's FP16 codes and scales (staged row r = m*groups + g at
     * xcodes + r*k, xscales + r*ceil(k/G)); NULL: the fp32 path only */
    const uint16_t *xcodes;
    const float *xscales;
} dsv4_cu_linear;

int dsv4_cu_linear_launch(const dsv4_cu_linear *a, void *stream);

/* 1: the linear family's and the MoE's kernels are launched as programmatic dependents of the
 * kernel before them ($DSV4_CUDA_LINEAR_PDL, default 1; linear_cuda.cu "launches"). */
int dsv4_cu_linear_pdl(void);

/* Up to DSV4_CU_MOE_CHUNK experts e0 .. e0+n-1 of one MoE product: their weights and scales (the
 * layout, strides included, that of a->w / a->scale), and offsets [E + 1] in device memory, the
 * sorted rows of expert e being [offsets[e], offsets[e+1]) of x (row stride xs_m) and of y. The
 * tables travel as a kernel parameter (8 KB; parameters above 4 KB need CUDA 12.1). */
#define DSV4_CU_MOE_CHUNK 256
typedef struct dsv4_cu_moe_chunk {
    const void *w[2][DSV4_CU_MOE_CHUNK]; /* `sets` weight sets on the same x (w1 and w3, or one) */
    const uint8_t *s[2][DSV4_CU_MOE_CHUNK];
    void *y[2]; /* set j's y (a->y unused) */
    const int32_t *offsets;
    int e0, n, sets;
} dsv4_cu_moe_chunk;

/* a->m: the R sorted rows in all (> 0); a->groups must be 1, a->x BF16. */
int dsv4_cu_moe_linear_launch(const dsv4_cu_linear *a, const dsv4_cu_moe_chunk *mo, void *stream);

/* ---- formats family (formats_cuda.cu) ---------------------------------------------------------- */
/* out [n, k] F32 (row stride ldo) = the FP8 E4M3 codes w [n, k] (fp4 = 0; scale element (i/128,
 * j/128) at scale[(i/128)*ss0 + (j/128)*ss1]) or the packed FP4 codes w [n, k/2] (fp4 = 1; low
 * nibble first; scale (i, j/32)) times their UE8M0 scales; row stride ldw bytes. */
int dsv4_cu_dequant_weight_launch(int fp4, const uint8_t *w, long long ldw, long long n, long long k,
                                  const uint8_t *scale, long long ss0, long long ss1, float *out, long long ldo,
                                  void *stream);

/* ---- tensor family (tensor_cuda.cu) ----------------------------------------------------------- */
int dsv4_cu_embed_launch(const uint16_t *table, long long ldt, long long v, long long d, const int32_t *ids, long long ids_s,
                         long long t, uint16_t *out, long long so_t, long long so_j, long long copies, void *stream);
int dsv4_cu_add_bf16_launch(long long t, long long n, long long d, const uint16_t *a, long long sa_t, long long sa_j,
                            const uint16_t *b, long long sb_t, uint16_t *y, long long sy_t, long long sy_j,
                            void *stream);
int dsv4_cu_copy_rows_launch(const void *src, long long lds, const int32_t *idx, long long idx_s, void *dst,
                             long long ldd, long long n, long long row_bytes, void *stream);
int dsv4_cu_paged_slots_launch(const int32_t *table, long long n_blocks, long long block_size, const int32_t *entries,
                               long long es, int32_t *slots, long long ss, long long n, void *stream);

/* The sample entry of the tensor family (sample_cuda.cu; core/ops_tensor.h dsv4_sample_args, the
 * same fields; params: dsv4_sampling [B]). */
int dsv4_cu_sample_launch(const float *logits, long long ldl, long long B, long long V, const void *params,
                          uint64_t *rng, int32_t *tokens, long long tok_s, void *ws, long long ws_row, void *stream);

/* ---- layer family (layer_cuda.cu) ------------------------------------------------------------- */
int dsv4_cu_rms_launch(const void *x, long long ldx, int x_bf16, const void *w, int w_bf16, void *y, long long ldy,
                       int y_bf16, long long rows, long long d, float eps, void *stream);
int dsv4_cu_swiglu_launch(const uint16_t *g, long long ldg, const uint16_t *u, long long ldu, const float *w,
                          uint16_t *h, long long ldh, long long rows, long long n, float limit, void *stream);
/* T tokens x n (1..8) streams of D: the hc_post of core/ops_layer.h. */
int dsv4_cu_hc_post_launch(long long T, long long D, int n, const uint16_t *x, long long ldx, const uint16_t *res,
                           long long res_t, long long res_j, const float *post, long long post_t, const float *comb,
                           long long comb_t, long long comb_j, uint16_t *out, long long out_t, long long out_j,
                           void *stream);
/* hc_pre (nmix = (2+n)·n) or hc_head (nmix = n: post_out and comb_out unused) of core/ops_layer.h
 * on the streams x [T, n, D]; y's rows serve as the scratch of the partial sums first. */
typedef struct dsv4_cu_hc_pre {
    long long T, D;
    int n, nmix;
    const float *fn;
    long long ldfn;
    const float *scale, *base;
    int iters;
    float eps, norm_eps;
    const uint16_t *x;
    long long x_t, x_j;
    uint16_t *y;
    long long ldy;
    float *post_out;
    long long post_t;
    float *comb_out;
    long long comb_t, comb_j;
} dsv4_cu_hc_pre;

/* Slices of the streams the dots are cut into (< 1: D too small for y to hold the partials). */
int dsv4_cu_hc_slices(long long D, int nmix);
int dsv4_cu_hc_pre_launch(const dsv4_cu_hc_pre *a, void *stream);

/* The router of core/ops_layer.h (dsv4_route_args, the same fields): a cluster of 8 CTAs per
 * token (layer_cuda.cu). */
#define DSV4_CU_ROUTE_MAX_EXPERTS 1024
#define DSV4_CU_ROUTE_MAX_TOPK 16
typedef struct dsv4_cu_route {
    const void *x;
    long long ldx;
    int x_bf16;
    const void *w;
    long long ldw;
    int w_bf16;
    const float *bias;
    const void *tid2eid;
    long long ldtid, V;
    int tid_i64;
    const void *token_ids;
    long long tok_stride;
    int tok_i64;
    int32_t *ids;
    long long ldids;
    float *weights;
    long long ldweights;
    long long T, D;
    int E, topk;
    float route_scale;
} dsv4_cu_route;

int dsv4_cu_route_launch(const dsv4_cu_route *a, void *stream);

/* ---- MoE block (moe_cuda.cu): the device side of core/ops_layer.h's dsv4_moe_args ------------- */
/* One CTA: the stable counting sort of the T*k pairs by expert (ids outside [0, E) dropped: pos
 * -1), offsets [E + 1], order / wsorted [R] (rows past the last kept pair: order -1, weight 0);
 * E <= DSV4_CU_MOE_MAX_EXPERTS (an expert's count per thread of the CTA). */
#define DSV4_CU_MOE_MAX_EXPERTS 1023
int dsv4_cu_moe_group_launch(const int32_t *ids, long long ldids, const float *weights, long long ldweights,
                             long long T, int k, int E, int32_t *offsets, int32_t *order, int32_t *pos,
                             float *wsorted, void *stream);
/* xg [R, D] = x[order[i] / k] (zeros where order[i] < 0). */
int dsv4_cu_moe_gather_launch(const uint16_t *x, long long ldx, const int32_t *order, int k, long long R,
                              long long D, uint16_t *xg, void *stream);
/* y[t] = bf16(Σ out[pos[p]] over t's kept pairs in ascending (expert, slot) + shared[t]); split:
 * a token's elements over several CTAs (0: one CTA a token, the old launch; the same bits). */
int dsv4_cu_moe_combine_launch(const int32_t *ids, long long ldids, const int32_t *pos, int k, int E,
                               const uint16_t *out, const uint16_t *shared, long long T, long long D, uint16_t *y,
                               long long ldy, int split, void *stream);

#ifdef __cplusplus
}
#endif
#endif
