/* Tensor family (embed_rows, add_bf16, copy_rows, sample_rows): every cpu path (AVX-512, AVX2, scalar) against
 * the cpu-ref reference bit for bit, 1 vs 2 threads, and bad input (status, outputs untouched).
 * The numpy oracles are in tests/python/test_tensor_ops.py. */
#include "dsv4.h"
#include "test_util.h"

/* the reference, and cpu contexts of 1 and 2 threads capped at each of test_isas */
static dsv4_ctx *ref_ctx, *one[3], *two[3];

enum { V = 37, D = 1029, T = 19, NC = 4 };

static dsv4_tensor view(void *data, dsv4_dtype dt, int ndim, int64_t a, int64_t b, int64_t c)
{
    dsv4_tensor t;
    const int64_t shape[3] = {a, b, c};
    dsv4_tensor_init(&t, data, dt, ndim, shape);
    return t;
}

static void fill_bits(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint16_t)test_rand_u64();
}

static void test_embed(void)
{
    static uint16_t table[V * D], y_ref[T * NC * D], y[T * NC * D], y2[T * NC * D];
    static int32_t ids[T];
    fill_bits(table, V * D);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(test_rand_u64() % V);
    dsv4_tensor tt = view(table, DSV4_BF16, 2, V, D, 0), ti = view(ids, DSV4_I32, 1, T, 0, 0),
                tr = view(y_ref, DSV4_BF16, 3, T, NC, D), ty = view(y, DSV4_BF16, 3, T, NC, D),
                ty2 = view(y2, DSV4_BF16, 3, T, NC, D);
    CHECK_STATUS(dsv4_embed_rows(ref_ctx, &tt, &ti, &tr), DSV4_OK);
    int ok = 1;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < NC; j++) ok &= !memcmp(y_ref + (t * NC + j) * D, table + ids[t] * D, D * 2);
    CHECK(ok, "embed_rows cpu-ref: out[t, j] != table[ids[t]]");
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(dsv4_embed_rows(two[i], &tt, &ti, &ty), DSV4_OK);
        CHECK(!memcmp(y, y_ref, sizeof y), "embed_rows %s vs cpu-ref", test_isas[i]);
        CHECK_STATUS(dsv4_embed_rows(one[i], &tt, &ti, &ty2), DSV4_OK);
        CHECK(!memcmp(y, y2, sizeof y), "embed_rows %s: 1 vs 2 threads", test_isas[i]);
    }
    ids[T - 1] = V;
    memset(y, 0x5A, sizeof y);
    memcpy(y2, y, sizeof y);
    CHECK_STATUS(dsv4_embed_rows(two[0], &tt, &ti, &ty), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_embed_rows(ref_ctx, &tt, &ti, &ty), DSV4_ERR_RANGE);
    ids[T - 1] = -1;
    CHECK_STATUS(dsv4_embed_rows(two[0], &tt, &ti, &ty), DSV4_ERR_RANGE);
    CHECK(!memcmp(y, y2, sizeof y), "embed_rows wrote its output on error");
    ids[T - 1] = 0;
    dsv4_tensor tover = view(table, DSV4_BF16, 2, T, D, 0); /* out inside the table */
    CHECK_STATUS(dsv4_embed_rows(two[0], &tt, &ti, &tover), DSV4_ERR_INVALID_ARG);
}

static void test_add(void)
{
    static uint16_t a[T * NC * D], b[T * D], y_ref[T * NC * D], y[T * NC * D], y2[T * NC * D];
    fill_bits(a, T * NC * D);
    fill_bits(b, T * D);
    dsv4_tensor ta = view(a, DSV4_BF16, 3, T, NC, D), tb = view(b, DSV4_BF16, 2, T, D, 0),
                tr = view(y_ref, DSV4_BF16, 3, T, NC, D), ty = view(y, DSV4_BF16, 3, T, NC, D),
                ty2 = view(y2, DSV4_BF16, 3, T, NC, D);
    CHECK_STATUS(dsv4_add_bf16(ref_ctx, &ta, &tb, &tr), DSV4_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(dsv4_add_bf16(two[i], &ta, &tb, &ty), DSV4_OK);
        CHECK(!memcmp(y, y_ref, sizeof y), "add_bf16 %s vs cpu-ref", test_isas[i]);
        memcpy(y2, a, sizeof a); /* in place */
        CHECK_STATUS(dsv4_add_bf16(one[i], &ty2, &tb, &ty2), DSV4_OK);
        CHECK(!memcmp(y, y2, sizeof y), "add_bf16 %s: in place on 1 thread vs 2", test_isas[i]);
    }
    memcpy(y2, y, sizeof y);
    dsv4_tensor tshift = view(y + 1, DSV4_BF16, 3, T, NC, D - 1), tsa = view(y, DSV4_BF16, 3, T, NC, D - 1),
                tbs = view(b, DSV4_BF16, 2, T, D - 1, 0);
    CHECK_STATUS(dsv4_add_bf16(two[0], &tsa, &tbs, &tshift), DSV4_ERR_INVALID_ARG); /* y overlaps a, not the same view */
    CHECK_STATUS(dsv4_add_bf16(two[0], &ta, &tb, &tb), DSV4_ERR_SHAPE);
    CHECK(!memcmp(y, y2, sizeof y), "add_bf16 wrote its output on error");
}

static void test_copy(void)
{
    enum { R = 23, C = 777, N = 31 };
    static float src[R * C], y_ref[N * C], y[N * C], y2[N * C];
    static int32_t idx[N];
    for (int i = 0; i < R * C; i++) src[i] = test_randn();
    for (int i = 0; i < N; i++) idx[i] = (int32_t)(test_rand_u64() % R);
    dsv4_tensor ts = view(src, DSV4_F32, 2, R, C, 0), ti = view(idx, DSV4_I32, 1, N, 0, 0),
                tr = view(y_ref, DSV4_F32, 2, N, C, 0), ty = view(y, DSV4_F32, 2, N, C, 0),
                ty2 = view(y2, DSV4_F32, 2, N, C, 0);
    CHECK_STATUS(dsv4_copy_rows(ref_ctx, &ts, &ti, &tr), DSV4_OK);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= !memcmp(y_ref + i * C, src + idx[i] * C, C * 4);
    CHECK(ok, "copy_rows cpu-ref: dst[i] != src[idx[i]]");
    CHECK_STATUS(dsv4_copy_rows(two[0], &ts, &ti, &ty), DSV4_OK);
    CHECK(!memcmp(y, y_ref, sizeof y), "copy_rows cpu vs cpu-ref");
    CHECK_STATUS(dsv4_copy_rows(one[0], &ts, &ti, &ty2), DSV4_OK);
    CHECK(!memcmp(y, y2, sizeof y), "copy_rows: 1 vs 2 threads");
    dsv4_tensor tplain = view(y, DSV4_F32, 2, R, C, 0);
    CHECK_STATUS(dsv4_copy_rows(two[0], &ts, NULL, &tplain), DSV4_OK);
    CHECK(!memcmp(y, src, sizeof src), "copy_rows without idx");
    memcpy(y2, y, sizeof y);
    idx[N / 2] = R;
    CHECK_STATUS(dsv4_copy_rows(two[0], &ts, &ti, &ty), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_copy_rows(ref_ctx, &ts, &ti, &ty), DSV4_ERR_RANGE);
    idx[N / 2] = 0;
    dsv4_tensor tbf = view(y, DSV4_BF16, 2, N, C, 0);
    CHECK_STATUS(dsv4_copy_rows(two[0], &ts, &ti, &tbf), DSV4_ERR_DTYPE);
    dsv4_tensor tself = view(src, DSV4_F32, 2, N < R ? N : R, C, 0), tidx = view(idx, DSV4_I32, 1, N < R ? N : R, 0, 0);
    CHECK_STATUS(dsv4_copy_rows(two[0], &tself, &tidx, &tself), DSV4_ERR_INVALID_ARG); /* gather in place */
    CHECK(!memcmp(y, y2, sizeof y), "copy_rows wrote its output on error");
}

/* sample_rows: rows spread over threads give cpu-ref's tokens and states; bad input is refused
 * with nothing written (the cross-backend comparison is in test_backend_ops.c). */
static void test_sample(void)
{
    enum { B = 6, NV = 1000 };
    static float lg[B * NV], ws[B * (2 * NV + 16)];
    for (int i = 0; i < B * NV; i++) lg[i] = 2.0f * test_randn();
    const dsv4_sampling sp[B] = {{0.0f, 0.0f, 0}, {1.0f, 0.0f, 0}, {0.8f, 0.9f, 0},
                                 {1.3f, 0.5f, 0}, {0.5f, 0.95f, 0}, {2.0f, 0.7f, 0}};
    uint64_t rng0[B][4], r_ref[B][4], r1[B][4], r2[B][4];
    for (int r = 0; r < B; r++) dsv4_rng_seed(100 + (uint64_t)r, rng0[r]);
    memcpy(r_ref, rng0, sizeof rng0), memcpy(r1, rng0, sizeof rng0), memcpy(r2, rng0, sizeof rng0);
    int32_t t_ref[B], t1[B], t2[B];
    size_t wsb = 0;
    CHECK_STATUS(dsv4_sample_workspace_size(ref_ctx, B, NV, &wsb), DSV4_OK);
    CHECK(wsb <= sizeof ws && wsb == (size_t)B * DSV4_SAMPLE_ROW_BYTES(NV), "sample_workspace_size %zu", wsb);
    dsv4_tensor tl = view(lg, DSV4_F32, 2, B, NV, 0), tr = view(t_ref, DSV4_I32, 1, B, 0, 0),
                tt1 = view(t1, DSV4_I32, 1, B, 0, 0), tt2 = view(t2, DSV4_I32, 1, B, 0, 0);
    CHECK_STATUS(dsv4_sample_rows(ref_ctx, &tl, sp, &r_ref[0][0], &tr, ws, wsb), DSV4_OK);
    CHECK_STATUS(dsv4_sample_rows(one[0], &tl, sp, &r1[0][0], &tt1, ws, wsb), DSV4_OK);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, sp, &r2[0][0], &tt2, ws, wsb), DSV4_OK);
    int valid = 1;
    for (int r = 0; r < B; r++) valid &= t_ref[r] >= 0 && t_ref[r] < NV;
    CHECK(valid, "sample_rows cpu-ref: a token outside [0, V)");
    CHECK(!memcmp(t1, t_ref, sizeof t1) && !memcmp(t2, t_ref, sizeof t2), "sample_rows: tokens of 1 / 2 threads");
    CHECK(!memcmp(r1, r_ref, sizeof r1) && !memcmp(r2, r_ref, sizeof r2), "sample_rows: states of 1 / 2 threads");
    /* bad input: nothing written */
    memcpy(t2, t1, sizeof t1), memcpy(r2, r1, sizeof r1);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, sp, &r1[0][0], &tt1, ws, wsb - 1), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, NULL, &r1[0][0], &tt1, ws, wsb), DSV4_ERR_INVALID_ARG);
    dsv4_tensor ti = view(lg, DSV4_I32, 2, B, NV, 0), tshort = view(t1, DSV4_I32, 1, B - 1, 0, 0),
                tf = view(t1, DSV4_F32, 1, B, 0, 0), t0 = view(lg, DSV4_F32, 2, B, 0, 0);
    CHECK_STATUS(dsv4_sample_rows(two[0], &ti, sp, &r1[0][0], &tt1, ws, wsb), DSV4_ERR_DTYPE);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, sp, &r1[0][0], &tshort, ws, wsb), DSV4_ERR_SHAPE);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, sp, &r1[0][0], &tf, ws, wsb), DSV4_ERR_DTYPE);
    CHECK_STATUS(dsv4_sample_rows(two[0], &t0, sp, &r1[0][0], &tt1, ws, wsb), DSV4_ERR_SHAPE);
    dsv4_tensor tin = view((float *)ws + 8, DSV4_I32, 1, B, 0, 0);
    CHECK_STATUS(dsv4_sample_rows(two[0], &tl, sp, &r1[0][0], &tin, ws, wsb), DSV4_ERR_INVALID_ARG);
    CHECK(!memcmp(t1, t2, sizeof t1) && !memcmp(r1, r2, sizeof r1), "sample_rows wrote on error");
    CHECK_STATUS(dsv4_sample_result(DSV4_SAMPLE_BAD_PARAMS, "x"), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_sample_result(DSV4_SAMPLE_ALL_MASKED, "x"), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_sample_result(7, "x"), DSV4_OK);
}

int main(void)
{
    test_seed();
    ref_ctx = test_ctx("cpu-ref", 1, NULL);
    for (int i = 0; i < 3; i++) {
        one[i] = test_ctx("cpu", 1, test_isas[i]);
        two[i] = test_ctx("cpu", 2, test_isas[i]);
    }
    test_embed();
    test_add();
    test_copy();
    test_sample();
    dsv4_ctx_destroy(ref_ctx);
    for (int i = 0; i < 3; i++) dsv4_ctx_destroy(one[i]), dsv4_ctx_destroy(two[i]);
    TEST_DONE();
}
