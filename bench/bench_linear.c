/* dsv4 bench linear: the linear layers (docs/kernels.md §5) at every V4-Flash shape (bench_lshapes,
 * linear_weights.c) in every format, and the LM head (bench_lshape_head) in every format but F32,
 * M = 1 .. 32. Effective weight GB/s (weight + scale bytes of the
 * format / time per call) next to the read bandwidth measured in the same run, GFLOP/s next to the
 * FMA peak, and OpenBLAS sgemv (M = 1) / sgemm on the same weights dequantized to F32 (OpenBLAS, or
 * another CBLAS, is opened when the benchmark runs: dsv4 is not linked with it), timed by the
 * same method in alternating passes. Each pass calls every copy of the weights once, back to back
 * (bench_time_pass), and the copies together exceed twice the last-level cache, so the weights come
 * from memory as in a decode step: the best call and the sustained rate of the pass. */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const int64_t ms[] = {1, 2, 4, 8, 16, 32};
enum { NM = (int)(sizeof ms / sizeof ms[0]), MMAX = 32 };

static void die(const char *what)
{
    fprintf(stderr, "bench linear: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

/* One measured line. */
typedef struct result {
    const bench_lshape *c;
    dsv4_linear_format fmt;
    int64_t m;
    bench_rate t, t_blas; /* seconds per call; t_blas.best >= 1e30: no peer */
    double bytes, flops, blas_bytes;
} result;

/* OpenBLAS on copy `copy` of the F32 weights: sgemv for M = 1, sgemm otherwise, one call per group. */
typedef struct blas_call {
    const bench_lshape *c;
    const float *wf, *xf;
    float *yf;
    int64_t m;
} blas_call;

static int run_blas(void *arg, int copy)
{
    const blas_call *a = arg;
    const bench_lshape *c = a->c;
    const int64_t kx = c->k * c->groups, ny = c->n * c->groups;
    const float *wb = a->wf + (size_t)(ny * c->k) * (size_t)copy;
    for (int64_t g = 0; g < c->groups; g++) {
        const float *wg = wb + (size_t)(g * c->n * c->k);
        if (a->m == 1)
            bench_blas.sgemv(101, 111, (int)c->n, (int)c->k, 1.0f, wg, (int)c->k, a->xf + g * c->k, 1, 0.0f, a->yf + g * c->n, 1);
        else
            bench_blas.sgemm(101, 111, 112, (int)a->m, (int)c->n, (int)c->k, 1.0f, a->xf + g * c->k, (int)kx, wg, (int)c->k,
                        0.0f, a->yf + g * c->n, (int)ny);
    }
    return 0;
}

/* Every M of one shape in one format: `rounds` alternating passes of dsv4 and the peer over all copies. */
static int run_case(dsv4_ctx *ctx, const bench_lshape *c, dsv4_linear_format fmt, int64_t only_m, size_t min_total,
                    int rounds, int peer, result *out)
{
    bench_wset ws;
    bench_wset_init(&ws, c, fmt, min_total);
    const int64_t kx = c->k * c->groups, ny = c->n * c->groups;
    uint16_t *x = bench_alloc((size_t)(MMAX * kx) * 2), *y = bench_alloc((size_t)(MMAX * ny) * 2);
    float *xf = bench_alloc((size_t)(MMAX * kx) * 4), *yf = bench_alloc((size_t)(MMAX * ny) * 4);
    if (!x || !y || !xf || !yf) die("out of memory");
    bench_fill_random_f32(xf, (size_t)(MMAX * kx), 3, 2.0f);
    if (dsv4_encode_array(ctx, DSV4_FMT_BF16, xf, MMAX * kx, x)) die("x");
    for (int64_t i = 0; i < MMAX * kx; i++) xf[i] = dsv4_bf16_decode(x[i]); /* the same x for the peer */
    size_t wsb = 0;
    if (dsv4_linear_workspace_size(ctx, fmt, MMAX * c->groups, c->k, &wsb)) die("workspace");
    void *work = bench_alloc(wsb + 1);
    const size_t f32_bytes = (size_t)(ws.rows * ws.k) * 4;
    int fcopies = (int)((min_total + f32_bytes - 1) / f32_bytes);
    if (fcopies < 2) fcopies = 2;
    float *wf = NULL;
    if (peer && bench_blas.sgemv && !(wf = bench_wset_f32(ctx, &ws, fcopies))) die("dequantize");
    int n = 0;
    for (int mi = 0; mi < NM; mi++) {
        if (only_m && ms[mi] != only_m) continue;
        result *r = &out[n++];
        *r = (result){.c = c, .fmt = fmt, .m = ms[mi], .t = BENCH_RATE_INIT, .t_blas = BENCH_RATE_INIT};
        bench_lcall d;
        bench_lcall_init(&d, ctx, c, &ws, r->m, x, y, work, wsb);
        blas_call b = {.c = c, .wf = wf, .xf = xf, .yf = yf, .m = r->m};
        for (int round = 0; round < rounds; round++) {
            if (bench_time_pass(bench_lcall_run, &d, ws.copies, &r->t)) die("linear");
            if (wf) bench_time_pass(run_blas, &b, fcopies, &r->t_blas);
        }
        r->bytes = (double)(ws.wbytes + ws.sbytes);
        r->flops = 2.0 * (double)(r->m * ny * c->k);
        r->blas_bytes = (double)f32_bytes;
    }
    free(wf);
    bench_wset_free(&ws);
    free(x);
    free(y);
    free(xf);
    free(yf);
    free(work);
    return n;
}

int dsv4_bench_linear(int argc, char **argv)
{
    const int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    const int quick = bench_opt_flag(argc, argv, "--quick");
    const char *only = bench_opt_str(argc, argv, "--only", NULL); /* the cases whose name or format has it */
    const int64_t only_m = bench_opt_int(argc, argv, "--m", 0);
    const int rounds = bench_opt_int(argc, argv, "--rounds", 2);
    /* --quick: each shape in its checkpoint format only, over fewer bytes */
    size_t min_total = quick ? ((size_t)96 << 20) : ((size_t)256 << 20);
    /* the copies of a case: more than twice the last-level cache, so every call reads from memory */
    if (min_total < 2 * bench_llc_bytes()) min_total = 2 * bench_llc_bytes();
    const size_t bw_bytes = quick ? ((size_t)256 << 20) : ((size_t)1 << 30);
    if (rounds < 1) {
        fprintf(stderr, "bench linear: --rounds must be >= 1\n");
        return 2;
    }

    /* The machine is shared: read bandwidth before and after, the higher one is the roofline. */
    const double bw0 = bench_read_bandwidth(bw_bytes, threads, 5);
    const double peak = bench_fma_peak(threads);
    bench_blas_open();
    if (bench_blas.set_threads) bench_blas.set_threads(threads);
    dsv4_ctx *ctx = NULL;
    const dsv4_ctx_options o = {.backend = "cpu", .threads = threads};
    if (dsv4_ctx_create(&o, &ctx)) die("context");
    result *res = calloc((size_t)(bench_nlshapes + 1) * DSV4_LINEAR_FORMAT_COUNT * NM, sizeof(result));
    if (!res) die("out of memory");
    int nres = 0;
    for (int ci = 0; ci < bench_nlshapes; ci++) {
        const bench_lshape *c = &bench_lshapes[ci];
        for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
            const dsv4_linear_format fmt = (dsv4_linear_format)f;
            if (quick && fmt != c->ckpt) continue;
            if (only && !strstr(c->name, only) && strcmp(dsv4_linear_format_name(fmt), only)) continue;
            nres += run_case(ctx, c, fmt, only_m, min_total, rounds, 1, res + nres);
        }
    }
    /* the LM head: 2 copies of 0.3-1.1 GB; not in F32 (2.1 GB a copy) and without the peer (its
     * F32 copies), so that the bench stays within a few GB */
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        const bench_lshape *c = &bench_lshape_head;
        const dsv4_linear_format fmt = (dsv4_linear_format)f;
        if (fmt == DSV4_LINEAR_F32 || (quick && fmt != c->ckpt)) continue;
        if (only && !strstr(c->name, only) && strcmp(dsv4_linear_format_name(fmt), only)) continue;
        nres += run_case(ctx, c, fmt, only_m, min_total, rounds, 0, res + nres);
    }
    dsv4_ctx_destroy(ctx);
    const double bw1 = bench_read_bandwidth(bw_bytes, threads, 5), bw = bw0 > bw1 ? bw0 : bw1;

    printf("dsv4 bench linear — %d thread(s), cpu isa %s\n", threads, dsv4_cpu_isa());
    printf("memory read bandwidth (measured before / after): %.1f / %.1f GB/s, %%read uses %.1f; "
           "fp32 FMA peak: %.0f GFLOP/s\n", bw0, bw1, bw, peak);
    if (bench_blas.sgemv)
        printf("peer: %s (%s), sgemv (M = 1) / sgemm on the weights dequantized to F32\n",
               bench_blas.get_config ? bench_blas.get_config() : "a CBLAS that is not OpenBLAS", bench_blas.file);
    else
        printf("peer: none (no CBLAS library found: libopenblas.so.0, libcblas.so.3 or libblas.so.3)\n");
    printf("each pass calls every copy once, back to back (copies > 2x L3); %d alternating rounds of dsv4 and the peer\n"
           "best = fastest call, sust = pass time / copies; GB/s = weight + scale bytes of the format / time per call\n\n",
           rounds);
    printf("%-20s %-8s %2s %9s %9s %7s %7s %5s %5s %8s %6s %9s %9s %7s %7s\n", "weight", "format", "M", "best us",
           "sust us", "GB/s", "sust", "%read", "sust", "GFLOP/s", "%peak", "blas us", "blas sust", "speedup", "sust");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        const double gbs = r->bytes / r->t.best * 1e-9, sgbs = r->bytes / r->t.sustained * 1e-9;
        const double gfl = r->flops / r->t.best * 1e-9;
        printf("%-20s %-8s %2lld %9.1f %9.1f %7.1f %7.1f %4.0f%% %4.0f%% %8.1f %5.1f%%", r->c->name,
               dsv4_linear_format_name(r->fmt), (long long)r->m, r->t.best * 1e6, r->t.sustained * 1e6, gbs, sgbs,
               100.0 * gbs / bw, 100.0 * sgbs / bw, gfl, 100.0 * gfl / peak);
        if (r->t_blas.best < 1e29)
            printf(" %9.1f %9.1f %6.2fx %6.2fx\n", r->t_blas.best * 1e6, r->t_blas.sustained * 1e6,
                   r->t_blas.best / r->t.best, r->t_blas.sustained / r->t.sustained);
        else
            printf(" %9s %9s %7s %7s\n", "-", "-", "-", "-");
    }
    printf("\nspeedup = OpenBLAS time / dsv4 time for the same product, best call and sustained (OpenBLAS reads\n"
           "4 B per weight, dsv4 the format's: 1 B FP8, 0.53 B FP4, 2 B BF16, 4 B F32, plus scales).\n");
    free(res);
    return 0;
}
