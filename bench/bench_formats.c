/* dsv4 bench formats: GB/s (bytes read + written) of the quantize / dequantize / codec routines
 * on the cpu backend and on the scalar reference, next to the read bandwidth measured here. */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    dsv4_ctx *ctx;
    dsv4_qrule rule;
    dsv4_tensor x, codes, scales;
} qcase;

static double time_best(int reps, dsv4_status (*fn)(qcase *), qcase *c)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (fn(c) != DSV4_OK) {
            fprintf(stderr, "bench formats: %s\n", dsv4_last_error());
            exit(1);
        }
        double dt = bench_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static dsv4_status run_quant(qcase *c) { return dsv4_quantize(c->ctx, c->rule, &c->x, &c->codes, &c->scales); }
static dsv4_status run_dequant(qcase *c) { return dsv4_dequantize(c->ctx, c->rule, &c->codes, &c->scales, &c->x); }

int dsv4_bench_formats(int argc, char **argv)
{
    int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    int quick = bench_opt_flag(argc, argv, "--quick");
    const int64_t rows = quick ? 1024 : 8192, k = 4096; /* 128 MiB of f32 (16 MiB quick): larger than the caches */
    const int reps = quick ? 3 : 5;

    double bw = bench_read_bandwidth(quick ? ((size_t)256 << 20) : ((size_t)1 << 30), threads, 3);
    printf("dsv4 bench formats — %d thread(s), cpu isa %s\n", threads, dsv4_cpu_isa());
    printf("memory read bandwidth (measured now): %.1f GB/s\n\n", bw);

    float *x = bench_alloc((size_t)(rows * k) * 4);
    uint8_t *codes = bench_alloc((size_t)(rows * k));
    uint8_t *scales = bench_alloc((size_t)(rows * k / 32));
    if (!x || !codes || !scales) {
        fprintf(stderr, "bench formats: out of memory\n");
        return 1;
    }
    bench_fill_random_f32(x, (size_t)(rows * k), 1, 3.0f);

    dsv4_ctx *fast = NULL, *ref = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = threads}, orf = {.backend = "cpu-ref", .threads = threads};
    if (dsv4_ctx_create(&o, &fast) || dsv4_ctx_create(&orf, &ref)) {
        fprintf(stderr, "bench formats: %s\n", dsv4_last_error());
        return 1;
    }

    printf("%-22s %10s %10s %12s %10s %10s\n", "routine", "cpu GB/s", "% of read", "cpu-ref GB/s", "speedup", "ms (cpu)");
    const dsv4_qrule rules[] = {DSV4_QRULE_KV64, DSV4_QRULE_ACT128, DSV4_QRULE_MX32, DSV4_QRULE_FP4_32};
    for (int ri = 0; ri < 4; ri++) {
        for (int dir = 0; dir < 2; dir++) {
            qcase c[2];
            for (int w = 0; w < 2; w++) {
                int64_t g = dsv4_qrule_group(rules[ri]);
                int64_t xs[2] = {rows, k}, ss[2] = {rows, k / g};
                c[w].ctx = w ? ref : fast;
                c[w].rule = rules[ri];
                dsv4_tensor_init(&c[w].x, x, DSV4_F32, 2, xs);
                dsv4_tensor_init(&c[w].codes, codes, DSV4_U8, 2, xs);
                dsv4_tensor_init(&c[w].scales, scales, DSV4_U8, 2, ss);
            }
            if (dir == 1) run_quant(&c[0]); /* valid codes to decode */
            dsv4_status (*fn)(qcase *) = dir ? run_dequant : run_quant;
            double t_fast = time_best(reps, fn, &c[0]);
            double t_ref = time_best(quick ? 1 : 2, fn, &c[1]);
            double bytes = (double)(rows * k) * 5.0 + (double)(rows * k / dsv4_qrule_group(rules[ri]));
            char label[40];
            snprintf(label, sizeof label, "%s %s", dir ? "dequantize" : "quantize", dsv4_qrule_name(rules[ri]));
            printf("%-22s %10.1f %9.0f%% %12.1f %9.1fx %10.2f\n", label, bytes / t_fast * 1e-9,
                   100.0 * bytes / t_fast * 1e-9 / bw, bytes / t_ref * 1e-9, t_ref / t_fast, t_fast * 1e3);
        }
    }
    /* element codecs */
    const dsv4_scalar_format fmts[] = {DSV4_FMT_E4M3, DSV4_FMT_BF16};
    const char *names[] = {"e4m3", "bf16"};
    int64_t n = rows * k;
    for (int fi = 0; fi < 2; fi++) {
        for (int dir = 0; dir < 2; dir++) {
            double t[2];
            for (int w = 0; w < 2; w++) {
                double best = 1e30;
                for (int r = 0; r < (w ? (quick ? 1 : 2) : reps); r++) {
                    double t0 = bench_now();
                    dsv4_status s = dir ? dsv4_decode_array(w ? ref : fast, fmts[fi], codes, n / 2, x)
                                        : dsv4_encode_array(w ? ref : fast, fmts[fi], x, n / 2, codes);
                    if (s) { fprintf(stderr, "bench formats: %s\n", dsv4_last_error()); return 1; }
                    double dt = bench_now() - t0;
                    if (dt < best) best = dt;
                }
                t[w] = best;
            }
            double bytes = (double)(n / 2) * (4.0 + (fi ? 2.0 : 1.0));
            char label[40];
            snprintf(label, sizeof label, "%s %s", names[fi], dir ? "decode" : "encode");
            printf("%-22s %10.1f %9.0f%% %12.1f %9.1fx %10.2f\n", label, bytes / t[0] * 1e-9,
                   100.0 * bytes / t[0] * 1e-9 / bw, bytes / t[1] * 1e-9, t[1] / t[0], t[0] * 1e3);
        }
    }
    printf("\nGB/s counts bytes read + written (f32 4 B, code 1-2 B, one scale byte per group);\n"
           "%% of read compares with the read-only bandwidth above, so >100%% is possible only through caches.\n");
    dsv4_ctx_destroy(fast);
    dsv4_ctx_destroy(ref);
    free(x);
    free(codes);
    free(scales);
    return 0;
}
