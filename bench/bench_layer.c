/* dsv4 bench layer: the layer family at V4-Flash sizes (docs/model.md §4, §7), one decode token at a time.
 *   mHC (n = 4, D = 4096): hc_pre, hc_post, fused post+pre, hc_head per token; bytes touched
 *     (fn + streams) per second next to the read bandwidth, and the cpu-ref time; hc_pre on a
 *     16-token chunk as GFLOP/s next to the FMA peak.
 *   router (E = 256, D = 4096, BF16 gate) and RMSNorm per token.
 *   MoE for one token: 6 routed FP4 experts + the FP8 shared expert (D = 4096, I = 2048):
 *     effective weight GB/s next to the read bandwidth, and the MoE time over the time of its 21
 *     linear products run alone (the block's own overhead: grouping, staging, SwiGLU, combine).
 * Every call reads weights (fn, gate, experts) that the previous calls did not touch, and the
 * pools exceed the 32 MiB L3, so they come from memory as in a decode step. The indexer part of
 * the layer benchmarks is the indexer family's `dsv4 bench indexer`, run at the end (skip it
 * with --no-indexer). Options: --threads N, --quick, --only mhc|router|moe (implies no indexer). */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dsv4_bench_indexer(int argc, char **argv);

enum { N = 4, D = 4096, NMIX = (2 + N) * N, E = 256, TOPK = 6, I_EXP = 2048, POOL = 16 };

static void die(const char *what)
{
    fprintf(stderr, "bench layer: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

static dsv4_tensor view(void *data, dsv4_dtype dt, int ndim, int64_t a, int64_t b, int64_t c)
{
    dsv4_tensor t;
    const int64_t shape[3] = {a, b, c};
    if (dsv4_tensor_init(&t, data, dt, ndim, shape)) die("view");
    return t;
}

static void fill_bf16(uint16_t *p, size_t n, uint64_t seed)
{
    float *tmp = bench_alloc_or_die(n * 4);
    bench_fill_random_f32(tmp, n, seed, 2.0f);
    if (dsv4_encode_array(NULL, DSV4_FMT_BF16, tmp, (int64_t)n, p)) die("bf16");
    free(tmp);
}

/* ---- one benchmarked call -------------------------------------------------------------- */
typedef struct call {
    dsv4_ctx *ctx;
    int op, slot; /* slot: which copy of the weights this call reads */
} call;

typedef struct mhc_data {
    int sites;
    float *fn, *hfn, scale[3], base[NMIX];
    uint16_t *x, *streams, *sub, *y;
    float *post, *comb;
} mhc_data;

static mhc_data M;

static dsv4_hc_site site_at(int i, int head)
{
    dsv4_hc_site s;
    s.fn = head ? view(M.hfn + (size_t)i * N * N * D, DSV4_F32, 2, N, N * D, 0)
                : view(M.fn + (size_t)i * NMIX * N * D, DSV4_F32, 2, NMIX, N * D, 0);
    s.scale = view(M.scale, DSV4_F32, 1, head ? 1 : 3, 0, 0);
    s.base = view(M.base, DSV4_F32, 1, head ? N : NMIX, 0, 0);
    s.sinkhorn_iters = 20;
    s.eps = 1e-6f;
    s.norm_eps = 1e-6f;
    return s;
}

enum { OP_PRE, OP_POST, OP_FUSED, OP_HEAD, OP_PRE16 };

static dsv4_status run_mhc(const call *c)
{
    int i = c->slot % M.sites;
    int64_t T = c->op == OP_PRE16 ? 16 : 1;
    uint16_t *x = M.x + (size_t)i * 16 * N * D, *st = M.streams + (size_t)i * 16 * N * D;
    dsv4_tensor tx = view(x, DSV4_BF16, 3, T, N, D), ts = view(st, DSV4_BF16, 3, T, N, D);
    dsv4_tensor tsub = view(M.sub, DSV4_BF16, 2, T, D, 0), ty = view(M.y, DSV4_BF16, 2, T, D, 0);
    dsv4_tensor tp = view(M.post, DSV4_F32, 2, T, N, 0), tc = view(M.comb, DSV4_F32, 3, T, N, N);
    dsv4_hc_site s = site_at(i, c->op == OP_HEAD);
    switch (c->op) {
    case OP_PRE:
    case OP_PRE16: return dsv4_hc_pre(c->ctx, &s, &tx, &ty, &tp, &tc);
    case OP_POST: return dsv4_hc_post(c->ctx, &tsub, &tx, &tp, &tc, &ts);
    case OP_FUSED: return dsv4_hc_post_pre(c->ctx, &tsub, &tx, &tp, &tc, &s, &ts, &ty, &tp, &tc);
    default: return dsv4_hc_head(c->ctx, &s, &tx, &ty);
    }
}

/* Best seconds per call over `reps` calls, each on the next slot (the best, like the read
 * bandwidth it is compared with: other jobs on the shared cores only ever add time). */
static double time_calls(dsv4_status (*fn)(const call *), call c, int reps)
{
    double best = 1e30;
    if (fn(&c)) die("warm-up");
    for (int r = 0; r < reps; r++) {
        c.slot++;
        double t0 = bench_now();
        if (fn(&c)) die("call");
        double t = bench_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* Read bandwidth just before a section: the probe's best 32 MiB burst over a buffer of at least
 * 8x the last-level cache (bench_bandwidth.c), like the calls it is compared with: the cores are
 * shared, and a best-of over bursts of the length of the timed calls sees the same quiet moments. */
static double section_bw(int threads, int quick)
{
    double bw = bench_read_bandwidth((size_t)128 << 20, threads, quick ? 8 : 20);
    printf("  (read bandwidth measured for this section: %.1f GB/s)\n", bw);
    return bw;
}

static void bench_mhc(dsv4_ctx *fast, dsv4_ctx *ref, int threads, double peak, int quick)
{
    M.sites = 48; /* 48 x 1.5 MiB of fn: twice the L3 */
    M.fn = bench_alloc_or_die((size_t)M.sites * NMIX * N * D * 4);
    M.hfn = bench_alloc_or_die((size_t)M.sites * N * N * D * 4);
    M.x = bench_alloc_or_die((size_t)M.sites * 16 * N * D * 2);
    M.streams = bench_alloc_or_die((size_t)M.sites * 16 * N * D * 2);
    M.sub = bench_alloc_or_die((size_t)16 * D * 2);
    M.y = bench_alloc_or_die((size_t)16 * D * 2);
    M.post = bench_alloc_or_die(16 * N * 4);
    M.comb = bench_alloc_or_die(16 * N * N * 4);
    bench_fill_random_f32(M.fn, (size_t)M.sites * NMIX * N * D, 3, 0.01f);
    bench_fill_random_f32(M.hfn, (size_t)M.sites * N * N * D, 4, 0.01f);
    bench_fill_random_f32(M.scale, 3, 5, 1.0f);
    bench_fill_random_f32(M.base, NMIX, 6, 1.0f);
    fill_bf16(M.x, (size_t)M.sites * 16 * N * D, 7);
    memcpy(M.streams, M.x, (size_t)M.sites * 16 * N * D * 2); /* touched: no page faults in the timing */
    fill_bf16(M.sub, (size_t)16 * D, 8);
    for (int i = 0; i < 16 * N; i++) M.post[i] = 1.0f;
    for (int i = 0; i < 16 * N * N; i++) M.comb[i] = 0.25f;

    const double fnb = (double)NMIX * N * D * 4, hfnb = (double)N * N * D * 4, sb = (double)N * D * 2, xb = D * 2.0;
    struct {
        const char *name;
        int op;
        double bytes; /* per call: weights read + streams read and written */
    } rows[] = {
        {"hc_pre", OP_PRE, fnb + sb + xb},
        {"hc_post", OP_POST, xb + 2 * sb},
        {"hc_post_pre (fused)", OP_FUSED, fnb + 2 * sb + 2 * xb},
        {"hc_head", OP_HEAD, hfnb + sb + xb},
    };
    int reps = quick ? 12 : 40;
    printf("mHC, V4-Flash site (n = 4, D = 4096, fn 1.5 MiB), one token per call:\n");
    double bw = section_bw(threads, quick);
    printf("  %-22s %10s %10s %10s %12s %9s\n", "op", "us/token", "GB/s", "% of read", "cpu-ref us", "speedup");
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        call c = {fast, rows[r].op, 0}, cr = {ref, rows[r].op, 0};
        double t = time_calls(run_mhc, c, reps), tr = time_calls(run_mhc, cr, quick ? 3 : 6);
        printf("  %-22s %10.1f %10.1f %9.0f%% %12.1f %8.1fx\n", rows[r].name, t * 1e6, rows[r].bytes / t * 1e-9,
               100.0 * rows[r].bytes / t * 1e-9 / bw, tr * 1e6, tr / t);
    }
    call c16 = {fast, OP_PRE16, 0};
    double t16 = time_calls(run_mhc, c16, quick ? 6 : 20);
    double flop = 16.0 * (2.0 * NMIX * N * D + 2.0 * N * D + 2.0 * N * D);
    printf("  %-22s %10.1f %10.1f GFLOP/s = %.0f%% of the FMA peak (fn read once for 16 tokens)\n\n",
           "hc_pre, 16-token chunk", t16 * 1e6 / 16, flop / t16 * 1e-9, 100.0 * flop / t16 * 1e-9 / peak);
    free(M.fn), free(M.hfn), free(M.x), free(M.streams), free(M.sub), free(M.y), free(M.post), free(M.comb);
}

/* ---- router and RMSNorm ----------------------------------------------------------------- */
typedef struct router_data {
    int copies;
    uint16_t *w, *x, *y, *nw;
    float *bias, wts[TOPK];
    int32_t ids[TOPK];
} router_data;

static router_data R;

static dsv4_status run_route(const call *c)
{
    int i = c->slot % R.copies;
    dsv4_tensor tx = view(R.x, DSV4_BF16, 2, 1, D, 0), tw = view(R.w + (size_t)i * E * D, DSV4_BF16, 2, E, D, 0);
    dsv4_tensor tb = view(R.bias, DSV4_F32, 1, E, 0, 0), ti = view(R.ids, DSV4_I32, 2, 1, TOPK, 0),
                two = view(R.wts, DSV4_F32, 2, 1, TOPK, 0);
    if (c->op) {
        dsv4_tensor ty = view(R.y, DSV4_BF16, 2, 1, D, 0), tn = view(R.nw, DSV4_BF16, 1, D, 0, 0);
        return dsv4_rms_norm(c->ctx, &tx, &tn, 1e-6f, &ty);
    }
    return dsv4_route(c->ctx, &tx, &tw, &tb, NULL, NULL, 1.5f, &ti, &two);
}

static void bench_router(dsv4_ctx *fast, dsv4_ctx *ref, int threads, int quick)
{
    R.copies = 32; /* 32 x 2 MiB */
    R.w = bench_alloc_or_die((size_t)R.copies * E * D * 2);
    R.x = bench_alloc_or_die(D * 2);
    R.y = bench_alloc_or_die(D * 2);
    R.nw = bench_alloc_or_die(D * 2);
    R.bias = bench_alloc_or_die(E * 4);
    fill_bf16(R.w, (size_t)R.copies * E * D, 9);
    fill_bf16(R.x, D, 10);
    fill_bf16(R.nw, D, 11);
    bench_fill_random_f32(R.bias, E, 12, 0.1f);
    printf("router (E = 256, D = 4096, BF16 gate 2 MiB) and RMSNorm (D = 4096), one token per call:\n");
    double bw = section_bw(threads, quick);
    printf("  %-22s %10s %10s %10s %12s %9s\n", "op", "us/token", "GB/s", "% of read", "cpu-ref us", "speedup");
    const double bytes[2] = {(double)E * D * 2 + D * 2, 3.0 * D * 2};
    const char *names[2] = {"route (top-6 + bias)", "rms_norm"};
    for (int op = 0; op < 2; op++) {
        call c = {fast, op, 0}, cr = {ref, op, 0};
        double t = time_calls(run_route, c, quick ? 12 : 40), tr = time_calls(run_route, cr, quick ? 3 : 6);
        printf("  %-22s %10.1f %10.1f %9.0f%% %12.1f %8.1fx\n", names[op], t * 1e6, bytes[op] / t * 1e-9,
               100.0 * bytes[op] / t * 1e-9 / bw, tr * 1e6, tr / t);
    }
    printf("\n");
    free(R.w), free(R.x), free(R.y), free(R.nw), free(R.bias);
}

/* ---- MoE -------------------------------------------------------------------------------- */
typedef struct expert_buf {
    uint8_t *w[3], *s[3];
    dsv4_tensor t[6];
    dsv4_ffn_weights f;
} expert_buf;

/* FP4 [I, D/2] / [D, I/2] with 1x32 scales, or FP8 [I, D] / [D, I] with 128x128 scales. */
static void expert_init(expert_buf *e, dsv4_linear_format fmt, uint64_t seed)
{
    const int fp4 = fmt == DSV4_LINEAR_FP4;
    const int64_t rows[3] = {I_EXP, I_EXP, D}, ks[3] = {D, D, I_EXP};
    for (int m = 0; m < 3; m++) {
        int64_t wc = fp4 ? ks[m] / 2 : ks[m], sr = fp4 ? rows[m] : rows[m] / 128, sc = fp4 ? ks[m] / 32 : ks[m] / 128;
        e->w[m] = bench_alloc_or_die((size_t)(rows[m] * wc));
        e->s[m] = bench_alloc_or_die((size_t)(sr * sc));
        bench_fill_random_u8(e->w[m], (size_t)(rows[m] * wc), seed * 7 + (uint64_t)m);
        if (!fp4)
            for (int64_t i = 0; i < rows[m] * wc; i++) e->w[m][i] &= 0xB7; /* no NaN codes, |w| <= 0.875 * 2^(6-7) */
        for (int64_t i = 0; i < sr * sc; i++) e->s[m][i] = (uint8_t)(118 + i % 5);
        e->t[2 * m] = view(e->w[m], fp4 ? DSV4_FP4X2 : DSV4_F8_E4M3, 2, rows[m], wc, 0);
        e->t[2 * m + 1] = view(e->s[m], DSV4_E8M0, 2, sr, sc, 0);
    }
    e->f = (dsv4_ffn_weights){fmt, &e->t[0], &e->t[1], &e->t[2], &e->t[3], &e->t[4], &e->t[5]};
}

static double expert_bytes(const expert_buf *e)
{
    double b = 0;
    for (int m = 0; m < 6; m++) b += (double)dsv4_tensor_numel(&e->t[m]);
    return b;
}

typedef struct moe_data {
    expert_buf pool[POOL], shared[2];
    dsv4_ffn_weights f[POOL];
    uint16_t *x, *y, *g, *u;
    int32_t ids[8 * TOPK];
    float wts[8 * TOPK];
    void *ws, *lws;
    size_t ws_bytes, lws_bytes;
    int T;
} moe_data;

static moe_data Q;

/* Token t of call `slot` picks 6 distinct experts of the pool (a fixed pseudo-random walk). */
static void pick(int slot)
{
    for (int t = 0; t < Q.T; t++) {
        uint64_t h = (uint64_t)(slot * 8 + t) * 0x9E3779B97F4A7C15ull;
        int used = 0;
        for (int s = 0; s < TOPK; s++) {
            int e;
            do {
                h = h * 6364136223846793005ull + 1442695040888963407ull;
                e = (int)((h >> 33) % POOL);
            } while (used & (1 << e));
            used |= 1 << e;
            Q.ids[t * TOPK + s] = e;
            Q.wts[t * TOPK + s] = 0.25f;
        }
    }
}

static dsv4_status run_moe(const call *c)
{
    pick(c->slot);
    dsv4_tensor tx = view(Q.x, DSV4_BF16, 2, Q.T, D, 0), ty = view(Q.y, DSV4_BF16, 2, Q.T, D, 0);
    dsv4_tensor ti = view(Q.ids, DSV4_I32, 2, Q.T, TOPK, 0), tw = view(Q.wts, DSV4_F32, 2, Q.T, TOPK, 0);
    return dsv4_moe(c->ctx, &tx, &ti, &tw, Q.f, POOL, &Q.shared[c->slot % 2].f, 10.0f, &ty, Q.ws, Q.ws_bytes);
}

/* The same 21 products (T = 1) through dsv4_linear alone, nothing else. */
static dsv4_status run_products(const call *c)
{
    pick(c->slot);
    dsv4_tensor tx = view(Q.x, DSV4_BF16, 2, 1, D, 0), ty = view(Q.y, DSV4_BF16, 2, 1, D, 0);
    dsv4_tensor tg = view(Q.g, DSV4_BF16, 2, 1, I_EXP, 0), tu = view(Q.u, DSV4_BF16, 2, 1, I_EXP, 0);
    for (int s = 0; s <= TOPK; s++) {
        const dsv4_ffn_weights *f = s < TOPK ? &Q.f[Q.ids[s]] : &Q.shared[c->slot % 2].f;
        if (dsv4_linear(c->ctx, f->fmt, &tx, f->w1, f->w1_scale, NULL, &tg, Q.lws, Q.lws_bytes) ||
            dsv4_linear(c->ctx, f->fmt, &tx, f->w3, f->w3_scale, NULL, &tu, Q.lws, Q.lws_bytes) ||
            dsv4_linear(c->ctx, f->fmt, &tg, f->w2, f->w2_scale, NULL, &ty, Q.lws, Q.lws_bytes))
            return DSV4_ERR_BACKEND;
    }
    return DSV4_OK;
}

static void bench_moe(dsv4_ctx *fast, int threads, int quick)
{
    for (int e = 0; e < POOL; e++) {
        expert_init(&Q.pool[e], DSV4_LINEAR_FP4, (uint64_t)e + 100);
        Q.f[e] = Q.pool[e].f;
    }
    expert_init(&Q.shared[0], DSV4_LINEAR_FP8_B128, 200);
    expert_init(&Q.shared[1], DSV4_LINEAR_FP8_B128, 201);
    Q.x = bench_alloc_or_die(8 * D * 2);
    Q.y = bench_alloc_or_die(8 * D * 2);
    Q.g = bench_alloc_or_die(I_EXP * 2);
    Q.u = bench_alloc_or_die(I_EXP * 2);
    fill_bf16(Q.x, 8 * D, 13);
    if (dsv4_moe_workspace_size(fast, 8, TOPK, POOL, &Q.f[0], &Q.shared[0].f, &Q.ws_bytes)) die("moe workspace");
    size_t a = 0, b = 0;
    if (dsv4_linear_workspace_size(fast, DSV4_LINEAR_FP8_B128, 1, D, &a) ||
        dsv4_linear_workspace_size(fast, DSV4_LINEAR_FP4, 1, D, &b))
        die("linear workspace");
    Q.lws_bytes = a > b ? a : b;
    Q.ws = bench_alloc_or_die(Q.ws_bytes);
    Q.lws = bench_alloc_or_die(Q.lws_bytes + 1);
    double routed = expert_bytes(&Q.pool[0]), shared = expert_bytes(&Q.shared[0]);
    printf("MoE, V4-Flash (D = 4096, I = 2048): 6 routed FP4 experts of a pool of %d (%.0f MiB) + the FP8 shared\n"
           "expert; weight bytes per token: routed %.1f MiB + shared %.1f MiB; work space %.1f MiB:\n",
           POOL, POOL * routed / 1048576.0, TOPK * routed / 1048576.0, shared / 1048576.0, Q.ws_bytes / 1048576.0);
    double bw = section_bw(threads, quick);
    printf("  %-30s %10s %12s %10s\n", "", "ms/call", "weight GB/s", "% of read");
    int reps = quick ? 5 : 16;
    Q.T = 1;
    call c = {fast, 0, 0};
    double tm = time_calls(run_moe, c, reps), tp = time_calls(run_products, c, reps);
    double bytes1 = TOPK * routed + shared;
    printf("  %-30s %10.2f %12.1f %9.0f%%\n", "moe, 1 token", tm * 1e3, bytes1 / tm * 1e-9, 100.0 * bytes1 / tm * 1e-9 / bw);
    printf("  %-30s %10.2f %12.1f %9.0f%%\n", "its 21 linear products alone", tp * 1e3, bytes1 / tp * 1e-9,
           100.0 * bytes1 / tp * 1e-9 / bw);
    printf("  MoE / products alone: %.3f (the block's own work: grouping, staging, SwiGLU, combine)\n", tm / tp);
    Q.T = 8; /* MTP verification / small prefill chunk: experts shared between tokens */
    double t8 = time_calls(run_moe, c, quick ? 3 : 8);
    int distinct = 0, seen = 0;
    pick(c.slot + 1);
    for (int i = 0; i < 8 * TOPK; i++)
        if (!(seen & (1 << Q.ids[i]))) seen |= 1 << Q.ids[i], distinct++;
    double bytes8 = distinct * routed + shared;
    printf("  %-30s %10.2f %12.1f %9.0f%%   (%.2f ms/token; ~%d distinct experts read once)\n\n", "moe, 8 tokens",
           t8 * 1e3, bytes8 / t8 * 1e-9, 100.0 * bytes8 / t8 * 1e-9 / bw, t8 * 1e3 / 8, distinct);
    for (int e = 0; e < POOL + 2; e++) {
        expert_buf *eb = e < POOL ? &Q.pool[e] : &Q.shared[e - POOL];
        for (int m = 0; m < 3; m++) free(eb->w[m]), free(eb->s[m]);
    }
    free(Q.x), free(Q.y), free(Q.g), free(Q.u), free(Q.ws), free(Q.lws);
}

int dsv4_bench_layer(int argc, char **argv)
{
    int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    int quick = bench_opt_flag(argc, argv, "--quick");
    double peak = bench_fma_peak(threads);
    printf("dsv4 bench layer — %d thread(s), cpu isa %s; fp32 FMA peak (measured now): %.0f GFLOP/s\n\n", threads,
           dsv4_cpu_isa(), peak);
    dsv4_ctx *fast = NULL, *ref = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = threads}, orf = {.backend = "cpu-ref", .threads = threads};
    if (dsv4_ctx_create(&o, &fast) || dsv4_ctx_create(&orf, &ref)) die("contexts");
    const char *only = bench_opt_str(argc, argv, "--only", "");
    if (!*only || !strcmp(only, "mhc")) bench_mhc(fast, ref, threads, peak, quick);
    if (!*only || !strcmp(only, "router")) bench_router(fast, ref, threads, quick);
    if (!*only || !strcmp(only, "moe")) bench_moe(fast, threads, quick);
    dsv4_ctx_destroy(fast);
    dsv4_ctx_destroy(ref);
    if (*only || bench_opt_flag(argc, argv, "--no-indexer")) return 0;
    printf("---- indexer scoring (the indexer family's benchmark, `dsv4 bench indexer`) ----\n");
    return dsv4_bench_indexer(argc, argv);
}
