/* dsv4 bench run: the decode engine end to end (docs/engine.md).
 *   1. the built-in tiny model (make-tiny);
 *   2. a synthetic checkpoint with V4-Flash layer shapes (D 4096, 64 heads, all 256 FP4 experts,
 *      vocabulary 129,280): 3 blocks (SWA + hash routing, CSA, HCA ratio 128) and the MTP block,
 *      written as file holes (zero weights: the kernels' speed does not depend on the values),
 *      except what routing reads: the embedding rows of the first ROUTE_IDS ids, every ffn_norm,
 *      the gates and the hash tables get random values (route_like), so that each token picks
 *      its own 6 experts, as with trained weights, and B tokens read as many experts as B real ones.
 * For each: prefill tokens/s (with GFLOP/s = 2 x active weights x tokens/s next to the FMA peak),
 * decode tokens/s without and with MTP (k = 1, 2; acceptance), next to the bytes-per-token
 * roofline = weights a decode step touches / the read bandwidth measured in the same run; then
 * batched decode (BENCHMARKS.md, "Batched decode (CPU)"): B = 1 .. 32 sequences, each prefilled
 * with an 8-token prompt, append one token each per dsv4_engine_forward_batch call; aggregate
 * tokens/s next to the roofline of B tokens (bytes_step and flops_step below).
 * With only 3 blocks the 1 GB BF16 LM head is half of what a step of this checkpoint reads, so its
 * decode rows are followed by the same step by weight class (attention, shared expert, routed
 * experts, router, norms, LM head; print_classes): bytes here and in the 43-layer V4-Flash, and
 * each class's own M = 1 kernel rate (class_rates, timed in turn with the decode), from which
 * the 43-layer decode rate is extrapolated, labelled as such.
 *   --quick: the tiny model only; --model DIR: that checkpoint only; --threads N;
 *   --max-batch B: the largest B (32); --busy N: N CPU-bound competing processes (forked spinners)
 *   run during the model parts (the bandwidth and peaks above them are measured before);
 *   --rounds R (default 7 with --busy, else 0): first, the threads against one thread on the tiny
 *   model's decode in R interleaved rounds (threads_vs_one). */
#define _XOPEN_SOURCE 700 /* nftw, pwrite */
#define _DEFAULT_SOURCE   /* mincore */
#include "bench.h"
#include "dsv4.h"
#include "dsv4/engine.h"

#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { ROUTE_IDS = 4096, MAX_B = 32, PROMPT = 8 };

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

/* the temporary checkpoint directories, depth first */
void bench_rm_tree(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

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

/* The weight classes a decode step reads, each reported with its own bytes and kernel rate. */
enum { C_ATTN, C_SHARED, C_ROUTED, C_ROUTER, C_OTHER, C_HEAD, NCLASS, MAX_BLK = 8, CLASS_ROUNDS = 2 };
static const char *const class_name[NCLASS] = {"attention (projections, compressors, indexer)", "shared expert",
                                               "routed experts (k of them)", "router gate", "norms, mHC, embedding row",
                                               "LM head"};

static double sum_bytes(const cost *cls) /* over the classes */
{
    double s = 0.0;
    for (int c = 0; c < NCLASS; c++) s += cls[c].bytes;
    return s;
}

/* Weights one token reads in block L, by class: everything but the experts it is not routed to. */
static void add_block(cost *cls, const dsv4_layer_weights *L, const dsv4_model_config *cfg)
{
    const dsv4_linear_weight *att[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_b, &L->index_wq_b, &L->e_proj, &L->h_proj};
    const dsv4_linear_weight *sh[] = {&L->shared.w1, &L->shared.w2, &L->shared.w3};
    const dsv4_tensor *att_t[] = {&L->q_norm, &L->kv_norm, &L->attn_sink, &L->compressor.wkv, &L->compressor.wgate,
                                  &L->index_weights_proj, &L->index_compressor.wkv, &L->index_compressor.wgate};
    const dsv4_tensor *other_t[] = {&L->attn_norm, &L->ffn_norm, &L->hc_attn_fn, &L->hc_ffn_fn,
                                    &L->enorm,     &L->hnorm,    &L->norm,       &L->hc_head_fn};
    add_l(&cls[C_ATTN], &L->wo_a, 1, 1);
    for (size_t i = 0; i < sizeof att / sizeof *att; i++) add_l(&cls[C_ATTN], att[i], 1, 0);
    for (size_t i = 0; i < sizeof sh / sizeof *sh; i++) add_l(&cls[C_SHARED], sh[i], 1, 0);
    for (size_t i = 0; i < sizeof att_t / sizeof *att_t; i++) add_t(&cls[C_ATTN], att_t[i]);
    for (size_t i = 0; i < sizeof other_t / sizeof *other_t; i++) add_t(&cls[C_OTHER], other_t[i]);
    add_t(&cls[C_ROUTER], &L->gate_weight);
    add_t(&cls[C_ROUTER], &L->gate_bias);
    int k = (int)cfg->n_activated_experts;
    add_l(&cls[C_ROUTED], &L->experts[0].w1, k, 0);
    add_l(&cls[C_ROUTED], &L->experts[0].w2, k, 0);
    add_l(&cls[C_ROUTED], &L->experts[0].w3, k, 0);
}

typedef struct model_cost {
    cost main, mtp;  /* per token: main model (incl. head); MTP block + head per draft */
    cost head;       /* the LM head */
    cost expert;     /* one routed expert: w1, w2, w3 */
    cost cls[NCLASS], mtp_block[NCLASS]; /* main model by class; the MTP block (no head) by class */
    cost blk[MAX_BLK][NCLASS];           /* the first MAX_BLK main blocks by class */
    uint8_t kind[MAX_BLK], hash[MAX_BLK]; /* their attention kind and routing */
    int n_blk;                            /* main blocks (blk holds min(n_blk, MAX_BLK)) */
    double embed_row; /* bytes of one embedding row */
    int moe_layers, k, E; /* main-model blocks with routed experts; experts per token; experts */
} model_cost;

/* Distinct experts B tokens touch in one MoE layer, in expectation, when each token picks k of E
 * uniformly (the random gates and hash tables here; trained routers are less uniform, so this is
 * the upper end): E (1 - (1 - k/E)^B). B = 1 gives k. */
static double distinct_experts(const model_cost *mc, int B)
{
    return (double)mc->E * (1.0 - pow(1.0 - (double)mc->k / (double)mc->E, (double)B));
}

/* Weight bytes a decode step of B tokens (one per sequence) reads: the dense weights and the LM
 * head once, B embedding rows, and per MoE layer the distinct experts of the B tokens. */
static double bytes_step(const model_cost *mc, int B)
{
    const double dense = mc->main.bytes - mc->embed_row - (double)mc->moe_layers * mc->k * mc->expert.bytes;
    return dense + B * mc->embed_row + (double)mc->moe_layers * distinct_experts(mc, B) * mc->expert.bytes;
}

/* FLOPs of that step: 2 per active weight per token (k experts each). The attention's own
 * products (2 x 64 heads x entries x 1024 per token and layer) are < 0.1 % at these lengths. */
static double flops_step(const model_cost *mc, int B) { return 2.0 * mc->main.params * B; }

static void add_classes(cost *to, const cost *from)
{
    for (int c = 0; c < NCLASS; c++) to[c].bytes += from[c].bytes, to[c].params += from[c].params;
}

static int cost_of(const char *dir, model_cost *mc)
{
    dsv4_model *m = NULL;
    if (dsv4_model_open(dir, NULL, &m) != DSV4_OK) return 0;
    const dsv4_model_weights *w = dsv4_model_get_weights(m);
    const dsv4_model_config *c = dsv4_model_get_config(m);
    memset(mc, 0, sizeof *mc);
    add_t(&mc->head, &w->head);
    add_t(&mc->cls[C_HEAD], &w->head);
    add_t(&mc->cls[C_OTHER], &w->hc_head_fn);
    add_t(&mc->cls[C_OTHER], &w->norm);
    mc->embed_row = (double)c->dim * (double)dsv4_dtype_size(w->embed.dtype);
    mc->cls[C_OTHER].bytes += mc->embed_row;
    mc->n_blk = w->n_layers;
    for (int b = 0; b < w->n_layers; b++) {
        cost one[NCLASS] = {{0}};
        add_block(one, &w->layers[b], c);
        add_classes(mc->cls, one);
        if (b < MAX_BLK) {
            memcpy(mc->blk[b], one, sizeof one);
            mc->kind[b] = c->attn_kind[b];
            mc->hash[b] = c->hash_routed[b];
        }
        mc->moe_layers += w->layers[b].experts && w->layers[b].experts[0].w1.weight.data;
    }
    for (int k = 0; k < NCLASS; k++) mc->main.bytes += mc->cls[k].bytes, mc->main.params += mc->cls[k].params;
    if (w->n_layers && w->layers[0].experts) {
        add_l(&mc->expert, &w->layers[0].experts[0].w1, 1, 0);
        add_l(&mc->expert, &w->layers[0].experts[0].w2, 1, 0);
        add_l(&mc->expert, &w->layers[0].experts[0].w3, 1, 0);
    }
    mc->k = (int)c->n_activated_experts;
    mc->E = (int)c->n_routed_experts;
    if (w->n_mtp) {
        add_block(mc->mtp_block, &w->layers[w->n_layers], c);
        mc->mtp.bytes = sum_bytes(mc->mtp_block) + mc->head.bytes;
        for (int k = 0; k < NCLASS; k++) mc->mtp.params += mc->mtp_block[k].params;
        mc->mtp.params += mc->head.params;
    }
    dsv4_model_close(m);
    return 1;
}

/* The same classes for the whole V4-Flash (dsv4_config_default: 43 layers + MTP): each of its
 * layers weighs what the block of this checkpoint with its attention kind weighs, its router what
 * a block with its routing (hash or learned) has; the head, the embedding row, the final norms
 * and the MTP block as here. 0 when this checkpoint lacks a kind. */
static int flash_classes(const model_cost *mc, cost *out)
{
    dsv4_model_config f;
    dsv4_config_default(&f);
    memset(out, 0, sizeof(cost) * NCLASS);
    const int nb = mc->n_blk < MAX_BLK ? mc->n_blk : MAX_BLK;
    for (int i = 0; i < f.n_layers; i++) {
        int ba = -1, br = -1;
        for (int b = nb - 1; b >= 0; b--) {
            if (mc->kind[b] == f.attn_kind[i]) ba = b;
            if (mc->hash[b] == f.hash_routed[i]) br = b;
        }
        if (ba < 0 || br < 0) return 0;
        for (int c = 0; c < NCLASS; c++) {
            const cost *x = &mc->blk[c == C_ROUTER ? br : ba][c];
            out[c].bytes += x->bytes;
            out[c].params += x->params;
        }
    }
    cost top[NCLASS]; /* what the main model reads outside its blocks */
    memcpy(top, mc->cls, sizeof top);
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < NCLASS; c++) top[c].bytes -= mc->blk[b][c].bytes, top[c].params -= mc->blk[b][c].params;
    add_classes(out, top);
    return nb == mc->n_blk;
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
    dsv4_generate_options o = {tokens, mtp, {0.0f, 1.0f, 0}, 0, 0, NULL, NULL, 0};
    int ok = out && dsv4_engine_seq_create(e, &seq) == DSV4_OK;
    ok = ok && dsv4_engine_generate(e, seq, prompt, n_prompt, &o, out, tokens, &n_out, st) == DSV4_OK;
    if (ok) dsv4_engine_seq_free(e, seq);
    free(out);
    return ok;
}

/* ---- the weight classes at their kernels' rates -------------------------------------------- */
/* The products behind each class's bytes, at V4-Flash shapes (bench_lshapes: linear_weights.c, by
 * index) in the formats the engine runs them in: wo_a as BF16 (converted at load), the routed
 * experts FP4, the shared expert FP8, the router gate BF16. times: calls per token and layer. */
typedef struct class_product {
    int cls, shape;
    dsv4_linear_format fmt;
    int times;
} class_product;
static const class_product class_products[] = {
    {C_ATTN, 0, DSV4_LINEAR_FP8_B128, 1},   {C_ATTN, 1, DSV4_LINEAR_FP8_B128, 1},   {C_ATTN, 2, DSV4_LINEAR_FP8_B128, 1},
    {C_ATTN, 3, DSV4_LINEAR_BF16, 1},       {C_ATTN, 4, DSV4_LINEAR_FP8_B128, 1},   {C_ATTN, 5, DSV4_LINEAR_FP8_B128, 1},
    {C_SHARED, 6, DSV4_LINEAR_FP8_B128, 2}, {C_SHARED, 7, DSV4_LINEAR_FP8_B128, 1}, {C_ROUTED, 6, DSV4_LINEAR_FP4, 2},
    {C_ROUTED, 7, DSV4_LINEAR_FP4, 1},      {C_ROUTER, 8, DSV4_LINEAR_BF16, 1},     {C_HEAD, -1, DSV4_LINEAR_BF16, 1},
};

/* rate[c] = GB/s of class c: its products' weight + scale bytes / their time, each product timed
 * at M = 1 by bench_time_pass over distinct copies of its weight (> 2x the last-level cache, so
 * every call reads from memory), the sustained rate (pass time / copies), best of 3 passes. The
 * norms, mHC and embedding row get the probe's rate (`bw`): no product, a few MB. 0 on failure. */
static int class_rates(int threads, double bw, double *rate)
{
    dsv4_ctx *ctx = NULL;
    const dsv4_ctx_options o = {.backend = "cpu", .threads = threads};
    if (dsv4_ctx_create(&o, &ctx) != DSV4_OK) return 0;
    size_t min_total = (size_t)256 << 20;
    if (min_total < 2 * bench_llc_bytes()) min_total = 2 * bench_llc_bytes();
    double bytes[NCLASS] = {0}, secs[NCLASS] = {0};
    uint16_t *x = bench_alloc_or_die((size_t)8 * 4096 * 2), *y = bench_alloc_or_die((size_t)bench_lshape_head.n * 2);
    for (int i = 0; i < 8 * 4096; i++) x[i] = dsv4_bf16_encode(0.25f * (float)(i % 7) - 0.75f);
    int ok = 1;
    for (size_t p = 0; p < sizeof class_products / sizeof *class_products && ok; p++) {
        const class_product *cp = &class_products[p];
        const bench_lshape *sh = cp->shape < 0 ? &bench_lshape_head : &bench_lshapes[cp->shape];
        bench_wset ws;
        bench_wset_init(&ws, sh, cp->fmt, min_total);
        size_t wsb = 0;
        void *work = NULL;
        ok = dsv4_linear_workspace_size(ctx, cp->fmt, sh->groups, sh->k, &wsb) == DSV4_OK && (work = bench_alloc(wsb + 1));
        bench_lcall call;
        bench_rate r = BENCH_RATE_INIT;
        if (ok) bench_lcall_init(&call, ctx, sh, &ws, 1, x, y, work, wsb);
        for (int pass = 0; pass < 3 && ok; pass++) ok = bench_time_pass(bench_lcall_run, &call, ws.copies, &r) == 0;
        bytes[cp->cls] += (double)cp->times * (double)(ws.wbytes + ws.sbytes);
        secs[cp->cls] += (double)cp->times * r.sustained;
        free(work);
        bench_wset_free(&ws);
    }
    if (!ok) fprintf(stderr, "bench run: timing the weight classes: %s\n", dsv4_last_error());
    for (int c = 0; c < NCLASS; c++) rate[c] = secs[c] > 0.0 ? bytes[c] / secs[c] * 1e-9 : bw;
    free(x);
    free(y);
    dsv4_ctx_destroy(ctx);
    return ok;
}

/* Seconds a token's weights take at the class rates. */
static double class_seconds(const cost *cls, const double *rate)
{
    double t = 0.0;
    for (int c = 0; c < NCLASS; c++) t += cls[c].bytes / (rate[c] * 1e9);
    return t;
}

/* The per-class table of a decode step (main model + the MTP block the engine runs with it), and
 * what it says of the 43-layer V4-Flash: its bytes per token at each class's kernel rate, times
 * engine / kernels of this run (the measured step over the step the class rates predict). */
static void print_classes(const model_cost *mc, const double *rate, double bw, double tps)
{
    cost here[NCLASS], full[NCLASS];
    memcpy(here, mc->cls, sizeof here);
    add_classes(here, mc->mtp_block);
    const int have_full = flash_classes(mc, full);
    if (have_full) add_classes(full, mc->mtp_block);
    const double th = sum_bytes(here), tf = have_full ? sum_bytes(full) : 0.0;
    printf("weight classes of a decode step (main model + the MTP block; kernel GB/s = dsv4_linear M = 1 at the class's\n"
           "V4-Flash shapes and formats, sustained over copies > 2x the last-level cache, in turn with the mtp 0 decode):\n");
    printf("%-46s %9s %6s %11s %6s %9s %7s %7s\n", "class", "MB here", "share", "MB V4-Flash", "share", "kern GB/s",
           "of read", "s share");
    for (int c = 0; c < NCLASS; c++) {
        const double sf = have_full ? full[c].bytes / (rate[c] * 1e9) / class_seconds(full, rate) : 0.0;
        printf("%-46s %9.1f %5.1f%% %11.1f %5.1f%% %9.1f %7.2f %6.1f%%\n", class_name[c], here[c].bytes / 1e6,
               100.0 * here[c].bytes / th, full[c].bytes / 1e6, have_full ? 100.0 * full[c].bytes / tf : 0.0, rate[c],
               rate[c] / bw, 100.0 * sf);
    }
    const double kh = class_seconds(here, rate), measured = 1.0 / tps, factor = measured / kh;
    printf("%-46s %9.1f %6s %11.1f %6s %9.1f %7.2f\n", "all (bytes / time at the class rates)", th / 1e6, "", tf / 1e6, "",
           th / kh * 1e-9, th / kh * 1e-9 / bw);
    printf("(MB V4-Flash: each of its 43 layers weighs this checkpoint's block of its attention kind, its router that\n"
           "of its routing; s share = the class's part of the step time at the kernel rates)\n");
    printf("this checkpoint: decode %.2f tok/s measured; the class rates alone give %.2f tok/s: engine / kernels %.2f\n", tps,
           1.0 / kh, factor);
    if (!have_full) return;
    const double t43 = class_seconds(full, rate) * factor, roof43 = bw * 1e9 / tf;
    printf("V4-Flash, 43 layers + MTP block, EXTRAPOLATED (class rates x engine / kernels, not run): %.0f MB / token,\n"
           "  %.2f tok/s vs the roofline %.2f tok/s at %.1f GB/s = %.2f of the roofline (this checkpoint: %.2f)\n",
           tf / 1e6, 1.0 / t43, roof43, bw, 1.0 / t43 / roof43, tps / (bw * 1e9 / th));
}

/* ---- batched decode ------------------------------------------------------------------------ */
typedef struct run_opts {
    int threads, max_b, steps; /* largest B; timed steps per B */
    int pool;                  /* prompt and decode ids come from [0, pool) */
    int rounds;                /* interleaved rounds of the threads against one thread (0: none) */
    double peak;               /* GFLOP/s: the faster of the fp32 FMA and the vdpbf16ps peaks */
    const char *peak_of;
    int classes;               /* the weight-class table after the decode rows (print_classes) */
    const char *backend;       /* the engine's backend (NULL: $DSV4_BACKEND, else cpu) */
    int device;                /* it computes in device memory: the roofline is the device's */
    int layers;                /* blocks of the V4-Flash-shaped checkpoint (3: one of each kind) */
    int no_tiny;               /* the V4-Flash-shaped checkpoint only */
} run_opts;

/* The ids of one step for B sequences: distinct (stride 7919, a prime above any pool here) from
 * a start that moves with the step. */
static void step_ids(int32_t *ids, int B, int pool, uint64_t step)
{
    uint64_t a = (step * 6364136223846793005ull + 1442695040888963407ull) >> 33;
    for (int j = 0; j < B; j++) ids[j] = (int32_t)((a + (uint64_t)j * 7919u) % (uint64_t)pool);
}

static double median_of(const double *v, int n)
{
    double t[256];
    for (int i = 0; i < n; i++) t[i] = v[i];
    return bench_median(t, n);
}

static double mean_of(const double *v, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

/* How many of each main block's routed experts have their w1 in the page cache (mincore on the
 * middle page): the experts some token was routed to so far. Prints one count per block. */
static void experts_resident(const char *dir, int n_layers, int E)
{
    dsv4_checkpoint *ck = NULL;
    if (dsv4_checkpoint_open(dir, &ck) != DSV4_OK) return;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    printf("routed experts touched so far (w1 in the page cache, mincore):");
    for (int b = 0; b < n_layers; b++) {
        int n = 0;
        for (int x = 0; x < E; x++) {
            char name[96];
            dsv4_tensor_entry te;
            unsigned char v = 0;
            snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w1.weight", b, x);
            if (dsv4_checkpoint_find(ck, name, &te) != DSV4_OK) continue;
            uintptr_t at = ((uintptr_t)te.data + te.nbytes / 2) & ~(uintptr_t)(pg - 1);
            n += mincore((void *)at, pg, &v) == 0 && (v & 1);
        }
        printf(" %d", n);
    }
    printf(" of %d per block\n", E);
    dsv4_checkpoint_close(ck);
}

/* Page faults of this process so far (minor + major): a step that maps weight pages again, e.g.
 * after the kernel dropped cold page-cache pages, pays for it in the kernel. */
static long faults_now(void)
{
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) ? 0 : u.ru_minflt + u.ru_majflt;
}

/* One timed decode step of seqs[0..B-1]: one token each, n_logits 1 each, in one call. */
static double batch_step(dsv4_engine *e, const int *seqs, int B, int pool, uint64_t step, float *logits)
{
    int32_t tok[MAX_B];
    dsv4_batch_entry en[MAX_B];
    step_ids(tok, B, pool, step);
    for (int j = 0; j < B; j++) en[j] = (dsv4_batch_entry){seqs[j], &tok[j], 1, 1, 0};
    double t0 = bench_now();
    dsv4_status st = dsv4_engine_forward_batch(e, en, B, logits, NULL);
    return st == DSV4_OK ? bench_now() - t0 : -1.0;
}

/* B = 1, 2, 4 .. max_b sequences decoding together on an engine planned for them (no MTP). Each
 * sequence is prefilled with an 8-token prompt (all in one call), then every B runs 1 untimed and
 * `steps` timed steps on sequences 0 .. B-1, which keep growing (positions 8 to ~60, where the
 * attention is a small part of a step). At B = 1 each timed step is followed by the same step
 * through the single-sequence calls (dsv4_engine_forward, dsv4_engine_step greedy) on two more
 * sequences, and dsv4_engine_generate runs after the table: all must agree. */
static int batched(const char *dir, const model_cost *mc, const run_opts *ro, double bw)
{
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options co = {.backend = ro->backend, .threads = ro->threads};
    dsv4_engine_options eo = {1024, ro->max_b + 2, ro->max_b > 64 ? ro->max_b : 64, 0, 0, DSV4_LOAD_MAP, NULL, NULL};
    dsv4_engine *e = NULL;
    if (dsv4_ctx_create(&co, &ctx) != DSV4_OK || dsv4_engine_create(ctx, dir, &eo, &e) != DSV4_OK) {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
        dsv4_ctx_destroy(ctx);
        return 1;
    }
    const int64_t V = dsv4_engine_config(e)->vocab_size;
    const int pool = ro->pool < V ? ro->pool : (int)V;
    dsv4_engine_memory mem;
    dsv4_engine_memory_info(e, &mem);
    printf("batched decode: engine for %d + 2 sequences, max_batch %d, no MTP (%.1f MB planned); ids from [0, %d)\n", ro->max_b,
           eo.max_batch, (double)mem.planned / 1e6, pool);
    float *logits = malloc(sizeof *logits * (size_t)V * (size_t)ro->max_b);
    int32_t prompt[MAX_B][PROMPT];
    int seqs[MAX_B + 2], n_seq = 0, rc = 1;
    dsv4_batch_entry en[MAX_B];
    for (int j = 0; j < ro->max_b; j++) fill_ids(prompt[j], PROMPT, pool, 101 + (uint64_t)j);
    if (!logits) goto done;
    for (; n_seq < ro->max_b; n_seq++) {
        if (dsv4_engine_seq_create(e, &seqs[n_seq]) != DSV4_OK) goto done;
        en[n_seq] = (dsv4_batch_entry){seqs[n_seq], prompt[n_seq], PROMPT, 1, 0};
    }
    double t0 = bench_now();
    if (dsv4_engine_forward_batch(e, en, n_seq, logits, NULL) != DSV4_OK) goto done;
    printf("prefill of %d sequences x %d tokens in one call: %.1f tok/s\n", n_seq, PROMPT,
           (double)(n_seq * PROMPT) / (bench_now() - t0));
    experts_resident(dir, mc->moe_layers, mc->E);
    /* two more sequences with sequence 0's prompt, for single-sequence steps: dsv4_engine_forward,
     * and dsv4_engine_step greedy (which feeds the token it sampled) */
    const int solo = n_seq, stepper = n_seq + 1;
    for (int j = 0; j < 2; j++, n_seq++)
        if (dsv4_engine_seq_create(e, &seqs[n_seq]) != DSV4_OK ||
            dsv4_engine_forward(e, seqs[n_seq], prompt[0], PROMPT, logits, 1, NULL, 0) != DSV4_OK)
            goto done;
    uint64_t rng[4];
    dsv4_rng_seed(0, rng);
    int32_t x = 0, xo[1];
    printf("roofline of B tokens = B / max(bytes / %.1f GB/s, FLOPs / %.0f GFLOP/s (%s peak));\n"
           "  bytes = dense weights + LM head once + B embedding rows + per MoE layer (%d of them)\n"
           "  E (1 - (1 - k/E)^B) distinct experts of %.1f MB (E %d, k %d); FLOPs = 2 x %.0f M active weights x B\n",
           bw, ro->peak, ro->peak_of, mc->moe_layers, mc->expert.bytes / 1e6, mc->E, mc->k, mc->main.params / 1e6);
    printf("%4s %9s %9s %9s %10s %9s %8s %8s %7s %10s %8s %9s\n", "B", "step ms", "median", "best", "tok/s", "MB/step",
           "experts", "bound", "GB/s", "roof tok/s", "vs roof", "faults");
    double b1_tps = 0.0, solo_tps = 0.0, step_tps = 0.0;
    uint64_t step = 0;
    for (int B = 1; B <= ro->max_b; B = B * 2 > ro->max_b && B < ro->max_b ? ro->max_b : B * 2) {
        double t[256] = {0}, ts[256] = {0}, tq[256] = {0};
        int n = ro->steps < 256 ? ro->steps : 256;
        if (batch_step(e, seqs, B, pool, step++, logits) < 0) goto done;
        long fb = 0; /* page faults of the batched steps only */
        for (int i = 0; i < n; i++) {
            long fa = faults_now();
            if ((t[i] = batch_step(e, seqs, B, pool, step, logits)) < 0) goto done;
            fb += faults_now() - fa;
            if (B == 1) { /* the same token through the single-sequence call, step by step in turn */
                int32_t tok;
                step_ids(&tok, 1, pool, step);
                double t1 = bench_now();
                if (dsv4_engine_forward(e, seqs[solo], &tok, 1, logits, 1, NULL, 0) != DSV4_OK) goto done;
                ts[i] = bench_now() - t1;
                dsv4_step_request rq = {seqs[stepper], &x, 1, 0, 1, {0.0f, 1.0f, 0}, rng, xo, 0, 0, 0};
                t1 = bench_now();
                if (dsv4_engine_step(e, &rq, 1) != DSV4_OK) goto done;
                tq[i] = bench_now() - t1;
                x = xo[0];
            }
            step++;
        }
        if (B == 1) solo_tps = 1.0 / mean_of(ts, n), step_tps = 1.0 / mean_of(tq, n);
        double best = t[0];
        for (int i = 1; i < n; i++) best = t[i] < best ? t[i] : best;
        const double mean = mean_of(t, n), med = median_of(t, n), tps = B / mean, bytes = bytes_step(mc, B),
                     fl = flops_step(mc, B);
        const double tm = bytes / (bw * 1e9), tc = fl / (ro->peak * 1e9), roof = B / (tm > tc ? tm : tc);
        if (B == 1) b1_tps = tps;
        printf("%4d %9.2f %9.2f %9.2f %10.1f %9.0f %8.1f %8s %7.1f %10.1f %8.2f %9.0f\n", B, mean * 1e3, med * 1e3, best * 1e3,
               tps, bytes / 1e6, distinct_experts(mc, B), tm > tc ? "memory" : "compute", bytes / mean * 1e-9, roof, tps / roof,
               (double)fb / n);
    }
    /* the single-sequence path of the rows above: greedy generation after sequence 0's prompt, on
     * the slot of the single-sequence calls */
    dsv4_generate_stats gs;
    dsv4_engine_seq_free(e, seqs[solo]);
    seqs[solo] = seqs[--n_seq];
    if (!decode(e, prompt[0], PROMPT, ro->steps + 2, 0, &gs)) goto done;
    const double gen_tps = (double)(gs.generated_tokens - 1) / gs.decode_seconds;
    printf("B = 1 through the single-sequence paths, step by step in turn with the batched one: dsv4_engine_forward %.1f tok/s\n"
           "(batched / it: %.2f), dsv4_engine_step greedy %.1f tok/s (%.2f); then dsv4_engine_generate %.1f tok/s (%.2f)\n",
           solo_tps, b1_tps / solo_tps, step_tps, b1_tps / step_tps, gen_tps, b1_tps / gen_tps);
    printf("(step ms = the mean of %d timed steps, median and best next to it; tok/s = B / step ms; GB/s = the weight\n"
           "bytes of a step / step ms; experts = distinct experts per MoE layer, E (1 - (1 - k/E)^B); faults = page faults\n"
           "per step: weight pages mapped again)\n", ro->steps);
    rc = 0;
done:
    if (rc) fprintf(stderr, "bench run: batched decode: %s\n", dsv4_last_error());
    for (int j = 0; j < n_seq; j++) dsv4_engine_seq_free(e, seqs[j]);
    free(logits);
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
    return rc;
}

/* The engine's load progress on a device (the weights' upload: GB/s). */
static void upload_line(void *user, const char *line)
{
    (void)user;
    printf("%s\n", line);
}

static int bench_model(const char *name, const char *dir, const run_opts *ro, int n_prefill, int n_decode, double bw_gbs,
                       double peak_gflops)
{
    const int threads = ro->threads;
    model_cost mc;
    if (!cost_of(dir, &mc)) {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
        return 1;
    }
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options co = {.backend = ro->backend, .threads = threads};
    dsv4_engine_options eo = {1024, 1, 64, 2, 0, DSV4_LOAD_MAP, ro->device ? upload_line : NULL, NULL};
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
    /* With MTP planned, every plain step also runs the MTP block on the row before it (so that a
     * later step can draft; docs/engine.md §8): its weights without the head. */
    const double mtp_block = mc.mtp.bytes > 0 ? mc.mtp.bytes - mc.head.bytes : 0.0;
    const double roof_mtp = bw_gbs * 1e9 / (mc.main.bytes + mtp_block);
    if (mtp_block > 0)
        printf("(the engine plans MTP here, so a plain step also runs the MTP block on one row: %.1f MB more, roofline %.1f tok/s)\n",
               mtp_block / 1e6, roof_mtp);
    int rc = 0;
    double tps0 = 0.0;
    /* untimed first: greedy decoding of one prompt gives the same tokens with any k, so this pass
     * maps in every expert the timed ones route to (the first touch of a page is a fault) */
    dsv4_generate_stats warm;
    if (!decode(e, ids, 8, n_decode, 0, &warm)) {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
        rc = 1;
    }
    for (int k = 0; k <= 2 && !rc; k++) {
        dsv4_generate_stats st;
        const long f0 = faults_now();
        if (!decode(e, ids, 8, n_decode, k, &st)) {
            fprintf(stderr, "bench run: %s\n", dsv4_last_error());
            rc = 1;
            break;
        }
        double tps = (double)(st.generated_tokens - 1) / st.decode_seconds;
        printf("decode %3d tokens, mtp %d: %8.1f tok/s = %.2f of the roofline", n_decode, k, tps, tps / roof);
        if (!k && mtp_block > 0) printf(" (%.2f with the MTP block)", tps / roof_mtp);
        if (!k) tps0 = tps;
        if (k) printf("; acceptance %.0f%% (%lld/%lld), %.2f tokens/step", 100.0 * (double)st.accepted / (double)st.drafted,
                      (long long)st.accepted, (long long)st.drafted, (double)(st.generated_tokens - 1) / (double)(st.steps - 1));
        printf("; %.0f page faults / token\n", (double)(faults_now() - f0) / (double)st.generated_tokens);
    }
    if (mc.mtp.bytes > 0)
        printf("(an MTP step of k drafts verifies k+1 tokens in one forward and reads %.1f MB more per draft: MTP block + head)\n",
               mc.mtp.bytes / 1e6);
    if (!rc && ro->classes) {
        /* the class rates and the mtp 0 decode in turn, under the same load, best of CLASS_ROUNDS
         * each; the probe again after them, the higher one is the roofline */
        double rate[NCLASS] = {0}, best_tps = tps0;
        for (int round = 0; round < CLASS_ROUNDS && !rc; round++) {
            double r[NCLASS];
            dsv4_generate_stats st;
            rc = !class_rates(threads, bw_gbs, r) || (round > 0 && !decode(e, ids, 8, n_decode, 0, &st));
            for (int c = 0; c < NCLASS && !rc; c++) rate[c] = r[c] > rate[c] ? r[c] : rate[c];
            const double tps = rc || !round ? 0.0 : (double)(st.generated_tokens - 1) / st.decode_seconds;
            best_tps = tps > best_tps ? tps : best_tps;
        }
        const bench_bw again = bench_read_bw(0, threads, 8);
        bench_bw_print(&again);
        const double bw = again.best > bw_gbs ? again.best : bw_gbs;
        rate[C_OTHER] = bw; /* no product of its own (class_rates) */
        printf("read bandwidth before / after: %.1f / %.1f GB/s, the table uses %.1f; decode mtp 0, best of %d: %.2f tok/s\n",
               bw_gbs, again.best, bw, CLASS_ROUNDS, best_tps);
        if (!rc) print_classes(&mc, rate, bw, best_tps);
    }
    free(ids);
    free(logits);
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
    return rc ? rc : batched(dir, &mc, ro, bw_gbs);
}

/* The context's threads against one thread on one model, in interleaved rounds (the modes take
 * turns, so a change of the machine's load hits them alike): decode tok/s with mtp 0 and 2 per
 * round for the threads, one thread, and one thread again in a second context, whose ratio to the
 * first is the noise of the machine; min and median per mode; then what the pool's team control
 * did (BENCHMARKS.md, "Threads on a busy machine"). */
enum { MAX_ROUNDS = 64, MODES = 3 };
static int threads_vs_one(const char *dir, int threads, int rounds, int n_decode)
{
    const int th[MODES] = {threads, 1, 1}, mtp[2] = {0, 2};
    dsv4_ctx *ctx[MODES] = {NULL};
    dsv4_engine *e[MODES] = {NULL};
    dsv4_engine_options eo = {1024, 1, 64, 2, 0, DSV4_LOAD_MAP, NULL, NULL};
    int32_t ids[8];
    dsv4_generate_stats st;
    int ok = 1;
    for (int m = 0; m < MODES && ok; m++) {
        dsv4_ctx_options co = {.threads = th[m]};
        ok = dsv4_ctx_create(&co, &ctx[m]) == DSV4_OK && dsv4_engine_create(ctx[m], dir, &eo, &e[m]) == DSV4_OK;
        if (ok) fill_ids(ids, 8, dsv4_engine_config(e[m])->vocab_size, 7);
        ok = ok && decode(e[m], ids, 8, n_decode, 0, &st); /* untimed: maps the weights in */
    }
    double tps[MODES][2][MAX_ROUNDS], ratio[MODES][2][MAX_ROUNDS]; /* ratio: to mode 1 (one thread) */
    printf("\n%d threads against 1, interleaved rounds: decode %d tokens, tok/s mtp 0 / mtp 2; \"1 again\" is a second\n"
           "1-thread context: its ratio to the first is the machine's noise\n",
           threads, n_decode);
    printf("%5s %17s %17s %17s %15s %15s\n", "round", "default", "1 thread", "1 again", "default / 1", "1 again / 1");
    for (int r = 0; r < rounds && ok; r++) {
        for (int m = 0; m < MODES && ok; m++)
            for (int k = 0; k < 2 && ok; k++) {
                ok = decode(e[m], ids, 8, n_decode, mtp[k], &st);
                tps[m][k][r] = (double)(st.generated_tokens - 1) / st.decode_seconds;
            }
        if (!ok) break;
        for (int m = 0; m < MODES; m++)
            for (int k = 0; k < 2; k++) ratio[m][k][r] = tps[m][k][r] / tps[1][k][r];
        printf("%5d", r + 1);
        for (int m = 0; m < MODES; m++) printf(" %8.1f / %6.1f", tps[m][0][r], tps[m][1][r]);
        printf(" %7.2f / %5.2f %7.2f / %5.2f\n", ratio[0][0][r], ratio[0][1][r], ratio[2][0][r], ratio[2][1][r]);
    }
    if (ok) {
        for (int row = 0; row < 2; row++) { /* min, median */
            printf("%5s", row ? "med" : "min");
            double v[MODES][2], q[MODES][2];
            for (int m = 0; m < MODES; m++)
                for (int k = 0; k < 2; k++) {
                    v[m][k] = row ? median_of(tps[m][k], rounds) : tps[m][k][0];
                    q[m][k] = row ? median_of(ratio[m][k], rounds) : ratio[m][k][0];
                    for (int r = 1; r < rounds && !row; r++) {
                        v[m][k] = fmin(v[m][k], tps[m][k][r]);
                        q[m][k] = fmin(q[m][k], ratio[m][k][r]);
                    }
                }
            for (int m = 0; m < MODES; m++) printf(" %8.1f / %6.1f", v[m][0], v[m][1]);
            printf(" %7.2f / %5.2f %7.2f / %5.2f (of the ratios)\n", q[0][0], q[0][1], q[2][0], q[2][1]);
        }
        int64_t k[DSV4_POOL_COUNTS];
        dsv4_ctx_pool_counts(ctx[0], k);
        printf("the default's pool: %lld loops by the team (%.1f ms), %lld on the caller alone (%.1f ms); %lld stalls (%.1f ms);\n"
               "the team shrank %lld times, %lld probes; team now %lld\n",
               (long long)k[DSV4_POOL_LOOPS_TEAM], (double)k[DSV4_POOL_TEAM_NS] / 1e6, (long long)k[DSV4_POOL_LOOPS_ALONE],
               (double)k[DSV4_POOL_ALONE_NS] / 1e6, (long long)k[DSV4_POOL_STALLS],
               (double)k[DSV4_POOL_STALL_NS] / 1e6, (long long)k[DSV4_POOL_SHRINKS], (long long)k[DSV4_POOL_PROBES],
               (long long)k[DSV4_POOL_TEAM]);
    } else {
        fprintf(stderr, "bench run: %s\n", dsv4_last_error());
    }
    for (int m = 0; m < MODES; m++) {
        dsv4_engine_destroy(e[m]);
        dsv4_ctx_destroy(ctx[m]);
    }
    return !ok;
}

/* What routing reads gets random values in the checkpoint of bench_flash_like (its data are file
 * holes): the embedding rows of ids [0, pool), every ffn_norm (1.0), every gate (uniform in
 * [-1, 1)), and every row of every hash table (k distinct experts). A token's hidden state
 * then is its embedding row (the zero attention and experts add nothing), so each learned layer
 * routes it through its own random gate and each hash layer through its own random row. */
static int route_like(const char *dir, int pool, int64_t n_experts)
{
    dsv4_checkpoint *ck = NULL;
    if (dsv4_checkpoint_open(dir, &ck) != DSV4_OK) return 0;
    typedef struct patch {
        char file[128];
        uint64_t off;
        int kind, dtype; /* kind: 0 embedding, 1 norm, 2 gate, 3 hash table */
        int64_t rows, cols;
    } patch;
    const int64_t n = dsv4_checkpoint_count(ck);
    patch *pl = calloc((size_t)n, sizeof *pl);
    int np = 0, ok = pl != NULL;
    static const char *const suffix[4] = {"embed.weight", "ffn_norm.weight", "ffn.gate.weight", "ffn.gate.tid2eid"};
    for (int64_t i = 0; i < n && ok; i++) {
        dsv4_tensor_entry te;
        if (dsv4_checkpoint_entry(ck, i, &te) != DSV4_OK) ok = 0;
        size_t cl = ok ? strlen(te.canonical) : 0;
        for (int k = 0; k < 4 && ok; k++) {
            size_t sl = strlen(suffix[k]);
            if (cl < sl || strcmp(te.canonical + cl - sl, suffix[k]) || (k == 0 && cl != sl)) continue;
            patch *p = &pl[np++];
            snprintf(p->file, sizeof p->file, "%s", te.file);
            p->off = te.file_offset;
            p->kind = k;
            p->dtype = te.dtype;
            p->rows = te.shape[0];
            p->cols = te.ndim > 1 ? te.shape[1] : 1;
            if (k == 0) p->rows = p->rows < pool ? p->rows : pool; /* hash tables: every row (the engine refuses a repeated expert) */
        }
    }
    dsv4_checkpoint_close(ck);
    uint64_t seed = 12345;
    for (int i = 0; i < np && ok; i++) {
        const patch *p = &pl[i];
        const size_t cnt = (size_t)(p->rows * p->cols), es = dsv4_dtype_size(p->dtype);
        unsigned char *buf = malloc(cnt * es);
        float *f = malloc(cnt * sizeof *f);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, p->file);
        int fd = open(path, O_WRONLY);
        ok = buf && f && fd >= 0;
        if (ok && p->kind == 3) { /* k distinct experts a row: a partial Fisher-Yates shuffle */
            int32_t perm[1024];
            for (int64_t r = 0; r < p->rows && n_experts <= 1024; r++) {
                for (int j = 0; j < n_experts; j++) perm[j] = j;
                for (int64_t c = 0; c < p->cols; c++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    int64_t j = c + (int64_t)((seed >> 33) % (uint64_t)(n_experts - c));
                    int32_t x = perm[c];
                    perm[c] = perm[j];
                    perm[j] = x;
                    if (p->dtype == DSV4_I64) ((int64_t *)(void *)buf)[r * p->cols + c] = perm[c];
                    else ((int32_t *)(void *)buf)[r * p->cols + c] = perm[c];
                }
            }
        } else if (ok) {
            if (p->kind == 1)
                for (size_t j = 0; j < cnt; j++) f[j] = 1.0f;
            else
                bench_fill_random_f32(f, cnt, seed + (uint64_t)i, 1.0f);
            for (size_t j = 0; j < cnt; j++)
                if (p->dtype == DSV4_BF16) ((uint16_t *)(void *)buf)[j] = dsv4_bf16_encode(f[j]);
                else ((float *)(void *)buf)[j] = f[j];
            ok = p->dtype == DSV4_BF16 || p->dtype == DSV4_F32;
        }
        ok = ok && pwrite(fd, buf, cnt * es, (off_t)p->off) == (ssize_t)(cnt * es);
        if (fd >= 0) close(fd);
        free(buf);
        free(f);
    }
    free(pl);
    if (!ok) fprintf(stderr, "bench run: giving the V4-Flash-shaped checkpoint its routing failed\n");
    return ok;
}

int bench_flash_like(const char *dir) { return bench_flash_layers(dir, 3); }

int bench_flash_layers(const char *dir, int n_layers)
{
    dsv4_model_config c;
    dsv4_config_default(&c);
    if (n_layers == 3) { /* one block of each kind */
        c.n_layers = 3;
        c.n_hash_layers = 1;
        const int ratios[4] = {0, 4, 128, 0};
        for (int i = 0; i < DSV4_MAX_LAYERS; i++) {
            int r = i < 4 ? ratios[i] : 0;
            c.compress_ratio[i] = r;
            c.attn_kind[i] = (uint8_t)(r == 0 ? DSV4_ATTN_SWA : r == 4 ? DSV4_ATTN_CSA : DSV4_ATTN_HCA);
            c.hash_routed[i] = (uint8_t)(i < 1);
        }
    } else { /* V4-Flash's first n_layers blocks as they are (kinds, ratios, hash routing) */
        if (n_layers < 1 || n_layers > c.n_layers) {
            fprintf(stderr, "bench run: --layers %d not in [1, %lld]\n", n_layers, (long long)c.n_layers);
            return 0;
        }
        c.n_layers = n_layers;
        if (c.n_hash_layers > n_layers) c.n_hash_layers = n_layers;
    }
    dsv4_write_options o = {1, 1, DSV4_LAYOUT_OFFICIAL, 1, 1};
    if (dsv4_checkpoint_write(dir, &c, &o) != DSV4_OK) {
        fprintf(stderr, "bench run: writing the V4-Flash-shaped checkpoint: %s\n", dsv4_last_error());
        return 0;
    }
    return route_like(dir, ROUTE_IDS, c.n_routed_experts);
}

/* Competitors for a shared machine: n child processes that only spin, until stop_spinners. */
enum { MAX_BUSY = 64 };
static int start_spinners(int n, pid_t *pids)
{
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
            for (volatile unsigned long x = 0;; x++) {
            }
        }
        if (pids[i] < 0) {
            perror("bench run: fork");
            return i;
        }
    }
    return n;
}

static void stop_spinners(int n, const pid_t *pids)
{
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
}

static int run_models(run_opts *ro, int quick, const char *model, int steps, double bw, double peak);

int dsv4_bench_run(int argc, char **argv)
{
    run_opts ro = {bench_opt_int(argc, argv, "--threads", dsv4_default_threads()), bench_opt_int(argc, argv, "--max-batch", MAX_B),
                   bench_opt_int(argc, argv, "--steps", 0), 0, 0, 0.0, NULL, 0, NULL, 0, 3, 0};
    int quick = bench_opt_flag(argc, argv, "--quick");
    const char *model = bench_opt_str(argc, argv, "--model", NULL);
    if (ro.max_b < 1 || ro.max_b > MAX_B) {
        fprintf(stderr, "bench run: --max-batch must be in [1, %d]\n", MAX_B);
        return 1;
    }
    const int busy = bench_opt_int(argc, argv, "--busy", 0);
    if (busy < 0 || busy > MAX_BUSY) {
        fprintf(stderr, "bench run: --busy must be in [0, %d]\n", MAX_BUSY);
        return 1;
    }
    ro.rounds = bench_opt_int(argc, argv, "--rounds", busy ? 7 : 0);
    if (ro.rounds < 0 || ro.rounds > MAX_ROUNDS) { /* the option table keeps it >= 1 */
        fprintf(stderr, "bench run: --rounds must be in [0, %d]\n", MAX_ROUNDS);
        return 1;
    }
    const int threads = ro.threads, steps = ro.steps;
    ro.backend = bench_opt_str(argc, argv, "--backend", NULL);
    ro.layers = bench_opt_int(argc, argv, "--layers", 3);
    ro.no_tiny = bench_opt_flag(argc, argv, "--no-tiny");
    double bw = 0.0, peak = 0.0;
    if (ro.backend && strcmp(ro.backend, "cpu") && strcmp(ro.backend, "cpu-ref")) {
        /* a device: its copy rate (read + write bytes) is the roofline's bandwidth, as in bench linear-cuda */
        dsv4_ctx *dc = NULL;
        const dsv4_ctx_options dco = {.backend = ro.backend};
        if (dsv4_backend_available(ro.backend) != DSV4_OK || dsv4_ctx_create(&dco, &dc) != DSV4_OK) {
            printf("bench run: skipped: %s\n", dsv4_last_error());
            return 0;
        }
        dsv4_device_info di;
        if (dsv4_device_info_get(dc, &di) != DSV4_OK) di.name[0] = 0;
        bw = bench_device_copy_rate(dc);
        dsv4_ctx_destroy(dc);
        ro.device = 1;
        ro.rounds = 0;
        peak = ro.peak = 1e3 * atof(bench_opt_str(argc, argv, "--peak-tflops", "0"));
        if (!(peak > 0)) peak = ro.peak = 1e12; /* not given: no compute bound */
        ro.peak_of = "given";
        printf("bench run: backend %s (%s), device copy rate %.0f GB/s (read + write, measured now): the roofline's bandwidth\n",
               ro.backend, di.name, bw);
    } else {
        const bench_bw probe = bench_read_bw(0, threads, 8);
        bench_bw_print(&probe);
        bw = probe.best, peak = bench_fma_peak(threads);
        const double dot = bench_dot_peak(threads);
        ro.peak = dot > peak ? dot : peak;
        ro.peak_of = dot > peak ? "vdpbf16ps" : "fp32 FMA";
        printf("bench run: %d threads, read bandwidth %.1f GB/s (median %.1f), FMA peak %.0f GFLOP/s, vdpbf16ps peak %.0f GFLOP/s"
               " (measured now)\n", threads, bw, probe.median, peak, dot);
    }

    printf("published CPU results: a good one is ~15-20 tok/s per server socket on V4-Flash (llama.cpp 9.7),\n"
           "i.e. 11.2 GB/token at ~200-250 GB/s: the fraction of the roofline below compares with ~0.8 for those\n");
    pid_t pids[MAX_BUSY];
    const int spinners = start_spinners(busy, pids);
    if (busy) printf("with %d CPU-bound competing process%s from here on\n", spinners, spinners == 1 ? "" : "es");
    int rc = spinners == busy ? run_models(&ro, quick, model, steps, bw, peak) : 1;
    stop_spinners(spinners, pids);
    return rc;
}

static int run_models(run_opts *ro_in, int quick, const char *model, int steps, double bw, double peak)
{
    run_opts ro = *ro_in;
    ro.pool = INT32_MAX; /* a real checkpoint or make-tiny: any id routes like a real token */
    ro.classes = 0; /* the V4-Flash-shaped checkpoint's rows only */
    ro.steps = steps > 0 ? steps : 8;
    if (model) return bench_model(model, model, &ro, 64, 32, bw, peak);
    char tiny[] = "/tmp/dsv4-bench-tiny-XXXXXX", flash[] = "/tmp/dsv4-bench-flash-XXXXXX";
    int rc = 1;
    ro.steps = steps > 0 ? steps : 24;
    const int with_tiny = quick || !ro.no_tiny; /* --quick is the tiny model alone */
    if (!with_tiny) {
        rc = 0;
    } else if (mkdtemp(tiny) && dsv4_make_tiny(tiny, 1) == DSV4_OK) {
        rc = ro.rounds && ro.threads > 1 ? threads_vs_one(tiny, ro.threads, ro.rounds, 128) : 0;
        rc = rc ? rc : bench_model("tiny (make-tiny)", tiny, &ro, 128, 64, bw, peak);
    } else {
        fprintf(stderr, "bench run: make-tiny: %s\n", dsv4_last_error());
    }
    if (with_tiny) bench_rm_tree(tiny);
    if (rc || quick) return rc;
    ro.pool = ROUTE_IDS;
    ro.classes = !ro.device; /* the class products are the cpu's */
    ro.steps = steps > 0 ? steps : 8; /* two CSA compressions (ratio 4) per sequence */
    char what[160];
    if (ro.layers == 3) snprintf(what, sizeof what, "V4-Flash shapes, 3 blocks (SWA, CSA, HCA) + MTP, zero weights but the routing");
    else snprintf(what, sizeof what, "V4-Flash shapes, its first %d blocks + MTP, zero weights but the routing", ro.layers);
    if (mkdtemp(flash) && bench_flash_layers(flash, ro.layers)) rc = bench_model(what, flash, &ro, 32, 8, bw, peak);
    bench_rm_tree(flash);
    return rc;
}
