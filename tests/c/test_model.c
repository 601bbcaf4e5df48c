/* config.json in three namings, checkpoints on disk (make-tiny, the HF tiny checkpoint, a
 * V4-Flash-shaped sparse checkpoint), and hostile variants: missing, extra, mistyped and
 * misshapen tensors, broken shard sets, absurd configs. Each failure is a clear error naming
 * the file and the tensor; the caller's outputs stay untouched. */
#include "dsv4.h"
#include "test_util.h"

#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_root[64];
static char hf_tiny[1024]; /* shared/testdata/hf-tiny-a next to the checkout, or under $DSV4_SHARED */

static void path_of(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(out, cap, "%s/", tmp_root);
    vsnprintf(out + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_dir(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static long file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static void copy_dir(const char *from, const char *to)
{
    mkdir(to, 0755);
    DIR *d = opendir(from);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        size_t n;
        char *data = test_read_file(a, &n);
        if (data) test_write_file(b, data, n);
        free(data);
    }
    if (d) closedir(d);
}

static int has(const char *needle) { return strstr(dsv4_last_error(), needle) != NULL; }

/* ---- config.json ------------------------------------------------------------------------------ */

static dsv4_status parse(const char *json, dsv4_model_config *c) { return dsv4_config_parse(json, strlen(json), "cfg.json", c); }

static void test_config_defaults(void)
{
    dsv4_model_config c;
    CHECK_STATUS(parse("{}", &c), DSV4_OK);
    /* docs/model.md §1.1, V4-Flash column */
    CHECK(c.dim == 4096 && c.n_layers == 43 && c.vocab_size == 129280 && c.n_heads == 64 && c.head_dim == 512 &&
              c.rope_head_dim == 64 && c.nope_head_dim == 448 && c.q_lora_rank == 1024 && c.o_groups == 8 &&
              c.o_lora_rank == 1024 && c.window_size == 128,
          "attention defaults");
    CHECK(c.index_n_heads == 64 && c.index_head_dim == 128 && c.index_topk == 512 && c.n_routed_experts == 256 &&
              c.n_shared_experts == 1 && c.n_activated_experts == 6 && c.moe_inter_dim == 2048 && c.n_hash_layers == 3,
          "moe defaults");
    CHECK(c.score_func == DSV4_SCORE_SQRTSOFTPLUS && c.norm_topk_prob && c.route_scale == 1.5 && c.swiglu_limit == 10.0 &&
              c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6 && c.norm_eps == 1e-6,
          "routing and mHC defaults");
    CHECK(c.rope_main.theta == 10000 && !c.rope_main.yarn && c.rope_compress.theta == 160000 && c.rope_compress.yarn &&
              c.rope_compress.factor == 16 && c.rope_compress.original_max_position == 65536 &&
              c.rope_compress.beta_fast == 32 && c.rope_compress.beta_slow == 1,
          "rope defaults");
    CHECK(c.max_position_embeddings == 1048576 && c.n_mtp_layers == 1 && c.bos_token_id == 0 && c.eos_token_ids[0] == 1 &&
              !c.tie_word_embeddings,
          "other defaults");
    int swa = 0, csa = 0, hca = 0;
    for (int i = 0; i < 43; i++) {
        swa += c.attn_kind[i] == DSV4_ATTN_SWA;
        csa += c.attn_kind[i] == DSV4_ATTN_CSA && c.compress_ratio[i] == 4;
        hca += c.attn_kind[i] == DSV4_ATTN_HCA && c.compress_ratio[i] == 128;
    }
    CHECK(swa == 2 && csa == 21 && hca == 20 && c.compress_ratio[43] == 0 && c.attn_kind[43] == DSV4_ATTN_SWA,
          "Flash schedule: %d SWA, %d CSA, %d HCA", swa, csa, hca);
    CHECK(c.hash_routed[0] && c.hash_routed[2] && !c.hash_routed[3] && !c.hash_routed[43], "hash layers 0-2");
}

static const char *official_cfg =
    "{\"hidden_size\": 256, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 1, \"vocab_size\": 1000,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 1, \"head_dim\": 512, \"qk_rope_head_dim\": 64,"
    " \"q_lora_rank\": 128, \"o_groups\": 4, \"o_lora_rank\": 64, \"sliding_window\": 32, \"index_n_heads\": 8,"
    " \"index_head_dim\": 128, \"index_topk\": 16, \"n_routed_experts\": 16, \"n_shared_experts\": 1,"
    " \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 256, \"num_hash_layers\": 1, \"scoring_func\": \"sqrtsoftplus\","
    " \"routed_scaling_factor\": 2.5, \"swiglu_limit\": 7.0, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 10, \"hc_eps\": 1e-5,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 20000, \"compress_rope_theta\": 80000, \"max_position_embeddings\": 8192,"
    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, \"original_max_position_embeddings\": 4096, \"beta_fast\": 16,"
    " \"beta_slow\": 2}, \"compress_ratios\": [0, 4, 128, 4, 0], \"bos_token_id\": 5, \"eos_token_id\": [6, 7],"
    " \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\","
    " \"weight_block_size\": [128, 128], \"activation_scheme\": \"dynamic\"}, \"expert_dtype\": \"fp4\","
    " \"topk_method\": \"noaux_tc\", \"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\", \"unrelated_key\": [1, {\"x\": null}]}";

static const char *reference_cfg =
    "{\"dim\": 256, \"n_layers\": 4, \"n_mtp_layers\": 1, \"vocab_size\": 1000, \"n_heads\": 8, \"head_dim\": 512,"
    " \"rope_head_dim\": 64, \"q_lora_rank\": 128, \"o_groups\": 4, \"o_lora_rank\": 64, \"window_size\": 32,"
    " \"index_n_heads\": 8, \"index_head_dim\": 128, \"index_topk\": 16, \"n_routed_experts\": 16, \"n_shared_experts\": 1,"
    " \"n_activated_experts\": 4, \"moe_inter_dim\": 256, \"n_hash_layers\": 1, \"score_func\": \"sqrtsoftplus\","
    " \"route_scale\": 2.5, \"swiglu_limit\": 7.0, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 10, \"hc_eps\": 1e-5,"
    " \"norm_eps\": 1e-5, \"rope_theta\": 20000, \"compress_rope_theta\": 80000, \"rope_factor\": 8, \"original_seq_len\": 4096,"
    " \"beta_fast\": 16, \"beta_slow\": 2, \"compress_ratios\": [0, 4, 128, 4, 0], \"dtype\": \"fp8\", \"scale_fmt\": \"ue8m0\","
    " \"expert_dtype\": \"fp4\", \"max_batch_size\": 4, \"max_seq_len\": 4096, \"max_position_embeddings\": 8192,"
    " \"bos_token_id\": 5, \"eos_token_id\": [6, 7]}";

static const char *transformers_cfg =
    "{\"hidden_size\": 256, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 1, \"vocab_size\": 1000,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 1, \"head_dim\": 512, \"partial_rotary_factor\": 0.125,"
    " \"q_lora_rank\": 128, \"o_groups\": 4, \"o_lora_rank\": 64, \"sliding_window\": 32, \"index_n_heads\": 8,"
    " \"index_head_dim\": 128, \"index_topk\": 16, \"n_routed_experts\": 16, \"n_shared_experts\": 1,"
    " \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 256, \"scoring_func\": \"sqrtsoftplus\","
    " \"routed_scaling_factor\": 2.5, \"swiglu_limit\": 7.0, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 10, \"hc_eps\": 1e-5,"
    " \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 8192, \"bos_token_id\": 5, \"eos_token_id\": [6, 7],"
    " \"layer_types\": [\"sliding_attention\", \"compressed_sparse_attention\", \"heavily_compressed_attention\","
    " \"compressed_sparse_attention\"], \"mlp_layer_types\": [\"hash_moe\", \"moe\", \"moe\", \"moe\"],"
    " \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 128},"
    " \"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 20000.0}, \"compress\": {\"rope_type\": \"yarn\","
    " \"rope_theta\": 80000.0, \"factor\": 8.0, \"original_max_position_embeddings\": 4096, \"beta_fast\": 16, \"beta_slow\": 2,"
    " \"attention_factor\": 1.0}}, \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},"
    " \"expert_dtype\": \"fp4\", \"dtype\": \"bfloat16\"}";

static int same_config(const dsv4_model_config *a, const dsv4_model_config *b)
{
    dsv4_model_config x = *a, y = *b;
    memset(x.naming, 0, sizeof x.naming);
    memset(y.naming, 0, sizeof y.naming);
    return !memcmp(&x, &y, sizeof x);
}

static void test_config_namings(void)
{
    dsv4_model_config a, b, t;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&t, 0, sizeof t);
    CHECK_STATUS(parse(official_cfg, &a), DSV4_OK);
    CHECK_STATUS(parse(reference_cfg, &b), DSV4_OK);
    CHECK_STATUS(parse(transformers_cfg, &t), DSV4_OK);
    CHECK(!strcmp(a.naming, "hf") && !strcmp(b.naming, "reference") && !strcmp(t.naming, "transformers"), "namings %s %s %s",
          a.naming, b.naming, t.naming);
    CHECK(a.dim == 256 && a.n_layers == 4 && a.n_heads == 8 && a.o_groups == 4 && a.window_size == 32 && a.index_topk == 16 &&
              a.n_routed_experts == 16 && a.n_activated_experts == 4 && a.moe_inter_dim == 256 && a.route_scale == 2.5 &&
              a.swiglu_limit == 7.0 && a.hc_sinkhorn_iters == 10 && a.hc_eps == 1e-5 && a.norm_eps == 1e-5,
          "official naming read");
    CHECK(a.rope_main.theta == 20000 && a.rope_compress.theta == 80000 && a.rope_compress.factor == 8 &&
              a.rope_compress.original_max_position == 4096 && a.rope_compress.beta_fast == 16 && a.rope_compress.beta_slow == 2,
          "rope read");
    CHECK(a.attn_kind[0] == DSV4_ATTN_SWA && a.attn_kind[1] == DSV4_ATTN_CSA && a.attn_kind[2] == DSV4_ATTN_HCA &&
              a.compress_ratio[2] == 128 && a.attn_kind[4] == DSV4_ATTN_SWA,
          "schedule read");
    CHECK(a.hash_routed[0] && !a.hash_routed[1] && a.n_eos == 2 && a.eos_token_ids[1] == 7 && a.bos_token_id == 5, "hash, eos");
    CHECK(a.weight_format == DSV4_WFMT_FP8 && a.expert_format == DSV4_WFMT_FP4, "formats");
    CHECK(same_config(&a, &b), "reference naming gives a different config");
    CHECK(same_config(&a, &t), "transformers naming gives a different config");
    /* round trip through the official naming */
    char buf[8192];
    size_t len = 0;
    CHECK_STATUS(dsv4_config_to_json(&a, buf, sizeof buf, &len), DSV4_OK);
    CHECK_STATUS(dsv4_config_parse(buf, len, "rt.json", &b), DSV4_OK);
    CHECK(same_config(&a, &b), "config_to_json does not read back the same");
    CHECK_STATUS(dsv4_config_to_json(&a, buf, 16, &len), DSV4_ERR_CAPACITY);
    dsv4_config_tiny(&t);
    CHECK_STATUS(dsv4_config_to_json(&t, buf, sizeof buf, &len), DSV4_OK);
    CHECK_STATUS(dsv4_config_parse(buf, len, "rt.json", &b), DSV4_OK);
    CHECK(same_config(&t, &b), "tiny config does not round-trip");
}

static void test_config_hf_tiny(void)
{
    dsv4_model_config c;
    if (!test_find_hf_tiny(hf_tiny, sizeof hf_tiny)) return;
    CHECK_STATUS(dsv4_config_load(hf_tiny, &c), DSV4_OK);
    static const int kinds[5] = {DSV4_ATTN_SWA, DSV4_ATTN_HCA, DSV4_ATTN_CSA, DSV4_ATTN_HCA, DSV4_ATTN_CSA};
    static const int ratios[5] = {0, 8, 4, 8, 4};
    for (int i = 0; i < 5; i++)
        CHECK(c.attn_kind[i] == kinds[i] && c.compress_ratio[i] == ratios[i] && c.hash_routed[i] == (i < 2), "layer %d", i);
    CHECK(c.dim == 128 && c.n_layers == 5 && c.n_heads == 4 && c.q_lora_rank == 64 && c.o_groups == 2 && c.o_lora_rank == 32 &&
              c.window_size == 16 && c.index_n_heads == 4 && c.index_topk == 4 && c.n_routed_experts == 8 &&
              c.n_activated_experts == 2 && c.moe_inter_dim == 64 && c.n_hash_layers == 2 && c.vocab_size == 512,
          "hf-tiny-a shape");
    CHECK(c.weight_format == DSV4_WFMT_BF16 && c.expert_format == DSV4_WFMT_BF16 && c.rope_compress.yarn &&
              c.rope_compress.factor == 16 && c.rope_main.theta == 10000 && !c.rope_main.yarn && !strcmp(c.naming, "transformers"),
          "hf-tiny-a formats and rope");
}

static void test_config_hostile(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"hidden_size\": 1000000000}", "hidden_size"},
        {"{\"hidden_size\": -4}", "hidden_size"},
        {"{\"hidden_size\": \"4096\"}", "hidden_size"},
        {"{\"hidden_size\": 4096.5}", "hidden_size"},
        {"{\"hidden_size\": 1e300}", "hidden_size"},
        {"{\"vocab_size\": 1099511627776}", "vocab_size"},
        {"{\"num_hidden_layers\": 100000}", "layers"},
        {"{\"num_hidden_layers\": 0}", "layers"},
        {"{\"num_nextn_predict_layers\": 1000}", "MTP"},
        {"{\"n_routed_experts\": 1000000}", "n_routed_experts"},
        {"{\"num_attention_heads\": 2147483648}", "num_attention_heads"},
        {"{\"moe_intermediate_size\": 9007199254740993}", "moe_intermediate_size"},
        {"{\"max_position_embeddings\": 1e15}", "max_position_embeddings"},
        {"{\"index_topk\": 0}", "index_topk"},
        {"{\"head_dim\": 256}", "head_dim"},
        {"{\"num_key_value_heads\": 8}", "num_key_value_heads"},
        {"{\"index_head_dim\": 96}", "index_head_dim"},
        {"{\"o_groups\": 7}", "o_groups"},
        {"{\"num_experts_per_tok\": 300}", "num_experts_per_tok"},
        {"{\"num_hash_layers\": 44}", "num_hash_layers"},
        {"{\"hidden_size\": 4096, \"dim\": 2048}", "\"dim\""},
        {"{\"compress_ratios\": [0, 4]}", "compress_ratios"},
        {"{\"num_hidden_layers\": 2, \"compress_ratios\": [0, -4]}", "compress_ratios[1]"},
        {"{\"num_hidden_layers\": 2, \"compress_ratios\": [0, 100000]}", "compress_ratios[1]"},
        {"{\"num_hidden_layers\": 2, \"compress_ratios\": [0, \"4\"]}", "compress_ratios"},
        {"{\"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"full_attention\"]}", "full_attention"},
        {"{\"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"],"
         " \"compress_ratios\": [0, 4]}", "layer 1"},
        {"{\"num_hidden_layers\": 2, \"mlp_layer_types\": [\"dense\", \"moe\"]}", "dense"},
        {"{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}}", "weight_block_size"},
        {"{\"quantization_config\": {\"quant_method\": \"awq\"}}", "awq"},
        {"{\"dtype\": \"bf16\", \"quantization_config\": {\"quant_method\": \"fp8\"}}", "quantization_config"},
        {"{\"attention_bias\": true}", "attention_bias"},
        {"{\"hidden_act\": \"gelu\"}", "gelu"},
        {"{\"scoring_func\": \"relu\"}", "relu"},
        {"{\"eos_token_id\": 129280}", "eos_token_id"},
        {"{\"eos_token_id\": []}", "eos_token_id"},
        {"{\"rope_theta\": 0.5}", "rope theta"},
        {"{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0.5}}", "YaRN"},
        {"{\"rope_scaling\": {\"type\": \"linear\"}}", "linear"},
        {"{\"rope_parameters\": {\"rope_theta\": 3}}", "rope_parameters"},
        {"{\"hc_eps\": 0}", "hc_eps"},
        {"{\"routed_scaling_factor\": -1}", "routed_scaling_factor"},
        {"{\"hidden_size\": 200, \"quantization_config\": {\"quant_method\": \"fp8\"}}", "multiples of 128"},
        {"{\"partial_rotary_factor\": 0.25}", "qk_rope_head_dim = 128"},
        {"{\"qk_rope_head_dim\": 64, \"partial_rotary_factor\": 0.25}", "partial_rotary_factor"},
        {"[]", "object"},
        {"{\"a\": 1,}", "invalid JSON"},
        {"{\"hidden_size\": 128, \"hidden_size\": 256}", "duplicate key"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dsv4_model_config c, before;
        memset(&c, 0xA5, sizeof c);
        before = c;
        dsv4_clear_error();
        dsv4_status st = parse(bad[k].json, &c);
        CHECK(st != DSV4_OK, "accepted: %s", bad[k].json);
        CHECK(has("cfg.json") && has(bad[k].needle), "%s: message lacks '%s': %s", bad[k].json, bad[k].needle, dsv4_last_error());
        CHECK(!memcmp(&c, &before, sizeof c), "%s: output written on failure", bad[k].json);
    }
    dsv4_model_config c;
    CHECK_STATUS(dsv4_config_load("/nonexistent-dir", &c), DSV4_ERR_NOT_FOUND);
    CHECK(has("/nonexistent-dir/config.json"), "%s", dsv4_last_error());
    /* vLLM-style "1 = no compression" and the 1-entry MTP tail are accepted */
    CHECK_STATUS(parse("{\"num_hidden_layers\": 2, \"compress_ratios\": [1, 4, 0]}", &c), DSV4_OK);
    CHECK(c.attn_kind[0] == DSV4_ATTN_SWA && c.compress_ratio[0] == 0 && c.attn_kind[1] == DSV4_ATTN_CSA, "ratio 1 is SWA");
}

/* The attention schedule as transformers reads it: kinds from layer_types (or compress_ratios
 * through {0, 4, 128}), ratios from compress_rates of the kind (src/model/config.c). */
static void test_config_schedule(void)
{
    dsv4_model_config c;
    const char *k_csa = "\"compressed_sparse_attention\"", *k_hca = "\"heavily_compressed_attention\"";
    char j[1024];
    /* an HCA layer of ratio 4 and a CSA layer of ratio 8; entries past the blocks are not read */
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 3, \"layer_types\": [\"sliding_attention\", %s, %s, %s, \"bogus\"],"
             " \"compress_rates\": {%s: 8, %s: 4}}", k_hca, k_csa, k_hca, k_csa, k_hca);
    CHECK_STATUS(parse(j, &c), DSV4_OK);
    CHECK(c.attn_kind[1] == DSV4_ATTN_HCA && c.compress_ratio[1] == 4 && c.attn_kind[2] == DSV4_ATTN_CSA &&
              c.compress_ratio[2] == 8 && c.attn_kind[3] == DSV4_ATTN_HCA && c.compress_ratio[3] == 4,
          "layer_types + compress_rates: %d/%d %d/%d", c.attn_kind[1], c.compress_ratio[1], c.attn_kind[2], c.compress_ratio[2]);
    /* the top-level legacy rates override compress_rates */
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"layer_types\": [%s, %s], \"compress_rates\": {%s: 8},"
             " \"compress_rate_csa\": 16, \"compress_rate_hca\": 32}", k_csa, k_hca, k_csa);
    CHECK_STATUS(parse(j, &c), DSV4_OK);
    CHECK(c.compress_ratio[0] == 16 && c.compress_ratio[1] == 32 && !strcmp(c.naming, "transformers"), "legacy rates");
    /* compress_ratios with rates: only the kinds; the ratios are the rates */
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 3, \"compress_ratios\": [0, 4, 128, 0], \"compress_rates\": {%s: 8, %s: 64}}",
             k_csa, k_hca);
    CHECK_STATUS(parse(j, &c), DSV4_OK);
    CHECK(c.attn_kind[1] == DSV4_ATTN_CSA && c.compress_ratio[1] == 8 && c.attn_kind[2] == DSV4_ATTN_HCA &&
              c.compress_ratio[2] == 64 && c.attn_kind[3] == DSV4_ATTN_SWA,
          "compress_ratios as kinds");
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"compress_ratios\": [0, 8], \"compress_rates\": {%s: 8}}", k_csa);
    CHECK_STATUS(parse(j, &c), DSV4_ERR_FORMAT);
    CHECK(has("compress_ratios[1] = 8") && has("only names"), "%s", dsv4_last_error());
    /* both given: the kinds must agree (with rates) or kinds and ratios (without) */
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"compress_ratios\": [4, 128], \"layer_types\": [%s, %s],"
             " \"compress_rates\": {%s: 8}}", k_csa, k_hca, k_csa);
    CHECK_STATUS(parse(j, &c), DSV4_OK);
    CHECK(c.compress_ratio[0] == 8 && c.compress_ratio[1] == 128, "both, agreeing kinds");
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"compress_ratios\": [4, 4], \"layer_types\": [%s, %s],"
             " \"compress_rates\": {%s: 8}}", k_csa, k_hca, k_csa);
    CHECK_STATUS(parse(j, &c), DSV4_ERR_FORMAT);
    CHECK(has("layer_types[1] disagrees with compress_ratios[1]"), "%s", dsv4_last_error());
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"compress_ratios\": [4, 8], \"layer_types\": [%s, %s]}", k_csa, k_hca);
    CHECK_STATUS(parse(j, &c), DSV4_ERR_FORMAT);
    CHECK(has("layer 1"), "%s", dsv4_last_error());
    /* no schedule: a transformers-named config takes transformers' default (HCA, HCA, then HCA / CSA) */
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 6, \"compress_rates\": {%s: 8}}", k_csa);
    CHECK_STATUS(parse(j, &c), DSV4_OK);
    static const int want[7] = {DSV4_ATTN_HCA, DSV4_ATTN_HCA, DSV4_ATTN_HCA, DSV4_ATTN_CSA, DSV4_ATTN_HCA, DSV4_ATTN_CSA,
                                DSV4_ATTN_SWA};
    for (int i = 0; i < 7; i++)
        CHECK(c.attn_kind[i] == want[i] && c.compress_ratio[i] == (want[i] == DSV4_ATTN_CSA ? 8 : want[i] ? 128 : 0),
              "transformers default, layer %d: %d/%d", i, c.attn_kind[i], c.compress_ratio[i]);
    /* ... an official one the V4-Flash schedule */
    CHECK_STATUS(parse("{\"num_hidden_layers\": 4}", &c), DSV4_OK);
    CHECK(c.attn_kind[0] == DSV4_ATTN_SWA && c.attn_kind[2] == DSV4_ATTN_CSA && c.compress_ratio[3] == 128, "official default");
    /* mlp_layer_types: the first num_hidden_layers entries count */
    CHECK_STATUS(parse("{\"num_hidden_layers\": 2, \"mlp_layer_types\": [\"moe\", \"hash_moe\", \"hash_moe\"]}", &c), DSV4_OK);
    CHECK(!c.hash_routed[0] && c.hash_routed[1] && !c.hash_routed[2] && c.n_hash_layers == 1, "mlp_layer_types");
    snprintf(j, sizeof j, "{\"num_hidden_layers\": 2, \"layer_types\": [%s, %s], \"compress_rates\": {%s: 1}}", k_csa, k_hca,
             k_hca);
    CHECK_STATUS(parse(j, &c), DSV4_ERR_FORMAT);
    CHECK(has("heavily_compressed_attention is 1"), "%s", dsv4_last_error());
}

/* The key table (src/model/config.c): nulls, transformers' rope_parameters, and what the writer
 * writes when the official naming cannot say the schedule. */
static void test_config_keys(void)
{
    dsv4_model_config c, d, def;
    dsv4_config_default(&def);
    static const char *const nulls[] = {"{\"hidden_size\": null}", "{\"dim\": null}", "{\"eos_token_id\": null}",
                                        "{\"scoring_func\": null}", "{\"bos_token_id\": null}", "{\"norm_topk_prob\": null}"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
        CHECK_STATUS(parse(nulls[i], &c), DSV4_ERR_FORMAT);
        CHECK(has("is null") && has("null is not the default"), "%s: %s", nulls[i], dsv4_last_error());
    }
    /* null where transformers types the field optional: absent */
    CHECK_STATUS(parse("{\"pad_token_id\": null, \"rope_scaling\": null, \"partial_rotary_factor\": null, \"layer_types\": null,"
                       " \"compress_rates\": null, \"mlp_layer_types\": null, \"rope_parameters\": null,"
                       " \"quantization_config\": null}", &c), DSV4_OK);
    CHECK_STATUS(parse("{}", &d), DSV4_OK);
    CHECK(same_config(&c, &d), "optional nulls are absent");
    /* nested rope_parameters win over the top-level rope keys (which transformers then drops) */
    const char *nested = "{\"rope_theta\": 10000.0, \"compress_rope_theta\": 5, \"rope_parameters\": {\"main\": {\"rope_type\": "
                         "\"default\", \"rope_theta\": 20000.0, \"partial_rotary_factor\": 0.125}, \"compress\": {\"rope_type\": "
                         "\"yarn\", \"rope_theta\": 80000.0, \"factor\": 4.0, \"original_max_position_embeddings\": 4096, "
                         "\"attention_factor\": 1.0}}}";
    CHECK_STATUS(parse(nested, &c), DSV4_OK);
    CHECK(c.rope_main.theta == 20000 && c.rope_compress.theta == 80000 && c.rope_compress.factor == 4 && c.rope_compress.yarn &&
              c.rope_compress.original_max_position == 4096,
          "nested rope_parameters: %g %g", c.rope_main.theta, c.rope_compress.theta);
    /* a flat rope_parameters is compress's YaRN numbers */
    CHECK_STATUS(parse("{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8.0, \"original_max_position_embeddings\": 1024}}",
                       &c), DSV4_OK);
    CHECK(c.rope_compress.yarn && c.rope_compress.factor == 8 && c.rope_compress.original_max_position == 1024 &&
              c.rope_compress.theta == def.rope_compress.theta,
          "flat rope_parameters");
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}}}", "lone entry"},
        {"{\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}, \"compress\": {\"rope_type\": \"yarn\","
         " \"rope_theta\": 1e5, \"factor\": 16.0, \"original_max_position_embeddings\": 4096}}}", "attention_factor 1.27726"},
        {"{\"rope_parameters\": {\"main\": {\"rope_type\": \"default\"}, \"compress\": {\"rope_type\": \"default\", "
         "\"rope_theta\": 1e5}}}", "rope_parameters.main has no rope_theta"},
        {"{\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 1e4, \"partial_rotary_factor\": 0.25},"
         " \"compress\": {\"rope_type\": \"default\", \"rope_theta\": 1e5}}}", "rope_parameters.main.partial_rotary_factor"},
        {"{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 4096,"
         " \"attention_factor\": 1.5}}", "attention_factor 1.5"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK(parse(bad[k].json, &c) != DSV4_OK, "accepted: %s", bad[k].json);
        CHECK(has(bad[k].needle), "%s: message lacks '%s': %s", bad[k].json, bad[k].needle, dsv4_last_error());
    }
    /* the writer: an HCA layer of ratio 4, a CSA layer of ratio 8 and hash routing not on a prefix
     * are written in transformers' naming, and read back the same */
    dsv4_config_tiny(&c);
    c.compress_ratio[1] = c.compress_ratio[3] = 8; /* CSA */
    c.compress_ratio[2] = 4;                       /* HCA */
    c.hash_routed[0] = 0, c.hash_routed[2] = 1;
    char buf[8192];
    size_t len = 0;
    CHECK_STATUS(dsv4_config_to_json(&c, buf, sizeof buf, &len), DSV4_OK);
    CHECK(strstr(buf, "\"layer_types\"") && strstr(buf, "\"compress_rates\"") && strstr(buf, "\"mlp_layer_types\"") &&
              !strstr(buf, "\"compress_ratios\"") && !strstr(buf, "\"num_hash_layers\""),
          "transformers schedule written: %s", buf);
    CHECK_STATUS(dsv4_config_parse(buf, len, "rt.json", &d), DSV4_OK);
    CHECK(same_config(&c, &d), "the transformers-named schedule does not read back the same");
    c.compress_ratio[3] = 16; /* two CSA rates besides an HCA of ratio 4: neither naming */
    CHECK_STATUS(dsv4_config_to_json(&c, buf, sizeof buf, &len), DSV4_ERR_UNSUPPORTED);
    CHECK(has("no naming says that"), "%s", dsv4_last_error());
}

/* ---- checkpoints ------------------------------------------------------------------------------ */

static void check_tiny_weights(const dsv4_model *m)
{
    const dsv4_model_config *c = dsv4_model_get_config(m);
    const dsv4_model_weights *w = dsv4_model_get_weights(m);
    CHECK(w->n_layers == 4 && w->n_mtp == 1 && w->layout == DSV4_LAYOUT_OFFICIAL && w->expert_format == DSV4_WFMT_FP4,
          "tiny: %d layers + %d MTP", w->n_layers, w->n_mtp);
    CHECK(w->embed.data && w->embed.dtype == DSV4_BF16 && w->embed.shape[0] == 512 && w->embed.shape[1] == 256, "embed");
    CHECK(w->head.data && w->head.data != w->embed.data && w->hc_head_fn.dtype == DSV4_F32 && w->hc_head_fn.shape[0] == 4 &&
              w->hc_head_fn.shape[1] == 1024,
          "head, hc_head");
    for (int b = 0; b < 5; b++) {
        const dsv4_layer_weights *L = &w->layers[b];
        CHECK(L->kind == (dsv4_attn_kind)c->attn_kind[b] && L->is_mtp == (b == 4), "block %d kind", b);
        CHECK(L->wq_a.weight.dtype == DSV4_F8_E4M3 && L->wq_a.scale.dtype == DSV4_E8M0 && L->wq_a.scale.shape[0] == 1 &&
                  L->wq_a.scale.shape[1] == 2 && L->wq_a.format == DSV4_WFMT_FP8,
              "block %d wq_a [128, 256] with a [1, 2] scale", b);
        CHECK(L->wq_b.weight.shape[0] == 2048 && L->wq_b.scale.shape[0] == 16 && L->wq_b.scale.shape[1] == 1, "wq_b");
        CHECK(L->wo_a.weight.shape[0] == 128 && L->wo_a.weight.shape[1] == 1024, "wo_a [G*o_lora, H*512/G]");
        CHECK(L->hc_attn_fn.dtype == DSV4_F32 && L->hc_attn_fn.shape[0] == 24 && L->hc_attn_fn.shape[1] == 1024, "hc_attn_fn");
        CHECK(L->attn_sink.dtype == DSV4_F32 && L->attn_sink.shape[0] == 4 && L->kv_norm.shape[0] == 512, "sink, kv_norm");
        int coff = L->kind == DSV4_ATTN_CSA ? 2 : 1;
        CHECK((L->kind == DSV4_ATTN_SWA) == !L->compressor.wkv.data, "block %d compressor presence", b);
        if (L->compressor.wkv.data)
            CHECK(L->compressor.wkv.shape[0] == coff * 512 && L->compressor.ape.shape[0] == L->compress_ratio &&
                      L->compressor.ape.dtype == DSV4_F32,
                  "block %d compressor shapes", b);
        CHECK((L->kind == DSV4_ATTN_CSA) == (L->index_wq_b.weight.data != NULL), "block %d indexer presence", b);
        if (L->index_wq_b.weight.data)
            CHECK(L->index_wq_b.weight.shape[0] == 512 && L->index_compressor.wkv.shape[0] == 256 &&
                      L->index_compressor.norm.shape[0] == 128 && L->index_weights_proj.shape[0] == 4,
                  "block %d indexer shapes", b);
        CHECK((L->tid2eid.data != NULL) == (b < 2) && (L->gate_bias.data != NULL) == (b >= 2), "block %d routing tensors", b);
        for (int e = 0; e < 8; e++) {
            const dsv4_expert_weights *ex = &L->experts[e];
            CHECK(ex->w1.weight.dtype == DSV4_FP4X2 && ex->w1.weight.shape[0] == 128 && ex->w1.weight.shape[1] == 128 &&
                      ex->w1.scale.shape[1] == 8 && ex->w2.weight.shape[0] == 256 && ex->w2.weight.shape[1] == 64 &&
                      ex->w2.scale.shape[1] == 4 && ex->w3.weight.data,
                  "block %d expert %d FP4 shapes", b, e);
        }
        CHECK(L->shared.w2.weight.dtype == DSV4_F8_E4M3 && L->shared.w2.scale.shape[0] == 2, "shared expert");
        CHECK((L->e_proj.weight.data != NULL) == (b == 4) && (L->hc_head_scale.data != NULL) == (b == 4), "MTP extras");
        if (L->tid2eid.data) {
            const int64_t *t = L->tid2eid.data;
            int ok = L->tid2eid.dtype == DSV4_I64 && L->tid2eid.shape[0] == 512 && L->tid2eid.shape[1] == 2;
            for (int r = 0; r < 512 && ok; r++) ok = t[2 * r] >= 0 && t[2 * r] < 8 && t[2 * r + 1] >= 0 && t[2 * r + 1] < 8 && t[2 * r] != t[2 * r + 1];
            CHECK(ok, "block %d tid2eid: distinct experts in range", b);
        }
    }
}

/* Weights come out well-scaled and their block scales follow the act128 rule. */
static void check_tiny_values(const dsv4_model *m)
{
    const dsv4_layer_weights *L = &dsv4_model_get_weights(m)->layers[1];
    const dsv4_linear_weight *lw = &L->wq_b; /* [2048, 128], std 1/sqrt(128) */
    float *x = malloc(2048 * 128 * sizeof *x);
    dsv4_tensor out;
    int64_t shape[2] = {2048, 128};
    dsv4_tensor_init(&out, x, DSV4_F32, 2, shape);
    CHECK_STATUS(dsv4_dequantize_weight(NULL, &lw->weight, &lw->scale, &out), DSV4_OK);
    double ss = 0;
    for (int i = 0; i < 2048 * 128; i++) ss += (double)x[i] * x[i];
    double rms = sqrt(ss / (2048.0 * 128)), want = 1 / sqrt(128.0);
    CHECK(fabs(rms / want - 1) < 0.1, "wq_b rms %g, expected %g (FP8 rounding moves it by a few %%)", rms, want);
    /* scale rule: each block's largest |code value| is in (224, 448] */
    const uint8_t *codes = lw->weight.data, *sc = lw->scale.data;
    for (int br = 0; br < 16; br++) {
        float amax = 0;
        for (int r = br * 128; r < br * 128 + 128; r++)
            for (int c = 0; c < 128; c++) {
                float v = fabsf(dsv4_e4m3_decode(codes[r * 128 + c]));
                if (v > amax) amax = v;
            }
        CHECK(amax > 224 && amax <= 448 && sc[br] > 100 && sc[br] < 127, "block %d: max code %g, scale byte %d", br, amax, sc[br]);
    }
    const dsv4_linear_weight *ew = &L->experts[3].w1; /* FP4 [128, 256], std 1/16 */
    float *y = malloc(128 * 256 * sizeof *y);
    int64_t s2[2] = {128, 256};
    dsv4_tensor_init(&out, y, DSV4_F32, 2, s2);
    CHECK_STATUS(dsv4_dequantize_weight(NULL, &ew->weight, &ew->scale, &out), DSV4_OK);
    ss = 0;
    for (int i = 0; i < 128 * 256; i++) ss += (double)y[i] * y[i];
    rms = sqrt(ss / (128.0 * 256));
    CHECK(fabs(rms / (1 / 16.0) - 1) < 0.25, "expert rms %g, expected 1/16 (FP4 rounding is coarse)", rms);
    free(x);
    free(y);
}

static void test_make_tiny(void)
{
    char dir[256], dir2[256], dir3[256], a[512], b[512];
    path_of(dir, sizeof dir, "tiny");
    path_of(dir2, sizeof dir2, "tiny2");
    path_of(dir3, sizeof dir3, "tiny3");
    uint64_t seed = test_rand_u64() % 1000000;
    CHECK_STATUS(dsv4_make_tiny(dir, seed), DSV4_OK);
    dsv4_model *m = NULL;
    CHECK_STATUS(dsv4_model_open(dir, NULL, &m), DSV4_OK);
    if (m) {
        CHECK(dsv4_model_issue_count(m) == 0, "issues in a fresh tiny model");
        check_tiny_weights(m);
        check_tiny_values(m);
        dsv4_tensor_entry e;
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "mtp.0.e_proj.weight", &e), DSV4_OK);
        CHECK(!strcmp(e.file, "model-00002-of-00002.safetensors") && e.dtype == DSV4_F8_E4M3, "MTP in the second shard");
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "mtp.0.hc_attn_fn", &e), DSV4_OK);
        CHECK(e.dtype == DSV4_F32 && e.file_offset % 4 == 0, "F32 tensors are 4-byte aligned in the file");
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "nope", &e), DSV4_ERR_NOT_FOUND);
        dsv4_model_close(m);
    }
    /* same seed, same bytes; another seed, other weights */
    CHECK_STATUS(dsv4_make_tiny(dir2, seed), DSV4_OK);
    CHECK_STATUS(dsv4_make_tiny(dir3, seed + 1), DSV4_OK);
    for (int s = 1; s <= 2; s++) {
        size_t n1 = 0, n2 = 0, n3 = 0;
        snprintf(a, sizeof a, "%s/model-0000%d-of-00002.safetensors", dir, s);
        char *x = test_read_file(a, &n1);
        snprintf(b, sizeof b, "%s/model-0000%d-of-00002.safetensors", dir2, s);
        char *y = test_read_file(b, &n2);
        snprintf(b, sizeof b, "%s/model-0000%d-of-00002.safetensors", dir3, s);
        char *z = test_read_file(b, &n3);
        CHECK(x && y && n1 == n2 && !memcmp(x, y, n1), "shard %d differs for the same seed", s);
        CHECK(z && n1 == n3 && memcmp(x, z, n1), "shard %d is the same for another seed", s);
        free(x);
        free(y);
        free(z);
    }
    rm_dir(dir2);
    rm_dir(dir3);
}

/* A copy of the tiny model with one file replaced by `text` (NULL: removed). */
static void variant(const char *name, const char *file, const char *text, char *out, size_t cap)
{
    char src[256], p[512];
    path_of(src, sizeof src, "tiny");
    path_of(out, cap, "%s", name);
    rm_dir(out);
    copy_dir(src, out);
    snprintf(p, sizeof p, "%s/%s", out, file);
    if (text) test_write_file(p, text, strlen(text));
    else unlink(p);
}

/* The tiny model with config.json rewritten from v. */
static void config_variant(const char *name, const dsv4_model_config *v, char *dir, size_t cap)
{
    char cfg[16384];
    size_t len = 0;
    CHECK_STATUS(dsv4_config_to_json(v, cfg, sizeof cfg, &len), DSV4_OK);
    cfg[len < sizeof cfg ? len : sizeof cfg - 1] = '\0';
    variant(name, "config.json", cfg, dir, cap);
}

/* c with its first n layers (the MTP block follows them). */
static dsv4_model_config with_layers(const dsv4_model_config *c, int n)
{
    dsv4_model_config v = *c;
    v.n_layers = n;
    for (int i = n; i < 8; i++) {
        v.compress_ratio[i] = 0;
        v.attn_kind[i] = DSV4_ATTN_SWA;
    }
    return v;
}

static void expect_open_fails(const char *dir, dsv4_status want, const char *n1, const char *n2)
{
    dsv4_model *m = (dsv4_model *)(uintptr_t)0x1234;
    dsv4_clear_error();
    dsv4_status st = dsv4_model_open(dir, NULL, &m);
    CHECK(st == want, "%s: status %d, expected %d: %s", dir, (int)st, (int)want, dsv4_last_error());
    CHECK(has(n1) && has(n2), "%s: message lacks '%s' / '%s': %s", dir, n1, n2, dsv4_last_error());
    CHECK(m == (dsv4_model *)(uintptr_t)0x1234, "%s: output written on failure", dir);
}

static void test_hostile_dirs(void)
{
    char dir[256], src[256], p[512];
    path_of(src, sizeof src, "tiny");
    dsv4_model_config c;
    CHECK_STATUS(dsv4_config_load(src, &c), DSV4_OK);
    char cfg[16384];
    size_t len;

    variant("noshard", "model-00002-of-00002.safetensors", NULL, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_NOT_FOUND, "model-00002-of-00002.safetensors", "cannot open");
    variant("evil", "model.safetensors.index.json", "{\"weight_map\": {\"embed.weight\": \"../x.safetensors\"}}", dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "not a plain file name");
    variant("badindex", "model.safetensors.index.json", "{\"weight_map\": {\"embed.weight\": \"model-00002-of-00002.safetensors\"}}",
            dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_FORMAT, "embed.weight", "model-00002-of-00002.safetensors");
    variant("noindexmap", "model.safetensors.index.json", "{\"metadata\": {}}", dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "weight_map");

    /* a truncated shard */
    variant("trunc", "config.json", NULL, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(truncate(p, file_size(p) - 100) == 0, "truncate");
    CHECK_STATUS(dsv4_config_to_json(&c, cfg, sizeof cfg, &len), DSV4_OK);
    snprintf(p, sizeof p, "%s/config.json", dir);
    test_write_file(p, cfg, len);
    expect_open_fails(dir, DSV4_ERR_FORMAT, "model-00001-of-00002.safetensors", "truncated");

    /* config and checkpoint disagree: shapes, extra layers, missing layers, formats */
    dsv4_model_config v = c;
    v.moe_inter_dim = 256;
    config_variant("shape", &v, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_SHAPE, "ffn.experts.0.w1.weight", "expected [256, 128]");
    dsv4_model_open_options lenient = {1, DSV4_LOAD_MAP};
    dsv4_model *m = NULL;
    CHECK_STATUS(dsv4_model_open(dir, &lenient, &m), DSV4_OK);
    if (m) {
        dsv4_model_issue_info is;
        int shapes = 0;
        for (int i = 0; dsv4_model_issue(m, i, &is) == DSV4_OK; i++) shapes += is.kind == DSV4_ISSUE_SHAPE;
        /* 5 blocks x (8 experts x 3 + shared 3) weights and their scales */
        CHECK(shapes == 5 * 27 * 2 && dsv4_model_issue_count(m) == shapes, "%d shape issues of %d", shapes, dsv4_model_issue_count(m));
        dsv4_model_close(m);
    }
    v = with_layers(&c, 5);
    config_variant("missing", &v, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_NOT_FOUND, "layers.4.", "is missing");
    v = with_layers(&c, 3);
    config_variant("extra", &v, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_FORMAT, "layers.3.", "not a weight of the model");
    v = c;
    v.weight_format = DSV4_WFMT_BF16;
    v.expert_format = DSV4_WFMT_BF16;
    config_variant("dtype", &v, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_DTYPE, "has dtype F8_E4M3", "expected BF16 or F32");
    v = c;
    v.n_hash_layers = 1;
    v.hash_routed[1] = 0;
    config_variant("routing", &v, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_NOT_FOUND, "layers.1.ffn.gate.bias", "is missing");
    variant("noconfig", "config.json", NULL, dir, sizeof dir);
    expect_open_fails(dir, DSV4_ERR_NOT_FOUND, "config.json", "cannot open");
    const char *names[] = {"noshard", "evil", "badindex", "noindexmap", "trunc", "shape", "missing", "extra", "dtype", "routing", "noconfig"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        path_of(dir, sizeof dir, "%s", names[k]);
        rm_dir(dir);
    }
}

/* ---- hostile files: FIFOs, huge shard indexes, warnings ---------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A FIFO in the place of config.json, the index, a shard or tokenizer.json is refused at once
 * (before the fix, opening it waited for a writer forever: alarm() turns such a hang into a
 * failure of this test). */
static void test_fifo_files(void)
{
    char dir[256], p[512];
    const char *files[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"};
    alarm(60);
    for (int k = 0; k < 3; k++) {
        variant("fifo", files[k], NULL, dir, sizeof dir);
        snprintf(p, sizeof p, "%s/%s", dir, files[k]);
        CHECK(mkfifo(p, 0600) == 0, "mkfifo %s", p);
        expect_open_fails(dir, DSV4_ERR_IO, files[k], "not a regular file");
    }
    dsv4_model_config c;
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK_STATUS(dsv4_config_load(dir, &c), DSV4_OK); /* the config itself is fine here */
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo %s", p);
    dsv4_tokenizer *tok = NULL;
    CHECK_STATUS(dsv4_tokenizer_load(p, &tok), DSV4_ERR_IO);
    CHECK(has("tokenizer.json") && has("not a regular file") && !tok, "%s", dsv4_last_error());
    alarm(0);
    rm_dir(dir);
}

/* The shard index: 60,000 distinct shard names are de-duplicated in linear time (the quadratic
 * scan took 17.7 s for 100,000), and more distinct files than ST_MAX_FILES (65536) are refused
 * with a clear message, also at once. */
static void index_of(char *ix, size_t cap, int n, size_t *len)
{
    size_t o = (size_t)snprintf(ix, cap, "{\"weight_map\": {");
    for (int i = 0; i < n; i++) o += (size_t)snprintf(ix + o, cap - o, "%s\"w%d\": \"s%d\"", i ? ", " : "", i, i);
    o += (size_t)snprintf(ix + o, cap - o, "}}");
    *len = o;
}

static void test_index_scale(void)
{
    char dir[256], p[512];
    size_t cap = (size_t)70000 * 40 + 64, len;
    char *ix = malloc(cap);
    index_of(ix, cap, 60000, &len);
    variant("bigindex", "model.safetensors.index.json", ix, dir, sizeof dir);
    double t0 = now_s();
    expect_open_fails(dir, DSV4_ERR_NOT_FOUND, "s0", "cannot open");
    double dt = now_s() - t0;
    CHECK(dt < 1.0, "60,000 shard names took %.2f s", dt);
    index_of(ix, cap, 70000, &len);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    test_write_file(p, ix, len);
    t0 = now_s();
    expect_open_fails(dir, DSV4_ERR_FORMAT, "model.safetensors.index.json", "more than 65536 shard files");
    dt = now_s() - t0;
    CHECK(dt < 1.0, "70,000 shard names took %.2f s", dt);
    free(ix);
    rm_dir(dir);
}

/* Warnings go to the handler: an unknown config key is reported there, and none reaches stderr
 * once the handler is NULL (silenced). */
static void test_warning_channel(void)
{
    dsv4_model_config c;
    test_caught()->n = 0;
    dsv4_set_warning_handler(test_on_warning, NULL);
    CHECK_STATUS(parse("{\"hidden_size\": 4096, \"my_knob\": 1}", &c), DSV4_OK);
    CHECK(test_caught()->n == 1 && strstr(test_caught()->last, "cfg.json: unknown config key \"my_knob\" ignored"),
          "%d warnings, last '%s'", test_caught()->n, test_caught()->last);
    CHECK_STATUS(parse("{\"hidden_size\": 4096, \"my_knob\": 1}", &c), DSV4_OK);
    CHECK(test_caught()->n == 2, "a caller's handler hears every warning: %d", test_caught()->n);
    dsv4_set_warning_handler(NULL, NULL);
    CHECK_STATUS(parse("{\"hidden_size\": 4096, \"my_knob\": 1}", &c), DSV4_OK);
    CHECK(test_caught()->n == 2, "silenced, yet the handler heard it");
    dsv4_set_warning_handler(dsv4_warning_stderr, NULL);
    /* a shard index given as config.json is named as such, not read as a config of defaults */
    CHECK_STATUS(parse("{\"metadata\": {}, \"weight_map\": {\"embed.weight\": \"a.safetensors\"}}", &c), DSV4_ERR_FORMAT);
    CHECK(has("cfg.json") && has("shard index"), "%s", dsv4_last_error());
}

static void test_hf_layout(void)
{
    /* the Hugging Face checkpoint written by transformers */
    dsv4_model *m = NULL;
    if (test_find_hf_tiny(hf_tiny, sizeof hf_tiny)) CHECK_STATUS(dsv4_model_open(hf_tiny, NULL, &m), DSV4_OK);
    if (m) {
        const dsv4_model_weights *w = dsv4_model_get_weights(m);
        CHECK(w->layout == DSV4_LAYOUT_HF && w->n_layers == 5 && w->n_mtp == 0 && w->expert_format == DSV4_WFMT_BF16,
              "hf-tiny-a: layout %d, %d layers, %d MTP", (int)w->layout, w->n_layers, w->n_mtp);
        CHECK(w->embed.dtype == DSV4_BF16 && w->embed.shape[0] == 512 && w->hc_head_fn.dtype == DSV4_BF16 &&
                  w->hc_head_fn.shape[1] == 512,
              "globals");
        const dsv4_layer_weights *L = &w->layers[2];
        CHECK(L->kind == DSV4_ATTN_CSA && L->kv_norm.data && L->kv_norm.shape[0] == 512 && L->wq_a.format == DSV4_WFMT_BF16 &&
                  !L->wq_a.scale.data && L->index_compressor.ape.shape[1] == 256 && L->experts[7].w2.weight.shape[0] == 128,
              "layer 2");
        CHECK(w->layers[0].tid2eid.dtype == DSV4_I64 && w->layers[4].gate_bias.dtype == DSV4_BF16, "routing tensors");
        dsv4_tensor_entry e;
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "layers.0.attn.kv_norm.weight", &e), DSV4_OK);
        CHECK(!strcmp(e.name, "model.layers.0.attn.norm.weight") && e.data == w->layers[0].kv_norm.data, "canonical lookup");
        /* the view is the file's bytes in place */
        size_t n;
        char fp[1100];
        snprintf(fp, sizeof fp, "%s/model.safetensors", hf_tiny);
        char *file = test_read_file(fp, &n);
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "model.embed_tokens.weight", &e), DSV4_OK);
        CHECK(file && e.file_offset + e.nbytes <= n && !memcmp(file + e.file_offset, w->embed.data, e.nbytes), "embed bytes");
        free(file);
        dsv4_model_close(m);
    }
    /* our writer's transformers layout reads back the same way */
    char dir[256];
    path_of(dir, sizeof dir, "hfwrite");
    dsv4_model_config c;
    dsv4_config_tiny(&c);
    c.weight_format = DSV4_WFMT_BF16;
    c.expert_format = DSV4_WFMT_BF16;
    dsv4_write_options o = {3, 1, DSV4_LAYOUT_HF, 0, 0};
    CHECK_STATUS(dsv4_checkpoint_write(dir, &c, &o), DSV4_OK);
    CHECK_STATUS(dsv4_model_open(dir, NULL, &m), DSV4_OK);
    if (m) {
        const dsv4_model_weights *w = dsv4_model_get_weights(m);
        CHECK(w->layout == DSV4_LAYOUT_HF && w->n_mtp == 0 && w->layers[3].wq_b.weight.dtype == DSV4_BF16, "hf write");
        dsv4_tensor_entry e;
        CHECK_STATUS(dsv4_checkpoint_find(dsv4_model_get_checkpoint(m), "model.hc_head.hc_fn", &e), DSV4_OK);
        dsv4_model_close(m);
    }
    o.layout = DSV4_LAYOUT_OFFICIAL;
    c.weight_format = DSV4_WFMT_FP8;
    o.layout = DSV4_LAYOUT_HF;
    CHECK_STATUS(dsv4_checkpoint_write(dir, &c, &o), DSV4_ERR_INVALID_ARG);
    rm_dir(dir);
}

/* Zero-initialized write options, or none, are the defaults: one file, the official layout; a
 * negative shard count is still refused. */
static void test_write_defaults(void)
{
    char dir[256];
    dsv4_model_config c;
    dsv4_config_tiny(&c);
    const dsv4_write_options zero = {0};
    for (int k = 0; k < 2; k++) {
        path_of(dir, sizeof dir, "wdefault%d", k);
        CHECK_STATUS(dsv4_checkpoint_write(dir, &c, k ? NULL : &zero), DSV4_OK);
        char file[300];
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        CHECK(access(file, F_OK) == 0, "default write options: no single model.safetensors in %s", dir);
        dsv4_model *m = NULL;
        CHECK_STATUS(dsv4_model_open(dir, NULL, &m), DSV4_OK);
        if (m) {
            CHECK(dsv4_model_get_weights(m)->layout == DSV4_LAYOUT_OFFICIAL && dsv4_model_get_weights(m)->n_mtp == 0,
                  "default write options: layout or MTP");
            dsv4_model_close(m);
        }
        rm_dir(dir);
    }
    const dsv4_write_options neg = {.shards = -1};
    path_of(dir, sizeof dir, "wneg");
    CHECK_STATUS(dsv4_checkpoint_write(dir, &c, &neg), DSV4_ERR_INVALID_ARG);
    rm_dir(dir);
}

/* The full V4-Flash tensor inventory, headers only (data are file holes): the counts and bytes
 * published for the real checkpoint (docs/model.md §9.2). */
static void test_flash_inventory(void)
{
    char dir[256];
    path_of(dir, sizeof dir, "flash");
    dsv4_model_config c;
    dsv4_config_default(&c);
    dsv4_write_options o = {0, 1, DSV4_LAYOUT_OFFICIAL, 1, 1};
    dsv4_status st = dsv4_checkpoint_write(dir, &c, &o);
    if (st == DSV4_ERR_IO && strstr(dsv4_last_error(), "extend")) {
        printf("skipped the V4-Flash inventory: this file system has no sparse files (%s)\n", dsv4_last_error());
        rm_dir(dir);
        return;
    }
    CHECK(st == DSV4_OK, "flash skeleton: %s", dsv4_last_error());
    dsv4_model *m = NULL;
    CHECK_STATUS(dsv4_model_open(dir, NULL, &m), DSV4_OK);
    if (m) {
        const dsv4_checkpoint *ck = dsv4_model_get_checkpoint(m);
        static const char *const dt[] = {"BF16", "F32", "F8_E4M3", "F8_E8M0", "I64", "I8"};
        static const long long want[] = {433, 417, 375, 34167, 3, 33792};
        long long cnt[6] = {0}, bytes = 0;
        for (int64_t i = 0; i < dsv4_checkpoint_count(ck); i++) {
            dsv4_tensor_entry e;
            dsv4_checkpoint_entry(ck, i, &e);
            bytes += (long long)e.nbytes;
            for (int k = 0; k < 6; k++) cnt[k] += !strcmp(e.st_dtype, dt[k]);
        }
        CHECK(dsv4_checkpoint_count(ck) == 69187, "%lld tensors, V4-Flash has 69187", (long long)dsv4_checkpoint_count(ck));
        for (int k = 0; k < 6; k++) CHECK(cnt[k] == want[k], "%s: %lld tensors, V4-Flash has %lld", dt[k], cnt[k], want[k]);
        /* 159,617,149,040 is the size of the 46 files: tensor data plus headers of 46 x 8 bytes
         * and ~110 bytes of JSON per tensor (name, dtype, shape, offsets) */
        long long headers = 159617149040ll - bytes;
        CHECK(headers > 46 * 8 + 69187 * 90 && headers < 46 * 8 + 69187 * 130, "%lld tensor bytes leave %lld for headers",
              bytes, headers);
        const dsv4_model_weights *w = dsv4_model_get_weights(m);
        CHECK(w->n_mtp == 1 && w->layers[42].experts[255].w2.scale.shape[1] == 64 && w->layers[2].index_wq_b.scale.shape[0] == 64,
              "Flash views");
        dsv4_model_close(m);
    }
    rm_dir(dir);
}

int main(void)
{
    test_seed();
    snprintf(tmp_root, sizeof tmp_root, "/tmp/dsv4-test-model-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    test_config_defaults();
    test_config_namings();
    test_config_hf_tiny();
    test_config_hostile();
    test_config_schedule();
    test_config_keys();
    test_make_tiny();
    test_hostile_dirs();
    test_fifo_files();
    test_index_scale();
    test_warning_channel();
    test_hf_layout();
    test_write_defaults();
    test_flash_inventory();
    char tiny[256];
    path_of(tiny, sizeof tiny, "tiny");
    rm_dir(tiny);
    rmdir(tmp_root);
    TEST_DONE();
}
