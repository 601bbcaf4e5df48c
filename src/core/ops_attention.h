/* Attention op family (docs/kernels.md §1-§4): RoPE tables, fused q-norm + RoPE + FP8 KV insert, dequant-gather,
 * sparse MLA decode (FlashMLA semantics, docs/contracts.md §5-§6), inverse RoPE.
 *
 * Entry points get raw pointers that the op layer (src/ops/attention.c) has validated: shapes,
 * dtypes, unit inner strides, non-overlap, and, when the data is in host memory, every index
 * range (slots < num_slots, 0 <= positions < max_pos, 0 <= lengths <= width). A device backend
 * cannot have its index data read by the op layer, so it gets the bounds and must never touch
 * memory outside them: an insert slot >= num_slots is skipped, a position outside [0, max_pos)
 * leaves that row as it was, a length outside [0, width] is clamped. Every pointer of data
 * (q, kv, cache pages, indices, lengths, positions, slots, rope table, sink, outputs, workspace)
 * lives in the backend's memory; the structs themselves and the `freq` array are host memory.
 * Strides are in elements of the pointed-to type; cache strides are in bytes.
 *
 * Cache entry (docs/contracts.md §5, "MODEL1"): 448 E4M3 codes (dims 0..447) + 64 BF16 (dims 448..511) =
 * 576 data bytes at page + row*576; 7 UE8M0 scale bytes + 1 zero pad byte at
 * page + block_size*576 + row*8. slot = page*block_size + row; a negative slot is "no entry". */
#ifndef DSV4_CORE_OPS_ATTENTION_H
#define DSV4_CORE_OPS_ATTENTION_H

#include "core/backend.h"
#include "dsv4/attention.h"

/* One paged FP8 cache as kernels see it. For the BF16 workspace of sparse_attn_bf16 the same
 * struct describes plain rows: block_size 1, page_stride = row stride in bytes (>= 1024),
 * num_slots = rows, each row 512 BF16 at pages + slot*page_stride. */
typedef struct dsv4_kv_geom {
    uint8_t *pages;      /* page 0 */
    int64_t page_stride; /* bytes from one page to the next, >= block_size*584 */
    int64_t block_size;  /* entries per page */
    int64_t num_slots;   /* num_pages * block_size; an index >= num_slots is masked */
} dsv4_kv_geom;

/* One scope of a sparse decode: query t attends to indices[t*ld + j] for j < lengths[t]
 * (lengths NULL: all `width`); inside that prefix an index < 0 or >= cache.num_slots is masked.
 * Entries at j >= lengths[t] are never read. */
typedef struct dsv4_attn_scope {
    dsv4_kv_geom cache;
    const int32_t *indices; /* [t, width], row stride ld */
    int64_t ld;
    int64_t width;
    const int32_t *lengths; /* [t] or NULL */
} dsv4_attn_scope;

/* The query/output side of a sparse decode.
 * q, out: BF16 [t, h, 512], element (i, j, d) at i*st + j*sh + d. lse: F32 [t, h] at
 * i*lse_st + j*lse_sh, or NULL. sink: F32 [h] or NULL (= no sink, same as -inf).
 * out[i, j] = sum_e exp(s_e) k_e / (sum_e exp(s_e) + exp(sink_j)), s_e = scale * <q, k_e>;
 * lse = ln sum_e exp(s_e) (sink excluded); no valid entry: out = +0.0, lse = +inf.
 * workspace: at least decode_workspace(t, h, total width) bytes (may be NULL when that is 0). */
typedef struct dsv4_attn_args {
    const uint16_t *q;
    int64_t q_st, q_sh;
    int64_t t, h;
    const float *sink;
    float scale;
    uint16_t *out;
    int64_t o_st, o_sh;
    float *lse;
    int64_t lse_st, lse_sh;
    void *workspace;
    size_t workspace_bytes;
} dsv4_attn_args;

struct dsv4_attention_ops {
    /* table F32 [max_pos, 64] contiguous: row p = cos(p*f_0..f_31) || sin(p*f_0..f_31), angles
     * and trigonometry in double, rounded once to float. freq: 32 doubles (host memory). */
    dsv4_status (*rope_table)(const dsv4_exec *ex, const double *freq, int64_t max_pos, float *table);

    /* KV side: for i < n: k = kv[i*ld_kv .. +512] (BF16); if positions: GPT-J rotate dims 448..511
     * by row positions[i] of rope (fp32 math, round to BF16), else take k as is; quantize per
     * docs/contracts.md §4 (KV64) and write the 584-byte entry at slots[i] (skip when < 0). */
    dsv4_status (*kv_insert)(const dsv4_exec *ex, const uint16_t *kv, int64_t ld_kv, int64_t n, const int64_t *slots,
                             const int64_t *positions, const float *rope, int64_t max_pos, const dsv4_kv_geom *cache);

    /* q BF16 [n, h, 512] in place (element (i, j, d) at i*q_st + j*q_sh + d): per head, in fp32,
     * r = 1/sqrt(sum_d q^2 / 512 + eps), dims < 448 -> bf16(q*r), dims 448..511 -> GPT-J rotation
     * of (q*r) at positions[i], rounded once. Then kv_insert(kv, ld_kv, n_ins, slots, positions)
     * for the first n_ins <= n tokens. */
    dsv4_status (*qnorm_rope_kv_insert)(const dsv4_exec *ex, uint16_t *q, int64_t q_st, int64_t q_sh, int64_t n,
                                        int64_t h, const uint16_t *kv, int64_t ld_kv, int64_t n_ins,
                                        const int64_t *slots, const int64_t *positions, const float *rope,
                                        int64_t max_pos, float eps, const dsv4_kv_geom *cache);

    /* out BF16 [s, 512] (row stride ld_out) = dequantized entries at slots[i]; slot < 0 -> zeros
     * (the op layer guarantees slot < num_slots for host data; device backends write zeros there). */
    dsv4_status (*dequant_gather)(const dsv4_exec *ex, const dsv4_kv_geom *cache, const int32_t *slots, int64_t s,
                                  uint16_t *out, int64_t ld_out);

    /* Scratch bytes sparse_mla_decode / sparse_attn_bf16 need for t queries of h heads whose
     * scopes have `width` index columns in total. Must not depend on the thread count, and must
     * never decrease as t or width grows: callers plan the largest call once and use the buffer
     * for every smaller one (tests/c/test_backend_ops.c sweeps it). */
    size_t (*decode_workspace)(const dsv4_exec *ex, int64_t t, int64_t h, int64_t width);

    /* Sparse MLA decode over one or two FP8 scopes (n_scopes 1 or 2); see dsv4_attn_args. */
    dsv4_status (*sparse_mla_decode)(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scopes,
                                     int n_scopes);

    /* The second pass of the two-pass design (docs/kernels.md §3.4): the same attention over one
     * scope whose entries are BF16 rows (scope->cache describes rows, see dsv4_kv_geom). */
    dsv4_status (*sparse_attn_bf16)(const dsv4_exec *ex, const dsv4_attn_args *a, const dsv4_attn_scope *scope);

    /* o BF16 [t, h, 512] in place: dims 448..511 rotated by -theta of positions[i] (fp32 math:
     * a' = a*c + b*s, b' = b*c - a*s), rounded once. */
    dsv4_status (*inv_rope)(const dsv4_exec *ex, uint16_t *o, int64_t st, int64_t sh, int64_t t, int64_t h,
                            const int64_t *positions, const float *rope, int64_t max_pos);
};

#endif
