/* ggml's CPU backend as an in-run peer of `dsv4 bench linear` (BENCHMARKS.md, "Linear layers vs
 * ggml"). Compiled and run by bench/ggml_peer.sh against a ggml build outside the repository; the
 * CMake build of dsv4 never sees this file.
 *
 * One row per (weight, format pair, M, threads): the same logical matrix in a dsv4 format and the
 * nearest ggml type, both timed by bench_time_pass (bench/bench_util.c) in alternating passes over
 * distinct copies adding up to more than --min-mb (default 1280 MiB, at least 4x the last-level
 * cache), so every call streams its weights from memory. ratio = ggml time / dsv4 time (> 1: dsv4
 * faster), for the best call and for the sustained rate.
 *
 * Pairs: FP8_B128 vs q8_0 and MXFP8 vs q8_0 (ggml's 8-bit type, quantized by ggml from dsv4's
 * dequantized copy 0); FP4 vs MXFP4 (bit for bit the same values: E2M1 codes with a UE8M0 scale per
 * 32, only the nibble order differs), in ggml's repacked layout where ggml's CPU backend repacks the
 * type (CPU_REPACK buffer, chosen the way llama.cpp chooses it: the device accepts the product with
 * the weight in that buffer); BF16 vs BF16 (the same bits). ggml gets x as F32 holding the BF16
 * values dsv4 reads; it quantizes x to its own dot type (q8_0 for q8_0 and MXFP4), dsv4 by its own
 * activation rule, so the outputs differ by those roundings: "diff" (max |y_ggml - y_dsv4| / max
 * |y_dsv4| on copy 0) is a check that both compute the same product, not a precision test. */
#include "bench.h"
#include "dsv4.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pair {
    const char *name;
    dsv4_linear_format fmt;
    enum ggml_type type;
} pair;

static const pair pairs[] = {
    {"fp8_b128/q8_0", DSV4_LINEAR_FP8_B128, GGML_TYPE_Q8_0},
    {"mxfp8/q8_0", DSV4_LINEAR_MXFP8, GGML_TYPE_Q8_0},
    {"fp4/mxfp4", DSV4_LINEAR_FP4, GGML_TYPE_MXFP4},
    {"bf16/bf16", DSV4_LINEAR_BF16, GGML_TYPE_BF16},
};
enum { NPAIRS = (int)(sizeof pairs / sizeof pairs[0]), MAXM = 32, MAXT = 4 };

static void die(const char *what, const char *why)
{
    fprintf(stderr, "ggml_peer: %s: %s\n", what, why);
    exit(1);
}

/* A comma-separated list: does it hold `s` as a substring of one of its items ("" or NULL: all)? */
static int listed(const char *list, const char *s)
{
    if (!list || !*list) return 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strstr(s, t)) return 1;
    return 0;
}

static int parse_ints(const char *list, int *v, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) {
        v[n] = atoi(t);
        if (v[n] > 0) n++;
    }
    return n;
}

static void loadavg(char *out, size_t n)
{
    FILE *f = fopen("/proc/loadavg", "r");
    out[0] = 0;
    if (f) {
        if (fgets(out, (int)n, f)) out[strcspn(out, "\n")] = 0;
        fclose(f);
    }
}

/* ---- the ggml side ---------------------------------------------------------------------------- */

/* dsv4's FP4 copy 0 (nibble pairs, low = even k; UE8M0 per 32) as ggml MXFP4 blocks: the same E2M1
 * codes and the same scale byte (2^(e-127)), element j of a block in the low nibble of byte j and
 * element j + 16 in its high nibble. */
static void fp4_to_mxfp4(const bench_wset *ws, uint8_t *dst)
{
    const int64_t nb = ws->k / 32;
    for (int64_t r = 0; r < ws->rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *src = ws->w + r * ws->wcols + b * 16;
            uint8_t *blk = dst + (r * nb + b) * 17, code[32];
            for (int i = 0; i < 16; i++) {
                code[2 * i] = src[i] & 15;
                code[2 * i + 1] = src[i] >> 4;
            }
            blk[0] = ws->s[r * ws->scols + b];
            for (int j = 0; j < 16; j++) blk[1 + j] = (uint8_t)(code[j] | code[j + 16] << 4);
        }
}

typedef struct gpeer {
    ggml_backend_t be;
    ggml_backend_buffer_type_t wbuft; /* CPU_REPACK where ggml repacks this weight, else the CPU type */
    struct ggml_context *wctx;        /* the weight copies */
    ggml_backend_buffer_t wbuf;
    struct ggml_tensor **w;
    int copies;
    size_t wbytes; /* one copy, ggml's own size of the type */
    ggml_backend_buffer_t iobuf; /* x and y, shared by the graphs of every copy */
    struct ggml_context *gctx;
    struct ggml_cgraph **g;
} gpeer;

/* Would ggml's CPU device run this product with the weight in `buft`? (llama.cpp's test) */
static int buft_takes(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, const bench_lshape *c,
                      enum ggml_type type)
{
    struct ggml_init_params ip = {.mem_size = 8 * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w = c->groups > 1 ? ggml_new_tensor_3d(ctx, type, c->k, c->n, c->groups)
                                          : ggml_new_tensor_2d(ctx, type, c->k, c->n);
    struct ggml_tensor *x = c->groups > 1 ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c->k, 1, c->groups)
                                          : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c->k, 1);
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = b;
    const int ok = ggml_backend_dev_supports_op(dev, y);
    ggml_backend_buffer_free(b);
    ggml_free(ctx);
    return ok;
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_dev_t dev)
{
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) return NULL;
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++)
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) return *b;
    return NULL;
}

/* The ggml copies of dsv4's copy 0, adding up to >= min_total bytes. */
static void gpeer_init(gpeer *p, ggml_backend_t be, const bench_lshape *c, const pair *pr, const bench_wset *ws,
                       const float *f32, size_t min_total)
{
    memset(p, 0, sizeof *p);
    p->be = be;
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_buffer_type_t cpu = ggml_backend_dev_buffer_type(dev), rp = repack_buft(dev);
    p->wbuft = rp && buft_takes(dev, rp, c, pr->type) ? rp : cpu;
    const int64_t rows = c->n * c->groups;
    p->wbytes = ggml_row_size(pr->type, c->k) * (size_t)rows;
    p->copies = (int)((min_total + p->wbytes - 1) / p->wbytes);
    if (p->copies < 2) p->copies = 2;
    uint8_t *src = bench_alloc_or_die(p->wbytes);
    if (pr->type == GGML_TYPE_MXFP4) {
        fp4_to_mxfp4(ws, src);
    } else if (pr->type == GGML_TYPE_BF16) {
        memcpy(src, ws->w, p->wbytes);
    } else {
        ggml_quantize_chunk(pr->type, f32, src, 0, rows, c->k, NULL);
    }
    /* the same logical matrix: ggml's own decoding of copy 0 against dsv4's (exact but for q8_0) */
    float *back = bench_alloc_or_die((size_t)c->k * 4);
    const struct ggml_type_traits *tt = ggml_get_type_traits(pr->type);
    double maxd = 0, maxv = 0;
    for (int64_t r = 0; r < rows; r++) {
        tt->to_float(src + ggml_row_size(pr->type, c->k) * (size_t)r, back, c->k);
        for (int64_t k = 0; k < c->k; k++) {
            const double d = fabs((double)back[k] - f32[r * c->k + k]), v = fabs((double)f32[r * c->k + k]);
            if (d > maxd) maxd = d;
            if (v > maxv) maxv = v;
        }
    }
    free(back);
    /* q8_0 rounds each weight to 1/254 of its block's max magnitude (half a step: 1/254) */
    if (pr->type == GGML_TYPE_Q8_0 ? maxd > maxv / 127.0 : maxd != 0)
        die("weights", "ggml's copy is not dsv4's matrix");

    struct ggml_init_params ip = {
        .mem_size = (size_t)p->copies * ggml_tensor_overhead() + 1024, .mem_buffer = NULL, .no_alloc = true};
    p->wctx = ggml_init(ip);
    p->w = bench_alloc_or_die((size_t)p->copies * sizeof *p->w);
    for (int i = 0; i < p->copies; i++)
        p->w[i] = c->groups > 1 ? ggml_new_tensor_3d(p->wctx, pr->type, c->k, c->n, c->groups)
                                : ggml_new_tensor_2d(p->wctx, pr->type, c->k, c->n);
    p->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(p->wctx, p->wbuft);
    if (!p->wbuf) die("ggml", "weight buffer");
    ggml_backend_buffer_set_usage(p->wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int i = 0; i < p->copies; i++) ggml_backend_tensor_set(p->w[i], src, 0, p->wbytes); /* repacks */
    free(src);
    const size_t io = (size_t)MAXM * (size_t)(c->k + c->n) * (size_t)c->groups * 4 + 1024;
    p->iobuf = ggml_backend_buft_alloc_buffer(cpu, io);
}

/* The graphs of every copy for M rows of x (ggml layout: [k, m, groups], F32). */
static void gpeer_graphs(gpeer *p, const bench_lshape *c, int64_t m, struct ggml_tensor **xo)
{
    if (p->gctx) ggml_free(p->gctx);
    const size_t gsz = ggml_graph_overhead_custom(4, false);
    struct ggml_init_params ip = {.mem_size = (size_t)(p->copies + 1) * (2 * ggml_tensor_overhead() + gsz) + 4096,
                                  .mem_buffer = NULL,
                                  .no_alloc = true};
    p->gctx = ggml_init(ip);
    struct ggml_tensor *x = c->groups > 1 ? ggml_new_tensor_3d(p->gctx, GGML_TYPE_F32, c->k, m, c->groups)
                                          : ggml_new_tensor_2d(p->gctx, GGML_TYPE_F32, c->k, m);
    char *base = ggml_backend_buffer_get_base(p->iobuf);
    const size_t align = ggml_backend_buffer_get_alignment(p->iobuf);
    const size_t yoff = (ggml_nbytes(x) + align - 1) / align * align;
    ggml_backend_tensor_alloc(p->iobuf, x, base);
    free(p->g);
    p->g = bench_alloc_or_die((size_t)p->copies * sizeof *p->g);
    for (int i = 0; i < p->copies; i++) {
        struct ggml_tensor *y = ggml_mul_mat(p->gctx, p->w[i], x);
        ggml_backend_tensor_alloc(p->iobuf, y, base + yoff); /* every copy writes the same y */
        p->g[i] = ggml_new_graph_custom(p->gctx, 4, false);
        ggml_build_forward_expand(p->g[i], y);
    }
    *xo = x;
}

static int gpeer_run(void *arg, int copy)
{
    gpeer *p = arg;
    return ggml_backend_graph_compute(p->be, p->g[copy]) != GGML_STATUS_SUCCESS;
}

static void gpeer_free(gpeer *p)
{
    if (p->gctx) ggml_free(p->gctx);
    ggml_backend_buffer_free(p->iobuf);
    ggml_backend_buffer_free(p->wbuf);
    ggml_free(p->wctx);
    free(p->w);
    free(p->g);
    memset(p, 0, sizeof *p);
}

/* ggml's messages from warnings up (its repacking logs every tensor at a lower level) */
static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    static enum ggml_log_level last = GGML_LOG_LEVEL_NONE;
    (void)user;
    if (level != GGML_LOG_LEVEL_CONT) last = level;
    if (last >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

/* ---- rows ---------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const int all = dsv4_default_threads();
    char dflt_threads[32];
    snprintf(dflt_threads, sizeof dflt_threads, all > 1 ? "1,%d" : "%d", all);
    int threads[MAXT], ms[8];
    const int nt = parse_ints(bench_opt_str(argc, argv, "--threads", dflt_threads), threads, MAXT);
    int nm = parse_ints(bench_opt_str(argc, argv, "--m", "1,2,4,8,16,32"), ms, 8);
    const char *only = bench_opt_str(argc, argv, "--only", NULL);    /* weights (substrings, comma-separated) */
    const char *pairs_sel = bench_opt_str(argc, argv, "--pairs", NULL); /* pairs, the same way */
    const char *variant = bench_opt_str(argc, argv, "--variant", "default");
    const char *commit = bench_opt_str(argc, argv, "--commit", "unknown");
    const int rounds = bench_opt_int(argc, argv, "--rounds", 3);
    size_t min_total = (size_t)bench_opt_int(argc, argv, "--min-mb", 1280) << 20;
    if (min_total < 4 * bench_llc_bytes()) min_total = 4 * bench_llc_bytes();
    const int llamafile = !strcmp(variant, "llamafile");
    for (int i = 0; i < nm; i++)
        if (ms[i] > MAXM) die("--m", "at most 32");
    if (llamafile) { /* llama.cpp's sgemm path serves M >= 2 */
        int j = 0;
        for (int i = 0; i < nm; i++)
            if (ms[i] >= 2) ms[j++] = ms[i];
        nm = j;
    }
    if (!nt || !nm || rounds < 1) die("options", "nothing to run");

    char la[128];
    loadavg(la, sizeof la);
    printf("ggml peer of dsv4 bench linear — ggml %s (%s mul_mat%s), dsv4 cpu isa %s\n", commit, variant,
           llamafile ? ": llamafile sgemm, M >= 2" : ", no llamafile", dsv4_cpu_isa());
    printf("each pass calls every copy once, back to back (copies >= %zu MiB per library); %d alternating rounds\n"
           "best = fastest call, sust = pass time / copies; ratio = ggml time / dsv4 time (> 1: dsv4 faster)\n"
           "load average at start: %s\n",
           min_total >> 20, rounds, la);
    double bw[MAXT];
    for (int t = 0; t < nt; t++) {
        bench_bw b = bench_read_bw(0, threads[t], 4);
        bench_bw_print(&b);
        bw[t] = b.best;
    }

    ggml_log_set(quiet_log, NULL);
    ggml_backend_t be = ggml_backend_cpu_init();
    if (!be) die("ggml", "no CPU backend");
    struct ggml_threadpool *tp[MAXT];
    dsv4_ctx *ctx[MAXT];
    for (int t = 0; t < nt; t++) {
        struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads[t]);
        tp[t] = ggml_threadpool_new(&tpp);
        const dsv4_ctx_options o = {.backend = "cpu", .threads = threads[t]};
        if (dsv4_ctx_create(&o, &ctx[t])) die("dsv4 context", dsv4_last_error());
    }
    printf("\n%-20s %-14s %-7s %2s %3s %9s %9s %6s %5s %9s %9s %6s %6s %6s %7s\n", "weight", "pair", "ggml w", "M",
           "thr", "dsv4 us", "sust", "GB/s", "%read", "ggml us", "sust", "GB/s", "ratio", "sust", "diff");
    fflush(stdout);

    int64_t kmax = 0, nmax = 0; /* x / y elements per row over the shapes */
    for (int ci = 0; ci < bench_nlshapes; ci++) {
        const bench_lshape *c = &bench_lshapes[ci];
        if (c->k * c->groups > kmax) kmax = c->k * c->groups;
        if (c->n * c->groups > nmax) nmax = c->n * c->groups;
    }
    uint16_t *x = bench_alloc_or_die((size_t)MAXM * (size_t)kmax * 2), *y = bench_alloc_or_die((size_t)MAXM * (size_t)nmax * 2);
    float *xf = bench_alloc_or_die((size_t)MAXM * (size_t)kmax * 4);
    int bad = 0;
    for (int ci = 0; ci < bench_nlshapes; ci++) {
        const bench_lshape *c = &bench_lshapes[ci];
        if (!listed(only, c->name)) continue;
        for (int pi = 0; pi < NPAIRS; pi++) {
            const pair *pr = &pairs[pi];
            if (!listed(pairs_sel, pr->name)) continue;
            const int64_t kx = c->k * c->groups, ny = c->n * c->groups;
            bench_wset ws;
            bench_wset_init(&ws, c, pr->fmt, min_total);
            float *f32 = bench_wset_f32(ctx[0], &ws, 1);
            if (!f32) die("dequantize", dsv4_last_error());
            gpeer gp;
            gpeer_init(&gp, be, c, pr, &ws, f32, min_total);
            free(f32);
            const char *gname = gp.wbuft == ggml_backend_dev_buffer_type(ggml_backend_get_device(be))
                                    ? ggml_type_name(pr->type) : "repack";
            bench_fill_random_f32(xf, (size_t)(MAXM * kx), 3, 2.0f);
            if (dsv4_encode_array(ctx[0], DSV4_FMT_BF16, xf, MAXM * kx, x)) die("x", dsv4_last_error());
            size_t wsb = 0;
            if (dsv4_linear_workspace_size(ctx[0], pr->fmt, MAXM * c->groups, c->k, &wsb)) die("ws", dsv4_last_error());
            void *work = bench_alloc_or_die(wsb + 1);
            for (int ti = 0; ti < nt; ti++) {
                ggml_backend_cpu_set_n_threads(be, threads[ti]);
                ggml_backend_cpu_set_threadpool(be, tp[ti]);
                for (int mi = 0; mi < nm; mi++) {
                    const int64_t m = ms[mi];
                    struct ggml_tensor *gx;
                    gpeer_graphs(&gp, c, m, &gx);
                    /* ggml's x [k, m, groups] from dsv4's [m, groups, k], the same BF16 values */
                    float *gxd = bench_alloc_or_die((size_t)(m * kx) * 4);
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t g = 0; g < c->groups; g++)
                            for (int64_t k = 0; k < c->k; k++)
                                gxd[(g * m + r) * c->k + k] = dsv4_bf16_decode(x[(r * c->groups + g) * c->k + k]);
                    ggml_backend_tensor_set(gx, gxd, 0, (size_t)(m * kx) * 4);
                    free(gxd);
                    bench_lcall d;
                    bench_lcall_init(&d, ctx[ti], c, &ws, m, x, y, work, wsb);
                    bench_rate td = BENCH_RATE_INIT, tg = BENCH_RATE_INIT;
                    for (int r = 0; r < rounds; r++) {
                        int st = 0;
                        if (r % 2 == 0) {
                            st |= bench_time_pass(bench_lcall_run, &d, ws.copies, &td);
                            st |= bench_time_pass(gpeer_run, &gp, gp.copies, &tg);
                        } else {
                            st |= bench_time_pass(gpeer_run, &gp, gp.copies, &tg);
                            st |= bench_time_pass(bench_lcall_run, &d, ws.copies, &td);
                        }
                        if (st) die("product", dsv4_last_error());
                    }
                    /* the check: copy 0 of both, y_dsv4 BF16 [m, groups, n] vs y_ggml F32 [n, m, groups] */
                    if (bench_lcall_run(&d, 0) || gpeer_run(&gp, 0)) die("product", dsv4_last_error());
                    struct ggml_tensor *gy = ggml_graph_node(gp.g[0], -1);
                    float *gyd = bench_alloc_or_die((size_t)(m * ny) * 4);
                    ggml_backend_tensor_get(gy, gyd, 0, (size_t)(m * ny) * 4);
                    double maxd = 0, maxv = 0;
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t g = 0; g < c->groups; g++)
                            for (int64_t n = 0; n < c->n; n++) {
                                const double a = dsv4_bf16_decode(y[(r * c->groups + g) * c->n + n]);
                                const double b = gyd[(g * m + r) * c->n + n];
                                if (fabs(a - b) > maxd || isnan(b)) maxd = isnan(b) ? INFINITY : fabs(a - b);
                                if (fabs(a) > maxv) maxv = fabs(a);
                            }
                    free(gyd);
                    const double diff = maxd / maxv;
                    const double db = (double)(ws.wbytes + ws.sbytes), gb = (double)gp.wbytes;
                    printf("%-20s %-14s %-7s %2lld %3d %9.1f %9.1f %6.1f %4.0f%% %9.1f %9.1f %6.1f %6.2f %6.2f %7.1e%s\n",
                           c->name, pr->name, gname, (long long)m, threads[ti], td.best * 1e6, td.sustained * 1e6,
                           db / td.best * 1e-9, 100.0 * db / td.best * 1e-9 / bw[ti], tg.best * 1e6,
                           tg.sustained * 1e6, gb / tg.best * 1e-9, tg.best / td.best, tg.sustained / td.sustained,
                           diff, diff > 0.1 ? "  <- not the same product" : "");
                    fflush(stdout);
                    bad |= !(diff <= 0.1);
                }
            }
            loadavg(la, sizeof la);
            printf("  [%s %s: %d dsv4 copies of %.1f MiB, %d ggml copies of %.1f MiB; load average %s]\n", c->name,
                   pr->name, ws.copies, (double)(ws.wbytes + ws.sbytes) / 1048576.0, gp.copies,
                   (double)gp.wbytes / 1048576.0, la);
            fflush(stdout);
            free(work);
            gpeer_free(&gp);
            bench_wset_free(&ws);
        }
    }
    printf("\nGB/s = bytes of one copy in the library's own format (dsv4: codes + scales; ggml: its blocks) / time;\n"
           "%%read: dsv4's best call against the read probe of that thread count.\n");
    for (int t = 0; t < nt; t++) {
        ggml_threadpool_free(tp[t]);
        dsv4_ctx_destroy(ctx[t]);
    }
    ggml_backend_free(be);
    free(x);
    free(y);
    free(xf);
    return bad;
}
