/* Indexer op family: compressor, lightning-indexer query path, head weights, scores, top-k
 * (include/dsv4/indexer.h). Entry points get raw pointers the op layer has validated; row
 * strides are in elements of the pointed-to type, inner strides are 1. */
#ifndef DSV4_CORE_OPS_INDEXER_H
#define DSV4_CORE_OPS_INDEXER_H

#include "core/backend.h"
#include "dsv4/indexer.h"

/* The largest sizes the kernels take (op-layer limits). */
#define DSV4_IX_MAX_HEADS 128
#define DSV4_IX_MAX_DIM 256       /* indexer head dim (q, k, indexer compressor) */
#define DSV4_CMP_MAX_DIM 1024     /* main compressor d */
#define DSV4_CMP_MAX_RATIO 512

/* Where a compressor writes its entries. */
typedef enum dsv4_cmp_out {
    DSV4_CMP_OUT_BF16 = 0,   /* BF16 [m, d] values */
    DSV4_CMP_OUT_PACKED = 1  /* indexer kind: FP4 codes [m, d/2] + E8M0 scales [m, d/32] */
} dsv4_cmp_out;

typedef struct dsv4_cmp_call {
    int kind, ratio, dim, overlap, fp8_sim; /* overlap: coff = 2, else 1 */
    float eps;
    int64_t start_pos, n_tokens;
    const float *kv, *gate;    /* [n, coff*d], row strides ld_in_kv, ld_in_gate */
    int64_t ld_in_kv, ld_in_gate;
    const float *ape;          /* [ratio, coff*d] */
    int64_t ld_ape;
    const void *norm;          /* [d], BF16 (norm_bf16) or F32 */
    int norm_bf16;
    const float *rope;         /* [max_pos, 64] */
    int64_t ld_rope;
    float *state_kv, *state_score; /* [coff*ratio, coff*d] */
    int64_t ld_state_kv, ld_state_score;
    dsv4_cmp_out out_mode;
    void *out;                 /* uint16 (BF16) or uint8 codes */
    int64_t ld_out;
    uint8_t *out_scales;
    int64_t ld_out_scales;
    /* Set only on a device (the CPU op layer reads it): the one token's position in the device's
     * memory (start_pos 0, n_tokens 1); its entry c, if it emits one, goes to out row c mod
     * out_rows, and an entry whose rope row c*ratio is past max_pos (rope_rows) is not written. */
    const int64_t *position;
    int64_t out_rows, rope_rows;
} dsv4_cmp_call;

typedef struct dsv4_ixq_call {
    int64_t tokens, heads;
    int dim;
    const uint16_t *q;         /* [T, H, d]: element (t, h, i) at t*ld_q_t + h*ld_q_h + i */
    int64_t ld_q_t, ld_q_h;
    const void *positions;     /* [T], int32 or int64: host memory, or with pos_device int64 in the
                                  device's memory, clamped there into the table's rope_rows rows */
    int pos_i64, pos_device;
    int64_t ld_pos, rope_rows;
    const float *rope;
    int64_t ld_rope;
    int packed;                /* 1: codes + scales, 0: BF16 values in out */
    void *out;
    int64_t ld_out_t, ld_out_h;
    uint8_t *out_scales;
    int64_t ld_os_t, ld_os_h;
} dsv4_ixq_call;

/* Scoring operands (same meaning as dsv4_indexer_args, as raw views). */
typedef struct dsv4_ix_operands {
    int64_t tokens, heads, n_cache;
    int dim, ratio;
    const uint8_t *q, *q_scales;       /* [T, H, d/2], [T, H, d/32] */
    int64_t ld_q_t, ld_q_h, ld_qs_t, ld_qs_h;
    const float *weights;              /* [T, H] */
    int64_t ld_w;
    const uint8_t *k, *k_scales;       /* [N, d/2], [N, d/32] */
    int64_t ld_k, ld_ks;
    const void *positions;             /* host memory; pos_device: int64 in the device's memory, */
    int pos_i64, pos_device;           /* n_t clamped there to [0, N] */
    int64_t ld_pos;
} dsv4_ix_operands;

/* Where top-k results go. */
typedef struct dsv4_topk_out {
    int64_t topk;
    int32_t *indices;                  /* [T, topk] */
    int64_t ld_indices;
    int32_t *lengths;                  /* [T], stride ld_lengths */
    int64_t ld_lengths;
    void *workspace;
    size_t workspace_bytes;
} dsv4_topk_out;

struct dsv4_indexer_ops {
    dsv4_status (*compress)(const dsv4_exec *ex, const dsv4_cmp_call *c);
    /* The fresh compressor state in the backend's memory: state_kv[i][j] = 0, state_score[i][j] =
     * -inf for i < rows, j < cols (row strides ld_kv, ld_score). */
    dsv4_status (*compress_reset)(const dsv4_exec *ex, float *state_kv, int64_t ld_kv, float *state_score,
                                  int64_t ld_score, int64_t rows, int64_t cols);
    dsv4_status (*index_q)(const dsv4_exec *ex, const dsv4_ixq_call *c);
    /* out[t][h] = bf16(proj[t][h] * scale); proj BF16 (proj_bf16) or F32. */
    dsv4_status (*head_weights)(const dsv4_exec *ex, const void *proj, int proj_bf16, int64_t ld_proj, int64_t tokens,
                                int64_t heads, float scale, float *out, int64_t ld_out);
    dsv4_status (*scores)(const dsv4_exec *ex, const dsv4_ix_operands *o, float *scores, int64_t ld_scores);
    dsv4_status (*select)(const dsv4_exec *ex, const dsv4_ix_operands *o, const dsv4_topk_out *out);
    /* scores [T, N] (row stride ld), n_valid [T] (NULL: N for all). */
    dsv4_status (*topk)(const dsv4_exec *ex, const float *scores, int64_t ld, int64_t tokens, int64_t n,
                        const int32_t *n_valid, int64_t ld_valid, const dsv4_topk_out *out);
    /* Bytes of topk's workspace; never decreases as tokens or topk grows (callers plan the
     * largest call once). */
    size_t (*workspace_size)(const dsv4_exec *ex, int64_t tokens, int64_t topk);
};

#endif
