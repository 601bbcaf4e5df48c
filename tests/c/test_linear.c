/* Linear family (docs/kernels.md §5): every weight format against a float64 evaluation of the contract (on
 * activations quantized by the library's own dsv4_quantize; the independent oracles are in
 * tests/python/test_linear.py), the cpu kernels of every ISA against cpu-ref, 1 vs 2 threads bit
 * for bit, grouped = separate products, transposed scale views, staged = unstaged products
 * (dsv4_linear_stage / dsv4_linear_staged), and bad input. */
#include "dsv4.h"
#include "test_util.h"
#include "test_linear_cases.h"

/* x F32 [m, k] quantized with the format's activation rule through dsv4_quantize/dequantize
 * (groups of 128 or 32; k must then be a multiple of the group here). */
static void act_dequant(dsv4_linear_format fmt, const float *x, int64_t m, int64_t k, double *xq)
{
    if (fmt >= DSV4_LINEAR_BF16) {
        for (int64_t i = 0; i < m * k; i++) xq[i] = x[i];
        return;
    }
    dsv4_qrule rule = fmt == DSV4_LINEAR_MXFP8 ? DSV4_QRULE_MX32 : DSV4_QRULE_ACT128;
    int64_t g = dsv4_qrule_group(rule);
    uint8_t *codes = malloc((size_t)(m * k)), *sc = malloc((size_t)(m * k / g));
    float *deq = malloc(sizeof(float) * (size_t)(m * k));
    dsv4_tensor tx, tc, ts, td;
    const int64_t xs[2] = {m, k}, ss[2] = {m, k / g};
    dsv4_tensor_init(&tx, (void *)x, DSV4_F32, 2, xs);
    dsv4_tensor_init(&tc, codes, DSV4_U8, 2, xs);
    dsv4_tensor_init(&ts, sc, DSV4_U8, 2, ss);
    dsv4_tensor_init(&td, deq, DSV4_F32, 2, xs);
    CHECK_STATUS(dsv4_quantize(NULL, rule, &tx, &tc, &ts), DSV4_OK);
    CHECK_STATUS(dsv4_dequantize(NULL, rule, &tc, &ts, &td), DSV4_OK);
    for (int64_t i = 0; i < m * k; i++) xq[i] = deq[i];
    free(codes);
    free(sc);
    free(deq);
}

static dsv4_ctx *make_ctx(const char *backend, int threads)
{
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = backend, .threads = threads};
    CHECK_STATUS(dsv4_ctx_create(&o, &c), DSV4_OK);
    return c;
}

/* y F32 [m, n] of one call. */
static dsv4_status run_linear(dsv4_ctx *ctx, const wcase *c, const float *x, int64_t m, float *y)
{
    dsv4_tensor tx, tw, ts, ty;
    const int64_t xs[2] = {m, c->k}, ys[2] = {m, c->n};
    dsv4_tensor_init(&tx, (void *)x, DSV4_F32, 2, xs);
    dsv4_tensor_init(&ty, y, DSV4_F32, 2, ys);
    wcase_views(c, &tw, &ts);
    size_t wsb = 0;
    dsv4_status st = dsv4_linear_workspace_size(ctx, c->fmt, m, c->k, &wsb);
    if (st) return st;
    void *ws = malloc(wsb + 1);
    st = dsv4_linear(ctx, c->fmt, &tx, &tw, c->fmt <= DSV4_LINEAR_FP4 ? &ts : NULL, NULL, &ty, ws, wsb);
    free(ws);
    return st;
}

static void test_formats(void)
{
    const char *const *isas = test_isas;
    dsv4_ctx *fast[3], *ref = make_ctx("cpu-ref", 2);
    for (int is = 0; is < 3; is++) fast[is] = test_ctx("cpu", 2, isas[is]);
    const int64_t ms[] = {1, 3, 8};
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        const int64_t n = 37 + 2 * (int64_t)(test_rand_u64() % 40), k = f == DSV4_LINEAR_MXFP8 ? 1184 : 1152;
        wcase c;
        wcase_make(&c, (dsv4_linear_format)f, n, k, f % 2, f == DSV4_LINEAR_MXFP8 || f == DSV4_LINEAR_FP8_B128);
        for (int mi = 0; mi < 3; mi++) {
            const int64_t m = ms[mi];
            float *x = malloc(sizeof(float) * (size_t)(m * k)), *y = malloc(sizeof(float) * (size_t)(m * n));
            float *yr = malloc(sizeof(float) * (size_t)(m * n));
            double *xq = malloc(sizeof(double) * (size_t)(m * k));
            for (int64_t i = 0; i < m * k; i++) x[i] = test_randn() * (i % k < 200 ? 10.0f : 1.0f);
            act_dequant(c.fmt, x, m, k, xq);
            for (int64_t i = 0; i < m * n; i++) yr[i] = NAN; /* poisoned: an unwritten output fails */
            CHECK_STATUS(run_linear(ref, &c, x, m, yr), DSV4_OK);
            for (int is = 0; is < 3; is++) {
                for (int64_t i = 0; i < m * n; i++) y[i] = NAN;
                CHECK_STATUS(run_linear(fast[is], &c, x, m, y), DSV4_OK);
                int bad = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double acc = 0, mag = 0;
                        for (int64_t q = 0; q < k; q++) {
                            acc += xq[i * k + q] * c.wq[j * k + q];
                            mag += fabs(xq[i * k + q] * c.wq[j * k + q]);
                        }
                        const double e1 = fabs(y[i * n + j] - acc), e2 = fabs(yr[i * n + j] - acc);
                        if (!(e1 <= TOL * mag) || !(e2 <= TOL * mag)) bad++;
                    }
                CHECK(bad == 0, "%s m=%lld isa=%s: %d outputs off the float64 evaluation",
                      dsv4_linear_format_name(c.fmt), (long long)m, isas[is], bad);
            }
            free(x);
            free(y);
            free(yr);
            free(xq);
        }
        wcase_free(&c);
    }
    for (int is = 0; is < 3; is++) dsv4_ctx_destroy(fast[is]);
    dsv4_ctx_destroy(ref);
}

/* 1 vs 2 threads bit for bit; transposed scale views identical to canonical ones. */
static void test_threads_and_views(void)
{
    dsv4_ctx *t1 = make_ctx("cpu", 1), *t2 = make_ctx("cpu", 2);
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        const int64_t n = 301, k = 1056, m = 5;
        wcase c, ct;
        const uint64_t seed = test_rng_state;
        wcase_make(&c, (dsv4_linear_format)f, n, k, 0, 0);
        test_rng_state = seed; /* the same values, scale stored transposed */
        wcase_make(&ct, (dsv4_linear_format)f, n, k, 0, 1);
        float *x = malloc(sizeof(float) * (size_t)(m * k)), *y1 = malloc(sizeof(float) * (size_t)(m * n));
        float *y2 = malloc(sizeof(float) * (size_t)(m * n)), *y3 = malloc(sizeof(float) * (size_t)(m * n));
        for (int64_t i = 0; i < m * k; i++) x[i] = test_randn();
        CHECK_STATUS(run_linear(t1, &c, x, m, y1), DSV4_OK);
        CHECK_STATUS(run_linear(t2, &c, x, m, y2), DSV4_OK);
        CHECK_STATUS(run_linear(t2, &ct, x, m, y3), DSV4_OK);
        CHECK(!memcmp(y1, y2, sizeof(float) * (size_t)(m * n)), "%s: 1 vs 2 threads differ", dsv4_linear_format_name(c.fmt));
        CHECK(!memcmp(y1, y3, sizeof(float) * (size_t)(m * n)), "%s: transposed scale view differs",
              dsv4_linear_format_name(c.fmt));
        free(x);
        free(y1);
        free(y2);
        free(y3);
        wcase_free(&c);
        wcase_free(&ct);
    }
    dsv4_ctx_destroy(t1);
    dsv4_ctx_destroy(t2);
}

/* A row's result does not depend on the other rows of the call: every row of an M-row call (the
 * kernels pick their tile shape from M, and the last tile of rows is partial) equals, bit for bit,
 * the same row computed alone (M = 1, another tile shape), on every ISA. */
static void test_rows_independent(void)
{
    const int64_t ms[] = {2, 3, 5, 11, 16};
    for (int is = 0; is < 3; is++) {
        dsv4_ctx *ctx = test_ctx("cpu", 2, test_isas[is]);
        for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
            const int64_t n = 45, k = 1152 + 32 * (f == DSV4_LINEAR_MXFP8);
            wcase c;
            wcase_make(&c, (dsv4_linear_format)f, n, k, 0, 0);
            float *x = malloc(sizeof(float) * (size_t)(16 * k)), *y = malloc(sizeof(float) * (size_t)(16 * n));
            float *y1 = malloc(sizeof(float) * (size_t)n);
            /* rows 1, 4, 7, ... of amplitude 2^12 and rows 3, 8, 13 of 2^-118: their act128 scales
             * leave [2^-109, 1], so the AVX2 FP4 staging does not fold them (linear_avx2.c folded)
             * and tiles mix both kinds of rows */
            for (int64_t i = 0; i < 16 * k; i++) {
                const int64_t r = i / k;
                x[i] = test_randn() * (i % 7 == 0 ? 8.0f : 1.0f) * (r % 3 == 1 ? 0x1p12f : r % 5 == 3 ? 0x1p-118f : 1.0f);
            }
            for (int mi = 0; mi < 5; mi++) {
                const int64_t m = ms[mi];
                for (int64_t i = 0; i < m * n; i++) y[i] = NAN;
                CHECK_STATUS(run_linear(ctx, &c, x, m, y), DSV4_OK);
                int same = 1;
                for (int64_t r = 0; r < m; r++) {
                    for (int64_t j = 0; j < n; j++) y1[j] = NAN;
                    CHECK_STATUS(run_linear(ctx, &c, x + r * k, 1, y1), DSV4_OK);
                    same &= !memcmp(y1, y + r * n, sizeof(float) * (size_t)n);
                }
                CHECK(same, "%s m=%lld isa=%s: a row differs from the same row alone", dsv4_linear_format_name(c.fmt),
                      (long long)m, test_isas[is]);
            }
            free(x);
            free(y);
            free(y1);
            wcase_free(&c);
        }
        dsv4_ctx_destroy(ctx);
    }
}

/* Grouped product = G separate products, bit for bit (group rows aligned to 128 for B128). */
static void test_grouped(void)
{
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        const int64_t g = 3, r = 128, k = 384, t = 2;
        wcase c;
        wcase_make(&c, (dsv4_linear_format)f, g * r, k, 0, 0);
        float *x = malloc(sizeof(float) * (size_t)(t * g * k)), *y = malloc(sizeof(float) * (size_t)(t * g * r));
        float *ys = malloc(sizeof(float) * (size_t)(t * r));
        for (int64_t i = 0; i < t * g * k; i++) x[i] = test_randn();
        dsv4_tensor tx, tw, ts, ty;
        const int64_t xs[3] = {t, g, k}, yshape[3] = {t, g, r};
        dsv4_tensor_init(&tx, x, DSV4_F32, 3, xs);
        dsv4_tensor_init(&ty, y, DSV4_F32, 3, yshape);
        wcase_views(&c, &tw, &ts);
        size_t wsb = 0;
        CHECK_STATUS(dsv4_linear_workspace_size(NULL, c.fmt, t * g, k, &wsb), DSV4_OK);
        void *ws = malloc(wsb + 1);
        const dsv4_tensor *sp = c.fmt <= DSV4_LINEAR_FP4 ? &ts : NULL;
        CHECK_STATUS(dsv4_grouped_linear(NULL, c.fmt, &tx, &tw, sp, &ty, ws, wsb), DSV4_OK);
        for (int64_t gi = 0; gi < g; gi++) {
            dsv4_tensor xg, wg, sg, yg;
            dsv4_tensor_slice(&tx, 1, gi, gi + 1, &xg);
            xg.ndim = 2;
            xg.stride[1] = 1;
            xg.shape[1] = k;
            dsv4_tensor_slice(&tw, 0, gi * r, gi * r + r, &wg);
            if (c.fmt == DSV4_LINEAR_FP8_B128)
                dsv4_tensor_slice(&ts, 0, gi, gi + 1, &sg);
            else
                dsv4_tensor_slice(&ts, 0, gi * r, gi * r + r, &sg);
            const int64_t ysh[2] = {t, r};
            dsv4_tensor_init(&yg, ys, DSV4_F32, 2, ysh);
            CHECK_STATUS(dsv4_linear(NULL, c.fmt, &xg, &wg, sp ? &sg : NULL, NULL, &yg, ws, wsb), DSV4_OK);
            int same = 1;
            for (int64_t i = 0; i < t; i++) same &= !memcmp(ys + i * r, y + (i * g + gi) * r, sizeof(float) * (size_t)r);
            CHECK(same, "%s: group %lld differs from its separate product", dsv4_linear_format_name(c.fmt), (long long)gi);
        }
        free(ws);
        free(x);
        free(y);
        free(ys);
        wcase_free(&c);
    }
}

/* Bad input: an error status and message, outputs and work space untouched. */
static void test_bad_input(void)
{
    enum { M = 2, N = 64, K = 256 };
    wcase c;
    wcase_make(&c, DSV4_LINEAR_MXFP8, N, K, 0, 0);
    float x[M * K], y[M * N], poison[M * N];
    for (int i = 0; i < M * K; i++) x[i] = test_randn();
    memset(poison, 0xA5, sizeof poison);
    memcpy(y, poison, sizeof y);
    static uint8_t ws[M * (K * 5 + K / 32 * 4 + 64) + 128]; /* the AVX2 staging (values, scales, codes) is the widest */
    size_t wsb = 0;
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, DSV4_LINEAR_MXFP8, M, K, &wsb), DSV4_OK);
    CHECK(wsb <= sizeof ws, "workspace size %zu", wsb);
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, DSV4_LINEAR_BF16, M, K, &wsb), DSV4_OK);
    CHECK(wsb == 0, "bf16 needs no work space");
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, DSV4_LINEAR_MXFP8, M, 48, &wsb), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, (dsv4_linear_format)9, M, K, &wsb), DSV4_ERR_INVALID_ARG);
    wsb = sizeof ws;

    dsv4_tensor tx, tw, ts, ty, t;
    const int64_t xs[2] = {M, K}, ys[2] = {M, N};
    dsv4_tensor_init(&tx, x, DSV4_F32, 2, xs);
    dsv4_tensor_init(&ty, y, DSV4_F32, 2, ys);
    wcase_views(&c, &tw, &ts);
    const dsv4_linear_format F = DSV4_LINEAR_MXFP8;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &ty, ws, wsb), DSV4_OK); /* the good call */
    memcpy(y, poison, sizeof y);

    t = tx; /* K not a multiple of 32 */
    t.shape[1] = 48;
    dsv4_tensor w48 = tw, s48 = ts;
    w48.shape[1] = 48;
    s48.shape[1] = 1;
    CHECK_STATUS(dsv4_linear(NULL, F, &t, &w48, &s48, NULL, &ty, ws, wsb), DSV4_ERR_SHAPE);
    t = ts; /* scale shape */
    t.shape[1] = 4;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &t, NULL, &ty, ws, wsb), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, NULL, NULL, &ty, ws, wsb), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_linear(NULL, DSV4_LINEAR_BF16, &tx, &tw, &ts, NULL, &ty, ws, wsb), DSV4_ERR_DTYPE);
    t = tw; /* wrong dtypes */
    t.dtype = DSV4_I32;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &t, &ts, NULL, &ty, ws, wsb), DSV4_ERR_DTYPE);
    t = tx;
    t.dtype = DSV4_I32;
    CHECK_STATUS(dsv4_linear(NULL, F, &t, &tw, &ts, NULL, &ty, ws, wsb), DSV4_ERR_DTYPE);
    t = ts;
    t.dtype = DSV4_F32;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &t, NULL, &ty, ws, wsb), DSV4_ERR_DTYPE);
    t = tx; /* strided K */
    t.stride[1] = 2;
    t.shape[1] = K / 2;
    CHECK_STATUS(dsv4_linear(NULL, F, &t, &tw, &ts, NULL, &ty, ws, wsb), DSV4_ERR_STRIDE);
    t = ty; /* y shape, y overlapping x */
    t.shape[1] = N - 1;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &t, ws, wsb), DSV4_ERR_SHAPE);
    t = ty;
    t.data = x;
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &t, ws, wsb), DSV4_ERR_INVALID_ARG);
    /* work space: too small, null, overlapping x */
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &ty, ws, 16), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &ty, NULL, wsb), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &ty, x, wsb), DSV4_ERR_INVALID_ARG);
    /* bias shape, unknown format, grouped rows not a multiple of G */
    float bias[N + 1];
    const int64_t bs[1] = {N + 1};
    dsv4_tensor tb;
    dsv4_tensor_init(&tb, bias, DSV4_F32, 1, bs);
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, &tb, &ty, ws, wsb), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_linear(NULL, (dsv4_linear_format)7, &tx, &tw, &ts, NULL, &ty, ws, wsb), DSV4_ERR_INVALID_ARG);
    const int64_t x3[3] = {1, 3, K}, y3[3] = {1, 3, 21};
    dsv4_tensor tx3, ty3;
    dsv4_tensor_init(&tx3, x, DSV4_F32, 3, x3);
    dsv4_tensor_init(&ty3, y, DSV4_F32, 3, y3);
    CHECK_STATUS(dsv4_grouped_linear(NULL, F, &tx3, &tw, &ts, &ty3, ws, wsb), DSV4_ERR_SHAPE);
    CHECK(!memcmp(y, poison, sizeof y), "an output was written on error");

    /* M = 0 does nothing */
    const int64_t x0[2] = {0, K}, y0[2] = {0, N};
    dsv4_tensor_init(&tx, x, DSV4_F32, 2, x0);
    dsv4_tensor_init(&ty, y, DSV4_F32, 2, y0);
    CHECK_STATUS(dsv4_linear(NULL, F, &tx, &tw, &ts, NULL, &ty, ws, wsb), DSV4_OK);
    CHECK(!memcmp(y, poison, sizeof y), "M = 0 wrote");
    wcase_free(&c);
}

/* ---- staging (dsv4_linear_stage / dsv4_linear_staged) ----------------------------------- */
typedef struct path {
    const char *backend, *isa; /* isa NULL: no cap */
} path;
static const path paths[] = {{"cpu-ref", NULL}, {"cpu", "scalar"}, {"cpu", "avx2"}, {"cpu", "avx512"}};

static const dsv4_tensor *scale_of(const wcase *c, const dsv4_tensor *ts) { return c->fmt <= DSV4_LINEAR_FP4 ? ts : NULL; }

/* y (F32 [m, n]) of x times c, unstaged (staged = 0) or from the staging in ws (staged = 1). */
static dsv4_status product_of(dsv4_ctx *ctx, const wcase *c, const dsv4_tensor *x, const dsv4_tensor *bias, float *y,
                              void *ws, size_t wsb, int staged)
{
    dsv4_tensor tw, ts, ty;
    const int64_t ys[2] = {x->shape[0], c->n};
    dsv4_tensor_init(&ty, y, DSV4_F32, 2, ys);
    wcase_views(c, &tw, &ts);
    return (staged ? dsv4_linear_staged : dsv4_linear)(ctx, c->fmt, x, &tw, scale_of(c, &ts), bias, &ty, ws, wsb);
}

/* Staged == unstaged bit for bit, for every quantized format, path and thread count: one staging
 * feeds two weights (w1 and w3 of an expert), and an act128 staging feeds both act128 formats
 * (FP8_B128 then FP4 then FP8_B128 again: the AVX-512 arrangements differ); x is read only for its
 * shape; BF16/F32 stage nothing and run as dsv4_linear. */
static void test_staged(void)
{
    for (int pi = 0; pi < 4; pi++)
        for (int threads = 1; threads <= 2; threads++) {
            dsv4_ctx *ctx = test_ctx(paths[pi].backend, threads, paths[pi].isa);
            for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
                const dsv4_linear_format fmt = (dsv4_linear_format)f;
                const int64_t k = fmt == DSV4_LINEAR_MXFP8 ? 1120 : 1248, xld = k + 8; /* act128 edge block */
                const int64_t m = (threads == 1 ? 1 : 60) + pi % 2; /* 60 rows: staged by 2 threads */
                wcase w1, w3, other; /* other: the other act128 format (FP8_B128 <-> FP4) */
                wcase_make(&w1, fmt, 77, k, 1, 1);
                wcase_make(&w3, fmt, 130, k, 0, 0);
                const int act128 = fmt == DSV4_LINEAR_FP8_B128 || fmt == DSV4_LINEAR_FP4;
                wcase_make(&other, fmt == DSV4_LINEAR_FP4 ? DSV4_LINEAR_FP8_B128 : DSV4_LINEAR_FP4, 40, k, 0, 0);
                const int x_bf16 = f % 2;
                void *xbuf = calloc((size_t)(m * xld), 4), *zeros = calloc((size_t)(m * k), 4);
                for (int64_t i = 0; i < m * xld; i++) {
                    const float v = test_randn() * (i % xld < 300 ? 20.0f : 1.0f);
                    if (x_bf16)
                        ((uint16_t *)xbuf)[i] = dsv4_bf16_encode(v);
                    else
                        ((float *)xbuf)[i] = v;
                }
                dsv4_tensor tx, tz, tb;
                const int64_t xs[2] = {m, k}, xst[2] = {xld, 1}, bs[1] = {w1.n};
                dsv4_tensor_init_strided(&tx, xbuf, x_bf16 ? DSV4_BF16 : DSV4_F32, 2, xs, xst);
                dsv4_tensor_init(&tz, zeros, DSV4_F32, 2, xs); /* the shape of x, other values */
                float bias[77];
                for (int i = 0; i < 77; i++) bias[i] = test_randn();
                dsv4_tensor_init(&tb, bias, DSV4_F32, 1, bs);
                size_t wsb = 0;
                CHECK_STATUS(dsv4_linear_workspace_size(ctx, fmt, m, k, &wsb), DSV4_OK);
                const size_t wsa = wsb ? wsb : 64; /* BF16/F32: a poisoned work space they must not touch */
                uint8_t *ws = malloc(wsa), *ws2 = malloc(wsa);
                float *a1 = malloc(sizeof(float) * (size_t)(m * 130)), *b1 = malloc(sizeof(float) * (size_t)(m * 130));
                float *a3 = malloc(sizeof(float) * (size_t)(m * 130)), *b3 = malloc(sizeof(float) * (size_t)(m * 130));
                float *ao = malloc(sizeof(float) * (size_t)(m * 130)), *bo = malloc(sizeof(float) * (size_t)(m * 130));
                CHECK_STATUS(product_of(ctx, &w1, &tx, &tb, a1, ws2, wsb, 0), DSV4_OK);
                CHECK_STATUS(product_of(ctx, &w3, &tx, NULL, a3, ws2, wsb, 0), DSV4_OK);
                if (act128) CHECK_STATUS(product_of(ctx, &other, &tx, NULL, ao, ws2, wsb, 0), DSV4_OK);
                memset(ws, 0xA5, wsa);
                CHECK_STATUS(dsv4_linear_stage(ctx, fmt, &tx, ws, wsa), DSV4_OK);
                if (fmt > DSV4_LINEAR_FP4) {
                    int same = 1;
                    for (size_t i = 0; i < wsa; i++) same &= ws[i] == 0xA5;
                    CHECK(same, "%s: staging wrote the work space", dsv4_linear_format_name(fmt));
                }
                for (int64_t i = 0; i < m * 130; i++) b1[i] = b3[i] = bo[i] = NAN;
                /* BF16/F32 read x: give them x itself; the quantized formats only its shape */
                const dsv4_tensor *xs_view = fmt <= DSV4_LINEAR_FP4 ? &tz : &tx;
                CHECK_STATUS(product_of(ctx, &w1, xs_view, &tb, b1, ws, wsb, 1), DSV4_OK);
                if (act128) CHECK_STATUS(product_of(ctx, &other, xs_view, NULL, bo, ws, wsb, 1), DSV4_OK);
                CHECK_STATUS(product_of(ctx, &w3, xs_view, NULL, b3, ws, wsb, 1), DSV4_OK);
                const char *where = paths[pi].isa ? paths[pi].isa : paths[pi].backend;
                CHECK(!memcmp(a1, b1, sizeof(float) * (size_t)(m * w1.n)), "%s %s t=%d: staged w1 differs",
                      dsv4_linear_format_name(fmt), where, threads);
                CHECK(!memcmp(a3, b3, sizeof(float) * (size_t)(m * w3.n)), "%s %s t=%d: staged w3 differs",
                      dsv4_linear_format_name(fmt), where, threads);
                if (act128)
                    CHECK(!memcmp(ao, bo, sizeof(float) * (size_t)(m * other.n)), "%s %s t=%d: staged %s differs",
                          dsv4_linear_format_name(fmt), where, threads, dsv4_linear_format_name(other.fmt));
                free(ws);
                free(ws2);
                free(a1);
                free(b1);
                free(a3);
                free(b3);
                free(ao);
                free(bo);
                free(xbuf);
                free(zeros);
                wcase_free(&w1);
                wcase_free(&w3);
                wcase_free(&other);
            }
            dsv4_ctx_destroy(ctx);
        }
}

/* Bad staging input: an error, y untouched (and the work space for dsv4_linear_stage); a failed
 * staged call leaves the staging usable. */
static void test_staged_bad_input(void)
{
    enum { M = 3, N = 40, K = 256 };
    wcase c, cb128, cmx, ck;
    wcase_make(&c, DSV4_LINEAR_FP4, N, K, 0, 0);
    wcase_make(&cb128, DSV4_LINEAR_FP8_B128, N, K, 0, 0);
    wcase_make(&cmx, DSV4_LINEAR_MXFP8, N, K, 0, 0);
    wcase_make(&ck, DSV4_LINEAR_FP4, N, K + 128, 0, 0);
    float x[M * (K + 128)], y[M * N], poison[M * N], good[M * N];
    for (int i = 0; i < M * (K + 128); i++) x[i] = test_randn();
    memset(poison, 0xA5, sizeof poison);
    memcpy(y, poison, sizeof y);
    dsv4_tensor tx, t;
    const int64_t xs[2] = {M, K};
    dsv4_tensor_init(&tx, x, DSV4_F32, 2, xs);
    size_t wsb = 0;
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, DSV4_LINEAR_FP4, M, K + 128, &wsb), DSV4_OK);
    uint8_t *ws = malloc(wsb), *before = malloc(wsb);
    const dsv4_linear_format F = DSV4_LINEAR_FP4;

    /* stage: too small, null, unknown format, K, dtype, overlapping x; the work space untouched */
    size_t need = 0;
    CHECK_STATUS(dsv4_linear_workspace_size(NULL, F, M, K, &need), DSV4_OK);
    memset(ws, 0x5A, wsb);
    memcpy(before, ws, wsb);
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &tx, ws, need - 1), DSV4_ERR_INVALID_ARG);
    CHECK(strstr(dsv4_last_error(), "work space") != NULL, "message: %s", dsv4_last_error());
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &tx, NULL, need), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_linear_stage(NULL, (dsv4_linear_format)7, &tx, ws, wsb), DSV4_ERR_INVALID_ARG);
    t = tx;
    t.shape[1] = 48;
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &t, ws, wsb), DSV4_ERR_SHAPE);
    t = tx;
    t.dtype = DSV4_I32;
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &t, ws, wsb), DSV4_ERR_DTYPE);
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &tx, x, wsb), DSV4_ERR_INVALID_ARG);
    CHECK(!memcmp(ws, before, wsb), "a failed stage wrote the work space");

    /* staged: no staging at all, then with a good staging: wrong family, rows, K, path, size */
    CHECK_STATUS(product_of(NULL, &c, &tx, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG);
    CHECK(strstr(dsv4_last_error(), "no staging") != NULL, "message: %s", dsv4_last_error());
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &tx, ws, wsb), DSV4_OK);
    CHECK_STATUS(product_of(NULL, &cmx, &tx, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG); /* act128 -> mx32 */
    CHECK(strstr(dsv4_last_error(), "mxfp8") != NULL, "message: %s", dsv4_last_error());
    t = tx;
    t.shape[0] = M - 1;
    CHECK_STATUS(product_of(NULL, &c, &t, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG); /* rows */
    const int64_t xks[2] = {M, K + 128};
    dsv4_tensor txk;
    dsv4_tensor_init(&txk, x, DSV4_F32, 2, xks);
    CHECK_STATUS(product_of(NULL, &ck, &txk, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG); /* K */
    CHECK_STATUS(product_of(NULL, &c, &tx, NULL, y, ws, need - 1, 1), DSV4_ERR_INVALID_ARG); /* size */
    CHECK_STATUS(product_of(NULL, &c, &tx, NULL, y, NULL, wsb, 1), DSV4_ERR_INVALID_ARG);
    dsv4_tensor tw, ts, ty;
    const int64_t ys[2] = {M, N};
    dsv4_tensor_init(&ty, y, DSV4_F32, 2, ys);
    wcase_views(&c, &tw, &ts);
    CHECK_STATUS(dsv4_linear_staged(NULL, (dsv4_linear_format)9, &tx, &tw, &ts, NULL, &ty, ws, wsb),
                 DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_linear_staged(NULL, DSV4_LINEAR_FP8_B128, &tx, &tw, &ts, NULL, &ty, ws, wsb), DSV4_ERR_DTYPE);
    /* staged by the scalar kernels, consumed by AVX2 ones */
    dsv4_ctx *ref = make_ctx("cpu-ref", 1), *fast = test_ctx("cpu", 1, "avx2");
    if (strcmp(dsv4_ctx_cpu_isa(fast), "scalar") != 0) {
        CHECK_STATUS(dsv4_linear_stage(ref, F, &tx, ws, wsb), DSV4_OK);
        CHECK_STATUS(product_of(fast, &c, &tx, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG);
        CHECK(strstr(dsv4_last_error(), "kernels") != NULL, "message: %s", dsv4_last_error());
        CHECK_STATUS(product_of(ref, &c, &tx, NULL, good, ws, wsb, 1), DSV4_OK);
    }
    dsv4_ctx_destroy(ref);
    dsv4_ctx_destroy(fast);
    CHECK(!memcmp(y, poison, sizeof y), "an output was written on error");

    /* mx32 staging -> act128 weights; then the staging still serves its own format */
    CHECK_STATUS(dsv4_linear_stage(NULL, DSV4_LINEAR_MXFP8, &tx, ws, wsb), DSV4_OK);
    CHECK_STATUS(product_of(NULL, &cb128, &tx, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(product_of(NULL, &c, &tx, NULL, y, ws, wsb, 1), DSV4_ERR_INVALID_ARG);
    CHECK(!memcmp(y, poison, sizeof y), "an output was written on error");
    CHECK_STATUS(product_of(NULL, &cmx, &tx, NULL, y, ws, wsb, 1), DSV4_OK);
    CHECK_STATUS(product_of(NULL, &cmx, &tx, NULL, good, before, wsb, 0), DSV4_OK);
    CHECK(!memcmp(y, good, sizeof y), "mxfp8 staged after failed calls differs");

    /* M = 0: nothing to do */
    const int64_t x0[2] = {0, K};
    dsv4_tensor tx0;
    dsv4_tensor_init(&tx0, x, DSV4_F32, 2, x0);
    CHECK_STATUS(dsv4_linear_stage(NULL, F, &tx0, ws, wsb), DSV4_OK);
    free(ws);
    free(before);
    wcase_free(&c);
    wcase_free(&cb128);
    wcase_free(&cmx);
    wcase_free(&ck);
}

/* Non-finite activations (documented): the row of y is NaN for the quantized formats. */
static void test_nonfinite(void)
{
    enum { M = 3, N = 20, K = 128 };
    for (int f = 0; f <= DSV4_LINEAR_FP4; f++) {
        wcase c;
        wcase_make(&c, (dsv4_linear_format)f, N, K, 0, 0);
        float x[M * K], y[M * N];
        for (int i = 0; i < M * K; i++) x[i] = test_randn();
        x[K + 7] = NAN;
        x[2 * K + 100] = -INFINITY;
        CHECK_STATUS(run_linear(NULL, &c, x, M, y), DSV4_OK);
        int ok = 1;
        for (int j = 0; j < N; j++) ok &= isfinite(y[j]) && isnan(y[N + j]) && isnan(y[2 * N + j]);
        CHECK(ok, "%s: non-finite rows", dsv4_linear_format_name(c.fmt));
        wcase_free(&c);
    }
}

/* The float64 weights of c again after its codes or scales were changed (canonical scale layout). */
static void wq_again(wcase *c)
{
    for (int64_t r = 0; r < c->n; r++)
        for (int64_t j = 0; j < c->k; j++) {
            const int fp4 = c->fmt == DSV4_LINEAR_FP4;
            const uint8_t b = fp4 ? (uint8_t)((c->w[r * c->wld + j / 2] >> (4 * (j & 1))) & 0xF) : c->w[r * c->wld + j];
            const int64_t si = c->fmt == DSV4_LINEAR_FP8_B128 ? (r / 128) * c->scols + j / 128 : r * c->scols + j / 32;
            c->wq[r * c->k + j] = (fp4 ? dsv4_e2m1_decode(b) : dsv4_e4m3_decode(b)) * e8m0(c->s[si]);
        }
}

/* y within TOL * sum|x w| of the float64 evaluation (NaN where it is NaN) on every ISA and cpu-ref;
 * x F32 [m, k]. Returns the number of outputs off. */
static int off_float64(const wcase *c, const float *x, int64_t m, const char *what)
{
    const char *const *isas = test_isas;
    float *y = malloc(sizeof(float) * (size_t)(m * c->n));
    double *xq = malloc(sizeof(double) * (size_t)(m * c->k));
    act_dequant(c->fmt, x, m, c->k, xq);
    int all = 0;
    for (int is = 0; is < 4; is++) {
        dsv4_ctx *ctx = is < 3 ? test_ctx("cpu", 2, isas[is]) : make_ctx("cpu-ref", 2);
        for (int64_t i = 0; i < m * c->n; i++) y[i] = 0.0f;
        CHECK_STATUS(run_linear(ctx, c, x, m, y), DSV4_OK);
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double acc = 0, mag = 0;
                for (int64_t q = 0; q < c->k; q++) {
                    acc += xq[i * c->k + q] * c->wq[j * c->k + q];
                    mag += fabs(xq[i * c->k + q] * c->wq[j * c->k + q]);
                }
                const float v = y[i * c->n + j];
                bad += isnan(acc) ? !isnan(v) : !(fabs(v - acc) <= TOL * mag);
            }
        CHECK(bad == 0, "%s m=%lld %s: %d outputs off the float64 evaluation (%s)", dsv4_linear_format_name(c->fmt),
              (long long)m, is < 3 ? isas[is] : "cpu-ref", bad, what);
        all += bad;
        dsv4_ctx_destroy(ctx);
    }
    free(y);
    free(xq);
    return all;
}

/* s_x * s_w = 2^127 (x group 0 of scale 1, weight scale byte 254): twice the scale (2^7 times it
 * for FP4) overflows, so the AVX2 path multiplies the block sum instead (linear_avx2.c
 * pair_scales). One small product per row in that block keeps y finite (2^118 and less). */
static void test_scale_overflow(void)
{
    enum { N = 9, K = 256, M = 2 };
    for (int f = 0; f <= DSV4_LINEAR_FP4; f++) {
        const int fp4 = f == DSV4_LINEAR_FP4;
        wcase c;
        wcase_make(&c, (dsv4_linear_format)f, N, K, 0, 0);
        for (int64_t r = 0; r < N; r++) {
            memset(c.w + r * c.wld, 0, 32);
            const int q = 5 + (int)(r % 3);
            if (fp4) /* +-0.5 */
                c.w[r * c.wld + q / 2] = (uint8_t)((r % 4 == 0 ? 0x9 : 0x1) << (4 * (q & 1)));
            else
                c.w[r * c.wld + q] = (uint8_t)(0x01 + 8 * (r % 4)); /* 2^-9 up to 1.125 * 2^-4 */
        }
        for (int64_t r = 0; r < c.srows; r++) c.s[r * c.scols] = 254;
        wq_again(&c);
        float x[M * K];
        for (int i = 0; i < M * K; i++) x[i] = i % K < 128 ? 0.0f : test_randn();
        for (int i = 0; i < M; i++) {
            x[i * K] = 400.0f; /* the group's scale: 1 */
            for (int q = 5; q < 8; q++) /* FP4: E4M3 subnormals, up to 2^-7 */
                x[i * K + q] = fp4 ? 0x1p-9f * (float)(q - 4 + i) : 0.5f + (float)(q + i);
        }
        off_float64(&c, x, M, "s_x * s_w = 2^127");
        wcase_free(&c);
    }
}

/* Special weight codes and scale bytes, every ISA against the float64 evaluation: NaN codes
 * (0x7F, 0xFF) and a NaN scale (255) make their rows NaN; scale byte 0 (the subnormal 2^-127), 1
 * and 247 (2^120, where the AVX2 FP8 path keeps its partial sums unscaled: linear_avx2.c
 * chunk_scales) give finite rows. x is large in its first 32 elements, so the block of scale
 * byte 0 carries the row, and small in elements 128-255, so 2^120 does not overflow. */
static void test_special_weights(void)
{
    enum { N = 45, K = 1152 };
    const int64_t ms[] = {1, 2, 5};
    for (int f = 0; f <= DSV4_LINEAR_FP4; f++) {
        wcase c;
        wcase_make(&c, (dsv4_linear_format)f, N, K, 0, 0);
        if (f == DSV4_LINEAR_FP8_B128) {
            c.s[0] = 0;
            c.s[1] = 247;
            c.s[4] = 1;
        } else {
            c.s[7 * c.scols + 0] = 0;
            c.s[9 * c.scols + 4] = 247;
            c.s[8 * c.scols + 20] = 1;
            c.s[2 * c.scols + 9] = 255;
            for (int j = 288; j < 320; j++) /* positive products: a NaN scale read as Inf gives Inf */
                if (f == DSV4_LINEAR_FP4)
                    c.w[2 * c.wld + j / 2] = 0x22; /* 1.0, 1.0 */
                else
                    c.w[2 * c.wld + j] = 0x38; /* 1.0 */
        }
        if (f != DSV4_LINEAR_FP4) {
            c.w[5 * c.wld + K - 3] = 0x7F;
            c.w[11 * c.wld + 40] = 0xFF;
        }
        wq_again(&c);
        for (int mi = 0; mi < 3; mi++) {
            const int64_t m = ms[mi];
            float *x = malloc(sizeof(float) * (size_t)(m * K));
            for (int64_t i = 0; i < m * K; i++) {
                const int64_t q = i % K;
                x[i] = test_randn() * (q < 32 ? 0x1p90f : q >= 128 && q < 256 ? 0x1p-20f : 0x1p-30f);
                if (q >= 288 && q < 320) x[i] = fabsf(x[i]);
            }
            off_float64(&c, x, m, "special codes and scales");
            free(x);
        }
        wcase_free(&c);
    }
}

int main(void)
{
    test_seed();
    test_formats();
    test_threads_and_views();
    test_rows_independent();
    test_grouped();
    test_bad_input();
    test_staged();
    test_staged_bad_input();
    test_nonfinite();
    test_special_weights();
    test_scale_overflow();
    TEST_DONE();
}
