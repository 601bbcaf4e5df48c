/* Launchers of the cuda backend's indexer family as its C glue (indexer_cuda.c) sees them: plain
 * C structs, a cudaError_t returned as int (0 = success), never a synchronization. Pointers are
 * device memory; strides are in elements of the pointed-to type. Per-token candidate counts
 * travel in the launch parameters, DSV4_CU_IX_TOKENS tokens per launch. */
#ifndef DSV4_CUDA_INDEXER_H
#define DSV4_CUDA_INDEXER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_CU_IX_TOKENS 512
#define DSV4_CU_IX_MAX_HEADS 128 /* core/ops_indexer.h DSV4_IX_MAX_HEADS */
#define DSV4_CU_IX_MAX_TOPK 4096 /* the selection sorts its keys in shared memory */

/* out[t][h] = bf16(proj[t][h] * scale), proj BF16 or F32. */
int dsv4_cu_ix_weights_launch(const void *proj, int proj_bf16, long long ld_proj, long long tokens, long long heads,
                              float scale, float *out, long long ld_out, void *stream);

/* The query path of core/ops_indexer.h dsv4_ixq_call (the same fields) for tokens t0 ..
 * t0+tokens-1 at rope rows pos[t - t0]. */
#define DSV4_CU_IXQ_TOKENS 256
typedef struct dsv4_cu_ixq {
    long long t0, tokens, heads;
    int dim, packed;
    const uint16_t *q;
    long long ld_q_t, ld_q_h;
    const float *rope;
    long long ld_rope;
    void *out;
    long long ld_out_t, ld_out_h;
    uint8_t *out_scales;
    long long ld_os_t, ld_os_h;
    int64_t pos[DSV4_CU_IXQ_TOKENS];
    const int64_t *dpos; /* non-NULL: the positions of tokens 0.. on the device (row stride ld_dpos),
                            clamped into the rope_rows rows of the table; pos unused */
    long long ld_dpos, rope_rows;
} dsv4_cu_ixq;

int dsv4_cu_ixq_launch(const dsv4_cu_ixq *a, void *stream);

/* Scores of tokens t0 .. t0+tokens-1 (core/ops_indexer.h dsv4_ix_operands, the same fields):
 * row t gets the n_cache scores, -inf from candidate count[t - t0] on. */
typedef struct dsv4_cu_ix_scores {
    long long t0, tokens, n_cache;
    int heads, dim;
    const uint8_t *q, *q_scales;
    long long ld_q_t, ld_q_h, ld_qs_t, ld_qs_h;
    const float *weights;
    long long ld_w;
    const uint8_t *k, *k_scales;
    long long ld_k, ld_ks;
    int32_t count[DSV4_CU_IX_TOKENS];
    const int64_t *dpos; /* non-NULL: count = min(n_cache, (p + 1) / ratio) of the positions on the
                            device (row stride ld_dpos; p < 0 counts none); count unused */
    long long ld_dpos;
    int ratio;
} dsv4_cu_ix_scores;

int dsv4_cu_ix_scores_launch(const dsv4_cu_ix_scores *a, float *scores, long long ld, void *stream);

/* Top-k of rows t0 .. t0+tokens-1 of scores over their first count[t - t0] candidates. */
typedef struct dsv4_cu_ix_topk {
    long long t0, tokens, topk;
    const float *scores;
    long long ld;
    int32_t *indices;
    long long ld_indices;
    int32_t *lengths;
    long long ld_lengths;
    int32_t count[DSV4_CU_IX_TOKENS];
} dsv4_cu_ix_topk;

int dsv4_cu_ix_topk_launch(const dsv4_cu_ix_topk *a, void *stream);

/* Scores and top-k in one op: s (its count = the candidates), the top-k outputs, and ws, the
 * workspace of tokens * parts rows of topk 64-bit keys (16-byte aligned). */
typedef struct dsv4_cu_ix_select {
    dsv4_cu_ix_scores s;
    long long topk;
    unsigned long long *ws;
    int32_t *indices;
    long long ld_indices;
    int32_t *lengths;
    long long ld_lengths;
} dsv4_cu_ix_select;

int dsv4_cu_ix_select_launch(const dsv4_cu_ix_select *a, int parts, void *stream);

/* The compressor (core/ops_indexer.h dsv4_cmp_call, the same fields; compressor_cuda.cu): the
 * m = (start_pos + n_tokens) / ratio - start_pos / ratio entries from entry start_pos / ratio on,
 * then the state update, both on `stream` in that order (the entries read state rows the update
 * overwrites). */
#define DSV4_CU_CMP_MAX_DIM 1024 /* core/ops_indexer.h DSV4_CMP_MAX_DIM: the entry's shared row */
typedef struct dsv4_cu_cmp {
    int kind, ratio, dim, overlap, fp8_sim, norm_bf16, packed; /* packed: out_mode PACKED */
    float eps;
    long long start_pos, n_tokens;
    const float *kv, *gate;
    long long ld_in_kv, ld_in_gate;
    const float *ape;
    long long ld_ape;
    const void *norm;
    const float *rope;
    long long ld_rope;
    float *state_kv, *state_score;
    long long ld_state_kv, ld_state_score;
    void *out;
    long long ld_out;
    uint8_t *out_scales;
    long long ld_out_scales;
    const int64_t *position; /* non-NULL: start_pos read here (n_tokens 1); entry c at out row c mod out_rows */
    long long out_rows, rope_rows;
} dsv4_cu_cmp;

int dsv4_cu_cmp_launch(const dsv4_cu_cmp *a, void *stream);

/* state_kv[i][j] = 0, state_score[i][j] = -inf for i < rows, j < cols. */
int dsv4_cu_cmp_reset_launch(float *state_kv, long long ld_kv, float *state_score, long long ld_score, long long rows,
                             long long cols, void *stream);

#ifdef __cplusplus
}
#endif
#endif
