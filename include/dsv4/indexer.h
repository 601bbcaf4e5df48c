/* Compressor and lightning indexer of the DeepSeek-V4 attention (docs/model.md §5.5, §5.6; docs/formats.md §5).
 *
 * Compressor. One instance per (layer, kind): the main compressor of a CSA/HCA layer (d = 512:
 * its entries become KV entries of the attention, through the attention family's KV-only insert)
 * and the indexer compressor of a CSA layer (d = 128: its entries form the indexer cache).
 * The linear projections are not done here: per token the caller passes `kv = wkv·x` and
 * `gate = wgate·x` (F32, width coff·d with coff = 2 with overlap, else 1); the op adds the
 * `ape` row of the token's in-block offset to the gate, keeps the per-sequence state and emits
 * entry c when the token at position c·ratio + ratio − 1 is processed:
 *   per channel e, v[e] = Σ softmax_t(score_t[e]) · kv_t[e] over the window of entry c
 *     overlap:    tokens c·r−r … c·r−1 (columns 0..d−1) and c·r … c·r+r−1 (columns d..2d−1);
 *                 positions < 0 do not count;
 *     no overlap: tokens c·r … c·r+r−1 (columns 0..d−1);
 *   v → BF16 → RMSNorm(norm, eps) → BF16 → GPT-J RoPE on dims d−64..d−1 at position c·ratio → BF16;
 *   main kind:    optionally the FP8 round trip of dims 0..d−65 (rule kv64), values stay BF16;
 *   indexer kind: Hadamard rotation of all d dims (Sylvester order, × d^-0.5, fp32, → BF16), then
 *                 FP4 E2M1 with one UE8M0 scale per 32 (rule fp4_32).
 * One call takes any number S ≥ 1 of consecutive tokens starting at `start_pos`: S = 1 is the
 * per-token decode step, S > 1 the batched prefill (or a chunk of it, or MTP verification). The
 * state a call leaves is exactly the one S single-token calls leave; so are the entries.
 *
 * State (per sequence, F32, in the memory of the context's backend like every other view: host
 * memory on the CPU backends, device memory on an accelerator): `state_kv` and `state_score`, each
 * [coff·ratio, coff·d], the reference's layout: row (overlap ? ratio : 0) + p mod ratio holds the
 * latest token p of that residue (kv row, gate + ape row); with overlap, rows 0..ratio−1 hold the
 * last complete block (copied when it was emitted). dsv4_compressor_state_reset() sets the fresh
 * state (0 / −inf) on the context's backend; dsv4_compressor_state_init() is its host-memory form
 * (no context).
 *
 * Indexer cache format (docs/formats.md §5, 68 B per entry for d = 128): codes FP4X2 [N, d/2] (two E2M1 codes
 * per byte, low nibble = even element) + scales E8M0 [N, d/32] (one UE8M0 byte per 32 elements).
 * The two views may have any row stride, so the 64 + 4 bytes of one entry can be adjacent (row
 * stride 68 for both views) or in separate arrays. Values are code · 2^(byte − 127), exactly the
 * reference's FP4-simulated BF16 values.
 *
 * Lightning indexer, for query token t at position p_t (the CSA layer's ratio, 4 in V4):
 *   q path     dsv4_indexer_q: wq_b output [T, H, d] BF16 → RoPE (dims d−64..d−1, position p_t)
 *              → BF16 → Hadamard → BF16 → FP4 simulation; stored packed like the cache.
 *   weights    dsv4_indexer_weights: w[t][h] = bf16(proj[t][h] · d^-0.5 · H^-0.5).
 *   scores     I[t][c] = Σ_h w[t][h] · ReLU(q[t][h] · k[c]) for c < n_t = (p_t + 1) div ratio.
 *              Every per-head dot product of FP4 values is exact in 32 groups (integer sums);
 *              the groups and heads are then summed in fp32 in a fixed order (see
 *              dsv4_indexer_scores), so the scores do not depend on the backend's ISA or threads.
 *   top-k      the min(topk, n_t) candidates with the largest scores. Ties are broken by the
 *              lower entry index, NaN counts as −inf. Output = the compressed scope of the sparse
 *              decode (docs/contracts.md §6): indices I32 [T, topk] in decreasing score order (equal scores:
 *              increasing index), −1 after the first `lengths[t]` = min(topk, n_t) ones.
 *              Indices are entry numbers c of the compressed caches (the caller maps them to
 *              slots when its caches are paged). The selection streams through the candidates
 *              with a buffer of 2·topk per thread; nothing is sorted but the chosen ones. */
#ifndef DSV4_INDEXER_H
#define DSV4_INDEXER_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_compressor_kind {
    DSV4_COMPRESSOR_MAIN = 0,    /* d % 64 == 0, 64 <= d <= 1024; out BF16 [n, d] */
    DSV4_COMPRESSOR_INDEXER = 1  /* d in {64, 128, 256}; out packed FP4 rows or BF16 values */
} dsv4_compressor_kind;

typedef struct dsv4_compressor_desc {
    dsv4_compressor_kind kind;
    int ratio;   /* 2..512 */
    int dim;     /* d */
    float eps;   /* RMSNorm epsilon (1e-6 in V4) */
    int fp8_sim; /* main kind: 1 = return the FP8 round trip of dims 0..d-65 (the values the FP8
                    KV cache will hold), 0 = the BF16 vector before it */
    int overlap; /* 1: overlapping windows of 2·ratio tokens, coff = 2 (the compressors of CSA
                    layers and their indexers); 0: one window of ratio tokens, coff = 1 (HCA) */
    const dsv4_tensor *position; /* NULL, or the position of the call's one token read where the op
                    runs (dsv4_compressor_forward: the graph-shaped decode step) */
} dsv4_compressor_desc;

/* Entries emitted by tokens start_pos .. start_pos+n_tokens-1: (start_pos+n)/ratio - start_pos/ratio;
 * the first one is entry start_pos/ratio. Returns -1 for a bad argument. */
DSV4_API int64_t dsv4_compressor_emit_count(int ratio, int64_t start_pos, int64_t n_tokens);

/* Fresh state: state_kv = 0, state_score = -inf (F32 [coff*ratio, coff*d], host memory). */
DSV4_API dsv4_status dsv4_compressor_state_init(const dsv4_compressor_desc *desc, dsv4_tensor *state_kv,
                                                dsv4_tensor *state_score);

/* The same fresh state in the memory of ctx's backend (device memory on an accelerator), written
 * on the context's stream like any op. */
DSV4_API dsv4_status dsv4_compressor_state_reset(dsv4_ctx *ctx, const dsv4_compressor_desc *desc, dsv4_tensor *state_kv,
                                                 dsv4_tensor *state_score);

/* Run n = kv->shape[0] tokens at positions start_pos.. through the compressor.
 * With desc->position (I64 [1] in the context's memory) the one token's position p is read
 * there instead (n = 1, start_pos = 0), so that a recorded graph replays the call at any
 * position: out (and out_scales) is then given whatever p, with rows >= 1, and the entry c = p/ratio
 * that the token emits when (p + 1) mod ratio == 0 goes to row c mod rows(out): a one-row out
 * takes it at any p, a view of a whole cache (rows > every entry) at row c. No entry: out is not
 * written. Where the position is host memory (the CPU backends) it is checked as start_pos is; on
 * a device it is not read on the host: an entry past the rope table is not written there.
 *   kv, gate     F32 [n, coff*d]          projections of the tokens (gate without ape)
 *   ape          F32 [ratio, coff*d]
 *   norm         BF16 or F32 [d]          RMSNorm weight
 *   rope         F32 [max_pos, 64]        rows cos(p·f_0..f_31) ‖ sin(p·f_0..f_31); row c·ratio of
 *                                         every emitted entry c must exist
 *   state_kv, state_score  F32 [coff*ratio, coff*d], updated in place (the backend's memory)
 *   out, out_scales  the m = dsv4_compressor_emit_count(...) entries, row i = entry start_pos/ratio + i:
 *     main:    out BF16 [m, d], out_scales NULL;
 *     indexer: out FP4X2/U8 [m, d/2] + out_scales E8M0/U8 [m, d/32] (cache rows; pass the view of
 *              the cache rows start_pos/ratio ..), or out BF16 [m, d] (the FP4-simulated values)
 *              with out_scales NULL.
 *   When m == 0, out and out_scales may be NULL. Every view needs unit inner stride. */
DSV4_API dsv4_status dsv4_compressor_forward(dsv4_ctx *ctx, const dsv4_compressor_desc *desc, int64_t start_pos,
                                             const dsv4_tensor *kv, const dsv4_tensor *gate, const dsv4_tensor *ape,
                                             const dsv4_tensor *norm, const dsv4_tensor *rope, dsv4_tensor *state_kv,
                                             dsv4_tensor *state_score, dsv4_tensor *out, dsv4_tensor *out_scales);

/* Positions of the indexer ops (dsv4_indexer_q, dsv4_indexer_args): host memory, checked before
 * anything runs; or, on a device, I64 in the context's memory, read where the op runs so that a
 * recorded graph replays the op at any positions. Those are not checked: a position outside the
 * rope table is clamped into it, and n_t is clamped to [0, N] (N: the cache rows given, which can
 * be a capacity).
 *
 * Indexer query path. q BF16 [T, H, d] (d in {64, 128, 256}), positions I32/I64 [T] (0 <= p < max_pos),
 * rope F32 [max_pos, 64]. out FP4X2/U8 [T, H, d/2] + out_scales E8M0/U8 [T, H, d/32], or
 * out BF16 [T, H, d] (the simulated values) with out_scales NULL. */
DSV4_API dsv4_status dsv4_indexer_q(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_tensor *positions,
                                    const dsv4_tensor *rope, dsv4_tensor *out, dsv4_tensor *out_scales);

/* Head weights: proj BF16 or F32 [T, H] (weights_proj·x) -> out F32 [T, H] holding
 * bf16(proj · head_dim^-0.5 · H^-0.5) (the reference's BF16 product). */
DSV4_API dsv4_status dsv4_indexer_weights(dsv4_ctx *ctx, const dsv4_tensor *proj, int head_dim, dsv4_tensor *out);

/* The operands of scoring and selection. */
typedef struct dsv4_indexer_args {
    const dsv4_tensor *q;         /* FP4X2/U8 [T, H, d/2]  packed queries (dsv4_indexer_q) */
    const dsv4_tensor *q_scales;  /* E8M0/U8  [T, H, d/32] */
    const dsv4_tensor *weights;   /* F32 [T, H]            head weights (dsv4_indexer_weights) */
    const dsv4_tensor *k;         /* FP4X2/U8 [N, d/2]     indexer cache codes, entries 0..N-1 */
    const dsv4_tensor *k_scales;  /* E8M0/U8  [N, d/32] */
    const dsv4_tensor *positions; /* I32/I64 [T]           query positions; n_t = (p_t+1)/ratio <= N */
    int ratio;                    /* 4 in V4 */
} dsv4_indexer_args;
/* Limits: 1 <= H <= 128, d in {64, 128, 256}. */

/* scores F32 [T, N]: I[t][c] for c < n_t, -inf for c >= n_t. Summation order (fixed, all fp32):
 * per head h, dot = 0; for each group g of 32: dot = fma(S_g, 2^(eq-1)·2^(ek-1), dot), where S_g is
 * the exact integer Σ (2 q_i)(2 k_i) of the group's E2M1 values; then lane[h mod 16] =
 * fma(max(dot, 0), w_h, lane) for h = 0..H-1 in order (lanes start at +0), and the 16 lanes are
 * added as a tree (i + i+8, then i + i+4, i + i+2, i + i+1). */
DSV4_API dsv4_status dsv4_indexer_scores(dsv4_ctx *ctx, const dsv4_indexer_args *args, dsv4_tensor *scores);

/* Bytes of workspace dsv4_indexer_select / dsv4_indexer_topk need on this context for `tokens`
 * query rows and this topk (0 on a bad argument). */
DSV4_API size_t dsv4_indexer_workspace_size(dsv4_ctx *ctx, int64_t tokens, int64_t topk);

/* Fused scoring + streaming top-k (no score matrix): indices I32 [T, topk], lengths I32 [T]. */
DSV4_API dsv4_status dsv4_indexer_select(dsv4_ctx *ctx, const dsv4_indexer_args *args, int64_t topk,
                                         dsv4_tensor *indices, dsv4_tensor *lengths, void *workspace,
                                         size_t workspace_bytes);

/* Top-k of given scores F32 [T, N] (row stride free) over the first n_valid[t] entries
 * (n_valid I32 [T], NULL = all N), same order, tie-break and output form as dsv4_indexer_select. */
DSV4_API dsv4_status dsv4_indexer_topk(dsv4_ctx *ctx, const dsv4_tensor *scores, const dsv4_tensor *n_valid,
                                       int64_t topk, dsv4_tensor *indices, dsv4_tensor *lengths, void *workspace,
                                       size_t workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif
