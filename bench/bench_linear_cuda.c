/* dsv4 bench linear-cuda: the linear layers of the cuda backend at V4-Flash shapes, every weight
 * format, M = 1, 2, 4, 8, 16, 64, 256, 1024, 4096 (docs/kernels.md §5, §12). Effective weight GB/s
 * (weight + scale bytes of the checkpoint format / time per call, the activation staging included)
 * next to the device copy rate measured in the same run (cudaMemcpy device to device of 1 GiB, read
 * + write bytes counted), and TFLOP/s, with --peak-tflops X (the bf16 matmul rate of the same run,
 * tests/gpu/run_gpu_tests.sh step matmul) as a share of it. Every call of a timing reads another
 * copy of the weights, and the copies together are >= 512 MB (ten times the L2), so the weights
 * come from HBM as in a decode step; a timing is one CUDA graph of one call per copy, replayed 5
 * times, the median per call. From M = 16 on, cuBLAS's BF16 GEMM (libcublas opened when the
 * benchmark runs; dsv4 does not link it) on a BF16 weight of the same N x K, timed the same way
 * without the graph (copies >= 512 MB, median of 5 passes), is the peer.
 * Options: --quick (M = 1 and 16 only), --m M (that M only), --only NAME (cases whose name or
 * format contains NAME), --peak-tflops X. */
#include "bench.h"
#include "dsv4.h"

#include <dlfcn.h>
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

enum { REPS = 5 };

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
    dsv4_device_timer *tm = NULL;
    if (dsv4_device_timer_create(c, &tm)) die("timer");
    if (dsv4_device_graph_launch(g)) die("graph_launch");
    double v[REPS];
    for (int r = 0; r < REPS; r++) {
        double ms = 0;
        if (dsv4_device_timer_start(tm) || dsv4_device_graph_launch(g) || dsv4_device_timer_stop(tm) ||
            dsv4_device_timer_elapsed_ms(tm, &ms))
            die("timing");
        v[r] = ms * 1e-3 / ws->copies;
    }
    dsv4_device_timer_destroy(tm);
    dsv4_device_graph_destroy(g);
    return bench_median(v, REPS);
}

/* ---- the cuBLAS peer: cublasGemmEx, BF16 in and out, FP32 compute, opened by name ---- */
typedef struct cublas_peer {
    void *handle;
    int (*set_stream)(void *h, void *stream);
    int (*gemm_ex)(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int at, int lda,
                   const void *b, int bt, int ldb, const void *beta, void *c, int ct, int ldc, int compute, int algo);
} cublas_peer;

/* 0 when no libcublas opens (the column is then "-"). */
static int cublas_open(dsv4_ctx *c, cublas_peer *p)
{
    static const char *const names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12"};
    memset(p, 0, sizeof *p);
    void *lib = NULL;
    for (size_t i = 0; !lib && i < sizeof names / sizeof names[0]; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    int (*create)(void **) = (int (*)(void **))dlsym(lib, "cublasCreate_v2");
    *(void **)&p->set_stream = dlsym(lib, "cublasSetStream_v2");
    *(void **)&p->gemm_ex = dlsym(lib, "cublasGemmEx");
    void *stream = NULL;
    if (!create || !p->set_stream || !p->gemm_ex || create(&p->handle) || dsv4_device_stream_get(c, &stream) ||
        p->set_stream(p->handle, stream))
        return 0;
    return 1;
}

/* Seconds per call of y [m, n] = x [m, k] W^T (W BF16 [n, k], row-major; cuBLAS's column-major
 * view: y^T = W x^T), cycling through `copies` copies of W; median of REPS passes. */
static double cublas_time(dsv4_ctx *c, const cublas_peer *p, const uint8_t *w, size_t wbytes, int copies, int64_t m,
                          int64_t n, int64_t k, const void *x, void *y)
{
    enum { OP_N = 0, OP_T = 1, R_16BF = 14, COMPUTE_32F = 68, GEMM_DEFAULT = -1 };
    const float one = 1.0f, zero = 0.0f;
    dsv4_device_timer *tm = NULL;
    if (dsv4_device_timer_create(c, &tm)) die("timer");
    double v[REPS];
    for (int r = -1; r < REPS; r++) { /* pass -1 warms up */
        if (r >= 0 && dsv4_device_timer_start(tm)) die("timing");
        for (int i = 0; i < copies; i++)
            if (p->gemm_ex(p->handle, OP_T, OP_N, (int)n, (int)m, (int)k, &one, w + wbytes * (size_t)i, R_16BF, (int)k, x,
                           R_16BF, (int)k, &zero, y, R_16BF, (int)n, COMPUTE_32F, GEMM_DEFAULT))
                die("cublasGemmEx");
        double ms = 0;
        if (r >= 0 && (dsv4_device_timer_stop(tm) || dsv4_device_timer_elapsed_ms(tm, &ms))) die("timing");
        if (r >= 0) v[r] = ms * 1e-3 / copies;
    }
    dsv4_device_timer_destroy(tm);
    return bench_median(v, REPS);
}

int dsv4_bench_linear_cuda(int argc, char **argv)
{
    const int quick = bench_opt_flag(argc, argv, "--quick"), only_m = bench_opt_int(argc, argv, "--m", 0);
    const char *only = bench_opt_str(argc, argv, "--only", NULL);
    const double peak = atof(bench_opt_str(argc, argv, "--peak-tflops", "0"));
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
    cublas_peer blas;
    const int have_blas = cublas_open(c, &blas);
    printf("dsv4 bench linear-cuda — %s, %d SMs, L2 %.0f MB\n", info.name, info.multiprocessors,
           (double)info.l2_bytes / 1e6);
    printf("device copy (measured now, read + write): %.0f GB/s\n", copy);
    if (peak > 0) printf("bf16 matmul peak (given): %.0f TFLOP/s\n", peak);
    printf("cuBLAS peer: %s\n\n", have_blas ? "cublasGemmEx BF16" : "none (libcublas did not open)");
    printf("%-26s %-8s %4s %10s %9s %8s %9s %7s %10s %9s\n", "case", "format", "M", "us/call", "GB/s", "% copy",
           "TFLOP/s", "% peak", "cuBLAS us", "TFLOP/s");
    static const int64_t ms_all[] = {1, 2, 4, 8, 16, 64, 256, 1024, 4096}, ms_quick[] = {1, 16};
    const int64_t *ms = only_m ? (const int64_t[]){only_m} : quick ? ms_quick : ms_all;
    const int nm = only_m ? 1 : quick ? 2 : (int)(sizeof ms_all / sizeof ms_all[0]);
    int64_t mmax = 1;
    for (int i = 0; i < nm; i++) mmax = ms[i] > mmax ? ms[i] : mmax;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const lcase *lc = &cases[ci];
        if (only && !strstr(lc->name, only) && !strstr(dsv4_linear_format_name(lc->fmt), only)) continue;
        wset ws;
        wset_make(c, lc, &ws);
        const size_t nx = (size_t)(mmax * lc->groups * lc->k), ny = (size_t)(mmax * lc->groups * lc->n);
        uint16_t *hx = bench_alloc(nx * 2);
        float *fx = bench_alloc(nx * 4);
        bench_fill_random_f32(fx, nx, 3, 2.0f);
        if (dsv4_encode_array(NULL, DSV4_FMT_BF16, fx, (int64_t)nx, hx)) die("x");
        free(fx);
        void *x = bench_device_alloc(c, nx * 2), *y = bench_device_alloc(c, ny * 2);
        if (dsv4_device_upload(c, x, hx, nx * 2)) die("upload");
        size_t wsb = 0;
        if (dsv4_linear_workspace_size(c, lc->fmt, mmax * lc->groups, lc->k, &wsb)) die("workspace");
        void *work = bench_device_alloc(c, wsb + 1);
        /* the peer's BF16 weights: copies of n x k values (random BF16 around 1) */
        const size_t bbytes = (size_t)(lc->n * lc->k) * 2;
        const int bneed = (int)((((size_t)512 << 20) + bbytes - 1) / bbytes), bcopies = bneed < 4 ? 4 : bneed;
        uint8_t *bw = NULL;
        if (have_blas && lc->groups == 1) {
            uint16_t *hb = bench_alloc(bbytes);
            bench_fill_random_u8((uint8_t *)hb, bbytes, 11);
            for (size_t i = 0; i < bbytes / 2; i++) hb[i] = (uint16_t)((hb[i] & 0x807F) | 0x3F00);
            bw = bench_device_alloc(c, bbytes * (size_t)bcopies);
            for (int i = 0; i < bcopies; i++)
                if (dsv4_device_upload(c, bw + bbytes * (size_t)i, hb, bbytes)) die("upload");
            free(hb);
        }
        for (int mi = 0; mi < nm; mi++) {
            const double t = time_case(c, lc, &ws, ms[mi], x, y, work, wsb);
            const double bytes = (double)(ws.wbytes + ws.sbytes), flop = 2.0 * ms[mi] * lc->n * lc->groups * lc->k;
            printf("%-26s %-8s %4lld %10.2f %9.0f %7.1f%% %9.2f", lc->name, dsv4_linear_format_name(lc->fmt),
                   (long long)ms[mi], t * 1e6, bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / copy, flop / t * 1e-12);
            if (peak > 0) printf(" %6.1f%%", 100.0 * flop / t * 1e-12 / peak);
            else printf(" %7s", "-");
            if (bw && ms[mi] >= 16) {
                const double tb = cublas_time(c, &blas, bw, bbytes, bcopies, ms[mi], lc->n, lc->k, x, y);
                printf(" %10.2f %9.2f\n", tb * 1e6, flop / tb * 1e-12);
            } else {
                printf(" %10s %9s\n", "-", "-");
            }
        }
        fflush(stdout);
        dsv4_device_free(c, x), dsv4_device_free(c, y), dsv4_device_free(c, work);
        dsv4_device_free(c, ws.w), dsv4_device_free(c, ws.s);
        if (bw) dsv4_device_free(c, bw);
        free(hx);
    }
    printf("\nGB/s: weight + scale bytes of the checkpoint format per call (activation staging included, x and y\n"
           "BF16); %% copy: that rate over the device copy rate above; %% peak: TFLOP/s over --peak-tflops. Weights\n"
           "from HBM: each call of a timing reads another copy (>= 512 MB in all); one CUDA graph per timing,\n"
           "median of %d replays. cuBLAS: cublasGemmEx on BF16 weights of the same N x K (not for the grouped\n"
           "case), copies >= 512 MB, median of %d passes.\n", REPS, REPS);
    dsv4_ctx_destroy(c);
    return 0;
}
