/* dsv4 bench memory: what running V4-Flash (and with --pro V4-Pro) takes, from the project's own
 * writer and planner rather than from arithmetic by hand. A headers-only checkpoint of the official
 * tensor inventory (file holes, dsv4_checkpoint_write's `sparse`) gives the mapped weight bytes and
 * the bytes a decode step reads (dense layers, LM head, the activated share of the routed experts;
 * an MTP draft apart, the embedding rows not counted); dsv4_engine_create then plans one sequence at
 * 4,096 / 65,536 / 1,048,576 positions (minutes: the engine converts parameters out of the holes).
 * With --model DIR the same for a checkpoint of your own. */
#include "bench.h"
#include "dsv4.h"
#include "dsv4/engine.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* V4-Pro's keys where they differ from V4-Flash (dsv4_config_default), docs/model.md §1. */
static int pro_config(dsv4_model_config *c)
{
    char json[1024];
    int n = snprintf(json, sizeof json,
                     "{\"hidden_size\": 7168, \"num_hidden_layers\": 61, \"num_attention_heads\": 128, \"q_lora_rank\": 1536,"
                     " \"o_groups\": 16, \"index_topk\": 1024, \"n_routed_experts\": 384, \"moe_intermediate_size\": 3072,"
                     " \"routed_scaling_factor\": 2.5, \"compress_ratios\": [128, 128");
    for (int i = 0; i < 29; i++) n += snprintf(json + n, sizeof json - (size_t)n, ", 4, 128");
    n += snprintf(json + n, sizeof json - (size_t)n, ", 4, 0]}");
    return dsv4_config_parse(json, (size_t)n, "V4-Pro", c) == DSV4_OK;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[1024];
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static int report(const char *label, const char *dir)
{
    dsv4_checkpoint *ck = NULL;
    dsv4_model_config c;
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (dsv4_config_load(cfg, &c) != DSV4_OK || dsv4_checkpoint_open(dir, &ck) != DSV4_OK) {
        fprintf(stderr, "bench memory: %s\n", dsv4_last_error());
        return 1;
    }
    double total = 0, dense = 0, head = 0, routed = 0, mtp = 0, mtp_routed = 0;
    for (int64_t i = 0; i < dsv4_checkpoint_count(ck); i++) {
        dsv4_tensor_entry e;
        if (dsv4_checkpoint_entry(ck, i, &e) != DSV4_OK) continue;
        const char *n = e.canonical;
        double b = (double)e.nbytes;
        total += b;
        if (!strncmp(n, "mtp.", 4)) *(strstr(n, ".experts.") ? &mtp_routed : &mtp) += b;
        else if (!strncmp(n, "embed.", 6) || strstr(n, "tid2eid")) continue; /* one row per token */
        else if (!strncmp(n, "head.", 5)) head += b;
        else if (strstr(n, ".experts.")) routed += b;
        else dense += b;
    }
    dsv4_checkpoint_close(ck);
    double share = (double)c.n_activated_experts / (double)c.n_routed_experts, act = routed * share, g = 1e9;
    printf("%s: checkpoint %.1f GB mapped; a decode step reads dense %.2f + LM head %.2f + %lld/%lld routed experts %.2f"
           " = %.2f GB per token; an MTP draft %.2f GB more (its block's dense part and experts, the LM head)\n",
           label, total / g, dense / g, head / g, (long long)c.n_activated_experts, (long long)c.n_routed_experts, act / g,
           (dense + head + act) / g, (mtp + mtp_routed * share + head) / g);
    fflush(stdout); /* the planning below takes minutes */
    const int64_t ctx[] = {4096, 65536, 1048576};
    for (int k = 0; k < 3; k++) {
        if (ctx[k] > c.max_position_embeddings) break;
        dsv4_engine_options eo = {ctx[k], 1, 0, 1, 0, DSV4_LOAD_MAP, NULL, NULL};
        dsv4_engine *e = NULL;
        double t0 = bench_now();
        if (dsv4_engine_create(NULL, dir, &eo, &e) != DSV4_OK) {
            fprintf(stderr, "bench memory: %s\n", dsv4_last_error());
            return 1;
        }
        dsv4_engine_memory m;
        dsv4_engine_memory_info(e, &m);
        printf("  %8lld positions: engine plans %.2f GB (converted %.2f, caches %.3f, state %.3f, scratch %.3f) "
               "-> %.1f GB with the weights; planned in %.0f s\n",
               (long long)ctx[k], m.planned / g, m.weights_converted / g, m.kv_cache / g, m.state / g, m.scratch / g,
               (m.planned + m.weights_mapped) / g, bench_now() - t0);
        fflush(stdout);
        dsv4_engine_destroy(e);
    }
    return 0;
}

int dsv4_bench_memory(int argc, char **argv)
{
    const char *model = bench_opt_str(argc, argv, "--model", NULL), *tmp = bench_opt_str(argc, argv, "--dir", "/tmp");
    if (model) return report(model, model);
    int rc = 0;
    for (int pro = 0; pro <= bench_opt_flag(argc, argv, "--pro") && !rc; pro++) {
        dsv4_model_config c;
        dsv4_config_default(&c);
        if (pro && !pro_config(&c)) {
            fprintf(stderr, "bench memory: %s\n", dsv4_last_error());
            return 1;
        }
        char dir[512];
        snprintf(dir, sizeof dir, "%s/dsv4-bench-memory-%d", tmp, (int)getpid());
        dsv4_write_options o = {1, 1, DSV4_LAYOUT_OFFICIAL, 1, 1};
        if (dsv4_checkpoint_write(dir, &c, &o) != DSV4_OK) {
            fprintf(stderr, "bench memory: %s\n", dsv4_last_error());
            rc = 1;
        } else {
            rc = report(pro ? "V4-Pro shapes" : "V4-Flash shapes", dir);
        }
        rm_dir(dir);
    }
    return rc;
}
