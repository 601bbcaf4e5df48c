/* Data movement on tensor views, run by the context's backend so that no step of a forward pass
 * has to stop on the host between ops: embedding rows by token id (with the copies the mHC
 * residual streams start from), the BF16 residual add broadcast over those copies, and plain or
 * gathered copies of rows (saved projections, state snapshots), and the sampling of rows of
 * logits (so that a step reads back only the sampled tokens).
 *
 * Conventions as in dsv4/layer.h: BF16 tensors hold uint16 bit patterns; the last dim has unit
 * stride, outer strides are free; every tensor is in the memory of the context's backend. Index
 * tensors (I32, any stride) are read by the backend, which rejects an entry out of range with
 * DSV4_ERR_RANGE before writing anything. On error nothing is written. Results never depend on
 * the context's thread count. */
#ifndef DSV4_TENSOR_OPS_H
#define DSV4_TENSOR_OPS_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[t, j, :] = table[ids[t], :] for t < T, j < copies.
 * table: BF16 [V, D]; ids: I32 [T], each in [0, V); out: BF16 [T, copies, D] (copies >= 1) or
 * [T, D] (copies = 1). out overlaps neither table nor ids. The exception to the rule above: on a
 * device (cuda) the ids are read where the op runs, never on the host, so that a step's graph can
 * start with it; an id out of range there gives rows of zeros and no error (check the ids first). */
DSV4_API dsv4_status dsv4_embed_rows(dsv4_ctx *ctx, const dsv4_tensor *table, const dsv4_tensor *ids,
                                     dsv4_tensor *out);

/* y[t, j, :] = bf16(f32(a[t, j, :]) + f32(b[t, :])) for j < n: b broadcast over the n copies, one
 * rounding (RNE). A NaN result is the canonical quiet NaN 0x7FC0 with a sign bit: a's when a is
 * NaN, else b's when b is, else the sign the fp32 add gave (inf - inf: negative on x86).
 * a, y: BF16 [T, n, D] (n >= 1) or [T, D] (n = 1), of one shape; b: BF16 [T, D]. y may be a
 * itself (the same view: in place); any other overlap of y with a or b is refused. */
DSV4_API dsv4_status dsv4_add_bf16(dsv4_ctx *ctx, const dsv4_tensor *a, const dsv4_tensor *b, dsv4_tensor *y);

/* dst[i, :] = src[idx ? idx[i] : i, :] for i < n: rows copied byte for byte.
 * src: [R, C] and dst: [n, C] of one dtype (any; FP4X2 shapes count bytes); idx: NULL (then n = R)
 * or I32 [n] with entries in [0, R). dst overlaps neither src nor idx, except that dst may be the
 * very view of src when idx is NULL (nothing to copy). */
DSV4_API dsv4_status dsv4_copy_rows(dsv4_ctx *ctx, const dsv4_tensor *src, const dsv4_tensor *idx, dsv4_tensor *dst);

/* slots[i] = the cache slot of entry entries[i] of a paged sequence (dsv4/attention.h):
 * block_table[e / block_size] * block_size + e % block_size for e in [0, n_blocks * block_size);
 * any other entry, negative ones ("no entry", as the indexer's top-k leaves them) included, gives
 * -1. The entries come from producers on the device (the lightning indexer's top-k) and are not
 * read back to be checked: an entry outside the table means no entry, as -1 does everywhere a
 * sparse scope is read. block_table: I32 [n_blocks] (page numbers >= 0, as dsv4_kv_seq_block_table
 * gives them, copied to the backend's memory); entries, slots: I32 [n] (any stride); slots may be
 * the very view of entries (in place), no other overlap. block_size >= 1. */
DSV4_API dsv4_status dsv4_paged_slots(dsv4_ctx *ctx, const dsv4_tensor *block_table, int64_t block_size,
                                      const dsv4_tensor *entries, dsv4_tensor *slots);

/* ---- sampling ------------------------------------------------------------------------------
 * tokens[r] = the token that the rule of dsv4/engine.h (greedy, temperature, top-p, Gumbel-max)
 * samples from row r of logits with params[r] and the generator state rng[4r .. 4r+3]
 * (xoshiro256**, dsv4_rng_seed), which advances exactly as dsv4_engine_sample advances it, so a
 * row gives the token dsv4_engine_sample gives for the same logits, parameters and state.
 * logits: F32 [B, V] (0 < V <= 2^29; row stride free); tokens: I32 [B] (any stride); params
 * (dsv4_sampling [B]), rng (uint64 [B, 4]) and the workspace are raw pointers in the memory of the
 * context's backend, as the views are, so that a device runs a step's sampling without the host.
 * A row that cannot be sampled gets a negative code instead of a token (its rng untouched): the
 * op itself succeeds, and dsv4_sample_result turns the code into the error dsv4_engine_sample
 * gives. The workspace holds dsv4_sample_workspace_size bytes (B·DSV4_SAMPLE_ROW_BYTES(V): a
 * row's probabilities and its nucleus order or block sums); nothing is allocated. tokens
 * overlaps neither logits nor the workspace. */
#define DSV4_SAMPLE_BAD_PARAMS (-1)           /* temperature not finite or < 0, or top_p not >= 0 */
#define DSV4_SAMPLE_ALL_MASKED (-2)           /* every logit is -Inf */
#define DSV4_SAMPLE_NAN_LOGIT(i) (-3 - 2 * (i)) /* logit i, the first that is NaN or +Inf, is NaN */
#define DSV4_SAMPLE_INF_LOGIT(i) (-4 - 2 * (i)) /* ... is +Inf */
#define DSV4_SAMPLE_ROW_BYTES(V) (8 * (int64_t)(V) + 64)
struct dsv4_sampling;
DSV4_API dsv4_status dsv4_sample_workspace_size(dsv4_ctx *ctx, int64_t rows, int64_t V, size_t *bytes);
DSV4_API dsv4_status dsv4_sample_rows(dsv4_ctx *ctx, const dsv4_tensor *logits, const struct dsv4_sampling *params,
                                      uint64_t *rng, dsv4_tensor *tokens, void *workspace, size_t workspace_bytes);
/* DSV4_OK for a token (>= 0); else the code's error (DSV4_ERR_INVALID_ARG for the parameters,
 * DSV4_ERR_RANGE naming the logit for the logits) with a message that starts with `what`. */
DSV4_API dsv4_status dsv4_sample_result(int32_t token, const char *what);

#ifdef __cplusplus
}
#endif
#endif
