/* DeepSeek-V4 checkpoints: config.json, safetensors (single or sharded), and the model-weights
 * description — a typed tensor view for every weight of every layer, used in place from the
 * memory-mapped files (docs/contracts.md §8; docs/model.md §1.1, §9; docs/formats.md §6).
 *
 * Nothing read from disk is trusted: header lengths, JSON syntax and UTF-8, offsets (inside the
 * file, no overlap, no holes), dtypes and shapes against the config, and every dimension of
 * config.json are checked; a failure returns a status and a message naming the file and the
 * tensor, and leaves the caller's outputs untouched. */
#ifndef DSV4_MODEL_H
#define DSV4_MODEL_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== config.json ========================================================================== */

#define DSV4_MAX_LAYERS 256 /* transformer blocks + MTP blocks */
#define DSV4_MAX_EOS 8

typedef enum dsv4_attn_kind {
    DSV4_ATTN_SWA = 0, /* sliding window only (compress ratio 0) */
    DSV4_ATTN_CSA = 1, /* compressed sparse: overlapping compressor + lightning indexer */
    DSV4_ATTN_HCA = 2  /* heavily compressed: non-overlapping compressor, dense over all entries */
} dsv4_attn_kind;

typedef enum dsv4_score_func {
    DSV4_SCORE_SQRTSOFTPLUS = 0,
    DSV4_SCORE_SOFTMAX = 1,
    DSV4_SCORE_SIGMOID = 2
} dsv4_score_func;

/* Storage format of a family of linear weights. */
typedef enum dsv4_weight_format {
    DSV4_WFMT_AUTO = 0, /* experts only: taken from the checkpoint's dtype */
    DSV4_WFMT_BF16 = 1, /* BF16 (or F32) [out, in], no scale */
    DSV4_WFMT_FP8 = 2,  /* F8_E4M3 [out, in] + E8M0 [ceil(out/128), ceil(in/128)] */
    DSV4_WFMT_FP4 = 3   /* packed E2M1 [out, in/2] (low nibble = even element) + E8M0 [out, in/32] */
} dsv4_weight_format;

typedef struct dsv4_rope_config {
    double theta;                 /* base */
    int yarn;                     /* 1: YaRN frequency blend below */
    double factor;                /* YaRN scaling factor */
    int64_t original_max_position;
    double beta_fast, beta_slow;
    double attention_factor;      /* YaRN logit scale; 1.0 (DeepSeek-V4 uses none) */
} dsv4_rope_config;

/* Every field of docs/model.md §1.1. Defaults (dsv4_config_default) are the V4-Flash values. */
typedef struct dsv4_model_config {
    int64_t dim;                  /* hidden_size / dim */
    int64_t n_layers;             /* num_hidden_layers / n_layers */
    int64_t n_mtp_layers;         /* num_nextn_predict_layers / n_mtp_layers */
    int64_t vocab_size;
    int64_t n_heads;              /* num_attention_heads / n_heads */
    int64_t n_kv_heads;           /* num_key_value_heads: 1 (one shared latent) */
    int64_t head_dim;             /* 512 */
    int64_t rope_head_dim;        /* qk_rope_head_dim / rope_head_dim: 64 (tail of each head) */
    int64_t nope_head_dim;        /* head_dim - rope_head_dim = 448 */
    int64_t q_lora_rank;
    int64_t o_groups;
    int64_t o_lora_rank;
    int64_t window_size;          /* sliding_window / window_size */
    int64_t index_n_heads, index_head_dim, index_topk;
    int64_t n_routed_experts, n_shared_experts;
    int64_t n_activated_experts;  /* num_experts_per_tok / n_activated_experts */
    int64_t moe_inter_dim;        /* moe_intermediate_size / moe_inter_dim */
    int64_t n_hash_layers;        /* layers with hash_routed set */
    dsv4_score_func score_func;   /* scoring_func / score_func */
    int norm_topk_prob;
    double route_scale;           /* routed_scaling_factor / route_scale */
    double swiglu_limit;          /* 0: no clamp */
    int64_t hc_mult, hc_sinkhorn_iters;
    double hc_eps, norm_eps;      /* hc_eps; rms_norm_eps / norm_eps */
    dsv4_rope_config rope_main;     /* SWA layers (and the MTP block): rope_theta, no YaRN */
    dsv4_rope_config rope_compress; /* CSA/HCA layers and their indexers: compress_rope_theta + YaRN */
    int64_t max_position_embeddings;
    int64_t bos_token_id;
    int n_eos;
    int64_t eos_token_ids[DSV4_MAX_EOS];
    int tie_word_embeddings;
    dsv4_weight_format weight_format; /* non-expert linear layers: BF16 or FP8 */
    dsv4_weight_format expert_format; /* routed experts: BF16, FP8, FP4 or AUTO */
    /* per block, blocks 0..n_layers-1 then the MTP blocks */
    int32_t compress_ratio[DSV4_MAX_LAYERS]; /* 0 = SWA */
    uint8_t attn_kind[DSV4_MAX_LAYERS];      /* dsv4_attn_kind */
    uint8_t hash_routed[DSV4_MAX_LAYERS];    /* 1: experts from gate.tid2eid[token] */
    char naming[16]; /* which naming the file used: "hf", "reference" or "transformers" */
} dsv4_model_config;

DSV4_API void dsv4_config_default(dsv4_model_config *cfg);
/* The built-in tiny model (`dsv4 make-tiny`): SWA, CSA, HCA blocks, hash and learned routing, MTP. */
DSV4_API void dsv4_config_tiny(dsv4_model_config *cfg);
/* Parse config.json text in any of the three namings (official root config.json, the reference's
 * inference/config.json ModelArgs keys, Hugging Face transformers' DeepseekV4Config); absent
 * fields keep their defaults (null is refused except where transformers types the field
 * optional); the result is validated. `source` names the text in messages. A layer's attention
 * kind comes from layer_types and its ratio from compress_rates of that kind, as transformers
 * reads them (compress_ratios alone: the official rule, CSA where the ratio is 4). A key the
 * library does not know, and that transformers configs do not carry as a matter of course, gets a
 * warning naming it (dsv4_set_warning_handler). */
DSV4_API dsv4_status dsv4_config_parse(const char *json, size_t len, const char *source, dsv4_model_config *out);
/* `path` is config.json or a directory holding it. */
DSV4_API dsv4_status dsv4_config_load(const char *path, dsv4_model_config *out);
/* Ranges and consistency (sizes bounded so that no tensor size can overflow). */
DSV4_API dsv4_status dsv4_config_validate(const dsv4_model_config *cfg);
/* config.json text in the official naming; a schedule it cannot say (a CSA layer of ratio other
 * than 4, an HCA layer of ratio 4, hash routing off the first layers) in transformers' layer_types
 * + compress_rates / mlp_layer_types (one rate per kind). *len receives the length (without the
 * NUL); fails with DSV4_ERR_CAPACITY if cap is too small. */
DSV4_API dsv4_status dsv4_config_to_json(const dsv4_model_config *cfg, char *buf, size_t cap, size_t *len);
DSV4_API const char *dsv4_attn_kind_name(dsv4_attn_kind kind);
DSV4_API const char *dsv4_weight_format_name(dsv4_weight_format fmt);

/* ==== safetensors checkpoints ============================================================== */

typedef struct dsv4_checkpoint dsv4_checkpoint;

typedef enum dsv4_layout {
    DSV4_LAYOUT_OFFICIAL = 0, /* DeepSeek's names: layers.N.attn.wq_a.weight + .scale, FP8/FP4 */
    DSV4_LAYOUT_HF = 1        /* transformers' save_pretrained: model. prefix, BF16 */
} dsv4_layout;

typedef struct dsv4_tensor_entry {
    const char *name;       /* as written in the file */
    const char *canonical;  /* the official-layout name it stands for */
    const char *file;       /* file name (no directory) */
    const char *st_dtype;   /* safetensors dtype string, e.g. "F8_E4M3" */
    int dtype;              /* dsv4_dtype of the raw bytes, or -1 (no dsv4 equivalent, e.g. F16) */
    int ndim;
    int64_t shape[DSV4_MAX_DIMS];
    uint64_t nbytes;
    uint64_t file_offset;   /* absolute offset of the first byte in the file */
    const void *data;       /* read-only: in the file's mapping, or its copy (DSV4_LOAD_COPY) */
} dsv4_tensor_entry;

/* How a checkpoint's files come into memory.
 *   DSV4_LOAD_MAP   memory-mapped read-only, used in place (the default: no copy, pages read on
 *                   first use). A file that shrinks while it is mapped (truncated, or rewritten
 *                   in place by another program) makes the next read of a page past its new end
 *                   raise SIGBUS, which kills the process unless it handles that signal: the
 *                   mapping cannot report an error.
 *   DSV4_LOAD_COPY  read into memory at open (the whole file, once): needs the memory, but
 *                   nothing done to the files afterwards can reach the process. A file that
 *                   changes size while it is read fails the open with DSV4_ERR_IO. For servers. */
typedef enum dsv4_load_mode { DSV4_LOAD_MAP = 0, DSV4_LOAD_COPY = 1 } dsv4_load_mode;

/* Open a checkpoint: a directory with model.safetensors.index.json (sharded) or model.safetensors,
 * or one .safetensors file. Every file is validated and memory-mapped read-only
 * (dsv4_checkpoint_open_mode: mapped or copied). */
DSV4_API dsv4_status dsv4_checkpoint_open(const char *path, dsv4_checkpoint **out);
DSV4_API dsv4_status dsv4_checkpoint_open_mode(const char *path, dsv4_load_mode mode, dsv4_checkpoint **out);
DSV4_API void dsv4_checkpoint_close(dsv4_checkpoint *ck);
DSV4_API int64_t dsv4_checkpoint_count(const dsv4_checkpoint *ck);
DSV4_API int dsv4_checkpoint_file_count(const dsv4_checkpoint *ck);
DSV4_API dsv4_layout dsv4_checkpoint_layout(const dsv4_checkpoint *ck);
/* Entry i in file order (files in index order, tensors by offset). */
DSV4_API dsv4_status dsv4_checkpoint_entry(const dsv4_checkpoint *ck, int64_t i, dsv4_tensor_entry *out);
/* By file name or canonical name; DSV4_ERR_NOT_FOUND if absent. */
DSV4_API dsv4_status dsv4_checkpoint_find(const dsv4_checkpoint *ck, const char *name, dsv4_tensor_entry *out);

/* ==== model weights ======================================================================== */

/* One linear layer y = W·x, W [out, in]. scale.data is NULL for BF16 weights. */
typedef struct dsv4_linear_weight {
    dsv4_tensor weight; /* BF16/F32 [out, in] | F8_E4M3 [out, in] | FP4X2 [out, in/2] */
    dsv4_tensor scale;  /* E8M0: FP8 [ceil(out/128), ceil(in/128)]; FP4 [out, in/32] */
    dsv4_weight_format format;
    int64_t out_features, in_features;
} dsv4_linear_weight;

typedef struct dsv4_expert_weights {
    dsv4_linear_weight w1, w2, w3; /* gate [I, D], down [D, I], up [I, D] */
} dsv4_expert_weights;

typedef struct dsv4_compressor_weights {
    dsv4_tensor wkv, wgate; /* [coff*d, D] (coff = 2 for CSA, 1 for HCA) */
    dsv4_tensor ape;        /* [ratio, coff*d] */
    dsv4_tensor norm;       /* [d] */
} dsv4_compressor_weights;

/* Float parameters (norms, mHC, sinks, ape, biases) are F32 or BF16 as the file stores them;
 * tensors a block does not have keep data == NULL. Every view's data is aligned for its dtype:
 * the checkpoint's bytes in place, or an aligned copy made at open where the file put a tensor
 * at an offset its dtype cannot be read from (a padded safetensors header). */
typedef struct dsv4_layer_weights {
    int index;         /* block index: 0..n_layers-1, then n_layers.. for MTP blocks */
    int is_mtp;
    dsv4_attn_kind kind;
    int compress_ratio;
    int hash_routed;
    dsv4_tensor attn_norm, ffn_norm;
    dsv4_tensor hc_attn_fn, hc_attn_base, hc_attn_scale; /* [mix, hc*D], [mix], [3] */
    dsv4_tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    dsv4_linear_weight wq_a, wq_b, wkv, wo_a, wo_b;
    dsv4_tensor q_norm, kv_norm, attn_sink;
    dsv4_compressor_weights compressor;       /* CSA, HCA */
    dsv4_linear_weight index_wq_b;                   /* CSA: [index_n_heads*index_head_dim, q_lora_rank] */
    dsv4_tensor index_weights_proj;           /* CSA: [index_n_heads, D] */
    dsv4_compressor_weights index_compressor; /* CSA */
    dsv4_tensor gate_weight;                  /* [E, D] */
    dsv4_tensor gate_bias;                    /* learned routing: [E] */
    dsv4_tensor tid2eid;                      /* hash routing: I64 or I32 [vocab, n_activated] */
    dsv4_expert_weights *experts;             /* n_routed_experts entries */
    dsv4_expert_weights shared;               /* when n_shared_experts == 1 */
    /* MTP blocks only */
    dsv4_linear_weight e_proj, h_proj;
    dsv4_tensor enorm, hnorm, norm;
    dsv4_tensor hc_head_fn, hc_head_base, hc_head_scale;
} dsv4_layer_weights;

typedef struct dsv4_model_weights {
    dsv4_layout layout;
    dsv4_tensor embed, head, norm;                 /* head == embed when embeddings are tied */
    dsv4_tensor hc_head_fn, hc_head_base, hc_head_scale;
    int n_layers;
    int n_mtp;                      /* MTP blocks the checkpoint has (0 when it has none) */
    dsv4_weight_format expert_format; /* resolved */
    dsv4_layer_weights *layers;     /* n_layers + n_mtp */
} dsv4_model_weights;

typedef struct dsv4_model dsv4_model;

typedef struct dsv4_model_open_options {
    /* 0: any missing, unexpected or mistyped tensor fails the open (with the first one named).
     * 1: the open succeeds and the problems are listed by dsv4_model_issue (for `dsv4 inspect`). */
    int allow_issues;
    dsv4_load_mode load; /* DSV4_LOAD_MAP (0) or DSV4_LOAD_COPY (see there) */
} dsv4_model_open_options;

typedef enum dsv4_issue_kind {
    DSV4_ISSUE_MISSING = 0,
    DSV4_ISSUE_UNEXPECTED = 1,
    DSV4_ISSUE_DTYPE = 2,
    DSV4_ISSUE_SHAPE = 3
} dsv4_issue_kind;

typedef struct dsv4_model_issue_info {
    dsv4_issue_kind kind;
    const char *name;    /* canonical tensor name */
    const char *message; /* one line naming the file and the tensor */
} dsv4_model_issue_info;

/* `dir`, a directory, holds config.json and the safetensors (see dsv4_checkpoint_open); a path
 * that is not a directory is DSV4_ERR_INVALID_ARG. options may be NULL. */
DSV4_API dsv4_status dsv4_model_open(const char *dir, const dsv4_model_open_options *options, dsv4_model **out);
DSV4_API void dsv4_model_close(dsv4_model *m);
DSV4_API const dsv4_model_config *dsv4_model_get_config(const dsv4_model *m);
DSV4_API const dsv4_model_weights *dsv4_model_get_weights(const dsv4_model *m);
DSV4_API const dsv4_checkpoint *dsv4_model_get_checkpoint(const dsv4_model *m);
/* Every problem found; dsv4_model_issue gives the first 10000 of them (i from 0). */
DSV4_API int dsv4_model_issue_count(const dsv4_model *m);
DSV4_API dsv4_status dsv4_model_issue(const dsv4_model *m, int i, dsv4_model_issue_info *out);

/* ==== writing checkpoints ================================================================== */

/* Zero-initialized (or NULL): seed 0, one file, the official layout, no MTP, real data. */
typedef struct dsv4_write_options {
    uint64_t seed;       /* random weights: same seed, same bytes */
    int shards;          /* 0 or 1: one file; > 1 writes model-0000i-of-0000n.safetensors + the index */
    dsv4_layout layout;  /* OFFICIAL (config formats) or HF (BF16, model. prefix) */
    int with_mtp;        /* write the config's MTP blocks */
    int sparse;          /* headers only: tensor data left as file holes (shape/size tests) */
} dsv4_write_options;

/* Write config.json and the safetensors of `cfg` into `dir` (created if absent) with
 * random weights scaled as a trained network's (each residual branch a small update, logits of
 * standard deviation ~2: docs/testing.md §4.1): FP8 weights with 128x128 E8M0 block scales, FP4
 * experts with 1x32 scales (expert_format AUTO means FP4 here), hash tables with distinct experts. */
DSV4_API dsv4_status dsv4_checkpoint_write(const char *dir, const dsv4_model_config *cfg,
                                           const dsv4_write_options *options);
/* The token-id tiny model (`dsv4 make-tiny --no-tokenizer`, the test suite's): dsv4_config_tiny in the
 * official layout, 2 shards, with MTP. `dsv4 make-tiny` writes the same layers with the vocabulary of
 * DeepSeek-V4's tokenizer and its tokenizer.json beside them (src/cli/make_tiny.c). */
DSV4_API dsv4_status dsv4_make_tiny(const char *dir, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
