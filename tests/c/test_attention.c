/* Attention family through the C API: page allocation and block tables, cache views, errors
 * that leave outputs untouched, and every cpu path (avx512, avx2, scalar) against the scalar
 * reference (cpu-ref), with 1 and 2 threads bit-identical. The float64 oracles are in
 * tests/python/test_attention.py. */
#include "dsv4.h"
#include "test_util.h"

#define BS 64
#define PAGES 6

static dsv4_ctx *make_ctx(const char *backend, int threads)
{
    dsv4_ctx_options o = {.backend = backend, .threads = threads};
    dsv4_ctx *c = NULL;
    if (dsv4_ctx_create(&o, &c) != DSV4_OK) {
        fprintf(stderr, "ctx %s: %s\n", backend, dsv4_last_error());
        exit(1);
    }
    return c;
}

static uint16_t bf16(float x) { return dsv4_bf16_encode(x); }

static void test_pages(void)
{
    dsv4_kv_pages *pool = NULL;
    CHECK_STATUS(dsv4_kv_pages_create(0, 2, &pool), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_kv_pages_create(4, 2, &pool), DSV4_OK);
    dsv4_kv_seq *a = NULL, *b = NULL;
    CHECK_STATUS(dsv4_kv_seq_create(pool, 9, &a), DSV4_ERR_INVALID_ARG); /* more than the pool's 8 slots */
    CHECK_STATUS(dsv4_kv_seq_create(pool, 6, &a), DSV4_OK);
    CHECK_STATUS(dsv4_kv_seq_create(pool, 8, &b), DSV4_OK);
    CHECK_STATUS(dsv4_kv_seq_reserve(a, 3), DSV4_OK);
    CHECK(dsv4_kv_seq_capacity(a) == 4 && dsv4_kv_pages_free_count(pool) == 2, "reserve 3 entries = 2 pages");
    CHECK_STATUS(dsv4_kv_seq_reserve(a, 7), DSV4_ERR_RANGE); /* beyond the sequence's 6 */
    CHECK_STATUS(dsv4_kv_seq_reserve(b, 5), DSV4_ERR_CAPACITY);
    CHECK(dsv4_kv_seq_capacity(b) == 0 && dsv4_kv_pages_free_count(pool) == 2, "a failed reserve changes nothing");
    CHECK_STATUS(dsv4_kv_seq_reserve(b, 4), DSV4_OK);
    int64_t nb = 0;
    const int32_t *ta = dsv4_kv_seq_block_table(a, &nb), *tb = dsv4_kv_seq_block_table(b, NULL);
    CHECK(nb == 2 && ta[0] == 0 && ta[1] == 1 && tb[0] == 2 && tb[1] == 3, "pages handed out in order");
    int64_t entries[5] = {0, 1, 2, -1, 3}, slots[5] = {9, 9, 9, 9, 9};
    CHECK_STATUS(dsv4_kv_seq_slots(b, entries, 5, slots), DSV4_OK);
    CHECK(slots[0] == 4 && slots[1] == 5 && slots[2] == 6 && slots[3] == -1 && slots[4] == 7, "entry -> slot");
    int32_t e32[2] = {1, 4}, i32[2] = {7, 7};
    CHECK_STATUS(dsv4_kv_seq_indices(a, e32, 2, i32), DSV4_ERR_RANGE);
    CHECK(i32[0] == 7 && i32[1] == 7, "a failed mapping writes nothing");
    /* an SWA ring of 4 entries: position p lives at entry p mod 4 */
    for (int64_t p = 0; p < 11; p++) {
        int64_t e = p % 4, s;
        CHECK_STATUS(dsv4_kv_seq_slots(b, &e, 1, &s), DSV4_OK);
        CHECK(s == 4 + p % 4, "ring slot of position %lld", (long long)p);
    }
    dsv4_kv_seq_destroy(a);
    CHECK(dsv4_kv_pages_free_count(pool) == 2, "destroy gives the pages back");
    CHECK_STATUS(dsv4_kv_seq_create(pool, 4, &a), DSV4_OK);
    CHECK_STATUS(dsv4_kv_seq_reserve(a, 4), DSV4_OK);
    ta = dsv4_kv_seq_block_table(a, NULL);
    CHECK(ta[0] == 0 && ta[1] == 1, "freed pages are reused");
    CHECK_STATUS(dsv4_kv_seq_reserve(a, 1), DSV4_OK); /* shrinking keeps the pages */
    dsv4_kv_seq_destroy(a);
    dsv4_kv_seq_destroy(b);
    dsv4_kv_pages_destroy(pool);

    CHECK(dsv4_kv_page_bytes(64) == 37440 && dsv4_kv_page_bytes(2) == 1728 && dsv4_kv_page_bytes(0) == 0,
          "page bytes");
    uint8_t mem[2 * 1728];
    dsv4_kv_cache c;
    CHECK_STATUS(dsv4_kv_cache_view(&c, mem, 2, 2, DSV4_DEVICE_CPU, 0), DSV4_OK);
    CHECK(dsv4_kv_cache_slots(&c) == 4 && c.pages.shape[1] == 1728, "cache view");
    CHECK_STATUS(dsv4_kv_cache_view(&c, mem, 2, 0, DSV4_DEVICE_CPU, 0), DSV4_ERR_INVALID_ARG);
}

/* Shared inputs of the op tests. */
typedef struct {
    uint8_t *cache;
    dsv4_kv_cache kc;
    float rope[4096 * 64];
    dsv4_tensor trope;
} fixture;

static void fill_cache(fixture *f, dsv4_ctx *ref)
{
    int64_t n = PAGES * BS;
    uint16_t *kv = malloc((size_t)n * 512 * 2);
    int64_t *slots = malloc((size_t)n * 8), *pos = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        float mag = ldexpf(1.0f, (int)(test_rand_u64() % 10) - 6);
        for (int d = 0; d < 512; d++) kv[i * 512 + d] = bf16(test_randn() * mag);
        slots[i] = i;
        pos[i] = (int64_t)(test_rand_u64() % 4096);
    }
    int64_t ks[2] = {n, 512}, ss[1] = {n};
    dsv4_tensor tkv, ts, tp;
    dsv4_tensor_init(&tkv, kv, DSV4_BF16, 2, ks);
    dsv4_tensor_init(&ts, slots, DSV4_I64, 1, ss);
    dsv4_tensor_init(&tp, pos, DSV4_I64, 1, ss);
    CHECK_STATUS(dsv4_kv_insert(ref, &tkv, &f->kc, &ts, &tp, &f->trope), DSV4_OK);
    free(kv);
    free(slots);
    free(pos);
}

typedef struct {
    int64_t t, h, w, k;
    uint16_t *q, *out;
    float *lse, *sink;
    int32_t *idx, *len, *xidx, *xlen;
    dsv4_tensor tq, tout, tlse, tsink, tidx, tlen, txidx, txlen;
    dsv4_sparse_scope swa, extra;
} decode_case;

static void make_decode(decode_case *c, fixture *f, int64_t t, int64_t h, int64_t w, int64_t k)
{
    c->t = t, c->h = h, c->w = w, c->k = k;
    c->q = malloc((size_t)(t * h * 512) * 2);
    c->out = malloc((size_t)(t * h * 512) * 2);
    c->lse = malloc((size_t)(t * h) * 4);
    c->sink = malloc((size_t)h * 4);
    c->idx = malloc((size_t)(t * w) * 4);
    c->xidx = malloc((size_t)(t * (k ? k : 1)) * 4);
    c->len = malloc((size_t)t * 4);
    c->xlen = malloc((size_t)t * 4);
    int64_t nslots = PAGES * BS;
    for (int64_t i = 0; i < t * h * 512; i++) c->q[i] = bf16(test_randn() * 0.5f);
    for (int64_t i = 0; i < h; i++) c->sink[i] = i % 5 == 4 ? -INFINITY : test_randn();
    for (int64_t i = 0; i < t * w; i++) c->idx[i] = (int32_t)(test_rand_u64() % (nslots + 8)) - 4; /* some masked */
    for (int64_t i = 0; i < t * k; i++) c->xidx[i] = (int32_t)(test_rand_u64() % nslots);
    for (int64_t i = 0; i < t; i++) {
        c->len[i] = (int32_t)(test_rand_u64() % (w + 1));
        c->xlen[i] = k ? (int32_t)(test_rand_u64() % (k + 1)) : 0;
    }
    int64_t qs[3] = {t, h, 512}, ls[2] = {t, h}, hs[1] = {h}, is[2] = {t, w}, xs[2] = {t, k}, ts[1] = {t};
    dsv4_tensor_init(&c->tq, c->q, DSV4_BF16, 3, qs);
    dsv4_tensor_init(&c->tout, c->out, DSV4_BF16, 3, qs);
    dsv4_tensor_init(&c->tlse, c->lse, DSV4_F32, 2, ls);
    dsv4_tensor_init(&c->tsink, c->sink, DSV4_F32, 1, hs);
    dsv4_tensor_init(&c->tidx, c->idx, DSV4_I32, 2, is);
    dsv4_tensor_init(&c->txidx, c->xidx, DSV4_I32, 2, xs);
    dsv4_tensor_init(&c->tlen, c->len, DSV4_I32, 1, ts);
    dsv4_tensor_init(&c->txlen, c->xlen, DSV4_I32, 1, ts);
    c->swa = (dsv4_sparse_scope){&f->kc, &c->tidx, &c->tlen};
    c->extra = (dsv4_sparse_scope){&f->kc, &c->txidx, &c->txlen};
}

static void free_decode(decode_case *c)
{
    free(c->q), free(c->out), free(c->lse), free(c->sink), free(c->idx), free(c->xidx), free(c->len), free(c->xlen);
}

/* Run the decode on ctx with poisoned outputs; copies results out. */
static dsv4_status run_decode(dsv4_ctx *ctx, decode_case *c, uint16_t *out, float *lse)
{
    size_t bytes = 0;
    dsv4_status s = dsv4_sparse_mla_decode_workspace(ctx, c->t, c->h, c->w, c->k, &bytes);
    if (s) return s;
    uint8_t *ws = malloc(bytes ? bytes : 1);
    int64_t wsz[1] = {(int64_t)bytes};
    dsv4_tensor tws;
    dsv4_tensor_init(&tws, ws, DSV4_U8, 1, wsz);
    memset(c->out, 0xA5, (size_t)(c->t * c->h * 512) * 2);
    memset(c->lse, 0xA5, (size_t)(c->t * c->h) * 4);
    s = dsv4_sparse_mla_decode(ctx, &c->tq, &c->swa, c->k ? &c->extra : NULL, &c->tsink, 0.044194173824159216f,
                               &c->tout, &c->tlse, &tws);
    memcpy(out, c->out, (size_t)(c->t * c->h * 512) * 2);
    memcpy(lse, c->lse, (size_t)(c->t * c->h) * 4);
    free(ws);
    return s;
}

static void compare_decode(const char *what, decode_case *c, const uint16_t *o, const float *lse,
                           const uint16_t *ro, const float *rlse)
{
    double num = 0, den = 0, lerr = 0;
    int inf_bad = 0;
    for (int64_t i = 0; i < c->t * c->h * 512; i++) {
        double a = dsv4_bf16_decode(o[i]), b = dsv4_bf16_decode(ro[i]);
        num += (a - b) * (a - b);
        den += b * b;
    }
    for (int64_t i = 0; i < c->t * c->h; i++) {
        if (isinf(rlse[i]) || isinf(lse[i])) {
            inf_bad += !(isinf(rlse[i]) && isinf(lse[i]) && lse[i] > 0);
            continue;
        }
        double e = fabs(lse[i] - rlse[i]) / fmax(1.0, fabs(rlse[i]));
        if (e > lerr) lerr = e;
    }
    /* the tolerances of docs/testing.md §4: relative L2 8e-3, lse 1e-5 * max(1, |lse|) */
    CHECK(sqrt(num / fmax(den, 1e-300)) <= 8e-3, "%s: relative L2 %g", what, sqrt(num / fmax(den, 1e-300)));
    CHECK(lerr <= 1e-5 && !inf_bad, "%s: lse error %g, %d +inf mismatches", what, lerr, inf_bad);
}

/* fast[i][k]: the cpu backend capped at test_isas[i], with k + 1 threads */
static void test_decode_paths(fixture *f, dsv4_ctx *ref, dsv4_ctx *fast[3][2])
{
    const int64_t shapes[][4] = {{1, 64, 128, 512}, {3, 22, 128, 0}, {2, 1, 40, 70}, {5, 8, 200, 96}};
    const char *const *isas = test_isas;
    for (int sI = 0; sI < 4; sI++) {
        decode_case c;
        make_decode(&c, f, shapes[sI][0], shapes[sI][1], shapes[sI][2], shapes[sI][3]);
        size_t no = (size_t)(c.t * c.h * 512), nl = (size_t)(c.t * c.h);
        uint16_t *ro = malloc(no * 2), *o1 = malloc(no * 2), *o2 = malloc(no * 2);
        float *rl = malloc(nl * 4), *l1 = malloc(nl * 4), *l2 = malloc(nl * 4);
        CHECK_STATUS(run_decode(ref, &c, ro, rl), DSV4_OK);
        for (int i = 0; i < 3; i++) {
            CHECK_STATUS(run_decode(fast[i][0], &c, o1, l1), DSV4_OK);
            CHECK_STATUS(run_decode(fast[i][1], &c, o2, l2), DSV4_OK);
            char what[96];
            snprintf(what, sizeof what, "decode T%lld H%lld %s", (long long)c.t, (long long)c.h, isas[i]);
            CHECK(!memcmp(o1, o2, no * 2) && !memcmp(l1, l2, nl * 4), "%s: 1 and 2 threads differ", what);
            compare_decode(what, &c, o1, l1, ro, rl);
        }
        free(ro), free(o1), free(o2), free(rl), free(l1), free(l2);
        free_decode(&c);
    }
}

static void test_insert_paths(fixture *f, dsv4_ctx *ref, dsv4_ctx *fast[3][2])
{
    const int64_t n = 40, h = 6;
    uint16_t *q = malloc(n * h * 512 * 2), *q0 = malloc(n * h * 512 * 2), *qr = malloc(n * h * 512 * 2);
    uint16_t *kv = malloc(n * 512 * 2);
    int64_t slots[40], pos[40];
    for (int64_t i = 0; i < n * h * 512; i++) q0[i] = bf16(test_randn() * 3.0f);
    for (int64_t i = 0; i < n * 512; i++) kv[i] = bf16(test_randn());
    for (int64_t i = 0; i < n; i++) {
        slots[i] = i % 7 == 3 ? -1 : (int64_t)(test_rand_u64() % (PAGES * BS)); /* duplicates likely */
        pos[i] = (int64_t)(test_rand_u64() % 4096);
    }
    size_t cb = (size_t)PAGES * dsv4_kv_page_bytes(BS);
    uint8_t *cref = malloc(cb), *cout = malloc(cb), *init = f->cache;
    int64_t qs[3] = {n, h, 512}, ks[2] = {n, 512}, ns[1] = {n};
    dsv4_tensor tq, tkv, ts, tp;
    dsv4_tensor_init(&tq, q, DSV4_BF16, 3, qs);
    dsv4_tensor_init(&tkv, kv, DSV4_BF16, 2, ks);
    dsv4_tensor_init(&ts, slots, DSV4_I64, 1, ns);
    dsv4_tensor_init(&tp, pos, DSV4_I64, 1, ns);
    uint8_t *saved = malloc(cb);
    memcpy(saved, init, cb);
    memcpy(q, q0, n * h * 512 * 2);
    CHECK_STATUS(dsv4_qnorm_rope_kv_insert(ref, &tq, &tkv, &f->kc, &ts, &tp, &f->trope, 1e-6f), DSV4_OK);
    memcpy(qr, q, n * h * 512 * 2);
    memcpy(cref, init, cb);
    const char *const *isas = test_isas;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            memcpy(init, saved, cb);
            memcpy(q, q0, n * h * 512 * 2);
            CHECK_STATUS(dsv4_qnorm_rope_kv_insert(fast[i][k], &tq, &tkv, &f->kc, &ts, &tp, &f->trope, 1e-6f), DSV4_OK);
            memcpy(cout, init, cb);
            /* the same fp32 operations in the same order: bit-identical to the reference */
            CHECK(!memcmp(q, qr, n * h * 512 * 2), "qnorm %s, %d threads: q differs from cpu-ref", isas[i], k + 1);
            CHECK(!memcmp(cout, cref, cb), "insert %s, %d threads: cache differs from cpu-ref", isas[i], k + 1);
        }
    memcpy(init, saved, cb);
    free(q), free(q0), free(qr), free(kv), free(cref), free(cout), free(saved);
}

static void test_errors(fixture *f, dsv4_ctx *ctx)
{
    decode_case c;
    make_decode(&c, f, 2, 4, 16, 0);
    uint16_t o[2 * 4 * 512];
    float l[8];
    memset(c.out, 0x5A, sizeof o);
    /* a workspace that is too small (when one is needed), a NULL scope, a device mismatch */
    size_t bytes = 0;
    CHECK_STATUS(dsv4_sparse_mla_decode_workspace(ctx, 1, 64, 128, 512, &bytes), DSV4_OK);
    CHECK(bytes > 0, "T=1 H=64 over 640 entries splits (workspace %zu)", bytes);
    CHECK_STATUS(dsv4_sparse_mla_decode_workspace(ctx, 1, 0, 128, 512, &bytes), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_sparse_mla_decode(ctx, &c.tq, NULL, NULL, NULL, 1.0f, &c.tout, NULL, NULL), DSV4_ERR_INVALID_ARG);
    dsv4_tensor dev = c.tout;
    dev.device = DSV4_DEVICE_CUDA;
    CHECK_STATUS(dsv4_sparse_mla_decode(ctx, &c.tq, &c.swa, NULL, NULL, 1.0f, &dev, NULL, NULL), DSV4_ERR_UNSUPPORTED);
    CHECK_STATUS(dsv4_sparse_mla_decode(ctx, &c.tq, &c.swa, NULL, NULL, NAN, &c.tout, NULL, NULL), DSV4_ERR_INVALID_ARG);
    dsv4_kv_cache bad = f->kc;
    bad.block_size = 65; /* pages too small for 65 entries */
    dsv4_sparse_scope sb = {&bad, &c.tidx, &c.tlen};
    CHECK_STATUS(dsv4_sparse_mla_decode(ctx, &c.tq, &sb, NULL, NULL, 1.0f, &c.tout, NULL, NULL), DSV4_ERR_SHAPE);
    memcpy(o, c.out, sizeof o);
    CHECK(o[0] == 0x5A5A && o[4095] == 0x5A5A, "outputs untouched on error");
    (void)l;
    dsv4_tensor tab;
    int64_t ts[2] = {10, 64};
    float t10[640];
    dsv4_tensor_init(&tab, t10, DSV4_F32, 2, ts);
    dsv4_rope_params p = dsv4_rope_v4_params(DSV4_ROPE_YARN);
    p.theta = 0.5;
    CHECK_STATUS(dsv4_rope_table(ctx, &p, &tab), DSV4_ERR_INVALID_ARG);
    free_decode(&c);
}

int main(void)
{
    test_seed();
    test_pages();
    dsv4_ctx *ref = make_ctx("cpu-ref", 2), *fast1 = make_ctx("cpu", 1), *fast2 = make_ctx("cpu", 2);
    static fixture f;
    size_t cb = (size_t)PAGES * dsv4_kv_page_bytes(BS);
    f.cache = malloc(cb);
    memset(f.cache, 0, cb);
    CHECK_STATUS(dsv4_kv_cache_view(&f.kc, f.cache, PAGES, BS, DSV4_DEVICE_CPU, 0), DSV4_OK);
    int64_t rs[2] = {4096, 64};
    dsv4_tensor_init(&f.trope, f.rope, DSV4_F32, 2, rs);
    dsv4_rope_params rp = dsv4_rope_v4_params(DSV4_ROPE_PLAIN);
    CHECK_STATUS(dsv4_rope_table(fast2, &rp, &f.trope), DSV4_OK);
    CHECK(f.rope[0] == 1.0f && f.rope[32] == 0.0f && fabsf(f.rope[64 + 1] - cosf(0.7498942f)) < 1e-6f, "rope rows");
    fill_cache(&f, ref);
    dsv4_ctx *fast[3][2];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) fast[i][k] = test_ctx("cpu", k + 1, test_isas[i]);
    test_insert_paths(&f, ref, fast);
    test_decode_paths(&f, ref, fast);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) dsv4_ctx_destroy(fast[i][k]);
    test_errors(&f, fast2);
    free(f.cache);
    dsv4_ctx_destroy(ref);
    dsv4_ctx_destroy(fast1);
    dsv4_ctx_destroy(fast2);
    TEST_DONE();
}
