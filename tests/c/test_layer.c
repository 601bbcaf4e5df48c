/* Layer family (RMSNorm, mHC, router): every cpu path (AVX-512, AVX2, scalar) against the cpu-ref
 * reference, 1 vs 2 threads bit for bit, a token's result independent of its batch, and bad input
 * (status, message, outputs untouched). The float64 oracles are in tests/python/test_layer.py. */
#include "dsv4.h"
#include "formats/codec.h"
#include "test_fp4_expert.h"
#include "test_util.h"

static dsv4_ctx *ref_ctx, *cpu1, *cpu2;

/* cpu contexts capped at each ISA (1 and 2 threads); use_isa(i) points cpu1/cpu2 at isas[i]'s */
static const char *const *const isas = test_isas;
static dsv4_ctx *isa_ctx[3][2];
static void use_isa(int i)
{
    cpu1 = isa_ctx[i][0];
    cpu2 = isa_ctx[i][1];
}

static void fill_bf16(uint16_t *p, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) p[i] = dsv4_bf16_from_f32(scale * test_randn());
}

static void fill_f32(float *p, size_t n, float scale, float offset)
{
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * test_randn();
}

static dsv4_tensor view(void *data, dsv4_dtype dt, int ndim, int64_t a, int64_t b, int64_t c)
{
    dsv4_tensor t;
    const int64_t shape[3] = {a, b, c};
    dsv4_tensor_init(&t, data, dt, ndim, shape);
    return t;
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */
static void test_rms_norm(void)
{
    enum { R = 5, D = 1037 };
    static uint16_t x[R * D], w[D], y_ref[R * D], y[R * D], y2[R * D];
    fill_bf16(x, R * D, 2.0f);
    fill_bf16(w, D, 0.5f);
    dsv4_tensor tx = view(x, DSV4_BF16, 2, R, D, 0), tw = view(w, DSV4_BF16, 1, D, 0, 0);
    dsv4_tensor tr = view(y_ref, DSV4_BF16, 2, R, D, 0), ty = view(y, DSV4_BF16, 2, R, D, 0),
                ty2 = view(y2, DSV4_BF16, 2, R, D, 0);
    CHECK_STATUS(dsv4_rms_norm(ref_ctx, &tx, &tw, 1e-6f, &tr), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        use_isa(i);
        memset(y, 0xA5, sizeof y);
        CHECK_STATUS(dsv4_rms_norm(cpu2, &tx, &tw, 1e-6f, &ty), DSV4_OK);
        CHECK(bf16_close(y, y_ref, R * D), "rms_norm %s differs from cpu-ref", isas[i]);
        CHECK_STATUS(dsv4_rms_norm(cpu1, &tx, &tw, 1e-6f, &ty2), DSV4_OK);
        CHECK(!memcmp(y, y2, sizeof y), "rms_norm %s: 1 vs 2 threads", isas[i]);
    }
    /* bad input: weight too short, y overlapping x, negative eps */
    memset(y, 0x5A, sizeof y);
    memcpy(y2, y, sizeof y);
    dsv4_tensor tws = view(w, DSV4_BF16, 1, D - 1, 0, 0);
    CHECK_STATUS(dsv4_rms_norm(cpu1, &tx, &tws, 1e-6f, &ty), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_rms_norm(cpu1, &tx, &tw, -1.0f, &ty), DSV4_ERR_RANGE);
    dsv4_tensor shifted = view(x + 1, DSV4_BF16, 2, R - 1, D, 0), xr = view(x, DSV4_BF16, 2, R - 1, D, 0);
    CHECK_STATUS(dsv4_rms_norm(cpu1, &xr, &tw, 1e-6f, &shifted), DSV4_ERR_INVALID_ARG);
    CHECK(!memcmp(y, y2, sizeof y), "rms_norm wrote its output on error");
}

/* ---- mHC --------------------------------------------------------------------------------- */
enum { HT = 6, HN = 4, HD = 300, HMIX = (2 + HN) * HN };

typedef struct {
    uint16_t y[HT * HD];
    float post[HT * HN], comb[HT * HN * HN];
} hc_out;

static dsv4_hc_site make_site(float *fn, float *scale, float *base, int nmix)
{
    fill_f32(fn, (size_t)nmix * HN * HD, 1.0f / sqrtf(HN * HD), 0.0f);
    for (int i = 0; i < (nmix == HN ? 1 : 3); i++) scale[i] = 0.5f + 0.3f * (float)i;
    fill_f32(base, (size_t)nmix, 0.5f, 0.0f);
    dsv4_hc_site s = {view(fn, DSV4_F32, 2, nmix, HN * HD, 0), view(scale, DSV4_F32, 1, nmix == HN ? 1 : 3, 0, 0),
                      view(base, DSV4_F32, 1, nmix, 0, 0), 20, 1e-6f, 1e-6f};
    return s;
}

static dsv4_status run_pre(dsv4_ctx *c, const dsv4_hc_site *s, uint16_t *x, int64_t T, hc_out *o)
{
    dsv4_tensor tx = view(x, DSV4_BF16, 3, T, HN, HD), ty = view(o->y, DSV4_BF16, 2, T, HD, 0),
                tp = view(o->post, DSV4_F32, 2, T, HN, 0), tc = view(o->comb, DSV4_F32, 3, T, HN, HN);
    return dsv4_hc_pre(c, s, &tx, &ty, &tp, &tc);
}

static void test_mhc(void)
{
    static uint16_t x[HT * HN * HD], sub[HT * HD], streams[HT * HN * HD], s_ref[HT * HN * HD], s2[HT * HN * HD];
    static float fn[HMIX * HN * HD], scale[3], base[HMIX], hfn[HN * HN * HD], hscale[1], hbase[HN];
    static hc_out ref, got, got2, one;
    fill_bf16(x, sizeof x / 2, 2.0f);
    fill_bf16(sub, sizeof sub / 2, 1.0f);
    dsv4_hc_site site = make_site(fn, scale, base, HMIX), head = make_site(hfn, hscale, hbase, HN);
    dsv4_tensor tsub = view(sub, DSV4_BF16, 2, HT, HD, 0), tx = view(x, DSV4_BF16, 3, HT, HN, HD);
    dsv4_tensor tpost = view(ref.post, DSV4_F32, 2, HT, HN, 0), tcomb = view(ref.comb, DSV4_F32, 3, HT, HN, HN);
    dsv4_tensor tsref = view(s_ref, DSV4_BF16, 3, HT, HN, HD), ts = view(streams, DSV4_BF16, 3, HT, HN, HD);
    CHECK_STATUS(run_pre(ref_ctx, &site, x, HT, &ref), DSV4_OK);
    CHECK_STATUS(dsv4_hc_post(ref_ctx, &tsub, &tx, &tpost, &tcomb, &tsref), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        use_isa(i);
        CHECK_STATUS(run_pre(cpu2, &site, x, HT, &got), DSV4_OK);
        CHECK(bf16_close(got.y, ref.y, HT * HD), "hc_pre y %s vs cpu-ref", isas[i]);
        CHECK(f32_close(got.post, ref.post, HT * HN, 2e-5f) && f32_close(got.comb, ref.comb, HT * HN * HN, 2e-5f),
              "hc_pre post/comb %s vs cpu-ref", isas[i]);
        CHECK_STATUS(run_pre(cpu1, &site, x, HT, &got2), DSV4_OK);
        CHECK(!memcmp(&got, &got2, sizeof got), "hc_pre %s: 1 vs 2 threads", isas[i]);
        CHECK_STATUS(run_pre(cpu2, &site, x + 3 * HN * HD, 1, &one), DSV4_OK);
        CHECK(!memcmp(one.y, got.y + 3 * HD, HD * 2) && !memcmp(one.comb, got.comb + 3 * HN * HN, HN * HN * 4),
              "hc_pre %s: token 3 alone differs from token 3 in the batch", isas[i]);
        /* hc_post is bit-identical to the reference on every path */
        CHECK_STATUS(dsv4_hc_post(cpu2, &tsub, &tx, &tpost, &tcomb, &ts), DSV4_OK);
        CHECK(!memcmp(streams, s_ref, sizeof s_ref), "hc_post %s differs from cpu-ref", isas[i]);
        /* fused == post then pre, in place (streams = residual, post/comb overwritten) */
        memcpy(s2, x, sizeof x);
        memcpy(got2.post, ref.post, sizeof ref.post);
        memcpy(got2.comb, ref.comb, sizeof ref.comb);
        dsv4_tensor ts2 = view(s2, DSV4_BF16, 3, HT, HN, HD), tp2 = view(got2.post, DSV4_F32, 2, HT, HN, 0),
                    tc2 = view(got2.comb, DSV4_F32, 3, HT, HN, HN), ty2 = view(got2.y, DSV4_BF16, 2, HT, HD, 0);
        CHECK_STATUS(dsv4_hc_post_pre(cpu2, &tsub, &ts2, &tp2, &tc2, &site, &ts2, &ty2, &tp2, &tc2), DSV4_OK);
        CHECK_STATUS(run_pre(cpu2, &site, streams, HT, &got), DSV4_OK);
        CHECK(!memcmp(s2, s_ref, sizeof s_ref) && !memcmp(&got, &got2, sizeof got), "hc_post_pre %s in place",
              isas[i]);
        /* hc_head */
        dsv4_tensor th = view(got.y, DSV4_BF16, 2, HT, HD, 0), th2 = view(got2.y, DSV4_BF16, 2, HT, HD, 0);
        CHECK_STATUS(dsv4_hc_head(ref_ctx, &head, &tx, &th2), DSV4_OK);
        CHECK_STATUS(dsv4_hc_head(cpu2, &head, &tx, &th), DSV4_OK);
        CHECK(bf16_close(got.y, got2.y, HT * HD), "hc_head %s vs cpu-ref", isas[i]);
    }
    /* bad input: fn with one mix too few, iterations 0, n > DSV4_HC_MAX, head site given to hc_pre */
    memset(&got, 0x5A, sizeof got);
    memcpy(&got2, &got, sizeof got);
    dsv4_hc_site bad = site;
    bad.fn.shape[0]--;
    CHECK_STATUS(run_pre(cpu1, &bad, x, HT, &got), DSV4_ERR_SHAPE);
    bad = site;
    bad.sinkhorn_iters = 0;
    CHECK_STATUS(run_pre(cpu1, &bad, x, HT, &got), DSV4_ERR_RANGE);
    CHECK_STATUS(run_pre(cpu1, &head, x, HT, &got), DSV4_ERR_SHAPE);
    dsv4_tensor t9 = view(x, DSV4_BF16, 3, 1, 9, HD), ty = view(got.y, DSV4_BF16, 2, 1, HD, 0),
                tp = view(got.post, DSV4_F32, 2, 1, 9, 0), tc = view(got.comb, DSV4_F32, 3, 1, 9, 9);
    CHECK_STATUS(dsv4_hc_pre(cpu1, &site, &t9, &ty, &tp, &tc), DSV4_ERR_SHAPE);
    CHECK(!memcmp(&got, &got2, sizeof got), "hc_pre wrote its outputs on error");
}

/* ---- router ------------------------------------------------------------------------------ */
/* Key of expert e for token row x (float64): sqrt(softplus(w_e . x)) + bias[e]. */
static double route_key(const uint16_t *x, const uint16_t *w, const float *bias, int e, int d)
{
    double z = 0;
    for (int k = 0; k < d; k++) z += (double)dsv4_bf16_to_f32(w[(size_t)e * d + k]) * dsv4_bf16_to_f32(x[k]);
    return sqrt(z > 20 ? z : log1p(exp(z))) + bias[e];
}

/* Two selections agree, or differ only by experts whose float64 keys are within 1e-4 of each
 * other (fp32 keys of near-tied experts may order either way). */
static int same_selection(const int32_t *a, const int32_t *b, int k, const uint16_t *x, const uint16_t *w,
                          const float *bias, int d)
{
    for (int s = 0; s < k; s++)
        if (a[s] != b[s] && fabs(route_key(x, w, bias, a[s], d) - route_key(x, w, bias, b[s], d)) > 1e-4) return 0;
    return 1;
}

static void test_route(void)
{
    enum { T = 9, E = 256, D = 512, K = 6, V = 40 };
    static uint16_t x[T * D], w[E * D];
    static float bias[E], wt_ref[T * K], wt[T * K], wt2[T * K];
    static int32_t ids_ref[T * K], ids[T * K], ids2[T * K], tok[T];
    static int64_t table[V * K];
    fill_bf16(x, T * D, 1.0f);
    fill_bf16(w, E * D, 0.05f);
    fill_f32(bias, E, 0.1f, 0.0f);
    dsv4_tensor tx = view(x, DSV4_BF16, 2, T, D, 0), tw = view(w, DSV4_BF16, 2, E, D, 0),
                tb = view(bias, DSV4_F32, 1, E, 0, 0);
    dsv4_tensor ti_ref = view(ids_ref, DSV4_I32, 2, T, K, 0), tw_ref = view(wt_ref, DSV4_F32, 2, T, K, 0);
    dsv4_tensor ti = view(ids, DSV4_I32, 2, T, K, 0), twt = view(wt, DSV4_F32, 2, T, K, 0);
    dsv4_tensor ti2 = view(ids2, DSV4_I32, 2, T, K, 0), twt2 = view(wt2, DSV4_F32, 2, T, K, 0);
    CHECK_STATUS(dsv4_route(ref_ctx, &tx, &tw, &tb, NULL, NULL, 1.5f, &ti_ref, &tw_ref), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        use_isa(i);
        CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, &tb, NULL, NULL, 1.5f, &ti, &twt), DSV4_OK);
        int same = 1;
        for (int t = 0; t < T; t++) same &= same_selection(ids + t * K, ids_ref + t * K, K, x + t * D, w, bias, D);
        CHECK(same, "route %s selects other experts than cpu-ref", isas[i]);
        CHECK(memcmp(ids, ids_ref, sizeof ids) || f32_close(wt, wt_ref, T * K, 1e-5f), "route %s weights", isas[i]);
        CHECK_STATUS(dsv4_route(cpu1, &tx, &tw, &tb, NULL, NULL, 1.5f, &ti2, &twt2), DSV4_OK);
        CHECK(!memcmp(ids, ids2, sizeof ids) && !memcmp(wt, wt2, sizeof wt), "route %s: 1 vs 2 threads", isas[i]);
    }
    /* hash routing */
    for (int i = 0; i < V * K; i++) table[i] = (int64_t)((i * 37 + 11) % E);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 7) % V);
    dsv4_tensor ttab = view(table, DSV4_I64, 2, V, K, 0), ttok = view(tok, DSV4_I32, 1, T, 0, 0);
    CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, NULL, &ttab, &ttok, 1.5f, &ti, &twt), DSV4_OK);
    int same = 1;
    for (int t = 0; t < T; t++)
        for (int s = 0; s < K; s++) same &= ids[t * K + s] == table[tok[t] * K + s];
    CHECK(same, "hash routing ids are not tid2eid[token]");
    /* bad input: a token outside the table, an entry outside [0, E), bias with the table */
    memset(ids, 0x5A, sizeof ids);
    memcpy(ids2, ids, sizeof ids);
    tok[4] = V;
    CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, NULL, &ttab, &ttok, 1.5f, &ti, &twt), DSV4_ERR_RANGE);
    tok[4] = 0;
    table[2] = E;
    CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, NULL, &ttab, &ttok, 1.5f, &ti, &twt), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, &tb, &ttab, &ttok, 1.5f, &ti, &twt), DSV4_ERR_INVALID_ARG);
    dsv4_tensor tk17 = view(ids, DSV4_I32, 2, T, 17, 0), tw17 = view(wt, DSV4_F32, 2, T, 17, 0);
    CHECK_STATUS(dsv4_route(cpu2, &tx, &tw, &tb, NULL, NULL, 1.5f, &tk17, &tw17), DSV4_ERR_SHAPE);
    CHECK(!memcmp(ids, ids2, sizeof ids), "route wrote its outputs on error");
}

/* ---- SwiGLU and MoE ------------------------------------------------------------------------- */
static void test_swiglu(void)
{
    enum { R = 3, N = 1000 };
    static uint16_t g[R * N], u[R * N], h_ref[R * N], h[R * N], h2[R * N];
    float w[R] = {0.5f, 1.0f, 1.7f};
    fill_bf16(g, R * N, 15.0f); /* clamps at L = 10 active for about half the values */
    fill_bf16(u, R * N, 15.0f);
    dsv4_tensor tg = view(g, DSV4_BF16, 2, R, N, 0), tu = view(u, DSV4_BF16, 2, R, N, 0),
                tw = view(w, DSV4_F32, 1, R, 0, 0), tr = view(h_ref, DSV4_BF16, 2, R, N, 0),
                th = view(h, DSV4_BF16, 2, R, N, 0), th2 = view(h2, DSV4_BF16, 2, R, N, 0);
    CHECK_STATUS(dsv4_swiglu(ref_ctx, &tg, &tu, &tw, 10.0f, &tr), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        use_isa(i);
        CHECK_STATUS(dsv4_swiglu(cpu2, &tg, &tu, &tw, 10.0f, &th), DSV4_OK);
        CHECK(bf16_close(h, h_ref, R * N), "swiglu %s vs cpu-ref", isas[i]);
        CHECK_STATUS(dsv4_swiglu(cpu1, &tg, &tu, &tw, 10.0f, &th2), DSV4_OK);
        CHECK(!memcmp(h, h2, sizeof h), "swiglu %s: 1 vs 2 threads", isas[i]);
    }
    memcpy(h2, h, sizeof h);
    CHECK_STATUS(dsv4_swiglu(cpu1, &tg, &tu, &tw, 0.0f, &th), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_swiglu(cpu1, &tg, &tu, &tw, 10.0f, &tu), DSV4_ERR_INVALID_ARG); /* h over u */
    CHECK(!memcmp(h, h2, sizeof h), "swiglu wrote its output on error");
}

enum { MT = 7, ME = 5, MK = 2, MD = TEST_FP4_MD, MI = TEST_FP4_MI };

static void test_moe(void)
{
    static fp4_expert ex[ME];
    static dsv4_ffn_weights f[ME];
    static uint16_t x[MT * MD], y_ref[MT * MD], y[MT * MD], y2[MT * MD];
    static int32_t ids[MT * MK];
    static float w[MT * MK];
    for (int e = 0; e < ME; e++) {
        make_fp4_expert(&ex[e]);
        f[e] = ex[e].f;
    }
    fill_bf16(x, MT * MD, 3.0f);
    for (int t = 0; t < MT; t++) { /* two distinct experts per token; expert 4 gets every token */
        ids[t * MK] = (int32_t)(test_rand_u64() % 4);
        ids[t * MK + 1] = 4;
        w[t * MK] = 0.25f + 0.5f * (float)(test_rand_u64() % 100) / 100.0f;
        w[t * MK + 1] = 1.5f - w[t * MK];
    }
    size_t bytes = 0;
    CHECK_STATUS(dsv4_moe_workspace_size(cpu2, MT, MK, ME, &f[0], &f[1], &bytes), DSV4_OK);
    void *ws = malloc(bytes);
    dsv4_tensor tx = view(x, DSV4_BF16, 2, MT, MD, 0), ti = view(ids, DSV4_I32, 2, MT, MK, 0),
                tw = view(w, DSV4_F32, 2, MT, MK, 0), tr = view(y_ref, DSV4_BF16, 2, MT, MD, 0),
                ty = view(y, DSV4_BF16, 2, MT, MD, 0), ty2 = view(y2, DSV4_BF16, 2, MT, MD, 0);
    CHECK_STATUS(dsv4_moe(ref_ctx, &tx, &ti, &tw, f, ME, &f[1], 10.0f, &tr, ws, bytes), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        use_isa(i);
        CHECK_STATUS(dsv4_moe(cpu2, &tx, &ti, &tw, f, ME, &f[1], 10.0f, &ty, ws, bytes), DSV4_OK);
        CHECK(bf16_close(y, y_ref, MT * MD), "moe %s vs cpu-ref", isas[i]);
        CHECK_STATUS(dsv4_moe(cpu1, &tx, &ti, &tw, f, ME, &f[1], 10.0f, &ty2, ws, bytes), DSV4_OK);
        CHECK(!memcmp(y, y2, sizeof y), "moe %s: 1 vs 2 threads", isas[i]);
    }
    memcpy(y2, y, sizeof y);
    CHECK_STATUS(dsv4_moe(cpu2, &tx, &ti, &tw, f, ME, &f[1], 10.0f, &ty, ws, bytes - 64), DSV4_ERR_INVALID_ARG);
    ids[3] = ME;
    CHECK_STATUS(dsv4_moe(cpu2, &tx, &ti, &tw, f, ME, &f[1], 10.0f, &ty, ws, bytes), DSV4_ERR_RANGE);
    ids[3] = 4;
    dsv4_tensor tover = view(ws, DSV4_BF16, 2, MT, MD, 0); /* y inside the work space */
    CHECK_STATUS(dsv4_moe(cpu2, &tx, &ti, &tw, f, ME, NULL, 10.0f, &tover, ws, bytes), DSV4_ERR_INVALID_ARG);
    CHECK(!memcmp(y, y2, sizeof y), "moe wrote its output on error");
    free(ws);
}

int main(void)
{
    test_seed();
    ref_ctx = test_ctx("cpu-ref", 1, NULL);
    for (int i = 0; i < 3; i++) {
        isa_ctx[i][0] = test_ctx("cpu", 1, isas[i]);
        isa_ctx[i][1] = test_ctx("cpu", 2, isas[i]);
    }
    use_isa(0);
    test_rms_norm();
    test_mhc();
    test_route();
    test_swiglu();
    test_moe();
    dsv4_ctx_destroy(ref_ctx);
    for (int i = 0; i < 3; i++) dsv4_ctx_destroy(isa_ctx[i][0]), dsv4_ctx_destroy(isa_ctx[i][1]);
    TEST_DONE();
}
