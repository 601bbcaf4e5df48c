/* dsv4 bench linear: quantized linear layers at the V4-Flash shapes (docs/kernels.md §5), M = 1, 2, 4, 8.
 * Effective weight GB/s (weight + scale bytes of the checkpoint format / time per call) next to
 * the read bandwidth measured in the same run, GFLOP/s next to the FMA peak, and OpenBLAS
 * sgemv (M = 1) / sgemm on the same weights dequantized to F32, timed in the same run (OpenBLAS,
 * or another CBLAS, is opened when the benchmark runs: dsv4 is not linked with it). Every call
 * reads a different copy of the weights, and the copies together exceed twice the last-level
 * cache, so the weights come from memory as in a decode step. */
#include "bench.h"
#include "dsv4.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The peer: CBLAS (row-major = 101, no transpose = 111, transpose = 112) of the first library of
 * `blas_names` that loads; sgemv NULL when none does. */
static struct blas {
    void (*sgemv)(int order, int trans, int m, int n, float alpha, const float *a, int lda, const float *x, int incx,
                  float beta, float *y, int incy);
    void (*sgemm)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc);
    void (*set_threads)(int n);  /* OpenBLAS only */
    char *(*get_config)(void);   /* OpenBLAS only */
    const char *file;
} blas;

static void blas_open(void)
{
    static const char *const blas_names[] = {"libopenblas.so.0", "libopenblas.so", "libcblas.so.3", "libblas.so.3"};
    for (size_t i = 0; i < sizeof blas_names / sizeof blas_names[0]; i++) {
        void *h = dlopen(blas_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        *(void **)&blas.sgemv = dlsym(h, "cblas_sgemv");
        *(void **)&blas.sgemm = dlsym(h, "cblas_sgemm");
        if (!blas.sgemv || !blas.sgemm) {
            blas.sgemv = NULL;
            dlclose(h);
            continue;
        }
        *(void **)&blas.set_threads = dlsym(h, "openblas_set_num_threads");
        *(void **)&blas.get_config = dlsym(h, "openblas_get_config");
        blas.file = blas_names[i];
        return;
    }
}

typedef bench_linear_case lcase;

static const lcase cases[] = {
    {"wq_a 1024x4096", DSV4_LINEAR_FP8_B128, 1024, 4096, 1},
    {"wq_b 32768x1024", DSV4_LINEAR_FP8_B128, 32768, 1024, 1},
    {"wkv 512x4096", DSV4_LINEAR_FP8_B128, 512, 4096, 1},
    {"wo_b 4096x8192", DSV4_LINEAR_FP8_B128, 4096, 8192, 1},
    {"wo_a 8x(1024x4096)", DSV4_LINEAR_FP8_B128, 1024, 4096, 8},
    {"wo_a 8x(1024x4096)", DSV4_LINEAR_BF16, 1024, 4096, 8},
    {"shared exp 2048x4096", DSV4_LINEAR_FP8_B128, 2048, 4096, 1},
    {"routed exp 2048x4096", DSV4_LINEAR_FP4, 2048, 4096, 1},
    {"wq_a 1024x4096", DSV4_LINEAR_MXFP8, 1024, 4096, 1},
    {"wo_b 4096x8192", DSV4_LINEAR_MXFP8, 4096, 8192, 1},
    {"shared exp 2048x4096", DSV4_LINEAR_MXFP8, 2048, 4096, 1},
};

static void die(const char *what)
{
    fprintf(stderr, "bench linear: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

/* One case's weights: `copies` distinct copies of weight + scale, and a view of copy c. */
typedef struct wset {
    dsv4_linear_format fmt;
    int64_t rows, k, wcols, srows, scols; /* rows = groups * n */
    size_t wbytes, sbytes;
    int copies;
    uint8_t *w, *s;
} wset;

static void wset_init(wset *ws, const lcase *c, size_t min_total)
{
    ws->fmt = c->fmt;
    ws->rows = c->n * c->groups;
    ws->k = c->k;
    ws->wcols = c->fmt == DSV4_LINEAR_FP4 ? c->k / 2 : c->k;
    const int b128 = c->fmt == DSV4_LINEAR_FP8_B128;
    ws->srows = b128 ? (ws->rows + 127) / 128 : ws->rows;
    ws->scols = b128 ? (c->k + 127) / 128 : c->k / 32;
    const size_t es = c->fmt == DSV4_LINEAR_BF16 ? 2 : c->fmt == DSV4_LINEAR_F32 ? 4 : 1;
    ws->wbytes = (size_t)(ws->rows * ws->wcols) * es;
    ws->sbytes = c->fmt <= DSV4_LINEAR_FP4 ? (size_t)(ws->srows * ws->scols) : 0;
    ws->copies = (int)((min_total + ws->wbytes - 1) / ws->wbytes);
    if (ws->copies < 2) ws->copies = 2;
    ws->w = bench_alloc(ws->wbytes * (size_t)ws->copies);
    ws->s = bench_alloc(ws->sbytes * (size_t)ws->copies + 1);
    if (!ws->w || !ws->s) {
        fprintf(stderr, "bench linear: out of memory\n");
        exit(1);
    }
    bench_fill_random_u8(ws->w, ws->wbytes * (size_t)ws->copies, 7);
    if (c->fmt == DSV4_LINEAR_BF16) { /* finite BF16 around 1: random sign and mantissa, exponent 120..127 */
        uint16_t *h = (uint16_t *)ws->w;
        for (size_t i = 0; i < ws->wbytes * (size_t)ws->copies / 2; i++) h[i] = (uint16_t)((h[i] & 0x807F) | (0x3C00 + ((h[i] >> 7) & 7) * 128));
    } else if (c->fmt != DSV4_LINEAR_FP4) {
        for (size_t i = 0; i < ws->wbytes * (size_t)ws->copies; i++)
            if ((ws->w[i] & 0x7F) == 0x7F) ws->w[i] ^= 1; /* no NaN codes */
    }
    for (size_t i = 0; i < ws->sbytes * (size_t)ws->copies; i++) ws->s[i] = (uint8_t)(118 + i % 7);
}

static void wset_view(const wset *ws, int copy, dsv4_tensor *w, dsv4_tensor *s)
{
    const int64_t wshape[2] = {ws->rows, ws->wcols}, sshape[2] = {ws->srows, ws->scols};
    static const dsv4_dtype wdt[DSV4_LINEAR_FORMAT_COUNT] = {DSV4_F8_E4M3, DSV4_F8_E4M3, DSV4_FP4X2, DSV4_BF16, DSV4_F32};
    dsv4_tensor_init(w, ws->w + ws->wbytes * (size_t)copy, wdt[ws->fmt], 2, wshape);
    dsv4_tensor_init(s, ws->s + ws->sbytes * (size_t)copy, DSV4_E8M0, 2, sshape);
}

/* Copy 0 dequantized to F32 [rows, k], replicated into `copies` copies. */
static float *wset_f32(dsv4_ctx *ctx, const wset *ws, int copies)
{
    const size_t n = (size_t)(ws->rows * ws->k);
    float *f = bench_alloc(n * 4 * (size_t)copies);
    if (!f) {
        fprintf(stderr, "bench linear: out of memory\n");
        exit(1);
    }
    dsv4_tensor w, s, o;
    wset_view(ws, 0, &w, &s);
    const int64_t oshape[2] = {ws->rows, ws->k};
    dsv4_tensor_init(&o, f, DSV4_F32, 2, oshape);
    dsv4_status st;
    if (ws->fmt == DSV4_LINEAR_MXFP8) {
        st = dsv4_dequantize(ctx, DSV4_QRULE_MX32, &w, &s, &o);
    } else if (ws->fmt == DSV4_LINEAR_BF16) {
        st = dsv4_decode_array(ctx, DSV4_FMT_BF16, ws->w, (int64_t)n, f);
    } else {
        st = dsv4_dequantize_weight(ctx, &w, &s, &o);
    }
    if (st) die("dequantize");
    for (int c = 1; c < copies; c++) memcpy(f + n * (size_t)c, f, n * 4);
    return f;
}

/* One measured line. */
typedef struct result {
    const lcase *c;
    int64_t m;
    double t, t_blas; /* best seconds per call; t_blas < 0: no peer */
    double bytes, flops, blas_bytes;
} result;

/* Best time of OpenBLAS on the F32 copies: sgemv for M = 1, sgemm otherwise, one call per group. */
static double time_blas(const lcase *c, const float *wf, int fcopies, int64_t m, const float *xf, float *yf)
{
    const int64_t kx = c->k * c->groups, ny = c->n * c->groups;
    const int reps = fcopies * 2 < 8 ? 8 : fcopies * 2;
    double best = 1e30;
    for (int r = -1; r < reps; r++) {
        const float *wb = wf + (size_t)(ny * c->k) * (size_t)((r + fcopies) % fcopies);
        const double t0 = bench_now();
        for (int64_t g = 0; g < c->groups; g++) {
            const float *wg = wb + (size_t)(g * c->n * c->k);
            if (m == 1)
                blas.sgemv(101, 111, (int)c->n, (int)c->k, 1.0f, wg, (int)c->k, xf + g * c->k, 1, 0.0f, yf + g * c->n, 1);
            else
                blas.sgemm(101, 111, 112, (int)m, (int)c->n, (int)c->k, 1.0f, xf + g * c->k, (int)kx, wg, (int)c->k,
                            0.0f, yf + g * c->n, (int)ny);
        }
        const double dt = bench_now() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    return best;
}

/* Best time of dsv4 on the quantized copies. */
static double time_dsv4(dsv4_ctx *ctx, const lcase *c, const wset *ws, int64_t m, uint16_t *x, uint16_t *y, void *work,
                        size_t wsb)
{
    dsv4_tensor tx, ty, tw, tsc;
    const int64_t xs[3] = {m, c->groups, c->k}, ys[3] = {m, c->groups, c->n};
    const int nd = c->groups > 1 ? 3 : 2;
    const int64_t xs2[2] = {m, c->k}, ys2[2] = {m, c->n};
    dsv4_tensor_init(&tx, x, DSV4_BF16, nd, nd == 3 ? xs : xs2);
    dsv4_tensor_init(&ty, y, DSV4_BF16, nd, nd == 3 ? ys : ys2);
    const int reps = ws->copies * 2 < 12 ? 12 : ws->copies * 2;
    double best = 1e30;
    for (int r = -1; r < reps; r++) {
        wset_view(ws, (r + ws->copies) % ws->copies, &tw, &tsc);
        const dsv4_tensor *sp = c->fmt <= DSV4_LINEAR_FP4 ? &tsc : NULL;
        const double t0 = bench_now();
        dsv4_status st = nd == 3 ? dsv4_grouped_linear(ctx, c->fmt, &tx, &tw, sp, &ty, work, wsb)
                                 : dsv4_linear(ctx, c->fmt, &tx, &tw, sp, NULL, &ty, work, wsb);
        if (st) die("linear");
        const double dt = bench_now() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    return best;
}

/* Every M of one case. */
static int run_case(dsv4_ctx *ctx, const lcase *c, size_t min_total, result *out)
{
    static const int64_t ms[] = {1, 2, 4, 8};
    wset ws;
    wset_init(&ws, c, min_total);
    const int64_t mmax = 8, kx = c->k * c->groups, ny = c->n * c->groups;
    uint16_t *x = bench_alloc((size_t)(mmax * kx) * 2), *y = bench_alloc((size_t)(mmax * ny) * 2);
    float *xf = bench_alloc((size_t)(mmax * kx) * 4), *yf = bench_alloc((size_t)(mmax * ny) * 4);
    bench_fill_random_f32(xf, (size_t)(mmax * kx), 3, 2.0f);
    if (dsv4_encode_array(ctx, DSV4_FMT_BF16, xf, mmax * kx, x)) die("x");
    for (int64_t i = 0; i < mmax * kx; i++) xf[i] = dsv4_bf16_decode(x[i]); /* the same x for the peer */
    size_t wsb = 0;
    if (dsv4_linear_workspace_size(ctx, c->fmt, mmax * c->groups, c->k, &wsb)) die("workspace");
    void *work = bench_alloc(wsb + 1);
    const size_t f32_bytes = (size_t)(ws.rows * ws.k) * 4;
    int fcopies = (int)((min_total + f32_bytes - 1) / f32_bytes);
    if (fcopies < 2) fcopies = 2;
    float *wf = blas.sgemv ? wset_f32(ctx, &ws, fcopies) : NULL;
    for (int mi = 0; mi < 4; mi++) {
        result *r = &out[mi];
        r->c = c;
        r->m = ms[mi];
        r->t = time_dsv4(ctx, c, &ws, r->m, x, y, work, wsb);
        r->bytes = (double)(ws.wbytes + ws.sbytes);
        r->flops = 2.0 * (double)(r->m * ny * c->k);
        r->blas_bytes = (double)f32_bytes;
        r->t_blas = wf ? time_blas(c, wf, fcopies, r->m, xf, yf) : -1.0;
    }
    free(wf);
    free(ws.w);
    free(ws.s);
    free(x);
    free(y);
    free(xf);
    free(yf);
    free(work);
    return 4;
}

int dsv4_bench_linear(int argc, char **argv)
{
    const int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    const int quick = bench_opt_flag(argc, argv, "--quick");
    const char *only = bench_opt_str(argc, argv, "--only", NULL); /* the cases whose name or format has it */
    /* the copies of a case: more than twice the last-level cache, so every call reads from memory */
    size_t min_total = quick ? ((size_t)96 << 20) : ((size_t)256 << 20);
    if (min_total < 2 * bench_llc_bytes()) min_total = 2 * bench_llc_bytes();
    const size_t bw_bytes = quick ? ((size_t)256 << 20) : ((size_t)1 << 30);

    /* The machine is shared: read bandwidth before and after, the higher one is the roofline. */
    const double bw0 = bench_read_bandwidth(bw_bytes, threads, 5);
    const double peak = bench_fma_peak(threads);
    blas_open();
    if (blas.set_threads) blas.set_threads(threads);
    dsv4_ctx *ctx = NULL;
    const dsv4_ctx_options o = {.backend = "cpu", .threads = threads};
    if (dsv4_ctx_create(&o, &ctx)) die("context");
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    result *res = calloc((size_t)ncases * 4, sizeof(result));
    int nres = 0;
    for (int ci = 0; ci < ncases; ci++) {
        const lcase *c = &cases[ci];
        if (only && !strstr(c->name, only) && strcmp(dsv4_linear_format_name(c->fmt), only)) continue;
        nres += run_case(ctx, c, min_total, res + nres);
    }
    dsv4_ctx_destroy(ctx);
    const double bw1 = bench_read_bandwidth(bw_bytes, threads, 5), bw = bw0 > bw1 ? bw0 : bw1;

    printf("dsv4 bench linear — %d thread(s), cpu isa %s\n", threads, dsv4_cpu_isa());
    printf("memory read bandwidth (measured before / after): %.1f / %.1f GB/s, %%read uses %.1f; "
           "fp32 FMA peak: %.0f GFLOP/s\n", bw0, bw1, bw, peak);
    if (blas.sgemv)
        printf("peer: %s (%s), sgemv (M = 1) / sgemm on the weights dequantized to F32\n",
               blas.get_config ? blas.get_config() : "a CBLAS that is not OpenBLAS", blas.file);
    else
        printf("peer: none (no CBLAS library found: libopenblas.so.0, libcblas.so.3 or libblas.so.3)\n");
    printf("GB/s = weight + scale bytes of the format / best time per call; each call reads another copy (> L3)\n\n");
    printf("%-21s %-8s %2s %9s %8s %6s %8s %6s %9s %9s %8s\n", "weight", "format", "M", "us/call", "GB/s", "%read",
           "GFLOP/s", "%peak", "blas us", "blas GB/s", "speedup");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        const double gbs = r->bytes / r->t * 1e-9, gfl = r->flops / r->t * 1e-9;
        printf("%-21s %-8s %2lld %9.1f %8.1f %5.0f%% %8.1f %5.1f%%", r->c->name, dsv4_linear_format_name(r->c->fmt),
               (long long)r->m, r->t * 1e6, gbs, 100.0 * gbs / bw, gfl, 100.0 * gfl / peak);
        if (r->t_blas > 0)
            printf(" %9.1f %9.1f %7.2fx\n", r->t_blas * 1e6, r->blas_bytes / r->t_blas * 1e-9, r->t_blas / r->t);
        else
            printf(" %9s %9s %8s\n", "-", "-", "-");
    }
    printf("\nspeedup = OpenBLAS time / dsv4 time for the same product (OpenBLAS reads 4 B per weight, dsv4 the\n"
           "checkpoint format: 1 B FP8, 0.5 B FP4, 2 B BF16, plus scales).\n");
    free(res);
    return 0;
}
