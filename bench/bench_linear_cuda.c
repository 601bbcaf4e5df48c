/* dsv4 bench linear-cuda: the linear layers of the cuda backend at V4-Flash shapes, every weight
 * format, M = 1, 2, 4, 8, 16, 64 (docs/kernels.md §5, §12). Effective weight GB/s (weight + scale
 * bytes of the checkpoint format / time per call, the activation staging included) next to the
 * device copy rate measured in the same run (cudaMemcpy device to device of 1 GiB, read + write
 * bytes counted). Every call of a timing reads another copy of the weights, and the copies
 * together are >= 512 MB (ten times the L2), so the weights come from HBM as in a decode step; a
 * timing is one CUDA graph of one call per copy, replayed 5 times, the median per call.
 * The MoE block for 1 and 8 tokens follows (moe_rows). Options: --quick (M = 1 and 16 only),
 * --only WORD (the cases whose name or format holds WORD; "moe": the MoE rows alone). */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef bench_linear_case lcase;

static const lcase cases[] = {
    {"wq_a 1024x4096", DSV4_LINEAR_FP8_B128, 1024, 4096, 1},
    {"wq_b 32768x1024", DSV4_LINEAR_FP8_B128, 32768, 1024, 1},
    {"wo_b 4096x8192", DSV4_LINEAR_FP8_B128, 4096, 8192, 1},
    {"shared exp 2048x4096", DSV4_LINEAR_FP8_B128, 2048, 4096, 1},
    {"routed exp w1 2048x4096", DSV4_LINEAR_FP4, 2048, 4096, 1},
    {"routed exp w2 4096x2048", DSV4_LINEAR_FP4, 4096, 2048, 1},
    {"6 experts' w1 12288x4096", DSV4_LINEAR_FP4, 12288, 4096, 1},
    {"wo_b 4096x8192", DSV4_LINEAR_MXFP8, 4096, 8192, 1},
    {"shared exp 2048x4096", DSV4_LINEAR_MXFP8, 2048, 4096, 1},
    {"wo_a 8x(1024x4096)", DSV4_LINEAR_BF16, 1024, 4096, 8},
    {"wo_b 4096x8192", DSV4_LINEAR_BF16, 4096, 8192, 1},
    {"4096x4096", DSV4_LINEAR_F32, 4096, 4096, 1},
};

enum { MMAX = 64, REPS = 5 };

static void die(const char *what)
{
    fprintf(stderr, "bench linear-cuda: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

/* One case's weights on the device: `copies` copies of weight + scale, random codes (no NaN),
 * scale bytes 118..124. */
typedef struct wset {
    int64_t rows, wcols, srows, scols;
    size_t wbytes, sbytes;
    int copies;
    uint8_t *w, *s;
} wset;

static void wset_make(dsv4_ctx *c, const lcase *lc, wset *ws)
{
    ws->rows = lc->n * lc->groups;
    ws->wcols = lc->fmt == DSV4_LINEAR_FP4 ? lc->k / 2 : lc->k;
    const int b128 = lc->fmt == DSV4_LINEAR_FP8_B128;
    ws->srows = b128 ? (ws->rows + 127) / 128 : ws->rows;
    ws->scols = b128 ? (lc->k + 127) / 128 : lc->k / 32;
    const size_t es = lc->fmt == DSV4_LINEAR_BF16 ? 2 : lc->fmt == DSV4_LINEAR_F32 ? 4 : 1;
    ws->wbytes = (size_t)(ws->rows * ws->wcols) * es;
    ws->sbytes = lc->fmt <= DSV4_LINEAR_FP4 ? (size_t)(ws->srows * ws->scols) : 0;
    const size_t min_total = (size_t)512 << 20;
    ws->copies = (int)((min_total + ws->wbytes - 1) / ws->wbytes);
    if (ws->copies < 4) ws->copies = 4;
    uint8_t *h = bench_alloc(ws->wbytes);
    bench_fill_random_u8(h, ws->wbytes, 7);
    if (lc->fmt == DSV4_LINEAR_BF16) {
        uint16_t *b = (uint16_t *)h;
        for (size_t i = 0; i < ws->wbytes / 2; i++) b[i] = (uint16_t)((b[i] & 0x807F) | (0x3C00 + ((b[i] >> 7) & 7) * 128));
    } else if (lc->fmt == DSV4_LINEAR_F32) {
        float *f = (float *)h;
        bench_fill_random_f32(f, ws->wbytes / 4, 9, 0.05f);
    } else if (lc->fmt != DSV4_LINEAR_FP4) {
        for (size_t i = 0; i < ws->wbytes; i++)
            if ((h[i] & 0x7F) == 0x7F) h[i] ^= 1;
    }
    uint8_t *hs = bench_alloc(ws->sbytes + 1);
    for (size_t i = 0; i < ws->sbytes; i++) hs[i] = (uint8_t)(118 + i % 7);
    ws->w = bench_device_alloc(c, ws->wbytes * (size_t)ws->copies);
    ws->s = bench_device_alloc(c, ws->sbytes * (size_t)ws->copies + 1);
    for (int i = 0; i < ws->copies; i++) {
        if (dsv4_device_upload(c, ws->w + ws->wbytes * (size_t)i, h, ws->wbytes)) die("upload");
        if (ws->sbytes && dsv4_device_upload(c, ws->s + ws->sbytes * (size_t)i, hs, ws->sbytes)) die("upload");
    }
    free(h);
    free(hs);
}

/* Seconds per call of graph g of `calls` calls: one warm-up replay, the median of REPS; g destroyed. */
static double graph_seconds(dsv4_ctx *c, dsv4_device_graph *g, int calls)
{
    dsv4_device_timer *tm = NULL;
    if (dsv4_device_timer_create(c, &tm)) die("timer");
    if (dsv4_device_graph_launch(g)) die("graph_launch");
    double v[REPS];
    for (int r = 0; r < REPS; r++) {
        double ms = 0;
        if (dsv4_device_timer_start(tm) || dsv4_device_graph_launch(g) || dsv4_device_timer_stop(tm) ||
            dsv4_device_timer_elapsed_ms(tm, &ms))
            die("timing");
        v[r] = ms * 1e-3 / calls;
    }
    dsv4_device_timer_destroy(tm);
    dsv4_device_graph_destroy(g);
    return bench_median(v, REPS);
}

/* Seconds per call at M = m: a graph of one call per copy, median of REPS replays. */
static double time_case(dsv4_ctx *c, const lcase *lc, const wset *ws, int64_t m, void *x, void *y, void *work,
                        size_t wsb)
{
    static const dsv4_dtype wdt[DSV4_LINEAR_FORMAT_COUNT] = {DSV4_F8_E4M3, DSV4_F8_E4M3, DSV4_FP4X2, DSV4_BF16, DSV4_F32};
    const int nd = lc->groups > 1 ? 3 : 2;
    const int64_t xs3[3] = {m, lc->groups, lc->k}, ys3[3] = {m, lc->groups, lc->n}, xs2[2] = {m, lc->k},
                  ys2[2] = {m, lc->n};
    dsv4_tensor tx = bench_device_view(x, DSV4_BF16, nd, nd == 3 ? xs3 : xs2), ty = bench_device_view(y, DSV4_BF16, nd, nd == 3 ? ys3 : ys2);
    const int64_t wshape[2] = {ws->rows, ws->wcols}, sshape[2] = {ws->srows, ws->scols};
    dsv4_device_graph *g = NULL;
    for (int pass = 0; pass < 2; pass++) { /* a plain pass first: errors surface outside the capture */
        if (pass && dsv4_device_graph_begin(c)) die("graph_begin");
        for (int i = 0; i < (pass ? ws->copies : 1); i++) {
            dsv4_tensor tw = bench_device_view(ws->w + ws->wbytes * (size_t)i, wdt[lc->fmt], 2, wshape);
            dsv4_tensor ts = bench_device_view(ws->s + ws->sbytes * (size_t)i, DSV4_E8M0, 2, sshape);
            const dsv4_tensor *sp = lc->fmt <= DSV4_LINEAR_FP4 ? &ts : NULL;
            dsv4_status st = nd == 3 ? dsv4_grouped_linear(c, lc->fmt, &tx, &tw, sp, &ty, work, wsb)
                                     : dsv4_linear(c, lc->fmt, &tx, &tw, sp, NULL, &ty, work, wsb);
            if (st) die("linear");
        }
        if (pass && dsv4_device_graph_end(c, &g)) die("graph_end");
    }
    return graph_seconds(c, g, ws->copies);
}

/* ---- the MoE block at V4-Flash sizes (dsv4_moe): 256 FP4 experts of w1, w3 [2048, 4096] and w2
 * [4096, 2048] over a pool of distinct copies, top 6, an FP8 shared expert of the same sizes. A
 * timing of T = 1 is a graph of MOE_CALLS calls, each routed to 6 experts no other call reads and
 * its own shared expert; T = 8 routes to 48 distinct experts (the whole pool, 612 MB: from HBM). */
enum { MOE_E = 256, MOE_TOPK = 6, MOE_D = 4096, MOE_I = 2048, MOE_POOL = 48, MOE_CALLS = 8 };

typedef struct moe_set {
    uint8_t *w, *s;                      /* [MOE_POOL routed + MOE_CALLS shared] x (w1, w3, w2) */
    dsv4_tensor tw[MOE_POOL + MOE_CALLS][3], ts[MOE_POOL + MOE_CALLS][3];
    dsv4_ffn_weights ex[MOE_E], sh[MOE_CALLS];
    size_t routed_bytes, shared_bytes; /* checkpoint bytes of one expert, weights + scales */
} moe_set;

static void moe_make(dsv4_ctx *c, moe_set *m)
{
    /* per matrix: rows, weight bytes per row, scale rows, scale columns (w1 = w3, then w2) */
    const int64_t fp4[2][4] = {{MOE_I, MOE_D / 2, MOE_I, MOE_D / 32}, {MOE_D, MOE_I / 2, MOE_D, MOE_I / 32}},
                  fp8[2][4] = {{MOE_I, MOE_D, MOE_I / 128, MOE_D / 128}, {MOE_D, MOE_I, MOE_D / 128, MOE_I / 128}};
    size_t wb[2][2], sbb[2][2], wexp[2] = {0, 0}, sexp[2] = {0, 0}; /* [routed/shared][w1/w2] */
    for (int kind = 0; kind < 2; kind++)
        for (int j = 0; j < 2; j++) {
            const int64_t *d = kind ? fp8[j] : fp4[j];
            wb[kind][j] = (size_t)(d[0] * d[1]), sbb[kind][j] = (size_t)(d[2] * d[3]);
            wexp[kind] += wb[kind][j] * (j ? 1 : 2), sexp[kind] += sbb[kind][j] * (j ? 1 : 2);
        }
    m->routed_bytes = wexp[0] + sexp[0], m->shared_bytes = wexp[1] + sexp[1];
    const size_t wall = MOE_POOL * wexp[0] + MOE_CALLS * wexp[1], sall = MOE_POOL * sexp[0] + MOE_CALLS * sexp[1];
    /* one host source for every upload: the largest matrix's weight bytes (the FP8 shared expert's)
     * and the largest scale bytes (the FP4 experts' 32-blocks: far more than the FP8 128-blocks) */
    size_t hb = 0, hsb = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int j = 0; j < 2; j++) {
            if (wb[kind][j] > hb) hb = wb[kind][j];
            if (sbb[kind][j] > hsb) hsb = sbb[kind][j];
        }
    uint8_t *h = bench_alloc(hb), *hs = bench_alloc(hsb);
    if (!h || !hs) die("host buffers");
    bench_fill_random_u8(h, hb, 11);
    for (size_t i = 0; i < hb; i++)
        if ((h[i] & 0x7F) == 0x7F) h[i] ^= 1; /* no E4M3 NaN */
    for (size_t i = 0; i < hsb; i++) hs[i] = (uint8_t)(118 + i % 7);
    m->w = bench_device_alloc(c, wall), m->s = bench_device_alloc(c, sall);
    size_t wo = 0, so = 0;
    for (int e = 0; e < MOE_POOL + MOE_CALLS; e++) {
        const int kind = e >= MOE_POOL;
        for (int j = 0; j < 3; j++) {
            const int64_t *d = kind ? fp8[j == 2] : fp4[j == 2];
            const int64_t ws[2] = {d[0], d[1]}, ss[2] = {d[2], d[3]};
            if (dsv4_device_upload(c, m->w + wo, h, wb[kind][j == 2]) ||
                dsv4_device_upload(c, m->s + so, hs, sbb[kind][j == 2]))
                die("upload");
            m->tw[e][j] = bench_device_view(m->w + wo, kind ? DSV4_F8_E4M3 : DSV4_FP4X2, 2, ws);
            m->ts[e][j] = bench_device_view(m->s + so, DSV4_E8M0, 2, ss);
            wo += wb[kind][j == 2], so += sbb[kind][j == 2];
        }
        const dsv4_ffn_weights f = {kind ? DSV4_LINEAR_FP8_B128 : DSV4_LINEAR_FP4,
                                    &m->tw[e][0], &m->ts[e][0], &m->tw[e][1], &m->ts[e][1], &m->tw[e][2], &m->ts[e][2]};
        if (kind) m->sh[e - MOE_POOL] = f;
        else
            for (int l = e; l < MOE_E; l += MOE_POOL) m->ex[l] = f; /* expert l reads pool copy l % MOE_POOL */
    }
    free(h), free(hs);
}

/* Seconds per call of T tokens (T * MOE_TOPK distinct experts per call, see above); *hash: FNV-1a
 * of the last call's y, so that two runs (say $DSV4_CUDA_MOE_FUSE 0 and 1) can be compared bit for bit. */
static double moe_time(dsv4_ctx *c, moe_set *m, int T, uint64_t *hash)
{
    const int calls = T == 1 ? MOE_CALLS : 2;
    int32_t ids[MOE_CALLS * 8 * MOE_TOPK];
    float wts[MOE_CALLS * 8 * MOE_TOPK];
    /* T = 1: call k routes to experts 6k .. 6k+5; T = 8: every call to experts 0 .. 47 */
    for (int i = 0; i < calls * T * MOE_TOPK; i++) ids[i] = i % MOE_POOL, wts[i] = 1.0f / MOE_TOPK;
    uint16_t *hx = bench_alloc((size_t)T * MOE_D * 2);
    float *fx = bench_alloc((size_t)T * MOE_D * 4);
    bench_fill_random_f32(fx, (size_t)T * MOE_D, 5, 1.0f);
    if (dsv4_encode_array(NULL, DSV4_FMT_BF16, fx, (int64_t)T * MOE_D, hx)) die("x");
    void *x = bench_device_alloc(c, (size_t)T * MOE_D * 2), *y = bench_device_alloc(c, (size_t)T * MOE_D * 2);
    void *di = bench_device_alloc(c, sizeof ids), *dw = bench_device_alloc(c, sizeof wts);
    if (dsv4_device_upload(c, x, hx, (size_t)T * MOE_D * 2) || dsv4_device_upload(c, di, ids, sizeof ids) ||
        dsv4_device_upload(c, dw, wts, sizeof wts))
        die("upload");
    size_t wsb = 0;
    if (dsv4_moe_workspace_size(c, T, MOE_TOPK, MOE_E, &m->ex[0], &m->sh[0], &wsb)) die("moe workspace");
    void *work = bench_device_alloc(c, wsb + 1);
    const int64_t xs[2] = {T, MOE_D}, ks[2] = {T, MOE_TOPK};
    dsv4_tensor tx = bench_device_view(x, DSV4_BF16, 2, xs), ty = bench_device_view(y, DSV4_BF16, 2, xs);
    dsv4_device_graph *g = NULL;
    for (int pass = 0; pass < 2; pass++) {
        if (pass && dsv4_device_graph_begin(c)) die("graph_begin");
        for (int k = 0; k < (pass ? calls : 1); k++) {
            const size_t o = (size_t)k * T * MOE_TOPK;
            dsv4_tensor ti = bench_device_view((int32_t *)di + o, DSV4_I32, 2, ks),
                        tw = bench_device_view((float *)dw + o, DSV4_F32, 2, ks);
            if (dsv4_moe(c, &tx, &ti, &tw, m->ex, MOE_E, &m->sh[k], 10.0f, &ty, work, wsb)) die("moe");
        }
        if (pass && dsv4_device_graph_end(c, &g)) die("graph_end");
    }
    const double t = graph_seconds(c, g, calls);
    if (dsv4_device_download(c, hx, y, (size_t)T * MOE_D * 2)) die("download");
    uint64_t hv = 1469598103934665603ull;
    for (size_t i = 0; i < (size_t)T * MOE_D; i++)
        hv = (hv ^ hx[i]) * 1099511628211ull;
    *hash = hv;
    dsv4_device_free(c, x), dsv4_device_free(c, y), dsv4_device_free(c, di), dsv4_device_free(c, dw);
    dsv4_device_free(c, work);
    free(hx), free(fx);
    return t;
}

/* Each row twice in one run: the routed experts' products as the environment picks them (the
 * streaming kernel for few rows by default), then on the tensor-core kernel alone
 * ($DSV4_CUDA_MOE_STREAM_ROWS = 0, src/backends/cuda/linear_cuda.cu), and whether the two gave
 * the same bits. */
static void moe_rows(dsv4_ctx *c, double copy)
{
    moe_set *m = bench_alloc(sizeof *m);
    moe_make(c, m);
    static const int toks[2] = {1, 8};
    const char *env = getenv("DSV4_CUDA_MOE_STREAM_ROWS");
    char *saved = env ? strdup(env) : NULL;
    uint64_t hash[2][2];
    for (int v = 0; v < 2; v++) {
        if (v) setenv("DSV4_CUDA_MOE_STREAM_ROWS", "0", 1);
        for (int i = 0; i < 2; i++) {
            const int T = toks[i];
            const double t = moe_time(c, m, T, &hash[v][i]),
                         bytes = (double)(T * MOE_TOPK * m->routed_bytes + m->shared_bytes);
            char name[64];
            snprintf(name, sizeof name, "moe %d of 256 + shared%s", T * MOE_TOPK, v ? " (mma)" : "");
            printf("%-26s %-8s %4d %10.2f %9.0f %7.1f%% %9s\n", name, "fp4+fp8", T, t * 1e6, bytes / t * 1e-9,
                   100.0 * bytes / t * 1e-9 / copy, "-");
        }
    }
    if (saved) setenv("DSV4_CUDA_MOE_STREAM_ROWS", saved, 1);
    else unsetenv("DSV4_CUDA_MOE_STREAM_ROWS");
    free(saved);
    printf("moe y (FNV-1a of the last call's BF16 output): 1 token %016llx, 8 tokens %016llx; (mma) rows %s\n",
           (unsigned long long)hash[0][0], (unsigned long long)hash[0][1],
           hash[0][0] == hash[1][0] && hash[0][1] == hash[1][1] ? "the same bits" : "OTHER BITS");
    dsv4_device_free(c, m->w), dsv4_device_free(c, m->s);
    free(m);
}

int dsv4_bench_linear_cuda(int argc, char **argv)
{
    const int quick = bench_opt_flag(argc, argv, "--quick");
    const char *only = bench_opt_str(argc, argv, "--only", NULL); /* cases whose name or format holds it */
    if (dsv4_backend_available("cuda") != DSV4_OK) {
        printf("bench linear-cuda: skipped: %s\n", dsv4_last_error());
        return 0;
    }
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = "cuda", .threads = 1};
    if (dsv4_ctx_create(&o, &c)) die("ctx");
    dsv4_device_info info;
    if (dsv4_device_info_get(c, &info)) die("info");
    const double copy = bench_device_copy_rate(c);
    printf("dsv4 bench linear-cuda — %s, %d SMs, L2 %.0f MB\n", info.name, info.multiprocessors,
           (double)info.l2_bytes / 1e6);
    printf("device copy (measured now, read + write): %.0f GB/s\n\n", copy);
    printf("%-26s %-8s %4s %10s %9s %8s %9s\n", "case", "format", "M", "us/call", "GB/s", "% copy", "TFLOP/s");
    static const int64_t ms_all[] = {1, 2, 4, 8, 16, 64}, ms_quick[] = {1, 16};
    const int64_t *ms = quick ? ms_quick : ms_all;
    const int nm = quick ? 2 : 6;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const lcase *lc = &cases[ci];
        if (only && !strstr(lc->name, only) && !strstr(dsv4_linear_format_name(lc->fmt), only)) continue;
        wset ws;
        wset_make(c, lc, &ws);
        const size_t nx = (size_t)(MMAX * lc->groups * lc->k), ny = (size_t)(MMAX * lc->groups * lc->n);
        uint16_t *hx = bench_alloc(nx * 2);
        float *fx = bench_alloc(nx * 4);
        bench_fill_random_f32(fx, nx, 3, 2.0f);
        if (dsv4_encode_array(NULL, DSV4_FMT_BF16, fx, (int64_t)nx, hx)) die("x");
        void *x = bench_device_alloc(c, nx * 2), *y = bench_device_alloc(c, ny * 2);
        if (dsv4_device_upload(c, x, hx, nx * 2)) die("upload");
        size_t wsb = 0;
        if (dsv4_linear_workspace_size(c, lc->fmt, MMAX * lc->groups, lc->k, &wsb)) die("workspace");
        void *work = bench_device_alloc(c, wsb + 1);
        for (int mi = 0; mi < nm; mi++) {
            const double t = time_case(c, lc, &ws, ms[mi], x, y, work, wsb);
            const double bytes = (double)(ws.wbytes + ws.sbytes), flop = 2.0 * ms[mi] * lc->n * lc->groups * lc->k;
            printf("%-26s %-8s %4lld %10.2f %9.0f %7.1f%% %9.2f\n", lc->name, dsv4_linear_format_name(lc->fmt),
                   (long long)ms[mi], t * 1e6, bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / copy, flop / t * 1e-12);
        }
        fflush(stdout);
        dsv4_device_free(c, x), dsv4_device_free(c, y), dsv4_device_free(c, work);
        dsv4_device_free(c, ws.w), dsv4_device_free(c, ws.s);
        free(hx), free(fx);
    }
    if (!only || !strcmp(only, "moe")) moe_rows(c, copy);
    printf("\nGB/s: weight + scale bytes of the checkpoint format per call (activation staging included, x and y\n"
           "BF16); %% copy: that rate over the device copy rate above. Weights from HBM: each call of a timing reads\n"
           "another copy (>= 512 MB in all); one CUDA graph per timing, median of %d replays. moe: one dsv4_moe of M\n"
           "tokens (grouping, stagings, SwiGLU, combine included), the bytes of the experts it reads (6 distinct per\n"
           "token) and of the shared expert.\n", REPS);
    dsv4_ctx_destroy(c);
    return 0;
}
