/* dsv4 inspect DIR: the config in short, the tensors by dtype, and what is missing, unexpected
 * or mistyped; with --values also every tensor holding NaN / Inf elements or NaN scales. Exit
 * status 0 when the checkpoint matches its config (and, with --values, every value is a number),
 * 1 otherwise. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void print_config(const dsv4_model_config *c)
{
    printf("config (%s naming): hidden %lld, %lld layers + %lld MTP, vocab %lld\n", c->naming, (long long)c->dim,
           (long long)c->n_layers, (long long)c->n_mtp_layers, (long long)c->vocab_size);
    printf("  attention: %lld heads x %lld (rope %lld), q_lora %lld, output %lld groups x %lld, window %lld\n",
           (long long)c->n_heads, (long long)c->head_dim, (long long)c->rope_head_dim, (long long)c->q_lora_rank,
           (long long)c->o_groups, (long long)c->o_lora_rank, (long long)c->window_size);
    int count[3] = {0, 0, 0};
    printf("  blocks:");
    for (int64_t i = 0; i < c->n_layers + c->n_mtp_layers; i++) {
        dsv4_attn_kind k = (dsv4_attn_kind)c->attn_kind[i];
        if (i < c->n_layers) count[k]++;
        printf(" %s%s%s", i == c->n_layers ? "| MTP " : "", dsv4_attn_kind_name(k), c->hash_routed[i] ? "#" : "");
        if (k != DSV4_ATTN_SWA) printf("/%d", c->compress_ratio[i]);
    }
    printf("\n    (%d SWA, %d CSA, %d HCA; /N = compression ratio, # = hash routing)\n", count[0], count[1], count[2]);
    printf("  indexer: %lld heads x %lld, top-k %lld\n", (long long)c->index_n_heads, (long long)c->index_head_dim,
           (long long)c->index_topk);
    static const char *const score[] = {"sqrtsoftplus", "softmax", "sigmoid"};
    printf("  moe: %lld routed experts (top-%lld, width %lld) + %lld shared; %lld hash layers; %s scores, scale %g, "
           "swiglu limit %g\n",
           (long long)c->n_routed_experts, (long long)c->n_activated_experts, (long long)c->moe_inter_dim,
           (long long)c->n_shared_experts, (long long)c->n_hash_layers, score[c->score_func], c->route_scale, c->swiglu_limit);
    printf("  mHC: %lld copies, %lld Sinkhorn iterations, eps %g; rms eps %g\n", (long long)c->hc_mult,
           (long long)c->hc_sinkhorn_iters, c->hc_eps, c->norm_eps);
    printf("  rope: main theta %g%s; compressed theta %g", c->rope_main.theta, c->rope_main.yarn ? " + YaRN" : "",
           c->rope_compress.theta);
    if (c->rope_compress.yarn)
        printf(" + YaRN (factor %g, original %lld, beta %g/%g)", c->rope_compress.factor,
               (long long)c->rope_compress.original_max_position, c->rope_compress.beta_fast, c->rope_compress.beta_slow);
    printf("; max positions %lld\n", (long long)c->max_position_embeddings);
    printf("  weights: %s, experts %s; bos %lld, eos %lld%s\n", dsv4_weight_format_name(c->weight_format),
           dsv4_weight_format_name(c->expert_format), (long long)c->bos_token_id, (long long)c->eos_token_ids[0],
           c->tie_word_embeddings ? ", tied embeddings" : "");
}

static void print_tensors(const dsv4_checkpoint *ck)
{
    const char *names[32];
    long long cnt[32] = {0}, bytes[32] = {0}, total = 0;
    int nd = 0;
    int64_t n = dsv4_checkpoint_count(ck);
    for (int64_t i = 0; i < n; i++) {
        dsv4_tensor_entry e;
        if (dsv4_checkpoint_entry(ck, i, &e) != DSV4_OK) continue;
        int k = 0;
        while (k < nd && strcmp(names[k], e.st_dtype)) k++;
        if (k == nd && nd < 32) names[nd++] = e.st_dtype;
        if (k < nd) {
            cnt[k]++;
            bytes[k] += (long long)e.nbytes;
        }
        total += (long long)e.nbytes;
    }
    printf("checkpoint: %d file%s, %s layout, %lld tensors, %lld bytes\n", dsv4_checkpoint_file_count(ck),
           dsv4_checkpoint_file_count(ck) > 1 ? "s" : "", dsv4_checkpoint_layout(ck) == DSV4_LAYOUT_HF ? "transformers" : "official",
           (long long)n, total);
    for (int k = 0; k < nd; k++) printf("  %-8s %8lld tensors %16lld bytes\n", names[k], cnt[k], bytes[k]);
}

/* --values: every element of every tensor whose dtype can hold a non-number (F32, BF16 and F16
 * NaN / Inf, E4M3 NaN codes, UE8M0 0xFF scales: the NaN scale makes its whole block NaN). Prints
 * one line per such tensor; returns how many there are. Data is read bytewise: a tensor may sit at
 * any offset of its file. */
static int64_t scan_values(const dsv4_checkpoint *ck)
{
    int64_t bad_tensors = 0, n = dsv4_checkpoint_count(ck);
    for (int64_t i = 0; i < n; i++) {
        dsv4_tensor_entry e;
        if (dsv4_checkpoint_entry(ck, i, &e) != DSV4_OK) continue;
        const uint8_t *b = e.data;
        uint64_t nan = 0, inf = 0, first = 0, count = 0;
        int width = !strcmp(e.st_dtype, "F32") ? 4 : !strcmp(e.st_dtype, "BF16") || !strcmp(e.st_dtype, "F16") ? 2
                  : !strcmp(e.st_dtype, "F8_E4M3") || !strcmp(e.st_dtype, "F8_E8M0") ? 1 : 0;
        if (!width) continue;
        count = e.nbytes / (uint64_t)width;
        for (uint64_t k = 0; k < count; k++) {
            int is_nan = 0, is_inf = 0;
            if (width == 4) {
                uint32_t x = (uint32_t)b[4 * k] | (uint32_t)b[4 * k + 1] << 8 | (uint32_t)b[4 * k + 2] << 16 | (uint32_t)b[4 * k + 3] << 24;
                is_nan = (x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu);
                is_inf = (x & 0x7FFFFFFFu) == 0x7F800000u;
            } else if (width == 2) {
                uint16_t x = (uint16_t)(b[2 * k] | b[2 * k + 1] << 8);
                const uint16_t em = e.st_dtype[1] == 'F' ? 0x7F80u : 0x7C00u; /* BF16 : F16 */
                is_nan = (x & em) == em && (x & (uint16_t)~em & 0x7FFFu);
                is_inf = (x & 0x7FFFu) == em;
            } else if (!strcmp(e.st_dtype, "F8_E4M3")) {
                is_nan = (b[k] & 0x7F) == 0x7F; /* E4M3FN has no Inf */
            } else {
                is_nan = b[k] == 0xFF; /* UE8M0 */
            }
            if ((is_nan || is_inf) && !nan && !inf) first = k;
            nan += (uint64_t)is_nan;
            inf += (uint64_t)is_inf;
        }
        if (!nan && !inf) continue;
        bad_tensors++;
        printf("  non-finite  %s: tensor '%s' (%s): %llu NaN, %llu Inf of %llu elements, the first at element %llu\n", e.file,
               e.name, e.st_dtype, (unsigned long long)nan, (unsigned long long)inf, (unsigned long long)count,
               (unsigned long long)first);
    }
    return bad_tensors;
}

static int values_report(const dsv4_checkpoint *ck)
{
    int64_t bad = scan_values(ck);
    printf("values: %s", bad ? "" : "every element is a number\n");
    if (bad) printf("%lld tensor%s with non-finite elements or NaN scales\n", (long long)bad, bad > 1 ? "s" : "");
    return bad ? 1 : 0;
}

int dsv4_cmd_inspect(int argc, char **argv)
{
    int all = 0, values = 0;
    const cli_opt own[] = {{"all", 'a', CLI_FLAG, &all, 0, 0, NULL, "list every problem (default: the first 20 of each kind)"},
                           {"values", 0, CLI_FLAG, &values, 0, 0, NULL, "also every tensor holding NaN / Inf elements or NaN scales"},
                           {0}};
    const cli_opt *tables[] = {own, NULL};
    const cli_cmd cmd = {"inspect", "DIR [--all] [--values]",
                         "A checkpoint: the config in short, the tensors by dtype, and what is missing, unexpected or\n"
                         "mistyped; with --values also every tensor holding NaN / Inf elements or NaN scales. Exit status 0\n"
                         "when the checkpoint matches its config (and, with --values, every value is a number), 1 otherwise.",
                         1, 1, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    const char *dir = argv[pos];
    dsv4_model_open_options opt = {1, DSV4_LOAD_MAP};
    dsv4_model *m = NULL;
    if (dsv4_model_open(dir, &opt, &m) != DSV4_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dsv4_last_error());
        dsv4_checkpoint *ck = NULL; /* the tensors can still be listed when only config.json is at fault */
        if (dsv4_checkpoint_open(dir, &ck) == DSV4_OK) {
            printf("model: %s\n", dir);
            print_tensors(ck);
            if (values) values_report(ck);
            dsv4_checkpoint_close(ck);
        }
        fprintf(stderr, "dsv4 inspect: %s\n", why);
        return 1;
    }
    printf("model: %s\n", dir);
    print_config(dsv4_model_get_config(m));
    print_tensors(dsv4_model_get_checkpoint(m));
    const dsv4_model_weights *w = dsv4_model_get_weights(m);
    printf("weights: %d blocks + %d MTP bound, experts %s\n", w->n_layers, w->n_mtp, dsv4_weight_format_name(w->expert_format));
    const int bad_values = values ? values_report(dsv4_model_get_checkpoint(m)) : 0;
    int n = dsv4_model_issue_count(m);
    if (!n) {
        printf("problems: none\n");
        dsv4_model_close(m);
        return bad_values;
    }
    static const char *const kinds[] = {"missing", "unexpected", "wrong dtype", "wrong shape"};
    int per_kind[4] = {0, 0, 0, 0}, stored = 0;
    dsv4_model_issue_info is;
    while (dsv4_model_issue(m, stored, &is) == DSV4_OK) {
        per_kind[is.kind]++;
        stored++;
    }
    printf("problems: %d (%d missing, %d unexpected, %d wrong dtype, %d wrong shape%s)\n", n, per_kind[0], per_kind[1],
           per_kind[2], per_kind[3], stored < n ? "; the first ones are counted" : "");
    for (int k = 0; k < 4; k++) {
        int shown = 0;
        for (int i = 0; i < stored; i++) {
            if (dsv4_model_issue(m, i, &is) != DSV4_OK || (int)is.kind != k) continue;
            if (all || shown < 20) printf("  %-11s %s\n", kinds[k], is.message);
            shown++;
        }
        if (!all && shown > 20) printf("  %-11s ... and %d more (--all lists every one)\n", kinds[k], shown - 20);
    }
    dsv4_model_close(m);
    return 1;
}
