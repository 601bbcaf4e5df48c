/* Tensor op family (include/dsv4/tensor_ops.h): data movement, and the sampling of rows of
 * logits. The op layer (src/ops/tensor_ops.c) has validated shapes, dtypes, strides, memories and
 * overlaps; index tensors are the entries' to read: an entry out of range fails (DSV4_ERR_RANGE)
 * before anything is written. Strides are in elements except where named in bytes. */
#ifndef DSV4_CORE_OPS_TENSOR_H
#define DSV4_CORE_OPS_TENSOR_H

#include "core/backend.h"
#include "dsv4/tensor_ops.h"

/* out[t*so_t + j*so_j + d] = table[ids[t*ids_s]*ldt + d] for t < T, j < copies, d < D. */
typedef struct dsv4_embed_args {
    const uint16_t *table;
    int64_t ldt, V, D;
    const int32_t *ids;
    int64_t ids_s, T;
    uint16_t *out;
    int64_t so_t, so_j, copies;
} dsv4_embed_args;

/* y[t*sy_t + j*sy_j + d] = bf16(a[t*sa_t + j*sa_j + d] + b[t*sb_t + d]); y may be a. */
typedef struct dsv4_add_args {
    int64_t T, n, D;
    const uint16_t *a, *b;
    uint16_t *y;
    int64_t sa_t, sa_j, sb_t, sy_t, sy_j;
} dsv4_add_args;

/* Row i of dst (at dst + i*ldd bytes) = row r of src (src + r*lds bytes), r = idx ? idx[i*idx_s]
 * : i, row_bytes bytes each, for i < n; idx entries are in [0, R). */
typedef struct dsv4_copy_rows_args {
    const void *src;
    int64_t lds, R;
    const int32_t *idx;
    int64_t idx_s;
    void *dst;
    int64_t ldd, n, row_bytes;
} dsv4_copy_rows_args;

/* tokens[r*tok_s] = the sampled token or result code of row r (logits + r*ldl [V], params[r],
 * rng + 4r) for r < B; row r's workspace: ws_row bytes at ws + r*ws_row (the cpu backends: V
 * floats, then V int32; a device: its probabilities and block sums). The op layer
 * checked the views, B >= 1 and 0 < V <= 2^29; params are the entry's to check (a code, not a
 * failure of the call). */
typedef struct dsv4_sample_args {
    const float *logits;
    int64_t ldl, B, V;
    const struct dsv4_sampling *params;
    uint64_t *rng;
    int32_t *tokens;
    int64_t tok_s;
    void *ws;
    int64_t ws_row;
} dsv4_sample_args;

/* slots[i*ss] = entries[i*es] = e in [0, n_blocks*block_size) ? table[e / block_size] *
 * block_size + e % block_size : -1, for i < n (slots may be entries: each element is read before
 * it is written, by the same thread). */
typedef struct dsv4_paged_slots_args {
    const int32_t *table, *entries; /* table [n_blocks]; entries with stride es */
    int32_t *slots;                 /* stride ss */
    int64_t n_blocks, block_size, es, ss, n;
} dsv4_paged_slots_args;

/* The rule of dsv4_paged_slots for one entry (every backend's). */
static inline int32_t dsv4_paged_slot(const int32_t *table, int64_t n_blocks, int64_t block_size, int32_t e)
{
    if (e < 0 || (int64_t)e >= n_blocks * block_size) return -1;
    return (int32_t)((int64_t)table[e / block_size] * block_size + e % block_size);
}

struct dsv4_tensor_ops {
    dsv4_status (*embed_rows)(const dsv4_exec *ex, const dsv4_embed_args *a);
    dsv4_status (*add_bf16)(const dsv4_exec *ex, const dsv4_add_args *a);
    dsv4_status (*copy_rows)(const dsv4_exec *ex, const dsv4_copy_rows_args *a);
    dsv4_status (*sample)(const dsv4_exec *ex, const dsv4_sample_args *a);
    dsv4_status (*paged_slots)(const dsv4_exec *ex, const dsv4_paged_slots_args *a);
};

#endif
