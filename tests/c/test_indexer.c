/* Indexer family (include/dsv4/indexer.h): cpu == cpu-ref bit for bit on every ISA path, results
 * independent of the thread count, batched compressor == token-by-token, top-k == a full sort,
 * bad input -> status + message with outputs untouched. The float64 oracles are in
 * tests/python/test_compressor.py and test_indexer.py. */
#include "dsv4.h"
#include "test_util.h"

enum { D = 128, H = 64, R = 4 };

static dsv4_ctx *make_ctx(const char *backend, int threads)
{
    dsv4_ctx *c = NULL;
    dsv4_ctx_options o = {.backend = backend, .threads = threads};
    if (dsv4_ctx_create(&o, &c) != DSV4_OK) {
        fprintf(stderr, "ctx %s: %s\n", backend, dsv4_last_error());
        exit(1);
    }
    return c;
}

static void fill_randn(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = test_randn() * scale;
}

static void rope_table(float *t, int rows)
{
    for (int p = 0; p < rows; p++)
        for (int i = 0; i < 32; i++) {
            float a = (float)p * powf(160000.0f, -(float)i / 32.0f);
            t[p * 64 + i] = cosf(a);
            t[p * 64 + 32 + i] = sinf(a);
        }
}

static dsv4_tensor view2(void *p, dsv4_dtype dt, int64_t a, int64_t b)
{
    dsv4_tensor t;
    int64_t s[2] = {a, b};
    dsv4_tensor_init(&t, p, dt, 2, s);
    return t;
}

static dsv4_tensor view1(void *p, dsv4_dtype dt, int64_t a)
{
    dsv4_tensor t;
    dsv4_tensor_init(&t, p, dt, 1, &a);
    return t;
}

/* ---- compressor: prefill vs token by token, backends, ISAs, threads ---------------------- */
typedef struct {
    int ratio, dim, kind, overlap, n;
    float *kv, *gate, *ape, *norm, *rope;
} cmp_case;

/* Runs the case in chunks of `chunk` tokens; writes all entries into out (m x width bytes). */
static void run_cmp(dsv4_ctx *ctx, const cmp_case *c, int chunk, uint8_t *out, float *skv, float *ss)
{
    const int coff = c->overlap ? 2 : 1, w = coff * c->dim, packed = c->kind == DSV4_COMPRESSOR_INDEXER;
    dsv4_compressor_desc desc = {.kind = c->kind, .ratio = c->ratio, .dim = c->dim, .eps = 1e-6f, .fp8_sim = !packed,
                                 .overlap = c->overlap};
    dsv4_tensor tskv = view2(skv, DSV4_F32, coff * c->ratio, w), tss = view2(ss, DSV4_F32, coff * c->ratio, w);
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tskv, &tss), DSV4_OK);
    dsv4_tensor ape = view2(c->ape, DSV4_F32, c->ratio, w), norm = view1(c->norm, DSV4_F32, c->dim);
    dsv4_tensor rope = view2(c->rope, DSV4_F32, c->n + c->ratio, 64);
    const size_t row = packed ? (size_t)c->dim / 2 + c->dim / 32 : (size_t)c->dim * 2;
    for (int a = 0; a < c->n; a += chunk) {
        int b = a + chunk < c->n ? a + chunk : c->n;
        dsv4_tensor kv = view2(c->kv + (size_t)a * w, DSV4_F32, b - a, w);
        dsv4_tensor gate = view2(c->gate + (size_t)a * w, DSV4_F32, b - a, w);
        int64_t m = dsv4_compressor_emit_count(c->ratio, a, b - a), first = a / c->ratio;
        uint8_t *o = out + (size_t)first * row;
        dsv4_tensor to, ts;
        int64_t st[2] = {(int64_t)row, 1};
        if (packed) { /* one 68-byte-style row per entry: codes then scales */
            dsv4_tensor_init_strided(&to, o, DSV4_FP4X2, 2, (int64_t[]){m, c->dim / 2}, st);
            dsv4_tensor_init_strided(&ts, o + c->dim / 2, DSV4_E8M0, 2, (int64_t[]){m, c->dim / 32}, st);
        } else {
            to = view2(o, DSV4_BF16, m, c->dim);
        }
        CHECK_STATUS(dsv4_compressor_forward(ctx, &desc, a, &kv, &gate, &ape, &norm, &rope, &tskv, &tss, &to,
                                             packed ? &ts : NULL), DSV4_OK);
    }
}

static void test_compressor(void)
{
    /* ratio, dim, kind, overlap: CSA and HCA of V4, then HCA of ratio 4 and CSA of ratio 8 */
    const int cfg[5][4] = {{4, 512, DSV4_COMPRESSOR_MAIN, 1}, {128, 512, DSV4_COMPRESSOR_MAIN, 0},
                           {4, 128, DSV4_COMPRESSOR_INDEXER, 1}, {4, 512, DSV4_COMPRESSOR_MAIN, 0},
                           {8, 128, DSV4_COMPRESSOR_INDEXER, 1}};
    for (int ci = 0; ci < 5; ci++) {
        cmp_case c = {cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], cfg[ci][0] == 128 ? 2 * 128 + 37 : 45, 0, 0, 0, 0, 0};
        const int coff = c.overlap ? 2 : 1, w = coff * c.dim, srows = coff * c.ratio;
        c.kv = malloc(sizeof(float) * c.n * w);
        c.gate = malloc(sizeof(float) * c.n * w);
        c.ape = malloc(sizeof(float) * c.ratio * w);
        c.norm = malloc(sizeof(float) * c.dim);
        c.rope = malloc(sizeof(float) * (c.n + c.ratio) * 64);
        fill_randn(c.kv, (size_t)c.n * w, 1.0f);
        fill_randn(c.gate, (size_t)c.n * w, 2.0f);
        fill_randn(c.ape, (size_t)c.ratio * w, 1.0f);
        for (int e = 0; e < c.dim; e++) c.norm[e] = 1.0f + 0.1f * test_randn();
        rope_table(c.rope, c.n + c.ratio);
        const size_t m = (size_t)(c.n / c.ratio), row = c.kind ? (size_t)c.dim / 2 + c.dim / 32 : (size_t)c.dim * 2;
        uint8_t *ref_out = malloc(m * row), *out = malloc(m * row);
        float *ref_kv = malloc(sizeof(float) * srows * w), *ref_ss = malloc(sizeof(float) * srows * w);
        float *skv = malloc(sizeof(float) * srows * w), *ss = malloc(sizeof(float) * srows * w);
        dsv4_ctx *ref = make_ctx("cpu-ref", 1);
        memset(ref_out, 0xA5, m * row);
        run_cmp(ref, &c, c.n, ref_out, ref_kv, ref_ss);
        const char *const *isas = test_isas;
        const int chunks[4] = {1, 3, c.ratio + 1, c.n};
        for (int ii = 0; ii < 3; ii++) {
            for (int th = 1; th <= 2; th++) {
                dsv4_ctx *fast = test_ctx("cpu", th, isas[ii]);
                for (int k = 0; k < 4; k++) {
                    memset(out, 0x5A, m * row);
                    run_cmp(fast, &c, chunks[k], out, skv, ss);
                    CHECK(!memcmp(out, ref_out, m * row), "r%d d%d %s threads %d chunk %d: entries differ from cpu-ref",
                          c.ratio, c.dim, isas[ii], th, chunks[k]);
                    CHECK(!memcmp(skv, ref_kv, sizeof(float) * srows * w) && !memcmp(ss, ref_ss, sizeof(float) * srows * w),
                          "r%d d%d %s threads %d chunk %d: state differs", c.ratio, c.dim, isas[ii], th, chunks[k]);
                }
                dsv4_ctx_destroy(fast);
            }
        }
        dsv4_ctx_destroy(ref);
        free(c.kv), free(c.gate), free(c.ape), free(c.norm), free(c.rope);
        free(ref_out), free(out), free(ref_kv), free(ref_ss), free(skv), free(ss);
    }
}

/* ---- indexer: q path, scores, select --------------------------------------------------- */
typedef struct {
    int64_t t, n;
    uint8_t *qc, *qs, *kc, *ks;
    float *w;
    int32_t *pos;
    dsv4_tensor tqc, tqs, tw, tkc, tks, tpos;
    dsv4_indexer_args args;
} ix_case;

static void ix_setup(ix_case *c, int64_t t, int64_t n)
{
    c->t = t;
    c->n = n;
    const int64_t rope_rows = 4 * n + 4;
    float *rope = malloc(sizeof(float) * rope_rows * 64), *x = malloc(sizeof(float) * (size_t)(t > n ? t : n) * H * D);
    uint16_t *qb = malloc(2 * (size_t)(t > n ? t : n) * H * D);
    rope_table(rope, (int)rope_rows);
    c->qc = malloc((size_t)t * H * D / 2);
    c->qs = malloc((size_t)t * H * D / 32);
    c->kc = malloc((size_t)n * D / 2);
    c->ks = malloc((size_t)n * D / 32);
    c->w = malloc(sizeof(float) * t * H);
    c->pos = malloc(sizeof(int32_t) * (size_t)(t > n ? t : n));
    dsv4_tensor tr = view2(rope, DSV4_F32, rope_rows, 64);
    /* queries through the q path, keys through it too (one head, position 0) */
    fill_randn(x, (size_t)t * H * D, 2.0f);
    dsv4_encode_array(NULL, DSV4_FMT_BF16, x, t * H * D, qb);
    for (int64_t i = 0; i < t; i++) c->pos[i] = (int32_t)(4 * n - 1 - (int64_t)(test_rand_u64() % (uint64_t)(4 * n)));
    c->pos[0] = (int32_t)(4 * n - 1);
    dsv4_tensor tq, tp = view1(c->pos, DSV4_I32, t), tqc, tqs;
    dsv4_tensor_init(&tq, qb, DSV4_BF16, 3, (int64_t[]){t, H, D});
    dsv4_tensor_init(&tqc, c->qc, DSV4_FP4X2, 3, (int64_t[]){t, H, D / 2});
    dsv4_tensor_init(&tqs, c->qs, DSV4_E8M0, 3, (int64_t[]){t, H, D / 32});
    CHECK_STATUS(dsv4_indexer_q(NULL, &tq, &tp, &tr, &tqc, &tqs), DSV4_OK);
    fill_randn(x, (size_t)n * D, 1.0f);
    dsv4_encode_array(NULL, DSV4_FMT_BF16, x, n * D, qb);
    int32_t *zero = calloc((size_t)n, sizeof(int32_t));
    dsv4_tensor tk, tz = view1(zero, DSV4_I32, n), tkc, tks;
    dsv4_tensor_init(&tk, qb, DSV4_BF16, 3, (int64_t[]){n, 1, D});
    dsv4_tensor_init(&tkc, c->kc, DSV4_FP4X2, 3, (int64_t[]){n, 1, D / 2});
    dsv4_tensor_init(&tks, c->ks, DSV4_E8M0, 3, (int64_t[]){n, 1, D / 32});
    CHECK_STATUS(dsv4_indexer_q(NULL, &tk, &tz, &tr, &tkc, &tks), DSV4_OK);
    float *proj = malloc(sizeof(float) * t * H);
    fill_randn(proj, (size_t)t * H, 1.0f);
    dsv4_tensor tpj = view2(proj, DSV4_F32, t, H), tw = view2(c->w, DSV4_F32, t, H);
    CHECK_STATUS(dsv4_indexer_weights(NULL, &tpj, D, &tw), DSV4_OK);
    dsv4_tensor_init(&c->tqc, c->qc, DSV4_FP4X2, 3, (int64_t[]){t, H, D / 2});
    dsv4_tensor_init(&c->tqs, c->qs, DSV4_E8M0, 3, (int64_t[]){t, H, D / 32});
    c->tw = view2(c->w, DSV4_F32, t, H);
    c->tkc = view2(c->kc, DSV4_FP4X2, n, D / 2);
    c->tks = view2(c->ks, DSV4_E8M0, n, D / 32);
    c->tpos = view1(c->pos, DSV4_I32, t);
    c->args = (dsv4_indexer_args){&c->tqc, &c->tqs, &c->tw, &c->tkc, &c->tks, &c->tpos, R};
    free(rope), free(x), free(qb), free(zero), free(proj);
}

static void ix_free(ix_case *c) { free(c->qc), free(c->qs), free(c->kc), free(c->ks), free(c->w), free(c->pos); }

static int cmp_desc(const void *a, const void *b)
{
    const float *x = a, *y = b; /* pairs (score, index) */
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : 1;
}

static void test_indexer(void)
{
    const int64_t shapes[3][2] = {{1, 6000}, {5, 900}, {3, 3}};
    const int64_t ks[2] = {64, 512};
    for (int si = 0; si < 3; si++) {
        ix_case c;
        ix_setup(&c, shapes[si][0], shapes[si][1]);
        const int64_t T = c.t, N = c.n;
        float *ref = malloc(sizeof(float) * T * N), *got = malloc(sizeof(float) * T * N);
        dsv4_ctx *cref = make_ctx("cpu-ref", 1);
        dsv4_tensor tref = view2(ref, DSV4_F32, T, N), tgot = view2(got, DSV4_F32, T, N);
        CHECK_STATUS(dsv4_indexer_scores(cref, &c.args, &tref), DSV4_OK);
        const char *const *isas = test_isas;
        for (int ii = 0; ii < 3; ii++) {
            for (int th = 1; th <= 2; th++) {
                dsv4_ctx *fast = test_ctx("cpu", th, isas[ii]);
                memset(got, 0xFF, sizeof(float) * T * N);
                CHECK_STATUS(dsv4_indexer_scores(fast, &c.args, &tgot), DSV4_OK);
                CHECK(!memcmp(got, ref, sizeof(float) * T * N), "scores T%lld N%lld %s threads %d differ from cpu-ref",
                      (long long)T, (long long)N, isas[ii], th);
                for (int ki = 0; ki < 2; ki++) {
                    const int64_t k = ks[ki];
                    int32_t *idx = malloc(sizeof(int32_t) * T * k), len[8];
                    size_t wsb = dsv4_indexer_workspace_size(fast, T, k);
                    void *ws = malloc(wsb);
                    dsv4_tensor ti = view2(idx, DSV4_I32, T, k), tl = view1(len, DSV4_I32, T);
                    CHECK_STATUS(dsv4_indexer_select(fast, &c.args, k, &ti, &tl, ws, wsb), DSV4_OK);
                    for (int64_t t = 0; t < T; t++) { /* a full sort of the reference scores */
                        int64_t nt = (c.pos[t] + 1) / R, m = nt < k ? nt : k;
                        float *pairs = malloc(sizeof(float) * 2 * (size_t)(nt ? nt : 1));
                        for (int64_t i = 0; i < nt; i++) pairs[2 * i] = ref[t * N + i], pairs[2 * i + 1] = (float)i;
                        qsort(pairs, (size_t)nt, 2 * sizeof(float), cmp_desc);
                        int ok = len[t] == m;
                        for (int64_t i = 0; ok && i < k; i++) ok = idx[t * k + i] == (i < m ? (int32_t)pairs[2 * i + 1] : -1);
                        CHECK(ok, "select T%lld N%lld k%lld token %lld %s threads %d != full sort", (long long)T,
                              (long long)N, (long long)k, (long long)t, isas[ii], th);
                        free(pairs);
                    }
                    free(idx), free(ws);
                }
                dsv4_ctx_destroy(fast);
            }
        }
        dsv4_ctx_destroy(cref);
        free(ref), free(got);
        ix_free(&c);
    }
}

/* ---- bad input -------------------------------------------------------------------------- */
static void test_bad_input(void)
{
    ix_case c;
    ix_setup(&c, 2, 40);
    int32_t idx[2 * 8], len[2];
    memset(idx, 0x5A, sizeof idx);
    memset(len, 0x5A, sizeof len);
    dsv4_tensor ti = view2(idx, DSV4_I32, 2, 8), tl = view1(len, DSV4_I32, 2);
    size_t wsb = dsv4_indexer_workspace_size(NULL, 2, 8);
    void *ws = malloc(wsb);
    CHECK(wsb > 0 && dsv4_indexer_workspace_size(NULL, 2, 0) == 0, "workspace size");
    CHECK_STATUS(dsv4_indexer_select(NULL, &c.args, 8, &ti, &tl, ws, wsb - 1), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_indexer_select(NULL, &c.args, 8, &ti, &tl, NULL, 0), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_indexer_select(NULL, NULL, 8, &ti, &tl, ws, wsb), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_indexer_select(NULL, &c.args, 9, &ti, &tl, ws, wsb), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_indexer_select(NULL, &c.args, 8, &ti, &tl, idx, sizeof idx), DSV4_ERR_INVALID_ARG);
    dsv4_indexer_args bad = c.args;
    bad.ratio = 0;
    CHECK_STATUS(dsv4_indexer_select(NULL, &bad, 8, &ti, &tl, ws, wsb), DSV4_ERR_INVALID_ARG);
    bad = c.args;
    dsv4_tensor wrong = c.tw;
    wrong.dtype = DSV4_BF16;
    bad.weights = &wrong;
    CHECK_STATUS(dsv4_indexer_select(NULL, &bad, 8, &ti, &tl, ws, wsb), DSV4_ERR_DTYPE);
    c.pos[1] = 4 * 40 + 3; /* 41 candidates, 40 entries */
    CHECK_STATUS(dsv4_indexer_select(NULL, &c.args, 8, &ti, &tl, ws, wsb), DSV4_ERR_RANGE);
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= idx[i] == 0x5A5A5A5A;
    CHECK(ok && len[0] == 0x5A5A5A5A && len[1] == 0x5A5A5A5A, "failed select wrote its outputs");
    c.pos[1] = 7;
    float sc[2 * 40];
    dsv4_tensor ts = view2(sc, DSV4_F32, 2, 39);
    CHECK_STATUS(dsv4_indexer_scores(NULL, &c.args, &ts), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_indexer_topk(NULL, &ts, NULL, 0, &ti, &tl, ws, wsb), DSV4_ERR_INVALID_ARG);

    dsv4_compressor_desc desc = {.kind = DSV4_COMPRESSOR_MAIN, .ratio = 4, .dim = 100, .eps = 1e-6f, .overlap = 1};
    float st[8 * 256];
    dsv4_tensor tst = view2(st, DSV4_F32, 8, 200), tst2 = tst;
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tst, &tst2), DSV4_ERR_INVALID_ARG); /* dim 100 */
    desc.dim = 128;
    desc.ratio = 600;
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tst, &tst2), DSV4_ERR_INVALID_ARG);
    desc.ratio = 4;
    tst = view2(st, DSV4_F32, 8, 256);
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tst, &tst), DSV4_ERR_INVALID_ARG); /* overlapping */
    desc.overlap = 2;
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tst, &tst2), DSV4_ERR_INVALID_ARG); /* overlap 0 or 1 */
    desc.overlap = 0;
    CHECK_STATUS(dsv4_compressor_state_init(&desc, &tst, &tst2), DSV4_ERR_SHAPE); /* no overlap: [4, 128] */
    CHECK_STATUS(dsv4_compressor_forward(NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, &tst, &tst, NULL, NULL),
                 DSV4_ERR_INVALID_ARG);
    CHECK(dsv4_compressor_emit_count(0, 0, 1) == -1 && dsv4_compressor_emit_count(4, 3, 1) == 1, "emit count");
    free(ws);
    ix_free(&c);
}

/* dsv4_compressor_state_reset on both cpu backends: state_init's bytes (0 / -inf) in the rows of
 * a padded view, the padding untouched; memory of another backend refused, nothing written. */
static void test_state_reset(void)
{
    const dsv4_compressor_desc desc = {.kind = DSV4_COMPRESSOR_MAIN, .ratio = 4, .dim = 64, .eps = 1e-6f, .overlap = 1};
    enum { ROWS = 8, W = 128, LD = W + 5 };
    static float kv[2][ROWS * LD], sc[2][ROWS * LD];
    const char *backends[2] = {"cpu", "cpu-ref"};
    for (int bi = 0; bi < 2; bi++) {
        dsv4_ctx *c = make_ctx(backends[bi], 2);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < ROWS * LD; i++) kv[k][i] = sc[k][i] = 7.5f;
        dsv4_tensor t[2][2];
        for (int k = 0; k < 2; k++) {
            t[k][0] = view2(kv[k], DSV4_F32, ROWS, W), t[k][1] = view2(sc[k], DSV4_F32, ROWS, W);
            t[k][0].stride[0] = t[k][1].stride[0] = LD;
        }
        CHECK_STATUS(dsv4_compressor_state_init(&desc, &t[0][0], &t[0][1]), DSV4_OK);
        CHECK_STATUS(dsv4_compressor_state_reset(c, &desc, &t[1][0], &t[1][1]), DSV4_OK);
        int pad = 1;
        for (int i = 0; i < ROWS * LD; i++) pad &= i % LD < W || (kv[1][i] == 7.5f && sc[1][i] == 7.5f);
        CHECK(pad && kv[1][0] == 0.0f && sc[1][0] == -INFINITY, "%s state_reset: padding written or wrong values",
              backends[bi]);
        CHECK(!memcmp(kv[0], kv[1], sizeof kv[0]) && !memcmp(sc[0], sc[1], sizeof sc[0]),
              "%s state_reset differs from state_init", backends[bi]);
        for (int i = 0; i < ROWS * LD; i++) kv[1][i] = sc[1][i] = 7.5f;
        t[1][0].device = DSV4_DEVICE_CUDA;
        CHECK_STATUS(dsv4_compressor_state_reset(c, &desc, &t[1][0], &t[1][1]), DSV4_ERR_UNSUPPORTED);
        CHECK_STATUS(dsv4_compressor_state_init(&desc, &t[1][0], &t[1][1]), DSV4_ERR_UNSUPPORTED); /* host form */
        CHECK(kv[1][0] == 7.5f && sc[1][0] == 7.5f, "%s: a refused state_reset wrote the state", backends[bi]);
        t[1][0].device = DSV4_DEVICE_CPU;
        CHECK_STATUS(dsv4_compressor_state_reset(c, &desc, &t[1][0], &t[1][0]), DSV4_ERR_INVALID_ARG); /* overlapping */
        dsv4_ctx_destroy(c);
    }
}

int main(void)
{
    test_seed();
    test_compressor();
    test_state_reset();
    test_indexer();
    test_bad_input();
    TEST_DONE();
}
