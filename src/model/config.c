/* config.json in the official (root), reference (inference/config.json ModelArgs) and
 * transformers (DeepseekV4Config) namings -> dsv4_model_config (docs/model.md §1.1). */
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "dsv4/model.h"
#include "model/safetensors.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG_BYTES ((size_t)16 << 20)

const char *dsv4_attn_kind_name(dsv4_attn_kind k)
{
    switch (k) {
    case DSV4_ATTN_SWA: return "SWA";
    case DSV4_ATTN_CSA: return "CSA";
    case DSV4_ATTN_HCA: return "HCA";
    }
    return "?";
}

const char *dsv4_weight_format_name(dsv4_weight_format f)
{
    switch (f) {
    case DSV4_WFMT_AUTO: return "auto";
    case DSV4_WFMT_BF16: return "bf16";
    case DSV4_WFMT_FP8: return "fp8";
    case DSV4_WFMT_FP4: return "fp4";
    }
    return "?";
}

/* ---- the keys --------------------------------------------------------------------------------
 * One row per config.json key: its spellings in the three namings, the field it sets, its type,
 * default and the range dsv4_config_validate checks. The parser reads every spelling, the
 * validator names a value by its official spelling, the writer writes that spelling, and a key
 * of no row (nor of known_ignored) draws a warning. K_OTHER rows are read by the functions named
 * in their comments; the table still owns their names, nullability and the writer's spelling. */
typedef enum key_type { K_INT, K_NUM, K_BOOL, K_ENUM, K_OTHER } key_type;

typedef struct name_value {
    const char *name;
    int value; /* < 0: accepted, sets nothing */
} name_value;

enum { KF_NULLABLE = 1, /* null reads as absent (a field transformers types as optional); else null is refused */
       KF_WRITE = 2 };  /* dsv4_config_to_json writes the official spelling (the K_OTHER rows by hand) */

typedef struct cfg_key {
    const char *name[4]; /* official root config (Hugging Face repos), reference ModelArgs, transformers, and an alias
                            transformers' attribute_map maps onto the field; NULL: none */
    key_type type;
    size_t off;          /* field of dsv4_model_config; NO_FIELD: checked, nothing stored */
    double def;          /* default of the field (every int default is exact in a double) */
    double lo, hi;       /* range checked by dsv4_config_validate; lo > hi: checked there by hand */
    const name_value *values; /* K_ENUM: the accepted strings; the first is the one written */
    int n_values;
    int flags;
} cfg_key;

#define CF(f) offsetof(dsv4_model_config, f)
#define NO_FIELD ((size_t)-1)
#define NO_RANGE 1, 0
#define ALL3(n) {n, n, n}
#define HF_TF(h, r) {h, r, h} /* transformers reads the official spelling */

enum {
    KEY_DIM, KEY_N_LAYERS, KEY_N_MTP, KEY_VOCAB, KEY_N_HEADS, KEY_N_KV_HEADS, KEY_HEAD_DIM, KEY_ROPE_DIM, KEY_Q_LORA,
    KEY_O_GROUPS, KEY_O_LORA, KEY_WINDOW, KEY_INDEX_HEADS, KEY_INDEX_DIM, KEY_INDEX_TOPK, KEY_N_ROUTED, KEY_N_SHARED,
    KEY_N_ACTIVATED, KEY_MOE_DIM, KEY_N_HASH, KEY_HC_MULT, KEY_HC_ITERS, KEY_MAX_POS, KEY_BOS, KEY_EOS, KEY_SCORE,
    KEY_TOPK_METHOD, KEY_ACT, KEY_NORM_TOPK, KEY_TIE, KEY_ATTN_BIAS, KEY_ROUTE_SCALE, KEY_SWIGLU, KEY_HC_EPS, KEY_NORM_EPS,
    KEY_ROPE_THETA, KEY_COMPRESS_THETA, KEY_ROPE_FACTOR, KEY_BETA_FAST, KEY_BETA_SLOW, KEY_ORIGINAL_SEQ_LEN,
    KEY_ROPE_SCALING, KEY_ROPE_PARAMETERS, KEY_PARTIAL_ROTARY, KEY_COMPRESS_RATIOS, KEY_LAYER_TYPES, KEY_COMPRESS_RATES,
    KEY_RATE_CSA, KEY_RATE_HCA, KEY_MLP_LAYER_TYPES, KEY_DTYPE, KEY_SCALE_FMT, KEY_QUANT, KEY_EXPERT_DTYPE, N_KEYS
};

static const name_value score_values[] = {{"sqrtsoftplus", DSV4_SCORE_SQRTSOFTPLUS}, {"softmax", DSV4_SCORE_SOFTMAX},
                                          {"sigmoid", DSV4_SCORE_SIGMOID}};
static const name_value topk_values[] = {{"noaux_tc", 0}};
static const name_value act_values[] = {{"silu", 0}};
static const name_value ue8m0_values[] = {{"ue8m0", 0}};
/* the reference's weight format ("fp8", "bf16") or a torch dtype (the checkpoint's tensors tell) */
static const name_value dtype_values[] = {{"bfloat16", -1}, {"fp8", DSV4_WFMT_FP8}, {"bf16", DSV4_WFMT_BF16},
                                          {"float32", -1}, {"float16", -1}, {"float8_e4m3fn", -1}, {"auto", -1}};
static const name_value expert_values[] = {{"fp4", DSV4_WFMT_FP4}, {"fp8", DSV4_WFMT_FP8}, {"bf16", DSV4_WFMT_BF16}};
#define ENUM_OF(t) t, (int)(sizeof t / sizeof t[0])

static const cfg_key keys[N_KEYS] = {
    [KEY_DIM] = {HF_TF("hidden_size", "dim"), K_INT, CF(dim), 4096, 1, 65536, NULL, 0, KF_WRITE},
    [KEY_N_LAYERS] = {HF_TF("num_hidden_layers", "n_layers"), K_INT, CF(n_layers), 43, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_N_MTP] = {HF_TF("num_nextn_predict_layers", "n_mtp_layers"), K_INT, CF(n_mtp_layers), 1, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_VOCAB] = {ALL3("vocab_size"), K_INT, CF(vocab_size), 129280, 1, 1 << 24, NULL, 0, KF_WRITE},
    [KEY_N_HEADS] = {HF_TF("num_attention_heads", "n_heads"), K_INT, CF(n_heads), 64, 1, 4096, NULL, 0, KF_WRITE},
    [KEY_N_KV_HEADS] = {{"num_key_value_heads", NULL, "num_key_value_heads"}, K_INT, CF(n_kv_heads), 1, 1, 1, NULL, 0, KF_WRITE},
    [KEY_HEAD_DIM] = {ALL3("head_dim"), K_INT, CF(head_dim), 512, 512, 512, NULL, 0, KF_WRITE},
    /* transformers takes qk_rope_head_dim (legacy) or partial_rotary_factor x head_dim */
    [KEY_ROPE_DIM] = {HF_TF("qk_rope_head_dim", "rope_head_dim"), K_INT, CF(rope_head_dim), 64, 64, 64, NULL, 0, KF_WRITE},
    [KEY_Q_LORA] = {ALL3("q_lora_rank"), K_INT, CF(q_lora_rank), 1024, 1, 65536, NULL, 0, KF_WRITE},
    [KEY_O_GROUPS] = {ALL3("o_groups"), K_INT, CF(o_groups), 8, 1, 4096, NULL, 0, KF_WRITE},
    [KEY_O_LORA] = {ALL3("o_lora_rank"), K_INT, CF(o_lora_rank), 1024, 1, 65536, NULL, 0, KF_WRITE},
    [KEY_WINDOW] = {HF_TF("sliding_window", "window_size"), K_INT, CF(window_size), 128, 1, 1 << 20, NULL, 0, KF_WRITE},
    [KEY_INDEX_HEADS] = {ALL3("index_n_heads"), K_INT, CF(index_n_heads), 64, 1, 4096, NULL, 0, KF_WRITE},
    [KEY_INDEX_DIM] = {ALL3("index_head_dim"), K_INT, CF(index_head_dim), 128, 64, 1024, NULL, 0, KF_WRITE},
    [KEY_INDEX_TOPK] = {ALL3("index_topk"), K_INT, CF(index_topk), 512, 1, 1 << 24, NULL, 0, KF_WRITE},
    [KEY_N_ROUTED] = {{"n_routed_experts", "n_routed_experts", "n_routed_experts", "num_local_experts"}, /* alias */
                      K_INT, CF(n_routed_experts), 256, 1, 4096, NULL, 0, KF_WRITE},
    [KEY_N_SHARED] = {ALL3("n_shared_experts"), K_INT, CF(n_shared_experts), 1, 0, 1, NULL, 0, KF_WRITE},
    [KEY_N_ACTIVATED] = {HF_TF("num_experts_per_tok", "n_activated_experts"), K_INT, CF(n_activated_experts), 6, 1, 64, NULL, 0,
                         KF_WRITE},
    [KEY_MOE_DIM] = {{"moe_intermediate_size", "moe_inter_dim", "moe_intermediate_size", "intermediate_size"}, /* alias */
                     K_INT, CF(moe_inter_dim), 2048, 1, 1 << 18, NULL, 0, KF_WRITE},
    /* transformers takes num_hash_layers (legacy) or mlp_layer_types */
    [KEY_N_HASH] = {HF_TF("num_hash_layers", "n_hash_layers"), K_INT, CF(n_hash_layers), 3, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_HC_MULT] = {ALL3("hc_mult"), K_INT, CF(hc_mult), 4, 1, 16, NULL, 0, KF_WRITE},
    [KEY_HC_ITERS] = {ALL3("hc_sinkhorn_iters"), K_INT, CF(hc_sinkhorn_iters), 20, 1, 10000, NULL, 0, KF_WRITE},
    [KEY_MAX_POS] = {{"max_position_embeddings", NULL, "max_position_embeddings"}, K_INT, CF(max_position_embeddings), 1048576, 1,
                     4294967296.0, NULL, 0, KF_WRITE},
    [KEY_BOS] = {{"bos_token_id", NULL, "bos_token_id"}, K_INT, CF(bos_token_id), 0, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_EOS] = {{"eos_token_id", NULL, "eos_token_id"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_WRITE}, /* parse_eos */
    [KEY_SCORE] = {HF_TF("scoring_func", "score_func"), K_ENUM, CF(score_func), DSV4_SCORE_SQRTSOFTPLUS, NO_RANGE,
                   ENUM_OF(score_values), KF_WRITE},
    [KEY_TOPK_METHOD] = {{"topk_method", NULL, NULL}, K_ENUM, NO_FIELD, 0, NO_RANGE, ENUM_OF(topk_values), KF_WRITE},
    [KEY_ACT] = {{"hidden_act", NULL, "hidden_act"}, K_ENUM, NO_FIELD, 0, NO_RANGE, ENUM_OF(act_values), KF_WRITE},
    [KEY_NORM_TOPK] = {{"norm_topk_prob", NULL, "norm_topk_prob"}, K_BOOL, CF(norm_topk_prob), 1, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_TIE] = {{"tie_word_embeddings", NULL, "tie_word_embeddings"}, K_BOOL, CF(tie_word_embeddings), 0, NO_RANGE, NULL, 0,
                 KF_WRITE},
    [KEY_ATTN_BIAS] = {{"attention_bias", NULL, "attention_bias"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_WRITE}, /* parse_doc */
    [KEY_ROUTE_SCALE] = {HF_TF("routed_scaling_factor", "route_scale"), K_NUM, CF(route_scale), 1.5, 1e-9, 1e9, NULL, 0, KF_WRITE},
    [KEY_SWIGLU] = {ALL3("swiglu_limit"), K_NUM, CF(swiglu_limit), 10.0, 0, 1e9, NULL, 0, KF_WRITE},
    [KEY_HC_EPS] = {ALL3("hc_eps"), K_NUM, CF(hc_eps), 1e-6, 1e-30, 0.5, NULL, 0, KF_WRITE},
    [KEY_NORM_EPS] = {HF_TF("rms_norm_eps", "norm_eps"), K_NUM, CF(norm_eps), 1e-6, 1e-30, 0.5, NULL, 0, KF_WRITE},
    /* the RoPE rows are range-checked by check_rope; rope_parameters (nested) overrides them */
    [KEY_ROPE_THETA] = {ALL3("rope_theta"), K_NUM, CF(rope_main.theta), 10000.0, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_COMPRESS_THETA] = {ALL3("compress_rope_theta"), K_NUM, CF(rope_compress.theta), 160000.0, NO_RANGE, NULL, 0, KF_WRITE},
    [KEY_ROPE_FACTOR] = {{NULL, "rope_factor", NULL}, K_NUM, CF(rope_compress.factor), 16.0, NO_RANGE, NULL, 0, 0},
    [KEY_BETA_FAST] = {{NULL, "beta_fast", NULL}, K_NUM, CF(rope_compress.beta_fast), 32.0, NO_RANGE, NULL, 0, 0},
    [KEY_BETA_SLOW] = {{NULL, "beta_slow", NULL}, K_NUM, CF(rope_compress.beta_slow), 1.0, NO_RANGE, NULL, 0, 0},
    [KEY_ORIGINAL_SEQ_LEN] = {{NULL, "original_seq_len", NULL}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, 0}, /* parse_ropes */
    [KEY_ROPE_SCALING] = {{"rope_scaling", NULL, NULL}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE | KF_WRITE},
    [KEY_ROPE_PARAMETERS] = {{NULL, NULL, "rope_parameters"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE}, /* parse_ropes */
    [KEY_PARTIAL_ROTARY] = {{NULL, NULL, "partial_rotary_factor"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE}, /* parse_doc */
    [KEY_COMPRESS_RATIOS] = {{"compress_ratios", "compress_ratios", NULL}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0,
                             KF_NULLABLE | KF_WRITE}, /* parse_attention_schedule */
    [KEY_LAYER_TYPES] = {{NULL, NULL, "layer_types"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE}, /* likewise */
    [KEY_COMPRESS_RATES] = {{NULL, NULL, "compress_rates"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE}, /* parse_rates */
    [KEY_RATE_CSA] = {{NULL, NULL, "compress_rate_csa"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE},  /* likewise */
    [KEY_RATE_HCA] = {{NULL, NULL, "compress_rate_hca"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE},  /* likewise */
    [KEY_MLP_LAYER_TYPES] = {{NULL, NULL, "mlp_layer_types"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0, KF_NULLABLE}, /* parse_mlp_schedule */
    [KEY_DTYPE] = {{"torch_dtype", "dtype", "dtype"}, K_ENUM, CF(weight_format), DSV4_WFMT_FP8, NO_RANGE, ENUM_OF(dtype_values),
                   KF_WRITE},
    [KEY_SCALE_FMT] = {{NULL, "scale_fmt", NULL}, K_ENUM, NO_FIELD, 0, NO_RANGE, ENUM_OF(ue8m0_values), 0},
    [KEY_QUANT] = {{"quantization_config", NULL, "quantization_config"}, K_OTHER, NO_FIELD, 0, NO_RANGE, NULL, 0,
                   KF_NULLABLE | KF_WRITE}, /* parse_quantization */
    [KEY_EXPERT_DTYPE] = {{"expert_dtype", "expert_dtype", NULL}, K_ENUM, CF(expert_format), DSV4_WFMT_AUTO, NO_RANGE,
                          ENUM_OF(expert_values), KF_WRITE},
};

/* Keys transformers configs (and the official ones) carry that say nothing dsv4 uses: no warning. */
static const char *const known_ignored[] = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "auto_map", "use_cache", "initializer_range",
    "pad_token_id", "attention_dropout", "mlp_bias", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "use_bfloat16", "tie_encoder_decoder", "is_encoder_decoder", "chunk_size_feed_forward", "id2label", "label2id",
    "problem_type", "tokenizer_class", "keys_to_ignore_at_inference", "max_batch_size", "max_seq_len", "ep_size",
    "n_group", "topk_group", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "first_k_dense_replace", "moe_layer_freq",
    "aux_loss_alpha", "seq_aux",
};

/* The spelling of row k that names it in messages and in the writer: official, else the other. */
static const char *key_name(int k) { return keys[k].name[0] ? keys[k].name[0] : keys[k].name[1] ? keys[k].name[1] : keys[k].name[2]; }

static void set_defaults(dsv4_model_config *c)
{
    for (int k = 0; k < N_KEYS; k++) {
        if (keys[k].off == NO_FIELD) continue;
        void *f = (char *)c + keys[k].off;
        switch (keys[k].type) {
        case K_INT: *(int64_t *)f = (int64_t)keys[k].def; break;
        case K_NUM: *(double *)f = keys[k].def; break;
        case K_BOOL:
        case K_ENUM: *(int *)f = (int)keys[k].def; break;
        case K_OTHER: break;
        }
    }
}

/* The official naming's rule (OF model.py): ratio 0 SWA, 4 CSA (overlapping + indexer), else HCA. */
static dsv4_attn_kind kind_of_ratio(int r) { return r == 0 ? DSV4_ATTN_SWA : r == 4 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA; }

/* The V4-Flash schedule generalized to n layers: 0, 1 SWA; then CSA (4) on even, HCA (128) on
 * odd layers; MTP blocks SWA. Hash routing on layers < n_hash_layers. */
static void default_schedule(dsv4_model_config *c)
{
    for (int64_t i = 0; i < DSV4_MAX_LAYERS; i++) {
        int r = (i < 2 || i >= c->n_layers) ? 0 : (i % 2 == 0 ? 4 : 128);
        c->compress_ratio[i] = r;
        c->attn_kind[i] = (uint8_t)kind_of_ratio(r);
    }
}

static void hash_prefix(dsv4_model_config *c)
{
    for (int64_t i = 0; i < DSV4_MAX_LAYERS; i++) c->hash_routed[i] = (uint8_t)(i < c->n_hash_layers && i < c->n_layers);
}

void dsv4_config_default(dsv4_model_config *c)
{
    memset(c, 0, sizeof *c);
    set_defaults(c); /* the table's fields; the rest: */
    c->nope_head_dim = c->head_dim - c->rope_head_dim;
    c->rope_main = (dsv4_rope_config){c->rope_main.theta, 0, 1.0, 0, 32.0, 1.0, 1.0};
    c->rope_compress = (dsv4_rope_config){c->rope_compress.theta, 1, c->rope_compress.factor, 65536,
                                          c->rope_compress.beta_fast, c->rope_compress.beta_slow, 1.0};
    c->n_eos = 1;
    c->eos_token_ids[0] = 1;
    default_schedule(c);
    hash_prefix(c);
    snprintf(c->naming, sizeof c->naming, "hf");
}

void dsv4_config_tiny(dsv4_model_config *c)
{
    dsv4_config_default(c);
    c->dim = 256;
    c->n_layers = 4;
    c->n_mtp_layers = 1;
    c->vocab_size = 512;
    c->n_heads = 4;
    c->q_lora_rank = 128;
    c->o_groups = 2;
    c->o_lora_rank = 64;
    c->window_size = 16;
    c->index_n_heads = 4;
    c->index_topk = 4;
    c->n_routed_experts = 8;
    c->n_activated_experts = 2;
    c->moe_inter_dim = 128;
    c->n_hash_layers = 2;
    c->max_position_embeddings = 4096;
    c->expert_format = DSV4_WFMT_FP4;
    static const int ratios[5] = {0, 4, 8, 4, 0}; /* SWA, CSA, HCA (ratio 8), CSA; MTP SWA */
    for (int i = 0; i < DSV4_MAX_LAYERS; i++) {
        int r = i < 5 ? ratios[i] : 0;
        c->compress_ratio[i] = r;
        c->attn_kind[i] = (uint8_t)kind_of_ratio(r);
    }
    hash_prefix(c);
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct cfg_parser {
    const mj_doc *d;
    const char *src;
    dsv4_model_config *c;
    /* which key set each value first, for the "two keys disagree" check */
    struct {
        const void *target;
        const char *key;
    } set[640];
    int n_set;
    char key_buf[640][40];
    int tf_ratio[DSV4_MAX_LAYERS]; /* transformers' default schedule (parse_attention_schedule) */
    uint8_t tf_kind[DSV4_MAX_LAYERS];
    dsv4_rope_config nested[2];    /* rope_parameters.main / .compress as read */
    double rope_prf[2];            /* their partial_rotary_factor (0: none) */
} cfg_parser;

/* Record that `key` sets `target`; if another key set it to a different value, fail. */
static dsv4_status claim(cfg_parser *p, const void *target, const char *key, int differs_from_previous)
{
    for (int i = 0; i < p->n_set; i++)
        if (p->set[i].target == target) {
            if (differs_from_previous)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: \"%s\" and \"%s\" give different values for the same setting", p->src,
                                 p->set[i].key, key);
            return DSV4_OK;
        }
    if (p->n_set < (int)(sizeof p->set / sizeof p->set[0])) {
        snprintf(p->key_buf[p->n_set], sizeof p->key_buf[0], "%s", key);
        p->set[p->n_set].target = target;
        p->set[p->n_set].key = p->key_buf[p->n_set];
        p->n_set++;
    }
    return DSV4_OK;
}

static int was_set(const cfg_parser *p, const void *target)
{
    for (int i = 0; i < p->n_set; i++)
        if (p->set[i].target == target) return 1;
    return 0;
}

static dsv4_status set_i64(cfg_parser *p, int64_t *target, int64_t v, const char *key)
{
    DSV4_TRY(claim(p, target, key, was_set(p, target) && *target != v));
    *target = v;
    return DSV4_OK;
}

static dsv4_status set_f64(cfg_parser *p, double *target, double v, const char *key)
{
    DSV4_TRY(claim(p, target, key, was_set(p, target) && *target != v));
    *target = v;
    return DSV4_OK;
}

static dsv4_status set_int(cfg_parser *p, int *target, int v, const char *key)
{
    DSV4_TRY(claim(p, target, key, was_set(p, target) && *target != v));
    *target = v;
    return DSV4_OK;
}

static dsv4_status type_error(const cfg_parser *p, const char *key, const char *want, uint32_t v)
{
    return dsv4_fail(DSV4_ERR_FORMAT, "%s: \"%s\" must be %s, got %s", p->src, key, want, mj_type_name(p->d->nodes[v].type));
}

/* Integer value of node v (integral numbers only). */
static dsv4_status get_int(const cfg_parser *p, uint32_t v, const char *key, int64_t *out)
{
    const mj_node *n = &p->d->nodes[v];
    if (n->type != MJ_NUMBER) return type_error(p, key, "an integer", v);
    if (n->is_int) {
        *out = n->v.i;
        return DSV4_OK;
    }
    double x = n->v.d;
    if (x != floor(x) || fabs(x) > 9007199254740992.0)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: \"%s\" must be an integer, got %g", p->src, key, x);
    *out = (int64_t)x;
    return DSV4_OK;
}

static dsv4_status get_num(const cfg_parser *p, uint32_t v, const char *key, double *out)
{
    if (p->d->nodes[v].type != MJ_NUMBER) return type_error(p, key, "a number", v);
    *out = mj_num(p->d, v);
    return DSV4_OK;
}

static dsv4_status get_bool(const cfg_parser *p, uint32_t v, const char *key, int *out)
{
    uint8_t t = p->d->nodes[v].type;
    if (t != MJ_TRUE && t != MJ_FALSE) return type_error(p, key, "true or false", v);
    *out = t == MJ_TRUE;
    return DSV4_OK;
}

static dsv4_status get_str(const cfg_parser *p, uint32_t v, const char *key, const char **out)
{
    if (p->d->nodes[v].type != MJ_STRING) return type_error(p, key, "a string", v);
    *out = mj_str(p->d, v);
    return DSV4_OK;
}

/* Member of object `obj`; null counts as absent (top-level nulls are checked first: check_keys). */
static uint32_t member(const cfg_parser *p, uint32_t obj, const char *key)
{
    uint32_t v = mj_get(p->d, obj, key);
    return v != MJ_NONE && p->d->nodes[v].type == MJ_NULL ? MJ_NONE : v;
}

/* The value of row k: its first spelling present (parse_keys reads and compares every spelling
 * of the field rows; a K_OTHER row has one spelling, or one the namings share). */
static uint32_t key_value(const cfg_parser *p, int k)
{
    for (int s = 0; s < 4; s++) {
        uint32_t v = keys[k].name[s] ? member(p, 0, keys[k].name[s]) : MJ_NONE;
        if (v != MJ_NONE) return v;
    }
    return MJ_NONE;
}

/* The row spelled `key`, or -1. */
static int key_row(const char *key)
{
    for (int k = 0; k < N_KEYS; k++)
        for (int s = 0; s < 4; s++)
            if (keys[k].name[s] && !strcmp(keys[k].name[s], key)) return k;
    return -1;
}

/* Every top-level key: null only where the row allows it (null never means the default), and a
 * warning (dsv4_warn) for a key of no row that is not known to be ignorable. Also notes the
 * naming: *reference / *transformers = a spelling only that naming has is present. */
static dsv4_status check_keys(const cfg_parser *p, int *reference, int *transformers)
{
    const mj_doc *d = p->d;
    *reference = *transformers = 0;
    for (uint32_t i = 1, n = 0; n < d->nodes[0].count; n++) {
        uint32_t v = d->nodes[i].end;
        const char *key = mj_str(d, i);
        char q[64];
        mj_quote(key, d->nodes[i].count, q, sizeof q);
        int k = key_row(key);
        if (!strcmp(key, "weight_map"))
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: has a \"weight_map\": a shard index (model.safetensors.index.json), not config.json",
                             p->src);
        if (k >= 0) {
            if (d->nodes[v].type == MJ_NULL && !(keys[k].flags & KF_NULLABLE))
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: \"%s\" is null; give a value or leave the key out (null is not the default)",
                                 p->src, q);
            int hf = keys[k].name[0] && !strcmp(keys[k].name[0], key);
            int tf = (keys[k].name[2] && !strcmp(keys[k].name[2], key)) || (keys[k].name[3] && !strcmp(keys[k].name[3], key));
            int ref = keys[k].name[1] && !strcmp(keys[k].name[1], key);
            int given = d->nodes[v].type != MJ_NULL;
            *reference |= given && ref && !hf && !tf;
            *transformers |= given && tf && !hf && !ref;
        } else {
            size_t j = 0, n_ign = sizeof known_ignored / sizeof known_ignored[0];
            while (j < n_ign && strcmp(known_ignored[j], key)) j++;
            if (j == n_ign && !d->nodes[i].has_nul) dsv4_warn("%s: unknown config key \"%s\" ignored", p->src, q);
        }
        i = d->nodes[v].end;
    }
    return DSV4_OK;
}

/* The value of string `key` among `table`; absent keys leave *out alone. */
static dsv4_status parse_enum(cfg_parser *p, uint32_t obj, const char *key, const name_value *table, int n, int *out,
                              int *present)
{
    uint32_t v = member(p, obj, key);
    if (present) *present = v != MJ_NONE;
    if (v == MJ_NONE) return DSV4_OK;
    const char *s = NULL;
    DSV4_TRY(get_str(p, v, key, &s));
    for (int i = 0; i < n; i++)
        if (!strcmp(s, table[i].name)) {
            *out = table[i].value;
            return DSV4_OK;
        }
    char q[64];
    mj_quote(s, strlen(s), q, sizeof q);
    return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s = \"%s\" is not supported", p->src, key, q);
}

/* Every spelling of every field row (two spellings of one field must agree). */
static dsv4_status parse_keys(cfg_parser *p)
{
    char *base = (char *)p->c;
    for (int k = 0; k < N_KEYS; k++) {
        const cfg_key *r = &keys[k];
        for (int s = 0; s < 4; s++) {
            const char *key = r->name[s];
            int seen = 0;
            for (int t = 0; t < s && key; t++) seen |= r->name[t] && !strcmp(key, r->name[t]);
            if (!key || seen) continue; /* a spelling already read */
            uint32_t v = member(p, 0, key);
            if (v == MJ_NONE || r->type == K_OTHER) continue;
            void *f = r->off == NO_FIELD ? NULL : base + r->off;
            int64_t xi = 0;
            double xd = 0;
            int xb = 0;
            switch (r->type) {
            case K_INT:
                DSV4_TRY(get_int(p, v, key, &xi));
                DSV4_TRY(set_i64(p, f, xi, key));
                break;
            case K_NUM:
                DSV4_TRY(get_num(p, v, key, &xd));
                DSV4_TRY(set_f64(p, f, xd, key));
                break;
            case K_BOOL:
                DSV4_TRY(get_bool(p, v, key, &xb));
                DSV4_TRY(set_int(p, f, xb, key));
                break;
            case K_ENUM:
                xb = -1;
                DSV4_TRY(parse_enum(p, 0, key, r->values, r->n_values, &xb, NULL));
                if (f && xb >= 0) DSV4_TRY(set_int(p, f, xb, key));
                break;
            case K_OTHER: break;
            }
        }
    }
    return DSV4_OK;
}

static dsv4_status parse_eos(cfg_parser *p)
{
    const char *key = key_name(KEY_EOS);
    uint32_t v = key_value(p, KEY_EOS);
    if (v == MJ_NONE) return DSV4_OK;
    const mj_node *n = &p->d->nodes[v];
    if (n->type == MJ_ARRAY) {
        if (n->count == 0 || n->count > DSV4_MAX_EOS)
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has %u entries (1 to %d allowed)", p->src, key, n->count, DSV4_MAX_EOS);
        for (uint32_t i = 0, e = v + 1; i < n->count; i++, e = p->d->nodes[e].end)
            DSV4_TRY(get_int(p, e, key, &p->c->eos_token_ids[i]));
        p->c->n_eos = (int)n->count;
    } else {
        DSV4_TRY(get_int(p, v, key, &p->c->eos_token_ids[0]));
        p->c->n_eos = 1;
    }
    return DSV4_OK;
}

static dsv4_status parse_quantization(cfg_parser *p)
{
    const char *key = key_name(KEY_QUANT);
    uint32_t q = key_value(p, KEY_QUANT);
    if (q == MJ_NONE) return DSV4_OK;
    if (p->d->nodes[q].type != MJ_OBJECT) return type_error(p, key, "an object", q);
    static const name_value method[] = {{"fp8", 0}};
    static const name_value fmt[] = {{"e4m3", 0}};
    static const name_value act[] = {{"dynamic", 0}};
    int ignored = 0, present;
    DSV4_TRY(parse_enum(p, q, "quant_method", method, 1, &ignored, &present));
    if (!present) return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has no quant_method", p->src, key);
    DSV4_TRY(parse_enum(p, q, "fmt", fmt, 1, &ignored, NULL));
    DSV4_TRY(parse_enum(p, q, "scale_fmt", ue8m0_values, 1, &ignored, NULL));
    DSV4_TRY(parse_enum(p, q, "activation_scheme", act, 1, &ignored, NULL));
    uint32_t b = member(p, q, "weight_block_size");
    if (b != MJ_NONE) {
        const mj_node *n = &p->d->nodes[b];
        int64_t x0 = 0, x1 = 0;
        if (n->type != MJ_ARRAY || n->count != 2) return type_error(p, "weight_block_size", "[128, 128]", b);
        DSV4_TRY(get_int(p, b + 1, "weight_block_size", &x0));
        DSV4_TRY(get_int(p, p->d->nodes[b + 1].end, "weight_block_size", &x1));
        if (x0 != 128 || x1 != 128)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: weight_block_size [%lld, %lld]: only 128x128 blocks are supported",
                             p->src, (long long)x0, (long long)x1);
    }
    return set_int(p, (int *)&p->c->weight_format, DSV4_WFMT_FP8, key);
}

/* One rope description: an entry of transformers' rope_parameters (nested: with its own
 * rope_theta and partial_rotary_factor) or the official rope_scaling / a flat rope_parameters
 * (YaRN numbers only). A YaRN entry of rope_parameters without attention_factor gets
 * transformers' default, 0.1 ln(factor) + 1 (factor > 1). */
static dsv4_status parse_rope(cfg_parser *p, uint32_t r, const char *key, dsv4_rope_config *rc, int nested, double *prf)
{
    if (p->d->nodes[r].type != MJ_OBJECT) return type_error(p, key, "an object", r);
    static const name_value types[] = {{"yarn", 1}, {"default", 0}};
    int yarn = -1, other = -1;
    DSV4_TRY(parse_enum(p, r, "rope_type", types, 2, &yarn, NULL));
    DSV4_TRY(parse_enum(p, r, "type", types, 2, &other, NULL));
    if (yarn >= 0 && other >= 0 && yarn != other)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has rope_type and type that disagree", p->src, key);
    if (yarn < 0) yarn = other;
    if (yarn >= 0) DSV4_TRY(set_int(p, &rc->yarn, yarn, key));
    if (!nested && member(p, r, "rope_theta") != MJ_NONE)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s.rope_theta: a flat %s holds YaRN numbers only (the bases are rope_theta and "
                         "compress_rope_theta; transformers ignores this one); nest it as {\"main\": ..., \"compress\": ...}",
                         p->src, key, key);
    static const struct {
        const char *k;
        size_t off;
    } nums[] = {{"rope_theta", offsetof(dsv4_rope_config, theta)},
                {"factor", offsetof(dsv4_rope_config, factor)},
                {"beta_fast", offsetof(dsv4_rope_config, beta_fast)},
                {"beta_slow", offsetof(dsv4_rope_config, beta_slow)},
                {"attention_factor", offsetof(dsv4_rope_config, attention_factor)}};
    for (size_t i = nested ? 0 : 1; i < sizeof nums / sizeof nums[0]; i++) {
        uint32_t v = member(p, r, nums[i].k);
        double x = 0;
        if (v == MJ_NONE) continue;
        DSV4_TRY(get_num(p, v, nums[i].k, &x));
        DSV4_TRY(set_f64(p, (double *)((char *)rc + nums[i].off), x, key));
    }
    if (nested && member(p, r, "rope_theta") == MJ_NONE)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has no rope_theta", p->src, key);
    if (nested && rc->yarn && member(p, r, "attention_factor") == MJ_NONE)
        rc->attention_factor = rc->factor > 1 ? 0.1 * log(rc->factor) + 1.0 : 1.0;
    uint32_t v = member(p, r, "original_max_position_embeddings");
    if (v != MJ_NONE) {
        int64_t x = 0;
        DSV4_TRY(get_int(p, v, "original_max_position_embeddings", &x));
        DSV4_TRY(set_i64(p, &rc->original_max_position, x, key));
    }
    if (nested && (v = member(p, r, "partial_rotary_factor")) != MJ_NONE) {
        DSV4_TRY(get_num(p, v, "partial_rotary_factor", prf));
        if (!(*prf > 0)) return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s.partial_rotary_factor %g is not positive", p->src, key, *prf);
    }
    return DSV4_OK;
}

/* The two ropes. transformers' rope_parameters {"main": ..., "compress": ...} (both entries)
 * override rope_theta, compress_rope_theta, rope_scaling and the reference's YaRN keys, which it
 * then ignores; a flat rope_parameters is compress's YaRN numbers, like rope_scaling. */
static dsv4_status parse_ropes(cfg_parser *p)
{
    dsv4_model_config *c = p->c;
    uint32_t v = key_value(p, KEY_ORIGINAL_SEQ_LEN); /* reference naming: 0 = no YaRN */
    if (v != MJ_NONE) {
        const char *key = key_name(KEY_ORIGINAL_SEQ_LEN);
        int64_t x = 0;
        DSV4_TRY(get_int(p, v, key, &x));
        DSV4_TRY(set_i64(p, &c->rope_compress.original_max_position, x, key));
        DSV4_TRY(set_int(p, &c->rope_compress.yarn, x > 0, key));
    }
    if ((v = key_value(p, KEY_ROPE_SCALING)) != MJ_NONE)
        DSV4_TRY(parse_rope(p, v, key_name(KEY_ROPE_SCALING), &c->rope_compress, 0, NULL));
    uint32_t rp = key_value(p, KEY_ROPE_PARAMETERS);
    if (rp == MJ_NONE) return DSV4_OK;
    const char *key = key_name(KEY_ROPE_PARAMETERS);
    if (p->d->nodes[rp].type != MJ_OBJECT) return type_error(p, key, "an object", rp);
    uint32_t main = member(p, rp, "main"), comp = member(p, rp, "compress");
    if (main == MJ_NONE && comp == MJ_NONE) return parse_rope(p, rp, key, &c->rope_compress, 0, NULL);
    if (main == MJ_NONE || comp == MJ_NONE)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has \"%s\" but no \"%s\" entry (transformers ignores a lone entry); give both",
                         p->src, key, main != MJ_NONE ? "main" : "compress", main != MJ_NONE ? "compress" : "main");
    static const dsv4_rope_config plain = {10000.0, 0, 1.0, 0, 32.0, 1.0, 1.0};
    p->nested[0] = p->nested[1] = plain;
    DSV4_TRY(parse_rope(p, main, "rope_parameters.main", &p->nested[0], 1, &p->rope_prf[0]));
    DSV4_TRY(parse_rope(p, comp, "rope_parameters.compress", &p->nested[1], 1, &p->rope_prf[1]));
    c->rope_main = p->nested[0];
    c->rope_compress = p->nested[1];
    return DSV4_OK;
}

/* An array of at least `lo` entries (at most `hi`, when hi >= lo). */
static dsv4_status check_array(cfg_parser *p, uint32_t v, const char *key, int64_t lo, int64_t hi)
{
    const mj_node *n = &p->d->nodes[v];
    if (n->type != MJ_ARRAY) return type_error(p, key, "an array", v);
    if ((int64_t)n->count < lo || (hi >= lo && (int64_t)n->count > hi))
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s has %u entries; expected one per layer (%lld)%s", p->src, key, n->count,
                         (long long)lo, hi >= lo ? ", or one more per MTP block" : " or more");
    return DSV4_OK;
}

static dsv4_status set_layer(cfg_parser *p, int64_t i, int ratio, dsv4_attn_kind kind, const char *key)
{
    dsv4_model_config *c = p->c;
    if (ratio < 0 || ratio > 65536)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s[%lld] = %d is not a compression ratio (0, or 2 to 65536)", p->src, key,
                         (long long)i, ratio);
    if (was_set(p, &c->compress_ratio[i]) && (c->compress_ratio[i] != ratio || c->attn_kind[i] != kind))
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s[%lld] disagrees with the other description of layer %lld", p->src, key,
                         (long long)i, (long long)i);
    DSV4_TRY(claim(p, &c->compress_ratio[i], key, 0));
    c->compress_ratio[i] = ratio;
    c->attn_kind[i] = (uint8_t)kind;
    return DSV4_OK;
}

static const char *const layer_type_names[3] = {"sliding_attention", "compressed_sparse_attention",
                                                "heavily_compressed_attention"}; /* by dsv4_attn_kind */

/* transformers' compression rate of each attention kind: compress_rates, then the top-level
 * compress_rate_csa / compress_rate_hca that override it. *have: any of them is present. */
static dsv4_status parse_rates(cfg_parser *p, int64_t rate[3], int *have)
{
    rate[DSV4_ATTN_SWA] = 0, rate[DSV4_ATTN_CSA] = 4, rate[DSV4_ATTN_HCA] = 128;
    *have = 0;
    uint32_t rates = key_value(p, KEY_COMPRESS_RATES);
    if (rates != MJ_NONE) {
        if (p->d->nodes[rates].type != MJ_OBJECT) return type_error(p, key_name(KEY_COMPRESS_RATES), "an object", rates);
        *have = 1;
        for (int k = DSV4_ATTN_CSA; k <= DSV4_ATTN_HCA; k++) {
            uint32_t x = member(p, rates, layer_type_names[k]);
            if (x != MJ_NONE) DSV4_TRY(get_int(p, x, layer_type_names[k], &rate[k]));
        }
    }
    static const int legacy[3] = {-1, KEY_RATE_CSA, KEY_RATE_HCA};
    for (int k = DSV4_ATTN_CSA; k <= DSV4_ATTN_HCA; k++) {
        uint32_t x = key_value(p, legacy[k]);
        if (x == MJ_NONE) continue;
        DSV4_TRY(get_int(p, x, key_name(legacy[k]), &rate[k]));
        *have = 1;
    }
    for (int k = DSV4_ATTN_CSA; k <= DSV4_ATTN_HCA; k++)
        if (rate[k] < 2 || rate[k] > 65536)
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: the compression rate of %s is %lld (2 to 65536 allowed)", p->src,
                             layer_type_names[k], (long long)rate[k]);
    return DSV4_OK;
}

/* The attention schedule, as transformers' DeepseekV4Config reads it: a layer's kind comes from
 * its layer_types entry and its ratio from the compression rate of that kind (parse_rates); a CSA
 * layer compresses overlapping windows and has an indexer, an HCA layer neither, whatever the
 * ratio. Without layer_types, compress_ratios names the kinds: with rates given, through
 * transformers' table {0: SWA, 4: CSA, 128: HCA}; without, by the official rule (kind_of_ratio): the
 * ratio as written, CSA where it is 4 (so ratios like 8 stay expressible). When both are given
 * they must describe the same layers. Entries past the blocks (transformers keeps the first
 * num_hidden_layers) are not read. *transformers_default: neither is given. */
static dsv4_status parse_attention_schedule(cfg_parser *p, int *transformers_default)
{
    dsv4_model_config *c = p->c;
    const int64_t nl = c->n_layers, nb = c->n_layers + c->n_mtp_layers, extra = c->n_mtp_layers > 1 ? c->n_mtp_layers : 1;
    int64_t rate[3];
    int have_rates;
    DSV4_TRY(parse_rates(p, rate, &have_rates));
    uint32_t lt = key_value(p, KEY_LAYER_TYPES), cr = key_value(p, KEY_COMPRESS_RATIOS);
    const char *lt_key = key_name(KEY_LAYER_TYPES), *cr_key = key_name(KEY_COMPRESS_RATIOS);
    *transformers_default = lt == MJ_NONE && cr == MJ_NONE;
    if (cr != MJ_NONE) {
        DSV4_TRY(check_array(p, cr, cr_key, nl, nl + extra));
        uint32_t e = cr + 1;
        for (int64_t i = 0; i < (int64_t)p->d->nodes[cr].count && i < nb; i++, e = p->d->nodes[e].end) {
            int64_t r = 0;
            DSV4_TRY(get_int(p, e, cr_key, &r));
            if (r == 1) r = 0; /* vLLM-style configs write 1 for "no compression" */
            if (r < 0 || r > 65536)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s[%lld] = %lld is not a compression ratio (0, or 2 to 65536)", p->src,
                                 cr_key, (long long)i, (long long)r);
            dsv4_attn_kind k = kind_of_ratio((int)r);
            if (have_rates && r != 0 && r != 4 && r != 128)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s[%lld] = %lld: with %s given, %s only names each layer's kind "
                                 "(0 SWA, 4 CSA, 128 HCA), as transformers reads it", p->src, cr_key, (long long)i,
                                 (long long)r, key_name(KEY_COMPRESS_RATES), cr_key);
            if (have_rates) r = rate[k];
            if (lt == MJ_NONE || !have_rates) DSV4_TRY(set_layer(p, i, (int)r, k, cr_key));
            else c->attn_kind[i] = (uint8_t)k; /* compared with layer_types below */
        }
    }
    if (lt != MJ_NONE) {
        DSV4_TRY(check_array(p, lt, lt_key, nl, 0));
        uint32_t e = lt + 1;
        for (int64_t i = 0; i < (int64_t)p->d->nodes[lt].count && i < nb; i++, e = p->d->nodes[e].end) {
            const char *s = NULL;
            DSV4_TRY(get_str(p, e, lt_key, &s));
            int k = 0;
            while (k < 3 && strcmp(s, layer_type_names[k])) k++;
            if (k == 3) {
                char q[64];
                mj_quote(s, strlen(s), q, sizeof q);
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s[%lld] = \"%s\" is not a DeepSeek-V4 attention type", p->src,
                                 lt_key, (long long)i, q);
            }
            if (cr != MJ_NONE && have_rates && i < (int64_t)p->d->nodes[cr].count && c->attn_kind[i] != k)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s[%lld] disagrees with %s[%lld] (layer %lld)", p->src, lt_key,
                                 (long long)i, cr_key, (long long)i, (long long)i);
            DSV4_TRY(set_layer(p, i, (int)rate[k], (dsv4_attn_kind)k, lt_key));
        }
    }
    if (*transformers_default) /* kept for the caller: only a transformers-named config takes its default */
        for (int64_t i = 0; i < DSV4_MAX_LAYERS; i++) {
            dsv4_attn_kind k = i >= nl ? DSV4_ATTN_SWA : (i >= 3 && i % 2) ? DSV4_ATTN_CSA : DSV4_ATTN_HCA;
            p->tf_ratio[i] = (int)rate[k];
            p->tf_kind[i] = (uint8_t)k;
        }
    return DSV4_OK;
}

/* mlp_layer_types (transformers): "hash_moe" or "moe" per layer; the first num_hidden_layers count. */
static dsv4_status parse_mlp_schedule(cfg_parser *p)
{
    dsv4_model_config *c = p->c;
    const int64_t nl = c->n_layers;
    const char *key = key_name(KEY_MLP_LAYER_TYPES);
    uint32_t v = key_value(p, KEY_MLP_LAYER_TYPES);
    if (v == MJ_NONE) return DSV4_OK;
    DSV4_TRY(check_array(p, v, key, nl, 0));
    int64_t n_hash = 0;
    uint32_t e = v + 1;
    for (int64_t i = 0; i < nl; i++, e = p->d->nodes[e].end) {
        const char *s = NULL;
        DSV4_TRY(get_str(p, e, key, &s));
        if (strcmp(s, "hash_moe") && strcmp(s, "moe")) {
            char q[64];
            mj_quote(s, strlen(s), q, sizeof q);
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s[%lld] = \"%s\" is not supported (hash_moe or moe)", p->src, key,
                             (long long)i, q);
        }
        c->hash_routed[i] = (uint8_t)(s[0] == 'h');
        n_hash += c->hash_routed[i];
    }
    DSV4_TRY(set_i64(p, &c->n_hash_layers, n_hash, key));
    return claim(p, c->hash_routed, key, 0);
}

static dsv4_status parse_doc(cfg_parser *p)
{
    dsv4_model_config *c = p->c;
    if (p->d->nodes[0].type != MJ_OBJECT) return dsv4_fail(DSV4_ERR_FORMAT, "%s: config must be a JSON object", p->src);
    int reference, transformers;
    DSV4_TRY(check_keys(p, &reference, &transformers));
    int64_t default_layers = c->n_layers;
    DSV4_TRY(parse_keys(p));
    DSV4_TRY(parse_eos(p));
    uint32_t v = key_value(p, KEY_ATTN_BIAS);
    if (v != MJ_NONE) {
        int b = 0;
        DSV4_TRY(get_bool(p, v, key_name(KEY_ATTN_BIAS), &b));
        if (b) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s = true: DeepSeek-V4 has no attention biases", p->src, key_name(KEY_ATTN_BIAS));
    }
    DSV4_TRY(parse_quantization(p));
    DSV4_TRY(parse_ropes(p));
    /* everything below depends on n_layers: bound it before using it as an array size */
    if (c->n_layers < 1 || c->n_layers > DSV4_MAX_LAYERS - 1 || c->n_mtp_layers < 0 ||
        c->n_layers + c->n_mtp_layers > DSV4_MAX_LAYERS)
        return dsv4_fail(DSV4_ERR_RANGE, "%s: %lld layers + %lld MTP layers: at most %d blocks in all", p->src,
                         (long long)c->n_layers, (long long)c->n_mtp_layers, DSV4_MAX_LAYERS);
    if (c->n_layers != default_layers) default_schedule(c);
    int no_schedule;
    DSV4_TRY(parse_attention_schedule(p, &no_schedule));
    DSV4_TRY(parse_mlp_schedule(p));
    if (no_schedule && transformers) /* transformers' default: 2 HCA layers, then HCA / CSA alternating */
        for (int64_t i = 0; i < DSV4_MAX_LAYERS; i++) {
            c->compress_ratio[i] = p->tf_ratio[i];
            c->attn_kind[i] = p->tf_kind[i];
        }
    if (!was_set(p, c->hash_routed)) {
        if (!was_set(p, &c->n_hash_layers) && c->n_hash_layers > c->n_layers) c->n_hash_layers = c->n_layers;
        hash_prefix(c);
    }
    for (int64_t i = c->n_layers; i < DSV4_MAX_LAYERS; i++) c->hash_routed[i] = 0;
    for (int64_t i = c->n_layers + c->n_mtp_layers; i < DSV4_MAX_LAYERS; i++) { /* entries past the last block */
        c->compress_ratio[i] = 0;
        c->attn_kind[i] = DSV4_ATTN_SWA;
    }
    /* YaRN numbers mean nothing without YaRN: keep one form of "plain RoPE" */
    dsv4_rope_config *ropes[2] = {&c->rope_main, &c->rope_compress};
    for (int k = 0; k < 2; k++)
        if (!ropes[k]->yarn) *ropes[k] = (dsv4_rope_config){ropes[k]->theta, 0, 1.0, 0, 32.0, 1.0, 1.0};
    /* the rope head dims, given as a fraction by transformers (also per rope_parameters entry) */
    const char *prf_key = key_name(KEY_PARTIAL_ROTARY);
    if ((v = key_value(p, KEY_PARTIAL_ROTARY)) != MJ_NONE) {
        double f = 0;
        DSV4_TRY(get_num(p, v, prf_key, &f));
        double dims = f * (double)c->head_dim;
        if (!was_set(p, &c->rope_head_dim) && dims >= 0 && dims <= 65536 && dims == floor(dims))
            c->rope_head_dim = (int64_t)dims;
        else if (dims != (double)c->rope_head_dim)
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: %s %g x head_dim %lld disagrees with %lld rope dims", p->src, prf_key, f,
                             (long long)c->head_dim, (long long)c->rope_head_dim);
    }
    for (int k = 0; k < 2; k++)
        if (p->rope_prf[k] != 0 && p->rope_prf[k] * (double)c->head_dim != (double)c->rope_head_dim)
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: rope_parameters.%s.%s %g x head_dim %lld disagrees with %lld rope dims", p->src,
                             k ? "compress" : "main", prf_key, p->rope_prf[k], (long long)c->head_dim, (long long)c->rope_head_dim);
    c->nope_head_dim = c->head_dim - c->rope_head_dim;
    snprintf(c->naming, sizeof c->naming, "%s", transformers ? "transformers" : reference ? "reference" : "hf");
    if (!was_set(p, &c->weight_format)) c->weight_format = reference ? DSV4_WFMT_FP8 : DSV4_WFMT_BF16;
    if (!was_set(p, &c->expert_format) && c->weight_format == DSV4_WFMT_BF16) c->expert_format = DSV4_WFMT_BF16;
    return DSV4_OK;
}

dsv4_status dsv4_config_parse(const char *json, size_t len, const char *source, dsv4_model_config *out)
{
    DSV4_CHECK_ARG(json && out, "config_parse: null argument");
    if (!source) source = "config.json";
    if (len > MAX_CONFIG_BYTES) return dsv4_fail(DSV4_ERR_FORMAT, "%s: %zu bytes is too large for a config", source, len);
    mj_doc d;
    DSV4_TRY(mj_parse(json, len, source, &d));
    cfg_parser *p = calloc(1, sizeof *p);
    dsv4_model_config *c = malloc(sizeof *c);
    dsv4_status st;
    if (!p || !c) {
        st = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory", source);
    } else {
        dsv4_config_default(c);
        p->d = &d;
        p->src = source;
        p->c = c;
        st = parse_doc(p);
        if (st == DSV4_OK) {
            st = dsv4_config_validate(c);
            if (st != DSV4_OK) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", dsv4_last_error());
                st = dsv4_fail(st, "%s: %s", source, msg);
            }
        }
        if (st == DSV4_OK) *out = *c;
    }
    free(p);
    free(c);
    mj_free(&d);
    return st;
}

dsv4_status dsv4_config_load(const char *path, dsv4_model_config *out)
{
    DSV4_CHECK_ARG(path && out, "config_load: null argument");
    char *file = NULL, *text = NULL;
    size_t n = strlen(path), len;
    file = malloc(n + 16);
    if (!file) return dsv4_fail(DSV4_ERR_NO_MEMORY, "config_load: out of memory");
    memcpy(file, path, n + 1);
    if (n < 5 || strcmp(path + n - 5, ".json")) snprintf(file + n, 16, "%sconfig.json", n && path[n - 1] == '/' ? "" : "/");
    dsv4_status st = dsv4_read_file(file, MAX_CONFIG_BYTES, &text, &len);
    if (st == DSV4_OK) st = dsv4_config_parse(text, len, file, out);
    free(text);
    free(file);
    return st;
}

/* ---- validation --------------------------------------------------------------------------- */

static int finite_in(double x, double lo, double hi) { return isfinite(x) && x >= lo && x <= hi; }

static dsv4_status check_rope(const dsv4_rope_config *r, const char *which)
{
    if (!finite_in(r->theta, 1.0000001, 1e12))
        return dsv4_fail(DSV4_ERR_RANGE, "%s rope theta %g is not in (1, 1e12]", which, r->theta);
    if (!r->yarn) return DSV4_OK;
    if (!finite_in(r->factor, 1.0, 1e6) || r->original_max_position < 1 || r->original_max_position > ((int64_t)1 << 32) ||
        !finite_in(r->beta_fast, 1e-6, 1e6) || !finite_in(r->beta_slow, 1e-6, 1e6) || r->beta_fast < r->beta_slow ||
        !finite_in(r->attention_factor, 1e-6, 1e6))
        return dsv4_fail(DSV4_ERR_RANGE,
                         "%s rope YaRN parameters out of range (factor %g >= 1, original_max_position_embeddings %lld >= 1, "
                         "beta_fast %g >= beta_slow %g > 0, attention_factor %g > 0)",
                         which, r->factor, (long long)r->original_max_position, r->beta_fast, r->beta_slow, r->attention_factor);
    if (r->attention_factor != 1.0) /* the RoPE tables (dsv4/attention.h) apply no mscale, as DeepSeek-V4 */
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s rope YaRN attention_factor %g: dsv4 scales no logits (DeepSeek-V4 uses 1.0; "
                         "transformers takes 0.1 ln(factor) + 1 where rope_parameters leaves it out)", which, r->attention_factor);
    return DSV4_OK;
}

dsv4_status dsv4_config_validate(const dsv4_model_config *c)
{
    DSV4_CHECK_ARG(c, "config_validate: null config");
    if (c->n_layers < 1 || c->n_layers > DSV4_MAX_LAYERS - 1 || c->n_mtp_layers < 0 ||
        c->n_layers + c->n_mtp_layers > DSV4_MAX_LAYERS)
        return dsv4_fail(DSV4_ERR_RANGE, "%lld layers + %lld MTP layers: at most %d blocks in all", (long long)c->n_layers,
                         (long long)c->n_mtp_layers, DSV4_MAX_LAYERS);
    for (int k = 0; k < N_KEYS; k++) { /* the table's ranges */
        const cfg_key *r = &keys[k];
        if (r->lo > r->hi) continue;
        const char *f = (const char *)c + r->off;
        if (r->type == K_INT) {
            int64_t v = *(const int64_t *)f;
            if ((double)v >= r->lo && (double)v <= r->hi) continue;
            if (r->lo == r->hi)
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s = %lld: dsv4 needs %.0f (the 512 = 448 + 64 head and cache layout)",
                                 key_name(k), (long long)v, r->lo);
            return dsv4_fail(DSV4_ERR_RANGE, "%s = %lld is out of range (%.0f to %.0f)", key_name(k), (long long)v, r->lo, r->hi);
        }
        if (r->type == K_NUM && !finite_in(*(const double *)f, r->lo, r->hi))
            return dsv4_fail(DSV4_ERR_RANGE, "%s = %g is not finite in [%g, %g]", key_name(k), *(const double *)f, r->lo, r->hi);
    }
    if (c->nope_head_dim != c->head_dim - c->rope_head_dim)
        return dsv4_fail(DSV4_ERR_RANGE, "nope dims %lld != head_dim %lld - rope dims %lld", (long long)c->nope_head_dim,
                         (long long)c->head_dim, (long long)c->rope_head_dim);
    if (c->n_heads % c->o_groups)
        return dsv4_fail(DSV4_ERR_RANGE, "o_groups %lld does not divide num_attention_heads %lld", (long long)c->o_groups,
                         (long long)c->n_heads);
    if (c->index_head_dim & (c->index_head_dim - 1))
        return dsv4_fail(DSV4_ERR_RANGE, "index_head_dim %lld is not a power of two (Hadamard rotation)", (long long)c->index_head_dim);
    if (c->n_activated_experts > c->n_routed_experts)
        return dsv4_fail(DSV4_ERR_RANGE, "num_experts_per_tok %lld > n_routed_experts %lld", (long long)c->n_activated_experts,
                         (long long)c->n_routed_experts);
    if ((c->n_layers + c->n_mtp_layers) * c->n_routed_experts > 65536)
        return dsv4_fail(DSV4_ERR_RANGE, "%lld blocks x %lld experts is more than the 65536 expert slots supported",
                         (long long)(c->n_layers + c->n_mtp_layers), (long long)c->n_routed_experts);
    if (c->n_hash_layers < 0 || c->n_hash_layers > c->n_layers)
        return dsv4_fail(DSV4_ERR_RANGE, "num_hash_layers %lld is not in [0, %lld]", (long long)c->n_hash_layers, (long long)c->n_layers);
    if ((unsigned)c->score_func > DSV4_SCORE_SIGMOID) return dsv4_fail(DSV4_ERR_RANGE, "unknown scoring function %d", (int)c->score_func);
    DSV4_TRY(check_rope(&c->rope_main, "main"));
    DSV4_TRY(check_rope(&c->rope_compress, "compress"));
    if (c->bos_token_id < 0 || c->bos_token_id >= c->vocab_size)
        return dsv4_fail(DSV4_ERR_RANGE, "bos_token_id %lld is not a token of the %lld-entry vocabulary", (long long)c->bos_token_id,
                         (long long)c->vocab_size);
    if (c->n_eos < 1 || c->n_eos > DSV4_MAX_EOS) return dsv4_fail(DSV4_ERR_RANGE, "%d eos ids (1 to %d allowed)", c->n_eos, DSV4_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] < 0 || c->eos_token_ids[i] >= c->vocab_size)
            return dsv4_fail(DSV4_ERR_RANGE, "eos_token_id %lld is not a token of the %lld-entry vocabulary",
                             (long long)c->eos_token_ids[i], (long long)c->vocab_size);
    if (c->weight_format != DSV4_WFMT_BF16 && c->weight_format != DSV4_WFMT_FP8)
        return dsv4_fail(DSV4_ERR_RANGE, "non-expert weights must be bf16 or fp8, not %s", dsv4_weight_format_name(c->weight_format));
    if ((unsigned)c->expert_format > DSV4_WFMT_FP4) return dsv4_fail(DSV4_ERR_RANGE, "unknown expert format %d", (int)c->expert_format);
    for (int64_t i = 0; i < c->n_layers + c->n_mtp_layers; i++) {
        int r = c->compress_ratio[i];
        int ok = c->attn_kind[i] == DSV4_ATTN_SWA ? r == 0 : (c->attn_kind[i] <= DSV4_ATTN_HCA && r >= 2 && r <= 65536);
        if (!ok)
            return dsv4_fail(DSV4_ERR_RANGE, "block %lld: attention kind %d with compression ratio %d", (long long)i,
                             (int)c->attn_kind[i], r);
        if (c->hash_routed[i] > 1 || (c->hash_routed[i] && i >= c->n_layers))
            return dsv4_fail(DSV4_ERR_RANGE, "block %lld: hash routing flag %d", (long long)i, (int)c->hash_routed[i]);
    }
    /* FP8/FP4 linear layers take activations quantized in 1x128 groups: their inputs must be whole groups */
    int q_weights = c->weight_format == DSV4_WFMT_FP8, q_experts = c->expert_format != DSV4_WFMT_BF16;
    const struct {
        const char *what;
        int64_t k;
        int quantized;
    } ks[] = {{"hidden_size", c->dim, q_weights || q_experts},
              {"q_lora_rank", c->q_lora_rank, q_weights},
              {"o_groups x o_lora_rank", c->o_groups * c->o_lora_rank, q_weights},
              {"moe_intermediate_size", c->moe_inter_dim, q_experts || (q_weights && c->n_shared_experts)}};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if (ks[i].quantized && ks[i].k % 128)
            return dsv4_fail(DSV4_ERR_RANGE, "%s = %lld: quantized weights need input sizes that are multiples of 128",
                             ks[i].what, (long long)ks[i].k);
    return DSV4_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct jw {
    char *buf;
    size_t cap, len;
} jw;

static void jw_put(jw *w, const char *fmt, ...) DSV4_PRINTF(2, 3);
static void jw_put(jw *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->len < w->cap ? w->buf + w->len : NULL, w->len < w->cap ? w->cap - w->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) w->len += (size_t)n;
}

/* Shortest text that reads back as exactly x, with '.' whatever the locale. */
static void fmt_double(double x, char *out, size_t cap)
{
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(out, cap, "%.1f", x);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, cap, "%.*g", prec, x); /* printf and strtod share the locale */
            if (strtod(out, NULL) == x) break;
        }
    }
    const char *dp = localeconv()->decimal_point;
    char *c = dp && dp[0] && dp[0] != '.' ? strchr(out, dp[0]) : NULL;
    if (c) *c = '.';
    size_t n = strlen(out);
    if (!strpbrk(out, ".eE") && n + 3 <= cap) memcpy(out + n, ".0", 3);
}

static void jw_num(jw *w, const char *key, double x)
{
    char b[64];
    fmt_double(x, b, sizeof b);
    jw_put(w, "  \"%s\": %s,\n", key, b);
}

static const char *enum_name(int k, int value)
{
    for (int i = 0; i < keys[k].n_values; i++)
        if (keys[k].values[i].value == value) return keys[k].values[i].name;
    return keys[k].values[0].name;
}

/* The schedule in the official naming (compress_ratios, CSA exactly where the ratio is 4, hash
 * routing on the first num_hash_layers) or, where that cannot say it, in transformers' (layer_types
 * + compress_rates, one rate per kind; mlp_layer_types). */
static dsv4_status schedule_naming(const dsv4_model_config *c, int *tf_types, int *tf_mlp, int rate[3])
{
    const int64_t nb = c->n_layers + c->n_mtp_layers;
    *tf_types = *tf_mlp = 0;
    rate[0] = 0, rate[DSV4_ATTN_CSA] = rate[DSV4_ATTN_HCA] = -1;
    for (int64_t i = 0; i < nb; i++) {
        int k = c->attn_kind[i], r = c->compress_ratio[i];
        *tf_types |= (k == DSV4_ATTN_CSA) != (r == 4);
        if (k != DSV4_ATTN_SWA && rate[k] < 0) rate[k] = r;
        if (i < c->n_layers) *tf_mlp |= c->hash_routed[i] != (i < c->n_hash_layers);
    }
    for (int64_t i = 0; i < nb && *tf_types; i++) { /* transformers' naming has one rate per kind */
        int k = c->attn_kind[i];
        if (k != DSV4_ATTN_SWA && c->compress_ratio[i] != rate[k])
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "config_to_json: %s layers of ratios %d and %d, and a CSA layer of ratio other "
                             "than 4 or an HCA layer of ratio 4: no naming says that", dsv4_attn_kind_name((dsv4_attn_kind)k),
                             rate[k], c->compress_ratio[i]);
    }
    if (rate[DSV4_ATTN_CSA] < 0) rate[DSV4_ATTN_CSA] = 4;
    if (rate[DSV4_ATTN_HCA] < 0) rate[DSV4_ATTN_HCA] = 128;
    return DSV4_OK;
}

dsv4_status dsv4_config_to_json(const dsv4_model_config *c, char *buf, size_t cap, size_t *len)
{
    DSV4_CHECK_ARG(c && (buf || !cap) && len, "config_to_json: null argument");
    DSV4_TRY(dsv4_config_validate(c));
    const int64_t nb = c->n_layers + c->n_mtp_layers;
    int tf_types, tf_mlp, rate[3];
    DSV4_TRY(schedule_naming(c, &tf_types, &tf_mlp, rate));
    if (c->rope_main.yarn) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "config_to_json: YaRN on the main rope has no official key");
    jw w = {buf, cap, 0};
    jw_put(&w, "{\n  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n  \"model_type\": \"deepseek_v4\",\n");
    const char *base = (const char *)c;
    for (int k = 0; k < N_KEYS; k++) /* integers */
        if (keys[k].type == K_INT && (keys[k].flags & KF_WRITE) && !(k == KEY_N_HASH && tf_mlp))
            jw_put(&w, "  \"%s\": %lld,\n", key_name(k), (long long)*(const int64_t *)(base + keys[k].off));
    jw_put(&w, "  \"%s\": ", key_name(KEY_EOS));
    if (c->n_eos == 1) jw_put(&w, "%lld,\n", (long long)c->eos_token_ids[0]);
    else
        for (int i = 0; i < c->n_eos; i++) jw_put(&w, "%s%lld%s", i ? ", " : "[", (long long)c->eos_token_ids[i], i + 1 == c->n_eos ? "],\n" : "");
    for (int k = 0; k < N_KEYS; k++) /* strings, flags */
        if ((keys[k].flags & KF_WRITE) && keys[k].type == K_ENUM && k != KEY_DTYPE && k != KEY_EXPERT_DTYPE)
            jw_put(&w, "  \"%s\": \"%s\",\n", key_name(k),
                   keys[k].off == NO_FIELD ? keys[k].values[0].name : enum_name(k, *(const int *)(base + keys[k].off)));
    for (int k = 0; k < N_KEYS; k++)
        if ((keys[k].flags & KF_WRITE) && keys[k].type == K_BOOL)
            jw_put(&w, "  \"%s\": %s,\n", key_name(k), *(const int *)(base + keys[k].off) ? "true" : "false");
    jw_put(&w, "  \"%s\": false,\n", key_name(KEY_ATTN_BIAS));
    for (int k = 0; k < N_KEYS; k++) /* numbers */
        if ((keys[k].flags & KF_WRITE) && keys[k].type == K_NUM) jw_num(&w, key_name(k), *(const double *)(base + keys[k].off));
    if (c->rope_compress.yarn) {
        char f[64], bf[64], bs[64], af[64];
        fmt_double(c->rope_compress.factor, f, sizeof f);
        fmt_double(c->rope_compress.beta_fast, bf, sizeof bf);
        fmt_double(c->rope_compress.beta_slow, bs, sizeof bs);
        fmt_double(c->rope_compress.attention_factor, af, sizeof af);
        jw_put(&w, "  \"%s\": {\"type\": \"yarn\", \"factor\": %s, \"original_max_position_embeddings\": %lld, "
                   "\"beta_fast\": %s, \"beta_slow\": %s, \"attention_factor\": %s},\n",
               key_name(KEY_ROPE_SCALING), f, (long long)c->rope_compress.original_max_position, bf, bs, af);
    } else {
        jw_put(&w, "  \"%s\": {\"type\": \"default\"},\n", key_name(KEY_ROPE_SCALING));
    }
    if (tf_types) {
        jw_put(&w, "  \"%s\": [", key_name(KEY_LAYER_TYPES));
        for (int64_t i = 0; i < nb; i++) jw_put(&w, "%s\"%s\"", i ? ", " : "", layer_type_names[c->attn_kind[i]]);
        jw_put(&w, "],\n  \"%s\": {\"%s\": %d, \"%s\": %d},\n", key_name(KEY_COMPRESS_RATES), layer_type_names[DSV4_ATTN_CSA],
               rate[DSV4_ATTN_CSA], layer_type_names[DSV4_ATTN_HCA], rate[DSV4_ATTN_HCA]);
    } else {
        jw_put(&w, "  \"%s\": [", key_name(KEY_COMPRESS_RATIOS));
        for (int64_t i = 0; i < nb; i++) jw_put(&w, "%s%d", i ? ", " : "", c->compress_ratio[i]);
        jw_put(&w, "],\n");
    }
    if (tf_mlp) {
        jw_put(&w, "  \"%s\": [", key_name(KEY_MLP_LAYER_TYPES));
        for (int64_t i = 0; i < c->n_layers; i++) jw_put(&w, "%s\"%s\"", i ? ", " : "", c->hash_routed[i] ? "hash_moe" : "moe");
        jw_put(&w, "],\n");
    }
    jw_put(&w, "  \"%s\": \"%s\"", key_name(KEY_DTYPE), keys[KEY_DTYPE].values[0].name);
    if (c->weight_format == DSV4_WFMT_FP8)
        jw_put(&w, ",\n  \"%s\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\", "
                   "\"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}", key_name(KEY_QUANT));
    if (c->expert_format != DSV4_WFMT_AUTO)
        jw_put(&w, ",\n  \"%s\": \"%s\"", key_name(KEY_EXPERT_DTYPE), dsv4_weight_format_name(c->expert_format));
    jw_put(&w, "\n}\n");
    *len = w.len;
    if (w.len >= cap) return dsv4_fail(DSV4_ERR_CAPACITY, "config_to_json: needs %zu bytes, the buffer has %zu", w.len + 1, cap);
    return DSV4_OK;
}
