/* dsv4 bench attention-cuda: the sparse MLA decode of the cuda backend on the GPU, in one run:
 *   (1) FlashMLA's MODEL1 shapes (h 64/128, 2 queries per sequence, SWA 128 + compressed 512 or
 *       1024 entries, batch 64..256) in TFLOP/s (FLOP = 2*T*H*entries*1024);
 *   (2) V4-Flash decode shapes (H 64, T 1..128, SWA 128 + K 0/512): time per call and GB/s next
 *       to a device-to-device copy measured here;
 *   (3) the two-pass design (docs/kernels.md §3.4) built from this project's kernels (dequant_gather of every
 *       index into a BF16 workspace, then sparse_attn_bf16 over it), timed the same way.
 * Every timing replays a CUDA graph of NSETS calls over different random index sets drawn from a
 * 600 MB cache pool (so the entries come from HBM, not L2), median of 5 replays.
 * Both sections also time other kernels of the launcher on the same calls (--compare LIST, default
 * "ws1,v1": a context with cuda_decode forced to each; time / default time is printed), and section (1)
 * the mma.sync kernel (cuda_decode "mma-sync"). Options: --quick (fewer shapes), --peak-tflops X
 * (a bf16 matmul rate measured elsewhere in the same run, printed as a ratio). */
#include "bench.h"
#include "dsv4.h"
#include "formats/kv_entry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSETS 8
#define BS 64
#define NPAGES 16384 /* x 64 entries x 584 B: 613 MB */
#define WMAX 128
#define KMAX 1024
#define TMAX 512
#define HMAX 128

typedef struct {
    dsv4_ctx *ctx;
    dsv4_kv_cache cache;
    void *q, *sink, *out, *lse, *ws, *idx0, *idx1, *rows, *gslots, *pidx;
    size_t ws_bytes;
} bctx;

typedef struct {
    int t, h, w, k, two_pass;
} bshape;

static void die(const char *what)
{
    fprintf(stderr, "bench attention-cuda: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

/* One call of the fused decode (set s of the index arrays). */
static void fused_call(bctx *b, const bshape *s, int set)
{
    const int64_t qs[3] = {s->t, s->h, 512}, ls[2] = {s->t, s->h}, i0s[2] = {s->t, s->w}, i1s[2] = {s->t, s->k},
                  hs[1] = {s->h}, wss[1] = {(int64_t)b->ws_bytes};
    dsv4_tensor q = bench_device_view(b->q, DSV4_BF16, 3, qs), o = bench_device_view(b->out, DSV4_BF16, 3, qs), l = bench_device_view(b->lse, DSV4_F32, 2, ls),
                sk = bench_device_view(b->sink, DSV4_F32, 1, hs), w = bench_device_view(b->ws, DSV4_U8, 1, wss);
    /* index sets are [NSETS][TMAX][WMAX] and [NSETS][TMAX][KMAX]: row stride is the max width */
    const int64_t st0[2] = {WMAX, 1}, st1[2] = {KMAX, 1};
    dsv4_tensor i0, i1;
    dsv4_tensor_init_strided(&i0, (int32_t *)b->idx0 + (size_t)set * TMAX * WMAX, DSV4_I32, 2, i0s, st0);
    dsv4_tensor_init_strided(&i1, (int32_t *)b->idx1 + (size_t)set * TMAX * KMAX, DSV4_I32, 2, i1s, st1);
    i0.device = i1.device = DSV4_DEVICE_CUDA;
    dsv4_sparse_scope s0 = {&b->cache, &i0, NULL}, s1 = {&b->cache, &i1, NULL};
    if (dsv4_sparse_mla_decode(b->ctx, &q, &s0, s->k ? &s1 : NULL, &sk, 0.044194173824159216f, &o, &l, &w)) die("decode");
}

/* The two passes of the two-pass design (docs/kernels.md §3.4): gather all t*(w+k) indices of the set
 * into BF16 rows, attend over them. */
static void two_pass_call(bctx *b, const bshape *s, int set)
{
    int64_t e = s->w + s->k, n = (int64_t)s->t * e;
    const int64_t gs[1] = {n}, rs[2] = {n, 512}, qs[3] = {s->t, s->h, 512}, ls[2] = {s->t, s->h}, ps[2] = {s->t, e},
                  hs[1] = {s->h}, wss[1] = {(int64_t)b->ws_bytes};
    dsv4_tensor g = bench_device_view((int32_t *)b->gslots + (size_t)set * TMAX * (WMAX + KMAX), DSV4_I32, 1, gs),
                rows = bench_device_view(b->rows, DSV4_BF16, 2, rs), q = bench_device_view(b->q, DSV4_BF16, 3, qs),
                o = bench_device_view(b->out, DSV4_BF16, 3, qs), l = bench_device_view(b->lse, DSV4_F32, 2, ls),
                p = bench_device_view(b->pidx, DSV4_I32, 2, ps), sk = bench_device_view(b->sink, DSV4_F32, 1, hs),
                w = bench_device_view(b->ws, DSV4_U8, 1, wss);
    if (dsv4_dequant_gather(b->ctx, &b->cache, &g, &rows)) die("dequant_gather");
    if (dsv4_sparse_attn_bf16(b->ctx, &q, &rows, &p, NULL, &sk, 0.044194173824159216f, &o, &l, &w)) die("attn_bf16");
}

/* Median microseconds per call: a graph of NSETS calls, replayed 5 times after a warm-up. */
static double time_us(bctx *b, const bshape *s, int two_pass)
{
    dsv4_device_graph *g = NULL;
    if (dsv4_device_graph_begin(b->ctx)) die("graph_begin");
    for (int set = 0; set < NSETS; set++) (two_pass ? two_pass_call : fused_call)(b, s, set);
    if (dsv4_device_graph_end(b->ctx, &g)) die("graph_end");
    dsv4_device_timer *tm = NULL;
    if (dsv4_device_timer_create(b->ctx, &tm)) die("timer");
    if (dsv4_device_graph_launch(g)) die("graph_launch");
    double v[5];
    for (int r = 0; r < 5; r++) {
        double ms = 0;
        if (dsv4_device_timer_start(tm) || dsv4_device_graph_launch(g) || dsv4_device_timer_stop(tm) ||
            dsv4_device_timer_elapsed_ms(tm, &ms))
            die("timing");
        v[r] = ms * 1e3 / NSETS;
    }
    dsv4_device_timer_destroy(tm);
    dsv4_device_graph_destroy(g);
    return bench_median(v, 5);
}

static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* 64 random pages of valid entries (codes without NaN, scale bytes 117..123, RoPE ~ +-0.5),
 * uploaded in turn over the whole pool. */
static void fill_pool(dsv4_ctx *c, uint8_t *pool, int64_t page_bytes)
{
    enum { TEMPLATES = 64 };
    uint8_t *h = bench_alloc((size_t)TEMPLATES * page_bytes);
    bench_fill_random_u8(h, (size_t)TEMPLATES * page_bytes, 7);
    float *f = bench_alloc(64 * sizeof(float));
    for (int p = 0; p < TEMPLATES; p++)
        for (int r = 0; r < BS; r++) {
            uint8_t *e = h + p * page_bytes + dsv4_kve_row_data(r), *s = h + p * page_bytes + dsv4_kve_row_scale(BS, r);
            for (int k = 0; k < DSV4_KVE_NOPE_DIM; k++)
                if ((e[k] & 0x7F) == 0x7F) e[k] ^= 1;
            bench_fill_random_f32(f, DSV4_KVE_ROPE_DIM, (uint64_t)(p * BS + r) + 99, 0.5f);
            for (int k = 0; k < DSV4_KVE_ROPE_DIM; k++) {
                uint16_t b = bf16_bits(f[k]);
                memcpy(e + DSV4_KVE_NOPE_BYTES + 2 * k, &b, 2);
            }
            for (int k = 0; k < DSV4_KVE_GROUPS; k++) s[k] = (uint8_t)(117 + s[k] % 7);
            s[DSV4_KVE_GROUPS] = 0;
        }
    for (int64_t p = 0; p < NPAGES; p += TEMPLATES)
        if (dsv4_device_upload(c, pool + p * page_bytes, h, (size_t)TEMPLATES * page_bytes)) die("upload pool");
    free(f);
    free(h);
}

static uint64_t rng = 12345;
static uint32_t rnd32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

int dsv4_bench_attention_cuda(int argc, char **argv)
{
    int quick = bench_opt_flag(argc, argv, "--quick");
    double peak = atof(bench_opt_str(argc, argv, "--peak-tflops", "0"));
    char cmp_list[128], *cmp[8];
    int ncmp = 0;
    snprintf(cmp_list, sizeof cmp_list, "%s", bench_opt_str(argc, argv, "--compare", "ws1,v1"));
    for (char *tok = strtok(cmp_list, ","); tok && ncmp < 8; tok = strtok(NULL, ",")) cmp[ncmp++] = tok;
    if (dsv4_backend_available("cuda") != DSV4_OK) {
        printf("bench attention-cuda: skipped: %s\n", dsv4_last_error());
        return 0;
    }
    bctx b = {0};
    dsv4_ctx_options o = {.backend = "cuda", .threads = 1};
    if (dsv4_ctx_create(&o, &b.ctx)) die("ctx");
    /* the same calls on other kernels of the launcher: contexts with a forced cuda_decode */
    dsv4_ctx *cmp_ctx[8], *mma_ctx = NULL, *main_ctx = b.ctx;
    for (int v = 0; v < ncmp; v++) {
        dsv4_ctx_options oc = {.backend = "cuda", .threads = 1, .cuda_decode = cmp[v]};
        if (dsv4_ctx_create(&oc, &cmp_ctx[v])) die("ctx (--compare)");
    }
    dsv4_ctx_options om = {.backend = "cuda", .threads = 1, .cuda_decode = "mma-sync"};
    if (dsv4_ctx_create(&om, &mma_ctx)) die("ctx (mma-sync)");
    dsv4_device_info info;
    if (dsv4_device_info_get(b.ctx, &info)) die("info");
    double copy = bench_device_copy_rate(b.ctx);
    printf("dsv4 bench attention-cuda — %s, %d SMs, L2 %.0f MB\n", info.name, info.multiprocessors,
           (double)info.l2_bytes / 1e6);
    printf("device copy (measured now, read + write): %.0f GB/s", copy);
    if (peak > 0) printf("; bf16 matmul (given): %.0f TFLOP/s", peak);
    printf("\n\n");

    /* buffers, sized for the largest shape */
    int64_t pb = dsv4_kv_page_bytes(BS);
    uint8_t *pool = bench_device_alloc(b.ctx, (size_t)NPAGES * pb);
    fill_pool(b.ctx, pool, pb);
    if (dsv4_kv_cache_view(&b.cache, pool, NPAGES, BS, DSV4_DEVICE_CUDA, 0)) die("cache view");
    const int64_t slots = (int64_t)NPAGES * BS;
    size_t nq = (size_t)TMAX * HMAX * 512;
    uint16_t *hq = malloc(nq * 2);
    float *fq = malloc(512 * sizeof(float));
    for (size_t i = 0; i < nq; i += 512) {
        bench_fill_random_f32(fq, 512, i + 1, 0.5f);
        for (int k = 0; k < 512; k++) hq[i + k] = bf16_bits(fq[k]);
    }
    b.q = bench_device_alloc(b.ctx, nq * 2);
    dsv4_device_upload(b.ctx, b.q, hq, nq * 2);
    float hs[HMAX];
    bench_fill_random_f32(hs, HMAX, 5, 1.0f);
    b.sink = bench_device_alloc(b.ctx, sizeof hs);
    dsv4_device_upload(b.ctx, b.sink, hs, sizeof hs);
    b.out = bench_device_alloc(b.ctx, nq * 2);
    b.lse = bench_device_alloc(b.ctx, (size_t)TMAX * HMAX * 4);
    size_t n0 = (size_t)NSETS * TMAX * WMAX, n1 = (size_t)NSETS * TMAX * KMAX, ng = n0 + n1;
    int32_t *i0 = malloc(n0 * 4), *i1 = malloc(n1 * 4), *gs = malloc(ng * 4), *pi = malloc((size_t)TMAX * (WMAX + KMAX) * 4);
    for (size_t i = 0; i < n0; i++) i0[i] = (int32_t)(rnd32() % slots);
    for (size_t i = 0; i < n1; i++) i1[i] = (int32_t)(rnd32() % slots);
    b.idx0 = bench_device_alloc(b.ctx, n0 * 4);
    b.idx1 = bench_device_alloc(b.ctx, n1 * 4);
    dsv4_device_upload(b.ctx, b.idx0, i0, n0 * 4);
    dsv4_device_upload(b.ctx, b.idx1, i1, n1 * 4);
    b.gslots = bench_device_alloc(b.ctx, ng * 4);
    b.pidx = bench_device_alloc(b.ctx, (size_t)TMAX * (WMAX + KMAX) * 4);
    b.rows = bench_device_alloc(b.ctx, (size_t)TMAX * (WMAX + KMAX) * 1024);

    bshape model1[12], decode[8];
    int nm = 0, nd = 0;
    const int hh[2] = {64, 128}, kk[2] = {512, 1024}, bb[3] = {64, 128, 256};
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++)
            for (int d = 0; d < 3; d++)
                if (!quick || d == 1) model1[nm++] = (bshape){2 * bb[d], hh[a], 128, kk[c], 0};
    const int tt[4] = {1, 8, 64, 128}, kd[2] = {512, 0};
    for (int c = 0; c < 2; c++)
        for (int a = 0; a < 4; a++)
            if (!quick || a != 2) decode[nd++] = (bshape){tt[a], 64, 128, kd[c], 1};
    size_t wsmax = 0;
    for (int i = 0; i < nm + nd; i++) {
        const bshape *s = i < nm ? &model1[i] : &decode[i - nm];
        size_t w = 0;
        if (dsv4_sparse_mla_decode_workspace(b.ctx, s->t, s->h, s->w, s->k, &w)) die("workspace");
        if (w > wsmax) wsmax = w;
        w = 0;
        if (dsv4_sparse_mla_decode_workspace(b.ctx, s->t, s->h, s->w + s->k, 0, &w)) die("workspace");
        if (w > wsmax) wsmax = w;
    }
    b.ws_bytes = wsmax ? wsmax : 1;
    b.ws = bench_device_alloc(b.ctx, b.ws_bytes);

    /* two-pass gather slots per set: token t's SWA indices then its compressed ones; the BF16
     * attention then reads rows t*(w+k) + j (built per shape below) */
    printf("(1) FlashMLA MODEL1 shapes: 2 queries per sequence, SWA 128 + compressed K entries\n");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            printf("%5s %5s %5s %5s %10s %9s %8s", "h", "batch", "T", "K", "us/call", "TFLOP/s", "% peak");
        else {
            printf("\n(2) V4-Flash decode shapes: H 64, SWA 128 + K compressed entries\n");
            printf("%5s %5s %10s %9s %9s %9s", "T", "K", "us/call", "GB/s", "% copy", "TFLOP/s");
        }
        for (int v = 0; v < ncmp; v++) printf(" %7s us %6s", cmp[v], "x");
        printf(" %12s %9s%s\n", "two-pass us", "ratio", pass ? "" : "  mma.sync us");
        int n = pass ? nd : nm;
        for (int i = 0; i < n; i++) {
            bshape *s = pass ? &decode[i] : &model1[i];
            int64_t e = s->w + s->k;
            for (int set = 0; set < NSETS; set++)
                for (int t = 0; t < s->t; t++) {
                    int32_t *g = gs + (size_t)set * TMAX * (WMAX + KMAX) + (size_t)t * e;
                    memcpy(g, i0 + ((size_t)set * TMAX + t) * WMAX, (size_t)s->w * 4);
                    if (s->k) memcpy(g + s->w, i1 + ((size_t)set * TMAX + t) * KMAX, (size_t)s->k * 4);
                }
            for (int64_t j = 0; j < (int64_t)s->t * e; j++) pi[j] = (int32_t)j;
            dsv4_device_upload(b.ctx, b.gslots, gs, ng * 4);
            dsv4_device_upload(b.ctx, b.pidx, pi, (size_t)s->t * e * 4);
            double us = time_us(&b, s, 0), alt[8];
            for (int v = 0; v < ncmp; v++) { /* the same calls on another kernel of the launcher */
                b.ctx = cmp_ctx[v];
                alt[v] = time_us(&b, s, 0);
                b.ctx = main_ctx;
            }
            double tp = (pass || !quick) ? time_us(&b, s, 1) : 0, mma = 0;
            if (!pass) { /* the same call on the mma.sync kernel (the warpgroup-MMA one is the default) */
                b.ctx = mma_ctx;
                mma = time_us(&b, s, 0);
                b.ctx = main_ctx;
            }
            double flop = 2.0 * s->t * s->h * (double)e * 1024;
            double bytes = (double)s->t * e * (DSV4_KVE_ENTRY_BYTES + 4) + 2.0 * s->t * s->h * 1024;
            if (!pass)
                printf("%5d %5d %5d %5d %10.1f %9.1f %8.1f", s->h, s->t / 2, s->t, s->k, us, flop / us * 1e-6,
                       peak > 0 ? 100.0 * flop / us * 1e-6 / peak : 0.0);
            else
                printf("%5d %5d %10.1f %9.0f %9.1f %9.1f", s->t, s->k, us, bytes / us * 1e-3,
                       100.0 * bytes / us * 1e-3 / copy, flop / us * 1e-6);
            for (int v = 0; v < ncmp; v++) printf(" %10.1f %6.2f", alt[v], alt[v] / us);
            printf(" %12.1f %9.2f", tp, tp > 0 ? tp / us : 0.0);
            if (!pass) printf(" %12.1f", mma);
            printf("\n");
        }
    }
    printf("\nx = that kernel's time / the default's; ratio = two-pass time / fused time (same run, same\n"
           "inputs). %% copy compares the bytes one call\n"
           "must move (584 B + a 4-byte index per entry, q and out) with the measured device copy rate.\n");
    free(hq), free(fq), free(i0), free(i1), free(gs), free(pi);
    for (int v = 0; v < ncmp; v++) dsv4_ctx_destroy(cmp_ctx[v]);
    dsv4_ctx_destroy(mma_ctx);
    dsv4_ctx_destroy(b.ctx);
    return 0;
}
