/* dsv4 bench run: the decode engine end to end (docs/engine.md).
 *   1. the built-in tiny model (make-tiny);
 *   2. a synthetic checkpoint with V4-Flash layer shapes (D 4096, 64 heads, all 256 FP4 experts,
 *      vocabulary 129,280): 3 blocks (SWA + hash routing, CSA, HCA ratio 128) and the MTP block,
 *      written as file holes (zero weights: the kernels' speed does not depend on the values; the
 *      zero router picks the same 6 experts every token, which reads as many bytes).
 * For each: prefill tokens/s (with GFLOP/s = 2 x active weights x tokens/s next to the FMA peak),
 * decode tokens/s without and with MTP (k = 1, 2; acceptance), next to the bytes-per-token
 * roofline = weights a decode step touches / the read bandwidth measured in the same run.
 *   --quick: the tiny model only; --model DIR: that checkpoint only; --threads N. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "bench.h"
#include "dsv4.h"
#include "dsv4/engine.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

/* the temporary checkpoint directories, depth first */
static void rm_tree(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

typedef struct cost {
    double bytes, params; /* weights read per token; their element count (FLOPs / 2) */
} cost;

static void add_t(cost *c, const dsv4_tensor *t)
{
    if (!t->data) return;
    double n = (double)dsv4_tensor_numel(t);
    c->bytes += n * (double)dsv4_dtype_size(t->dtype);
    c->params += n;
}

/* wo_a of FP8 checkpoints runs as BF16 (converted at load): 2 bytes per weight */
static void add_l(cost *c, const dsv4_linear_weight *w, int times, int as_bf16)
{
    if (!w->weight.data) return;
    double n = (double)(w->out_features * w->in_features);
    double b = as_bf16 && w->format == DSV4_WFMT_FP8 ? 2.0 * n
                                                     : (double)dsv4_tensor_numel(&w->weight) * (double)dsv4_dtype_size(w->weight.dtype) +
                                                           (w->scale.data ? (double)dsv4_tensor_numel(&w->scale) : 0.0);
    c->bytes += times * b;
    c->params += times * n;
}

/* Weights one token reads in block L: everything but the experts it is not routed to. */
static void add_block(cost *c, const dsv4_layer_weights *L, const dsv4_model_config *cfg)
{
    const dsv4_linear_weight *lin[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_b, &L->index_wq_b, &L->e_proj, &L->h_proj,
                                       &L->shared.w1, &L->shared.w2, &L->shared.w3};
    const dsv4_tensor *t[] = {&L->attn_norm, &L->ffn_norm, &L->hc_attn_fn, &L->hc_ffn_fn, &L->q_norm, &L->kv_norm,
                              &L->attn_sink, &L->compressor.wkv, &L->compressor.wgate, &L->index_weights_proj,
                              &L->index_compressor.wkv, &L->index_compressor.wgate, &L->gate_weight, &L->gate_bias,
                              &L->enorm, &L->hnorm, &L->norm, &L->hc_head_fn};
    add_l(c, &L->wo_a, 1, 1);
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) add_l(c, lin[i], 1, 0);
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) add_t(c, t[i]);
    int k = (int)cfg->n_activated_experts;
    add_l(c, &L->experts[0].w1, k, 0);
    add_l(c, &L->experts[0].w2, k, 0);
    add_l(c, &L->experts[0].w3, k, 0);
}

typedef struct model_cost {
    cost main, mtp; /* per token: main model (incl. head); MTP block + head per draft */
} model_cost;

static int cost_of(const char *dir, model_cost *mc)
{
    dsv4_model *m = NULL;
    if (dsv4_model_open(dir, NULL, &m) != DSV4_OK) return 0;
    const dsv4_model_weights *w = dsv4_model_get_weights(m);
    const dsv4_model_config *c = dsv4_model_get_config(m);
    memset(mc, 0, sizeof *mc);
    add_t(&mc->main, &w->head);
    add_t(&mc->main, &w->hc_head_fn);
    add_t(&mc->main, &w->norm);
    mc->main.bytes += (double)c->dim * 2.0; /* the embedding row */
    for (int b = 0; b < w->n_layers; b++) add_block(&mc->main, &w->layers[b], c);
    if (w->n_mtp) {
        add_block(&mc->mtp, &w->layers[w->n_layers], c);
        add_t(&mc->mtp, &w->head);
    }
    dsv4_model_close(m);
    return 1;
}

static void fill_ids(int32_t *ids, int n, int64_t vocab, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
}

/* Best-of-`reps` prefill of n tokens (seconds). */
static double prefill_s(dsv4_engine *e, const int32_t *ids, int n, float *logits, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        int seq;
        if (dsv4_engine_seq_create(e, &seq) != DSV4_OK) return -1;
        double t0 = bench_now();
        dsv4_status st = dsv4_engine_forward(e, seq, ids, n, logits, 1, NULL, 0);
        double dt = bench_now() - t0;
        dsv4_engine_seq_free(e, seq);
        if (st != DSV4_OK) return -1;
        if (dt < best) best = dt;
    }
    return best;
}

static int decode(dsv4_engine *e, const int32_t *prompt, int n_prompt, int tokens, int mtp, dsv4_generate_stats *st)
{
    int seq;
    int64_t n_out;
    int32_t *out = malloc(sizeof *out * (size_t)tokens);
    dsv4_generate_options o = {tokens, mtp, {0.0f, 1.0f, 0}, 0, 0, NULL, NULL};
    int ok = out && dsv4_engine_seq_create(e, &seq) == DSV4_OK;
    ok = ok && dsv4_engine_generate(e, seq, prompt, n_prompt, &o, out, tokens, &n_out, st) == DSV4_OK;
    if (ok) dsv4_engine_seq_free(e, seq);
    free(out);
    return ok;
}

static int bench_model(const char *name, const char *dir, int threads, int n_prefill, int n_decode, double bw_gbs,
                       double peak_gflops)
{
    model_cost mc;
    if (!cost_of(dir, &mc)) {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
        return 1;
    }
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options co = {.backend = NULL, .threads = threads};
    dsv4_engine_options eo = {1024, 1, 64, 2, 0};
    dsv4_engine *e = NULL;
    if (dsv4_ctx_create(&co, &ctx) != DSV4_OK || dsv4_engine_create(ctx, dir, &eo, &e) != DSV4_OK) {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
        dsv4_ctx_destroy(ctx);
        return 1;
    }
    const dsv4_model_config *c = dsv4_engine_config(e);
    int32_t *ids = malloc(sizeof *ids * (size_t)n_prefill);
    float *logits = malloc(sizeof *logits * (size_t)c->vocab_size);
    fill_ids(ids, n_prefill, c->vocab_size, 7);
    dsv4_engine_memory mem;
    dsv4_engine_memory_info(e, &mem);
    printf("\n== %s: %lld layers + MTP, D %lld, %lld experts, vocab %lld; %.1f MB weights mapped, %.1f MB planned ==\n", name,
           (long long)c->n_layers, (long long)c->dim, (long long)c->n_routed_experts, (long long)c->vocab_size,
           (double)mem.weights_mapped / 1e6, (double)mem.planned / 1e6);
    double pre = prefill_s(e, ids, n_prefill, logits, 2);
    double gflops = 2.0 * mc.main.params * (double)n_prefill / pre / 1e9;
    printf("prefill %4d tokens: %8.1f tok/s = %.1f GFLOP/s (2 x %.0f M active weights / token) = %.2f of the FMA peak\n",
           n_prefill, (double)n_prefill / pre, gflops, mc.main.params / 1e6, gflops / peak_gflops);
    double roof = bw_gbs * 1e9 / mc.main.bytes;
    printf("decode roofline: %.1f MB of weights touched / token at %.1f GB/s = %.1f tok/s\n", mc.main.bytes / 1e6, bw_gbs,
           roof);
    int rc = 0;
    for (int k = 0; k <= 2; k++) {
        dsv4_generate_stats st;
        if (!decode(e, ids, 8, n_decode, k, &st)) {
            fprintf(stderr, "bench run: %s\n", dsv4_last_error());
            rc = 1;
            break;
        }
        double tps = (double)(st.generated_tokens - 1) / st.decode_seconds;
        printf("decode %3d tokens, mtp %d: %8.1f tok/s = %.2f of the roofline", n_decode, k, tps, tps / roof);
        if (k) printf("; acceptance %.0f%% (%lld/%lld), %.2f tokens/step", 100.0 * (double)st.accepted / (double)st.drafted,
                      (long long)st.accepted, (long long)st.drafted, (double)(st.generated_tokens - 1) / (double)(st.steps - 1));
        printf("\n");
    }
    if (mc.mtp.bytes > 0)
        printf("(an MTP step of k drafts verifies k+1 tokens in one forward and reads %.1f MB more per draft: MTP block + head)\n",
               mc.mtp.bytes / 1e6);
    free(ids);
    free(logits);
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
    return rc;
}

static int flash_like(const char *dir)
{
    dsv4_model_config c;
    dsv4_config_default(&c);
    c.n_layers = 3;
    c.n_hash_layers = 1;
    const int ratios[4] = {0, 4, 128, 0};
    for (int i = 0; i < DSV4_MAX_LAYERS; i++) {
        int r = i < 4 ? ratios[i] : 0;
        c.compress_ratio[i] = r;
        c.attn_kind[i] = (uint8_t)(r == 0 ? DSV4_ATTN_SWA : r == 4 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA);
        c.hash_routed[i] = (uint8_t)(i < 1);
    }
    dsv4_write_options o = {1, 1, DSV4_LAYOUT_OFFICIAL, 1, 1};
    if (dsv4_checkpoint_write(dir, &c, &o) != DSV4_OK) {
        fprintf(stderr, "bench run: writing the V4-Flash-shaped checkpoint: %s\n", dsv4_last_error());
        return 0;
    }
    return 1;
}

int dsv4_bench_run(int argc, char **argv)
{
    int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    int quick = bench_opt_flag(argc, argv, "--quick");
    const char *model = bench_opt_str(argc, argv, "--model", NULL);
    double bw = bench_read_bandwidth((size_t)512 << 20, threads, 3), peak = bench_fma_peak(threads);
    printf("bench run: %d threads, read bandwidth %.1f GB/s, FMA peak %.0f GFLOP/s (measured now)\n", threads, bw, peak);
    printf("published CPU results: a good one is ~15-20 tok/s per server socket on V4-Flash (llama.cpp 9.7),\n"
           "i.e. 11.2 GB/token at ~200-250 GB/s: the fraction of the roofline below compares with ~0.8 for those\n");
    if (model) return bench_model(model, model, threads, 64, 32, bw, peak);
    char tiny[] = "/tmp/dsv4-bench-tiny-XXXXXX", flash[] = "/tmp/dsv4-bench-flash-XXXXXX";
    int rc = 1;
    if (mkdtemp(tiny) && dsv4_make_tiny(tiny, 1) == DSV4_OK) rc = bench_model("tiny (make-tiny)", tiny, threads, 128, 64, bw, peak);
    else fprintf(stderr, "bench run: make-tiny: %s\n", dsv4_last_error());
    rm_tree(tiny);
    if (rc || quick) return rc;
    if (mkdtemp(flash) && flash_like(flash))
        rc = bench_model("V4-Flash shapes, 3 blocks (SWA, CSA, HCA) + MTP, zero weights", flash, threads, 32, 8, bw, peak);
    rm_tree(flash);
    return rc;
}
