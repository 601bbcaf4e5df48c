/* Attention decode path (docs/kernels.md §1-§4): the paged FP8 KV cache, RoPE tables, fused q-norm + RoPE + KV
 * insert, dequant-gather, sparse MLA decode with sink (FlashMLA semantics) and inverse RoPE.
 *
 * KV cache entry (docs/contracts.md §5, FlashMLA "MODEL1"): the 512-vector of one token is
 * 448 E4M3 codes (dims 0..447, one UE8M0 scale per 64 dims) + 64 BF16 (dims 448..511, already
 * rotated) = 576 data bytes, plus 8 scale bytes (7 UE8M0 + a zero pad byte) = 584 bytes.
 * A page of `block_size` entries holds all data rows first (row r at r*576), then all scale rows
 * (at block_size*576 + r*8); its size is rounded up to a multiple of 576 (dsv4_kv_page_bytes).
 * slot = page*block_size + row; a negative slot means "no entry" everywhere.
 *
 * The cache memory is a tensor view the caller owns (host or device memory of the context's
 * backend): U8 [num_pages, page_bytes] with unit inner stride; its row stride is the page stride
 * and must be >= block_size*584. Page allocation and block tables (dsv4_kv_pages, dsv4_kv_seq)
 * are host-side bookkeeping, separate from the memory and from the kernels.
 *
 * Index dtypes: slot mappings and positions are I64; attention indices, gather slots and
 * lengths are I32 (FlashMLA's). Index ranges are checked when the data is in host memory. */
#ifndef DSV4_ATTENTION_H
#define DSV4_ATTENTION_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_KV_DIM 512
#define DSV4_KV_NOPE_DIM 448
#define DSV4_KV_ROPE_DIM 64
#define DSV4_KV_DATA_BYTES 576
#define DSV4_KV_SCALE_BYTES 8
#define DSV4_KV_ENTRY_BYTES 584

/* ---- the paged cache ---------------------------------------------------------------------- */
typedef struct dsv4_kv_cache {
    dsv4_tensor pages;  /* U8 [num_pages, page_bytes] */
    int64_t block_size; /* entries per page (64 for SWA and C4A, 2 for C128A; any >= 1) */
} dsv4_kv_cache;

/* block_size*584 rounded up to a multiple of 576 (37440 for 64, 1728 for 2); 0 if invalid. */
DSV4_API int64_t dsv4_kv_page_bytes(int64_t block_size);
/* A cache view over `num_pages * dsv4_kv_page_bytes(block_size)` bytes at `pages`. */
DSV4_API dsv4_status dsv4_kv_cache_view(dsv4_kv_cache *cache, void *pages, int64_t num_pages, int64_t block_size,
                                        dsv4_device_kind device, int device_index);
/* num_pages * block_size (0 for an invalid cache). */
DSV4_API int64_t dsv4_kv_cache_slots(const dsv4_kv_cache *cache);

/* ---- page allocation and block tables (host-side) -----------------------------------------
 * A dsv4_kv_pages hands out the page numbers 0..num_pages-1 of one pool (LIFO free list; several
 * caches with the same page count, e.g. one per layer, may share it). A dsv4_kv_seq is one
 * sequence's block table: its entries 0..capacity-1 map to slots through the pages it holds
 * (entry e -> table[e / block_size]*block_size + e % block_size). An SWA ring of W entries is a
 * sequence of capacity W addressed with entry = position mod W; a compressed cache is a sequence
 * addressed with the compressed entry number. Running out of pages is DSV4_ERR_CAPACITY and
 * changes nothing. */
typedef struct dsv4_kv_pages dsv4_kv_pages;
typedef struct dsv4_kv_seq dsv4_kv_seq;

DSV4_API dsv4_status dsv4_kv_pages_create(int64_t num_pages, int64_t block_size, dsv4_kv_pages **out);
DSV4_API void dsv4_kv_pages_destroy(dsv4_kv_pages *pool);
DSV4_API int64_t dsv4_kv_pages_free_count(const dsv4_kv_pages *pool);

/* A sequence that can grow to max_entries entries (its table is allocated here, once). */
DSV4_API dsv4_status dsv4_kv_seq_create(dsv4_kv_pages *pool, int64_t max_entries, dsv4_kv_seq **out);
/* Give the pages back to the pool and free the sequence (NULL is a no-op). */
DSV4_API void dsv4_kv_seq_destroy(dsv4_kv_seq *seq);
/* Make entries 0..n_entries-1 addressable (allocates the missing pages, all or none). */
DSV4_API dsv4_status dsv4_kv_seq_reserve(dsv4_kv_seq *seq, int64_t n_entries);
/* Entries reserved so far (a multiple of block_size, or 0). */
DSV4_API int64_t dsv4_kv_seq_capacity(const dsv4_kv_seq *seq);
/* The block table: page of each block of entries; *n_blocks of them. */
DSV4_API const int32_t *dsv4_kv_seq_block_table(const dsv4_kv_seq *seq, int64_t *n_blocks);
/* entries -> slots (negative entry -> -1; an entry beyond the capacity is DSV4_ERR_RANGE and
 * nothing is written). The I64 version builds slot mappings, the I32 one attention indices. */
DSV4_API dsv4_status dsv4_kv_seq_slots(const dsv4_kv_seq *seq, const int64_t *entries, int64_t n, int64_t *slots);
DSV4_API dsv4_status dsv4_kv_seq_indices(const dsv4_kv_seq *seq, const int32_t *entries, int64_t n,
                                         int32_t *indices);

/* ---- RoPE tables -------------------------------------------------------------------------- */
/* Frequencies of the 32 rotated pairs: f_i = theta^(-2i/64); with YaRN (factor > 1)
 * low = floor(64 ln(orig/(beta_fast 2 pi)) / (2 ln theta)), high = ceil(64 ln(orig/(beta_slow 2 pi))
 * / (2 ln theta)) clamped to [0, 63], ramp_i = clamp((i - low)/(high - low), 0, 1),
 * f_i = f_i (1 - ramp_i) + f_i/factor ramp_i (docs/model.md §5.4; no mscale). */
typedef struct dsv4_rope_params {
    double theta;            /* base */
    double factor;           /* YaRN factor; <= 1 means no YaRN */
    double original_max_pos; /* YaRN original context */
    double beta_fast, beta_slow;
} dsv4_rope_params;

typedef enum dsv4_rope_kind {
    DSV4_ROPE_PLAIN = 0, /* SWA-only layers: base 10000, no YaRN */
    DSV4_ROPE_YARN = 1   /* compressed layers: base 160000, YaRN 16 / 65536 / beta 32, 1 */
} dsv4_rope_kind;

/* The DeepSeek-V4 parameters of a kind. */
DSV4_API dsv4_rope_params dsv4_rope_v4_params(dsv4_rope_kind kind);
/* freq[32] from the parameters, in double. */
DSV4_API dsv4_status dsv4_rope_frequencies(const dsv4_rope_params *params, double freq[32]);
/* table F32 [max_pos, 64] (contiguous): row p = cos(p f_0..p f_31) || sin(p f_0..p f_31), the
 * angles and their cos/sin taken in double and rounded once. */
DSV4_API dsv4_status dsv4_rope_table(dsv4_ctx *ctx, const dsv4_rope_params *params, dsv4_tensor *table);

/* ---- insert ------------------------------------------------------------------------------- */
/* q BF16 [N, H, 512] (unit inner stride; rows may be strided) in place: per head an unweighted
 * RMS norm over all 512 dims (eps), then a GPT-J interleaved rotation of dims 448..511 at
 * positions[n], fp32 throughout, rounded to BF16 once. kv BF16 [N, 512] (read only): dims
 * 448..511 rotated the same way (no norm) and rounded to BF16, then quantized (KV64 rule) and
 * written at slot_mapping[n] for n < N_ins, where slot_mapping is I64 [N_ins], N_ins <= N; a
 * negative slot is skipped. positions I64 [N]; rope F32 [max_pos, 64] (dsv4_rope_table). */
DSV4_API dsv4_status dsv4_qnorm_rope_kv_insert(dsv4_ctx *ctx, dsv4_tensor *q, const dsv4_tensor *kv,
                                               const dsv4_kv_cache *cache, const dsv4_tensor *slot_mapping,
                                               const dsv4_tensor *positions, const dsv4_tensor *rope, float eps);
/* The KV side alone (compressor outputs): kv BF16 [N, 512], slot_mapping I64 [N]; positions
 * I64 [N] + rope rotate dims 448..511 first; positions and rope NULL insert kv as it is. */
DSV4_API dsv4_status dsv4_kv_insert(dsv4_ctx *ctx, const dsv4_tensor *kv, const dsv4_kv_cache *cache,
                                    const dsv4_tensor *slot_mapping, const dsv4_tensor *positions,
                                    const dsv4_tensor *rope);

/* ---- gather ------------------------------------------------------------------------------- */
/* out BF16 [S, 512] = the dequantized entries at slots I32 [S] (slot < 0 -> zeros; a slot
 * >= the slot count is DSV4_ERR_RANGE). Exact: E4M3 * 2^k is representable in BF16. */
DSV4_API dsv4_status dsv4_dequant_gather(dsv4_ctx *ctx, const dsv4_kv_cache *cache, const dsv4_tensor *slots,
                                         dsv4_tensor *out);

/* ---- sparse MLA decode (docs/contracts.md §6) ---------------------------------------------- */
/* One scope: query t attends to the first lengths[t] entries of indices[t, :] (I32 [T, width];
 * lengths I32 [T], or NULL for all of them); inside that prefix an index < 0 or >= the cache's
 * slot count is masked; what lies beyond the prefix is never read. */
typedef struct dsv4_sparse_scope {
    const dsv4_kv_cache *cache;
    const dsv4_tensor *indices;
    const dsv4_tensor *lengths;
} dsv4_sparse_scope;

/* Bytes of scratch dsv4_sparse_mla_decode needs for T queries of H heads whose scopes have
 * `width` + `extra_width` index columns (also for dsv4_sparse_attn_bf16 with extra_width 0). */
DSV4_API dsv4_status dsv4_sparse_mla_decode_workspace(dsv4_ctx *ctx, int64_t t, int64_t h, int64_t width,
                                                      int64_t extra_width, size_t *bytes);
/* q BF16 [T, H, 512]; swa scope (required) and extra scope (compressed cache; NULL: none);
 * sink F32 [H] or NULL; out BF16 [T, H, 512]; lse F32 [T, H] or NULL; workspace U8 [>= bytes]
 * (NULL when 0 bytes are needed). Per query t and head h, over the valid entries e of both
 * scopes with k_e the dequantized 512-vector (K = V):
 *   s_e = scale <q, k_e>,  lse = ln sum exp(s_e),  out = sum exp(s_e) k_e / (exp(lse) + exp(sink_h));
 * no valid entry: out = 0, lse = +inf. Any H >= 1. The FP8 pages are read directly. */
DSV4_API dsv4_status dsv4_sparse_mla_decode(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_sparse_scope *swa,
                                            const dsv4_sparse_scope *extra, const dsv4_tensor *sink, float scale,
                                            dsv4_tensor *out, dsv4_tensor *lse, dsv4_tensor *workspace);
/* The two-pass design's second pass, for comparison (docs/kernels.md §3.4): the same attention over BF16 rows kv BF16 [R, 512]
 * (e.g. from dsv4_dequant_gather) addressed by indices I32 [T, P] (masked when < 0 or >= R)
 * with lengths I32 [T] or NULL. */
DSV4_API dsv4_status dsv4_sparse_attn_bf16(dsv4_ctx *ctx, const dsv4_tensor *q, const dsv4_tensor *kv,
                                           const dsv4_tensor *indices, const dsv4_tensor *lengths,
                                           const dsv4_tensor *sink, float scale, dsv4_tensor *out, dsv4_tensor *lse,
                                           dsv4_tensor *workspace);

/* ---- output side -------------------------------------------------------------------------- */
/* o BF16 [T, H, 512] in place: dims 448..511 rotated back by the angle of positions[t] (I64 [T]). */
DSV4_API dsv4_status dsv4_inv_rope(dsv4_ctx *ctx, dsv4_tensor *o, const dsv4_tensor *positions,
                                   const dsv4_tensor *rope);

#ifdef __cplusplus
}
#endif
#endif
