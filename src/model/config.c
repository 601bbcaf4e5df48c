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
    c->dim = 4096;
    c->n_layers = 43;
    c->n_mtp_layers = 1;
    c->vocab_size = 129280;
    c->n_heads = 64;
    c->n_kv_heads = 1;
    c->head_dim = 512;
    c->rope_head_dim = 64;
    c->nope_head_dim = 448;
    c->q_lora_rank = 1024;
    c->o_groups = 8;
    c->o_lora_rank = 1024;
    c->window_size = 128;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 512;
    c->n_routed_experts = 256;
    c->n_shared_experts = 1;
    c->n_activated_experts = 6;
    c->moe_inter_dim = 2048;
    c->n_hash_layers = 3;
    c->score_func = DSV4_SCORE_SQRTSOFTPLUS;
    c->norm_topk_prob = 1;
    c->route_scale = 1.5;
    c->swiglu_limit = 10.0;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6;
    c->norm_eps = 1e-6;
    c->rope_main = (dsv4_rope_config){10000.0, 0, 1.0, 0, 32.0, 1.0, 1.0};
    c->rope_compress = (dsv4_rope_config){160000.0, 1, 16.0, 65536, 32.0, 1.0, 1.0};
    c->max_position_embeddings = 1048576;
    c->bos_token_id = 0;
    c->n_eos = 1;
    c->eos_token_ids[0] = 1;
    c->tie_word_embeddings = 0;
    c->weight_format = DSV4_WFMT_FP8;
    c->expert_format = DSV4_WFMT_AUTO;
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

/* Member of object `obj`; null counts as absent. */
static uint32_t member(const cfg_parser *p, uint32_t obj, const char *key)
{
    uint32_t v = mj_get(p->d, obj, key);
    return v != MJ_NONE && p->d->nodes[v].type == MJ_NULL ? MJ_NONE : v;
}

typedef enum key_type { K_INT, K_NUM, K_BOOL } key_type;

typedef struct cfg_key {
    const char *key;
    size_t off;
    key_type type;
} cfg_key;

#define CF(f) offsetof(dsv4_model_config, f)

/* Scalar keys of every naming; two keys of one field must agree (claim). */
static const cfg_key scalar_keys[] = {
    {"hidden_size", CF(dim), K_INT}, {"dim", CF(dim), K_INT},
    {"num_hidden_layers", CF(n_layers), K_INT}, {"n_layers", CF(n_layers), K_INT},
    {"num_nextn_predict_layers", CF(n_mtp_layers), K_INT}, {"n_mtp_layers", CF(n_mtp_layers), K_INT},
    {"vocab_size", CF(vocab_size), K_INT},
    {"num_attention_heads", CF(n_heads), K_INT}, {"n_heads", CF(n_heads), K_INT},
    {"num_key_value_heads", CF(n_kv_heads), K_INT},
    {"head_dim", CF(head_dim), K_INT},
    {"qk_rope_head_dim", CF(rope_head_dim), K_INT}, {"rope_head_dim", CF(rope_head_dim), K_INT},
    {"q_lora_rank", CF(q_lora_rank), K_INT},
    {"o_groups", CF(o_groups), K_INT},
    {"o_lora_rank", CF(o_lora_rank), K_INT},
    {"sliding_window", CF(window_size), K_INT}, {"window_size", CF(window_size), K_INT},
    {"index_n_heads", CF(index_n_heads), K_INT},
    {"index_head_dim", CF(index_head_dim), K_INT},
    {"index_topk", CF(index_topk), K_INT},
    {"n_routed_experts", CF(n_routed_experts), K_INT},
    {"n_shared_experts", CF(n_shared_experts), K_INT},
    {"num_experts_per_tok", CF(n_activated_experts), K_INT}, {"n_activated_experts", CF(n_activated_experts), K_INT},
    {"moe_intermediate_size", CF(moe_inter_dim), K_INT}, {"moe_inter_dim", CF(moe_inter_dim), K_INT},
    {"num_hash_layers", CF(n_hash_layers), K_INT}, {"n_hash_layers", CF(n_hash_layers), K_INT},
    {"hc_mult", CF(hc_mult), K_INT},
    {"hc_sinkhorn_iters", CF(hc_sinkhorn_iters), K_INT},
    {"max_position_embeddings", CF(max_position_embeddings), K_INT},
    {"bos_token_id", CF(bos_token_id), K_INT},
    {"routed_scaling_factor", CF(route_scale), K_NUM}, {"route_scale", CF(route_scale), K_NUM},
    {"swiglu_limit", CF(swiglu_limit), K_NUM},
    {"hc_eps", CF(hc_eps), K_NUM},
    {"rms_norm_eps", CF(norm_eps), K_NUM}, {"norm_eps", CF(norm_eps), K_NUM},
    {"rope_theta", CF(rope_main.theta), K_NUM},
    {"compress_rope_theta", CF(rope_compress.theta), K_NUM},
    {"rope_factor", CF(rope_compress.factor), K_NUM},
    {"beta_fast", CF(rope_compress.beta_fast), K_NUM},
    {"beta_slow", CF(rope_compress.beta_slow), K_NUM},
    {"norm_topk_prob", CF(norm_topk_prob), K_BOOL},
    {"tie_word_embeddings", CF(tie_word_embeddings), K_BOOL},
};

static dsv4_status parse_scalars(cfg_parser *p)
{
    char *base = (char *)p->c;
    for (size_t i = 0; i < sizeof scalar_keys / sizeof scalar_keys[0]; i++) {
        const cfg_key *k = &scalar_keys[i];
        uint32_t v = member(p, 0, k->key);
        if (v == MJ_NONE) continue;
        int64_t xi = 0;
        double xd = 0;
        int xb = 0;
        switch (k->type) {
        case K_INT:
            DSV4_TRY(get_int(p, v, k->key, &xi));
            DSV4_TRY(set_i64(p, (int64_t *)(base + k->off), xi, k->key));
            break;
        case K_NUM:
            DSV4_TRY(get_num(p, v, k->key, &xd));
            DSV4_TRY(set_f64(p, (double *)(base + k->off), xd, k->key));
            break;
        case K_BOOL:
            DSV4_TRY(get_bool(p, v, k->key, &xb));
            DSV4_TRY(set_int(p, (int *)(base + k->off), xb, k->key));
            break;
        }
    }
    uint32_t v = member(p, 0, "original_seq_len"); /* reference naming: 0 = no YaRN */
    if (v != MJ_NONE) {
        int64_t x = 0;
        DSV4_TRY(get_int(p, v, "original_seq_len", &x));
        DSV4_TRY(set_i64(p, &p->c->rope_compress.original_max_position, x, "original_seq_len"));
        DSV4_TRY(set_int(p, &p->c->rope_compress.yarn, x > 0, "original_seq_len"));
    }
    if ((v = member(p, 0, "attention_bias")) != MJ_NONE) {
        int b = 0;
        DSV4_TRY(get_bool(p, v, "attention_bias", &b));
        if (b) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: attention_bias = true: DeepSeek-V4 has no attention biases", p->src);
    }
    if ((v = member(p, 0, "eos_token_id")) != MJ_NONE) {
        const mj_node *n = &p->d->nodes[v];
        if (n->type == MJ_ARRAY) {
            if (n->count == 0 || n->count > DSV4_MAX_EOS)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: eos_token_id has %u entries (1 to %d allowed)", p->src, n->count, DSV4_MAX_EOS);
            for (uint32_t i = 0, e = v + 1; i < n->count; i++, e = p->d->nodes[e].end)
                DSV4_TRY(get_int(p, e, "eos_token_id", &p->c->eos_token_ids[i]));
            p->c->n_eos = (int)n->count;
        } else {
            DSV4_TRY(get_int(p, v, "eos_token_id", &p->c->eos_token_ids[0]));
            p->c->n_eos = 1;
        }
    }
    return DSV4_OK;
}

typedef struct name_value {
    const char *name;
    int value;
} name_value;

/* The value of string key `key` among `table`; absent keys leave *out alone. */
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

static dsv4_status parse_strings(cfg_parser *p)
{
    dsv4_model_config *c = p->c;
    static const name_value score[] = {{"sqrtsoftplus", DSV4_SCORE_SQRTSOFTPLUS}, {"softmax", DSV4_SCORE_SOFTMAX},
                                       {"sigmoid", DSV4_SCORE_SIGMOID}};
    int sf = (int)c->score_func, present, ignored = 0;
    DSV4_TRY(parse_enum(p, 0, "scoring_func", score, 3, &sf, &present));
    if (present) DSV4_TRY(set_int(p, (int *)&c->score_func, sf, "scoring_func"));
    DSV4_TRY(parse_enum(p, 0, "score_func", score, 3, &sf, &present));
    if (present) DSV4_TRY(set_int(p, (int *)&c->score_func, sf, "score_func"));
    static const name_value act[] = {{"silu", 0}};
    DSV4_TRY(parse_enum(p, 0, "hidden_act", act, 1, &ignored, NULL));
    static const name_value topk[] = {{"noaux_tc", 0}};
    DSV4_TRY(parse_enum(p, 0, "topk_method", topk, 1, &ignored, NULL));
    static const name_value ue8m0[] = {{"ue8m0", 0}};
    DSV4_TRY(parse_enum(p, 0, "scale_fmt", ue8m0, 1, &ignored, NULL));
    /* "dtype": the reference's weight format ("fp8", "bf16") or transformers' torch dtype */
    static const name_value dtype[] = {{"fp8", DSV4_WFMT_FP8}, {"bf16", DSV4_WFMT_BF16}, {"bfloat16", -1},
                                       {"float32", -1}, {"float16", -1}};
    int wf = -1;
    DSV4_TRY(parse_enum(p, 0, "dtype", dtype, 5, &wf, NULL));
    if (wf >= 0) DSV4_TRY(set_int(p, (int *)&c->weight_format, wf, "dtype"));
    static const name_value expert[] = {{"fp4", DSV4_WFMT_FP4}, {"fp8", DSV4_WFMT_FP8}, {"bf16", DSV4_WFMT_BF16}};
    int ef = DSV4_WFMT_AUTO;
    DSV4_TRY(parse_enum(p, 0, "expert_dtype", expert, 3, &ef, &present));
    if (present) DSV4_TRY(set_int(p, (int *)&c->expert_format, ef, "expert_dtype"));
    return DSV4_OK;
}

static dsv4_status parse_quantization(cfg_parser *p)
{
    uint32_t q = member(p, 0, "quantization_config");
    if (q == MJ_NONE) return DSV4_OK;
    if (p->d->nodes[q].type != MJ_OBJECT) return type_error(p, "quantization_config", "an object", q);
    static const name_value method[] = {{"fp8", 0}};
    static const name_value fmt[] = {{"e4m3", 0}};
    static const name_value scale[] = {{"ue8m0", 0}};
    static const name_value act[] = {{"dynamic", 0}};
    int ignored = 0, present;
    DSV4_TRY(parse_enum(p, q, "quant_method", method, 1, &ignored, &present));
    if (!present) return dsv4_fail(DSV4_ERR_FORMAT, "%s: quantization_config has no quant_method", p->src);
    DSV4_TRY(parse_enum(p, q, "fmt", fmt, 1, &ignored, NULL));
    DSV4_TRY(parse_enum(p, q, "scale_fmt", scale, 1, &ignored, NULL));
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
    return set_int(p, (int *)&p->c->weight_format, DSV4_WFMT_FP8, "quantization_config");
}

/* One rope description: transformers' rope_parameters entry or the official rope_scaling. */
static dsv4_status parse_rope(cfg_parser *p, uint32_t r, const char *key, dsv4_rope_config *rc, int with_theta)
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
    static const struct {
        const char *k;
        size_t off;
    } nums[] = {{"rope_theta", offsetof(dsv4_rope_config, theta)},
                {"factor", offsetof(dsv4_rope_config, factor)},
                {"beta_fast", offsetof(dsv4_rope_config, beta_fast)},
                {"beta_slow", offsetof(dsv4_rope_config, beta_slow)},
                {"attention_factor", offsetof(dsv4_rope_config, attention_factor)}};
    for (size_t i = with_theta ? 0 : 1; i < sizeof nums / sizeof nums[0]; i++) {
        uint32_t v = member(p, r, nums[i].k);
        double x = 0;
        if (v == MJ_NONE) continue;
        DSV4_TRY(get_num(p, v, nums[i].k, &x));
        DSV4_TRY(set_f64(p, (double *)((char *)rc + nums[i].off), x, key));
    }
    uint32_t v = member(p, r, "original_max_position_embeddings");
    if (v != MJ_NONE) {
        int64_t x = 0;
        DSV4_TRY(get_int(p, v, "original_max_position_embeddings", &x));
        DSV4_TRY(set_i64(p, &rc->original_max_position, x, key));
    }
    return DSV4_OK;
}

static dsv4_status parse_ropes(cfg_parser *p)
{
    uint32_t v = member(p, 0, "rope_scaling");
    if (v != MJ_NONE) DSV4_TRY(parse_rope(p, v, "rope_scaling", &p->c->rope_compress, 0));
    uint32_t rp = member(p, 0, "rope_parameters");
    if (rp == MJ_NONE) return DSV4_OK;
    if (p->d->nodes[rp].type != MJ_OBJECT) return type_error(p, "rope_parameters", "an object", rp);
    uint32_t main = member(p, rp, "main"), comp = member(p, rp, "compress");
    if (main == MJ_NONE && comp == MJ_NONE)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: rope_parameters needs \"main\" and/or \"compress\" entries", p->src);
    if (main != MJ_NONE) DSV4_TRY(parse_rope(p, main, "rope_parameters.main", &p->c->rope_main, 1));
    if (comp != MJ_NONE) DSV4_TRY(parse_rope(p, comp, "rope_parameters.compress", &p->c->rope_compress, 1));
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
    uint32_t rates = member(p, 0, "compress_rates");
    if (rates != MJ_NONE) {
        if (p->d->nodes[rates].type != MJ_OBJECT) return type_error(p, "compress_rates", "an object", rates);
        *have = 1;
        for (int k = DSV4_ATTN_CSA; k <= DSV4_ATTN_HCA; k++) {
            uint32_t x = member(p, rates, layer_type_names[k]);
            if (x != MJ_NONE) DSV4_TRY(get_int(p, x, layer_type_names[k], &rate[k]));
        }
    }
    static const char *const legacy[3] = {NULL, "compress_rate_csa", "compress_rate_hca"};
    for (int k = DSV4_ATTN_CSA; k <= DSV4_ATTN_HCA; k++) {
        uint32_t x = member(p, 0, legacy[k]);
        if (x == MJ_NONE) continue;
        DSV4_TRY(get_int(p, x, legacy[k], &rate[k]));
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
 * transformers' table {0: SWA, 4: CSA, 128: HCA}; without, by the official rule (OF model.py): the
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
    uint32_t lt = member(p, 0, "layer_types"), cr = member(p, 0, "compress_ratios");
    *transformers_default = lt == MJ_NONE && cr == MJ_NONE;
    if (cr != MJ_NONE) {
        DSV4_TRY(check_array(p, cr, "compress_ratios", nl, nl + extra));
        uint32_t e = cr + 1;
        for (int64_t i = 0; i < (int64_t)p->d->nodes[cr].count && i < nb; i++, e = p->d->nodes[e].end) {
            int64_t r = 0;
            DSV4_TRY(get_int(p, e, "compress_ratios", &r));
            if (r == 1) r = 0; /* vLLM-style configs write 1 for "no compression" */
            if (r < 0 || r > 65536)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: compress_ratios[%lld] = %lld is not a compression ratio (0, or 2 to 65536)",
                                 p->src, (long long)i, (long long)r);
            dsv4_attn_kind k = kind_of_ratio((int)r);
            if (have_rates && r != 0 && r != 4 && r != 128)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: compress_ratios[%lld] = %lld: with compress_rates given, compress_ratios "
                                 "only names each layer's kind (0 SWA, 4 CSA, 128 HCA), as transformers reads it",
                                 p->src, (long long)i, (long long)r);
            if (have_rates) r = rate[k];
            if (lt == MJ_NONE || !have_rates) DSV4_TRY(set_layer(p, i, (int)r, k, "compress_ratios"));
            else c->attn_kind[i] = (uint8_t)k; /* compared with layer_types below */
        }
    }
    if (lt != MJ_NONE) {
        DSV4_TRY(check_array(p, lt, "layer_types", nl, 0));
        uint32_t e = lt + 1;
        for (int64_t i = 0; i < (int64_t)p->d->nodes[lt].count && i < nb; i++, e = p->d->nodes[e].end) {
            const char *s = NULL;
            DSV4_TRY(get_str(p, e, "layer_types", &s));
            int k = 0;
            while (k < 3 && strcmp(s, layer_type_names[k])) k++;
            if (k == 3) {
                char q[64];
                mj_quote(s, strlen(s), q, sizeof q);
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: layer_types[%lld] = \"%s\" is not a DeepSeek-V4 attention type",
                                 p->src, (long long)i, q);
            }
            if (cr != MJ_NONE && have_rates && i < (int64_t)p->d->nodes[cr].count && c->attn_kind[i] != k)
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: layer_types[%lld] disagrees with compress_ratios[%lld] (layer %lld)",
                                 p->src, (long long)i, (long long)i, (long long)i);
            DSV4_TRY(set_layer(p, i, (int)rate[k], (dsv4_attn_kind)k, "layer_types"));
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
    uint32_t v = member(p, 0, "mlp_layer_types");
    if (v == MJ_NONE) return DSV4_OK;
    DSV4_TRY(check_array(p, v, "mlp_layer_types", nl, 0));
    int64_t n_hash = 0;
    uint32_t e = v + 1;
    for (int64_t i = 0; i < nl; i++, e = p->d->nodes[e].end) {
        const char *s = NULL;
        DSV4_TRY(get_str(p, e, "mlp_layer_types", &s));
        if (strcmp(s, "hash_moe") && strcmp(s, "moe")) {
            char q[64];
            mj_quote(s, strlen(s), q, sizeof q);
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: mlp_layer_types[%lld] = \"%s\" is not supported (hash_moe or moe)",
                             p->src, (long long)i, q);
        }
        c->hash_routed[i] = (uint8_t)(s[0] == 'h');
        n_hash += c->hash_routed[i];
    }
    DSV4_TRY(set_i64(p, &c->n_hash_layers, n_hash, "mlp_layer_types"));
    return claim(p, c->hash_routed, "mlp_layer_types", 0);
}

static dsv4_status parse_doc(cfg_parser *p)
{
    dsv4_model_config *c = p->c;
    if (p->d->nodes[0].type != MJ_OBJECT) return dsv4_fail(DSV4_ERR_FORMAT, "%s: config must be a JSON object", p->src);
    int64_t default_layers = c->n_layers;
    DSV4_TRY(parse_scalars(p));
    DSV4_TRY(parse_strings(p));
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
    static const char *const tf_only[] = {"layer_types", "mlp_layer_types", "rope_parameters", "compress_rates",
                                          "compress_rate_csa", "compress_rate_hca", "partial_rotary_factor"};
    int transformers = 0;
    for (size_t i = 0; i < sizeof tf_only / sizeof tf_only[0]; i++) transformers |= member(p, 0, tf_only[i]) != MJ_NONE;
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
    /* the rope head dims, given as a fraction by transformers */
    uint32_t v = member(p, 0, "partial_rotary_factor");
    if (v != MJ_NONE) {
        double f = 0;
        DSV4_TRY(get_num(p, v, "partial_rotary_factor", &f));
        double dims = f * (double)c->head_dim;
        if (!was_set(p, &c->rope_head_dim) && dims >= 0 && dims <= 65536 && dims == floor(dims))
            c->rope_head_dim = (int64_t)dims;
        else if (dims != (double)c->rope_head_dim)
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: partial_rotary_factor %g x head_dim %lld disagrees with %lld rope dims",
                             p->src, f, (long long)c->head_dim, (long long)c->rope_head_dim);
    }
    c->nope_head_dim = c->head_dim - c->rope_head_dim;
    int reference = member(p, 0, "dim") != MJ_NONE || member(p, 0, "n_layers") != MJ_NONE || member(p, 0, "n_heads") != MJ_NONE;
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

typedef struct range {
    const char *name;
    size_t off;
    int64_t lo, hi;
} range;

static const range ranges[] = {
    {"hidden_size", CF(dim), 1, 65536},
    {"vocab_size", CF(vocab_size), 1, 1 << 24},
    {"num_attention_heads", CF(n_heads), 1, 4096},
    {"num_key_value_heads", CF(n_kv_heads), 1, 1},
    {"head_dim", CF(head_dim), 512, 512},
    {"qk_rope_head_dim", CF(rope_head_dim), 64, 64},
    {"q_lora_rank", CF(q_lora_rank), 1, 65536},
    {"o_groups", CF(o_groups), 1, 4096},
    {"o_lora_rank", CF(o_lora_rank), 1, 65536},
    {"sliding_window", CF(window_size), 1, 1 << 20},
    {"index_n_heads", CF(index_n_heads), 1, 4096},
    {"index_head_dim", CF(index_head_dim), 64, 1024},
    {"index_topk", CF(index_topk), 1, 1 << 24},
    {"n_routed_experts", CF(n_routed_experts), 1, 4096},
    {"n_shared_experts", CF(n_shared_experts), 0, 1},
    {"num_experts_per_tok", CF(n_activated_experts), 1, 64},
    {"moe_intermediate_size", CF(moe_inter_dim), 1, 1 << 18},
    {"hc_mult", CF(hc_mult), 1, 16},
    {"hc_sinkhorn_iters", CF(hc_sinkhorn_iters), 1, 10000},
    {"max_position_embeddings", CF(max_position_embeddings), 1, (int64_t)1 << 32},
};

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
    return DSV4_OK;
}

dsv4_status dsv4_config_validate(const dsv4_model_config *c)
{
    DSV4_CHECK_ARG(c, "config_validate: null config");
    if (c->n_layers < 1 || c->n_layers > DSV4_MAX_LAYERS - 1 || c->n_mtp_layers < 0 ||
        c->n_layers + c->n_mtp_layers > DSV4_MAX_LAYERS)
        return dsv4_fail(DSV4_ERR_RANGE, "%lld layers + %lld MTP layers: at most %d blocks in all", (long long)c->n_layers,
                         (long long)c->n_mtp_layers, DSV4_MAX_LAYERS);
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        int64_t v = *(const int64_t *)((const char *)c + ranges[i].off);
        if (v < ranges[i].lo || v > ranges[i].hi) {
            if (ranges[i].lo == ranges[i].hi)
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s = %lld: dsv4 needs %lld (the 512 = 448 + 64 head and cache layout)",
                                 ranges[i].name, (long long)v, (long long)ranges[i].lo);
            return dsv4_fail(DSV4_ERR_RANGE, "%s = %lld is out of range (%lld to %lld)", ranges[i].name, (long long)v,
                             (long long)ranges[i].lo, (long long)ranges[i].hi);
        }
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
    if (!finite_in(c->route_scale, 1e-9, 1e9)) return dsv4_fail(DSV4_ERR_RANGE, "routed_scaling_factor %g is not positive and finite", c->route_scale);
    if (!finite_in(c->swiglu_limit, 0, 1e9)) return dsv4_fail(DSV4_ERR_RANGE, "swiglu_limit %g is not >= 0 and finite", c->swiglu_limit);
    if (!finite_in(c->hc_eps, 1e-30, 0.5)) return dsv4_fail(DSV4_ERR_RANGE, "hc_eps %g is not in (0, 0.5]", c->hc_eps);
    if (!finite_in(c->norm_eps, 1e-30, 0.5)) return dsv4_fail(DSV4_ERR_RANGE, "rms_norm_eps %g is not in (0, 0.5]", c->norm_eps);
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

dsv4_status dsv4_config_to_json(const dsv4_model_config *c, char *buf, size_t cap, size_t *len)
{
    DSV4_CHECK_ARG(c && (buf || !cap) && len, "config_to_json: null argument");
    DSV4_TRY(dsv4_config_validate(c));
    int64_t nb = c->n_layers + c->n_mtp_layers;
    for (int64_t i = 0; i < nb; i++) {
        int r = c->compress_ratio[i];
        if ((c->attn_kind[i] == DSV4_ATTN_CSA) != (r == 4))
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "config_to_json: block %lld is %s with ratio %d; the official naming "
                             "ties CSA to ratio 4", (long long)i, dsv4_attn_kind_name((dsv4_attn_kind)c->attn_kind[i]), r);
        if (i < c->n_layers && c->hash_routed[i] != (i < c->n_hash_layers))
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "config_to_json: hash-routed layers must be the first num_hash_layers");
    }
    if (c->rope_main.yarn) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "config_to_json: YaRN on the main rope has no official key");
    jw w = {buf, cap, 0};
    jw_put(&w, "{\n  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n  \"model_type\": \"deepseek_v4\",\n");
    const struct {
        const char *k;
        int64_t v;
    } ints[] = {{"hidden_size", c->dim}, {"num_hidden_layers", c->n_layers}, {"num_nextn_predict_layers", c->n_mtp_layers},
                {"vocab_size", c->vocab_size}, {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads},
                {"head_dim", c->head_dim}, {"qk_rope_head_dim", c->rope_head_dim}, {"q_lora_rank", c->q_lora_rank},
                {"o_groups", c->o_groups}, {"o_lora_rank", c->o_lora_rank}, {"sliding_window", c->window_size},
                {"index_n_heads", c->index_n_heads}, {"index_head_dim", c->index_head_dim}, {"index_topk", c->index_topk},
                {"n_routed_experts", c->n_routed_experts}, {"n_shared_experts", c->n_shared_experts},
                {"num_experts_per_tok", c->n_activated_experts}, {"moe_intermediate_size", c->moe_inter_dim},
                {"num_hash_layers", c->n_hash_layers}, {"hc_mult", c->hc_mult}, {"hc_sinkhorn_iters", c->hc_sinkhorn_iters},
                {"max_position_embeddings", c->max_position_embeddings}, {"bos_token_id", c->bos_token_id}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) jw_put(&w, "  \"%s\": %lld,\n", ints[i].k, (long long)ints[i].v);
    jw_put(&w, "  \"eos_token_id\": ");
    if (c->n_eos == 1) jw_put(&w, "%lld,\n", (long long)c->eos_token_ids[0]);
    else
        for (int i = 0; i < c->n_eos; i++) jw_put(&w, "%s%lld%s", i ? ", " : "[", (long long)c->eos_token_ids[i], i + 1 == c->n_eos ? "],\n" : "");
    static const char *const score[] = {"sqrtsoftplus", "softmax", "sigmoid"};
    jw_put(&w, "  \"scoring_func\": \"%s\",\n  \"topk_method\": \"noaux_tc\",\n  \"hidden_act\": \"silu\",\n", score[c->score_func]);
    jw_put(&w, "  \"norm_topk_prob\": %s,\n  \"tie_word_embeddings\": %s,\n  \"attention_bias\": false,\n",
           c->norm_topk_prob ? "true" : "false", c->tie_word_embeddings ? "true" : "false");
    jw_num(&w, "routed_scaling_factor", c->route_scale);
    jw_num(&w, "swiglu_limit", c->swiglu_limit);
    jw_num(&w, "hc_eps", c->hc_eps);
    jw_num(&w, "rms_norm_eps", c->norm_eps);
    jw_num(&w, "rope_theta", c->rope_main.theta);
    jw_num(&w, "compress_rope_theta", c->rope_compress.theta);
    if (c->rope_compress.yarn) {
        char f[64], bf[64], bs[64], af[64];
        fmt_double(c->rope_compress.factor, f, sizeof f);
        fmt_double(c->rope_compress.beta_fast, bf, sizeof bf);
        fmt_double(c->rope_compress.beta_slow, bs, sizeof bs);
        fmt_double(c->rope_compress.attention_factor, af, sizeof af);
        jw_put(&w, "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": %s, \"original_max_position_embeddings\": %lld, "
                   "\"beta_fast\": %s, \"beta_slow\": %s, \"attention_factor\": %s},\n",
               f, (long long)c->rope_compress.original_max_position, bf, bs, af);
    } else {
        jw_put(&w, "  \"rope_scaling\": {\"type\": \"default\"},\n");
    }
    jw_put(&w, "  \"compress_ratios\": [");
    for (int64_t i = 0; i < nb; i++) jw_put(&w, "%s%d", i ? ", " : "", c->compress_ratio[i]);
    jw_put(&w, "],\n  \"torch_dtype\": \"bfloat16\"");
    if (c->weight_format == DSV4_WFMT_FP8)
        jw_put(&w, ",\n  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\", "
                   "\"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}");
    if (c->expert_format != DSV4_WFMT_AUTO) jw_put(&w, ",\n  \"expert_dtype\": \"%s\"", dsv4_weight_format_name(c->expert_format));
    jw_put(&w, "\n}\n");
    *len = w.len;
    if (w.len >= cap) return dsv4_fail(DSV4_ERR_CAPACITY, "config_to_json: needs %zu bytes, the buffer has %zu", w.len + 1, cap);
    return DSV4_OK;
}
