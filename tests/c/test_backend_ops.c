/* Conformance of every backend against the scalar reference, op by op (in the manner of ggml's
 * test-backend-ops). For each registered backend other than cpu-ref — and for cpu once per ISA
 * level this machine has — every op family runs its cases on that backend and on cpu-ref with the
 * same inputs, each in its own backend's memory (the device API of include/dsv4/device.h: host
 * memory for the CPU backends, device memory for accelerators; outputs are poisoned first), and
 * the results are compared bit for bit where the contract makes them identical across backends,
 * within a tolerance stated at the comparison otherwise. An entry a backend leaves NULL
 * (core/backend.h) is reported as skipped, and so is a backend that cannot run here (no device).
 * The cases follow the families' own tests (tests/c/test_formats in test_core.c, test_linear.c,
 * test_layer.c, test_tensor_ops.c, test_attention.c, test_indexer.c); the float64 oracles are the
 * Python tests. */
#include "core/backend.h"
#include "core/ops_attention.h"
#include "core/ops_formats.h"
#include "core/ops_indexer.h"
#include "core/ops_layer.h"
#include "core/ops_linear.h"
#include "core/ops_tensor.h"
#include "dsv4.h"
#include "formats/kv_entry.h"
#include "test_linear_cases.h"
#include "test_util.h"

static dsv4_ctx *ref;          /* cpu-ref */
static dsv4_ctx *tc;           /* the backend under test */
static const dsv4_backend *tb; /* its op tables */
static char target[48];        /* "cuda", "cpu[avx2]", ... */
static int n_compared, n_skipped;

/* ---- memory of a backend -------------------------------------------------------------------- */
enum { MAX_BUFS = 256 };
static struct {
    dsv4_ctx *c;
    void *p;
} bufs[MAX_BUFS];
static int nbufs;

static void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", target, what, dsv4_last_error());
    exit(1);
}

/* Bytes a view spans from its data pointer (0 for an empty view). */
static size_t extent(const dsv4_tensor *t)
{
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return (size_t)(last + 1) * dsv4_dtype_size(t->dtype);
}

static void *poisoned(size_t bytes);

/* `bytes` of host data copied into c's memory (freed by release()). */
static void *put(dsv4_ctx *c, const void *host, size_t bytes)
{
    void *p = NULL;
    if (nbufs == MAX_BUFS || dsv4_device_alloc(c, bytes ? bytes : 1, &p) != DSV4_OK) die("device_alloc");
    bufs[nbufs].c = c;
    bufs[nbufs++].p = p;
    if (bytes && dsv4_device_upload(c, p, host, bytes) != DSV4_OK) die("device_upload");
    return p;
}

/* A poisoned work space of `bytes` in c's memory. */
static void *scratch(dsv4_ctx *c, size_t bytes)
{
    uint8_t *z = poisoned(bytes);
    void *p = put(c, z, bytes);
    free(z);
    return p;
}

static void release(void)
{
    for (int i = 0; i < nbufs; i++) dsv4_device_free(bufs[i].c, bufs[i].p);
    nbufs = 0;
}

/* The same view over a copy of its bytes in c's memory. */
static dsv4_tensor on(dsv4_ctx *c, const dsv4_tensor *host)
{
    dsv4_tensor d = *host;
    d.data = put(c, host->data, extent(host));
    d.device = dsv4_ctx_device_kind(c);
    d.device_index = 0;
    return d;
}

/* The bytes of view d (in c's memory) into the host buffer `host` (laid out as d). */
static void back(dsv4_ctx *c, const dsv4_tensor *d, void *host)
{
    size_t n = extent(d);
    if (n && dsv4_device_download(c, host, d->data, n) != DSV4_OK) die("device_download");
}

static dsv4_tensor view(void *p, dsv4_dtype dt, int nd, int64_t a, int64_t b, int64_t c)
{
    dsv4_tensor t;
    const int64_t shape[3] = {a, b, c};
    dsv4_tensor_init(&t, p, dt, nd, shape);
    return t;
}

static void *poisoned(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    memset(p, 0xA5, bytes);
    return p;
}

static uint16_t *bf16_rand(size_t n, float scale)
{
    uint16_t *p = malloc(2 * n + 2);
    for (size_t i = 0; i < n; i++) p[i] = dsv4_bf16_encode(scale * test_randn());
    return p;
}

static float *f32_rand(size_t n, float scale, float offset)
{
    float *p = malloc(4 * n + 4);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * test_randn();
    return p;
}

static uint8_t *bytes_rand(size_t n, unsigned lo, unsigned span)
{
    uint8_t *p = malloc(n + 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(lo + test_rand_u64() % span);
    return p;
}

/* ---- entries and comparisons ------------------------------------------------------------------ */
/* An op whose entries the backend leaves NULL is skipped (and said so once per case). */
static int missing(const char *op, int have)
{
    if (!have) {
        printf("  %-10s %-28s skipped: %s leaves it NULL\n", target, op, tb->name);
        n_skipped++;
    }
    return !have;
}
#define HAS(family, entry) (tb->family && tb->family->entry)

static void ran(const char *op, dsv4_status s, dsv4_status sr)
{
    CHECK(sr == DSV4_OK, "%s on cpu-ref: %s", op, dsv4_last_error());
    CHECK(s == DSV4_OK, "%s on %s: %s", op, target, dsv4_last_error());
}

/* Bit-identical results. */
static void same(const char *op, const char *what, const void *a, const void *b, size_t bytes)
{
    n_compared++;
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (i < bytes && x[i] == y[i]) i++;
    CHECK(i == bytes, "%s %s on %s: byte %zu of %zu differs from cpu-ref (0x%02x vs 0x%02x)", op, what, target, i,
          bytes, i < bytes ? x[i] : 0, i < bytes ? y[i] : 0);
    size_t p = 0; /* outputs start poisoned (0xA5): equal poison would compare equal */
    while (p < bytes && y[p] == 0xA5) p++;
    CHECK(bytes < 16 || p < bytes, "%s %s: cpu-ref left the output unwritten", op, what);
}

/* F32 values bit for bit, except that a NaN matches a NaN of either sign: a NaN scale byte or
 * code times a number is NaN by the rules (dsv4/formats.h), and which operand's sign the product
 * keeps is the instruction's choice (the AVX-512 dequantize keeps another than the scalar code). */
static void same_f32(const char *op, const char *what, const float *a, const float *b, size_t n)
{
    n_compared++;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i])) && !bad++) first = i;
    CHECK(bad == 0, "%s %s on %s: %zu of %zu values differ from cpu-ref (first %zu: %a vs %a)", op, what, target, bad,
          n, first, bad ? a[first] : 0.0f, bad ? b[first] : 0.0f);
}

/* Within the BF16 closeness of test_util.h: one BF16 ulp plus 1e-5 of the largest magnitude. */
static void near_bf16(const char *op, const char *what, const uint16_t *a, const uint16_t *b, size_t n)
{
    n_compared++;
    CHECK(bf16_close(a, b, n), "%s %s on %s: beyond one BF16 ulp (+1e-5 of the largest) of cpu-ref", op, what,
          target);
}

static void near_f32(const char *op, const char *what, const float *a, const float *b, size_t n, float atol)
{
    n_compared++;
    CHECK(f32_close(a, b, n, atol), "%s %s on %s: beyond %g of cpu-ref", op, what, target, atol);
}

/* ---- formats: element codecs and block rules are exact, so bit for bit (dsv4/formats.h) ---- */
static void formats_codecs(void)
{
    enum { N = 1031 };
    float *x = f32_rand(N, 30.0f, 0.0f);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 465.0f, 1e-9f, -6.0f, 0.25f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[i * 97] = special[i];
    static const dsv4_scalar_format enc[] = {DSV4_FMT_E4M3, DSV4_FMT_BF16, DSV4_FMT_E2M1};
    if (!missing("formats.encode", HAS(formats, encode)))
        for (int f = 0; f < 3; f++) {
            size_t cb = (enc[f] == DSV4_FMT_BF16 ? 2 : 1) * (size_t)N;
            uint8_t *hr = poisoned(cb), *ht = poisoned(cb);
            void *dr = put(ref, hr, cb), *dt = put(tc, ht, cb);
            float *xr = put(ref, x, sizeof(float) * N), *xt = put(tc, x, sizeof(float) * N);
            ran("encode_array", dsv4_encode_array(tc, enc[f], xt, N, dt), dsv4_encode_array(ref, enc[f], xr, N, dr));
            dsv4_device_download(ref, hr, dr, cb);
            dsv4_device_download(tc, ht, dt, cb);
            same("encode_array", "codes", ht, hr, cb);
            free(hr), free(ht);
            release();
        }
    static const dsv4_scalar_format dec[] = {DSV4_FMT_E4M3, DSV4_FMT_BF16, DSV4_FMT_E2M1, DSV4_FMT_E8M0};
    uint16_t codes[4096];
    for (int i = 0; i < 4096; i++) codes[i] = (uint16_t)(i < 256 ? (uint64_t)i * 257 : test_rand_u64());
    uint8_t bytes[4096];
    for (int i = 0; i < 4096; i++) bytes[i] = (uint8_t)i;
    if (!missing("formats.decode", HAS(formats, decode)))
        for (int f = 0; f < 4; f++) {
            const void *src = dec[f] == DSV4_FMT_BF16 ? (const void *)codes : (const void *)bytes;
            size_t cb = (dec[f] == DSV4_FMT_BF16 ? 2 : 1) * 4096u;
            float *hr = poisoned(4 * 4096), *ht = poisoned(4 * 4096);
            void *cr = put(ref, src, cb), *ct = put(tc, src, cb);
            float *dr = put(ref, hr, 4 * 4096), *dt = put(tc, ht, 4 * 4096);
            ran("decode_array", dsv4_decode_array(tc, dec[f], ct, 4096, dt),
                dsv4_decode_array(ref, dec[f], cr, 4096, dr));
            dsv4_device_download(ref, hr, dr, 4 * 4096);
            dsv4_device_download(tc, ht, dt, 4 * 4096);
            same("decode_array", "values", ht, hr, 4 * 4096); /* NaN payloads included */
            free(hr), free(ht);
            release();
        }
    free(x);
}

static void formats_rules(void)
{
    enum { R = 5, K = 256, LD = K + 16 };
    float *x = f32_rand(R * LD, 4.0f, 0.0f);
    x[3] = NAN, x[LD + 7] = INFINITY, x[2 * LD] = 1e30f;
    for (int k = 0; k < K; k++) x[3 * LD + k] = 0.0f; /* an all-zero row */
    for (int rule = 0; rule < DSV4_QRULE_COUNT; rule++) {
        const int g = dsv4_qrule_group((dsv4_qrule)rule);
        dsv4_tensor hx;
        dsv4_tensor_init_strided(&hx, x, DSV4_F32, 2, (int64_t[]){R, K}, (int64_t[]){LD, 1});
        if (!missing("formats.quantize_rows", HAS(formats, quantize_rows))) {
            uint8_t *cr = poisoned(R * K), *ct = poisoned(R * K), *sr = poisoned(R * K / g), *st = poisoned(R * K / g);
            dsv4_tensor hc = view(cr, DSV4_U8, 2, R, K, 0), hs = view(sr, DSV4_U8, 2, R, K / g, 0);
            dsv4_tensor xr = on(ref, &hx), xt = on(tc, &hx), c_r = on(ref, &hc), c_t = on(tc, &hc), s_r = on(ref, &hs),
                        s_t = on(tc, &hs);
            ran("quantize", dsv4_quantize(tc, (dsv4_qrule)rule, &xt, &c_t, &s_t),
                dsv4_quantize(ref, (dsv4_qrule)rule, &xr, &c_r, &s_r));
            back(ref, &c_r, cr), back(tc, &c_t, ct), back(ref, &s_r, sr), back(tc, &s_t, st);
            same("quantize", dsv4_qrule_name((dsv4_qrule)rule), ct, cr, R * K);
            same("quantize", "scales", st, sr, R * K / g);
            free(cr), free(ct), free(sr), free(st);
            release();
        }
        if (!missing("formats.dequantize_rows", HAS(formats, dequantize_rows))) {
            uint8_t *codes = bytes_rand(R * K, 0, rule == DSV4_QRULE_FP4_32 ? 16 : 256);
            uint8_t *sc = bytes_rand(R * K / g, 110, 30);
            sc[1] = 255; /* a NaN scale */
            float *yr = poisoned(4 * R * K), *yt = poisoned(4 * R * K);
            dsv4_tensor hc = view(codes, DSV4_U8, 2, R, K, 0), hs = view(sc, DSV4_U8, 2, R, K / g, 0),
                        hy = view(yr, DSV4_F32, 2, R, K, 0);
            dsv4_tensor c_r = on(ref, &hc), c_t = on(tc, &hc), s_r = on(ref, &hs), s_t = on(tc, &hs),
                        y_r = on(ref, &hy), y_t = on(tc, &hy);
            ran("dequantize", dsv4_dequantize(tc, (dsv4_qrule)rule, &c_t, &s_t, &y_t),
                dsv4_dequantize(ref, (dsv4_qrule)rule, &c_r, &s_r, &y_r));
            back(ref, &y_r, yr), back(tc, &y_t, yt);
            same_f32("dequantize", dsv4_qrule_name((dsv4_qrule)rule), yt, yr, R * K);
            free(codes), free(sc), free(yr), free(yt);
            release();
        }
    }
    free(x);
}

static void formats_weights(void)
{
    /* FP8 [130, 256] with 128x128 scale blocks (an edge block of 2 rows), FP4 [33, 128] per 1x32 */
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const char *op = fp4 ? "formats.dequantize_fp4_g32" : "formats.dequantize_fp8_b128";
        if (missing(op, fp4 ? HAS(formats, dequantize_fp4_g32) : HAS(formats, dequantize_fp8_b128))) continue;
        const int64_t n = fp4 ? 33 : 130, k = fp4 ? 128 : 256, wc = fp4 ? k / 2 : k;
        const int64_t sr = fp4 ? n : 2, scn = fp4 ? k / 32 : 2;
        uint8_t *w = bytes_rand((size_t)(n * wc), 0, 256), *s = bytes_rand((size_t)(sr * scn), 115, 20);
        float *orf = poisoned(4 * (size_t)(n * k)), *ot = poisoned(4 * (size_t)(n * k));
        dsv4_tensor hw = view(w, fp4 ? DSV4_FP4X2 : DSV4_F8_E4M3, 2, n, wc, 0), hs = view(s, DSV4_E8M0, 2, sr, scn, 0),
                    ho = view(orf, DSV4_F32, 2, n, k, 0);
        dsv4_tensor w_r = on(ref, &hw), w_t = on(tc, &hw), s_r = on(ref, &hs), s_t = on(tc, &hs), o_r = on(ref, &ho),
                    o_t = on(tc, &ho);
        ran("dequantize_weight", dsv4_dequantize_weight(tc, &w_t, &s_t, &o_t),
            dsv4_dequantize_weight(ref, &w_r, &s_r, &o_r));
        back(ref, &o_r, orf), back(tc, &o_t, ot);
        same_f32("dequantize_weight", fp4 ? "fp4" : "fp8", ot, orf, (size_t)(n * k));
        free(w), free(s), free(orf), free(ot);
        release();
    }
}

/* ---- linear ------------------------------------------------------------------------------- */
/* Each backend is within TOL·Σ_k|xq_k w_k| of the float64 evaluation (test_linear.c: only the
 * fp32 summation order differs), so two backends are within 2·TOL of each other; the bound here
 * uses the unquantized |x_k|, and the act rules round |x| up by at most 2^-4 (E4M3 RNE), hence
 * the factor 1.0625. A BF16 x is exact. The cuda backend's tensor-core product (3 <= M <= 16, see
 * src/backends/cuda/linear_cuda.cu) sums the exact products of a piece of 32 or 64 values in two
 * mmas, each adding 16 products and the running sum with the tensor core's own alignment: an
 * error of a few fp32 ulps of the piece's sum of |terms|, then one fp32 add per piece, so its
 * error is of the same few ulps of Σ|terms| as the fp32 orders' and the bound stands. */
#define LIN_TOL (2.0 * 1.0625 * TOL)

static dsv4_status linear_on(dsv4_ctx *c, const wcase *w, const dsv4_tensor *hx, const dsv4_tensor *hb, float *y,
                             int staged)
{
    dsv4_tensor hw, hs;
    wcase_views(w, &hw, &hs);
    dsv4_tensor x = on(c, hx), wt = on(c, &hw), st = on(c, &hs), b = on(c, hb);
    dsv4_tensor hy = view(y, DSV4_F32, 2, hx->shape[0], w->n, 0), yt = on(c, &hy);
    size_t wsb = 0;
    dsv4_status s = dsv4_linear_workspace_size(c, w->fmt, hx->shape[0], w->k, &wsb);
    if (s) return s;
    void *ws = scratch(c, wsb);
    const dsv4_tensor *scale = w->fmt <= DSV4_LINEAR_FP4 ? &st : NULL;
    if (staged) {
        s = dsv4_linear_stage(c, w->fmt, &x, ws, wsb);
        if (!s) s = dsv4_linear_staged(c, w->fmt, &x, &wt, scale, &b, &yt, ws, wsb);
    } else {
        s = dsv4_linear(c, w->fmt, &x, &wt, scale, &b, &yt, ws, wsb);
    }
    back(c, &yt, y);
    return s;
}

/* Outputs of y beyond LIN_TOL of sum |x w| (plus |bias|) from cpu-ref's yr, m rows of w.n. */
static int lin_beyond(const wcase *w, const float *xf, const float *bias, const float *y, const float *yr, int64_t m)
{
    const int64_t n = w->n, k = w->k;
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = fabs(bias[j]);
            for (int64_t q = 0; q < k; q++) mag += fabs(xf[i * k + q] * w->wq[j * k + q]);
            bad += !(fabs((double)y[i * n + j] - yr[i * n + j]) <= LIN_TOL * mag);
        }
    return bad;
}

static void linear_formats(void)
{
    if (missing("linear.linear", HAS(linear, linear) && HAS(linear, workspace_size))) return;
    const int staging = HAS(linear, stage);
    if (!staging) missing("linear.stage", 0);
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++)
        for (int mi = 0; mi < 3; mi++) { /* M = 37: more rows than one device tile of 16 */
            const int64_t m = mi == 2 ? 37 : mi ? 6 : 1, n = 70, k = f == DSV4_LINEAR_MXFP8 ? 288 : 384;
            const int x_bf16 = (f + mi) % 2;
            wcase w;
            wcase_make(&w, (dsv4_linear_format)f, n, k, f % 2, mi & 1);
            float *xf = f32_rand((size_t)(m * k), 2.0f, 0.0f), *bias = f32_rand((size_t)n, 1.0f, 0.0f);
            uint16_t *xb = malloc(2 * (size_t)(m * k));
            for (int64_t i = 0; i < m * k; i++) {
                xb[i] = dsv4_bf16_encode(xf[i]);
                if (x_bf16) xf[i] = dsv4_bf16_decode(xb[i]);
            }
            dsv4_tensor hx = view(x_bf16 ? (void *)xb : (void *)xf, x_bf16 ? DSV4_BF16 : DSV4_F32, 2, m, k, 0),
                        hb = view(bias, DSV4_F32, 1, n, 0, 0);
            float *yr = poisoned(4 * (size_t)(m * n)), *yt = poisoned(4 * (size_t)(m * n)),
                  *ys = poisoned(4 * (size_t)(m * n));
            ran("linear", linear_on(tc, &w, &hx, &hb, yt, 0), linear_on(ref, &w, &hx, &hb, yr, 0));
            const int bad = lin_beyond(&w, xf, bias, yt, yr, m);
            n_compared++;
            CHECK(bad == 0, "linear %s m=%lld on %s: %d outputs beyond %g of sum|x w| from cpu-ref",
                  dsv4_linear_format_name(w.fmt), (long long)m, target, bad, LIN_TOL);
            if (staging) { /* the contract: stage + staged == linear, bit for bit, on one backend */
                CHECK_STATUS(linear_on(tc, &w, &hx, &hb, ys, 1), DSV4_OK);
                same("linear_staged", dsv4_linear_format_name(w.fmt), ys, yt, 4 * (size_t)(m * n));
            }
            release();
            free(xf), free(xb), free(bias), free(yr), free(yt), free(ys);
            wcase_free(&w);
        }
}

/* On a device backend a row's result does not depend on the other rows of the call, in every
 * format: calls of 1, 2, 3, 5, 13, 17 and 40 rows (one or two n8 tiles of the cuda backend's
 * tensor-core product, more than one CTA row of 16) give the bytes of the same rows of the
 * 40-row call. The engine's logits of a token must not depend on the batch it is decoded in. */
static void linear_rows_independent(void)
{
    if (tb->device == DSV4_DEVICE_CPU || missing("linear.linear", HAS(linear, linear))) return;
    enum { N = 40, K = 256, MS = 7 };
    static const int64_t ms[MS] = {40, 1, 2, 3, 5, 13, 17};
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        wcase w;
        wcase_make(&w, (dsv4_linear_format)f, N, K, 0, 0);
        float *xf = f32_rand(40 * K, 2.0f, 0.0f), *bias = f32_rand(N, 1.0f, 0.0f), *y[MS];
        const dsv4_tensor hb = view(bias, DSV4_F32, 1, N, 0, 0);
        for (int i = 0; i < MS; i++) {
            const dsv4_tensor hx = view(xf, DSV4_F32, 2, ms[i], K, 0);
            y[i] = poisoned(4 * (size_t)(ms[i] * N));
            CHECK_STATUS(linear_on(tc, &w, &hx, &hb, y[i], 0), DSV4_OK);
            release();
        }
        for (int i = 1; i < MS; i++) {
            char what[48];
            snprintf(what, sizeof what, "linear (%lld rows vs 40)", (long long)ms[i]);
            same(what, dsv4_linear_format_name(w.fmt), y[i], y[0], 4 * (size_t)(ms[i] * N));
        }
        free(xf), free(bias);
        for (int i = 0; i < MS; i++) free(y[i]);
        wcase_free(&w);
    }
}

/* The cuda backend's FP8 products of at most 8 rows run a streaming kernel ($DSV4_CUDA_GEMV_ROWS,
 * default 8; 0 keeps the tensor-core kernel) with the tensor-core kernel's operations in its
 * order: both must give the same bits, at every K split (1 .. 8 accumulators), ring depth (2, 4,
 * 8 stages), a last stage cut short, N past a tile of 16 and across a 128-row scale block, and
 * transposed scales; each also within the tolerance of linear_formats against cpu-ref. */
static void linear_gemv(void)
{
    if (tb->device == DSV4_DEVICE_CPU || missing("linear.linear", HAS(linear, linear))) return;
    /* (K split, stages): (8, 2) (8, 8) (8, 8) (1, 2) (2, 4) (4, 8): k_split's choice from N */
    static const int64_t shapes[][2] = {{40, 256}, {200, 3200}, {24, 8192}, {34000, 256}, {17000, 544}, {8500, 1056}};
    static const int64_t ms[] = {1, 2, 5, 8};
    const char *env = getenv("DSV4_CUDA_GEMV_ROWS");
    char *saved = env ? strdup(env) : NULL;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t n = shapes[si][0], k = shapes[si][1];
        wcase w;
        wcase_make(&w, DSV4_LINEAR_FP8_B128, n, k, 0, (int)(si & 1));
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t m = ms[mi];
            float *xf = f32_rand((size_t)(m * k), 2.0f, 0.0f), *bias = f32_rand((size_t)n, 1.0f, 0.0f);
            const dsv4_tensor hx = view(xf, DSV4_F32, 2, m, k, 0), hb = view(bias, DSV4_F32, 1, n, 0, 0);
            float *yt = poisoned(4 * (size_t)(m * n)), *ym = poisoned(4 * (size_t)(m * n)), *yr = poisoned(4 * (size_t)(m * n));
            setenv("DSV4_CUDA_GEMV_ROWS", "8", 1);
            ran("linear", linear_on(tc, &w, &hx, &hb, yt, 0), linear_on(ref, &w, &hx, &hb, yr, 0));
            release();
            setenv("DSV4_CUDA_GEMV_ROWS", "0", 1);
            CHECK_STATUS(linear_on(tc, &w, &hx, &hb, ym, 0), DSV4_OK);
            release();
            char what[96];
            snprintf(what, sizeof what, "linear streaming vs tensor-core kernel (N %lld, K %lld, M %lld)", (long long)n,
                     (long long)k, (long long)m);
            same(what, "fp8_b128", yt, ym, 4 * (size_t)(m * n));
            const int bad = lin_beyond(&w, xf, bias, yt, yr, m);
            n_compared++;
            CHECK(bad == 0, "%s on %s: %d outputs beyond %g of sum|x w| from cpu-ref", what, target, bad, LIN_TOL);
            free(xf), free(bias), free(yt), free(ym), free(yr);
        }
        wcase_free(&w);
    }
    if (saved) setenv("DSV4_CUDA_GEMV_ROWS", saved, 1);
    else unsetenv("DSV4_CUDA_GEMV_ROWS");
    free(saved);
}

/* The grouped product (wo_a): G groups of R rows of one weight, the same tolerance per output. */
static void linear_grouped(void)
{
    if (missing("linear.linear (grouped)", HAS(linear, linear) && HAS(linear, workspace_size))) return;
    enum { T = 3, G = 4, R = 24, K = 256 };
    for (int f = 0; f < DSV4_LINEAR_FORMAT_COUNT; f++) {
        wcase w;
        wcase_make(&w, (dsv4_linear_format)f, G * R, K, 0, f % 2);
        uint16_t *x = bf16_rand(T * G * K, 2.0f);
        float *y[2] = {poisoned(4 * T * G * R), poisoned(4 * T * G * R)};
        dsv4_status st[2];
        dsv4_ctx *cs[2] = {ref, tc};
        for (int side = 0; side < 2; side++) {
            dsv4_ctx *c = cs[side];
            dsv4_tensor hw, hs, hx = view(x, DSV4_BF16, 3, T, G, K), hy = view(y[side], DSV4_F32, 3, T, G, R);
            wcase_views(&w, &hw, &hs);
            dsv4_tensor tx = on(c, &hx), tw = on(c, &hw), ts = on(c, &hs), ty = on(c, &hy);
            size_t wsb = 0;
            st[side] = dsv4_linear_workspace_size(c, w.fmt, T * G, K, &wsb);
            if (!st[side])
                st[side] = dsv4_grouped_linear(c, w.fmt, &tx, &tw, w.fmt <= DSV4_LINEAR_FP4 ? &ts : NULL, &ty,
                                               scratch(c, wsb), wsb);
            back(c, &ty, y[side]);
            release();
        }
        ran("grouped_linear", st[1], st[0]);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int g = 0; g < G; g++)
                for (int r = 0; r < R; r++) {
                    double mag = 0;
                    for (int k = 0; k < K; k++)
                        mag += fabs(dsv4_bf16_decode(x[(t * G + g) * K + k]) * w.wq[(int64_t)(g * R + r) * K + k]);
                    const int i = (t * G + g) * R + r;
                    bad += !(fabs((double)y[1][i] - y[0][i]) <= LIN_TOL * mag);
                }
        n_compared++;
        CHECK(bad == 0, "grouped_linear %s on %s: %d outputs beyond %g of sum|x w| from cpu-ref",
              dsv4_linear_format_name(w.fmt), target, bad, LIN_TOL);
        free(x), free(y[0]), free(y[1]);
        wcase_free(&w);
    }
}

/* ---- layer --------------------------------------------------------------------------------- */
/* RMSNorm, mHC pre/head, SwiGLU and MoE sum in fp32 in an order the contract leaves to the
 * backend: BF16 results within one BF16 ulp (+1e-5 of the largest; test_layer.c), mHC post/comb
 * weights (sigmoid and Sinkhorn of those sums) within 2e-5 (test_layer.c). hc_post is one fp32
 * expression per element in a fixed order: bit-identical on the CPU backends (test_layer.c), one
 * BF16 ulp elsewhere (a device may fuse its multiply-adds). */
static void layer_rms(void)
{
    if (missing("layer.rms_norm", HAS(layer, rms_norm))) return;
    enum { R = 5, D = 1037 };
    uint16_t *x = bf16_rand(R * D, 2.0f), *w = bf16_rand(D, 0.5f), *yr = poisoned(2 * R * D), *yt = poisoned(2 * R * D);
    for (int weighted = 0; weighted < 2; weighted++) {
        dsv4_tensor hx = view(x, DSV4_BF16, 2, R, D, 0), hw = view(w, DSV4_BF16, 1, D, 0, 0),
                    hy = view(yr, DSV4_BF16, 2, R, D, 0);
        dsv4_tensor x_r = on(ref, &hx), x_t = on(tc, &hx), w_r = on(ref, &hw), w_t = on(tc, &hw), y_r = on(ref, &hy),
                    y_t = on(tc, &hy);
        ran("rms_norm", dsv4_rms_norm(tc, &x_t, weighted ? &w_t : NULL, 1e-6f, &y_t),
            dsv4_rms_norm(ref, &x_r, weighted ? &w_r : NULL, 1e-6f, &y_r));
        back(ref, &y_r, yr), back(tc, &y_t, yt);
        near_bf16("rms_norm", weighted ? "weighted" : "unweighted", yt, yr, R * D);
        release();
    }
    free(x), free(w), free(yr), free(yt);
}

/* HD not a multiple of 8: the cuda finish splits a token's weighted sum over a cluster of 8 CTAs.
 * The streams n: 4 (V4's; the cuda Sinkhorn unrolled for it), 2 (the generic lanes' Sinkhorn of
 * n * n <= 32) and 6 (the one of larger n). */
enum { HT = 5, HN_MAX = 6, HD = 260 };

typedef struct hc_host {
    float *fn, scale[3], *base;
    dsv4_tensor tfn, tscale, tbase;
    int n, nmix;
} hc_host;

static void hc_make(hc_host *h, int n, int nmix)
{
    h->n = n, h->nmix = nmix;
    h->fn = f32_rand((size_t)nmix * n * HD, 0.02f, 0.0f);
    h->base = f32_rand((size_t)nmix, 0.5f, 0.0f);
    for (int i = 0; i < 3; i++) h->scale[i] = 0.5f + 0.3f * (float)i;
    h->tfn = view(h->fn, DSV4_F32, 2, nmix, n * HD, 0);
    h->tscale = view(h->scale, DSV4_F32, 1, nmix == n ? 1 : 3, 0, 0);
    h->tbase = view(h->base, DSV4_F32, 1, nmix, 0, 0);
}

static dsv4_hc_site hc_site_on(dsv4_ctx *c, const hc_host *h)
{
    dsv4_hc_site s = {on(c, &h->tfn), on(c, &h->tscale), on(c, &h->tbase), 20, 1e-6f, 1e-6f};
    return s;
}

typedef struct hc_out {
    uint16_t y[HT * HD], streams[HT * HN_MAX * HD];
    float post[HT * HN_MAX], comb[HT * HN_MAX * HN_MAX];
} hc_out;

/* which: 0 hc_pre, 1 hc_post, 2 hc_post_pre, 3 hc_head */
static dsv4_status hc_on(dsv4_ctx *c, int which, const hc_host *site, const uint16_t *x, const uint16_t *sub,
                         const float *post, const float *comb, hc_out *o)
{
    const int n = site->n;
    memset(o, 0xA5, sizeof *o);
    if (!post) post = o->post, comb = o->comb; /* hc_pre / hc_head read neither */
    dsv4_hc_site s = hc_site_on(c, site);
    dsv4_tensor hx = view((void *)x, DSV4_BF16, 3, HT, n, HD), hsub = view((void *)sub, DSV4_BF16, 2, HT, HD, 0);
    dsv4_tensor hp = view((void *)post, DSV4_F32, 2, HT, n, 0), hcm = view((void *)comb, DSV4_F32, 3, HT, n, n);
    dsv4_tensor hy = view(o->y, DSV4_BF16, 2, HT, HD, 0), hs = view(o->streams, DSV4_BF16, 3, HT, n, HD);
    dsv4_tensor hpo = view(o->post, DSV4_F32, 2, HT, n, 0), hco = view(o->comb, DSV4_F32, 3, HT, n, n);
    dsv4_tensor tx = on(c, &hx), tsub = on(c, &hsub), tp = on(c, &hp), tcm = on(c, &hcm), ty = on(c, &hy),
                ts = on(c, &hs), tpo = on(c, &hpo), tco = on(c, &hco);
    dsv4_status st;
    switch (which) {
    case 0: st = dsv4_hc_pre(c, &s, &tx, &ty, &tpo, &tco); break;
    case 1: st = dsv4_hc_post(c, &tsub, &tx, &tp, &tcm, &ts); break;
    case 2: st = dsv4_hc_post_pre(c, &tsub, &tx, &tp, &tcm, &s, &ts, &ty, &tpo, &tco); break;
    default: st = dsv4_hc_head(c, &s, &tx, &ty); break;
    }
    back(c, &ty, o->y), back(c, &ts, o->streams), back(c, &tpo, o->post), back(c, &tco, o->comb);
    release();
    return st;
}

static void layer_mhc(void)
{
    static const char *const names[4] = {"hc_pre", "hc_post", "hc_post_pre", "hc_head"};
    static const int ns[3] = {4, 2, HN_MAX};
    const int have[4] = {HAS(layer, hc_pre), HAS(layer, hc_post), HAS(layer, hc_post_pre), HAS(layer, hc_head)};
    for (int ni = 0; ni < 3; ni++) {
        const int n = ns[ni];
        hc_host site, head;
        hc_make(&site, n, (2 + n) * n);
        hc_make(&head, n, n);
        uint16_t *x = bf16_rand(HT * n * HD, 2.0f), *sub = bf16_rand(HT * HD, 1.0f);
        static hc_out pre, r, t;
        CHECK_STATUS(hc_on(ref, 0, &site, x, sub, NULL, NULL, &pre), DSV4_OK); /* post and comb of a real site */
        for (int which = 0; which < 4; which++) {
            char op[32], what[48];
            snprintf(op, sizeof op, "layer.%s", names[which]);
            if (missing(op, have[which])) continue;
            snprintf(what, sizeof what, "%s n=%d", names[which], n);
            const hc_host *s = which == 3 ? &head : &site;
            ran(what, hc_on(tc, which, s, x, sub, pre.post, pre.comb, &t), hc_on(ref, which, s, x, sub, pre.post, pre.comb, &r));
            if (which != 1) near_bf16(what, "y", t.y, r.y, HT * HD);
            if (which == 0 || which == 2) {
                near_f32(what, "post", t.post, r.post, HT * n, 2e-5f);
                near_f32(what, "comb", t.comb, r.comb, HT * n * n, 2e-5f);
            }
            if (which == 1 || which == 2) {
                if (tb->device == DSV4_DEVICE_CPU) same(what, "streams", t.streams, r.streams, sizeof(uint16_t) * HT * n * HD);
                else near_bf16(what, "streams", t.streams, r.streams, HT * n * HD);
            }
        }
        free(site.fn), free(site.base), free(head.fn), free(head.base), free(x), free(sub);
    }
}

/* Router: the experts chosen are the same (the random scores here have no near-ties), and their
 * weights (normalized sqrt-softplus of fp32 dot products summed in the backend's order) agree
 * within 1e-5 relative to route_scale (test_layer.c). Hash layers pick by table: identical. */
/* One shape; the cuda kernel streams BF16 rows of 16-byte multiples in tiles of 256 values through
 * shared memory (layer_cuda.cu warp_dot_ring) and spreads the experts over a cluster's 256 warps:
 * shape 1 is D = 256 (one tile), 64 experts; shape 2 has a tail past its tiles, more experts than
 * warps and 8 slots; shape 3 a row of 8256 values (32 tiles and a tail), few experts. */
static void layer_route_case(int T, int D, int E, int K, int V, uint16_t *x, uint16_t *gw, float *bias)
{
    int32_t *tid = malloc(sizeof(int32_t) * V * K), *tok = malloc(sizeof(int32_t) * T);
    int32_t *ir = malloc(sizeof(int32_t) * T * K), *it = malloc(sizeof(int32_t) * T * K);
    float *wr = malloc(sizeof(float) * T * K), *wt = malloc(sizeof(float) * T * K);
    for (int i = 0; i < V * K; i++) tid[i] = (int32_t)(test_rand_u64() % E);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand_u64() % V);
    for (int hash = 0; hash < 2; hash++) {
        memset(ir, 0xA5, sizeof(int32_t) * T * K), memset(wr, 0xA5, sizeof(float) * T * K);
        dsv4_tensor hx = view(x, DSV4_BF16, 2, T, D, 0), hg = view(gw, DSV4_BF16, 2, E, D, 0),
                    hb = view(bias, DSV4_F32, 1, E, 0, 0), htid = view(tid, DSV4_I32, 2, V, K, 0),
                    htok = view(tok, DSV4_I32, 1, T, 0, 0), hi = view(ir, DSV4_I32, 2, T, K, 0),
                    hw = view(wr, DSV4_F32, 2, T, K, 0);
        dsv4_tensor x_r = on(ref, &hx), g_r = on(ref, &hg), b_r = on(ref, &hb), d_r = on(ref, &htid),
                    k_r = on(ref, &htok), i_r = on(ref, &hi), w_r = on(ref, &hw);
        dsv4_tensor x_t = on(tc, &hx), g_t = on(tc, &hg), b_t = on(tc, &hb), d_t = on(tc, &htid), k_t = on(tc, &htok),
                    i_t = on(tc, &hi), w_t = on(tc, &hw);
        ran("route",
            dsv4_route(tc, &x_t, &g_t, hash ? NULL : &b_t, hash ? &d_t : NULL, hash ? &k_t : NULL, 2.5f, &i_t, &w_t),
            dsv4_route(ref, &x_r, &g_r, hash ? NULL : &b_r, hash ? &d_r : NULL, hash ? &k_r : NULL, 2.5f, &i_r, &w_r));
        back(ref, &i_r, ir), back(tc, &i_t, it), back(ref, &w_r, wr), back(tc, &w_t, wt);
        same("route", hash ? "hash ids" : "ids", it, ir, sizeof(int32_t) * T * K);
        near_f32("route", "weights", wt, wr, T * K, 2.5e-5f);
        release();
    }
    free(tid), free(tok), free(ir), free(it), free(wr), free(wt);
}

static void layer_route(void)
{
    if (missing("layer.route", HAS(layer, route))) return;
    enum { T = 6, D = 256, E = 64, K = 6, V = 50 };
    uint16_t *x = bf16_rand(T * D, 1.0f), *gw = bf16_rand(E * D, 0.1f);
    float *bias = f32_rand(E, 0.1f, 0.0f);
    int32_t tid[V * K], tok[T];
    for (int i = 0; i < V * K; i++) tid[i] = (int32_t)(test_rand_u64() % E);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand_u64() % V);
    layer_route_case(T, D, E, K, V, x, gw, bias);
    {
        enum { T2 = 3, D2 = 2120, E2 = 300, K2 = 8, V2 = 40 };
        uint16_t *x2 = bf16_rand(T2 * D2, 1.0f), *gw2 = bf16_rand(E2 * D2, 0.05f);
        float *bias2 = f32_rand(E2, 0.1f, 0.0f);
        layer_route_case(T2, D2, E2, K2, V2, x2, gw2, bias2);
        free(x2), free(gw2), free(bias2);
    }
    {
        enum { T3 = 2, D3 = 8256, E3 = 24, K3 = 4, V3 = 10 };
        uint16_t *x3 = bf16_rand(T3 * D3, 1.0f), *gw3 = bf16_rand(E3 * D3, 0.05f);
        float *bias3 = f32_rand(E3, 0.1f, 0.0f);
        layer_route_case(T3, D3, E3, K3, V3, x3, gw3, bias3);
        free(x3), free(gw3), free(bias3);
    }
    if (tb->device != DSV4_DEVICE_CPU) { /* a table in device memory: bounds kept on the device */
        int32_t bad_tid[V * K], bad_tok[T], it[T * K];
        float wt[T * K];
        memcpy(bad_tid, tid, sizeof tid), memcpy(bad_tok, tok, sizeof tok);
        bad_tok[0] = V;                 /* outside the table: every slot -1 */
        bad_tid[bad_tok[1] * K + 2] = E; /* not an expert: that slot alone */
        dsv4_tensor hx = view(x, DSV4_BF16, 2, T, D, 0), hg = view(gw, DSV4_BF16, 2, E, D, 0),
                    htid = view(bad_tid, DSV4_I32, 2, V, K, 0), htok = view(bad_tok, DSV4_I32, 1, T, 0, 0),
                    hi = view(it, DSV4_I32, 2, T, K, 0), hw = view(wt, DSV4_F32, 2, T, K, 0);
        dsv4_tensor x_t = on(tc, &hx), g_t = on(tc, &hg), d_t = on(tc, &htid), k_t = on(tc, &htok), i_t = on(tc, &hi),
                    w_t = on(tc, &hw);
        CHECK_STATUS(dsv4_route(tc, &x_t, &g_t, NULL, &d_t, &k_t, 2.5f, &i_t, &w_t), DSV4_OK);
        back(tc, &i_t, it), back(tc, &w_t, wt);
        float sum1 = 0.0f;
        for (int s = 0; s < K; s++) {
            CHECK(it[s] == -1 && wt[s] == 0.0f, "route on %s: slot %d of a token outside the table: %d, %g", target,
                  s, it[s], (double)wt[s]);
            const int want = s == 2 ? -1 : bad_tid[bad_tok[1] * K + s];
            CHECK(it[K + s] == want, "route on %s: token 1 slot %d: id %d, want %d", target, s, it[K + s], want);
            sum1 += wt[K + s];
        }
        CHECK(wt[K + 2] == 0.0f && fabsf(sum1 - 2.5f) < 1e-5f, "route on %s: the kept slots sum to %g, want 2.5",
              target, (double)sum1);
        n_compared++;
        release();
    }
    free(x), free(gw), free(bias);
}

static void layer_swiglu(void)
{
    if (missing("layer.swiglu", HAS(layer, swiglu))) return;
    enum { R = 5, I = 300 };
    uint16_t *g = bf16_rand(R * I, 4.0f), *u = bf16_rand(R * I, 4.0f), *hr = poisoned(2 * R * I),
             *ht = poisoned(2 * R * I);
    float *rw = f32_rand(R, 0.3f, 1.0f);
    dsv4_tensor hg = view(g, DSV4_BF16, 2, R, I, 0), hu = view(u, DSV4_BF16, 2, R, I, 0),
                hw = view(rw, DSV4_F32, 1, R, 0, 0), hh = view(hr, DSV4_BF16, 2, R, I, 0);
    dsv4_tensor g_r = on(ref, &hg), u_r = on(ref, &hu), w_r = on(ref, &hw), h_r = on(ref, &hh);
    dsv4_tensor g_t = on(tc, &hg), u_t = on(tc, &hu), w_t = on(tc, &hw), h_t = on(tc, &hh);
    ran("swiglu", dsv4_swiglu(tc, &g_t, &u_t, &w_t, 7.0f, &h_t), dsv4_swiglu(ref, &g_r, &u_r, &w_r, 7.0f, &h_r));
    back(ref, &h_r, hr), back(tc, &h_t, ht);
    near_bf16("swiglu", "h", ht, hr, R * I);
    release();
    free(g), free(u), free(hr), free(ht), free(rw);
}

/* MoE of BF16 experts: g = w1 x, u = w3 x, h = swiglu(g, u)·weight and each expert's w2 h are
 * rounded to BF16, then y = the fp32 sum of the experts' rows, rounded. The sums of each product
 * run in an order the contract leaves to the backend, so a rounded g, u or h may land one BF16 ulp
 * from cpu-ref's, and w2 carries such a flip of h_j into every y_i as w2_ij·ulp(h_j): one ulp of
 * y_i alone is no bound when y_i is a cancellation of larger terms (seen: 2 ulps of a y 40x smaller
 * than its token's largest). A flip is rare and moves y by a fraction of an ulp of the token's
 * largest |y| at these scales, so: each element within one BF16 ulp of itself plus one of its
 * token's largest |y| (2^-7 each; over 150 seeds the worst excess was 0.0036 of the token's
 * largest, on avx2), and the relative L2 error of all of y at most 2e-3 (worst seen 7.3e-4; one
 * of the ten routing weights 1% off gives 3e-3, 0.3% off 2.2e-3). */
static void near_moe(const char *what, const uint16_t *a, const uint16_t *b, int T, int D)
{
    n_compared++;
    double se = 0.0, sr = 0.0;
    int bad = -1;
    for (int t = 0; t < T; t++) {
        double top = 0.0;
        for (int i = 0; i < D; i++) top = fmax(top, fabs(dsv4_bf16_decode(b[t * D + i])));
        for (int i = 0; i < D; i++) {
            const double x = dsv4_bf16_decode(a[t * D + i]), y = dsv4_bf16_decode(b[t * D + i]);
            if (!(fabs(x - y) <= 0x1p-7 * (fabs(y) + top)) && bad < 0) bad = t * D + i;
            se += (x - y) * (x - y), sr += y * y;
        }
    }
    CHECK(bad < 0, "moe %s on %s: element %d is %g, cpu-ref %g: beyond one BF16 ulp of it and of its token's largest",
          what, target, bad, bad >= 0 ? dsv4_bf16_decode(a[bad]) : 0.0f, bad >= 0 ? dsv4_bf16_decode(b[bad]) : 0.0f);
    CHECK(se <= 4e-6 * sr, "moe %s on %s: relative L2 error %g from cpu-ref (bound 2e-3)", what, target, sqrt(se / sr));
}

/* The cases: 4 experts, and on a device backend 70 experts with a
 * shared expert of another width, an expert routed to by several tokens and some never, then ids
 * outside [0, E). */
enum { MT_ = 5, MD = 128, MI = 64, MIS = 96, MEMAX = 70, MK = 2 };

/* dsv4_moe on c with E experts w13[e][0..1], w2[e] (and e == E the shared expert when `shared`). */
static dsv4_status moe_on(dsv4_ctx *c, const uint16_t *x, const int32_t *ids, const float *wts, int E,
                          uint16_t *(*w13)[2], uint16_t **w2, int shared, uint16_t *y)
{
    dsv4_tensor hx = view((void *)x, DSV4_BF16, 2, MT_, MD, 0), hi = view((void *)ids, DSV4_I32, 2, MT_, MK, 0),
                hw = view((void *)wts, DSV4_F32, 2, MT_, MK, 0), hy = view(y, DSV4_BF16, 2, MT_, MD, 0);
    memset(y, 0xA5, 2 * MT_ * MD);
    dsv4_tensor tx = on(c, &hx), ti = on(c, &hi), tw = on(c, &hw), ty = on(c, &hy);
    dsv4_tensor t1[MEMAX + 1], t3[MEMAX + 1], t2[MEMAX + 1];
    dsv4_ffn_weights ex[MEMAX + 1];
    for (int e = 0; e < E + shared; e++) {
        const int64_t ie = e == E ? MIS : MI;
        dsv4_tensor a = view(w13[e][0], DSV4_BF16, 2, ie, MD, 0), b = view(w13[e][1], DSV4_BF16, 2, ie, MD, 0),
                    d = view(w2[e], DSV4_BF16, 2, MD, ie, 0);
        t1[e] = on(c, &a), t3[e] = on(c, &b), t2[e] = on(c, &d);
        ex[e] = (dsv4_ffn_weights){DSV4_LINEAR_BF16, &t1[e], NULL, &t3[e], NULL, &t2[e], NULL};
    }
    const dsv4_ffn_weights *sh = shared ? &ex[E] : NULL;
    size_t wsb = 0;
    dsv4_status st = dsv4_moe_workspace_size(c, MT_, MK, E, &ex[0], sh, &wsb);
    if (st == DSV4_OK) st = dsv4_moe(c, &tx, &ti, &tw, ex, E, sh, 10.0f, &ty, scratch(c, wsb), wsb);
    back(c, &ty, y);
    release();
    return st;
}

static void layer_moe(void)
{
    const int have = HAS(layer, moe) && HAS(linear, linear);
    if (missing("layer.moe (+ linear)", have)) return;
    enum { T = MT_, D = MD, K = MK };
    for (int big = 0; big < (tb->device == DSV4_DEVICE_CPU ? 1 : 2); big++) { /* the CPU drivers are cpu-ref's */
        const int E = big ? MEMAX : 4;
        uint16_t *x = bf16_rand(T * D, 1.0f), *yr = poisoned(2 * T * D), *yt = poisoned(2 * T * D);
        uint16_t *w13[MEMAX + 1][2], *w2[MEMAX + 1]; /* [E]: the shared expert */
        for (int e = 0; e < E + big; e++) {
            const int64_t ie = e == E ? MIS : MI;
            w13[e][0] = bf16_rand(ie * D, 0.1f), w13[e][1] = bf16_rand(ie * D, 0.1f), w2[e] = bf16_rand(D * ie, 0.1f);
        }
        int32_t ids[T * K];
        float wts[T * K];
        for (int t = 0; t < T; t++) {
            ids[t * K] = big ? (t < 3 ? 66 : 3 * t) : (int32_t)(test_rand_u64() % E);
            ids[t * K + 1] = (ids[t * K] + 1 + (int32_t)(test_rand_u64() % (E - 1))) % E;
            wts[t * K] = 0.6f, wts[t * K + 1] = 0.4f;
        }
        ran("moe", moe_on(tc, x, ids, wts, E, w13, w2, big, yt), moe_on(ref, x, ids, wts, E, w13, w2, big, yr));
        near_moe(big ? "y (70 experts, shared)" : "y", yt, yr, T, D);
        if (big && tb->device != DSV4_DEVICE_CPU) {
            /* ids in device memory: a pair outside [0, E) is dropped, as a pair of weight 0 adds +0 */
            int32_t dev_ids[T * K];
            memcpy(dev_ids, ids, sizeof ids);
            dev_ids[1] = -1, dev_ids[2 * K] = E;
            wts[1] = 0.0f, wts[2 * K] = 0.0f;
            ran("moe", moe_on(tc, x, dev_ids, wts, E, w13, w2, 1, yt), moe_on(ref, x, ids, wts, E, w13, w2, 1, yr));
            near_moe("y (ids outside [0, E) on the device)", yt, yr, T, D);
        }
        for (int e = 0; e < E + big; e++) free(w13[e][0]), free(w13[e][1]), free(w2[e]);
        free(x), free(yr), free(yt);
    }
}

/* MoE of FP4 experts and an FP8 shared expert (the checkpoint's formats): both sides stage x and h
 * by the act128 rule, so only the fp32 summation orders differ, as for BF16 experts (near_moe),
 * save an E4M3 code of h that a one-ulp BF16 flip of h would move (the CPU backends passed the
 * device case below over 150 seeds). On a
 * device backend 260 experts (the cuda backend's table holds 256 a launch) and 11 tokens, 9 of
 * them routed to expert 7 (more rows than one pass of the cuda kernel's tile of 8). */
enum { MQMAX = 260 };

static dsv4_status moe_q_on(dsv4_ctx *c, const uint16_t *x, const int32_t *ids, const float *wts, int T, int E,
                            wcase (*w)[3], uint16_t *y)
{
    const int64_t D = w[0][0].k;
    dsv4_tensor hx = view((void *)x, DSV4_BF16, 2, T, D, 0), hi = view((void *)ids, DSV4_I32, 2, T, MK, 0),
                hw = view((void *)wts, DSV4_F32, 2, T, MK, 0), hy = view(y, DSV4_BF16, 2, T, D, 0);
    memset(y, 0xA5, 2 * (size_t)(T * D));
    dsv4_tensor tx = on(c, &hx), ti = on(c, &hi), tw = on(c, &hw), ty = on(c, &hy);
    /* every expert's codes in one buffer and its scales in another (few device buffers) */
    size_t wb = 0, sb = 0;
    for (int e = 0; e <= E; e++)
        for (int j = 0; j < 3; j++)
            wb += (size_t)(w[e][j].n * w[e][j].wld), sb += (size_t)(w[e][j].srows * w[e][j].scols);
    uint8_t *hwb = malloc(wb), *hsb = malloc(sb);
    static dsv4_tensor tws[MQMAX + 1][3], tss[MQMAX + 1][3];
    static dsv4_ffn_weights ex[MQMAX + 1];
    size_t wo = 0, so = 0;
    for (int e = 0; e <= E; e++)
        for (int j = 0; j < 3; j++) {
            const wcase *q = &w[e][j];
            wcase_views(q, &tws[e][j], &tss[e][j]);
            const size_t n1 = (size_t)(q->n * q->wld), n2 = (size_t)(q->srows * q->scols);
            memcpy(hwb + wo, q->w, n1), memcpy(hsb + so, q->s, n2);
            tws[e][j].data = (void *)wo, tss[e][j].data = (void *)so; /* offsets until the upload */
            wo += n1, so += n2;
        }
    uint8_t *dw = put(c, hwb, wb), *ds = put(c, hsb, sb);
    for (int e = 0; e <= E; e++) {
        for (int j = 0; j < 3; j++) {
            tws[e][j].data = dw + (size_t)tws[e][j].data, tss[e][j].data = ds + (size_t)tss[e][j].data;
            tws[e][j].device = tss[e][j].device = dsv4_ctx_device_kind(c);
            tws[e][j].device_index = tss[e][j].device_index = 0;
        }
        ex[e] = (dsv4_ffn_weights){w[e][0].fmt, &tws[e][0], &tss[e][0], &tws[e][1], &tss[e][1], &tws[e][2], &tss[e][2]};
    }
    size_t wsb = 0;
    dsv4_status st = dsv4_moe_workspace_size(c, T, MK, E, &ex[0], &ex[E], &wsb);
    if (st == DSV4_OK) st = dsv4_moe(c, &tx, &ti, &tw, ex, E, &ex[E], 10.0f, &ty, scratch(c, wsb), wsb);
    back(c, &ty, y);
    release();
    free(hwb), free(hsb);
    return st;
}

static void layer_moe_quantized(void)
{
    if (missing("layer.moe (+ linear)", HAS(layer, moe) && HAS(linear, linear))) return;
    const int dev = tb->device != DSV4_DEVICE_CPU, E = dev ? MQMAX : 4;
    wcase(*w)[3] = malloc(sizeof(wcase[3]) * (size_t)(E + 1)); /* [E]: the shared expert */
    for (int e = 0; e <= E; e++) {
        const dsv4_linear_format f = e == E ? DSV4_LINEAR_FP8_B128 : DSV4_LINEAR_FP4;
        const int64_t ie = e == E ? MIS : MI;
        wcase_make(&w[e][0], f, ie, MD, 0, 0), wcase_make(&w[e][1], f, ie, MD, 0, 0);
        wcase_make(&w[e][2], f, MD, ie, 0, 0);
    }
    /* on a device also 3 tokens (6 pairs, three on expert 7): one decode step's few rows
     * ($DSV4_CUDA_MOE_FP32_ROWS=8 puts them on the cuda backend's fp32 kernel: linear_cuda.cu) */
    for (int pass = 0; pass < (dev ? 2 : 1); pass++) {
        const int T = !dev ? MT_ : pass ? 3 : 11;
        uint16_t *x = bf16_rand((size_t)T * MD, 1.0f), *yr = poisoned(2 * (size_t)T * MD),
                 *yt = poisoned(2 * (size_t)T * MD);
        int32_t ids[16 * MK];
        float wts[16 * MK];
        for (int t = 0; t < T; t++) {
            ids[t * MK] = dev ? (t < 9 ? 7 : 248 + t) : (int32_t)(test_rand_u64() % E);
            ids[t * MK + 1] = (ids[t * MK] + 1 + (int32_t)(test_rand_u64() % (E - 1))) % E;
            wts[t * MK] = 0.6f, wts[t * MK + 1] = 0.4f;
        }
        ran("moe", moe_q_on(tc, x, ids, wts, T, E, w, yt), moe_q_on(ref, x, ids, wts, T, E, w, yr));
        near_moe(!dev ? "y (FP4 experts, FP8 shared)"
                 : pass ? "y (3 tokens, 260 FP4 experts, FP8 shared)" : "y (260 FP4 experts, FP8 shared)",
                 yt, yr, T, MD);
        free(x), free(yr), free(yt);
    }
    for (int e = 0; e <= E; e++)
        for (int j = 0; j < 3; j++) wcase_free(&w[e][j]);
    free(w);
}

/* The cuda backend runs MoE products of few FP4 rows on a streaming kernel that gives the
 * tensor-core kernel's bits, so the choice is free ($DSV4_CUDA_MOE_STREAM_ROWS = 0 keeps the
 * tensor-core kernel: linear_cuda.cu mma_stream_kernel): the same MoE both ways, bit for bit, and
 * near cpu-ref, at a shape where its K-split accumulators are 8 (w1: K = 1024, two stages) and 4
 * (w2: K = 256, a stage of 4 pieces), for 3 tokens and for 11 (9 on one expert: two passes of
 * 8 rows). The env is read at each product; another backend ignores it. */
static void layer_moe_stream(void)
{
    if (tb->device == DSV4_DEVICE_CPU || missing("layer.moe (+ linear)", HAS(layer, moe) && HAS(linear, linear)))
        return;
    /* D = 4224: 66 pieces of 64 along w1 / w3's K, so the streaming kernel's ring of 16-piece
     * stages turns (5 stages in a ring of 4) and its last stage is short */
    enum { E = 8, D = 4224, I = 256 };
    wcase w[E + 1][3];
    for (int e = 0; e <= E; e++) {
        const dsv4_linear_format f = e == E ? DSV4_LINEAR_FP8_B128 : DSV4_LINEAR_FP4;
        wcase_make(&w[e][0], f, I, D, 0, 0), wcase_make(&w[e][1], f, I, D, 0, 0);
        wcase_make(&w[e][2], f, D, I, 0, 0);
    }
    const char *env = getenv("DSV4_CUDA_MOE_STREAM_ROWS");
    char *saved = env ? strdup(env) : NULL;
    for (int pass = 0; pass < 2; pass++) {
        const int T = pass ? 11 : 3;
        uint16_t *x = bf16_rand((size_t)T * D, 1.0f), *yr = poisoned(2 * (size_t)T * D),
                 *yt = poisoned(2 * (size_t)T * D), *ym = poisoned(2 * (size_t)T * D);
        int32_t ids[16 * MK];
        float wts[16 * MK];
        for (int t = 0; t < T; t++) {
            ids[t * MK] = pass && t < 9 ? 5 : (int32_t)(test_rand_u64() % E);
            ids[t * MK + 1] = (ids[t * MK] + 1 + (int32_t)(test_rand_u64() % (E - 1))) % E;
            wts[t * MK] = 0.7f, wts[t * MK + 1] = 0.3f;
        }
        setenv("DSV4_CUDA_MOE_STREAM_ROWS", "64", 1);
        ran("moe", moe_q_on(tc, x, ids, wts, T, E, &w[0], yt), moe_q_on(ref, x, ids, wts, T, E, &w[0], yr));
        setenv("DSV4_CUDA_MOE_STREAM_ROWS", "0", 1);
        ran("moe", moe_q_on(tc, x, ids, wts, T, E, &w[0], ym), DSV4_OK);
        near_moe(pass ? "y (11 tokens, FP4 experts of K 4224 and 256)" : "y (3 tokens, FP4 experts of K 4224 and 256)",
                 yt, yr, T, D);
        same("moe", "y, the streaming kernel vs the tensor-core kernel", yt, ym, 2 * (size_t)T * D);
        free(x), free(yr), free(yt), free(ym);
    }
    if (saved) setenv("DSV4_CUDA_MOE_STREAM_ROWS", saved, 1);
    else unsetenv("DSV4_CUDA_MOE_STREAM_ROWS");
    free(saved);
    for (int e = 0; e <= E; e++)
        for (int j = 0; j < 3; j++) wcase_free(&w[e][j]);
}

/* ---- tensor family ----------------------------------------------------------------------------- */
/* Data movement is defined to the bit (copies; one fp32 add rounded once, a NaN a kept): identical
 * bytes on every backend, random bit patterns (NaNs and infinities included) for the add. */
static void tensor_ops(void)
{
    const int have = HAS(tensor, embed_rows) && HAS(tensor, add_bf16) && HAS(tensor, copy_rows);
    if (missing("tensor.embed/add/copy", have)) return;
    enum { V = 23, D = 300, T = 7, NC = 4, N = 11 };
    uint16_t *table = bf16_rand(V * D, 1.0f), *a = malloc(2 * T * NC * D), *b = malloc(2 * T * D);
    for (int i = 0; i < T * NC * D; i++) a[i] = (uint16_t)test_rand_u64();
    for (int i = 0; i < T * D; i++) b[i] = (uint16_t)test_rand_u64();
    int32_t ids[T], idx[N];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(test_rand_u64() % V);
    for (int i = 0; i < N; i++) idx[i] = (int32_t)(test_rand_u64() % V);
    const size_t emb = 2 * T * NC * D, cpy = 2 * N * D;
    uint8_t *out[2][3];
    dsv4_ctx *cs[2] = {ref, tc};
    dsv4_status st[2][3];
    for (int side = 0; side < 2; side++) {
        dsv4_ctx *c = cs[side];
        for (int k = 0; k < 3; k++) out[side][k] = poisoned(k == 2 ? cpy : emb);
        dsv4_tensor ht = view(table, DSV4_BF16, 2, V, D, 0), hi = view(ids, DSV4_I32, 1, T, 0, 0),
                    hx = view(idx, DSV4_I32, 1, N, 0, 0), ha = view(a, DSV4_BF16, 3, T, NC, D),
                    hb = view(b, DSV4_BF16, 2, T, D, 0), he = view(out[side][0], DSV4_BF16, 3, T, NC, D),
                    hy = view(out[side][1], DSV4_BF16, 3, T, NC, D), hc = view(out[side][2], DSV4_BF16, 2, N, D, 0);
        dsv4_tensor tt = on(c, &ht), ti = on(c, &hi), tx = on(c, &hx), ta = on(c, &ha), tb2 = on(c, &hb),
                    te = on(c, &he), ty = on(c, &hy), tcp = on(c, &hc);
        st[side][0] = dsv4_embed_rows(c, &tt, &ti, &te);
        st[side][1] = dsv4_add_bf16(c, &ta, &tb2, &ty);
        st[side][2] = dsv4_copy_rows(c, &tt, &tx, &tcp);
        back(c, &te, out[side][0]), back(c, &ty, out[side][1]), back(c, &tcp, out[side][2]);
        release();
    }
    const char *const names[3] = {"embed_rows", "add_bf16", "copy_rows"};
    for (int k = 0; k < 3; k++) {
        ran(names[k], st[1][k], st[0][k]);
        same(names[k], "out", out[1][k], out[0][k], k == 2 ? cpy : emb);
        free(out[0][k]), free(out[1][k]);
    }
    free(table), free(a), free(b);
}

/* Paged slots are integers defined by one rule (include/dsv4/tensor_ops.h): identical on every
 * backend and equal to the rule worked out here, over a shuffled block table, entries inside the
 * table, negative ("no entry") and past its end, strided and in place. */
static void tensor_paged_slots(void)
{
    if (missing("tensor.paged_slots", HAS(tensor, paged_slots))) return;
    enum { NB = 13, BS = 16, N = 300 };
    int32_t table[NB], ent[N * 2], want[N];
    for (int i = 0; i < NB; i++) table[i] = i * 3 + 1;
    for (int i = NB - 1; i > 0; i--) { /* shuffled: the slots are not the entries */
        int j = (int)(test_rand_u64() % (uint64_t)(i + 1)), t = table[i];
        table[i] = table[j], table[j] = t;
    }
    for (int i = 0; i < 2 * N; i++) ent[i] = (int32_t)(test_rand_u64() % (NB * BS + 40)) - 20;
    ent[0] = -1, ent[2] = NB * BS - 1, ent[4] = NB * BS, ent[6] = 0;
    for (int i = 0; i < N; i++) {
        const int32_t e = ent[2 * i];
        want[i] = e < 0 || e >= NB * BS ? -1 : table[e / BS] * BS + e % BS;
    }
    dsv4_ctx *cs[2] = {ref, tc};
    int32_t got[2][2][N];
    dsv4_status st[2][2];
    for (int side = 0; side < 2; side++) {
        dsv4_ctx *c = cs[side];
        int32_t *out = poisoned(sizeof got[0][0]), *inplace = malloc(sizeof got[0][0]);
        for (int i = 0; i < N; i++) inplace[i] = ent[2 * i];
        dsv4_tensor ht = view(table, DSV4_I32, 1, NB, 0, 0), he, ho = view(out, DSV4_I32, 1, N, 0, 0),
                    hp = view(inplace, DSV4_I32, 1, N, 0, 0);
        dsv4_tensor_init_strided(&he, ent, DSV4_I32, 1, (int64_t[]){N}, (int64_t[]){2}); /* every other entry */
        dsv4_tensor tt = on(c, &ht), te = on(c, &he), to = on(c, &ho), tp = on(c, &hp);
        st[side][0] = dsv4_paged_slots(c, &tt, BS, &te, &to);
        st[side][1] = dsv4_paged_slots(c, &tt, BS, &tp, &tp);
        back(c, &to, got[side][0]), back(c, &tp, got[side][1]);
        release();
        free(out), free(inplace);
    }
    for (int k = 0; k < 2; k++) {
        ran("paged_slots", st[1][k], st[0][k]);
        same("paged_slots", k ? "slots (in place)" : "slots", got[1][k], got[0][k], sizeof got[0][0]);
    }
    same("paged_slots", "cpu-ref slots against the rule", got[0][0], want, sizeof want);
}

/* Sampling is defined to the token and the generator state (core/sample.h; include/dsv4/tensor_ops.h
 * says what a device must keep to): identical tokens and states on every backend, at the model's
 * vocabulary, for greedy rows (a tie to the lower id), temperatures with and without top-p (masked
 * tokens, a row of few distinct values: the nucleus's tie rule) and the rows the rule refuses. The
 * expectations are checked on cpu-ref's results. The entry does not depend on the ISA level: the
 * cpu backend runs it at its first level only, and at a smaller vocabulary (the same code as
 * cpu-ref's: a few ms of CI instead of a second). */
static void tensor_sample(void)
{
    static char done_for[48];
    if (missing("tensor.sample", HAS(tensor, sample)) || !strcmp(done_for, tb->name)) return;
    snprintf(done_for, sizeof done_for, "%s", tb->name);
    enum { B = 11 };
    const int64_t V = tb->device == DSV4_DEVICE_CPU ? 1031 : 129280, LD = V + 3;
    const int64_t nan_at = V / 97, inf_at = V / 11, tie_a = V / 31, tie_b = V - 5;
    float *lg = f32_rand((size_t)B * LD, 3.0f, 0.0f);
    const dsv4_sampling sp[B] = {{0.0f, 0.0f, 0},   {1.0f, 0.0f, 1},   {0.7f, 0.9f, 2},  {1.6f, 0.5f, 3},
                                 {0.3f, 0.95f, 4},  {1.0f, 1.0f, 5},   {0.0f, 0.0f, 6},  {-1.0f, 0.5f, 7},
                                 {1.0f, 0.0f, 8},   {1.0f, 0.9f, 9},   {2.5f, 0.99999f, 10}};
    lg[tie_a] = lg[tie_b] = 50.0f;                                         /* row 0: greedy, a tie */
    for (int64_t i = 0; i < V; i += 4) lg[3 * LD + i + (i / 4) % 4] = -INFINITY; /* row 3: a quarter masked */
    lg[5 * LD + nan_at] = NAN, lg[5 * LD + inf_at] = INFINITY;            /* row 5: the first is NaN */
    for (int64_t i = 0; i < V; i++) lg[6 * LD + i] = -INFINITY;           /* row 6: nothing to sample */
    lg[8 * LD + inf_at] = INFINITY;                                       /* row 8: +Inf */
    for (int64_t i = 0; i < V; i++) lg[9 * LD + i] = roundf(lg[9 * LD + i]); /* row 9: many ties */
    uint64_t rng0[B][4];
    for (int r = 0; r < B; r++) dsv4_rng_seed(sp[r].seed, rng0[r]);
    int32_t tok[2][B];
    uint64_t rng[2][B][4];
    dsv4_status st[2];
    dsv4_ctx *cs[2] = {ref, tc};
    size_t wsb = 0;
    CHECK_STATUS(dsv4_sample_workspace_size(ref, B, V, &wsb), DSV4_OK);
    for (int side = 0; side < 2; side++) {
        dsv4_ctx *c = cs[side];
        memset(tok[side], 0xA5, sizeof tok[side]);
        dsv4_tensor hl, ht = view(tok[side], DSV4_I32, 1, B, 0, 0);
        dsv4_tensor_init_strided(&hl, lg, DSV4_F32, 2, (int64_t[]){B, V}, (int64_t[]){LD, 1});
        dsv4_tensor tl = on(c, &hl), tt = on(c, &ht);
        const dsv4_sampling *dp = put(c, sp, sizeof sp);
        uint64_t *dr = put(c, rng0, sizeof rng0);
        st[side] = dsv4_sample_rows(c, &tl, dp, dr, &tt, scratch(c, wsb), wsb);
        back(c, &tt, tok[side]);
        if (dsv4_device_download(c, rng[side], dr, sizeof rng0) != DSV4_OK) die("device_download");
        release();
    }
    ran("sample_rows", st[1], st[0]);
    same("sample_rows", "tokens", tok[1], tok[0], sizeof tok[0]);
    same("sample_rows", "generator states", rng[1], rng[0], sizeof rng[0]);
    const int32_t *t = tok[0];
    CHECK(t[0] == tie_a, "sample_rows: greedy row gave %d, want %lld (the lower id of a tie)", t[0], (long long)tie_a);
    CHECK(t[5] == DSV4_SAMPLE_NAN_LOGIT(nan_at), "sample_rows: NaN row gave %d", t[5]);
    CHECK(t[6] == DSV4_SAMPLE_ALL_MASKED, "sample_rows: all -Inf row gave %d", t[6]);
    CHECK(t[7] == DSV4_SAMPLE_BAD_PARAMS, "sample_rows: temperature -1 gave %d", t[7]);
    CHECK(t[8] == DSV4_SAMPLE_INF_LOGIT(inf_at), "sample_rows: +Inf row gave %d", t[8]);
    char want[64];
    snprintf(want, sizeof want, "logit %lld is NaN", (long long)nan_at);
    CHECK(dsv4_sample_result(t[5], "x") == DSV4_ERR_RANGE && strstr(dsv4_last_error(), want), "sample_result: %s",
          dsv4_last_error());
    snprintf(want, sizeof want, "logit %lld is +Inf", (long long)inf_at);
    CHECK(dsv4_sample_result(t[8], "x") == DSV4_ERR_RANGE && strstr(dsv4_last_error(), want), "sample_result: %s",
          dsv4_last_error());
    for (int r = 0; r < B; r++) {
        const int sampled = r != 0 && r != 5 && r != 6 && r != 7 && r != 8;
        if (sampled)
            CHECK(t[r] >= 0 && t[r] < V && lg[r * LD + t[r]] > -INFINITY, "sample_rows: row %d gave %d", r, t[r]);
        /* a draw per id at temperature > 0; greedy and refused rows leave the state as it was */
        CHECK(!memcmp(rng[0][r], rng0[r], 32) == !sampled, "sample_rows: row %d's generator state", r);
    }
    free(lg);
}

/* ---- attention ------------------------------------------------------------------------------ */
/* Insert, gather and inverse RoPE are defined to the bit (fp32 operations in a fixed order, no
 * contraction, then the exact KV64 rule): bit-identical cache bytes and values on every backend
 * (kv_cuda.cu says how the device keeps to it). The RoPE table takes cos/sin in double and rounds
 * once: within one float ulp of cpu-ref (the device's double cos/sin are not glibc's). The sparse
 * decode sums exponentials in a backend's own order and rounds P to BF16 where FlashMLA does:
 * relative L2 of the output 8e-3 and lse within 1e-5·max(1, |lse|) (test_attention.c). */
enum { BS = 16, PAGES = 6, SLOTS = BS * PAGES, MAXPOS = 300 };

typedef struct attn_host {
    uint8_t *pages; /* PAGES pages of dsv4_kv_page_bytes(BS) */
    size_t page_bytes;
    float *rope; /* [MAXPOS, 64] from cpu-ref */
} attn_host;

static void attn_make(attn_host *a)
{
    a->page_bytes = (size_t)dsv4_kv_page_bytes(BS);
    a->pages = calloc(PAGES, a->page_bytes);
    for (int s = 0; s < SLOTS; s++) { /* valid random entries: finite codes, scales near 1 */
        uint8_t *data = a->pages + dsv4_kve_slot_data((int64_t)a->page_bytes, BS, s);
        uint8_t *sc = a->pages + dsv4_kve_slot_scale((int64_t)a->page_bytes, BS, s);
        for (int d = 0; d < DSV4_KVE_NOPE_DIM; d++) {
            uint8_t c = (uint8_t)test_rand_u64();
            data[d] = (c & 0x7F) == 0x7F ? c ^ 1 : c;
        }
        for (int d = 0; d < DSV4_KVE_ROPE_DIM; d++) {
            uint16_t b = dsv4_bf16_encode(test_randn());
            memcpy(data + DSV4_KVE_NOPE_BYTES + 2 * d, &b, 2);
        }
        for (int g = 0; g < DSV4_KVE_GROUPS; g++) sc[g] = (uint8_t)(118 + test_rand_u64() % 8);
        sc[DSV4_KVE_GROUPS] = 0;
    }
    a->rope = malloc(sizeof(float) * MAXPOS * 64);
    dsv4_rope_params rp = dsv4_rope_v4_params(DSV4_ROPE_YARN);
    dsv4_tensor tr = view(a->rope, DSV4_F32, 2, MAXPOS, 64, 0);
    CHECK_STATUS(dsv4_rope_table(ref, &rp, &tr), DSV4_OK);
}

/* The cache of c: a copy of the host pages. */
static dsv4_kv_cache cache_on(dsv4_ctx *c, const attn_host *a)
{
    dsv4_kv_cache kc;
    void *p = put(c, a->pages, PAGES * a->page_bytes);
    if (dsv4_kv_cache_view(&kc, p, PAGES, BS, dsv4_ctx_device_kind(c), 0) != DSV4_OK) die("kv_cache_view");
    return kc;
}

static void attn_rope_table(void)
{
    if (missing("attention.rope_table", HAS(attention, rope_table))) return;
    for (int kind = 0; kind < 2; kind++) {
        float *tr = poisoned(4 * MAXPOS * 64), *tt = poisoned(4 * MAXPOS * 64);
        dsv4_rope_params rp = dsv4_rope_v4_params((dsv4_rope_kind)kind);
        dsv4_tensor h = view(tr, DSV4_F32, 2, MAXPOS, 64, 0), d_r = on(ref, &h), d_t = on(tc, &h);
        ran("rope_table", dsv4_rope_table(tc, &rp, &d_t), dsv4_rope_table(ref, &rp, &d_r));
        back(ref, &d_r, tr), back(tc, &d_t, tt);
        int bad = 0;
        for (int i = 0; i < MAXPOS * 64; i++)
            bad += !(fabsf(tt[i] - tr[i]) <= nextafterf(fabsf(tr[i]), INFINITY) - fabsf(tr[i]));
        n_compared++;
        CHECK(bad == 0, "rope_table kind %d on %s: %d values more than one float ulp from cpu-ref", kind, target, bad);
        free(tr), free(tt);
        release();
    }
}

static void attn_insert(const attn_host *a)
{
    enum { N = 20, H = 3, NINS = 17 };
    uint16_t *kv = bf16_rand(N * 512, 1.0f), *q = bf16_rand(N * H * 512, 3.0f);
    int64_t slots[N], pos[N];
    for (int i = 0; i < N; i++) {
        slots[i] = i % 7 == 3 ? -1 : (int64_t)(test_rand_u64() % SLOTS); /* skipped rows, likely duplicates */
        pos[i] = (int64_t)(test_rand_u64() % MAXPOS);
    }
    const size_t cb = PAGES * a->page_bytes;
    uint8_t *cr = malloc(cb), *ct = malloc(cb);
    uint16_t *qr = malloc(2 * N * H * 512), *qt = malloc(2 * N * H * 512);
    /* 0: kv_insert with RoPE, 1: kv_insert as is, 2: fused q-norm + RoPE + insert */
    for (int mode = 0; mode < 3; mode++) {
        const char *op = mode == 2 ? "attention.qnorm_rope_kv_insert" : "attention.kv_insert";
        if (missing(op, mode == 2 ? HAS(attention, qnorm_rope_kv_insert) : HAS(attention, kv_insert))) continue;
        dsv4_tensor hkv = view(kv, DSV4_BF16, 2, N, 512, 0), hq = view(q, DSV4_BF16, 3, N, H, 512),
                    hs = view(slots, DSV4_I64, 1, mode == 2 ? NINS : N, 0, 0), hp = view(pos, DSV4_I64, 1, N, 0, 0),
                    hr = view(a->rope, DSV4_F32, 2, MAXPOS, 64, 0);
        dsv4_status st[2];
        dsv4_ctx *cs[2] = {ref, tc};
        uint8_t *cout[2] = {cr, ct};
        uint16_t *qout[2] = {qr, qt};
        for (int side = 0; side < 2; side++) {
            dsv4_ctx *c = cs[side];
            dsv4_kv_cache kc = cache_on(c, a);
            dsv4_tensor tkv = on(c, &hkv), tq = on(c, &hq), ts = on(c, &hs), tp = on(c, &hp), tr = on(c, &hr);
            st[side] = mode == 2 ? dsv4_qnorm_rope_kv_insert(c, &tq, &tkv, &kc, &ts, &tp, &tr, 1e-6f)
                                 : dsv4_kv_insert(c, &tkv, &kc, &ts, mode ? NULL : &tp, mode ? NULL : &tr);
            back(c, &kc.pages, cout[side]);
            back(c, &tq, qout[side]);
            release();
        }
        ran(op + 10, st[1], st[0]);
        same(op + 10, "cache bytes", ct, cr, cb);
        /* q: bit-exact on the CPU backends; a device may reduce the 512 squares in another order,
         * which docs/kernels.md §2.3 allows one BF16 ulp for */
        if (mode == 2 && tb->device == DSV4_DEVICE_CPU) same(op + 10, "q", qt, qr, 2 * N * H * 512);
        if (mode == 2 && tb->device != DSV4_DEVICE_CPU) near_bf16(op + 10, "q", qt, qr, (size_t)N * H * 512);
    }
    free(kv), free(q), free(cr), free(ct), free(qr), free(qt);
}

static void attn_gather_inv_rope(const attn_host *a)
{
    enum { S = 30, T = 4, H = 5 };
    if (!missing("attention.dequant_gather", HAS(attention, dequant_gather))) {
        int32_t slots[S];
        for (int i = 0; i < S; i++) slots[i] = i % 9 == 4 ? -1 : (int32_t)(test_rand_u64() % SLOTS);
        uint16_t *gr = poisoned(2 * S * 512), *gt = poisoned(2 * S * 512);
        uint16_t *gout[2] = {gr, gt};
        dsv4_status st[2];
        dsv4_ctx *cs[2] = {ref, tc};
        for (int side = 0; side < 2; side++) {
            dsv4_kv_cache kc = cache_on(cs[side], a);
            dsv4_tensor hs = view(slots, DSV4_I32, 1, S, 0, 0), ho = view(gout[side], DSV4_BF16, 2, S, 512, 0);
            dsv4_tensor ts = on(cs[side], &hs), to = on(cs[side], &ho);
            st[side] = dsv4_dequant_gather(cs[side], &kc, &ts, &to);
            back(cs[side], &to, gout[side]);
            release();
        }
        ran("dequant_gather", st[1], st[0]);
        same("dequant_gather", "rows", gt, gr, 2 * S * 512);
        free(gr), free(gt);
    }
    if (!missing("attention.inv_rope", HAS(attention, inv_rope))) {
        uint16_t *o = bf16_rand(T * H * 512, 1.0f), *orf = malloc(2 * T * H * 512), *ot = malloc(2 * T * H * 512);
        int64_t pos[T] = {0, 7, MAXPOS - 1, 123};
        uint16_t *oout[2] = {orf, ot};
        dsv4_status st[2];
        dsv4_ctx *cs[2] = {ref, tc};
        for (int side = 0; side < 2; side++) {
            dsv4_tensor ho = view(o, DSV4_BF16, 3, T, H, 512), hp = view(pos, DSV4_I64, 1, T, 0, 0),
                        hr = view(a->rope, DSV4_F32, 2, MAXPOS, 64, 0);
            dsv4_tensor to = on(cs[side], &ho), tp = on(cs[side], &hp), tr = on(cs[side], &hr);
            st[side] = dsv4_inv_rope(cs[side], &to, &tp, &tr);
            back(cs[side], &to, oout[side]);
            release();
        }
        ran("inv_rope", st[1], st[0]);
        same("inv_rope", "o", ot, orf, 2 * T * H * 512);
        free(o), free(orf), free(ot);
    }
}

static void compare_decode(const char *op, int64_t n_out, const uint16_t *o, const float *lse, const uint16_t *ro,
                           const float *rlse, int64_t n_lse)
{
    double num = 0, den = 0, lerr = 0;
    int inf_bad = 0;
    for (int64_t i = 0; i < n_out; i++) {
        double x = dsv4_bf16_decode(o[i]), y = dsv4_bf16_decode(ro[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    for (int64_t i = 0; i < n_lse; i++) {
        if (isinf(rlse[i]) || isinf(lse[i])) {
            inf_bad += !(isinf(rlse[i]) && isinf(lse[i]) && lse[i] > 0);
            continue;
        }
        double e = fabs(lse[i] - rlse[i]) / fmax(1.0, fabs(rlse[i]));
        lerr = e > lerr ? e : lerr;
    }
    n_compared++;
    const double rel = sqrt(num / fmax(den, 1e-300));
    CHECK(rel <= 8e-3, "%s on %s: relative L2 %g of cpu-ref", op, target, rel);
    CHECK(lerr <= 1e-5 && !inf_bad, "%s on %s: lse error %g, %d +inf mismatches", op, target, lerr, inf_bad);
}

/* One sparse decode (bf16_rows: sparse_attn_bf16 over the gathered rows instead of the FP8 pages). */
typedef struct dcase {
    int64_t t, h, w, k;
} dcase;

static dsv4_status decode_on(dsv4_ctx *c, const attn_host *a, const dcase *d, int bf16_rows, const uint16_t *q,
                             const float *sink, const int32_t *idx, const int32_t *len, const int32_t *xidx,
                             const int32_t *xlen, const uint16_t *rows, uint16_t *out, float *lse)
{
    dsv4_kv_cache kc = cache_on(c, a);
    dsv4_tensor hq = view((void *)q, DSV4_BF16, 3, d->t, d->h, 512), hsk = view((void *)sink, DSV4_F32, 1, d->h, 0, 0),
                hi = view((void *)idx, DSV4_I32, 2, d->t, d->w, 0), hl = view((void *)len, DSV4_I32, 1, d->t, 0, 0),
                hxi = view((void *)xidx, DSV4_I32, 2, d->t, d->k, 0), hxl = view((void *)xlen, DSV4_I32, 1, d->t, 0, 0),
                hrows = view((void *)rows, DSV4_BF16, 2, SLOTS, 512, 0), ho = view(out, DSV4_BF16, 3, d->t, d->h, 512),
                hlse = view(lse, DSV4_F32, 2, d->t, d->h, 0);
    dsv4_tensor tq = on(c, &hq), tsk = on(c, &hsk), ti = on(c, &hi), tl = on(c, &hl), txi = on(c, &hxi),
                txl = on(c, &hxl), trows = on(c, &hrows), to = on(c, &ho), tlse = on(c, &hlse);
    size_t wsb = 0;
    dsv4_status s = dsv4_sparse_mla_decode_workspace(c, d->t, d->h, d->w, bf16_rows ? 0 : d->k, &wsb);
    if (s) return s;
    dsv4_tensor tws = view(scratch(c, wsb), DSV4_U8, 1, (int64_t)wsb, 0, 0);
    tws.device = dsv4_ctx_device_kind(c);
    dsv4_sparse_scope swa = {&kc, &ti, &tl}, extra = {&kc, &txi, &txl};
    const float scale = 0.044194173824159216f;
    if (bf16_rows)
        s = dsv4_sparse_attn_bf16(c, &tq, &trows, &ti, &tl, &tsk, scale, &to, &tlse, &tws);
    else
        s = dsv4_sparse_mla_decode(c, &tq, &swa, d->k ? &extra : NULL, &tsk, scale, &to, &tlse, &tws);
    back(c, &to, out), back(c, &tlse, lse);
    release();
    return s;
}

/* decode_workspace never decreases with t or width (src/core/ops_attention.h: the engine plans
 * its largest call once): a sweep over call sizes and widths on each side of the split sizes. */
static void attn_workspace_monotone(void)
{
    if (missing("attention.decode_workspace", HAS(attention, decode_workspace))) return;
    static const int64_t heads[] = {1, 8, 64, 128};
    int bad = 0;
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
        for (int64_t t = 1; t <= 48; t += 1 + t / 8)
            for (int64_t w = 0; w <= 70000; w += 1 + w / 3) {
                size_t a = 0, bt = 0, bw = 0;
                dsv4_status s = dsv4_sparse_mla_decode_workspace(tc, t, heads[hi], w, 0, &a);
                s |= dsv4_sparse_mla_decode_workspace(tc, t + 1 + t / 8, heads[hi], w, 0, &bt);
                s |= dsv4_sparse_mla_decode_workspace(tc, t, heads[hi], w + 1 + w / 3, 0, &bw);
                if (s != DSV4_OK || bt < a || bw < a) {
                    if (!bad++)
                        CHECK(0, "decode_workspace on %s: t %lld h %lld width %lld: %zu bytes, %zu at the next t, %zu at the next width",
                              target, (long long)t, (long long)heads[hi], (long long)w, a, bt, bw);
                }
            }
    CHECK(bad == 0, "decode_workspace on %s decreases in %d places", target, bad);
    n_compared++;
}

static void attn_decode(const attn_host *a)
{
    static const dcase cases[] = {{1, 64, 128, 256}, {3, 16, 40, 0}, {2, 128, 64, 64}, {5, 8, 70, 96}, {2, 1, 3, 5}};
    /* the BF16 rows of the two-pass peer: every cache entry dequantized (cpu-ref's gather) */
    uint16_t *rows = malloc(2 * SLOTS * 512);
    {
        int32_t all[SLOTS];
        for (int i = 0; i < SLOTS; i++) all[i] = i;
        dsv4_kv_cache kc;
        CHECK_STATUS(dsv4_kv_cache_view(&kc, a->pages, PAGES, BS, DSV4_DEVICE_CPU, 0), DSV4_OK);
        dsv4_tensor ts = view(all, DSV4_I32, 1, SLOTS, 0, 0), tr = view(rows, DSV4_BF16, 2, SLOTS, 512, 0);
        CHECK_STATUS(dsv4_dequant_gather(ref, &kc, &ts, &tr), DSV4_OK);
    }
    for (int bf16_rows = 0; bf16_rows < 2; bf16_rows++) {
        const char *op = bf16_rows ? "attention.sparse_attn_bf16" : "attention.sparse_mla_decode";
        if (missing(op, (bf16_rows ? HAS(attention, sparse_attn_bf16) : HAS(attention, sparse_mla_decode)) &&
                            HAS(attention, decode_workspace)))
            continue;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const dcase *d = &cases[ci];
            const int64_t t = d->t, h = d->h, kk = d->k ? d->k : 1;
            uint16_t *q = bf16_rand((size_t)(t * h * 512), 0.5f);
            float *sink = f32_rand((size_t)h, 1.0f, 0.0f);
            for (int64_t i = 4; i < h; i += 5) sink[i] = -INFINITY;
            int32_t *idx = malloc(4 * (size_t)(t * d->w)), *xidx = malloc(4 * (size_t)(t * kk)),
                    *len = malloc(4 * (size_t)t), *xlen = malloc(4 * (size_t)t);
            for (int64_t i = 0; i < t * d->w; i++)
                idx[i] = (int32_t)(test_rand_u64() % (SLOTS + 8)) - 4; /* some masked */
            for (int64_t i = 0; i < t * kk; i++) xidx[i] = (int32_t)(test_rand_u64() % SLOTS);
            for (int64_t i = 0; i < t; i++) {
                len[i] = (int32_t)(test_rand_u64() % (uint64_t)(d->w + 1));
                xlen[i] = d->k ? (int32_t)(test_rand_u64() % (uint64_t)(d->k + 1)) : 0;
            }
            len[0] = (int32_t)d->w;
            size_t no = (size_t)(t * h * 512), nl = (size_t)(t * h);
            uint16_t *orf = poisoned(2 * no), *ot = poisoned(2 * no);
            float *lr = poisoned(4 * nl), *lt = poisoned(4 * nl);
            ran(op + 10, decode_on(tc, a, d, bf16_rows, q, sink, idx, len, xidx, xlen, rows, ot, lt),
                decode_on(ref, a, d, bf16_rows, q, sink, idx, len, xidx, xlen, rows, orf, lr));
            char what[80];
            snprintf(what, sizeof what, "%s t%lld h%lld w%lld k%lld", op + 10, (long long)t, (long long)h,
                     (long long)d->w, bf16_rows ? 0LL : (long long)d->k);
            compare_decode(what, (int64_t)no, ot, lt, orf, lr, (int64_t)nl);
            free(q), free(sink), free(idx), free(xidx), free(len), free(xlen), free(orf), free(ot), free(lr), free(lt);
        }
    }
    free(rows);
}

/* ---- indexer --------------------------------------------------------------------------------- */
/* The compressor, the q path, head weights, scores and top-k are defined to the bit (dsv4/indexer.h:
 * exact FP4 group dots, a fixed fp32 summation order, a total order for top-k), so every backend
 * gives cpu-ref's bytes. Compressor states are the backend's memory, like the other views (query
 * positions are host memory by contract). */
typedef struct {
    dsv4_compressor_desc d;
    int bf16_out, bf16_norm; /* indexer kind: BF16 values instead of codes + scales; norm weight BF16 */
} cmp_case;

/* One chain of compressor calls on each side from a state reset on that side (the state carried
 * across the calls in the backend's memory, rows padded by 8 poisoned floats that must stay as
 * they are): start 0 with one token, then from mid-block over several blocks, a call that ends on
 * a block boundary, one that starts on it and spans two blocks, and single tokens after it; the
 * entries and the whole state are compared after every call. */
static void ix_compressor_case(const cmp_case *cc)
{
    const dsv4_compressor_desc *dc = &cc->d;
    const int r = dc->ratio, D = dc->dim, coff = dc->overlap ? 2 : 1, w = coff * D, srows = coff * r, ld = w + 8;
    const int packed = dc->kind == DSV4_COMPRESSOR_INDEXER && !cc->bf16_out;
    const int64_t calls[][2] = {{0, 1}, {1, 3 * r + 2}, {3 * r + 3, r - 3}, {4 * r, 2 * r + 1}, {6 * r + 1, 1}, {6 * r + 2, 1}};
    enum { NCALLS = sizeof calls / sizeof calls[0] };
    const int64_t P = 6 * r + 3, rows = P + r; /* positions, rope rows */
    float *rope = malloc(4 * (size_t)rows * 64);
    dsv4_rope_params rp = dsv4_rope_v4_params(DSV4_ROPE_YARN);
    dsv4_tensor trope = view(rope, DSV4_F32, 2, rows, 64, 0);
    CHECK_STATUS(dsv4_rope_table(ref, &rp, &trope), DSV4_OK);
    /* scores spread over a few units, so that the softmax weights differ and none underflows alone */
    float *kv = f32_rand((size_t)P * w, 1.0f, 0.0f), *gate = f32_rand((size_t)P * w, 2.0f, 0.0f),
          *ape = f32_rand((size_t)r * w, 1.0f, 0.0f), *normf = f32_rand((size_t)D, 0.1f, 1.0f);
    uint16_t *normb = malloc(2 * (size_t)D);
    for (int e = 0; e < D; e++) normb[e] = dsv4_bf16_encode(normf[e]);
    const size_t sbytes = 4 * ((size_t)(srows - 1) * ld + w);
    dsv4_ctx *cs[2] = {ref, tc};
    void *skv[2], *ssc[2];
    float *hskv[2] = {malloc(sbytes), malloc(sbytes)}, *hssc[2] = {malloc(sbytes), malloc(sbytes)};
    dsv4_tensor tskv[2], tssc[2];
    char what[64];
    snprintf(what, sizeof what, "%s r%d d%d%s%s%s", dc->kind == DSV4_COMPRESSOR_INDEXER ? "indexer" : "main", r, D,
             dc->overlap ? " overlap" : "", dc->fp8_sim ? " fp8" : "", cc->bf16_out ? " bf16 out" : "");
    for (int side = 0; side < 2; side++) {
        skv[side] = scratch(cs[side], sbytes), ssc[side] = scratch(cs[side], sbytes);
        tskv[side] = view(skv[side], DSV4_F32, 2, srows, w, 0), tssc[side] = view(ssc[side], DSV4_F32, 2, srows, w, 0);
        tskv[side].stride[0] = tssc[side].stride[0] = ld;
        tskv[side].device = tssc[side].device = dsv4_ctx_device_kind(cs[side]);
        CHECK_STATUS(dsv4_compressor_state_reset(cs[side], dc, &tskv[side], &tssc[side]), DSV4_OK);
        back(cs[side], &tskv[side], hskv[side]), back(cs[side], &tssc[side], hssc[side]);
    }
    same("compressor_state_reset", what, hskv[1], hskv[0], sbytes);
    same("compressor_state_reset", "scores", hssc[1], hssc[0], sbytes);
    for (int ci = 0; ci < NCALLS && !test_failures; ci++) {
        const int64_t start = calls[ci][0], n = calls[ci][1], m = dsv4_compressor_emit_count(r, start, n);
        const size_t row = packed ? (size_t)D / 2 : 2 * (size_t)D, srow = (size_t)D / 32;
        uint8_t *out[2] = {poisoned(m * row), poisoned(m * row)}, *osc[2] = {poisoned(m * srow), poisoned(m * srow)};
        dsv4_status st[2];
        const int nb = nbufs;
        for (int side = 0; side < 2; side++) {
            dsv4_ctx *c = cs[side];
            dsv4_tensor hkv = view(kv + start * w, DSV4_F32, 2, n, w, 0), hg = view(gate + start * w, DSV4_F32, 2, n, w, 0),
                        ha = view(ape, DSV4_F32, 2, r, w, 0),
                        hn = cc->bf16_norm ? view(normb, DSV4_BF16, 1, D, 0, 0) : view(normf, DSV4_F32, 1, D, 0, 0),
                        ho = packed ? view(out[side], DSV4_U8, 2, m, D / 2, 0) : view(out[side], DSV4_BF16, 2, m, D, 0),
                        hos = view(osc[side], DSV4_U8, 2, m, D / 32, 0);
            dsv4_tensor tkv = on(c, &hkv), tg = on(c, &hg), ta = on(c, &ha), tn = on(c, &hn), tr = on(c, &trope),
                        to = on(c, &ho), tos = on(c, &hos);
            st[side] = dsv4_compressor_forward(c, dc, start, &tkv, &tg, &ta, &tn, &tr, &tskv[side], &tssc[side],
                                               m ? &to : NULL, m && packed ? &tos : NULL);
            if (m) back(c, &to, out[side]);
            if (m && packed) back(c, &tos, osc[side]);
            back(c, &tskv[side], hskv[side]), back(c, &tssc[side], hssc[side]);
        }
        while (nbufs > nb) nbufs--, dsv4_device_free(bufs[nbufs].c, bufs[nbufs].p);
        char call[96];
        snprintf(call, sizeof call, "%s, tokens %lld..%lld", what, (long long)start, (long long)(start + n - 1));
        ran("compressor_forward", st[1], st[0]);
        if (m) same("compressor_forward", call, out[1], out[0], m * row);
        if (m && packed) same("compressor_forward", "scales", osc[1], osc[0], m * srow);
        same("compressor_forward", "state", hskv[1], hskv[0], sbytes);
        same("compressor_forward", "state scores", hssc[1], hssc[0], sbytes);
        for (int side = 0; side < 2; side++) free(out[side]), free(osc[side]);
    }
    release();
    for (int side = 0; side < 2; side++) free(hskv[side]), free(hssc[side]);
    free(kv), free(gate), free(ape), free(normf), free(normb), free(rope);
}

/* The position form (desc.position, the shaped decode step): single tokens at positions 0 .. 3r,
 * each position in the context's memory, the entries into a cache of 3 entries + 1 (packed
 * indexer rows of one 68-byte stride, or BF16 rows) at the entry's row, against cpu-ref's plain
 * calls at those positions into the same rows; a position of no emission leaves the cache as it
 * is (poisoned rows stay poisoned). Then the same tokens with a one-row out, as the engine's main
 * compressor uses it: the row holds the latest entry. */
static void ix_compressor_at_case(const cmp_case *cc)
{
    const dsv4_compressor_desc *dc = &cc->d;
    const int r = dc->ratio, D = dc->dim, coff = dc->overlap ? 2 : 1, w = coff * D, srows = coff * r;
    const int packed = dc->kind == DSV4_COMPRESSOR_INDEXER && !cc->bf16_out;
    const int64_t P = 3 * r + 1, NE = 4; /* positions, cache rows */
    const size_t eb = packed ? (size_t)D / 2 + (size_t)D / 32 : 2 * (size_t)D, cbytes = (size_t)NE * eb;
    float *rope = malloc(4 * (size_t)P * 64);
    dsv4_rope_params rp = dsv4_rope_v4_params(DSV4_ROPE_YARN);
    dsv4_tensor trope = view(rope, DSV4_F32, 2, P, 64, 0);
    CHECK_STATUS(dsv4_rope_table(ref, &rp, &trope), DSV4_OK);
    float *kv = f32_rand((size_t)P * w, 1.0f, 0.0f), *gate = f32_rand((size_t)P * w, 2.0f, 0.0f),
          *ape = f32_rand((size_t)r * w, 1.0f, 0.0f), *normf = f32_rand((size_t)D, 0.1f, 1.0f);
    const size_t sbytes = 4 * (size_t)srows * (size_t)w;
    int64_t *pos = malloc(8 * (size_t)P);
    for (int64_t p = 0; p < P; p++) pos[p] = p;
    char what[64];
    snprintf(what, sizeof what, "position form: %s r%d d%d%s", dc->kind == DSV4_COMPRESSOR_INDEXER ? "indexer" : "main",
             r, D, cc->bf16_out ? " bf16 out" : "");
    for (int one_row = 0; one_row < 2 && !test_failures; one_row++) {
        const int64_t rows = one_row ? 1 : NE;
        dsv4_ctx *cs[2] = {ref, tc};
        uint8_t *hcache[2], *hst[2][2];
        dsv4_status st[2] = {DSV4_OK, DSV4_OK};
        for (int side = 0; side < 2; side++) {
            dsv4_ctx *c = cs[side];
            uint8_t *cache = scratch(c, cbytes);
            dsv4_tensor skv = view(scratch(c, sbytes), DSV4_F32, 2, srows, w, 0), ssc = view(scratch(c, sbytes), DSV4_F32, 2, srows, w, 0);
            skv.device = ssc.device = dsv4_ctx_device_kind(c);
            CHECK_STATUS(dsv4_compressor_state_reset(c, dc, &skv, &ssc), DSV4_OK);
            dsv4_tensor ha = view(ape, DSV4_F32, 2, r, w, 0), hn = view(normf, DSV4_F32, 1, D, 0, 0);
            dsv4_tensor ta = on(c, &ha), tn = on(c, &hn), tr = on(c, &trope);
            dsv4_tensor hkv = view(kv, DSV4_F32, 2, P, w, 0), hg = view(gate, DSV4_F32, 2, P, w, 0);
            dsv4_tensor hpos = view(pos, DSV4_I64, 1, P, 0, 0), tkvs = on(c, &hkv), tgs = on(c, &hg), tpos = on(c, &hpos);
            for (int64_t p = 0; p < P && st[side] == DSV4_OK; p++) {
                dsv4_tensor tkv = tkvs, tg = tgs, tp = tpos;
                tkv.shape[0] = tg.shape[0] = tp.shape[0] = 1;
                tkv.data = (float *)tkvs.data + p * w, tg.data = (float *)tgs.data + p * w;
                tp.data = (int64_t *)tpos.data + p;
                dsv4_tensor o, os; /* side 0: the plain call's row of the entry; side 1: every row */
                const int64_t first = side ? 0 : ((p / r) % rows), n = side ? rows : 1;
                uint8_t *base = cache + (size_t)first * eb;
                if (packed) {
                    dsv4_tensor_init_strided(&o, base, DSV4_U8, 2, (const int64_t[]){n, D / 2}, (const int64_t[]){(int64_t)eb, 1});
                    dsv4_tensor_init_strided(&os, base + D / 2, DSV4_U8, 2, (const int64_t[]){n, D / 32},
                                             (const int64_t[]){(int64_t)eb, 1});
                } else {
                    dsv4_tensor_init(&o, base, DSV4_BF16, 2, (const int64_t[]){n, D});
                }
                o.device = os.device = dsv4_ctx_device_kind(c);
                const int emits = (p + 1) % r == 0;
                if (side == 0) {
                    st[0] = dsv4_compressor_forward(c, dc, p, &tkv, &tg, &ta, &tn, &tr, &skv, &ssc, emits ? &o : NULL,
                                                    emits && packed ? &os : NULL);
                } else {
                    dsv4_compressor_desc d1 = *dc;
                    d1.position = &tp;
                    st[1] = dsv4_compressor_forward(c, &d1, 0, &tkv, &tg, &ta, &tn, &tr, &skv, &ssc, &o, packed ? &os : NULL);
                }
            }
            hcache[side] = malloc(cbytes), hst[side][0] = malloc(sbytes), hst[side][1] = malloc(sbytes);
            if (dsv4_device_download(c, hcache[side], cache, cbytes) != DSV4_OK) die("device_download");
            back(c, &skv, hst[side][0]), back(c, &ssc, hst[side][1]);
            release();
        }
        ran("compressor_forward", st[1], st[0]);
        same("compressor_forward", what, hcache[1], hcache[0], cbytes);
        same("compressor_forward", "position form: state", hst[1][0], hst[0][0], sbytes);
        same("compressor_forward", "position form: state scores", hst[1][1], hst[0][1], sbytes);
        for (int side = 0; side < 2; side++) free(hcache[side]), free(hst[side][0]), free(hst[side][1]);
    }
    free(kv), free(gate), free(ape), free(normf), free(rope), free(pos);
}

static void ix_compressor(void)
{
    if (missing("indexer.compress", HAS(indexer, compress))) return;
    if (missing("indexer.compress_reset", HAS(indexer, compress_reset))) return;
    /* kind, ratio, dim, eps, fp8_sim, overlap: CSA (overlapping, ratios 4, 8 and 128), HCA (128),
     * the CSA indexer with packed and BF16 entries */
    static const cmp_case cases[] = {
        {{DSV4_COMPRESSOR_MAIN, 4, 512, 1e-6f, 1, 1, NULL}, 0, 0},    {{DSV4_COMPRESSOR_MAIN, 8, 512, 1e-6f, 0, 1, NULL}, 0, 1},
        {{DSV4_COMPRESSOR_MAIN, 128, 512, 1e-6f, 1, 0, NULL}, 0, 0},  {{DSV4_COMPRESSOR_MAIN, 128, 512, 1e-6f, 0, 1, NULL}, 0, 0},
        {{DSV4_COMPRESSOR_INDEXER, 4, 128, 1e-6f, 0, 1, NULL}, 0, 1}, {{DSV4_COMPRESSOR_INDEXER, 4, 128, 1e-6f, 0, 1, NULL}, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ix_compressor_case(&cases[i]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ix_compressor_at_case(&cases[i]);
}

/* One indexer_q comparison: T tokens (positions spread over the MP rows of the rope table, the
 * first 0 and the last MP - 1), H heads of dim D; packed codes + scales, or BF16 values. dev_pos
 * (I64 only): the tested side's positions are in its context's memory (read where the op runs). */
static void ix_query_case(int T, int H, int D, int MP, int packed, int pos_i64, const dsv4_tensor *trope, int dev_pos)
{
    uint16_t *q = bf16_rand((size_t)T * H * D, 2.0f);
    int64_t *pos = malloc(8 * (size_t)T);
    for (int t = 0; t < T; t++) {
        const int64_t p = t == 0 ? 0 : t == T - 1 ? MP - 1 : (int64_t)(test_rand_u64() % (uint64_t)MP);
        if (pos_i64) pos[t] = p;
        else ((int32_t *)pos)[t] = (int32_t)p;
    }
    const size_t nc = packed ? (size_t)T * H * D / 2 : 2 * (size_t)T * H * D, ns = (size_t)T * H * D / 32;
    uint8_t *oc[2] = {poisoned(nc), poisoned(nc)}, *os[2] = {poisoned(ns), poisoned(ns)};
    dsv4_status st[2];
    dsv4_ctx *cs[2] = {ref, tc};
    for (int side = 0; side < 2; side++) {
        dsv4_tensor hq = view(q, DSV4_BF16, 3, T, H, D), hp = view(pos, pos_i64 ? DSV4_I64 : DSV4_I32, 1, T, 0, 0),
                    hc = packed ? view(oc[side], DSV4_U8, 3, T, H, D / 2) : view(oc[side], DSV4_BF16, 3, T, H, D),
                    hs = view(os[side], DSV4_U8, 3, T, H, D / 32);
        dsv4_tensor tq = on(cs[side], &hq), tr = on(cs[side], trope), tcd = on(cs[side], &hc), ts = on(cs[side], &hs);
        dsv4_tensor tp = dev_pos && side ? on(cs[side], &hp) : hp;
        st[side] = dsv4_indexer_q(cs[side], &tq, &tp, &tr, &tcd, packed ? &ts : NULL);
        back(cs[side], &tcd, oc[side]);
        if (packed) back(cs[side], &ts, os[side]);
        release();
    }
    ran("indexer_q", st[1], st[0]);
    same("indexer_q", packed ? "codes" : "values", oc[1], oc[0], nc);
    if (packed) same("indexer_q", "scales", os[1], os[0], ns);
    free(q), free(pos), free(oc[0]), free(oc[1]), free(os[0]), free(os[1]);
}

static void ix_query_and_weights(void)
{
    enum { T = 3, D = 128, MP = 64 };
    float rope[MP * 64];
    dsv4_rope_params rp = dsv4_rope_v4_params(DSV4_ROPE_YARN);
    dsv4_tensor trope = view(rope, DSV4_F32, 2, MP, 64, 0);
    CHECK_STATUS(dsv4_rope_table(ref, &rp, &trope), DSV4_OK);
    if (!missing("indexer.index_q", HAS(indexer, index_q))) {
        ix_query_case(T, 8, D, MP, 1, 0, &trope, 0);
        ix_query_case(T, 8, D, MP, 1, 1, &trope, 1);
        if (tb->device != DSV4_DEVICE_CPU) { /* the device kernel's shapes; CI time on the cpu backends */
            ix_query_case(300, 2, 64, MP, 1, 1, &trope, 0); /* two launches of tokens */
            ix_query_case(300, 2, 64, MP, 1, 1, &trope, 1);
            ix_query_case(5, 3, 256, MP, 1, 0, &trope, 0);
            ix_query_case(4, 5, 128, MP, 0, 1, &trope, 0);   /* BF16 values */
        }
    }
    const int proj_kinds = tb->device == DSV4_DEVICE_CPU ? 1 : 2; /* F32, and BF16 on device backends */
    for (int bf = 0; bf < proj_kinds && !missing("indexer.head_weights", HAS(indexer, head_weights)); bf++) {
        float *proj = f32_rand(T * 64, 3.0f, 0.0f), *wr = poisoned(4 * T * 64), *wt = poisoned(4 * T * 64);
        uint16_t pb[T * 64];
        for (int i = 0; i < T * 64; i++) pb[i] = dsv4_bf16_encode(proj[i]);
        dsv4_tensor hp = bf ? view(pb, DSV4_BF16, 2, T, 64, 0) : view(proj, DSV4_F32, 2, T, 64, 0),
                    hw = view(wr, DSV4_F32, 2, T, 64, 0);
        dsv4_tensor p_r = on(ref, &hp), p_t = on(tc, &hp), w_r = on(ref, &hw), w_t = on(tc, &hw);
        ran("indexer_weights", dsv4_indexer_weights(tc, &p_t, D, &w_t), dsv4_indexer_weights(ref, &p_r, D, &w_r));
        back(ref, &w_r, wr), back(tc, &w_t, wt);
        same("indexer_weights", "w", wt, wr, 4 * T * 64);
        release();
        free(proj), free(wr), free(wt);
    }
}

/* One scores / select / topk comparison: T tokens at positions pos (ratio 4), H heads of dim D,
 * N cache entries; topk on given scores with ties every `tie` candidates (tie 0: scores rounded to
 * quarters), a NaN, and n_valid. dev_pos: the tested side's positions are I64 in its context's
 * memory (counts read where the op runs). */
static void ix_scores_topk_case(int T, int H, int D, int N, int TOPK, const int32_t *pos, const int32_t *nvalid,
                                int tie, int entries, int dev_pos)
{
    int64_t pos64[8];
    for (int t = 0; t < T && t < 8; t++) pos64[t] = pos[t];
    const dsv4_tensor hp64 = view(pos64, DSV4_I64, 1, T, 0, 0);
    uint8_t *q = bytes_rand((size_t)T * H * D / 2, 0, 256), *qs = bytes_rand((size_t)T * H * D / 32, 120, 12);
    uint8_t *k = bytes_rand((size_t)N * D / 2, 0, 256), *ks = bytes_rand((size_t)N * D / 32, 120, 12);
    float *w = f32_rand((size_t)T * H, 0.1f, 0.0f);
    dsv4_tensor hq = view(q, DSV4_FP4X2, 3, T, H, D / 2), hqs = view(qs, DSV4_E8M0, 3, T, H, D / 32),
                hw = view(w, DSV4_F32, 2, T, H, 0), hk = view(k, DSV4_FP4X2, 2, N, D / 2, 0),
                hks = view(ks, DSV4_E8M0, 2, N, D / 32, 0), hp = view((void *)pos, DSV4_I32, 1, T, 0, 0);
    uint8_t *ent = NULL;
    if (entries) { /* the cache's entry layout: codes then scales in rows of D/2 + D/32 bytes */
        const int64_t rb = D / 2 + D / 32;
        ent = malloc((size_t)N * rb);
        for (int64_t c = 0; c < N; c++)
            memcpy(ent + c * rb, k + c * D / 2, D / 2), memcpy(ent + c * rb + D / 2, ks + c * D / 32, D / 32);
        hk = view(ent, DSV4_FP4X2, 2, N, D / 2, 0), hks = view(ent + D / 2, DSV4_E8M0, 2, N, D / 32, 0);
        hk.stride[0] = hks.stride[0] = rb;
    }
    const size_t nsc = 4 * (size_t)T * N, nix = 4 * (size_t)T * TOPK;
    float *sc[2] = {poisoned(nsc), poisoned(nsc)};
    int32_t *ix[2] = {poisoned(nix), poisoned(nix)}, *ln[2] = {poisoned(4 * T), poisoned(4 * T)};
    const int have[3] = {HAS(indexer, scores), HAS(indexer, select) && HAS(indexer, workspace_size),
                         HAS(indexer, topk) && HAS(indexer, workspace_size)};
    static const char *const names[3] = {"indexer.scores", "indexer.select", "indexer.topk"};
    float *given = f32_rand((size_t)T * N, 1.0f, 0.0f);
    if (tie > 0)
        for (size_t i = 0; i + 1 < (size_t)T * N; i += tie) given[i] = given[i + 1]; /* ties */
    else /* a few distinct values: thousands tie at the k-th, both zeros among them */
        for (size_t i = 0; i < (size_t)T * N; i++) given[i] = i % 97 == 3 ? -0.0f : floorf(given[i] * 4.0f) / 4.0f;
    given[5] = NAN;
    for (int op = 0; op < 3; op++) {
        if (missing(names[op], have[op])) continue;
        dsv4_status st[2];
        dsv4_ctx *cs[2] = {ref, tc};
        for (int side = 0; side < 2; side++) {
            dsv4_ctx *c = cs[side];
            memset(sc[side], 0xA5, nsc), memset(ix[side], 0xA5, nix), memset(ln[side], 0xA5, 4 * T);
            dsv4_tensor tq = on(c, &hq), tqs = on(c, &hqs), tw = on(c, &hw), tk = on(c, &hk), tks = on(c, &hks);
            dsv4_tensor tp = dev_pos && side ? on(c, &hp64) : hp;
            dsv4_indexer_args args = {&tq, &tqs, &tw, &tk, &tks, &tp, 4};
            dsv4_tensor hs = view(op == 2 ? given : sc[side], DSV4_F32, 2, T, N, 0), ts = on(c, &hs),
                        hi = view(ix[side], DSV4_I32, 2, T, TOPK, 0), ti = on(c, &hi),
                        hl = view(ln[side], DSV4_I32, 1, T, 0, 0), tl = on(c, &hl),
                        hnv = view((void *)nvalid, DSV4_I32, 1, T, 0, 0);
            size_t wsb = op ? dsv4_indexer_workspace_size(c, T, TOPK) : 0;
            void *ws = scratch(c, wsb);
            if (op == 0) st[side] = dsv4_indexer_scores(c, &args, &ts);
            else if (op == 1) st[side] = dsv4_indexer_select(c, &args, TOPK, &ti, &tl, ws, wsb);
            else st[side] = dsv4_indexer_topk(c, &ts, &hnv, TOPK, &ti, &tl, ws, wsb); /* n_valid: host memory */
            if (op == 0) back(c, &ts, sc[side]);
            else back(c, &ti, ix[side]), back(c, &tl, ln[side]);
            release();
        }
        ran(names[op] + 8, st[1], st[0]);
        if (op == 0) same(names[op] + 8, "scores", sc[1], sc[0], nsc);
        else {
            same(names[op] + 8, "indices", ix[1], ix[0], nix);
            same(names[op] + 8, "lengths", ln[1], ln[0], 4 * T);
        }
    }
    for (int s = 0; s < 2; s++) free(sc[s]), free(ix[s]), free(ln[s]);
    free(q), free(qs), free(k), free(ks), free(w), free(given), free(ent);
}

static void ix_scores_topk(void)
{
    {
        const int32_t pos[4] = {4 * 700 - 1, 4 * 700 - 3, 9, 2}, nvalid[4] = {700, 300, 2, 0}; /* n_t <= N */
        ix_scores_topk_case(4, 64, 128, 700, 64, pos, nvalid, 37, 0, 0);
        ix_scores_topk_case(4, 64, 128, 700, 64, pos, nvalid, 37, 0, 1);
    }
    if (tb->device == DSV4_DEVICE_CPU) return; /* the device kernels' shapes; CI time on the cpu backends */
    {   /* head dims 64 and 256, heads not a multiple of 16 or the maximum, a top-k wider than a pass */
        const int32_t pos[3] = {4 * 1000 - 1, 1999, 6}, nvalid[3] = {1000, 999, 1};
        ix_scores_topk_case(3, 20, 64, 1000, 1024, pos, nvalid, 3, 0, 0);
        ix_scores_topk_case(3, 128, 256, 1000, 100, pos, nvalid, 2, 1, 1); /* 136-byte cache entries */
    }
    {   /* 256k candidates, the widest top-k of the cuda kernel; pairs tied, then mass ties */
        const int32_t pos[2] = {4 * 262144 - 1, 4 * 100000}, nvalid[2] = {262144, 200001};
        ix_scores_topk_case(2, 16, 64, 262144, 4096, pos, nvalid, 2, 0, 0);
        ix_scores_topk_case(2, 16, 64, 262144, 2048, pos, nvalid, 0, 1, 0);
    }
}

/* ---- driver ---------------------------------------------------------------------------------- */
static void attn_all(void)
{
    attn_host a;
    attn_make(&a);
    attn_rope_table();
    attn_insert(&a);
    attn_gather_inv_rope(&a);
    attn_decode(&a);
    attn_workspace_monotone();
    free(a.pages), free(a.rope);
}

/* The cases in order; DSV4_TEST_OPS=word runs only those whose name contains it (a sanitizer run
 * of one family). */
static const struct {
    const char *name;
    void (*run)(void);
} families[] = {
    {"formats_codecs", formats_codecs}, {"formats_rules", formats_rules},   {"formats_weights", formats_weights},
    {"linear_formats", linear_formats}, {"linear_grouped", linear_grouped}, {"linear_rows_independent", linear_rows_independent}, {"linear_gemv", linear_gemv},
    {"layer_rms", layer_rms},
    {"layer_mhc", layer_mhc},           {"layer_route", layer_route},       {"layer_swiglu", layer_swiglu},
    {"layer_moe", layer_moe},           {"layer_moe_quantized", layer_moe_quantized}, {"layer_moe_stream", layer_moe_stream}, {"tensor_ops", tensor_ops},         {"tensor_paged_slots", tensor_paged_slots},
    {"tensor_sample", tensor_sample},
    {"attention", attn_all},            {"ix_compressor", ix_compressor},   {"ix_query_and_weights", ix_query_and_weights},
    {"ix_scores_topk", ix_scores_topk},
};

static void run_families(void)
{
    const int f0 = test_failures, c0 = n_compared, s0 = n_skipped;
    const char *only = getenv("DSV4_TEST_OPS");
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!only || strstr(families[i].name, only)) families[i].run();
    printf("%-10s %d comparisons with cpu-ref, %d failed checks, %d ops skipped\n", target, n_compared - c0,
           test_failures - f0, n_skipped - s0);
}

int main(void)
{
    test_seed();
    ref = test_ctx("cpu-ref", 2, NULL);
    int tested = 0;
    for (int bi = 0; bi < dsv4_backend_count(); bi++) {
        const char *name = dsv4_backend_name(bi);
        if (!strcmp(name, "cpu-ref")) continue;
        if (dsv4_backend_available(name) != DSV4_OK) {
            printf("%-10s SKIP: %s\n", name, dsv4_last_error());
            continue;
        }
        tb = dsv4_backend_find(name);
        const int cpu = !strcmp(name, "cpu");
        for (int li = 0; li < (cpu ? 3 : 1); li++) {
            const char *isa = cpu ? test_isas[li] : NULL;
            tc = test_ctx(name, 2, isa);
            if (cpu) {
                /* a cap only: a level this machine lacks would run a lower one under its name */
                const char *got = dsv4_ctx_cpu_isa(tc);
                if (strncmp(got, isa, strlen(isa)) != 0) {
                    printf("%s[%s] SKIP: this machine runs the %s kernels at that cap\n", name, isa, got);
                    dsv4_ctx_destroy(tc);
                    continue;
                }
                snprintf(target, sizeof target, "%s[%s]", name, got);
            } else {
                snprintf(target, sizeof target, "%s", name);
            }
            run_families();
            dsv4_ctx_destroy(tc);
            tested++;
        }
    }
    dsv4_ctx_destroy(ref);
    printf("%d backend configuration(s) compared with cpu-ref\n", tested);
    TEST_DONE();
}
