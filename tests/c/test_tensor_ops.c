/* Tensor family (embed_rows, add_bf16, copy_rows): every cpu path (AVX-512, AVX2, scalar) against
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
    dsv4_ctx_destroy(ref_ctx);
    for (int i = 0; i < 3; i++) dsv4_ctx_destroy(one[i]), dsv4_ctx_destroy(two[i]);
    TEST_DONE();
}
